//! The agent listener: `/agent/v1/*` over TLS 1.3 with optional client
//! certificates. Two layers guard every route. The version check runs first
//! and answers 400/426 before anything else happens; then every route except
//! join and the installer requires a client certificate of a node that is
//! still registered.

mod certificates;
mod cluster;
pub mod commands;
mod heartbeat;
pub mod installer;
mod join;
mod logs;
pub mod leave;
pub mod listener;
pub use crate::listener_cert;
mod renew;
mod report;
mod service_logs;
mod stream;
mod volume_moves;
mod backup_jobs;
mod task_runs;
mod sessions;

use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use cloudweb_protocol::version::{HEADER_AGENT_VERSION, HEADER_PROTOCOL};
use cloudweb_protocol::{negotiate, paths, Negotiation};

use crate::error::ApiError;
use crate::live::CertStanding;
use crate::AppState;

/// Largest request body the agent listener reads.
pub use crate::error::MAX_BODY_BYTES;

/// The client certificate a connection presented, if any. Set per
/// connection by the listener.
#[derive(Debug, Clone)]
pub struct PeerCert {
    pub node_id: String,
    pub cert_sha256: String,
    /// The certified public key (raw), so a renewal can insist on a new one.
    pub public_key: Option<Vec<u8>>,
}

#[derive(Debug, Clone, Default)]
pub struct ConnectionPeer(pub Option<PeerCert>);

/// What the version headers said, for handlers that record it.
#[derive(Debug, Clone)]
pub struct AgentInfo {
    pub version: Option<String>,
    pub protocol: u32,
}

/// The node a request was authenticated as.
#[derive(Debug, Clone)]
pub struct AuthedNode(pub String);

pub fn router(state: Arc<AppState>) -> Router {
    let authenticated = Router::new()
        .route(paths::HEARTBEAT, post(heartbeat::heartbeat))
        .route(paths::PEERS, get(cluster::peers))
        .route(paths::COMMANDS, get(commands::list))
        .route("/agent/v1/commands/{id}/ack", post(commands::ack))
        .route(paths::LEAVE, post(leave::leave))
        .route(paths::REPORT, post(report::report))
        .route(paths::LOGS, post(logs::upload))
        .route(paths::SERVICE_LOGS, post(service_logs::upload))
        .route(paths::ROUTES, get(cluster::routes))
        .route(paths::REGISTRY, get(cluster::registry))
        .route(paths::STREAM, get(stream::stream))
        .route(paths::CERTIFICATES, get(certificates::certificates))
        .route("/agent/v1/acme-challenge/{token}", get(certificates::challenge))
        .route(paths::ACME_TLS_ALPN, get(certificates::tls_alpn))
        .route(paths::RENEW, post(renew::renew))
        .route("/agent/v1/volume-moves/{id}", post(volume_moves::report))
        .route("/agent/v1/backup-jobs/{id}", post(backup_jobs::report))
        .route("/agent/v1/task-runs/{id}", post(task_runs::report))
        .route("/agent/v1/sessions/{id}/attach", post(sessions::attach))
        .route_layer(middleware::from_fn_with_state(state.clone(), require_node));
    Router::new()
        .route(paths::JOIN, post(join::join))
        .route("/node.sh", get(installer::script))
        .route("/downloads/cloudweb-agent", get(installer::agent_binary))
        .merge(authenticated)
        .fallback(|| async { ApiError::NotFound("no such agent endpoint".to_string()) })
        // A dropped connection must not cancel a join or a report halfway.
        .layer(middleware::from_fn(crate::whole_requests::run_to_completion))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(middleware::from_fn(crate::error::refuse_declared_oversize))
        .layer(middleware::from_fn_with_state(state.clone(), check_version))
        .layer(middleware::from_fn_with_state(state.clone(), only_the_leader))
        .with_state(state)
}

/// A replica that does not lead answers agents 503, naming the leader:
/// nodes' liveness lives in the memory of the replica they heartbeat, and
/// the leader's loops act on it (see `cloudweb_core::leader`).
///
/// A session's dial-back is the exception: it goes to the replica that
/// holds the session's user side, leader or not.
async fn only_the_leader(State(state): State<Arc<AppState>>, request: Request, next: Next) -> Response {
    if state.leader.is_leading() || request.uri().path().starts_with(paths::SESSIONS) {
        return next.run(request).await;
    }
    let leader = state.leader.leader_url();
    let named = leader.as_deref().map(|url| format!(" (the leader is {url})")).unwrap_or_default();
    ApiError::NotLeader { message: format!("this control-plane replica does not lead; agents are served by the leader{named}"), leader }.into_response()
}

/// Answers 400 or 426 before any handler runs when the version headers are
/// malformed or outside the supported range.
async fn check_version(State(state): State<Arc<AppState>>, mut request: Request, next: Next) -> Response {
    let headers: &HeaderMap = request.headers();
    let protocol = headers.get(HEADER_PROTOCOL).map(|v| v.as_bytes());
    let version = headers.get(HEADER_AGENT_VERSION).map(|v| v.as_bytes());
    match negotiate(state.config.protocol_range, protocol, version) {
        Negotiation::Accepted(protocol) => {
            let version = headers
                .get(HEADER_AGENT_VERSION)
                .and_then(|v| v.to_str().ok())
                .map(|v| v.trim().to_string());
            request.extensions_mut().insert(AgentInfo { version, protocol });
            next.run(request).await
        }
        Negotiation::Malformed(message) => ApiError::BadRequest(message).into_response(),
        Negotiation::Unsupported(body) => {
            tracing::warn!(
                agent_version = %body.agent_version,
                agent_protocol = body.agent_protocol,
                "refused an agent speaking an unsupported protocol"
            );
            (StatusCode::UPGRADE_REQUIRED, Json(body)).into_response()
        }
    }
}

/// Requires a client certificate from a node that is still registered.
async fn require_node(State(state): State<Arc<AppState>>, mut request: Request, next: Next) -> Response {
    let peer = request.extensions().get::<ConnectionPeer>().cloned().unwrap_or_default();
    let Some(cert) = peer.0 else {
        return ApiError::Unauthorized("a client certificate issued by the cluster CA is required".to_string())
            .into_response();
    };
    match state.nodes.authorize(&cert.node_id, &cert.cert_sha256) {
        CertStanding::Current => {}
        CertStanding::Renewed => {
            // First use of a renewed certificate: it becomes the current
            // one and the one it replaces is refused from now on.
            match state.store.promote_next_cert(&cert.node_id, &cert.cert_sha256, state.clock.now_ms()).await {
                Ok(Some(row)) => {
                    state.nodes.set_certs(&row);
                    tracing::info!(node_id = %cert.node_id, "node switched to its renewed certificate; the old one is revoked");
                }
                // Another request of the same node promoted it first.
                Ok(None) => {}
                Err(err) => return ApiError::from(err).into_response(),
            }
        }
        CertStanding::Replaced => {
            return ApiError::CertificateReplaced(format!(
                "this certificate of node {} was replaced by a renewal or re-join; use the new one",
                cert.node_id
            ))
            .into_response()
        }
        CertStanding::Unknown => {
            return ApiError::NodeNotRegistered(format!("node {} is not registered with this control plane", cert.node_id))
                .into_response()
        }
    }
    request.extensions_mut().insert(AuthedNode(cert.node_id));
    next.run(request).await
}
