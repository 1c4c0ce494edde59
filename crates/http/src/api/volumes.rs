//! Persistent volumes: list them, mount one in an app (new, or a detached
//! one with its data), detach one, delete one by name, and what deleting an
//! app does with its volumes. Data goes only on a request that names it.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::Json;
use cloudweb_api_types::volumes::{AttachVolume, DeleteAppQuery, VolumeList, VolumeView, VolumesOnDelete};
use cloudweb_api_types::ErrorBody;

use crate::clock::rfc3339_ms;
use crate::error::{body_bytes, parse_json, ApiError};
use crate::store::{Attached, VolumeRow};
use crate::AppState;

/// Warnings start at this share of the node's disk in use.
const DISK_WARNINGS: [u64; 2] = [90, 80];

/// A warning when the disk of the node holding the volume is 80 % (or
/// 90 %) full, from the node's latest usage sample.
fn disk_warning(state: &AppState, volume: &VolumeRow) -> Option<String> {
    let node = state.nodes.get(volume.node_id.as_deref()?)?;
    let total = node.capacity?.disk_bytes;
    let used = node.metrics.as_ref()?.value.node.as_ref()?.disk_used?;
    if total == 0 {
        return None;
    }
    let percent = used.saturating_mul(100) / total;
    let level = DISK_WARNINGS.into_iter().find(|level| percent >= *level)?;
    Some(format!("the disk of node {} is {percent}% full (over {level}%)", node.name))
}

pub fn view(state: &AppState, volume: &VolumeRow) -> VolumeView {
    VolumeView {
        warning: disk_warning(state, volume),
        name: volume.name.clone(),
        state: match (&volume.app, &volume.service) {
            (Some(_), _) => "attached",
            (None, Some(_)) => "service",
            (None, None) => "detached",
        }
        .to_string(),
        service: volume.service.clone(),
        app: volume.app.clone(),
        path: volume.mount_path.clone(),
        node_id: volume.node_id.clone(),
        node_name: volume.node_id.as_deref().and_then(|id| state.nodes.get(id)).map(|n| n.name.clone()),
        size_bytes: volume.size_bytes,
        size_at: volume.size_at.map(rfc3339_ms),
        created_at: rfc3339_ms(volume.created_at),
    }
}

#[utoipa::path(get, path = "/api/volumes", operation_id = "volumes_list", tag = "volumes",
    responses((status = 200, description = "Every volume, attached or detached", body = VolumeList)))]
pub async fn list(State(state): State<Arc<AppState>>, axum::Extension(access): axum::Extension<crate::access::Access>) -> Result<Json<VolumeList>, ApiError> {
    let mut volumes = Vec::new();
    for volume in state.store.volumes().await? {
        if crate::access::sees_owned(&state, &access, crate::store::Owned::Volume, &volume.name).await? {
            volumes.push(view(&state, &volume));
        }
    }
    Ok(Json(VolumeList { volumes }))
}

#[utoipa::path(get, path = "/api/apps/{name}/volumes", operation_id = "apps_volumes_list", tag = "volumes",
    params(("name" = String, Path, description = "The app's name")),
    responses((status = 200, description = "The app's volumes", body = VolumeList), (status = 404, description = "No such app", body = ErrorBody)))]
pub async fn of_app(State(state): State<Arc<AppState>>, Path(name): Path<String>) -> Result<Json<VolumeList>, ApiError> {
    if state.store.app(&name).await?.is_none() {
        return Err(ApiError::NotFound(format!("no app named {name}")));
    }
    let volumes = state.store.app_volumes(&name).await?;
    Ok(Json(VolumeList { volumes: volumes.iter().map(|v| view(&state, v)).collect() }))
}

/// Mounts a volume in the app from its next deployment on.
#[utoipa::path(post, path = "/api/apps/{name}/volumes", operation_id = "apps_volumes_attach", tag = "volumes",
    params(("name" = String, Path, description = "The app's name")),
    request_body = AttachVolume,
    responses(
        (status = 201, description = "A new volume, mounted from the next deployment on", body = VolumeView),
        (status = 200, description = "A detached volume attached again, with its data", body = VolumeView),
        (status = 400, description = "Invalid name or path", body = ErrorBody),
        (status = 404, description = "No such app", body = ErrorBody),
        (status = 409, description = "Attached elsewhere, the path is taken, or its data is on another node than the app's other volumes", body = ErrorBody),
    ))]
pub async fn attach(
    State(state): State<Arc<AppState>>,
    Path(name): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<(StatusCode, Json<VolumeView>), ApiError> {
    let request: AttachVolume = parse_json(&body_bytes(body)?)?;
    match crate::volumes::attach(&state, &name, &request.name, &request.path).await? {
        Attached::Created(volume) => Ok((StatusCode::CREATED, Json(view(&state, &volume)))),
        Attached::Reattached(volume) => Ok((StatusCode::OK, Json(view(&state, &volume)))),
    }
}

/// Unmounts a volume from the app from its next deployment on; the data
/// stays on its node and the volume is listed as detached.
#[utoipa::path(delete, path = "/api/apps/{name}/volumes/{volume}", operation_id = "apps_volumes_detach", tag = "volumes",
    params(("name" = String, Path, description = "The app's name"), ("volume" = String, Path, description = "The volume's name")),
    responses((status = 204, description = "Detached; the data stays"), (status = 404, description = "The app does not mount it", body = ErrorBody)))]
pub async fn detach(State(state): State<Arc<AppState>>, Path((name, volume)): Path<(String, String)>) -> Result<StatusCode, ApiError> {
    crate::volumes::detach(&state, &name, &volume).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Deletes a detached volume and its data on its node.
#[utoipa::path(delete, path = "/api/volumes/{name}", operation_id = "volumes_delete", tag = "volumes",
    params(("name" = String, Path, description = "The volume's name")),
    responses(
        (status = 204, description = "Deleted; its node removes the data"),
        (status = 404, description = "No such volume", body = ErrorBody),
        (status = 409, description = "Still attached to an app", body = ErrorBody),
    ))]
pub async fn remove(State(state): State<Arc<AppState>>, Path(name): Path<String>) -> Result<StatusCode, ApiError> {
    let deleted = crate::volumes::delete(&state, &name).await?;
    cloudweb_core::backups::cancel_jobs_of(&state, &cloudweb_core::backups::Target::Volume(deleted.name.clone()), "the volume was deleted").await?;
    Ok(StatusCode::NO_CONTENT)
}

/// What `DELETE /api/apps/{name}?volumes=…` asked for.
pub fn delete_query(query: Result<Query<DeleteAppQuery>, QueryRejection>) -> Result<VolumesOnDelete, ApiError> {
    query
        .map(|Query(q)| q.volumes)
        .map_err(|e| ApiError::BadRequest(format!("invalid query: {}; volumes= takes keep or delete", e.body_text())))
}

/// Before an app is deleted: refuses (naming them) when it has volumes
/// and the request did not say what becomes of them. Returns the volumes
/// to delete after the app is gone (none when they are kept).
pub async fn before_app_delete(state: &AppState, app: &str, choice: VolumesOnDelete) -> Result<Vec<String>, ApiError> {
    let volumes = state.store.app_volumes(app).await?;
    if volumes.is_empty() {
        return Ok(Vec::new());
    }
    let names: Vec<String> = volumes.iter().map(|v| v.name.clone()).collect();
    match choice {
        VolumesOnDelete::Refuse => Err(ApiError::Conflict(format!(
            "app {app} has volumes ({}): delete it with volumes=keep to keep them detached with their data, or volumes=delete to delete them too",
            names.join(", ")
        ))),
        VolumesOnDelete::Keep => Ok(Vec::new()),
        VolumesOnDelete::Delete => Ok(names),
    }
}

/// After the app is gone (its volumes detached with it): deletes the ones
/// the request named for deletion.
pub async fn after_app_delete(state: &AppState, doomed: &[String]) -> Result<(), ApiError> {
    for name in doomed {
        crate::volumes::delete(state, name).await?;
    }
    Ok(())
}
