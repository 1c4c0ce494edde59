//! Deploy tokens: `cwd_` and 64 hex digits, one app's, for a CI system.
//! They deploy and read that app only, belong to no user (they outlive
//! whoever made them) and are listed and revoked by the app's admins.

use crate::auth::Principal;
use crate::ca::sha256_hex;
use crate::error::ApiError;
use crate::store::DeployTokenRow;
use crate::AppState;

pub const PREFIX: &str = "cwd_";
const SHOWN_CHARS: usize = 12;
/// Unrevoked deploy tokens one app may have.
pub const MAX_ACTIVE_PER_APP: usize = 20;
const TOUCH_GRANULARITY_MS: i64 = 60_000;

/// Creates a deploy token for `app`; returns its row and the token itself.
pub async fn create(state: &AppState, app: &str, name: &str, created_by: &str, expires_at: Option<i64>) -> Result<(DeployTokenRow, String), ApiError> {
    super::tokens::validate_name(name)?;
    if state.store.app(app).await?.is_none() {
        return Err(ApiError::NotFound(format!("no app named {app}")));
    }
    if expires_at.is_some_and(|end| end <= state.clock.now_ms()) {
        return Err(ApiError::BadRequest("expires_at must be in the future".to_string()));
    }
    let active: Vec<DeployTokenRow> = state.store.deploy_tokens_of(app).await?.into_iter().filter(|t| t.revoked_at.is_none()).collect();
    if active.iter().any(|t| t.name == name) {
        return Err(ApiError::Conflict(format!("app {app} already has a deploy token named {name:?}; revoke it or pick another name")));
    }
    if active.len() >= MAX_ACTIVE_PER_APP {
        return Err(ApiError::Conflict(format!("app {app} already has {MAX_ACTIVE_PER_APP} deploy tokens; revoke one first")));
    }
    let token = format!("{PREFIX}{}", super::random_hex(32));
    let row = DeployTokenRow {
        id: format!("dtk_{}", super::random_hex(8)),
        app: app.to_string(),
        name: name.to_string(),
        prefix: token[..SHOWN_CHARS].to_string(),
        created_by: created_by.to_string(),
        created_at: state.clock.now_ms(),
        expires_at,
        last_used_at: None,
        revoked_at: None,
    };
    state.store.insert_deploy_token(&row, &sha256_hex(token.as_bytes())).await?;
    tracing::info!(app, token_id = %row.id, "deploy token created");
    Ok((row, token))
}

/// The principal of a live deploy token, its use recorded.
pub async fn authenticate(state: &AppState, token: &str) -> Result<Option<Principal>, ApiError> {
    if !token.starts_with(PREFIX) {
        return Ok(None);
    }
    let Some((row, team_id)) = state.store.deploy_token_by_digest(&sha256_hex(token.as_bytes())).await? else { return Ok(None) };
    if row.expires_at.is_some_and(|end| end <= state.clock.now_ms()) {
        return Ok(None);
    }
    state.store.touch_deploy_token(&row.id, state.clock.now_ms(), TOUCH_GRANULARITY_MS).await?;
    Ok(Some(Principal::Deploy { token_id: row.id, app: row.app, team_id }))
}

/// Revokes one of an app's deploy tokens.
pub async fn revoke(state: &AppState, app: &str, id: &str) -> Result<DeployTokenRow, ApiError> {
    let row = state
        .store
        .revoke_deploy_token(app, id, state.clock.now_ms())
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("app {app} has no deploy token with id {id}")))?;
    tracing::info!(app, token_id = %row.id, "deploy token revoked");
    Ok(row)
}
