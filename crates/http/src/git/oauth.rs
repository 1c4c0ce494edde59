//! GitLab login: OAuth 2 authorization-code flow with `state` and PKCE
//! (S256). `GET /api/auth/gitlab/login` sends the browser to GitLab;
//! `GET /api/auth/gitlab/callback` takes it back, checks the `state` (one
//! use, ten minutes), trades the code and verifier for tokens, reads the
//! GitLab user, and lets in only users on the allow-list (by username, or
//! through membership of an allowed group). The identity is kept by its
//! GitLab user id, the only thing that links it to a local user: an email
//! address never links accounts ([`super::login`] picks, links or creates
//! the local user).
//!
//! The state, PKCE and login-CSRF machinery (the `cloudweb_gitlab_login`
//! cookie) is [`super::login_flow`], shared with the GitHub login.
//!
//! A successful callback starts a session for the local user (the same
//! cookies as a password login) and answers `303 See Other` to `/`, the
//! dashboard. A client whose `Accept` names `application/json` and not
//! `text/html` gets the session as JSON instead (`200`), cookies included.

use std::sync::Arc;

use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use cloudweb_api_types::git::{GitlabLoginView, GitlabUserView};
use cloudweb_api_types::ErrorBody;

use super::gitlab::{self, GitLab};
use super::login_flow::{self, Callback, Flow};
use crate::error::ApiError;
use crate::AppState;

pub use super::login_flow::pkce_challenge;

/// The cookie that binds a login's `state` to the browser that started it.
pub const LOGIN_COOKIE: &str = "cloudweb_gitlab_login";

const FLOW: Flow = Flow { label: "GitLab", kind: "gitlab-login", cookie: LOGIN_COOKIE, cookie_path: "/api/auth/gitlab" };

/// Sends the browser to GitLab's authorize endpoint.
#[utoipa::path(get, path = "/api/auth/gitlab/login", operation_id = "auth_gitlab_login", tag = "git", security(()),
    responses(
        (status = 302, description = "To GitLab's authorize page, with a one-use state and a PKCE S256 challenge; sets the cloudweb_gitlab_login cookie the callback checks"),
        (status = 404, description = "GitLab is not configured", body = ErrorBody),
    ))]
pub async fn login(State(state): State<Arc<AppState>>, headers: HeaderMap) -> Result<Response, ApiError> {
    let settings = super::settings(&state).await?;
    let started = FLOW.start(&state).await?;
    let mut url = url::Url::parse(&format!("{}/oauth/authorize", settings.base_url)).map_err(|e| ApiError::Internal(e.to_string()))?;
    url.query_pairs_mut()
        .append_pair("client_id", &settings.client_id)
        .append_pair("redirect_uri", &super::redirect_uri(&state))
        .append_pair("response_type", "code")
        .append_pair("scope", "api read_user")
        .append_pair("state", &started.state)
        .append_pair("code_challenge", &started.challenge)
        .append_pair("code_challenge_method", "S256");
    FLOW.redirect(&state, &headers, &started, &url)
}

/// Whether the allow-list lets this GitLab user in: by username (or
/// numeric id), or by membership of a listed group (exact full path).
pub fn allowed(user: &gitlab::GitlabUser, groups: &[String], allowed_users: &[String], allowed_groups: &[String]) -> bool {
    let by_user = allowed_users.iter().any(|a| a.eq_ignore_ascii_case(&user.username) || a == &user.id.to_string());
    let by_group = groups.iter().any(|g| allowed_groups.iter().any(|a| a.eq_ignore_ascii_case(g)));
    by_user || by_group
}

#[utoipa::path(get, path = "/api/auth/gitlab/callback", operation_id = "auth_gitlab_callback", tag = "git", security(()),
    params(("code" = Option<String>, Query, description = "GitLab's authorization code"), ("state" = Option<String>, Query, description = "The login's state"), ("error" = Option<String>, Query, description = "GitLab's refusal")),
    responses(
        (status = 303, description = "Logged in: session cookies set, to / (the dashboard)"),
        (status = 200, description = "Logged in (Accept: application/json): the session, cookies set", body = GitlabLoginView),
        (status = 400, description = "Missing, unknown, expired or reused state, a state started in another browser (login cookie missing or wrong), or no code", body = ErrorBody),
        (status = 401, description = "GitLab refused the code (wrong PKCE verifier)", body = ErrorBody),
        (status = 403, description = "Not on the allow-list, or the linked user is disabled (an HTML page for a browser)", body = ErrorBody),
        (status = 409, description = "The browser is logged in as another user than the one this GitLab identity is linked to", body = ErrorBody),
        (status = 502, description = "GitLab failed", body = ErrorBody),
    ))]
pub async fn callback(State(state): State<Arc<AppState>>, headers: HeaderMap, Query(query): Query<Callback>) -> Response {
    let response = match finish(&state, &headers, query).await {
        Ok(response) => response,
        Err(err) => err.into_response(),
    };
    FLOW.seal_answer(&state, &headers, response)
}

fn refusal(headers: &HeaderMap, status: StatusCode, message: &str) -> Response {
    FLOW.refusal(headers, status, message)
}

async fn finish(state: &AppState, headers: &HeaderMap, query: Callback) -> Result<Response, ApiError> {
    let pending = match FLOW.take(state, headers, query.state).await? {
        Ok(pending) => pending,
        Err(refused) => return Ok(refused),
    };
    if let Some(error) = query.error {
        let mut error = error;
        cloudweb_protocol::misc::truncate_on_char(&mut error, 100);
        return Ok(refusal(headers, StatusCode::FORBIDDEN, &format!("GitLab did not authorize the login: {error}")));
    }
    let Some(code) = query.code.filter(|c| !c.is_empty() && c.len() <= 512) else {
        return Ok(refusal(headers, StatusCode::BAD_REQUEST, "the callback has no authorization code"));
    };
    let settings = super::settings(state).await?;
    let tokens = match gitlab::exchange_code(
        &state.git.http,
        &settings.base_url,
        &settings.client_id,
        &settings.client_secret,
        &code,
        &pending.verifier,
        &super::redirect_uri(state),
    )
    .await
    {
        Ok(tokens) => tokens,
        Err(super::ProviderError::Status { status, message, .. }) if (400..500).contains(&status) => {
            tracing::warn!(status, %message, "GitLab refused the authorization code");
            return Ok(refusal(headers, StatusCode::UNAUTHORIZED, &format!("GitLab refused the authorization code: {message}")));
        }
        Err(err) => return Err(ApiError::BadGateway(err.to_string())),
    };
    let api = GitLab { http: state.git.http.clone(), base: settings.base_url.clone(), token: tokens.access_token.clone() };
    let user = api.user().await.map_err(|e| ApiError::BadGateway(e.to_string()))?;
    if user.state.as_deref().is_some_and(|s| s != "active") {
        return Ok(refusal(headers, StatusCode::FORBIDDEN, &format!("the GitLab account {} is not active", user.username)));
    }
    let mapped = crate::access::mapping::wanted(state, "gitlab").await?;
    let groups = if settings.allowed_groups.is_empty() && !mapped { Vec::new() } else { api.group_paths().await.map_err(|e| ApiError::BadGateway(e.to_string()))? };
    if !allowed(&user, &groups, &settings.allowed_users, &settings.allowed_groups) {
        tracing::warn!(gitlab_user = user.id, username = %user.username, "refused a GitLab login outside the allow-list");
        return Ok(refusal(
            headers,
            StatusCode::FORBIDDEN,
            &format!("the GitLab user {} is not allowed to log in here; ask an administrator to add the user or one of their groups to the allow-list", user.username),
        ));
    }
    super::save_tokens(state, user.id, &user.username, &tokens).await?;
    // A browser that is already logged in links the identity to its user.
    let identity = super::login::Identity { host: super::login::Host::Gitlab, id: user.id, username: &user.username };
    login_flow::log_in_identity(state, headers, &FLOW, identity, mapped.then_some(groups.as_slice()), |local, session| {
        Json(GitlabLoginView {
            gitlab_user: GitlabUserView { id: user.id, username: user.username.clone(), name: user.name.clone() },
            // Linked only by the GitLab user id, never by email.
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pkce_challenge_matches_rfc_7636_appendix_b() {
        assert_eq!(pkce_challenge("dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk"), "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM");
    }

    fn user(name: &str) -> gitlab::GitlabUser {
        gitlab::GitlabUser { id: 7, username: name.into(), name: None, email: None, confirmed_at: None, state: Some("active".into()) }
    }

    #[test]
    fn allow_list_by_user_id_or_group() {
        let users = vec!["Alice".to_string(), "99".to_string()];
        let groups = vec!["acme/web".to_string()];
        assert!(allowed(&user("alice"), &[], &users, &groups));
        assert!(!allowed(&user("bob"), &[], &users, &groups));
        assert!(allowed(&user("bob"), &["acme/web".into()], &users, &groups));
        assert!(!allowed(&user("bob"), &["acme".into(), "acme/web-2".into()], &users, &groups), "exact group paths only");
        assert!(!allowed(&user("bob"), &[], &[], &[]), "an empty allow-list lets nobody in");
        let mut by_id = user("carol");
        by_id.id = 99;
        assert!(allowed(&by_id, &[], &users, &groups));
    }
}
