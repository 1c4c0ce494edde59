//! `POST /agent/v1/heartbeat`: capacity, and optionally health and usage.
//! Kept in memory; the batch writer persists it.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::{Extension, Json};
use cloudweb_protocol::Heartbeat;

use super::{AgentInfo, AuthedNode};
use crate::error::{body_bytes, parse_json, ApiError};
use crate::AppState;

pub async fn heartbeat(
    State(state): State<Arc<AppState>>,
    Extension(AuthedNode(node_id)): Extension<AuthedNode>,
    Extension(agent): Extension<AgentInfo>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<cloudweb_protocol::heartbeat::HeartbeatAnswer>, ApiError> {
    let bytes = body_bytes(body)?;
    let mut heartbeat: Heartbeat = parse_json(&bytes)?;
    let body_text = String::from_utf8_lossy(&bytes).into_owned();
    // Health and metrics are additive: a bad one is dropped, and the
    // heartbeat (liveness and capacity) still counts.
    if let Err(err) = heartbeat.validate_health() {
        tracing::warn!(node_id = %node_id, error = %err, "dropped an invalid health block");
        heartbeat.health = None;
    }
    if let Err(err) = heartbeat.validate_metrics() {
        tracing::warn!(node_id = %node_id, error = %err, "dropped an invalid metrics block");
        heartbeat.metrics = None;
    }
    if let Err(err) = heartbeat.validate_ingress() {
        tracing::warn!(node_id = %node_id, error = %err, "dropped an invalid ingress block");
        heartbeat.ingress = None;
    }
    if let Err(err) = heartbeat.validate_mesh_endpoint() {
        tracing::warn!(node_id = %node_id, error = %err, "dropped an invalid mesh endpoint");
        heartbeat.mesh_endpoint = None;
    }
    if let Some(why) = heartbeat.mesh_endpoint.as_deref().and_then(|endpoint| state.config.mesh_endpoints.refusal(endpoint)) {
        tracing::warn!(node_id = %node_id, reason = %why, "dropped a refused mesh endpoint; the node keeps the one it had");
        heartbeat.mesh_endpoint = None;
    }
    let reported_endpoint = heartbeat.mesh_endpoint.clone();
    // Volumes' sizes are written when they change, not at every beat.
    let volume_sizes = heartbeat.metrics.as_ref().and_then(|m| m.volumes.clone()).filter(|sizes| {
        let previous = state.nodes.get(&node_id).and_then(|n| n.metrics).and_then(|m| m.value.volumes);
        previous.as_ref() != Some(sizes)
    });
    // The raw body is kept (in memory, per node) so an operator can see
    // exactly what an agent sends.
    state.last_bodies.lock().expect("last bodies lock").insert(node_id.clone(), body_text);
    let now = tokio::time::Instant::now();
    let Some(node_state) = state.nodes.record_heartbeat(&node_id, heartbeat, agent.version, agent.protocol, now, state.clock.now_ms())
    else {
        return Err(ApiError::NodeNotRegistered(format!("node {node_id} is not registered with this control plane")));
    };
    state.heartbeats_total.fetch_add(1, Ordering::Relaxed);
    if let Some(endpoint) = reported_endpoint {
        update_endpoint(&state, &node_id, &endpoint).await?;
    }
    if let Some(sizes) = volume_sizes {
        let sizes: Vec<(String, u64)> = sizes.into_iter().map(|v| (v.volume, v.bytes)).collect();
        state.store.set_volume_sizes(&node_id, &sizes, state.clock.now_ms()).await?;
    }
    Ok(Json(cloudweb_protocol::heartbeat::HeartbeatAnswer {
        node_id,
        state: node_state.as_str().to_string(),
        control_planes: state.leader.control_planes(),
    }))
}

/// A node whose WireGuard endpoint moved (its public address changed):
/// stored, and every peer told through a `peers` event so it updates the
/// tunnel. An unchanged endpoint costs nothing.
async fn update_endpoint(state: &AppState, node_id: &str, endpoint: &str) -> Result<(), ApiError> {
    let Some(node) = state.nodes.get(node_id) else { return Ok(()) };
    if node.endpoint.as_deref() == Some(endpoint) {
        return Ok(());
    }
    state.store.set_endpoint(node_id, endpoint).await.map_err(ApiError::from)?;
    state.nodes.set_endpoint(node_id, endpoint);
    tracing::info!(node_id, endpoint, previous = ?node.endpoint, "node's mesh endpoint changed");
    if node.wireguard_public_key.is_some() {
        state.hub.notify_all(cloudweb_protocol::events::PEERS);
    }
    Ok(())
}
