//! What the managed-services tests share: the local database images, a
//! node that runs services, and the calls they all make.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use reqwest::Method;
use serde_json::Value;

use crate::{bin, wait_for, AgentNode, ServerProcess};

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

/// A `--service-ports` range of two ports no other test holds.
pub fn service_ports() -> String {
    let first = crate::ports::reserve_run(2);
    format!("{first}-{}", first + 1)
}

/// A user API call that must get an answer: its status and body.
pub async fn call(server: &ServerProcess, method: Method, path: &str, body: Option<Value>) -> (u16, Value) {
    server.call(method, path, body).await.unwrap()
}

/// Waits until service `name`'s view passes `done`; the view.
pub async fn until<F>(server: &ServerProcess, agent: &AgentNode, name: &str, what: &str, limit: Duration, done: F) -> Value
where
    F: Fn(&Value) -> bool,
{
    wait_for(limit, &format!("service {name}: {what}"), || async {
        let (_, view) = server.call(Method::GET, &format!("/api/services/{name}"), None).await.ok()?;
        done(&view).then_some(view)
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\nagent log:\n{}", agent.log_text()))
}

/// SQL in PostgreSQL service `service`'s own container (its socket trusts
/// local users): the tuples' text, or psql's error.
pub fn psql_in(service: &str, sql: &str) -> Result<String, String> {
    let out = Command::new("docker")
        .args(["exec", &format!("cw-svc.{service}"), "psql", "-U", "app", "-d", "app", "-v", "ON_ERROR_STOP=1", "-tAc", sql])
        .output()
        .map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).to_string())
    }
}

/// The newest running deployment of an app that serves the URL it got at
/// `/url`, other than `not`: its id and that URL.
pub async fn running_url(server: &ServerProcess, app: &str, not: Option<&str>) -> (String, String) {
    wait_for(Duration::from_secs(120), &format!("a new running deployment of {app}"), || async {
        let (_, list) = server.call(Method::GET, &format!("/api/apps/{app}/deployments"), None).await.ok()?;
        // Newest first.
        let newest = list["deployments"].as_array()?.iter().find(|d| d["state"] == "running")?.clone();
        let id = newest["id"].as_str()?.to_string();
        if Some(id.as_str()) == not {
            return None;
        }
        let (_, deployment) = server.call(Method::GET, &format!("/api/deployments/{id}"), None).await.ok()?;
        let address = deployment["instances"][0]["address"].as_str()?.to_string();
        let url = reqwest::get(format!("http://{address}/url")).await.ok()?.text().await.ok()?.trim().to_string();
        Some((id, url))
    })
    .await
    .unwrap()
}

/// The `cloudweb` command line against `server`, as its admin: exit code,
/// standard output and standard error.
pub fn cli(server: &ServerProcess, args: &[&str]) -> (i32, String, String) {
    let home = server.dir.join("cli-home");
    std::fs::create_dir_all(&home).unwrap();
    let out = Command::new(bin("cloudweb"))
        .args(args)
        .env("HOME", &home)
        .env("XDG_CONFIG_HOME", &home)
        .env("CLOUDWEB_SERVER", server.api(""))
        .env("CLOUDWEB_TOKEN", &server.admin_token)
        .output()
        .unwrap();
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}
