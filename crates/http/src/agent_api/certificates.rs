//! What ingress nodes need for public hosts: the certificates the control
//! plane obtained, and the answers to the CA's HTTP-01 and TLS-ALPN-01
//! challenges.

use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::header;
use axum::response::IntoResponse;
use axum::{Extension, Json};
use cloudweb_protocol::{CertificateSet, TlsAlpnChallenges};
use serde::Deserialize;

use super::AuthedNode;
use crate::error::ApiError;
use crate::AppState;

#[derive(Deserialize)]
pub struct Known {
    known: Option<String>,
}

/// `GET /agent/v1/certificates[?known=<version>]`: ingress nodes only, as
/// the answer holds private keys.
pub async fn certificates(
    State(state): State<Arc<AppState>>,
    Extension(AuthedNode(node_id)): Extension<AuthedNode>,
    Query(query): Query<Known>,
) -> Result<Json<CertificateSet>, ApiError> {
    if !state.nodes.get(&node_id).is_some_and(|n| n.ingress) {
        return Err(ApiError::Forbidden("only ingress nodes get certificates".to_string()));
    }
    if let Some(known) = &query.known {
        cloudweb_protocol::validate::token("known", known, 64)?;
    }
    Ok(Json(state.acme.certificate_set(query.known.as_deref())))
}

#[derive(Deserialize)]
pub struct Applied {
    applied: Option<String>,
}

/// `GET /agent/v1/acme-tls-alpn[?applied=<version>]`: the pending
/// TLS-ALPN-01 challenges, for ingress nodes only; `applied` is the version
/// the node has put in place.
pub async fn tls_alpn(
    State(state): State<Arc<AppState>>,
    Extension(AuthedNode(node_id)): Extension<AuthedNode>,
    Query(query): Query<Applied>,
) -> Result<Json<TlsAlpnChallenges>, ApiError> {
    if !state.nodes.get(&node_id).is_some_and(|n| n.ingress) {
        return Err(ApiError::Forbidden("only ingress nodes answer TLS-ALPN-01 challenges".to_string()));
    }
    if let Some(applied) = &query.applied {
        cloudweb_protocol::validate::token("applied", applied, 64)?;
    }
    Ok(Json(state.acme.tls_alpn_challenges(&node_id, query.applied.as_deref())))
}

/// `GET /agent/v1/acme-challenge/{token}`: the key authorization, as the CA
/// expects it in the body of `/.well-known/acme-challenge/{token}`.
pub async fn challenge(State(state): State<Arc<AppState>>, Path(token): Path<String>) -> Result<impl IntoResponse, ApiError> {
    cloudweb_protocol::certificates::challenge_token("token", &token)?;
    match state.acme.key_authorization(&token) {
        Some(answer) => Ok(([(header::CONTENT_TYPE, "text/plain")], answer)),
        None => Err(ApiError::NotFound("no pending challenge has this token".to_string())),
    }
}
