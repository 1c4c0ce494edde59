//! `POST /agent/v1/heartbeat`: capacity, and optionally health and usage.
//! Kept in memory; the batch writer persists it.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::{Extension, Json};
use cloudweb_protocol::Heartbeat;
use serde_json::json;

use super::{AgentInfo, AuthedNode};
use crate::error::{body_bytes, parse_json, ApiError};
use crate::AppState;

pub async fn heartbeat(
    State(state): State<Arc<AppState>>,
    Extension(AuthedNode(node_id)): Extension<AuthedNode>,
    Extension(agent): Extension<AgentInfo>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let heartbeat: Heartbeat = parse_json(&body_bytes(body)?)?;
    heartbeat.validate()?;
    let now = tokio::time::Instant::now();
    if !state.nodes.record_heartbeat(&node_id, heartbeat, agent.version, agent.protocol, now, state.clock.now_ms()) {
        return Err(ApiError::Forbidden(format!("node {node_id} is not registered with this control plane")));
    }
    state.heartbeats_total.fetch_add(1, Ordering::Relaxed);
    let node = state.nodes.get(&node_id);
    let node_state = node.map(|n| n.state(now, state.config.unreachable_after).as_str()).unwrap_or("unknown");
    Ok(Json(json!({ "node_id": node_id, "state": node_state })))
}
