//! The foundation end to end, with the real binaries: join, heartbeats,
//! commands delivered over SSE and acked once, and a command that survives
//! an agent crash and a control-plane restart until it is done.

use std::time::Duration;

use cloudweb_e2e::{wait_for, AgentNode, ServerProcess};
use reqwest::Method;
use serde_json::{json, Value};

async fn command_acks(server: &ServerProcess, node_id: &str, command_id: &str) -> Option<i64> {
    let (_, body) = server.call(Method::GET, &format!("/api/nodes/{node_id}/commands"), None).await.ok()?;
    body["commands"].as_array()?.iter().find(|c| c["id"] == command_id).and_then(|c| c["ack_count"].as_i64())
}

async fn enqueue_stop(server: &ServerProcess, node_id: &str, deployment: &str) -> String {
    let (status, body) = server
        .call(
            Method::POST,
            &format!("/api/nodes/{node_id}/commands"),
            Some(json!({"type": "stop", "payload": {"deployment_id": deployment}})),
        )
        .await
        .unwrap();
    assert_eq!(status, 201, "{body}");
    body["id"].as_str().unwrap().to_string()
}

#[tokio::test]
async fn join_heartbeat_and_commands_survive_restarts() {
    let tmp = tempfile::tempdir().unwrap();
    let mut server = ServerProcess::start(tmp.path()).await.unwrap();
    let (token, ca_sha256) = server.join_token().await.unwrap();
    let mut agent = AgentNode::join(&server, &tmp.path().join("alpha"), "alpha", &token, &ca_sha256, &[])
        .unwrap()
        .expect("join succeeds");
    let node_id = agent.node_id.clone();
    for file in ["node.key", "node.crt", "ca.crt", "node.json"] {
        let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(agent.dir.join(file)).unwrap().permissions());
        assert_eq!(mode & 0o777, 0o600, "{file}");
    }

    // A very long poll interval: anything that arrives fast came over SSE.
    let run_flags = ["--heartbeat-interval-seconds", "1", "--poll-interval-seconds", "3600"];
    agent.start(&run_flags).unwrap();

    let node: Value = wait_for(Duration::from_secs(5), "node ready with a heartbeat", || async {
        let node = server.node(&node_id).await.ok()?;
        (node["state"] == "ready" && !node["last_heartbeat"].is_null()).then_some(node)
    })
    .await
    .unwrap();
    assert_eq!(node["name"], "alpha");
    assert_eq!(node["protocol"], 1);
    assert_eq!(node["version"], env!("CARGO_PKG_VERSION"));
    assert!(node["capacity"]["cpu_cores"].as_u64().unwrap() >= 1);
    assert!(node["capacity"]["mem_bytes"].as_u64().unwrap() > 0);

    wait_for(Duration::from_secs(5), "two heartbeats", || async {
        (server.metric("cloudweb_heartbeats_total").await.ok()? >= 2.0).then_some(())
    })
    .await
    .unwrap();

    // Wait until the agent holds its stream, then queue a command.
    wait_for(Duration::from_secs(5), "event stream", || async { agent.log_text().contains("event stream connected").then_some(()) })
        .await
        .unwrap();
    let first = enqueue_stop(&server, &node_id, "dep-first").await;
    wait_for(Duration::from_secs(3), "first command acked via SSE", || async {
        (command_acks(&server, &node_id, &first).await? == 1).then_some(())
    })
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(command_acks(&server, &node_id, &first).await, Some(1), "acked exactly once");
    assert_eq!(agent.log_text().matches(&format!("command acked command={first}")).count(), 1);

    // The agent restarts without a usable Docker Engine: the command cannot
    // be carried out, so it must stay un-acked.
    agent.kill();
    agent.start(&["--heartbeat-interval-seconds", "1", "--poll-interval-seconds", "3600", "--docker-host", "unix:///nonexistent/docker.sock"]).unwrap();
    wait_for(Duration::from_secs(5), "event stream", || async { agent.log_text().contains("event stream connected").then_some(()) })
        .await
        .unwrap();
    let second = enqueue_stop(&server, &node_id, "dep-second").await;
    wait_for(Duration::from_secs(5), "the agent to try the command", || async {
        agent.log_text().contains("command will be retried").then_some(())
    })
    .await
    .unwrap();
    assert_eq!(command_acks(&server, &node_id, &second).await, Some(0));

    // Crash the agent and restart the control plane: the queue is durable.
    agent.kill();
    let (agent_port, api_port) = (server.agent_port, server.api_port);
    server.process.kill();
    server = ServerProcess::start_on(tmp.path(), agent_port, api_port, &[]).await.unwrap();
    assert_eq!(command_acks(&server, &node_id, &second).await, Some(0));

    agent.start(&run_flags).unwrap();
    wait_for(Duration::from_secs(5), "second command delivered again and acked", || async {
        (command_acks(&server, &node_id, &second).await? == 1).then_some(())
    })
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(command_acks(&server, &node_id, &first).await, Some(1), "the first command is not run again");
    assert_eq!(command_acks(&server, &node_id, &second).await, Some(1));
    assert!(agent.log_text().contains("stopped 0 container(s) of dep-second"));
}

#[tokio::test]
async fn heartbeats_are_written_in_batches_and_survive_a_restart() {
    let tmp = tempfile::tempdir().unwrap();
    let mut server = ServerProcess::start_with(tmp.path(), &["--heartbeat-flush-seconds", "4"]).await.unwrap();
    let (token, ca_sha256) = server.join_token().await.unwrap();
    let mut agent = AgentNode::join(&server, &tmp.path().join("beta"), "beta", &token, &ca_sha256, &[]).unwrap().unwrap();
    let commits_before = server.metric("cloudweb_store_commits_total").await.unwrap();
    let beats_before = server.metric("cloudweb_heartbeats_total").await.unwrap();
    let started = std::time::Instant::now();
    // No usage sample in the window: only heartbeats write.
    agent.start(&["--heartbeat-interval-seconds", "1", "--metrics-interval-seconds", "3600"]).unwrap();
    // Wait for a number of heartbeats, not for a time: a slow machine only
    // makes the batches bigger.
    wait_for(Duration::from_secs(90), "12 heartbeats", || async {
        (server.metric("cloudweb_heartbeats_total").await.ok()? - beats_before >= 12.0).then_some(())
    })
    .await
    .unwrap();
    let elapsed = started.elapsed().as_secs_f64();
    let commits = server.metric("cloudweb_store_commits_total").await.unwrap() - commits_before;
    let beats = server.metric("cloudweb_heartbeats_total").await.unwrap() - beats_before;
    // One batch every 4 s, whatever the number of heartbeats (+2: a flush
    // cut by the window's ends); a commit per heartbeat would be >= 12.
    assert!(commits <= (elapsed / 4.0).ceil() + 2.0, "{commits} commits for {beats} heartbeats in {elapsed:.1} s");
    assert!(commits * 2.0 <= beats, "{commits} commits for {beats} heartbeats: not batched");

    let before = server.node(&agent.node_id).await.unwrap();
    agent.kill();
    let (agent_port, api_port) = (server.agent_port, server.api_port);
    server.process.kill();
    let server = ServerProcess::start_on(tmp.path(), agent_port, api_port, &[]).await.unwrap();
    let after = server.node(&agent.node_id).await.unwrap();
    assert!(!after["last_heartbeat"].is_null(), "heartbeat persisted: {after}");
    assert_eq!(after["capacity"], before["capacity"]);
}
