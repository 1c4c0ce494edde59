//! `POST /agent/v1/task-runs/{run_id}`: a node's report on a task run
//! it runs: started, output lines, its end (403 from any other node).

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Extension;
use cloudweb_protocol::TaskRunReport;

use super::AuthedNode;
use crate::error::{body_bytes, parse_json, ApiError};
use crate::AppState;

pub async fn report(
    State(state): State<Arc<AppState>>,
    Extension(AuthedNode(node_id)): Extension<AuthedNode>,
    Path(run_id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<StatusCode, ApiError> {
    let report: TaskRunReport = parse_json(&body_bytes(body)?)?;
    cloudweb_core::tasks::on_report(&state, &node_id, &run_id, &report).await?;
    Ok(StatusCode::ACCEPTED)
}
