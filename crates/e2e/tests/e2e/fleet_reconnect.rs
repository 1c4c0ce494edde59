//! Issue 21: a thousand simulated agents (`cloudweb_e2e::fleet`: real
//! joins, one mTLS connection for requests and one for the event stream
//! each, every agent from its own 127.0.x.y address) heartbeat against the
//! real debug control plane under its default connection caps; it is
//! killed with SIGKILL and started again on the same data and ports, and
//! every agent must be streaming and heartbeating again, none giving up,
//! while `GET /api/apps` keeps answering. This is the herd the agents'
//! 1 s stream retry makes, through the per-address and total caps on
//! unauthenticated connections (1,024) and the join-free reconnect.
//!
//! `cloudweb-bench heartbeats` measures the same at 10,000 agents against
//! a 60 s target and a 100 ms p99; the bounds here are generous for a
//! loaded 2-core CI machine and a debug build.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cloudweb_e2e::fleet::{self, Fleet};
use cloudweb_e2e::ServerProcess;

const AGENTS: usize = 1000;
const INTERVAL: Duration = Duration::from_secs(5);
/// The bench's 60 s for 10,000 agents, made generous for CI.
const BACK_WITHIN: Duration = Duration::from_secs(90);
/// The user API must keep answering while the fleet reconnects: every
/// `GET /api/apps` succeeds, and one that has no answer within this is a
/// failure. How fast it answers is a figure printed here, not judged: the
/// latency target is `cloudweb-bench heartbeats`' "GET /api/apps p99 while
/// the fleet reconnects" (100 ms, release build). On a shared 2-core runner
/// the debug build's slowest answer measures the neighbours: 0.9 s beside a
/// release build, 2.1 s beside two, 6.1 s in a CI run with a core-wide hash
/// job and three other tests (load average 9).
const ANSWER_WITHIN: Duration = Duration::from_secs(20);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_agents_are_back_soon_after_the_control_plane_is_killed_and_restarted() {
    // Two sockets per agent here, as many on the server.
    cloudweb_e2e::flood::raise_open_file_limit(2 * AGENTS as u64 + 500);
    let tmp = tempfile::tempdir().unwrap();
    let mut server = ServerProcess::start(tmp.path()).await.unwrap();
    let control = fleet::ControlPlane {
        agent_port: server.agent_port,
        api_url: server.api(""),
        admin_token: server.admin_token.clone(),
        ca_pem: server.ca_pem(),
    };
    let started = Instant::now();
    let agents = fleet::enroll(&control, AGENTS, 32).await.unwrap();
    let enrolled = started.elapsed();
    // Setting up is not what is judged: the wait for every agent's first
    // heartbeat counts from the fleet's start, not from before the
    // enrolment (a CI run spent over 30 s enrolling on a loaded machine).
    let starting = Instant::now();
    let fleet = Fleet::start(&control, agents, INTERVAL, 32, true).await.unwrap();
    let connected = started.elapsed();
    fleet.all_back_since(starting, Duration::from_secs(90)).await.map_err(|n| format!("only {n} agents heartbeating before the kill")).unwrap();
    eprintln!("{AGENTS} agents enrolled in {enrolled:?}, connected at {connected:?}, heartbeating at {:?}", started.elapsed());

    let killed = Instant::now();
    server.restart().await.unwrap();
    let restarted = killed.elapsed();

    // The user API, sampled one request at a time while the herd comes in.
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (http, url, token, stop) = (server.http.clone(), server.api("/api/apps"), server.admin_token.clone(), stop.clone());
        tokio::spawn(async move {
            let (mut took, mut errors) = (Vec::new(), Vec::new());
            while !stop.load(Ordering::Relaxed) {
                let started = Instant::now();
                match http.get(&url).bearer_auth(&token).timeout(ANSWER_WITHIN).send().await {
                    Ok(response) if response.status().is_success() => took.push(started.elapsed()),
                    Ok(response) => errors.push(format!("answered {}", response.status())),
                    Err(err) => errors.push(format!("{err:#}")),
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            (took, errors)
        })
    };
    let back = fleet.all_back_since(killed, BACK_WITHIN).await;
    stop.store(true, Ordering::Relaxed);
    let (mut took, errors) = sampler.await.unwrap();
    took.sort();
    let (answers, slowest, median) = (took.len(), took.last().copied().unwrap_or_default(), took.get(took.len() / 2).copied().unwrap_or_default());
    let stats = &fleet.stats;
    eprintln!(
        "restart answered /healthz after {restarted:?}; back: {back:?}; {} heartbeats failed, {} stream opens failed; GET /api/apps: {answers} answers, median {median:?}, slowest {slowest:?}",
        stats.failed.load(Ordering::Relaxed),
        stats.stream_failures.load(Ordering::Relaxed)
    );
    let took = back.unwrap_or_else(|n| panic!("only {n} of {AGENTS} agents streaming and heartbeating again {BACK_WITHIN:?} after the kill"));
    assert!(took < BACK_WITHIN);
    assert_eq!(fleet.gave_up(), 0, "agents stopped");
    assert!(errors.is_empty(), "GET /api/apps failed (or had no answer within {ANSWER_WITHIN:?}) while the fleet reconnected: {errors:?}");
    assert!(answers > 0, "GET /api/apps never answered");
}
