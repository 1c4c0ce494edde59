//! The user API on `--api-listen`: bearer-token authenticated JSON, plus
//! `/healthz` (open) and Prometheus `/metrics`.

mod apps;
mod deployments;
mod join_tokens;
mod metrics;
mod nodes;
mod traffic;

use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::header::AUTHORIZATION;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;

use crate::ca::sha256_hex;
use crate::error::ApiError;
use crate::AppState;

pub fn router(state: Arc<AppState>) -> Router {
    let authenticated = Router::new()
        .route("/api/join-tokens", post(join_tokens::create))
        .route("/api/nodes", get(nodes::list))
        .route("/api/nodes/{id}", get(nodes::show).delete(nodes::remove))
        .route("/api/nodes/{id}/commands", get(nodes::commands).post(nodes::enqueue))
        .route("/api/nodes/{id}/drain", post(nodes::drain))
        .route("/api/nodes/{id}/undrain", post(nodes::undrain))
        .route("/api/apps", get(apps::list).post(apps::create))
        .route("/api/apps/{name}", get(apps::show).delete(apps::remove))
        .route("/api/apps/{name}/env", axum::routing::put(apps::set_env))
        .route("/api/apps/{name}/domains", axum::routing::put(apps::set_domains))
        .route("/api/apps/{name}/deploy", post(apps::deploy))
        .route("/api/apps/{name}/rollback", post(apps::rollback))
        .route("/api/apps/{name}/deployments", get(deployments::of_app))
        .route("/api/deployments/{id}", get(deployments::show))
        .route("/api/deployments/{id}/logs", get(deployments::logs))
        .route("/api/deployments/{id}/cancel", post(deployments::cancel))
        .route("/api/routes", get(traffic::routes))
        .route("/api/traffic/{host}", get(traffic::traffic))
        .route("/api/nodes/{id}/last-heartbeat", get(traffic::last_heartbeat))
        .route("/api/nodes/{id}/usage", get(traffic::node_usage))
        .route("/metrics", get(metrics::prometheus))
        .route("/api/gitlab/settings", get(crate::git::api::get_settings).put(crate::git::api::put_settings))
        .route("/api/gitlab/accounts", get(crate::git::api::accounts))
        .route("/api/gitlab/projects", get(crate::git::api::projects))
        .route("/api/gitlab/projects/{id}/branches", get(crate::git::api::branches))
        .route_layer(middleware::from_fn_with_state(state.clone(), require_admin));
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        // Public: GitLab login, and webhooks that authenticate themselves
        // (X-Gitlab-Token, an HMAC signature).
        .route("/api/auth/gitlab/login", get(crate::git::oauth::login))
        .route("/api/auth/gitlab/callback", get(crate::git::oauth::callback))
        .route("/api/webhooks/gitlab", post(crate::git::webhooks::gitlab))
        .route("/api/webhooks/generic/{app}", post(crate::git::webhooks::generic))
        .merge(authenticated)
        .fallback(|| async { ApiError::NotFound("no such endpoint".to_string()) })
        .layer(middleware::from_fn(run_to_completion))
        .layer(DefaultBodyLimit::max(crate::error::MAX_BODY_BYTES))
        .layer(middleware::from_fn(crate::error::refuse_declared_oversize))
        .with_state(state)
}

async fn require_admin(State(state): State<Arc<AppState>>, request: Request, next: Next) -> Response {
    let token = request
        .headers()
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    let Some(token) = token else {
        return ApiError::Unauthorized("missing Authorization: Bearer <token>".to_string()).into_response();
    };
    if !state.admin_tokens.read().expect("admin token lock").contains(&sha256_hex(token.as_bytes())) {
        return ApiError::Unauthorized("invalid API token".to_string()).into_response();
    }
    next.run(request).await
}

/// Runs the handler in its own task, so a client that hangs up does not
/// cancel it halfway through a change (the user API's handlers write in
/// several steps: an app row and its route table, a deployment and its
/// placement). The answer is simply not delivered.
pub async fn run_to_completion(request: Request, next: Next) -> Response {
    match tokio::spawn(next.run(request)).await {
        Ok(response) => response,
        Err(err) => ApiError::Internal(format!("request handler failed: {err}")).into_response(),
    }
}
