//! Personal API tokens: `cwp_` and 64 hex digits (256 bits), shown once at
//! creation; the store keeps their SHA-256, their name, their first
//! characters (to recognise one in a list) and when they were last used
//! (to the minute). A revoked token stops working at once.

use crate::ca::sha256_hex;
use crate::error::ApiError;
use crate::store::{ApiTokenRow, UserRow};
use crate::AppState;

pub const PREFIX: &str = "cwp_";
/// How many characters of a token its listing shows.
const SHOWN_CHARS: usize = 12;
/// Unrevoked tokens one user may hold.
pub const MAX_ACTIVE_PER_USER: usize = 100;
pub const MAX_NAME_CHARS: usize = 100;
/// `last_used_at` moves at most this often.
const TOUCH_GRANULARITY_MS: i64 = 60_000;

pub fn validate_name(name: &str) -> Result<(), ApiError> {
    if name.trim().is_empty() || name.chars().count() > MAX_NAME_CHARS || name.chars().any(char::is_control) {
        return Err(ApiError::BadRequest(format!(
            "invalid token name: use 1 to {MAX_NAME_CHARS} characters without control characters"
        )));
    }
    Ok(())
}

/// What a new token is held to.
#[derive(Debug, Clone, Default)]
pub struct NewScope {
    pub role: Option<crate::roles::Role>,
    pub apps: Option<Vec<String>>,
    pub expires_at: Option<i64>,
}

/// Creates a token for `user`, held to `scope` (which the caller checked:
/// `access::teams::check_token_scope`); returns its row and the token
/// itself, which exists nowhere else afterwards.
pub async fn create(state: &AppState, user: &UserRow, name: &str, scope: NewScope) -> Result<(ApiTokenRow, String), ApiError> {
    validate_name(name)?;
    let existing = state.store.api_tokens_of(&user.id).await?;
    let active: Vec<&ApiTokenRow> = existing.iter().filter(|t| t.revoked_at.is_none()).collect();
    if active.iter().any(|t| t.name == name) {
        return Err(ApiError::Conflict(format!("you already have a token named {name:?}; revoke it or pick another name")));
    }
    if active.len() >= MAX_ACTIVE_PER_USER {
        return Err(ApiError::Conflict(format!("you already have {MAX_ACTIVE_PER_USER} tokens; revoke one first")));
    }
    let token = format!("{PREFIX}{}", super::random_hex(32));
    let row = ApiTokenRow {
        id: format!("tok_{}", super::random_hex(8)),
        user_id: user.id.clone(),
        name: name.to_string(),
        prefix: token[..SHOWN_CHARS].to_string(),
        created_at: state.clock.now_ms(),
        last_used_at: None,
        revoked_at: None,
        role: scope.role.map(|r| r.as_str().to_string()),
        apps: scope.apps,
        expires_at: scope.expires_at,
    };
    state.store.insert_api_token(&row, &sha256_hex(token.as_bytes())).await?;
    tracing::info!(user = %user.name, token_id = %row.id, "personal API token created");
    Ok((row, token))
}

/// The unrevoked token `token` and its enabled user, its use recorded.
pub async fn authenticate(state: &AppState, token: &str) -> Result<Option<(ApiTokenRow, UserRow)>, ApiError> {
    if !token.starts_with(PREFIX) {
        return Ok(None);
    }
    let Some((row, user)) = state.store.api_token_by_digest(&sha256_hex(token.as_bytes())).await? else { return Ok(None) };
    if user.disabled_at.is_some() || row.expires_at.is_some_and(|end| end <= state.clock.now_ms()) {
        return Ok(None);
    }
    state.store.touch_api_token(&row.id, state.clock.now_ms(), TOUCH_GRANULARITY_MS).await?;
    Ok(Some((row, user)))
}

/// Revokes one of `user`'s tokens; 404 when they have none with that id.
pub async fn revoke(state: &AppState, user: &UserRow, id: &str) -> Result<ApiTokenRow, ApiError> {
    let row = state
        .store
        .revoke_api_token(&user.id, id, state.clock.now_ms())
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("you have no token with id {id}")))?;
    tracing::info!(user = %user.name, token_id = %row.id, "personal API token revoked");
    Ok(row)
}
