//! What the managed-services tests share: the local database images and a
//! node that runs services.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::{wait_for, AgentNode, ServerProcess};

/// Agent flags of the services tests' nodes: quick heartbeats, services
/// published on loopback.
pub const AGENT_FLAGS: [&str; 6] = ["--heartbeat-interval-seconds", "1", "--publish-ip", "127.0.0.1", "--advertise-host", "127.0.0.1"];

/// Builds (or finds cached) the local PostgreSQL, Redis and MariaDB images
/// (`scripts/service-images.sh`).
pub fn ensure_service_images() {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/service-images.sh");
    let out = Command::new("bash").arg(&script).output().expect("bash runs");
    assert!(out.status.success(), "service-images.sh: {}", String::from_utf8_lossy(&out.stderr));
}

/// Joins and starts a node, and waits until it reports the `services`
/// feature.
pub async fn services_node(server: &ServerProcess, dir: &Path, name: &str) -> AgentNode {
    let (token, ca) = server.join_token().await.unwrap();
    let mut agent = AgentNode::join(server, &dir.join("node"), name, &token, &ca, &[]).unwrap().unwrap();
    agent.start(&AGENT_FLAGS).unwrap();
    let node_id = agent.node_id.clone();
    wait_for(Duration::from_secs(20), "the node to run services", || async {
        let node = server.node(&node_id).await.ok()?;
        (node["state"] == "ready" && node["features"].as_array()?.iter().any(|f| f == "services")).then_some(())
    })
    .await
    .unwrap();
    agent
}
