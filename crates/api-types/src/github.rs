//! GitHub as a GitHub App: `/api/github/...` and the App's webhook.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// `PUT /api/github/settings`: the GitHub App this control plane is.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"app_id": 123456, "private_key": "-----BEGIN RSA PRIVATE KEY-----\n…", "webhook_secret": "a long random string"}))]
pub struct GithubSettingsInput {
    /// `https://api.github.com` (the default), or a GitHub Enterprise
    /// Server's `https://<host>/api/v3`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_url: Option<String>,
    /// The App's id (its settings page, "App ID").
    pub app_id: i64,
    /// The App's private key as GitHub gives it (PEM). Required the first
    /// time; kept when absent later.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub private_key: Option<String>,
    /// The App's webhook secret (at least 16 characters). Required the
    /// first time; kept when absent later.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub webhook_secret: Option<String>,
}

impl std::fmt::Debug for GithubSettingsInput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GithubSettingsInput")
            .field("api_url", &self.api_url)
            .field("app_id", &self.app_id)
            .field("private_key", &self.private_key.as_ref().map(|_| "<redacted>"))
            .field("webhook_secret", &self.webhook_secret.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

/// The GitHub App as the API shows it (never its key or secret).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct GithubSettingsView {
    pub api_url: String,
    pub app_id: i64,
    /// Always `true`: the key itself never leaves the control plane.
    pub private_key_set: bool,
    pub webhook_secret_set: bool,
    /// What to set as the App's webhook URL.
    pub webhook_url: String,
}

/// Where the App is installed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Installation {
    pub id: i64,
    /// The user's or organization's login.
    pub account: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct InstallationList {
    pub installations: Vec<Installation>,
}

/// A repository the App can deploy, with the installation that reaches it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Repository {
    pub id: i64,
    /// `owner/name`.
    pub full_name: String,
    pub clone_url: String,
    pub default_branch: Option<String>,
    pub html_url: Option<String>,
    pub installation: i64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct RepositoryList {
    pub repositories: Vec<Repository>,
}

/// `PUT /api/github/login`: logging in with GitHub through the App's OAuth
/// side (its "Client ID" and a client secret made on its settings page).
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"client_id": "Iv23liAbCdEf", "client_secret": "…", "allowed_orgs": ["acme"], "allowed_teams": ["acme/web"]}))]
pub struct GithubLoginInput {
    /// `https://github.com` (the default), or a GitHub Enterprise Server's
    /// `https://<host>`: where the authorize and token endpoints are.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub web_url: Option<String>,
    /// `https://api.github.com` (the default), or `https://<host>/api/v3`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_url: Option<String>,
    pub client_id: String,
    /// Required the first time; kept when absent later.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_secret: Option<String>,
    /// GitHub logins allowed to log in, or `id:<number>` for a user id (a
    /// bare number is a login).
    #[serde(default)]
    pub allowed_users: Vec<String>,
    /// Organizations whose active members may log in.
    #[serde(default)]
    pub allowed_orgs: Vec<String>,
    /// Teams (`org/team-slug`) whose active members may log in.
    #[serde(default)]
    pub allowed_teams: Vec<String>,
}

impl std::fmt::Debug for GithubLoginInput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GithubLoginInput")
            .field("web_url", &self.web_url)
            .field("api_url", &self.api_url)
            .field("client_id", &self.client_id)
            .field("client_secret", &self.client_secret.as_ref().map(|_| "<redacted>"))
            .field("allowed_users", &self.allowed_users)
            .field("allowed_orgs", &self.allowed_orgs)
            .field("allowed_teams", &self.allowed_teams)
            .finish()
    }
}

/// Logging in with GitHub as the API shows it (never the client secret).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct GithubLoginSettingsView {
    pub web_url: String,
    pub api_url: String,
    pub client_id: String,
    /// Always `true`: the secret itself never leaves the control plane.
    pub client_secret_set: bool,
    pub allowed_users: Vec<String>,
    pub allowed_orgs: Vec<String>,
    pub allowed_teams: Vec<String>,
    /// What to set as the App's "Callback URL".
    pub callback_url: String,
    pub login_url: String,
}

/// The GitHub user of a login.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct GithubUserView {
    pub id: i64,
    pub login: String,
    pub name: Option<String>,
}

/// The answer of `GET /api/auth/github/callback` to `Accept: application/json`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct GithubLoginView {
    pub github_user: GithubUserView,
    /// The local user's id: linked only by the GitHub user id, never by
    /// name or email.
    pub linked_user: String,
    pub user: crate::accounts::UserView,
    pub csrf_token: String,
    pub expires_at: String,
    pub idle_timeout_seconds: u64,
}
