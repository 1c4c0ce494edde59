//! `cloudweb-bench logs` (issue 26): the runtime-log store on SQLite.
//!
//! 1. Ingest: a real control plane on loopback, N simulated agents
//!    heartbeating over mTLS (`cloudweb_e2e::fleet`), and an app whose
//!    instances the scheduler placed on some of them; those agents upload
//!    log batches (1,000 lines each, as the real agent sends them) as fast
//!    as they are answered, through `POST /agent/v1/logs`, which answers
//!    once the lines are written. Measured: lines per second stored, the
//!    upload and heartbeat latencies, and that the store holds every line
//!    the uploads were told it took.
//! 2. Query: the control plane stopped, its log store filled to M lines
//!    (100 apps over 7 days, through the store's own insert), started
//!    again; then `GET /api/apps/{app}/logs?since=1h&grep=ERROR|panic` (a
//!    regular expression over the last hour of one app) and the same with
//!    words (`q=timeout`), timed through the user API.
//!
//! Targets: ingest at least 10,000 lines/s with 1,000 agents heartbeating
//! (a 2-core control plane), and the grep under 200 ms p99.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use bytes::Bytes;
use cloudweb_e2e::fleet::{self, Enrolled, Fleet};
use cloudweb_server::store::{LogSource, LogStore, NewLogLine, Store};
use http_body_util::BodyExt;
use rand::{Rng, SeedableRng};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use serde_json::{json, Value};

use crate::git_daemon::GitDaemon;
use crate::server::{sibling_binary, Server};
use crate::stats::{ms, summarize};
use crate::target::{Cmp, Target};

#[derive(clap::Args)]
pub struct Args {
    /// Simulated agents heartbeating during the ingest.
    #[arg(long, default_value_t = 1_000)]
    agents: usize,
    /// Apps logging, each with its instance on a node the scheduler picks,
    /// whose simulated agent uploads its lines.
    #[arg(long, default_value_t = 10)]
    uploaders: u32,
    /// Seconds of uploading measured.
    #[arg(long, default_value_t = 30)]
    duration: u64,
    /// Lines in the store for the query part.
    #[arg(long, default_value_t = 10_000_000)]
    stored_lines: u64,
    /// Timed queries of each kind.
    #[arg(long, default_value_t = 200)]
    queries: usize,
    /// The control plane binary (default: next to this one).
    #[arg(long)]
    server_bin: Option<std::path::PathBuf>,
}

/// Apps the stored lines belong to.
const APPS: usize = 100;
/// The time the stored lines span.
const SPAN_NS: i64 = 7 * 24 * 3600 * 1_000_000_000;

pub async fn run(args: Args) -> Result<Vec<Target>> {
    if args.agents == 0 || args.uploaders == 0 || u64::from(args.uploaders) > args.agents as u64 || args.queries == 0 {
        bail!("--agents, --uploaders (at most the agents) and --queries must be at least 1");
    }
    let binary = sibling_binary("cloudweb-server", args.server_bin.clone())?;
    let dir = tempfile::tempdir()?;
    let git = GitDaemon::start(&dir.path().join("git"))?;
    git.commit("logger", &[("Dockerfile", "FROM scratch\n")], "app")?;
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data)?;
    let mut server = Server::start(&binary, &data, &["--allow-file-repos", "--placement-wait-seconds", "600"]).await?;
    let mut targets = ingest(&args, &server, &git).await?;
    // The query part's apps exist before the control plane stops.
    for i in 0..APPS {
        let (status, body) = server.call(reqwest::Method::POST, "/api/apps", Some(&json!({"name": format!("q{i}"), "repo_url": git.url("logger"), "port": 8080}))).await?;
        if status != 201 {
            bail!("creating app q{i} answered {status}: {body}");
        }
    }
    server.kill();
    targets.extend(query(&args, &mut server, &data.join("server")).await?);
    Ok(targets)
}

async fn ingest(args: &Args, server: &Server, git: &GitDaemon) -> Result<Vec<Target>> {
    let started = Instant::now();
    let agents = fleet::enroll(&server.control(), args.agents, 32).await?;
    println!("enrolled {} agents in {:.1} s", agents.len(), started.elapsed().as_secs_f64());
    let identities: std::collections::HashMap<String, (usize, String, String)> =
        agents.iter().enumerate().map(|(i, a)| (a.name.clone(), (i, a.cert_pem.clone(), a.key_pem.clone()))).collect();
    let fleet = Fleet::start(&server.control(), agents, Duration::from_secs(5), 32, false).await?;
    let stats = fleet.stats.clone();
    // Every node is ready before the app is placed.
    tokio::time::sleep(Duration::from_secs(6)).await;
    // One app per uploading node: a deploy places its first instance (the
    // build's) at once, on the node the scheduler picks.
    let mut placed = Vec::new();
    for k in 0..args.uploaders {
        let app = format!("logger{k}");
        let (status, body) = server.call(reqwest::Method::POST, "/api/apps", Some(&json!({"name": app, "repo_url": git.url("logger"), "port": 8080}))).await?;
        if status != 201 {
            bail!("creating {app} answered {status}: {body}");
        }
        let (status, deployment) = server.call(reqwest::Method::POST, &format!("/api/apps/{app}/deploy"), None).await?;
        if status != 201 {
            bail!("deploying {app} answered {status}: {deployment}");
        }
        let id = deployment["id"].as_str().context("deployment id")?.to_string();
        let (instance, node) = wait_placed(server, &id).await?;
        placed.push((app, id, instance, node));
    }
    let (_, nodes) = server.call(reqwest::Method::GET, "/api/nodes", None).await?;
    let name_of = |node: &str| nodes["nodes"].as_array().and_then(|all| all.iter().find(|n| n["id"] == node)).and_then(|n| n["name"].as_str().map(str::to_string));
    let mut roots = rustls::RootCertStore::empty();
    roots.add(CertificateDer::from_pem_slice(server.control().ca_pem.as_bytes())?)?;
    let roots = Arc::new(roots);
    let stored = Arc::new(AtomicU64::new(0));
    let latencies = Arc::new(std::sync::Mutex::new(Vec::<u32>::new()));
    let deadline = Instant::now() + Duration::from_secs(args.duration);
    stats.recording.store(true, Ordering::Relaxed);
    let mut tasks = Vec::new();
    for (app, id, instance, node) in placed.clone() {
        let name = name_of(&node).context("a placed node that is not listed")?;
        let (index, cert_pem, key_pem) = identities.get(&name).cloned().context("a placed node that is not a simulated agent")?;
        let tls = fleet::tls(&roots, &Enrolled { cert_pem, key_pem, name })?;
        let (port, stored, latencies) = (server.control().agent_port, stored.clone(), latencies.clone());
        tasks.push(tokio::spawn(async move {
            let mut sender = fleet::connect(&tls, fleet::source_address(index), port).await?;
            let mut batch = 0u64;
            while Instant::now() < deadline {
                let body = upload_body(&app, &id, instance, batch);
                batch += 1;
                sender.ready().await?;
                let sent = Instant::now();
                let response = sender.send_request(fleet::request("/agent/v1/logs", Some(body))?).await?;
                let status = response.status();
                let answer = response.into_body().collect().await?.to_bytes();
                latencies.lock().expect("latency lock").push(u32::try_from(sent.elapsed().as_micros()).unwrap_or(u32::MAX));
                if !status.is_success() {
                    bail!("an upload answered {status}: {}", String::from_utf8_lossy(&answer));
                }
                let answer: Value = serde_json::from_slice(&answer)?;
                if let Some(refused) = answer["refused"].as_array().and_then(|r| r.first()) {
                    bail!("an upload was refused: {refused}");
                }
                stored.fetch_add(answer["accepted"].as_u64().unwrap_or(0), Ordering::Relaxed);
            }
            Ok::<_, anyhow::Error>(())
        }));
    }
    let measured = Instant::now();
    for task in tasks {
        task.await??;
    }
    let seconds = measured.elapsed().as_secs_f64();
    stats.recording.store(false, Ordering::Relaxed);
    let lines = stored.load(Ordering::Relaxed);
    let rate = lines as f64 / seconds;
    let uploads = summarize(std::mem::take(&mut *latencies.lock().expect("latency lock")));
    let beats = summarize(std::mem::take(&mut *stats.latencies.lock().expect("latency lock")));
    let mut held = 0;
    for (app, _, _, _) in &placed {
        let (_, answer) = server.call(reqwest::Method::GET, &format!("/api/apps/{app}/logs?limit=1"), None).await?;
        held += answer["stored"]["lines"].as_u64().unwrap_or(0);
    }
    println!(
        "ingest: {lines} lines in {seconds:.1} s = {rate:.0} lines/s from {} uploading nodes; upload p50 {} p99 {}; heartbeats of {} agents p50 {} p99 {}; the store holds {held}",
        args.uploaders,
        ms(uploads.p50),
        ms(uploads.p99),
        fleet.len(),
        ms(beats.p50),
        ms(beats.p99)
    );
    drop(fleet);
    Ok(vec![
        Target::new(format!("log ingest with {} agents heartbeating", args.agents), Cmp::AtLeast, 10_000.0, "lines/s", Some(rate)),
        Target::new("lines stored of those the uploads were told were taken", Cmp::AtLeast, 100.0, "%", Some(if lines == 0 { 0.0 } else { held as f64 * 100.0 / lines as f64 })),
        Target::below("heartbeat latency p99 during the ingest", 200.0, "ms", Some(beats.p99.as_secs_f64() * 1000.0)),
    ])
}

/// The deployment's first placed instance as (instance, node id).
async fn wait_placed(server: &Server, id: &str) -> Result<(u32, String)> {
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        let (_, deployment) = server.call(reqwest::Method::GET, &format!("/api/deployments/{id}"), None).await?;
        let placed = deployment["instances"]
            .as_array()
            .and_then(|all| all.iter().find_map(|i| Some((u32::try_from(i["instance"].as_u64()?).ok()?, i["node_id"].as_str()?.to_string()))));
        if let Some(placed) = placed {
            return Ok(placed);
        }
        if Instant::now() > until {
            bail!("no instance placed after 60 s: {deployment}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// 1,000 lines of one instance, about 90 bytes each.
fn upload_body(app: &str, deployment: &str, instance: u32, batch: u64) -> Bytes {
    let base = 1_700_000_000_000_000_000i64 + i64::try_from(batch).unwrap_or(0) * 1_000_000_000;
    let lines: Vec<Value> = (0..1000)
        .map(|i| {
            let ts = cloudweb_server::log_archive::format_ts_ns(base + i * 1000);
            let text = if i % 50 == 0 { format!("ERROR batch {batch} line {i}: upstream timeout after 30s") } else { format!("GET /api/items/{i} 200 in {}ms (batch {batch})", i % 97) };
            json!({"ts": ts, "stream": if i % 50 == 0 { "stderr" } else { "stdout" }, "line": text})
        })
        .collect();
    let body = json!({"containers": [{"deployment_id": deployment, "instance": instance, "container": format!("cw-{app}-{instance}"), "lines": lines}]});
    Bytes::from(body.to_string())
}

async fn query(args: &Args, server: &mut Server, data: &std::path::Path) -> Result<Vec<Target>> {
    // Fill the stopped control plane's log store (its own insert path).
    let state = Store::open(data, "bench").await?;
    let logs = LogStore::beside(&state, data, "bench").await?;
    let now_ns = i64::try_from(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_nanos())?;
    let started = Instant::now();
    let mut rng = rand::rngs::StdRng::seed_from_u64(26);
    let batch_size = 5_000u64;
    let mut written = 0u64;
    while written < args.stored_lines {
        let count = batch_size.min(args.stored_lines - written);
        let batch: Vec<NewLogLine> = (0..count)
            .map(|k| {
                let n = written + k;
                let app = usize::try_from(n % APPS as u64).unwrap_or(0);
                // Spread evenly over the span, oldest first.
                let ts_ns = now_ns - SPAN_NS + i64::try_from(n).unwrap_or(0) * (SPAN_NS / i64::try_from(args.stored_lines).unwrap_or(1).max(1));
                let line = match rng.random_range(0..100) {
                    0 => format!("ERROR request {n} failed: database timeout"),
                    1 => format!("thread 'worker-{}' panicked at src/main.rs:{}", n % 8, n % 500),
                    _ => format!("GET /api/items/{} 200 in {}ms user={}", n % 10_000, n % 97, n % 1_000),
                };
                NewLogLine {
                    source: LogSource { app: format!("q{app}"), container: format!("cw-q{app}-1"), deployment_id: "dep_bench".into(), node_id: "node-bench".into(), instance: 1 },
                    ts_ns,
                    seq: i64::try_from(n + 1).unwrap_or(i64::MAX),
                    stream: "stdout".into(),
                    line,
                }
            })
            .collect();
        logs.insert(&batch).await?;
        written += count;
        if written % 1_000_000 == 0 {
            println!("filled {written} lines ({:.0} lines/s)", written as f64 / started.elapsed().as_secs_f64());
        }
    }
    let fill = started.elapsed().as_secs_f64();
    let bytes = logs.disk_bytes().await?;
    println!("filled the store with {written} lines in {fill:.1} s ({:.0} lines/s through one writer); {:.0} MiB on disk", written as f64 / fill, bytes as f64 / 1048576.0);
    drop(logs);
    state.close().await;
    server.start_again().await?;
    let mut targets = Vec::new();
    for (what, query, limit) in [
        ("a grep over the last hour of one app", "since=1h&grep=ERROR%7Cpanic&limit=100", Some(200.0)),
        ("a word search over the last hour of one app", "since=1h&q=timeout&limit=100", None),
        ("a grep over the last day of one app", "since=24h&grep=ERROR%7Cpanic&limit=100", None),
    ] {
        let mut micros = Vec::with_capacity(args.queries);
        let mut found = 0usize;
        for i in 0..args.queries {
            let app = (i * 37) % APPS;
            let sent = Instant::now();
            let (status, body) = server.call(reqwest::Method::GET, &format!("/api/apps/q{app}/logs?{query}"), None).await?;
            micros.push(u32::try_from(sent.elapsed().as_micros()).unwrap_or(u32::MAX));
            if status != 200 {
                bail!("{query} answered {status}: {body}");
            }
            found += body["lines"].as_array().map_or(0, Vec::len);
        }
        let summary = summarize(micros);
        println!("{what}: p50 {} p90 {} p99 {} ({} lines found per query on average)", ms(summary.p50), ms(summary.p90), ms(summary.p99), found / args.queries);
        if let Some(limit) = limit {
            targets.push(Target::below(format!("{what} over {written} stored lines, p99"), limit, "ms", Some(summary.p99.as_secs_f64() * 1000.0)));
        }
    }
    Ok(targets)
}
