//! The gate in front of every authenticated route: finds who is calling
//! ([`Principal`]) from a bearer token or the session cookie, and refuses
//! cross-site and token-less state-changing requests made with the cookie.
//!
//! - `Authorization: Bearer <token>`: the admin token or a personal token;
//!   anything else there is 401 (a bad token never falls back to a cookie).
//!   Token requests need no CSRF token: a browser never adds that header
//!   by itself.
//! - Otherwise the session cookie: a missing, unknown or expired session is
//!   401. For any method other than GET, HEAD and OPTIONS the request must
//!   also (1) not come from another site: `Sec-Fetch-Site`, when sent, is
//!   `same-origin` or `none`, and `Origin`, when sent, is this host; and
//!   (2) carry the session's CSRF token in `X-CSRF-Token`, or, for an
//!   `application/x-www-form-urlencoded` body, in its `csrf_token` field.
//!   Either failing is 403.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::header::{AUTHORIZATION, CONTENT_TYPE, HOST, ORIGIN};
use axum::http::{HeaderMap, Method};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::{sessions, tokens, Principal, Via};
use crate::ca::sha256_hex;
use crate::error::ApiError;
use crate::AppState;

/// Middleware: authenticates the request or answers 401/403.
pub async fn require_principal(State(state): State<Arc<AppState>>, request: Request, next: Next) -> Response {
    match authenticate(&state, request).await {
        Ok(request) => next.run(request).await,
        Err(refusal) => refusal,
    }
}

async fn authenticate(state: &AppState, mut request: Request) -> Result<Request, Response> {
    if let Some(value) = request.headers().get(AUTHORIZATION) {
        let token = value.to_str().ok().and_then(|v| v.strip_prefix("Bearer ")).map(str::trim);
        let Some(token) = token else {
            return Err(ApiError::Unauthorized("the Authorization header must be Bearer <token>".to_string()).into_response());
        };
        let principal = bearer(state, token).await.map_err(IntoResponse::into_response)?;
        request.extensions_mut().insert(principal);
        return Ok(request);
    }
    let Some(cookie) = sessions::session_cookie(request.headers()).map(str::to_string) else {
        return Err(ApiError::Unauthorized("log in (POST /api/session) or send Authorization: Bearer <token>".to_string()).into_response());
    };
    let session = sessions::lookup(state, &cookie).await.map_err(IntoResponse::into_response)?;
    let Some(session) = session else {
        let mut response = ApiError::Unauthorized("your session has ended; log in again".to_string()).into_response();
        for value in sessions::clear_cookie_headers(state, request.headers()) {
            response.headers_mut().append(axum::http::header::SET_COOKIE, value);
        }
        return Err(response);
    };
    if !matches!(*request.method(), Method::GET | Method::HEAD | Method::OPTIONS) {
        same_origin(request.headers()).map_err(IntoResponse::into_response)?;
        request = check_csrf_token(request, &session.csrf_token).await.map_err(IntoResponse::into_response)?;
    }
    let via = Via::Session { id_sha256: session.id_sha256, csrf_token: session.csrf_token, expires_at: session.expires_at };
    request.extensions_mut().insert(Principal::User { user: session.user, via });
    Ok(request)
}

/// The principal a bearer token stands for.
pub async fn bearer(state: &AppState, token: &str) -> Result<Principal, ApiError> {
    if state.admin_tokens.read().expect("admin token lock").contains(&sha256_hex(token.as_bytes())) {
        return Ok(Principal::Admin);
    }
    if token.starts_with(super::deploy_tokens::PREFIX) {
        return super::deploy_tokens::authenticate(state, token)
            .await?
            .ok_or_else(|| ApiError::Unauthorized("invalid, expired or revoked deploy token".to_string()));
    }
    match tokens::authenticate(state, token).await? {
        Some((row, user)) => {
            let scope = super::TokenScope { role: row.role.as_deref().and_then(crate::access::Role::parse), apps: row.apps.clone() };
            Ok(Principal::User { user, via: Via::Token { id: row.id, scope } })
        }
        None => Err(ApiError::Unauthorized("invalid, expired or revoked API token".to_string())),
    }
}

/// Refuses a request a browser says came from another site or origin.
pub fn same_origin(headers: &HeaderMap) -> Result<(), ApiError> {
    if let Some(site) = headers.get("sec-fetch-site") {
        if !matches!(site.to_str().unwrap_or(""), "same-origin" | "none") {
            return Err(ApiError::Forbidden("cross-site request refused".to_string()));
        }
    }
    if let Some(origin) = headers.get(ORIGIN) {
        let host = headers.get(HOST).and_then(|h| h.to_str().ok()).unwrap_or("");
        let origin_host = origin.to_str().ok().and_then(|o| o.strip_prefix("https://").or_else(|| o.strip_prefix("http://")));
        if host.is_empty() || !origin_host.is_some_and(|o| o.eq_ignore_ascii_case(host)) {
            return Err(ApiError::Forbidden("request from another origin refused".to_string()));
        }
    }
    Ok(())
}

/// Passes the request on when it carries the session's CSRF token.
async fn check_csrf_token(request: Request, expected: &str) -> Result<Request, ApiError> {
    let missing = || ApiError::Forbidden(format!("missing or wrong CSRF token: send the session's token in {}", sessions::CSRF_HEADER));
    if let Some(sent) = request.headers().get(sessions::CSRF_HEADER) {
        return if super::constant_time_eq(sent.as_bytes(), expected.as_bytes()) { Ok(request) } else { Err(missing()) };
    }
    let is_form = request
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(';').next().unwrap_or("").trim().eq_ignore_ascii_case("application/x-www-form-urlencoded"));
    if !is_form {
        return Err(missing());
    }
    let (parts, body) = request.into_parts();
    let bytes = axum::body::to_bytes(body, crate::error::MAX_BODY_BYTES)
        .await
        .map_err(|_| ApiError::TooLarge("request body is larger than 1 MiB".to_string()))?;
    let sent = url::form_urlencoded::parse(&bytes).find(|(k, _)| k == sessions::CSRF_FIELD).map(|(_, v)| v.into_owned());
    match sent {
        Some(sent) if super::constant_time_eq(sent.as_bytes(), expected.as_bytes()) => Ok(Request::from_parts(parts, Body::from(bytes))),
        _ => Err(missing()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_static(v));
        }
        h
    }

    #[test]
    fn origins() {
        assert!(same_origin(&headers(&[("host", "cp.example.com")])).is_ok());
        assert!(same_origin(&headers(&[("host", "cp.example.com"), ("origin", "https://cp.example.com")])).is_ok());
        assert!(same_origin(&headers(&[("host", "cp.example.com"), ("origin", "https://evil.example.com")])).is_err());
        assert!(same_origin(&headers(&[("host", "cp.example.com"), ("origin", "null")])).is_err());
        assert!(same_origin(&headers(&[("host", "cp.example.com"), ("sec-fetch-site", "same-site")])).is_err());
        assert!(same_origin(&headers(&[("host", "cp.example.com"), ("sec-fetch-site", "same-origin")])).is_ok());
        assert!(same_origin(&headers(&[("host", "cp.example.com:8080"), ("origin", "http://cp.example.com")])).is_err());
    }
}
