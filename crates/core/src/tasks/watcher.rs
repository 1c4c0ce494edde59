//! What moves runs along: nodes' reports, and a pass every second on the
//! leader that records the scheduled jobs' ticks that are due and ends the
//! runs whose node went away or that ran past their time.

use std::sync::Arc;

use cloudweb_protocol::{CommandKind, TaskCancelPayload, TaskRunReport, TaskState};

use super::runs::{command, ended_row, prepare, RunSpec};
use super::{is_failure, KEEP_ONE_OFF_RUNS, KEEP_RUNS_PER_JOB, LOST_AFTER, RUNNING_SLACK_MS};
use crate::clock::rfc3339_ms;
use crate::cron::{self, Schedule};
use crate::error::ApiError;
use crate::store::{CronJobRow, NewCommand, TaskLineRow, TaskRunRow, Tick};
use crate::AppState;

/// How often the leader looks for due ticks and runs to end.
const PASS: std::time::Duration = std::time::Duration::from_secs(1);
/// Jobs handled in one pass, the most overdue first.
const JOBS_PER_PASS: i64 = 200;
/// How long a tick that no node can take yet waits for one (a control
/// plane that just started has not heard its nodes' features yet; a node
/// may be about to join or be undrained) before it is recorded `failed`.
const PLACEMENT_WAIT_MS: i64 = 60_000;

/// `POST /agent/v1/task-runs/{id}` from node `node_id`.
pub async fn on_report(state: &AppState, node_id: &str, run_id: &str, report: &TaskRunReport) -> Result<(), ApiError> {
    cloudweb_protocol::tasks::run_id(run_id).map_err(|e| ApiError::BadRequest(e.to_string()))?;
    report.validate().map_err(|e| ApiError::BadRequest(e.to_string()))?;
    let run = state.store.task_run(run_id).await?.ok_or_else(|| ApiError::NotFound(format!("no task run {run_id}")))?;
    if run.node_id.as_deref() != Some(node_id) {
        return Err(ApiError::Forbidden(format!("run {run_id} is not this node's")));
    }
    let lines: Vec<TaskLineRow> = report
        .lines
        .iter()
        .map(|l| TaskLineRow { seq: l.seq.min(i64::MAX as u64) as i64, at: l.at.replace('\0', ""), stderr: l.stderr, line: l.line.replace('\0', "\u{fffd}") })
        .collect();
    // Lines of a run that ended here already (cancelled, lost) are still
    // its output: kept.
    state.store.append_task_lines(run_id, &lines).await?;
    let now = state.clock.now_ms();
    if report.state == TaskState::Running {
        if state.store.start_task_run(run_id, now, now + run.timeout_s * 1000 + RUNNING_SLACK_MS).await? {
            tracing::info!(run = %run_id, app = %run.app, job = ?run.job, node_id, "task run started");
        }
        return Ok(());
    }
    let message = report.message.as_deref().map(|m| m.replace('\0', "\u{fffd}"));
    let ended = state.store.finish_task_run(run_id, report.state.as_str(), report.exit_code, message.as_deref(), None, &[], now).await?;
    if ended {
        let failed = is_failure(report.state.as_str());
        if failed {
            tracing::warn!(run = %run_id, app = %run.app, job = ?run.job, state = report.state.as_str(), exit_code = ?report.exit_code, message = ?report.message, "task run did not succeed");
        } else {
            tracing::info!(run = %run_id, app = %run.app, job = ?run.job, state = report.state.as_str(), exit_code = ?report.exit_code, "task run ended");
        }
        let keep = if run.job.is_some() { KEEP_RUNS_PER_JOB } else { KEEP_ONE_OFF_RUNS };
        state.store.prune_task_runs(&run.app, run.job.as_deref(), keep).await?;
    }
    Ok(())
}

/// The latest tick at or before `now`, from `first` on (a control plane
/// down over several ticks runs the job once, for the last of them).
fn latest_due(schedule: &Schedule, zone: &jiff::tz::TimeZone, first: i64, now: i64) -> i64 {
    let mut latest = first;
    // Bounded: a minute-by-minute job down a week is 10,080 ticks.
    for _ in 0..20_000 {
        match schedule.next_in_zone(zone, latest) {
            Some(next) if next <= now => latest = next,
            _ => break,
        }
    }
    latest
}

/// Records the due tick of `job`: its run queued, or recorded as skipped
/// or failed with why. `leading_since` (ms) is when this replica began
/// leading: a tick waits for a node from then at the earliest, since a
/// control plane that has just started has not heard its nodes yet.
async fn record_due(state: &AppState, job: &CronJobRow, now: i64, leading_since: i64) -> Result<(), ApiError> {
    let Some(first) = job.next_run_at else { return Ok(()) };
    let (schedule, zone) = match (Schedule::parse(&job.schedule), cron::zone(&job.timezone)) {
        (Ok(schedule), Ok(zone)) => (schedule, zone),
        // Checked when the job was written; a zone a newer tzdata dropped.
        (Err(e), _) | (_, Err(e)) => {
            tracing::warn!(app = %job.app, job = %job.name, error = %e, "scheduled job cannot be read; suspended");
            let mut suspended = job.clone();
            suspended.suspended = true;
            suspended.next_run_at = None;
            state.store.update_cron_job(&suspended, job.next_run_at).await?;
            return Ok(());
        }
    };
    let tick = latest_due(&schedule, &zone, first, now);
    let next = schedule.next_in_zone(&zone, now.max(tick));
    let args: Vec<String> = serde_json::from_str(&job.command).unwrap_or_default();
    let spec = RunSpec { job: Some(&job.name), trigger: "schedule", tick: Some(tick), command: &args, timeout_s: job.timeout_s, attempt: 1, avoid: Vec::new() };
    // How late the tick already was when this replica began leading: the
    // time no control plane acted on it. (A tick that came due while
    // leading waits only for a node, bounded apart.)
    let missed_by = (leading_since - tick).max(0);
    let mut commands: Vec<NewCommand> = Vec::new();
    let mut ends: Vec<(String, String)> = Vec::new();
    let run: TaskRunRow = if missed_by > job.starting_deadline_s * 1000 {
        let message = format!(
            "missed: the tick of {} was {} s past when a control plane led again, beyond its starting deadline of {} s",
            rfc3339_ms(tick),
            missed_by / 1000,
            job.starting_deadline_s
        );
        ended_row(&job.app, &spec, "skipped", &message, now)
    } else {
        let unfinished: Vec<TaskRunRow> = state.store.task_runs_of(&job.app, Some(&job.name), 50).await?.into_iter().filter(TaskRunRow::is_unfinished).collect();
        match (job.concurrency.as_str(), unfinished.first()) {
            ("forbid", Some(previous)) => {
                ended_row(&job.app, &spec, "skipped", &format!("the previous run {} is unfinished (concurrency forbid)", previous.id), now)
            }
            _ => {
                let Some(app) = state.store.app(&job.app).await? else { return Ok(()) };
                let waited = now - tick.max(leading_since);
                let prepared = match prepare(state, &app, &spec).await {
                    Ok(prepared) => prepared,
                    // The store or the environment failing: tried again
                    // next pass, then recorded as a failure.
                    Err(err) if waited < PLACEMENT_WAIT_MS => return Err(err),
                    Err(err) => Err(err.to_string()),
                };
                match prepared {
                    Ok(prepared) => {
                        if job.concurrency == "replace" {
                            for previous in &unfinished {
                                let reason = format!("replaced by the run {} (concurrency replace)", prepared.row.id);
                                if let Some(node) = &previous.node_id {
                                    commands.push(command(state, node, CommandKind::TaskCancel, &TaskCancelPayload { run_id: previous.id.clone(), reason: Some(reason.clone()) }));
                                }
                                ends.push((previous.id.clone(), reason));
                            }
                        }
                        commands.push(prepared.command);
                        prepared.row
                    }
                    Err(reason) if waited < PLACEMENT_WAIT_MS => {
                        // Tried again next pass: the tick stays due.
                        tracing::debug!(app = %job.app, job = %job.name, reason = %reason, "the tick's run cannot start yet; it waits");
                        return Ok(());
                    }
                    Err(reason) => ended_row(&job.app, &spec, "failed", &format!("could not start: {reason}"), now),
                }
            }
        }
    };
    // The previous runs a replace ends go in the same write as the tick.
    let recorded = state.store.record_tick(&Tick { app: &job.app, job: &job.name, tick: first, next, run: Some(&run), commands: &commands, ends: &ends }, now).await?;
    if !recorded {
        // Another pass recorded it (or the job changed meanwhile).
        return Ok(());
    }
    for command in &commands {
        state.hub.notify(&command.node_id, cloudweb_protocol::events::COMMANDS);
    }
    match run.state.as_str() {
        "queued" => tracing::info!(run = %run.id, app = %job.app, job = %job.name, tick = %rfc3339_ms(tick), node_id = ?run.node_id, "scheduled job tick queued"),
        state_text => tracing::warn!(run = %run.id, app = %job.app, job = %job.name, tick = %rfc3339_ms(tick), state = state_text, message = ?run.message, "scheduled job tick did not run"),
    }
    state.store.prune_task_runs(&job.app, Some(&job.name), KEEP_RUNS_PER_JOB).await?;
    Ok(())
}

/// Ends an unfinished run from the control plane's side (`lost`), tells
/// its node to kill it should it come back, and tries a job's run once
/// more elsewhere when the job says so.
async fn lose(state: &AppState, run: &TaskRunRow, reason: &str, now: i64) -> Result<(), ApiError> {
    let mut commands: Vec<NewCommand> = Vec::new();
    if let Some(node) = &run.node_id {
        commands.push(command(state, node, CommandKind::TaskCancel, &TaskCancelPayload { run_id: run.id.clone(), reason: Some(reason.to_string()) }));
    }
    let job = match &run.job {
        Some(name) => state.store.cron_job(&run.app, name).await?,
        None => None,
    };
    let mut retry = None;
    if job.as_ref().is_some_and(|j| j.retry_lost) && run.attempt == 1 && run.trigger != "manual" {
        if let Some(app) = state.store.app(&run.app).await? {
            let command_args: Vec<String> = serde_json::from_str(&run.command).unwrap_or_default();
            let spec = RunSpec {
                job: run.job.as_deref(),
                trigger: "retry",
                tick: run.scheduled_for,
                command: &command_args,
                timeout_s: run.timeout_s,
                attempt: 2,
                avoid: run.node_id.iter().cloned().collect(),
            };
            match prepare(state, &app, &spec).await? {
                Ok(prepared) => retry = Some(prepared),
                Err(why) => tracing::warn!(run = %run.id, app = %run.app, reason = %why, "a lost run cannot be tried again now"),
            }
        }
    }
    let then = retry.as_ref().map(|p| (&p.row, &p.command));
    if state.store.finish_task_run(&run.id, "lost", None, Some(reason), then, &commands, now).await? {
        for command in commands.iter().chain(retry.as_ref().map(|p| &p.command)) {
            state.hub.notify(&command.node_id, cloudweb_protocol::events::COMMANDS);
        }
        tracing::warn!(run = %run.id, app = %run.app, job = ?run.job, reason, retry = ?retry.as_ref().map(|p| &p.row.id), "task run lost");
    }
    Ok(())
}

/// One pass: due ticks, then unfinished runs' deadlines and nodes.
/// `leading_since` (ms): when this replica began leading.
pub async fn tick(state: &AppState, leading_since: i64) -> Result<(), ApiError> {
    let now = state.clock.now_ms();
    // One job's failure is logged and holds up neither the others nor the
    // runs below.
    for job in state.store.due_cron_jobs(now, JOBS_PER_PASS).await? {
        if let Err(err) = record_due(state, &job, now, leading_since).await {
            tracing::warn!(app = %job.app, job = %job.name, error = %err, "scheduled job tick not recorded; trying again next pass");
        }
    }
    let instant = tokio::time::Instant::now();
    for run in state.store.unfinished_task_runs().await? {
        let result = if now > run.deadline {
            lose(state, &run, "no word from its node within the run's time limit", now).await
        } else {
            let node_id = run.node_id.clone().unwrap_or_default();
            let silent_limit = LOST_AFTER.max(state.config.unreachable_after);
            match state.nodes.get(&node_id) {
                None => lose(state, &run, &format!("node {node_id} is no longer in the cluster"), now).await,
                Some(node) if instant.saturating_duration_since(node.last_seen) > silent_limit => {
                    let reason = format!("node {} ({node_id}) was not heard from for {} s during the run", node.name, silent_limit.as_secs());
                    lose(state, &run, &reason, now).await
                }
                Some(_) => Ok(()),
            }
        };
        if let Err(err) = result {
            tracing::warn!(run = %run.id, app = %run.app, error = %err, "task run not moved on; trying again next pass");
        }
    }
    Ok(())
}

/// Runs [`tick`] every second until the task is aborted (the leader's).
pub async fn watcher(state: Arc<AppState>) {
    // The leader's loops start when it begins leading (and stop with it).
    let leading_since = state.clock.now_ms();
    let mut every = tokio::time::interval(PASS);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        if let Err(err) = tick(&state, leading_since).await {
            tracing::warn!(error = %err, "task watcher pass failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_control_plane_down_over_several_ticks_runs_the_last_of_them() {
        let every_minute = Schedule::parse("* * * * *").unwrap();
        let utc = cron::zone("UTC").unwrap();
        assert_eq!(latest_due(&every_minute, &utc, 60_000, 60_000), 60_000);
        assert_eq!(latest_due(&every_minute, &utc, 60_000, 359_999), 300_000);
        assert_eq!(latest_due(&every_minute, &utc, 60_000, 360_000), 360_000);
    }
}
