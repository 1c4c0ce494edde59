//! The GitLab routes of the user API (`/api/gitlab/...`), and what
//! creating or deleting an app does with its provider: an app made from a
//! GitLab project gets a push webhook with its own random secret; an app
//! from any other git URL can ask for a webhook URL and secret for the
//! generic, HMAC-signed webhook.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, Query, State};
use axum::{Extension, Json};
use cloudweb_api_types::apps::{GitLink, WebhookSetup};
use cloudweb_api_types::git::{Branch, BranchList, GitlabAccount, GitlabAccountList, GitlabSettingsView, Project, ProjectList};
use cloudweb_api_types::ErrorBody;
use serde::Deserialize;

use super::gitlab;
use super::provider::GitProvider;
use crate::auth::Principal;
use crate::ca::sha256_hex;
use crate::error::{body_bytes, parse_json, ApiError};
use crate::store::{AppGitLinkRow, GitlabSettingsRow};
use crate::AppState;

/// Longest allow-list.
const MAX_ALLOWED: usize = 1000;

fn settings_view(state: &AppState, row: &GitlabSettingsRow) -> GitlabSettingsView {
    GitlabSettingsView {
        base_url: row.base_url.clone(),
        client_id: row.client_id.clone(),
        // The secret itself never leaves the control plane.
        client_secret_set: true,
        allowed_users: serde_json::from_str(&row.allowed_users).unwrap_or_default(),
        allowed_groups: serde_json::from_str(&row.allowed_groups).unwrap_or_default(),
        redirect_uri: super::redirect_uri(state),
        login_url: format!("{}/api/auth/gitlab/login", state.git.public_url()),
    }
}

#[utoipa::path(get, path = "/api/gitlab/settings", operation_id = "gitlab_settings_show", tag = "git",
    responses((status = 200, description = "The GitLab connection (never the client secret)", body = GitlabSettingsView), (status = 404, description = "GitLab is not configured", body = ErrorBody)))]
pub async fn get_settings(State(state): State<Arc<AppState>>) -> Result<Json<GitlabSettingsView>, ApiError> {
    let row = state.store.gitlab_settings().await?.ok_or_else(|| ApiError::NotFound("GitLab is not configured".into()))?;
    Ok(Json(settings_view(&state, &row)))
}

pub use crate::git::settings::SettingsInput;

/// Validates and stores GitLab settings (from the API or the flags).
pub async fn apply_settings(state: &AppState, input: SettingsInput) -> Result<GitlabSettingsRow, ApiError> {
    let base_url = gitlab::base_url(&input.base_url, state.config.allow_private_git_hosts).map_err(ApiError::BadRequest)?;
    cloudweb_protocol::validate::bounded_text("client_id", &input.client_id, 256)?;
    if input.client_id.is_empty() || input.client_id.contains(char::is_whitespace) {
        return Err(ApiError::BadRequest("invalid client_id".into()));
    }
    if input.allowed_users.len() > MAX_ALLOWED || input.allowed_groups.len() > MAX_ALLOWED {
        return Err(ApiError::BadRequest(format!("at most {MAX_ALLOWED} allowed users and groups")));
    }
    for (field, list) in [("allowed_users", &input.allowed_users), ("allowed_groups", &input.allowed_groups)] {
        for entry in list {
            cloudweb_protocol::validate::bounded_text(field, entry, 255)?;
            if entry.is_empty() || !entry.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-/".contains(&b)) {
                return Err(ApiError::BadRequest(format!("invalid {field} entry {entry:?}: GitLab names are letters, digits, '.', '_', '-' (and '/' in group paths)")));
            }
        }
    }
    let client_secret_sealed = match input.client_secret {
        Some(secret) => {
            cloudweb_protocol::validate::bounded_text("client_secret", &secret, 1024)?;
            if secret.is_empty() {
                return Err(ApiError::BadRequest("client_secret must not be empty".into()));
            }
            state.sealer.seal(super::client_secret_context(), secret.as_bytes())
        }
        None => match state.store.gitlab_settings().await? {
            Some(existing) => existing.client_secret_sealed,
            None => return Err(ApiError::BadRequest("client_secret is required the first time".into())),
        },
    };
    let row = GitlabSettingsRow {
        base_url,
        client_id: input.client_id,
        client_secret_sealed,
        allowed_users: serde_json::to_string(&input.allowed_users).expect("strings serialize"),
        allowed_groups: serde_json::to_string(&input.allowed_groups).expect("strings serialize"),
        updated_at: state.clock.now_ms(),
    };
    state.store.put_gitlab_settings(&row).await?;
    tracing::info!(base_url = %row.base_url, "GitLab settings saved");
    Ok(row)
}

#[utoipa::path(put, path = "/api/gitlab/settings", operation_id = "gitlab_settings_replace", tag = "git", request_body = SettingsInput,
    responses((status = 200, description = "Saved; the client secret is sealed", body = GitlabSettingsView), (status = 400, description = "Invalid settings", body = ErrorBody), (status = 413, description = "Body over 1 MiB", body = ErrorBody)))]
pub async fn put_settings(State(state): State<Arc<AppState>>, body: Result<Bytes, BytesRejection>) -> Result<Json<GitlabSettingsView>, ApiError> {
    let input: SettingsInput = parse_json(&body_bytes(body)?)?;
    let row = apply_settings(&state, input).await?;
    Ok(Json(settings_view(&state, &row)))
}

#[utoipa::path(get, path = "/api/gitlab/accounts", operation_id = "gitlab_accounts_list", tag = "git", responses((status = 200, description = "GitLab identities that logged in (never a token)", body = GitlabAccountList)))]
pub async fn accounts(State(state): State<Arc<AppState>>) -> Result<Json<GitlabAccountList>, ApiError> {
    let accounts = state
        .store
        .gitlab_accounts()
        .await?
        .into_iter()
        .map(|a| GitlabAccount {
            gitlab_user_id: a.gitlab_user_id,
            username: a.username,
            linked_user: a.local_user,
            token_expires_at: a.expires_at.map(crate::clock::rfc3339_ms),
        })
        .collect();
    Ok(Json(GitlabAccountList { accounts }))
}

/// Which GitLab identity acts for the caller. A user acts through the
/// identities linked to them: the one named (it must be theirs), else
/// their only one. The admin token may name any identity, else the only
/// one there is.
async fn account_for(state: &AppState, principal: &Principal, named: Option<i64>) -> Result<i64, ApiError> {
    if let Some(user) = principal.user() {
        let mine = state.store.gitlab_accounts_of_user(&user.id).await?;
        if let Some(id) = named {
            return mine
                .iter()
                .find(|a| a.gitlab_user_id == id)
                .map(|a| a.gitlab_user_id)
                .ok_or_else(|| ApiError::Forbidden(format!("the GitLab account {id} is not linked to your user")));
        }
        return match mine.as_slice() {
            [only] => Ok(only.gitlab_user_id),
            [] => Err(ApiError::NotFound("your user has no GitLab identity: log in with GitLab first (/api/auth/gitlab/login)".into())),
            _ => Err(ApiError::BadRequest("several GitLab identities are linked to your user: name one with account (gitlab_account when creating an app)".into())),
        };
    }
    if let Some(id) = named {
        return state.store.gitlab_account(id).await?.map(|a| a.gitlab_user_id).ok_or_else(|| ApiError::NotFound(format!("no GitLab account {id}")));
    }
    let accounts = state.store.gitlab_accounts().await?;
    match accounts.as_slice() {
        [only] => Ok(only.gitlab_user_id),
        [] => Err(ApiError::NotFound("no GitLab account: log in with GitLab first (/api/auth/gitlab/login)".into())),
        _ => Err(ApiError::BadRequest("several GitLab accounts exist: name one with account (gitlab_account when creating an app)".into())),
    }
}

#[derive(Deserialize)]
pub struct ProjectsQuery {
    account: Option<i64>,
    search: Option<String>,
}

#[utoipa::path(get, path = "/api/gitlab/projects", operation_id = "gitlab_projects_list", tag = "git",
    params(("search" = Option<String>, Query, description = "Part of the project path"), ("account" = Option<i64>, Query, description = "GitLab user id acting; by default the caller's own linked identity")),
    responses(
        (status = 200, description = "The user's projects", body = ProjectList),
        (status = 400, description = "Several accounts: name one", body = ErrorBody),
        (status = 403, description = "The named GitLab account is not linked to the caller", body = ErrorBody),
        (status = 404, description = "No GitLab account or not configured", body = ErrorBody),
        (status = 502, description = "GitLab failed", body = ErrorBody),
    ))]
pub async fn projects(State(state): State<Arc<AppState>>, Extension(principal): Extension<Principal>, Query(query): Query<ProjectsQuery>) -> Result<Json<ProjectList>, ApiError> {
    if let Some(search) = &query.search {
        cloudweb_protocol::validate::bounded_text("search", search, 100)?;
    }
    let projects = list_projects(&state, &principal, query.account, query.search.as_deref()).await?;
    let projects = projects
        .into_iter()
        .map(|p| Project { id: p.id, path: p.path, clone_url: p.clone_url, default_branch: p.default_branch, web_url: p.web_url })
        .collect();
    Ok(Json(ProjectList { projects }))
}

/// The GitLab projects `principal` can reach through its identity (the
/// one named, else its only one): what `GET /api/gitlab/projects` answers
/// and the dashboard's new-app form offers.
pub async fn list_projects(state: &AppState, principal: &Principal, account: Option<i64>, search: Option<&str>) -> Result<Vec<super::provider::Project>, ApiError> {
    let account = account_for(state, principal, account).await?;
    let gitlab = super::gitlab_as(state, account).await?;
    gitlab.projects(search).await.map_err(super::provider_error)
}

#[derive(Deserialize)]
pub struct AccountQuery {
    account: Option<i64>,
}

#[utoipa::path(get, path = "/api/gitlab/projects/{id}/branches", operation_id = "gitlab_branches_list", tag = "git",
    params(("id" = i64, Path, description = "GitLab project id"), ("account" = Option<i64>, Query, description = "GitLab user id acting")),
    responses(
        (status = 200, description = "The project's branches", body = BranchList),
        (status = 400, description = "Several accounts: name one", body = ErrorBody),
        (status = 403, description = "The named GitLab account is not linked to the caller", body = ErrorBody),
        (status = 404, description = "No such project or account", body = ErrorBody),
        (status = 502, description = "GitLab failed", body = ErrorBody),
    ))]
pub async fn branches(State(state): State<Arc<AppState>>, Extension(principal): Extension<Principal>, Path(project): Path<i64>, Query(query): Query<AccountQuery>) -> Result<Json<BranchList>, ApiError> {
    let account = account_for(&state, &principal, query.account).await?;
    let gitlab = super::gitlab_as(&state, account).await?;
    let branches = gitlab.branches(super::Repo { id: project, path: "" }).await.map_err(super::provider_error)?;
    let branches = branches.into_iter().map(|b| Branch { name: b.name, commit: b.commit }).collect();
    Ok(Json(BranchList { branches }))
}

pub use cloudweb_api_types::apps::ProjectRef;

/// What app creation learned from the provider, to link once the app row exists.
pub enum LinkPlan {
    Gitlab { account: i64, project: super::Project },
    /// A repository of a GitHub App installation.
    Github { installation: i64, project: super::Project },
    /// A Gitea or Forgejo repository, through a logged-in identity.
    Gitea { account: i64, project: super::Project },
    Generic,
}

/// What `POST /api/apps` asks of a provider: for an app from a GitLab
/// project, a GitHub or a Gitea repository, the project looked up (its clone URL
/// and default branch go into `request`) and the link to make once the app
/// exists; for a generic webhook, its link; else `None`.
pub async fn plan_for(state: &AppState, principal: &Principal, request: &mut cloudweb_api_types::apps::CreateApp) -> Result<Option<LinkPlan>, ApiError> {
    let sources = [request.gitlab_project.is_some(), request.github_repository.is_some(), request.gitea_repository.is_some()];
    if sources.iter().filter(|s| **s).count() > 1 {
        return Err(ApiError::BadRequest("give one of gitlab_project, github_repository and gitea_repository".into()));
    }
    if request.gitlab_account.is_some() && request.gitlab_project.is_none() {
        return Err(ApiError::BadRequest("gitlab_account only goes with gitlab_project".into()));
    }
    if request.gitea_account.is_some() && request.gitea_repository.is_none() {
        return Err(ApiError::BadRequest("gitea_account only goes with gitea_repository".into()));
    }
    if let Some(repository) = request.gitea_repository.clone() {
        if !request.repo_url.is_empty() || request.webhook {
            return Err(ApiError::BadRequest("give gitea_repository or repo_url (with webhook), not both".into()));
        }
        if request.git_username.is_some() || request.git_ssh_key.is_some() {
            return Err(ApiError::BadRequest("an app from a Gitea repository clones with its Gitea identity's token; drop git_username, git_password and git_ssh_key".into()));
        }
        cloudweb_protocol::validate::node_name("name", &request.name)?;
        let (account, project) = super::gitea::resolve_repository(state, principal, &repository, request.gitea_account).await?;
        request.repo_url = project.clone_url.clone();
        if request.branch.is_none() {
            request.branch = project.default_branch.clone();
        }
        return Ok(Some(LinkPlan::Gitea { account, project }));
    }
    let plan = match (&request.gitlab_project, &request.github_repository) {
        (None, Some(repository)) => {
            if !request.repo_url.is_empty() || request.webhook {
                return Err(ApiError::BadRequest("give github_repository or repo_url (with webhook), not both".into()));
            }
            if request.git_username.is_some() || request.git_ssh_key.is_some() {
                return Err(ApiError::BadRequest("an app from a GitHub repository gets its clone credentials from the GitHub App; drop git_username, git_password and git_ssh_key".into()));
            }
            cloudweb_protocol::validate::node_name("name", &request.name)?;
            let (installation, project) = super::github::resolve_repository(state, repository).await?;
            request.repo_url = project.clone_url.clone();
            if request.branch.is_none() {
                request.branch = project.default_branch.clone();
            }
            Some(LinkPlan::Github { installation, project })
        }
        (Some(project), _) => {
            if !request.repo_url.is_empty() || request.webhook {
                return Err(ApiError::BadRequest("give gitlab_project or repo_url (with webhook), not both".into()));
            }
            if request.git_username.is_some() || request.git_ssh_key.is_some() {
                return Err(ApiError::BadRequest("an app from a GitLab project gets its clone credentials from GitLab; drop git_username, git_password and git_ssh_key".into()));
            }
            cloudweb_protocol::validate::node_name("name", &request.name)?;
            let (account, project) = resolve_project(state, principal, project, request.gitlab_account).await?;
            request.repo_url = project.clone_url.clone();
            if request.branch.is_none() {
                request.branch = project.default_branch.clone();
            }
            Some(LinkPlan::Gitlab { account, project })
        }
        (None, None) if request.webhook => Some(LinkPlan::Generic),
        (None, None) => None,
    };
    Ok(plan)
}

/// Looks up the GitLab project an app is created from.
pub async fn resolve_project(state: &AppState, principal: &Principal, project: &ProjectRef, account: Option<i64>) -> Result<(i64, super::Project), ApiError> {
    let account = account_for(state, principal, account).await?;
    let key = match project {
        ProjectRef::Id(id) => id.to_string(),
        ProjectRef::Path(path) => {
            cloudweb_protocol::validate::bounded_text("gitlab_project", path, 512)?;
            if path.is_empty() || path.starts_with('/') || path.contains("..") {
                return Err(ApiError::BadRequest("invalid gitlab_project: a numeric id or group/name".into()));
            }
            path.clone()
        }
    };
    let gitlab = super::gitlab_as(state, account).await?;
    let project = gitlab.project(&key).await.map_err(super::provider_error)?;
    Ok((account, project))
}

/// After the app row exists: registers the GitLab webhook (or makes the
/// generic webhook's secret) and records the link. Returns what the
/// creator sees: for a generic webhook, the URL and the secret, once.
pub async fn link_app(state: &AppState, app: &str, branch: &str, plan: LinkPlan) -> Result<GitLink, ApiError> {
    let secret = super::random_secret();
    let now = state.clock.now_ms();
    match plan {
        LinkPlan::Gitlab { account, project } => {
            let url = format!("{}/api/webhooks/gitlab", state.git.public_url());
            let gitlab = super::gitlab_as(state, account).await?;
            let hook_id = gitlab.register_webhook(super::Repo { id: project.id, path: &project.path }, &url, &secret, branch).await.map_err(super::provider_error)?;
            let link = AppGitLinkRow {
                app: app.to_string(),
                provider: "gitlab".into(),
                project_id: Some(project.id),
                project_path: Some(project.path.clone()),
                account: Some(account),
                hook_id,
                webhook_secret_sha256: sha256_hex(secret.as_bytes()),
                webhook_secret_sealed: None,
                created_at: now,
            };
            if let Err(err) = state.store.insert_app_git_link(&link).await {
                if let Some(hook) = hook_id {
                    let _ = gitlab.remove_webhook(super::Repo { id: project.id, path: &project.path }, hook).await;
                }
                return Err(err.into());
            }
            tracing::info!(app, project = %project.path, "registered the GitLab push webhook");
            Ok(super::link_view(&link))
        }
        LinkPlan::Github { installation, project } => {
            // The App's one webhook covers the repository; this link's
            // secret digest is only there to keep the column unique.
            let link = AppGitLinkRow {
                app: app.to_string(),
                provider: "github".into(),
                project_id: Some(project.id),
                project_path: Some(project.path.clone()),
                account: Some(installation),
                hook_id: None,
                webhook_secret_sha256: sha256_hex(secret.as_bytes()),
                webhook_secret_sealed: None,
                created_at: now,
            };
            state.store.insert_app_git_link(&link).await?;
            tracing::info!(app, repository = %project.path, installation, "linked the app to its GitHub repository");
            Ok(super::link_view(&link))
        }
        LinkPlan::Gitea { account, project } => {
            // The hook's secret is kept sealed: Gitea signs each event
            // with it, and the signature is checked against it.
            let url = format!("{}/api/webhooks/gitea/{app}", state.git.public_url());
            let gitea = cloudweb_core::git::gitea::gitea_as(state, account).await?;
            let repo = super::Repo { id: project.id, path: &project.path };
            let hook_id = gitea.register_webhook(repo, &url, &secret, branch).await.map_err(super::provider_error)?;
            let link = AppGitLinkRow {
                app: app.to_string(),
                provider: "gitea".into(),
                project_id: Some(project.id),
                project_path: Some(project.path.clone()),
                account: Some(account),
                hook_id,
                webhook_secret_sha256: sha256_hex(secret.as_bytes()),
                webhook_secret_sealed: Some(state.sealer.seal(&super::webhook_context(app), secret.as_bytes())),
                created_at: now,
            };
            if let Err(err) = state.store.insert_app_git_link(&link).await {
                if let Some(hook) = hook_id {
                    let _ = gitea.remove_webhook(repo, hook).await;
                }
                return Err(err.into());
            }
            tracing::info!(app, repository = %project.path, "registered the Gitea push webhook");
            Ok(super::link_view(&link))
        }
        LinkPlan::Generic => {
            let link = AppGitLinkRow {
                app: app.to_string(),
                provider: "generic".into(),
                project_id: None,
                project_path: None,
                account: None,
                hook_id: None,
                webhook_secret_sha256: sha256_hex(secret.as_bytes()),
                webhook_secret_sealed: Some(state.sealer.seal(&super::webhook_context(app), secret.as_bytes())),
                created_at: now,
            };
            state.store.insert_app_git_link(&link).await?;
            let mut view = super::link_view(&link);
            view.webhook = Some(WebhookSetup {
                url: format!("{}/api/webhooks/generic/{app}", state.git.public_url()),
                // Shown this once; stored sealed.
                secret,
                signature_header: "X-Cloudweb-Signature".into(),
                timestamp_header: "X-Cloudweb-Timestamp".into(),
                signature: "sha256=<lowercase hex HMAC-SHA256 of \"<X-Cloudweb-Timestamp>.<raw body>\", keyed with the secret>, with X-Cloudweb-Timestamp: <unix seconds> (within 5 minutes); or GitHub's X-Hub-Signature-256 of the body alone".into(),
                body: "{\"ref\": \"refs/heads/<branch>\", \"after\": \"<full commit id>\"}".into(),
                delivery_header: "X-Cloudweb-Delivery".into(),
            });
            Ok(view)
        }
    }
}

/// Before an app is deleted: removes the webhook its provider holds for
/// it (a failure is logged; the hook then answers 401 from here on).
pub async fn app_removed(state: &AppState, app: &str) {
    let Ok(Some(link)) = state.store.app_git_link(app).await else {
        return;
    };
    let Some(hook) = link.hook_id else { return };
    let result = match super::linked::connect(state, &link).await {
        Ok(Some(linked)) => linked.provider.remove_webhook(linked.repo(), hook).await.map_err(super::provider_error),
        Ok(None) => Ok(()),
        Err(err) => Err(err),
    };
    match result {
        Ok(()) => tracing::info!(app, provider = %link.provider, "removed the webhook"),
        Err(err) => tracing::warn!(app, provider = %link.provider, error = %err, "could not remove the webhook"),
    }
}
