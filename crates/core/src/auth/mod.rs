//! Accounts: who is calling the user API, and how they proved it.
//!
//! Three credentials open `/api/*`:
//! - the admin token (`Authorization: Bearer cwa_…`), the break-glass
//!   credential written to `<data-dir>/admin-token` at first start;
//! - a personal API token of a user (`Authorization: Bearer cwp_…`), for
//!   scripts and the CLI ([`tokens`]);
//! - a browser session cookie ([`sessions`]), which must also carry the
//!   session's CSRF token on every state-changing request ([`guard`]).
//!
//! Users ([`users`]) have argon2id password hashes; login attempts are
//! rate-limited per account and per address ([`limiter`]). The HTTP
//! handlers and the guard are `cloudweb_http::auth::{routes, guard}`. Secrets (passwords, session ids, tokens)
//! are never logged and never stored in clear: the store holds argon2id
//! hashes and SHA-256 digests.

pub mod deploy_tokens;
pub mod limiter;
pub mod sessions;
pub mod tokens;
pub mod users;

use std::time::Duration;

use rand::Rng;

use crate::store::UserRow;

/// Session and login settings.
#[derive(Debug, Clone)]
pub struct AuthSettings {
    /// A session unused for this long ends.
    pub session_idle: Duration,
    /// A session ends this long after login, used or not.
    pub session_absolute: Duration,
    pub login_limits: limiter::Limits,
    /// The audit log's retention and what a failed write does.
    pub audit: crate::audit_policy::AuditSettings,
    /// How often team memberships granted by login mappings are checked
    /// against the git host's groups between logins.
    pub mapping_check: Duration,
}

impl Default for AuthSettings {
    fn default() -> Self {
        AuthSettings {
            session_idle: Duration::from_secs(8 * 3600),
            session_absolute: Duration::from_secs(7 * 24 * 3600),
            login_limits: limiter::Limits::default(),
            audit: crate::audit_policy::AuditSettings::default(),
            mapping_check: Duration::from_secs(3600),
        }
    }
}

/// What the auth layer keeps in memory.
pub struct AuthState {
    pub limiter: limiter::LoginLimiter,
    /// Bounds the argon2 computations running at once (each takes 19 MiB
    /// and a core for a while).
    hashing: tokio::sync::Semaphore,
    /// The audit log's forwarder and anonymous-request budget.
    pub audit: crate::audit_policy::AuditRuntime,
}

impl AuthState {
    /// The login limiter keeps and stores `sealer`'s keyed digests of its
    /// keys, never the names people typed.
    pub fn new(settings: &AuthSettings, sealer: crate::secrets::Sealer) -> AuthState {
        let limiter = limiter::LoginLimiter::keyed(settings.login_limits.clone(), move |kind, key| {
            sealer.digest(&format!("login-attempts/{}", kind.as_str()), key.as_bytes())
        });
        AuthState { limiter, hashing: tokio::sync::Semaphore::new(2), audit: Default::default() }
    }
}

/// Who made a request, put into the request's extensions by [`guard`].
#[derive(Debug, Clone)]
pub enum Principal {
    /// The admin (break-glass) token.
    Admin,
    /// A user, by session or personal token.
    User { user: UserRow, via: Via },
    /// An app's deploy token (a CI system): deploys and reads that app.
    Deploy { token_id: String, app: String, team_id: String },
}

#[derive(Debug, Clone)]
pub enum Via {
    Session { id_sha256: String, csrf_token: String, expires_at: i64 },
    Token { id: String, scope: TokenScope },
}

/// What a personal token is held to (checked by `crate::access`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TokenScope {
    /// At most this role; `None`: all its user may.
    pub role: Option<crate::roles::Role>,
    /// Only these apps; `None`: all its user reaches.
    pub apps: Option<Vec<String>>,
}

impl Principal {
    /// The user behind the request; `None` for the admin token.
    pub fn user(&self) -> Option<&UserRow> {
        match self {
            Principal::Admin | Principal::Deploy { .. } => None,
            Principal::User { user, .. } => Some(user),
        }
    }
}

/// `bytes` random bytes as lowercase hex.
pub fn random_hex(bytes: usize) -> String {
    let mut buf = vec![0u8; bytes];
    rand::rng().fill(&mut buf[..]);
    hex::encode(buf)
}

/// Equality that takes the same time wherever the inputs differ.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}
