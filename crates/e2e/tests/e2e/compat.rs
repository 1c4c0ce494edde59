//! Compatibility with the previous release (`RELEASES`, last line), both
//! ways: this build's control plane with the previous release's agent, and
//! the previous release's control plane with this build's agent. Each pair
//! goes through a join, heartbeats, a deploy (its command delivered and
//! acknowledged), a stop command and its acknowledgement; then the 426 path
//! when the two sides' protocol ranges do not meet.
//!
//! The previous release's binaries come from `CLOUDWEB_PREVIOUS_BIN_DIR`,
//! which `scripts/compat-build.sh` builds from the repository's own history
//! (cached by commit) and `scripts/test.sh` sets. Both releases speak
//! protocol 1, so the non-overlapping ranges are simulated on the new side
//! only: the new control plane accepts `--agent-protocols 2-2`, the new
//! agent announces `--speak-protocol 2`; the previous release runs as it
//! was released.

use std::path::PathBuf;
use std::time::Duration;

use cloudweb_e2e::{bin, docker, previous_bin_dir, run_agent_program, start_platform_with, unique_name, wait_for, AgentNode, Platform};
use reqwest::Method;
use serde_json::{json, Value};

const DOCKERFILE: &str = "FROM cloudweb-test/busybox:latest\nCOPY index.html /www/index.html\nCMD [\"httpd\", \"-f\", \"-p\", \"8080\", \"-h\", \"/www\"]\n";
const AGENT_FLAGS: [&str; 6] = ["--heartbeat-interval-seconds", "1", "--publish-ip", "127.0.0.1", "--advertise-host", "127.0.0.1"];
const NEW_VERSION: &str = env!("CARGO_PKG_VERSION");

/// The previous release: its version (from `RELEASES`) and binaries.
struct Previous {
    version: String,
    dir: PathBuf,
}

fn previous() -> Previous {
    let dir = previous_bin_dir().expect(
        "CLOUDWEB_PREVIOUS_BIN_DIR is not set: run `scripts/test.sh` (which builds the previous release with \
         scripts/compat-build.sh), or `export CLOUDWEB_PREVIOUS_BIN_DIR=$(bash scripts/compat-build.sh)` first",
    );
    let releases = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../RELEASES")).expect("RELEASES");
    let version = releases
        .lines()
        .rfind(|l| !l.trim().is_empty() && !l.starts_with('#'))
        .and_then(|l| l.split_whitespace().next())
        .expect("a release in RELEASES")
        .to_string();
    for name in ["cloudweb-server", "cloudweb-agent"] {
        assert!(dir.join(name).is_file(), "{} is missing", dir.join(name).display());
    }
    // The binaries really are that release.
    let output = std::process::Command::new(dir.join("cloudweb-agent")).arg("--version").output().unwrap();
    let printed = String::from_utf8_lossy(&output.stdout).to_string();
    assert!(printed.trim().ends_with(&version), "{} --version printed {printed:?}, RELEASES says {version}", dir.display());
    assert_ne!(version, NEW_VERSION, "the previous release has this build's version");
    Previous { version, dir }
}

/// One pair: `server` and `agent` binaries, the versions each reports.
async fn exercise(server_bin: PathBuf, agent_bin: PathBuf, agent_version: &str) {
    let Platform { tmp, git, server } = start_platform_with(&server_bin, &["--placement-wait-seconds", "30"]).await.unwrap();

    // Join and heartbeats.
    let (token, ca) = server.join_token().await.unwrap();
    let mut agent = AgentNode::join_program(&agent_bin, &server, &tmp.path().join("node"), "node-0", &token, &ca, &[])
        .unwrap()
        .unwrap_or_else(|output| panic!("join failed:\n{output}"));
    agent.start(&AGENT_FLAGS).unwrap();
    let node = agent.node_id.clone();
    let view = wait_for(Duration::from_secs(30), "the node to be ready with a heartbeat", || async {
        let view = server.node(&node).await.ok()?;
        (view["state"] == "ready" && view["last_heartbeat"].is_string() && view["capacity"].is_object()).then_some(view)
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\nagent:\n{}\nserver:\n{}", agent.log_text(), server.process.log_text()));
    assert_eq!(view["version"], agent_version, "{view}");
    assert_eq!(view["protocol"], 1, "{view}");

    // A deploy: its command is delivered, run and acknowledged.
    let app = unique_name("compat");
    git.commit(&app, &[("Dockerfile", DOCKERFILE), ("index.html", "compatible\n")], "first").unwrap();
    let (status, body) = server
        .call(Method::POST, "/api/apps", Some(json!({"name": app, "repo_url": git.url(&app), "port": 8080, "health_timeout_seconds": 20})))
        .await
        .unwrap();
    assert_eq!(status, 201, "{body}");
    let (status, body) = server.call(Method::POST, &format!("/api/apps/{app}/deploy"), None).await.unwrap();
    assert!(status == 201 || status == 202, "{status} {body}");
    let deployment = body["id"].as_str().unwrap().to_string();
    let running = wait_for(Duration::from_secs(180), "the deployment to run", || async {
        let (_, d) = server.call(Method::GET, &format!("/api/deployments/{deployment}"), None).await.ok()?;
        (d["state"] == "running" || d["state"] == "failed").then_some(d)
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\nagent:\n{}\nserver:\n{}", agent.log_text(), server.process.log_text()));
    assert_eq!(running["state"], "running", "{running}\nagent:\n{}", agent.log_text());
    // The app serves its page at the address the deployment view gives
    // (both releases' views have `address`, host:port).
    let address = running["instances"][0]["address"].as_str().unwrap_or_else(|| panic!("no instance address: {running}"));
    let page = reqwest::get(format!("http://{address}/")).await.unwrap().text().await.unwrap();
    assert_eq!(page, "compatible\n", "the page at {address}");
    // The agent acknowledges a deploy command once its last report is in,
    // which can land just after the server saw `running`.
    let acked = wait_for(Duration::from_secs(30), "the deploy command's ack", || async {
        let commands = acked_commands(&server, &node).await;
        commands.iter().any(|c| c["type"] == "deploy" && c["acked_at"].is_string()).then_some(())
    })
    .await;
    assert!(acked.is_ok(), "{:?}", acked_commands(&server, &node).await);

    // A stop command queued by hand: delivered, run, acknowledged.
    let (status, body) = server
        .call(Method::POST, &format!("/api/nodes/{node}/commands"), Some(json!({"type": "stop", "payload": {"deployment_id": deployment, "reason": "compatibility test"}})))
        .await
        .unwrap();
    assert_eq!(status, 201, "{body}");
    let stop_id = body["id"].as_str().unwrap().to_string();
    wait_for(Duration::from_secs(60), "the stop command to be acknowledged", || async {
        let commands = acked_commands(&server, &node).await;
        commands.iter().any(|c| c["id"] == stop_id.as_str() && c["acked_at"].is_string()).then_some(())
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\nagent:\n{}", agent.log_text()));
    wait_for(Duration::from_secs(30), "the instance to be stopped", || async { (containers_of(&deployment) == 0).then_some(()) })
        .await
        .unwrap();
    agent.kill();
    agent.remove_containers();
}

async fn acked_commands(server: &cloudweb_e2e::ServerProcess, node: &str) -> Vec<Value> {
    let (_, body) = server.call(Method::GET, &format!("/api/nodes/{node}/commands"), None).await.unwrap();
    body["commands"].as_array().cloned().unwrap_or_default()
}

/// One line of the matrix that ran, in `CLOUDWEB_COMPAT_SUMMARY` (the test
/// script prints the file at the end) and on stdout.
fn summary(line: &str) {
    use std::io::Write;
    println!("compat: {line}");
    if let Some(path) = std::env::var_os("CLOUDWEB_COMPAT_SUMMARY") {
        if let Ok(mut file) = std::fs::OpenOptions::new().create(true).append(true).open(path) {
            let _ = writeln!(file, "compat: {line}");
        }
    }
}

fn containers_of(deployment: &str) -> usize {
    docker::ps(&["-q", "--filter", &format!("label=cloudweb.deployment={deployment}")]).len()
}

#[tokio::test]
async fn new_server_with_the_previous_agent() {
    let previous = previous();
    exercise(bin("cloudweb-server"), previous.dir.join("cloudweb-agent"), &previous.version).await;
    summary(&format!("server {NEW_VERSION} + agent {}: join, heartbeats, deploy (command acked), stop command acked: ok", previous.version));
}

#[tokio::test]
async fn previous_server_with_the_new_agent() {
    let previous = previous();
    exercise(previous.dir.join("cloudweb-server"), bin("cloudweb-agent"), NEW_VERSION).await;
    summary(&format!("server {} + agent {NEW_VERSION}: join, heartbeats, deploy (command acked), stop command acked: ok", previous.version));
}

/// New control plane that accepts only protocol 2 (simulated with
/// `--agent-protocols 2-2`): the previous agent's join gets 426 and says to
/// upgrade the agent; nothing is registered.
#[tokio::test]
async fn previous_agent_gets_426_from_a_server_without_its_protocol() {
    let previous = previous();
    let tmp = tempfile::tempdir().unwrap();
    let server = cloudweb_e2e::ServerProcess::start_with(tmp.path(), &["--agent-protocols", "2-2"]).await.unwrap();
    let (token, ca) = server.join_token().await.unwrap();
    let failed = AgentNode::join_program(&previous.dir.join("cloudweb-agent"), &server, &tmp.path().join("old"), "old", &token, &ca, &[])
        .unwrap()
        .err()
        .expect("the join must be refused");
    assert!(failed.contains("upgrade the agent"), "{failed}");
    assert!(failed.contains("426") || failed.contains("does not speak"), "{failed}");
    let (_, nodes) = server.call(Method::GET, "/api/nodes", None).await.unwrap();
    assert_eq!(nodes["nodes"], json!([]), "{nodes}");
    summary(&format!("server {NEW_VERSION} (simulated range 2-2) + agent {} (protocol 1): 426, upgrade the agent: ok", previous.version));
}

/// Previous control plane (protocol 1 only) and a new agent announcing
/// protocol 2 (simulated with `--speak-protocol 2`): 426, "upgrade the
/// control-plane", with the previous server's range in the body.
#[tokio::test]
async fn new_agent_gets_426_from_the_previous_server() {
    let previous = previous();
    let tmp = tempfile::tempdir().unwrap();
    let server = cloudweb_e2e::ServerProcess::start_program(
        &previous.dir.join("cloudweb-server"),
        tmp.path(),
        cloudweb_e2e::free_port(),
        cloudweb_e2e::free_port(),
        &[],
    )
    .await
    .unwrap();
    let (token, ca) = server.join_token().await.unwrap();
    let args: Vec<String> = [
        "--speak-protocol", "2", "--data-dir", &tmp.path().join("new").display().to_string(), "join", "--server", &server.url(),
        "--token", &token, "--ca-sha256", &ca, "--name", "new",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let finished = run_agent_program(&bin("cloudweb-agent"), &args).unwrap();
    assert!(!finished.success, "{}", finished.output);
    assert!(finished.output.contains("upgrade the control-plane"), "{}", finished.output);

    // The raw answer: 426 with the previous server's range.
    let client = cloudweb_e2e::RawClient::new(&server.ca_pem(), None);
    let (status, body) = client
        .send(Method::POST, &format!("{}/agent/v1/join", server.url()), &[("x-cloudweb-protocol", "2"), ("x-cloudweb-agent-version", NEW_VERSION)], Some("{}"))
        .await
        .unwrap();
    assert_eq!(status, 426, "{body}");
    let body: Value = serde_json::from_str(&body).unwrap();
    assert_eq!((body["supported_min"].as_u64(), body["supported_max"].as_u64()), (Some(1), Some(1)), "{body}");
    assert_eq!(body["upgrade"], "control-plane", "{body}");
    summary(&format!("server {} (range 1-1) + agent {NEW_VERSION} (simulated protocol 2): 426, upgrade the control-plane: ok", previous.version));
}
