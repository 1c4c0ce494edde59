//! The GitHub App's share of the control plane's state: its settings (the
//! private key and the webhook secret sealed with the cluster key), and
//! the installation tokens it acts with, kept in memory until five minutes
//! before GitHub expires them. A deploy's clone gets a token of its own,
//! narrower (one repository, `contents: read`), made by the provider
//! (`cloudweb_git::github`).

use std::collections::HashMap;

use cloudweb_git::github::{self, AppKey, GitHub, GitHubApp};

use super::provider_error;
use crate::error::ApiError;
use crate::store::GithubSettingsRow;
use crate::AppState;

/// Reuse an installation token until this long before it expires.
const TOKEN_MARGIN_MS: i64 = 5 * 60 * 1000;

pub fn private_key_context() -> &'static str {
    "github-app-private-key"
}

pub fn webhook_secret_context() -> &'static str {
    "github-app-webhook-secret"
}

/// Installation tokens for API calls, by installation id: (token, expiry
/// in unix ms).
#[derive(Default)]
pub struct TokenCache {
    tokens: tokio::sync::Mutex<HashMap<i64, (String, i64)>>,
}

impl TokenCache {
    /// Forgets every token (new settings: another App, perhaps).
    pub async fn clear(&self) {
        self.tokens.lock().await.clear();
    }

    /// Forgets one installation's token (it was removed, suspended, or its
    /// repositories changed): the next call makes a new one, or learns why not.
    pub async fn forget(&self, installation: i64) -> bool {
        self.tokens.lock().await.remove(&installation).is_some()
    }
}

/// The App's settings with its secrets opened.
pub struct Opened {
    pub row: GithubSettingsRow,
    pub private_key: String,
    pub webhook_secret: Vec<u8>,
}

fn open(state: &AppState, context: &str, sealed: &str, what: &str) -> Result<Vec<u8>, ApiError> {
    state.sealer.open(context, sealed).map_err(|e| ApiError::Internal(format!("the GitHub App's {what}: {e}")))
}

/// The GitHub App's settings, `None` when it is not configured.
pub async fn settings(state: &AppState) -> Result<Option<Opened>, ApiError> {
    let Some(row) = state.store.github_settings().await? else { return Ok(None) };
    let private_key = String::from_utf8(open(state, private_key_context(), &row.private_key_sealed, "private key")?)
        .map_err(|_| ApiError::Internal("the GitHub App's private key is not text".into()))?;
    let webhook_secret = open(state, webhook_secret_context(), &row.webhook_secret_sealed, "webhook secret")?;
    Ok(Some(Opened { row, private_key, webhook_secret }))
}

fn not_configured() -> ApiError {
    ApiError::NotFound("GitHub is not configured (PUT /api/github/settings, or `cloudweb github setup`)".into())
}

/// The App, calling as itself.
pub async fn app(state: &AppState) -> Result<GitHubApp, ApiError> {
    let opened = settings(state).await?.ok_or_else(not_configured)?;
    let key = AppKey::from_pem(opened.row.app_id, &opened.private_key).map_err(ApiError::Internal)?;
    Ok(GitHubApp { http: state.git.http.clone(), api: opened.row.api_url, key: std::sync::Arc::new(key) })
}

/// One installation of the App, with an installation token for API calls
/// (reused while it has more than five minutes left).
pub async fn installation(state: &AppState, installation: i64) -> Result<GitHub, ApiError> {
    let app = app(state).await?;
    let now = state.clock.now_ms();
    let mut tokens = state.git.github_tokens.tokens.lock().await;
    if let Some((token, expires)) = tokens.get(&installation) {
        if expires - now > TOKEN_MARGIN_MS {
            return Ok(GitHub { app, installation, token: token.clone() });
        }
    }
    let made = app.installation_token(installation, &[], None).await.map_err(provider_error)?;
    // A token whose expiry cannot be read is used for this call only.
    let expires = made.expires_at_ms().unwrap_or(now);
    tokens.insert(installation, (made.token.clone(), expires));
    Ok(GitHub { app, installation, token: made.token })
}

/// Validates and stores the App's settings (from the API).
pub async fn apply_settings(state: &AppState, input: cloudweb_api_types::github::GithubSettingsInput) -> Result<GithubSettingsRow, ApiError> {
    let existing = state.store.github_settings().await?;
    let api_url = github::api_url(input.api_url.as_deref().unwrap_or(github::DEFAULT_API_URL), state.config.allow_private_git_hosts).map_err(ApiError::BadRequest)?;
    if input.app_id <= 0 {
        return Err(ApiError::BadRequest("app_id must be the GitHub App's id (a positive number)".into()));
    }
    let private_key_sealed = match input.private_key {
        Some(pem) => {
            // PEM: lines of printable ASCII.
            if pem.len() > 16 * 1024 || !pem.bytes().all(|b| b == b'\n' || b == b'\r' || (0x20..0x7f).contains(&b)) {
                return Err(ApiError::BadRequest("invalid private_key: the PEM file GitHub gave (printable text, at most 16 KiB)".into()));
            }
            // Checked now, so a wrong key is refused here and not at the first deploy.
            AppKey::from_pem(input.app_id, &pem).map_err(ApiError::BadRequest)?;
            state.sealer.seal(private_key_context(), pem.as_bytes())
        }
        None => existing.as_ref().map(|e| e.private_key_sealed.clone()).ok_or_else(|| ApiError::BadRequest("private_key is required the first time".into()))?,
    };
    let webhook_secret_sealed = match input.webhook_secret {
        Some(secret) => {
            cloudweb_protocol::validate::bounded_text("webhook_secret", &secret, 1024)?;
            if secret.len() < 16 {
                return Err(ApiError::BadRequest("webhook_secret must be at least 16 characters (GitHub signs every event with it)".into()));
            }
            state.sealer.seal(webhook_secret_context(), secret.as_bytes())
        }
        None => existing.as_ref().map(|e| e.webhook_secret_sealed.clone()).ok_or_else(|| ApiError::BadRequest("webhook_secret is required the first time".into()))?,
    };
    let row = GithubSettingsRow { api_url, app_id: input.app_id, private_key_sealed, webhook_secret_sealed, updated_at: state.clock.now_ms() };
    state.store.put_github_settings(&row).await?;
    state.git.github_tokens.clear().await;
    tracing::info!(api_url = %row.api_url, app_id = row.app_id, "GitHub App settings saved");
    Ok(row)
}
