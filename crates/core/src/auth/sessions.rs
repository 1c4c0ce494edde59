//! Browser sessions. The browser holds a random id (256 bits) in the
//! `cloudweb_session` cookie; the store holds only its SHA-256, so a copy
//! of the database opens no session. A session ends at logout (its row is
//! deleted), after [`AuthSettings::session_idle`](super::AuthSettings)
//! without a request, or [`session_absolute`](super::AuthSettings) after
//! login, whichever comes first; the check is made on the server's clock.
//!
//! Cookies are `HttpOnly; SameSite=Lax; Path=/` and `Secure`, except in
//! one case: the user API listens on a loopback address, the request names
//! a loopback host (`localhost`, `127.0.0.1`, `[::1]`) and carries no
//! proxy header (`Forwarded`, `X-Forwarded-*`). That is a browser on the
//! control plane's own machine speaking plain HTTP to it, where no network
//! carries the cookie and browsers would otherwise drop it. A TLS proxy in
//! front of the listener keeps `Secure` because it sends the public host
//! name or a forwarding header.
//!
//! Each session has a CSRF token (256 bits), returned by the login and
//! `GET /api/me` and also set in the `cloudweb_csrf` cookie (readable by
//! the dashboard's scripts, same flags otherwise); `cloudweb_http::auth::guard` wants
//! it back in `X-CSRF-Token` (or a form's `csrf_token` field) on every
//! state-changing request made with the session cookie.

use http::header::{HeaderMap, HeaderValue, COOKIE, FORWARDED, HOST};

use crate::ca::sha256_hex;
use crate::error::ApiError;
use crate::store::SessionRow;
use crate::AppState;

/// The session cookie.
pub const COOKIE_NAME: &str = "cloudweb_session";
/// The cookie holding the session's CSRF token, for the dashboard's scripts.
pub const CSRF_COOKIE_NAME: &str = "cloudweb_csrf";
/// The header that must carry the CSRF token.
pub const CSRF_HEADER: &str = "x-csrf-token";
/// The form field that may carry it instead (form posts).
pub const CSRF_FIELD: &str = "csrf_token";
const ID_PREFIX: &str = "cws_";
/// A session's idle clock moves at most this often (one write a minute
/// per active session, not one per request).
const TOUCH_GRANULARITY_MS: i64 = 60_000;

/// A session just started: what goes into the cookies and the answer.
#[derive(Debug, Clone)]
pub struct NewSession {
    /// The cookie value; shown to nobody but the browser.
    pub cookie_value: String,
    pub csrf_token: String,
    /// Absolute end, Unix ms.
    pub expires_at: i64,
}

/// Starts a session for `user_id` (after a password check, or a GitLab
/// login). Put [`set_cookie_headers`] on the answer.
pub async fn start(state: &AppState, user_id: &str) -> Result<NewSession, ApiError> {
    let user = state.store.user_by_id(user_id).await?.ok_or_else(|| ApiError::NotFound("no such user".to_string()))?;
    if user.disabled_at.is_some() {
        return Err(ApiError::Forbidden("this user is disabled".to_string()));
    }
    let now = state.clock.now_ms();
    let cookie_value = format!("{ID_PREFIX}{}", super::random_hex(32));
    let csrf_token = super::random_hex(32);
    let expires_at = now + state.config.auth.session_absolute.as_millis() as i64;
    let row = SessionRow {
        id_sha256: sha256_hex(cookie_value.as_bytes()),
        user,
        csrf_token: csrf_token.clone(),
        created_at: now,
        last_seen_at: now,
        expires_at,
    };
    state.store.insert_session(&row).await?;
    tracing::info!(user = %row.user.name, "session started");
    Ok(NewSession { cookie_value, csrf_token, expires_at })
}

/// The live session a cookie value names, its idle clock moved to now.
/// Expired sessions are deleted and give `None`.
pub async fn lookup(state: &AppState, cookie_value: &str) -> Result<Option<SessionRow>, ApiError> {
    if !is_well_formed(cookie_value) {
        return Ok(None);
    }
    let digest = sha256_hex(cookie_value.as_bytes());
    let Some(session) = state.store.session(&digest).await? else { return Ok(None) };
    let now = state.clock.now_ms();
    let idle_ms = state.config.auth.session_idle.as_millis() as i64;
    if now >= session.expires_at || now >= session.last_seen_at + idle_ms || session.user.disabled_at.is_some() {
        state.store.delete_session(&digest).await?;
        return Ok(None);
    }
    if now - session.last_seen_at >= TOUCH_GRANULARITY_MS {
        state.store.touch_session(&digest, now).await?;
    }
    Ok(Some(session))
}

/// Ends a session server-side (its cookie stops working at once).
pub async fn end(state: &AppState, id_sha256: &str) -> Result<(), ApiError> {
    state.store.delete_session(id_sha256).await?;
    Ok(())
}

/// Deletes sessions past their end (run now and then).
pub async fn prune(state: &AppState) -> Result<u64, ApiError> {
    let now = state.clock.now_ms();
    let idle_ms = state.config.auth.session_idle.as_millis() as i64;
    Ok(state.store.delete_expired_sessions(now, now - idle_ms).await?)
}

fn is_well_formed(value: &str) -> bool {
    value.strip_prefix(ID_PREFIX).is_some_and(|hex| hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// The value of cookie `name` in the request's `Cookie` headers.
pub fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(key, _)| *key == name)
        .map(|(_, value)| value.trim())
}

/// The session cookie's value, if the request has one.
pub fn session_cookie(headers: &HeaderMap) -> Option<&str> {
    cookie(headers, COOKIE_NAME)
}

/// Whether cookies set in answer to this request get `Secure` (see the
/// module documentation for the one exception).
pub fn cookie_secure(state: &AppState, headers: &HeaderMap) -> bool {
    if !state.config.api_listen.ip().is_loopback() {
        return true;
    }
    let proxied = headers.contains_key(FORWARDED) || headers.keys().any(|k| k.as_str().starts_with("x-forwarded-"));
    let host = headers.get(HOST).and_then(|h| h.to_str().ok()).unwrap_or("");
    proxied || !is_loopback_host(host)
}

/// `localhost`, `127.x.y.z` or `[::1]`, with or without a port.
fn is_loopback_host(host: &str) -> bool {
    let name = if let Some(rest) = host.strip_prefix('[') {
        rest.split(']').next().unwrap_or("")
    } else {
        host.rsplit_once(':').map_or(host, |(name, _)| name)
    };
    name.eq_ignore_ascii_case("localhost") || name.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

fn cookie_attributes(secure: bool, max_age_s: i64) -> String {
    format!("Path=/; Max-Age={max_age_s}; SameSite=Lax{}", if secure { "; Secure" } else { "" })
}

/// The two `Set-Cookie` values that give the browser a session.
pub fn set_cookie_headers(state: &AppState, request_headers: &HeaderMap, session: &NewSession) -> Vec<HeaderValue> {
    let secure = cookie_secure(state, request_headers);
    let max_age = ((session.expires_at - state.clock.now_ms()) / 1000).max(0);
    let attributes = cookie_attributes(secure, max_age);
    [
        format!("{COOKIE_NAME}={}; HttpOnly; {attributes}", session.cookie_value),
        format!("{CSRF_COOKIE_NAME}={}; {attributes}", session.csrf_token),
    ]
    .into_iter()
    .filter_map(|v| HeaderValue::from_str(&v).ok())
    .collect()
}

/// The `Set-Cookie` values that make the browser forget its session.
pub fn clear_cookie_headers(state: &AppState, request_headers: &HeaderMap) -> Vec<HeaderValue> {
    let attributes = cookie_attributes(cookie_secure(state, request_headers), 0);
    [format!("{COOKIE_NAME}=; HttpOnly; {attributes}"), format!("{CSRF_COOKIE_NAME}=; {attributes}")]
        .into_iter()
        .filter_map(|v| HeaderValue::from_str(&v).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_hosts() {
        for host in ["localhost", "LOCALHOST:8080", "127.0.0.1", "127.1.2.3:80", "[::1]", "[::1]:8080"] {
            assert!(is_loopback_host(host), "{host}");
        }
        for host in ["", "cp.example.com", "10.0.0.1:8080", "[2001:db8::1]:80", "localhost.example.com"] {
            assert!(!is_loopback_host(host), "{host}");
        }
    }

    #[test]
    fn cookies_are_found_among_others() {
        let mut headers = HeaderMap::new();
        headers.append(COOKIE, HeaderValue::from_static("a=1; cloudweb_session=cws_x"));
        headers.append(COOKIE, HeaderValue::from_static("cloudweb_csrf=abc"));
        assert_eq!(session_cookie(&headers), Some("cws_x"));
        assert_eq!(cookie(&headers, CSRF_COOKIE_NAME), Some("abc"));
        assert_eq!(cookie(&headers, "b"), None);
        assert!(!is_well_formed("cws_x"));
        assert!(is_well_formed(&format!("cws_{}", "a".repeat(64))));
    }
}
