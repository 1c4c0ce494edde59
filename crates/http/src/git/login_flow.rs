//! What every "log in with a git host" flow shares (GitLab: `oauth.rs`,
//! GitHub: `github_login.rs`): the OAuth 2 authorization-code flow with
//! `state` and PKCE (S256), bound to the browser that started it, and the
//! session a successful callback starts.
//!
//! - The login keeps its PKCE verifier sealed in `one_shot_values` (any
//!   replica may take the callback), under the SHA-256 of its `state`:
//!   one use, ten minutes, at most 1,000 in flight (more are refused).
//! - Login CSRF: the browser gets a random nonce in a cookie of the flow
//!   (`HttpOnly; SameSite=Lax`, the flow's path, ten minutes); the pending
//!   login keeps only its SHA-256, and the callback refuses a `state`
//!   whose browser does not send the matching cookie.
//! - A refusal is an HTML page for a browser and JSON for a script.

use std::time::Duration;

use axum::http::header::{ACCEPT, CACHE_CONTROL, LOCATION, SET_COOKIE};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use axum::Json;
use base64::Engine;
use cloudweb_api_types::ErrorBody;
use rand::Rng;
use sha2::{Digest, Sha256};

use crate::error::ApiError;
use crate::git::login::Identity;
use crate::git::PendingLogin;
use crate::store::UserRow;
use crate::AppState;

/// How long a login may take between the redirect and the callback.
const LOGIN_TTL: Duration = Duration::from_secs(600);
const LOGIN_TTL_MS: i64 = 600_000;
const LOGIN_BOUNDS: crate::store::one_shot::Bounds =
    crate::store::one_shot::Bounds { lifetime_ms: LOGIN_TTL_MS, max: 1000, when_full: crate::store::one_shot::WhenFull::Refuse };

/// One host's login flow.
pub struct Flow {
    /// The host's name in messages.
    pub label: &'static str,
    /// The pending logins' kind in `one_shot_values` (and sealing context).
    pub kind: &'static str,
    /// The cookie that binds a login's `state` to its browser.
    pub cookie: &'static str,
    /// Where that cookie is sent: the flow's login and callback.
    pub cookie_path: &'static str,
}

/// A login just started: what the authorize URL carries, and the nonce
/// the browser's cookie holds.
pub struct Started {
    pub state: String,
    pub challenge: String,
    nonce: String,
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

impl Flow {
    fn context(&self, key: &str) -> String {
        format!("{}:{key}", self.kind)
    }

    /// The `Set-Cookie` value of the login cookie (`max_age_s` 0 clears it).
    fn cookie_header(&self, state: &AppState, headers: &HeaderMap, value: &str, max_age_s: u64) -> Option<HeaderValue> {
        let secure = if crate::auth::sessions::cookie_secure(state, headers) { "; Secure" } else { "" };
        HeaderValue::from_str(&format!("{}={value}; HttpOnly; SameSite=Lax; Path={}; Max-Age={max_age_s}{secure}", self.cookie, self.cookie_path)).ok()
    }

    /// Starts a login: a state, a PKCE verifier kept sealed for the
    /// callback, and the browser's nonce.
    pub async fn start(&self, state: &AppState) -> Result<Started, ApiError> {
        let login_state = random_url_safe(32);
        // 32 random bytes make a 43-character verifier (RFC 7636: 43 to 128).
        let verifier = random_url_safe(32);
        let challenge = pkce_challenge(&verifier);
        let nonce = random_url_safe(32);
        let pending = PendingLogin { verifier, browser_sha256: crate::ca::sha256_hex(nonce.as_bytes()) };
        let key = crate::ca::sha256_hex(login_state.as_bytes());
        let sealed = state.sealer.seal_json(&self.context(&key), &pending);
        if !state.store.put_one_shot(self.kind, &key, &sealed, state.clock.now_ms(), LOGIN_BOUNDS).await? {
            return Err(ApiError::Unavailable(format!("too many {} logins in progress; try again in a few minutes", self.label)));
        }
        Ok(Started { state: login_state, challenge, nonce })
    }

    /// The redirect to the host's authorize page, setting the login cookie.
    pub fn redirect(&self, state: &AppState, headers: &HeaderMap, started: &Started, url: &url::Url) -> Result<Response, ApiError> {
        let mut response = StatusCode::FOUND.into_response();
        response.headers_mut().insert(LOCATION, HeaderValue::from_str(url.as_str()).map_err(|e| ApiError::Internal(e.to_string()))?);
        response.headers_mut().insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
        if let Some(cookie) = self.cookie_header(state, headers, &started.nonce, LOGIN_TTL.as_secs()) {
            response.headers_mut().append(SET_COOKIE, cookie);
        }
        Ok(response)
    }

    /// Takes the pending login of a callback's `state` (one use, whatever
    /// happens next) and checks it was started in this browser; a refusal
    /// to answer otherwise.
    pub async fn take(&self, state: &AppState, headers: &HeaderMap, login_state: Option<String>) -> Result<Result<PendingLogin, Response>, ApiError> {
        let Some(login_state) = login_state.filter(|s| !s.is_empty()) else {
            return Ok(Err(self.refusal(headers, StatusCode::BAD_REQUEST, "the callback has no state parameter; start the login again")));
        };
        let key = crate::ca::sha256_hex(login_state.as_bytes());
        let sealed = state.store.take_one_shot(self.kind, &key, state.clock.now_ms(), LOGIN_TTL_MS).await?;
        let pending: Option<PendingLogin> = sealed.and_then(|sealed| state.sealer.open_json(&self.context(&key), &sealed).ok());
        let Some(pending) = pending else {
            return Ok(Err(self.refusal(headers, StatusCode::BAD_REQUEST, "unknown, expired or already used login state; start the login again")));
        };
        let browser = crate::auth::sessions::cookie(headers, self.cookie).map(|nonce| crate::ca::sha256_hex(nonce.as_bytes()));
        if !browser.is_some_and(|b| crate::auth::constant_time_eq(b.as_bytes(), pending.browser_sha256.as_bytes())) {
            tracing::warn!(host = self.label, "refused a login callback whose state was started in another browser");
            let message = format!(
                "this login state was not started in this browser (its {} cookie is missing or does not match); start the login again",
                self.cookie
            );
            return Ok(Err(self.refusal(headers, StatusCode::BAD_REQUEST, &message)));
        }
        Ok(Ok(pending))
    }

    /// A refusal the browser shows as a page and a script reads as JSON.
    pub fn refusal(&self, headers: &HeaderMap, status: StatusCode, message: &str) -> Response {
        let wants_html = headers.get(ACCEPT).and_then(|v| v.to_str().ok()).is_some_and(|v| v.contains("text/html"));
        if wants_html {
            let escaped = message.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;");
            let label = self.label;
            let page = format!(
                "<!doctype html><html><head><meta charset=\"utf-8\"><title>{label} login refused</title></head>\
                 <body><h1>{label} login refused</h1><p>{escaped}</p></body></html>"
            );
            return (status, Html(page)).into_response();
        }
        (status, Json(ErrorBody { error: message.to_string(), code: None })).into_response()
    }

    /// What every callback answer gets: the nonce cleared (it served its
    /// one login, whatever the outcome) and `Cache-Control: no-store`.
    pub fn seal_answer(&self, state: &AppState, headers: &HeaderMap, mut response: Response) -> Response {
        if let Some(clear) = self.cookie_header(state, headers, "", 0) {
            response.headers_mut().append(SET_COOKIE, clear);
        }
        response.headers_mut().insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
        response
    }
}

/// A callback's query: the host's code, the login's state, or the host's
/// refusal.
#[derive(serde::Deserialize)]
pub struct Callback {
    pub code: Option<String>,
    pub state: Option<String>,
    pub error: Option<String>,
}

/// Whether the client asked for JSON rather than a page.
pub fn wants_json(headers: &HeaderMap) -> bool {
    let accept = headers.get(ACCEPT).and_then(|v| v.to_str().ok()).unwrap_or("");
    accept.contains("application/json") && !accept.contains("text/html")
}

/// The user of the browser's live session, if any.
pub async fn current_user(state: &AppState, headers: &HeaderMap) -> Result<Option<UserRow>, ApiError> {
    Ok(match crate::auth::sessions::session_cookie(headers) {
        Some(cookie) => crate::auth::sessions::lookup(state, cookie).await?.map(|s| s.user),
        None => None,
    })
}

/// Logs in the local user of an identity that passed the host's checks
/// (and is saved): linked, linked now to the browser's user, or made
/// ([`crate::git::login`]). `json` makes the JSON answer for a script.
pub async fn log_in_identity(
    state: &AppState,
    headers: &HeaderMap,
    flow: &Flow,
    identity: Identity<'_>,
    groups: Option<&[String]>,
    json: impl FnOnce(&UserRow, &crate::auth::sessions::NewSession) -> Response,
) -> Result<Response, ApiError> {
    let current = current_user(state, headers).await?;
    let local = match crate::git::login::local_user(state, identity, current.as_ref()).await? {
        Ok(local) => local,
        Err(crate::git::login::Refusal::LinkedElsewhere) => {
            let message = format!(
                "the {} user {} is linked to another user of this control plane; log out first to log in as that user",
                flow.label, identity.username
            );
            return Ok(flow.refusal(headers, StatusCode::CONFLICT, &message));
        }
    };
    if local.disabled_at.is_some() {
        tracing::warn!(host = flow.label, host_user = identity.id, user = %local.name, "refused a login of a disabled user");
        crate::auth::routes::login_entry(state, Some(&local.id), None, flow.label, "refused: the user is disabled").await;
        return Ok(flow.refusal(headers, StatusCode::FORBIDDEN, &format!("the user {} is disabled", local.name)));
    }
    tracing::info!(host = flow.label, host_user = identity.id, username = %identity.username, user = %local.name, "login with a git host");
    if let Some(groups) = groups {
        crate::access::mapping::apply(state, &local.id, &flow.label.to_ascii_lowercase(), groups).await?;
    }
    crate::auth::routes::login_entry(state, Some(&local.id), None, flow.label, "ok").await;
    log_in(state, headers, &local, |session| json(&local, session)).await
}

/// Starts a session for `local` (replacing the one this browser had):
/// `json(session)` for a client that asked for JSON, else `303` to `/`,
/// the dashboard; the session cookies set either way.
pub async fn log_in(
    state: &AppState,
    headers: &HeaderMap,
    local: &UserRow,
    json: impl FnOnce(&crate::auth::sessions::NewSession) -> Response,
) -> Result<Response, ApiError> {
    if let Some(old) = crate::auth::sessions::session_cookie(headers) {
        state.store.delete_session(&crate::ca::sha256_hex(old.as_bytes())).await?;
    }
    let session = crate::auth::sessions::start(state, &local.id).await?;
    let mut response = if wants_json(headers) {
        json(&session)
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
