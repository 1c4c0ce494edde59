//! Managed services: create, list, inspect and delete them, and link apps
//! to them. Passwords never leave the control plane through these routes:
//! a linked app gets its connection URL in its environment at deploy.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::Json;
use cloudweb_api_types::services::{CreateLink, CreateService, DataOnDelete, DeleteServiceQuery, LinkView, MajorUpgradeView, RotationView, ServiceList, ServiceLogLine, ServiceLogsView, ServiceView, UpgradeService};
use cloudweb_api_types::ErrorBody;

use crate::clock::rfc3339_ms;
use crate::error::{body_bytes, parse_json, ApiError};
use crate::services::NewService;
use crate::store::ServiceRow;
use crate::AppState;

async fn view(state: &AppState, service: &ServiceRow) -> Result<ServiceView, ApiError> {
    let node = state.nodes.get(&service.node_id);
    let status = crate::services::status(state, service);
    let silent = node
        .as_ref()
        .is_none_or(|n| n.state(tokio::time::Instant::now(), state.config.unreachable_after) == crate::live::NodeState::Unreachable);
    let (state_word, detail) = match (&status, silent) {
        (_, true) => ("unknown".to_string(), Some("its node is not reachable".to_string())),
        (Some(s), false) if s.generation == service.generation.max(0) as u64 => (s.state.clone(), s.detail.clone()),
        _ => ("pending".to_string(), None),
    };
    let links = state.store.service_links(&service.name).await?;
    Ok(ServiceView {
        name: service.name.clone(),
        kind: service.kind.clone(),
        version: service.version.clone(),
        image: service.image.clone(),
        node_id: service.node_id.clone(),
        node_name: node.map(|n| n.name.clone()),
        state: state_word,
        detail,
        address: status.as_ref().and_then(|s| s.address.clone()),
        restarts: status.as_ref().map_or(0, |s| s.restarts),
        volume: service.volume.clone(),
        memory: service.memory_bytes,
        links: links.into_iter().map(|l| LinkView { app: l.app, variable: l.variable }).collect(),
        created_at: rfc3339_ms(service.created_at),
        rotation: service.previous_secret_sealed.as_ref().map(|_| RotationView {
            since: rfc3339_ms(service.rotation_started_at.unwrap_or(service.created_at)),
            detail: crate::service_ops::rotation_detail(state, service),
        }),
        upgrade: cloudweb_core::backups::upgrade::view_of(state, &service.name).await?,
    })
}

async fn load(state: &AppState, name: &str) -> Result<ServiceRow, ApiError> {
    state.store.service(name).await?.ok_or_else(|| ApiError::NotFound(format!("no service named {name}")))
}

#[utoipa::path(get, path = "/api/services", operation_id = "services_list", tag = "services",
    responses((status = 200, description = "Every managed service", body = ServiceList)))]
pub async fn list(State(state): State<Arc<AppState>>, axum::Extension(access): axum::Extension<crate::access::Access>) -> Result<Json<ServiceList>, ApiError> {
    let mut services = Vec::new();
    for row in state.store.services().await?.into_iter().filter(|row| access.sees(&row.team_id, None)) {
        services.push(view(&state, &row).await?);
    }
    Ok(Json(ServiceList { services }))
}

#[utoipa::path(post, path = "/api/services", operation_id = "services_create", tag = "services", request_body = CreateService,
    responses(
        (status = 201, description = "Created; its node starts it (state `pending`, then `starting`, then `healthy`)", body = ServiceView),
        (status = 400, description = "Invalid name, type, version or memory", body = ErrorBody),
        (status = 404, description = "No such node", body = ErrorBody),
        (status = 409, description = "The name is taken (by a service, or as the new service of an unfinished major upgrade), or no node can take it (the scheduler's reasons)", body = ErrorBody),
    ))]
pub async fn create(
    State(state): State<Arc<AppState>>,
    axum::Extension(team): axum::Extension<crate::auth::authorize::RequestTeam>,
    body: Result<Bytes, BytesRejection>,
) -> Result<(StatusCode, Json<ServiceView>), ApiError> {
    let request: CreateService = parse_json(&body_bytes(body)?)?;
    let row = crate::services::create(
        &state,
        NewService { name: request.name, kind: request.kind, version: request.version, node: request.node, memory_bytes: request.memory, team_id: team.id() },
    )
    .await?;
    Ok((StatusCode::CREATED, Json(view(&state, &row).await?)))
}

#[utoipa::path(get, path = "/api/services/{name}", operation_id = "services_show", tag = "services",
    params(("name" = String, Path, description = "The service's name")),
    responses((status = 200, description = "The service", body = ServiceView), (status = 404, description = "No such service", body = ErrorBody)))]
pub async fn show(State(state): State<Arc<AppState>>, Path(name): Path<String>) -> Result<Json<ServiceView>, ApiError> {
    let row = load(&state, &name).await?;
    Ok(Json(view(&state, &row).await?))
}

/// Deletes a service: its container goes; its data stays in its volume
/// (detached) unless `data=delete`.
#[utoipa::path(delete, path = "/api/services/{name}", operation_id = "services_delete", tag = "services",
    params(("name" = String, Path, description = "The service's name"),
        ("data" = Option<String>, Query, description = "`keep` (default: its volume stays, detached) or `delete`")),
    responses(
        (status = 204, description = "Deleted"),
        (status = 400, description = "Invalid query", body = ErrorBody),
        (status = 404, description = "No such service", body = ErrorBody),
        (status = 409, description = "Apps are still linked to it, or an unfinished major version upgrade goes from or into it (cancel it first)", body = ErrorBody),
    ))]
pub async fn remove(
    State(state): State<Arc<AppState>>,
    Path(name): Path<String>,
    query: Result<Query<DeleteServiceQuery>, QueryRejection>,
) -> Result<StatusCode, ApiError> {
    let Query(query) = query.map_err(|e| ApiError::BadRequest(format!("invalid query: {}; data= takes keep or delete", e.body_text())))?;
    load(&state, &name).await?;
    let deleted = crate::services::delete(&state, &name).await?;
    // A backup or restore of it under way ends `cancelled` and its node
    // stops it: no dump keeps running against a removed container.
    cloudweb_core::backups::cancel_jobs_of(&state, &cloudweb_core::backups::Target::Service(deleted.name.clone()), "the service was deleted").await?;
    if query.data == DataOnDelete::Delete {
        crate::volumes::delete(&state, &deleted.volume).await?;
    }
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(post, path = "/api/services/{name}/links", operation_id = "services_link", tag = "services",
    params(("name" = String, Path, description = "The service's name")), request_body = CreateLink,
    responses(
        (status = 200, description = "Linked: the app's next deploy gets the variable", body = LinkView),
        (status = 400, description = "Invalid variable name", body = ErrorBody),
        (status = 404, description = "No such service or app", body = ErrorBody),
        (status = 409, description = "The app gets that variable from another service", body = ErrorBody),
    ))]
pub async fn link(State(state): State<Arc<AppState>>, Path(name): Path<String>, body: Result<Bytes, BytesRejection>) -> Result<Json<LinkView>, ApiError> {
    let request: CreateLink = parse_json(&body_bytes(body)?)?;
    let link = crate::services::link(&state, &name, &request.app, request.variable.as_deref()).await?;
    Ok(Json(LinkView { app: link.app, variable: link.variable }))
}

#[utoipa::path(delete, path = "/api/services/{name}/links/{app}", operation_id = "services_unlink", tag = "services",
    params(("name" = String, Path, description = "The service's name"), ("app" = String, Path, description = "The app's name")),
    responses((status = 204, description = "Unlinked from the app's next deploy on"), (status = 404, description = "Not linked", body = ErrorBody)))]
pub async fn unlink(State(state): State<Arc<AppState>>, Path((name, app)): Path<(String, String)>) -> Result<StatusCode, ApiError> {
    crate::services::unlink(&state, &name, &app).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Rotates the service's password: its node makes the database take a new
/// one, linked apps are redeployed with it once the node runs it, and the
/// old one stops working. Answers at once; `rotation` shows it until done.
#[utoipa::path(post, path = "/api/services/{name}/rotate-password", operation_id = "services_rotate_password", tag = "services",
    params(("name" = String, Path, description = "The service's name")),
    responses(
        (status = 202, description = "Started: `rotation` is present until the node runs the new password and linked apps are redeployed", body = ServiceView),
        (status = 404, description = "No such service", body = ErrorBody),
        (status = 409, description = "Another rotation is unfinished", body = ErrorBody),
        (status = 503, description = "Its node is not reachable: nothing was changed", body = ErrorBody),
    ))]
pub async fn rotate_password(State(state): State<Arc<AppState>>, Path(name): Path<String>) -> Result<(StatusCode, Json<ServiceView>), ApiError> {
    let row = crate::service_ops::rotate_password(&state, &name).await?;
    Ok((StatusCode::ACCEPTED, Json(view(&state, &row).await?)))
}

/// Runs another version of the service: on the same data for a minor
/// version (and a newer major one of Redis and MariaDB); a newer major
/// PostgreSQL version goes through a fresh backup restored into a new
/// service `<name>-<major>`, to which the links then move (`upgrade` in
/// the view follows it; the old service is kept until deleted).
#[utoipa::path(post, path = "/api/services/{name}/upgrade", operation_id = "services_upgrade", tag = "services",
    params(("name" = String, Path, description = "The service's name")), request_body = UpgradeService,
    responses(
        (status = 202, description = "Queued: its node replaces the container on the same data (state `pending` until it reports the new one); or, for a newer major PostgreSQL version, the upgrade started (`upgrade.state` `backing_up`)", body = ServiceView),
        (status = 400, description = "Invalid version", body = ErrorBody),
        (status = 404, description = "No such service", body = ErrorBody),
        (status = 409, description = "Not possible: an older series or major version, the operator's pinned image, the same image, a rotation or an upgrade unfinished; for a major PostgreSQL version, writes not said to be stopped (`writes_stopped`), no backup destination, the service's node unreachable, a newest backup that failed its verification, or the new service's name taken", body = ErrorBody),
    ))]
pub async fn upgrade(State(state): State<Arc<AppState>>, Path(name): Path<String>, body: Result<Bytes, BytesRejection>) -> Result<(StatusCode, Json<ServiceView>), ApiError> {
    let request: UpgradeService = parse_json(&body_bytes(body)?)?;
    let row = cloudweb_core::backups::upgrade::upgrade(&state, &name, &request.version, request.writes_stopped).await?;
    Ok((StatusCode::ACCEPTED, Json(view(&state, &row).await?)))
}

/// Cancels the unfinished major version upgrade from or into the service
/// before its links move: its backup or restore is cancelled, the old
/// service runs on as it was, and a new service the restore made is kept
/// (with what it holds) until deleted by name.
#[utoipa::path(post, path = "/api/services/{name}/upgrade/cancel", operation_id = "services_upgrade_cancel", tag = "services",
    params(("name" = String, Path, description = "Either service of the upgrade")),
    responses(
        (status = 200, description = "Cancelled: the upgrade is `failed`, saying so", body = MajorUpgradeView),
        (status = 404, description = "No unfinished upgrade goes from or into this service", body = ErrorBody),
        (status = 409, description = "Its links have moved already (it ends on its own), or it moved on meanwhile", body = ErrorBody),
    ))]
pub async fn cancel_upgrade(State(state): State<Arc<AppState>>, Path(name): Path<String>) -> Result<Json<MajorUpgradeView>, ApiError> {
    let cancelled = cloudweb_core::backups::upgrade::cancel(&state, &name).await?;
    let view = cloudweb_core::backups::upgrade::view_of(&state, &cancelled.service)
        .await?
        .ok_or_else(|| ApiError::Internal(format!("upgrade {} is not shown after its cancel", cancelled.id)))?;
    Ok(Json(view))
}

#[derive(Debug, serde::Deserialize)]
pub struct ServiceLogsQuery {
    lines: Option<String>,
}

/// The recent output of the service's container, as its node uploads it
/// (kept like apps' runtime logs: live in memory, and in the log store).
#[utoipa::path(get, path = "/api/services/{name}/logs", operation_id = "services_logs", tag = "services",
    params(("name" = String, Path, description = "The service's name"), ("lines" = Option<u32>, Query, description = "How many recent lines (default 100, at most 2000)")),
    responses(
        (status = 200, description = "Recent lines, oldest first", body = ServiceLogsView),
        (status = 400, description = "Invalid query", body = ErrorBody),
        (status = 404, description = "No such service", body = ErrorBody),
    ))]
pub async fn logs(
    State(state): State<Arc<AppState>>,
    Path(name): Path<String>,
    query: Result<Query<ServiceLogsQuery>, QueryRejection>,
) -> Result<Json<ServiceLogsView>, ApiError> {
    let Query(query) = query.map_err(|e| ApiError::BadRequest(format!("invalid query: {}", e.body_text())))?;
    let max = crate::runtime_logs::MAX_APP_LINES;
    let limit = match query.lines.as_deref() {
        None => 100,
        Some(text) => text.parse::<usize>().ok().filter(|n| *n <= max).ok_or_else(|| ApiError::BadRequest(format!("lines must be 0 to {max}")))?,
    };
    load(&state, &name).await?;
    let lines = state.runtime_logs.tail(&crate::services::logs_key(&name), 0, limit, None).await;
    Ok(Json(ServiceLogsView {
        service: name,
        lines: lines
            .into_iter()
            .map(|l| ServiceLogLine { seq: l.seq, ts: l.ts, stream: l.stream, line: l.line, node_id: l.node_id, container: l.container })
            .collect(),
    }))
}
