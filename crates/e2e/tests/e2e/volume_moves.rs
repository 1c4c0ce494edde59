//! Moving a volume between two nodes over the mesh, agent to agent: each
//! node in its own network namespace with its own Docker Engine, the
//! control plane in a third with the registry. A copy cut by killing the
//! receiving agent leaves the app running on the source and, once that
//! agent is back, no partial copy; the retry carries every file (same
//! SHA-256, owner and mode), switches the app to the new node with its
//! data and measures the downtime; the old copy stays aside until the
//! move is confirmed.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use cloudweb_e2e::mesh_cluster::{MeshAgent, MeshCluster, Setup};
use cloudweb_e2e::{ensure_images, wait_for, GitServer};
use serde_json::Value;
use sha2::{Digest, Sha256};

/// Serves the volume; every start appends a line to it.
const DOCKERFILE: &str = "FROM cloudweb-test/busybox:latest\nCMD [\"sh\", \"-c\", \"echo started >> /data/starts.txt; exec httpd -f -p 8080 -h /data\"]\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_volume_moves_to_another_node_with_every_file_and_its_app_follows() {
    ensure_images().unwrap();
    let setup = Setup { control_plane_node: true, registry: true, docker: vec![1, 2], ..Setup::default() };
    let mut cluster = MeshCluster::start_with(2, setup).await.unwrap();
    let git = GitServer::start(cluster.tmp.path()).unwrap();
    if let Err(err) = scenario(&mut cluster, &git).await {
        panic!("{err:#}\n{}", cluster.logs());
    }
}

/// Path → (SHA-256 or link target, uid, mode) of every entry under `root`.
fn manifest(root: &Path) -> Result<BTreeMap<String, (String, u32, u32)>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir)? {
            let entry = entry?;
            let path = entry.path();
            let meta = std::fs::symlink_metadata(&path)?;
            let rel = path.strip_prefix(root)?.display().to_string();
            let what = if meta.file_type().is_symlink() {
                format!("-> {}", std::fs::read_link(&path)?.display())
            } else if meta.is_dir() {
                stack.push(path.clone());
                "dir".to_string()
            } else {
                hex::encode(Sha256::digest(std::fs::read(&path)?))
            };
            out.insert(rel, (what, meta.uid(), meta.mode() & 0o7777));
        }
    }
    Ok(out)
}

fn fill(root: &Path) -> Result<()> {
    std::fs::create_dir_all(root.join("deep/er/still"))?;
    for i in 0..200 {
        std::fs::write(root.join(format!("deep/small-{i:03}.txt")), format!("file {i}\n").repeat(i + 1))?;
    }
    std::fs::write(root.join("index.html"), "moved with its data")?;
    // A large file, so the first pass takes a while (the cut lands in it).
    let mut big = Vec::with_capacity(160 << 20);
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    while big.len() < 160 << 20 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        big.extend_from_slice(&x.to_le_bytes());
    }
    std::fs::write(root.join("deep/er/big.bin"), &big)?;
    std::fs::write(root.join("deep/er/still/owned"), "by uid 999")?;
    std::os::unix::fs::chown(root.join("deep/er/still/owned"), Some(999), Some(999))?;
    std::fs::set_permissions(root.join("deep/er/still/owned"), std::os::unix::fs::PermissionsExt::from_mode(0o640))?;
    std::os::unix::fs::symlink("../index.html", root.join("deep/link"))?;
    std::fs::write(root.join("empty"), "")?;
    Ok(())
}

async fn show_move(cluster: &MeshCluster, id: &str) -> Option<Value> {
    let (status, view) = cluster.api("GET", &format!("/api/volume-moves/{id}")).await.ok()?;
    (status == 200).then_some(view)
}

async fn app_serves(cluster: &MeshCluster, from: &MeshAgent, app: &str, on: &MeshAgent) -> Result<String> {
    let (_, list) = cluster.api("GET", &format!("/api/apps/{app}/deployments")).await?;
    let running = list["deployments"].as_array().context("deployments")?.iter().find(|d| d["state"] == "running").context("a running deployment")?.clone();
    let (_, d) = cluster.api("GET", &format!("/api/deployments/{}", running["id"].as_str().context("id")?)).await?;
    let instance = d["instances"]
        .as_array()
        .context("instances")?
        .iter()
        .find(|i| i["state"] == "running")
        .context("a running instance")?
        .clone();
    if instance["node_id"] != on.node_id.as_str() {
        bail!("the app runs on {} rather than {}: {d}", instance["node_id"], on.node_id);
    }
    let address = instance["address"].as_str().context("address")?;
    cluster.lan.members[from.ns].exec("curl", &["-sf", "--max-time", "5", &format!("http://{address}/index.html")])
}

async fn scenario(cluster: &mut MeshCluster, git: &GitServer) -> Result<()> {
    let (source, target) = (1usize, 2usize);
    for i in [source, target] {
        let agent = &cluster.agents[i];
        cluster.dockers.iter().find(|(n, _)| *n == agent.index).context("an engine")?.1.load_from_host("cloudweb-test/busybox:latest")?;
    }
    for agent in &cluster.agents[1..] {
        wait_for(Duration::from_secs(90), &format!("{} to be ready with the mesh and the registry", agent.name), || async {
            let (_, view) = cluster.api("GET", &format!("/api/nodes/{}", agent.node_id)).await.ok()?;
            (view["state"] == "ready" && view["health_report"]["registry"]["reachable"] == true).then_some(())
        })
        .await?;
    }
    for agent in [&cluster.agents[0], &cluster.agents[target]] {
        let (status, body) = cluster.api("POST", &format!("/api/nodes/{}/drain", agent.node_id)).await?;
        assert_eq!(status, 200, "{body}");
    }
    let app = "mover";
    git.commit(app, &[("Dockerfile", DOCKERFILE)], "first")?;
    let body = serde_json::json!({"name": app, "repo_url": git.file_url(app), "port": 8080, "health_timeout_seconds": 60});
    let (status, created) = cluster.api_json("POST", "/api/apps", &body).await?;
    assert_eq!(status, 201, "{created}");
    let (status, attached) = cluster.api_json("POST", &format!("/api/apps/{app}/volumes"), &serde_json::json!({"name": "files", "path": "/data"})).await?;
    assert_eq!(status, 201, "{attached}");
    let (status, deployment) = cluster.api_json("POST", &format!("/api/apps/{app}/deploy"), &serde_json::json!({})).await?;
    assert_eq!(status, 201, "{deployment}");
    let id = deployment["id"].as_str().context("deployment id")?.to_string();
    let settled = wait_for(Duration::from_secs(300), "the first deployment to settle", || async {
        let (_, d) = cluster.api("GET", &format!("/api/deployments/{id}")).await.ok()?;
        matches!(d["state"].as_str(), Some("running" | "failed")).then_some(d)
    })
    .await?;
    assert_eq!(settled["state"], "running", "{settled}");
    // The target may take the app from now on.
    let (status, body) = cluster.api("POST", &format!("/api/nodes/{}/undrain", cluster.agents[target].node_id)).await?;
    assert_eq!(status, 200, "{body}");

    let source_dir = cluster.agents[source].dir.join("volumes/files");
    let target_dir = cluster.agents[target].dir.join("volumes/files");
    fill(&source_dir)?;
    let page = app_serves(cluster, &cluster.agents[0], app, &cluster.agents[source]).await?;
    assert_eq!(page, "moved with its data");

    // Bad requests are refused with a reason, and start nothing.
    for (body, want) in [
        (serde_json::json!({"to": cluster.agents[source].name}), 409),
        (serde_json::json!({"to": "no-such-node"}), 404),
        (serde_json::json!({"to": 7}), 400),
    ] {
        let (status, answer) = cluster.api_json("POST", "/api/volumes/files/move", &body).await?;
        assert_eq!(status, want, "{body}: {answer}");
    }

    // 1. The receiving agent is killed in the middle of the first pass.
    let target_name = cluster.agents[target].name.clone();
    let (status, started) = cluster.api_json("POST", "/api/volumes/files/move", &serde_json::json!({"to": target_name})).await?;
    assert_eq!(status, 202, "{started}");
    let first = started["id"].as_str().context("move id")?.to_string();
    let staging = cluster.agents[target].dir.join("volumes/.incoming").join(&first);
    wait_for(Duration::from_secs(60), "the copy to be under way", || async {
        let bytes = std::fs::metadata(staging.join("deep/er/big.bin")).map(|m| m.len()).unwrap_or(0);
        (bytes > 0).then_some(())
    })
    .await?;
    cluster.agents[target].process.take().context("target agent")?.kill();
    let failed = wait_for(Duration::from_secs(90), "the cut move to fail", || async {
        let view = show_move(cluster, &first).await?;
        (view["state"] == "failed").then_some(view)
    })
    .await?;
    assert!(failed["reason"].as_str().unwrap_or_default().contains("source:"), "{failed}");
    let (_, volume) = cluster.api("GET", "/api/volumes").await?;
    assert_eq!(volume["volumes"][0]["node_id"], cluster.agents[source].node_id.as_str(), "{volume}");
    // The app never stopped: the cut came in the live pass.
    assert_eq!(app_serves(cluster, &cluster.agents[0], app, &cluster.agents[source]).await?, "moved with its data");
    let mut agent = std::mem::replace(&mut cluster.agents[target], placeholder());
    cluster.start_agent(&mut agent)?;
    cluster.agents[target] = agent;
    wait_for(Duration::from_secs(60), "the restarted target to remove the partial copy", || async { (!staging.exists()).then_some(()) }).await?;
    assert!(!target_dir.exists(), "nothing was put in place");

    // 2. The retry.
    wait_for(Duration::from_secs(60), "the target to be ready again, with its mesh", || async {
        let (_, view) = cluster.api("GET", &format!("/api/nodes/{}", cluster.agents[target].node_id)).await.ok()?;
        (view["state"] == "ready" && !view["health_report"]["mesh"].is_null()).then_some(())
    })
    .await?;
    let (status, started) = cluster.api_json("POST", "/api/volumes/files/move", &serde_json::json!({"to": target_name})).await?;
    assert_eq!(status, 202, "{started}");
    let second = started["id"].as_str().context("move id")?.to_string();
    let done = wait_for(Duration::from_secs(300), "the move to finish", || async {
        let view = show_move(cluster, &second).await?;
        matches!(view["state"].as_str(), Some("done" | "failed")).then_some(view)
    })
    .await?;
    assert_eq!(done["state"], "done", "{done}");
    assert!(done["reason"].is_null(), "{done}");
    let downtime = done["downtime_ms"].as_i64().context("downtime measured")?;
    assert!(downtime >= 0, "{done}");
    eprintln!("volume move: {} files, {} bytes, downtime {downtime} ms", done["files"], done["bytes"]);
    // Every file arrived as it was (content, owner, mode, links); the app
    // appended its start line on the new node only.
    let kept = cluster.agents[source].dir.join("volumes/.moved").join(format!("files.{second}"));
    wait_for(Duration::from_secs(60), "the old copy to be set aside", || async { kept.exists().then_some(()) }).await?;
    let mut before = manifest(&kept)?;
    let mut after = manifest(&target_dir)?;
    let starts_before = std::fs::read_to_string(kept.join("starts.txt"))?;
    let starts_after = std::fs::read_to_string(target_dir.join("starts.txt"))?;
    assert_eq!(starts_after, format!("{starts_before}started\n"), "one more start, on the new node");
    before.remove("starts.txt");
    after.remove("starts.txt");
    assert_eq!(before.len(), after.len());
    assert_eq!(before, after, "every file, link and directory is the same");
    assert!(!source_dir.exists(), "the source's copy is no longer the volume");
    let (_, volume) = cluster.api("GET", "/api/volumes").await?;
    assert_eq!(volume["volumes"][0]["node_id"], cluster.agents[target].node_id.as_str(), "{volume}");
    assert_eq!(app_serves(cluster, &cluster.agents[0], app, &cluster.agents[target]).await?, "moved with its data");
    assert_eq!(done["source_copy"], "kept", "{done}");

    // 3. Confirming deletes the old copy; nothing else.
    let (status, confirmed) = cluster.api("POST", &format!("/api/volume-moves/{second}/confirm")).await?;
    assert_eq!(status, 200, "{confirmed}");
    wait_for(Duration::from_secs(60), "the old copy to be deleted", || async {
        let view = show_move(cluster, &second).await?;
        (view["source_copy"] == "purged").then_some(())
    })
    .await?;
    assert!(!kept.exists());
    assert!(target_dir.join("deep/er/big.bin").exists());
    let (status, again) = cluster.api("POST", &format!("/api/volume-moves/{first}/confirm")).await?;
    assert_eq!(status, 409, "a failed move left no copy: {again}");
    Ok(())
}

fn placeholder() -> MeshAgent {
    MeshAgent {
        index: 0,
        ns: 0,
        name: String::new(),
        dir: std::path::PathBuf::new(),
        node_id: String::new(),
        interface: String::new(),
        process: None,
        follow_eth0: false,
        ingress: false,
    }
}
