//! Tasks: an app's scheduled jobs (`/api/apps/{app}/cron`) and its runs
//! (`/api/apps/{app}/runs`): one-off runs, a run's output, cancelling.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::Json;
use cloudweb_api_types::tasks::{CronJobChange, CronJobList, CronJobView, NewCronJob, NewTaskRun, TaskRunList, TaskRunLogs, TaskRunView};
use cloudweb_api_types::ErrorBody;
use cloudweb_core::tasks;

use crate::error::{body_bytes, parse_json, ApiError};
use crate::AppState;

#[derive(Debug, Default, serde::Deserialize)]
pub struct RunsQuery {
    pub job: Option<String>,
    pub limit: Option<String>,
}

#[derive(Debug, Default, serde::Deserialize)]
pub struct LogsQuery {
    pub after: Option<String>,
}

fn query<T>(query: Result<Query<T>, QueryRejection>) -> Result<T, ApiError> {
    query.map(|Query(q)| q).map_err(|e| ApiError::BadRequest(format!("invalid query: {}", e.body_text())))
}

#[utoipa::path(get, path = "/api/apps/{app}/cron", operation_id = "cron_jobs_list", tag = "tasks",
    params(("app" = String, Path, description = "The app's name")),
    responses((status = 200, description = "The app's scheduled jobs, by name, each with its newest run", body = CronJobList), (status = 404, description = "No such app", body = ErrorBody)))]
pub async fn list_jobs(State(state): State<Arc<AppState>>, Path(app): Path<String>) -> Result<Json<CronJobList>, ApiError> {
    Ok(Json(CronJobList { jobs: tasks::jobs_of(&state, &app).await? }))
}

/// Adds a scheduled job: its command runs in a one-off container of the
/// app's running image, with the app's environment, at each tick.
#[utoipa::path(post, path = "/api/apps/{app}/cron", operation_id = "cron_jobs_create", tag = "tasks",
    params(("app" = String, Path, description = "The app's name")), request_body = NewCronJob,
    responses(
        (status = 201, description = "Added", body = CronJobView),
        (status = 400, description = "Invalid name, schedule, time zone, command or limit", body = ErrorBody),
        (status = 404, description = "No such app", body = ErrorBody),
        (status = 409, description = "The app has a job of that name, or as many jobs as it may have", body = ErrorBody),
    ))]
pub async fn create_job(State(state): State<Arc<AppState>>, Path(app): Path<String>, body: Result<Bytes, BytesRejection>) -> Result<(StatusCode, Json<CronJobView>), ApiError> {
    let new: NewCronJob = parse_json(&body_bytes(body)?)?;
    Ok((StatusCode::CREATED, Json(tasks::create_job(&state, &app, &new).await?)))
}

#[utoipa::path(get, path = "/api/apps/{app}/cron/{name}", operation_id = "cron_jobs_show", tag = "tasks",
    params(("app" = String, Path, description = "The app's name"), ("name" = String, Path, description = "The job's name")),
    responses((status = 200, description = "The job, with its newest run", body = CronJobView), (status = 404, description = "No such app or job", body = ErrorBody)))]
pub async fn get_job(State(state): State<Arc<AppState>>, Path((app, name)): Path<(String, String)>) -> Result<Json<CronJobView>, ApiError> {
    tasks::jobs_of(&state, &app)
        .await?
        .into_iter()
        .find(|j| j.name == name)
        .map(Json)
        .ok_or_else(|| ApiError::NotFound(format!("app {app} has no scheduled job named {name}")))
}

/// Changes a job: only the fields given. A new schedule or time zone, or a
/// resumption, counts the next tick from now.
#[utoipa::path(patch, path = "/api/apps/{app}/cron/{name}", operation_id = "cron_jobs_change", tag = "tasks",
    params(("app" = String, Path, description = "The app's name"), ("name" = String, Path, description = "The job's name")), request_body = CronJobChange,
    responses((status = 200, description = "The job now", body = CronJobView), (status = 400, description = "Invalid body", body = ErrorBody), (status = 404, description = "No such app or job", body = ErrorBody)))]
pub async fn change_job(
    State(state): State<Arc<AppState>>,
    Path((app, name)): Path<(String, String)>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<CronJobView>, ApiError> {
    let change: CronJobChange = parse_json(&body_bytes(body)?)?;
    Ok(Json(tasks::change_job(&state, &app, &name, &change).await?))
}

/// Removes a job. Its runs stay in the history; one under way runs on.
#[utoipa::path(delete, path = "/api/apps/{app}/cron/{name}", operation_id = "cron_jobs_remove", tag = "tasks",
    params(("app" = String, Path, description = "The app's name"), ("name" = String, Path, description = "The job's name")),
    responses((status = 204, description = "Removed"), (status = 404, description = "No such app or job", body = ErrorBody)))]
pub async fn remove_job(State(state): State<Arc<AppState>>, Path((app, name)): Path<(String, String)>) -> Result<StatusCode, ApiError> {
    tasks::remove_job(&state, &app, &name).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Runs a job's command now, beside its schedule.
#[utoipa::path(post, path = "/api/apps/{app}/cron/{name}/run", operation_id = "cron_jobs_run", tag = "tasks",
    params(("app" = String, Path, description = "The app's name"), ("name" = String, Path, description = "The job's name")),
    responses(
        (status = 202, description = "Queued on a node", body = TaskRunView),
        (status = 404, description = "No such app or job", body = ErrorBody),
        (status = 409, description = "It cannot run now: no running deployment, or no node with room (the reason says which)", body = ErrorBody),
    ))]
pub async fn run_job(State(state): State<Arc<AppState>>, Path((app, name)): Path<(String, String)>) -> Result<(StatusCode, Json<TaskRunView>), ApiError> {
    let run = tasks::run_job_now(&state, &app, &name).await?;
    Ok((StatusCode::ACCEPTED, Json(tasks::run_view(&run))))
}

#[utoipa::path(get, path = "/api/apps/{app}/runs", operation_id = "task_runs_list", tag = "tasks",
    params(("app" = String, Path, description = "The app's name"),
        ("job" = Option<String>, Query, description = "Only this scheduled job's runs"),
        ("limit" = Option<u32>, Query, description = "How many, newest first (default 50, at most 200)")),
    responses((status = 200, description = "Runs, newest first", body = TaskRunList), (status = 400, description = "Invalid query", body = ErrorBody), (status = 404, description = "No such app", body = ErrorBody)))]
pub async fn list_runs(
    State(state): State<Arc<AppState>>,
    Path(app): Path<String>,
    q: Result<Query<RunsQuery>, QueryRejection>,
) -> Result<Json<TaskRunList>, ApiError> {
    let q = query(q)?;
    let limit = match q.limit.as_deref() {
        None => 50,
        Some(text) => text.parse::<u32>().ok().filter(|n| (1..=200).contains(n)).ok_or_else(|| ApiError::BadRequest("limit must be 1 to 200".into()))?,
    };
    Ok(Json(TaskRunList { runs: tasks::runs_of(&state, &app, q.job.as_deref(), limit).await? }))
}

/// Runs a command once now in a one-off container of the app's running
/// image, with its environment.
#[utoipa::path(post, path = "/api/apps/{app}/runs", operation_id = "task_runs_create", tag = "tasks",
    params(("app" = String, Path, description = "The app's name")), request_body = NewTaskRun,
    responses(
        (status = 202, description = "Queued on a node; follow it with GET …/runs/{id}/logs", body = TaskRunView),
        (status = 400, description = "Invalid command or time limit", body = ErrorBody),
        (status = 404, description = "No such app", body = ErrorBody),
        (status = 409, description = "It cannot run now: no running deployment, or no node with room (the reason says which)", body = ErrorBody),
    ))]
pub async fn create_run(State(state): State<Arc<AppState>>, Path(app): Path<String>, body: Result<Bytes, BytesRejection>) -> Result<(StatusCode, Json<TaskRunView>), ApiError> {
    let new: NewTaskRun = parse_json(&body_bytes(body)?)?;
    let run = tasks::run_once(&state, &app, &new).await?;
    Ok((StatusCode::ACCEPTED, Json(tasks::run_view(&run))))
}

#[utoipa::path(get, path = "/api/apps/{app}/runs/{id}", operation_id = "task_runs_show", tag = "tasks",
    params(("app" = String, Path, description = "The app's name"), ("id" = String, Path, description = "The run's id (tr_…)")),
    responses((status = 200, description = "The run", body = TaskRunView), (status = 400, description = "Not a run id", body = ErrorBody), (status = 404, description = "No such app or run", body = ErrorBody)))]
pub async fn get_run(State(state): State<Arc<AppState>>, Path((app, id)): Path<(String, String)>) -> Result<Json<TaskRunView>, ApiError> {
    Ok(Json(tasks::run_view(&tasks::run_of(&state, &app, &id).await?)))
}

/// The run and its output lines numbered after `after` (at most 1,000 at
/// a time): poll with the last number seen to follow it.
#[utoipa::path(get, path = "/api/apps/{app}/runs/{id}/logs", operation_id = "task_runs_logs", tag = "tasks",
    params(("app" = String, Path, description = "The app's name"), ("id" = String, Path, description = "The run's id (tr_…)"),
        ("after" = Option<u64>, Query, description = "Only lines numbered after this (default 0: from the first kept)")),
    responses((status = 200, description = "The run and its lines, oldest first", body = TaskRunLogs), (status = 400, description = "Invalid query", body = ErrorBody), (status = 404, description = "No such app or run", body = ErrorBody)))]
pub async fn run_logs(
    State(state): State<Arc<AppState>>,
    Path((app, id)): Path<(String, String)>,
    q: Result<Query<LogsQuery>, QueryRejection>,
) -> Result<Json<TaskRunLogs>, ApiError> {
    let q = query(q)?;
    let after = match q.after.as_deref() {
        None => 0,
        Some(text) => text.parse::<u64>().map_err(|_| ApiError::BadRequest("after must be a line number (0 or more)".into()))?,
    };
    Ok(Json(tasks::lines(&state, &app, &id, after).await?))
}

/// Cancels an unfinished run: it ends `cancelled` and its node kills its
/// container. A run that has ended is answered as it is.
#[utoipa::path(post, path = "/api/apps/{app}/runs/{id}/cancel", operation_id = "task_runs_cancel", tag = "tasks",
    params(("app" = String, Path, description = "The app's name"), ("id" = String, Path, description = "The run's id (tr_…)")),
    responses((status = 200, description = "The run now", body = TaskRunView), (status = 404, description = "No such app or run", body = ErrorBody)))]
pub async fn cancel_run(State(state): State<Arc<AppState>>, Path((app, id)): Path<(String, String)>) -> Result<Json<TaskRunView>, ApiError> {
    let run = tasks::cancel(&state, &app, &id, "cancelled by a user").await?;
    Ok(Json(tasks::run_view(&run)))
}
