//! Runtime logs end to end: a real container prints on stdout and stderr,
//! the real agent follows it and uploads the lines, and the user API shows
//! them (recent lines as JSON, live over SSE), redacted, once each even
//! across an agent restart; `cloudweb logs -f` goes on across a restart
//! of the control plane, printing no line twice, and gives up after its
//! bounded reconnects when the control plane stays away; the agent
//! endpoint refuses lines about deployments that are not the node's.

use std::time::Duration;

use cloudweb_e2e::{bin, start_platform, unique_name, wait_for, AgentNode, Platform, Process, ServerProcess};
use futures_util::StreamExt;
use reqwest::Method;
use serde_json::{json, Value};

const AGENT_FLAGS: [&str; 6] = ["--heartbeat-interval-seconds", "1", "--publish-ip", "127.0.0.1", "--advertise-host", "127.0.0.1"];

/// Prints a line with a secret, one on stderr, then a numbered tick every
/// second while it serves HTTP.
const DOCKERFILE: &str = "FROM cloudweb-test/busybox:latest\nRUN mkdir -p /www && echo ok > /www/index.html\n\
CMD [\"sh\", \"-c\", \"echo \\\"started with $SECRET_TOKEN\\\"; echo 'to <stderr>' >&2; \
(i=0; while true; do i=$((i+1)); echo \\\"tick $i\\\"; sleep 1; done) & exec httpd -f -p 8080 -h /www\"]\n";

const SECRET: &str = "s3cr3t-value-4711";

fn lines_of(body: &Value) -> Vec<Value> {
    body["lines"].as_array().cloned().unwrap_or_default()
}

fn texts(lines: &[Value]) -> Vec<String> {
    lines.iter().map(|l| l["line"].as_str().unwrap_or_default().to_string()).collect()
}

#[tokio::test]
async fn an_instance_output_reaches_the_user_api_live_redacted_and_once() {
    let Platform { tmp, git, mut server } = start_platform(&[]).await.unwrap();
    let (token, ca) = server.join_token().await.unwrap();
    let mut agent = AgentNode::join(&server, &tmp.path().join("node"), "logger", &token, &ca, &[]).unwrap().unwrap();
    agent.start(&AGENT_FLAGS).unwrap();
    let node_id = agent.node_id.clone();
    wait_for(Duration::from_secs(20), "node ready", || async {
        let node = server.node(&node_id).await.ok()?;
        (node["state"] == "ready").then_some(())
    })
    .await
    .unwrap();
    let app = unique_name("logs");
    let commit = git.commit("logs", &[("Dockerfile", DOCKERFILE)], "printing app").unwrap();
    let (status, body) = server
        .call(Method::POST, "/api/apps", Some(json!({"name": app, "repo_url": git.url("logs"), "port": 8080, "health_timeout_seconds": 30})))
        .await
        .unwrap();
    assert_eq!(status, 201, "{body}");
    let (status, _) = server.call(Method::PUT, &format!("/api/apps/{app}/env"), Some(json!({"SECRET_TOKEN": SECRET}))).await.unwrap();
    assert_eq!(status, 200);
    // Unknown app, bad query.
    assert_eq!(server.call(Method::GET, "/api/apps/no-such-app/logs", None).await.unwrap().0, 404);
    let (status, body) = server.call(Method::GET, &format!("/api/apps/{app}/logs?lines=abc"), None).await.unwrap();
    assert_eq!(status, 400, "{body}");
    assert_eq!(server.call(Method::GET, &format!("/api/apps/{app}/logs?follow=maybe"), None).await.unwrap().0, 400);
    let (status, body) = server.call(Method::GET, &format!("/api/apps/{app}/logs"), None).await.unwrap();
    assert_eq!((status, lines_of(&body).len()), (200, 0), "no lines before a deploy: {body}");

    let (status, body) = server.call(Method::POST, &format!("/api/apps/{app}/deploy"), Some(json!({"commit": commit}))).await.unwrap();
    assert_eq!(status, 201, "{body}");
    let deployment = body["id"].as_str().unwrap().to_string();
    let running = wait_for(Duration::from_secs(180), "the deployment to run", || async {
        let (_, body) = server.call(Method::GET, &format!("/api/deployments/{deployment}"), None).await.ok()?;
        matches!(body["state"].as_str(), Some("running" | "failed")).then_some(body)
    })
    .await
    .unwrap_or_else(|err| panic!("{err}\nagent log:\n{}", agent.log_text()));
    assert_eq!(running["state"], "running", "{running}\nagent log:\n{}", agent.log_text());
    let container = running["instances"][0]["container"].as_str().unwrap().to_string();

    // Recent lines, as JSON.
    let snapshot = wait_for(Duration::from_secs(60), "the app's first lines and three ticks", || async {
        let (_, body) = server.call(Method::GET, &format!("/api/apps/{app}/logs?lines=1000"), None).await.ok()?;
        let lines = lines_of(&body);
        let texts = texts(&lines);
        (texts.iter().any(|t| t.starts_with("started with")) && texts.iter().filter(|t| t.starts_with("tick")).count() >= 3).then_some(lines)
    })
    .await
    .unwrap_or_else(|err| panic!("{err}\nagent log:\n{}", agent.log_text()));
    let all = texts(&snapshot);
    assert!(all.contains(&"started with [redacted SECRET_TOKEN]".to_string()), "{all:?}");
    assert!(!all.iter().any(|t| t.contains(SECRET)), "the secret never leaves the node: {all:?}");
    let stderr = snapshot.iter().find(|l| l["line"] == "to <stderr>").expect("the stderr line");
    assert_eq!(stderr["stream"], "stderr");
    let first = &snapshot[0];
    assert_eq!(first["deployment_id"], deployment.as_str());
    assert_eq!(first["instance"], 1);
    assert_eq!(first["node_id"], node_id.as_str());
    assert_eq!(first["container"], container.as_str());
    assert!(first["ts"].as_str().unwrap().starts_with("20"), "{first}");
    let seqs: Vec<u64> = snapshot.iter().map(|l| l["seq"].as_u64().unwrap()).collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "oldest first: {seqs:?}");
    let (_, two) = server.call(Method::GET, &format!("/api/apps/{app}/logs?lines=2"), None).await.unwrap();
    assert_eq!(lines_of(&two).len(), 2);
    let (_, other) = server.call(Method::GET, &format!("/api/apps/{app}/logs?deployment=dep_other"), None).await.unwrap();
    assert!(lines_of(&other).is_empty(), "filtered by deployment");

    // Live: a follower sees ticks newer than the snapshot.
    let last_tick = |texts: &[String]| texts.iter().filter_map(|t| t.strip_prefix("tick ")?.parse::<u64>().ok()).max().unwrap_or(0);
    let seen = last_tick(&all);
    let stream = server
        .http
        .get(server.api(&format!("/api/apps/{app}/logs?follow=1&lines=5")))
        .bearer_auth(&server.admin_token)
        .timeout(Duration::from_secs(60))
        .send()
        .await
        .unwrap();
    assert_eq!(stream.status(), 200);
    assert_eq!(stream.headers()["content-type"], "text/event-stream");
    let mut body = stream.bytes_stream();
    let mut text = String::new();
    let live = tokio::time::timeout(Duration::from_secs(45), async {
        while let Some(chunk) = body.next().await {
            text.push_str(&String::from_utf8_lossy(&chunk.unwrap()));
            let ticks: Vec<String> = text
                .lines()
                .filter_map(|l| l.strip_prefix("data: "))
                .filter_map(|d| serde_json::from_str::<Value>(d).ok())
                .map(|v| v["line"].as_str().unwrap_or_default().to_string())
                .collect();
            if last_tick(&ticks) > seen + 2 {
                return true;
            }
        }
        false
    })
    .await;
    assert_eq!(live, Ok(true), "new ticks arrive on the stream: {text}");
    assert!(text.contains("event: log") && text.contains("\nid: "), "{text}");
    drop(body);

    // An agent restart reads the container's tail again; nothing is stored
    // twice.
    agent.kill();
    agent.start(&AGENT_FLAGS).unwrap();
    let before_restart = last_tick(&texts(&lines_of(&server.call(Method::GET, &format!("/api/apps/{app}/logs?lines=2000"), None).await.unwrap().1)));
    wait_for(Duration::from_secs(60), "ticks after the agent restart", || async {
        let (_, body) = server.call(Method::GET, &format!("/api/apps/{app}/logs?lines=2000"), None).await.ok()?;
        (last_tick(&texts(&lines_of(&body))) > before_restart + 3).then_some(())
    })
    .await
    .unwrap_or_else(|err| panic!("{err}\nagent log:\n{}", agent.log_text()));
    let (_, body) = server.call(Method::GET, &format!("/api/apps/{app}/logs?lines=2000"), None).await.unwrap();
    let after = texts(&lines_of(&body));
    for wanted in ["started with [redacted SECRET_TOKEN]", "to <stderr>", "tick 1", "tick 2"] {
        assert_eq!(after.iter().filter(|t| *t == wanted).count(), 1, "{wanted:?} once: {after:?}");
    }
    let mut ticks: Vec<u64> = after.iter().filter_map(|t| t.strip_prefix("tick ")?.parse().ok()).collect();
    let count = ticks.len();
    ticks.dedup();
    assert_eq!(ticks.len(), count, "no tick twice: {ticks:?}");

    // The agent endpoint: lines about someone else's deployment are refused,
    // a malformed upload is a 400.
    let raw = agent.raw_client();
    let url = format!("{}/agent/v1/logs", server.url());
    let headers = [("x-cloudweb-protocol", "1"), ("x-cloudweb-agent-version", "0.1.0")];
    let upload = json!({"containers": [{"deployment_id": "dep_nope", "instance": 1, "container": "cw-x-1",
        "lines": [{"ts": "2026-11-30T10:00:00.000000001Z", "stream": "stdout", "line": "forged"}]}]});
    let (status, answer) = raw.send(Method::POST, &url, &headers, Some(&upload.to_string())).await.unwrap();
    assert_eq!(status, 200, "{answer}");
    let answer: Value = serde_json::from_str(&answer).unwrap();
    assert_eq!(answer["accepted"], 0);
    assert_eq!(answer["refused"][0]["container"], "cw-x-1");
    let wrong_instance = json!({"containers": [{"deployment_id": deployment, "instance": 7, "container": "cw-x-1",
        "lines": [{"ts": "2026-11-30T10:00:00.000000001Z", "stream": "stdout", "line": "forged"}]}]});
    let (_, answer) = raw.send(Method::POST, &url, &headers, Some(&wrong_instance.to_string())).await.unwrap();
    assert!(answer.contains("not placed on this node"), "{answer}");
    let bad = json!({"containers": [{"deployment_id": deployment, "instance": 1, "container": container,
        "lines": [{"ts": "x", "stream": "build", "line": "x"}]}]});
    let (status, answer) = raw.send(Method::POST, &url, &headers, Some(&bad.to_string())).await.unwrap();
    assert_eq!(status, 400, "{answer}");
    assert!(answer.contains("lines.stream"), "{answer}");
    let (_, body) = server.call(Method::GET, &format!("/api/apps/{app}/logs?lines=2000"), None).await.unwrap();
    assert!(!texts(&lines_of(&body)).iter().any(|t| t == "forged"));

    // `cloudweb logs -f` across a restart of the control plane: it
    // reconnects with the id of the last line it printed and goes on with
    // the lines after it (the restarted control plane numbers its lines
    // above the last run's), none twice.
    let mut follower = cli_follow(&server, tmp.path(), &app, "follow-restart");
    let printed = wait_for(Duration::from_secs(30), "the CLI to print two ticks", || async {
        let ticks = cli_ticks(&follower.log_text());
        (ticks.len() >= 2).then_some(ticks)
    })
    .await
    .unwrap_or_else(|err| panic!("{err}\ncli:\n{}", follower.log_text()));
    let before = *printed.last().unwrap();
    server.restart().await.unwrap();
    wait_for(Duration::from_secs(90), "the CLI to print ticks after the restart", || async {
        (cli_ticks(&follower.log_text()).last().copied().unwrap_or(0) > before + 3).then_some(())
    })
    .await
    .unwrap_or_else(|err| panic!("{err}\ncli:\n{}\nagent log:\n{}", follower.log_text(), agent.log_text()));
    let output = follower.log_text();
    assert!(output.contains("the log stream was lost") && output.contains("reconnecting in"), "{output}");
    let ticks = cli_ticks(&output);
    assert!(ticks.windows(2).all(|w| w[0] < w[1]), "each tick once, in order: {ticks:?}");
    let seqs: Vec<u64> = output.lines().filter_map(|l| serde_json::from_str::<Value>(l).ok()).filter_map(|v| v["seq"].as_u64()).collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "the restarted control plane numbers its lines above the last run's: {seqs:?}");
    assert!(follower.is_running(), "{output}");

    // Deleting the app ends its followers' streams.
    let stream = server
        .http
        .get(server.api(&format!("/api/apps/{app}/logs?follow=1&lines=0")))
        .bearer_auth(&server.admin_token)
        .timeout(Duration::from_secs(60))
        .send()
        .await
        .unwrap();
    let (status, _) = server.call(Method::DELETE, &format!("/api/apps/{app}"), None).await.unwrap();
    assert_eq!(status, 204);
    let rest = tokio::time::timeout(Duration::from_secs(30), stream.text()).await.expect("the stream ends").unwrap();
    assert!(rest.contains("event: end"), "{rest}");
    let status = follower.wait_exit(Duration::from_secs(30)).await;
    assert_eq!(status.and_then(|s| s.code()), Some(0), "the CLI ends with the app:\n{}", follower.log_text());
    assert!(follower.log_text().contains("the app was deleted"));
    agent.remove_containers();
}

/// `cloudweb logs <app> -f --json -n 0` with the admin token, its stdout
/// and stderr in one file.
fn cli_follow(server: &ServerProcess, dir: &std::path::Path, app: &str, name: &str) -> Process {
    let home = dir.join(format!("{name}-home"));
    std::fs::create_dir_all(&home).unwrap();
    let args: Vec<String> = ["logs", app, "-f", "--json", "-n", "0"].iter().map(|s| s.to_string()).collect();
    let server_url = server.api("");
    let home = home.display().to_string();
    let env = [("CLOUDWEB_SERVER", server_url.as_str()), ("CLOUDWEB_TOKEN", server.admin_token.as_str()), ("HOME", home.as_str()), ("XDG_CONFIG_HOME", home.as_str())];
    Process::spawn_with_env(&bin("cloudweb"), &args, &env, dir.join(format!("{name}.log"))).unwrap()
}

/// The tick numbers the CLI printed, in order.
fn cli_ticks(output: &str) -> Vec<u64> {
    output
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter_map(|v| v["line"].as_str()?.strip_prefix("tick ")?.parse().ok())
        .collect()
}

/// A follower whose control plane does not come back: a bounded number of
/// reconnects (about half a minute), then exit 1 with what happened.
#[tokio::test]
async fn a_follower_gives_up_when_the_control_plane_stays_away() {
    let Platform { tmp, git, mut server } = start_platform(&[]).await.unwrap();
    let app = unique_name("gone");
    git.commit("gone", &[("Dockerfile", DOCKERFILE)], "app").unwrap();
    let (status, body) = server.call(Method::POST, "/api/apps", Some(json!({"name": app, "repo_url": git.url("gone"), "port": 8080}))).await.unwrap();
    assert_eq!(status, 201, "{body}");
    let mut follower = cli_follow(&server, tmp.path(), &app, "follow-gone");
    // Connected: the server answered its stream request (a refused first
    // connection ends it at once, without reconnects).
    let (pid, port) = (follower.pid(), server.api_port);
    wait_for(Duration::from_secs(30), "the follower's stream to be answered", || async { answered(pid, port).then_some(()) })
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", follower.log_text()));
    assert!(follower.is_running(), "{}", follower.log_text());
    server.process.kill();
    let lost = std::time::Instant::now();
    let status = follower.wait_exit(Duration::from_secs(90)).await;
    let waited = lost.elapsed();
    let output = follower.log_text();
    assert_eq!(status.and_then(|s| s.code()), Some(1), "{output}");
    assert_eq!(output.matches("reconnecting in").count(), 7, "{output}");
    assert!(output.contains("7 reconnects over 31 s failed, giving up"), "{output}");
    assert!((Duration::from_secs(25)..Duration::from_secs(60)).contains(&waited), "gave up after {waited:?}: {output}");
}

/// Whether process `pid` holds a TCP connection to `port` on which it has
/// received bytes (the answer to its request), from `ss`.
fn answered(pid: u32, port: u16) -> bool {
    let output = std::process::Command::new("ss")
        .args(["-H", "-t", "-n", "-p", "-i", "-O", "state", "established", "dport", "=", &format!(":{port}")])
        .output()
        .unwrap();
    assert!(output.status.success(), "ss: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8_lossy(&output.stdout).lines().any(|line| {
        line.contains(&format!("pid={pid},"))
            && line.split_whitespace().any(|field| field.strip_prefix("bytes_received:").and_then(|n| n.parse::<u64>().ok()).is_some_and(|n| n > 0))
    })
}
