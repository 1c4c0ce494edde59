//! `cloudweb-bench heartbeats`: joins N simulated agents to a real control
//! plane (each with its own key and certificate, through the real join
//! endpoint), opens one mTLS connection per agent, and has every agent send
//! a heartbeat every `interval`, spread evenly. Prints the rate achieved,
//! latency percentiles, the server's CPU and memory, and database commits
//! per 1,000 heartbeats, and the verdicts of issue 2's targets.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use bytes::Bytes;
use cloudweb_protocol::version::{HEADER_AGENT_VERSION, HEADER_PROTOCOL};
use futures_util::stream::{self, StreamExt};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use serde_json::json;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use crate::procstat::{self, mib};
use crate::server::{sibling_binary, Server};
use crate::stats::{ms, summarize};
use crate::target::{Cmp, Target};

#[derive(clap::Args)]
pub struct Args {
    /// Number of simulated agents.
    #[arg(long, default_value_t = 10_000)]
    agents: usize,
    /// Seconds between two heartbeats of one agent.
    #[arg(long, default_value_t = 5)]
    interval: u64,
    /// Seconds measured, after every agent is connected and has sent one heartbeat.
    #[arg(long, default_value_t = 30)]
    duration: u64,
    /// Concurrent joins while enrolling the agents.
    #[arg(long, default_value_t = 32)]
    join_concurrency: usize,
    /// The control plane binary (default: next to this one).
    #[arg(long)]
    server_bin: Option<std::path::PathBuf>,
}

pub(crate) struct Enrolled {
    cert_pem: String,
    key_pem: String,
}

#[derive(Default)]
struct Counters {
    sent: AtomicU64,
    failed: AtomicU64,
}

pub async fn run(args: Args) -> Result<Vec<Target>> {
    if args.agents == 0 || args.interval == 0 || args.duration == 0 {
        bail!("--agents, --interval and --duration must be positive");
    }
    let binary = sibling_binary("cloudweb-server", args.server_bin.clone())?;
    let dir = tempfile::tempdir()?;
    // Every simulated agent connects from 127.0.0.1, where real ones come
    // from an address each: the per-address cap on connections still in
    // their handshake (128) is raised to the total cap (1,024), which stays.
    let server = Arc::new(Server::start(&binary, dir.path(), &["--max-unauthenticated-per-address", "1024"]).await?);
    println!("heartbeats: {} agents, one heartbeat each every {} s, measured for {} s", args.agents, args.interval, args.duration);

    let enroll_start = Instant::now();
    let agents = enroll(&server, args.agents, args.join_concurrency).await?;
    println!("enrolled {} agents through /agent/v1/join in {:.1} s", agents.len(), enroll_start.elapsed().as_secs_f64());

    let mut roots = rustls::RootCertStore::empty();
    roots.add(CertificateDer::from_pem_slice(server.ca_pem.as_bytes())?)?;
    let roots = Arc::new(roots);
    let port: u16 = server.agent_url.rsplit(':').next().context("port")?.parse()?;

    let counters = Arc::new(Counters::default());
    let latencies = Arc::new(Mutex::new(Vec::<u32>::with_capacity(args.agents * 16)));
    let recording = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let interval = Duration::from_secs(args.interval);
    let connected = Arc::new(AtomicU64::new(0));
    // The server counts a connection as unauthenticated until its handshake
    // is done and sheds the oldest past its caps (issue 10): at most 32
    // handshakes at once keeps the bench well under them.
    let handshakes = Arc::new(tokio::sync::Semaphore::new(32));
    let epoch = Instant::now() + Duration::from_secs(2);
    let mut tasks = Vec::with_capacity(agents.len());
    for (index, agent) in agents.into_iter().enumerate() {
        let offset = interval.mul_f64(index as f64 / args.agents as f64);
        let ctx = AgentTask {
            roots: roots.clone(),
            port,
            counters: counters.clone(),
            latencies: latencies.clone(),
            recording: recording.clone(),
            connected: connected.clone(),
            handshakes: handshakes.clone(),
            interval,
            first: epoch + offset,
        };
        tasks.push(tokio::spawn(async move { ctx.run(agent).await }));
        if index % 256 == 255 {
            // Spread the handshakes a little so the accept queue keeps up.
            tokio::task::yield_now().await;
        }
    }
    let connect_start = Instant::now();
    while (connected.load(Ordering::Relaxed) as usize) < tasks.len() {
        if connect_start.elapsed() > Duration::from_secs(120) {
            bail!("only {} of {} agents connected in 120 s", connected.load(Ordering::Relaxed), tasks.len());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!("all {} mTLS connections up in {:.1} s", tasks.len(), connect_start.elapsed().as_secs_f64());
    // One full round so every agent has a heartbeat on record.
    tokio::time::sleep_until((epoch + interval).into()).await;

    let commits_before = server.metric("cloudweb_store_commits_total").await?;
    let beats_before = server.metric("cloudweb_heartbeats_total").await?;
    let cpu_before = procstat::sample(server.pid()).context("server /proc")?;
    let sent_before = counters.sent.load(Ordering::Relaxed);
    let failed_before = counters.failed.load(Ordering::Relaxed);
    let start = Instant::now();
    recording.store(true, Ordering::Relaxed);
    tokio::time::sleep(Duration::from_secs(args.duration)).await;
    recording.store(false, Ordering::Relaxed);
    let elapsed = start.elapsed().as_secs_f64();
    let cpu_after = procstat::sample(server.pid()).context("server /proc")?;
    let commits = server.metric("cloudweb_store_commits_total").await? - commits_before;
    let beats = server.metric("cloudweb_heartbeats_total").await? - beats_before;
    let sent = counters.sent.load(Ordering::Relaxed) - sent_before;
    let failed = counters.failed.load(Ordering::Relaxed) - failed_before;
    for task in &tasks {
        task.abort();
    }
    let summary = summarize(std::mem::take(&mut *latencies.lock().expect("latency lock")));

    println!("heartbeats accepted by the server: {:.0} ({:.0}/s); sent {sent}, failed {failed}", beats, beats / elapsed);
    println!(
        "latency (request sent to answer read, {} samples): p50 {}  p90 {}  p99 {}  max {}",
        summary.count,
        ms(summary.p50),
        ms(summary.p90),
        ms(summary.p99),
        ms(summary.max)
    );
    println!(
        "server CPU: {:.1}% of one core; RSS {} (peak {})",
        100.0 * (cpu_after.cpu_seconds - cpu_before.cpu_seconds) / elapsed,
        mib(cpu_after.rss_bytes),
        mib(cpu_after.peak_rss_bytes)
    );
    let per_thousand = if beats > 0.0 { 1000.0 * commits / beats } else { f64::NAN };
    println!("SQLite commits: {commits:.0} during the window = {per_thousand:.2} per 1,000 heartbeats");
    // Issue 2: 10,000 agents at a 5 s interval (2,000 heartbeats/s) with p99
    // under 50 ms and at most 10 commits per 1,000 heartbeats. The rate is
    // judged against what this run offers (agents / interval); 5 % below it
    // allows for the window's edges (issue 2's run: 2,009/s of 2,000). No
    // issue set one for failed heartbeats; none is chosen (issue 2's runs
    // had none, and a refused heartbeat makes a live node look late).
    let offered = args.agents as f64 / args.interval as f64;
    Ok(vec![
        Target::new(format!("heartbeats accepted/s with {} agents every {} s", args.agents, args.interval), Cmp::AtLeast, 0.95 * offered, "/s", Some(beats / elapsed)),
        Target::new("failed heartbeats", Cmp::AtMost, 0.0, "", Some(failed as f64)),
        Target::below("heartbeat latency p99", 50.0, "ms", (summary.count > 0).then_some(summary.p99.as_secs_f64() * 1000.0)),
        Target::new("SQLite commits per 1,000 heartbeats", Cmp::AtMost, 10.0, "", Some(per_thousand)),
    ])
}

/// Creates a join token and joins, `count` times, with real keys and CSRs.
pub(crate) async fn enroll(server: &Server, count: usize, concurrency: usize) -> Result<Vec<Enrolled>> {
    let anonymous = {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = rustls::RootCertStore::empty();
        roots.add(CertificateDer::from_pem_slice(server.ca_pem.as_bytes())?)?;
        let mut config = rustls::ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])?
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        reqwest::Client::builder().use_preconfigured_tls(config).timeout(Duration::from_secs(60)).build()?
    };
    let results: Vec<Result<Enrolled>> = stream::iter(0..count)
        .map(|index| {
            let anonymous = anonymous.clone();
            async move {
                let token = server.join_token().await?;
                let key = rcgen::KeyPair::generate()?;
                let csr = rcgen::CertificateParams::default().serialize_request(&key)?.pem()?;
                let body = json!({"token": token, "csr": csr, "hostname": format!("sim-{index}"), "name": format!("sim-{index}")});
                let response = anonymous
                    .post(format!("{}/agent/v1/join", server.agent_url))
                    .header(HEADER_PROTOCOL, "1")
                    .header(HEADER_AGENT_VERSION, "0.1.0")
                    .json(&body)
                    .send()
                    .await?;
                if !response.status().is_success() {
                    bail!("join {index} answered {}: {}", response.status(), response.text().await.unwrap_or_default());
                }
                let joined: serde_json::Value = response.json().await?;
                Ok(Enrolled { cert_pem: joined["certificate"].as_str().context("certificate")?.to_string(), key_pem: key.serialize_pem() })
            }
        })
        .buffer_unordered(concurrency)
        .collect()
        .await;
    results.into_iter().collect()
}

/// Sends one heartbeat with a usage sample for each of `agents`, `concurrency`
/// at a time, each on its own mTLS connection, so every node has a full row
/// (state, capacity, health, usage) on the control plane.
pub(crate) async fn one_heartbeat_each(server: &Server, agents: &[Enrolled], concurrency: usize) -> Result<()> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(CertificateDer::from_pem_slice(server.ca_pem.as_bytes())?)?;
    let roots = Arc::new(roots);
    let port: u16 = server.agent_url.rsplit(':').next().context("port")?.parse()?;
    let results: Vec<Result<()>> = stream::iter(agents)
        .map(|agent| {
            let roots = roots.clone();
            async move {
                let mut sender = connect(&roots, port, agent).await?;
                let request = hyper::Request::post("/agent/v1/heartbeat")
                    .header("host", "127.0.0.1")
                    .header("content-type", "application/json")
                    .header(HEADER_PROTOCOL, "1")
                    .header(HEADER_AGENT_VERSION, "0.1.0")
                    .body(Full::new(heartbeat_body(6)))?;
                sender.ready().await?;
                let response = sender.send_request(request).await?;
                if !response.status().is_success() {
                    bail!("heartbeat answered {}", response.status());
                }
                Ok(())
            }
        })
        .buffer_unordered(concurrency)
        .collect()
        .await;
    results.into_iter().collect()
}

/// An HTTP/1.1 connection to the agent listener with the agent's certificate.
pub(crate) async fn connect(roots: &Arc<rustls::RootCertStore>, port: u16, agent: &Enrolled) -> Result<hyper::client::conn::http1::SendRequest<Full<Bytes>>> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_root_certificates(roots.clone())
        .with_client_auth_cert(
            vec![CertificateDer::from_pem_slice(agent.cert_pem.as_bytes())?],
            PrivateKeyDer::from_pem_slice(agent.key_pem.as_bytes())?,
        )?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let connector = TlsConnector::from(Arc::new(config));
    let tcp = TcpStream::connect(("127.0.0.1", port)).await?;
    tcp.set_nodelay(true)?;
    let tls = connector.connect(ServerName::try_from("127.0.0.1")?.to_owned(), tcp).await?;
    let (sender, connection) = hyper::client::conn::http1::handshake::<_, Full<Bytes>>(TokioIo::new(tls)).await?;
    tokio::spawn(connection);
    Ok(sender)
}

struct AgentTask {
    roots: Arc<rustls::RootCertStore>,
    port: u16,
    counters: Arc<Counters>,
    latencies: Arc<Mutex<Vec<u32>>>,
    recording: Arc<std::sync::atomic::AtomicBool>,
    connected: Arc<AtomicU64>,
    handshakes: Arc<tokio::sync::Semaphore>,
    interval: Duration,
    first: Instant,
}

impl AgentTask {
    async fn run(self, agent: Enrolled) {
        if let Err(err) = self.run_inner(agent).await {
            eprintln!("agent stopped: {err:#}");
        }
    }

    async fn run_inner(&self, agent: Enrolled) -> Result<()> {
        let permit = self.handshakes.acquire().await?;
        let mut sender = connect(&self.roots, self.port, &agent).await?;
        drop(permit);
        self.connected.fetch_add(1, Ordering::Relaxed);

        let mut next = self.first;
        let mut round: u64 = 0;
        loop {
            tokio::time::sleep_until(next.into()).await;
            next += self.interval;
            round += 1;
            let body = heartbeat_body(round);
            let request = hyper::Request::post("/agent/v1/heartbeat")
                .header("host", "127.0.0.1")
                .header("content-type", "application/json")
                .header(HEADER_PROTOCOL, "1")
                .header(HEADER_AGENT_VERSION, "0.1.0")
                .body(Full::new(body))?;
            let started = Instant::now();
            sender.ready().await?;
            let outcome = match sender.send_request(request).await {
                Ok(response) => {
                    let ok = response.status().is_success();
                    response.into_body().collect().await.map(|_| ok).unwrap_or(false)
                }
                Err(_) => false,
            };
            let took = started.elapsed();
            self.counters.sent.fetch_add(1, Ordering::Relaxed);
            if !outcome {
                self.counters.failed.fetch_add(1, Ordering::Relaxed);
            }
            if self.recording.load(Ordering::Relaxed) {
                let micros = took.as_micros().min(u128::from(u32::MAX)) as u32;
                self.latencies.lock().expect("latency lock").push(micros);
            }
        }
    }
}

/// A heartbeat as a current agent sends it: capacity and health every
/// time, a usage sample with five containers every sixth time (every 30 s
/// at a 5 s interval).
pub(crate) fn heartbeat_body(round: u64) -> Bytes {
    let mut body = json!({
        "cpu_cores": 8, "mem_bytes": 34359738368u64, "disk_bytes": 536870912000u64,
        "health": {"registry": {"configured": true, "reachable": true}, "mesh": {"peers": 3, "connected": 3},
                   "features": ["static-sites"]}
    });
    if round.is_multiple_of(6) {
        let containers: Vec<_> = (0..5)
            .map(|i| json!({"container": format!("cw-app{i}-1"), "cpu_cores": 0.25, "mem_bytes": 104857600, "mem_limit": 536870912, "restarts": 0, "started_at": "2026-11-29T10:00:00Z"}))
            .collect();
        body["metrics"] = json!({"node": {"cpu_pct": 12.5, "mem_used": 8589934592u64, "disk_used": 128849018880u64}, "containers": containers, "omitted": 0});
    }
    Bytes::from(body.to_string())
}
