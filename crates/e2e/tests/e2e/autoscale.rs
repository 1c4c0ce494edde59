//! Issue 25, autoscaling, end to end with the real binaries and Docker:
//! an app whose instances burn CPU is scaled up to its max (never above)
//! by the autoscaler, each change recorded with its reason; once the load
//! is gone it comes back down to its min (never below) after the down
//! window; a manual scale is refused while autoscaling is on, and bad
//! settings are refused.

use std::time::Duration;

use cloudweb_e2e::docker::docker;
use cloudweb_e2e::{start_platform, unique_name, wait_for, AgentNode, Platform, ServerProcess};
use reqwest::Method;
use serde_json::{json, Value};

const DOCKERFILE: &str = "FROM cloudweb-test/busybox:latest\nRUN mkdir -p /www && echo up > /www/index.html\nCOPY run.sh /run.sh\nCMD [\"sh\", \"/run.sh\"]\n";
/// Serves, and burns CPU while /tmp/burn exists.
const BURNS: &str = "touch /tmp/burn\nhttpd -f -p 8080 -h /www &\nwhile [ -f /tmp/burn ]; do :; done &\nwait\n";

async fn call(server: &ServerProcess, method: Method, path: &str, body: Option<Value>) -> (u16, Value) {
    server.call(method, path, body).await.unwrap()
}

/// The running instances of the app's running deployment.
async fn running(server: &ServerProcess, app: &str) -> Option<Vec<String>> {
    let (_, list) = server.call(Method::GET, &format!("/api/apps/{app}/top"), None).await.ok()?;
    Some(list["instances"].as_array()?.iter().filter(|i| i["state"] == "running").filter_map(|i| i["container"].as_str().map(str::to_string)).collect())
}

#[tokio::test]
async fn a_cpu_load_scales_an_app_up_to_its_max_and_back_to_its_min() {
    let Platform { tmp, git, server } = start_platform(&["--autoscale-interval-seconds", "1"]).await.unwrap();
    let (token, ca) = server.join_token().await.unwrap();
    let mut agent = AgentNode::join(&server, &tmp.path().join("node"), "node", &token, &ca, &[]).unwrap().unwrap();
    agent.start(&["--heartbeat-interval-seconds", "1", "--publish-ip", "127.0.0.1", "--advertise-host", "127.0.0.1", "--metrics-interval-seconds", "1"]).unwrap();
    let name = unique_name("burns");
    git.commit(&name, &[("Dockerfile", DOCKERFILE), ("run.sh", BURNS)], "burns CPU while /tmp/burn exists").unwrap();
    let (status, app) = call(&server, Method::POST, "/api/apps", Some(json!({"name": name, "repo_url": git.url(&name), "port": 8080, "cpu": 0.1}))).await;
    assert_eq!(status, 201, "{app}");
    let path = format!("/api/apps/{name}/autoscale");
    for bad in [
        json!({"min": 0, "max": 2, "target": {"cpu_percent": 50}}),
        json!({"min": 3, "max": 2, "target": {"cpu_percent": 50}}),
        json!({"min": 1, "max": 21, "target": {"cpu_percent": 50}}),
        json!({"min": 1, "max": 2, "target": {"cpu_percent": 0}}),
        json!({"min": 1, "max": 2, "target": {"memory": 50}}),
        json!({"min": 1, "max": 2}),
    ] {
        let (status, body) = call(&server, Method::PUT, &path, Some(bad.clone())).await;
        assert_eq!(status, 400, "{bad} → {body}");
    }
    let (_, off) = call(&server, Method::GET, &path, None).await;
    assert_eq!(off["autoscale"], Value::Null, "{off}");
    server.deploy_and_settle(&name, None).await.unwrap_or_else(|e| panic!("{e}\n{}", agent.log_text()));
    let settings = json!({"min": 1, "max": 3, "target": {"cpu_percent": 50}, "up_window_seconds": 0, "down_window_seconds": 5});
    let (status, view) = call(&server, Method::PUT, &path, Some(settings.clone())).await;
    assert_eq!(status, 200, "{view}");
    assert_eq!(view["autoscale"], settings, "{view}");
    let (status, body) = call(&server, Method::POST, &format!("/api/apps/{name}/scale"), Some(json!({"instances": 2}))).await;
    assert_eq!(status, 409, "a manual scale while autoscaled: {body}");

    // Each instance burns far more than half of its 0.1 core: up to 3,
    // and no further.
    wait_for(Duration::from_secs(120), "three running instances", || async { running(&server, &name).await.filter(|r| r.len() == 3) })
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", server.process.log_text()));
    let (_, view) = call(&server, Method::GET, &path, None).await;
    let ups: Vec<&Value> = view["decisions"].as_array().unwrap().iter().filter(|d| d["to"].as_u64() > d["from"].as_u64()).collect();
    assert!(!ups.is_empty(), "{view}");
    for d in view["decisions"].as_array().unwrap() {
        assert!(d["to"].as_u64().unwrap() <= 3 && d["to"].as_u64().unwrap() >= 1, "within the bounds: {view}");
        assert!(d["reason"].as_str().unwrap().contains("cpu_percent"), "{view}");
    }
    eprintln!("autoscale: up decisions {ups:?}");

    // The load goes: back to 1 once a whole down window asked for it.
    let ids = docker(&["ps", "-q", "--filter", &format!("label=cloudweb.app={name}")]);
    assert!(!ids.is_empty());
    for id in &ids {
        docker(&["exec", id, "rm", "-f", "/tmp/burn"]);
    }
    wait_for(Duration::from_secs(120), "one running instance", || async { running(&server, &name).await.filter(|r| r.len() == 1) })
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", server.process.log_text()));
    let (_, view) = call(&server, Method::GET, &path, None).await;
    let last = &view["decisions"][0];
    assert!(last["from"].as_u64() > Some(1) && last["to"].as_u64() == Some(1), "{view}");
    assert!(last["reason"].as_str().unwrap().contains("asked for at most 1"), "{view}");
    assert_eq!(view["instances"], 1, "{view}");

    // Off: the count stays, and a manual scale is allowed again.
    let (status, view) = call(&server, Method::DELETE, &path, None).await;
    assert_eq!((status, &view["autoscale"]), (200, &Value::Null), "{view}");
    let (status, body) = call(&server, Method::POST, &format!("/api/apps/{name}/scale"), Some(json!({"instances": 1}))).await;
    assert_eq!(status, 200, "{body}");
    let (status, _) = call(&server, Method::DELETE, &format!("/api/apps/{name}"), None).await;
    assert_eq!(status, 204);
}
