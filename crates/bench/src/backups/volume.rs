//! The volume figure: an unchanged volume's incremental backup.

use std::io::Read;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use reqwest::Method;
use serde_json::json;

use super::{expect, median, phases, sync, tree_size, until_done, volume_dir, Bench, Sizes, APP};

const VOLUME: &str = "bench-files";
/// Serves the volume; every start appends a line to it. It ends on
/// SIGTERM (an httpd as PID 1 would ignore it).
const DOCKERFILE: &str = "FROM cloudweb-test/busybox:latest\n\
CMD [\"sh\", \"-c\", \"echo started >> /data/starts.txt; trap 'exit 0' TERM; httpd -f -p 8080 -h /data & wait\"]\n";
/// The size of each random file.
const FILE: u64 = 1 << 20;

pub struct Figures {
    /// Seconds, POST to succeeded.
    pub first: f64,
    pub incremental: f64,
}

/// `mib` files of 1 MiB from /dev/urandom, in 16 directories.
fn fill(root: &Path, mib: u64) -> Result<()> {
    let mut random = std::fs::File::open("/dev/urandom").context("opening /dev/urandom")?;
    for i in 0..mib {
        let dir = root.join("files").join(format!("d{:02}", i % 16));
        std::fs::create_dir_all(&dir)?;
        let path = dir.join(format!("f{i:05}.bin"));
        let mut file = std::fs::File::create(&path).with_context(|| format!("creating {}", path.display()))?;
        let copied = std::io::copy(&mut (&mut random).take(FILE), &mut file)?;
        if copied != FILE {
            bail!("/dev/urandom gave {copied} bytes, not {FILE}");
        }
    }
    Ok(())
}

async fn backup(bench: &Bench) -> Result<(serde_json::Value, Duration)> {
    let server = &bench.cluster.server;
    sync();
    let posted = Instant::now();
    let job = expect(server.call(Method::POST, &format!("/api/volumes/{VOLUME}/backups"), None).await?, 202, "POST /api/volumes/{name}/backups")?;
    let id = job["id"].as_str().context("the job's id")?.to_string();
    until_done(server, &id, posted).await
}

pub async fn bench(bench: &mut Bench, sizes: &Sizes) -> Result<Figures> {
    let deployed = Instant::now();
    bench.cluster.git().commit("files", &[("Dockerfile", DOCKERFILE)], "serves its volume")?;
    bench.cluster.create_app("files", 60).await?;
    let server = &bench.cluster.server;
    expect(server.call(Method::POST, &format!("/api/apps/{APP}/volumes"), Some(&json!({"name": VOLUME, "path": "/data"}))).await?, 201, "attaching the volume")?;
    let deployment = expect(server.call(Method::POST, &format!("/api/apps/{APP}/deploy"), None).await?, 201, "deploy")?;
    let id = deployment["id"].as_str().context("the deployment's id")?.to_string();
    loop {
        let (_, d) = server.call(Method::GET, &format!("/api/deployments/{id}"), None).await?;
        match d["state"].as_str() {
            Some("running") => break,
            Some("failed") => bail!("the app with the volume did not run: {d}"),
            _ if deployed.elapsed() > Duration::from_secs(300) => bail!("the app with the volume did not run within 300 s: {d}"),
            _ => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    let dir = volume_dir(bench, VOLUME);
    if !dir.is_dir() {
        bail!("the node has no directory for the volume at {}", dir.display());
    }
    println!("app {APP} with volume {VOLUME} running after {:.1} s", deployed.elapsed().as_secs_f64());
    let filled = Instant::now();
    tokio::task::block_in_place(|| fill(&dir, sizes.volume_mib))?;
    let (files, bytes) = tree_size(&dir)?;
    println!("volume {VOLUME}: {files} files, {bytes} bytes of random data, written in {:.1} s", filled.elapsed().as_secs_f64());

    let (job, took) = backup(bench).await?;
    let first = took.as_secs_f64();
    println!(
        "first volume backup: {first:.2} s POST -> succeeded ({}), {} files, {} bytes, {} added",
        phases(&job),
        job["files"],
        job["bytes"],
        job["added_bytes"]
    );
    let mut times = Vec::new();
    for run in 1..=sizes.runs {
        let (job, took) = backup(bench).await?;
        println!(
            "incremental volume backup run {run} (unchanged): {:.2} s POST -> succeeded ({}), {} added",
            took.as_secs_f64(),
            phases(&job),
            job["added_bytes"]
        );
        times.push(took.as_secs_f64());
    }
    Ok(Figures { first, incremental: median(&times) })
}
