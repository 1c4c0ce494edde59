//! Readiness probes: whether a running instance should get requests. The
//! probe supervisor ([`crate::liveness::supervise`]) asks an instance's
//! check (the health path over HTTP by default) at its readiness probe's
//! interval once it passed its deploy health check and its grace period;
//! an answer of 200 to 399 within the timeout passes.
//! `failure_threshold` failures in a row make it unready, and
//! `success_threshold` passes in a row ready again. Only verdicts are
//! reported (`Report::ready`), and the first verdict after the agent
//! (re)started always is, since the control plane may hold an older one.
//! A report that fails is sent again no sooner than 10 s later. A probe
//! that cannot run as set (its command is not in the image) fails, so the
//! instance is unready with that reason, and is logged once.

use std::time::Duration;

use cloudweb_protocol::Readiness;
use tokio::time::Instant;

use crate::client::ControlPlane;
use crate::runtime::Probed;

/// The pause before a failed report is sent again.
const REPORT_RETRY: Duration = Duration::from_secs(10);

/// One container's readiness as the agent sees it.
#[derive(Debug)]
pub struct ReadyWatch {
    /// Passed its deploy health check: probed from now on.
    pub armed: bool,
    pub next_probe: Instant,
    /// The verdict the control plane was told (`None`: nothing yet).
    told: Option<bool>,
    /// What the probes say now (`None`: no verdict yet).
    verdict: Option<bool>,
    passes: u32,
    failures: u32,
    last_failure: Option<String>,
    report_after: Instant,
    /// The probe was found unable to run (logged once).
    broken_logged: bool,
}

impl ReadyWatch {
    pub fn new(now: Instant) -> ReadyWatch {
        ReadyWatch {
            armed: false,
            next_probe: now,
            told: None,
            verdict: None,
            passes: 0,
            failures: 0,
            last_failure: None,
            report_after: now,
            broken_logged: false,
        }
    }

    /// The probe cannot run as set: said once in the log (it also fails,
    /// so the instance is unready with that reason).
    pub fn broken(&mut self, container: &str, reason: &str) {
        if !std::mem::replace(&mut self.broken_logged, true) {
            tracing::warn!(container, %reason, "the readiness probe cannot run as set");
        }
    }

    /// Counts a probe's result; the verdict changes after enough in a row.
    pub fn observe(&mut self, readiness: &Readiness, result: Result<(), String>) {
        match result {
            Ok(()) => {
                self.failures = 0;
                self.passes += 1;
                if self.passes >= readiness.success_threshold {
                    self.verdict = Some(true);
                }
            }
            Err(reason) => {
                self.passes = 0;
                self.failures += 1;
                self.last_failure = Some(reason);
                if self.failures >= readiness.failure_threshold {
                    self.verdict = Some(false);
                }
            }
        }
    }

    /// The verdict to report now, if it differs from the one told and a
    /// failed report is not waiting out its pause.
    pub fn to_report(&self, now: Instant) -> Option<(bool, Option<String>)> {
        let verdict = self.verdict?;
        if self.told == Some(verdict) || now < self.report_after {
            return None;
        }
        Some((verdict, if verdict { None } else { self.last_failure.clone() }))
    }

    /// What became of a report of `verdict`.
    pub fn reported(&mut self, verdict: bool, settled: bool, now: Instant) {
        if settled {
            self.told = Some(verdict);
        } else {
            self.report_after = now + REPORT_RETRY;
        }
    }
}

/// Tells the control plane the instance's verdict; true once settled
/// (applied, or refused for good: the deployment is gone, say).
pub async fn report(client: &ControlPlane, probed: &Probed, ready: bool, reason: Option<String>) -> bool {
    let mut report = cloudweb_protocol::Report::new(probed.deployment.clone());
    report.instance = Some(probed.instance);
    report.ready = Some(ready);
    report.message = reason.clone().map(|r| format!("readiness probe: {r}"));
    match client.report(&report).await {
        Ok(()) => {
            if ready {
                tracing::info!(container = %probed.name, "readiness probe passes: the instance gets requests");
            } else {
                tracing::warn!(container = %probed.name, reason = reason.as_deref().unwrap_or(""), "readiness probe fails: the instance gets no requests");
            }
            true
        }
        Err(err) if err.is_permanent() => {
            tracing::warn!(container = %probed.name, error = %err, "the instance's readiness was refused");
            true
        }
        Err(err) => {
            tracing::warn!(container = %probed.name, error = %err, "could not report the instance's readiness; trying again");
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn verdicts_need_enough_in_a_row_and_are_reported_once() {
        let readiness = Readiness {
            interval_seconds: 1,
            timeout_seconds: 1,
            failure_threshold: 2,
            success_threshold: 2,
            check: None,
            grace_seconds: 0,
        };
        let now = Instant::now();
        let mut watch = ReadyWatch::new(now);
        watch.observe(&readiness, Ok(()));
        assert_eq!(watch.to_report(now), None, "one pass is not a verdict yet");
        watch.observe(&readiness, Ok(()));
        assert_eq!(watch.to_report(now), Some((true, None)), "the first verdict is always told");
        watch.reported(true, true, now);
        assert_eq!(watch.to_report(now), None);
        watch.observe(&readiness, Err("HTTP 503".into()));
        watch.observe(&readiness, Ok(()));
        watch.observe(&readiness, Err("HTTP 503".into()));
        assert_eq!(watch.to_report(now), None, "failures not in a row");
        watch.observe(&readiness, Err("HTTP 503".into()));
        assert_eq!(watch.to_report(now), Some((false, Some("HTTP 503".into()))));
        watch.reported(false, false, now);
        assert_eq!(watch.to_report(now), None, "a failed report waits");
        assert_eq!(watch.to_report(now + REPORT_RETRY), Some((false, Some("HTTP 503".into()))));
    }
}
