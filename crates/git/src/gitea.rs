//! Gitea and Forgejo (self-hosted, by URL) through their API v1 and
//! OAuth 2 provider. Forgejo keeps Gitea's API, so one provider serves
//! both.
//!
//! A user logs in with OAuth 2 (authorization code with PKCE S256, at
//! `/login/oauth/authorize` and `/login/oauth/access_token`); the access
//! token that login gives acts for the apps made through that identity.
//! Gitea's access tokens live one hour (`ACCESS_TOKEN_EXPIRATION_TIME`)
//! and are refreshed from the refresh token, which Gitea rotates: that
//! hour-long token is also what a deploy clones with (Gitea takes an
//! OAuth access token as the password of git over HTTP, whatever the
//! user name), so a clone credential is never good for more than an hour.
//!
//! Each app gets its own push hook on its repository, signed with a
//! secret of its own (`X-Gitea-Signature`/`X-Forgejo-Signature`, the hex
//! HMAC-SHA256 of the body). Tokens travel only in the `Authorization`
//! header or a form body, never in a URL; answers are read with a size
//! cap and errors quote Gitea's message, never a token.

use reqwest::Method;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::provider::{parse_answer as parse, read_answer, transport, Branch, CloneCredentials, CommitState, CommitStatus, GitProvider, Project, ProviderError, Repo};

/// The name statuses are posted under (a Gitea status `context`).
pub const STATUS_CONTEXT: &str = "cloud-web";
/// The git user name a clone sends with the access token (Gitea reads
/// only the token).
pub const TOKEN_USER: &str = "oauth2";
/// Gitea answers at most this many items a page (`MAX_RESPONSE_ITEMS`).
const PAGE: usize = 50;
/// The most repositories listed at once.
const MAX_REPOSITORIES: usize = 100;

const NAME: &str = "Gitea";

/// A Gitea or Forgejo instance's URL (`https://git.example.com`),
/// normalised (see [`crate::provider::service_url`]).
pub fn base_url(text: &str, allow_http: bool) -> Result<String, String> {
    crate::provider::service_url("Gitea URL", text, allow_http)
}

/// A user, organization or repository name as Gitea allows them:
/// letters, digits, `-`, `_`, `.`.
pub fn valid_name(text: &str) -> bool {
    !text.is_empty() && text.len() <= 100 && text != "." && text != ".." && text.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
}

/// Checks an `owner/name` repository path.
pub fn repo_path(full_name: &str) -> Result<&str, ProviderError> {
    match full_name.split_once('/') {
        Some((owner, name)) if valid_name(owner) && valid_name(name) => Ok(full_name),
        _ => Err(ProviderError::Unsupported(format!("invalid Gitea repository {full_name:?}: owner/name"))),
    }
}

/// Tokens from `/login/oauth/access_token`.
pub use crate::provider::TokenAnswer;

/// The user behind a token (`/api/v1/user`).
#[derive(Debug, Clone, Deserialize)]
pub struct GiteaUser {
    pub id: i64,
    pub login: String,
    #[serde(default)]
    pub full_name: Option<String>,
    /// `false` for an account not activated yet.
    #[serde(default = "yes")]
    pub active: bool,
    /// Set by an administrator to keep the user out.
    #[serde(default)]
    pub prohibit_login: bool,
}

fn yes() -> bool {
    true
}

async fn token_call(http: &reqwest::Client, base: &str, what: &str, form: &[(&str, &str)]) -> Result<TokenAnswer, ProviderError> {
    let response = http.post(format!("{base}/login/oauth/access_token")).form(form).send().await.map_err(|e| transport(NAME, what, e))?;
    let (_, body) = read_answer(NAME, what, response).await?;
    parse(what, &body)
}

/// Trades an authorization code (with its PKCE verifier) for tokens.
pub async fn exchange_code(http: &reqwest::Client, base: &str, client_id: &str, client_secret: &str, code: &str, verifier: &str, redirect_uri: &str) -> Result<TokenAnswer, ProviderError> {
    let form = [
        ("grant_type", "authorization_code"),
        ("client_id", client_id),
        ("client_secret", client_secret),
        ("code", code),
        ("code_verifier", verifier),
        ("redirect_uri", redirect_uri),
    ];
    token_call(http, base, "the authorization code exchange", &form).await
}

/// Trades a refresh token for new tokens (Gitea rotates the refresh token).
pub async fn refresh(http: &reqwest::Client, base: &str, client_id: &str, client_secret: &str, refresh_token: &str) -> Result<TokenAnswer, ProviderError> {
    let form = [("grant_type", "refresh_token"), ("client_id", client_id), ("client_secret", client_secret), ("refresh_token", refresh_token)];
    token_call(http, base, "the token refresh", &form).await
}

fn project_from(value: &Value) -> Option<Project> {
    Some(Project {
        id: value.get("id")?.as_i64()?,
        path: value.get("full_name")?.as_str()?.to_string(),
        clone_url: value.get("clone_url")?.as_str()?.to_string(),
        default_branch: value.get("default_branch").and_then(Value::as_str).filter(|b| !b.is_empty()).map(str::to_string),
        web_url: value.get("html_url").and_then(Value::as_str).map(str::to_string),
    })
}

/// A commit state in Gitea's words (`pending`, `success`, `error`,
/// `failure`, `warning`): running is still pending, a cancelled
/// deployment an error.
pub fn gitea_state(state: CommitState) -> &'static str {
    match state {
        CommitState::Pending | CommitState::Running => "pending",
        CommitState::Success => "success",
        CommitState::Failed => "failure",
        CommitState::Canceled => "error",
    }
}

/// One Gitea or Forgejo instance, called with one user's access token.
pub struct Gitea {
    pub http: reqwest::Client,
    pub base: String,
    pub token: String,
}

impl Gitea {
    async fn call(&self, method: Method, path: &str, what: &str, body: Option<Value>) -> Result<bytes::Bytes, ProviderError> {
        let mut request = self.http.request(method, format!("{}/api/v1{path}", self.base)).bearer_auth(&self.token).header("accept", "application/json");
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.map_err(|e| transport(NAME, what, e))?;
        Ok(read_answer(NAME, what, response).await?.1)
    }

    pub async fn user(&self) -> Result<GiteaUser, ProviderError> {
        let what = "reading the user";
        parse(what, &self.call(Method::GET, "/user", what, None).await?)
    }

    /// The names of the organizations the user belongs to (at most 100).
    pub async fn org_names(&self) -> Result<Vec<String>, ProviderError> {
        let what = "listing the user's organizations";
        let mut names = Vec::new();
        for page in 1..=2 {
            let orgs: Vec<Value> = parse(what, &self.call(Method::GET, &format!("/user/orgs?limit={PAGE}&page={page}"), what, None).await?)?;
            let count = orgs.len();
            // `username` in every version; `name` alone in some.
            names.extend(orgs.iter().filter_map(|o| o.get("username").or_else(|| o.get("name")).and_then(Value::as_str).map(str::to_string)));
            if count < PAGE {
                break;
            }
        }
        Ok(names)
    }
}

impl GitProvider for Gitea {
    fn name(&self) -> &'static str {
        "gitea"
    }

    /// The repositories the user can reach (owned, as a collaborator or
    /// through an organization), at most 100, those whose `owner/name`
    /// contains `search` (any case) when given.
    async fn projects(&self, search: Option<&str>) -> Result<Vec<Project>, ProviderError> {
        let what = "listing repositories";
        let needle = search.map(str::to_ascii_lowercase).filter(|s| !s.is_empty());
        let mut projects = Vec::new();
        for page in 1..=(MAX_REPOSITORIES / PAGE) {
            let listed: Vec<Value> = parse(what, &self.call(Method::GET, &format!("/user/repos?limit={PAGE}&page={page}"), what, None).await?)?;
            let count = listed.len();
            projects.extend(listed.iter().filter_map(project_from).filter(|p| needle.as_ref().is_none_or(|n| p.path.to_ascii_lowercase().contains(n))));
            if count < PAGE {
                break;
            }
        }
        projects.truncate(MAX_REPOSITORIES);
        Ok(projects)
    }

    async fn project(&self, full_name: &str) -> Result<Project, ProviderError> {
        let what = "reading the repository";
        let path = repo_path(full_name)?;
        let value: Value = parse(what, &self.call(Method::GET, &format!("/repos/{path}"), what, None).await?)?;
        project_from(&value).ok_or_else(|| transport(NAME, what, "the repository has no id, full_name or clone_url"))
    }

    async fn branches(&self, repo: Repo<'_>) -> Result<Vec<Branch>, ProviderError> {
        let what = "listing branches";
        let path = repo_path(repo.path)?;
        let branches: Vec<Value> = parse(what, &self.call(Method::GET, &format!("/repos/{path}/branches?limit={PAGE}"), what, None).await?)?;
        Ok(crate::provider::branches_from(&branches, "id"))
    }

    /// A `gitea` hook on push events to `branch` and pull request events
    /// (for previews), JSON, signed with `secret`.
    async fn register_webhook(&self, repo: Repo<'_>, url: &str, secret: &str, branch: &str) -> Result<Option<i64>, ProviderError> {
        let what = "registering the webhook";
        let path = repo_path(repo.path)?;
        let body = json!({
            "type": "gitea",
            "config": {"url": url, "content_type": "json", "secret": secret},
            "events": ["push", "pull_request"],
            "branch_filter": branch,
            "active": true,
        });
        let value: Value = parse(what, &self.call(Method::POST, &format!("/repos/{path}/hooks"), what, Some(body)).await?)?;
        Ok(Some(value.get("id").and_then(Value::as_i64).ok_or_else(|| transport(NAME, what, "the answer has no hook id"))?))
    }

    async fn remove_webhook(&self, repo: Repo<'_>, hook_id: i64) -> Result<(), ProviderError> {
        let path = repo_path(repo.path)?;
        match self.call(Method::DELETE, &format!("/repos/{path}/hooks/{hook_id}"), "removing the webhook", None).await {
            // Already gone is what we wanted.
            Err(ProviderError::Status { status: 404, .. }) | Ok(_) => Ok(()),
            Err(err) => Err(err),
        }
    }

    /// The access token itself: it expires within the hour, and the
    /// caller hands out one with enough time left for a clone.
    async fn clone_credentials(&self, _repo: Repo<'_>, _deployment_id: &str) -> Result<Option<CloneCredentials>, ProviderError> {
        Ok(Some(CloneCredentials { username: TOKEN_USER.into(), password: self.token.clone(), revoke_id: None }))
    }

    async fn revoke_clone_credentials(&self, _repo: Repo<'_>, _credentials: &CloneCredentials) -> Result<(), ProviderError> {
        Ok(())
    }

    async fn post_status(&self, repo: Repo<'_>, status: &CommitStatus<'_>) -> Result<(), ProviderError> {
        let what = "posting the commit status";
        let path = repo_path(repo.path)?;
        let body = json!({
            "state": gitea_state(status.state),
            "context": STATUS_CONTEXT,
            "target_url": status.target_url,
            "description": status.description,
        });
        self.call(Method::POST, &format!("/repos/{path}/statuses/{}", status.sha), what, Some(body)).await?;
        Ok(())
    }

    async fn upsert_comment(&self, repo: Repo<'_>, number: i64, comment_id: Option<i64>, body: &str) -> Result<i64, ProviderError> {
        let path = repo_path(repo.path)?;
        if let Some(id) = comment_id {
            match self.call(Method::PATCH, &format!("/repos/{path}/issues/comments/{id}"), "updating the comment", Some(json!({"body": body}))).await {
                Ok(_) => return Ok(id),
                // Deleted by someone: write a new one.
                Err(ProviderError::Status { status: 404, .. }) => {}
                Err(err) => return Err(err),
            }
        }
        let answer = self.call(Method::POST, &format!("/repos/{path}/issues/{number}/comments"), "writing the comment", Some(json!({"body": body}))).await?;
        crate::provider::comment_id(NAME, &answer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_paths() {
        assert!(repo_path("acme/site").is_ok());
        assert!(repo_path("a.b-c_d/x").is_ok());
        for bad in ["acme", "acme/", "/site", "acme/si te", "../x", "acme/..", "a/b/c"] {
            assert!(repo_path(bad).is_err(), "{bad}");
        }
        assert_eq!(base_url("https://git.example.com/", false).unwrap(), "https://git.example.com");
        assert!(base_url("http://127.0.0.1:3000", false).is_err());
    }

    #[test]
    fn states_in_giteas_words() {
        assert_eq!(gitea_state(CommitState::Running), "pending");
        assert_eq!(gitea_state(CommitState::Failed), "failure");
        assert_eq!(gitea_state(CommitState::Canceled), "error");
    }

    #[test]
    fn a_user_is_active_unless_said() {
        let user: GiteaUser = serde_json::from_str(r#"{"id": 3, "login": "ann"}"#).unwrap();
        assert!(user.active && !user.prohibit_login);
    }
}
