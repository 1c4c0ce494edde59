//! `POST /agent/v1/volume-moves/{move_id}`: a node's report on a volume
//! move it takes part in (403 from any other node).

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Extension;
use cloudweb_protocol::MoveReport;

use super::AuthedNode;
use crate::error::{body_bytes, parse_json, ApiError};
use crate::AppState;

pub async fn report(
    State(state): State<Arc<AppState>>,
    Extension(AuthedNode(node_id)): Extension<AuthedNode>,
    Path(move_id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<StatusCode, ApiError> {
    let report: MoveReport = parse_json(&body_bytes(body)?)?;
    crate::volume_moves::on_report(&state, &node_id, &move_id, &report).await?;
    Ok(StatusCode::ACCEPTED)
}
