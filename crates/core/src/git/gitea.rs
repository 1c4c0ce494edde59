//! Gitea and Forgejo, the control plane's side: the connection's settings
//! (the OAuth client secret sealed with the cluster key, the allow-list),
//! each identity's tokens (sealed; refreshed before they expire, one
//! refresh at a time since Gitea rotates the refresh token), and the API
//! as one identity. The login flow is `cloudweb_http::git::gitea_login`;
//! the Gitea calls are `cloudweb_git::gitea`.

use cloudweb_api_types::gitea::{GiteaAccount, GiteaSettingsInput, GiteaSettingsView};
use cloudweb_git::gitea::{self as api, Gitea, GiteaUser, TokenAnswer};

use super::login::Host;
use super::provider_error;
use crate::error::ApiError;
use crate::store::{GiteaSettingsRow, GiteaTokensRow};
use crate::AppState;

/// Longest allow-list, per kind.
const MAX_ALLOWED: usize = 1000;
/// Refresh an access token this long before it expires: a deploy's clone
/// gets a token with at least this long to live.
const REFRESH_MARGIN_MS: i64 = 10 * 60 * 1000;

pub fn client_secret_context() -> &'static str {
    "gitea-oauth-client-secret"
}

fn token_context(gitea_user_id: i64, kind: &str) -> String {
    format!("gitea-token:{gitea_user_id}:{kind}")
}

/// The settings with the client secret opened.
pub struct Settings {
    pub base_url: String,
    pub client_id: String,
    pub client_secret: String,
    pub allowed_users: Vec<String>,
    pub allowed_orgs: Vec<String>,
}

fn list(json: &str) -> Vec<String> {
    serde_json::from_str(json).unwrap_or_default()
}

pub fn not_configured() -> ApiError {
    ApiError::NotFound("Gitea is not configured (PUT /api/gitea/settings, or `cloudweb gitea setup`)".into())
}

/// The settings; 404 when Gitea is not configured.
pub async fn settings(state: &AppState) -> Result<Settings, ApiError> {
    let row = state.store.gitea_settings().await?.ok_or_else(not_configured)?;
    let secret = state.sealer.open(client_secret_context(), &row.client_secret_sealed).map_err(|e| ApiError::Internal(format!("Gitea client secret: {e}")))?;
    Ok(Settings {
        client_secret: String::from_utf8(secret).map_err(|_| ApiError::Internal("the Gitea client secret is not text".into()))?,
        allowed_users: list(&row.allowed_users),
        allowed_orgs: list(&row.allowed_orgs),
        base_url: row.base_url,
        client_id: row.client_id,
    })
}

pub fn callback_url(state: &AppState) -> String {
    format!("{}/api/auth/gitea/callback", state.git.public_url())
}

pub fn login_url(state: &AppState) -> String {
    format!("{}/api/auth/gitea/login", state.git.public_url())
}

pub fn view(state: &AppState, row: &GiteaSettingsRow) -> GiteaSettingsView {
    GiteaSettingsView {
        base_url: row.base_url.clone(),
        client_id: row.client_id.clone(),
        client_secret_set: true,
        allowed_users: list(&row.allowed_users),
        allowed_orgs: list(&row.allowed_orgs),
        redirect_uri: callback_url(state),
        login_url: login_url(state),
    }
}

/// Checks an allow-list: Gitea names (and `id:<number>` among users), no
/// duplicates kept.
fn clean(field: &str, entries: Vec<String>, users: bool) -> Result<Vec<String>, ApiError> {
    if entries.len() > MAX_ALLOWED {
        return Err(ApiError::BadRequest(format!("at most {MAX_ALLOWED} entries in {field}")));
    }
    let mut kept: Vec<String> = Vec::with_capacity(entries.len());
    for entry in entries {
        cloudweb_protocol::validate::bounded_text(field, &entry, 100)?;
        let valid = match entry.strip_prefix("id:") {
            Some(id) if users => !id.is_empty() && id.len() <= 19 && id.bytes().all(|b| b.is_ascii_digit()),
            _ => api::valid_name(&entry),
        };
        if !valid {
            let shape = if users { "a user name (letters, digits, '-', '_' or '.') or id:<number>" } else { "letters, digits, '-', '_' or '.'" };
            return Err(ApiError::BadRequest(format!("invalid {field} entry {entry:?}: {shape}")));
        }
        if !kept.iter().any(|k| k.eq_ignore_ascii_case(&entry)) {
            kept.push(entry);
        }
    }
    Ok(kept)
}

/// Validates and stores the settings.
pub async fn apply(state: &AppState, input: GiteaSettingsInput) -> Result<GiteaSettingsRow, ApiError> {
    let base_url = api::base_url(&input.base_url, state.config.allow_private_git_hosts).map_err(ApiError::BadRequest)?;
    cloudweb_protocol::validate::bounded_text("client_id", &input.client_id, 256)?;
    if input.client_id.is_empty() || !input.client_id.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(ApiError::BadRequest("invalid client_id: the OAuth 2 application's \"Client ID\" (printable, no spaces)".into()));
    }
    let allowed_users = clean("allowed_users", input.allowed_users, true)?;
    let allowed_orgs = clean("allowed_orgs", input.allowed_orgs, false)?;
    let client_secret_sealed = match input.client_secret {
        Some(secret) => {
            cloudweb_protocol::validate::bounded_text("client_secret", &secret, 1024)?;
            if secret.is_empty() || !secret.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(ApiError::BadRequest("invalid client_secret: the secret Gitea showed once (printable, no spaces)".into()));
            }
            state.sealer.seal(client_secret_context(), secret.as_bytes())
        }
        None => match state.store.gitea_settings().await? {
            Some(existing) => existing.client_secret_sealed,
            None => return Err(ApiError::BadRequest("client_secret is required the first time".into())),
        },
    };
    let json = |list: &Vec<String>| serde_json::to_string(list).expect("strings serialize");
    let row = GiteaSettingsRow {
        base_url,
        client_id: input.client_id,
        client_secret_sealed,
        allowed_users: json(&allowed_users),
        allowed_orgs: json(&allowed_orgs),
        updated_at: state.clock.now_ms(),
    };
    state.store.put_gitea_settings(&row).await?;
    tracing::info!(base_url = %row.base_url, users = allowed_users.len(), orgs = allowed_orgs.len(), "Gitea settings saved");
    Ok(row)
}

/// Whether an `allowed_users` entry names this user: a name (any case),
/// or `id:<number>`.
fn names(entry: &str, user: &GiteaUser) -> bool {
    match entry.strip_prefix("id:") {
        Some(id) => id == user.id.to_string(),
        None => entry.eq_ignore_ascii_case(&user.login),
    }
}

/// Whether the allow-list lets this user in: by name or id, or as a
/// member of a listed organization. An empty allow-list lets nobody in.
pub fn allowed(user: &GiteaUser, orgs: &[String], settings: &Settings) -> bool {
    settings.allowed_users.iter().any(|entry| names(entry, user)) || orgs.iter().any(|o| settings.allowed_orgs.iter().any(|a| a.eq_ignore_ascii_case(o)))
}

/// Seals and stores an identity's tokens.
pub async fn save_tokens(state: &AppState, gitea_user_id: i64, tokens: &TokenAnswer) -> Result<(), ApiError> {
    let now = state.clock.now_ms();
    let row = GiteaTokensRow {
        gitea_user_id,
        access_token_sealed: state.sealer.seal(&token_context(gitea_user_id, "access"), tokens.access_token.as_bytes()),
        refresh_token_sealed: tokens.refresh_token.as_ref().map(|t| state.sealer.seal(&token_context(gitea_user_id, "refresh"), t.as_bytes())),
        expires_at: tokens.expires_in.map(|s| now + s.clamp(0, 10 * 365 * 86_400) * 1000),
        updated_at: now,
    };
    state.store.put_gitea_tokens(&row).await?;
    Ok(())
}

fn open(state: &AppState, id: i64, kind: &str, sealed: &str) -> Result<String, ApiError> {
    let bytes = state.sealer.open(&token_context(id, kind), sealed).map_err(|e| ApiError::Internal(format!("Gitea token of user {id}: {e}")))?;
    String::from_utf8(bytes).map_err(|_| ApiError::Internal("a Gitea token is not text".into()))
}

/// An identity's access token, refreshed first when it expires within
/// [`REFRESH_MARGIN_MS`]. Refreshes run one at a time.
pub async fn access_token(state: &AppState, gitea_user_id: i64) -> Result<String, ApiError> {
    let load = || async {
        state.store.gitea_tokens(gitea_user_id).await?.ok_or_else(|| ApiError::NotFound(format!("no Gitea account {gitea_user_id}: log in with Gitea first")))
    };
    let due = |row: &GiteaTokensRow, now: i64| row.expires_at.is_some_and(|at| at - now < REFRESH_MARGIN_MS);
    let row = load().await?;
    if !due(&row, state.clock.now_ms()) {
        return open(state, gitea_user_id, "access", &row.access_token_sealed);
    }
    let _guard = state.git.refresh_lock.lock().await;
    let row = load().await?;
    if !due(&row, state.clock.now_ms()) {
        return open(state, gitea_user_id, "access", &row.access_token_sealed);
    }
    let Some(sealed) = &row.refresh_token_sealed else {
        return Err(ApiError::Forbidden(format!("the Gitea token of user {gitea_user_id} expires and Gitea gave no refresh token: log in with Gitea again")));
    };
    let refresh_token = open(state, gitea_user_id, "refresh", sealed)?;
    let settings = settings(state).await?;
    let tokens = api::refresh(&state.git.http, &settings.base_url, &settings.client_id, &settings.client_secret, &refresh_token).await.map_err(|err| match err {
        // A refresh token Gitea no longer takes (revoked, or unused for
        // its lifetime): only a new login helps.
        cloudweb_git::ProviderError::Status { status: 400 | 401, message, .. } => {
            ApiError::Forbidden(format!("Gitea refused to refresh the token of user {gitea_user_id} ({message}): log in with Gitea again"))
        }
        other => provider_error(other),
    })?;
    save_tokens(state, gitea_user_id, &tokens).await?;
    tracing::info!(gitea_user = gitea_user_id, "refreshed a Gitea access token");
    Ok(tokens.access_token)
}

/// The Gitea API as one identity.
pub async fn gitea_as(state: &AppState, gitea_user_id: i64) -> Result<Gitea, ApiError> {
    let token = access_token(state, gitea_user_id).await?;
    let settings = state.store.gitea_settings().await?.ok_or_else(not_configured)?;
    Ok(Gitea { http: state.git.http.clone(), base: settings.base_url, token })
}

/// Every Gitea identity with tokens (never a token).
pub async fn accounts(state: &AppState) -> Result<Vec<GiteaAccount>, ApiError> {
    let mut accounts = Vec::new();
    for id in state.store.gitea_token_holders().await? {
        let identity = state.store.git_identity(Host::Gitea.key(), id).await?;
        let tokens = state.store.gitea_tokens(id).await?;
        accounts.push(GiteaAccount {
            gitea_user_id: id,
            username: identity.as_ref().map(|i| i.username.clone()).unwrap_or_default(),
            linked_user: identity.and_then(|i| i.local_user),
            token_expires_at: tokens.and_then(|t| t.expires_at).map(crate::clock::rfc3339_ms),
        });
    }
    Ok(accounts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allow_lists_are_checked_and_deduplicated() {
        assert_eq!(clean("allowed_users", vec!["Ann".into(), "ann".into(), "id:42".into(), "42".into()], true).unwrap(), vec!["Ann", "id:42", "42"]);
        for bad in ["a/b", "", "id:", "id:x1", "a b"] {
            assert!(clean("allowed_users", vec![bad.into()], true).is_err(), "{bad}");
        }
        assert!(clean("allowed_orgs", vec!["id:42".into()], false).is_err());
        assert!(clean("allowed_orgs", vec!["x".into(); MAX_ALLOWED + 1], false).is_err());
    }

    #[test]
    fn users_by_name_or_id_and_members_of_orgs() {
        let settings = Settings {
            base_url: String::new(),
            client_id: String::new(),
            client_secret: String::new(),
            allowed_users: vec!["ann".into(), "id:9".into()],
            allowed_orgs: vec!["Acme".into()],
        };
        let user = |id: i64, login: &str| GiteaUser { id, login: login.into(), full_name: None, active: true, prohibit_login: false };
        assert!(allowed(&user(1, "ANN"), &[], &settings));
        assert!(allowed(&user(9, "bob"), &[], &settings));
        assert!(!allowed(&user(10, "9"), &[], &settings), "a bare number is a name, an id is id:N");
        assert!(allowed(&user(2, "bob"), &["acme".into()], &settings));
        assert!(!allowed(&user(2, "bob"), &["acme-2".into()], &settings));
    }
}
