//! Backups: destinations (the recovery kit is in the answer that adds
//! one, and nowhere else), plans, backups on demand, verifications,
//! restores and their confirmation, and the overview.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use cloudweb_api_types::backups::{
    BackupJobView, BackupList, BackupOverview, BackupPlanView, DestinationCreated, DestinationList, NewDestination, RestoreBackup, SetBackupPlan,
};
use cloudweb_api_types::ErrorBody;
use cloudweb_core::backups::{self, Target};

use crate::error::{body_bytes, parse_json, ApiError};
use crate::AppState;

#[utoipa::path(get, path = "/api/backup-destinations", operation_id = "backup_destinations_list", tag = "backups",
    responses((status = 200, description = "The destinations, oldest (the default) first; no secrets", body = DestinationList)))]
pub async fn list_destinations(State(state): State<Arc<AppState>>, axum::Extension(access): axum::Extension<crate::access::Access>) -> Result<Json<DestinationList>, ApiError> {
    let mut destinations = Vec::new();
    for destination in backups::destinations(&state).await? {
        if crate::access::sees_owned(&state, &access, crate::store::Owned::Destination, &destination.name).await? {
            destinations.push(destination);
        }
    }
    Ok(Json(DestinationList { destinations }))
}

/// Adds a destination. cloud-web creates its two restic repositories
/// there first (so a destination it cannot write to is refused now), and
/// answers with the recovery kit: the repositories and their password,
/// shown this once.
#[utoipa::path(post, path = "/api/backup-destinations", operation_id = "backup_destinations_create", tag = "backups",
    request_body = NewDestination,
    responses(
        (status = 201, description = "Added; keep the recovery kit", body = DestinationCreated),
        (status = 400, description = "Invalid body", body = ErrorBody),
        (status = 409, description = "The name is taken, or a restic repository is there already", body = ErrorBody),
        (status = 502, description = "The destination did not answer or refused (the reason says why); nothing was recorded", body = ErrorBody),
        (status = 503, description = "restic is not installed on the control plane's host", body = ErrorBody),
    ))]
pub async fn create_destination(
    State(state): State<Arc<AppState>>,
    axum::Extension(team): axum::Extension<crate::auth::authorize::RequestTeam>,
    body: Result<Bytes, BytesRejection>,
) -> Result<(StatusCode, Json<DestinationCreated>), ApiError> {
    let new: NewDestination = parse_json(&body_bytes(body)?)?;
    let (destination, recovery_kit) = backups::add_destination(&state, &new, &team.id()).await?;
    Ok((StatusCode::CREATED, Json(DestinationCreated { destination, recovery_kit })))
}

/// Forgets a destination. Nothing at the destination is deleted.
#[utoipa::path(delete, path = "/api/backup-destinations/{name}", operation_id = "backup_destinations_remove", tag = "backups",
    params(("name" = String, Path, description = "The destination's name")),
    responses(
        (status = 204, description = "Forgotten; its repositories stay where they are"),
        (status = 404, description = "No such destination", body = ErrorBody),
        (status = 409, description = "A plan names it", body = ErrorBody),
    ))]
pub async fn remove_destination(State(state): State<Arc<AppState>>, Path(name): Path<String>) -> Result<StatusCode, ApiError> {
    backups::remove_destination(&state, &name).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(get, path = "/api/backups", operation_id = "backups_overview", tag = "backups",
    responses((status = 200, description = "Every target's last success, and what needs attention", body = BackupOverview)))]
pub async fn overview(State(state): State<Arc<AppState>>, axum::Extension(access): axum::Extension<crate::access::Access>) -> Result<Json<BackupOverview>, ApiError> {
    let mut overview = backups::overview(&state).await?;
    if !access.sees_all() {
        let mut targets = Vec::new();
        for target in overview.targets {
            if sees_target(&state, &access, &target.target).await? {
                targets.push(target);
            }
        }
        let mut alerts = Vec::new();
        for alert in overview.alerts {
            let target = alert.split(':').next().unwrap_or_default();
            if sees_target(&state, &access, target).await? {
                alerts.push(alert);
            }
        }
        let mut destinations = 0;
        for destination in state.store.destinations().await? {
            if access.sees(&destination.team_id, None) {
                destinations += 1;
            }
        }
        overview = BackupOverview { destinations, targets, alerts };
    }
    Ok(Json(overview))
}

/// Whether the caller sees a backup target (`service/<name>`,
/// `volume/<name>`).
async fn sees_target(state: &AppState, access: &crate::access::Access, target: &str) -> Result<bool, ApiError> {
    let owned = match target.split_once('/') {
        Some(("service", name)) => (crate::store::Owned::Service, name),
        Some(("volume", name)) => (crate::store::Owned::Volume, name),
        _ => return Ok(false),
    };
    crate::access::sees_owned(state, access, owned.0, owned.1).await
}

async fn list(state: &AppState, target: Target) -> Result<Json<BackupList>, ApiError> {
    let exists = match &target {
        Target::Service(name) => state.store.service(name).await?.is_some(),
        Target::Volume(name) => state.store.volume(name).await?.is_some(),
    };
    let jobs = backups::jobs_of(state, &target).await?;
    if !exists && jobs.is_empty() {
        return Err(ApiError::NotFound(format!("no {} and no backups of it", target.key())));
    }
    let plan = backups::plan(state, &target).await?;
    Ok(Json(BackupList { plan: backups::plan_view(state, &plan), jobs: jobs.iter().map(backups::job_view).collect() }))
}

#[utoipa::path(get, path = "/api/services/{name}/backups", operation_id = "services_backups_list", tag = "backups",
    params(("name" = String, Path, description = "The service's name")),
    responses((status = 200, description = "Its plan and jobs, newest first (also of a deleted service)", body = BackupList), (status = 404, description = "No such service and no backups of it", body = ErrorBody)))]
pub async fn service_backups(State(state): State<Arc<AppState>>, Path(name): Path<String>) -> Result<Json<BackupList>, ApiError> {
    list(&state, Target::Service(name)).await
}

#[utoipa::path(get, path = "/api/volumes/{name}/backups", operation_id = "volumes_backups_list", tag = "backups",
    params(("name" = String, Path, description = "The volume's name")),
    responses((status = 200, description = "Its plan and jobs, newest first (also of a deleted volume)", body = BackupList), (status = 404, description = "No such volume and no backups of it", body = ErrorBody)))]
pub async fn volume_backups(State(state): State<Arc<AppState>>, Path(name): Path<String>) -> Result<Json<BackupList>, ApiError> {
    list(&state, Target::Volume(name)).await
}

/// Backs the service up now (a logical dump).
#[utoipa::path(post, path = "/api/services/{name}/backups", operation_id = "services_backups_run", tag = "backups",
    params(("name" = String, Path, description = "The service's name")),
    responses(
        (status = 202, description = "Queued on the service's node", body = BackupJobView),
        (status = 404, description = "No such service", body = ErrorBody),
        (status = 409, description = "No destination, a backup is under way, or the node is away", body = ErrorBody),
    ))]
pub async fn run_service(State(state): State<Arc<AppState>>, Path(name): Path<String>) -> Result<(StatusCode, Json<BackupJobView>), ApiError> {
    let job = backups::run_now(&state, &Target::Service(name)).await?;
    Ok((StatusCode::ACCEPTED, Json(backups::job_view(&job))))
}

/// Backs the volume up now (its files; paused first when its plan says so).
#[utoipa::path(post, path = "/api/volumes/{name}/backups", operation_id = "volumes_backups_run", tag = "backups",
    params(("name" = String, Path, description = "The volume's name")),
    responses(
        (status = 202, description = "Queued on the volume's node", body = BackupJobView),
        (status = 404, description = "No such volume", body = ErrorBody),
        (status = 409, description = "No destination, a backup is under way, the node is away, or the volume holds a service's data", body = ErrorBody),
    ))]
pub async fn run_volume(State(state): State<Arc<AppState>>, Path(name): Path<String>) -> Result<(StatusCode, Json<BackupJobView>), ApiError> {
    let job = backups::run_now(&state, &Target::Volume(name)).await?;
    Ok((StatusCode::ACCEPTED, Json(backups::job_view(&job))))
}

async fn set_plan(state: &AppState, target: Target, body: Result<Bytes, BytesRejection>) -> Result<Json<BackupPlanView>, ApiError> {
    let change: SetBackupPlan = parse_json(&body_bytes(body)?)?;
    let plan = backups::set_plan(state, &target, &change).await?;
    Ok(Json(backups::plan_view(state, &plan)))
}

#[utoipa::path(put, path = "/api/services/{name}/backup-plan", operation_id = "services_backup_plan_set", tag = "backups",
    params(("name" = String, Path, description = "The service's name")), request_body = SetBackupPlan,
    responses((status = 200, description = "The plan now", body = BackupPlanView), (status = 400, description = "Invalid schedule or body", body = ErrorBody), (status = 404, description = "No such service or destination", body = ErrorBody)))]
pub async fn plan_service(State(state): State<Arc<AppState>>, Path(name): Path<String>, body: Result<Bytes, BytesRejection>) -> Result<Json<BackupPlanView>, ApiError> {
    set_plan(&state, Target::Service(name), body).await
}

#[utoipa::path(put, path = "/api/volumes/{name}/backup-plan", operation_id = "volumes_backup_plan_set", tag = "backups",
    params(("name" = String, Path, description = "The volume's name")), request_body = SetBackupPlan,
    responses((status = 200, description = "The plan now", body = BackupPlanView), (status = 400, description = "Invalid schedule or body", body = ErrorBody), (status = 404, description = "No such volume or destination", body = ErrorBody)))]
pub async fn plan_volume(State(state): State<Arc<AppState>>, Path(name): Path<String>, body: Result<Bytes, BytesRejection>) -> Result<Json<BackupPlanView>, ApiError> {
    set_plan(&state, Target::Volume(name), body).await
}

#[utoipa::path(get, path = "/api/backups/{id}", operation_id = "backups_show", tag = "backups",
    params(("id" = String, Path, description = "The job's id")),
    responses((status = 200, description = "The job", body = BackupJobView), (status = 404, description = "No such job", body = ErrorBody)))]
pub async fn show(State(state): State<Arc<AppState>>, Path(id): Path<String>) -> Result<Json<BackupJobView>, ApiError> {
    let job = state.store.backup_job(&id).await?.ok_or_else(|| ApiError::NotFound(format!("no backup job {id}")))?;
    Ok(Json(backups::job_view(&job)))
}

/// Verifies a backup now: restored into a throwaway place and checked.
#[utoipa::path(post, path = "/api/backups/{id}/verify", operation_id = "backups_verify", tag = "backups",
    params(("id" = String, Path, description = "The backup's id")),
    responses(
        (status = 202, description = "The verification job", body = BackupJobView),
        (status = 404, description = "No such backup", body = ErrorBody),
        (status = 409, description = "Not a successful backup, or a verification is under way", body = ErrorBody),
    ))]
pub async fn verify(State(state): State<Arc<AppState>>, Path(id): Path<String>) -> Result<(StatusCode, Json<BackupJobView>), ApiError> {
    let job = backups::verify_now(&state, &id).await?;
    Ok((StatusCode::ACCEPTED, Json(backups::job_view(&job))))
}

/// Restores a backup: into its own service or volume (the data it
/// replaces is kept as `<volume>-before-restore-<time>` until confirmed or
/// for the keep period), or with `to` into a new service or volume.
#[utoipa::path(post, path = "/api/backups/{id}/restore", operation_id = "backups_restore", tag = "backups",
    params(("id" = String, Path, description = "The backup's id")), request_body = RestoreBackup,
    responses(
        (status = 202, description = "The restore job", body = BackupJobView),
        (status = 400, description = "Invalid body", body = ErrorBody),
        (status = 404, description = "No such backup, service, volume or node", body = ErrorBody),
        (status = 409, description = "Not a successful backup, the name is taken, or a restore is under way", body = ErrorBody),
    ))]
pub async fn restore(State(state): State<Arc<AppState>>, Path(id): Path<String>, body: Result<Bytes, BytesRejection>) -> Result<(StatusCode, Json<BackupJobView>), ApiError> {
    let bytes = body_bytes(body)?;
    let request: RestoreBackup = if bytes.is_empty() { RestoreBackup::default() } else { parse_json(&bytes)? };
    for (field, value) in [("to", &request.to), ("node", &request.node)] {
        if let Some(value) = value {
            cloudweb_protocol::validate::bounded_text(field, value, 128).map_err(|e| ApiError::BadRequest(e.to_string()))?;
        }
    }
    let job = backups::restore(&state, &id, request.to.as_deref(), request.node.as_deref()).await?;
    Ok((StatusCode::ACCEPTED, Json(backups::job_view(&job))))
}

/// The restore is good: the data it replaced is deleted now.
#[utoipa::path(post, path = "/api/backups/{id}/confirm", operation_id = "backups_confirm_restore", tag = "backups",
    params(("id" = String, Path, description = "The restore job's id")),
    responses(
        (status = 200, description = "The replaced data is being deleted", body = BackupJobView),
        (status = 400, description = "Not a restore", body = ErrorBody),
        (status = 404, description = "No such job", body = ErrorBody),
        (status = 409, description = "The restore keeps no replaced data", body = ErrorBody),
    ))]
pub async fn confirm(State(state): State<Arc<AppState>>, Path(id): Path<String>) -> Result<Json<BackupJobView>, ApiError> {
    let job = backups::confirm_restore(&state, &id).await?;
    Ok(Json(backups::job_view(&job)))
}
