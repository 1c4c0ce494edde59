//! Issue 22, volumes, end to end with the real binaries and Docker: an
//! app's files on a volume outlive blue/green redeploys and the app
//! itself, a kept volume carries its data into another app, and its data
//! goes only when the volume is deleted by name.

use std::time::Duration;

use cloudweb_e2e::{start_platform, unique_name, wait_for, AgentNode, Platform, ServerProcess};
use reqwest::Method;
use serde_json::{json, Value};

const AGENT_FLAGS: [&str; 6] = ["--heartbeat-interval-seconds", "1", "--publish-ip", "127.0.0.1", "--advertise-host", "127.0.0.1"];

/// Each container that starts appends its host name (its container id) to
/// a file on the volume, then serves the volume's files.
const DOCKERFILE: &str = "FROM cloudweb-test/busybox:latest\n\
CMD [\"sh\", \"-c\", \"mkdir -p /data/www && hostname >> /data/www/boots && exec httpd -f -p 8080 -h /data/www\"]\n";

async fn call(server: &ServerProcess, method: Method, path: &str, body: Option<Value>) -> (u16, Value) {
    server.call(method, path, body).await.unwrap()
}

async fn deploy_and_run(server: &ServerProcess, agent: &AgentNode, app: &str) -> Value {
    server.deploy_and_settle(app, None).await.unwrap_or_else(|e| panic!("{e}\nagent log:\n{}", agent.log_text()))
}

/// The lines of `boots` as the running instance serves them.
async fn boots(deployment: &Value) -> Vec<String> {
    let address = deployment["instances"][0]["address"].as_str().unwrap();
    let text = reqwest::get(format!("http://{address}/boots")).await.unwrap().text().await.unwrap();
    text.lines().map(str::to_string).collect()
}

#[tokio::test]
async fn files_on_a_volume_outlive_redeploys_and_the_app_and_go_only_when_deleted() {
    let Platform { tmp, git, server } = start_platform(&[]).await.unwrap();
    let (token, ca) = server.join_token().await.unwrap();
    let mut agent = AgentNode::join(&server, &tmp.path().join("node"), "disk", &token, &ca, &[]).unwrap().unwrap();
    agent.start(&AGENT_FLAGS).unwrap();
    let node_id = agent.node_id.clone();
    wait_for(Duration::from_secs(20), "the node to report volumes", || async {
        let node = server.node(&node_id).await.ok()?;
        (node["state"] == "ready" && node["features"].as_array()?.iter().any(|f| f == "volumes")).then_some(())
    })
    .await
    .unwrap();
    git.commit("stateful", &[("Dockerfile", DOCKERFILE)], "keeps files").unwrap();
    let app = unique_name("files");
    let volume = unique_name("vol");
    let (status, body) = call(&server, Method::POST, "/api/apps", Some(json!({"name": app, "repo_url": git.url("stateful"), "port": 8080}))).await;
    assert_eq!(status, 201, "{body}");
    let (status, body) = call(&server, Method::POST, &format!("/api/apps/{app}/volumes"), Some(json!({"name": volume, "path": "/data"}))).await;
    assert_eq!(status, 201, "{body}");

    let first = deploy_and_run(&server, &agent, &app).await;
    assert_eq!(boots(&first).await.len(), 1, "one container has started");
    let on_disk = agent.dir.join("volumes").join(&volume).join("www/boots");
    assert!(on_disk.is_file(), "the data is in the agent's volume directory: {}", on_disk.display());

    // Blue/green: the new container starts while the old one still runs,
    // both on the same files.
    let second = deploy_and_run(&server, &agent, &app).await;
    let lines = boots(&second).await;
    assert_eq!(lines.len(), 2, "the second container saw the first one's file: {lines:?}");
    assert_ne!(lines[0], lines[1], "two different containers: {lines:?}");
    let (_, listed) = call(&server, Method::GET, "/api/volumes", None).await;
    let row = listed["volumes"].as_array().unwrap().iter().find(|v| v["name"] == volume.as_str()).cloned().unwrap();
    assert_eq!(row["node_id"], node_id.as_str(), "{row}");
    assert_eq!(row["app"], app.as_str());

    // The app goes, its volume stays (detached) with its data.
    let (status, answer) = call(&server, Method::DELETE, &format!("/api/apps/{app}"), None).await;
    assert_eq!(status, 409, "{answer}");
    let (status, answer) = call(&server, Method::DELETE, &format!("/api/apps/{app}?volumes=keep"), None).await;
    assert_eq!(status, 204, "{answer}");
    let (_, row) = call(&server, Method::GET, "/api/volumes", None).await;
    assert_eq!(row["volumes"][0]["state"], "detached", "{row}");
    assert!(on_disk.is_file(), "kept");

    // Another app takes it over, with the data.
    let heir = unique_name("heir");
    let (status, body) = call(&server, Method::POST, "/api/apps", Some(json!({"name": heir, "repo_url": git.url("stateful"), "port": 8080}))).await;
    assert_eq!(status, 201, "{body}");
    let (status, body) = call(&server, Method::POST, &format!("/api/apps/{heir}/volumes"), Some(json!({"name": volume, "path": "/data"}))).await;
    assert_eq!(status, 200, "attached again, not created: {body}");
    let third = deploy_and_run(&server, &agent, &heir).await;
    assert_eq!(boots(&third).await.len(), 3, "the heir sees the earlier boots");

    // Attached: not deletable. Deleted with the app: the node removes the
    // data once the app's containers are gone.
    let (status, _) = call(&server, Method::DELETE, &format!("/api/volumes/{volume}"), None).await;
    assert_eq!(status, 409);
    let (status, answer) = call(&server, Method::DELETE, &format!("/api/apps/{heir}?volumes=delete"), None).await;
    assert_eq!(status, 204, "{answer}");
    let volume_dir = agent.dir.join("volumes").join(&volume);
    wait_for(Duration::from_secs(60), "the node to delete the volume's data", || async { (!volume_dir.exists()).then_some(()) })
        .await
        .unwrap_or_else(|e| panic!("{e}\nagent log:\n{}", agent.log_text()));
    assert!(agent.log_text().contains("deleted the volume's data on request"), "{}", agent.log_text());
}

/// `rollout: recreate`: the old instance stops before the new one starts
/// (they never share the files), and the deployment's log says how long
/// the app was down.
#[tokio::test]
async fn a_recreate_rollout_stops_the_old_instance_first_and_logs_the_downtime() {
    let Platform { tmp, git, server } = start_platform(&[]).await.unwrap();
    let (token, ca) = server.join_token().await.unwrap();
    let mut agent = AgentNode::join(&server, &tmp.path().join("node"), "single", &token, &ca, &[]).unwrap().unwrap();
    agent.start(&AGENT_FLAGS).unwrap();
    let node_id = agent.node_id.clone();
    wait_for(Duration::from_secs(20), "the node to be ready", || async {
        let node = server.node(&node_id).await.ok()?;
        (node["state"] == "ready" && node["features"].as_array()?.iter().any(|f| f == "volumes")).then_some(())
    })
    .await
    .unwrap();
    // Each container counts the others it finds running on the files.
    let dockerfile = "FROM cloudweb-test/busybox:latest\n\
CMD [\"sh\", \"-c\", \"mkdir -p /data/www && ls /data/running-* 2>/dev/null | wc -l >> /data/www/overlaps && touch /data/running-$(hostname) && exec httpd -f -p 8080 -h /data/www\"]\n";
    git.commit("single", &[("Dockerfile", dockerfile)], "one at a time").unwrap();
    let app = unique_name("alone");
    let (status, body) = call(&server, Method::POST, "/api/apps", Some(json!({"name": app, "repo_url": git.url("single"), "port": 8080, "rollout": "maybe"}))).await;
    assert_eq!(status, 400, "an unknown rollout is refused: {body}");
    let (status, body) = call(&server, Method::POST, "/api/apps", Some(json!({"name": app, "repo_url": git.url("single"), "port": 8080, "rollout": "recreate"}))).await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["rollout"], "recreate");
    let (status, _) = call(&server, Method::POST, &format!("/api/apps/{app}/volumes"), Some(json!({"name": unique_name("one"), "path": "/data"}))).await;
    assert_eq!(status, 201);
    deploy_and_run(&server, &agent, &app).await;
    let second = deploy_and_run(&server, &agent, &app).await;
    let address = second["instances"][0]["address"].as_str().unwrap();
    let overlaps = reqwest::get(format!("http://{address}/overlaps")).await.unwrap().text().await.unwrap();
    // The first container found none; the second found only the first's
    // marker file (left behind: it was stopped, not still running).
    assert_eq!(overlaps.split_whitespace().collect::<Vec<_>>(), ["0", "1"], "{overlaps}");
    let id = second["id"].as_str().unwrap();
    let log = server
        .http
        .get(server.api(&format!("/api/deployments/{id}/logs")))
        .bearer_auth(&server.admin_token)
        .timeout(Duration::from_secs(30))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(log.contains("recreate: stopped 1 older instance(s)"), "{log}");
    let downtime: u64 = log
        .split("recreate: downtime ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|ms| ms.parse().ok())
        .unwrap_or_else(|| panic!("no downtime line: {log}"));
    eprintln!("recreate downtime: {downtime} ms");
    // Blue/green is the default and the old instance still ran when the
    // new one started: switched back, a third deploy overlaps.
    let (status, body) = call(&server, Method::PATCH, &format!("/api/apps/{app}"), Some(json!({"rollout": "blue-green"}))).await;
    assert_eq!(status, 200, "{body}");
    let third = deploy_and_run(&server, &agent, &app).await;
    let address = third["instances"][0]["address"].as_str().unwrap();
    let overlaps = reqwest::get(format!("http://{address}/overlaps")).await.unwrap().text().await.unwrap();
    assert_eq!(overlaps.split_whitespace().last(), Some("2"), "{overlaps}");
}
