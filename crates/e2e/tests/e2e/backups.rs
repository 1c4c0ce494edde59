//! Issue 23, backups, end to end with the real binaries, Docker, restic, a
//! real PostgreSQL and an S3-compatible server (moto's): a database backed
//! up to S3 comes back after its table is dropped, is verified by
//! restoring it (rows counted), is cloned into a new service, and a damaged
//! repository fails its verification and alerts; a volume's files come
//! back identical; a destination that went away fails the backup with its
//! reason, prunes nothing, is retried on schedule with back-off (2 s, 8 s,
//! 32 s here) and alerts until the retry that succeeds.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use cloudweb_e2e::s3::{S3Server, ACCESS_KEY_ID, SECRET_ACCESS_KEY};
use cloudweb_e2e::services::{call, ensure_service_images, psql_in as psql, service_ports, services_node, AGENT_FLAGS};
use cloudweb_e2e::{start_platform, unique_name, wait_for, AgentNode, Platform, ServerProcess};
use reqwest::Method;
use serde_json::{json, Value};

const IMAGE: &str = "cloudweb-test/postgres:15";

/// Waits until job `id` ends; its view.
async fn until_done(server: &ServerProcess, agent: &AgentNode, id: &str, limit: Duration) -> Value {
    wait_for(limit, &format!("job {id} to end"), || async {
        let (_, job) = server.call(Method::GET, &format!("/api/backups/{id}"), None).await.ok()?;
        (!matches!(job["state"].as_str(), Some("queued" | "running")) && job["kept_state"] != "settling").then_some(job)
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\nagent log:\n{}", agent.log_text()))
}

async fn until_healthy(server: &ServerProcess, agent: &AgentNode, name: &str) {
    wait_for(Duration::from_secs(120), &format!("service {name} to be healthy"), || async {
        let (_, view) = server.call(Method::GET, &format!("/api/services/{name}"), None).await.ok()?;
        (view["state"] == "healthy").then_some(())
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\nagent log:\n{}", agent.log_text()));
}

const CHECKSUM: &str = "SELECT count(*) || ':' || md5(string_agg(id || ':' || body, ',' ORDER BY id)) FROM items";

/// Polls `psql` until it answers (a service that just started).
async fn answer(service: &str, sql: &str) -> String {
    wait_for(Duration::from_secs(60), &format!("{service} to answer"), || async { psql(service, sql).ok() }).await.unwrap()
}

#[tokio::test]
async fn a_postgres_backup_on_s3_restores_dropped_rows_is_verified_cloned_and_a_damaged_repository_alerts() {
    ensure_service_images();
    let ports = service_ports();
    let Platform { tmp, git: _git, server } = start_platform(&["--service-image", &format!("postgres={IMAGE}"), "--service-ports", &ports]).await.unwrap();
    let agent = services_node(&server, tmp.path(), "db-node").await;
    let name = unique_name("pg");
    let (status, body) = call(&server, Method::POST, "/api/services", Some(json!({"name": name, "type": "postgres"}))).await;
    assert_eq!(status, 201, "{body}");
    until_healthy(&server, &agent, &name).await;
    answer(&name, "CREATE TABLE items (id int PRIMARY KEY, body text); INSERT INTO items SELECT g, md5(g::text) FROM generate_series(1, 5000) g").await;
    let before = psql(&name, CHECKSUM).unwrap();
    assert!(before.starts_with("5000:"), "{before}");

    let s3 = S3Server::start().await;
    s3.create_bucket("backups").await;
    let prefix = unique_name("cluster");
    // A destination that does not answer is refused, and nothing is kept.
    let dead = json!({"name": "dead", "kind": "s3", "endpoint": format!("http://127.0.0.1:{}", cloudweb_e2e::free_port()), "bucket": "backups",
        "access_key_id": ACCESS_KEY_ID, "secret_access_key": SECRET_ACCESS_KEY});
    let (status, body) = call(&server, Method::POST, "/api/backup-destinations", Some(dead)).await;
    assert_eq!(status, 502, "{body}");
    assert!(body["error"].as_str().unwrap().contains("did not answer"), "{body}");
    assert!(!body.to_string().contains(SECRET_ACCESS_KEY), "{body}");
    for (bad, fragment) in [
        (json!({"name": "x", "kind": "s3", "endpoint": "ftp://h", "bucket": "backups", "access_key_id": "a", "secret_access_key": "b"}), "endpoint"),
        (json!({"name": "x", "kind": "path", "path": "relative"}), "absolute"),
        (json!({"name": "X", "kind": "path", "path": "/srv"}), "name"),
        (json!({"name": "x", "kind": "tape"}), "kind"),
    ] {
        let (status, body) = call(&server, Method::POST, "/api/backup-destinations", Some(bad.clone())).await;
        assert_eq!(status, 400, "{bad} -> {body}");
        assert!(body["error"].as_str().unwrap().contains(fragment), "{bad} -> {body}");
    }
    let (status, listed) = call(&server, Method::GET, "/api/backup-destinations", None).await;
    assert_eq!((status, listed["destinations"].as_array().unwrap().len()), (200, 0), "{listed}");

    let (status, created) = call(
        &server,
        Method::POST,
        "/api/backup-destinations",
        Some(json!({"name": "offsite", "kind": "s3", "endpoint": s3.endpoint(), "bucket": "backups", "prefix": prefix,
            "access_key_id": ACCESS_KEY_ID, "secret_access_key": SECRET_ACCESS_KEY})),
    )
    .await;
    assert_eq!(status, 201, "{created}");
    let kit = created["recovery_kit"].clone();
    let password = kit["password"].as_str().unwrap().to_string();
    let repository = kit["repository"].as_str().unwrap().to_string();
    assert_eq!(password.len(), 64, "{kit}");
    assert!(kit["text"].as_str().unwrap().contains(&password) && kit["text"].as_str().unwrap().contains("cloudweb-server restore"), "{kit}");
    // The kit is given once: no later answer holds the password or the secret.
    for path in ["/api/backup-destinations".to_string(), "/api/backups".to_string(), format!("/api/services/{name}/backups")] {
        let (_, body) = call(&server, Method::GET, &path, None).await;
        assert!(!body.to_string().contains(&password) && !body.to_string().contains(SECRET_ACCESS_KEY), "{path} shows a secret: {body}");
    }
    let (_, plan) = call(&server, Method::GET, &format!("/api/services/{name}/backups"), None).await;
    assert_eq!(plan["plan"]["destination"], "offsite", "{plan}");
    assert!(plan["plan"]["default"].as_bool().unwrap(), "{plan}");
    // The default schedule is a minute of a night hour (UTC) derived from
    // the name: a run at night could see it fire mid-test, and the alert
    // below speaks of the newest good backup. One that cannot fire now.
    let (status, body) = call(&server, Method::PUT, &format!("/api/services/{name}/backup-plan"), Some(json!({"schedule": "0 0 29 2 *"}))).await;
    assert_eq!(status, 200, "{body}");

    // A backup now.
    let started = Instant::now();
    let (status, job) = call(&server, Method::POST, &format!("/api/services/{name}/backups"), None).await;
    assert_eq!(status, 202, "{job}");
    let (status, busy) = call(&server, Method::POST, &format!("/api/services/{name}/backups"), None).await;
    assert!(status == 409 || status == 202, "a second backup while one runs: {status} {busy}");
    let backup = until_done(&server, &agent, job["id"].as_str().unwrap(), Duration::from_secs(120)).await;
    assert_eq!(backup["state"], "succeeded", "{backup}\nagent log:\n{}", agent.log_text());
    eprintln!("backup of 5000 rows: {:.1} s, {} bytes", started.elapsed().as_secs_f64(), backup["bytes"]);
    let snapshot = backup["snapshot"].as_str().unwrap().to_string();
    let backup_id = backup["id"].as_str().unwrap().to_string();
    assert!(backup["bytes"].as_i64().unwrap() > 10_000, "{backup}");

    // Plain restic and the kit reach it without cloud-web.
    let out = Command::new("restic")
        .args(["-r", &repository, "snapshots", "--json", "--no-lock"])
        .env("RESTIC_PASSWORD", &password)
        .env("AWS_ACCESS_KEY_ID", ACCESS_KEY_ID)
        .env("AWS_SECRET_ACCESS_KEY", SECRET_ACCESS_KEY)
        .env("RESTIC_CACHE_DIR", tmp.path().join("restic-cache"))
        .output()
        .unwrap();
    let listed = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && listed.contains(&snapshot) && listed.contains(&format!("target=service/{name}")), "{listed} {}", String::from_utf8_lossy(&out.stderr));

    // Verified by restoring it: every row counted.
    let (status, job) = call(&server, Method::POST, &format!("/api/backups/{backup_id}/verify"), None).await;
    assert_eq!(status, 202, "{job}");
    let verified = until_done(&server, &agent, job["id"].as_str().unwrap(), Duration::from_secs(180)).await;
    assert_eq!(verified["state"], "succeeded", "{verified}\nagent log:\n{}", agent.log_text());
    assert_eq!(verified["counts"]["public.items"], 5000, "{verified}");
    let (_, shown) = call(&server, Method::GET, &format!("/api/backups/{backup_id}"), None).await;
    assert_eq!(shown["verification"]["state"], "passed", "{shown}");

    // Drop the table, restore in place: the rows are back.
    psql(&name, "DROP TABLE items").unwrap();
    let (status, job) = call(&server, Method::POST, &format!("/api/backups/{backup_id}/restore"), Some(json!({}))).await;
    assert_eq!(status, 202, "{job}");
    let restored = until_done(&server, &agent, job["id"].as_str().unwrap(), Duration::from_secs(180)).await;
    assert_eq!(restored["state"], "succeeded", "{restored}\nagent log:\n{}", agent.log_text());
    until_healthy(&server, &agent, &name).await;
    assert_eq!(answer(&name, CHECKSUM).await, before, "the rows came back as they were");
    let kept = restored["kept_volume"].as_str().unwrap().to_string();
    assert_eq!(restored["kept_state"], "kept", "{restored}");
    let (_, volumes) = call(&server, Method::GET, "/api/volumes", None).await;
    assert!(volumes["volumes"].as_array().unwrap().iter().any(|v| v["name"] == kept.as_str()), "the replaced data is kept as {kept}: {volumes}");
    assert!(agent.dir.join("volumes").join(&kept).is_dir(), "kept on the node");
    let (status, confirmed) = call(&server, Method::POST, &format!("/api/backups/{}/confirm", restored["id"].as_str().unwrap()), None).await;
    assert_eq!(status, 200, "{confirmed}");
    assert_eq!(confirmed["kept_state"], "purged", "{confirmed}");
    wait_for(Duration::from_secs(20), "the kept data to be deleted", || async { (!agent.dir.join("volumes").join(&kept).exists()).then_some(()) }).await.unwrap();

    // A clone into a new service.
    let copy = format!("{name}-copy");
    let (status, job) = call(&server, Method::POST, &format!("/api/backups/{backup_id}/restore"), Some(json!({"to": copy}))).await;
    assert_eq!(status, 202, "{job}");
    let cloned = until_done(&server, &agent, job["id"].as_str().unwrap(), Duration::from_secs(180)).await;
    assert_eq!(cloned["state"], "succeeded", "{cloned}\nagent log:\n{}", agent.log_text());
    until_healthy(&server, &agent, &copy).await;
    assert_eq!(answer(&copy, CHECKSUM).await, before, "the clone holds the same rows");
    let metrics = server.http.get(server.api("/metrics")).bearer_auth(&server.admin_token).send().await.unwrap().text().await.unwrap();
    assert!(metrics.contains(&format!("cloudweb_backup_last_success_bytes{{target=\"service/{name}\"}}")), "{metrics}");

    // Damage every pack file on the S3 server: the verification fails and alerts.
    let packs = s3.keys("backups", &format!("{prefix}/data/data/")).await;
    assert!(!packs.is_empty(), "pack files under {prefix}/data/data/");
    for key in &packs {
        let mut bytes = s3.get("backups", key).await;
        let middle = bytes.len() / 2;
        let end = (middle + 16).min(bytes.len());
        for byte in &mut bytes[middle..end] {
            *byte ^= 0xff;
        }
        s3.put("backups", key, bytes).await;
    }
    let (status, job) = call(&server, Method::POST, &format!("/api/backups/{backup_id}/verify"), None).await;
    assert_eq!(status, 202, "{job}");
    let damaged = until_done(&server, &agent, job["id"].as_str().unwrap(), Duration::from_secs(180)).await;
    assert_eq!(damaged["state"], "failed", "{damaged}");
    let (_, overview) = call(&server, Method::GET, "/api/backups", None).await;
    let alerts = overview["alerts"].as_array().unwrap();
    assert!(alerts.iter().any(|a| a.as_str().unwrap().contains(&format!("service/{name}")) && a.as_str().unwrap().contains("verification")), "{overview}");
    let metrics = server.http.get(server.api("/metrics")).bearer_auth(&server.admin_token).send().await.unwrap().text().await.unwrap();
    assert!(metrics.contains(&format!("cloudweb_backup_alert{{target=\"service/{name}\"}} 1")), "{metrics}");
}

/// SHA-256 of every file under `dir`, by relative path.
fn tree(dir: &Path) -> BTreeMap<String, String> {
    use sha2::{Digest, Sha256};
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(next) = stack.pop() {
        for entry in std::fs::read_dir(&next).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else {
                let rel = path.strip_prefix(dir).unwrap().to_string_lossy().into_owned();
                out.insert(rel, hex::encode(Sha256::digest(std::fs::read(&path).unwrap())));
            }
        }
    }
    out
}

/// Each container that starts appends its host name to a file on the
/// volume, then serves the volume's files.
const DOCKERFILE: &str = "FROM cloudweb-test/busybox:latest\n\
CMD [\"sh\", \"-c\", \"mkdir -p /data/www && hostname >> /data/www/boots && exec httpd -f -p 8080 -h /data/www\"]\n";

#[tokio::test]
async fn a_volume_comes_back_identical_and_a_destination_that_went_away_fails_prunes_nothing_is_retried_and_alerts() {
    // Retries of a failed scheduled backup wait 2, 8 and 32 s (the watcher
    // looks every 5 s: a wait without back-off would be seen as ~5 s).
    let Platform { tmp, git, server } = start_platform(&["--backup-retry-seconds", "2"]).await.unwrap();
    let (token, ca) = server.join_token().await.unwrap();
    let mut agent = AgentNode::join(&server, &tmp.path().join("node"), "disk", &token, &ca, &[]).unwrap().unwrap();
    agent.start(&AGENT_FLAGS).unwrap();
    let node_id = agent.node_id.clone();
    wait_for(Duration::from_secs(20), "the node to back up", || async {
        let node = server.node(&node_id).await.ok()?;
        (node["state"] == "ready" && node["features"].as_array()?.iter().any(|f| f == "backups")).then_some(())
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
    let (status, body) = call(&server, Method::POST, &format!("/api/apps/{app}/deploy"), None).await;
    assert_eq!(status, 201, "{body}");
    let id = body["id"].as_str().unwrap().to_string();
    wait_for(Duration::from_secs(120), "the app to run", || async {
        let (_, d) = server.call(Method::GET, &format!("/api/deployments/{id}"), None).await.ok()?;
        (d["state"] == "running").then_some(())
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\nagent log:\n{}", agent.log_text()));
    // Files with known contents.
    let data = agent.dir.join("volumes").join(&volume);
    std::fs::create_dir_all(data.join("www/docs")).unwrap();
    for i in 0..50u32 {
        std::fs::write(data.join(format!("www/docs/f{i}.bin")), vec![(i % 251) as u8; 1000 + i as usize * 997]).unwrap();
    }
    let before = tree(&data);

    let target = tmp.path().join("backups");
    std::fs::create_dir_all(&target).unwrap();
    let (status, created) = call(&server, Method::POST, "/api/backup-destinations", Some(json!({"name": "local", "kind": "path", "path": target.to_string_lossy()}))).await;
    assert_eq!(status, 201, "{created}");
    let (status, job) = call(&server, Method::POST, &format!("/api/volumes/{volume}/backups"), None).await;
    assert_eq!(status, 202, "{job}");
    let backup = until_done(&server, &agent, job["id"].as_str().unwrap(), Duration::from_secs(120)).await;
    assert_eq!(backup["state"], "succeeded", "{backup}\nagent log:\n{}", agent.log_text());
    assert_eq!(backup["files"].as_i64().unwrap(), before.len() as i64, "{backup}");

    // Deleted and damaged files, then a restore in place: identical again.
    for i in 0..25u32 {
        std::fs::remove_file(data.join(format!("www/docs/f{i}.bin"))).unwrap();
    }
    std::fs::write(data.join("www/docs/f30.bin"), b"changed").unwrap();
    let (status, job) = call(&server, Method::POST, &format!("/api/backups/{}/restore", backup["id"].as_str().unwrap()), None).await;
    assert_eq!(status, 202, "{job}");
    let restored = until_done(&server, &agent, job["id"].as_str().unwrap(), Duration::from_secs(120)).await;
    assert_eq!(restored["state"], "succeeded", "{restored}\nagent log:\n{}", agent.log_text());
    let after = tree(&data);
    // The app restarted on the restored data appends its boot line.
    let mut expected = before.clone();
    expected.remove("www/boots");
    let mut got = after.clone();
    got.remove("www/boots");
    assert_eq!(got, expected, "every file as it was backed up");
    assert!(agent.dir.join("volumes").join(restored["kept_volume"].as_str().unwrap()).is_dir(), "the replaced data is kept");

    // The destination goes away: the backup fails with the reason, prunes
    // nothing, and alerts until a backup succeeds again.
    let away = tmp.path().join("backups-away");
    std::fs::rename(&target, &away).unwrap();
    let (_, job) = call(&server, Method::POST, &format!("/api/volumes/{volume}/backups"), None).await;
    let failed = until_done(&server, &agent, job["id"].as_str().unwrap(), Duration::from_secs(120)).await;
    assert_eq!(failed["state"], "failed", "{failed}");
    assert!(failed["message"].as_str().unwrap().contains("repository"), "a reason in words: {failed}");
    assert_ne!(failed["pruned"], true, "{failed}");
    let (_, overview) = call(&server, Method::GET, "/api/backups", None).await;
    assert!(overview["alerts"].as_array().unwrap().iter().any(|a| a.as_str().unwrap().contains(&format!("volume/{volume}"))), "{overview}");
    // The same is an alert (what channels send; `cloudweb alerts`).
    let subject = format!("volume/{volume}");
    let backup_alert = |all: bool| {
        let (server, subject) = (&server, subject.clone());
        async move {
            let (_, list) = server.call(Method::GET, if all { "/api/alerts?all=1" } else { "/api/alerts" }, None).await.ok()?;
            list["alerts"].as_array()?.iter().find(|a| a["kind"] == "backup_failed" && a["subject"] == subject.as_str()).cloned()
        }
    };
    let opened = wait_for(Duration::from_secs(20), "the backup_failed alert", || backup_alert(false)).await.unwrap();
    assert!(opened["summary"].as_str().unwrap().contains("need attention"), "{opened}");
    // Scheduled every minute: the scheduled backup fails, and is retried
    // with back-off (2 s, then 8 s), failing again, never pruning.
    let plan_path = format!("/api/volumes/{volume}/backup-plan");
    let (status, plan) = call(&server, Method::PUT, &plan_path, Some(json!({"schedule": "* * * * *"}))).await;
    assert_eq!(status, 200, "{plan}");
    let jobs_path = format!("/api/volumes/{volume}/backups");
    let tries = wait_for(Duration::from_secs(150), "a scheduled backup and two retries to fail", || async {
        let (_, list) = server.call(Method::GET, &jobs_path, None).await.ok()?;
        let mut tries: Vec<Value> = list["jobs"].as_array()?.iter().filter(|j| j["kind"] == "backup" && j["trigger"] != "manual").cloned().collect();
        tries.reverse(); // oldest first
        (tries.len() >= 3 && tries[..3].iter().all(|j| j["state"] == "failed")).then_some(tries)
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\nagent log:\n{}", agent.log_text()));
    let at = |job: &Value, field: &str| time::OffsetDateTime::parse(job[field].as_str().unwrap(), &time::format_description::well_known::Rfc3339).unwrap();
    let triggers: Vec<(&str, i64)> = tries[..3].iter().map(|j| (j["trigger"].as_str().unwrap(), j["attempt"].as_i64().unwrap())).collect();
    assert_eq!(triggers, vec![("schedule", 1), ("retry", 2), ("retry", 3)], "{tries:?}");
    let waits: Vec<f64> = (1..3).map(|i| (at(&tries[i], "created_at") - at(&tries[i - 1], "finished_at")).as_seconds_f64()).collect();
    eprintln!("retry waits after a failed scheduled backup: {waits:?} s (at least 2 and 8)");
    assert!(waits[0] >= 2.0 && waits[1] >= 8.0, "each retry waits four times longer: {waits:?}");
    assert!(tries[..3].iter().all(|j| j["pruned"] != true), "{tries:?}");
    // The destination back: the next retry (32 s later) succeeds and
    // clears the alert.
    std::fs::rename(&away, &target).unwrap();
    let snapshots = std::fs::read_dir(target.join("data/snapshots")).unwrap().count();
    assert_eq!(snapshots, 1, "the failures pruned nothing");
    let again = wait_for(Duration::from_secs(90), "the last retry to succeed", || async {
        let (_, list) = server.call(Method::GET, &jobs_path, None).await.ok()?;
        list["jobs"].as_array()?.iter().find(|j| j["trigger"] == "retry" && j["attempt"] == 4 && j["state"] == "succeeded").cloned()
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\nagent log:\n{}", agent.log_text()));
    assert!((at(&again, "created_at") - at(&tries[2], "finished_at")).as_seconds_f64() >= 32.0, "{again}");
    let (_, overview) = call(&server, Method::GET, "/api/backups", None).await;
    assert!(!overview["alerts"].as_array().unwrap().iter().any(|a| a.as_str().unwrap().contains(&format!("volume/{volume}"))), "the success cleared it: {overview}");
    let resolved = wait_for(Duration::from_secs(20), "the backup alert resolved", || async { backup_alert(true).await.filter(|a| a["resolved_at"].is_string()) }).await.unwrap();
    assert_eq!(resolved["id"], opened["id"], "one alert for the whole outage: {resolved}");
}
