//! `POST /agent/v1/join`: spends a join token, signs the node's CSR and
//! registers the node. Nothing is spent when any input is wrong.
//!
//! A join with `rejoin` set is the way back for a node whose certificate
//! expired while it was offline (or whose key is lost): with a new token it
//! gets a new certificate under its old id, so it keeps its name, mesh
//! address and instances. A node that is online with a valid certificate
//! cannot be re-joined: it renews over mTLS instead.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::{Extension, Json};
use cloudweb_protocol::{events, JoinRequest, JoinResponse};
use rand::Rng;

use super::AgentInfo;
use crate::ca::sha256_hex;
use crate::error::{body_bytes, parse_json, ApiError};
use crate::store::{JoinAnswer, JoinRefusal, NewNode, TokenRejection};
use crate::AppState;

pub async fn join(
    State(state): State<Arc<AppState>>,
    Extension(agent): Extension<AgentInfo>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<JoinResponse>, ApiError> {
    let request: JoinRequest = parse_json(&body_bytes(body)?)?;
    request.validate()?;
    if let Some(why) = request.endpoint.as_deref().and_then(|endpoint| state.config.mesh_endpoints.refusal(endpoint)) {
        return Err(ApiError::BadRequest(why));
    }
    let name = match &request.name {
        Some(name) => name.clone(),
        None => name_from_hostname(&request.hostname)?,
    };
    let now = state.clock.now();
    let now_ms = state.clock.now_ms();
    let token_digest = sha256_hex(request.token.as_bytes());
    let csr_sha256 = sha256_hex(request.csr.trim().as_bytes());
    // Check the token before the (comparatively costly) signature, and sign
    // before spending it, so a bad CSR leaves the token usable.
    if let Err(rejection) = state.store.check_join_token(&token_digest, now_ms).await? {
        return retry_or(&state, &token_digest, &csr_sha256, now_ms, rejection).await;
    }
    let lifetime = lifetime(&state);
    if let Some(node_id) = &request.rejoin {
        return rejoin(&state, &agent, &request, node_id, &token_digest, &csr_sha256, lifetime).await;
    }
    let node_id = new_node_id();
    let issued = state.ca.sign_node_csr(&request.csr, &node_id, now, lifetime)?;
    let node = NewNode {
        id: node_id.clone(),
        name: name.clone(),
        hostname: request.hostname.clone(),
        ingress: request.ingress,
        wireguard_public_key: request.wireguard_public_key.clone(),
        endpoint: request.endpoint.clone(),
        cert_sha256: issued.sha256.clone(),
        cert_not_after: issued.not_after_ms,
        agent_version: agent.version.clone(),
        protocol: i64::from(agent.protocol),
    };
    let certificate = issued.pem;
    let answer = JoinAnswer { csr_sha256: &csr_sha256, certificate: &certificate };
    let row = match state.store.register_node(&token_digest, &node, &answer, now_ms).await? {
        Ok(row) => row,
        Err(JoinRefusal::Token(rejection)) => return retry_or(&state, &token_digest, &csr_sha256, now_ms, rejection).await,
        Err(JoinRefusal::MeshFull) => {
            return Err(ApiError::Conflict("the mesh has no free address left; remove unused nodes first".to_string()))
        }
        Err(JoinRefusal::NameTaken) => {
            return Err(ApiError::Conflict(format!(
                "a node named {name} already exists; join with another --name or remove the old node first"
            )))
        }
        Err(JoinRefusal::NoSuchNode) => return Err(ApiError::Internal("a first join found no node".into())),
        Err(JoinRefusal::KeyTaken) => return Err(key_taken()),
    };
    state.nodes.insert(&row, tokio::time::Instant::now());
    if row.wireguard_public_key.is_some() {
        state.hub.notify_all(events::PEERS);
    }
    tracing::info!(node_id = %row.id, name = %row.name, ingress = row.ingress, "node joined");
    let entry = crate::access::audit::Entry {
        request_id: crate::access::audit::request_id(),
        phase: "event",
        actor: format!("node:{}", row.id),
        source: request.endpoint.clone(),
        action: "node join".to_string(),
        target: Some(format!("node:{}", row.name)),
        result: "ok".to_string(),
        ..Default::default()
    };
    crate::access::audit::after(&state, entry).await;
    Ok(Json(answer_for(&state, row, certificate)))
}

/// The configured node certificate lifetime.
pub(super) fn lifetime(state: &AppState) -> time::Duration {
    time::Duration::try_from(state.config.node_cert_lifetime).unwrap_or(crate::ca::NODE_CERT_VALIDITY)
}

/// A re-join of `node_id` (see the module docs). The token was checked.
async fn rejoin(
    state: &Arc<AppState>,
    agent: &AgentInfo,
    request: &JoinRequest,
    node_id: &str,
    token_digest: &str,
    csr_sha256: &str,
    lifetime: time::Duration,
) -> Result<Json<JoinResponse>, ApiError> {
    let now = state.clock.now();
    let now_ms = state.clock.now_ms();
    let Some(existing) = state.store.node(node_id).await? else {
        return Err(ApiError::NotFound(format!(
            "no node {node_id} is registered (it was removed); join as a new node: `cloudweb-agent leave --force`, then `cloudweb-agent join`"
        )));
    };
    if let Some(name) = &request.name {
        if *name != existing.name {
            return Err(ApiError::Conflict(format!(
                "node {node_id} is named {}; a re-join keeps the name (leave out --name or pass --name {})",
                existing.name, existing.name
            )));
        }
    }
    let online = state
        .nodes
        .get(node_id)
        .is_some_and(|live| live.state(tokio::time::Instant::now(), state.config.unreachable_after) != crate::live::NodeState::Unreachable);
    let valid = existing.cert_not_after.is_none_or(|end| end > now_ms);
    if online && valid {
        return Err(ApiError::Conflict(format!(
            "node {} is online with a valid certificate; a re-join is only for a node whose certificate expired or that has been unreachable",
            existing.name
        )));
    }
    let issued = state.ca.sign_node_csr(&request.csr, node_id, now, lifetime)?;
    let node = NewNode {
        id: node_id.to_string(),
        name: existing.name.clone(),
        hostname: request.hostname.clone(),
        ingress: existing.ingress,
        wireguard_public_key: request.wireguard_public_key.clone(),
        endpoint: request.endpoint.clone(),
        cert_sha256: issued.sha256.clone(),
        cert_not_after: issued.not_after_ms,
        agent_version: agent.version.clone(),
        protocol: i64::from(agent.protocol),
    };
    let certificate = issued.pem;
    let answer = JoinAnswer { csr_sha256, certificate: &certificate };
    let row = match state.store.rejoin_node(token_digest, &node, &answer, now_ms).await? {
        Ok(row) => row,
        Err(JoinRefusal::Token(rejection)) => return retry_or(state, token_digest, csr_sha256, now_ms, rejection).await,
        Err(JoinRefusal::NoSuchNode) => return Err(ApiError::NotFound(format!("no node {node_id} is registered (it was removed)"))),
        Err(JoinRefusal::KeyTaken) => return Err(key_taken()),
        Err(JoinRefusal::NameTaken | JoinRefusal::MeshFull) => return Err(ApiError::Internal("a re-join took a new name or address".into())),
    };
    // It may have been removed from the registry meanwhile; otherwise keep
    // what is known about it and take the new certificate.
    if !state.nodes.rejoined(&row, tokio::time::Instant::now()) {
        state.nodes.insert(&row, tokio::time::Instant::now());
    }
    if existing.wireguard_public_key != row.wireguard_public_key || existing.endpoint != row.endpoint {
        state.hub.notify_all(events::PEERS);
    }
    tracing::info!(node_id = %row.id, name = %row.name, "node re-joined with a new certificate; its old one is refused from now on");
    Ok(Json(answer_for(state, row, certificate)))
}

fn answer_for(state: &AppState, row: crate::store::NodeRow, certificate: String) -> JoinResponse {
    let peers = state.nodes.mesh_peers(&row.id).peers;
    JoinResponse {
        node_id: row.id,
        name: row.name,
        certificate,
        ca: state.ca.cert_pem().to_string(),
        peers,
        mesh_address: crate::mesh_address(row.mesh_index),
    }
}

/// A used token is still good for the request that used it: the same CSR
/// within the token's life gets the same answer again (its first answer
/// may have been lost with the connection, and the node that holds the
/// key is the only one that can use the certificate). Anything else gets
/// the token's refusal.
async fn retry_or(
    state: &AppState,
    token_digest: &str,
    csr_sha256: &str,
    now_ms: i64,
    rejection: TokenRejection,
) -> Result<Json<JoinResponse>, ApiError> {
    if rejection == TokenRejection::AlreadyUsed {
        if let Some((row, certificate)) = state.store.join_retry(token_digest, csr_sha256, now_ms).await? {
            tracing::info!(node_id = %row.id, name = %row.name, "join repeated with the same token and CSR; answered again");
            return Ok(Json(answer_for(state, row, certificate)));
        }
    }
    Err(token_error(rejection))
}

/// The refusal of a join whose WireGuard key another node has. The token
/// is not spent.
fn key_taken() -> ApiError {
    ApiError::Conflict(
        "another node already uses this WireGuard public key; every node needs its own (was the agent's data directory copied from another node? join from an empty one), or remove the other node first"
            .to_string(),
    )
}

fn token_error(rejection: TokenRejection) -> ApiError {
    ApiError::Unauthorized(
        match rejection {
            TokenRejection::Unknown => "join token is not valid",
            TokenRejection::Expired => "join token has expired; create a new one",
            TokenRejection::AlreadyUsed => "join token was already used; create a new one",
        }
        .to_string(),
    )
}

/// A node name from a host name: its first label, lowercased, with anything
/// outside `[a-z0-9-]` turned into '-'.
fn name_from_hostname(hostname: &str) -> Result<String, ApiError> {
    let first = hostname.split('.').next().unwrap_or_default().to_ascii_lowercase();
    let cleaned: String = first.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '-' }).collect();
    let trimmed = cleaned.trim_matches('-').to_string();
    cloudweb_protocol::validate::node_name("name", &trimmed)
        .map_err(|_| ApiError::BadRequest("cannot derive a node name from the hostname; pass name".to_string()))?;
    Ok(trimmed)
}

fn new_node_id() -> String {
    let bytes: [u8; 8] = rand::rng().random();
    format!("n-{}", hex::encode(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_from_hostnames() {
        assert_eq!(name_from_hostname("Web-1.example.com").unwrap(), "web-1");
        assert_eq!(name_from_hostname("my_host").unwrap(), "my-host");
        assert!(name_from_hostname("___").is_err());
    }
}
