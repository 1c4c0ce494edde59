//! Push-to-deploy webhooks.
//!
//! `POST /api/webhooks/gitlab`: GitLab's push hook. The `X-Gitlab-Token`
//! names the app (each app's hook has its own random secret, kept as a
//! SHA-256 digest and compared in constant time); tag pushes, other
//! events and pushes to other branches are acknowledged and ignored (a
//! merge request event goes to the app's preview environments); a
//! redelivery (the same body: GitLab's event UUID is not signed, so a
//! replay could carry any) deploys nothing more; a push queues exactly one
//! deployment of its `checkout_sha` (the last commit of the push).
//!
//! `POST /api/webhooks/generic/{app}`: any git host. The body is signed
//! with the app's secret, one of two ways:
//!
//! - `X-Cloudweb-Timestamp: <unix seconds>` and `X-Cloudweb-Signature:
//!   sha256=<hex HMAC-SHA256 of "<timestamp>.<body>">`: refused when the
//!   timestamp is more than 5 minutes from the server's clock, so a
//!   captured request is good for 5 minutes, and within them once (the
//!   signed timestamp and body are its delivery id);
//! - GitHub's and Gitea's `X-Hub-Signature-256: sha256=<hex HMAC-SHA256 of
//!   the body>` (or Gitea's `X-Gitea-Signature` and Forgejo's
//!   `X-Forgejo-Signature`, the same HMAC as bare hex), which signs no
//!   time: the body is its delivery id, so a captured one deploys once
//!   (kept 7 days).
//!
//! The body is JSON with `ref` (`refs/heads/<branch>`) and the commit in
//! `after` (GitHub, Gitea, Forgejo, Gogs) or `commit`. Delivery id headers
//! (`X-Cloudweb-Delivery`, `X-GitHub-Delivery`, `X-Gitea-Delivery`) are
//! not signed and so decide nothing.
//!
//! For either provider, a push of the commit that the app's newest
//! deployment already runs or is bringing up starts no other one.
//!
//! Bodies over 1 MiB are refused with 413 by the API's body limit.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::Json;
use cloudweb_api_types::git::{GenericPushEvent, GitlabPushEvent, WebhookAnswer, WebhookIgnored, WebhookQueued};
use cloudweb_api_types::ErrorBody;
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::ca::sha256_hex;
use crate::deploy::Origin;
use crate::error::{body_bytes, ApiError};
use crate::AppState;

pub(super) use super::events::{body_delivery, commit_id, header, ignored};

/// How far a signed `X-Cloudweb-Timestamp` may be from the server's clock.
pub const TIMESTAMP_TOLERANCE_S: i64 = 300;

/// Checks the generic webhook's signature (see the module docs); the
/// delivery id it stands for, or why it is refused.
fn check_generic_signature(secret: &[u8], headers: &HeaderMap, body: &[u8], now_ms: i64) -> Result<String, ApiError> {
    if let Some(signature) = header(headers, "x-cloudweb-signature") {
        let Some(stamp) = header(headers, "x-cloudweb-timestamp") else {
            return Err(ApiError::Unauthorized(
                "X-Cloudweb-Signature needs X-Cloudweb-Timestamp (unix seconds), signed as \"<timestamp>.<body>\"".into(),
            ));
        };
        let Some(seconds) = stamp.parse::<i64>().ok().filter(|_| stamp.len() <= 12) else {
            return Err(ApiError::Unauthorized("X-Cloudweb-Timestamp must be unix seconds".into()));
        };
        let signed = [stamp.as_bytes(), b".", body].concat();
        if !signature_valid(secret, &signed, signature) {
            return Err(ApiError::Unauthorized("invalid signature".into()));
        }
        let skew = (now_ms / 1000 - seconds).abs();
        if skew > TIMESTAMP_TOLERANCE_S {
            return Err(ApiError::Unauthorized(format!(
                "the signed timestamp is {skew} s from the server's clock (more than {TIMESTAMP_TOLERANCE_S} s): a replay, or a clock to set right"
            )));
        }
        return Ok(format!("signed-sha256:{}", hex::encode(Sha256::digest(&signed))));
    }
    // Gitea's and Forgejo's own headers carry the same HMAC as bare hex.
    let bare = header(headers, "x-gitea-signature").or_else(|| header(headers, "x-forgejo-signature")).map(|hex| format!("sha256={hex}"));
    let Some(signature) = header(headers, "x-hub-signature-256").map(str::to_string).or(bare) else {
        return Err(ApiError::Unauthorized(
            "missing X-Cloudweb-Signature (sha256=<hex HMAC-SHA256 of \"<timestamp>.<body>\">, with X-Cloudweb-Timestamp)".into(),
        ));
    };
    if !signature_valid(secret, body, &signature) {
        return Err(ApiError::Unauthorized("invalid signature".into()));
    }
    Ok(body_delivery(body))
}

/// Queues the deployment of `commit` once per delivery.
pub(super) async fn deploy_once(state: &AppState, app_name: &str, delivery: &str, commit: &str, received: std::time::Instant) -> Result<(StatusCode, Json<WebhookAnswer>), ApiError> {
    let now = state.clock.now_ms();
    if !state.store.claim_webhook_delivery(app_name, delivery, now).await? {
        let deployment = state.store.webhook_delivery_deployment(app_name, delivery).await?;
        tracing::info!(app = %app_name, delivery, "ignored a redelivered webhook");
        return Ok((StatusCode::OK, Json(WebhookAnswer::Ignored(WebhookIgnored { ignored: "redelivery".to_string(), deployment: Some(deployment) }))));
    }
    let app = match state.store.app(app_name).await? {
        Some(app) => app,
        None => return Err(ApiError::NotFound(format!("no app {app_name:?}"))),
    };
    // The newest deployment already is this commit, running or on its
    // way: another would only replace it with itself.
    if let Some(newest) = state.store.app_deployments(app_name).await?.into_iter().next() {
        let live = crate::deployment_state::DeploymentState::parse(&newest.state).is_some_and(|s| !s.is_terminal());
        if live && newest.commit_sha.as_deref() == Some(commit) {
            let _ = state.store.set_webhook_delivery_deployment(app_name, delivery, &newest.id).await;
            tracing::info!(app = %app_name, deployment = %newest.id, commit, "ignored a push of the commit the newest deployment already is");
            let reason = if newest.state == "running" { "already running this commit" } else { "already deploying this commit" };
            return Ok((StatusCode::OK, Json(WebhookAnswer::Ignored(WebhookIgnored { ignored: reason.to_string(), deployment: Some(Some(newest.id)) }))));
        }
    }
    let deployment = match crate::deploy::create(state, &app, Origin::Source { commit: Some(commit.to_string()) }).await {
        Ok(deployment) => deployment,
        Err(err) => {
            // Not handled: the sender's retry must not count as a redelivery.
            let _ = state.store.release_webhook_delivery(app_name, delivery).await;
            return Err(err);
        }
    };
    state.store.set_webhook_delivery_deployment(app_name, delivery, &deployment.id).await?;
    tracing::info!(app = %app_name, deployment = %deployment.id, commit, delivery, queued_after_ms = received.elapsed().as_millis() as u64, "webhook push queued a deployment");
    Ok((StatusCode::ACCEPTED, Json(WebhookAnswer::Queued(WebhookQueued { deployment: deployment.id, commit: commit.to_string(), state: deployment.state }))))
}

#[utoipa::path(post, path = "/api/webhooks/gitlab", operation_id = "webhooks_gitlab", tag = "git", security(()),
    params(("X-Gitlab-Token" = String, Header, description = "The secret the webhook was registered with")),
    request_body(content = GitlabPushEvent, description = "GitLab's push event (other fields are ignored)"),
    responses(
        (status = 200, description = "Ignored (tag push, other branch, redelivery, not a push)", body = WebhookIgnored),
        (status = 202, description = "One deployment of checkout_sha queued", body = WebhookQueued),
        (status = 400, description = "Malformed event", body = ErrorBody),
        (status = 401, description = "Missing, empty or wrong X-Gitlab-Token", body = ErrorBody),
        (status = 403, description = "The token belongs to another project", body = ErrorBody),
        (status = 404, description = "The app is gone", body = ErrorBody),
        (status = 413, description = "Body over 1 MiB", body = ErrorBody),
    ))]
pub async fn gitlab(State(state): State<Arc<AppState>>, headers: HeaderMap, body: Result<Bytes, BytesRejection>) -> Result<(StatusCode, Json<WebhookAnswer>), ApiError> {
    let received = std::time::Instant::now();
    let body = body_bytes(body)?;
    let Some(token) = header(&headers, "x-gitlab-token") else {
        return Err(ApiError::Unauthorized("missing X-Gitlab-Token".into()));
    };
    let digest = sha256_hex(token.as_bytes());
    let link = state.store.app_git_link_by_secret("gitlab", &digest).await?;
    // The lookup found the row by digest; the comparison that decides is
    // this constant-time one.
    let Some(link) = link.filter(|l| super::constant_time_eq(l.webhook_secret_sha256.as_bytes(), digest.as_bytes())) else {
        tracing::warn!("refused a GitLab webhook with an unknown token");
        return Err(ApiError::Unauthorized("invalid X-Gitlab-Token".into()));
    };
    let payload: Value = crate::error::parse_json(&body)?;
    let kind = payload.get("object_kind").and_then(Value::as_str).unwrap_or_default();
    if kind == "tag_push" || header(&headers, "x-gitlab-event") == Some("Tag Push Hook") {
        return Ok(ignored("tag push"));
    }
    if kind != "push" && kind != "merge_request" {
        return Ok(ignored("not a push event"));
    }
    let project = payload.get("project_id").and_then(Value::as_i64).or_else(|| payload.get("project").and_then(|p| p.get("id")).and_then(Value::as_i64));
    if project != link.project_id {
        return Err(ApiError::Forbidden("the token belongs to another project".into()));
    }
    if kind == "merge_request" {
        let Some(request) = super::change_requests::from_merge_request(&payload)? else {
            return Ok(ignored("a merge request change with no new code"));
        };
        return super::change_requests::dispatch(&state, std::slice::from_ref(&link), &request, &body_delivery(&body)).await;
    }
    let reference = payload.get("ref").and_then(Value::as_str).unwrap_or_default();
    let app = state.store.app(&link.app).await?.ok_or_else(|| ApiError::NotFound(format!("no app {:?}", link.app)))?;
    if reference.starts_with("refs/tags/") {
        return Ok(ignored("tag push"));
    }
    if reference != format!("refs/heads/{}", app.branch) {
        return Ok(ignored("push to another branch"));
    }
    // A deleted branch has no checkout_sha.
    let Some(commit) = payload.get("checkout_sha").and_then(Value::as_str) else {
        return Ok(ignored("branch deleted"));
    };
    if !commit_id(commit) {
        return Err(ApiError::BadRequest("checkout_sha is not a commit id".into()));
    }
    let delivery = body_delivery(&body);
    deploy_once(&state, &app.name, &delivery, commit, received).await
}

pub use cloudweb_core::signing::{sign, signature_valid};

#[utoipa::path(post, path = "/api/webhooks/generic/{app}", operation_id = "webhooks_generic", tag = "git", security(()),
    params(("app" = String, Path, description = "The app's name"), ("X-Cloudweb-Signature" = Option<String>, Header, description = "sha256=<hex HMAC-SHA256 of \"<X-Cloudweb-Timestamp>.<raw body>\">"), ("X-Cloudweb-Timestamp" = Option<String>, Header, description = "Unix seconds, within 5 minutes of the server's clock; signed with the body"), ("X-Hub-Signature-256" = Option<String>, Header, description = "GitHub's and Gitea's sha256=<hex HMAC-SHA256 of the raw body>, instead of the two above; the body then deploys once")),
    request_body = GenericPushEvent,
    responses(
        (status = 200, description = "Ignored (tag push, other branch, redelivery)", body = WebhookIgnored),
        (status = 202, description = "One deployment queued", body = WebhookQueued),
        (status = 400, description = "Malformed body", body = ErrorBody),
        (status = 401, description = "Missing or wrong signature", body = ErrorBody),
        (status = 404, description = "No such app", body = ErrorBody),
        (status = 413, description = "Body over 1 MiB", body = ErrorBody),
    ))]
pub async fn generic(
    State(state): State<Arc<AppState>>,
    Path(app_name): Path<String>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<(StatusCode, Json<WebhookAnswer>), ApiError> {
    let received = std::time::Instant::now();
    let body = body_bytes(body)?;
    // An unknown app and a wrong signature answer the same.
    let refused = || ApiError::Unauthorized("invalid signature".into());
    let link = state.store.app_git_link(&app_name).await?.filter(|l| l.provider == "generic");
    let Some(sealed) = link.and_then(|l| l.webhook_secret_sealed) else {
        return Err(refused());
    };
    let secret = state.sealer.open(&super::webhook_context(&app_name), &sealed).map_err(|e| ApiError::Internal(format!("webhook secret of {app_name}: {e}")))?;
    let delivery = match check_generic_signature(&secret, &headers, &body, state.clock.now_ms()) {
        Ok(delivery) => delivery,
        Err(err) => {
            tracing::warn!(app = %app_name, reason = %err, "refused a webhook");
            return Err(err);
        }
    };
    let payload: Value = crate::error::parse_json(&body)?;
    let reference = payload.get("ref").and_then(Value::as_str).unwrap_or_default();
    let app = state.store.app(&app_name).await?.ok_or_else(|| ApiError::NotFound(format!("no app {app_name:?}")))?;
    if reference.starts_with("refs/tags/") {
        return Ok(ignored("tag push"));
    }
    if reference != format!("refs/heads/{}", app.branch) {
        return Ok(ignored("push to another branch"));
    }
    let Some(commit) = payload.get("after").or_else(|| payload.get("commit")).and_then(Value::as_str) else {
        return Err(ApiError::BadRequest("the body has no commit (after or commit)".into()));
    };
    if commit.bytes().all(|b| b == b'0') {
        return Ok(ignored("branch deleted"));
    }
    if !commit_id(commit) {
        return Err(ApiError::BadRequest("the commit is not a full commit id".into()));
    }
    deploy_once(&state, &app.name, &delivery, commit, received).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signatures() {
        let body = br#"{"ref":"refs/heads/main"}"#;
        let good = sign(b"secret", body);
        assert!(signature_valid(b"secret", body, &good));
        assert!(!signature_valid(b"other", body, &good));
        assert!(!signature_valid(b"secret", b"{}", &good));
        assert!(!signature_valid(b"secret", body, good.trim_start_matches("sha256=")));
        assert!(!signature_valid(b"secret", body, "sha256=zz"));
        // RFC 4231 test case 2.
        assert_eq!(
            sign(b"Jefe", b"what do ya want for nothing?"),
            "sha256=5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    #[test]
    fn commit_ids_and_delivery_ids() {
        assert!(commit_id(&"a".repeat(40)));
        assert!(commit_id(&"0123456789abcdef".repeat(4)));
        assert!(!commit_id(&"A".repeat(40)));
        assert!(!commit_id("abc"));
        assert_eq!(body_delivery(b"x"), body_delivery(b"x"));
        assert_ne!(body_delivery(b"x"), body_delivery(b"y"));
    }

    #[test]
    fn a_timestamped_signature_holds_for_five_minutes_and_covers_the_time() {
        let body = br#"{"ref":"refs/heads/main"}"#;
        let now_ms = 1_800_000_000_000;
        let headers = |pairs: &[(&'static str, String)]| {
            let mut h = HeaderMap::new();
            for (k, v) in pairs {
                h.insert(*k, v.parse().unwrap());
            }
            h
        };
        let signed_at = |t: i64| headers(&[("x-cloudweb-timestamp", t.to_string()), ("x-cloudweb-signature", sign(b"s", &[t.to_string().as_bytes(), b".", body].concat()))]);
        let now = now_ms / 1000;
        let fresh = check_generic_signature(b"s", &signed_at(now - 299), body, now_ms).unwrap();
        assert!(fresh.starts_with("signed-sha256:"));
        assert_ne!(fresh, check_generic_signature(b"s", &signed_at(now), body, now_ms).unwrap(), "another time, another delivery");
        for stale in [now - 301, now + 301, 0] {
            let err = check_generic_signature(b"s", &signed_at(stale), body, now_ms).unwrap_err().to_string();
            assert!(err.contains("from the server's clock"), "{err}");
        }
        // The time is signed: moving it breaks the signature.
        let mut moved = signed_at(now - 400);
        moved.insert("x-cloudweb-timestamp", now.to_string().parse().unwrap());
        assert!(check_generic_signature(b"s", &moved, body, now_ms).unwrap_err().to_string().contains("invalid signature"));
        // The body-only scheme without a time is refused under our header.
        let untimed = headers(&[("x-cloudweb-signature", sign(b"s", body))]);
        assert!(check_generic_signature(b"s", &untimed, body, now_ms).unwrap_err().to_string().contains("X-Cloudweb-Timestamp"));
        // GitHub's header: the body is the delivery.
        let hub = headers(&[("x-hub-signature-256", sign(b"s", body))]);
        assert_eq!(check_generic_signature(b"s", &hub, body, now_ms).unwrap(), body_delivery(body));
        assert!(check_generic_signature(b"other", &hub, body, now_ms).is_err());
        // Gitea's and Forgejo's: bare hex, the same delivery.
        for name in ["x-gitea-signature", "x-forgejo-signature"] {
            let bare = headers(&[(name, sign(b"s", body).trim_start_matches("sha256=").to_string())]);
            assert_eq!(check_generic_signature(b"s", &bare, body, now_ms).unwrap(), body_delivery(body));
            assert!(check_generic_signature(b"other", &bare, body, now_ms).is_err());
        }
    }
}
