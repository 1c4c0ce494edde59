//! The `GitProvider` interface: what the control plane needs from a git
//! host, whatever it is. GitLab ([`crate::gitlab::GitLab`]) implements all
//! of it; the generic provider ([`crate::generic::Generic`]) is any git URL
//! with no API behind it, so it lists nothing, registers no hook (the user
//! points their host at the app's webhook URL) and posts no status.

use serde::Serialize;

#[derive(Debug, thiserror::Error)]
pub enum ProviderError {
    /// The provider answered with an error status.
    #[error("{provider} answered {status} to {what}: {message}")]
    Status { provider: &'static str, what: String, status: u16, message: String },
    /// It could not be reached, or its answer made no sense.
    #[error("{provider}: {what} failed: {message}")]
    Transport { provider: &'static str, what: String, message: String },
    /// This provider cannot do that.
    #[error("{0}")]
    Unsupported(String),
    #[error("{0}")]
    NotConfigured(String),
}

/// A project (repository) the user can deploy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Project {
    pub id: i64,
    /// `group/subgroup/name`.
    pub path: String,
    /// What git clones over HTTP(S).
    pub clone_url: String,
    pub default_branch: Option<String>,
    pub web_url: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Branch {
    pub name: String,
    pub commit: Option<String>,
}

/// Credentials good for one deploy's clone.
#[derive(Clone, PartialEq, Eq)]
pub struct CloneCredentials {
    pub username: String,
    pub password: String,
    /// A token made for this deploy alone, to revoke when it ends.
    pub revoke_id: Option<i64>,
}

impl std::fmt::Debug for CloneCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CloneCredentials").field("username", &self.username).field("password", &"<redacted>").field("revoke_id", &self.revoke_id).finish()
    }
}

/// A commit status as the deployment moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CommitState {
    Pending,
    Running,
    Success,
    Failed,
    Canceled,
}

impl CommitState {
    pub fn as_str(self) -> &'static str {
        match self {
            CommitState::Pending => "pending",
            CommitState::Running => "running",
            CommitState::Success => "success",
            CommitState::Failed => "failed",
            CommitState::Canceled => "canceled",
        }
    }
}

#[derive(Debug, Clone)]
pub struct CommitStatus<'a> {
    pub sha: &'a str,
    pub branch: &'a str,
    pub state: CommitState,
    /// Where the deployment can be seen.
    pub target_url: &'a str,
    pub description: &'a str,
}

/// What the control plane asks of a git host.
#[allow(async_fn_in_trait)]
pub trait GitProvider {
    fn name(&self) -> &'static str;
    /// The user's projects (at most 100, optionally matching `search`).
    async fn projects(&self, search: Option<&str>) -> Result<Vec<Project>, ProviderError>;
    /// One project by id or `group/name` path.
    async fn project(&self, id_or_path: &str) -> Result<Project, ProviderError>;
    /// A project's branches (at most 100).
    async fn branches(&self, project: i64) -> Result<Vec<Branch>, ProviderError>;
    /// Registers a push webhook that calls `url` with `secret`; returns the
    /// hook's id at the provider, when it has one.
    async fn register_webhook(&self, project: i64, url: &str, secret: &str, branch: &str) -> Result<Option<i64>, ProviderError>;
    async fn remove_webhook(&self, project: i64, hook_id: i64) -> Result<(), ProviderError>;
    /// Credentials for one deploy's clone, valid for a short time; `None`
    /// when the provider has none to give (the app's own are used).
    async fn clone_credentials(&self, project: i64, deployment_id: &str) -> Result<Option<CloneCredentials>, ProviderError>;
    /// Revokes what [`GitProvider::clone_credentials`] made.
    async fn revoke_clone_credentials(&self, project: i64, revoke_id: i64) -> Result<(), ProviderError>;
    async fn post_status(&self, project: i64, status: &CommitStatus<'_>) -> Result<(), ProviderError>;
}
