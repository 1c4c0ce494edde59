//! `POST /api/join-tokens`: a single-use token and the command that uses it.

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use rand::Rng;
use cloudweb_api_types::nodes::JoinToken;

use crate::ca::sha256_hex;
use crate::clock::rfc3339_ms;
use crate::error::ApiError;
use crate::AppState;

#[utoipa::path(post, path = "/api/join-tokens", operation_id = "join_tokens_create", tag = "nodes", responses((status = 201, description = "A single-use join token and the command that uses it", body = JoinToken)))]
pub async fn create(State(state): State<Arc<AppState>>) -> Result<(StatusCode, Json<JoinToken>), ApiError> {
    let bytes: [u8; 32] = rand::rng().random();
    let token = format!("cwj_{}", hex::encode(bytes));
    let now_ms = state.clock.now_ms();
    let expires_ms = now_ms + state.config.join_token_ttl.as_millis() as i64;
    state.store.insert_join_token(&sha256_hex(token.as_bytes()), now_ms, expires_ms).await?;
    let ca_sha256 = state.ca.fingerprint().to_string();
    let command = crate::agent_api::installer::join_command(
        &state.config.public_url.to_string(),
        &state.listener_pin,
        &token,
        &ca_sha256,
    );
    Ok((StatusCode::CREATED, Json(JoinToken { token, expires_at: rfc3339_ms(expires_ms), ca_sha256, command })))
}
