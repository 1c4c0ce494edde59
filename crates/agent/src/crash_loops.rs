//! Crash loops. The watch follows the Engine's `die` events of this
//! node's app instance containers: a container that stopped
//! [`CRASH_LOOP_RESTARTS`] times within [`CRASH_LOOP_WINDOW_SECONDS`]
//! (exits Docker restarted it after, or its liveness probe's restarts) is
//! crash-looping. The control plane is told once, with the restarts, the
//! last exit code, why it was restarted last (the liveness probe's reason,
//! or the exit) and its last output lines; and told again once the
//! container has run a whole window since its last stop. A report that
//! fails is sent again at the next check (every [`CHECK_EVERY`]).
//!
//! The events are followed from where they were left off, so a Docker
//! Engine that restarts loses none; a container removed is forgotten.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cloudweb_protocol::probes::{
    CrashLoop, CRASH_LOOP_LINES, CRASH_LOOP_RESTARTS, CRASH_LOOP_WINDOW_SECONDS,
};
use futures_util::StreamExt;

use crate::client::ControlPlane;
use crate::runtime::{Died, DockerRuntime};

const CHECK_EVERY: Duration = Duration::from_secs(10);
/// A lost event stream is opened again after this pause.
const RECONNECT_AFTER: Duration = Duration::from_secs(5);
const WINDOW_NANOS: i64 = CRASH_LOOP_WINDOW_SECONDS as i64 * 1_000_000_000;

/// Why the liveness supervisor restarted a container last, by container
/// id, so that a stop it caused is explained by the probe's reason.
#[derive(Clone, Default)]
pub struct RestartReasons(Arc<Mutex<HashMap<String, String>>>);

impl RestartReasons {
    pub fn note(&self, container: &str, reason: &str) {
        self.0
            .lock()
            .expect("restart reasons")
            .insert(container.to_string(), reason.to_string());
    }

    fn take(&self, container: &str) -> Option<String> {
        self.0.lock().expect("restart reasons").remove(container)
    }
}

/// One container's recent stops.
#[derive(Debug, Default)]
struct Stops {
    deployment: String,
    instance: u32,
    /// Unix nanoseconds of its stops within the window.
    at: VecDeque<i64>,
    exit_code: Option<i64>,
    reason: Option<String>,
    /// What the control plane was told: looping or not (`None`: nothing).
    told: Option<bool>,
}

impl Stops {
    fn record(&mut self, died: &Died, reason: Option<String>) {
        self.deployment.clone_from(&died.deployment);
        self.instance = died.instance;
        self.at.push_back(died.at_nanos);
        self.forget_before(died.at_nanos - WINDOW_NANOS);
        self.exit_code = died.exit_code;
        self.reason = reason.or_else(|| {
            died.exit_code
                .map(|code| format!("exited with code {code}"))
        });
    }

    fn forget_before(&mut self, cutoff: i64) {
        while self.at.front().is_some_and(|at| *at <= cutoff) {
            self.at.pop_front();
        }
    }

    /// The verdict to tell now, if it changed: looping once enough stops
    /// fall in the window, steady once none does.
    fn due(&mut self, now_nanos: i64) -> Option<bool> {
        self.forget_before(now_nanos - WINDOW_NANOS);
        let looping = self.at.len() >= CRASH_LOOP_RESTARTS;
        match (self.told, looping) {
            (Some(told), now) if told == now => None,
            (None, false) => None,
            (_, now) if now || self.at.is_empty() => Some(now),
            _ => None,
        }
    }
}

fn now_nanos() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0)
}

/// Runs until the task is aborted.
pub async fn watch(runtime: DockerRuntime, client: Arc<ControlPlane>, reasons: RestartReasons) {
    let mut stops: HashMap<String, Stops> = HashMap::new();
    let mut since = now_nanos();
    let mut check = tokio::time::interval(CHECK_EVERY);
    check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let mut events = match runtime.die_events(since) {
            Ok(events) => events.boxed(),
            Err(err) => {
                tracing::debug!(error = %err, "the container events cannot be followed; trying again");
                tokio::time::sleep(RECONNECT_AFTER).await;
                continue;
            }
        };
        loop {
            tokio::select! {
                event = events.next() => match event {
                    Some(Ok(died)) => {
                        since = since.max(died.at_nanos + 1);
                        let reason = reasons.take(&died.container);
                        let entry = stops.entry(died.container.clone()).or_default();
                        entry.record(&died, reason);
                        tell(&runtime, &client, &died.container, entry).await;
                    }
                    Some(Err(err)) => {
                        tracing::debug!(error = %err, "the container events stopped; following them again");
                        break;
                    }
                    None => break,
                },
                _ = check.tick() => {
                    let present: Vec<String> = match runtime.instance_containers().await {
                        Ok(containers) => containers.into_iter().map(|c| c.id).collect(),
                        Err(_) => continue,
                    };
                    stops.retain(|id, _| present.contains(id));
                    for (id, entry) in stops.iter_mut() {
                        tell(&runtime, &client, id, entry).await;
                    }
                }
            }
        }
        tokio::time::sleep(RECONNECT_AFTER).await;
    }
}

/// Tells the control plane a change of verdict, if there is one.
async fn tell(runtime: &DockerRuntime, client: &ControlPlane, container: &str, entry: &mut Stops) {
    let Some(looping) = entry.due(now_nanos()) else {
        return;
    };
    let last_lines = if looping {
        runtime
            .logs(container, CRASH_LOOP_LINES)
            .await
            .map(|lines| lines.into_iter().map(|(_, line)| line).collect())
            .unwrap_or_default()
    } else {
        Vec::new()
    };
    let mut crash_loop = CrashLoop {
        looping,
        restarts: entry.at.len() as u32,
        exit_code: entry.exit_code,
        reason: entry.reason.clone(),
        last_lines,
    };
    if !looping {
        crash_loop.exit_code = None;
        crash_loop.reason = None;
    }
    let mut report = cloudweb_protocol::Report::new(entry.deployment.clone());
    report.instance = Some(entry.instance);
    report.crash_loop = Some(crash_loop);
    report.sanitize();
    match client.report(&report).await {
        Ok(()) => {
            if looping {
                tracing::warn!(
                    container,
                    restarts = entry.at.len(),
                    reason = entry.reason.as_deref().unwrap_or(""),
                    "crash-looping: the container keeps stopping"
                );
            } else {
                tracing::info!(container, "no longer crash-looping");
            }
            entry.told = Some(looping);
        }
        Err(err) if err.is_permanent() => {
            tracing::warn!(container, error = %err, "the crash loop report was refused");
            entry.told = Some(looping);
        }
        Err(err) => {
            tracing::warn!(container, error = %err, "could not report the crash loop; trying again")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn died(at_seconds: i64, code: i64) -> Died {
        Died {
            container: "c".into(),
            deployment: "d".into(),
            instance: 1,
            exit_code: Some(code),
            at_nanos: at_seconds * 1_000_000_000,
        }
    }

    #[test]
    fn three_stops_in_the_window_loop_and_a_quiet_window_ends_it() {
        let mut stops = Stops::default();
        let s = 1_000_000_000;
        stops.record(&died(0, 1), None);
        assert_eq!(stops.due(s), None, "one stop is not a loop");
        stops.record(&died(100, 1), None);
        stops.record(
            &died(200, 3),
            Some("liveness probe: no answer on / within 1 s".into()),
        );
        assert_eq!(stops.due(200 * s), Some(true));
        assert_eq!(
            stops.reason.as_deref(),
            Some("liveness probe: no answer on / within 1 s")
        );
        assert_eq!(stops.exit_code, Some(3));
        stops.told = Some(true);
        assert_eq!(stops.due(300 * s), None, "told once");
        // The first stop leaves the window: two are left, not quiet yet.
        assert_eq!(stops.due(650 * s), None);
        assert_eq!(
            stops.due(801 * s),
            Some(false),
            "a whole window without a stop"
        );
        stops.told = Some(false);
        stops.record(&died(900, 1), None);
        assert_eq!(stops.reason.as_deref(), Some("exited with code 1"));
        assert_eq!(stops.due(900 * s), None);
    }

    #[test]
    fn stops_spread_over_more_than_the_window_are_no_loop() {
        let mut stops = Stops::default();
        let s = 1_000_000_000;
        for at in [0, 400, 800, 1200] {
            stops.record(&died(at, 1), None);
            assert_eq!(stops.due(at * s), None, "at {at}");
        }
    }
}
