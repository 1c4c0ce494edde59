//! `POST /agent/v1/report`: deployment progress and log lines.
//!
//! A report is checked before anything of it is stored: its deployment
//! must exist (404) and the instance it names, or for a report without an
//! instance any instance of it, must be placed on the sending node (403), so
//! one node cannot write lines into another node's deployments. Free text is
//! made valid rather than refused: a state change must never be lost over
//! the wording of its message.

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
    let mut report: Report = parse_json(&body_bytes(body)?)?;
    // Agents sanitise what they send; older ones may not.
    report.sanitize();
    report.validate()?;
    crate::deploy::check_report(&state, &node_id, &report).await?;
    state.store.save_report(&node_id, &report, state.clock.now_ms()).await?;
    crate::deploy::on_report(&state, &node_id, &report).await?;
    state.log_hub.notify(&report.deployment_id, "logs");
    Ok(StatusCode::ACCEPTED)
}
