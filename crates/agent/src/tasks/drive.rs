//! Waiting for a run's container: its output followed and sent in
//! `running` reports (at most one in flight, about once a second, a
//! growing pause after failures, never holding up the waiting), the
//! container stopped at its time limit or on a cancel, and once it ended
//! the rest of its output, the final report and the container's removal.
//! The run's slot is held throughout, and released last.

use std::sync::Arc;
use std::time::Duration;

use cloudweb_protocol::tasks::MAX_REPORT_LINES;
use cloudweb_protocol::{TaskLine, TaskRunReport, TaskState};
use futures_util::future::BoxFuture;
use futures_util::stream::BoxStream;
use futures_util::StreamExt;
use tokio::sync::watch;

use super::lines::Lines;
use super::{final_report, retry_pause, send_with_tries, Claim, ReportError, Reporter, Tasks, REPORT_TIMEOUT, REPORT_TRIES};
use crate::redact::Redactor;
use crate::runtime::{DockerRuntime, OutputLine, RuntimeError};

/// Pace of `running` reports.
const REPORT_INTERVAL: Duration = Duration::from_secs(1);
/// How long the output of a container that stopped may take to be read
/// to its end.
const DRAIN_LIMIT: Duration = Duration::from_secs(10);
/// Seconds a task gets to exit after SIGTERM, at its time limit or on a
/// cancel, before Docker kills it.
const STOP_GRACE_SECONDS: i32 = 10;
/// Longest pause before the output or the wait is taken up again after
/// the Engine dropped it.
const MAX_PAUSE: Duration = Duration::from_secs(30);

/// A run's container to wait for.
pub(super) struct Watch {
    pub container_id: String,
    /// The run's variables, kept out of its lines and messages.
    pub redactor: Redactor,
    /// When it must be stopped; `None` when it had exited when found.
    pub deadline: Option<tokio::time::Instant>,
    pub timeout_seconds: u32,
    pub memory_bytes: Option<u64>,
    /// A `running` report is owed (not for a run found ended).
    pub report_running: bool,
}

/// How the container's run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Ended {
    Exited(i64),
    /// Removed by someone else before it ended.
    Gone,
    TimedOut,
    Cancelled(String),
}

pub(super) async fn drive(tasks: Tasks, claim: Claim, mut cancel: watch::Receiver<Option<String>>, watch: Watch) {
    let run_id = claim.run_id.clone();
    let runtime = tasks.inner.runtime.clone();
    let id = watch.container_id.clone();
    let mut lines = Lines::default();
    let mut output = Output::new(runtime.clone(), id.clone());
    let mut sender = Sender::new(tasks.inner.reporter.clone(), run_id.clone(), watch.report_running);
    let ended_before = watch.deadline.is_none();
    // Far enough never to come: the branch is off then anyway.
    let deadline = watch.deadline.unwrap_or_else(|| tokio::time::Instant::now() + Duration::from_secs(100 * 365 * 24 * 3600));
    let mut wait = Box::pin(wait_exit(runtime.clone(), id.clone(), run_id.clone()));
    let mut tick = tokio::time::interval(REPORT_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let ended = loop {
        tokio::select! {
            // The end first; then the reports, whose pace must hold
            // while the output floods.
            biased;
            ended = &mut wait => break ended,
            reason = cancel_reason(&mut cancel), if !ended_before => {
                tracing::info!(run_id, "stopping the task's container: cancelled");
                stop(&runtime, &id, &run_id).await;
                break Ended::Cancelled(reason);
            }
            () = tokio::time::sleep_until(deadline), if !ended_before => {
                tracing::info!(run_id, timeout_seconds = watch.timeout_seconds, "stopping the task's container: its time is up");
                stop(&runtime, &id, &run_id).await;
                break Ended::TimedOut;
            }
            (result, batch) = sender.in_flight() => sender.settle(result, batch, &mut lines),
            _ = tick.tick() => sender.send_due(&mut lines),
            line = output.next() => push(&mut lines, &watch.redactor, line),
        }
    };
    drop(wait);
    if ended == Ended::Gone && crate::shutdown::requested() {
        // The node was removed and its containers with it: nobody to
        // report to, and no run of it to settle.
        return;
    }
    sender.finish(&mut lines).await;
    output.drain(DRAIN_LIMIT, |line| push(&mut lines, &watch.redactor, line)).await;
    let oom_killed = match ended {
        Ended::Exited(code) if code != 0 => runtime.inspect_task(&id, &run_id).await.ok().flatten().is_some_and(|c| c.oom_killed),
        _ => false,
    };
    if lines.dropped() > 0 {
        tracing::info!(run_id, dropped = lines.dropped(), numbered = lines.numbered(), "output lines of the task run were dropped unsent (more than the reports could carry)");
    }
    // Lines beyond one report go first, in `running` reports; when those
    // do not go out, the last ones go with the final report.
    while !sender.refused && !lines.fits_one_report() {
        let report = TaskRunReport { state: TaskState::Running, exit_code: None, message: None, lines: lines.take(MAX_REPORT_LINES) };
        if let Err(err) = send_with_tries(tasks.inner.reporter.as_ref(), &run_id, &report, REPORT_TRIES).await {
            tracing::warn!(run_id, error = %err, "could not send the task run's last output lines");
            lines.put_back(report.lines);
            break;
        }
    }
    lines.keep_fitting();
    let (state, exit_code, message) = outcome(&ended, oom_killed, watch.timeout_seconds, watch.memory_bytes);
    let mut report = final_report(state, exit_code, message);
    report.lines = lines.take(MAX_REPORT_LINES);
    tasks.conclude(&run_id, report, &watch.redactor).await;
    if ended != Ended::Gone {
        remove_container(&runtime, &id, &run_id).await;
    }
    drop(claim);
}

/// The final state, exit code and message of a run that ended so.
pub(super) fn outcome(ended: &Ended, oom_killed: bool, timeout_seconds: u32, memory_bytes: Option<u64>) -> (TaskState, Option<i64>, Option<String>) {
    match ended {
        Ended::Exited(0) => (TaskState::Succeeded, Some(0), None),
        Ended::Exited(code) if oom_killed => {
            let limit = memory_bytes.map(|m| format!(" (its limit is {} MiB)", m / (1024 * 1024))).unwrap_or_default();
            (TaskState::Failed, Some(*code), Some(format!("ran out of memory{limit} and was killed")))
        }
        Ended::Exited(code) => (TaskState::Failed, Some(*code), Some(format!("exited with code {code}"))),
        Ended::Gone => (TaskState::Failed, None, Some("the task's container was removed before it ended, by something other than the agent".to_string())),
        Ended::TimedOut => (TaskState::TimedOut, None, Some(format!("stopped at its time limit of {timeout_seconds} s"))),
        Ended::Cancelled(reason) => (TaskState::Cancelled, None, Some(reason.clone())),
    }
}

fn push(lines: &mut Lines, redactor: &Redactor, (stream, at, text): OutputLine) {
    lines.push(stream == "stderr", &at, redactor.apply(&text));
}

/// Resolves with a cancel's reason; never when none can come any more.
async fn cancel_reason(cancel: &mut watch::Receiver<Option<String>>) -> String {
    let reason = cancel.wait_for(Option::is_some).await.map(|reason| reason.clone().unwrap_or_default());
    match reason {
        Ok(reason) => reason,
        Err(_) => std::future::pending().await,
    }
}

/// Waits until the container no longer runs. A wait the Engine drops (it
/// restarted) is taken up again, after a look at the container.
async fn wait_exit(runtime: DockerRuntime, id: String, run_id: String) -> Ended {
    let mut pause = Duration::from_secs(1);
    loop {
        let err = match runtime.wait_task(&id).await {
            Ok(code) => return Ended::Exited(code),
            Err(err) => err,
        };
        match runtime.inspect_task(&id, &run_id).await {
            Ok(None) => return Ended::Gone,
            Ok(Some(container)) if !container.running && container.started_at.is_some() => return Ended::Exited(container.exit_code.unwrap_or(-1)),
            _ => {}
        }
        tracing::warn!(run_id, error = %err, "lost the wait for the task's container; waiting again in {} s", pause.as_secs());
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(MAX_PAUSE);
    }
}

/// Stops the container (SIGTERM, then SIGKILL after the grace period), a
/// few tries; one that stays is killed by its removal.
async fn stop(runtime: &DockerRuntime, id: &str, run_id: &str) {
    for attempt in 1..=3 {
        match runtime.stop_within(id, STOP_GRACE_SECONDS).await {
            Ok(_) => return,
            Err(err) if err.is_not_found() => return,
            Err(err) => {
                tracing::warn!(run_id, attempt, error = %err, "could not stop the task's container");
                tokio::time::sleep(retry_pause(attempt)).await;
            }
        }
    }
}

/// Removes a run's container, a few tries; one that stays is removed by
/// a later sweep (its run has a record by then).
pub(super) async fn remove_container(runtime: &DockerRuntime, id: &str, run_id: &str) {
    for attempt in 1..=3 {
        match runtime.kill_and_remove(id).await {
            Ok(()) => return,
            Err(err) => {
                tracing::warn!(run_id, attempt, error = %err, "could not remove the task's container");
                tokio::time::sleep(retry_pause(attempt)).await;
            }
        }
    }
}

/// A report on its way: its outcome and its lines (back when it failed).
type InFlight = BoxFuture<'static, (Result<(), ReportError>, Vec<TaskLine>)>;

/// The `running` reports of one run.
pub(super) struct Sender {
    reporter: Arc<dyn Reporter>,
    run_id: String,
    in_flight: Option<InFlight>,
    /// A `running` report is owed even without lines (the first one).
    owe_running: bool,
    next_at: tokio::time::Instant,
    failures: u32,
    /// The control plane refused one for good: no more are sent, and the
    /// lines wait for the final report.
    pub refused: bool,
}

impl Sender {
    pub fn new(reporter: Arc<dyn Reporter>, run_id: String, owe_running: bool) -> Sender {
        Sender { reporter, run_id, in_flight: None, owe_running, next_at: tokio::time::Instant::now(), failures: 0, refused: false }
    }

    /// Sends the waiting lines (a batch) when a report is due and none is
    /// in flight.
    pub fn send_due(&mut self, lines: &mut Lines) {
        if self.in_flight.is_some() || self.refused || tokio::time::Instant::now() < self.next_at || (lines.is_empty() && !self.owe_running) {
            return;
        }
        let report = TaskRunReport { state: TaskState::Running, exit_code: None, message: None, lines: lines.take(MAX_REPORT_LINES) };
        let (reporter, run_id) = (self.reporter.clone(), self.run_id.clone());
        self.in_flight = Some(Box::pin(async move {
            let result = match tokio::time::timeout(REPORT_TIMEOUT, reporter.report(&run_id, &report)).await {
                Ok(result) => result,
                Err(_) => Err(ReportError { permanent: false, message: format!("no answer within {} s", REPORT_TIMEOUT.as_secs()) }),
            };
            (result, report.lines)
        }));
    }

    /// The report in flight's end; never while none is.
    pub async fn in_flight(&mut self) -> (Result<(), ReportError>, Vec<TaskLine>) {
        match &mut self.in_flight {
            Some(report) => report.await,
            None => std::future::pending().await,
        }
    }

    /// Takes note of the report's end; its lines go back when it failed.
    pub fn settle(&mut self, result: Result<(), ReportError>, batch: Vec<TaskLine>, lines: &mut Lines) {
        self.in_flight = None;
        match result {
            Ok(()) => {
                self.owe_running = false;
                self.failures = 0;
            }
            Err(err) => {
                lines.put_back(batch);
                if err.permanent {
                    tracing::warn!(run_id = %self.run_id, error = %err, "the control plane refused a running report of the task run; its last lines go with the final report");
                    self.refused = true;
                    return;
                }
                self.failures += 1;
                if self.failures == 1 || self.failures.is_multiple_of(20) {
                    tracing::warn!(run_id = %self.run_id, failures = self.failures, error = %err, "could not send a running report of the task run; trying again");
                }
                self.next_at = tokio::time::Instant::now() + retry_pause(self.failures);
            }
        }
    }

    /// Waits for the report in flight, if any.
    pub async fn finish(&mut self, lines: &mut Lines) {
        if self.in_flight.is_some() {
            let (result, batch) = self.in_flight().await;
            self.settle(result, batch, lines);
        }
    }
}

/// A container's output from its first line. A follow the Engine ends
/// while the container runs (it restarted) is opened again and skips the
/// lines read before, so the numbering holds.
struct Output {
    runtime: DockerRuntime,
    id: String,
    stream: Option<BoxStream<'static, Result<OutputLine, RuntimeError>>>,
    /// Lines taken so far.
    read: u64,
    /// Lines of the current follow still to skip.
    skip: u64,
    /// The last follow came to its end (the container stopped and every
    /// line was read).
    at_end: bool,
    pause: Duration,
}

impl Output {
    fn new(runtime: DockerRuntime, id: String) -> Output {
        Output { runtime, id, stream: None, read: 0, skip: 0, at_end: false, pause: Duration::from_secs(1) }
    }

    fn open(&mut self) -> Result<(), RuntimeError> {
        self.stream = Some(Box::pin(self.runtime.follow_whole_output(&self.id)?));
        self.skip = self.read;
        self.at_end = false;
        Ok(())
    }

    /// A line not taken before, or `None` for one to skip.
    fn take(&mut self, line: OutputLine) -> Option<OutputLine> {
        if self.skip > 0 {
            self.skip -= 1;
            return None;
        }
        self.read += 1;
        Some(line)
    }

    /// The next line; while the follow is down it is opened again after a
    /// growing pause.
    async fn next(&mut self) -> OutputLine {
        loop {
            if self.stream.is_none() {
                if let Err(err) = self.open() {
                    tracing::debug!(container = %self.id, error = %err, "cannot follow the task's output");
                    self.rest().await;
                    continue;
                }
            }
            let item = self.stream.as_mut().expect("opened").next().await;
            match item {
                Some(Ok(line)) => {
                    self.pause = Duration::from_secs(1);
                    if let Some(line) = self.take(line) {
                        return line;
                    }
                }
                Some(Err(_)) => {
                    self.stream = None;
                    self.rest().await;
                }
                None => {
                    self.stream = None;
                    self.at_end = true;
                    self.rest().await;
                }
            }
        }
    }

    async fn rest(&mut self) {
        tokio::time::sleep(self.pause).await;
        self.pause = (self.pause * 2).min(MAX_PAUSE);
    }

    /// Once the container stopped: the lines not taken yet, until the
    /// follow ends, within `limit`.
    async fn drain(&mut self, limit: Duration, mut each: impl FnMut(OutputLine)) {
        let work = async {
            let mut opened = 0;
            loop {
                if self.stream.is_none() {
                    if self.at_end || opened >= 2 || self.open().is_err() {
                        return;
                    }
                    opened += 1;
                }
                let item = self.stream.as_mut().expect("opened").next().await;
                match item {
                    Some(Ok(line)) => {
                        if let Some(line) = self.take(line) {
                            each(line);
                        }
                    }
                    Some(Err(_)) => self.stream = None,
                    None => return,
                }
            }
        };
        if tokio::time::timeout(limit, work).await.is_err() {
            tracing::warn!(container = %self.id, "the task's output was not read to its end within {} s", limit.as_secs());
        }
    }
}
