//! `/api/nodes`: list, inspect and remove nodes, and queue commands to one.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::Json;
use cloudweb_protocol::{CommandKind, StopPayload};
use cloudweb_api_types::nodes::{Capacity, CommandRequest, MetricsView, NodeCertificate, NodeCommand, NodeCommandList, NodeList, NodeView, Waiting};
use cloudweb_api_types::ErrorBody;
use serde::Deserialize;
use tokio::time::Instant;

use crate::agent_api::commands as commands_wire;
use crate::clock::rfc3339_ms;
use crate::error::{body_bytes, parse_json, ApiError};
use crate::live::HealthState;
use crate::store::NodeRow;
use crate::AppState;

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
                current.cloned(),
                current.and_then(|h| h.features.clone()).unwrap_or_default(),
                live.metrics.as_ref().map(|m| MetricsView { at: rfc3339_ms(m.at_ms), sample: m.value.clone() }),
                live.capacity.map(|c| Capacity { cpu_cores: c.cpu_cores, mem_bytes: c.mem_bytes, disk_bytes: c.disk_bytes }),
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
        state: node_state.to_string(),
        eligible: live.as_ref().is_some_and(|l| l.eligible(now, state.config.unreachable_after)),
        ingress: row.ingress,
        mesh_address: crate::mesh_address(row.mesh_index),
        mesh_endpoint: live.as_ref().map_or_else(|| row.endpoint.clone(), |l| l.endpoint.clone()),
        version,
        protocol,
        joined_at: rfc3339_ms(row.joined_at),
        last_heartbeat: heartbeat_ms.map(rfc3339_ms),
        capacity,
        health: health.to_string(),
        health_reason: reason,
        health_report: report,
        features,
        metrics,
        waiting: state
            .waiting
            .lock()
            .expect("waiting lock")
            .get(&row.id)
            .map(|apps| apps.iter().map(|(app, reason)| Waiting { app: app.clone(), reason: reason.clone() }).collect())
            .unwrap_or_default(),
        certificate: {
            let (sha256, not_after) = match &live {
                Some(live) => (live.cert_sha256.clone(), live.cert_not_after),
                None => (row.cert_sha256.clone(), row.cert_not_after),
            };
            NodeCertificate { sha256, not_after: not_after.map(rfc3339_ms), renewed_at: row.cert_renewed_at.map(rfc3339_ms) }
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
#[utoipa::path(post, path = "/api/nodes/{id}/drain", operation_id = "nodes_drain", tag = "nodes", params(("id" = String, Path, description = "The node's id")),
    responses((status = 200, description = "The node, draining; `waiting` lists apps that cannot move yet", body = NodeView), (status = 404, description = "No such node", body = ErrorBody)))]
pub async fn drain(State(state): State<Arc<AppState>>, Path(id): Path<String>) -> Result<Json<NodeView>, ApiError> {
    set_draining(&state, &id, true).await
}

/// The node takes new instances again. Moves already started go on.
#[utoipa::path(post, path = "/api/nodes/{id}/undrain", operation_id = "nodes_undrain", tag = "nodes", params(("id" = String, Path, description = "The node's id")),
    responses((status = 200, description = "The node, taking instances again", body = NodeView), (status = 404, description = "No such node", body = ErrorBody)))]
pub async fn undrain(State(state): State<Arc<AppState>>, Path(id): Path<String>) -> Result<Json<NodeView>, ApiError> {
    set_draining(&state, &id, false).await
}

#[utoipa::path(get, path = "/api/nodes", operation_id = "nodes_list", tag = "nodes", responses((status = 200, description = "Every node", body = NodeList)))]
pub async fn list(State(state): State<Arc<AppState>>) -> Result<Json<NodeList>, ApiError> {
    let now = Instant::now();
    let rows = state.store.nodes().await?;
    let nodes = rows.iter().map(|row| view(&state, row, now)).collect();
    Ok(Json(NodeList { nodes }))
}

#[utoipa::path(get, path = "/api/nodes/{id}", operation_id = "nodes_show", tag = "nodes", params(("id" = String, Path, description = "The node's id")),
    responses((status = 200, description = "The node", body = NodeView), (status = 404, description = "No such node", body = ErrorBody)))]
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
#[utoipa::path(delete, path = "/api/nodes/{id}", operation_id = "nodes_delete", tag = "nodes",
    params(("id" = String, Path, description = "The node's id"), ("force" = Option<String>, Query, description = "1: remove an unreachable node that still has instances")),
    responses(
        (status = 204, description = "Removed"),
        (status = 400, description = "Invalid force", body = ErrorBody),
        (status = 404, description = "No such node", body = ErrorBody),
        (status = 409, description = "The node still runs instances", body = ErrorBody),
    ))]
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

/// Queues a command for one node. Only `stop` may be queued by hand; deploys
/// come from the scheduler.
#[utoipa::path(post, path = "/api/nodes/{id}/commands", operation_id = "nodes_commands_create", tag = "nodes", params(("id" = String, Path, description = "The node's id")), request_body = CommandRequest,
    responses(
        (status = 201, description = "Queued: the command as the node will get it", body = cloudweb_protocol::Command),
        (status = 400, description = "Only stop commands may be queued by hand", body = ErrorBody),
        (status = 404, description = "No such node", body = ErrorBody),
        (status = 413, description = "Body over 1 MiB", body = ErrorBody),
    ))]
pub async fn enqueue(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<(StatusCode, Json<cloudweb_protocol::Command>), ApiError> {
    let request: CommandRequest = parse_json(&body_bytes(body)?)?;
    match CommandKind::parse(&request.kind) {
        Some(CommandKind::Stop) => {
            let payload: StopPayload = serde_json::from_value(request.payload.clone())
                .map_err(|e| ApiError::BadRequest(format!("invalid stop payload: {e}")))?;
            payload.validate()?;
        }
        Some(CommandKind::Deploy) => {
            return Err(ApiError::BadRequest("deploy commands are created by deployments, not queued by hand".into()))
        }
        Some(_) => {
            return Err(ApiError::BadRequest(format!("{} commands are queued by the volumes and services routes, not by hand", request.kind)))
        }
        None => return Err(ApiError::BadRequest("type must be \"stop\"".to_string())),
    }
    if state.store.node(&id).await?.is_none() {
        return Err(ApiError::NotFound(format!("no node {id:?}")));
    }
    let row = crate::queue_command(&state, &id, CommandKind::Stop, &request.payload).await?;
    let wire = commands_wire::to_wire(&state, &row)?;
    Ok((StatusCode::CREATED, Json(wire)))
}

#[utoipa::path(get, path = "/api/nodes/{id}/commands", operation_id = "nodes_commands_list", tag = "nodes", params(("id" = String, Path, description = "The node's id")),
    responses((status = 200, description = "The node's latest commands", body = NodeCommandList), (status = 404, description = "No such node", body = ErrorBody)))]
pub async fn commands(State(state): State<Arc<AppState>>, Path(id): Path<String>) -> Result<Json<NodeCommandList>, ApiError> {
    if state.store.node(&id).await?.is_none() {
        return Err(ApiError::NotFound(format!("no node {id:?}")));
    }
    let rows = state.store.node_commands(&id, 100).await?;
    let commands = rows
        .iter()
        .map(|row| NodeCommand {
            id: commands_wire::command_id(row.seq),
            kind: row.kind.clone(),
            created_at: rfc3339_ms(row.created_at),
            acked_at: row.acked_at.map(rfc3339_ms),
            ack_count: row.ack_count,
        })
        .collect();
    Ok(Json(NodeCommandList { commands }))
}
