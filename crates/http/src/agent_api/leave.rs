//! `POST /agent/v1/leave[?force=1]`: a node removes itself from the cluster.

use std::sync::Arc;

use axum::extract::{Query, State};
use axum::{Extension, Json};
use axum::http::StatusCode;
use cloudweb_protocol::{LeaveConflict, LeaveResponse};
use serde_json::json;
use serde::Deserialize;

use super::AuthedNode;
use crate::error::ApiError;
use crate::AppState;

#[derive(Debug, Deserialize)]
pub struct LeaveQuery {
    force: Option<String>,
}

/// `force` accepts `1`/`true` and `0`/`false`; anything else is an error
/// rather than a silent "no".
pub fn parse_force(value: Option<&str>) -> Result<bool, ApiError> {
    match value {
        None | Some("0") | Some("false") => Ok(false),
        Some("1") | Some("true") => Ok(true),
        Some(_) => Err(ApiError::BadRequest("force must be 1 or 0".to_string())),
    }
}

pub async fn leave(
    State(state): State<Arc<AppState>>,
    Extension(AuthedNode(node_id)): Extension<AuthedNode>,
    Query(query): Query<LeaveQuery>,
) -> Result<(StatusCode, Json<serde_json::Value>), ApiError> {
    let force = parse_force(query.force.as_deref())?;
    let apps = state.store.apps_on_node(&node_id).await?;
    if !apps.is_empty() && !force {
        let error = format!("node {node_id} still runs {}; drain it first, or leave with force=1", apps.join(", "));
        return Ok((StatusCode::CONFLICT, Json(json!(LeaveConflict { error, apps }))));
    }
    // The node goes first, so nothing is placed on it again while its
    // instances are replaced.
    crate::remove_node(&state, &node_id).await?;
    let loss = if apps.is_empty() {
        crate::deploy::NodeLoss::default()
    } else {
        crate::deploy::fail_node_instances(&state, &node_id, &format!("node {node_id} left the cluster")).await?
    };
    tracing::info!(node_id = %node_id, force, failed = ?loss.failed, rescheduled = ?loss.rescheduled, "node left the cluster");
    Ok((StatusCode::OK, Json(json!(LeaveResponse { node_id, failed_deployments: loss.failed, rescheduled: loss.rescheduled }))))
}
