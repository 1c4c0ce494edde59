//! The control plane started in-process (the same `start` that the binary
//! calls) where a test needs to reach inside: a clock it can move, or many
//! requests without process start-up cost.

use std::sync::Arc;
use std::time::Duration;

use cloudweb_e2e::{key_and_csr, RawClient};
use cloudweb_server::clock::ShiftedClock;
use cloudweb_server::config::Config;
use cloudweb_server::RunningServer;
use proptest::prelude::*;
use reqwest::Method;
use serde_json::{json, Value};

struct InProcess {
    _dir: tempfile::TempDir,
    server: RunningServer,
    clock: ShiftedClock,
    admin: String,
    http: reqwest::Client,
}

impl InProcess {
    async fn start() -> InProcess {
        let dir = tempfile::tempdir().unwrap();
        let clock = ShiftedClock::default();
        let server = cloudweb_server::start(Config::local(dir.path().to_path_buf()), Arc::new(clock.clone())).await.unwrap();
        let admin = std::fs::read_to_string(dir.path().join("admin-token")).unwrap().trim().to_string();
        InProcess { _dir: dir, server, clock, admin, http: reqwest::Client::new() }
    }

    fn agent_url(&self, path: &str) -> String {
        format!("https://127.0.0.1:{}{path}", self.server.agent_addr.port())
    }

    fn anonymous(&self) -> RawClient {
        RawClient::new(self.server.state.ca.cert_pem(), None)
    }

    async fn token(&self) -> String {
        let response = self
            .http
            .post(format!("http://{}/api/join-tokens", self.server.api_addr))
            .bearer_auth(&self.admin)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 201);
        response.json::<Value>().await.unwrap()["token"].as_str().unwrap().to_string()
    }

    /// Joins by hand; returns a client with the node's certificate.
    async fn join(&self, name: &str) -> RawClient {
        let (key, csr) = key_and_csr(|_| {});
        let body = json!({"token": self.token().await, "csr": csr, "hostname": "h", "name": name}).to_string();
        let (status, text) = self.anonymous().send(Method::POST, &self.agent_url("/agent/v1/join"), &[], Some(&body)).await.unwrap();
        assert_eq!(status, 200, "{text}");
        let joined: Value = serde_json::from_str(&text).unwrap();
        RawClient::new(self.server.state.ca.cert_pem(), Some((joined["certificate"].as_str().unwrap(), &key)))
    }
}

#[tokio::test]
async fn an_expired_join_token_is_refused() {
    let cp = InProcess::start().await;
    let token = cp.token().await;
    cp.clock.advance(Duration::from_secs(3601));
    let (_, csr) = key_and_csr(|_| {});
    let body = json!({"token": token, "csr": csr, "hostname": "h", "name": "late"}).to_string();
    let (status, text) = cp.anonymous().send(Method::POST, &cp.agent_url("/agent/v1/join"), &[], Some(&body)).await.unwrap();
    assert_eq!(status, 401);
    assert!(text.contains("expired"), "{text}");
    assert!(cp.server.state.nodes.is_empty());
}

#[tokio::test]
async fn a_token_just_before_expiry_still_works() {
    let cp = InProcess::start().await;
    let token = cp.token().await;
    cp.clock.advance(Duration::from_secs(3590));
    let (_, csr) = key_and_csr(|_| {});
    let body = json!({"token": token, "csr": csr, "hostname": "h", "name": "intime"}).to_string();
    let (status, _) = cp.anonymous().send(Method::POST, &cp.agent_url("/agent/v1/join"), &[], Some(&body)).await.unwrap();
    assert_eq!(status, 200);
}

#[tokio::test]
async fn unknown_fields_are_ignored_and_health_is_kept() {
    let cp = InProcess::start().await;
    let node = cp.join("n").await;
    let body = json!({
        "cpu_cores": 2, "mem_bytes": 1, "disk_bytes": 1, "brand_new_field": {"x": 1},
        "health": {"registry": {"configured": true, "reachable": true}, "mesh": {"peers": 2, "connected": 1},
                   "features": ["static-sites", "something-later"], "extra": true},
        "metrics": {"node": {"mem_used": 0}, "containers": [], "omitted": 0, "later": "yes"}
    });
    let (status, text) = node.send(Method::POST, &cp.agent_url("/agent/v1/heartbeat"), &[], Some(&body.to_string())).await.unwrap();
    assert_eq!(status, 200, "{text}");
    let live = cp.server.state.nodes.all().pop().unwrap();
    let health = live.health.as_ref().unwrap();
    assert_eq!(health.value.mesh.as_ref().unwrap().connected, 1);
    assert!(live.has_feature(tokio::time::Instant::now(), "static-sites"));
    let metrics = live.metrics.as_ref().unwrap();
    assert_eq!(metrics.value.node.as_ref().unwrap().mem_used, Some(0));
    assert_eq!(metrics.value.node.as_ref().unwrap().cpu_pct, None, "absent stays absent");
}

#[tokio::test]
async fn a_bad_optional_block_is_dropped_but_the_heartbeat_counts() {
    let cp = InProcess::start().await;
    let node = cp.join("n").await;
    let body = json!({"cpu_cores": 2, "mem_bytes": 1, "disk_bytes": 1,
                      "health": {"mesh": {"peers": 1, "connected": 2}},
                      "metrics": {"node": {"cpu_pct": 250.0}}});
    let (status, text) = node.send(Method::POST, &cp.agent_url("/agent/v1/heartbeat"), &[], Some(&body.to_string())).await.unwrap();
    assert_eq!(status, 200, "{text}");
    let live = &cp.server.state.nodes.all()[0];
    assert_eq!(live.capacity.unwrap().cpu_cores, 2, "liveness and capacity are kept");
    assert!(live.health.is_none() && live.metrics.is_none(), "the invalid blocks are not");
    // A heartbeat whose required fields are wrong is refused whole.
    let (status, text) = node.send(Method::POST, &cp.agent_url("/agent/v1/heartbeat"), &[], Some(r#"{"cpu_cores": -1}"#)).await.unwrap();
    assert_eq!(status, 400, "{text}");
}

#[tokio::test]
async fn an_existing_database_is_backed_up_before_migrating() {
    let dir = tempfile::tempdir().unwrap();
    // An empty file is a valid SQLite database with no migrations applied.
    std::fs::write(dir.path().join("state.db"), b"").unwrap();
    let server = cloudweb_server::start(Config::local(dir.path().to_path_buf()), Arc::new(ShiftedClock::default())).await.unwrap();
    server.shutdown().await;
    let backups: Vec<_> = std::fs::read_dir(dir.path().join("backups")).unwrap().collect();
    assert_eq!(backups.len(), 1);
    let name = backups[0].as_ref().unwrap().file_name().into_string().unwrap();
    assert!(name.starts_with("state-") && name.ends_with(".db"), "{name}");
    // Up to date now: a second start makes no new backup.
    let server = cloudweb_server::start(Config::local(dir.path().to_path_buf()), Arc::new(ShiftedClock::default())).await.unwrap();
    server.shutdown().await;
    assert_eq!(std::fs::read_dir(dir.path().join("backups")).unwrap().count(), 1);
}

#[tokio::test]
async fn a_fresh_database_needs_no_backup() {
    let dir = tempfile::tempdir().unwrap();
    let server = cloudweb_server::start(Config::local(dir.path().to_path_buf()), Arc::new(ShiftedClock::default())).await.unwrap();
    server.shutdown().await;
    assert!(!dir.path().join("backups").exists());
}

/// Arbitrary JSON, nested a few levels.
fn arbitrary_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_filter("finite", |f| f.is_finite()).prop_map(Value::from),
        ".{0,40}".prop_map(Value::from),
    ];
    leaf.prop_recursive(4, 64, 8, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..8).prop_map(Value::Array),
            prop::collection::hash_map(
                prop_oneof![
                    Just("cpu_cores".to_string()), Just("health".to_string()), Just("metrics".to_string()),
                    Just("token".to_string()), Just("csr".to_string()), Just("deployment_id".to_string()),
                    Just("logs".to_string()), Just("traffic".to_string()), Just("node".to_string()),
                    "[a-z_]{1,12}",
                ],
                inner,
                0..8
            )
            .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

#[test]
fn arbitrary_bodies_never_make_the_server_fail() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let (cp, node) = runtime.block_on(async {
        let cp = InProcess::start().await;
        let node = cp.join("fuzz").await;
        (cp, node)
    });
    let routes = ["/agent/v1/heartbeat", "/agent/v1/report", "/agent/v1/logs", "/agent/v1/join", "/agent/v1/leave?force=maybe"];
    let mut config = ProptestConfig::with_cases(200);
    config.failure_persistence = None;
    proptest!(config, |(body in arbitrary_json(), raw in prop::collection::vec(any::<u8>(), 0..256), route in 0..routes.len())| {
        runtime.block_on(async {
            for payload in [body.to_string(), String::from_utf8_lossy(&raw).into_owned()] {
                let (status, text) = node.send(Method::POST, &cp.agent_url(routes[route]), &[], Some(&payload)).await.unwrap();
                prop_assert!(status < 500, "{} answered {status} {text} to {payload}", routes[route]);
                if status >= 400 {
                    prop_assert!(serde_json::from_str::<Value>(&text).map(|v| v["error"].is_string()).unwrap_or(false), "{text}");
                }
            }
            Ok(())
        })?;
    });
    // Still serving, and the node is still registered.
    runtime.block_on(async {
        let (status, _) = node.send(Method::GET, &cp.agent_url("/agent/v1/commands"), &[], None).await.unwrap();
        assert_eq!(status, 200);
    });
}

#[tokio::test]
async fn an_oversized_body_gets_a_json_413() {
    let cp = InProcess::start().await;
    let node = cp.join("big").await;
    let body = format!("{{\"cpu_cores\": 1, \"pad\": \"{}\"}}", "x".repeat(1_200_000));
    let (status, text) = node.send(Method::POST, &cp.agent_url("/agent/v1/heartbeat"), &[], Some(&body)).await.unwrap();
    assert_eq!(status, 413);
    let error: Value = serde_json::from_str(&text).unwrap();
    assert!(error["error"].as_str().unwrap().contains("larger than 1 MiB"), "{text}");
}

#[tokio::test]
async fn usage_history_is_kept_then_downsampled() {
    let cp = InProcess::start().await;
    let node = cp.join("busy").await;
    for cpu in [10.0, 20.0, 30.0] {
        let body = json!({"cpu_cores": 2, "mem_bytes": 1, "disk_bytes": 1,
                          "metrics": {"node": {"cpu_pct": cpu, "mem_used": 100, "disk_used": 5},
                                      "containers": [{"container": "cw-web-1", "cpu_cores": 0.5, "mem_bytes": 10}], "omitted": 0}});
        let (status, _) = node.send(Method::POST, &cp.agent_url("/agent/v1/heartbeat"), &[], Some(&body.to_string())).await.unwrap();
        assert_eq!(status, 200);
    }
    cp.server.state.store.save_heartbeats(&[], &[], &cp.server.state.nodes.take_usage()).await.unwrap();
    let node_id = cp.server.state.nodes.all()[0].id.clone();
    let fine = cp.server.state.store.node_usage(&node_id, 0).await.unwrap();
    assert_eq!(fine.len(), 3);
    assert!(fine.iter().all(|row| row.1 == 30));
    // Two days later the fine rows are folded into one 5-minute average.
    cp.clock.advance(Duration::from_secs(2 * 86_400));
    cp.server.state.store.downsample_usage(cp.server.state.clock.now_ms()).await.unwrap();
    let coarse = cp.server.state.store.node_usage(&node_id, 0).await.unwrap();
    assert_eq!(coarse.len(), 1, "{coarse:?}");
    assert_eq!(coarse[0].1, 300);
    assert_eq!(coarse[0].2, Some(20.0));
    assert_eq!(coarse[0].3, Some(100));
}

#[tokio::test]
async fn an_outage_open_before_a_restart_stays_open_until_the_node_is_heard_from() {
    let cp = InProcess::start().await;
    let node = cp.join("n").await;
    let state = &cp.server.state;
    let id = state.nodes.all().pop().unwrap().id;
    // An outage an earlier run opened; this run has not heard from the
    // node yet (every node gets one unreachable period at start).
    let raise = cloudweb_server::store::alerts::Raise { id: "alt_old", kind: "node_unreachable", subject: &id, severity: "critical", summary: "down", detail: None, now: 1 };
    state.store.raise_alert(&raise).await.unwrap();
    cloudweb_server::alerts::evaluate(state).await.unwrap();
    assert_eq!(state.store.open_alerts_of("node_unreachable").await.unwrap().len(), 1, "the start's grace settles nothing");
    // Its first heartbeat ends the outage: one alert, resolved once.
    let body = json!({"cpu_cores": 2, "mem_bytes": 1, "disk_bytes": 1});
    let (status, text) = node.send(Method::POST, &cp.agent_url("/agent/v1/heartbeat"), &[], Some(&body.to_string())).await.unwrap();
    assert_eq!(status, 200, "{text}");
    cloudweb_server::alerts::evaluate(state).await.unwrap();
    assert!(state.store.open_alerts_of("node_unreachable").await.unwrap().is_empty());
    let all = state.store.alerts(false, 10).await.unwrap();
    assert_eq!(all.iter().filter(|a| a.kind == "node_unreachable").map(|a| a.id.as_str()).collect::<Vec<_>>(), ["alt_old"]);
}

/// A preview with no push for its app's TTL is removed by the sweep (app,
/// record and all), one pushed to within it stays, and the app is kept;
/// deleting the app deletes its previews.
#[tokio::test]
async fn the_sweep_removes_previews_idle_past_their_ttl() {
    use cloudweb_server::previews::{self, Action, ChangeRequest, Outcome};
    use cloudweb_server::store::AppGitLinkRow;

    let cp = InProcess::start().await;
    let state = cp.server.state.clone();
    let response = cp
        .http
        .post(format!("http://{}/api/apps", cp.server.api_addr))
        .bearer_auth(&cp.admin)
        .json(&json!({"name": "swept", "repo_url": "https://git.example.com/acme/swept.git", "port": 8080}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 201);
    let link = AppGitLinkRow {
        app: "swept".into(),
        provider: "generic".into(),
        project_id: None,
        project_path: None,
        account: None,
        hook_id: None,
        webhook_secret_sha256: "0".repeat(64),
        webhook_secret_sealed: None,
        created_at: 0,
    };
    state.store.insert_app_git_link(&link).await.unwrap();
    previews::apply_settings(&state, "swept", previews::SettingsChange { enabled: true, ttl_s: Some(3600), ..Default::default() }).await.unwrap();
    let app = state.store.app("swept").await.unwrap().unwrap();
    let request = |number: i64| ChangeRequest {
        number,
        action: Action::Updated,
        base_ref: "main".into(),
        head_ref: format!("topic-{number}"),
        head_sha: format!("{number:0>40}"),
        head_clone_url: "https://git.example.com/acme/swept.git".into(),
        from_fork: false,
    };
    assert!(matches!(previews::on_change_request(&state, &app, &link, &request(1)).await.unwrap(), Outcome::Deployed(_)));
    cp.clock.advance(Duration::from_secs(3000));
    assert!(matches!(previews::on_change_request(&state, &app, &link, &request(2)).await.unwrap(), Outcome::Deployed(_)));
    assert_eq!(previews::sweep(&state).await.unwrap(), 0, "nothing is idle an hour yet");
    cp.clock.advance(Duration::from_secs(700));
    assert_eq!(previews::sweep(&state).await.unwrap(), 1, "the first is idle past its hour");
    assert!(state.store.app("swept-pr-1").await.unwrap().is_none());
    assert!(state.store.app("swept-pr-2").await.unwrap().is_some());
    let left: Vec<i64> = state.store.previews_of("swept").await.unwrap().iter().map(|p| p.number).collect();
    assert_eq!(left, [2]);
    assert!(state.store.app("swept").await.unwrap().is_some());
    // Deleting the app deletes its previews with it.
    let response = cp.http.delete(format!("http://{}/api/apps/swept", cp.server.api_addr)).bearer_auth(&cp.admin).send().await.unwrap();
    assert_eq!(response.status(), 204);
    assert!(state.store.app("swept-pr-2").await.unwrap().is_none(), "no preview outlives its app");
}
