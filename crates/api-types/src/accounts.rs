//! Accounts: `POST/DELETE /api/session`, `GET /api/me`, personal API
//! tokens (`/api/tokens`) and users (`/api/users`).

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// A login, as JSON or as a form.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[schema(example = json!({"name": "alice", "password": "correct horse battery staple"}))]
pub struct LoginRequest {
    pub name: String,
    pub password: String,
    /// Forms only: where to send the browser after a successful login (a
    /// path on this host; default `/`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next: Option<String>,
}

/// A user who logs in with a name and password (or through GitLab).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct UserView {
    pub id: String,
    pub name: String,
    /// RFC 3339.
    pub created_at: String,
    /// Set once the user is disabled (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disabled_at: Option<String>,
    /// `cluster-admin`, `cluster-viewer`, or absent: only what the user's
    /// teams give.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_role: Option<String>,
}

/// A session just started (its id is only in the `cloudweb_session` cookie).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct SessionView {
    pub user: UserView,
    /// Send it in `X-CSRF-Token` with every state-changing request.
    pub csrf_token: String,
    /// The session's absolute end, RFC 3339.
    pub expires_at: String,
    /// The session also ends after this long without a request.
    pub idle_timeout_seconds: u64,
}

/// Who is calling.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[schema(example = json!({"auth": "admin_token"}))]
pub struct MeView {
    /// `admin_token`, `session`, `api_token` or `deploy_token`.
    pub auth: String,
    /// Absent for the admin token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<UserView>,
    /// Sessions only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub csrf_token: Option<String>,
    /// Sessions only: the absolute end, RFC 3339.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_expires_at: Option<String>,
    /// The caller's cluster role, if any (after its token's cap).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_role: Option<String>,
    /// The teams the caller is in, and its role in each (after its
    /// token's cap).
    #[serde(default)]
    pub teams: Vec<crate::teams::TeamRoleView>,
    /// A token held to some apps: those apps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub apps: Option<Vec<String>>,
}

/// `POST /api/tokens`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"name": "ci", "role": "deployer", "apps": ["web"], "expires_at": "2027-01-01T00:00:00Z"}))]
pub struct NewTokenRequest {
    pub name: String,
    /// The most the token may do: `viewer`, `deployer`, `admin`, `owner`
    /// (in the user's teams), `cluster-viewer` or `cluster-admin`; no
    /// higher than the user's own. Absent: all the user may.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    /// The only apps the token reaches. Absent: all the user reaches.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub apps: Option<Vec<String>>,
    /// When the token stops working (RFC 3339). Absent: never.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<String>,
}

/// A personal API token, without the token itself.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct TokenView {
    pub id: String,
    pub name: String,
    /// The token's first characters.
    pub prefix: String,
    pub created_at: String,
    /// To the minute; `null` if never used.
    pub last_used_at: Option<String>,
    pub revoked_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub apps: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<String>,
}

/// A token just created: the only time `token` is shown.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct CreatedTokenView {
    pub id: String,
    pub name: String,
    pub prefix: String,
    pub created_at: String,
    /// Use as `Authorization: Bearer <token>`. Shown only now.
    pub token: String,
}

/// `POST /api/users`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"name": "bob", "password": "a long enough password"}))]
pub struct NewUserRequest {
    /// 1 to 64 letters, digits, `.`, `_` or `-`; unique without regard to case.
    pub name: String,
    /// At least 10 characters; stored as an argon2id hash.
    pub password: String,
    /// `cluster-admin` or `cluster-viewer`; absent: the user may do only
    /// what their teams give them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_role: Option<String>,
}
