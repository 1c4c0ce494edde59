//! The `GitProvider` interface: what the control plane needs from a git
//! host, whatever it is. GitLab ([`crate::gitlab::GitLab`]) implements all
//! of it; the generic provider ([`crate::generic::Generic`]) is any git URL
//! with no API behind it, so it lists nothing, registers no hook (the user
//! points their host at the app's webhook URL) and posts no status.

use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

/// Largest answer read from a git host's API.
const MAX_ANSWER_BYTES: usize = 4 << 20;

pub(crate) fn transport(provider: &'static str, what: &str, err: impl std::fmt::Display) -> ProviderError {
    // reqwest's errors name the URL, which never holds a token here.
    ProviderError::Transport { provider, what: what.to_string(), message: err.to_string() }
}

/// Reads an answer with the size cap; a non-2xx status becomes an error
/// quoting the host's `message`/`error` field (never a token: those are
/// only ever sent, not echoed).
pub(crate) async fn read_answer(provider: &'static str, what: &str, response: reqwest::Response) -> Result<(reqwest::StatusCode, bytes::Bytes), ProviderError> {
    let status = response.status();
    if response.content_length().is_some_and(|len| len > MAX_ANSWER_BYTES as u64) {
        return Err(transport(provider, what, "the answer is too large"));
    }
    let body = response.bytes().await.map_err(|e| transport(provider, what, e))?;
    if body.len() > MAX_ANSWER_BYTES {
        return Err(transport(provider, what, "the answer is too large"));
    }
    if !status.is_success() {
        let parsed: Option<Value> = serde_json::from_slice(&body).ok();
        let mut message = parsed
            .as_ref()
            .and_then(|v| v.get("message").or_else(|| v.get("error_description")).or_else(|| v.get("error")))
            .map(|m| match m {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            })
            .unwrap_or_else(|| String::from_utf8_lossy(&body).chars().take(200).collect());
        cloudweb_protocol::misc::truncate_on_char(&mut message, 300);
        return Err(ProviderError::Status { provider, what: what.to_string(), status: status.as_u16(), message });
    }
    Ok((status, body))
}

/// Branches from a host's list: `name`, and the head commit's id under
/// `commit.<commit_field>`.
pub(crate) fn branches_from(list: &[Value], commit_field: &str) -> Vec<Branch> {
    list.iter()
        .filter_map(|b| {
            Some(Branch {
                name: b.get("name")?.as_str()?.to_string(),
                commit: b.get("commit").and_then(|c| c.get(commit_field)).and_then(Value::as_str).map(str::to_string),
            })
        })
        .collect()
}

pub(crate) fn parse_answer<T: DeserializeOwned>(what: &str, body: &[u8]) -> Result<T, ProviderError> {
    serde_json::from_slice(body).map_err(|e| ProviderError::Transport { provider: "git host", what: what.to_string(), message: format!("unexpected answer: {e}") })
}

/// A git host's URL (`https://gitlab.com`, `https://api.github.com`),
/// normalised with no trailing slash. Plain http only when private git
/// hosts are allowed (a self-hosted one on the local network, or a test
/// stand-in). `what` names it in errors.
pub fn service_url(what: &str, text: &str, allow_http: bool) -> Result<String, String> {
    let url = url::Url::parse(text.trim()).map_err(|e| format!("invalid {what} {text:?}: {e}"))?;
    match url.scheme() {
        "https" => {}
        "http" if allow_http => {}
        "http" => return Err(format!("the {what} must be https (plain http only with --allow-private-git-hosts)")),
        _ => return Err(format!("invalid {what} {text:?}: must start with https://")),
    }
    if url.host_str().is_none() || !url.username().is_empty() || url.password().is_some() || url.query().is_some() || url.fragment().is_some() {
        return Err(format!("invalid {what} {text:?}: must be https://host[:port][/path] with no credentials or query"));
    }
    Ok(url.as_str().trim_end_matches('/').to_string())
}

/// An OAuth 2 token endpoint's answer (RFC 6749, section 5.1).
#[derive(serde::Deserialize)]
pub struct TokenAnswer {
    pub access_token: String,
    #[serde(default)]
    pub refresh_token: Option<String>,
    /// Seconds.
    #[serde(default)]
    pub expires_in: Option<i64>,
}

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
    /// Set when the credentials were made for this deploy alone and are to
    /// be revoked when its build ends: what the provider needs besides the
    /// credentials themselves (GitLab's deploy token id; GitHub's
    /// installation id).
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

/// A repository as the control plane keeps it: the provider's numeric id
/// and its `owner/name` path. Each provider addresses it by the one its
/// API takes (GitLab the id, GitHub and Gitea the path).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Repo<'a> {
    pub id: i64,
    pub path: &'a str,
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
    async fn branches(&self, repo: Repo<'_>) -> Result<Vec<Branch>, ProviderError>;
    /// Registers a push webhook that calls `url` with `secret`; returns the
    /// hook's id at the provider, when it has one.
    async fn register_webhook(&self, repo: Repo<'_>, url: &str, secret: &str, branch: &str) -> Result<Option<i64>, ProviderError>;
    async fn remove_webhook(&self, repo: Repo<'_>, hook_id: i64) -> Result<(), ProviderError>;
    /// Credentials for one deploy's clone, valid for a short time; `None`
    /// when the provider has none to give (the app's own are used).
    async fn clone_credentials(&self, repo: Repo<'_>, deployment_id: &str) -> Result<Option<CloneCredentials>, ProviderError>;
    /// Revokes what [`GitProvider::clone_credentials`] made (only called
    /// when it set `revoke_id`).
    async fn revoke_clone_credentials(&self, repo: Repo<'_>, credentials: &CloneCredentials) -> Result<(), ProviderError>;
    async fn post_status(&self, repo: Repo<'_>, status: &CommitStatus<'_>) -> Result<(), ProviderError>;
    /// Writes `body` as the comment `comment_id` on pull (merge) request
    /// `number`, or as a new comment when there is none yet (or it was
    /// deleted); returns the comment's id, to update it the next time.
    async fn upsert_comment(&self, repo: Repo<'_>, number: i64, comment_id: Option<i64>, body: &str) -> Result<i64, ProviderError>;
}

/// The id in a created comment's answer.
pub(crate) fn comment_id(provider: &'static str, answer: &[u8]) -> Result<i64, ProviderError> {
    let value: Value = parse_answer("writing the comment", answer)?;
    value.get("id").and_then(Value::as_i64).ok_or_else(|| transport(provider, "writing the comment", "the answer has no comment id"))
}
