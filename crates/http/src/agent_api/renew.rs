//! `POST /agent/v1/renew`: a registered node trades a CSR for a new client
//! certificate, authenticated by the certificate it has now.
//!
//! The CSR may name no one or this node only (a CSR naming another node is
//! refused, though the certificate would name this node anyway), and must
//! be for a new key. The new certificate is recorded as the node's next
//! one: the old one keeps working until the node first presents the new
//! one (see `require_node`), then it is refused as replaced. A renewal
//! whose answer was lost is simply sent again with another new key; the
//! unused certificate is forgotten.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::{Extension, Json};
use cloudweb_protocol::{RenewRequest, RenewResponse};

use super::{AuthedNode, ConnectionPeer};
use crate::ca::csr_claims;
use crate::error::{body_bytes, parse_json, ApiError};
use crate::AppState;

pub async fn renew(
    State(state): State<Arc<AppState>>,
    Extension(AuthedNode(node_id)): Extension<AuthedNode>,
    Extension(peer): Extension<ConnectionPeer>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<RenewResponse>, ApiError> {
    let request: RenewRequest = parse_json(&body_bytes(body)?)?;
    request.validate()?;
    let presented = peer.0.ok_or_else(|| ApiError::Unauthorized("a client certificate is required".into()))?;
    let claims = csr_claims(&request.csr).map_err(|e| ApiError::BadRequest(e.to_string()))?;
    if let Some(other) = claims.names.iter().find(|name| **name != node_id) {
        return Err(ApiError::Forbidden(format!(
            "the CSR names {other:?}, but the certificate presented is node {node_id}'s; a node renews only its own certificate"
        )));
    }
    if presented.public_key.as_deref() == Some(claims.public_key.as_slice()) {
        return Err(ApiError::BadRequest("the CSR is for the key of the certificate presented; a renewal needs a new key".into()));
    }
    let issued = state.ca.sign_node_csr(&request.csr, &node_id, state.clock.now(), super::join::lifetime(&state))?;
    // The node may have renewed with the new certificate meanwhile; what
    // it presented must still be its current one.
    if !state.store.set_next_cert(&node_id, &presented.cert_sha256, &issued.sha256, issued.not_after_ms).await? {
        return Err(ApiError::Conflict("this certificate is no longer the node's current one; renew with the current one".into()));
    }
    state.nodes.set_next_cert(&node_id, &issued.sha256);
    tracing::info!(node_id = %node_id, not_after = %crate::clock::rfc3339_ms(issued.not_after_ms), "issued a renewed node certificate");
    Ok(Json(RenewResponse { certificate: issued.pem, not_after: crate::clock::rfc3339_ms(issued.not_after_ms) }))
}

