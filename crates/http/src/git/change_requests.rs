//! Pull and merge request events, read into a
//! [`cloudweb_core::previews::ChangeRequest`], and handed to the preview
//! environments of every app of the repository. GitHub's `pull_request`
//! event and Gitea's (the same shape) are read here.

use axum::http::StatusCode;
use axum::Json;
use cloudweb_api_types::git::{WebhookAnswer, WebhookQueued};
use cloudweb_core::previews::{self, Action, ChangeRequest, Outcome};
use serde_json::Value;

use super::events::{commit_id, ignored};
use crate::error::ApiError;
use crate::store::AppGitLinkRow;
use crate::AppState;

/// A `pull_request` event as GitHub (and Gitea) send it; `None` for an
/// action that changes no code (`edited`, `labeled`, …).
pub fn from_pull_request(payload: &Value) -> Result<Option<ChangeRequest>, ApiError> {
    let bad = |what: &str| ApiError::BadRequest(format!("the pull request event has no {what}"));
    let action = match payload.get("action").and_then(Value::as_str).unwrap_or_default() {
        "opened" | "reopened" | "synchronize" | "synchronized" => Action::Updated,
        "closed" => Action::Closed,
        _ => return Ok(None),
    };
    let pull = payload.get("pull_request").ok_or_else(|| bad("pull_request"))?;
    let number = payload.get("number").or_else(|| pull.get("number")).and_then(Value::as_i64).filter(|n| *n > 0).ok_or_else(|| bad("number"))?;
    let text = |v: Option<&Value>, what: &str| v.and_then(Value::as_str).map(str::to_string).ok_or_else(|| bad(what));
    let head = pull.get("head").ok_or_else(|| bad("head"))?;
    let base = pull.get("base").ok_or_else(|| bad("base"))?;
    let head_sha = text(head.get("sha"), "head.sha")?;
    if !commit_id(&head_sha) {
        return Err(ApiError::BadRequest("head.sha is not a full commit id".into()));
    }
    let base_repo = base.get("repo").and_then(|r| r.get("id")).and_then(Value::as_i64);
    // A fork's repository, or none when the fork was deleted.
    let head_repo = head.get("repo").filter(|r| !r.is_null());
    let from_fork = head_repo.and_then(|r| r.get("id")).and_then(Value::as_i64) != base_repo;
    let head_clone_url = match head_repo {
        Some(repo) => text(repo.get("clone_url"), "head.repo.clone_url")?,
        None => text(base.get("repo").and_then(|r| r.get("clone_url")), "base.repo.clone_url")?,
    };
    Ok(Some(ChangeRequest {
        number,
        action,
        base_ref: text(base.get("ref"), "base.ref")?,
        head_ref: text(head.get("ref"), "head.ref")?,
        head_sha,
        head_clone_url,
        from_fork,
    }))
}

/// A GitLab merge request event (`object_kind: merge_request`); `None`
/// for an action that brings no new code (an `update` with no `oldrev`
/// changed the title or labels, not the commits).
pub fn from_merge_request(payload: &Value) -> Result<Option<ChangeRequest>, ApiError> {
    let bad = |what: &str| ApiError::BadRequest(format!("the merge request event has no {what}"));
    let attributes = payload.get("object_attributes").ok_or_else(|| bad("object_attributes"))?;
    let action = match attributes.get("action").and_then(Value::as_str).unwrap_or_default() {
        "open" | "reopen" => Action::Updated,
        "update" if attributes.get("oldrev").is_some_and(|v| !v.is_null()) => Action::Updated,
        "close" | "merge" => Action::Closed,
        _ => return Ok(None),
    };
    let text = |v: Option<&Value>, what: &str| v.and_then(Value::as_str).map(str::to_string).ok_or_else(|| bad(what));
    let head_sha = text(attributes.get("last_commit").and_then(|c| c.get("id")), "object_attributes.last_commit.id")?;
    if !commit_id(&head_sha) {
        return Err(ApiError::BadRequest("last_commit.id is not a full commit id".into()));
    }
    let source = attributes.get("source_project_id").and_then(Value::as_i64);
    let target = attributes.get("target_project_id").and_then(Value::as_i64);
    Ok(Some(ChangeRequest {
        number: attributes.get("iid").and_then(Value::as_i64).filter(|n| *n > 0).ok_or_else(|| bad("object_attributes.iid"))?,
        action,
        base_ref: text(attributes.get("target_branch"), "object_attributes.target_branch")?,
        head_ref: text(attributes.get("source_branch"), "object_attributes.source_branch")?,
        head_sha,
        head_clone_url: text(attributes.get("source").and_then(|s| s.get("git_http_url")), "object_attributes.source.git_http_url")?,
        from_fork: source.is_none() || source != target,
    }))
}

/// Hands the request to each app's previews (once per signed body);
/// the answer names the first deployment made, else what happened.
pub async fn dispatch(state: &std::sync::Arc<AppState>, links: &[AppGitLinkRow], request: &ChangeRequest, body_key: &str) -> Result<(StatusCode, Json<WebhookAnswer>), ApiError> {
    let mut answer = None;
    let mut why = String::from("no app of the repository has previews");
    for link in links {
        let Some(app) = state.store.app(&link.app).await? else { continue };
        // A preview app shares its app's repository; its own requests are its app's.
        if state.store.preview_by_app(&app.name).await?.is_some() {
            continue;
        }
        if !state.store.claim_webhook_delivery(&app.name, body_key, state.clock.now_ms()).await? {
            why = "redelivery".into();
            continue;
        }
        let outcome = previews::on_change_request(state, &app, link, request).await;
        let outcome = match outcome {
            Ok(outcome) => outcome,
            Err(err) => {
                // Not handled: the sender's retry must not count as a redelivery.
                let _ = state.store.release_webhook_delivery(&app.name, body_key).await;
                return Err(err);
            }
        };
        match outcome {
            Outcome::Deployed(deployment) => {
                state.store.set_webhook_delivery_deployment(&app.name, body_key, &deployment.id).await?;
                let queued = WebhookAnswer::Queued(WebhookQueued { deployment: deployment.id, commit: request.head_sha.clone(), state: deployment.state });
                answer = answer.or(Some((StatusCode::ACCEPTED, Json(queued))));
            }
            Outcome::Already(deployment) => {
                let _ = state.store.set_webhook_delivery_deployment(&app.name, body_key, &deployment).await;
                why = "already deploying this commit".into();
            }
            Outcome::AwaitingApproval => why = "from a fork: waiting for approval".into(),
            Outcome::Starting => why = "deploying once the preview's databases answer".into(),
            Outcome::Removed => why = "preview removed".into(),
            Outcome::Ignored(reason) => {
                let _ = state.store.release_webhook_delivery(&app.name, body_key).await;
                why = reason;
            }
        }
    }
    Ok(answer.unwrap_or_else(|| ignored(&why)))
}
