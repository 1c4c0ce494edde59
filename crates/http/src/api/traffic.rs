//! `GET /api/routes`, `GET /api/traffic/{host}` and
//! `GET /api/nodes/{id}/last-heartbeat`: what the ingress serves and counts.

use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::header::CONTENT_TYPE;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::clock::rfc3339_ms;
use crate::error::ApiError;
use crate::AppState;

#[utoipa::path(get, path = "/api/routes", tag = "traffic", responses((status = 200, description = "The ingress route table", body = serde_json::Value)))]
pub async fn routes(State(state): State<Arc<AppState>>) -> Json<Value> {
    let table = state.routes.read().expect("routes lock").clone();
    let ingress: Vec<Value> = state
        .nodes
        .all()
        .iter()
        .filter(|n| n.ingress)
        .map(|n| json!({"node_id": n.id, "name": n.name, "status": n.ingress_status}))
        .collect();
    Json(json!({"version": table.version, "routes": table.routes, "ingress": ingress}))
}

#[derive(Debug, Deserialize)]
pub struct TrafficQuery {
    /// Seconds of history (default one hour, at most 30 days).
    seconds: Option<u64>,
}

/// The start of the window `?seconds=` asks for (default an hour, at most
/// 30 days).
fn since_ms(state: &AppState, query: &TrafficQuery) -> Result<i64, ApiError> {
    let seconds = query.seconds.unwrap_or(3600);
    if seconds == 0 || seconds > 30 * 86_400 {
        return Err(ApiError::BadRequest("seconds must be 1 to 2592000".into()));
    }
    Ok(state.clock.now_ms() - (seconds as i64) * 1000)
}

/// A host's request counts per sample, summed over ingress nodes.
#[utoipa::path(get, path = "/api/traffic/{host}", tag = "traffic", params(("host" = String, Path, description = "A host name"), ("seconds" = Option<u64>, Query, description = "Window, 1 to 2592000 (default 3600)")), responses((status = 200, description = "Request counts per sample", body = serde_json::Value), (status = 400, description = "Invalid window", body = crate::error::ErrorDoc)))]
pub async fn traffic(
    State(state): State<Arc<AppState>>,
    Path(host): Path<String>,
    Query(query): Query<TrafficQuery>,
) -> Result<Json<Value>, ApiError> {
    cloudweb_protocol::validate::hostname("host", &host)?;
    let since = since_ms(&state, &query)?;
    let samples: Vec<Value> = state
        .store
        .traffic(&host.to_ascii_lowercase(), since)
        .await?
        .into_iter()
        .map(|(at, requests, r2xx, r3xx, r4xx, r5xx, dur_sum_ms, slow)| {
            json!({"at": rfc3339_ms(at), "requests": requests, "r2xx": r2xx, "r3xx": r3xx, "r4xx": r4xx, "r5xx": r5xx,
                   "avg_ms": if requests > 0 { dur_sum_ms / requests as f64 } else { 0.0 }, "slow": slow})
        })
        .collect();
    Ok(Json(json!({"host": host, "samples": samples})))
}

/// The last heartbeat body a node sent, byte for byte.
#[utoipa::path(get, path = "/api/nodes/{id}/last-heartbeat", tag = "nodes", params(("id" = String, Path, description = "The node's id")), responses((status = 200, description = "The last heartbeat body, byte for byte", body = serde_json::Value), (status = 404, description = "No heartbeat since start", body = crate::error::ErrorDoc)))]
pub async fn last_heartbeat(State(state): State<Arc<AppState>>, Path(id): Path<String>) -> Result<Response, ApiError> {
    let body = state.last_bodies.lock().expect("last bodies lock").get(&id).cloned();
    match body {
        Some(body) => Ok(([(CONTENT_TYPE, "application/json")], body).into_response()),
        None => Err(ApiError::NotFound(format!("no heartbeat from node {id:?} since the control plane started"))),
    }
}

/// A node's usage history: 30 s samples for the last day, 5-minute
/// averages before that.
#[utoipa::path(get, path = "/api/nodes/{id}/usage", tag = "nodes", params(("id" = String, Path, description = "The node's id"), ("seconds" = Option<u64>, Query, description = "Window, 1 to 2592000 (default 3600)")), responses((status = 200, description = "Usage samples", body = serde_json::Value), (status = 400, description = "Invalid window", body = crate::error::ErrorDoc), (status = 404, description = "No such node", body = crate::error::ErrorDoc)))]
pub async fn node_usage(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
    Query(query): Query<TrafficQuery>,
) -> Result<Json<Value>, ApiError> {
    let since = since_ms(&state, &query)?;
    // An unknown node is a 404, as on every other node route, not an empty
    // history that looks like a node that never reported.
    if state.store.node(&id).await?.is_none() {
        return Err(ApiError::NotFound(format!("no node {id:?}")));
    }
    let samples: Vec<Value> = state
        .store
        .node_usage(&id, since)
        .await?
        .into_iter()
        .map(|(at, resolution, cpu_pct, mem_used, disk_used)| {
            json!({"at": rfc3339_ms(at), "resolution_seconds": resolution, "cpu_pct": cpu_pct, "mem_used": mem_used, "disk_used": disk_used})
        })
        .collect();
    Ok(Json(json!({"node_id": id, "samples": samples})))
}
