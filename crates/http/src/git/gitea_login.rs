//! Logging in with Gitea or Forgejo: OAuth 2 authorization code with
//! `state` and PKCE (S256) ([`super::login_flow`], as for GitLab and
//! GitHub). `GET /api/auth/gitea/login` sends the browser to the
//! instance's authorize page; `GET /api/auth/gitea/callback` takes it
//! back, trades the code and the verifier for tokens, reads the user, and
//! lets in only active users on the allow-list (by name or id, or as a
//! member of an allowed organization). The identity is kept by its Gitea
//! user id, the only thing that links it to a local user
//! ([`super::login`]); its tokens are kept sealed, since they act for the
//! apps made through it.

use std::sync::Arc;

use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use cloudweb_api_types::gitea::{GiteaLoginView, GiteaUserView};
use cloudweb_api_types::ErrorBody;

use cloudweb_core::git::gitea as core_gitea;
use super::gitea_api::{self as api, Gitea};
use super::login::{Host, Identity};
use super::login_flow::{self, Callback, Flow};
use crate::error::ApiError;
use crate::AppState;

/// The cookie that binds a login's `state` to the browser that started it.
pub const LOGIN_COOKIE: &str = "cloudweb_gitea_login";

const FLOW: Flow = Flow { label: "Gitea", kind: "gitea-login", cookie: LOGIN_COOKIE, cookie_path: "/api/auth/gitea" };

/// Sends the browser to Gitea's authorize page.
#[utoipa::path(get, path = "/api/auth/gitea/login", operation_id = "auth_gitea_login", tag = "git", security(()),
    responses(
        (status = 302, description = "To Gitea's authorize page, with a one-use state and a PKCE S256 challenge; sets the cloudweb_gitea_login cookie the callback checks"),
        (status = 404, description = "Gitea is not configured", body = ErrorBody),
    ))]
pub async fn login(State(state): State<Arc<AppState>>, headers: HeaderMap) -> Result<Response, ApiError> {
    let settings = core_gitea::settings(&state).await?;
    let started = FLOW.start(&state).await?;
    let mut url = url::Url::parse(&format!("{}/login/oauth/authorize", settings.base_url)).map_err(|e| ApiError::Internal(e.to_string()))?;
    url.query_pairs_mut()
        .append_pair("client_id", &settings.client_id)
        .append_pair("redirect_uri", &core_gitea::callback_url(&state))
        .append_pair("response_type", "code")
        .append_pair("state", &started.state)
        .append_pair("code_challenge", &started.challenge)
        .append_pair("code_challenge_method", "S256");
    FLOW.redirect(&state, &headers, &started, &url)
}

#[utoipa::path(get, path = "/api/auth/gitea/callback", operation_id = "auth_gitea_callback", tag = "git", security(()),
    params(("code" = Option<String>, Query, description = "Gitea's authorization code"), ("state" = Option<String>, Query, description = "The login's state"), ("error" = Option<String>, Query, description = "Gitea's refusal")),
    responses(
        (status = 303, description = "Logged in: session cookies set, to / (the dashboard)"),
        (status = 200, description = "Logged in (Accept: application/json): the session, cookies set", body = GiteaLoginView),
        (status = 400, description = "Missing, unknown, expired or reused state, a state started in another browser (login cookie missing or wrong), or no code", body = ErrorBody),
        (status = 401, description = "Gitea refused the code (wrong PKCE verifier, expired or used code)", body = ErrorBody),
        (status = 403, description = "Not on the allow-list, an inactive or prohibited Gitea account, or the linked user is disabled (an HTML page for a browser)", body = ErrorBody),
        (status = 409, description = "The browser is logged in as another user than the one this Gitea identity is linked to", body = ErrorBody),
        (status = 502, description = "Gitea failed", body = ErrorBody),
    ))]
pub async fn callback(State(state): State<Arc<AppState>>, headers: HeaderMap, Query(query): Query<Callback>) -> Response {
    let response = match finish(&state, &headers, query).await {
        Ok(response) => response,
        Err(err) => err.into_response(),
    };
    FLOW.seal_answer(&state, &headers, response)
}

async fn finish(state: &AppState, headers: &HeaderMap, query: Callback) -> Result<Response, ApiError> {
    let refusal = |status: StatusCode, message: &str| FLOW.refusal(headers, status, message);
    let pending = match FLOW.take(state, headers, query.state).await? {
        Ok(pending) => pending,
        Err(refused) => return Ok(refused),
    };
    if let Some(mut error) = query.error {
        cloudweb_protocol::misc::truncate_on_char(&mut error, 100);
        return Ok(refusal(StatusCode::FORBIDDEN, &format!("Gitea did not authorize the login: {error}")));
    }
    let Some(code) = query.code.filter(|c| !c.is_empty() && c.len() <= 512) else {
        return Ok(refusal(StatusCode::BAD_REQUEST, "the callback has no authorization code"));
    };
    let settings = core_gitea::settings(state).await?;
    let exchanged = api::exchange_code(&state.git.http, &settings.base_url, &settings.client_id, &settings.client_secret, &code, &pending.verifier, &core_gitea::callback_url(state)).await;
    let tokens = match exchanged {
        Ok(tokens) => tokens,
        Err(super::ProviderError::Status { status, message, .. }) if (400..500).contains(&status) => {
            tracing::warn!(status, %message, "Gitea refused the authorization code");
            return Ok(refusal(StatusCode::UNAUTHORIZED, &format!("Gitea refused the authorization code: {message}")));
        }
        Err(err) => return Err(ApiError::BadGateway(err.to_string())),
    };
    let client = Gitea { http: state.git.http.clone(), base: settings.base_url.clone(), token: tokens.access_token.clone() };
    let user = client.user().await.map_err(|e| ApiError::BadGateway(e.to_string()))?;
    if !user.active || user.prohibit_login {
        return Ok(refusal(StatusCode::FORBIDDEN, &format!("the Gitea account {} is not active", user.login)));
    }
    let mapped = crate::access::mapping::wanted(state, "gitea").await?;
    let orgs = if settings.allowed_orgs.is_empty() && !mapped { Vec::new() } else { client.org_names().await.map_err(|e| ApiError::BadGateway(e.to_string()))? };
    if !core_gitea::allowed(&user, &orgs, &settings) {
        tracing::warn!(gitea_user = user.id, login = %user.login, "refused a Gitea login outside the allow-list");
        return Ok(refusal(
            StatusCode::FORBIDDEN,
            &format!("the Gitea user {} is not allowed to log in here; ask an administrator to add the user or one of their organizations to the allow-list", user.login),
        ));
    }
    state.store.saw_git_identity(Host::Gitea.key(), user.id, &user.login, state.clock.now_ms()).await?;
    core_gitea::save_tokens(state, user.id, &tokens).await?;
    let identity = Identity { host: Host::Gitea, id: user.id, username: &user.login };
    login_flow::log_in_identity(state, headers, &FLOW, identity, mapped.then_some(orgs.as_slice()), |local, session| {
        Json(GiteaLoginView {
            gitea_user: GiteaUserView { id: user.id, login: user.login.clone(), full_name: user.full_name.clone().filter(|n| !n.is_empty()) },
            linked_user: local.id.clone(),
            user: crate::auth::routes::user_view(local),
            csrf_token: session.csrf_token.clone(),
            expires_at: crate::clock::rfc3339_ms(session.expires_at),
            idle_timeout_seconds: state.config.auth.session_idle.as_secs(),
        })
        .into_response()
    })
    .await
}
