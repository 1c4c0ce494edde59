//! Part 3: what Caddy adds. The same page fetched straight from the
//! container (plain HTTP to the instance address the control plane
//! records) and through Caddy (HTTPS to the app's host, connections kept
//! alive, over HTTP/1.1 and over HTTP/2): sequential requests for latency,
//! then a fixed-duration concurrent load for throughput.

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

pub struct Way {
    pub name: String,
    pub latency: Summary,
    pub requests_per_second: f64,
    pub failures: Failures,
}

/// Measures straight to `direct_address` (`host:port`) and through Caddy.
pub async fn measure(edge: &Edge, direct_address: &str, settings: &Settings) -> Result<Vec<Way>> {
    let timeout = Duration::from_secs(10);
    let ways = [
        (format!("direct  http://{direct_address}/"), client::plain(timeout)?, format!("http://{direct_address}/")),
        (format!("Caddy   HTTPS, {}", Protocol::Http1.name()), edge.client(Protocol::Http1, timeout)?, edge.https_url(&edge.probe_host, "/")),
        (format!("Caddy   HTTPS, {}", Protocol::Http2.name()), edge.client(Protocol::Http2, timeout)?, edge.https_url(&edge.probe_host, "/")),
    ];
    let mut results = Vec::new();
    for (name, client, url) in ways {
        let mut failures = Failures::default();
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
        let (ok, seconds, concurrent_failures) = concurrent(&client, &url, settings).await?;
        failures.merge(&concurrent_failures);
        let way = Way { name, latency, requests_per_second: ok as f64 / seconds, failures };
        println!(
            "  {:<36} sequential p50 {:>7.3} ms  p99 {:>7.3} ms; {} workers x {} s: {:>6.0} req/s; failed {}",
            way.name,
            way.latency.p50.as_secs_f64() * 1000.0,
            way.latency.p99.as_secs_f64() * 1000.0,
            settings.workers,
            settings.duration.as_secs(),
            way.requests_per_second,
            way.failures.describe(),
        );
        results.push(way);
    }
    Ok(results)
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
