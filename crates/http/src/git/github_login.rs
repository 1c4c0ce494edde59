//! Logging in with GitHub: the GitHub App's OAuth web flow with `state`
//! and PKCE (S256) ([`super::login_flow`], as for GitLab).
//! `GET /api/auth/github/login` sends the browser to GitHub's authorize
//! page; `GET /api/auth/github/callback` takes it back, trades the code
//! and the verifier for a user token, reads the user, and lets in only
//! users on the allow-list (by login or id, or as an active member of an
//! allowed organization or team). The identity is kept by its GitHub user
//! id, the only thing that links it to a local user ([`super::login`]);
//! the user token is used for these checks only, never stored, and
//! revoked in the background once the login is decided.
//!
//! `GET`/`PUT /api/github/login` show and set the login settings.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use cloudweb_api_types::github::{GithubLoginInput, GithubLoginSettingsView, GithubLoginView, GithubUserView};
use cloudweb_api_types::ErrorBody;

use cloudweb_core::git::github_login::{self as settings_of, LoginSettings};
use super::github_login_api::{self as api, UserClient};
use super::login::{Host, Identity};
use super::login_flow::{self, Callback, Flow};
use crate::error::{body_bytes, parse_json, ApiError};
use crate::AppState;

/// The cookie that binds a login's `state` to the browser that started it.
pub const LOGIN_COOKIE: &str = "cloudweb_github_login";

const FLOW: Flow = Flow { label: "GitHub", kind: "github-login", cookie: LOGIN_COOKIE, cookie_path: "/api/auth/github" };

fn not_configured() -> ApiError {
    ApiError::NotFound("logging in with GitHub is not set up (PUT /api/github/login, or `cloudweb github login-setup`)".into())
}

#[utoipa::path(get, path = "/api/github/login", operation_id = "github_login_show", tag = "git",
    responses((status = 200, description = "Logging in with GitHub (never the client secret)", body = GithubLoginSettingsView), (status = 404, description = "Not set up", body = ErrorBody)))]
pub async fn get_settings(State(state): State<Arc<AppState>>) -> Result<Json<GithubLoginSettingsView>, ApiError> {
    let row = state.store.github_login().await?.ok_or_else(not_configured)?;
    Ok(Json(settings_of::view(&state, &row)))
}

#[utoipa::path(put, path = "/api/github/login", operation_id = "github_login_replace", tag = "git", request_body = GithubLoginInput,
    responses((status = 200, description = "Saved; the client secret is sealed", body = GithubLoginSettingsView), (status = 400, description = "Invalid settings", body = ErrorBody), (status = 413, description = "Body over 1 MiB", body = ErrorBody)))]
pub async fn put_settings(State(state): State<Arc<AppState>>, body: Result<Bytes, BytesRejection>) -> Result<Json<GithubLoginSettingsView>, ApiError> {
    let input: GithubLoginInput = parse_json(&body_bytes(body)?)?;
    let row = settings_of::apply(&state, input).await?;
    Ok(Json(settings_of::view(&state, &row)))
}

/// Sends the browser to GitHub's authorize page.
#[utoipa::path(get, path = "/api/auth/github/login", operation_id = "auth_github_login", tag = "git", security(()),
    responses(
        (status = 302, description = "To GitHub's authorize page, with a one-use state and a PKCE S256 challenge; sets the cloudweb_github_login cookie the callback checks"),
        (status = 404, description = "Logging in with GitHub is not set up", body = ErrorBody),
    ))]
pub async fn login(State(state): State<Arc<AppState>>, headers: HeaderMap) -> Result<Response, ApiError> {
    let settings = settings_of::settings(&state).await?.ok_or_else(not_configured)?;
    let started = FLOW.start(&state).await?;
    let mut url = url::Url::parse(&format!("{}/login/oauth/authorize", settings.web_url)).map_err(|e| ApiError::Internal(e.to_string()))?;
    url.query_pairs_mut()
        .append_pair("client_id", &settings.client_id)
        .append_pair("redirect_uri", &settings_of::callback_url(&state))
        .append_pair("state", &started.state)
        .append_pair("code_challenge", &started.challenge)
        .append_pair("code_challenge_method", "S256")
        // A GitHub App's user token has the App's permissions, not scopes;
        // an OAuth App would need read:org to show org and team membership.
        .append_pair("scope", "read:org")
        .append_pair("allow_signup", "false");
    FLOW.redirect(&state, &headers, &started, &url)
}

#[utoipa::path(get, path = "/api/auth/github/callback", operation_id = "auth_github_callback", tag = "git", security(()),
    params(("code" = Option<String>, Query, description = "GitHub's authorization code"), ("state" = Option<String>, Query, description = "The login's state"), ("error" = Option<String>, Query, description = "GitHub's refusal")),
    responses(
        (status = 303, description = "Logged in: session cookies set, to / (the dashboard)"),
        (status = 200, description = "Logged in (Accept: application/json): the session, cookies set", body = GithubLoginView),
        (status = 400, description = "Missing, unknown, expired or reused state, a state started in another browser (login cookie missing or wrong), or no code", body = ErrorBody),
        (status = 401, description = "GitHub refused the code (wrong PKCE verifier, expired or used code)", body = ErrorBody),
        (status = 403, description = "Not on the allow-list, or the linked user is disabled (an HTML page for a browser)", body = ErrorBody),
        (status = 409, description = "The browser is logged in as another user than the one this GitHub identity is linked to", body = ErrorBody),
        (status = 502, description = "GitHub failed, or refused the login settings (client id and secret, callback URL)", body = ErrorBody),
    ))]
pub async fn callback(State(state): State<Arc<AppState>>, headers: HeaderMap, Query(query): Query<Callback>) -> Response {
    let response = match finish(&state, &headers, query).await {
        Ok(response) => response,
        Err(err) => err.into_response(),
    };
    FLOW.seal_answer(&state, &headers, response)
}

/// The user, whether the allow-list lets them in, and, when team
/// mappings name GitHub groups, those the user is in.
async fn check(state: &AppState, client: &UserClient, settings: &LoginSettings) -> Result<(api::GithubUser, bool, Option<Vec<String>>), ApiError> {
    let user = client.user().await.map_err(|e| ApiError::BadGateway(e.to_string()))?;
    let allowed = settings_of::allowed(client, &user, settings).await.map_err(|e| ApiError::BadGateway(e.to_string()))?;
    let groups = crate::access::mapping::mapped_groups(&state.store.team_mappings().await?, "github");
    if !allowed || groups.is_empty() {
        return Ok((user, allowed, None));
    }
    let groups = settings_of::member_of(client, &user, &groups).await.map_err(|e| ApiError::BadGateway(e.to_string()))?;
    Ok((user, allowed, Some(groups)))
}

/// Revokes the login's user token in the background (the login does not
/// wait for it; a failure is logged, never retried: GitHub expires the
/// token anyway).
fn revoke_later(settings: &LoginSettings, client: UserClient) {
    let (api, id, secret) = (settings.api_url.clone(), settings.client_id.clone(), settings.client_secret.clone());
    tokio::spawn(async move {
        let revoked = tokio::time::timeout(std::time::Duration::from_secs(30), api::revoke_token(&client.http, &api, &id, &secret, &client.token)).await;
        match revoked {
            Ok(Ok(())) => tracing::debug!("revoked the GitHub login's user token"),
            Ok(Err(err)) => tracing::warn!(error = %err, "cannot revoke the GitHub login's user token; GitHub expires it"),
            Err(_) => tracing::warn!("revoking the GitHub login's user token took over 30 s; GitHub expires it"),
        }
    });
}

async fn finish(state: &AppState, headers: &HeaderMap, query: Callback) -> Result<Response, ApiError> {
    let refusal = |status: StatusCode, message: &str| FLOW.refusal(headers, status, message);
    let pending = match FLOW.take(state, headers, query.state).await? {
        Ok(pending) => pending,
        Err(refused) => return Ok(refused),
    };
    if let Some(mut error) = query.error {
        cloudweb_protocol::misc::truncate_on_char(&mut error, 100);
        return Ok(refusal(StatusCode::FORBIDDEN, &format!("GitHub did not authorize the login: {error}")));
    }
    let Some(code) = query.code.filter(|c| !c.is_empty() && c.len() <= 512) else {
        return Ok(refusal(StatusCode::BAD_REQUEST, "the callback has no authorization code"));
    };
    let settings: LoginSettings = settings_of::settings(state).await?.ok_or_else(not_configured)?;
    let callback_url = settings_of::callback_url(state);
    let exchanged = api::exchange_code(&state.git.http, &settings.web_url, &settings.client_id, &settings.client_secret, &code, &pending.verifier, &callback_url).await;
    let token = match exchanged {
        Ok(token) => token,
        Err(super::ProviderError::Status { status, message, .. }) if (400..500).contains(&status) => {
            tracing::warn!(status, %message, "GitHub refused the authorization code");
            return Ok(refusal(StatusCode::UNAUTHORIZED, &format!("GitHub refused the authorization code: {message}")));
        }
        Err(super::ProviderError::NotConfigured(message)) => {
            tracing::error!(%message, "a GitHub login failed on the login settings");
            return Err(ApiError::BadGateway(message));
        }
        Err(err) => return Err(ApiError::BadGateway(err.to_string())),
    };
    let client = UserClient { http: state.git.http.clone(), api: settings.api_url.clone(), token };
    let checked = check(state, &client, &settings).await;
    revoke_later(&settings, client);
    let (user, allowed, groups) = checked?;
    if !allowed {
        tracing::warn!(github_user = user.id, login = %user.login, "refused a GitHub login outside the allow-list");
        return Ok(refusal(
            StatusCode::FORBIDDEN,
            &format!(
                "the GitHub user {} is not allowed to log in here; ask an administrator to add the user, one of their organizations or teams to the allow-list",
                user.login
            ),
        ));
    }
    state.store.saw_git_identity(Host::Github.key(), user.id, &user.login, state.clock.now_ms()).await?;
    let identity = Identity { host: Host::Github, id: user.id, username: &user.login };
    login_flow::log_in_identity(state, headers, &FLOW, identity, groups.as_deref(), |local, session| {
        Json(GithubLoginView {
            github_user: GithubUserView { id: user.id, login: user.login.clone(), name: user.name.clone() },
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
