//! Part 3: what Caddy adds. The same page fetched straight from the
//! container (plain HTTP to the instance address the control plane
//! records) and through Caddy (HTTPS to the app's host, connections kept
//! alive, over HTTP/1.1 and over HTTP/2): sequential requests for latency,
//! then a fixed-duration concurrent load for throughput. It runs against
//! two upstreams: busybox httpd, which closes every connection (so both
//! the direct client and Caddy open one per request), and cloudweb-static,
//! which keeps connections alive (so both reuse theirs, as with most app
//! servers).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use super::client::{self, error_kind, Failures, Protocol};
use super::edge::{Edge, BLUE};
use crate::stats::{summarize, Summary};

pub struct Settings {
    pub requests: u32,
    pub workers: u32,
    pub duration: Duration,
}

/// Requests sent before measuring, so connections and caches are warm.
const WARM_UP: u32 = 50;

/// The server in the probe's container.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Upstream {
    /// busybox httpd: `Connection: close` on every response.
    Closing,
    /// cloudweb-static: HTTP/1.1 keep-alive.
    KeepAlive,
}

impl Upstream {
    pub fn name(self) -> &'static str {
        match self {
            Upstream::Closing => "busybox httpd, closes every connection",
            Upstream::KeepAlive => "cloudweb-static, keeps connections alive",
        }
    }
}

/// How a way reaches the container.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// Plain HTTP/1.1 to the published port, connections kept alive when
    /// the upstream allows it.
    Direct,
    /// HTTPS through Caddy.
    Caddy(Protocol),
}

pub struct Way {
    pub upstream: Upstream,
    pub route: Route,
    pub name: String,
    pub latency: Summary,
    pub requests_per_second: f64,
    pub failures: Failures,
    /// CPU time per successful request during the concurrent load.
    pub cpu: Cpu,
}

/// CPU microseconds per request of the processes a way's requests cost,
/// beyond the container (and Docker's proxy, the same on every way): the
/// benchmark's own client, Caddy, and the agent (its upstream directory
/// and the access log). Unlike the throughput, these hardly depend on what
/// else the machine runs.
#[derive(Debug, Clone, Copy, Default)]
pub struct Cpu {
    pub client: Option<f64>,
    pub caddy: Option<f64>,
    pub agent: Option<f64>,
}

impl Cpu {
    pub fn describe(&self) -> String {
        let us = |v: Option<f64>| v.map_or("?".to_string(), |v| format!("{v:.0} us"));
        format!("client {}, Caddy {}, agent {}", us(self.client), us(self.caddy), us(self.agent))
    }
}

impl Way {
    /// Caddy's figures against the direct way's to the same upstream:
    /// added p50 and p99 (ms) and the throughput ratio (%).
    pub fn against(&self, direct: &Way) -> (f64, f64, f64) {
        (
            (self.latency.p50.as_secs_f64() - direct.latency.p50.as_secs_f64()) * 1000.0,
            (self.latency.p99.as_secs_f64() - direct.latency.p99.as_secs_f64()) * 1000.0,
            100.0 * self.requests_per_second / direct.requests_per_second.max(0.001),
        )
    }
}

/// Measures `upstream`, served at `direct_address` (`host:port`), straight
/// and through Caddy.
pub async fn measure(edge: &Edge, upstream: Upstream, direct_address: &str, settings: &Settings) -> Result<Vec<Way>> {
    let timeout = Duration::from_secs(10);
    let caddy_url = edge.https_url(&edge.probe_host, "/");
    let ways = [
        (Route::Direct, format!("direct  http://{direct_address}/"), client::plain(timeout)?, format!("http://{direct_address}/")),
        (Route::Caddy(Protocol::Http1), format!("Caddy   HTTPS, {}", Protocol::Http1.name()), edge.client(Protocol::Http1, timeout)?, caddy_url.clone()),
        (Route::Caddy(Protocol::Http2), format!("Caddy   HTTPS, {}", Protocol::Http2.name()), edge.client(Protocol::Http2, timeout)?, caddy_url),
    ];
    println!("  upstream: {}", upstream.name());
    let mut results = Vec::new();
    for (route, name, client, url) in ways {
        let mut failures = Failures::default();
        if route == Route::Direct {
            check_upstream(&client, &url, upstream).await?;
        }
        for _ in 0..WARM_UP {
            fetch(&client, &url).await.map_err(|kind| anyhow::anyhow!("warming up {url}: {kind}"))?;
        }
        let mut micros = Vec::with_capacity(settings.requests as usize);
        for _ in 0..settings.requests {
            let start = Instant::now();
            match fetch(&client, &url).await {
                Ok(()) => micros.push(u32::try_from(start.elapsed().as_micros()).unwrap_or(u32::MAX)),
                Err(kind) => failures.add(kind),
            }
        }
        if micros.is_empty() {
            bail!("no sequential request to {url} succeeded: {}", failures.describe());
        }
        let latency = summarize(micros);
        let pids = [Some(std::process::id()), edge.caddy_pid(), edge.cluster.agent_pid()];
        let before = pids.map(cpu_seconds);
        let (ok, seconds, concurrent_failures) = concurrent(&client, &url, settings).await?;
        let after = pids.map(cpu_seconds);
        let per_request = |i: usize| Some((after[i]? - before[i]?) * 1e6 / (ok as f64).max(1.0));
        let cpu = Cpu { client: per_request(0), caddy: per_request(1), agent: per_request(2) };
        failures.merge(&concurrent_failures);
        let way = Way { upstream, route, name, latency, requests_per_second: ok as f64 / seconds, failures, cpu };
        println!(
            "  {:<36} sequential p50 {:>7.3} ms  p99 {:>7.3} ms; {} workers x {} s: {:>6.0} req/s, CPU per request {}; failed {}",
            way.name,
            way.latency.p50.as_secs_f64() * 1000.0,
            way.latency.p99.as_secs_f64() * 1000.0,
            settings.workers,
            settings.duration.as_secs(),
            way.requests_per_second,
            way.cpu.describe(),
            way.failures.describe(),
        );
        results.push(way);
    }
    Ok(results)
}

/// The container really is `upstream`: it closes the connection after
/// each response, or it keeps it open.
async fn check_upstream(client: &reqwest::Client, url: &str, upstream: Upstream) -> Result<()> {
    let response = client.get(url).send().await.with_context(|| format!("GET {url}"))?;
    let closes = response.headers().get_all(reqwest::header::CONNECTION).iter().any(|v| v.to_str().is_ok_and(|v| v.eq_ignore_ascii_case("close")));
    let _ = response.bytes().await;
    match (upstream, closes) {
        (Upstream::Closing, false) => bail!("{url} should close every connection but answered without Connection: close"),
        (Upstream::KeepAlive, true) => bail!("{url} should keep connections alive but answered Connection: close"),
        _ => Ok(()),
    }
}

fn cpu_seconds(pid: Option<u32>) -> Option<f64> {
    crate::procstat::sample(pid?).map(|sample| sample.cpu_seconds)
}

/// One GET that must answer 200 with the probe's page; the error kind if not.
async fn fetch(client: &reqwest::Client, url: &str) -> Result<(), String> {
    let response = client.get(url).send().await.map_err(|err| error_kind(&err))?;
    if response.status() != 200 {
        return Err(format!("status {}", response.status().as_u16()));
    }
    match response.text().await {
        Ok(page) if page == BLUE => Ok(()),
        Ok(page) => Err(format!("unexpected page {:?}", page.chars().take(40).collect::<String>())),
        Err(err) => Err(error_kind(&err)),
    }
}

/// `settings.workers` loops fetching `url` for `settings.duration`: the
/// successful requests, the seconds they took, and the failures.
async fn concurrent(client: &reqwest::Client, url: &str, settings: &Settings) -> Result<(u64, f64, Failures)> {
    let stop = Arc::new(AtomicBool::new(false));
    let ok = Arc::new(AtomicU64::new(0));
    let failures = Arc::new(Mutex::new(Failures::default()));
    let start = Instant::now();
    let mut workers = Vec::new();
    for _ in 0..settings.workers {
        let (client, url, stop, ok, failures) = (client.clone(), url.to_string(), stop.clone(), ok.clone(), failures.clone());
        workers.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                match fetch(&client, &url).await {
                    Ok(()) => {
                        ok.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(kind) => failures.lock().expect("failures lock").add(kind),
                }
            }
        }));
    }
    tokio::time::sleep(settings.duration).await;
    stop.store(true, Ordering::Relaxed);
    for worker in workers {
        worker.await.context("a load worker panicked")?;
    }
    let seconds = start.elapsed().as_secs_f64();
    let failures = failures.lock().expect("failures lock").clone();
    Ok((ok.load(Ordering::Relaxed), seconds, failures))
}
