//! Scheduled jobs: creating, changing, removing and showing them, and
//! running one now.

use cloudweb_api_types::tasks::{CronJobChange, CronJobView, NewCronJob, TaskRunView};

use super::runs::{app_of, check_command, check_timeout, command_json, prepare, queue, run_view, RunSpec};
use super::{DEFAULT_STARTING_DEADLINE_SECONDS, KEEP_RUNS_PER_JOB, MAX_JOBS_PER_APP, MAX_STARTING_DEADLINE_SECONDS};
use crate::clock::rfc3339_ms;
use crate::cron::{self, Schedule};
use crate::error::ApiError;
use crate::store::{CronJobRow, CronRefusal, TaskRunRow};
use crate::AppState;

const CONCURRENCY: [&str; 3] = ["forbid", "replace", "allow"];

fn check_name(name: &str) -> Result<(), ApiError> {
    cloudweb_protocol::validate::node_name("name", name).map_err(|e| ApiError::BadRequest(e.to_string()))
}

/// The schedule and time zone, checked, and the job's next tick after
/// `now` (`None` when the schedule never fires).
fn next_tick(schedule: &str, timezone: &str, now: i64) -> Result<Option<i64>, ApiError> {
    let parsed = Schedule::parse(schedule).map_err(|e| ApiError::BadRequest(format!("schedule: {e}")))?;
    let zone = cron::zone(timezone).map_err(|e| ApiError::BadRequest(format!("timezone: {e}")))?;
    let next = parsed.next_in_zone(&zone, now);
    if next.is_none() {
        return Err(ApiError::BadRequest(format!("schedule: {schedule:?} never fires (no such day within five years)")));
    }
    Ok(next)
}

fn check_concurrency(value: &str) -> Result<(), ApiError> {
    if CONCURRENCY.contains(&value) {
        Ok(())
    } else {
        Err(ApiError::BadRequest(format!("concurrency must be one of {}", CONCURRENCY.join(", "))))
    }
}

/// At least a minute: a tick may wait that long for a node to take it.
fn check_deadline(value: u32) -> Result<(), ApiError> {
    let min = cloudweb_protocol::tasks::MIN_STARTING_DEADLINE_SECONDS;
    if (min..=MAX_STARTING_DEADLINE_SECONDS).contains(&value) {
        Ok(())
    } else {
        Err(ApiError::BadRequest(format!("starting_deadline_seconds must be {min} to {MAX_STARTING_DEADLINE_SECONDS}")))
    }
}

/// `POST /api/apps/{app}/cron`.
pub async fn create_job(state: &AppState, app: &str, body: &NewCronJob) -> Result<CronJobView, ApiError> {
    check_name(&body.name)?;
    check_command(&body.command)?;
    let timeout = check_timeout(body.timeout_seconds)?;
    let concurrency = body.concurrency.clone().unwrap_or_else(|| "forbid".into());
    check_concurrency(&concurrency)?;
    let deadline = body.starting_deadline_seconds.unwrap_or(DEFAULT_STARTING_DEADLINE_SECONDS);
    check_deadline(deadline)?;
    let timezone = body.timezone.clone().unwrap_or_else(|| "UTC".into());
    let now = state.clock.now_ms();
    let next = next_tick(&body.schedule, &timezone, now)?;
    app_of(state, app).await?;
    if state.store.cron_jobs_of(app).await?.len() >= MAX_JOBS_PER_APP {
        return Err(ApiError::Conflict(format!("app {app} has {MAX_JOBS_PER_APP} scheduled jobs, the most it may have")));
    }
    let suspended = body.suspended.unwrap_or(false);
    let row = CronJobRow {
        app: app.to_string(),
        name: body.name.clone(),
        schedule: body.schedule.trim().to_string(),
        timezone,
        command: command_json(&body.command),
        timeout_s: i64::from(timeout),
        concurrency,
        retry_lost: body.retry_lost.unwrap_or(true),
        starting_deadline_s: i64::from(deadline),
        suspended,
        next_run_at: if suspended { None } else { next },
        created_at: now,
        updated_at: now,
    };
    match state.store.insert_cron_job(&row).await? {
        Ok(()) => {}
        Err(CronRefusal::Exists) => return Err(ApiError::Conflict(format!("app {app} has a scheduled job named {} already", body.name))),
        Err(CronRefusal::NoApp) => return Err(ApiError::NotFound(format!("no app named {app}"))),
    }
    tracing::info!(app, job = %row.name, schedule = %row.schedule, timezone = %row.timezone, "scheduled job created");
    Ok(job_view(&row, None))
}

pub(crate) async fn job_of(state: &AppState, app: &str, name: &str) -> Result<CronJobRow, ApiError> {
    check_name(name)?;
    state.store.cron_job(app, name).await?.ok_or_else(|| ApiError::NotFound(format!("app {app} has no scheduled job named {name}")))
}

/// `PATCH /api/apps/{app}/cron/{name}`: the fields given change; a new
/// schedule, time zone or resumption counts the next tick from now.
pub async fn change_job(state: &AppState, app: &str, name: &str, change: &CronJobChange) -> Result<CronJobView, ApiError> {
    // The leader may record a tick between the read and the write: the
    // write is made only over the tick read, and tried again over a new
    // read (a few times) when it moved.
    for _ in 0..5 {
        let read = job_of(state, app, name).await?;
        let row = changed(state, read.clone(), change)?;
        if state.store.update_cron_job(&row, read.next_run_at).await? {
            tracing::info!(app, job = name, schedule = %row.schedule, suspended = row.suspended, "scheduled job changed");
            let last = state.store.task_runs_of(app, Some(name), 1).await?.into_iter().next();
            return Ok(job_view(&row, last.as_ref()));
        }
    }
    Err(ApiError::Conflict(format!("scheduled job {name} kept changing while it was written (its ticks are being recorded); try again")))
}

/// `row` with `change` applied and checked.
fn changed(state: &AppState, mut row: CronJobRow, change: &CronJobChange) -> Result<CronJobRow, ApiError> {
    let now = state.clock.now_ms();
    let mut reschedule = false;
    if let Some(schedule) = &change.schedule {
        row.schedule = schedule.trim().to_string();
        reschedule = true;
    }
    if let Some(timezone) = &change.timezone {
        row.timezone = timezone.clone();
        reschedule = true;
    }
    if let Some(command) = &change.command {
        check_command(command)?;
        row.command = command_json(command);
    }
    if let Some(timeout) = change.timeout_seconds {
        row.timeout_s = i64::from(check_timeout(Some(timeout))?);
    }
    if let Some(concurrency) = &change.concurrency {
        check_concurrency(concurrency)?;
        row.concurrency = concurrency.clone();
    }
    if let Some(retry) = change.retry_lost {
        row.retry_lost = retry;
    }
    if let Some(deadline) = change.starting_deadline_seconds {
        check_deadline(deadline)?;
        row.starting_deadline_s = i64::from(deadline);
    }
    if let Some(suspended) = change.suspended {
        reschedule |= row.suspended && !suspended;
        row.suspended = suspended;
    }
    let next = next_tick(&row.schedule, &row.timezone, now)?;
    if row.suspended {
        row.next_run_at = None;
    } else if reschedule || row.next_run_at.is_none() {
        row.next_run_at = next;
    }
    row.updated_at = now;
    Ok(row)
}

/// `DELETE /api/apps/{app}/cron/{name}`: the job goes; its runs stay in
/// the history, and one under way runs to its end.
pub async fn remove_job(state: &AppState, app: &str, name: &str) -> Result<(), ApiError> {
    check_name(name)?;
    if !state.store.delete_cron_job(app, name).await? {
        return Err(ApiError::NotFound(format!("app {app} has no scheduled job named {name}")));
    }
    tracing::info!(app, job = name, "scheduled job removed");
    Ok(())
}

pub async fn jobs_of(state: &AppState, app: &str) -> Result<Vec<CronJobView>, ApiError> {
    app_of(state, app).await?;
    let mut views = Vec::new();
    for job in state.store.cron_jobs_of(app).await? {
        let last = state.store.task_runs_of(app, Some(&job.name), 1).await?.into_iter().next();
        views.push(job_view(&job, last.as_ref()));
    }
    Ok(views)
}

/// `cloudweb cron run`: the job's command now, beside its schedule (the
/// job's concurrency policy is not applied to a run asked for by hand).
pub async fn run_job_now(state: &AppState, app: &str, name: &str) -> Result<TaskRunRow, ApiError> {
    let job = job_of(state, app, name).await?;
    let app_row = app_of(state, app).await?;
    let command: Vec<String> = serde_json::from_str(&job.command).map_err(|e| ApiError::Internal(format!("job {name}'s command: {e}")))?;
    let spec = RunSpec { job: Some(name), trigger: "manual", tick: None, command: &command, timeout_s: job.timeout_s, attempt: 1, avoid: Vec::new() };
    let prepared = prepare(state, &app_row, &spec).await?.map_err(ApiError::Conflict)?;
    let row = queue(state, prepared, &[], &[]).await?;
    state.store.prune_task_runs(app, Some(name), KEEP_RUNS_PER_JOB).await?;
    Ok(row)
}

pub fn job_view(job: &CronJobRow, last: Option<&TaskRunRow>) -> CronJobView {
    let last_run: Option<TaskRunView> = last.map(run_view);
    CronJobView {
        app: job.app.clone(),
        name: job.name.clone(),
        schedule: job.schedule.clone(),
        timezone: job.timezone.clone(),
        command: serde_json::from_str(&job.command).unwrap_or_default(),
        timeout_seconds: job.timeout_s.clamp(0, i64::from(u32::MAX)) as u32,
        concurrency: job.concurrency.clone(),
        retry_lost: job.retry_lost,
        starting_deadline_seconds: job.starting_deadline_s.clamp(0, i64::from(u32::MAX)) as u32,
        suspended: job.suspended,
        next_run_at: job.next_run_at.map(rfc3339_ms),
        alert: last_run.as_ref().filter(|r| super::is_failure(&r.state)).map(|r| match (r.state.as_str(), r.exit_code) {
            ("failed", Some(code)) => format!("the last run ({}) failed with exit code {code}", r.id),
            (state, _) => format!("the last run ({}) ended {state}{}", r.id, r.message.as_deref().map(|m| format!(": {m}")).unwrap_or_default()),
        }),
        last_run,
        created_at: rfc3339_ms(job.created_at),
    }
}
