//! GitLab and webhooks: `/api/gitlab/...`, the GitLab login's JSON answer
//! and the push webhooks' bodies and answers.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::accounts::UserView;

/// The GitLab connection as the API shows it (never the client secret).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct GitlabSettingsView {
    pub base_url: String,
    pub client_id: String,
    /// Always `true`: the secret itself never leaves the control plane.
    pub client_secret_set: bool,
    pub allowed_users: Vec<String>,
    pub allowed_groups: Vec<String>,
    /// What to register as the OAuth application's redirect URI.
    pub redirect_uri: String,
    pub login_url: String,
}

/// `PUT /api/gitlab/settings`.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"base_url": "https://gitlab.example.com", "client_id": "abc", "client_secret": "s3cret", "allowed_groups": ["acme"]}))]
pub struct GitlabSettingsInput {
    pub base_url: String,
    pub client_id: String,
    /// Required the first time; kept when absent later.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_secret: Option<String>,
    /// GitLab user names or ids allowed to log in.
    #[serde(default)]
    pub allowed_users: Vec<String>,
    /// GitLab group paths whose members may log in.
    #[serde(default)]
    pub allowed_groups: Vec<String>,
}

impl std::fmt::Debug for GitlabSettingsInput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GitlabSettingsInput")
            .field("base_url", &self.base_url)
            .field("client_id", &self.client_id)
            .field("client_secret", &self.client_secret.as_ref().map(|_| "<redacted>"))
            .field("allowed_users", &self.allowed_users)
            .field("allowed_groups", &self.allowed_groups)
            .finish()
    }
}

/// A GitLab identity that logged in (never a token).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct GitlabAccount {
    pub gitlab_user_id: i64,
    pub username: String,
    /// The local user's id it is linked to.
    pub linked_user: Option<String>,
    pub token_expires_at: Option<String>,
}

/// `GET /api/gitlab/accounts`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct GitlabAccountList {
    pub accounts: Vec<GitlabAccount>,
}

/// A project (repository) the user can deploy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Project {
    pub id: i64,
    /// `group/subgroup/name`.
    pub path: String,
    /// What git clones over HTTP(S).
    pub clone_url: String,
    pub default_branch: Option<String>,
    pub web_url: Option<String>,
}

/// `GET /api/gitlab/projects`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ProjectList {
    pub projects: Vec<Project>,
}

/// A branch and its head commit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Branch {
    pub name: String,
    pub commit: Option<String>,
}

/// `GET /api/gitlab/projects/{id}/branches`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct BranchList {
    pub branches: Vec<Branch>,
}

/// The GitLab user of a login.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct GitlabUserView {
    pub id: i64,
    pub username: String,
    pub name: Option<String>,
}

/// The answer of `GET /api/auth/gitlab/callback` to `Accept: application/json`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct GitlabLoginView {
    pub gitlab_user: GitlabUserView,
    /// The local user's id: linked only by the GitLab user id, never by email.
    pub linked_user: String,
    pub user: UserView,
    pub csrf_token: String,
    pub expires_at: String,
    pub idle_timeout_seconds: u64,
}

/// A push event as GitLab sends it: the fields the control plane reads
/// (any others are ignored). `X-Gitlab-Token` authenticates it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct GitlabPushEvent {
    /// `push` (anything else is ignored).
    pub object_kind: String,
    /// `refs/heads/<branch>`.
    #[serde(rename = "ref")]
    pub reference: String,
    /// The commit to deploy; `null` for a deleted branch.
    pub checkout_sha: Option<String>,
    pub project_id: Option<i64>,
}

/// The generic webhook's body, signed in `X-Cloudweb-Signature:
/// sha256=<hex HMAC-SHA256 of "<X-Cloudweb-Timestamp>.<raw body>">`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[schema(example = json!({"ref": "refs/heads/main", "after": "0123456789abcdef0123456789abcdef01234567"}))]
pub struct GenericPushEvent {
    /// `refs/heads/<branch>`.
    #[serde(rename = "ref")]
    pub reference: String,
    /// The full commit id to deploy (`commit` is accepted too).
    pub after: String,
}

/// A push the webhook did not act on (200).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct WebhookIgnored {
    /// Why: a tag push, another branch, `redelivery`, not a push.
    pub ignored: String,
    /// For a redelivery only: the deployment the first delivery queued
    /// (`null` if it queued none).
    #[serde(default, deserialize_with = "crate::present", skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>)]
    pub deployment: Option<Option<String>>,
}

/// A push that queued a deployment (202).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct WebhookQueued {
    pub deployment: String,
    pub commit: String,
    pub state: String,
}

/// What a push webhook answers: 202 with the deployment it queued, or 200
/// with why it did nothing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum WebhookAnswer {
    Queued(WebhookQueued),
    Ignored(WebhookIgnored),
}
