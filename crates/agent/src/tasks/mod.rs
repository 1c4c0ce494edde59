//! Task runs on this node (see `cloudweb_protocol::tasks`): one-off
//! containers of an app's image that run a command to its end, for a
//! scheduled job's tick or `cloudweb run`.
//!
//! - `task_run` ([`Tasks::run_command`]): the image is pulled when the
//!   node lacks it (the cluster registry's credentials, tried again while
//!   the registry restarts, as a deploy pulls), the container
//!   `cloudweb-task-<run id>` is created and started ([`start`]), and the
//!   command is acked. A task of its own then follows the container
//!   ([`drive`]): `running` reports carry its output lines about once a
//!   second, and once it exits (or is killed at its time limit, or by
//!   `task_cancel`) the final report goes out, and then the container is
//!   removed.
//! - Each run has a slot here while anything works on it (starting,
//!   waiting, cancelling). A command for a run that has one changes
//!   nothing, so a command delivered again while its run is waited for is
//!   a no-op.
//! - A run's container is its record while it runs: a command delivered
//!   again, or an agent that starts, finds it by name or by its labels and
//!   waits for it (with the time left of its limit, counted from the
//!   container's start), reading its output again from the first line
//!   (the control plane ignores the numbers it has). [`Tasks::sweep`] does
//!   that for every task container nothing waits for, at start and every
//!   minute after.
//! - Its final report is kept in `<data>/task-runs/<run id>.json`
//!   ([`store`]) before it is sent: a run that ended is reported again,
//!   never run again, and a report the control plane did not take goes
//!   out again every minute.
//! - A `task_cancel` for a run this node has not seen (its `task_run` may
//!   still be on its way, or waiting to be tried again) records the run
//!   `cancelled`, so a `task_run` that comes later does not start it.
//!
//! No variable value is logged, and the output lines and messages sent
//! have the app's variable values redacted, as runtime logs do.

mod drive;
mod lines;
mod start;
pub mod store;

#[cfg(test)]
mod tests;

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cloudweb_protocol::{TaskCancelPayload, TaskRunPayload, TaskRunReport, TaskState};
use futures_util::future::BoxFuture;
use tokio::sync::watch;

use crate::client::ControlPlane;
use crate::deploy::RegistryError;
use crate::runtime::{DockerRuntime, RegistryAuth, RuntimeError, TaskContainer};

use self::store::{Finished, Store};

/// How long a `task_run` that cannot be carried out for a passing reason
/// (the Docker Engine or the control plane does not answer) is tried
/// again before the run is reported `failed`, like a deploy.
pub const START_RETRY_LIMIT: Duration = Duration::from_secs(30 * 60);
/// How often [`Tasks::housekeeping`] looks for task containers nothing
/// waits for and sends the final reports again that did not go out.
pub const SWEEP_INTERVAL: Duration = Duration::from_secs(60);
/// Tries of a final report (and of the last batches of lines before it)
/// before it waits for the next sweep.
const REPORT_TRIES: u32 = 5;
/// How long one report may take.
const REPORT_TIMEOUT: Duration = Duration::from_secs(30);

/// Why a report did not go out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReportError {
    /// The control plane refused it for good (a 4xx): sending it again is
    /// pointless.
    pub permanent: bool,
    pub message: String,
}

impl std::fmt::Display for ReportError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// What runs need of the control plane: where reports go and the cluster
/// registry's credentials. The control plane, or a test's recorder.
pub trait Reporter: Send + Sync + 'static {
    fn report<'a>(&'a self, run_id: &'a str, report: &'a TaskRunReport) -> BoxFuture<'a, Result<(), ReportError>>;
    /// The cluster registry's credentials, `None` without one.
    fn registry(&self) -> BoxFuture<'_, Result<Option<RegistryAuth>, RegistryError>>;
}

/// The control plane as [`Reporter`].
pub struct Link {
    client: Arc<ControlPlane>,
    /// Docker's per-registry certificate directory (the registry's CA goes
    /// there before a pull).
    docker_certs_dir: PathBuf,
}

impl Link {
    pub fn new(client: Arc<ControlPlane>, docker_certs_dir: PathBuf) -> Link {
        Link { client, docker_certs_dir }
    }
}

impl Reporter for Link {
    fn report<'a>(&'a self, run_id: &'a str, report: &'a TaskRunReport) -> BoxFuture<'a, Result<(), ReportError>> {
        Box::pin(async move {
            self.client.task_run(run_id, report).await.map_err(|e| ReportError { permanent: e.is_permanent(), message: e.to_string() })
        })
    }

    fn registry(&self) -> BoxFuture<'_, Result<Option<RegistryAuth>, RegistryError>> {
        Box::pin(crate::deploy::cluster_registry(&self.client, &self.docker_certs_dir))
    }
}

/// What became of a task command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Taken {
    /// The container was created and started now.
    Started,
    /// A container of the run was there (a command delivered again, an
    /// agent restarted): it is waited for.
    Adopted,
    /// Something here works on the run already: the command changes nothing.
    Busy,
    /// The run ended before: its final report was sent again.
    Finished,
    /// It could not start: reported `failed`.
    Failed,
    /// `task_cancel`: the run is being stopped, or was recorded cancelled.
    Cancelled,
    /// The payload is wrong: dropped (reported `failed` when it names a run).
    Invalid(String),
    /// Not now (the Docker Engine is down): the command stays queued.
    Retry(String),
}

/// What works on a run now.
enum Slot {
    /// Its `task_run` or its waiting; a cancel sends its reason here.
    Run(watch::Sender<Option<String>>),
    /// A `task_cancel` of a run nothing else worked on.
    Cancelling,
}

#[derive(Clone)]
pub struct Tasks {
    inner: Arc<Inner>,
}

struct Inner {
    runtime: DockerRuntime,
    reporter: Arc<dyn Reporter>,
    store: Store,
    slots: Mutex<HashMap<String, Slot>>,
    /// Runs whose final report did not go out yet.
    unsent: Mutex<HashSet<String>>,
    /// Final reports being sent now (so a sweep does not send one twice).
    sending: Mutex<HashSet<String>>,
    /// When each run's `task_run` first had to be tried again.
    retrying: Mutex<HashMap<String, Instant>>,
}

/// A run's slot, released when dropped (also when the work on it panics).
pub(crate) struct Claim {
    tasks: Tasks,
    run_id: String,
}

impl Drop for Claim {
    fn drop(&mut self) {
        self.tasks.inner.slots.lock().expect("slots lock").remove(&self.run_id);
    }
}

impl Tasks {
    pub fn new(runtime: DockerRuntime, data_dir: &Path, reporter: Arc<dyn Reporter>) -> Tasks {
        let store = Store::new(data_dir);
        let unsent = store.unsent().into_iter().collect();
        Tasks {
            inner: Arc::new(Inner {
                runtime,
                reporter,
                store,
                slots: Mutex::new(HashMap::new()),
                unsent: Mutex::new(unsent),
                sending: Mutex::new(HashSet::new()),
                retrying: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// Takes the run's slot for its `task_run` or its waiting; `None` when
    /// something works on it already.
    fn claim(&self, run_id: &str) -> Option<(Claim, watch::Receiver<Option<String>>)> {
        let mut slots = self.inner.slots.lock().expect("slots lock");
        if slots.contains_key(run_id) {
            return None;
        }
        let (sender, receiver) = watch::channel(None);
        slots.insert(run_id.to_string(), Slot::Run(sender));
        Some((Claim { tasks: self.clone(), run_id: run_id.to_string() }, receiver))
    }

    /// Whether something works on the run now.
    pub fn is_busy(&self, run_id: &str) -> bool {
        self.inner.slots.lock().expect("slots lock").contains_key(run_id)
    }

    /// `task_run`.
    pub async fn run_command(&self, payload: serde_json::Value) -> Taken {
        let parsed = serde_json::from_value::<TaskRunPayload>(payload.clone()).map_err(|e| e.to_string());
        let payload = match parsed.and_then(|p| p.validate().map(|()| p).map_err(|e| e.to_string())) {
            Ok(payload) => payload,
            Err(reason) => {
                self.fail_unstarted(&payload, format!("the agent refused the task: {reason}")).await;
                return Taken::Invalid(reason);
            }
        };
        let run_id = payload.run_id.clone();
        let Some((claim, cancel)) = self.claim(&run_id) else {
            tracing::info!(run_id, "the task run is being waited for already; the command changes nothing");
            return Taken::Busy;
        };
        // Looked at once the slot is held: a run's waiting keeps its slot
        // until its final report is recorded, so a run that ended is seen.
        if let Some(finished) = self.inner.store.get(&run_id) {
            drop(claim);
            tracing::info!(run_id, state = finished.report.state.as_str(), "the task run ended before; its final report is sent again");
            self.resend(&run_id, finished);
            return Taken::Finished;
        }
        let taken = start::start(self, claim, cancel, &payload).await;
        if !matches!(taken, Taken::Retry(_)) {
            self.inner.retrying.lock().expect("retry lock").remove(&run_id);
        }
        taken
    }

    /// A `task_run` that cannot be carried out at all (its payload is
    /// wrong, or handling it panicked): its run is reported `failed` with
    /// `message` when the payload names one that nothing works on and that
    /// did not end before. The message names no variable's value.
    pub async fn fail_unstarted(&self, payload: &serde_json::Value, message: String) {
        let run_id = payload.get("run_id").and_then(|v| v.as_str()).filter(|id| cloudweb_protocol::tasks::run_id(id).is_ok());
        let Some(run_id) = run_id else { return };
        let Some((claim, _)) = self.claim(run_id) else { return };
        if self.inner.store.get(run_id).is_none() {
            self.conclude(run_id, final_report(TaskState::Failed, None, Some(message)), &crate::redact::Redactor::default()).await;
        }
        drop(claim);
    }

    /// A `task_run` that could not be carried out now: tried again, until
    /// it has been for [`START_RETRY_LIMIT`]; then the run is reported
    /// `failed`. Called while the run's slot is held.
    async fn retry(&self, run_id: &str, reason: String) -> Taken {
        let first = *self.inner.retrying.lock().expect("retry lock").entry(run_id.to_string()).or_insert_with(Instant::now);
        if first.elapsed() < START_RETRY_LIMIT {
            return Taken::Retry(reason);
        }
        self.inner.retrying.lock().expect("retry lock").remove(run_id);
        tracing::error!(run_id, %reason, "giving up on a task run that could not start for {} minutes", START_RETRY_LIMIT.as_secs() / 60);
        let message = format!("the agent could not start the task within {} minutes: {reason}", START_RETRY_LIMIT.as_secs() / 60);
        self.conclude(run_id, final_report(TaskState::Failed, None, Some(message)), &crate::redact::Redactor::default()).await;
        Taken::Failed
    }

    /// `task_cancel`.
    pub async fn cancel_command(&self, payload: serde_json::Value) -> Taken {
        let parsed = serde_json::from_value::<TaskCancelPayload>(payload).map_err(|e| e.to_string());
        let payload = match parsed.and_then(|p| p.validate().map(|()| p).map_err(|e| e.to_string())) {
            Ok(payload) => payload,
            Err(reason) => return Taken::Invalid(reason),
        };
        let run_id = payload.run_id.as_str();
        let reason = payload.reason.clone().filter(|r| !r.trim().is_empty()).unwrap_or_else(|| "cancelled".to_string());
        let claim = {
            let mut slots = self.inner.slots.lock().expect("slots lock");
            match slots.get(run_id) {
                Some(Slot::Run(cancel)) => {
                    tracing::info!(run_id, "cancelling the task run");
                    cancel.send_replace(Some(reason));
                    return Taken::Cancelled;
                }
                Some(Slot::Cancelling) => return Taken::Busy,
                None => {
                    slots.insert(run_id.to_string(), Slot::Cancelling);
                    Claim { tasks: self.clone(), run_id: run_id.to_string() }
                }
            }
        };
        if let Some(finished) = self.inner.store.get(run_id) {
            drop(claim);
            tracing::info!(run_id, state = finished.report.state.as_str(), "the task run had ended; nothing to cancel");
            self.resend(run_id, finished);
            return Taken::Finished;
        }
        match self.inner.runtime.task_container(run_id).await {
            Err(err) => Taken::Retry(format!("cannot look for the task's container: {err}")),
            Ok(Some(container)) if container.ours => {
                // Nothing waits for it (the sweep has not found it yet):
                // it is waited for now, cancelled from the start. The
                // claim keeps the slot, now a run's.
                let (sender, cancel) = watch::channel(Some(reason));
                self.inner.slots.lock().expect("slots lock").insert(run_id.to_string(), Slot::Run(sender));
                match start::adopt(self, claim, cancel, container, None).await {
                    Ok(_) => Taken::Cancelled,
                    Err((_claim, reason)) => Taken::Retry(reason),
                }
            }
            Ok(Some(_)) => {
                tracing::warn!(run_id, "the container named after the task run is not this node's; not touching it");
                Taken::Cancelled
            }
            Ok(None) => {
                tracing::info!(run_id, "the task run has not started here; it is recorded cancelled so that it never starts");
                self.conclude(run_id, final_report(TaskState::Cancelled, None, Some(reason)), &crate::redact::Redactor::default()).await;
                drop(claim);
                Taken::Cancelled
            }
        }
    }

    /// Keeps a run's final report, then sends it (a few tries). Called
    /// while the run's slot is held, so that whoever takes the slot next
    /// finds the record.
    async fn conclude(&self, run_id: &str, mut report: TaskRunReport, redactor: &crate::redact::Redactor) {
        report.message = report.message.map(|m| cloudweb_protocol::misc::one_line(&redactor.apply(&m), cloudweb_protocol::tasks::MAX_MESSAGE_BYTES));
        tracing::info!(run_id, state = report.state.as_str(), exit_code = ?report.exit_code, message = ?report.message, "task run ended");
        let finished = Finished { finished_ms: crate::timestamp::now_ms(), sent: false, report };
        if let Err(err) = self.inner.store.put(run_id, &finished) {
            tracing::warn!(run_id, error = %err, "could not keep the task run's final report; a command delivered again would find no record of it");
        }
        self.inner.unsent.lock().expect("unsent lock").insert(run_id.to_string());
        self.deliver(run_id, finished).await;
    }

    /// Sends a kept final report, unless it is being sent already; true
    /// once it is settled (taken, or refused for good).
    async fn deliver(&self, run_id: &str, finished: Finished) -> bool {
        if !self.inner.sending.lock().expect("sending lock").insert(run_id.to_string()) {
            return false;
        }
        let result = send_with_tries(self.inner.reporter.as_ref(), run_id, &finished.report, REPORT_TRIES).await;
        self.inner.sending.lock().expect("sending lock").remove(run_id);
        let settled = match result {
            Ok(()) => true,
            Err(err) if err.permanent => {
                tracing::warn!(run_id, error = %err, "the control plane refused the task run's final report; it is not sent again");
                true
            }
            Err(err) => {
                tracing::warn!(run_id, error = %err, "could not send the task run's final report; it goes again at the next sweep");
                false
            }
        };
        if settled {
            if !finished.sent {
                self.inner.store.mark_sent(run_id);
            }
            self.inner.unsent.lock().expect("unsent lock").remove(run_id);
        }
        settled
    }

    /// Sends a kept final report again, in the background.
    fn resend(&self, run_id: &str, finished: Finished) {
        let (tasks, run_id) = (self.clone(), run_id.to_string());
        tokio::spawn(async move {
            tasks.deliver(&run_id, finished).await;
        });
    }

    /// Waits for every task container of this node that nothing waits for
    /// (left by an earlier agent, or not found when its command came),
    /// removes those of runs already reported, sends again the final
    /// reports that did not go out, and forgets old ones.
    pub async fn sweep(&self) {
        match self.inner.runtime.task_containers().await {
            Ok(found) => {
                for (id, run_id) in found {
                    if cloudweb_protocol::tasks::run_id(&run_id).is_err() {
                        continue;
                    }
                    let Some((claim, cancel)) = self.claim(&run_id) else { continue };
                    if self.inner.store.get(&run_id).is_some() {
                        // Reported; its waiting stopped before the removal.
                        if let Err(err) = self.inner.runtime.kill_and_remove(&id).await {
                            tracing::warn!(run_id, error = %err, "could not remove the container of a task run that ended");
                        }
                        continue;
                    }
                    match self.inner.runtime.inspect_task(&id, &run_id).await {
                        Ok(Some(container)) if container.ours => {
                            tracing::info!(run_id, status = %container.status, "found a task container nothing waits for; waiting for it");
                            if let Err((_claim, reason)) = start::adopt(self, claim, cancel, container, None).await {
                                tracing::warn!(run_id, %reason, "could not wait for a task container; trying again at the next sweep");
                            }
                        }
                        Ok(_) => {}
                        Err(err) => tracing::warn!(run_id, error = %err, "could not inspect a task container"),
                    }
                }
            }
            Err(err) => tracing::warn!(error = %err, "could not list the task containers; looking again at the next sweep"),
        }
        let unsent: Vec<String> = self.inner.unsent.lock().expect("unsent lock").iter().cloned().collect();
        for run_id in unsent {
            if self.is_busy(&run_id) {
                continue;
            }
            match self.inner.store.get(&run_id) {
                Some(finished) if !finished.sent => self.resend(&run_id, finished),
                _ => {
                    self.inner.unsent.lock().expect("unsent lock").remove(&run_id);
                }
            }
        }
        let pruned = self.inner.store.prune(std::time::SystemTime::now());
        if pruned > 0 {
            tracing::debug!(pruned, "forgot old task run reports");
        }
    }

    /// Sweeps every [`SWEEP_INTERVAL`] until the task is aborted.
    pub async fn housekeeping(self) {
        loop {
            tokio::time::sleep(SWEEP_INTERVAL).await;
            self.sweep().await;
        }
    }
}

/// A final report with no lines yet.
fn final_report(state: TaskState, exit_code: Option<i64>, message: Option<String>) -> TaskRunReport {
    TaskRunReport { state, exit_code, message, lines: Vec::new() }
}

/// Sends a report up to `tries` times, pausing longer after each failure;
/// stops at a refusal for good.
async fn send_with_tries(reporter: &dyn Reporter, run_id: &str, report: &TaskRunReport, tries: u32) -> Result<(), ReportError> {
    let mut attempt = 1;
    loop {
        let result = match tokio::time::timeout(REPORT_TIMEOUT, reporter.report(run_id, report)).await {
            Ok(result) => result,
            Err(_) => Err(ReportError { permanent: false, message: format!("no answer within {} s", REPORT_TIMEOUT.as_secs()) }),
        };
        match result {
            Ok(()) => return Ok(()),
            Err(err) if err.permanent || attempt >= tries => return Err(err),
            Err(err) => {
                tracing::debug!(run_id, attempt, error = %err, "could not report the task run; trying again");
                tokio::time::sleep(retry_pause(attempt)).await;
                attempt += 1;
            }
        }
    }
}

/// The pause after the `attempt`th failed report: 1, 2, 4, 8 s, then 30 s
/// at most (milliseconds in tests).
fn retry_pause(attempt: u32) -> Duration {
    let seconds = 1u64 << attempt.saturating_sub(1).min(5);
    let pause = Duration::from_secs(seconds.min(30));
    if cfg!(test) {
        pause / 100
    } else {
        pause
    }
}

/// How much of a run's time limit is left at `now`, counted from the
/// container's start (`started_at`, RFC 3339). A start that cannot be
/// read, or one in the future (clocks), leaves the whole limit.
pub fn remaining(timeout_seconds: u32, started_at: Option<&str>, now: time::OffsetDateTime) -> Duration {
    let limit = Duration::from_secs(u64::from(timeout_seconds));
    let Some(started) = started_at.and_then(|at| time::OffsetDateTime::parse(at, &time::format_description::well_known::Rfc3339).ok()) else {
        return limit;
    };
    let elapsed = now - started;
    if elapsed.is_negative() {
        return limit;
    }
    limit.saturating_sub(Duration::try_from(elapsed).unwrap_or(Duration::MAX))
}

/// What to do with what the Engine has under a run's container name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    /// Nothing there: create and start it.
    Create,
    /// Not this node's container of this run: leave it alone.
    Foreign,
    /// Created, never started (an agent stopped between the two): start it.
    Start,
    /// Running (or paused): wait for it.
    Wait,
    /// It ran and exited: report how.
    Settle,
    /// Docker could not start it: report that.
    NeverStarted(String),
}

pub fn plan(found: Option<&TaskContainer>) -> Plan {
    let Some(container) = found else { return Plan::Create };
    if !container.ours {
        return Plan::Foreign;
    }
    match container.status.as_str() {
        "created" => match &container.error {
            Some(error) => Plan::NeverStarted(error.clone()),
            None => Plan::Start,
        },
        "running" | "paused" | "restarting" => Plan::Wait,
        // exited, dead, removing
        _ if container.started_at.is_none() => {
            Plan::NeverStarted(container.error.clone().unwrap_or_else(|| "the container never started".to_string()))
        }
        _ => Plan::Settle,
    }
}

/// An error that passes (the Engine does not answer): try again later.
fn is_transient(err: &RuntimeError) -> bool {
    err.is_transient()
}
