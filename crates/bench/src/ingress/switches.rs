//! Part 2: requests that fail while the probe app switches between two
//! deployments. The probe runs blue, then green; each switch is a rollback
//! to the other one (a new deployment of its image: a new container, the
//! route's upstream replaced, the old container stopped after the drain
//! period once the ingress serves the new table). Meanwhile two clients
//! with their own connections send a steady loop of HTTPS requests through
//! Caddy, one over HTTP/2 and one over HTTP/1.1 keep-alive, counted apart.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use reqwest::Method;
use serde_json::json;

use super::client::{error_kind, Failures, Protocol};
use super::edge::{Edge, BLUE, GREEN};
use super::route_change::{format_ms, quantile};

pub struct Settings {
    pub switches: u32,
    pub workers: u32,
    pub pause: Duration,
}

pub struct SwitchResult {
    pub switches: u32,
    pub seconds: f64,
    /// Rollback request to the node quiet again (new instance running, old
    /// one stopped, table applied), per switch.
    pub switch_ms: Vec<f64>,
    /// Route tables Caddy loaded during the switches (each a reload).
    pub caddy_loads: usize,
    pub loads: Vec<LoadResult>,
}

pub struct LoadResult {
    pub protocol: Protocol,
    pub sent: u64,
    pub failures: Failures,
    /// How often a worker saw the page change from blue to green or back.
    pub flips: u64,
}

/// One protocol's request loops.
struct Load {
    protocol: Protocol,
    sent: Arc<AtomicU64>,
    flips: Arc<AtomicU64>,
    failures: Arc<Mutex<Failures>>,
    workers: Vec<tokio::task::JoinHandle<()>>,
}

/// Runs the switches; `blue` is the probe's first deployment (busybox, the
/// blue page). Green is deployed first, so whatever runs before is replaced.
pub async fn measure(edge: &mut Edge, settings: &Settings, blue: &str) -> Result<SwitchResult> {
    // The Dockerfile again: part 3 may have left cloudweb-static's in the repository.
    let dockerfile = edge.dockerfile.clone();
    let commit = edge.cluster.git().commit("probe", &[("Dockerfile", &dockerfile), ("index.html", GREEN)], "green")?;
    let green = edge.deploy(&commit).await?["id"].as_str().context("the green deployment has no id")?.to_string();
    println!("  blue {blue} and green {green} deployed; {} switches, rollbacks alternating between them", settings.switches);

    let stop = Arc::new(AtomicBool::new(false));
    let mut loads = Vec::new();
    for protocol in [Protocol::Http2, Protocol::Http1] {
        loads.push(start_load(edge, protocol, settings, stop.clone()).await?);
    }
    let loads_before = edge.applied().iter().filter(|a| a.reloaded).count();
    let started = Instant::now();
    let outcome = switch_all(edge, settings, blue, &green).await;
    let seconds = started.elapsed().as_secs_f64();
    let caddy_loads = edge.applied().iter().filter(|a| a.reloaded).count().saturating_sub(loads_before);
    stop.store(true, Ordering::Relaxed);
    let mut results = Vec::new();
    for load in loads {
        for worker in load.workers {
            worker.await.context("a request loop panicked")?;
        }
        let failures = load.failures.lock().expect("failures lock").clone();
        results.push(LoadResult { protocol: load.protocol, sent: load.sent.load(Ordering::Relaxed), failures, flips: load.flips.load(Ordering::Relaxed) });
    }
    let switch_ms = outcome?;
    Ok(SwitchResult { switches: settings.switches, seconds, switch_ms, caddy_loads, loads: results })
}

async fn switch_all(edge: &mut Edge, settings: &Settings, blue: &str, green: &str) -> Result<Vec<f64>> {
    let path = format!("/api/apps/{}/rollback", edge.probe());
    let mut switch_ms = Vec::with_capacity(settings.switches as usize);
    for number in 1..=settings.switches {
        let target = if number % 2 == 1 { blue } else { green };
        let start = Instant::now();
        let (status, answer) = edge.cluster.server.call(Method::POST, &path, Some(&json!({ "deployment_id": target }))).await?;
        if status != 201 {
            bail!("switch {number}: POST {path} answered {status}: {answer}");
        }
        let id = answer["id"].as_str().context("the rollback answer has no id")?.to_string();
        edge.settle(&id).await.with_context(|| format!("switch {number} (deployment {id})"))?;
        switch_ms.push(start.elapsed().as_secs_f64() * 1000.0);
        if number % 10 == 0 || number == settings.switches {
            println!(
                "    {number}/{} switches; each took p50 {} (rollback to running, old instance stopped, table applied)",
                settings.switches,
                format_ms(quantile(&switch_ms, 0.5))
            );
        }
    }
    Ok(switch_ms)
}

async fn start_load(edge: &Edge, protocol: Protocol, settings: &Settings, stop: Arc<AtomicBool>) -> Result<Load> {
    let client = edge.client(protocol, Duration::from_secs(10))?;
    let url = edge.https_url(&edge.probe_host, "/");
    // The client must really speak the protocol it is counted under.
    let first = client.get(&url).send().await.with_context(|| format!("GET {url} over {}", protocol.name()))?;
    if first.version() != protocol.version() {
        bail!("{url} answered over {:?}, not {}", first.version(), protocol.name());
    }
    let load = Load {
        protocol,
        sent: Arc::new(AtomicU64::new(0)),
        flips: Arc::new(AtomicU64::new(0)),
        failures: Arc::new(Mutex::new(Failures::default())),
        workers: Vec::new(),
    };
    let mut workers = Vec::new();
    for _ in 0..settings.workers {
        let (client, url, stop, pause) = (client.clone(), url.clone(), stop.clone(), settings.pause);
        let (sent, flips, failures) = (load.sent.clone(), load.flips.clone(), load.failures.clone());
        workers.push(tokio::spawn(async move {
            let mut last_page: Option<String> = None;
            while !stop.load(Ordering::Relaxed) {
                sent.fetch_add(1, Ordering::Relaxed);
                let failure = match client.get(&url).send().await {
                    Ok(response) if response.status() == 200 => match response.text().await {
                        Ok(page) if page == BLUE || page == GREEN => {
                            if last_page.as_ref().is_some_and(|last| *last != page) {
                                flips.fetch_add(1, Ordering::Relaxed);
                            }
                            last_page = Some(page);
                            None
                        }
                        Ok(page) => Some(format!("unexpected page {:?}", page.chars().take(40).collect::<String>())),
                        Err(err) => Some(error_kind(&err)),
                    },
                    Ok(response) => Some(format!("status {}", response.status().as_u16())),
                    Err(err) => Some(error_kind(&err)),
                };
                if let Some(kind) = failure {
                    failures.lock().expect("failures lock").add(kind);
                }
                if !pause.is_zero() {
                    tokio::time::sleep(pause).await;
                }
            }
        }));
    }
    Ok(Load { workers, ..load })
}
