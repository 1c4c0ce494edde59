//! `cloudweb-bench services`: the time from `POST /api/services` to the
//! service accepting connections, for PostgreSQL and Redis, against a bare
//! `docker run` of the same image with the same environment and the same
//! readiness probe (run with `docker exec` every 20 ms on both sides).
//! Everything is real: the release `cloudweb-server`, one `cloudweb-agent`
//! joined to it, and the machine's Docker Engine; the images are the local
//! ones `scripts/service-images.sh` builds (the official ones cannot be
//! pulled here), given to the control plane with `--service-image`.
//!
//! Target (issue 22): the control plane's overhead, the median of
//! cloud-web's time less the median of `docker run`'s, under 300 ms.

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use rand::Rng;
use reqwest::Method;
use serde_json::json;

use crate::deploy::cluster::{BinaryArgs, Cluster, ExtraFlags};
use crate::docker;
use crate::target::Target;

#[derive(clap::Args)]
pub struct Args {
    /// Repetitions of each measurement (1 to 50).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=50))]
    pub runs: u32,
    #[arg(long, default_value = "cloudweb-test/postgres:15")]
    pub postgres_image: String,
    #[arg(long, default_value = "cloudweb-test/redis:7")]
    pub redis_image: String,
    #[command(flatten)]
    pub binaries: BinaryArgs,
}

/// What is measured for one kind.
struct Kind {
    kind: &'static str,
    image: String,
    /// The baseline's `docker run` arguments after the image (its
    /// environment comes before).
    env: Vec<(&'static str, &'static str)>,
    command: Vec<&'static str>,
    probe: Vec<&'static str>,
}

const LIMIT: Duration = Duration::from_secs(120);

/// Probes `container` with `probe` every 20 ms until it exits 0 (a
/// container that does not exist yet counts as not ready).
fn wait_ready(container: &str, probe: &[&str], started: Instant) -> Result<Duration> {
    loop {
        let mut args = vec!["exec", container];
        args.extend_from_slice(probe);
        if docker::docker(&args).is_ok() {
            return Ok(started.elapsed());
        }
        if started.elapsed() > LIMIT {
            bail!("{container} was not ready after {} s", LIMIT.as_secs());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

async fn through_cloudweb(cluster: &Cluster, kind: &Kind) -> Result<Duration> {
    let name = format!("bench-{:06x}", rand::rng().random_range(0..0x100_0000u32));
    let started = Instant::now();
    let (status, body) = cluster.server.call(Method::POST, "/api/services", Some(&json!({"name": name, "type": kind.kind}))).await?;
    if status != 201 {
        bail!("POST /api/services answered {status}: {body}");
    }
    let container = format!("cw-svc.{name}");
    let probe: Vec<&str> = match kind.kind {
        // The service's own probe, as the agent runs it (Redis's needs the
        // password the container holds in REDISCLI_AUTH).
        "redis" => vec!["redis-cli", "-h", "127.0.0.1", "ping"],
        _ => kind.probe.clone(),
    };
    let ready = tokio::task::block_in_place(|| wait_ready(&container, &probe, started));
    let (status, body) = cluster.server.call(Method::DELETE, &format!("/api/services/{name}?data=delete"), None).await?;
    if status != 204 {
        bail!("DELETE /api/services/{name} answered {status}: {body}");
    }
    // The next run starts with the node idle.
    let gone = Instant::now();
    while docker::docker(&["inspect", &container]).is_ok() && gone.elapsed() < Duration::from_secs(30) {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    ready
}

fn through_docker_run(kind: &Kind, dir: &std::path::Path) -> Result<Duration> {
    let name = format!("cloudweb-bench-svc-{:06x}", rand::rng().random_range(0..0x100_0000u32));
    let data = dir.join(&name);
    std::fs::create_dir_all(&data)?;
    let mount = format!("type=bind,source={},target={}", data.display(), if kind.kind == "postgres" { "/var/lib/postgresql/data" } else { "/data" });
    let mut args: Vec<String> = vec!["run".into(), "-d".into(), "--name".into(), name.clone(), "--mount".into(), mount, "-p".into(), format!("127.0.0.1::{}", if kind.kind == "postgres" { 5432 } else { 6379 })];
    for (key, value) in &kind.env {
        args.push("-e".into());
        args.push(format!("{key}={value}"));
    }
    args.push(kind.image.clone());
    args.extend(kind.command.iter().map(|s| s.to_string()));
    let started = Instant::now();
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();
    docker::docker(&argv).context("docker run")?;
    let ready = wait_ready(&name, &kind.probe, started);
    let _ = docker::docker(&["rm", "-f", &name]);
    let _ = std::fs::remove_dir_all(&data);
    ready
}

fn median(values: &mut [Duration]) -> Duration {
    values.sort();
    values[values.len() / 2]
}

pub async fn run(args: Args) -> Result<Vec<Target>> {
    let binaries = args.binaries.resolve()?;
    for image in [&args.postgres_image, &args.redis_image] {
        crate::deploy::check_image_reference(image)?;
        if !docker::image_exists(image) {
            bail!("image {image} is missing; build it with scripts/service-images.sh");
        }
    }
    let dir = tempfile::Builder::new().prefix("cloudweb-bench-services-").tempdir()?;
    let postgres = format!("postgres={}", args.postgres_image);
    let redis = format!("redis={}", args.redis_image);
    let server_flags = ["--service-image", postgres.as_str(), "--service-image", redis.as_str()];
    let extra = ExtraFlags { server: &server_flags, ..Default::default() };
    let cluster = Cluster::start_with(dir.path(), &binaries, "bench-services", &extra).await?;
    // The node's features come with its heartbeats' health.
    let waited = Instant::now();
    loop {
        let (_, node) = cluster.server.call(Method::GET, &format!("/api/nodes/{}", cluster.node_id), None).await?;
        if node["features"].as_array().is_some_and(|f| f.iter().any(|f| f == "services")) {
            break;
        }
        if waited.elapsed() > Duration::from_secs(30) {
            bail!("the node did not report the services feature within 30 s: {node}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!("services: {} run(s) of each; control plane {}, agent {}", args.runs, binaries.server.display(), binaries.agent.display());
    let kinds = [
        Kind {
            kind: "postgres",
            image: args.postgres_image.clone(),
            env: vec![("POSTGRES_PASSWORD", "bench"), ("POSTGRES_USER", "app"), ("POSTGRES_DB", "app"), ("PGDATA", "/var/lib/postgresql/data")],
            command: vec![],
            probe: vec!["pg_isready", "-h", "127.0.0.1", "-p", "5432", "-U", "app", "-d", "app"],
        },
        Kind {
            kind: "redis",
            image: args.redis_image.clone(),
            env: vec![("REDISCLI_AUTH", "bench")],
            command: vec!["redis-server", "--requirepass", "bench", "--appendonly", "yes", "--dir", "/data", "--bind", "0.0.0.0", "--protected-mode", "no"],
            probe: vec!["redis-cli", "-h", "127.0.0.1", "ping"],
        },
    ];
    let mut targets = Vec::new();
    for kind in &kinds {
        let (mut ours, mut theirs) = (Vec::new(), Vec::new());
        for run in 0..args.runs {
            // Interleaved, so a slower moment of the machine hits both.
            let a = through_cloudweb(&cluster, kind).await?;
            let b = tokio::task::block_in_place(|| through_docker_run(kind, dir.path()))?;
            println!("{} run {}: cloud-web {:.0} ms, docker run {:.0} ms", kind.kind, run + 1, a.as_secs_f64() * 1e3, b.as_secs_f64() * 1e3);
            ours.push(a);
            theirs.push(b);
        }
        let (ours, theirs) = (median(&mut ours), median(&mut theirs));
        let overhead = ours.as_secs_f64() * 1e3 - theirs.as_secs_f64() * 1e3;
        println!("{}: create -> accepting connections, median: cloud-web {:.0} ms, docker run {:.0} ms, overhead {overhead:.0} ms", kind.kind, ours.as_secs_f64() * 1e3, theirs.as_secs_f64() * 1e3);
        targets.push(Target::below(format!("{} service create -> accepting connections, overhead over docker run (median)", kind.kind), 300.0, "ms", Some(overhead)));
    }
    Ok(targets)
}
