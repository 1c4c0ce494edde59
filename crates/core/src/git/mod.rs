//! Git providers: GitLab login (OAuth 2 with PKCE), push-to-deploy from
//! GitLab projects and from any git host, short-lived clone credentials
//! for each deploy, and commit statuses that follow the deployment.
//!
//! This module is the glue between providers and the control plane's
//! state: clone credentials per deploy, token refresh, commit statuses
//! posted as deployments move, and the local user behind a GitLab login
//! (`login.rs`); `settings.rs` is the connection's settings. The
//! providers themselves are the `cloudweb-git` crate (re-exported here as
//! `provider`, `gitlab`, `generic`); the routes (`oauth`, `webhooks`,
//! `api`) are `cloudweb_http::git`.
//!
//! Everything secret is sealed (`secrets.rs`) or kept as a digest: the
//! OAuth client secret, each GitLab identity's access and refresh tokens,
//! generic webhook secrets, and the clone credentials of a deployment
//! while it builds. Tokens are refreshed before they expire.

pub mod login;
pub mod settings;

pub use cloudweb_git::{generic, gitlab, provider};

use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use cloudweb_protocol::GitCredentials;
use rand::Rng;
use tokio::sync::mpsc;

pub use provider::{Branch, CloneCredentials, CommitState, CommitStatus, GitProvider, Project, ProviderError};

use crate::deployment_state::DeploymentState;
use crate::error::ApiError;
use crate::store::{AppGitLinkRow, AppRow, DeploymentRow, GitlabAccountRow, GitlabSettingsRow};
use crate::AppState;

/// A GitLab login under way: its PKCE verifier and the browser it
/// belongs to, kept sealed in `one_shot_values` until its callback.
#[derive(serde::Serialize, serde::Deserialize)]
pub struct PendingLogin {
    pub verifier: String,
    /// SHA-256 (hex) of the nonce in the browser's login cookie (`cloudweb_http::git::oauth`).
    pub browser_sha256: String,
}

/// Refresh an access token this long before it expires.
const REFRESH_MARGIN_MS: i64 = 10 * 60 * 1000;
/// Bound on the queue of commit statuses to post.
const STATUS_QUEUE: usize = 1024;

/// A deployment moved: what the status poster needs.
#[derive(Debug, Clone)]
pub struct Moved {
    pub deployment_id: String,
    pub app: String,
    pub commit: Option<String>,
    pub to: DeploymentState,
}

/// The git providers' share of the control plane's state.
pub struct GitState {
    pub http: reqwest::Client,
    /// Where GitLab, browsers and git hosts reach the user API
    /// (`--public-api-url`, else the address it listens on).
    pub public_api_url: OnceLock<String>,
    refresh_lock: tokio::sync::Mutex<()>,
    moved: mpsc::Sender<Moved>,
    moved_rx: Mutex<Option<mpsc::Receiver<Moved>>>,
    /// The certificates of `--gitlab-ca-file`, which clones of the GitLab
    /// host's repositories trust too (see [`repo_ca`]).
    gitlab_ca_pem: Option<String>,
}

impl GitState {
    pub fn new(http: reqwest::Client, public_api_url: Option<String>) -> GitState {
        let (moved, moved_rx) = mpsc::channel(STATUS_QUEUE);
        let url = OnceLock::new();
        if let Some(public) = public_api_url {
            let _ = url.set(public.trim_end_matches('/').to_string());
        }
        GitState {
            http,
            public_api_url: url,
            refresh_lock: tokio::sync::Mutex::new(()),
            moved,
            moved_rx: Mutex::new(Some(moved_rx)),
            gitlab_ca_pem: None,
        }
    }

    /// The private CA of a self-hosted GitLab (`--gitlab-ca-file`), handed
    /// to nodes with the clones of that host's repositories.
    pub fn with_gitlab_ca(mut self, pem: Option<String>) -> GitState {
        self.gitlab_ca_pem = pem;
        self
    }

    pub fn public_url(&self) -> &str {
        self.public_api_url.get().map(String::as_str).unwrap_or("http://127.0.0.1:8080")
    }
}

/// A random secret: 32 bytes, hex.
pub fn random_secret() -> String {
    let bytes: [u8; 32] = rand::rng().random();
    hex::encode(bytes)
}

/// Compares two byte strings in time that does not depend on where they
/// differ.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    use subtle::ConstantTimeEq;
    a.len() == b.len() && bool::from(a.ct_eq(b))
}

pub fn client_secret_context() -> &'static str {
    "gitlab-oauth-client-secret"
}

fn token_context(gitlab_user_id: i64, kind: &str) -> String {
    format!("gitlab-token:{gitlab_user_id}:{kind}")
}

pub fn webhook_context(app: &str) -> String {
    format!("app-webhook:{app}")
}

fn clone_context(deployment_id: &str) -> String {
    format!("deployment-git:{deployment_id}")
}

/// The GitLab connection's settings with the client secret opened.
pub struct Settings {
    pub base_url: String,
    pub client_id: String,
    pub client_secret: String,
    pub allowed_users: Vec<String>,
    pub allowed_groups: Vec<String>,
}

pub async fn settings(state: &AppState) -> Result<Settings, ApiError> {
    let row = state
        .store
        .gitlab_settings()
        .await?
        .ok_or_else(|| ApiError::NotFound("GitLab is not configured (PUT /api/gitlab/settings or the --gitlab-* flags)".into()))?;
    open_settings(state, &row)
}

fn open_settings(state: &AppState, row: &GitlabSettingsRow) -> Result<Settings, ApiError> {
    let secret = state
        .sealer
        .open(client_secret_context(), &row.client_secret_sealed)
        .map_err(|e| ApiError::Internal(format!("GitLab client secret: {e}")))?;
    Ok(Settings {
        base_url: row.base_url.clone(),
        client_id: row.client_id.clone(),
        client_secret: String::from_utf8(secret).map_err(|_| ApiError::Internal("GitLab client secret is not text".into()))?,
        allowed_users: serde_json::from_str(&row.allowed_users).unwrap_or_default(),
        allowed_groups: serde_json::from_str(&row.allowed_groups).unwrap_or_default(),
    })
}

pub fn redirect_uri(state: &AppState) -> String {
    format!("{}/api/auth/gitlab/callback", state.git.public_url())
}

/// Seals and stores a GitLab identity's tokens.
pub async fn save_tokens(state: &AppState, user_id: i64, username: &str, tokens: &gitlab::TokenAnswer) -> Result<(), ApiError> {
    let now = state.clock.now_ms();
    let account = GitlabAccountRow {
        gitlab_user_id: user_id,
        username: username.to_string(),
        local_user: None,
        access_token_sealed: state.sealer.seal(&token_context(user_id, "access"), tokens.access_token.as_bytes()),
        refresh_token_sealed: tokens.refresh_token.as_ref().map(|t| state.sealer.seal(&token_context(user_id, "refresh"), t.as_bytes())),
        expires_at: tokens.expires_in.map(|s| now + s.clamp(0, 10 * 365 * 86_400) * 1000),
        updated_at: now,
    };
    state.store.put_gitlab_account(&account).await?;
    Ok(())
}

fn open_token(state: &AppState, account: &GitlabAccountRow, kind: &str, sealed: &str) -> Result<String, ApiError> {
    let bytes = state
        .sealer
        .open(&token_context(account.gitlab_user_id, kind), sealed)
        .map_err(|e| ApiError::Internal(format!("GitLab token of user {}: {e}", account.gitlab_user_id)))?;
    String::from_utf8(bytes).map_err(|_| ApiError::Internal("a GitLab token is not text".into()))
}

pub fn provider_error(err: ProviderError) -> ApiError {
    match err {
        ProviderError::Unsupported(m) => ApiError::BadRequest(m),
        ProviderError::NotConfigured(m) => ApiError::NotFound(m),
        ProviderError::Status { status: 404, .. } => ApiError::NotFound(err.to_string()),
        ProviderError::Status { status: 401 | 403, .. } => ApiError::Forbidden(err.to_string()),
        other => ApiError::BadGateway(other.to_string()),
    }
}

/// A GitLab identity's access token, refreshed first when it expires
/// within [`REFRESH_MARGIN_MS`]. Refreshes run one at a time: GitLab
/// rotates the refresh token, so two at once would lose one.
pub async fn access_token(state: &AppState, gitlab_user_id: i64) -> Result<String, ApiError> {
    let load = || async {
        state
            .store
            .gitlab_account(gitlab_user_id)
            .await?
            .ok_or_else(|| ApiError::NotFound(format!("no GitLab account {gitlab_user_id}: log in with GitLab first")))
    };
    let account = load().await?;
    let now = state.clock.now_ms();
    let due = |account: &GitlabAccountRow| account.expires_at.is_some_and(|at| at - now < REFRESH_MARGIN_MS) && account.refresh_token_sealed.is_some();
    if !due(&account) {
        return open_token(state, &account, "access", &account.access_token_sealed);
    }
    let _guard = state.git.refresh_lock.lock().await;
    let account = load().await?;
    if due(&account) {
        refresh_account(state, &account).await?;
        let account = load().await?;
        return open_token(state, &account, "access", &account.access_token_sealed);
    }
    open_token(state, &account, "access", &account.access_token_sealed)
}

async fn refresh_account(state: &AppState, account: &GitlabAccountRow) -> Result<(), ApiError> {
    let settings = settings(state).await?;
    let sealed = account.refresh_token_sealed.as_deref().ok_or_else(|| ApiError::Internal("no refresh token".into()))?;
    let refresh_token = open_token(state, account, "refresh", sealed)?;
    let tokens = gitlab::refresh(&state.git.http, &settings.base_url, &settings.client_id, &settings.client_secret, &refresh_token, &redirect_uri(state))
        .await
        .map_err(provider_error)?;
    save_tokens(state, account.gitlab_user_id, &account.username, &tokens).await?;
    tracing::info!(gitlab_user = account.gitlab_user_id, "refreshed a GitLab access token");
    Ok(())
}

/// Refreshes, once a minute, every token that expires within the margin.
pub async fn refresher(state: Arc<AppState>) {
    let mut interval = tokio::time::interval(Duration::from_secs(60));
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        interval.tick().await;
        let due = match state.store.gitlab_accounts_expiring(state.clock.now_ms() + REFRESH_MARGIN_MS).await {
            Ok(due) => due,
            Err(err) => {
                tracing::warn!(error = %err, "cannot list GitLab tokens to refresh");
                continue;
            }
        };
        for account in due {
            // One attempt a minute per token: no retry loop.
            if let Err(err) = access_token(&state, account.gitlab_user_id).await {
                tracing::warn!(gitlab_user = account.gitlab_user_id, error = %err, "could not refresh a GitLab token");
            }
        }
    }
}

/// The GitLab API as one identity.
pub async fn gitlab_as(state: &AppState, gitlab_user_id: i64) -> Result<gitlab::GitLab, ApiError> {
    let settings = settings(state).await?;
    let token = access_token(state, gitlab_user_id).await?;
    Ok(gitlab::GitLab { http: state.git.http.clone(), base: settings.base_url, token })
}

/// The clone credentials of a deployment from code: for an app from a
/// GitLab project, made for this deployment (a deploy token, or the
/// refreshed OAuth token) and kept sealed until the build is over; `None`
/// for other apps, which use their own stored credentials.
pub async fn clone_credentials(state: &AppState, app: &AppRow, deployment: &DeploymentRow) -> Result<Option<GitCredentials>, ApiError> {
    let Some(link) = state.store.app_git_link(&app.name).await? else {
        return Ok(None);
    };
    let (Some(project), Some(account), "gitlab") = (link.project_id, link.account, link.provider.as_str()) else {
        return Ok(None);
    };
    if let Some(row) = state.store.deployment_git(&deployment.id).await? {
        if let Some(sealed) = row.credentials_sealed {
            let credentials: GitCredentials = state
                .sealer
                .open_json(&clone_context(&deployment.id), &sealed)
                .map_err(|e| ApiError::Internal(format!("clone credentials of {}: {e}", deployment.id)))?;
            return Ok(Some(credentials));
        }
    }
    let gitlab = gitlab_as(state, account).await?;
    let Some(made) = gitlab.clone_credentials(project, &deployment.id).await.map_err(provider_error)? else {
        return Ok(None);
    };
    let credentials = GitCredentials { username: made.username, password: made.password };
    let sealed = state.sealer.seal_json(&clone_context(&deployment.id), &credentials);
    state.store.put_deployment_credentials(&deployment.id, &sealed, made.revoke_id, state.clock.now_ms()).await?;
    tracing::info!(deployment = %deployment.id, deploy_token = made.revoke_id.is_some(), "made clone credentials for the deployment");
    Ok(Some(credentials))
}

/// The CA a clone of `repo_url` trusts beyond the node's own: the
/// `--gitlab-ca-file` certificates when the repository is https on the
/// configured GitLab's host and port, `None` for every other repository.
pub async fn repo_ca(state: &AppState, repo_url: &str) -> Result<Option<String>, ApiError> {
    let Some(pem) = &state.git.gitlab_ca_pem else { return Ok(None) };
    let Some(row) = state.store.gitlab_settings().await? else { return Ok(None) };
    Ok(same_https_origin(&row.base_url, repo_url).then(|| pem.clone()))
}

/// Both URLs are https with the same host and port.
fn same_https_origin(a: &str, b: &str) -> bool {
    let (Ok(a), Ok(b)) = (url::Url::parse(a), url::Url::parse(b)) else { return false };
    a.scheme() == "https" && b.scheme() == "https" && a.host() == b.host() && a.port_or_known_default() == b.port_or_known_default()
}

/// Tells the status poster that a deployment moved. Never blocks: a full
/// queue drops the status (logged).
pub fn deployment_moved(state: &AppState, deployment: &DeploymentRow, to: DeploymentState) {
    let moved = Moved { deployment_id: deployment.id.clone(), app: deployment.app.clone(), commit: deployment.commit_sha.clone(), to };
    if state.git.moved.try_send(moved).is_err() {
        tracing::warn!(deployment = %deployment.id, "the commit status queue is full; a status was not posted");
    }
}

fn commit_state(to: DeploymentState, error: Option<&str>) -> Option<CommitState> {
    match to {
        DeploymentState::Queued => Some(CommitState::Pending),
        DeploymentState::Building | DeploymentState::Deploying => Some(CommitState::Running),
        DeploymentState::Running => Some(CommitState::Success),
        DeploymentState::Failed if error == Some(crate::deployment_state::CANCELLED) => Some(CommitState::Canceled),
        DeploymentState::Failed => Some(CommitState::Failed),
        DeploymentState::Superseded => None,
    }
}

/// Posts commit statuses in the order deployments move, and revokes a
/// deployment's clone credentials once its build is over.
pub async fn status_poster(state: Arc<AppState>) {
    let Some(mut moved) = state.git.moved_rx.lock().expect("status queue lock").take() else {
        return;
    };
    while let Some(event) = moved.recv().await {
        if let Err(err) = on_moved(&state, &event).await {
            tracing::warn!(deployment = %event.deployment_id, error = %err, "could not post the commit status");
        }
    }
}

async fn on_moved(state: &AppState, event: &Moved) -> Result<(), ApiError> {
    let Some(link) = state.store.app_git_link(&event.app).await? else {
        return Ok(());
    };
    let (Some(project), Some(account), "gitlab") = (link.project_id, link.account, link.provider.as_str()) else {
        return Ok(());
    };
    let gitlab = gitlab_as(state, account).await?;
    // The build is over: the clone credentials go.
    if !matches!(event.to, DeploymentState::Queued | DeploymentState::Building) {
        if let Some(token_id) = state.store.take_deployment_credentials(&event.deployment_id).await? {
            match gitlab.revoke_clone_credentials(project, token_id).await {
                Ok(()) => tracing::info!(deployment = %event.deployment_id, "revoked the deployment's deploy token"),
                Err(err) => tracing::warn!(deployment = %event.deployment_id, error = %err, "could not revoke the deploy token (it expires by itself)"),
            }
        }
    }
    let Some(sha) = event.commit.as_deref() else {
        return Ok(());
    };
    let deployment = state.store.deployment(&event.deployment_id).await?;
    let error = deployment.as_ref().and_then(|d| d.error.clone());
    let Some(commit_state) = commit_state(event.to, error.as_deref()) else {
        return Ok(());
    };
    let previous = state.store.deployment_git(&event.deployment_id).await?.and_then(|r| r.last_status);
    if previous.as_deref() == Some(commit_state.as_str()) {
        return Ok(());
    }
    let app = state.store.app(&event.app).await?;
    let branch = app.map(|a| a.branch).unwrap_or_default();
    // The dashboard's page of the deployment: a person follows this link
    // from GitLab (the JSON stays at /api/deployments/{id}).
    let target_url = format!("{}/deployments/{}", state.git.public_url(), event.deployment_id);
    let mut description = match (event.to, error) {
        (DeploymentState::Failed, Some(error)) => format!("deployment {} failed: {error}", event.deployment_id),
        (to, _) => format!("deployment {} is {}", event.deployment_id, to.as_str()),
    };
    cloudweb_protocol::misc::truncate_on_char(&mut description, 255);
    let status = CommitStatus { sha, branch: &branch, state: commit_state, target_url: &target_url, description: &description };
    gitlab.post_status(project, &status).await.map_err(provider_error)?;
    state.store.set_deployment_status(&event.deployment_id, commit_state.as_str(), state.clock.now_ms()).await?;
    tracing::info!(deployment = %event.deployment_id, status = commit_state.as_str(), "posted the commit status");
    Ok(())
}

/// The link an app has to its provider, for views.
#[cfg(test)]
mod ca_tests {
    #[test]
    fn the_gitlab_ca_goes_only_to_the_gitlab_host_and_port() {
        let base = "https://gitlab.internal:8443";
        assert!(super::same_https_origin(base, "https://GitLab.internal:8443/acme/site.git"));
        assert!(!super::same_https_origin(base, "https://gitlab.internal/acme/site.git"));
        assert!(!super::same_https_origin(base, "https://other.internal:8443/acme/site.git"));
        assert!(!super::same_https_origin("http://gitlab.internal:8443", "http://gitlab.internal:8443/a.git"));
        assert!(super::same_https_origin("https://gitlab.internal", "https://gitlab.internal:443/a.git"));
        assert!(!super::same_https_origin(base, "git@gitlab.internal:acme/site.git"));
    }
}

pub fn link_view(link: &AppGitLinkRow) -> cloudweb_api_types::apps::GitLink {
    cloudweb_api_types::apps::GitLink {
        provider: link.provider.clone(),
        project_id: link.project_id,
        project: link.project_path.clone(),
        account: link.account,
        webhook_registered: link.hook_id.is_some(),
        webhook: None,
    }
}
