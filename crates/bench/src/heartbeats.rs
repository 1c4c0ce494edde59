//! `cloudweb-bench heartbeats`: joins N simulated agents to a real control
//! plane (each with its own key and certificate, through the real join
//! endpoint), opens one mTLS connection per agent from its own loopback
//! address (127.0.x.y, `cloudweb_e2e::fleet`), and has every agent send a
//! heartbeat every `interval`, spread evenly. The connection caps are the
//! defaults. Prints the rate achieved, latency percentiles, the server's
//! CPU and memory, and database commits per 1,000 heartbeats, and the
//! verdicts of issue 2's targets.
//!
//! Then (issue 21) the thundering herd: the control plane is killed with
//! SIGKILL and started again on the same data and ports, and the bench
//! measures how long until every agent has a heartbeat taken again, while
//! sampling `GET /api/apps`.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use cloudweb_e2e::fleet::{self, Enrolled, Fleet};
use futures_util::stream::{self, StreamExt};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;

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
    /// Agents without an event stream (heartbeats only, one connection each).
    #[arg(long)]
    no_event_stream: bool,
    /// Skip the kill -9 and restart of the control plane at the end.
    #[arg(long)]
    no_restart: bool,
    /// Changes a second made through the user API (each written to the
    /// audit log before and after it runs) in a second window as long as
    /// the first (issue 28: audit writes do not lower heartbeat
    /// throughput); 0 skips that window.
    #[arg(long, default_value_t = 20)]
    audited_changes: u32,
    /// The control plane binary (default: next to this one).
    #[arg(long)]
    server_bin: Option<std::path::PathBuf>,
    /// Where the control plane keeps its state: SQLite's file, or a
    /// database of a PostgreSQL server the bench starts (Debian's initdb
    /// and postgres on a Unix socket, cloudweb-test-support), whose CPU
    /// is measured too.
    #[arg(long, value_enum, default_value_t = Database::Sqlite)]
    database: Database,
    /// Control-plane replicas on the database (PostgreSQL only): the
    /// agents heartbeat the leader, the followers mirror the nodes from
    /// the database; their CPU and the database's is measured too.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=5))]
    replicas: u32,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Database {
    Sqlite,
    Postgres,
}

impl Database {
    fn name(self) -> &'static str {
        match self {
            Database::Sqlite => "SQLite",
            Database::Postgres => "PostgreSQL",
        }
    }
}

/// Every agent back within this long after the kill, at any fleet size
/// (issue 21: 10,000 within 60 s; a smaller fleet gets the same bound).
const RECONNECT_LIMIT: Duration = Duration::from_secs(60);

const MIB: f64 = 1024.0 * 1024.0;
/// Issue 21 item 1's targets.
const IDLE_RSS_MIB: f64 = 48.0;
const FLEET_RSS_MIB: f64 = 150.0;

pub async fn run(args: Args) -> Result<Vec<Target>> {
    if args.agents == 0 || args.interval == 0 || args.duration == 0 {
        bail!("--agents, --interval and --duration must be positive");
    }
    // Each agent holds two connections (requests, event stream), and the
    // control plane the other ends: with too few descriptors for that, the
    // agents heartbeat only (their reconnects then spread over the interval
    // instead of coming at once).
    let limit = raise_open_file_limit(args.agents)?;
    let event_stream = !args.no_event_stream && limit >= 2 * args.agents + 512;
    if !event_stream && !args.no_event_stream {
        println!("heartbeats: the open file limit ({limit}) is too low for an event stream per agent; they heartbeat only");
    }
    let binary = sibling_binary("cloudweb-server", args.server_bin.clone())?;
    let dir = tempfile::tempdir()?;
    let postgres = match args.database {
        Database::Sqlite => None,
        Database::Postgres => {
            let postgres = tokio::task::spawn_blocking(cloudweb_test_support::postgres::TestPostgres::start).await?;
            postgres.create_database("cloudweb");
            Some(postgres)
        }
    };
    let url = postgres.as_ref().map(|p| p.url("cloudweb"));
    let extra: Vec<&str> = url.as_deref().map(|u| vec!["--database-url", u]).unwrap_or_default();
    if args.replicas > 1 && args.database != Database::Postgres {
        bail!("--replicas above 1 needs --database postgres (SQLite has one control plane)");
    }
    let mut server = Server::start(&binary, dir.path(), &extra).await?;
    // The followers, started once the first leads, each with the first's
    // master key (and admin token, for the bench's calls).
    let follower_dirs: Vec<tempfile::TempDir> = (1..args.replicas).map(|_| tempfile::tempdir()).collect::<Result<_, _>>()?;
    let mut followers = Vec::new();
    for follower_dir in &follower_dirs {
        std::fs::create_dir_all(follower_dir.path().join("server"))?;
        for file in ["master.key", "admin-token"] {
            std::fs::copy(dir.path().join("server").join(file), follower_dir.path().join("server").join(file)).with_context(|| format!("copying {file}"))?;
        }
        followers.push(Server::start(&binary, follower_dir.path(), &extra).await?);
    }
    println!("heartbeats: the state in {}, {} control-plane replica{}", args.database.name(), args.replicas, if args.replicas == 1 { "" } else { "s" });
    // Idle: started, nothing joined yet (a second for the start's own work).
    tokio::time::sleep(Duration::from_secs(1)).await;
    let idle_rss = procstat::sample(server.pid()).context("server /proc")?.rss_bytes;
    println!("idle control plane RSS: {}", mib(idle_rss));
    println!("heartbeats: {} agents, one heartbeat each every {} s, measured for {} s", args.agents, args.interval, args.duration);

    let enroll_start = Instant::now();
    let agents = fleet::enroll(&server.control(), args.agents, args.join_concurrency).await?;
    println!("enrolled {} agents through /agent/v1/join in {:.1} s", agents.len(), enroll_start.elapsed().as_secs_f64());

    let interval = Duration::from_secs(args.interval);
    let connect_start = Instant::now();
    // The first connections, 32 handshakes at a time (a fleet is enrolled
    // over time); each from its own address, under the default caps.
    let fleet = tokio::time::timeout(Duration::from_secs(120), Fleet::start(&server.control(), agents, interval, 32, event_stream))
        .await
        .context("the agents did not connect within 120 s")??;
    let stats = fleet.stats.clone();
    println!(
        "all {} agents connected ({} mTLS connections{}) in {:.1} s",
        fleet.len(),
        stats.connects.load(Ordering::Relaxed),
        if event_stream { ", event streams open" } else { "" },
        connect_start.elapsed().as_secs_f64()
    );
    // One full round so every agent has a heartbeat on record.
    tokio::time::sleep(interval + Duration::from_secs(1)).await;

    let commits_before = server.metric("cloudweb_store_commits_total").await?;
    let beats_before = server.metric("cloudweb_heartbeats_total").await?;
    let cpu_before = procstat::sample(server.pid()).context("server /proc")?;
    let database_cpu_before = postgres.as_ref().map(|p| procstat::tree_cpu_seconds(p.pid()));
    let followers_cpu_before: Vec<f64> = followers.iter().map(|f| procstat::tree_cpu_seconds(f.pid())).collect();
    let mut follower_commits_before = 0.0;
    for follower in &followers {
        follower_commits_before += follower.metric("cloudweb_store_commits_total").await?;
    }
    let sent_before = stats.sent.load(Ordering::Relaxed);
    let failed_before = stats.failed.load(Ordering::Relaxed);
    let start = Instant::now();
    stats.recording.store(true, Ordering::Relaxed);
    let steady_api = ApiSampler::start(&server);
    tokio::time::sleep(Duration::from_secs(args.duration)).await;
    stats.recording.store(false, Ordering::Relaxed);
    let steady_api = summarize(steady_api.stop().await.latencies);
    let elapsed = start.elapsed().as_secs_f64();
    let cpu_after = procstat::sample(server.pid()).context("server /proc")?;
    let database_cpu = postgres.as_ref().zip(database_cpu_before).map(|(p, before)| 100.0 * (procstat::tree_cpu_seconds(p.pid()) - before) / elapsed);
    let followers_cpu: Vec<f64> = followers.iter().zip(&followers_cpu_before).map(|(f, before)| 100.0 * (procstat::tree_cpu_seconds(f.pid()) - before) / elapsed).collect();
    let mut follower_commits = -follower_commits_before;
    for follower in &followers {
        follower_commits += follower.metric("cloudweb_store_commits_total").await?;
    }
    let commits = server.metric("cloudweb_store_commits_total").await? - commits_before + follower_commits;
    let beats = server.metric("cloudweb_heartbeats_total").await? - beats_before;
    let sent = stats.sent.load(Ordering::Relaxed) - sent_before;
    let failed = stats.failed.load(Ordering::Relaxed) - failed_before;
    let summary = summarize(std::mem::take(&mut *stats.latencies.lock().expect("latency lock")));

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
    println!("GET /api/apps meanwhile (for comparison with the restart): p50 {}  p99 {}  max {}", ms(steady_api.p50), ms(steady_api.p99), ms(steady_api.max));
    let per_thousand = if beats > 0.0 { 1000.0 * commits / beats } else { f64::NAN };
    println!("{} commits: {commits:.0} during the window = {per_thousand:.2} per 1,000 heartbeats", args.database.name());
    if let Some(cpu) = database_cpu {
        println!("PostgreSQL CPU (its server and every backend): {cpu:.1}% of one core");
    }
    for (n, cpu) in followers_cpu.iter().enumerate() {
        println!("follower {}: CPU {cpu:.1}% of one core (lease tries, mirroring {} nodes from the database)", n + 1, args.agents);
    }
    if !followers.is_empty() {
        println!("commits of all replicas together: {commits:.0} ({follower_commits:.0} by the followers)");
    }
    // Issue 2: 10,000 agents at a 5 s interval (2,000 heartbeats/s) with p99
    // under 50 ms and at most 10 commits per 1,000 heartbeats. The rate is
    // judged against what this run offers (agents / interval); 5 % below it
    // allows for the window's edges (issue 2's run: 2,009/s of 2,000). No
    // issue set one for failed heartbeats; none is chosen (issue 2's runs
    // had none, and a refused heartbeat makes a live node look late).
    let offered = args.agents as f64 / args.interval as f64;
    let mut targets = vec![
        Target::new(format!("heartbeats accepted/s with {} agents every {} s", args.agents, args.interval), Cmp::AtLeast, 0.95 * offered, "/s", Some(beats / elapsed)),
        Target::new("failed heartbeats", Cmp::AtMost, 0.0, "", Some(failed as f64)),
        Target::below("heartbeat latency p99", 50.0, "ms", (summary.count > 0).then_some(summary.p99.as_secs_f64() * 1000.0)),
        Target::new(format!("{} commits per 1,000 heartbeats", args.database.name()), Cmp::AtMost, 10.0, "", Some(per_thousand)),
        // Issue 21 item 1: idle under 48 MiB, 150 MiB with 10,000 agents;
        // in between, the idle figure plus the same share per agent.
        Target::new("idle control plane RSS", Cmp::AtMost, IDLE_RSS_MIB, "MiB", Some(idle_rss as f64 / MIB)),
        Target::new(
            format!("control plane RSS with {} agents", args.agents),
            Cmp::AtMost,
            IDLE_RSS_MIB + (FLEET_RSS_MIB - IDLE_RSS_MIB) * args.agents as f64 / 10_000.0,
            "MiB",
            Some(cpu_after.rss_bytes as f64 / MIB),
        ),
    ];
    if args.audited_changes > 0 {
        // The same window again, with changes going through the user API
        // beside it: each writes two audit entries to the same database.
        let sent_before = stats.sent.load(Ordering::Relaxed);
        let failed_before = stats.failed.load(Ordering::Relaxed);
        let beats_before = server.metric("cloudweb_heartbeats_total").await?;
        stats.latencies.lock().expect("latency lock").clear();
        let start = Instant::now();
        stats.recording.store(true, Ordering::Relaxed);
        let changes = ChangeLoad::start(&server, args.audited_changes);
        tokio::time::sleep(Duration::from_secs(args.duration)).await;
        stats.recording.store(false, Ordering::Relaxed);
        let (made, refused) = changes.stop().await;
        let elapsed = start.elapsed().as_secs_f64();
        let beats = server.metric("cloudweb_heartbeats_total").await? - beats_before;
        let failed = stats.failed.load(Ordering::Relaxed) - failed_before;
        let sent = stats.sent.load(Ordering::Relaxed) - sent_before;
        let audited = summarize(std::mem::take(&mut *stats.latencies.lock().expect("latency lock")));
        println!(
            "with {made} audited changes beside ({:.1}/s, {refused} failed): heartbeats accepted {beats:.0} ({:.0}/s); sent {sent}, failed {failed}; latency p50 {}  p99 {}",
            made as f64 / elapsed,
            beats / elapsed,
            ms(audited.p50),
            ms(audited.p99)
        );
        targets.push(Target::new(
            format!("heartbeats accepted/s with {} audited changes/s beside", args.audited_changes),
            Cmp::AtLeast,
            0.95 * offered,
            "/s",
            (refused == 0).then_some(beats / elapsed),
        ));
        targets.push(Target::below("heartbeat latency p99 with audited changes beside", 50.0, "ms", (audited.count > 0).then_some(audited.p99.as_secs_f64() * 1000.0)));
    }
    if let Some(busiest) = followers_cpu.iter().copied().reduce(f64::max) {
        // No issue set a figure; a follower costing a tenth of a core
        // with a fleet this size would be a defect of the mirror.
        targets.push(Target::new(format!("busiest follower's CPU with {} agents", args.agents), Cmp::AtMost, 10.0, "% of a core", Some(busiest)));
    }
    // A kill of the leader with followers running is `failover`'s; the
    // herd is one control plane's.
    if !args.no_restart && followers.is_empty() {
        targets.extend(herd(&mut server, &fleet, event_stream).await?);
    }
    Ok(targets)
}

/// Kills the control plane, starts it again, and measures until every
/// agent of `fleet` has a heartbeat taken by the new process.
async fn herd(server: &mut Server, fleet: &Fleet, event_stream: bool) -> Result<Vec<Target>> {
    let stats = fleet.stats.clone();
    let (connects_before, failed_before, streams_before) =
        (stats.connects.load(Ordering::Relaxed), stats.failed.load(Ordering::Relaxed), stats.stream_failures.load(Ordering::Relaxed));
    let killed = Instant::now();
    server.kill_and_restart().await?;
    let restarted = killed.elapsed();
    println!("restart: killed the control plane with SIGKILL; the new one answered /healthz {:.1} s later", restarted.as_secs_f64());
    let sampler = ApiSampler::start(server);
    let outcome = fleet.all_back_since(killed, RECONNECT_LIMIT + Duration::from_secs(30)).await;
    let api = sampler.stop().await;
    let back = stats.back_since(killed);
    let reconnected = stats.connects.load(Ordering::Relaxed) - connects_before;
    let failed = stats.failed.load(Ordering::Relaxed) - failed_before;
    let stream_failures = stats.stream_failures.load(Ordering::Relaxed) - streams_before;
    match outcome {
        Ok(took) => println!(
            "restart: all {} agents {} again {:.1} s after the kill ({:.1} s after /healthz); {reconnected} new connections, {failed} failed heartbeats and {stream_failures} failed stream opens meanwhile",
            fleet.len(),
            if event_stream { "streaming and heartbeating" } else { "heartbeating" },
            took.as_secs_f64(),
            (took.saturating_sub(restarted)).as_secs_f64()
        ),
        Err(done) => println!("restart: only {done} of {} agents heartbeating again {} s after the kill", fleet.len(), RECONNECT_LIMIT.as_secs() + 30),
    }
    let summary = summarize(api.latencies);
    println!(
        "restart: GET /api/apps meanwhile ({} answers, {} errors): p50 {}  p99 {}  max {}",
        summary.count,
        api.errors,
        ms(summary.p50),
        ms(summary.p99),
        ms(summary.max)
    );
    let n = fleet.len();
    Ok(vec![
        Target::below(format!("seconds from kill -9 to all {n} agents heartbeating again"), RECONNECT_LIMIT.as_secs_f64(), "s", outcome.ok().map(|d| d.as_secs_f64()))
            .with_note(format!("{back} of {n} back{}", if event_stream { "" } else { "; heartbeats only, no event streams" })),
        Target::new("agents that gave up reconnecting", Cmp::AtMost, 0.0, "", Some(fleet.gave_up() as f64)),
        Target::below("GET /api/apps p99 while the fleet reconnects", 100.0, "ms", (summary.count > 0 && api.errors == 0).then_some(summary.p99.as_secs_f64() * 1000.0))
            .with_note(format!("{} errors", api.errors)),
    ])
}

/// `GET /api/apps` in a loop, one at a time, every 50 ms, on a thread and
/// runtime of its own: the simulated agents' own TLS work must not count
/// as the control plane's latency.
struct ApiSampler {
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<ApiSamples>,
}

struct ApiSamples {
    latencies: Vec<u32>,
    errors: u64,
}

impl ApiSampler {
    fn start(server: &Server) -> ApiSampler {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (url, token, done) = (format!("{}/api/apps", server.api_url), server.admin_token.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("sampler runtime");
            runtime.block_on(async move {
                let http = reqwest::Client::builder().timeout(Duration::from_secs(10)).build().expect("http client");
                let mut samples = ApiSamples { latencies: Vec::new(), errors: 0 };
                while !done.load(Ordering::Relaxed) {
                    let started = Instant::now();
                    let ok = match http.get(&url).bearer_auth(&token).send().await {
                        Ok(response) => response.status().is_success() && response.bytes().await.is_ok(),
                        Err(_) => false,
                    };
                    if ok {
                        samples.latencies.push(started.elapsed().as_micros().min(u128::from(u32::MAX)) as u32);
                    } else {
                        samples.errors += 1;
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                samples
            })
        });
        ApiSampler { stop, thread }
    }

    async fn stop(self) -> ApiSamples {
        self.stop.store(true, Ordering::Relaxed);
        let thread = self.thread;
        tokio::task::spawn_blocking(move || thread.join())
            .await
            .ok()
            .and_then(Result::ok)
            .unwrap_or(ApiSamples { latencies: Vec::new(), errors: 1 })
    }
}

/// Changes through the user API at a steady rate (a team made, then
/// deleted: each change is audited before and after it runs), on a thread
/// and runtime of its own like [`ApiSampler`].
struct ChangeLoad {
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<(u64, u64)>,
}

impl ChangeLoad {
    fn start(server: &Server, per_second: u32) -> ChangeLoad {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (base, token, done) = (server.api_url.clone(), server.admin_token.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("change runtime");
            runtime.block_on(async move {
                let http = reqwest::Client::builder().timeout(Duration::from_secs(10)).build().expect("http client");
                let mut ticks = tokio::time::interval(Duration::from_secs_f64(1.0 / f64::from(per_second.max(1))));
                let (mut made, mut refused) = (0u64, 0u64);
                // The teams' owner (the admin token is no user).
                let user = serde_json::json!({ "name": "audit-load", "password": "audit load's long password" });
                if !http.post(format!("{base}/api/users")).bearer_auth(&token).json(&user).send().await.is_ok_and(|r| r.status().is_success()) {
                    return (0, 1);
                }
                let mut n = 0u64;
                while !done.load(Ordering::Relaxed) {
                    ticks.tick().await;
                    let name = format!("audit-load-{}", n / 2);
                    let request = if n.is_multiple_of(2) {
                        http.post(format!("{base}/api/teams")).json(&serde_json::json!({ "name": name, "owner": "audit-load" }))
                    } else {
                        http.delete(format!("{base}/api/teams/{name}"))
                    };
                    n += 1;
                    match request.bearer_auth(&token).send().await {
                        Ok(response) if response.status().is_success() => made += 1,
                        _ => refused += 1,
                    }
                }
                (made, refused)
            })
        });
        ChangeLoad { stop, thread }
    }

    async fn stop(self) -> (u64, u64) {
        self.stop.store(true, Ordering::Relaxed);
        let thread = self.thread;
        tokio::task::spawn_blocking(move || thread.join()).await.ok().and_then(Result::ok).unwrap_or((0, 1))
    }
}

/// One socket per agent, and a few for the rest: lift the soft limit.
fn raise_open_file_limit(agents: usize) -> Result<usize> {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit and setrlimit only read and write `limit`.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
            bail!("getrlimit: {}", std::io::Error::last_os_error());
        }
        limit.rlim_cur = limit.rlim_max;
        if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
            bail!("setrlimit: {}", std::io::Error::last_os_error());
        }
    }
    if (limit.rlim_cur as usize) < agents + 512 {
        bail!("the open file limit ({}) is too low for {agents} agents", limit.rlim_cur);
    }
    Ok(limit.rlim_cur as usize)
}

/// Joins `count` agents (see [`fleet::enroll`]).
pub(crate) async fn enroll(server: &Server, count: usize, concurrency: usize) -> Result<Vec<Enrolled>> {
    fleet::enroll(&server.control(), count, concurrency).await
}

/// Sends one heartbeat with a usage sample for each of `agents`, `concurrency`
/// at a time, each on its own mTLS connection from its own address, so every
/// node has a full row (state, capacity, health, usage) on the control plane.
pub(crate) async fn one_heartbeat_each(server: &Server, agents: &[Enrolled], concurrency: usize) -> Result<()> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(CertificateDer::from_pem_slice(server.ca_pem.as_bytes())?)?;
    let roots = Arc::new(roots);
    let port = server.agent_port;
    let results: Vec<Result<()>> = stream::iter(agents.iter().enumerate())
        .map(|(index, agent)| {
            let roots = roots.clone();
            async move {
                let tls = fleet::tls(&roots, agent)?;
                let mut sender = fleet::connect(&tls, fleet::source_address(index), port).await?;
                fleet::heartbeat(&mut sender, fleet::heartbeat_body(6)).await
            }
        })
        .buffer_unordered(concurrency)
        .collect()
        .await;
    results.into_iter().collect()
}
