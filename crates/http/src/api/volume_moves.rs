//! Moving a volume to another node: start a move, follow it, confirm it
//! (which deletes the copy left on the old node).

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use cloudweb_api_types::volumes::{MoveVolume, VolumeMoveList, VolumeMoveView};
use cloudweb_api_types::ErrorBody;

use crate::clock::rfc3339_ms;
use crate::error::{body_bytes, parse_json, ApiError};
use crate::store::VolumeMoveRow;
use crate::AppState;

pub fn view(state: &AppState, moved: &VolumeMoveRow) -> VolumeMoveView {
    let name = |id: &str| state.nodes.get(id).map(|n| n.name.clone());
    VolumeMoveView {
        id: moved.id.clone(),
        volume: moved.volume.clone(),
        from_node_id: moved.from_node.clone(),
        from_node_name: name(&moved.from_node),
        to_node_id: moved.to_node.clone(),
        to_node_name: name(&moved.to_node),
        state: moved.state.clone(),
        reason: moved.reason.clone(),
        files: moved.files,
        bytes: moved.bytes,
        digest: moved.received_digest.clone(),
        stopped_at: moved.stopped_at.map(rfc3339_ms),
        switched_at: moved.switched_at.map(rfc3339_ms),
        finished_at: moved.finished_at.map(rfc3339_ms),
        deployment_id: moved.deployment_id.clone(),
        downtime_ms: moved.downtime_ms,
        source_copy: moved.source_copy.clone(),
        keep_until: moved.keep_until.map(rfc3339_ms),
        created_at: rfc3339_ms(moved.created_at),
    }
}

/// Starts copying the volume to another node over the mesh; the app
/// keeps running on the old node until the copy is checked.
#[utoipa::path(post, path = "/api/volumes/{name}/move", operation_id = "volumes_move", tag = "volumes",
    params(("name" = String, Path, description = "The volume's name")),
    request_body = MoveVolume,
    responses(
        (status = 202, description = "The move started; follow it at /api/volume-moves/{id}", body = VolumeMoveView),
        (status = 400, description = "Invalid body", body = ErrorBody),
        (status = 404, description = "No such volume or node", body = ErrorBody),
        (status = 409, description = "The volume or one of the nodes cannot take part now (the reason says why)", body = ErrorBody),
    ))]
pub async fn start(State(state): State<Arc<AppState>>, Path(name): Path<String>, body: Result<Bytes, BytesRejection>) -> Result<(StatusCode, Json<VolumeMoveView>), ApiError> {
    let request: MoveVolume = parse_json(&body_bytes(body)?)?;
    if let Some(to) = &request.to {
        cloudweb_protocol::validate::bounded_text("to", to, 128).map_err(|e| ApiError::BadRequest(e.to_string()))?;
    }
    let moved = crate::volume_moves::start(&state, &name, request.to.as_deref()).await?;
    Ok((StatusCode::ACCEPTED, Json(view(&state, &moved))))
}

#[utoipa::path(get, path = "/api/volumes/{name}/moves", operation_id = "volumes_moves_list", tag = "volumes",
    params(("name" = String, Path, description = "The volume's name")),
    responses((status = 200, description = "The volume's moves, newest first", body = VolumeMoveList)))]
pub async fn of_volume(State(state): State<Arc<AppState>>, Path(name): Path<String>) -> Result<Json<VolumeMoveList>, ApiError> {
    let moves = state.store.volume_moves_of(&name).await?;
    Ok(Json(VolumeMoveList { moves: moves.iter().map(|m| view(&state, m)).collect() }))
}

#[utoipa::path(get, path = "/api/volume-moves/{id}", operation_id = "volume_moves_show", tag = "volumes",
    params(("id" = String, Path, description = "The move's id")),
    responses((status = 200, description = "The move", body = VolumeMoveView), (status = 404, description = "No such move", body = ErrorBody)))]
pub async fn show(State(state): State<Arc<AppState>>, Path(id): Path<String>) -> Result<Json<VolumeMoveView>, ApiError> {
    let moved = state.store.volume_move(&id).await?.ok_or_else(|| ApiError::NotFound(format!("no volume move {id}")))?;
    Ok(Json(view(&state, &moved)))
}

/// Deletes the copy the move left on the old node, now rather than at the
/// end of the keep period.
#[utoipa::path(post, path = "/api/volume-moves/{id}/confirm", operation_id = "volume_moves_confirm", tag = "volumes",
    params(("id" = String, Path, description = "The move's id")),
    responses(
        (status = 200, description = "The old copy is being deleted", body = VolumeMoveView),
        (status = 404, description = "No such move", body = ErrorBody),
        (status = 409, description = "The move left no old copy (it failed, or has not switched yet)", body = ErrorBody),
    ))]
pub async fn confirm(State(state): State<Arc<AppState>>, Path(id): Path<String>) -> Result<Json<VolumeMoveView>, ApiError> {
    let moved = crate::volume_moves::confirm(&state, &id).await?;
    Ok(Json(view(&state, &moved)))
}
