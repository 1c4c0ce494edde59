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
//! Login CSRF: the login also gives the browser a random nonce in the
//! `cloudweb_gitlab_login` cookie (`HttpOnly; SameSite=Lax`, path
//! `/api/auth/gitlab`, ten minutes); the pending login keeps only its
//! SHA-256, and the callback refuses a `state` whose browser does not
//! send the matching cookie. Someone who starts a login and lures another
//! browser to its callback gets nothing.
//!
//! A successful callback starts a session for the local user (the same
//! cookies as a password login) and answers `303 See Other` to `/`, the
//! dashboard. A client whose `Accept` names `application/json` and not
//! `text/html` gets the session as JSON instead (`200`), cookies included.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Query, State};
use axum::http::header::{ACCEPT, CACHE_CONTROL, LOCATION, SET_COOKIE};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use axum::Json;
use base64::Engine;
use rand::Rng;
use serde::Deserialize;
use cloudweb_api_types::git::{GitlabLoginView, GitlabUserView};
use cloudweb_api_types::ErrorBody;
use sha2::{Digest, Sha256};

use super::gitlab::{self, GitLab};
use crate::error::ApiError;
use crate::AppState;

/// How long a login may take between the redirect and the callback.
const LOGIN_TTL: Duration = Duration::from_secs(600);
const LOGIN_TTL_MS: i64 = 600_000;
/// Logins in flight, at most 1,000 at once (more are refused, not pushed
/// out), in `one_shot_values`.
const LOGIN_KIND: &str = "gitlab-login";
const LOGIN_BOUNDS: crate::store::one_shot::Bounds =
    crate::store::one_shot::Bounds { lifetime_ms: LOGIN_TTL_MS, max: 1000, when_full: crate::store::one_shot::WhenFull::Refuse };

fn login_context(key: &str) -> String {
    format!("gitlab-login:{key}")
}
/// The cookie that binds a login's `state` to the browser that started it.
pub const LOGIN_COOKIE: &str = "cloudweb_gitlab_login";
const LOGIN_COOKIE_PATH: &str = "/api/auth/gitlab";

use crate::git::PendingLogin;

/// The `Set-Cookie` value of the login cookie (`max_age_s` 0 clears it).
fn login_cookie(state: &AppState, headers: &HeaderMap, value: &str, max_age_s: u64) -> Option<HeaderValue> {
    let secure = if crate::auth::sessions::cookie_secure(state, headers) { "; Secure" } else { "" };
    HeaderValue::from_str(&format!("{LOGIN_COOKIE}={value}; HttpOnly; SameSite=Lax; Path={LOGIN_COOKIE_PATH}; Max-Age={max_age_s}{secure}")).ok()
}

/// The PKCE S256 challenge of a verifier: base64url(SHA-256(verifier)),
/// unpadded (RFC 7636 §4.2).
pub fn pkce_challenge(verifier: &str) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(Sha256::digest(verifier.as_bytes()))
}

fn random_url_safe(bytes: usize) -> String {
    let mut buffer = vec![0u8; bytes];
    rand::rng().fill(buffer.as_mut_slice());
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(buffer)
}

/// Sends the browser to GitLab's authorize endpoint.
#[utoipa::path(get, path = "/api/auth/gitlab/login", operation_id = "auth_gitlab_login", tag = "git", security(()),
    responses(
        (status = 302, description = "To GitLab's authorize page, with a one-use state and a PKCE S256 challenge; sets the cloudweb_gitlab_login cookie the callback checks"),
        (status = 404, description = "GitLab is not configured", body = ErrorBody),
    ))]
pub async fn login(State(state): State<Arc<AppState>>, headers: HeaderMap) -> Result<Response, ApiError> {
    let settings = super::settings(&state).await?;
    let login_state = random_url_safe(32);
    // 32 random bytes make a 43-character verifier (RFC 7636: 43 to 128).
    let verifier = random_url_safe(32);
    let challenge = pkce_challenge(&verifier);
    let nonce = random_url_safe(32);
    // In the database, so that the callback may reach any replica.
    let pending = PendingLogin { verifier, browser_sha256: crate::ca::sha256_hex(nonce.as_bytes()) };
    let key = crate::ca::sha256_hex(login_state.as_bytes());
    let sealed = state.sealer.seal_json(&login_context(&key), &pending);
    if !state.store.put_one_shot(LOGIN_KIND, &key, &sealed, state.clock.now_ms(), LOGIN_BOUNDS).await? {
        return Err(ApiError::Unavailable("too many GitLab logins in progress; try again in a few minutes".into()));
    }
    let mut url = url::Url::parse(&format!("{}/oauth/authorize", settings.base_url)).map_err(|e| ApiError::Internal(e.to_string()))?;
    url.query_pairs_mut()
        .append_pair("client_id", &settings.client_id)
        .append_pair("redirect_uri", &super::redirect_uri(&state))
        .append_pair("response_type", "code")
        .append_pair("scope", "api read_user")
        .append_pair("state", &login_state)
        .append_pair("code_challenge", &challenge)
        .append_pair("code_challenge_method", "S256");
    let mut response = StatusCode::FOUND.into_response();
    response.headers_mut().insert(LOCATION, HeaderValue::from_str(url.as_str()).map_err(|e| ApiError::Internal(e.to_string()))?);
    response.headers_mut().insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    if let Some(cookie) = login_cookie(&state, &headers, &nonce, LOGIN_TTL.as_secs()) {
        response.headers_mut().append(SET_COOKIE, cookie);
    }
    Ok(response)
}

#[derive(Deserialize)]
pub struct Callback {
    code: Option<String>,
    state: Option<String>,
    error: Option<String>,
}

/// A refusal the browser shows as a page and a script reads as JSON.
fn refusal(headers: &HeaderMap, status: StatusCode, message: &str) -> Response {
    let wants_html = headers.get(ACCEPT).and_then(|v| v.to_str().ok()).is_some_and(|v| v.contains("text/html"));
    if wants_html {
        let escaped = message.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;");
        let page = format!(
            "<!doctype html><html><head><meta charset=\"utf-8\"><title>GitLab login refused</title></head>\
             <body><h1>GitLab login refused</h1><p>{escaped}</p></body></html>"
        );
        return (status, Html(page)).into_response();
    }
    (status, Json(ErrorBody { error: message.to_string(), code: None })).into_response()
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
    let mut response = match finish(&state, &headers, query).await {
        Ok(response) => response,
        Err(err) => err.into_response(),
    };
    // The nonce served its one login, whatever the outcome.
    if let Some(clear) = login_cookie(&state, &headers, "", 0) {
        response.headers_mut().append(SET_COOKIE, clear);
    }
    response.headers_mut().insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

/// Whether the client asked for JSON rather than a page.
fn wants_json(headers: &HeaderMap) -> bool {
    let accept = headers.get(ACCEPT).and_then(|v| v.to_str().ok()).unwrap_or("");
    accept.contains("application/json") && !accept.contains("text/html")
}

async fn finish(state: &AppState, headers: &HeaderMap, query: Callback) -> Result<Response, ApiError> {
    let Some(login_state) = query.state.filter(|s| !s.is_empty()) else {
        return Ok(refusal(headers, StatusCode::BAD_REQUEST, "the callback has no state parameter; start the login again"));
    };
    // One use: the state is gone whatever happens next.
    let key = crate::ca::sha256_hex(login_state.as_bytes());
    let sealed = state.store.take_one_shot(LOGIN_KIND, &key, state.clock.now_ms(), LOGIN_TTL_MS).await?;
    let pending: Option<PendingLogin> = sealed.and_then(|sealed| state.sealer.open_json(&login_context(&key), &sealed).ok());
    let Some(pending) = pending else {
        return Ok(refusal(headers, StatusCode::BAD_REQUEST, "unknown, expired or already used login state; start the login again"));
    };
    let browser = crate::auth::sessions::cookie(headers, LOGIN_COOKIE).map(|nonce| crate::ca::sha256_hex(nonce.as_bytes()));
    if !browser.is_some_and(|b| crate::auth::constant_time_eq(b.as_bytes(), pending.browser_sha256.as_bytes())) {
        tracing::warn!("refused a GitLab callback whose state was started in another browser");
        return Ok(refusal(
            headers,
            StatusCode::BAD_REQUEST,
            "this login state was not started in this browser (its cloudweb_gitlab_login cookie is missing or does not match); start the login again",
        ));
    }
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
    let groups = if settings.allowed_groups.is_empty() { Vec::new() } else { api.group_paths().await.map_err(|e| ApiError::BadGateway(e.to_string()))? };
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
    let current = match crate::auth::sessions::session_cookie(headers) {
        Some(cookie) => crate::auth::sessions::lookup(state, cookie).await?.map(|s| s.user),
        None => None,
    };
    let local = match super::login::local_user(state, user.id, &user.username, current.as_ref()).await? {
        Ok(local) => local,
        Err(super::login::Refusal::LinkedElsewhere) => {
            return Ok(refusal(
                headers,
                StatusCode::CONFLICT,
                &format!("the GitLab user {} is linked to another user of this control plane; log out first to log in as that user", user.username),
            ));
        }
    };
    if local.disabled_at.is_some() {
        tracing::warn!(gitlab_user = user.id, user = %local.name, "refused a GitLab login of a disabled user");
        return Ok(refusal(headers, StatusCode::FORBIDDEN, &format!("the user {} is disabled", local.name)));
    }
    // A new login replaces the session this browser had.
    if let Some(old) = crate::auth::sessions::session_cookie(headers) {
        state.store.delete_session(&crate::ca::sha256_hex(old.as_bytes())).await?;
    }
    let session = crate::auth::sessions::start(state, &local.id).await?;
    tracing::info!(gitlab_user = user.id, username = %user.username, user = %local.name, "GitLab login");
    let mut response = if wants_json(headers) {
        Json(GitlabLoginView {
            gitlab_user: GitlabUserView { id: user.id, username: user.username.clone(), name: user.name.clone() },
            // Linked only by the GitLab user id, never by email.
            linked_user: local.id.clone(),
            user: crate::auth::routes::user_view(&local),
            csrf_token: session.csrf_token.clone(),
            expires_at: crate::clock::rfc3339_ms(session.expires_at),
            idle_timeout_seconds: state.config.auth.session_idle.as_secs(),
        })
        .into_response()
    } else {
        let mut response = StatusCode::SEE_OTHER.into_response();
        response.headers_mut().insert(LOCATION, HeaderValue::from_static("/"));
        response
    };
    for cookie in crate::auth::sessions::set_cookie_headers(state, headers, &session) {
        response.headers_mut().append(SET_COOKIE, cookie);
    }
    Ok(response)
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
