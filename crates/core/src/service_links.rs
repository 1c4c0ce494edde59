//! What an app gets from the managed services it is linked to: each
//! service's connection URL at the address its node reports, with the
//! credentials opened from their sealed form. Below `deploy` (which adds
//! these variables to a deployment's environment) and `services` (which
//! creates and deletes services), so neither imports the other for it.

use std::collections::BTreeMap;

use cloudweb_protocol::services::{ServiceKind, ServiceStatus};

use crate::error::ApiError;
use crate::store::ServiceRow;
use crate::AppState;

/// What a service's sealed secret holds.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct ServiceSecret {
    pub password: String,
    /// MariaDB's root password (never handed to apps).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root_password: Option<String>,
}

pub fn secret_context(service: &str) -> String {
    format!("service:{service}")
}

/// The user and database every service is made with.
pub const USER: &str = "app";
pub const DATABASE: &str = "app";

pub fn kind_of(service: &ServiceRow) -> Result<ServiceKind, ApiError> {
    ServiceKind::parse(&service.kind).ok_or_else(|| ApiError::Internal(format!("service {} has unknown kind {}", service.name, service.kind)))
}

pub fn secret(state: &AppState, service: &ServiceRow) -> Result<ServiceSecret, ApiError> {
    state
        .sealer
        .open_json(&secret_context(&service.name), &service.secret_sealed)
        .map_err(|e| ApiError::Internal(format!("service {}: {e}", service.name)))
}

/// The status its node last reported, if the node reports it at all.
pub fn status(state: &AppState, service: &ServiceRow) -> Option<ServiceStatus> {
    let node = state.nodes.get(&service.node_id)?;
    let now = tokio::time::Instant::now();
    let health = node.current_health(now)?;
    health.services.as_ref()?.iter().find(|s| s.service == service.name).cloned()
}

/// Whether the node runs the service's current generation with its
/// password set: healthy (or degraded) at that generation. Until then, an
/// unfinished rotation's old password is the one the database accepts.
pub fn runs_current(state: &AppState, service: &ServiceRow) -> bool {
    status(state, service)
        .is_some_and(|s| s.generation >= service.generation.max(0) as u64 && matches!(s.state.as_str(), "healthy" | "degraded"))
}

/// The credentials the database accepts now: during a rotation the old
/// ones until its node runs the generation that sets the new ones.
pub fn accepted_secret(state: &AppState, service: &ServiceRow) -> Result<ServiceSecret, ApiError> {
    match &service.previous_secret_sealed {
        Some(previous) if !runs_current(state, service) => state
            .sealer
            .open_json(&secret_context(&service.name), previous)
            .map_err(|e| ApiError::Internal(format!("service {}: {e}", service.name))),
        _ => secret(state, service),
    }
}

/// The connection URL a linked app gets: with the password the database
/// accepts now.
pub fn url(state: &AppState, service: &ServiceRow, address: &str) -> Result<String, ApiError> {
    let secret = accepted_secret(state, service)?;
    Ok(match kind_of(service)? {
        ServiceKind::Postgres => format!("postgres://{USER}:{}@{address}/{DATABASE}", secret.password),
        // Redis 6 and later (and Valkey) name the requirepass user `default`;
        // an empty user name is sent as one by some clients (redis-cli 7.0).
        ServiceKind::Redis => format!("redis://default:{}@{address}/0", secret.password),
        ServiceKind::Mariadb => format!("mysql://{USER}:{}@{address}/{DATABASE}", secret.password),
    })
}

/// The variables an app's next deployment gets from its links; an error
/// names a linked service that has no address yet.
pub async fn link_env(state: &AppState, app: &str) -> Result<Result<BTreeMap<String, String>, String>, ApiError> {
    let mut env = BTreeMap::new();
    for link in state.store.app_links(app).await? {
        let Some(service) = state.store.service(&link.service).await? else { continue };
        let Some(address) = status(state, &service).and_then(|s| s.address) else {
            return Ok(Err(format!("linked service {} has not reported an address yet (is its node up?)", service.name)));
        };
        env.insert(link.variable.clone(), url(state, &service, &address)?);
    }
    Ok(Ok(env))
}
