//! Disaster recovery of the control plane, end to end with the real
//! binaries, real restic, the registry and two agents: an app deployed,
//! the control plane backed up to a path destination, killed, its data dir
//! deleted, and `cloudweb-server restore` run with the recovery key into a
//! fresh data dir (a wrong key first, which writes nothing). Started on
//! the same public URL and ports, both agents are back within 60 s
//! without a join, the app is listed, a new deploy succeeds, and the app
//! answered all along.

use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use cloudweb_e2e::{bin, ensure_images, free_port, unique_name, wait_for, AgentNode, GitServer, ServerProcess};
use reqwest::Method;
use serde_json::{json, Value};

const DOCKERFILE: &str = "FROM cloudweb-test/busybox:latest\nCOPY index.html /www/index.html\nCMD [\"httpd\", \"-f\", \"-p\", \"8080\", \"-h\", \"/www\"]\n";
const AGENT_FLAGS: [&str; 6] = ["--heartbeat-interval-seconds", "1", "--publish-ip", "127.0.0.1", "--advertise-host", "127.0.0.1"];
const BACK_WITHIN: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_control_plane_restored_on_a_fresh_data_dir_gets_its_agents_back_without_a_join_and_apps_keep_serving() {
    ensure_images().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let git = GitServer::start(&tmp.path().join("git")).unwrap();
    let registry = format!("127.0.0.1:{}", free_port());
    let flags = ["--registry-bin", "/usr/bin/docker-registry", "--registry-listen", &registry, "--drain-seconds", "1", "--allow-private-git-hosts"];
    let (agent_port, api_port) = (free_port(), free_port());
    let mut server = ServerProcess::start_program(&bin("cloudweb-server"), tmp.path(), agent_port, api_port, &flags).await.unwrap();
    let mut agents = Vec::new();
    for name in ["node-a", "node-b"] {
        let (token, ca) = server.join_token().await.unwrap();
        let mut agent = AgentNode::join(&server, &tmp.path().join(name), name, &token, &ca, &[]).unwrap().unwrap();
        agent.start(&AGENT_FLAGS).unwrap();
        agents.push(agent);
    }
    let result = scenario(tmp.path(), &git, &mut server, &agents, &flags).await;
    if let Err(err) = result {
        let logs: Vec<String> = agents.iter().map(|a| format!("agent {}:\n{}", a.node_id, a.log_text())).collect();
        panic!("{err:#}\nserver log:\n{}\n{}", server.process.log_text(), logs.join("\n"));
    }
}

async fn call(server: &ServerProcess, method: Method, path: &str, body: Option<Value>) -> Result<(u16, Value)> {
    server.call(method, path, body).await
}

async fn deploy_and_settle(server: &ServerProcess, app: &str, commit: &str) -> Result<Value> {
    server.deploy_and_settle(app, Some(commit)).await
}

async fn scenario(root: &std::path::Path, git: &GitServer, server: &mut ServerProcess, agents: &[AgentNode], flags: &[&str]) -> Result<()> {
    let started = Instant::now();
    for agent in agents {
        let id = agent.node_id.clone();
        wait_for(Duration::from_secs(20), "node ready", || async { (server.node(&id).await.ok()?["state"] == "ready").then_some(()) }).await?;
    }
    let app = unique_name("kept");
    let commit_a = git.commit(&app, &[("Dockerfile", DOCKERFILE), ("index.html", "version A\n")], "A")?;
    let (status, body) = call(server, Method::POST, "/api/apps", Some(json!({"name": app, "repo_url": git.url(&app), "port": 8080, "health_timeout_seconds": 20}))).await?;
    if status != 201 {
        bail!("creating the app answered {status}: {body}");
    }
    let first = deploy_and_settle(server, &app, &commit_a).await?;
    let url = format!("http://{}/", first["instances"][0]["address"].as_str().context("address")?);
    eprintln!("app running after {:?}", started.elapsed());

    // A path destination; its recovery kit holds the control-plane
    // repository and the key.
    let repo = root.join("backups");
    let (status, created) = call(server, Method::POST, "/api/backup-destinations", Some(json!({"name": "local", "kind": "path", "path": repo.display().to_string()}))).await?;
    if status != 201 {
        bail!("adding the destination answered {status}: {created}");
    }
    let kit = &created["recovery_kit"];
    let from = kit["control_plane_repository"].as_str().context("control-plane repository")?.to_string();
    let key = kit["password"].as_str().context("password")?.to_string();
    // The first scheduled run may have started already (a destination was
    // just added); either way one backup must end well.
    let (status, job) = call(server, Method::POST, "/api/control-plane/backups", None).await?;
    if status != 202 && status != 409 {
        bail!("POST /api/control-plane/backups answered {status}: {job}");
    }
    let target = wait_for(Duration::from_secs(60), "a successful control-plane backup", || async {
        let (_, overview) = server.call(Method::GET, "/api/backups", None).await.ok()?;
        let target = overview["targets"].as_array()?.iter().find(|t| t["target"] == "control-plane")?.clone();
        (target["last_state"] == "succeeded" && target["last_success_at"].is_string()).then_some(target)
    })
    .await?;
    if target["last_bytes"].as_i64().unwrap_or(0) <= 0 {
        bail!("the backup has no size: {target}");
    }
    let metric = server.metric("cloudweb_backup_last_success_timestamp_seconds{target=\"control-plane\"}").await?;
    if metric <= 0.0 {
        bail!("/metrics has no control-plane backup time");
    }
    eprintln!("control plane backed up after {:?}", started.elapsed());

    // From here on, the app is asked every 100 ms.
    let stop = Arc::new(AtomicBool::new(false));
    let (asked, failed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let poller = {
        let (stop, asked, failed, url) = (stop.clone(), asked.clone(), failed.clone(), url.clone());
        tokio::spawn(async move {
            let http = reqwest::Client::builder().timeout(Duration::from_secs(2)).build().expect("client");
            while !stop.load(Ordering::Relaxed) {
                asked.fetch_add(1, Ordering::Relaxed);
                let good = match http.get(&url).send().await {
                    Ok(response) if response.status().is_success() => response.text().await.is_ok_and(|t| t == "version A\n"),
                    _ => false,
                };
                if !good {
                    failed.fetch_add(1, Ordering::Relaxed);
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };

    // The disaster: the control plane is gone with its data dir.
    server.process.kill();
    let data_dir = root.join("server");
    std::fs::remove_dir_all(&data_dir)?;
    let lost = Instant::now();

    // A wrong key is refused and writes nothing.
    let wrong_key = root.join("wrong.key");
    std::fs::write(&wrong_key, "not-the-recovery-key\n")?;
    let restore = |key_file: &std::path::Path| {
        Command::new(bin("cloudweb-server"))
            .args(["restore", "--from", &from, "--recovery-key-file", &key_file.display().to_string(), "--data-dir", &data_dir.display().to_string()])
            .env("NO_COLOR", "1")
            .output()
    };
    let refused = restore(&wrong_key)?;
    let refused_text = format!("{}{}", String::from_utf8_lossy(&refused.stdout), String::from_utf8_lossy(&refused.stderr));
    if refused.status.success() || !refused_text.contains("recovery key does not open") {
        bail!("a wrong key was not refused: {refused_text}");
    }
    if data_dir.exists() || std::fs::read_dir(root)?.flatten().any(|e| e.file_name().to_string_lossy().contains(".restore-")) {
        bail!("a refused restore wrote something");
    }

    let key_file = root.join("recovery.key");
    std::fs::write(&key_file, format!("{key}\n"))?;
    let restored = restore(&key_file)?;
    let restored_text = format!("{}{}", String::from_utf8_lossy(&restored.stdout), String::from_utf8_lossy(&restored.stderr));
    if !restored.status.success() || !restored_text.contains("old (the backup was taken at") || !restored_text.contains("--public-url") {
        bail!("the restore failed: {restored_text}");
    }
    eprintln!("{restored_text}");

    // Same public URL and ports; no agent is touched.
    *server = ServerProcess::start_program(&bin("cloudweb-server"), root, server.agent_port, server.api_port, flags).await?;
    for agent in agents {
        let id = agent.node_id.clone();
        wait_for(BACK_WITHIN.saturating_sub(lost.elapsed()), &format!("{id} to heartbeat to the restored control plane"), || async {
            let (status, _) = server.call(Method::GET, &format!("/api/nodes/{id}/last-heartbeat"), None).await.ok()?;
            (status == 200 && server.node(&id).await.ok()?["state"] == "ready").then_some(())
        })
        .await?;
    }
    let back = lost.elapsed();
    eprintln!("both agents back {back:?} after the control plane was lost");
    let (_, nodes) = call(server, Method::GET, "/api/nodes", None).await?;
    let mut listed: Vec<String> = nodes["nodes"].as_array().context("nodes")?.iter().filter_map(|n| n["id"].as_str().map(str::to_string)).collect();
    let mut joined: Vec<String> = agents.iter().map(|a| a.node_id.clone()).collect();
    listed.sort();
    joined.sort();
    if listed != joined {
        bail!("the restored control plane lists {listed:?}, not the two nodes that never joined again ({joined:?})");
    }
    let (_, apps) = call(server, Method::GET, "/api/apps", None).await?;
    if !apps.to_string().contains(&app) {
        bail!("the app is not listed: {apps}");
    }
    let (_, overview) = call(server, Method::GET, "/api/backups", None).await?;
    let own = overview["targets"].as_array().and_then(|t| t.iter().find(|t| t["target"] == "control-plane").cloned()).unwrap_or_default();
    if own["last_state"] != "succeeded" {
        bail!("the restored control plane's own backup should read succeeded: {overview}");
    }

    // The app answered through the whole outage.
    stop.store(true, Ordering::Relaxed);
    poller.await?;
    let (asked, failed) = (asked.load(Ordering::Relaxed), failed.load(Ordering::Relaxed));
    eprintln!("the app was asked {asked} times during the outage, {failed} failed");
    if asked < 10 || failed > 0 {
        bail!("the app did not answer the whole time: {failed} of {asked} requests failed");
    }

    // A new deploy goes through the restored control plane and both sides
    // of its registry.
    let commit_b = git.commit(&app, &[("index.html", "version B\n")], "B")?;
    let second = deploy_and_settle(server, &app, &commit_b).await?;
    let url_b = format!("http://{}/", second["instances"][0]["address"].as_str().context("address")?);
    let text = reqwest::get(&url_b).await?.text().await?;
    if text != "version B\n" {
        bail!("the new deployment answers {text:?}");
    }
    eprintln!("scenario done in {:?}", started.elapsed());
    Ok(())
}
