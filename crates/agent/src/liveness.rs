//! Liveness probes. Every second the supervisor lists this node's running
//! app containers that carry a probe (labels set at creation, so it finds
//! them after an agent restart too) and, once a container passed its
//! deploy health check, probes its health path over HTTP on its published
//! port at the probe's interval. A probe with no answer below 500 within
//! its timeout (one that hangs included) is a failure; `failure_threshold`
//! failures in a row restart the container, and a container is restarted
//! again no sooner than the back-off after its previous restart (10 s,
//! doubling up to 5 min): a container that keeps failing is
//! `crash-looping` in the agent's log, never restarted in a tight loop.
//! Restarts show in the usage samples (`restarts`, counted from Docker's
//! start events), so `cloudweb top` and the app page see them.
//!
//! The same loop runs readiness probes (see [`crate::readiness`]).
//!
//! A restarted container is published on a new host port: when an app
//! instance container's port changes (after a probe's restart, or Docker's
//! own after a crash, probe or not), the agent reports the instance running
//! at its new address, so the ingress routes to it again.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use cloudweb_protocol::deploy::healthy_status;
use cloudweb_protocol::Liveness;
use tokio::time::Instant;

use crate::client::ControlPlane;
use crate::runtime::{DockerRuntime, Probed};

/// Restarts within this window make a container `crash-looping`.
const LOOP_WINDOW: Duration = Duration::from_secs(600);
const LOOP_RESTARTS: usize = 3;

#[derive(Debug)]
struct Watch {
    /// Passed its deploy health check: probed from now on.
    armed: bool,
    next_probe: Instant,
    failures: u32,
    restarts: u32,
    /// No restart before this.
    not_before: Instant,
    recent: Vec<Instant>,
    /// The host port last reported (or seen at the first look).
    port: Option<u16>,
    /// No address report before this (after a failed one).
    report_after: Instant,
}

/// Tells the control plane the instance runs at its new address, once:
/// the supervisor tries again no sooner than [`REPORT_RETRY`] later, so a
/// control plane that is down never holds up the probes. True once it is
/// settled (applied, or refused for good).
async fn report_address(client: &ControlPlane, probed: &Probed, address: String) -> bool {
    let mut report = cloudweb_protocol::Report::new(probed.deployment.clone());
    report.instance = Some(probed.instance);
    report.state = Some("running".into());
    report.address = Some(address.clone());
    match client.report(&report).await {
        Ok(()) => {
            tracing::info!(container = %probed.name, %address, "the restarted instance runs at a new address");
            true
        }
        // Refused for good (the deployment is gone, say): not again.
        Err(err) if err.is_permanent() => {
            tracing::warn!(container = %probed.name, error = %err, "the restarted instance's address was refused");
            true
        }
        Err(err) => {
            tracing::warn!(container = %probed.name, error = %err, "could not report the restarted instance's address; trying again");
            false
        }
    }
}

/// The pause before a failed address report is sent again.
const REPORT_RETRY: Duration = Duration::from_secs(10);

/// Probes `probed` once: Ok, or why it failed.
async fn probe(http: &reqwest::Client, host: &str, probed: &Probed) -> Result<(), String> {
    let Some(port) = probed.host_port else { return Err("no published port".into()) };
    let Some(liveness) = &probed.liveness else { return Ok(()) };
    let url = format!("http://{host}:{port}{}", probed.path);
    let timeout = Duration::from_secs(u64::from(liveness.timeout_seconds));
    match tokio::time::timeout(timeout, http.get(&url).send()).await {
        Err(_) => Err(format!("no answer on {} within {} s", probed.path, liveness.timeout_seconds)),
        Ok(Err(err)) => Err(format!("{} failed: {}", probed.path, if err.is_connect() { "connection refused".to_string() } else { err.to_string() })),
        Ok(Ok(response)) if healthy_status(response.status().as_u16()) => Ok(()),
        Ok(Ok(response)) => Err(format!("{} answered HTTP {}", probed.path, response.status().as_u16())),
    }
}

fn interval(liveness: &Liveness) -> Duration {
    Duration::from_secs(u64::from(liveness.interval_seconds))
}

/// Runs until the task is aborted. `host` is where published ports are
/// reached (the publish address, loopback for a wildcard); `advertise` is
/// the host of the addresses reported.
pub async fn supervise(runtime: DockerRuntime, client: Arc<ControlPlane>, host: String, advertise: String) {
    let http = match reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build() {
        Ok(http) => http,
        Err(err) => {
            tracing::error!(error = %err, "liveness probes cannot run");
            return;
        }
    };
    let bracket = |h: String| if h.contains(':') { format!("[{h}]") } else { h };
    let (host, advertise) = (bracket(host), bracket(advertise));
    let mut watches: HashMap<String, Watch> = HashMap::new();
    let mut ready_watches: HashMap<String, crate::readiness::ReadyWatch> = HashMap::new();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let containers = match runtime.instance_containers().await {
            Ok(containers) => containers,
            Err(err) => {
                tracing::debug!(error = %err, "cannot list the containers with a liveness probe");
                continue;
            }
        };
        watches.retain(|id, _| containers.iter().any(|c| c.id == *id));
        ready_watches.retain(|id, _| containers.iter().any(|c| c.id == *id));
        let now = Instant::now();
        let mut due = Vec::new();
        let mut due_ready = Vec::new();
        for probed in &containers {
            let watch = watches.entry(probed.id.clone()).or_insert_with(|| Watch {
                armed: false,
                next_probe: now,
                failures: 0,
                restarts: 0,
                not_before: now,
                recent: Vec::new(),
                port: probed.host_port,
                report_after: now,
            });
            // Stopped, or between two runs: its watch waits for it.
            if !probed.running {
                continue;
            }
            // Only a move from a port seen before is reported: a container
            // seen first while it was being created is the deploy's to
            // report, once healthy.
            match (watch.port, probed.host_port) {
                (Some(before), Some(port)) if before != port && now >= watch.report_after => {
                    if report_address(&client, probed, format!("{advertise}:{port}")).await {
                        watch.port = Some(port);
                    } else {
                        watch.report_after = now + REPORT_RETRY;
                    }
                }
                (None, Some(port)) => watch.port = Some(port),
                _ => {}
            }
            if let Some(readiness) = &probed.readiness {
                let ready = ready_watches.entry(probed.id.clone()).or_insert_with(|| crate::readiness::ReadyWatch::new(now));
                if now >= ready.next_probe {
                    ready.next_probe = now + Duration::from_secs(u64::from(readiness.interval_seconds));
                    if !ready.armed {
                        ready.armed = runtime.passed_health_check(&probed.id).await.unwrap_or(false);
                    }
                    if ready.armed {
                        due_ready.push((probed, *readiness));
                    }
                }
            }
            let Some(liveness) = &probed.liveness else { continue };
            if now < watch.next_probe {
                continue;
            }
            watch.next_probe = now + interval(liveness);
            if !watch.armed {
                watch.armed = runtime.passed_health_check(&probed.id).await.unwrap_or(false);
                if !watch.armed {
                    continue;
                }
            }
            due.push(probed);
        }
        let verdicts = futures_util::future::join_all(due_ready.iter().map(|(probed, readiness)| crate::readiness::probe(&http, &host, probed, readiness))).await;
        for ((probed, readiness), result) in due_ready.into_iter().zip(verdicts) {
            let Some(ready) = ready_watches.get_mut(&probed.id) else { continue };
            ready.observe(&readiness, result);
            let now = Instant::now();
            if let Some((verdict, reason)) = ready.to_report(now) {
                let settled = crate::readiness::report(&client, probed, verdict, reason).await;
                ready.reported(verdict, settled, Instant::now());
            }
        }
        let results = futures_util::future::join_all(due.iter().map(|probed| probe(&http, &host, probed))).await;
        for (probed, result) in due.into_iter().zip(results) {
            let (Some(watch), Some(liveness)) = (watches.get_mut(&probed.id), probed.liveness.as_ref()) else { continue };
            let reason = match result {
                Ok(()) => {
                    watch.failures = 0;
                    continue;
                }
                Err(reason) => reason,
            };
            watch.failures += 1;
            tracing::debug!(container = %probed.name, failures = watch.failures, %reason, "liveness probe failed");
            if watch.failures < liveness.failure_threshold || Instant::now() < watch.not_before {
                continue;
            }
            tracing::warn!(container = %probed.name, app = %probed.app, failures = watch.failures, %reason, "liveness probe failed; restarting the container");
            match runtime.restart(&probed.id).await {
                Ok(()) => {
                    let now = Instant::now();
                    watch.failures = 0;
                    watch.not_before = now + Liveness::backoff(watch.restarts);
                    watch.restarts += 1;
                    watch.next_probe = now + interval(liveness);
                    watch.recent.retain(|at| now.duration_since(*at) < LOOP_WINDOW);
                    watch.recent.push(now);
                    if watch.recent.len() >= LOOP_RESTARTS {
                        tracing::warn!(container = %probed.name, app = %probed.app, restarts = watch.recent.len(), window_s = LOOP_WINDOW.as_secs(), %reason, "crash-looping: the container keeps failing its liveness probe");
                    }
                }
                Err(err) => tracing::warn!(container = %probed.name, error = %err, "could not restart the container"),
            }
        }
    }
}
