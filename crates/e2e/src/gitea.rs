//! A Gitea stand-in for tests: a small HTTP server on loopback that speaks
//! the parts of Gitea (and Forgejo, which keeps its API) cloud-web uses, as
//! Gitea documents them: the OAuth 2 provider (`/login/oauth/authorize`
//! with PKCE S256, `/login/oauth/access_token` for codes and refresh
//! tokens, the refresh token rotated at each use), API v1 (`/user`,
//! `/user/orgs`, `/user/repos`, `/repos/{owner}/{repo}`, its branches,
//! hooks and commit statuses), and git over smart HTTP (`git
//! http-backend`) where the password must be a live access token of a user
//! who may read the repository: an expired token, or one of a user whose
//! access was taken away, is refused. It records what the control plane
//! sent, and delivers push events signed as Gitea signs them.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use axum::body::Bytes;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use hmac::Mac;
use serde_json::{json, Value};

use crate::gitlab::{json_response, query_map, random_token, s256};

pub const CLIENT_ID: &str = "0b6f3f1e-gitea-test-client";
pub const CLIENT_SECRET: &str = "gto_test_client_secret_7d2c";

#[derive(Debug, Clone)]
pub struct User {
    pub id: i64,
    pub login: String,
    pub orgs: Vec<String>,
    pub active: bool,
}

#[derive(Debug, Clone)]
pub struct Hook {
    pub id: i64,
    pub repository: String,
    pub url: String,
    pub secret: String,
    pub branch_filter: String,
    pub events: Vec<String>,
    pub removed: bool,
}

#[derive(Debug, Clone)]
pub struct Status {
    pub repository: String,
    pub sha: String,
    pub state: String,
    pub context: String,
    pub target_url: String,
}

#[derive(Debug, Clone)]
struct Repository {
    id: i64,
    path: String,
    /// Who may read it.
    readers: Vec<i64>,
}

struct Code {
    user: i64,
    challenge: String,
    redirect_uri: String,
}

struct Token {
    user: i64,
    expires: Instant,
}

#[derive(Default)]
struct Inner {
    users: Vec<User>,
    login_as: Option<i64>,
    repositories: Vec<Repository>,
    codes: HashMap<String, Code>,
    access: HashMap<String, Token>,
    refresh: HashMap<String, i64>,
    expires_in: u64,
    /// (grant type, outcome) of each token request.
    token_requests: Vec<(String, String)>,
    hooks: Vec<Hook>,
    statuses: Vec<Status>,
    /// The passwords git clones were let in with.
    git_clones: Vec<String>,
    /// Clones refused, and why.
    git_refusals: Vec<String>,
    api_down: bool,
    next_id: i64,
}

/// The running stand-in; stops when dropped.
pub struct FakeGitea {
    pub addr: SocketAddr,
    root: PathBuf,
    inner: Arc<Mutex<Inner>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FakeGitea {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The hex HMAC-SHA256 of `body`, as Gitea's `X-Gitea-Signature`.
pub fn signature(secret: &[u8], body: &[u8]) -> String {
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(secret).expect("any key length");
    mac.update(body);
    hex::encode(mac.finalize().into_bytes())
}

fn message(status: StatusCode, text: &str) -> Response {
    json_response(status, json!({"message": text, "url": "https://gitea.com/api/swagger"}))
}

impl FakeGitea {
    /// On plain http (the control plane and agents need
    /// `--allow-private-git-hosts`, as for any loopback git host).
    pub async fn start(root: &Path) -> Result<FakeGitea> {
        std::fs::create_dir_all(root.join("repos"))?;
        let inner = Arc::new(Mutex::new(Inner { expires_in: 3600, next_id: 200, ..Inner::default() }));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let shared = (inner.clone(), root.join("repos"));
        let app = axum::Router::new().fallback(move |method: Method, uri: Uri, headers: HeaderMap, body: Bytes| {
            let (inner, repos) = shared.clone();
            async move { handle(&inner, &repos, method, uri, headers, body).await }
        });
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(FakeGitea { addr, root: root.to_path_buf(), inner, task })
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn add_user(&self, id: i64, login: &str, orgs: &[&str]) {
        self.inner.lock().unwrap().users.push(User { id, login: login.into(), orgs: orgs.iter().map(|o| o.to_string()).collect(), active: true });
    }

    /// The user the authorize page logs in and approves as.
    /// Replaces user `id`'s organizations.
    pub fn set_orgs(&self, id: i64, orgs: &[&str]) {
        if let Some(user) = self.inner.lock().unwrap().users.iter_mut().find(|u| u.id == id) {
            user.orgs = orgs.iter().map(|o| o.to_string()).collect();
        }
    }

    pub fn login_as(&self, id: i64) {
        self.inner.lock().unwrap().login_as = Some(id);
    }

    /// Lifetime of access tokens handed out from now on.
    pub fn set_expires_in(&self, seconds: u64) {
        self.inner.lock().unwrap().expires_in = seconds;
    }

    /// Every API call answers 503 while down (OAuth and git still work).
    pub fn set_api_down(&self, down: bool) {
        self.inner.lock().unwrap().api_down = down;
    }

    /// Creates a repository with a bare git repository, readable by
    /// `readers`; returns its id.
    pub fn add_repository(&self, path: &str, readers: &[i64]) -> Result<i64> {
        crate::git_backend::init_bare(&self.root, path)?;
        let mut inner = self.inner.lock().unwrap();
        inner.next_id += 1;
        let id = inner.next_id;
        inner.repositories.push(Repository { id, path: path.into(), readers: readers.to_vec() });
        Ok(id)
    }

    /// Takes the repository away from a user (removed as collaborator).
    pub fn remove_reader(&self, path: &str, user: i64) {
        let mut inner = self.inner.lock().unwrap();
        if let Some(repository) = inner.repositories.iter_mut().find(|r| r.path == path) {
            repository.readers.retain(|r| *r != user);
        }
    }

    pub fn commit(&self, path: &str, branch: &str, files: &[(&str, &str)], message: &str) -> Result<String> {
        crate::git_backend::commit(&self.root, path, branch, files, message)
    }

    pub fn hooks(&self) -> Vec<Hook> {
        self.inner.lock().unwrap().hooks.clone()
    }

    pub fn statuses(&self, sha: &str) -> Vec<Status> {
        self.inner.lock().unwrap().statuses.iter().filter(|s| s.sha == sha).cloned().collect()
    }

    pub fn token_requests(&self) -> Vec<(String, String)> {
        self.inner.lock().unwrap().token_requests.clone()
    }

    pub fn git_clones(&self) -> Vec<String> {
        self.inner.lock().unwrap().git_clones.clone()
    }

    pub fn git_refusals(&self) -> Vec<String> {
        self.inner.lock().unwrap().git_refusals.clone()
    }

    /// Every access and refresh token handed out (to grep for them).
    pub fn tokens(&self) -> Vec<String> {
        let inner = self.inner.lock().unwrap();
        inner.access.keys().chain(inner.refresh.keys()).cloned().collect()
    }

    /// A push event as Gitea sends it (`modules/structs/hook.go`,
    /// `PushPayload`).
    pub fn push_body(&self, path: &str, reference: &str, before: &str, after: &str) -> Value {
        let id = self.inner.lock().unwrap().repositories.iter().find(|r| r.path == path).map(|r| r.id).unwrap_or(0);
        let (owner, name) = path.split_once('/').unwrap_or(("", path));
        json!({
            "ref": reference,
            "before": before,
            "after": after,
            "compare_url": format!("{}/{path}/compare/{before}...{after}", self.url()),
            "commits": [{"id": after, "message": "change\n", "url": format!("{}/{path}/commit/{after}", self.url())}],
            "total_commits": 1,
            "head_commit": {"id": after, "message": "change\n"},
            "repository": {
                "id": id, "name": name, "full_name": path, "owner": {"id": 1, "login": owner},
                "private": true, "html_url": format!("{}/{path}", self.url()), "clone_url": format!("{}/{path}.git", self.url()),
                "default_branch": "main",
            },
            "pusher": {"id": 1, "login": "ann"},
            "sender": {"id": 1, "login": "ann"},
        })
    }

    /// A `pull_request` event as Gitea sends it (GitHub's shape): request
    /// `number` against main, its head `head_ref` at `head_sha` in the
    /// same repository.
    pub fn pull_request_body(&self, path: &str, number: i64, action: &str, head_ref: &str, head_sha: &str) -> Value {
        let id = self.inner.lock().unwrap().repositories.iter().find(|r| r.path == path).map(|r| r.id).unwrap_or(0);
        let repo = json!({"id": id, "full_name": path, "clone_url": format!("{}/{path}.git", self.url())});
        json!({
            "action": action,
            "number": number,
            "pull_request": {
                "number": number,
                "state": if action == "closed" { "closed" } else { "open" },
                "head": {"ref": head_ref, "sha": head_sha, "repo_id": id, "repo": repo},
                "base": {"ref": "main", "repo_id": id, "repo": repo},
            },
            "repository": repo,
            "sender": {"id": 1, "login": "ann"},
        })
    }

    /// Delivers `body` to a hook URL as Gitea does (`X-Gitea-Event`,
    /// `X-Gitea-Delivery`, `X-Gitea-Signature`, and the GitHub-style
    /// headers Gitea also sends), or as Forgejo does (`X-Forgejo-*`)
    /// when `forgejo`; signed with `secret`.
    pub async fn deliver(&self, url: &str, event: &str, body: &Value, delivery: &str, secret: &str, forgejo: bool) -> Result<(u16, Value)> {
        let bytes = serde_json::to_vec(body)?;
        let hex = signature(secret.as_bytes(), &bytes);
        let prefix = if forgejo { "x-forgejo" } else { "x-gitea" };
        let response = reqwest::Client::new()
            .post(url)
            .header("content-type", "application/json")
            .header(format!("{prefix}-event"), event)
            .header(format!("{prefix}-delivery"), delivery)
            .header(format!("{prefix}-signature"), &hex)
            .header("x-github-event", event)
            .header("x-github-delivery", delivery)
            .header("x-hub-signature-256", format!("sha256={hex}"))
            .body(bytes)
            .send()
            .await?;
        let status = response.status().as_u16();
        let text = response.text().await?;
        Ok((status, serde_json::from_str(&text).unwrap_or(Value::String(text))))
    }

    /// The hook registered for `path`, live.
    pub fn live_hook(&self, path: &str) -> Result<Hook> {
        match self.hooks().into_iter().find(|h| h.repository == path && !h.removed) {
            Some(hook) => Ok(hook),
            None => bail!("{path} has no live hook"),
        }
    }
}

fn repository_json(base: &str, repository: &Repository) -> Value {
    let (owner, name) = repository.path.split_once('/').unwrap_or(("", &repository.path));
    json!({
        "id": repository.id, "name": name, "full_name": repository.path, "owner": {"login": owner},
        "clone_url": format!("{base}/{}.git", repository.path), "html_url": format!("{base}/{}", repository.path),
        "default_branch": "main", "private": true,
    })
}

/// The user of a live access token (`Authorization: Bearer` or `token`).
fn caller(inner: &Inner, headers: &HeaderMap) -> Option<User> {
    let value = headers.get("authorization")?.to_str().ok()?;
    let token = value.strip_prefix("Bearer ").or_else(|| value.strip_prefix("token "))?;
    let live = inner.access.get(token).filter(|t| t.expires > Instant::now())?;
    inner.users.iter().find(|u| u.id == live.user).cloned()
}

async fn handle(inner: &Mutex<Inner>, repos: &Path, method: Method, uri: Uri, headers: HeaderMap, body: Bytes) -> Response {
    let path = uri.path().to_string();
    let base = format!("http://{}", headers.get("host").and_then(|h| h.to_str().ok()).unwrap_or("127.0.0.1"));
    if path.contains(".git/") {
        return git_http(inner, repos, method, &uri, &headers, body).await;
    }
    if path == "/login/oauth/authorize" && method == Method::GET {
        let q = query_map(&uri);
        let mut inner = inner.lock().unwrap();
        if q.get("client_id").map(String::as_str) != Some(CLIENT_ID) || q.get("response_type").map(String::as_str) != Some("code") {
            return json_response(StatusCode::BAD_REQUEST, json!({"error": "unauthorized_client"}));
        }
        if q.get("code_challenge_method").map(String::as_str) != Some("S256") || q.get("code_challenge").is_none_or(|c| c.len() < 43) {
            return json_response(StatusCode::BAD_REQUEST, json!({"error": "invalid_request", "error_description": "PKCE S256 is required here"}));
        }
        let Some(user) = inner.login_as else {
            return message(StatusCode::UNAUTHORIZED, "not signed in");
        };
        let code = random_token("gitea-code-");
        let redirect = q.get("redirect_uri").cloned().unwrap_or_default();
        inner.codes.insert(code.clone(), Code { user, challenge: q["code_challenge"].clone(), redirect_uri: redirect.clone() });
        let Ok(mut target) = url::Url::parse(&redirect) else {
            return json_response(StatusCode::BAD_REQUEST, json!({"error": "invalid_request"}));
        };
        target.query_pairs_mut().append_pair("code", &code).append_pair("state", q.get("state").map(String::as_str).unwrap_or(""));
        return (StatusCode::FOUND, [("location", target.to_string())]).into_response();
    }
    if path == "/login/oauth/access_token" && method == Method::POST {
        let form: HashMap<String, String> = url::form_urlencoded::parse(&body).into_owned().collect();
        let mut inner = inner.lock().unwrap();
        let grant = form.get("grant_type").cloned().unwrap_or_default();
        let user = if form.get("client_id").map(String::as_str) != Some(CLIENT_ID) || form.get("client_secret").map(String::as_str) != Some(CLIENT_SECRET) {
            Err("invalid_client")
        } else if grant == "authorization_code" {
            match form.get("code").and_then(|c| inner.codes.remove(c)) {
                None => Err("invalid_grant"),
                Some(code) if form.get("redirect_uri") != Some(&code.redirect_uri) => Err("invalid_grant"),
                Some(code) if form.get("code_verifier").map(|v| s256(v)).as_ref() != Some(&code.challenge) => Err("invalid_grant"),
                Some(code) => Ok(code.user),
            }
        } else if grant == "refresh_token" {
            // Rotated: a refresh token works once.
            form.get("refresh_token").and_then(|r| inner.refresh.remove(r)).ok_or("invalid_grant")
        } else {
            Err("unsupported_grant_type")
        };
        let (outcome, answer) = match user {
            Err(error) => (error.to_string(), json_response(StatusCode::BAD_REQUEST, json!({"error": error, "error_description": "the grant is invalid"}))),
            Ok(user) => {
                let access = random_token("gta_");
                let refresh = random_token("gtr_");
                let lifetime = inner.expires_in;
                inner.access.insert(access.clone(), Token { user, expires: Instant::now() + Duration::from_secs(lifetime) });
                inner.refresh.insert(refresh.clone(), user);
                ("ok".to_string(), json_response(StatusCode::OK, json!({"access_token": access, "token_type": "bearer", "expires_in": lifetime, "refresh_token": refresh})))
            }
        };
        inner.token_requests.push((grant, outcome));
        return answer;
    }
    let Some(api) = path.strip_prefix("/api/v1") else {
        return message(StatusCode::NOT_FOUND, "not found");
    };
    let mut inner = inner.lock().unwrap();
    if inner.api_down {
        return message(StatusCode::SERVICE_UNAVAILABLE, "the stand-in is down");
    }
    let Some(user) = caller(&inner, &headers) else {
        return message(StatusCode::UNAUTHORIZED, "token is required");
    };
    let segments: Vec<&str> = api.trim_start_matches('/').split('/').collect();
    let request: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let readable = |inner: &Inner, owner: &str, name: &str| inner.repositories.iter().find(|r| r.path == format!("{owner}/{name}") && r.readers.contains(&user.id)).cloned();
    match (method.clone(), segments.as_slice()) {
        (Method::GET, ["user"]) => json_response(
            StatusCode::OK,
            json!({"id": user.id, "login": user.login, "full_name": "", "email": format!("{}@gitea.test", user.login), "active": user.active, "prohibit_login": false}),
        ),
        (Method::GET, ["user", "orgs"]) => json_response(StatusCode::OK, Value::Array(user.orgs.iter().map(|o| json!({"id": 1, "name": o, "username": o})).collect())),
        (Method::GET, ["user", "repos"]) => {
            let q = query_map(&uri);
            let limit: usize = q.get("limit").and_then(|l| l.parse().ok()).unwrap_or(30).min(50);
            let page: usize = q.get("page").and_then(|p| p.parse().ok()).unwrap_or(1).max(1);
            let list: Vec<Value> =
                inner.repositories.iter().filter(|r| r.readers.contains(&user.id)).skip((page - 1) * limit).take(limit).map(|r| repository_json(&base, r)).collect();
            json_response(StatusCode::OK, Value::Array(list))
        }
        (Method::GET, ["repos", owner, name]) => match readable(&inner, owner, name) {
            Some(r) => json_response(StatusCode::OK, repository_json(&base, &r)),
            None => message(StatusCode::NOT_FOUND, "The target couldn't be found."),
        },
        (Method::GET, ["repos", owner, name, "branches"]) => {
            let Some(repository) = readable(&inner, owner, name) else { return message(StatusCode::NOT_FOUND, "The target couldn't be found.") };
            let bare = repos.join(format!("{}.git", repository.path));
            let refs = crate::run_command(crate::git_command().arg("--git-dir").arg(&bare).args(["for-each-ref", "--format=%(refname:short) %(objectname)", "refs/heads"])).unwrap_or_default();
            let list: Vec<Value> = refs.lines().filter_map(|l| l.split_once(' ')).map(|(name, id)| json!({"name": name, "commit": {"id": id}})).collect();
            json_response(StatusCode::OK, Value::Array(list))
        }
        (Method::POST, ["repos", owner, name, "hooks"]) => {
            let Some(repository) = readable(&inner, owner, name) else { return message(StatusCode::NOT_FOUND, "The target couldn't be found.") };
            if request["type"] != "gitea" || request["config"]["content_type"] != "json" || request["config"]["url"].as_str().is_none() {
                return message(StatusCode::UNPROCESSABLE_ENTITY, "type, config.url and config.content_type are required");
            }
            inner.next_id += 1;
            let hook = Hook {
                id: inner.next_id,
                repository: repository.path.clone(),
                url: request["config"]["url"].as_str().unwrap_or_default().into(),
                secret: request["config"]["secret"].as_str().unwrap_or_default().into(),
                branch_filter: request["branch_filter"].as_str().unwrap_or("*").into(),
                events: request["events"].as_array().map(|e| e.iter().filter_map(|v| v.as_str().map(str::to_string)).collect()).unwrap_or_default(),
                removed: false,
            };
            inner.hooks.push(hook.clone());
            json_response(StatusCode::CREATED, json!({"id": hook.id, "type": "gitea", "config": {"url": hook.url, "content_type": "json"}, "events": hook.events, "active": true}))
        }
        (Method::DELETE, ["repos", owner, name, "hooks", id]) => {
            let path = format!("{owner}/{name}");
            match inner.hooks.iter_mut().find(|h| h.id.to_string() == *id && h.repository == path && !h.removed) {
                Some(hook) => {
                    hook.removed = true;
                    StatusCode::NO_CONTENT.into_response()
                }
                None => message(StatusCode::NOT_FOUND, "The target couldn't be found."),
            }
        }
        (Method::POST, ["repos", owner, name, "statuses", sha]) => {
            let Some(repository) = readable(&inner, owner, name) else { return message(StatusCode::NOT_FOUND, "The target couldn't be found.") };
            let state = request["state"].as_str().unwrap_or_default().to_string();
            if !["pending", "success", "error", "failure", "warning"].contains(&state.as_str()) {
                return message(StatusCode::UNPROCESSABLE_ENTITY, "state is not a commit status state");
            }
            inner.statuses.push(Status {
                repository: repository.path.clone(),
                sha: sha.to_string(),
                state: state.clone(),
                context: request["context"].as_str().unwrap_or_default().into(),
                target_url: request["target_url"].as_str().unwrap_or_default().into(),
            });
            json_response(StatusCode::CREATED, json!({"id": inner.statuses.len(), "status": state, "context": request["context"]}))
        }
        _ => message(StatusCode::NOT_FOUND, &format!("{method} {path} is not handled by the stand-in")),
    }
}

/// Git over smart HTTP after checking Basic credentials: the password a
/// live access token of a user who may read the repository (the user
/// name is not looked at, as Gitea does for OAuth tokens).
async fn git_http(inner: &Mutex<Inner>, repos: &Path, method: Method, uri: &Uri, headers: &HeaderMap, body: Bytes) -> Response {
    let path = uri.path();
    let repository_path = path[1..path.find(".git/").unwrap()].to_string();
    let credentials = crate::git_backend::basic_credentials(headers);
    let verdict = {
        let mut inner = inner.lock().unwrap();
        let repository = inner.repositories.iter().find(|r| r.path == repository_path).cloned();
        let verdict = match (&credentials, &repository) {
            (None, _) => Err("no credentials".to_string()),
            (_, None) => Err("no such repository".to_string()),
            (Some((_, password)), Some(repository)) => match inner.access.get(password) {
                None => Err("not a token".to_string()),
                Some(token) if token.expires <= Instant::now() => Err("expired token".to_string()),
                Some(token) if !repository.readers.contains(&token.user) => Err("no access to the repository".to_string()),
                Some(_) => Ok(password.clone()),
            },
        };
        match &verdict {
            Ok(password) => inner.git_clones.push(password.clone()),
            Err(why) => inner.git_refusals.push(why.clone()),
        }
        verdict
    };
    match verdict {
        Ok(_) => crate::git_backend::serve(repos, method, uri, headers, body, &credentials.map(|c| c.0).unwrap_or_default()).await,
        Err(_) => (StatusCode::UNAUTHORIZED, [("www-authenticate", "Basic realm=\"Gitea\"")], "Unauthorized\n").into_response(),
    }
}
