//! Control-plane behaviour found wanting by an outside audit, each checked
//! against the server started in-process (the same `start` as the binary)
//! with nodes spoken for by hand and a clock the test moves: one owner per
//! host, usage samples that merge, node loss that settles every deployment
//! in bounded time, placement that waits for a node, retention, the
//! database's failure paths, and idempotent joins and deploys.

use std::sync::atomic::Ordering;
use std::time::Duration;

use cloudweb_e2e::control::{reached, spin, Control, Steps};
use cloudweb_e2e::key_and_csr;
use cloudweb_server::store::IdempotencyClaim;
use reqwest::Method;
use serde_json::{json, Value};

async fn control(tweak: impl FnOnce(&mut cloudweb_server::config::Config)) -> (tempfile::TempDir, Control) {
    let dir = tempfile::tempdir().unwrap();
    let cp = Control::start(dir.path(), tweak).await;
    (dir, cp)
}

// Item: domain takeover. A host belongs to one app.
#[tokio::test]
async fn a_host_belongs_to_at_most_one_app() {
    let (_dir, cp) = control(|_| {}).await;
    assert_eq!(cp.create_app("b", json!({"domains": ["shop.example.com"]})).await.0, 201);
    assert_eq!(cp.create_app("a", json!({})).await.0, 201);

    // Another app's default host, as a domain of a new app or of an
    // existing one: 409 naming the owner.
    let (status, body) = cp.create_app("c", json!({"domains": ["b.localhost"]})).await;
    assert_eq!(status, 409, "{body}");
    assert!(body["error"].as_str().unwrap().contains("app b"), "{body}");
    let (status, body) = cp.call(Method::PUT, "/api/apps/a/domains", Some(json!(["B.localhost"]))).await;
    assert_eq!(status, 409, "{body}");
    assert!(body["error"].as_str().unwrap().contains("b.localhost") && body["error"].as_str().unwrap().contains("app b"), "{body}");
    // Another app's custom domain.
    let (status, body) = cp.call(Method::PUT, "/api/apps/a/domains", Some(json!(["ok.example.com", "shop.example.com"]))).await;
    assert_eq!(status, 409, "{body}");
    assert!(body["error"].as_str().unwrap().contains("app b"), "{body}");
    // Nothing of a refused change was kept.
    let (_, a) = cp.call(Method::GET, "/api/apps/a", None).await;
    assert_eq!(a["domains"], json!([]), "{a}");
    assert_eq!(cp.call(Method::GET, "/api/apps/c", None).await.0, 404, "a refused app is not created");

    // An app whose default host is someone's custom domain is refused.
    assert_eq!(cp.call(Method::PUT, "/api/apps/b/domains", Some(json!(["shop.example.com", "x.localhost"]))).await.0, 200);
    let (status, body) = cp.create_app("x", json!({})).await;
    assert_eq!(status, 409, "{body}");
    assert!(body["error"].as_str().unwrap().contains("x.localhost") && body["error"].as_str().unwrap().contains("app b"), "{body}");

    // An app may list its own default host, and a domain freed by its
    // owner can be taken.
    assert_eq!(cp.call(Method::PUT, "/api/apps/a/domains", Some(json!(["a.localhost"]))).await.0, 200);
    assert_eq!(cp.call(Method::PUT, "/api/apps/b/domains", Some(json!([]))).await.0, 200);
    assert_eq!(cp.call(Method::PUT, "/api/apps/a/domains", Some(json!(["shop.example.com"]))).await.0, 200);
    // Deleting an app frees its hosts.
    assert_eq!(cp.call(Method::DELETE, "/api/apps/a", None).await.0, 204);
    assert_eq!(cp.call(Method::PUT, "/api/apps/b/domains", Some(json!(["shop.example.com", "a.localhost"]))).await.0, 200);

    // Race: many apps claim one host at once; exactly one gets it.
    for i in 0..8 {
        assert_eq!(cp.create_app(&format!("r{i}"), json!({})).await.0, 201);
    }
    let paths: Vec<String> = (0..8).map(|i| format!("/api/apps/r{i}/domains")).collect();
    let claims = paths.iter().map(|path| cp.call(Method::PUT, path, Some(json!(["race.example.com"]))));
    let statuses: Vec<u16> = futures_util::future::join_all(claims).await.into_iter().map(|(status, _)| status).collect();
    assert_eq!(statuses.iter().filter(|&&s| s == 200).count(), 1, "{statuses:?}");
    assert_eq!(statuses.iter().filter(|&&s| s == 409).count(), 7, "{statuses:?}");
    let (_, routes) = cp.call(Method::GET, "/api/routes", None).await;
    let hosts: Vec<&str> = routes["routes"].as_array().unwrap().iter().map(|r| r["host"].as_str().unwrap()).collect();
    assert_eq!(hosts.iter().filter(|h| **h == "race.example.com").count(), 1, "{routes}");
}

// Item: usage samples vanish. Traffic arrives on its own timer; the node's
// and the apps' gauges stay.
#[tokio::test]
async fn a_traffic_only_sample_keeps_the_usage_gauges() {
    let (_dir, cp) = control(|_| {}).await;
    let node = cp.join("edge").await;
    cp.heartbeat(&node, json!({"cpu_cores": 2, "mem_bytes": 1u64 << 30, "disk_bytes": 1u64 << 30,
        "metrics": {"node": {"cpu_pct": 12.5, "mem_used": 1000, "disk_used": 2000},
                    "containers": [{"container": "cw-web-1", "cpu_cores": 0.5, "mem_bytes": 300}], "omitted": 0}}))
        .await;
    cp.heartbeat(&node, json!({"cpu_cores": 2, "mem_bytes": 1u64 << 30, "disk_bytes": 1u64 << 30,
        "metrics": {"traffic": [{"host": "web.localhost", "requests": 3, "r2xx": 3, "r3xx": 0, "r4xx": 0, "r5xx": 0, "dur_sum_ms": 3.0, "slow": 0}],
                    "traffic_omitted": 0}}))
        .await;
    let (_, view) = cp.call(Method::GET, &format!("/api/nodes/{}", node.id), None).await;
    let sample = &view["metrics"]["sample"];
    assert_eq!(sample["node"]["cpu_pct"], 12.5, "{view}");
    assert_eq!(sample["containers"][0]["container"], "cw-web-1", "{view}");
    assert_eq!(sample["traffic"][0]["requests"], 3, "{view}");
    let metrics = cp.http.get(format!("http://{}/metrics", cp.server.api_addr)).bearer_auth(&cp.admin).send().await.unwrap().text().await.unwrap();
    for gauge in ["cloudweb_node_cpu_percent{", "cloudweb_node_memory_used_bytes{", "cloudweb_node_disk_used_bytes{", "cloudweb_app_cpu_cores{app=\"web\"", "cloudweb_app_memory_bytes{app=\"web\""] {
        assert!(metrics.contains(gauge), "{gauge} missing:\n{metrics}");
    }
    // A later usage sample replaces the usage part, and the traffic stays.
    cp.heartbeat(&node, json!({"cpu_cores": 2, "mem_bytes": 1u64 << 30, "disk_bytes": 1u64 << 30,
        "metrics": {"node": {"cpu_pct": 50.0, "mem_used": 1000, "disk_used": 2000}, "containers": [], "omitted": 0}}))
        .await;
    let (_, view) = cp.call(Method::GET, &format!("/api/nodes/{}", node.id), None).await;
    assert_eq!(view["metrics"]["sample"]["node"]["cpu_pct"], 50.0, "{view}");
    assert_eq!(view["metrics"]["sample"]["containers"], json!([]), "{view}");
    assert_eq!(view["metrics"]["sample"]["traffic"][0]["requests"], 3, "{view}");
}

// Item: unknown node sub-resources are 404.
#[tokio::test]
async fn unknown_node_sub_resources_are_404() {
    let (_dir, cp) = control(|_| {}).await;
    for path in ["/api/nodes/n-nope/usage", "/api/nodes/n-nope/commands"] {
        let (status, body) = cp.call(Method::GET, path, None).await;
        assert_eq!(status, 404, "{path}: {body}");
        assert!(body["error"].as_str().unwrap().contains("n-nope"), "{body}");
    }
    let node = cp.join("known").await;
    for path in [format!("/api/nodes/{}/usage", node.id), format!("/api/nodes/{}/commands", node.id)] {
        assert_eq!(cp.call(Method::GET, &path, None).await.0, 200, "{path}");
    }
}

// Item: a node is not eligible before its first heartbeat with capacity,
// and a deployment that finds no node waits (bounded) instead of failing.
#[tokio::test]
async fn a_deploy_waits_for_a_node_that_just_joined() {
    let (_dir, cp) = control(|_| {}).await;
    let node = cp.join("fresh").await;
    let (_, view) = cp.call(Method::GET, &format!("/api/nodes/{}", node.id), None).await;
    assert_eq!(view["capacity"], Value::Null, "{view}");
    assert_eq!(view["eligible"], false, "no capacity yet: {view}");
    assert_eq!(cp.create_app("early", json!({})).await.0, 201);
    let (status, body) = cp.call(Method::POST, "/api/apps/early/deploy", None).await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["state"], "queued", "it waits for a node: {body}");
    let id = body["id"].as_str().unwrap().to_string();

    // The first heartbeat makes the node eligible and the deployment goes
    // there on the next reconcile pass.
    cp.alive(&node).await;
    let (_, view) = cp.call(Method::GET, &format!("/api/nodes/{}", node.id), None).await;
    assert_eq!(view["eligible"], true, "{view}");
    let placed = cp.deployment_until(&id, 10, "placement", |d| d["instances"][0]["node_id"] == node.id.as_str()).await;
    assert_eq!(placed["state"], "queued", "{placed}");
    let (status, text) = node.client.send(Method::GET, &cp.agent_url("/agent/v1/commands"), &[], None).await.unwrap();
    assert_eq!(status, 200);
    assert!(text.contains(&id), "the deploy command is queued: {text}");
}

#[tokio::test]
async fn a_deploy_with_nowhere_to_go_fails_after_the_wait_with_the_reasons() {
    let (_dir, cp) = control(|_| {}).await;
    let node = cp.join("tiny").await;
    cp.heartbeat(&node, json!({"cpu_cores": 1, "mem_bytes": 64u64 << 20, "disk_bytes": 1u64 << 30})).await;
    assert_eq!(cp.create_app("big", json!({"memory": 1u64 << 30})).await.0, 201);
    let (_, body) = cp.call(Method::POST, "/api/apps/big/deploy", None).await;
    assert_eq!(body["state"], "queued", "{body}");
    let id = body["id"].as_str().unwrap().to_string();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(cp.deployment(&id).await["state"], "queued", "still within the wait");
    cp.clock.advance(Duration::from_secs(61));
    let failed = cp.deployment_until(&id, 5, "the deployment to fail", |d| d["state"] == "failed").await;
    let error = failed["error"].as_str().unwrap();
    assert!(error.contains("tiny") && error.contains("not enough memory"), "{error}");
}

// Item: a deployment in progress on a node that becomes unreachable
// reaches a terminal state.
#[tokio::test]
async fn a_deployment_on_a_node_that_goes_silent_fails() {
    let (_dir, cp) = control(|c| c.unreachable_after = Duration::from_secs(3)).await;
    let node = cp.join("silent").await;
    cp.alive(&node).await;
    assert_eq!(cp.create_app("hung", json!({})).await.0, 201);
    let mut ids = Vec::new();
    // One still queued on the node, one building there (the second keeps
    // the first in flight: by default a newer request supersedes it).
    let (_, body) = cp.call(Method::POST, "/api/apps/hung/deploy", None).await;
    ids.push(body["id"].as_str().unwrap().to_string());
    let (_, body) = cp.call(Method::POST, "/api/apps/hung/deploy", Some(json!({"keep_in_flight": true}))).await;
    let building = body["id"].as_str().unwrap().to_string();
    assert_eq!(cp.report(&node, json!({"deployment_id": building, "state": "building"})).await, 202);
    ids.push(building);
    for id in &ids {
        let d = cp.deployment(id).await;
        assert_eq!(d["instances"][0]["node_id"], node.id.as_str(), "{d}");
    }
    // No more heartbeats: unreachable after 3 s, failed on the next pass.
    for id in &ids {
        let failed = cp.deployment_until(id, 15, "the deployment to fail", |d| d["state"] == "failed").await;
        assert!(failed["error"].as_str().unwrap().contains("unreachable"), "{failed}");
    }
}

#[tokio::test]
async fn an_unfinished_rollback_on_a_node_that_goes_silent_is_placed_again() {
    let (_dir, cp) = control(|c| c.unreachable_after = Duration::from_secs(3)).await;
    let a = cp.join("a").await;
    let b = cp.join("b").await;
    // Both beat until the test silences one.
    let beat = |node: &cloudweb_e2e::control::HandNode| {
        let client = node.client.clone();
        let url = cp.agent_url("/agent/v1/heartbeat");
        tokio::spawn(async move {
            loop {
                let body = json!({"cpu_cores": 4, "mem_bytes": 8u64 << 30, "disk_bytes": 100u64 << 30}).to_string();
                let _ = client.send(Method::POST, &url, &[], Some(&body)).await;
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        })
    };
    let beats = [beat(&a), beat(&b)];
    cp.alive(&a).await;
    cp.alive(&b).await;
    assert_eq!(cp.create_app("back", json!({})).await.0, 201);
    let (_, body) = cp.call(Method::POST, "/api/apps/back/deploy", None).await;
    let first = body["id"].as_str().unwrap().to_string();
    let d = cp.deployment_until(&first, 5, "placement", |d| !d["instances"][0]["node_id"].is_null()).await;
    let (stays, silent, silenced) = if d["instances"][0]["node_id"] == a.id.as_str() { (&a, &b, &beats[1]) } else { (&b, &a, &beats[0]) };
    cp.run_on(stays, &first, 1).await;
    // The rollback goes to the less loaded node, which then goes silent.
    let (_, body) = cp.call(Method::POST, "/api/apps/back/rollback", Some(json!({"deployment_id": first}))).await;
    let rollback = body["id"].as_str().unwrap().to_string();
    assert_eq!(cp.deployment(&rollback).await["instances"][0]["node_id"], silent.id.as_str());
    silenced.abort();
    let moved = cp
        // The replacement is written before the old instance is marked
        // lost (two writes): wait for both, not for the first.
        .deployment_until(&rollback, 15, "the instance to move and the old one to be lost", |d| {
            let instances = d["instances"].as_array().unwrap();
            instances.iter().any(|i| i["node_id"] == stays.id.as_str()) && instances[0]["state"] == "lost"
        })
        .await;
    for beat in &beats {
        beat.abort();
    }
    assert_eq!(moved["state"], "queued", "re-placed, not failed: {moved}");
    assert_eq!(moved["instances"][0]["state"], "lost", "{moved}");
    assert_eq!(moved["instances"][1]["state"], "pending", "{moved}");
    let (_, text) = silent.client.send(Method::GET, &cp.agent_url("/agent/v1/commands"), &[], None).await.unwrap();
    assert!(text.contains("\"stop\""), "the silent node is told to stop its copy: {text}");
    // It runs on the other node.
    assert_eq!(cp.report(stays, json!({"deployment_id": rollback, "instance": 2, "state": "deploying", "image": moved["image"]})).await, 202);
    assert_eq!(cp.report(stays, json!({"deployment_id": rollback, "instance": 2, "state": "running", "address": "10.77.0.5:1"})).await, 202);
    assert_eq!(cp.deployment(&rollback).await["state"], "running");
}

/// A running deployment of app `app` on `node`.
async fn running_app(cp: &Control, node: &cloudweb_e2e::control::HandNode, app: &str) -> String {
    assert_eq!(cp.create_app(app, json!({})).await.0, 201);
    let (_, body) = cp.call(Method::POST, &format!("/api/apps/{app}/deploy"), None).await;
    let id = body["id"].as_str().unwrap().to_string();
    cp.deployment_until(&id, 5, "placement", |d| d["instances"][0]["node_id"] == node.id.as_str()).await;
    cp.run_on(node, &id, 1).await;
    assert_eq!(cp.deployment(&id).await["state"], "running");
    id
}

// Item: forced leave. The API says failed, and the image starts again
// elsewhere.
#[tokio::test]
async fn a_forced_leave_fails_the_deployment_and_starts_its_image_elsewhere() {
    let (_dir, cp) = control(|_| {}).await;
    let leaving = cp.join("leaving").await;
    cp.alive(&leaving).await;
    let id = running_app(&cp, &leaving, "web").await;
    let image = cp.deployment(&id).await["image"].clone();
    let other = cp.join("other").await;
    cp.alive(&other).await;

    let (status, text) = leaving.client.send(Method::POST, &cp.agent_url("/agent/v1/leave?force=1"), &[], None).await.unwrap();
    assert_eq!(status, 200, "{text}");
    let left: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(left["failed_deployments"], json!([id]), "{left}");
    let d = cp.deployment(&id).await;
    assert_eq!(d["state"], "failed", "the answer and the deployment agree: {d}");
    assert!(d["error"].as_str().unwrap().contains("left the cluster"), "{d}");

    let again = left["rescheduled"][0].as_str().expect("a new deployment").to_string();
    let d = cp.deployment(&again).await;
    assert_eq!(d["kind"], "reschedule", "{d}");
    assert_eq!(d["image"], image, "{d}");
    assert_eq!(d["instances"][0]["node_id"], other.id.as_str(), "{d}");
    // It runs there, and becomes the app's deployment in force.
    assert_eq!(cp.report(&other, json!({"deployment_id": again, "state": "deploying", "image": image})).await, 202);
    assert_eq!(cp.report(&other, json!({"deployment_id": again, "state": "running", "address": "10.77.0.3:3000"})).await, 202);
    assert_eq!(cp.deployment(&again).await["state"], "running");
}

#[tokio::test]
async fn a_forced_leave_of_one_of_two_instances_replaces_it() {
    let (_dir, cp) = control(|_| {}).await;
    let a = cp.join("a").await;
    let b = cp.join("b").await;
    cp.alive(&a).await;
    cp.alive(&b).await;
    assert_eq!(cp.create_app("pair", json!({"instances": 2})).await.0, 201);
    let (_, body) = cp.call(Method::POST, "/api/apps/pair/deploy", None).await;
    let id = body["id"].as_str().unwrap().to_string();
    let d = cp.deployment_until(&id, 5, "placement", |d| !d["instances"][0]["node_id"].is_null()).await;
    // Instance 1 builds on one node; instance 2 then goes to the other,
    // the less loaded one.
    let (stayer, leaver) = if d["instances"][0]["node_id"] == a.id.as_str() { (&a, &b) } else { (&b, &a) };
    cp.run_on(stayer, &id, 1).await;
    let d = cp.deployment(&id).await;
    assert_eq!(d["instances"][1]["node_id"], leaver.id.as_str(), "{d}");
    assert_eq!(cp.report(leaver, json!({"deployment_id": id, "instance": 2, "state": "running", "address": "10.77.0.9:1"})).await, 202);
    assert_eq!(cp.deployment(&id).await["state"], "running");
    let c = cp.join("c").await;
    cp.alive(&c).await;

    // What runs on the node that stays keeps serving; the lost instance is
    // replaced on c, and the deployment is not failed.
    let (status, text) = leaver.client.send(Method::POST, &cp.agent_url("/agent/v1/leave?force=1"), &[], None).await.unwrap();
    assert_eq!(status, 200, "{text}");
    let left: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(left["failed_deployments"], json!([]), "{left}");
    assert_eq!(left["rescheduled"], json!([id]), "{left}");
    let d = cp.deployment(&id).await;
    assert_eq!(d["state"], "running", "{d}");
    let instances = d["instances"].as_array().unwrap();
    assert!(instances.iter().any(|i| i["node_id"] == stayer.id.as_str() && i["state"] == "running"), "{d}");
    assert!(instances.iter().any(|i| i["node_id"] == c.id.as_str() && i["state"] == "pending"), "{d}");
}

// Item: never running with no running instance for more than 60 s.
#[tokio::test]
async fn a_running_deployment_that_lost_its_instance_is_failed_and_started_again() {
    let (_dir, cp) = control(|_| {}).await;
    let node = cp.join("crashy").await;
    cp.alive(&node).await;
    let id = running_app(&cp, &node, "crash").await;
    assert_eq!(cp.report(&node, json!({"deployment_id": id, "state": "failed", "message": "exited with 1"})).await, 202);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(cp.deployment(&id).await["state"], "running", "within the 60 s");
    cp.clock.advance(Duration::from_secs(61));
    let failed = cp.deployment_until(&id, 5, "the deployment to fail", |d| d["state"] == "failed").await;
    assert!(failed["error"].as_str().unwrap().contains("no instance"), "{failed}");
    // Written just after the failure (another write of the same pass).
    let two = || async { Some(cp.call(Method::GET, "/api/apps/crash/deployments", None).await.1).filter(|a| a["deployments"].as_array().is_some_and(|d| d.len() == 2)) };
    let all = cloudweb_e2e::wait_for(Duration::from_secs(5), "the image started again", two).await.unwrap();
    let again = &all["deployments"][0];
    assert_eq!(again["kind"], "reschedule", "{all}");
    assert_eq!(again["rollback_of"], id.as_str(), "{all}");
    // Placed in the same pass (which this test may have looked in on).
    let again = again["id"].as_str().unwrap().to_string();
    cp.deployment_until(&again, 5, "the new deployment's placement", |d| d["instances"][0]["node_id"] == node.id.as_str()).await;
}

// Item: retention of logs, reports, acked commands, traffic and
// idempotency keys.
#[tokio::test]
async fn old_rows_are_pruned_and_recent_ones_kept() {
    use cloudweb_server::store::retention::KEEP_DEPLOYMENTS;
    let (_dir, cp) = control(|c| c.placement_wait = Duration::ZERO).await;
    let state = &cp.server.state;
    let node = cp.join("keeper").await;
    assert_eq!(cp.create_app("logs", json!({})).await.0, 201);
    // With no capacity anywhere, each deploy fails at once.
    let mut ids = Vec::new();
    for _ in 0..KEEP_DEPLOYMENTS + 2 {
        let (_, body) = cp.call(Method::POST, "/api/apps/logs/deploy", None).await;
        assert_eq!(body["state"], "failed", "{body}");
        ids.push(body["id"].as_str().unwrap().to_string());
    }
    for id in &ids {
        let report: cloudweb_protocol::Report = serde_json::from_value(json!({
            "deployment_id": id, "state": "failed", "message": "m",
            "logs": [{"ts": "2026-11-29T11:06:58Z", "stream": "build", "line": "step 1"}]}))
        .unwrap();
        state.store.save_report(&node.id, &report, state.clock.now_ms()).await.unwrap();
    }
    let lines = |id: &str| {
        let id = id.to_string();
        async move { state.store.deployment_logs(&id, 0, 100).await.unwrap().len() }
    };
    // A stop command, acked.
    let (status, body) = cp.call(Method::POST, &format!("/api/nodes/{}/commands", node.id), Some(json!({"type": "stop", "payload": {"deployment_id": ids[0]}}))).await;
    assert_eq!(status, 201, "{body}");
    let command = body["id"].as_str().unwrap().to_string();
    let (status, _) = node.client.send(Method::POST, &cp.agent_url(&format!("/agent/v1/commands/{command}/ack")), &[], None).await.unwrap();
    assert_eq!(status, 200);
    // Traffic of one host.
    cp.heartbeat(&node, json!({"cpu_cores": 1, "mem_bytes": 1, "disk_bytes": 1,
        "metrics": {"traffic": [{"host": "logs.localhost", "requests": 5, "r2xx": 5, "r3xx": 0, "r4xx": 0, "r5xx": 0, "dur_sum_ms": 5.0, "slow": 0}]}}))
        .await;
    state.store.save_heartbeats(&[], &state.nodes.take_traffic(), &[]).await.unwrap();
    // An idempotency key (on another app, whose deployments do not count
    // against the first one's).
    assert_eq!(cp.create_app("keys", json!({})).await.0, 201);
    let (_, first) = cp.call_with(Method::POST, "/api/apps/keys/deploy", &[("Idempotency-Key", "k-1")], None).await;

    // Nothing is old yet.
    let pruned = state.store.prune(state.clock.now_ms()).await.unwrap();
    assert_eq!(pruned, Default::default());
    assert_eq!(lines(&ids[0]).await, 1);

    // Two days on: traffic is folded into a 5-minute row (same sums), the
    // key has expired, logs and commands are still kept.
    cp.clock.advance(Duration::from_secs(2 * 86_400));
    let pruned = state.store.prune(state.clock.now_ms()).await.unwrap();
    assert_eq!((pruned.logs, pruned.commands, pruned.idempotency_keys), (0, 0, 1), "{pruned:?}");
    let traffic = state.store.traffic("logs.localhost", 0).await.unwrap();
    assert_eq!(traffic.len(), 1, "{traffic:?}");
    assert_eq!(traffic[0].1, 5);
    let (_, again) = cp.call_with(Method::POST, "/api/apps/keys/deploy", &[("Idempotency-Key", "k-1")], None).await;
    assert_ne!(again["id"], first["id"], "an expired key is a new request");

    // Eight days on: the old deployments' logs and reports go, the newest
    // ones' stay; the acked command goes.
    cp.clock.advance(Duration::from_secs(6 * 86_400));
    let pruned = state.store.prune(state.clock.now_ms()).await.unwrap();
    assert_eq!(pruned.logs, 2, "{pruned:?}");
    assert_eq!(pruned.reports, 2, "{pruned:?}");
    assert_eq!(pruned.commands, 1, "{pruned:?}");
    assert_eq!(lines(&ids[0]).await, 0);
    assert_eq!(lines(&ids[1]).await, 0);
    assert_eq!(lines(&ids[2]).await, 1, "the app's last {KEEP_DEPLOYMENTS} deployments keep theirs");
    assert_eq!(lines(ids.last().unwrap()).await, 1);
    let (_, commands) = cp.call(Method::GET, &format!("/api/nodes/{}/commands", node.id), None).await;
    assert_eq!(commands["commands"], json!([]), "{commands}");

    // A month on, the traffic is gone too.
    cp.clock.advance(Duration::from_secs(30 * 86_400));
    state.store.prune(state.clock.now_ms()).await.unwrap();
    assert!(state.store.traffic("logs.localhost", 0).await.unwrap().is_empty());
}

// Item: an empty or missing state.db beside the CA refuses to start;
// a corrupt one is explained.
#[tokio::test]
async fn a_lost_database_is_not_replaced_by_a_new_cluster() {
    if cloudweb_e2e::state_db::skip_unless_sqlite("a lost or damaged database file") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let cp = Control::start(dir.path(), |_| {}).await;
    let token = cp.admin.clone();
    assert_eq!(cp.create_app("kept", json!({})).await.0, 201);
    cp.server.shutdown().await;
    let db = dir.path().join("state.db");
    let start = || cloudweb_server::start(cloudweb_server::config::Config::local(dir.path().to_path_buf()), std::sync::Arc::new(cloudweb_server::clock::ShiftedClock::default()));

    // Keep the database aside (with its write-ahead log, if any is left).
    let aside = dir.path().join("aside");
    std::fs::create_dir(&aside).unwrap();
    for file in ["state.db", "state.db-wal", "state.db-shm"] {
        let _ = std::fs::rename(dir.path().join(file), aside.join(file));
    }
    std::fs::write(&db, b"").unwrap();
    let err = start().await.err().expect("an empty database must not start").to_string();
    assert!(err.contains("is empty") && err.contains("refusing"), "{err}");
    // No migration ran, so there is no backup: the message says so
    // instead of pointing at a directory that does not exist.
    let backups = dir.path().join("backups");
    assert!(!backups.exists());
    assert!(err.contains(&format!("no backup exists in {}", backups.display())) && err.contains("start a new cluster"), "{err}");
    std::fs::remove_file(&db).unwrap();
    let err = start().await.err().expect("a missing database must not start").to_string();
    assert!(err.contains("is missing") && err.contains("no backup exists"), "{err}");
    assert_eq!(std::fs::read_to_string(dir.path().join("admin-token")).unwrap().trim(), token, "the admin token was not replaced");
    // With a backup, it points at it.
    std::fs::create_dir(&backups).unwrap();
    std::fs::write(backups.join("state-20260101T000000Z.db"), b"copy").unwrap();
    let err = start().await.err().expect("a missing database must not start").to_string();
    assert!(err.contains(&format!("restore the newest copy from {}", backups.display())) && !err.contains("no backup"), "{err}");
    std::fs::remove_dir_all(&backups).unwrap();

    std::fs::write(&db, vec![0x5a; 8192]).unwrap();
    let err = start().await.err().expect("a corrupt database must not start").to_string();
    assert!(err.contains("damaged or is not a cloud-web database") && err.contains("restore"), "{err}");

    // Restored, it starts with its apps.
    for file in ["state.db", "state.db-wal", "state.db-shm"] {
        let _ = std::fs::rename(aside.join(file), dir.path().join(file));
    }
    let server = start().await.unwrap();
    assert!(server.state.store.app("kept").await.unwrap().is_some());
    server.shutdown().await;

    // Damage in pages that opening never reads (a table of its own at the
    // end of the file) is found by the check at open.
    // With a busy timeout: the closed pool's last connection may still be
    // letting go of its lock for a few milliseconds.
    let sqlite = |sql: &str| {
        let out = std::process::Command::new("sqlite3").args(["-cmd", ".timeout 20000"]).arg(&db).arg(sql).output().expect("the sqlite3 program (scripts/deps.sh installs it)");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    };
    sqlite("PRAGMA wal_checkpoint(TRUNCATE); CREATE TABLE filler (x BLOB); WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 64) INSERT INTO filler SELECT randomblob(3000) FROM n; PRAGMA wal_checkpoint(TRUNCATE);");
    let good = std::fs::read(&db).unwrap();
    let mut damaged = good.clone();
    let len = damaged.len();
    damaged[len - 16 * 4096..].fill(0x5a);
    std::fs::write(&db, &damaged).unwrap();
    let err = start().await.err().expect("a damaged database must not start").to_string();
    assert!(err.contains("damaged or is not a cloud-web database") && err.contains("integrity check failed") && err.contains("restore"), "{err}");
    std::fs::write(&db, &good).unwrap();
    let server = start().await.unwrap();
    assert!(server.state.store.app("kept").await.unwrap().is_some());
    cloudweb_e2e::fault_summary("empty, missing, corrupt and partly damaged state.db: refused to start each time with a message naming the backups; the admin token kept; the restored database started with its apps");
}

// Item: a disk full answers 503 and a restart says so.
#[tokio::test]
async fn a_full_disk_answers_503_and_a_restart_says_so() {
    if cloudweb_e2e::state_db::skip_unless_sqlite("a full disk under the state") {
        return;
    }
    let mount = tempfile::tempdir().unwrap();
    let status = std::process::Command::new("mount").args(["-t", "tmpfs", "-o", "size=4m", "tmpfs"]).arg(mount.path()).status().unwrap();
    assert!(status.success(), "this test mounts a small tmpfs and needs root");
    struct Unmount(std::path::PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            // Lazily: the pool's connections close in the background.
            let _ = std::process::Command::new("umount").arg("-l").arg(&self.0).status();
        }
    }
    let _unmount = Unmount(mount.path().to_path_buf());
    let data = mount.path().join("data");
    let cp = Control::start(&data, |_| {}).await;
    assert_eq!(cp.create_app("before", json!({})).await.0, 201);
    // Fill the file system.
    let mut filler = std::fs::File::create(mount.path().join("filler")).unwrap();
    let chunk = vec![0u8; 64 * 1024];
    while std::io::Write::write_all(&mut filler, &chunk).is_ok() {}
    let small = vec![0u8; 512];
    while std::io::Write::write_all(&mut filler, &small).is_ok() {}
    let mut refused = None;
    for i in 0..50 {
        let (status, body) = cp.create_app(&format!("full{i}"), json!({"domains": [format!("d{i}.example.com")], "build": {"build_cmd": "x".repeat(500)}})).await;
        if status != 201 {
            refused = Some((status, body));
            break;
        }
    }
    let (status, body) = refused.expect("writes must fail on a full disk");
    assert_eq!(status, 503, "{body}");
    assert!(body["error"].as_str().unwrap().contains("disk is full"), "{body}");
    cp.server.shutdown().await;
    // Closing may have freed the write-ahead log's space: fill it again.
    drop(filler);
    let mut filler = std::fs::OpenOptions::new().append(true).open(mount.path().join("filler")).unwrap();
    while std::io::Write::write_all(&mut filler, &chunk).is_ok() {}
    while std::io::Write::write_all(&mut filler, &small).is_ok() {}

    let err = cloudweb_server::start(cloudweb_server::config::Config::local(data.clone()), std::sync::Arc::new(cloudweb_server::clock::ShiftedClock::default()))
        .await
        .err()
        .expect("a control plane cannot start on a full disk")
        .to_string();
    assert!(err.contains("is full") && err.contains("free some space"), "{err}");
    // Space again: it starts and has what it had.
    drop(filler);
    std::fs::remove_file(mount.path().join("filler")).unwrap();
    let server = cloudweb_server::start(cloudweb_server::config::Config::local(data), std::sync::Arc::new(cloudweb_server::clock::ShiftedClock::default()))
        .await
        .unwrap();
    assert!(server.state.store.app("before").await.unwrap().is_some());
}

// Item: a join whose answer was lost can be asked again.
#[tokio::test]
async fn a_join_sent_again_gets_the_same_answer() {
    let (_dir, cp) = control(|_| {}).await;
    let token = cp.token().await;
    let (_, csr) = key_and_csr(|_| {});
    let body = json!({"token": token, "csr": csr, "hostname": "h", "name": "again"}).to_string();
    let url = cp.agent_url("/agent/v1/join");
    let (status, first) = cp.anonymous().send(Method::POST, &url, &[], Some(&body)).await.unwrap();
    assert_eq!(status, 200, "{first}");
    let (status, second) = cp.anonymous().send(Method::POST, &url, &[], Some(&body)).await.unwrap();
    assert_eq!(status, 200, "{second}");
    let (first, second): (Value, Value) = (serde_json::from_str(&first).unwrap(), serde_json::from_str(&second).unwrap());
    assert_eq!(first["node_id"], second["node_id"]);
    assert_eq!(first["certificate"], second["certificate"]);
    assert_eq!(cp.server.state.nodes.len(), 1);
    // Another CSR with the spent token is still refused.
    let (_, other) = key_and_csr(|_| {});
    let body = json!({"token": token, "csr": other, "hostname": "h", "name": "thief"}).to_string();
    let (status, text) = cp.anonymous().send(Method::POST, &url, &[], Some(&body)).await.unwrap();
    assert_eq!(status, 401, "{text}");
    // The client hangs up at various points of the join; sending the same
    // request again always completes it, and each token makes one node.
    let mut spent_before_retry = 0;
    let drops = [1u64, 3, 6, 10, 15, 21, 28, 36, 45, 55];
    for (i, millis) in drops.iter().enumerate() {
        let token = cp.token().await;
        let (_, csr) = key_and_csr(|_| {});
        let body = json!({"token": token, "csr": csr, "hostname": "h", "name": format!("drop{i}")}).to_string();
        let impatient = reqwest::Client::builder()
            .use_rustls_tls()
            .danger_accept_invalid_certs(true)
            .timeout(Duration::from_millis(*millis))
            .build()
            .unwrap();
        let _ = impatient.post(&url).header("content-type", "application/json").body(body.clone()).send().await;
        // Whatever reached the server finishes there.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let digest = cloudweb_server::ca::sha256_hex(token.as_bytes());
        if cp.server.state.store.check_join_token(&digest, cp.server.state.clock.now_ms()).await.unwrap().is_err() {
            spent_before_retry += 1;
        }
        let (status, text) = cp.anonymous().send(Method::POST, &url, &[], Some(&body)).await.unwrap();
        assert_eq!(status, 200, "attempt {i}: {text}");
    }
    assert_eq!(cp.server.state.nodes.len(), 1 + drops.len());
    assert!(spent_before_retry > 0, "no first attempt reached the server; the retries proved nothing");
    cloudweb_e2e::fault_summary(&format!(
        "lost join answer: {} joins cut off between 1 and 55 ms ({spent_before_retry} after the server spent the token), every retry got the same node, 1 node per token",
        drops.len()
    ));
    // Past the token's life the same request is refused too.
    cp.clock.advance(Duration::from_secs(3601));
    let body = json!({"token": token, "csr": csr, "hostname": "h", "name": "again"}).to_string();
    assert_eq!(cp.anonymous().send(Method::POST, &url, &[], Some(&body)).await.unwrap().0, 401);
}

// Item: a write cancelled half way (a request whose client hung up) leaves
// no transaction open: later writes work and what they write stays.
#[tokio::test]
async fn cancelled_writes_leave_no_transaction_open() {
    if cloudweb_e2e::state_db::skip_unless_sqlite("cancelled writes against the database file") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let cp = Control::start(dir.path(), |_| {}).await;
    let store = cp.server.state.store.clone();
    // Cancel transactions at many points of their progress: at the BEGIN,
    // between its answer and the transaction object, in the middle; again
    // (up to 5 rounds) until some were cut off mid-transaction: holding
    // their transaction object, and the key still free (nothing committed).
    let (mut rolled_back, mut cut) = (0, 0);
    for round in 0..5u64 {
        for i in 0..600u64 {
            let key = format!("cancel-{round}-{i}");
            let write = Steps::new(store.claim_idempotency_key(&key, "digest", 0));
            let pending = write.pending.clone();
            // Every third write is cut off as soon as it holds its
            // transaction object (a point that does not depend on how
            // fast this machine is); the others after a growing time.
            let at_step = i % 3 == 0;
            let watched = pending.clone();
            let mid = tokio::select! {
                biased;
                _ = write => false,
                _ = spin(Duration::from_nanos(i * 500)), if !at_step => pending.load(Ordering::SeqCst) >= 2,
                _ = reached(move || watched.load(Ordering::SeqCst) >= 2), if at_step => true,
            };
            if mid {
                cut += 1;
                rolled_back += usize::from(store.claim_idempotency_key(&key, "digest", 0).await.unwrap() == IdempotencyClaim::New);
            }
            // Also from the user API: requests whose client gives up at once.
            if i % 40 == 0 {
                let client = reqwest::Client::builder().timeout(Duration::from_micros(300 + i)).build().unwrap();
                let _ = client
                    .post(format!("http://{}/api/apps", cp.server.api_addr))
                    .bearer_auth(&cp.admin)
                    .json(&json!({"name": format!("c{round}-{i}"), "repo_url": "https://git.example.com/a.git", "port": 80}))
                    .send()
                    .await;
            }
        }
        if rolled_back > 0 {
            break;
        }
    }
    eprintln!("{cut} writes cut off after their BEGIN, {rolled_back} of them before their commit");
    assert!(rolled_back > 0, "no write was cancelled mid-transaction in 3000 ({cut} after their BEGIN, all committed)");
    // Every connection of the pool takes writes, and they commit.
    for i in 0..20 {
        let (status, body) = tokio::time::timeout(Duration::from_secs(10), cp.create_app(&format!("after{i}"), json!({}))).await.expect("a write hung");
        assert_eq!(status, 201, "{body}");
    }
    cp.server.shutdown().await;
    let server = cloudweb_server::start(cloudweb_server::config::Config::local(dir.path().to_path_buf()), std::sync::Arc::new(cloudweb_server::clock::ShiftedClock::default()))
        .await
        .unwrap();
    for i in 0..20 {
        assert!(server.state.store.app(&format!("after{i}")).await.unwrap().is_some(), "after{i} was lost");
    }
}

// Item: Idempotency-Key on deploy and rollback.
#[tokio::test]
async fn a_replayed_idempotency_key_creates_one_deployment() {
    let (_dir, cp) = control(|_| {}).await;
    let node = cp.join("idem").await;
    cp.alive(&node).await;
    assert_eq!(cp.create_app("once", json!({})).await.0, 201);
    let key = [("Idempotency-Key", "deploy-1")];
    let (status, first) = cp.call_with(Method::POST, "/api/apps/once/deploy", &key, None).await;
    assert_eq!(status, 201, "{first}");
    let (status, second) = cp.call_with(Method::POST, "/api/apps/once/deploy", &key, None).await;
    assert_eq!(status, 201, "{second}");
    assert_eq!(first["id"], second["id"]);
    // At the same time, many replays: still one.
    let replays = (0..8).map(|_| cp.call_with(Method::POST, "/api/apps/once/deploy", &[("Idempotency-Key", "deploy-2")], Some(json!({}))));
    let answers = futures_util::future::join_all(replays).await;
    let ids: std::collections::BTreeSet<String> = answers.iter().filter(|(s, _)| *s == 201).map(|(_, b)| b["id"].as_str().unwrap().to_string()).collect();
    assert_eq!(ids.len(), 1, "{answers:?}");
    assert!(answers.iter().all(|(s, _)| *s == 201 || *s == 409), "{answers:?}");
    let (_, all) = cp.call(Method::GET, "/api/apps/once/deployments", None).await;
    assert_eq!(all["deployments"].as_array().unwrap().len(), 2, "{all}");

    // The same key with another body, or on another route: 422.
    let (status, body) = cp.call_with(Method::POST, "/api/apps/once/deploy", &key, Some(json!({"commit": "abc1234"}))).await;
    assert_eq!(status, 422, "{body}");
    let (status, body) = cp.call_with(Method::POST, "/api/apps/once/rollback", &key, Some(json!({"deployment_id": first["id"]}))).await;
    assert_eq!(status, 422, "{body}");

    // Rollback: same key, same answer.
    let id = first["id"].as_str().unwrap().to_string();
    cp.run_on(&node, &id, 1).await;
    let rollback = Some(json!({"deployment_id": id}));
    let key = [("Idempotency-Key", "rollback-1")];
    let (status, first) = cp.call_with(Method::POST, "/api/apps/once/rollback", &key, rollback.clone()).await;
    assert_eq!(status, 201, "{first}");
    let (_, second) = cp.call_with(Method::POST, "/api/apps/once/rollback", &key, rollback).await;
    assert_eq!(first["id"], second["id"]);
    let (_, all) = cp.call(Method::GET, "/api/apps/once/deployments", None).await;
    assert_eq!(all["deployments"].as_array().unwrap().len(), 3, "{all}");
    // A request that failed frees its key.
    let key = [("Idempotency-Key", "bad-1")];
    assert_eq!(cp.call_with(Method::POST, "/api/apps/none/deploy", &key, None).await.0, 404);
    assert_eq!(cp.call_with(Method::POST, "/api/apps/none/deploy", &key, None).await.0, 404);
    assert_eq!(cp.call_with(Method::POST, "/api/apps/once/deploy", &[("Idempotency-Key", "")], None).await.0, 400);
}

// Review: serde quotes the refused value, and a cut of its message inside
// a multi-byte character used to panic the handler (500).
#[tokio::test]
async fn a_json_error_quoting_multi_byte_text_is_a_400() {
    let (_dir, cp) = control(|_| {}).await;
    let port = format!("a{}", "é".repeat(300));
    let (status, body) = cp.call(Method::POST, "/api/apps", Some(json!({"name": "x", "repo_url": "https://e.com/x.git", "port": port}))).await;
    assert_eq!(status, 400, "{body}");
    let error = body["error"].as_str().unwrap();
    assert!(error.starts_with("invalid JSON body: invalid type: string \"aé"), "{error}");
    // The server is still answering.
    assert_eq!(cp.create_app("x", json!({})).await.0, 201);
}

/// The digest the API stores for a deploy request with an empty body.
fn deploy_digest(app: &str) -> String {
    use sha2::Digest;
    let mut digest = sha2::Sha256::new();
    digest.update(format!("POST /api/apps/{app}/deploy\n").as_bytes());
    hex::encode(digest.finalize())
}

// Review: a deploy cut off mid-request (the server killed) left its
// Idempotency-Key "still running" for a day. A claim older than 60 s, or
// made before the last start, is free.
#[tokio::test]
async fn an_idempotency_key_cut_off_by_a_crash_is_freed() {
    let dir = tempfile::tempdir().unwrap();
    let cp = Control::start(dir.path(), |_| {}).await;
    let node = cp.join("idem-crash").await;
    cp.alive(&node).await;
    assert_eq!(cp.create_app("crash", json!({})).await.0, 201);
    let store = &cp.server.state.store;
    // A request that claimed its key and never finished, as a killed
    // process leaves it.
    let claim = store.claim_idempotency_key("cut-1", &deploy_digest("crash"), cp.server.state.clock.now_ms()).await.unwrap();
    assert_eq!(claim, cloudweb_server::store::IdempotencyClaim::New);
    let key = [("Idempotency-Key", "cut-1")];
    let (status, body) = cp.call_with(Method::POST, "/api/apps/crash/deploy", &key, None).await;
    assert_eq!(status, 409, "a fresh claim is still running: {body}");
    cp.clock.advance(Duration::from_secs(61));
    let (status, first) = cp.call_with(Method::POST, "/api/apps/crash/deploy", &key, None).await;
    assert_eq!(status, 201, "a claim older than 60 s is free: {first}");
    let (_, again) = cp.call_with(Method::POST, "/api/apps/crash/deploy", &key, None).await;
    assert_eq!(again["id"], first["id"], "and the new answer is replayed");

    // Cut off by a restart: free at once.
    let now = cp.server.state.clock.now_ms();
    assert_eq!(store.claim_idempotency_key("cut-2", &deploy_digest("crash"), now).await.unwrap(), cloudweb_server::store::IdempotencyClaim::New);
    cp.server.shutdown().await;
    let cp = Control::start(dir.path(), |_| {}).await;
    let (status, body) = cp.call_with(Method::POST, "/api/apps/crash/deploy", &[("Idempotency-Key", "cut-2")], None).await;
    assert_eq!(status, 201, "a claim from before the restart is free: {body}");
    let (_, again) = cp.call_with(Method::POST, "/api/apps/crash/deploy", &[("Idempotency-Key", "cut-1")], None).await;
    assert_eq!(again["id"], first["id"], "finished answers survive the restart");
}
