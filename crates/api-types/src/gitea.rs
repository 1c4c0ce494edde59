//! Gitea and Forgejo: `/api/gitea/...`, the login, and each app's webhook.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// `PUT /api/gitea/settings`: the Gitea or Forgejo instance and the OAuth 2
/// application made on it for this control plane.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"base_url": "https://git.example.com", "client_id": "5c1e…", "client_secret": "gto_…", "allowed_orgs": ["acme"]}))]
pub struct GiteaSettingsInput {
    /// The instance's URL, `https://git.example.com` (with its path when
    /// it is served under one).
    pub base_url: String,
    /// The OAuth 2 application's "Client ID".
    pub client_id: String,
    /// Required the first time; kept when absent later.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_secret: Option<String>,
    /// User names allowed to log in, or `id:<number>` for a user id (a bare
    /// number is a name).
    #[serde(default)]
    pub allowed_users: Vec<String>,
    /// Organizations whose members may log in.
    #[serde(default)]
    pub allowed_orgs: Vec<String>,
}

impl std::fmt::Debug for GiteaSettingsInput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GiteaSettingsInput")
            .field("base_url", &self.base_url)
            .field("client_id", &self.client_id)
            .field("client_secret", &self.client_secret.as_ref().map(|_| "<redacted>"))
            .field("allowed_users", &self.allowed_users)
            .field("allowed_orgs", &self.allowed_orgs)
            .finish()
    }
}

/// The Gitea connection as the API shows it (never the client secret).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct GiteaSettingsView {
    pub base_url: String,
    pub client_id: String,
    /// Always `true`: the secret itself never leaves the control plane.
    pub client_secret_set: bool,
    pub allowed_users: Vec<String>,
    pub allowed_orgs: Vec<String>,
    /// What to give the OAuth 2 application as its "Redirect URI".
    pub redirect_uri: String,
    pub login_url: String,
}

/// A Gitea identity that logged in (never a token).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct GiteaAccount {
    pub gitea_user_id: i64,
    pub username: String,
    /// The local user's id it is linked to.
    pub linked_user: Option<String>,
    pub token_expires_at: Option<String>,
}

/// `GET /api/gitea/accounts`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct GiteaAccountList {
    pub accounts: Vec<GiteaAccount>,
}

/// The Gitea user of a login.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct GiteaUserView {
    pub id: i64,
    pub login: String,
    pub full_name: Option<String>,
}

/// The answer of `GET /api/auth/gitea/callback` to `Accept: application/json`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct GiteaLoginView {
    pub gitea_user: GiteaUserView,
    /// The local user's id: linked only by the Gitea user id, never by
    /// name or email.
    pub linked_user: String,
    pub user: crate::accounts::UserView,
    pub csrf_token: String,
    pub expires_at: String,
    pub idle_timeout_seconds: u64,
}
