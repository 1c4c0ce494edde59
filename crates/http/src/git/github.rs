//! GitHub as a GitHub App: its settings (`/api/github/settings`), where it
//! is installed and which repositories it reaches (`/api/github/...`), the
//! lookup app creation makes, and the App's webhook.
//!
//! `POST /api/webhooks/github` is the one webhook URL of the App (GitHub
//! calls it for every repository the App is installed on). An event is
//! taken only with a valid `X-Hub-Signature-256` (HMAC-SHA256 of the body
//! with the App's webhook secret, compared in constant time) and an
//! `X-GitHub-Delivery` id. A push for a repository no app deploys, or from
//! another installation than the one an app was made through, is refused
//! with 403 and logged. A push to an app's branch queues one deployment of
//! its `after` commit per app; the same delivery id, or the same signed
//! body under another id (a replay), deploys nothing more. A
//! `pull_request` event goes to the apps' preview environments
//! (`change_requests.rs`). An
//! `installation` or `installation_repositories` event drops the token
//! cached for that installation.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::Json;
use cloudweb_api_types::git::{GenericPushEvent, WebhookAnswer, WebhookIgnored, WebhookQueued};
use cloudweb_api_types::github::{GithubSettingsInput, GithubSettingsView, Installation, InstallationList, Repository, RepositoryList};
use cloudweb_api_types::ErrorBody;
use serde::Deserialize;
use serde_json::Value;

use cloudweb_core::git::github as core_github;
use super::provider::GitProvider;
use super::webhooks::{body_delivery, commit_id, deploy_once, header, ignored};
use crate::error::{body_bytes, parse_json, ApiError};
use crate::store::GithubSettingsRow;
use crate::AppState;

/// The most repositories listed at once.
const MAX_REPOSITORIES: usize = 100;

fn settings_view(state: &AppState, row: &GithubSettingsRow) -> GithubSettingsView {
    GithubSettingsView {
        api_url: row.api_url.clone(),
        app_id: row.app_id,
        private_key_set: true,
        webhook_secret_set: true,
        webhook_url: format!("{}/api/webhooks/github", state.git.public_url()),
    }
}

#[utoipa::path(get, path = "/api/github/settings", operation_id = "github_settings_show", tag = "git",
    responses((status = 200, description = "The GitHub App (never its key or secret)", body = GithubSettingsView), (status = 404, description = "GitHub is not configured", body = ErrorBody)))]
pub async fn get_settings(State(state): State<Arc<AppState>>) -> Result<Json<GithubSettingsView>, ApiError> {
    let row = state.store.github_settings().await?.ok_or_else(|| ApiError::NotFound("GitHub is not configured".into()))?;
    Ok(Json(settings_view(&state, &row)))
}

#[utoipa::path(put, path = "/api/github/settings", operation_id = "github_settings_replace", tag = "git", request_body = GithubSettingsInput,
    responses((status = 200, description = "Saved; the key and the secret are sealed", body = GithubSettingsView), (status = 400, description = "Invalid settings (a key that is not an RSA key, say)", body = ErrorBody), (status = 413, description = "Body over 1 MiB", body = ErrorBody)))]
pub async fn put_settings(State(state): State<Arc<AppState>>, body: Result<Bytes, BytesRejection>) -> Result<Json<GithubSettingsView>, ApiError> {
    let input: GithubSettingsInput = parse_json(&body_bytes(body)?)?;
    let row = core_github::apply_settings(&state, input).await?;
    Ok(Json(settings_view(&state, &row)))
}

#[utoipa::path(get, path = "/api/github/installations", operation_id = "github_installations_list", tag = "git",
    responses((status = 200, description = "Where the App is installed", body = InstallationList), (status = 404, description = "GitHub is not configured", body = ErrorBody), (status = 502, description = "GitHub failed", body = ErrorBody)))]
pub async fn installations(State(state): State<Arc<AppState>>) -> Result<Json<InstallationList>, ApiError> {
    let app = core_github::app(&state).await?;
    let list = app.installations().await.map_err(super::provider_error)?;
    Ok(Json(InstallationList { installations: list.into_iter().map(|i| Installation { id: i.id, account: i.account }).collect() }))
}

#[derive(Deserialize)]
pub struct RepositoriesQuery {
    search: Option<String>,
}

#[utoipa::path(get, path = "/api/github/repositories", operation_id = "github_repositories_list", tag = "git",
    params(("search" = Option<String>, Query, description = "Part of owner/name")),
    responses((status = 200, description = "The repositories the App's installations reach (at most 100)", body = RepositoryList), (status = 404, description = "GitHub is not configured", body = ErrorBody), (status = 502, description = "GitHub failed", body = ErrorBody)))]
pub async fn repositories(State(state): State<Arc<AppState>>, Query(query): Query<RepositoriesQuery>) -> Result<Json<RepositoryList>, ApiError> {
    if let Some(search) = &query.search {
        cloudweb_protocol::validate::bounded_text("search", search, 100)?;
    }
    Ok(Json(RepositoryList { repositories: list_repositories(&state, query.search.as_deref()).await? }))
}

/// The repositories the App's installations reach (at most 100), matching
/// `search` when given: what `GET /api/github/repositories` answers and the
/// dashboard's new-app form offers.
pub async fn list_repositories(state: &AppState, search: Option<&str>) -> Result<Vec<Repository>, ApiError> {
    let app = core_github::app(state).await?;
    let mut repositories = Vec::new();
    for installation in app.installations().await.map_err(super::provider_error)? {
        let github = core_github::installation(state, installation.id).await?;
        for p in github.projects(search).await.map_err(super::provider_error)? {
            repositories.push(Repository { id: p.id, full_name: p.path, clone_url: p.clone_url, default_branch: p.default_branch, html_url: p.web_url, installation: installation.id });
        }
        if repositories.len() >= MAX_REPOSITORIES {
            repositories.truncate(MAX_REPOSITORIES);
            break;
        }
    }
    Ok(repositories)
}

/// Looks up the GitHub repository an app is created from: the App's
/// installation on it (its id), and the repository as that installation
/// sees it.
pub async fn resolve_repository(state: &AppState, full_name: &str) -> Result<(i64, super::Project), ApiError> {
    cloudweb_protocol::validate::bounded_text("github_repository", full_name, 201)?;
    super::github_api::repo_path(full_name).map_err(|e| ApiError::BadRequest(e.to_string()))?;
    let app = core_github::app(state).await?;
    let installation = match app.repository_installation(full_name).await {
        Ok(installation) => installation,
        Err(super::ProviderError::Status { status: 404, .. }) => {
            return Err(ApiError::NotFound(format!("the GitHub App is not installed on {full_name} (install it on the repository first)")));
        }
        Err(err) => return Err(super::provider_error(err)),
    };
    let github = core_github::installation(state, installation.id).await?;
    let project = github.project(full_name).await.map_err(super::provider_error)?;
    Ok((installation.id, project))
}

/// A delivery id as GitHub makes them (a GUID).
fn delivery_id(text: &str) -> bool {
    !text.is_empty() && text.len() <= 64 && text.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-')
}

#[utoipa::path(post, path = "/api/webhooks/github", operation_id = "webhooks_github", tag = "git", security(()),
    params(
        ("X-Hub-Signature-256" = String, Header, description = "sha256=<hex HMAC-SHA256 of the raw body>, keyed with the App's webhook secret"),
        ("X-GitHub-Delivery" = String, Header, description = "The delivery's id; a redelivery deploys nothing more"),
        ("X-GitHub-Event" = String, Header, description = "push (others are acknowledged and ignored)"),
    ),
    request_body(content = GenericPushEvent, description = "GitHub's push event (ref, after, repository.id, installation.id; other fields are ignored)"),
    responses(
        (status = 200, description = "Ignored (not a push, tag push, other branch, redelivery)", body = WebhookIgnored),
        (status = 202, description = "One deployment of `after` queued", body = WebhookQueued),
        (status = 400, description = "Malformed event or delivery id", body = ErrorBody),
        (status = 401, description = "Missing or wrong signature", body = ErrorBody),
        (status = 403, description = "No app deploys the repository, or the event is from another installation", body = ErrorBody),
        (status = 404, description = "GitHub is not configured", body = ErrorBody),
        (status = 413, description = "Body over 1 MiB", body = ErrorBody),
    ))]
pub async fn webhook(State(state): State<Arc<AppState>>, headers: HeaderMap, body: Result<Bytes, BytesRejection>) -> Result<(StatusCode, Json<WebhookAnswer>), ApiError> {
    let received = std::time::Instant::now();
    let body = body_bytes(body)?;
    let Some(settings) = core_github::settings(&state).await? else {
        return Err(ApiError::NotFound("GitHub is not configured".into()));
    };
    let Some(signature) = header(&headers, "x-hub-signature-256") else {
        tracing::warn!("refused a GitHub webhook without X-Hub-Signature-256");
        return Err(ApiError::Unauthorized("missing X-Hub-Signature-256".into()));
    };
    if !super::webhooks::signature_valid(&settings.webhook_secret, &body, signature) {
        tracing::warn!("refused a GitHub webhook with an invalid signature");
        return Err(ApiError::Unauthorized("invalid signature".into()));
    }
    let delivery = header(&headers, "x-github-delivery").filter(|d| delivery_id(d)).ok_or_else(|| ApiError::BadRequest("missing or malformed X-GitHub-Delivery".into()))?;
    let event = header(&headers, "x-github-event").unwrap_or_default();
    if !matches!(event, "push" | "pull_request" | "ping" | "installation" | "installation_repositories") {
        return Ok(ignored("not a push event"));
    }
    if event == "ping" {
        return Ok(ignored("ping"));
    }
    let payload: Value = parse_json(&body)?;
    if !matches!(event, "push" | "pull_request") {
        // The App was removed, suspended or given other repositories: the
        // token cached for that installation may no longer be good.
        let installation = payload.get("installation").and_then(|i| i.get("id")).and_then(Value::as_i64);
        let action = payload.get("action").and_then(Value::as_str).unwrap_or("?");
        if let Some(id) = installation {
            let forgot = state.git.github_tokens.forget(id).await;
            tracing::info!(installation = id, event, action, forgot_token = forgot, "the GitHub App's installation changed");
        }
        return Ok(ignored(&format!("{event} {action}")));
    }
    let repository = payload.get("repository").ok_or_else(|| ApiError::BadRequest("the event has no repository".into()))?;
    let repo_id = repository.get("id").and_then(Value::as_i64).ok_or_else(|| ApiError::BadRequest("the event has no repository.id".into()))?;
    let full_name = repository.get("full_name").and_then(Value::as_str).unwrap_or("?");
    let installation = payload.get("installation").and_then(|i| i.get("id")).and_then(Value::as_i64);
    let links = state.store.app_git_links_of_project("github", repo_id).await?;
    if links.is_empty() {
        tracing::warn!(repository = %full_name, repository_id = repo_id, delivery, "refused a GitHub push for a repository no app deploys");
        return Err(ApiError::Forbidden(format!("no app deploys the GitHub repository {full_name}")));
    }
    let links: Vec<_> = links.into_iter().filter(|l| installation.is_some() && l.account == installation).collect();
    if links.is_empty() {
        tracing::warn!(repository = %full_name, installation, delivery, "refused a GitHub push from another installation");
        return Err(ApiError::Forbidden(format!("the event for {full_name} comes from another installation of the App than its apps were made through")));
    }
    if event == "pull_request" {
        let Some(request) = super::change_requests::from_pull_request(&payload)? else {
            return Ok(ignored("a pull request change with no new code"));
        };
        return super::change_requests::dispatch(&state, &links, &request, &body_delivery(&body)).await;
    }
    let reference = payload.get("ref").and_then(Value::as_str).unwrap_or_default();
    if reference.starts_with("refs/tags/") {
        return Ok(ignored("tag push"));
    }
    let after = payload.get("after").and_then(Value::as_str).unwrap_or_default();
    if payload.get("deleted").and_then(Value::as_bool) == Some(true) || (!after.is_empty() && after.bytes().all(|b| b == b'0')) {
        return Ok(ignored("branch deleted"));
    }
    if !commit_id(after) {
        return Err(ApiError::BadRequest("after is not a full commit id".into()));
    }
    let body_key = body_delivery(&body);
    let mut answer = None;
    for link in links {
        let Some(app) = state.store.app(&link.app).await? else { continue };
        if reference != format!("refs/heads/{}", app.branch) {
            continue;
        }
        let this = push_once(&state, &app.name, delivery, &body_key, after, received).await?;
        // Several apps from one branch: each deploys; the answer names the first.
        answer = answer.or(Some(this));
    }
    Ok(answer.unwrap_or_else(|| ignored("push to another branch")))
}

/// One app's deployment of a push, once per delivery id and once per
/// signed body.
async fn push_once(state: &AppState, app: &str, delivery: &str, body_key: &str, commit: &str, received: std::time::Instant) -> Result<(StatusCode, Json<WebhookAnswer>), ApiError> {
    let now = state.clock.now_ms();
    if !state.store.claim_webhook_delivery(app, body_key, now).await? {
        let deployment = state.store.webhook_delivery_deployment(app, body_key).await?;
        tracing::info!(app, delivery, "ignored a GitHub event whose body was delivered before");
        return Ok((StatusCode::OK, Json(WebhookAnswer::Ignored(WebhookIgnored { ignored: "redelivery".to_string(), deployment: Some(deployment) }))));
    }
    let result = deploy_once(state, app, &format!("github:{delivery}"), commit, received).await;
    match &result {
        Ok((_, Json(WebhookAnswer::Queued(queued)))) => state.store.set_webhook_delivery_deployment(app, body_key, &queued.deployment).await?,
        Ok(_) => {}
        Err(_) => state.store.release_webhook_delivery(app, body_key).await?,
    }
    result
}

#[cfg(test)]
mod tests {
    #[test]
    fn delivery_ids_are_guids() {
        assert!(super::delivery_id("72d3162e-cc78-11e3-81ab-4c9367dc0958"));
        for bad in ["", "x y", "../../etc", &"a".repeat(65)] {
            assert!(!super::delivery_id(bad), "{bad}");
        }
    }
}
