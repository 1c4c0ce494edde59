//! Gitea and Forgejo: the connection's settings (`/api/gitea/settings`),
//! the identities that logged in, the repository picker, the lookup app
//! creation makes, and each app's push webhook.
//!
//! `POST /api/webhooks/gitea/{app}` is the hook registered on an app's
//! repository when the app is made, with a secret of its own (sealed
//! here). An event is taken only with a valid signature: Gitea's
//! `X-Gitea-Signature` or Forgejo's `X-Forgejo-Signature` (hex
//! HMAC-SHA256 of the body, compared in constant time), or the
//! `X-Hub-Signature-256` both also send. A push from another repository
//! than the app's is refused with 403 and logged; a push to the app's
//! branch queues one deployment of its `after` commit; the same body
//! again (Gitea's redelivery resends it under a new delivery id, which is
//! not signed) deploys nothing more. A `pull_request` event goes to the
//! app's preview environments (`change_requests.rs`).

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::{Extension, Json};
use cloudweb_api_types::git::{GenericPushEvent, Project, ProjectList, WebhookAnswer, WebhookIgnored, WebhookQueued};
use cloudweb_api_types::gitea::{GiteaAccountList, GiteaSettingsInput, GiteaSettingsView};
use cloudweb_api_types::ErrorBody;
use serde::Deserialize;
use serde_json::Value;

use cloudweb_core::git::gitea as core_gitea;
use super::login::Host;
use super::provider::GitProvider;
use super::webhooks::{body_delivery, commit_id, deploy_once, header, ignored};
use crate::auth::Principal;
use crate::error::{body_bytes, parse_json, ApiError};
use crate::AppState;

#[utoipa::path(get, path = "/api/gitea/settings", operation_id = "gitea_settings_show", tag = "git",
    responses((status = 200, description = "The Gitea connection (never the client secret)", body = GiteaSettingsView), (status = 404, description = "Gitea is not configured", body = ErrorBody)))]
pub async fn get_settings(State(state): State<Arc<AppState>>) -> Result<Json<GiteaSettingsView>, ApiError> {
    let row = state.store.gitea_settings().await?.ok_or_else(core_gitea::not_configured)?;
    Ok(Json(core_gitea::view(&state, &row)))
}

#[utoipa::path(put, path = "/api/gitea/settings", operation_id = "gitea_settings_replace", tag = "git", request_body = GiteaSettingsInput,
    responses((status = 200, description = "Saved; the client secret is sealed", body = GiteaSettingsView), (status = 400, description = "Invalid settings", body = ErrorBody), (status = 413, description = "Body over 1 MiB", body = ErrorBody)))]
pub async fn put_settings(State(state): State<Arc<AppState>>, body: Result<Bytes, BytesRejection>) -> Result<Json<GiteaSettingsView>, ApiError> {
    let input: GiteaSettingsInput = parse_json(&body_bytes(body)?)?;
    let row = core_gitea::apply(&state, input).await?;
    Ok(Json(core_gitea::view(&state, &row)))
}

#[utoipa::path(get, path = "/api/gitea/accounts", operation_id = "gitea_accounts_list", tag = "git",
    responses((status = 200, description = "Gitea identities that logged in (never a token)", body = GiteaAccountList)))]
pub async fn accounts(State(state): State<Arc<AppState>>) -> Result<Json<GiteaAccountList>, ApiError> {
    Ok(Json(GiteaAccountList { accounts: core_gitea::accounts(&state).await? }))
}

/// Which Gitea identity acts for the caller: for a user, the identity
/// named (it must be linked to them), else their only one; for the admin
/// token, the one named, else the only one there is.
pub async fn account_for(state: &AppState, principal: &Principal, named: Option<i64>) -> Result<i64, ApiError> {
    let holders = state.store.gitea_token_holders().await?;
    let candidates: Vec<i64> = match principal.user() {
        Some(user) => {
            let mine = state.store.git_identities_of_user(Host::Gitea.key(), &user.id).await?;
            mine.iter().map(|i| i.provider_user_id).filter(|id| holders.contains(id)).collect()
        }
        None => holders,
    };
    if let Some(id) = named {
        return candidates.contains(&id).then_some(id).ok_or_else(|| match principal.user() {
            Some(_) => ApiError::Forbidden(format!("the Gitea account {id} is not linked to your user")),
            None => ApiError::NotFound(format!("no Gitea account {id}")),
        });
    }
    match candidates.as_slice() {
        [only] => Ok(*only),
        [] => Err(ApiError::NotFound("no Gitea identity to act with: log in with Gitea first (/api/auth/gitea/login)".into())),
        _ => Err(ApiError::BadRequest("several Gitea identities could act: name one with account (gitea_account when creating an app)".into())),
    }
}

#[derive(Deserialize)]
pub struct RepositoriesQuery {
    account: Option<i64>,
    search: Option<String>,
}

#[utoipa::path(get, path = "/api/gitea/repositories", operation_id = "gitea_repositories_list", tag = "git",
    params(("search" = Option<String>, Query, description = "Part of owner/name"), ("account" = Option<i64>, Query, description = "Gitea user id acting; by default the caller's own linked identity")),
    responses(
        (status = 200, description = "The repositories the identity reaches (at most 100); `path` is owner/name", body = ProjectList),
        (status = 400, description = "Several identities: name one", body = ErrorBody),
        (status = 403, description = "The named identity is not linked to the caller, or its token can no longer be refreshed", body = ErrorBody),
        (status = 404, description = "No Gitea identity, or Gitea is not configured", body = ErrorBody),
        (status = 502, description = "Gitea failed", body = ErrorBody),
    ))]
pub async fn repositories(State(state): State<Arc<AppState>>, Extension(principal): Extension<Principal>, Query(query): Query<RepositoriesQuery>) -> Result<Json<ProjectList>, ApiError> {
    if let Some(search) = &query.search {
        cloudweb_protocol::validate::bounded_text("search", search, 100)?;
    }
    let projects = list_repositories(&state, &principal, query.account, query.search.as_deref()).await?;
    let projects = projects.into_iter().map(|p| Project { id: p.id, path: p.path, clone_url: p.clone_url, default_branch: p.default_branch, web_url: p.web_url }).collect();
    Ok(Json(ProjectList { projects }))
}

/// The repositories `principal` reaches through its Gitea identity: what
/// `GET /api/gitea/repositories` answers and the dashboard's form offers.
pub async fn list_repositories(state: &AppState, principal: &Principal, account: Option<i64>, search: Option<&str>) -> Result<Vec<super::Project>, ApiError> {
    let account = account_for(state, principal, account).await?;
    let gitea = core_gitea::gitea_as(state, account).await?;
    gitea.projects(search).await.map_err(super::provider_error)
}

/// Looks up the repository an app is created from, as the acting identity sees it.
pub async fn resolve_repository(state: &AppState, principal: &Principal, full_name: &str, account: Option<i64>) -> Result<(i64, super::Project), ApiError> {
    cloudweb_protocol::validate::bounded_text("gitea_repository", full_name, 201)?;
    super::gitea_api::repo_path(full_name).map_err(|e| ApiError::BadRequest(e.to_string()))?;
    let account = account_for(state, principal, account).await?;
    let gitea = core_gitea::gitea_as(state, account).await?;
    let project = gitea.project(full_name).await.map_err(super::provider_error)?;
    Ok((account, project))
}

/// The signature of a Gitea or Forgejo event, as `sha256=<hex>`.
fn signature(headers: &HeaderMap) -> Option<String> {
    header(headers, "x-gitea-signature")
        .or_else(|| header(headers, "x-forgejo-signature"))
        .map(|hex| format!("sha256={hex}"))
        .or_else(|| header(headers, "x-hub-signature-256").map(str::to_string))
}

#[utoipa::path(post, path = "/api/webhooks/gitea/{app}", operation_id = "webhooks_gitea", tag = "git", security(()),
    params(
        ("app" = String, Path, description = "The app's name"),
        ("X-Gitea-Signature" = Option<String>, Header, description = "Hex HMAC-SHA256 of the raw body, keyed with the app's hook secret (or X-Forgejo-Signature, or X-Hub-Signature-256 as sha256=<hex>)"),
        ("X-Gitea-Event" = Option<String>, Header, description = "push (others are acknowledged and ignored); or X-Forgejo-Event"),
    ),
    request_body(content = GenericPushEvent, description = "Gitea's push event (ref, after, repository.id; other fields are ignored)"),
    responses(
        (status = 200, description = "Ignored (not a push, tag push, other branch, branch deleted, redelivery)", body = WebhookIgnored),
        (status = 202, description = "One deployment of `after` queued", body = WebhookQueued),
        (status = 400, description = "Malformed event", body = ErrorBody),
        (status = 401, description = "Missing or wrong signature, or no such app", body = ErrorBody),
        (status = 403, description = "The event is for another repository than the app's", body = ErrorBody),
        (status = 413, description = "Body over 1 MiB", body = ErrorBody),
    ))]
pub async fn webhook(State(state): State<Arc<AppState>>, Path(app_name): Path<String>, headers: HeaderMap, body: Result<Bytes, BytesRejection>) -> Result<(StatusCode, Json<WebhookAnswer>), ApiError> {
    let received = std::time::Instant::now();
    let body = body_bytes(body)?;
    // An unknown app and a wrong signature answer the same.
    let refused = || ApiError::Unauthorized("invalid signature".into());
    let link = state.store.app_git_link(&app_name).await?.filter(|l| l.provider == "gitea");
    let Some((link, sealed)) = link.and_then(|l| l.webhook_secret_sealed.clone().map(|s| (l, s))) else {
        return Err(refused());
    };
    let secret = state.sealer.open(&super::webhook_context(&app_name), &sealed).map_err(|e| ApiError::Internal(format!("webhook secret of {app_name}: {e}")))?;
    let Some(signature) = signature(&headers) else {
        tracing::warn!(app = %app_name, "refused a Gitea webhook without a signature");
        return Err(ApiError::Unauthorized("missing X-Gitea-Signature".into()));
    };
    if !super::webhooks::signature_valid(&secret, &body, &signature) {
        tracing::warn!(app = %app_name, "refused a Gitea webhook with an invalid signature");
        return Err(refused());
    }
    let event = header(&headers, "x-gitea-event").or_else(|| header(&headers, "x-forgejo-event")).unwrap_or_default();
    if !matches!(event, "push" | "pull_request") {
        return Ok(ignored("not a push event"));
    }
    let payload: Value = parse_json(&body)?;
    let repository = payload.get("repository").ok_or_else(|| ApiError::BadRequest("the event has no repository".into()))?;
    let repo_id = repository.get("id").and_then(Value::as_i64).ok_or_else(|| ApiError::BadRequest("the event has no repository.id".into()))?;
    if Some(repo_id) != link.project_id {
        let full_name = repository.get("full_name").and_then(Value::as_str).unwrap_or("?");
        tracing::warn!(app = %app_name, repository = %full_name, repository_id = repo_id, "refused a Gitea push for another repository than the app's");
        return Err(ApiError::Forbidden(format!("the app {app_name} does not deploy the Gitea repository {full_name}")));
    }
    if event == "pull_request" {
        // Gitea's pull request event has GitHub's shape.
        let Some(request) = super::change_requests::from_pull_request(&payload)? else {
            return Ok(ignored("a pull request change with no new code"));
        };
        return super::change_requests::dispatch(&state, std::slice::from_ref(&link), &request, &body_delivery(&body)).await;
    }
    let reference = payload.get("ref").and_then(Value::as_str).unwrap_or_default();
    if reference.starts_with("refs/tags/") {
        return Ok(ignored("tag push"));
    }
    let app = state.store.app(&app_name).await?.ok_or_else(|| ApiError::NotFound(format!("no app {app_name:?}")))?;
    if reference != format!("refs/heads/{}", app.branch) {
        return Ok(ignored("push to another branch"));
    }
    let after = payload.get("after").and_then(Value::as_str).unwrap_or_default();
    if !after.is_empty() && after.bytes().all(|b| b == b'0') {
        return Ok(ignored("branch deleted"));
    }
    if !commit_id(after) {
        return Err(ApiError::BadRequest("after is not a full commit id".into()));
    }
    deploy_once(&state, &app.name, &body_delivery(&body), after, received).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gitea_and_forgejo_signatures_read_alike() {
        let mut headers = HeaderMap::new();
        assert_eq!(signature(&headers), None);
        headers.insert("x-hub-signature-256", "sha256=bb".parse().unwrap());
        assert_eq!(signature(&headers).as_deref(), Some("sha256=bb"));
        headers.insert("x-forgejo-signature", "cc".parse().unwrap());
        assert_eq!(signature(&headers).as_deref(), Some("sha256=cc"));
        headers.insert("x-gitea-signature", "aa".parse().unwrap());
        assert_eq!(signature(&headers).as_deref(), Some("sha256=aa"));
    }
}
