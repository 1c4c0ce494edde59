//! The control plane's own backups on demand: its state, CA and keys to
//! every destination's control-plane repository (see
//! `cloudweb_core::backups::control_plane`).

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use cloudweb_api_types::backups::BackupJobView;
use cloudweb_api_types::ErrorBody;
use cloudweb_core::backups;

use crate::error::ApiError;
use crate::AppState;

/// Backs the control plane up now, to every destination one after the
/// other; the answer is the first destination's job (`GET
/// /api/backups/{id}` follows it).
#[utoipa::path(post, path = "/api/control-plane/backups", operation_id = "control_plane_backups_run", tag = "backups",
    responses(
        (status = 202, description = "Under way; the first destination's job", body = BackupJobView),
        (status = 409, description = "No destination, or a backup of the control plane is under way", body = ErrorBody),
    ))]
pub async fn run(State(state): State<Arc<AppState>>) -> Result<(StatusCode, Json<BackupJobView>), ApiError> {
    let job = backups::control_plane::run_now(&state).await?;
    Ok((StatusCode::ACCEPTED, Json(backups::job_view(&job))))
}
