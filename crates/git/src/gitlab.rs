//! GitLab (gitlab.com or self-hosted) through its REST API v4 and its
//! OAuth 2 endpoints. Tokens travel only in the `Authorization` header or
//! a form body, never in a URL; answers are read with a size cap and
//! errors quote GitLab's message, never a token.

use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::provider::{Branch, CloneCredentials, CommitStatus, GitProvider, Project, ProviderError, Repo};

/// How long a deploy token made for one deploy lives.
pub const DEPLOY_TOKEN_TTL: time::Duration = time::Duration::hours(2);

/// The HTTP client every GitLab call uses: bounded time, no redirects
/// (a redirect would carry the token elsewhere), the system's CA roots
/// plus an optional extra CA for a self-hosted GitLab.
pub fn http_client(extra_ca: Option<&std::path::Path>) -> Result<reqwest::Client, String> {
    let mut builder = reqwest::Client::builder()
        .timeout(Duration::from_secs(20))
        .connect_timeout(Duration::from_secs(10))
        .redirect(reqwest::redirect::Policy::none())
        .user_agent(concat!("cloud-web/", env!("CARGO_PKG_VERSION")));
    let mut bundles = vec![std::path::PathBuf::from("/etc/ssl/certs/ca-certificates.crt")];
    if let Some(extra) = extra_ca {
        bundles.push(extra.to_path_buf());
    }
    for path in bundles {
        let Ok(pem) = std::fs::read(&path) else {
            if Some(path.as_path()) == extra_ca {
                return Err(format!("cannot read the GitLab CA file {}", path.display()));
            }
            continue;
        };
        let certificates = reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| format!("{}: {e}", path.display()))?;
        for certificate in certificates {
            builder = builder.add_root_certificate(certificate);
        }
    }
    builder.build().map_err(|e| format!("cannot build the GitLab HTTP client: {e}"))
}

/// A GitLab instance's base URL (`https://gitlab.com`), normalised with no
/// trailing slash. Plain http only when private git hosts are allowed
/// (a self-hosted GitLab on the local network, or a test stand-in).
pub fn base_url(text: &str, allow_http: bool) -> Result<String, String> {
    crate::provider::service_url("GitLab base URL", text, allow_http)
}

/// Tokens from GitLab's `/oauth/token`.
pub use crate::provider::TokenAnswer;

/// The user behind a token (`/api/v4/user`).
#[derive(Debug, Clone, Deserialize)]
pub struct GitlabUser {
    pub id: i64,
    pub username: String,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub email: Option<String>,
    /// Present for administrators' view only; `None` means GitLab did not
    /// say the email is confirmed.
    #[serde(default)]
    pub confirmed_at: Option<String>,
    #[serde(default)]
    pub state: Option<String>,
}

/// One GitLab instance, called with one user's access token.
pub struct GitLab {
    pub http: reqwest::Client,
    pub base: String,
    pub token: String,
}

fn transport(what: &str, err: impl std::fmt::Display) -> ProviderError {
    crate::provider::transport("GitLab", what, err)
}

async fn read(what: &str, response: reqwest::Response) -> Result<(StatusCode, bytes::Bytes), ProviderError> {
    crate::provider::read_answer("GitLab", what, response).await
}

use crate::provider::parse_answer as parse;

/// Exchanges an authorization code (with its PKCE verifier) for tokens.
pub async fn exchange_code(
    http: &reqwest::Client,
    base: &str,
    client_id: &str,
    client_secret: &str,
    code: &str,
    verifier: &str,
    redirect_uri: &str,
) -> Result<TokenAnswer, ProviderError> {
    let form = [
        ("grant_type", "authorization_code"),
        ("client_id", client_id),
        ("client_secret", client_secret),
        ("code", code),
        ("code_verifier", verifier),
        ("redirect_uri", redirect_uri),
    ];
    let what = "the authorization code exchange";
    let response = http.post(format!("{base}/oauth/token")).form(&form).send().await.map_err(|e| transport(what, e))?;
    let (_, body) = read(what, response).await?;
    parse(what, &body)
}

/// Trades a refresh token for new tokens (GitLab rotates the refresh token).
pub async fn refresh(http: &reqwest::Client, base: &str, client_id: &str, client_secret: &str, refresh_token: &str, redirect_uri: &str) -> Result<TokenAnswer, ProviderError> {
    let form = [
        ("grant_type", "refresh_token"),
        ("client_id", client_id),
        ("client_secret", client_secret),
        ("refresh_token", refresh_token),
        ("redirect_uri", redirect_uri),
    ];
    let what = "the token refresh";
    let response = http.post(format!("{base}/oauth/token")).form(&form).send().await.map_err(|e| transport(what, e))?;
    let (_, body) = read(what, response).await?;
    parse(what, &body)
}

fn project_from(value: &Value) -> Option<Project> {
    Some(Project {
        id: value.get("id")?.as_i64()?,
        path: value.get("path_with_namespace")?.as_str()?.to_string(),
        clone_url: value.get("http_url_to_repo")?.as_str()?.to_string(),
        default_branch: value.get("default_branch").and_then(Value::as_str).map(str::to_string),
        web_url: value.get("web_url").and_then(Value::as_str).map(str::to_string),
    })
}

/// `group/name` → `group%2Fname`, as GitLab wants a path in place of an id.
fn encode_path(path: &str) -> String {
    url::form_urlencoded::byte_serialize(path.as_bytes()).collect()
}

impl GitLab {
    async fn call(&self, method: Method, path: &str, what: &str, body: Option<Value>) -> Result<bytes::Bytes, ProviderError> {
        let mut request = self.http.request(method, format!("{}/api/v4{path}", self.base)).bearer_auth(&self.token);
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.map_err(|e| transport(what, e))?;
        Ok(read(what, response).await?.1)
    }

    pub async fn user(&self) -> Result<GitlabUser, ProviderError> {
        let body = self.call(Method::GET, "/user", "reading the user", None).await?;
        parse("reading the user", &body)
    }

    /// Full paths of the groups the user is a member of (at most 100).
    pub async fn group_paths(&self) -> Result<Vec<String>, ProviderError> {
        let what = "listing the user's groups";
        let body = self.call(Method::GET, "/groups?min_access_level=10&per_page=100", what, None).await?;
        let groups: Vec<Value> = parse(what, &body)?;
        Ok(groups.iter().filter_map(|g| g.get("full_path").and_then(Value::as_str).map(str::to_string)).collect())
    }
}

impl GitProvider for GitLab {
    fn name(&self) -> &'static str {
        "gitlab"
    }

    async fn projects(&self, search: Option<&str>) -> Result<Vec<Project>, ProviderError> {
        let what = "listing projects";
        let mut path = "/projects?membership=true&simple=true&per_page=100&order_by=last_activity_at".to_string();
        if let Some(search) = search.filter(|s| !s.is_empty()) {
            path.push_str("&search=");
            path.extend(url::form_urlencoded::byte_serialize(search.as_bytes()));
        }
        let body = self.call(Method::GET, &path, what, None).await?;
        let projects: Vec<Value> = parse(what, &body)?;
        Ok(projects.iter().filter_map(project_from).collect())
    }

    async fn project(&self, id_or_path: &str) -> Result<Project, ProviderError> {
        let what = "reading the project";
        let body = self.call(Method::GET, &format!("/projects/{}", encode_path(id_or_path)), what, None).await?;
        let value: Value = parse(what, &body)?;
        project_from(&value).ok_or_else(|| transport(what, "the project has no id, path or http_url_to_repo"))
    }

    async fn branches(&self, repo: Repo<'_>) -> Result<Vec<Branch>, ProviderError> {
        let what = "listing branches";
        let body = self.call(Method::GET, &format!("/projects/{}/repository/branches?per_page=100", repo.id), what, None).await?;
        let branches: Vec<Value> = parse(what, &body)?;
        Ok(crate::provider::branches_from(&branches, "id"))
    }

    async fn register_webhook(&self, repo: Repo<'_>, url: &str, secret: &str, branch: &str) -> Result<Option<i64>, ProviderError> {
        let what = "registering the webhook";
        let body = json!({
            "url": url,
            "token": secret,
            "push_events": true,
            "push_events_branch_filter": branch,
            "tag_push_events": false,
            // For preview environments (ignored while previews are off).
            "merge_requests_events": true,
            "enable_ssl_verification": url.starts_with("https://"),
        });
        let answer = self.call(Method::POST, &format!("/projects/{}/hooks", repo.id), what, Some(body)).await?;
        let value: Value = parse(what, &answer)?;
        Ok(Some(value.get("id").and_then(Value::as_i64).ok_or_else(|| transport(what, "the answer has no hook id"))?))
    }

    async fn remove_webhook(&self, repo: Repo<'_>, hook_id: i64) -> Result<(), ProviderError> {
        match self.call(Method::DELETE, &format!("/projects/{}/hooks/{hook_id}", repo.id), "removing the webhook", None).await {
            // Already gone is what we wanted.
            Err(ProviderError::Status { status: 404, .. }) | Ok(_) => Ok(()),
            Err(err) => Err(err),
        }
    }

    /// A project deploy token (`read_repository`, expiring in two hours)
    /// made for this deploy; when the user may not create one (deploy
    /// tokens need the Maintainer role) the OAuth access token itself,
    /// which GitLab accepts for git over HTTP as user `oauth2`.
    async fn clone_credentials(&self, repo: Repo<'_>, deployment_id: &str) -> Result<Option<CloneCredentials>, ProviderError> {
        let what = "creating a deploy token";
        let expires = (time::OffsetDateTime::now_utc() + DEPLOY_TOKEN_TTL)
            .format(&time::format_description::well_known::Rfc3339)
            .map_err(|e| transport(what, e))?;
        let body = json!({
            "name": format!("cloud-web {deployment_id}"),
            "scopes": ["read_repository"],
            "expires_at": expires,
        });
        match self.call(Method::POST, &format!("/projects/{}/deploy_tokens", repo.id), what, Some(body)).await {
            Ok(answer) => {
                let value: Value = parse(what, &answer)?;
                let field = |name: &str| value.get(name).and_then(Value::as_str).map(str::to_string);
                match (field("username"), field("token"), value.get("id").and_then(Value::as_i64)) {
                    (Some(username), Some(password), Some(id)) => Ok(Some(CloneCredentials { username, password, revoke_id: Some(id) })),
                    _ => Err(transport(what, "the answer lacks username, token or id")),
                }
            }
            Err(ProviderError::Status { status: 401 | 403 | 404, .. }) => {
                Ok(Some(CloneCredentials { username: "oauth2".into(), password: self.token.clone(), revoke_id: None }))
            }
            Err(err) => Err(err),
        }
    }

    async fn revoke_clone_credentials(&self, repo: Repo<'_>, credentials: &CloneCredentials) -> Result<(), ProviderError> {
        let Some(revoke_id) = credentials.revoke_id else { return Ok(()) };
        match self.call(Method::DELETE, &format!("/projects/{}/deploy_tokens/{revoke_id}", repo.id), "revoking the deploy token", None).await {
            Err(ProviderError::Status { status: 404, .. }) | Ok(_) => Ok(()),
            Err(err) => Err(err),
        }
    }

    async fn post_status(&self, repo: Repo<'_>, status: &CommitStatus<'_>) -> Result<(), ProviderError> {
        let body = json!({
            "state": status.state.as_str(),
            "ref": status.branch,
            "name": "cloud-web",
            "target_url": status.target_url,
            "description": status.description,
        });
        self.call(Method::POST, &format!("/projects/{}/statuses/{}", repo.id, status.sha), "posting the commit status", Some(body)).await?;
        Ok(())
    }

    /// A note on merge request `number` (its iid).
    async fn upsert_comment(&self, repo: Repo<'_>, number: i64, comment_id: Option<i64>, body: &str) -> Result<i64, ProviderError> {
        let notes = format!("/projects/{}/merge_requests/{number}/notes", repo.id);
        if let Some(id) = comment_id {
            match self.call(Method::PUT, &format!("{notes}/{id}"), "updating the comment", Some(json!({"body": body}))).await {
                Ok(_) => return Ok(id),
                Err(ProviderError::Status { status: 404, .. }) => {}
                Err(err) => return Err(err),
            }
        }
        let answer = self.call(Method::POST, &notes, "writing the comment", Some(json!({"body": body}))).await?;
        crate::provider::comment_id("GitLab", &answer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_urls() {
        assert_eq!(base_url("https://gitlab.com/", false).unwrap(), "https://gitlab.com");
        assert_eq!(base_url("https://git.example.com/gitlab", false).unwrap(), "https://git.example.com/gitlab");
        assert!(base_url("http://127.0.0.1:8080", false).is_err());
        assert_eq!(base_url("http://127.0.0.1:8080", true).unwrap(), "http://127.0.0.1:8080");
        for bad in ["ftp://x", "https://u:p@x", "https://x/?q=1", "gitlab.com", ""] {
            assert!(base_url(bad, true).is_err(), "{bad}");
        }
    }

    #[test]
    fn project_paths_are_encoded() {
        assert_eq!(encode_path("group/sub/name"), "group%2Fsub%2Fname");
        assert_eq!(encode_path("42"), "42");
    }

    #[test]
    fn clone_credentials_debug_hides_the_password() {
        let c = CloneCredentials { username: "u".into(), password: "glpat-secret".into(), revoke_id: None };
        assert!(!format!("{c:?}").contains("glpat-secret"));
    }
}
