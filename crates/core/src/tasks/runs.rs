//! Starting runs (placing them, with the app's image and environment),
//! cancelling them, and showing them.

use cloudweb_api_types::tasks::{TaskLine, TaskRunLogs, TaskRunView};
use cloudweb_protocol::{CommandKind, TaskCancelPayload, TaskRunPayload};

use super::{new_run_id, DEADLINE_SLACK_MS, DEFAULT_TIMEOUT_SECONDS, KEEP_ONE_OFF_RUNS, MAX_TIMEOUT_SECONDS};
use crate::clock::rfc3339_ms;
use crate::deploy::scheduler::{self, Placement, Request};
use crate::deploy::{DEFAULT_CPU, DEFAULT_MEMORY};
use crate::error::ApiError;
use crate::store::{AppRow, NewCommand, TaskRunRow};
use crate::AppState;

/// What a new run is for.
pub(crate) struct RunSpec<'a> {
    pub job: Option<&'a str>,
    /// `schedule`, `manual`, `one-off` or `retry`.
    pub trigger: &'a str,
    pub tick: Option<i64>,
    pub command: &'a [String],
    pub timeout_s: i64,
    pub attempt: i64,
    /// Nodes it must not go to (the one a lost run was on).
    pub avoid: Vec<String>,
}

/// A run ready to record, with the command that starts it.
pub(crate) struct Prepared {
    pub row: TaskRunRow,
    pub command: NewCommand,
}

pub(crate) fn command(state: &AppState, node_id: &str, kind: CommandKind, payload: &impl serde::Serialize) -> NewCommand {
    NewCommand {
        node_id: node_id.to_string(),
        kind: kind.as_str().to_string(),
        payload: state.sealer.seal_json(&crate::command_context(node_id), &serde_json::to_value(payload).expect("payload serializes")),
    }
}

pub(crate) fn command_json(command: &[String]) -> String {
    serde_json::to_string(command).expect("arguments serialize")
}

/// The run of `spec` placed on a node, or why it cannot run now (no
/// running deployment, a linked service without an address, no node with
/// room), in words.
pub(crate) async fn prepare(state: &AppState, app: &AppRow, spec: &RunSpec<'_>) -> Result<Result<Prepared, String>, ApiError> {
    let deployments = state.store.app_deployments(&app.name).await?;
    let Some(running) = deployments.iter().filter(|d| d.state == "running" && d.image.is_some()).max_by_key(|d| d.seq) else {
        return Ok(Err(format!("app {} has no running deployment: deploy it first (a task runs the image the app runs)", app.name)));
    };
    let image = running.image.clone().expect("filtered");
    let mut env = crate::deploy::app_env(state, app)?;
    match crate::service_links::link_env(state, &app.name).await? {
        Ok(linked) => env.extend(linked),
        Err(reason) => return Ok(Err(reason)),
    }
    let request = Request {
        cpu: app.cpu.unwrap_or(DEFAULT_CPU),
        mem_bytes: app.memory_bytes.map(|m| m.max(0) as u64).unwrap_or(DEFAULT_MEMORY),
        features: vec![cloudweb_protocol::features::TASKS.to_string()],
        avoid: spec.avoid.clone(),
        pin: None,
        spread: Vec::new(),
    };
    let nodes = crate::deploy::snapshot(state).await?;
    let node_id = match scheduler::place(&nodes, &request) {
        Placement::Node(id) => id,
        Placement::Nowhere(reason) => return Ok(Err(format!("no node can run it: {reason}"))),
    };
    let id = new_run_id();
    let timeout_s = spec.timeout_s.clamp(1, i64::from(MAX_TIMEOUT_SECONDS));
    let payload = TaskRunPayload {
        run_id: id.clone(),
        app: app.name.clone(),
        image: image.clone(),
        env,
        command: spec.command.to_vec(),
        timeout_seconds: timeout_s as u32,
        memory_bytes: app.memory_bytes.map(|m| m.max(0) as u64),
        cpu: app.cpu,
    };
    payload.validate().map_err(|e| ApiError::BadRequest(format!("this task cannot run: {e}")))?;
    let now = state.clock.now_ms();
    let row = TaskRunRow {
        id,
        app: app.name.clone(),
        job: spec.job.map(str::to_string),
        trigger: spec.trigger.to_string(),
        scheduled_for: spec.tick,
        state: "queued".into(),
        command: command_json(spec.command),
        node_id: Some(node_id.clone()),
        image: Some(image),
        deployment_id: Some(running.id.clone()),
        attempt: spec.attempt,
        timeout_s,
        created_at: now,
        deadline: now + timeout_s * 1000 + DEADLINE_SLACK_MS,
        ..TaskRunRow::default()
    };
    let command = command(state, &node_id, CommandKind::TaskRun, &payload);
    Ok(Ok(Prepared { row, command }))
}

/// A run that could not start, recorded as ended (`failed` or `skipped`)
/// with why, so it shows in the history and alerts.
pub(crate) fn ended_row(app: &str, spec: &RunSpec<'_>, state: &str, message: &str, now: i64) -> TaskRunRow {
    TaskRunRow {
        id: new_run_id(),
        app: app.to_string(),
        job: spec.job.map(str::to_string),
        trigger: spec.trigger.to_string(),
        scheduled_for: spec.tick,
        state: state.to_string(),
        message: Some(message.to_string()),
        command: command_json(spec.command),
        attempt: spec.attempt,
        timeout_s: spec.timeout_s,
        created_at: now,
        finished_at: Some(now),
        deadline: now,
        ..TaskRunRow::default()
    }
}

pub(crate) async fn app_of(state: &AppState, app: &str) -> Result<AppRow, ApiError> {
    state.store.app(app).await?.ok_or_else(|| ApiError::NotFound(format!("no app named {app}")))
}

/// Checks a command from the API.
pub(crate) fn check_command(command: &[String]) -> Result<(), ApiError> {
    cloudweb_protocol::tasks::command("command", command).map_err(|e| ApiError::BadRequest(e.to_string()))
}

pub(crate) fn check_timeout(timeout: Option<u32>) -> Result<u32, ApiError> {
    match timeout {
        None => Ok(DEFAULT_TIMEOUT_SECONDS),
        Some(t) if (1..=MAX_TIMEOUT_SECONDS).contains(&t) => Ok(t),
        Some(_) => Err(ApiError::BadRequest(format!("timeout_seconds must be 1 to {MAX_TIMEOUT_SECONDS}"))),
    }
}

/// Records and queues a placed run.
pub(crate) async fn queue(state: &AppState, prepared: Prepared, ends: &[(String, String)], also: &[NewCommand]) -> Result<TaskRunRow, ApiError> {
    let now = state.clock.now_ms();
    let mut commands = vec![prepared.command];
    commands.extend(also.iter().cloned());
    state.store.insert_task_run(&prepared.row, &commands, ends, now).await?;
    for command in &commands {
        state.hub.notify(&command.node_id, cloudweb_protocol::events::COMMANDS);
    }
    tracing::info!(run = %prepared.row.id, app = %prepared.row.app, job = ?prepared.row.job, trigger = %prepared.row.trigger, node_id = ?prepared.row.node_id, "task run queued");
    Ok(prepared.row)
}

/// `cloudweb run APP -- CMD`: a one-off run now.
pub async fn run_once(state: &AppState, app: &str, body: &cloudweb_api_types::tasks::NewTaskRun) -> Result<TaskRunRow, ApiError> {
    check_command(&body.command)?;
    let timeout = check_timeout(body.timeout_seconds)?;
    let app = app_of(state, app).await?;
    let spec = RunSpec { job: None, trigger: "one-off", tick: None, command: &body.command, timeout_s: i64::from(timeout), attempt: 1, avoid: Vec::new() };
    let prepared = prepare(state, &app, &spec).await?.map_err(ApiError::Conflict)?;
    let row = queue(state, prepared, &[], &[]).await?;
    state.store.prune_task_runs(&app.name, None, KEEP_ONE_OFF_RUNS).await?;
    Ok(row)
}

/// Ends an unfinished run `cancelled` and tells its node to kill it.
pub async fn cancel(state: &AppState, app: &str, id: &str, reason: &str) -> Result<TaskRunRow, ApiError> {
    let run = run_of(state, app, id).await?;
    if run.is_unfinished() {
        let now = state.clock.now_ms();
        let commands: Vec<NewCommand> = run
            .node_id
            .iter()
            .map(|node| command(state, node, CommandKind::TaskCancel, &TaskCancelPayload { run_id: run.id.clone(), reason: Some(reason.to_string()) }))
            .collect();
        if state.store.finish_task_run(&run.id, "cancelled", None, Some(reason), None, &commands, now).await? {
            for command in &commands {
                state.hub.notify(&command.node_id, cloudweb_protocol::events::COMMANDS);
            }
            tracing::info!(run = %run.id, app = %run.app, reason, "task run cancelled");
        }
    }
    run_of(state, app, id).await
}

/// Before an app is deleted: its scheduled jobs go first (a tick the
/// leader is recording meanwhile then records nothing: its job is gone),
/// then its unfinished runs are cancelled.
pub async fn app_deleting(state: &AppState, app: &str) -> Result<(), ApiError> {
    for job in state.store.cron_jobs_of(app).await? {
        state.store.delete_cron_job(app, &job.name).await?;
    }
    cancel_runs_of(state, app, "the app was deleted").await
}

/// Cancels an app's unfinished runs.
pub async fn cancel_runs_of(state: &AppState, app: &str, reason: &str) -> Result<(), ApiError> {
    for run in state.store.task_runs_of(app, None, 1000).await? {
        if run.is_unfinished() {
            cancel(state, app, &run.id, reason).await?;
        }
    }
    Ok(())
}

pub async fn run_of(state: &AppState, app: &str, id: &str) -> Result<TaskRunRow, ApiError> {
    cloudweb_protocol::tasks::run_id(id).map_err(|e| ApiError::BadRequest(e.to_string()))?;
    match state.store.task_run(id).await? {
        Some(run) if run.app == app => Ok(run),
        _ => Err(ApiError::NotFound(format!("app {app} has no run {id}"))),
    }
}

pub async fn runs_of(state: &AppState, app: &str, job: Option<&str>, limit: u32) -> Result<Vec<TaskRunView>, ApiError> {
    app_of(state, app).await?;
    let runs = state.store.task_runs_of(app, job, i64::from(limit.clamp(1, 200))).await?;
    Ok(runs.iter().map(run_view).collect())
}

/// A run and its lines after `after`.
pub async fn lines(state: &AppState, app: &str, id: &str, after: u64) -> Result<TaskRunLogs, ApiError> {
    let run = run_of(state, app, id).await?;
    let after = after.min(i64::MAX as u64) as i64;
    let (rows, first) = state.store.task_lines(id, after, 1000).await?;
    let lines = rows.into_iter().map(|l| TaskLine { seq: l.seq as u64, at: l.at, stderr: l.stderr, line: l.line }).collect::<Vec<_>>();
    Ok(TaskRunLogs { run: run_view(&run), truncated: first.is_some_and(|first| first > after + 1), lines })
}

pub fn run_view(run: &TaskRunRow) -> TaskRunView {
    TaskRunView {
        id: run.id.clone(),
        app: run.app.clone(),
        job: run.job.clone(),
        trigger: run.trigger.clone(),
        scheduled_for: run.scheduled_for.map(rfc3339_ms),
        state: run.state.clone(),
        exit_code: run.exit_code,
        message: run.message.clone(),
        command: serde_json::from_str(&run.command).unwrap_or_default(),
        node_id: run.node_id.clone(),
        image: run.image.clone(),
        deployment_id: run.deployment_id.clone(),
        attempt: run.attempt.clamp(0, i64::from(u32::MAX)) as u32,
        created_at: rfc3339_ms(run.created_at),
        started_at: run.started_at.map(rfc3339_ms),
        finished_at: run.finished_at.map(rfc3339_ms),
        duration_ms: match (run.started_at, run.finished_at) {
            (Some(start), Some(end)) if end >= start => Some((end - start) as u64),
            _ => None,
        },
    }
}
