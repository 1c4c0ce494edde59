//! Liveness probes. Every second the supervisor lists this node's running
//! app containers that carry a probe (labels set at creation, so it finds
//! them after an agent restart too) and, once a container passed its
//! deploy health check and its probe's grace period since it (re)started
//! is over, runs its check (see [`crate::probe_checks`]: the health path
//! over HTTP by default) at the probe's interval. A check that does not
//! pass within its timeout (one that hangs included) is a failure;
//! `failure_threshold` failures in a row restart the container, and a
//! container is restarted again no sooner than the back-off after its
//! previous restart (10 s, doubling up to 5 min): never in a tight loop.
//! Restarts show in the usage samples (`restarts`, counted from Docker's
//! start events), so `cloudweb top` and the app page see them, and a
//! container that keeps stopping is reported crash-looping (see
//! [`crate::crash_loops`]).
//!
//! A probe that cannot run as set (its command is not in the image) is
//! not the app's failure: it restarts nothing, and the control plane is
//! told once (`Report::probe_problem`), and told again when it runs.
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
use crate::crash_loops::RestartReasons;
use crate::probe_checks::{self, Outcome};
use crate::runtime::{DockerRuntime, Probed};

#[derive(Debug)]
struct Watch {
    /// Passed its deploy health check: probed from now on.
    armed: bool,
    next_probe: Instant,
    failures: u32,
    restarts: u32,
    /// No restart before this.
    not_before: Instant,
    /// Seen running at the last look; when it (re)started, as seen here.
    running: bool,
    started: Instant,
    /// Why the probe cannot run as set, now, and what the control plane
    /// was told (`None`: nothing yet, or nothing to tell).
    problem: Option<String>,
    problem_told: Option<String>,
    problem_report_after: Instant,
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

/// Tells the control plane about a probe that cannot run (`problem`), or
/// that it runs again (`None`); true once settled.
async fn report_problem(client: &ControlPlane, probed: &Probed, problem: Option<&str>) -> bool {
    let mut report = cloudweb_protocol::Report::new(probed.deployment.clone());
    report.instance = Some(probed.instance);
    report.probe_problem = Some(problem.unwrap_or("").to_string());
    report.sanitize();
    match client.report(&report).await {
        Ok(()) => true,
        Err(err) if err.is_permanent() => {
            tracing::warn!(container = %probed.name, error = %err, "the probe problem report was refused");
            true
        }
        Err(err) => {
            tracing::warn!(container = %probed.name, error = %err, "could not report the probe problem; trying again");
            false
        }
    }
}

fn interval(liveness: &Liveness) -> Duration {
    Duration::from_secs(u64::from(liveness.interval_seconds))
}

fn grace(seconds: u32) -> Duration {
    Duration::from_secs(u64::from(seconds))
}

/// Runs until the task is aborted. `host` is where published ports are
/// reached (the publish address, loopback for a wildcard); `advertise` is
/// the host of the addresses reported.
pub async fn supervise(
    runtime: DockerRuntime,
    client: Arc<ControlPlane>,
    host: String,
    advertise: String,
    reasons: RestartReasons,
) {
    let http = match reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
    {
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
                running: false,
                started: now,
                problem: None,
                problem_told: None,
                problem_report_after: now,
                port: probed.host_port,
                report_after: now,
            });
            // Stopped, or between two runs: its watch waits for it.
            if !probed.running {
                watch.running = false;
                continue;
            }
            if !watch.running {
                watch.running = true;
                watch.started = now;
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
            if watch.problem != watch.problem_told && now >= watch.problem_report_after {
                if report_problem(&client, probed, watch.problem.as_deref()).await {
                    watch.problem_told.clone_from(&watch.problem);
                } else {
                    watch.problem_report_after = now + REPORT_RETRY;
                }
            }
            let in_grace = |seconds: u32| now < watch.started + grace(seconds);
            if let Some(readiness) = &probed.readiness {
                let ready = ready_watches
                    .entry(probed.id.clone())
                    .or_insert_with(|| crate::readiness::ReadyWatch::new(now));
                if now >= ready.next_probe && !in_grace(readiness.grace_seconds) {
                    ready.next_probe =
                        now + Duration::from_secs(u64::from(readiness.interval_seconds));
                    if !ready.armed {
                        ready.armed = runtime.passed_health_check(&probed.id).await.unwrap_or(false);
                    }
                    if ready.armed {
                        due_ready.push((probed, readiness));
                    }
                }
            }
            let Some(liveness) = &probed.liveness else {
                continue;
            };
            if now < watch.next_probe || in_grace(liveness.grace_seconds) {
                continue;
            }
            watch.next_probe = now + interval(liveness);
            if !watch.armed {
                watch.armed = runtime.passed_health_check(&probed.id).await.unwrap_or(false);
                if !watch.armed {
                    continue;
                }
            }
            due.push((probed, liveness));
        }
        let verdicts =
            futures_util::future::join_all(due_ready.iter().map(|(probed, readiness)| {
                let probe = probe_checks::Probe {
                    check: readiness.check.as_ref(),
                    timeout_seconds: readiness.timeout_seconds,
                    passes: cloudweb_protocol::Readiness::passes,
                };
                probe_checks::run(&runtime, &http, &host, probed, probe)
            }))
            .await;
        for ((probed, readiness), outcome) in due_ready.into_iter().zip(verdicts) {
            let Some(ready) = ready_watches.get_mut(&probed.id) else {
                continue;
            };
            // Docker is restarting it: no verdict.
            if outcome == Outcome::Skip {
                continue;
            }
            if let Outcome::Broken(reason) = &outcome {
                ready.broken(&probed.name, reason);
            }
            ready.observe(readiness, outcome.into_result());
            let now = Instant::now();
            if let Some((verdict, reason)) = ready.to_report(now) {
                let settled = crate::readiness::report(&client, probed, verdict, reason).await;
                ready.reported(verdict, settled, Instant::now());
            }
        }
        let outcomes = futures_util::future::join_all(due.iter().map(|(probed, liveness)| {
            let probe = probe_checks::Probe {
                check: liveness.check.as_ref(),
                timeout_seconds: liveness.timeout_seconds,
                passes: healthy_status,
            };
            probe_checks::run(&runtime, &http, &host, probed, probe)
        }))
        .await;
        for ((probed, liveness), outcome) in due.into_iter().zip(outcomes) {
            let Some(watch) = watches.get_mut(&probed.id) else {
                continue;
            };
            let reason = match outcome {
                Outcome::Pass => {
                    watch.failures = 0;
                    watch.problem = None;
                    continue;
                }
                // Docker is restarting it: no verdict.
                Outcome::Skip => continue,
                Outcome::Broken(reason) => {
                    if watch.problem.is_none() {
                        tracing::warn!(container = %probed.name, app = %probed.app, %reason, "the liveness probe cannot run as set; it restarts nothing until it can");
                    }
                    watch.failures = 0;
                    watch.problem = Some(reason);
                    continue;
                }
                // A probe found unable to run stays so until it passes: a
                // failure meanwhile (an exec over its time on a loaded
                // host) says nothing of the app.
                Outcome::Fail(reason) if watch.problem.is_some() => {
                    tracing::debug!(container = %probed.name, %reason, "liveness probe failed while it cannot run as set; not counted");
                    continue;
                }
                Outcome::Fail(reason) => reason,
            };
            watch.failures += 1;
            tracing::debug!(container = %probed.name, failures = watch.failures, %reason, "liveness probe failed");
            if watch.failures < liveness.failure_threshold || Instant::now() < watch.not_before {
                continue;
            }
            tracing::warn!(container = %probed.name, app = %probed.app, failures = watch.failures, %reason, "liveness probe failed; restarting the container");
            reasons.note(&probed.id, &format!("liveness probe: {reason}"));
            match runtime.restart(&probed.id).await {
                Ok(()) => {
                    let now = Instant::now();
                    watch.failures = 0;
                    watch.not_before = now + Liveness::backoff(watch.restarts);
                    watch.restarts += 1;
                    watch.next_probe = now + interval(liveness);
                }
                Err(err) => tracing::warn!(container = %probed.name, error = %err, "could not restart the container"),
            }
        }
    }
}
