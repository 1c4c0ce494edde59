//! Issue 22, volumes, with the control plane in process and nodes spoken
//! for by the test: an app with a volume is pinned to the node that got
//! its first placement, its deploy commands carry the mount, it waits for
//! that node instead of starting elsewhere with empty data, and nothing
//! deletes a volume unless asked by name.

use std::time::Duration;

use cloudweb_e2e::control::{Control, HandNode};
use reqwest::Method;
use serde_json::{json, Value};

/// Heartbeats every 300 ms with the `volumes` feature until aborted.
fn beat(cp: &Control, node: &HandNode) -> tokio::task::JoinHandle<()> {
    let client = node.client.clone();
    let url = cp.agent_url("/agent/v1/heartbeat");
    tokio::spawn(async move {
        loop {
            // The disk is 85 % full: volumes there carry a warning.
            let body = json!({"cpu_cores": 4, "mem_bytes": 8u64 << 30, "disk_bytes": 100u64 << 30,
                              "health": {"features": ["static-sites", "volumes"]},
                              "metrics": {"node": {"disk_used": 85u64 << 30}}})
            .to_string();
            let _ = client.send(Method::POST, &url, &[], Some(&body)).await;
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    })
}

/// The node's queued commands, as the node reads them.
async fn commands(cp: &Control, node: &HandNode) -> Vec<Value> {
    let (status, text) = node.client.send(Method::GET, &cp.agent_url("/agent/v1/commands"), &[], None).await.unwrap();
    assert_eq!(status, 200, "{text}");
    let list: Value = serde_json::from_str(&text).unwrap();
    list["commands"].as_array().unwrap().clone()
}

async fn until(what: &str, seconds: u64, mut check: impl AsyncFnMut() -> Option<Value>) -> Value {
    let start = std::time::Instant::now();
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(start.elapsed() < Duration::from_secs(seconds), "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn deploy(cp: &Control, app: &str) -> String {
    let (status, body) = cp.call(Method::POST, &format!("/api/apps/{app}/deploy"), None).await;
    assert_eq!(status, 201, "{body}");
    body["id"].as_str().unwrap().to_string()
}

#[tokio::test]
async fn an_app_with_a_volume_stays_on_its_node_and_waits_for_it() {
    let dir = tempfile::tempdir().unwrap();
    let cp = Control::start(dir.path(), |c| {
        c.unreachable_after = Duration::from_secs(3);
        c.placement_wait = Duration::from_secs(4);
    })
    .await;
    let a = cp.join("a").await;
    let b = cp.join("b").await;
    let beats = [beat(&cp, &a), beat(&cp, &b)];
    let nodes = [&a, &b];
    until("both nodes ready", 10, async || {
        let (_, list) = cp.call(Method::GET, "/api/nodes", None).await;
        let ready = list["nodes"].as_array()?.iter().filter(|n| n["state"] == "ready").count();
        (ready == 2).then_some(Value::Null)
    })
    .await;

    assert_eq!(cp.create_app("keeper", json!({})).await.0, 201);
    // Bad volumes are refused and change nothing.
    for (body, status, fragment) in [
        (json!({"name": "Data", "path": "/data"}), 400, "volume"),
        (json!({"name": "data", "path": "relative"}), 400, "absolute"),
        (json!({"name": "data", "path": "/proc/x"}), 400, "/proc"),
        (json!({"name": "data", "path": "/a/../b"}), 400, ".."),
        (json!({"name": "data", "path": "/data", "size": 1}), 400, "size"),
    ] {
        let (got, answer) = cp.call(Method::POST, "/api/apps/keeper/volumes", Some(body.clone())).await;
        assert_eq!(got, status, "{body} -> {answer}");
        assert!(answer["error"].as_str().unwrap_or("").contains(fragment), "{body} -> {answer}");
    }
    let (status, answer) = cp.call(Method::POST, "/api/apps/nosuch/volumes", Some(json!({"name": "data", "path": "/data"}))).await;
    assert_eq!(status, 404, "{answer}");
    let (_, list) = cp.call(Method::GET, "/api/volumes", None).await;
    assert_eq!(list["volumes"], json!([]), "{list}");

    let (status, volume) = cp.call(Method::POST, "/api/apps/keeper/volumes", Some(json!({"name": "data", "path": "/data"}))).await;
    assert_eq!(status, 201, "{volume}");
    assert_eq!(volume["state"], "attached");
    assert_eq!(volume["node_id"], Value::Null, "no node before the first placement: {volume}");
    let (status, answer) = cp.call(Method::POST, "/api/apps/keeper/volumes", Some(json!({"name": "logs", "path": "/data"}))).await;
    assert_eq!(status, 409, "the path is taken: {answer}");

    // The first placement pins the volume; the command carries the mount.
    let first = deploy(&cp, "keeper").await;
    let placed = cp.deployment_until(&first, 10, "the instance to be placed", |d| d["instances"][0]["node_id"].is_string()).await;
    let home_id = placed["instances"][0]["node_id"].as_str().unwrap().to_string();
    let (home, other) = if home_id == a.id { (0, 1) } else { (1, 0) };
    let (_, list) = cp.call(Method::GET, "/api/apps/keeper/volumes", None).await;
    assert_eq!(list["volumes"][0]["node_id"], home_id.as_str(), "{list}");
    let warning = list["volumes"][0]["warning"].as_str().unwrap_or_else(|| panic!("no disk warning: {list}"));
    assert!(warning.contains("85% full (over 80%)"), "{warning}");
    let sent = commands(&cp, nodes[home]).await;
    let deploy_command = sent.iter().find(|c| c["type"] == "deploy" && c["payload"]["deployment_id"] == first.as_str()).expect("a deploy command");
    assert_eq!(deploy_command["payload"]["volumes"], json!([{"name": "data", "path": "/data"}]), "{deploy_command}");
    cp.run_on(nodes[home], &first, 1).await;
    cp.deployment_until(&first, 10, "the deployment to run", |d| d["state"] == "running").await;

    // More instances all go to the volume's node, even when the other
    // node is emptier.
    let (status, body) = cp.call(Method::PATCH, "/api/apps/keeper", Some(json!({"instances": 3}))).await;
    assert_eq!(status, 200, "{body}");
    let second = deploy(&cp, "keeper").await;
    cp.run_on(nodes[home], &second, 1).await;
    let spread = cp.deployment_until(&second, 10, "three instances placed", |d| d["instances"].as_array().is_some_and(|i| i.len() == 3 && i.iter().all(|i| i["node_id"].is_string()))).await;
    for instance in spread["instances"].as_array().unwrap() {
        assert_eq!(instance["node_id"], home_id.as_str(), "{spread}");
    }
    for n in 2..=3 {
        cp.run_on(nodes[home], &second, n).await;
    }
    cp.deployment_until(&second, 10, "the second deployment to run", |d| d["state"] == "running").await;

    // The volume's node goes silent: the app is not started elsewhere; it
    // waits and says for what.
    beats[home].abort();
    let app = until("the app to wait for its node", 20, async || {
        let (_, app) = cp.call(Method::GET, "/api/apps/keeper", None).await;
        app["waiting"].as_str().is_some_and(|w| w.contains("holds volume data")).then_some(app)
    })
    .await;
    let waiting = app["waiting"].as_str().unwrap();
    assert!(waiting.contains(&format!("waiting for node {}", ["a", "b"][home])), "{waiting}");
    assert!(waiting.contains("unreachable"), "{waiting}");
    // A few reconcile passes later, still nothing on the other node.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        commands(&cp, nodes[other]).await.iter().all(|c| c["type"] != "deploy"),
        "nothing of the app was sent to the node without its volume"
    );
    // A new deploy meanwhile waits, then fails naming the volume's node.
    let third = deploy(&cp, "keeper").await;
    let failed = cp.deployment_until(&third, 15, "the deploy to fail", |d| d["state"] == "failed").await;
    let error = failed["error"].as_str().unwrap();
    assert!(error.contains("which holds volume data"), "{error}");
    assert!(commands(&cp, nodes[other]).await.iter().all(|c| c["type"] != "deploy"));

    // Deleting the app: refused without saying what becomes of the
    // volume; a bad choice is a 400.
    let (status, answer) = cp.call(Method::DELETE, "/api/apps/keeper", None).await;
    assert_eq!(status, 409, "{answer}");
    assert!(answer["error"].as_str().unwrap().contains("data"), "names the volume: {answer}");
    let (status, answer) = cp.call(Method::DELETE, "/api/apps/keeper?volumes=maybe", None).await;
    assert_eq!(status, 400, "{answer}");
    assert!(cp.call(Method::GET, "/api/apps/keeper", None).await.0 == 200, "nothing was deleted");

    // A second app's volume lands on the node that is still up.
    assert_eq!(cp.create_app("other", json!({})).await.0, 201);
    let (status, _) = cp.call(Method::POST, "/api/apps/other/volumes", Some(json!({"name": "elsewhere", "path": "/srv"}))).await;
    assert_eq!(status, 201);
    let dep = deploy(&cp, "other").await;
    let placed = cp.deployment_until(&dep, 10, "the other app placed", |d| d["instances"][0]["node_id"].is_string()).await;
    assert_eq!(placed["instances"][0]["node_id"], nodes[other].id.as_str(), "{placed}");
    // Kept on delete: detached, with its node.
    let (status, answer) = cp.call(Method::DELETE, "/api/apps/other?volumes=keep", None).await;
    assert_eq!(status, 204, "{answer}");
    let (_, list) = cp.call(Method::GET, "/api/volumes", None).await;
    let kept = list["volumes"].as_array().unwrap().iter().find(|v| v["name"] == "elsewhere").cloned().expect("kept");
    assert_eq!(kept["state"], "detached", "{kept}");
    assert_eq!(kept["app"], Value::Null);
    assert_eq!(kept["node_id"], nodes[other].id.as_str());
    // It cannot join keeper, whose data is on the other node.
    let (status, answer) = cp.call(Method::POST, "/api/apps/keeper/volumes", Some(json!({"name": "elsewhere", "path": "/srv"}))).await;
    assert_eq!(status, 409, "{answer}");
    assert!(answer["error"].as_str().unwrap().contains("must be on one node"), "{answer}");
    // Deleted by name: the node that holds it gets the command.
    let (status, _) = cp.call(Method::DELETE, "/api/volumes/data", None).await;
    assert_eq!(status, 409, "an attached volume is not deleted");
    let (status, answer) = cp.call(Method::DELETE, "/api/volumes/elsewhere", None).await;
    assert_eq!(status, 204, "{answer}");
    let sent = commands(&cp, nodes[other]).await;
    assert!(sent.iter().any(|c| c["type"] == "volume_delete" && c["payload"] == json!({"volume": "elsewhere"})), "{sent:?}");
    assert_eq!(cp.call(Method::DELETE, "/api/volumes/elsewhere", None).await.0, 404);

    // keeper deleted with volumes=delete: the volume and a delete command
    // for its (silent) node, which carries it out when it is back.
    let (status, answer) = cp.call(Method::DELETE, "/api/apps/keeper?volumes=delete", None).await;
    assert_eq!(status, 204, "{answer}");
    let (_, list) = cp.call(Method::GET, "/api/volumes", None).await;
    assert_eq!(list["volumes"], json!([]), "{list}");
    let sent = commands(&cp, nodes[home]).await;
    assert!(sent.iter().any(|c| c["type"] == "volume_delete" && c["payload"] == json!({"volume": "data"})), "{sent:?}");
    for beat in beats {
        beat.abort();
    }
}
