//! `POST /agent/v1/backup-jobs/{job_id}`: a node's report on a backup,
//! verification or restore it runs (403 from any other node).

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Extension;
use cloudweb_protocol::BackupJobReport;

use super::AuthedNode;
use crate::error::{body_bytes, parse_json, ApiError};
use crate::AppState;

pub async fn report(
    State(state): State<Arc<AppState>>,
    Extension(AuthedNode(node_id)): Extension<AuthedNode>,
    Path(job_id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<StatusCode, ApiError> {
    let report: BackupJobReport = parse_json(&body_bytes(body)?)?;
    cloudweb_core::backups::on_report(&state, &node_id, &job_id, &report).await?;
    Ok(StatusCode::ACCEPTED)
}
