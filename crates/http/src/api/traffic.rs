//! `GET /api/routes`, `GET /api/traffic/{host}` and
//! `GET /api/nodes/{id}/last-heartbeat`: what the ingress serves and counts.

use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::header::CONTENT_TYPE;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use cloudweb_api_types::traffic::{IngressNode, RouteTableView, TrafficSample, TrafficView, UsageSample, UsageView};
use cloudweb_api_types::ErrorBody;

use crate::clock::rfc3339_ms;
use crate::error::ApiError;
use crate::AppState;

#[utoipa::path(get, path = "/api/routes", operation_id = "routes_show", tag = "traffic", responses((status = 200, description = "The ingress route table, and what each ingress node serves", body = RouteTableView)))]
pub async fn routes(State(state): State<Arc<AppState>>) -> Json<RouteTableView> {
    let table = state.routes.read().expect("routes lock").clone();
    let ingress = state
        .nodes
        .all()
        .iter()
        .filter(|n| n.ingress)
        .map(|n| IngressNode { node_id: n.id.clone(), name: n.name.clone(), status: n.ingress_status.clone() })
        .collect();
    Json(RouteTableView { version: table.version, routes: table.routes, ingress })
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
#[utoipa::path(get, path = "/api/traffic/{host}", operation_id = "traffic_show", tag = "traffic", params(("host" = String, Path, description = "A host name"), ("seconds" = Option<u64>, Query, description = "Window, 1 to 2592000 (default 3600)")),
    responses((status = 200, description = "Request counts per sample", body = TrafficView), (status = 400, description = "Invalid host or window", body = ErrorBody)))]
pub async fn traffic(
    State(state): State<Arc<AppState>>,
    Path(host): Path<String>,
    Query(query): Query<TrafficQuery>,
) -> Result<Json<TrafficView>, ApiError> {
    cloudweb_protocol::validate::hostname("host", &host)?;
    let since = since_ms(&state, &query)?;
    let samples = state
        .store
        .traffic(&host.to_ascii_lowercase(), since)
        .await?
        .into_iter()
        .map(|(at, requests, r2xx, r3xx, r4xx, r5xx, dur_sum_ms, slow)| TrafficSample {
            at: rfc3339_ms(at),
            requests,
            r2xx,
            r3xx,
            r4xx,
            r5xx,
            avg_ms: if requests > 0 { dur_sum_ms / requests as f64 } else { 0.0 },
            slow,
        })
        .collect();
    Ok(Json(TrafficView { host, samples }))
}

/// The last heartbeat body a node sent, byte for byte.
#[utoipa::path(get, path = "/api/nodes/{id}/last-heartbeat", operation_id = "nodes_last_heartbeat", tag = "nodes", params(("id" = String, Path, description = "The node's id")),
    responses((status = 200, description = "The last heartbeat body, byte for byte", body = cloudweb_protocol::Heartbeat), (status = 404, description = "No heartbeat since start", body = ErrorBody)))]
pub async fn last_heartbeat(State(state): State<Arc<AppState>>, Path(id): Path<String>) -> Result<Response, ApiError> {
    let body = state.last_bodies.lock().expect("last bodies lock").get(&id).cloned();
    match body {
        Some(body) => Ok(([(CONTENT_TYPE, "application/json")], body).into_response()),
        None => Err(ApiError::NotFound(format!("no heartbeat from node {id:?} since the control plane started"))),
    }
}

/// A node's usage history: 30 s samples for the last day, 5-minute
/// averages before that.
#[utoipa::path(get, path = "/api/nodes/{id}/usage", operation_id = "nodes_usage", tag = "nodes", params(("id" = String, Path, description = "The node's id"), ("seconds" = Option<u64>, Query, description = "Window, 1 to 2592000 (default 3600)")),
    responses((status = 200, description = "Usage samples", body = UsageView), (status = 400, description = "Invalid window", body = ErrorBody), (status = 404, description = "No such node", body = ErrorBody)))]
pub async fn node_usage(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
    Query(query): Query<TrafficQuery>,
) -> Result<Json<UsageView>, ApiError> {
    let since = since_ms(&state, &query)?;
    // An unknown node is a 404, as on every other node route, not an empty
    // history that looks like a node that never reported.
    if state.store.node(&id).await?.is_none() {
        return Err(ApiError::NotFound(format!("no node {id:?}")));
    }
    let samples = state
        .store
        .node_usage(&id, since)
        .await?
        .into_iter()
        .map(|(at, resolution, cpu_pct, mem_used, disk_used)| UsageSample {
            at: rfc3339_ms(at),
            resolution_seconds: resolution,
            cpu_pct,
            mem_used,
            disk_used,
        })
        .collect();
    Ok(Json(UsageView { node_id: id, samples }))
}
