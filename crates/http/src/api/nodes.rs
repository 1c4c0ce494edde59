//! `/api/nodes`: list, inspect and remove nodes, and queue commands to one.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::Json;
use cloudweb_protocol::{CommandKind, StopPayload};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tokio::time::Instant;

use crate::agent_api::commands as commands_wire;
use crate::clock::rfc3339_ms;
use crate::error::{body_bytes, parse_json, ApiError};
use crate::live::HealthState;
use crate::store::NodeRow;
use crate::AppState;

#[derive(Debug, Serialize)]
pub struct NodeView {
    id: String,
    name: String,
    hostname: String,
    state: &'static str,
    /// May receive new instances.
    eligible: bool,
    ingress: bool,
    mesh_address: String,
    /// `host:port` other nodes reach its WireGuard at (none behind NAT).
    mesh_endpoint: Option<String>,
    version: Option<String>,
    protocol: Option<i64>,
    joined_at: String,
    last_heartbeat: Option<String>,
    capacity: Option<Value>,
    health: &'static str,
    health_reason: Option<String>,
    health_report: Option<Value>,
    features: Vec<String>,
    metrics: Option<Value>,
    /// Apps that could not be moved off this node (draining or
    /// unreachable), with the scheduler's reason.
    waiting: Vec<Value>,
    /// The node's client certificate: its fingerprint, when it ends, and
    /// when the node last switched to a renewed one.
    certificate: Value,
}

fn view(state: &AppState, row: &NodeRow, now: Instant) -> NodeView {
    let live = state.nodes.get(&row.id);
    let (node_state, health, reason, report, features, metrics, capacity, heartbeat_ms, version, protocol) = match &live {
        Some(live) => {
            let (health, reason) = match live.health_state(now) {
                HealthState::Healthy => ("healthy", None),
                HealthState::Degraded(reason) => ("degraded", Some(reason)),
                HealthState::Unknown => ("unknown", None),
            };
            let current = live.current_health(now);
            (
                live.state(now, state.config.unreachable_after).as_str(),
                health,
                reason,
                current.map(|h| serde_json::to_value(h).unwrap_or(Value::Null)),
                current.and_then(|h| h.features.clone()).unwrap_or_default(),
                live.metrics.as_ref().map(|m| json!({"at": rfc3339_ms(m.at_ms), "sample": m.value})),
                live.capacity.map(|c| json!({"cpu_cores": c.cpu_cores, "mem_bytes": c.mem_bytes, "disk_bytes": c.disk_bytes})),
                live.heartbeat_at_ms,
                live.agent_version.clone(),
                Some(i64::from(live.protocol)),
            )
        }
        None => ("unreachable", "unknown", None, None, Vec::new(), None, None, row.last_heartbeat_at, row.agent_version.clone(), row.protocol),
    };
    NodeView {
        id: row.id.clone(),
        name: row.name.clone(),
        hostname: row.hostname.clone(),
        state: node_state,
        eligible: live.as_ref().is_some_and(|l| l.eligible(now, state.config.unreachable_after)),
        ingress: row.ingress,
        mesh_address: crate::mesh_address(row.mesh_index),
        mesh_endpoint: live.as_ref().map_or_else(|| row.endpoint.clone(), |l| l.endpoint.clone()),
        version,
        protocol,
        joined_at: rfc3339_ms(row.joined_at),
        last_heartbeat: heartbeat_ms.map(rfc3339_ms),
        capacity,
        health,
        health_reason: reason,
        health_report: report,
        features,
        metrics,
        waiting: state
            .waiting
            .lock()
            .expect("waiting lock")
            .get(&row.id)
            .map(|apps| apps.iter().map(|(app, reason)| json!({"app": app, "reason": reason})).collect())
            .unwrap_or_default(),
        certificate: {
            let (sha256, not_after) = match &live {
                Some(live) => (live.cert_sha256.clone(), live.cert_not_after),
                None => (row.cert_sha256.clone(), row.cert_not_after),
            };
            json!({
                "sha256": sha256,
                "not_after": not_after.map(rfc3339_ms),
                "renewed_at": row.cert_renewed_at.map(rfc3339_ms),
            })
        },
    }
}

async fn set_draining(state: &AppState, id: &str, draining: bool) -> Result<Json<NodeView>, ApiError> {
    if !state.store.set_draining(id, draining).await? {
        return Err(ApiError::NotFound(format!("no node {id:?}")));
    }
    state.nodes.set_draining(id, draining);
    tracing::info!(node_id = %id, draining, "node drain changed");
    if draining {
        // Start the replacements now rather than on the next tick, so the
        // answer can list what has to wait.
        let waiting = crate::deploy::moves::move_instances(state).await?;
        *state.waiting.lock().expect("waiting lock") = waiting;
    }
    let row = state.store.node(id).await?.ok_or_else(|| ApiError::NotFound(format!("no node {id:?}")))?;
    Ok(Json(view(state, &row, Instant::now())))
}

/// Stops placing instances on the node and moves its instances elsewhere;
/// each old instance stops once its replacement runs.
#[utoipa::path(post, path = "/api/nodes/{id}/drain", tag = "nodes", params(("id" = String, Path, description = "The node's id")), responses((status = 200, description = "The node, draining", body = serde_json::Value), (status = 404, description = "No such node", body = crate::error::ErrorDoc)))]
pub async fn drain(State(state): State<Arc<AppState>>, Path(id): Path<String>) -> Result<Json<NodeView>, ApiError> {
    set_draining(&state, &id, true).await
}

/// The node takes new instances again. Moves already started go on.
#[utoipa::path(post, path = "/api/nodes/{id}/undrain", tag = "nodes", params(("id" = String, Path, description = "The node's id")), responses((status = 200, description = "The node, taking instances again", body = serde_json::Value), (status = 404, description = "No such node", body = crate::error::ErrorDoc)))]
pub async fn undrain(State(state): State<Arc<AppState>>, Path(id): Path<String>) -> Result<Json<NodeView>, ApiError> {
    set_draining(&state, &id, false).await
}

#[utoipa::path(get, path = "/api/nodes", tag = "nodes", responses((status = 200, description = "Every node", body = serde_json::Value)))]
pub async fn list(State(state): State<Arc<AppState>>) -> Result<Json<Value>, ApiError> {
    let now = Instant::now();
    let rows = state.store.nodes().await?;
    let nodes: Vec<NodeView> = rows.iter().map(|row| view(&state, row, now)).collect();
    Ok(Json(json!({ "nodes": nodes })))
}

#[utoipa::path(get, path = "/api/nodes/{id}", tag = "nodes", params(("id" = String, Path, description = "The node's id")), responses((status = 200, description = "The node", body = serde_json::Value), (status = 404, description = "No such node", body = crate::error::ErrorDoc)))]
pub async fn show(State(state): State<Arc<AppState>>, Path(id): Path<String>) -> Result<Json<NodeView>, ApiError> {
    let row = state.store.node(&id).await?.ok_or_else(|| ApiError::NotFound(format!("no node {id:?}")))?;
    Ok(Json(view(&state, &row, Instant::now())))
}

#[derive(Debug, Deserialize)]
pub struct RemoveQuery {
    force: Option<String>,
}

impl RemoveQuery {
    pub fn new(force: bool) -> RemoveQuery {
        RemoveQuery { force: force.then(|| "1".to_string()) }
    }
}

/// Removes a node that runs nothing. A node that still has instances can
/// only be removed when it is unreachable and `force=1` is given; its
/// instances become failed.
#[utoipa::path(delete, path = "/api/nodes/{id}", tag = "nodes", params(("id" = String, Path, description = "The node's id"), ("force" = Option<String>, Query, description = "1: remove an unreachable node that still has instances")), responses((status = 204, description = "Removed"), (status = 404, description = "No such node", body = crate::error::ErrorDoc), (status = 409, description = "The node still runs instances", body = crate::error::ErrorDoc)))]
pub async fn remove(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
    Query(query): Query<RemoveQuery>,
) -> Result<StatusCode, ApiError> {
    let force = crate::agent_api::leave::parse_force(query.force.as_deref())?;
    if state.store.node(&id).await?.is_none() {
        return Err(ApiError::NotFound(format!("no node {id:?}")));
    }
    let apps = state.store.apps_on_node(&id).await?;
    if !apps.is_empty() {
        let unreachable = state
            .nodes
            .get(&id)
            .is_none_or(|n| n.state(Instant::now(), state.config.unreachable_after) == crate::live::NodeState::Unreachable);
        if !(force && unreachable) {
            return Err(ApiError::Conflict(format!(
                "node {id} still runs {}; drain it first (or, if it is unreachable, remove it with force=1)",
                apps.join(", ")
            )));
        }
        crate::remove_node(&state, &id).await?;
        let loss = crate::deploy::fail_node_instances(&state, &id, &format!("node {id} was removed")).await?;
        tracing::info!(node_id = %id, failed = ?loss.failed, rescheduled = ?loss.rescheduled, "node removed by the API");
        return Ok(StatusCode::NO_CONTENT);
    }
    crate::remove_node(&state, &id).await?;
    tracing::info!(node_id = %id, "node removed by the API");
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Debug, Deserialize)]
struct EnqueueRequest {
    #[serde(rename = "type")]
    kind: String,
    payload: Value,
}

/// Queues a command for one node. Only `stop` may be queued by hand; deploys
/// come from the scheduler.
#[utoipa::path(post, path = "/api/nodes/{id}/commands", tag = "nodes", params(("id" = String, Path, description = "The node's id")), request_body = serde_json::Value, responses((status = 201, description = "Queued", body = serde_json::Value), (status = 400, description = "Only stop commands may be queued by hand", body = crate::error::ErrorDoc), (status = 404, description = "No such node", body = crate::error::ErrorDoc)))]
pub async fn enqueue(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let request: EnqueueRequest = parse_json(&body_bytes(body)?)?;
    match CommandKind::parse(&request.kind) {
        Some(CommandKind::Stop) => {
            let payload: StopPayload = serde_json::from_value(request.payload.clone())
                .map_err(|e| ApiError::BadRequest(format!("invalid stop payload: {e}")))?;
            payload.validate()?;
        }
        Some(CommandKind::Deploy) => {
            return Err(ApiError::BadRequest("deploy commands are created by deployments, not queued by hand".into()))
        }
        None => return Err(ApiError::BadRequest("type must be \"stop\"".to_string())),
    }
    if state.store.node(&id).await?.is_none() {
        return Err(ApiError::NotFound(format!("no node {id:?}")));
    }
    let row = crate::queue_command(&state, &id, CommandKind::Stop, &request.payload).await?;
    let wire = commands_wire::to_wire(&state, &row)?;
    Ok((StatusCode::CREATED, Json(serde_json::to_value(wire).unwrap_or(Value::Null))))
}

#[utoipa::path(get, path = "/api/nodes/{id}/commands", tag = "nodes", params(("id" = String, Path, description = "The node's id")), responses((status = 200, description = "The node's queued commands", body = serde_json::Value), (status = 404, description = "No such node", body = crate::error::ErrorDoc)))]
pub async fn commands(State(state): State<Arc<AppState>>, Path(id): Path<String>) -> Result<Json<Value>, ApiError> {
    if state.store.node(&id).await?.is_none() {
        return Err(ApiError::NotFound(format!("no node {id:?}")));
    }
    let rows = state.store.node_commands(&id, 100).await?;
    let commands: Vec<Value> = rows
        .iter()
        .map(|row| {
            json!({
                "id": commands_wire::command_id(row.seq),
                "type": row.kind,
                "created_at": rfc3339_ms(row.created_at),
                "acked_at": row.acked_at.map(rfc3339_ms),
                "ack_count": row.ack_count,
            })
        })
        .collect();
    Ok(Json(json!({ "commands": commands })))
}
