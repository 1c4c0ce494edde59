//! GitHub (github.com, or GitHub Enterprise Server by its API URL) as a
//! GitHub App, through the REST API v3.
//!
//! The App authenticates as itself with a JWT (RS256, signed with the
//! App's private key, valid for at most 10 minutes) and acts on a
//! repository with an **installation access token**: one hour, and for a
//! deploy's clone scoped to that one repository with `contents: read`
//! only. There is no webhook to register per repository: the App has one,
//! set in its settings, which GitHub calls for every repository the App is
//! installed on (`cloudweb_http::git::github_hooks` checks it).
//!
//! Tokens travel only in the `Authorization` header, never in a URL;
//! answers are read with a size cap and errors quote GitHub's message.

use std::sync::Arc;

use base64::Engine;
use reqwest::Method;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::provider::{parse_answer as parse, read_answer, transport, Branch, CloneCredentials, CommitState, CommitStatus, GitProvider, Project, ProviderError, Repo};

/// github.com's API.
pub const DEFAULT_API_URL: &str = "https://api.github.com";
/// The name statuses are posted under (a GitHub status `context`).
pub const STATUS_CONTEXT: &str = "cloud-web";
/// The git user name installation tokens clone as.
pub const TOKEN_USER: &str = "x-access-token";

const NAME: &str = "GitHub";

/// The GitHub API's URL, normalised (see [`crate::provider::service_url`]).
pub fn api_url(text: &str, allow_http: bool) -> Result<String, String> {
    crate::provider::service_url("GitHub API URL", text, allow_http)
}

/// The App's identity: its id and private key.
pub struct AppKey {
    pub app_id: i64,
    key: ring::signature::RsaKeyPair,
}

impl std::fmt::Debug for AppKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppKey").field("app_id", &self.app_id).field("key", &"<redacted>").finish()
    }
}

impl AppKey {
    /// Reads the private key GitHub hands out (PEM, `RSA PRIVATE KEY`,
    /// PKCS#1) or the same key as PKCS#8 (`PRIVATE KEY`). Errors never
    /// quote the key.
    pub fn from_pem(app_id: i64, pem: &str) -> Result<AppKey, String> {
        if app_id <= 0 {
            return Err("the GitHub App id must be a positive number".into());
        }
        let (label, der) = pem_block(pem).ok_or("the GitHub App private key is not a PEM block (-----BEGIN RSA PRIVATE KEY-----)")?;
        let key = match label.as_str() {
            "RSA PRIVATE KEY" => ring::signature::RsaKeyPair::from_der(&der),
            "PRIVATE KEY" => ring::signature::RsaKeyPair::from_pkcs8(&der),
            other => return Err(format!("the GitHub App private key is a {other:?} PEM block; GitHub's is an RSA PRIVATE KEY")),
        }
        .map_err(|e| format!("the GitHub App private key is not a usable RSA key: {e}"))?;
        Ok(AppKey { app_id, key })
    }

    /// The App's JWT at `now_s` (unix seconds): issued a minute back (for
    /// clock drift, as GitHub advises), expiring 9 minutes on.
    pub fn jwt(&self, now_s: i64) -> Result<String, String> {
        let b64 = |bytes: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes);
        let header = b64(br#"{"alg":"RS256","typ":"JWT"}"#);
        let claims = b64(json!({"iat": now_s - 60, "exp": now_s + 540, "iss": self.app_id.to_string()}).to_string().as_bytes());
        let message = format!("{header}.{claims}");
        let mut signature = vec![0u8; self.key.public().modulus_len()];
        self.key
            .sign(&ring::signature::RSA_PKCS1_SHA256, &ring::rand::SystemRandom::new(), message.as_bytes(), &mut signature)
            .map_err(|_| "cannot sign the GitHub App JWT".to_string())?;
        Ok(format!("{message}.{}", b64(&signature)))
    }
}

/// The label and contents of the first PEM block in `text`.
fn pem_block(text: &str) -> Option<(String, Vec<u8>)> {
    let start = text.find("-----BEGIN ")?;
    let rest = &text[start + 11..];
    let label_end = rest.find("-----")?;
    let label = rest[..label_end].to_string();
    let body_start = label_end + 5;
    let end_marker = format!("-----END {label}-----");
    let body_end = rest.find(&end_marker)?;
    let body: String = rest[body_start..body_end].chars().filter(|c| !c.is_whitespace()).collect();
    let der = base64::engine::general_purpose::STANDARD.decode(body).ok()?;
    Some((label, der))
}

/// Where the App is installed (a user or an organization).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Installation {
    pub id: i64,
    /// The account's login.
    pub account: String,
}

fn installation_from(value: &Value) -> Option<Installation> {
    Some(Installation {
        id: value.get("id")?.as_i64()?,
        account: value.get("account").and_then(|a| a.get("login")).and_then(Value::as_str).unwrap_or_default().to_string(),
    })
}

/// An installation access token.
#[derive(Clone, Deserialize)]
pub struct InstallationToken {
    pub token: String,
    /// RFC 3339.
    pub expires_at: String,
}

impl std::fmt::Debug for InstallationToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InstallationToken").field("token", &"<redacted>").field("expires_at", &self.expires_at).finish()
    }
}

impl InstallationToken {
    /// Its expiry in unix milliseconds (`None` when GitHub's text is not
    /// RFC 3339).
    pub fn expires_at_ms(&self) -> Option<i64> {
        time::OffsetDateTime::parse(&self.expires_at, &time::format_description::well_known::Rfc3339).ok().map(|t| (t.unix_timestamp_nanos() / 1_000_000) as i64)
    }
}

/// The App itself, calling with its JWT.
#[derive(Clone)]
pub struct GitHubApp {
    pub http: reqwest::Client,
    /// `https://api.github.com`, or `https://<host>/api/v3`.
    pub api: String,
    pub key: Arc<AppKey>,
}

fn headers(request: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
    request.header("accept", "application/vnd.github+json").header("x-github-api-version", "2022-11-28")
}

impl GitHubApp {
    async fn call(&self, method: Method, path: &str, what: &str, body: Option<Value>) -> Result<bytes::Bytes, ProviderError> {
        let now = time::OffsetDateTime::now_utc().unix_timestamp();
        let jwt = self.key.jwt(now).map_err(|e| transport(NAME, what, e))?;
        let mut request = headers(self.http.request(method, format!("{}{path}", self.api))).bearer_auth(jwt);
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.map_err(|e| transport(NAME, what, e))?;
        Ok(read_answer(NAME, what, response).await?.1)
    }

    /// Every installation of the App (at most 100).
    pub async fn installations(&self) -> Result<Vec<Installation>, ProviderError> {
        let what = "listing the App's installations";
        let body = self.call(Method::GET, "/app/installations?per_page=100", what, None).await?;
        let list: Vec<Value> = parse(what, &body)?;
        Ok(list.iter().filter_map(installation_from).collect())
    }

    /// The installation that covers `owner/name` (404 when the App is not
    /// installed on it).
    pub async fn repository_installation(&self, full_name: &str) -> Result<Installation, ProviderError> {
        let what = "finding the App's installation on the repository";
        let body = self.call(Method::GET, &format!("/repos/{}/installation", repo_path(full_name)?), what, None).await?;
        let value: Value = parse(what, &body)?;
        installation_from(&value).ok_or_else(|| transport(NAME, what, "the answer has no installation id"))
    }

    /// An installation access token; with `repository_ids`, for those
    /// repositories only; with `permissions`, those only.
    pub async fn installation_token(&self, installation: i64, repository_ids: &[i64], permissions: Option<Value>) -> Result<InstallationToken, ProviderError> {
        let what = "making an installation access token";
        let mut body = serde_json::Map::new();
        if !repository_ids.is_empty() {
            body.insert("repository_ids".into(), json!(repository_ids));
        }
        if let Some(permissions) = permissions {
            body.insert("permissions".into(), permissions);
        }
        let answer = self.call(Method::POST, &format!("/app/installations/{installation}/access_tokens"), what, Some(Value::Object(body))).await?;
        parse(what, &answer)
    }
}

/// `owner/name`, checked: one slash, and only the characters GitHub allows
/// in logins and repository names, so it is safe in an API path.
pub fn repo_path(full_name: &str) -> Result<&str, ProviderError> {
    let valid = |part: &str| !part.is_empty() && part.len() <= 100 && part != "." && part != ".." && part.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
    match full_name.split_once('/') {
        Some((owner, name)) if valid(owner) && valid(name) => Ok(full_name),
        _ => Err(ProviderError::Unsupported(format!("invalid GitHub repository {full_name:?}: owner/name"))),
    }
}

fn project_from(value: &Value) -> Option<Project> {
    Some(Project {
        id: value.get("id")?.as_i64()?,
        path: value.get("full_name")?.as_str()?.to_string(),
        clone_url: value.get("clone_url")?.as_str()?.to_string(),
        default_branch: value.get("default_branch").and_then(Value::as_str).map(str::to_string),
        web_url: value.get("html_url").and_then(Value::as_str).map(str::to_string),
    })
}

/// GitHub's name for a commit state.
pub fn status_state(state: CommitState) -> &'static str {
    match state {
        CommitState::Pending | CommitState::Running => "pending",
        CommitState::Success => "success",
        CommitState::Failed => "failure",
        CommitState::Canceled => "error",
    }
}

/// One installation of the App, acting with an installation token.
pub struct GitHub {
    pub app: GitHubApp,
    pub installation: i64,
    /// An installation token (any repository of the installation) for the
    /// API calls; clones get their own, narrower one.
    pub token: String,
}

impl GitHub {
    async fn call(&self, method: Method, path: &str, what: &str, body: Option<Value>) -> Result<bytes::Bytes, ProviderError> {
        let mut request = headers(self.app.http.request(method, format!("{}{path}", self.app.api))).bearer_auth(&self.token);
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.map_err(|e| transport(NAME, what, e))?;
        Ok(read_answer(NAME, what, response).await?.1)
    }

    /// The login of the account with GitHub id `id` now (a login can be
    /// renamed, the id cannot), or `None` when no account has that id.
    pub async fn login_of(&self, id: i64) -> Result<Option<String>, ProviderError> {
        let what = "reading a user by id";
        match self.call(Method::GET, &format!("/user/{id}"), what, None).await {
            Ok(body) => match parse::<Value>(what, &body)?.get("login").and_then(Value::as_str) {
                Some(login) if crate::github_login::valid_name(login) => Ok(Some(login.to_string())),
                _ => Err(ProviderError::Transport { provider: NAME, what: what.to_string(), message: "the answer has no valid login".to_string() }),
            },
            Err(ProviderError::Status { status: 404, .. }) => Ok(None),
            Err(err) => Err(err),
        }
    }

    /// Whether `login` is an active member of `group`, an organization
    /// (`acme`) or a team (`acme/team-slug`), as this installation sees it
    /// (the App needs the organization permission "Members: read"):
    /// `None` when GitHub will not say (403).
    pub async fn member(&self, group: &str, login: &str) -> Result<Option<bool>, ProviderError> {
        let valid = |name: &str| crate::github_login::valid_name(name);
        let (path, what) = match group.split_once('/') {
            None if valid(group) && valid(login) => (format!("/orgs/{group}/members/{login}"), "checking an organization membership"),
            Some((org, team)) if valid(org) && valid(team) && valid(login) => {
                (format!("/orgs/{org}/teams/{team}/memberships/{login}"), "checking a team membership")
            }
            _ => return Ok(Some(false)),
        };
        match self.call(Method::GET, &path, what, None).await {
            // An organization answers 204; a team, its membership.
            Ok(body) if body.is_empty() => Ok(Some(true)),
            Ok(body) => Ok(Some(parse::<Value>(what, &body)?.get("state").and_then(Value::as_str) == Some("active"))),
            Err(ProviderError::Status { status: 404, .. }) => Ok(Some(false)),
            Err(ProviderError::Status { status: 403, .. }) => Ok(None),
            Err(err) => Err(err),
        }
    }
}

impl GitProvider for GitHub {
    fn name(&self) -> &'static str {
        "github"
    }

    /// The repositories the installation reaches (at most 100), matching
    /// `search` in their `owner/name` when given.
    async fn projects(&self, search: Option<&str>) -> Result<Vec<Project>, ProviderError> {
        let what = "listing the installation's repositories";
        let body = self.call(Method::GET, "/installation/repositories?per_page=100", what, None).await?;
        let value: Value = parse(what, &body)?;
        let list = value.get("repositories").and_then(Value::as_array).ok_or_else(|| transport(NAME, what, "the answer has no repositories"))?;
        let needle = search.map(str::to_ascii_lowercase).filter(|s| !s.is_empty());
        Ok(list.iter().filter_map(project_from).filter(|p| needle.as_ref().is_none_or(|n| p.path.to_ascii_lowercase().contains(n.as_str()))).collect())
    }

    async fn project(&self, full_name: &str) -> Result<Project, ProviderError> {
        let what = "reading the repository";
        let body = self.call(Method::GET, &format!("/repos/{}", repo_path(full_name)?), what, None).await?;
        let value: Value = parse(what, &body)?;
        project_from(&value).ok_or_else(|| transport(NAME, what, "the repository has no id, full_name or clone_url"))
    }

    async fn branches(&self, repo: Repo<'_>) -> Result<Vec<Branch>, ProviderError> {
        let what = "listing branches";
        let body = self.call(Method::GET, &format!("/repos/{}/branches?per_page=100", repo_path(repo.path)?), what, None).await?;
        let branches: Vec<Value> = parse(what, &body)?;
        Ok(crate::provider::branches_from(&branches, "sha"))
    }

    /// The App's own webhook covers every repository it is installed on.
    async fn register_webhook(&self, _repo: Repo<'_>, _url: &str, _secret: &str, _branch: &str) -> Result<Option<i64>, ProviderError> {
        Ok(None)
    }

    async fn remove_webhook(&self, _repo: Repo<'_>, _hook_id: i64) -> Result<(), ProviderError> {
        Ok(())
    }

    /// A token for this one repository, `contents: read` only, for one
    /// hour at most; revoked when the build ends.
    async fn clone_credentials(&self, repo: Repo<'_>, _deployment_id: &str) -> Result<Option<CloneCredentials>, ProviderError> {
        let token = self.app.installation_token(self.installation, &[repo.id], Some(json!({"contents": "read"}))).await?;
        Ok(Some(CloneCredentials { username: TOKEN_USER.into(), password: token.token, revoke_id: Some(self.installation) }))
    }

    /// `DELETE /installation/token`, authenticated with the token itself.
    async fn revoke_clone_credentials(&self, _repo: Repo<'_>, credentials: &CloneCredentials) -> Result<(), ProviderError> {
        let what = "revoking the clone token";
        let request = headers(self.app.http.request(Method::DELETE, format!("{}/installation/token", self.app.api))).bearer_auth(&credentials.password);
        let response = request.send().await.map_err(|e| transport(NAME, what, e))?;
        match read_answer(NAME, what, response).await {
            // Expired or already revoked: what we wanted.
            Err(ProviderError::Status { status: 401, .. }) | Ok(_) => Ok(()),
            Err(err) => Err(err),
        }
    }

    async fn post_status(&self, repo: Repo<'_>, status: &CommitStatus<'_>) -> Result<(), ProviderError> {
        let body = json!({
            "state": status_state(status.state),
            "target_url": status.target_url,
            "description": status.description.chars().take(140).collect::<String>(),
            "context": STATUS_CONTEXT,
        });
        self.call(Method::POST, &format!("/repos/{}/statuses/{}", repo_path(repo.path)?, status.sha), "posting the commit status", Some(body)).await?;
        Ok(())
    }

    /// An issue comment on the pull request (`issues: write` or
    /// `pull_requests: write`).
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
    fn repository_paths_are_checked() {
        assert!(repo_path("acme/web").is_ok());
        assert!(repo_path("acme-co/web.site_2").is_ok());
        for bad in ["acme", "acme/web/x", "/web", "acme/", "../x", "acme/..", "acme/w?x", "acme/w%2f", "a b/c"] {
            assert!(repo_path(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn states_map_to_githubs() {
        assert_eq!(status_state(CommitState::Running), "pending");
        assert_eq!(status_state(CommitState::Failed), "failure");
        assert_eq!(status_state(CommitState::Canceled), "error");
    }

    #[test]
    fn a_key_that_is_not_pem_is_refused_without_quoting_it() {
        let err = AppKey::from_pem(1, "not-a-key-sekrit").unwrap_err();
        assert!(!err.contains("sekrit"), "{err}");
        assert!(AppKey::from_pem(0, "x").is_err());
        let err = AppKey::from_pem(1, "-----BEGIN RSA PRIVATE KEY-----\nAAAA\n-----END RSA PRIVATE KEY-----\n").unwrap_err();
        assert!(err.contains("not a usable RSA key"), "{err}");
    }

    #[test]
    fn pem_blocks_are_read() {
        let (label, der) = pem_block("junk\n-----BEGIN PRIVATE KEY-----\nAAEC\nAw==\n-----END PRIVATE KEY-----\n").unwrap();
        assert_eq!(label, "PRIVATE KEY");
        assert_eq!(der, [0, 1, 2, 3]);
    }
}
