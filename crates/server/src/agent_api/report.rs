//! `POST /agent/v1/report`: deployment progress and log lines.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::StatusCode;
use axum::Extension;
use cloudweb_protocol::Report;

use super::AuthedNode;
use crate::error::{body_bytes, parse_json, ApiError};
use crate::AppState;

pub async fn report(
    State(state): State<Arc<AppState>>,
    Extension(AuthedNode(node_id)): Extension<AuthedNode>,
    body: Result<Bytes, BytesRejection>,
) -> Result<StatusCode, ApiError> {
    let report: Report = parse_json(&body_bytes(body)?)?;
    report.validate()?;
    state.store.save_report(&node_id, &report, state.clock.now_ms()).await?;
    crate::deploy::on_report(&state, &node_id, &report).await?;
    state.log_hub.notify(&report.deployment_id, "logs");
    Ok(StatusCode::ACCEPTED)
}
