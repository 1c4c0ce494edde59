//! Git providers: GitLab login (OAuth 2 with PKCE), push-to-deploy from
//! GitLab projects, GitHub repositories (as a GitHub App), Gitea and
//! Forgejo repositories and any git host, short-lived clone credentials
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

pub mod gitea;
pub mod github;
pub mod github_login;
pub mod linked;
pub mod login;
pub mod preview_notes;
pub mod settings;

pub use cloudweb_git::{generic, gitea as gitea_api, github as github_api, github_login as github_login_api, gitlab, provider};

use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use cloudweb_protocol::GitCredentials;
use rand::Rng;
use tokio::sync::mpsc;

pub use provider::{Branch, CloneCredentials, CommitState, CommitStatus, GitProvider, Project, ProviderError, Repo};

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
    /// The GitHub App's installation tokens for API calls.
    pub github_tokens: github::TokenCache,
    /// Deployments waiting for a provider to hand out clone credentials.
    pub clone_retries: CloneRetries,
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
            github_tokens: github::TokenCache::default(),
            clone_retries: CloneRetries::default(),
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
        // Any other refusal is the provider's answer to this request, not
        // an outage: retrying would get the same (429 is an outage).
        ProviderError::Status { status: 400..=428 | 430..=499, .. } => ApiError::Unprocessable(err.to_string()),
        // Down, overloaded, unreachable, or an answer that made no sense.
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
/// Also checks, every `--team-mapping-check-seconds` (an hour), the
/// groups of linked identities against the team mappings.
pub async fn refresher(state: Arc<AppState>) {
    let resync = state.config.auth.mapping_check;
    let mut interval = tokio::time::interval(resync.min(Duration::from_secs(60)));
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_groups_sync: Option<tokio::time::Instant> = None;
    loop {
        interval.tick().await;
        if last_groups_sync.is_none_or(|at| at.elapsed() >= resync) {
            last_groups_sync = Some(tokio::time::Instant::now());
            resync_groups(&state).await;
        }
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

/// Checks memberships from team mappings against the groups each linked
/// identity is in now: GitLab groups and Gitea organizations with the
/// identity's stored token, GitHub organizations and teams through the
/// App's installations.
async fn resync_groups(state: &AppState) {
    resync_gitlab_groups(state).await;
    resync_gitea_orgs(state).await;
    resync_github_groups(state).await;
}

/// For each GitHub identity linked to a user: the mapped organizations
/// and teams it is in now, asked through the App's installation on each
/// organization (the login's own token is revoked right after the login).
/// A user any of whose groups cannot be checked (the App not installed
/// there, or without "Members: read") keeps its memberships until the
/// next login.
async fn resync_github_groups(state: &AppState) {
    let groups = match state.store.team_mappings().await {
        Ok(mappings) => crate::access::mapping::mapped_groups(&mappings, "github"),
        Err(err) => return tracing::warn!(error = %err, "cannot read the team mappings"),
    };
    if groups.is_empty() {
        return;
    }
    let installations = match github::app(state).await {
        Ok(app) => match app.installations().await {
            Ok(list) => list,
            Err(err) => return tracing::warn!(error = %err, "cannot list the GitHub App's installations to check team mappings"),
        },
        Err(_) => return tracing::debug!("no GitHub App: GitHub team mappings follow each login only"),
    };
    let identities = match state.store.linked_git_identities("github").await {
        Ok(identities) => identities,
        Err(err) => return tracing::warn!(error = %err, "cannot list GitHub identities to check their groups"),
    };
    let org_of = |group: &str| group.split_once('/').map_or(group, |(org, _)| org).to_string();
    // Any installation on a mapped organization can read a user by id.
    let any_installation = groups.iter().find_map(|group| installations.iter().find(|i| i.account.eq_ignore_ascii_case(&org_of(group))));
    for identity in identities {
        let Some(local) = identity.local_user.clone() else { continue };
        let mut member_of = Vec::new();
        let mut unknown = None;
        // Groups are asked by login, and the login may have been renamed
        // since the user's last login: the current one, by the account's
        // id. An account that no longer exists is in no group.
        let mut login = identity.username.clone();
        if let Some(installation) = any_installation {
            let current = match github::installation(state, installation.id).await {
                Ok(api) => api.login_of(identity.provider_user_id).await.map_err(|e| e.to_string()),
                Err(err) => Err(err.to_string()),
            };
            match current {
                Ok(Some(current)) => {
                    if current != identity.username {
                        tracing::info!(old = %identity.username, new = %current, "a linked GitHub account was renamed");
                        if let Err(err) = state.store.saw_git_identity("github", identity.provider_user_id, &current, state.clock.now_ms()).await {
                            tracing::warn!(error = %err, "cannot record a GitHub account's new login");
                        }
                    }
                    login = current;
                }
                Ok(None) => {
                    tracing::info!(login = %identity.username, "a linked GitHub account no longer exists; its mapped memberships go");
                    if let Err(err) = crate::access::mapping::apply(state, &local, "github", &[]).await {
                        tracing::warn!(login = %identity.username, error = %err, "cannot apply the team mappings");
                    }
                    continue;
                }
                Err(err) => {
                    tracing::warn!(login = %identity.username, reason = %err, "cannot read a GitHub identity's login; its memberships stay until its next login");
                    continue;
                }
            }
        }
        for group in &groups {
            let org = org_of(group);
            let Some(installation) = installations.iter().find(|i| i.account.eq_ignore_ascii_case(&org)) else {
                unknown = Some(format!("the App is not installed on {org}"));
                break;
            };
            let answer = match github::installation(state, installation.id).await {
                Ok(api) => api.member(group, &login).await.map_err(|e| e.to_string()),
                Err(err) => Err(err.to_string()),
            };
            match answer {
                Ok(Some(true)) => member_of.push(group.clone()),
                Ok(Some(false)) => {}
                Ok(None) => {
                    unknown = Some(format!("the App may not read {org}'s members"));
                    break;
                }
                Err(err) => {
                    unknown = Some(err);
                    break;
                }
            }
        }
        if let Some(reason) = unknown {
            tracing::warn!(login = %identity.username, %reason, "cannot check a GitHub identity's groups; its memberships stay until its next login");
            continue;
        }
        if let Err(err) = crate::access::mapping::apply(state, &local, "github", &member_of).await {
            tracing::warn!(login = %identity.username, error = %err, "cannot apply the team mappings");
        }
    }
}

/// Whether any team mapping names `provider` (logged when unknown).
async fn mapped(state: &AppState, provider: &str) -> bool {
    crate::access::mapping::wanted(state, provider).await.unwrap_or_else(|err| {
        tracing::warn!(error = %err, "cannot read the team mappings");
        false
    })
}

/// For each Gitea identity with tokens linked to a user: its
/// organizations now, applied to the user's mapped memberships.
async fn resync_gitea_orgs(state: &AppState) {
    if !mapped(state, "gitea").await {
        return;
    }
    let holders = match state.store.gitea_token_holders().await {
        Ok(holders) => holders,
        Err(err) => return tracing::warn!(error = %err, "cannot list Gitea identities to check their organizations"),
    };
    for id in holders {
        let Ok(Some(local)) = state.store.git_identity("gitea", id).await.map(|i| i.and_then(|i| i.local_user)) else { continue };
        let orgs = match gitea::gitea_as(state, id).await {
            Ok(api) => api.org_names().await.map_err(|e| ApiError::BadGateway(e.to_string())),
            Err(err) => Err(err),
        };
        match orgs {
            Ok(orgs) => {
                if let Err(err) = crate::access::mapping::apply(state, &local, "gitea", &orgs).await {
                    tracing::warn!(gitea_user = id, error = %err, "cannot apply the team mappings");
                }
            }
            Err(err) => tracing::warn!(gitea_user = id, error = %err, "cannot read a Gitea identity's organizations; its memberships stay until the next check"),
        }
    }
}

/// For each GitLab identity linked to a user: its groups now, applied to
/// the user's mapped memberships (one call each; a failure is logged and
/// waits for the next round).
async fn resync_gitlab_groups(state: &AppState) {
    if !mapped(state, "gitlab").await {
        return;
    }
    let accounts = match state.store.gitlab_accounts().await {
        Ok(accounts) => accounts,
        Err(err) => return tracing::warn!(error = %err, "cannot list GitLab identities to check their groups"),
    };
    for account in accounts {
        let local = match state.store.git_identity("gitlab", account.gitlab_user_id).await {
            Ok(Some(identity)) => identity.local_user,
            _ => None,
        };
        let Some(local) = local else { continue };
        let groups = match gitlab_as(state, account.gitlab_user_id).await {
            Ok(api) => api.group_paths().await.map_err(|e| ApiError::BadGateway(e.to_string())),
            Err(err) => Err(err),
        };
        match groups {
            Ok(groups) => {
                if let Err(err) = crate::access::mapping::apply(state, &local, "gitlab", &groups).await {
                    tracing::warn!(gitlab_user = account.gitlab_user_id, error = %err, "cannot apply the team mappings");
                }
            }
            Err(err) => tracing::warn!(gitlab_user = account.gitlab_user_id, error = %err, "cannot read a GitLab identity's groups; its memberships stay until the next check"),
        }
    }
}

/// The GitLab API as one identity.
pub async fn gitlab_as(state: &AppState, gitlab_user_id: i64) -> Result<gitlab::GitLab, ApiError> {
    let settings = settings(state).await?;
    let token = access_token(state, gitlab_user_id).await?;
    Ok(gitlab::GitLab { http: state.git.http.clone(), base: settings.base_url, token })
}

/// How long a deployment waits for a provider that cannot be reached (or
/// answers 5xx) to hand out its clone credentials before it fails.
pub const CLONE_CREDENTIALS_PATIENCE_MS: i64 = 2 * 60 * 1000;
/// The longest wait between two attempts.
const CLONE_RETRY_MAX_MS: i64 = 30_000;

/// When each waiting deployment may ask its provider again: (attempts so
/// far, not before this unix ms).
#[derive(Default)]
pub struct CloneRetries {
    due: Mutex<std::collections::HashMap<String, (u32, i64)>>,
}

/// What asking for a deployment's clone credentials came to.
pub enum CloneAccess {
    /// The credentials (`None`: the app uses its own stored ones).
    Ready(Option<GitCredentials>),
    /// The provider could not be reached or failed on its side; the
    /// reconciler asks again later (with back-off) until the patience runs out.
    Later(String),
}

/// [`clone_credentials`], with a provider that is down for a while
/// retried (1 s, 2 s, 4 s … at most 30 s apart) for
/// [`CLONE_CREDENTIALS_PATIENCE_MS`] from the deployment's creation,
/// instead of failing the deployment at once. A refusal (401, 403, 404)
/// fails at once.
pub async fn clone_access(state: &AppState, app: &AppRow, deployment: &DeploymentRow) -> Result<CloneAccess, ApiError> {
    let now = state.clock.now_ms();
    let pending = state.git.clone_retries.due.lock().expect("clone retry lock").get(&deployment.id).copied();
    if let Some((_, not_before)) = pending {
        if now < not_before {
            return Ok(CloneAccess::Later("waiting to ask the git provider again".into()));
        }
    }
    match clone_credentials(state, app, deployment).await {
        Ok(credentials) => {
            state.git.clone_retries.due.lock().expect("clone retry lock").remove(&deployment.id);
            Ok(CloneAccess::Ready(credentials))
        }
        Err(ApiError::BadGateway(reason)) if now - deployment.created_at < CLONE_CREDENTIALS_PATIENCE_MS => {
            let attempts = pending.map_or(0, |(n, _)| n) + 1;
            let wait = (500_i64 << attempts.min(6)).min(CLONE_RETRY_MAX_MS);
            let mut due = state.git.clone_retries.due.lock().expect("clone retry lock");
            // Deployments that stopped waiting (cancelled, superseded) leave no entry behind.
            due.retain(|_, (_, not_before)| *not_before > now - CLONE_CREDENTIALS_PATIENCE_MS);
            due.insert(deployment.id.clone(), (attempts, now + wait));
            drop(due);
            tracing::warn!(deployment = %deployment.id, attempts, retry_in_ms = wait, error = %reason, "the git provider did not hand out clone credentials; asking again");
            Ok(CloneAccess::Later(reason))
        }
        Err(err) => {
            state.git.clone_retries.due.lock().expect("clone retry lock").remove(&deployment.id);
            Err(err)
        }
    }
}

/// The clone credentials of a deployment from code: for an app from a
/// provider's repository, made for this deployment (a GitLab deploy token
/// or the refreshed OAuth token; a GitHub installation token for that one
/// repository) and kept sealed until the build is over; `None` for other
/// apps, which use their own stored credentials.
pub async fn clone_credentials(state: &AppState, app: &AppRow, deployment: &DeploymentRow) -> Result<Option<GitCredentials>, ApiError> {
    let Some(link) = state.store.app_git_link(&app.name).await? else {
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
    let Some(linked) = linked::connect(state, &link).await? else {
        return Ok(None);
    };
    let Some(made) = linked.provider.clone_credentials(linked.repo(), &deployment.id).await.map_err(provider_error)? else {
        return Ok(None);
    };
    let credentials = GitCredentials { username: made.username, password: made.password };
    let sealed = state.sealer.seal_json(&clone_context(&deployment.id), &credentials);
    state.store.put_deployment_credentials(&deployment.id, &sealed, made.revoke_id, state.clock.now_ms()).await?;
    tracing::info!(deployment = %deployment.id, provider = linked.provider.name(), revocable = made.revoke_id.is_some(), "made clone credentials for the deployment");
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

/// How many times a commit status is tried, and the wait before the
/// first retry (doubling after each).
const STATUS_ATTEMPTS: u32 = 5;
const STATUS_FIRST_RETRY: Duration = Duration::from_secs(5);

/// Posts commit statuses in the order deployments move, and revokes a
/// deployment's clone credentials once its build is over. A status the
/// provider does not take (down, say) is retried in the background with
/// back-off, at most [`STATUS_ATTEMPTS`] times in all, and only while the
/// deployment is still where that status says: it never holds up the
/// deployment or the statuses of others.
pub async fn status_poster(state: Arc<AppState>) {
    let Some(mut moved) = state.git.moved_rx.lock().expect("status queue lock").take() else {
        return;
    };
    while let Some(event) = moved.recv().await {
        if let Err(err) = on_moved(&state, &event).await {
            tracing::warn!(deployment = %event.deployment_id, error = %err, "could not post the commit status; retrying in the background");
            tokio::spawn(retry_status(state.clone(), event));
        }
    }
}

async fn retry_status(state: Arc<AppState>, event: Moved) {
    let mut wait = STATUS_FIRST_RETRY;
    for attempt in 2..=STATUS_ATTEMPTS {
        tokio::time::sleep(wait).await;
        wait *= 2;
        // Moved on since: the newer state's status is the one to post.
        match state.store.deployment(&event.deployment_id).await {
            Ok(Some(d)) if d.state == event.to.as_str() => {}
            Ok(_) => return,
            Err(err) => {
                tracing::warn!(deployment = %event.deployment_id, error = %err, "cannot read the deployment to retry its commit status");
                continue;
            }
        }
        match on_moved(&state, &event).await {
            Ok(()) => return,
            Err(err) if attempt == STATUS_ATTEMPTS => {
                tracing::warn!(deployment = %event.deployment_id, error = %err, attempts = STATUS_ATTEMPTS, "gave up posting the commit status");
            }
            Err(err) => tracing::warn!(deployment = %event.deployment_id, error = %err, attempt, "could not post the commit status"),
        }
    }
}

/// The commit status of a move, then what a preview tells its request
/// (each done once: a retry skips a status already posted and updates the
/// same comment).
async fn on_moved(state: &AppState, event: &Moved) -> Result<(), ApiError> {
    post_status(state, event).await?;
    preview_notes::moved(state, event).await
}

async fn post_status(state: &AppState, event: &Moved) -> Result<(), ApiError> {
    let Some(link) = state.store.app_git_link(&event.app).await? else {
        return Ok(());
    };
    // The build is over: the clone credentials go (taken first, so a
    // provider that cannot be reached does not keep them here).
    if !matches!(event.to, DeploymentState::Queued | DeploymentState::Building) {
        if let Some(taken) = state.store.take_deployment_credentials(&event.deployment_id).await? {
            revoke(state, &link, &event.deployment_id, taken).await;
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
    let Some(linked) = linked::connect(state, &link).await? else {
        return Ok(());
    };
    let app = state.store.app(&event.app).await?;
    let branch = app.map(|a| a.branch).unwrap_or_default();
    // The dashboard's page of the deployment (or a running preview
    // itself): a person follows this link from the provider (the JSON
    // stays at /api/deployments/{id}).
    let target_url = preview_notes::target_url(state, event).await?;
    let mut description = match (event.to, error) {
        (DeploymentState::Failed, Some(error)) => format!("deployment {} failed: {error}", event.deployment_id),
        (to, _) => format!("deployment {} is {}", event.deployment_id, to.as_str()),
    };
    cloudweb_protocol::misc::truncate_on_char(&mut description, 255);
    let status = CommitStatus { sha, branch: &branch, state: commit_state, target_url: &target_url, description: &description };
    linked.provider.post_status(linked.repo(), &status).await.map_err(provider_error)?;
    state.store.set_deployment_status(&event.deployment_id, commit_state.as_str(), state.clock.now_ms()).await?;
    tracing::info!(deployment = %event.deployment_id, status = commit_state.as_str(), provider = linked.provider.name(), "posted the commit status");
    Ok(())
}

/// Revokes a finished build's clone credentials at their provider, once
/// (a failure is logged: they expire by themselves within hours).
async fn revoke(state: &AppState, link: &AppGitLinkRow, deployment_id: &str, taken: crate::store::TakenCredentials) {
    let (Some(sealed), Some(revoke_id)) = (taken.sealed, taken.deploy_token_id) else { return };
    let credentials: GitCredentials = match state.sealer.open_json(&clone_context(deployment_id), &sealed) {
        Ok(c) => c,
        Err(err) => {
            tracing::warn!(deployment = %deployment_id, error = %err, "cannot open the clone credentials to revoke them");
            return;
        }
    };
    let made = CloneCredentials { username: credentials.username, password: credentials.password, revoke_id: Some(revoke_id) };
    let result = match linked::connect(state, link).await {
        Ok(Some(linked)) => linked.provider.revoke_clone_credentials(linked.repo(), &made).await.map_err(provider_error),
        Ok(None) => Ok(()),
        Err(err) => Err(err),
    };
    match result {
        Ok(()) => tracing::info!(deployment = %deployment_id, "revoked the deployment's clone credentials"),
        Err(err) => tracing::warn!(deployment = %deployment_id, error = %err, "could not revoke the clone credentials (they expire by themselves)"),
    }
}

/// The link an app has to its provider, for views.
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
