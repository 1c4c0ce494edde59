//! Part 1: the time from a route change in the control plane to Caddy
//! serving it, at growing sizes of the route table.
//!
//! The table grows with background apps created through `POST /api/apps`
//! (never deployed: each adds the route `<app>.test` with no upstream).
//! A change puts a new, unique custom domain on the probe app with
//! `PUT /api/apps/{probe}/domains`; it counts as served when an HTTPS GET
//! to that host through Caddy answers 200 with the probe's page. The
//! agent's "route table applied" log line splits the time into the control
//! plane's answer, the agent's fetch and Caddy's load, and what follows
//! the load (the host's certificate from Caddy's internal CA).

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use futures_util::stream::{self, StreamExt};
use reqwest::Method;
use serde_json::json;

use super::client::{error_kind, Protocol};
use super::edge::{Applied, Edge};
use crate::procstat;
use crate::timestamp::{self, millis_between};

pub struct Settings {
    pub sizes: Vec<usize>,
    pub changes: u32,
    pub poll: Duration,
    pub change_timeout: Duration,
    pub create_concurrency: usize,
    pub build_budget: Duration,
    /// Background app names are `<prefix><n>`.
    pub prefix: String,
}

/// The figures at one table size.
pub struct SizeResult {
    /// The size asked for.
    pub target: usize,
    /// Routes in the table while the changes were timed.
    pub routes: usize,
    /// Why the table stopped short of `target`, if it did.
    pub short: Option<String>,
    pub build: Build,
    pub changes: Vec<Change>,
    pub caddy: Option<procstat::Sample>,
}

/// Growing the table to one size.
pub struct Build {
    pub apps_created: usize,
    pub seconds: f64,
    /// From the last creation's answer to Caddy having loaded a table with
    /// every route.
    pub applied_after_seconds: Option<f64>,
    /// Caddy loads during the growth (the agent coalesces the rest).
    pub loads: usize,
    /// Creation answer times, in microseconds.
    pub create_micros: Vec<u32>,
}

/// One timed route change.
pub struct Change {
    /// Request to the PUT's answer.
    pub put_ms: f64,
    /// Request to the agent's "route table applied" line (Caddy loaded it).
    pub applied_ms: Option<f64>,
    /// Request to the first 200 from the new host; `None`: not within the timeout.
    pub served_ms: Option<f64>,
    /// Failed probes of the new host before it answered.
    pub probes: u32,
}

pub async fn measure(edge: &mut Edge, settings: &Settings) -> Result<Vec<SizeResult>> {
    let client = edge.client(Protocol::Http1, Duration::from_secs(2))?;
    // The probe serves blue or green, depending on how many switches part 2 made.
    let probe_url = edge.https_url(&edge.probe_host, "/");
    let response = client.get(&probe_url).send().await.with_context(|| format!("GET {probe_url}"))?;
    if response.status() != 200 {
        bail!("GET {probe_url} answered {}", response.status());
    }
    let page = response.text().await?;
    // Every change replaces the probe's one custom domain, so the table
    // holds one: put it there before the table grows, so that the size
    // measured at is the size asked for.
    let path = format!("/api/apps/{}/domains", edge.probe());
    let first_domain = format!("{}-first.test", edge.probe());
    let (status, answer) = edge.cluster.server.call(Method::PUT, &path, Some(&json!([first_domain]))).await?;
    if status != 200 {
        bail!("PUT {path} answered {status}: {answer}");
    }
    let (version, _) = edge.table().await?;
    edge.wait_applied(version, super::edge::APPLY_TIMEOUT).await?;
    let budget_end = Instant::now() + settings.build_budget;
    let mut next_app = 0usize;
    let mut results = Vec::new();
    for &target in &settings.sizes {
        let (build, routes, short) = grow(edge, settings, target, budget_end, &mut next_app).await?;
        println!(
            "  table of {routes} routes{}: {} apps created in {:.1} s ({:.0} apps/s, POST /api/apps p50 {:.1} ms p99 {:.1} ms); \
             {} Caddy loads; every route loaded {}",
            if routes == target { String::new() } else { format!(" (asked for {target})") },
            build.apps_created,
            build.seconds,
            if build.seconds > 0.0 { build.apps_created as f64 / build.seconds } else { 0.0 },
            percentile_ms(&build.create_micros, 0.5),
            percentile_ms(&build.create_micros, 0.99),
            build.loads,
            build.applied_after_seconds.map_or("(no load needed)".to_string(), |s| format!("{s:.1} s after the last creation")),
        );
        if let Some(reason) = &short {
            println!("  stopped short of {target} routes: {reason}");
        }
        let mut changes = Vec::new();
        for index in 0..settings.changes {
            let change = time_change(edge, &client, settings, &page, routes, index).await?;
            changes.push(change);
        }
        let served: Vec<f64> = changes.iter().filter_map(|c| c.served_ms).collect();
        let caddy = edge.caddy_pid().and_then(procstat::sample);
        println!(
            "  {routes} routes: {} changes, served p50 {} p99 {}{}; Caddy RSS {}",
            changes.len(),
            format_ms(quantile(&served, 0.5)),
            format_ms(quantile(&served, 0.99)),
            match changes.len() - served.len() {
                0 => String::new(),
                missed => format!(", {missed} NOT served within {} s", settings.change_timeout.as_secs()),
            },
            caddy.as_ref().map_or("?".to_string(), |s| procstat::mib(s.rss_bytes)),
        );
        let stop = short.is_some();
        results.push(SizeResult { target, routes, short, build, changes, caddy });
        if stop {
            break;
        }
    }
    Ok(results)
}

/// Creates background apps until the table has `target` routes (or the
/// budget is spent); returns how that went, the routes reached, and why it
/// stopped short.
async fn grow(edge: &mut Edge, settings: &Settings, target: usize, budget_end: Instant, next_app: &mut usize) -> Result<(Build, usize, Option<String>)> {
    let (version_before, routes_before) = edge.table().await?;
    let loads_before = edge.applied().iter().filter(|line| line.version > version_before).count();
    let wanted = target.saturating_sub(routes_before);
    let started = Instant::now();
    let first = *next_app;
    let repo_url = edge.cluster.git().url("background");
    let server = &edge.cluster.server;
    // Apps are created in order of their number, each as soon as one of the
    // `create_concurrency` slots is free, and none once the budget is spent.
    let mut creations = stream::iter(first..first + wanted)
        .take_while(|_| std::future::ready(Instant::now() < budget_end))
        .map(|number| {
            let body = json!({"name": format!("{}{number}", settings.prefix), "repo_url": repo_url, "port": 8080});
            async move {
                let sent = Instant::now();
                let (status, answer) = server.call(Method::POST, "/api/apps", Some(&body)).await?;
                if status != 201 {
                    bail!("creating background app {} answered {status}: {answer}", body["name"]);
                }
                Ok(sent.elapsed())
            }
        })
        .buffer_unordered(settings.create_concurrency);
    let mut create_micros = Vec::with_capacity(wanted);
    let mut chunk_started = Instant::now();
    while let Some(answer) = creations.next().await {
        let took = answer?;
        create_micros.push(u32::try_from(took.as_micros()).unwrap_or(u32::MAX));
        let done = create_micros.len();
        if done % 1000 == 0 && done < wanted {
            let recent = &create_micros[done - 1000..];
            println!(
                "    {done}/{wanted} apps after {:.1} s: {:.0} apps/s over the last 1,000 (POST p50 {:.1} ms, p99 {:.1} ms)",
                started.elapsed().as_secs_f64(),
                1000.0 / chunk_started.elapsed().as_secs_f64(),
                percentile_ms(recent, 0.5),
                percentile_ms(recent, 0.99),
            );
            chunk_started = Instant::now();
        }
    }
    drop(creations);
    let seconds = started.elapsed().as_secs_f64();
    let last_created = timestamp::now();
    *next_app += create_micros.len();
    let short = (create_micros.len() < wanted).then(|| {
        format!(
            "the build budget (--build-budget-seconds {}) ran out after {} of {wanted} apps",
            settings.build_budget.as_secs(),
            create_micros.len()
        )
    });
    // Concurrent creations can briefly leave the table without the last
    // apps (each recomputes it from its own read of the store); the
    // control plane's reconciler recomputes it every second.
    let expected = routes_before + create_micros.len();
    let deadline = Instant::now() + Duration::from_secs(10);
    let (version, routes) = loop {
        let (version, routes) = edge.table().await?;
        if routes >= expected || Instant::now() > deadline {
            break (version, routes);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    if routes < expected {
        bail!("the route table has {routes} routes 10 s after the creations, {expected} expected");
    }
    let applied = edge.wait_applied(version, super::edge::APPLY_TIMEOUT).await?;
    let loads = edge.applied().iter().filter(|line| line.version > version_before).count() - loads_before;
    let applied_after_seconds = applied.map(|line| millis_between(last_created, line.at).max(0.0) / 1000.0);
    Ok((Build { apps_created: create_micros.len(), seconds, applied_after_seconds, loads, create_micros }, routes, short))
}

/// Puts a new domain on the probe and polls it through Caddy until it
/// answers the probe's page.
async fn time_change(edge: &mut Edge, client: &reqwest::Client, settings: &Settings, page: &str, routes: usize, index: u32) -> Result<Change> {
    let host = format!("{}-r{routes}-c{index}.test", edge.probe());
    let url = edge.https_url(&host, "/");
    let path = format!("/api/apps/{}/domains", edge.probe());
    let body = json!([host]);
    let wall_start = timestamp::now();
    let start = Instant::now();
    let (status, answer) = edge.cluster.server.call(Method::PUT, &path, Some(&body)).await?;
    let put_ms = start.elapsed().as_secs_f64() * 1000.0;
    if status != 200 {
        bail!("PUT {path} answered {status}: {answer}");
    }
    let mut tick = tokio::time::interval(settings.poll);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut probes = 0u32;
    let mut last_failure = None;
    let served_ms = loop {
        tick.tick().await;
        match client.get(&url).send().await {
            Ok(response) => {
                let status = response.status();
                let answer = response.text().await.unwrap_or_default();
                if status == 200 && answer == page {
                    break Some(start.elapsed().as_secs_f64() * 1000.0);
                }
                last_failure = Some(format!("status {}: {:?}", status.as_u16(), answer.chars().take(40).collect::<String>()));
            }
            Err(err) => last_failure = Some(error_kind(&err)),
        }
        probes += 1;
        if start.elapsed() > settings.change_timeout {
            break None;
        }
    };
    // Nothing else changes the table meanwhile, so the version in force now
    // is the one the PUT made.
    let (version, _) = edge.table().await?;
    let applied: Option<Applied> = edge.wait_applied(version, super::edge::APPLY_TIMEOUT).await.context("waiting for the agent to log the change")?;
    let applied_ms = applied.map(|line| millis_between(wall_start, line.at));
    if served_ms.is_none() {
        println!("    change {index} to {host} not served within {} s; the last probe got: {}", settings.change_timeout.as_secs(), last_failure.as_deref().unwrap_or("?"));
    }
    Ok(Change { put_ms, applied_ms, served_ms, probes })
}

/// The `q` quantile (nearest rank) of `values`; `None` when empty.
pub fn quantile(values: &[f64], q: f64) -> Option<f64> {
    let mut sorted: Vec<f64> = values.iter().copied().filter(|v| v.is_finite()).collect();
    if sorted.is_empty() {
        return None;
    }
    sorted.sort_by(f64::total_cmp);
    let index = ((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len()) - 1;
    Some(sorted[index])
}

pub fn format_ms(value: Option<f64>) -> String {
    match value {
        Some(ms) if ms >= 10_000.0 => format!("{:.1} s", ms / 1000.0),
        Some(ms) => format!("{ms:.0} ms"),
        None => "-".to_string(),
    }
}

fn percentile_ms(micros: &[u32], q: f64) -> f64 {
    quantile(&micros.iter().map(|&m| f64::from(m) / 1000.0).collect::<Vec<_>>(), q).unwrap_or(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_use_the_nearest_rank() {
        let values: Vec<f64> = (1..=20).map(f64::from).collect();
        assert_eq!(quantile(&values, 0.5), Some(10.0));
        assert_eq!(quantile(&values, 0.99), Some(20.0));
        assert_eq!(quantile(&[], 0.5), None);
        assert_eq!(format_ms(Some(12_345.0)), "12.3 s");
        assert_eq!(format_ms(Some(87.4)), "87 ms");
    }
}
