//! Issue 25, exec and port-forward, end to end with the real binaries and
//! Docker: the node dials back for each session, the control plane
//! bridges it to the user's WebSocket. A command's output, stderr and exit
//! status reach `cloudweb exec`; a terminal has the size asked for and
//! follows a resize; input passes through; a port-forward carries HTTP;
//! closing the client ends the process in the container; a user past the
//! session limit is refused until one closes; an idle session is closed;
//! a node that goes away ends its session with a clear reason and exit
//! status 255; a managed PostgreSQL is reached by exec and by a
//! local psql through port-forward; every session is recorded.

use std::process::{Command, Stdio};
use std::time::Duration;

use cloudweb_e2e::docker;
use cloudweb_e2e::{bin, start_platform, unique_name, wait_for, AgentNode, Platform, Process, ServerProcess};
use cloudweb_protocol::sessions::SessionFrame;
use futures_util::{SinkExt, StreamExt};
use reqwest::Method;
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;

const AGENT_FLAGS: [&str; 6] = ["--heartbeat-interval-seconds", "1", "--publish-ip", "127.0.0.1", "--advertise-host", "127.0.0.1"];

const DOCKERFILE: &str = "FROM cloudweb-test/busybox:latest\nRUN mkdir -p /www && echo ok > /www/index.html\nCMD [\"httpd\", \"-f\", \"-p\", \"8080\", \"-h\", \"/www\"]\n";

async fn call(server: &ServerProcess, method: Method, path: &str, body: Option<Value>) -> (u16, Value) {
    server.call(method, path, body).await.unwrap()
}

/// A platform (with `server_flags`) with one node and an app running on it;
/// the app's name and its instance's container.
async fn app_running(server_flags: &[&str]) -> (Platform, AgentNode, String, String) {
    let platform = start_platform(server_flags).await.unwrap();
    let server = &platform.server;
    let (token, ca) = server.join_token().await.unwrap();
    let mut agent = AgentNode::join(server, &platform.tmp.path().join("node"), "worker", &token, &ca, &[]).unwrap().unwrap();
    agent.start(&AGENT_FLAGS).unwrap();
    let node_id = agent.node_id.clone();
    wait_for(Duration::from_secs(20), "the node to offer sessions", || async {
        let node = server.node(&node_id).await.ok()?;
        (node["state"] == "ready" && node["features"].as_array()?.iter().any(|f| f == "sessions")).then_some(())
    })
    .await
    .unwrap();
    platform.git.commit("exec", &[("Dockerfile", DOCKERFILE)], "an app").unwrap();
    let app = unique_name("exec");
    let (status, body) = call(server, Method::POST, "/api/apps", Some(json!({"name": app, "repo_url": platform.git.url("exec"), "port": 8080}))).await;
    assert_eq!(status, 201, "{body}");
    let (status, body) = call(server, Method::PUT, &format!("/api/apps/{app}/env"), Some(json!({"FOO": "bar"}))).await;
    assert_eq!(status, 200, "{body}");
    let deployment = server.deploy_and_settle(&app, None).await.unwrap_or_else(|e| panic!("{e}\nagent log:\n{}", agent.log_text()));
    let container = deployment["instances"][0]["container"].as_str().expect("the instance's container").to_string();
    (platform, agent, app, container)
}

fn cli(platform: &Platform, args: &[&str]) -> Command {
    let mut command = Command::new(bin("cloudweb"));
    command
        .args(args)
        .env("CLOUDWEB_SERVER", platform.server.api(""))
        .env("CLOUDWEB_TOKEN", &platform.server.admin_token)
        .env("HOME", platform.tmp.path())
        .env("XDG_CONFIG_HOME", platform.tmp.path());
    command
}

fn spawn_cli(platform: &Platform, args: &[&str], log: &str) -> Process {
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    let env = [("CLOUDWEB_SERVER", platform.server.api("")), ("CLOUDWEB_TOKEN", platform.server.admin_token.clone())];
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    Process::spawn_with_env(&bin("cloudweb"), &args, &env, platform.tmp.path().join(log)).unwrap()
}

async fn sessions(server: &ServerProcess, app: &str) -> Vec<Value> {
    let (status, body) = call(server, Method::GET, &format!("/api/apps/{app}/sessions"), None).await;
    assert_eq!(status, 200, "{body}");
    body["sessions"].as_array().cloned().unwrap_or_default()
}

/// The processes of `container` (its `docker top` lines).
fn processes(container: &str) -> String {
    docker::docker(&["top", container]).join("\n")
}

type Socket = tokio_tungstenite::WebSocketStream<tokio::net::TcpStream>;

/// A session WebSocket opened the way a browser or the CLI does.
async fn websocket(server: &ServerProcess, path_and_query: &str) -> Socket {
    let url = server.api(path_and_query).replacen("http://", "ws://", 1);
    let mut request = url.as_str().into_client_request().unwrap();
    request.headers_mut().insert("authorization", format!("Bearer {}", server.admin_token).parse().unwrap());
    let host = request.uri().authority().unwrap().to_string();
    let tcp = tokio::net::TcpStream::connect(host).await.unwrap();
    tokio_tungstenite::client_async(request, tcp).await.unwrap().0
}

async fn send(socket: &mut Socket, frame: SessionFrame) {
    socket.send(Message::Binary(frame.encode().into())).await.unwrap();
}

/// Reads output until it contains `wanted` (or an exit status).
async fn read_until(socket: &mut Socket, wanted: &str) -> Result<String, String> {
    let mut seen = String::new();
    let read = async {
        while let Some(message) = socket.next().await {
            let Ok(Message::Binary(bytes)) = message else { continue };
            match SessionFrame::decode_one(&bytes).unwrap() {
                SessionFrame::Data(data) => {
                    seen.push_str(&String::from_utf8_lossy(&data));
                    if seen.contains(wanted) {
                        return Ok(());
                    }
                }
                SessionFrame::Exit(code) => return Err(format!("exit {code}")),
                SessionFrame::Error(message) => return Err(message),
                _ => {}
            }
        }
        Err("closed".to_string())
    };
    match tokio::time::timeout(Duration::from_secs(15), read).await {
        Ok(Ok(())) => Ok(seen),
        Ok(Err(why)) => Err(format!("{why}; output so far: {seen:?}")),
        Err(_) => Err(format!("timed out; output so far: {seen:?}")),
    }
}

#[tokio::test]
async fn exec_gives_output_status_input_and_a_terminal_that_follows_its_window() {
    let (platform, agent, app, _) = app_running(&[]).await;
    let server = &platform.server;

    // Output, stderr apart, the app's environment, the exit status.
    let output = cli(&platform, &["exec", &app, "--", "sh", "-c", "echo out $FOO; echo err >&2; exit 3"]).output().unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert_eq!(output.status.code(), Some(3), "stdout: {stdout}\nstderr: {stderr}\nagent:\n{}", agent.log_text());
    assert_eq!(stdout, "out bar\n");
    assert!(stderr.contains("err"), "{stderr}");

    // -i: this terminal's input goes to the command, its end too.
    let mut child = cli(&platform, &["exec", "-i", &app, "--", "sh", "-c", "cat; echo end"]).stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(b"hello\nworld\n").unwrap();
    }
    let output = child.wait_with_output().unwrap();
    assert_eq!(output.status.code(), Some(0));
    assert_eq!(String::from_utf8_lossy(&output.stdout), "hello\nworld\nend\n");

    // -it under a real terminal (script's pty): raw mode, a terminal in the
    // container, the status passed through.
    let line = format!("{} exec -it {app} -- sh -c 'stty size; tty; exit 4'", bin("cloudweb").display());
    let output = cli(&platform, &[]).program_replace("script", &["-qec", &line, "/dev/null"]).output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(4), "{stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    assert!(stdout.contains("/dev/pts/"), "a terminal in the container: {stdout}");

    // The WebSocket itself: the size asked for, then a resize, keys in,
    // the exit status out.
    let mut socket = websocket(server, &format!("/api/apps/{app}/exec?command=sh&tty=1&cols=100&rows=30")).await;
    send(&mut socket, SessionFrame::Data(b"stty size\n".to_vec())).await;
    read_until(&mut socket, "30 100").await.unwrap();
    send(&mut socket, SessionFrame::Resize { cols: 120, rows: 40 }).await;
    send(&mut socket, SessionFrame::Data(b"stty size\n".to_vec())).await;
    read_until(&mut socket, "40 120").await.unwrap();
    send(&mut socket, SessionFrame::Data(b"exit 5\n".to_vec())).await;
    assert_eq!(read_until(&mut socket, "never printed").await.unwrap_err().split(';').next(), Some("exit 5"));

    // A user may not send what only a node sends.
    let mut socket = websocket(server, &format!("/api/apps/{app}/exec?command=sleep&command=30")).await;
    send(&mut socket, SessionFrame::Exit(0)).await;
    let refused = read_until(&mut socket, "never printed").await.unwrap_err();
    assert!(refused.contains("only a node may send"), "{refused}");

    // Refusals are plain answers, before any session.
    let status = |path: String| async move { server.call(Method::GET, &path, None).await.unwrap().0 };
    assert_eq!(status(format!("/api/apps/{app}/exec?command=true")).await, 400, "not a WebSocket request");
    let output = cli(&platform, &["exec", "no-such-app", "--", "true"]).output().unwrap();
    assert_eq!(output.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&output.stderr).contains("no app"), "{}", String::from_utf8_lossy(&output.stderr));
    let output = cli(&platform, &["exec", "--instance", "9", &app, "--", "true"]).output().unwrap();
    assert_eq!(output.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&output.stderr).contains("no running instance 9"), "{}", String::from_utf8_lossy(&output.stderr));
    let output = cli(&platform, &["exec", &app, "--", "no-such-program"]).output().unwrap();
    assert!(matches!(output.status.code(), Some(126 | 127)), "{:?} {}", output.status, String::from_utf8_lossy(&output.stdout));

    // Every session is recorded, newest first, without its arguments.
    let recorded = sessions(server, &app).await;
    assert!(recorded.len() >= 6, "{recorded:?}");
    let first = recorded.last().unwrap();
    assert_eq!((first["kind"].as_str(), first["user"].as_str(), first["program"].as_str(), first["exit_code"].as_i64()), (Some("exec"), Some("admin"), Some("sh"), Some(3)), "{first}");
    assert!(first["duration_ms"].as_i64().is_some(), "{first}");
    assert!(!first.to_string().contains("echo out"), "arguments are not kept: {first}");
    assert!(recorded.iter().any(|s| s["exit_code"] == 5 && s["tty"] == true), "{recorded:?}");
}

/// `Command::new` for another program with the same environment.
trait ProgramReplace {
    fn program_replace(&mut self, program: &str, args: &[&str]) -> Command;
}

impl ProgramReplace for Command {
    fn program_replace(&mut self, program: &str, args: &[&str]) -> Command {
        let mut command = Command::new(program);
        command.args(args);
        for (key, value) in self.get_envs() {
            if let Some(value) = value {
                command.env(key, value);
            }
        }
        command
    }
}

#[tokio::test]
async fn port_forward_and_how_sessions_end() {
    let (platform, mut agent, app, container) = app_running(&["--exec-idle-seconds", "6", "--exec-sessions-per-user", "3"]).await;
    let server = &platform.server;

    // A local port forwarded to the instance's 8080 carries HTTP.
    let mut forward = spawn_cli(&platform, &["port-forward", &app, "0:8080"], "forward.log");
    let port: u16 = wait_for(Duration::from_secs(10), "port-forward to listen", || async {
        let text = forward.log_text();
        let rest = text.split("forwarding 127.0.0.1:").nth(1)?;
        rest.split_whitespace().next()?.parse().ok()
    })
    .await
    .unwrap();
    for _ in 0..3 {
        let body = reqwest::get(format!("http://127.0.0.1:{port}/")).await.unwrap().text().await.unwrap();
        assert_eq!(body, "ok\n", "{}", forward.log_text());
    }
    forward.kill();
    let forwarded = sessions(server, &app).await;
    assert!(forwarded.iter().filter(|s| s["kind"] == "port-forward" && s["port"] == 8080).count() >= 3, "{forwarded:?}");

    // A user holds at most 3 sessions at once: the 4th is refused before
    // it opens, and one closed makes room again.
    let mut held = Vec::new();
    for _ in 0..3 {
        let mut socket = websocket(server, &format!("/api/apps/{app}/exec?command=cat")).await;
        send(&mut socket, SessionFrame::Data(b"held\n".to_vec())).await;
        read_until(&mut socket, "held").await.unwrap();
        held.push(socket);
    }
    let output = cli(&platform, &["exec", &app, "--", "true"]).output().unwrap();
    assert_eq!(output.status.code(), Some(1), "{}", String::from_utf8_lossy(&output.stderr));
    assert!(String::from_utf8_lossy(&output.stderr).contains("holds 3 sessions"), "{}", String::from_utf8_lossy(&output.stderr));
    let _ = held.pop().unwrap().close(None).await;
    wait_for(Duration::from_secs(10), "a closed session to make room", || async {
        (cli(&platform, &["exec", &app, "--", "true"]).output().ok()?.status.code() == Some(0)).then_some(())
    })
    .await
    .unwrap();
    drop(held);

    // A session with nothing moving is closed after the idle timeout.
    let started = std::time::Instant::now();
    let output = cli(&platform, &["exec", &app, "--", "sleep", "60"]).output().unwrap();
    assert_eq!(output.status.code(), Some(255), "{}", String::from_utf8_lossy(&output.stderr));
    assert!(String::from_utf8_lossy(&output.stderr).contains("without input or output"), "{}", String::from_utf8_lossy(&output.stderr));
    assert!(started.elapsed() < Duration::from_secs(20), "closed within a bound: {:?}", started.elapsed());

    // Closing the client ends the process in the container.
    let mut client = spawn_cli(&platform, &["exec", &app, "--", "sleep", "1234"], "exec-close.log");
    wait_for(Duration::from_secs(10), "the exec's process to run", || async { processes(&container).contains("sleep 1234").then_some(()) }).await.unwrap();
    client.kill();
    wait_for(Duration::from_secs(10), "the exec's process to end once its client left", || async { (!processes(&container).contains("sleep 1234")).then_some(()) })
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}\nagent:\n{}", processes(&container), agent.log_text()));

    // The node goes away: the client is told, with status 255, promptly.
    let mut client = spawn_cli(&platform, &["exec", &app, "--", "sleep", "999"], "exec-node-gone.log");
    wait_for(Duration::from_secs(10), "the session to open", || async {
        let all = sessions(server, &app).await;
        all.first().is_some_and(|s| s["state"] == "open" && s["program"] == "sleep").then_some(())
    })
    .await
    .unwrap();
    agent.kill();
    let status = client.wait_exit(Duration::from_secs(15)).await.expect("the client ends once its node went away");
    assert_eq!(status.code(), Some(255), "{}", client.log_text());
    assert!(client.log_text().contains("went away"), "{}", client.log_text());
    let last = sessions(server, &app).await.remove(0);
    assert_eq!(last["state"], "failed", "{last}");
    assert!(last["message"].as_str().unwrap_or_default().contains("went away"), "{last}");
    let _ = docker::docker(&["rm", "-f", &container]);
}

#[tokio::test]
async fn a_managed_postgres_is_reached_through_exec_and_port_forward() {
    use cloudweb_e2e::services::{ensure_service_images, service_ports, services_node, until};
    ensure_service_images();
    let ports = service_ports();
    let platform = start_platform(&["--service-image", "postgres=cloudweb-test/postgres:15", "--service-ports", &ports]).await.unwrap();
    let server = &platform.server;
    let agent = services_node(server, platform.tmp.path(), "db-node").await;
    let name = unique_name("pg");
    let (status, created) = call(server, Method::POST, "/api/services", Some(json!({"name": name, "type": "postgres"}))).await;
    assert_eq!(status, 201, "{created}");
    until(server, &agent, &name, "healthy", Duration::from_secs(90), |view| view["state"] == "healthy").await;

    // exec --service: psql in the service's container, over its socket.
    let sql = "CREATE ROLE probe LOGIN PASSWORD 'probe-pw'; SELECT 40 + 2";
    let output = cli(&platform, &["exec", "--service", &name, "--", "psql", "-U", "app", "-d", "app", "-v", "ON_ERROR_STOP=1", "-tAc", sql]).output().unwrap();
    assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));
    assert!(String::from_utf8_lossy(&output.stdout).contains("42"), "{}", String::from_utf8_lossy(&output.stdout));
    let output = cli(&platform, &["exec", "--service", "--instance", "2", &name, "--", "true"]).output().unwrap();
    assert_eq!(output.status.code(), Some(2), "a service has no instances to pick");

    // port-forward --service: a local psql against the database, which is
    // reachable only inside the cluster.
    let mut forward = spawn_cli(&platform, &["port-forward", "--service", &name, "0:5432"], "pg-forward.log");
    let port: u16 = wait_for(Duration::from_secs(10), "port-forward to listen", || async {
        let text = forward.log_text();
        text.split("forwarding 127.0.0.1:").nth(1)?.split_whitespace().next()?.parse().ok()
    })
    .await
    .unwrap();
    let url = format!("postgresql://probe:probe-pw@127.0.0.1:{port}/app");
    let output = Command::new("psql").args([url.as_str(), "-tAc", "SELECT 6 * 7"]).output().unwrap();
    assert!(output.status.success(), "{}\n{}", String::from_utf8_lossy(&output.stderr), forward.log_text());
    assert_eq!(String::from_utf8_lossy(&output.stdout).trim(), "42");
    forward.kill();

    let (status, recorded) = call(server, Method::GET, &format!("/api/services/{name}/sessions"), None).await;
    assert_eq!(status, 200, "{recorded}");
    let recorded = recorded["sessions"].as_array().cloned().unwrap_or_default();
    assert!(recorded.iter().any(|s| s["service"] == name.as_str() && s["kind"] == "exec" && s["exit_code"] == 0 && s.get("instance").is_none()), "{recorded:?}");
    assert!(recorded.iter().any(|s| s["kind"] == "port-forward" && s["port"] == 5432), "{recorded:?}");
    let (status, _) = call(server, Method::GET, "/api/services/no-such-service/sessions", None).await;
    assert_eq!(status, 404);
}
