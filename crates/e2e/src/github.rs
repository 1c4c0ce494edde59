//! A GitHub stand-in for tests: a small HTTP server on loopback that
//! speaks the parts of GitHub's REST API v3 a GitHub App uses, as GitHub
//! documents them. The App authenticates with a JWT (RS256, checked
//! against the App's public key: issuer, expiry, at most 10 minutes)
//! for `/app/installations`, `/repos/{owner}/{repo}/installation` and
//! `/app/installations/{id}/access_tokens` (tokens that expire, narrowed
//! to repositories and permissions when asked); with an installation token
//! for `/installation/repositories`, `/repos/{owner}/{repo}`, its branches,
//! commit statuses (which need `statuses: write`) and `DELETE
//! /installation/token`. Git over smart HTTP (`git http-backend`) takes
//! `x-access-token:<token>` only while the token lives, is not revoked and
//! covers the repository. It records what the control plane sent, and
//! sends push events signed as GitHub signs them.
//!
//! Logging in (the App's OAuth web flow): `/login/oauth/authorize` logs in
//! as the user set with [`FakeGithub::login_as`] and sends the browser
//! back with a one-use code (ten minutes) bound to the client, the
//! redirect URI (which must be the App's registered callback URL) and the
//! PKCE S256 challenge; `/login/oauth/access_token` answers only
//! `Accept: application/json` in JSON (form encoding otherwise), a wrong
//! client secret, code, redirect URI or verifier with `200` and an
//! `error` field, as GitHub does, and a good one with a user token
//! (`ghu_…`); with that token, `/user`, `/user/memberships/orgs/{org}`
//! (404 for a non-member, 403 for an organization enforcing SAML SSO)
//! and `/orgs/{org}/teams/{team}/memberships/{login}` (404 for a
//! non-member, else the membership's state); `DELETE
//! /applications/{client_id}/token` (Basic client id and secret) revokes
//! a user token.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use anyhow::{bail, Context, Result};
use axum::body::Bytes;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use hmac::Mac;
use serde_json::{json, Value};

use crate::run_command;

pub const APP_ID: i64 = 424242;
pub const WEBHOOK_SECRET: &str = "github-app-webhook-secret-7d1e";

#[derive(Debug, Clone)]
pub struct Repository {
    pub id: i64,
    pub full_name: String,
    pub installation: i64,
}

#[derive(Debug, Clone)]
pub struct Token {
    pub token: String,
    pub installation: i64,
    /// `None`: every repository of the installation.
    pub repository_ids: Option<Vec<i64>>,
    pub permissions: Option<Value>,
    pub expires_at_s: i64,
    pub revoked: bool,
}

#[derive(Debug, Clone)]
pub struct Status {
    pub repository: String,
    pub sha: String,
    pub state: String,
    pub target_url: String,
    pub description: String,
    pub context: String,
}

/// A comment on a pull request: every text it had, oldest first.
#[derive(Debug, Clone)]
pub struct Comment {
    pub id: i64,
    pub repository: String,
    pub number: i64,
    pub bodies: Vec<String>,
}

/// A GitHub user who can log in.
#[derive(Debug, Clone)]
pub struct User {
    pub id: i64,
    pub login: String,
    /// Organization logins, with the membership's state (`active`,
    /// `pending`), or `sso`: an organization enforcing SAML SSO the user
    /// has not authorized this token for (GitHub answers 403).
    pub orgs: Vec<(String, String)>,
    /// `org/team-slug`, with the membership's state (`active`, `pending`).
    pub teams: Vec<(String, String)>,
}

struct Code {
    user: i64,
    client_id: String,
    redirect_uri: String,
    challenge: Option<String>,
    expires_at_s: i64,
}

#[derive(Default)]
struct Inner {
    /// The App's OAuth client id and secret.
    oauth_client: Option<(String, String)>,
    /// The App's registered callback URL: an authorize request's
    /// `redirect_uri` must start with it.
    callback_url: Option<String>,
    users: Vec<User>,
    logged_in: Option<i64>,
    codes: std::collections::HashMap<String, Code>,
    /// User tokens, to their user id.
    user_tokens: std::collections::HashMap<String, i64>,
    /// Each token request's outcome: `ok` or GitHub's error code.
    token_requests: Vec<String>,
    /// User tokens revoked through `DELETE /applications/{client_id}/token`.
    revoked_user_tokens: Vec<String>,
    installations: Vec<(i64, String)>,
    repositories: Vec<Repository>,
    tokens: Vec<Token>,
    statuses: Vec<Status>,
    /// The tokens git clones were made with.
    git_clones: Vec<String>,
    /// JWTs refused, with why.
    refused_jwts: Vec<String>,
    scoped_ttl_s: i64,
    /// While set, every API call answers 503 (git still serves).
    api_down: bool,
    /// Repositories anyone may clone (public forks).
    public: Vec<String>,
    comments: Vec<Comment>,
    next_id: i64,
    /// Installations without the organization permission "Members: read"
    /// (membership checks answer 403).
    no_members_read: Vec<i64>,
}

/// The running stand-in; stops when dropped.
pub struct FakeGithub {
    pub addr: SocketAddr,
    /// The App's private key as GitHub hands it out (PKCS#1 PEM).
    pub private_key_pem: String,
    root: PathBuf,
    inner: Arc<Mutex<Inner>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FakeGithub {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn now_s() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64
}

fn json_response(status: StatusCode, value: Value) -> Response {
    (status, axum::Json(value)).into_response()
}

fn message(status: StatusCode, text: &str) -> Response {
    json_response(status, json!({"message": text, "documentation_url": "https://docs.github.com/rest"}))
}

/// `sha256=<hex HMAC-SHA256>`, as GitHub signs deliveries.
pub fn signature(secret: &[u8], body: &[u8]) -> String {
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(secret).expect("any key length");
    mac.update(body);
    format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
}

impl FakeGithub {
    /// On plain http (the control plane and agents need
    /// `--allow-private-git-hosts`). Makes the App's RSA key with openssl.
    pub async fn start(root: &Path) -> Result<FakeGithub> {
        std::fs::create_dir_all(root.join("repos"))?;
        let key = root.join("app-key.pem");
        run_command(std::process::Command::new("openssl").args(["genrsa", "-traditional", "-out"]).arg(&key).arg("2048"))?;
        let public = root.join("app-key.pub.der");
        run_command(std::process::Command::new("openssl").arg("rsa").arg("-in").arg(&key).args(["-RSAPublicKey_out", "-outform", "DER", "-out"]).arg(&public))?;
        let private_key_pem = std::fs::read_to_string(&key)?;
        let public_der = std::fs::read(&public)?;
        let inner = Arc::new(Mutex::new(Inner { scoped_ttl_s: 3600, next_id: 9000, ..Inner::default() }));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let shared = (inner.clone(), root.join("repos"), Arc::new(public_der), format!("http://{addr}"));
        let app = axum::Router::new().fallback(move |method: Method, uri: Uri, headers: HeaderMap, body: Bytes| {
            let (inner, repos, public, base) = shared.clone();
            async move { handle(&inner, &repos, &public, &base, method, uri, headers, body).await }
        });
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(FakeGithub { addr, private_key_pem, root: root.to_path_buf(), inner, task })
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Installs the App on `account`; returns the installation id.
    pub fn install(&self, account: &str) -> i64 {
        let mut inner = self.inner.lock().unwrap();
        inner.next_id += 1;
        let id = inner.next_id;
        inner.installations.push((id, account.to_string()));
        id
    }

    /// Creates `owner/name` with a bare repository, reached by
    /// `installation`; returns its id.
    pub fn add_repository(&self, full_name: &str, installation: i64) -> Result<i64> {
        crate::git_backend::init_bare(&self.root, full_name)?;
        let mut inner = self.inner.lock().unwrap();
        inner.next_id += 1;
        let id = inner.next_id;
        inner.repositories.push(Repository { id, full_name: full_name.into(), installation });
        Ok(id)
    }

    /// Commits and pushes `files` on `branch`; returns the commit id.
    pub fn commit(&self, full_name: &str, branch: &str, files: &[(&str, &str)], message: &str) -> Result<String> {
        crate::git_backend::commit(&self.root, full_name, branch, files, message)
    }

    /// Lifetime of the repository-scoped tokens made from now on (as if
    /// the hour had passed while the build waited; others keep an hour).
    pub fn set_scoped_token_ttl(&self, seconds: i64) {
        self.inner.lock().unwrap().scoped_ttl_s = seconds;
    }

    /// Takes `owner/name` out of its installation (the owner removed the
    /// App's access to it).
    pub fn revoke_access(&self, full_name: &str) {
        for repo in self.inner.lock().unwrap().repositories.iter_mut().filter(|r| r.full_name == full_name) {
            repo.installation = -1;
        }
    }

    /// The comments written on pull requests.
    pub fn comments(&self) -> Vec<Comment> {
        self.inner.lock().unwrap().comments.clone()
    }

    /// Lets anyone clone `owner/name` with no credentials (a public
    /// fork, say).
    pub fn make_public(&self, full_name: &str) {
        self.inner.lock().unwrap().public.push(full_name.to_string());
    }

    /// A `pull_request` event as GitHub sends it to an App: request
    /// `number` against `main` of `base`, its head `head_ref` at
    /// `head_sha` in `head_repo` (another repository for a fork).
    pub fn pull_request_body(&self, base: &str, number: i64, action: &str, head_repo: &str, head_ref: &str, head_sha: &str) -> Value {
        let inner = self.inner.lock().unwrap();
        let repo = |name: &str| inner.repositories.iter().find(|r| r.full_name == name).cloned().expect("a repository of the stand-in");
        let (base_repo, head) = (repo(base), repo(head_repo));
        let repo_json = |r: &Repository| json!({"id": r.id, "full_name": r.full_name, "clone_url": format!("{}/{}.git", self.url(), r.full_name), "fork": r.full_name != base});
        json!({
            "action": action,
            "number": number,
            "pull_request": {
                "number": number,
                "state": if action == "closed" { "closed" } else { "open" },
                "merged": false,
                "head": {"ref": head_ref, "sha": head_sha, "repo": repo_json(&head)},
                "base": {"ref": "main", "sha": "0000000000000000000000000000000000000000", "repo": repo_json(&base_repo)},
            },
            "repository": {"id": base_repo.id, "full_name": base, "clone_url": format!("{}/{base}.git", self.url())},
            "sender": {"login": "octocat", "id": 1},
            "installation": {"id": base_repo.installation},
        })
    }

    /// Every API call answers 503 while `down` (git keeps serving).
    pub fn set_api_down(&self, down: bool) {
        self.inner.lock().unwrap().api_down = down;
    }

    /// The App's OAuth client id and secret, and its registered callback URL.
    pub fn set_oauth_client(&self, id: &str, secret: &str, callback_url: &str) {
        let mut inner = self.inner.lock().unwrap();
        inner.oauth_client = Some((id.into(), secret.into()));
        inner.callback_url = Some(callback_url.into());
    }

    pub fn add_user(&self, user: User) {
        self.inner.lock().unwrap().users.push(user);
    }

    /// Replaces user `id`'s organization and team memberships.
    pub fn set_memberships(&self, id: i64, orgs: &[(&str, &str)], teams: &[(&str, &str)]) {
        let pairs = |list: &[(&str, &str)]| list.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect();
        if let Some(user) = self.inner.lock().unwrap().users.iter_mut().find(|u| u.id == id) {
            user.orgs = pairs(orgs);
            user.teams = pairs(teams);
        }
    }

    /// Renames user `id` (GitHub keeps the id).
    pub fn rename_user(&self, id: i64, login: &str) {
        if let Some(user) = self.inner.lock().unwrap().users.iter_mut().find(|u| u.id == id) {
            user.login = login.to_string();
        }
    }

    /// Deletes user `id`'s account.
    pub fn remove_user(&self, id: i64) {
        self.inner.lock().unwrap().users.retain(|u| u.id != id);
    }

    /// Takes "Members: read" from an installation.
    pub fn deny_members_read(&self, installation: i64) {
        self.inner.lock().unwrap().no_members_read.push(installation);
    }

    /// The user the authorize page logs in and approves as.
    pub fn login_as(&self, id: i64) {
        self.inner.lock().unwrap().logged_in = Some(id);
    }

    /// Each token request's outcome, in order: `ok` or GitHub's error.
    pub fn token_requests(&self) -> Vec<String> {
        self.inner.lock().unwrap().token_requests.clone()
    }

    /// The user tokens the App revoked.
    pub fn revoked_user_tokens(&self) -> Vec<String> {
        self.inner.lock().unwrap().revoked_user_tokens.clone()
    }

    /// The user tokens handed out.
    pub fn user_tokens(&self) -> Vec<String> {
        self.inner.lock().unwrap().user_tokens.keys().cloned().collect()
    }

    pub fn tokens(&self) -> Vec<Token> {
        self.inner.lock().unwrap().tokens.clone()
    }

    pub fn statuses(&self, sha: &str) -> Vec<Status> {
        self.inner.lock().unwrap().statuses.iter().filter(|s| s.sha == sha).cloned().collect()
    }

    pub fn git_clones(&self) -> Vec<String> {
        self.inner.lock().unwrap().git_clones.clone()
    }

    pub fn refused_jwts(&self) -> Vec<String> {
        self.inner.lock().unwrap().refused_jwts.clone()
    }

    /// A push event as GitHub sends it to an App.
    pub fn push_body(&self, full_name: &str, reference: &str, before: &str, after: &str) -> Value {
        let inner = self.inner.lock().unwrap();
        let repo = inner.repositories.iter().find(|r| r.full_name == full_name).cloned().expect("a repository of the stand-in");
        let (owner, name) = full_name.split_once('/').unwrap();
        let deleted = after.bytes().all(|b| b == b'0');
        json!({
            "ref": reference,
            "before": before,
            "after": after,
            "created": before.bytes().all(|b| b == b'0'),
            "deleted": deleted,
            "forced": false,
            "base_ref": null,
            "compare": format!("https://github.test/{full_name}/compare/{}...{}", &before[..12], &after[..12]),
            "commits": if deleted { json!([]) } else { json!([{"id": after, "message": "change", "timestamp": "2026-12-06T10:00:00Z", "distinct": true}]) },
            "head_commit": if deleted { Value::Null } else { json!({"id": after, "message": "change"}) },
            "repository": {
                "id": repo.id,
                "node_id": format!("R_{}", repo.id),
                "name": name,
                "full_name": full_name,
                "private": true,
                "owner": {"login": owner, "name": owner},
                "html_url": format!("https://github.test/{full_name}"),
                "clone_url": format!("{}/{full_name}.git", self.url()),
                "default_branch": "main",
                "pushed_at": now_s(),
            },
            "pusher": {"name": "octocat", "email": "octocat@github.test"},
            "sender": {"login": "octocat", "id": 1},
            "installation": {"id": repo.installation, "node_id": format!("I_{}", repo.installation)},
        })
    }

    /// POSTs `body` to `url` as GitHub delivers an App's events: signed
    /// with `secret`, with the event name and the delivery id.
    pub async fn deliver(&self, url: &str, event: &str, body: &Value, delivery: &str, secret: &str) -> Result<(u16, Value)> {
        let bytes = serde_json::to_vec(body)?;
        let response = reqwest::Client::new()
            .post(url)
            .header("content-type", "application/json")
            .header("user-agent", "GitHub-Hookshot/stand-in")
            .header("x-github-event", event)
            .header("x-github-delivery", delivery)
            .header("x-github-hook-installation-target-type", "integration")
            .header("x-hub-signature-256", signature(secret.as_bytes(), &bytes))
            .body(bytes)
            .send()
            .await
            .context("delivering the event")?;
        let status = response.status().as_u16();
        let text = response.text().await?;
        Ok((status, serde_json::from_str(&text).unwrap_or(Value::String(text))))
    }
}

/// Checks an App JWT: RS256 under the App's key, issued by the App, not
/// expired, issued at most 60 s ahead, living at most 10 minutes.
fn check_jwt(public_der: &[u8], jwt: &str) -> Result<()> {
    let parts: Vec<&str> = jwt.split('.').collect();
    let [header, claims, signature] = parts.as_slice() else { bail!("not a JWT") };
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let header: Value = serde_json::from_slice(&b64.decode(header)?)?;
    if header["alg"] != "RS256" {
        bail!("alg is not RS256");
    }
    let key = ring::signature::UnparsedPublicKey::new(&ring::signature::RSA_PKCS1_2048_8192_SHA256, public_der);
    key.verify(format!("{}.{}", parts[0], parts[1]).as_bytes(), &b64.decode(signature)?).map_err(|_| anyhow::anyhow!("bad signature"))?;
    let claims: Value = serde_json::from_slice(&b64.decode(claims)?)?;
    let (iat, exp) = (claims["iat"].as_i64().unwrap_or(0), claims["exp"].as_i64().unwrap_or(0));
    let now = now_s();
    if claims["iss"].as_str() != Some(APP_ID.to_string().as_str()) && claims["iss"].as_i64() != Some(APP_ID) {
        bail!("iss is not the App id");
    }
    if exp <= now || iat > now + 60 || exp - iat > 600 {
        bail!("'Expiration time' claim ('exp') is too far in the future, or expired");
    }
    Ok(())
}

fn bearer(headers: &HeaderMap) -> Option<String> {
    let value = headers.get("authorization")?.to_str().ok()?;
    value.strip_prefix("Bearer ").or_else(|| value.strip_prefix("token ")).map(str::to_string)
}

fn repository_json(base: &str, repo: &Repository) -> Value {
    json!({
        "id": repo.id,
        "full_name": repo.full_name,
        "name": repo.full_name.split('/').nth(1),
        "private": true,
        "clone_url": format!("{base}/{}.git", repo.full_name),
        "html_url": format!("https://github.test/{}", repo.full_name),
        "default_branch": "main",
    })
}

/// The live installation token `token`, if any.
fn live_token(inner: &Inner, token: &str) -> Option<Token> {
    inner.tokens.iter().find(|t| t.token == token && !t.revoked && t.expires_at_s > now_s()).cloned()
}

fn covers(token: &Token, repo: &Repository) -> bool {
    token.installation == repo.installation && token.repository_ids.as_ref().is_none_or(|ids| ids.contains(&repo.id))
}

#[allow(clippy::too_many_arguments)]
async fn handle(inner: &Mutex<Inner>, repos: &Path, public_der: &[u8], base: &str, method: Method, uri: Uri, headers: HeaderMap, body: Bytes) -> Response {
    let path = uri.path().to_string();
    if path.contains(".git/") {
        return git_http(inner, repos, method, &uri, &headers, body).await;
    }
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let mut inner = inner.lock().unwrap();
    if inner.api_down {
        return message(StatusCode::SERVICE_UNAVAILABLE, "Service Unavailable");
    }
    if let Some(answer) = oauth_web(&mut inner, &method, &segments, &uri, &headers, &body) {
        return answer;
    }
    let Some(credential) = bearer(&headers) else {
        return message(StatusCode::UNAUTHORIZED, "Requires authentication");
    };
    if let Some(&user) = inner.user_tokens.get(&credential) {
        return as_user(&inner, user, &method, &segments);
    }
    // The App's own endpoints take its JWT.
    let app_call = matches!((&method, segments.as_slice()), (&Method::GET, ["app", "installations"]) | (&Method::GET, ["repos", _, _, "installation"]) | (&Method::POST, ["app", "installations", _, "access_tokens"]));
    if app_call {
        if let Err(err) = check_jwt(public_der, &credential) {
            inner.refused_jwts.push(err.to_string());
            return message(StatusCode::UNAUTHORIZED, "A JSON web token could not be decoded");
        }
        return match (&method, segments.as_slice()) {
            (&Method::GET, ["app", "installations"]) => {
                json_response(StatusCode::OK, json!(inner.installations.iter().map(|(id, login)| json!({"id": id, "account": {"login": login}})).collect::<Vec<_>>()))
            }
            (_, ["repos", owner, name, "installation"]) => {
                let full_name = format!("{owner}/{name}");
                match inner.repositories.iter().find(|r| r.full_name == full_name) {
                    Some(repo) => {
                        let login = inner.installations.iter().find(|(id, _)| *id == repo.installation).map(|(_, l)| l.clone()).unwrap_or_default();
                        json_response(StatusCode::OK, json!({"id": repo.installation, "account": {"login": login}}))
                    }
                    None => message(StatusCode::NOT_FOUND, "Not Found"),
                }
            }
            (_, ["app", "installations", id, "access_tokens"]) => {
                let Some(installation) = id.parse::<i64>().ok().filter(|id| inner.installations.iter().any(|(i, _)| i == id)) else {
                    return message(StatusCode::NOT_FOUND, "Not Found");
                };
                let request: Value = if body.is_empty() { json!({}) } else { serde_json::from_slice(&body).unwrap_or(json!({})) };
                let repository_ids: Option<Vec<i64>> = request.get("repository_ids").and_then(Value::as_array).map(|ids| ids.iter().filter_map(Value::as_i64).collect());
                if let Some(ids) = &repository_ids {
                    if ids.iter().any(|id| !inner.repositories.iter().any(|r| r.id == *id && r.installation == installation)) {
                        return message(StatusCode::UNPROCESSABLE_ENTITY, "There is at least one repository that does not exist or is not accessible to the parent installation.");
                    }
                }
                inner.next_id += 1;
                let token = format!("ghs_{:016x}{:016x}", inner.next_id, rand_u64());
                let expires_at_s = now_s() + if repository_ids.is_some() { inner.scoped_ttl_s } else { 3600 };
                let expires_at = time::OffsetDateTime::from_unix_timestamp(expires_at_s).unwrap().format(&time::format_description::well_known::Rfc3339).unwrap();
                let permissions = request.get("permissions").cloned();
                inner.tokens.push(Token { token: token.clone(), installation, repository_ids, permissions: permissions.clone(), expires_at_s, revoked: false });
                json_response(StatusCode::CREATED, json!({"token": token, "expires_at": expires_at, "permissions": permissions.unwrap_or(json!({"contents": "read", "statuses": "write", "metadata": "read"}))}))
            }
            _ => message(StatusCode::NOT_FOUND, "Not Found"),
        };
    }
    let Some(token) = live_token(&inner, &credential) else {
        return message(StatusCode::UNAUTHORIZED, "Bad credentials");
    };
    let repo_of = |inner: &Inner, owner: &str, name: &str| inner.repositories.iter().find(|r| r.full_name == format!("{owner}/{name}") && covers(&token, r)).cloned();
    let on_org = |inner: &Inner, org: &str| inner.installations.iter().any(|(id, login)| *id == token.installation && login.eq_ignore_ascii_case(org));
    match (&method, segments.as_slice()) {
        // "Get a user using their ID": a public profile, with any token.
        (&Method::GET, ["user", account_id]) => match inner.users.iter().find(|u| u.id.to_string() == *account_id) {
            Some(user) => json_response(StatusCode::OK, json!({"id": user.id, "login": user.login, "type": "User"})),
            None => message(StatusCode::NOT_FOUND, "Not Found"),
        },
        // Membership checks: the installation must be on the organization
        // and hold "Members: read".
        (&Method::GET, ["orgs", org, "members", login]) | (&Method::GET, ["orgs", org, "teams", _, "memberships", login]) => {
            if !on_org(&inner, org) {
                return message(StatusCode::NOT_FOUND, "Not Found");
            }
            if inner.no_members_read.contains(&token.installation) {
                return message(StatusCode::FORBIDDEN, "Resource not accessible by integration");
            }
            let Some(user) = inner.users.iter().find(|u| u.login.eq_ignore_ascii_case(login)) else { return message(StatusCode::NOT_FOUND, "Not Found") };
            match segments.as_slice() {
                [_, _, "members", _] => match user.orgs.iter().any(|(o, state)| o.eq_ignore_ascii_case(org) && state == "active") {
                    true => StatusCode::NO_CONTENT.into_response(),
                    false => message(StatusCode::NOT_FOUND, "Not Found"),
                },
                [_, _, _, team, _, _] => {
                    let slug = format!("{org}/{team}");
                    match user.teams.iter().find(|(t, _)| t.eq_ignore_ascii_case(&slug)) {
                        Some((_, state)) => json_response(StatusCode::OK, json!({"state": state, "role": "member"})),
                        None => message(StatusCode::NOT_FOUND, "Not Found"),
                    }
                }
                _ => message(StatusCode::NOT_FOUND, "Not Found"),
            }
        }
        (&Method::DELETE, ["installation", "token"]) => {
            if let Some(t) = inner.tokens.iter_mut().find(|t| t.token == token.token) {
                t.revoked = true;
            }
            StatusCode::NO_CONTENT.into_response()
        }
        (&Method::GET, ["installation", "repositories"]) => {
            let list: Vec<Value> = inner.repositories.iter().filter(|r| covers(&token, r)).map(|r| repository_json(base, r)).collect();
            json_response(StatusCode::OK, json!({"total_count": list.len(), "repositories": list}))
        }
        (&Method::GET, ["repos", owner, name]) => match repo_of(&inner, owner, name) {
            Some(repo) => json_response(StatusCode::OK, repository_json(base, &repo)),
            None => message(StatusCode::NOT_FOUND, "Not Found"),
        },
        (&Method::GET, ["repos", owner, name, "branches"]) => {
            let Some(repo) = repo_of(&inner, owner, name) else { return message(StatusCode::NOT_FOUND, "Not Found") };
            drop(inner);
            let bare = repos.join(format!("{}.git", repo.full_name));
            let listed = run_command(crate::git_command().arg("-C").arg(&bare).args(["for-each-ref", "--format=%(refname:short) %(objectname)", "refs/heads"])).unwrap_or_default();
            let branches: Vec<Value> = listed.lines().filter_map(|l| l.split_once(' ')).map(|(name, sha)| json!({"name": name, "commit": {"sha": sha}})).collect();
            json_response(StatusCode::OK, json!(branches))
        }
        (&Method::POST, ["repos", owner, name, "statuses", sha]) => {
            let Some(repo) = repo_of(&inner, owner, name) else { return message(StatusCode::NOT_FOUND, "Not Found") };
            if token.permissions.as_ref().is_some_and(|p| p.get("statuses").and_then(Value::as_str) != Some("write")) {
                return message(StatusCode::FORBIDDEN, "Resource not accessible by integration");
            }
            let request: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            let field = |name: &str| request.get(name).and_then(Value::as_str).unwrap_or_default().to_string();
            let state = field("state");
            if !["error", "failure", "pending", "success"].contains(&state.as_str()) {
                return message(StatusCode::UNPROCESSABLE_ENTITY, "Validation Failed");
            }
            inner.statuses.push(Status { repository: repo.full_name, sha: sha.to_string(), state, target_url: field("target_url"), description: field("description"), context: field("context") });
            json_response(StatusCode::CREATED, json!({"state": request["state"], "context": request["context"]}))
        }
        (&Method::POST, ["repos", owner, name, "issues", number, "comments"]) => {
            let Some(repo) = repo_of(&inner, owner, name) else { return message(StatusCode::NOT_FOUND, "Not Found") };
            let request: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            let (Some(text), Ok(number)) = (request["body"].as_str(), number.parse::<i64>()) else { return message(StatusCode::UNPROCESSABLE_ENTITY, "Validation Failed") };
            inner.next_id += 1;
            let comment = Comment { id: inner.next_id, repository: repo.full_name, number, bodies: vec![text.to_string()] };
            inner.comments.push(comment.clone());
            json_response(StatusCode::CREATED, json!({"id": comment.id, "body": text}))
        }
        (&Method::PATCH, ["repos", owner, name, "issues", "comments", id]) => {
            let full_name = format!("{owner}/{name}");
            let request: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            let Some(text) = request["body"].as_str() else { return message(StatusCode::UNPROCESSABLE_ENTITY, "Validation Failed") };
            match inner.comments.iter_mut().find(|c| c.id.to_string() == *id && c.repository == full_name) {
                Some(comment) => {
                    comment.bodies.push(text.to_string());
                    json_response(StatusCode::OK, json!({"id": comment.id, "body": text}))
                }
                None => message(StatusCode::NOT_FOUND, "Not Found"),
            }
        }
        _ => message(StatusCode::NOT_FOUND, "Not Found"),
    }
}

fn query_map(uri: &Uri) -> std::collections::HashMap<String, String> {
    url::form_urlencoded::parse(uri.query().unwrap_or("").as_bytes()).into_owned().collect()
}

/// GitHub's OAuth error answer: `200` with `error` (the documented codes).
fn oauth_error(inner: &mut Inner, error: &str, description: &str) -> Response {
    inner.token_requests.push(error.to_string());
    json_response(StatusCode::OK, json!({"error": error, "error_description": description, "error_uri": "https://docs.github.com/apps/oauth"}))
}

/// The web flow's two endpoints; `None` for any other path.
fn oauth_web(inner: &mut Inner, method: &Method, segments: &[&str], uri: &Uri, headers: &HeaderMap, body: &[u8]) -> Option<Response> {
    match (method, segments) {
        (&Method::GET, ["login", "oauth", "authorize"]) => {
            let query = query_map(uri);
            let known = inner.oauth_client.as_ref().is_some_and(|(id, _)| query.get("client_id") == Some(id));
            let (Some(redirect_uri), Some(state), true) = (query.get("redirect_uri"), query.get("state"), known) else {
                return Some((StatusCode::BAD_REQUEST, "unknown client_id, or no redirect_uri or state").into_response());
            };
            let challenge = query.get("code_challenge").cloned();
            if challenge.is_some() && query.get("code_challenge_method").map(String::as_str) != Some("S256") {
                return Some((StatusCode::BAD_REQUEST, "code_challenge_method must be S256").into_response());
            }
            // GitHub: the redirect_uri must be the registered callback URL
            // (or a path below it).
            if !inner.callback_url.as_ref().is_some_and(|registered| redirect_uri.starts_with(registered.as_str())) {
                return Some((StatusCode::BAD_REQUEST, "The redirect_uri MUST match the registered callback URL for this application.").into_response());
            }
            let Some(user) = inner.logged_in else {
                return Some((StatusCode::UNAUTHORIZED, "nobody is logged in at the stand-in").into_response());
            };
            let code = format!("{:016x}{:04x}", rand_u64(), rand_u64() & 0xffff);
            let client_id = query["client_id"].clone();
            inner.codes.insert(code.clone(), Code { user, client_id, redirect_uri: redirect_uri.clone(), challenge, expires_at_s: now_s() + 600 });
            let mut back = url::Url::parse(redirect_uri).ok()?;
            back.query_pairs_mut().append_pair("code", &code).append_pair("state", state);
            Some((StatusCode::FOUND, [(axum::http::header::LOCATION, back.to_string())]).into_response())
        }
        (&Method::POST, ["login", "oauth", "access_token"]) => {
            // Without `Accept: application/json` GitHub answers in
            // form encoding; a client that reads JSON then gets nothing.
            let wants_json = headers.get("accept").and_then(|v| v.to_str().ok()).is_some_and(|v| v.contains("application/json"));
            if !wants_json {
                inner.token_requests.push("no json accept".into());
                return Some((StatusCode::OK, [(axum::http::header::CONTENT_TYPE, "application/x-www-form-urlencoded")], "error=not_json&error_description=asked+without+Accept%3A+application%2Fjson").into_response());
            }
            let form: std::collections::HashMap<String, String> = url::form_urlencoded::parse(body).into_owned().collect();
            let field = |name: &str| form.get(name).cloned().unwrap_or_default();
            if inner.oauth_client.as_ref() != Some(&(field("client_id"), field("client_secret"))) {
                return Some(oauth_error(inner, "incorrect_client_credentials", "The client_id and/or client_secret passed are incorrect."));
            }
            // A code is used once, whatever the outcome.
            let Some(code) = inner.codes.remove(&field("code")).filter(|c| c.expires_at_s > now_s() && c.client_id == field("client_id")) else {
                return Some(oauth_error(inner, "bad_verification_code", "The code passed is incorrect or expired."));
            };
            if form.get("redirect_uri").is_some_and(|uri| *uri != code.redirect_uri) {
                return Some(oauth_error(inner, "redirect_uri_mismatch", "The redirect_uri MUST match the registered callback URL for this application."));
            }
            if let Some(challenge) = &code.challenge {
                let digest = <sha2::Sha256 as sha2::Digest>::digest(field("code_verifier").as_bytes());
                if base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(digest) != *challenge {
                    return Some(oauth_error(inner, "bad_verification_code", "The code passed is incorrect or expired."));
                }
            }
            let token = format!("ghu_{:016x}{:016x}", rand_u64(), rand_u64());
            inner.user_tokens.insert(token.clone(), code.user);
            inner.token_requests.push("ok".into());
            Some(json_response(StatusCode::OK, json!({"access_token": token, "token_type": "bearer", "scope": ""})))
        }
        (&Method::DELETE, ["applications", client_id, "token"]) => {
            // Basic client_id:client_secret, the token in the body.
            let basic = headers.get("authorization").and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Basic ")).map(str::to_string);
            let pair = basic.and_then(|b| base64::engine::general_purpose::STANDARD.decode(b).ok()).and_then(|b| String::from_utf8(b).ok());
            let expected = inner.oauth_client.as_ref().map(|(id, secret)| format!("{id}:{secret}"));
            if pair.is_none() || pair != expected || expected.as_deref().is_some_and(|e| !e.starts_with(&format!("{client_id}:"))) {
                return Some(message(StatusCode::NOT_FOUND, "Not Found"));
            }
            let request: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
            let Some(token) = request.get("access_token").and_then(Value::as_str).filter(|t| inner.user_tokens.contains_key(*t)) else {
                return Some(message(StatusCode::UNPROCESSABLE_ENTITY, "Validation Failed"));
            };
            let token = token.to_string();
            inner.user_tokens.remove(&token);
            inner.revoked_user_tokens.push(token);
            Some(StatusCode::NO_CONTENT.into_response())
        }
        _ => None,
    }
}

/// The API as a user, with a user token.
fn as_user(inner: &Inner, id: i64, method: &Method, segments: &[&str]) -> Response {
    let Some(user) = inner.users.iter().find(|u| u.id == id) else {
        return message(StatusCode::UNAUTHORIZED, "Bad credentials");
    };
    match (method, segments) {
        (&Method::GET, ["user"]) => json_response(StatusCode::OK, json!({"id": user.id, "login": user.login, "name": format!("{} (stand-in)", user.login), "type": "User"})),
        (&Method::GET, ["user", "memberships", "orgs", org]) => match user.orgs.iter().find(|(o, _)| o.eq_ignore_ascii_case(org)) {
            Some((_, state)) if state == "sso" => {
                message(StatusCode::FORBIDDEN, "Resource protected by organization SAML enforcement. You must grant your Personal Access token access to this organization.")
            }
            Some((org, state)) => json_response(StatusCode::OK, json!({"state": state, "role": "member", "organization": {"login": org}, "user": {"login": user.login}})),
            None => message(StatusCode::NOT_FOUND, "Not Found"),
        },
        (&Method::GET, ["orgs", org, "teams", team, "memberships", login]) => {
            let target = inner.users.iter().find(|u| u.login.eq_ignore_ascii_case(login));
            let slug = format!("{org}/{team}");
            match target.and_then(|t| t.teams.iter().find(|(x, _)| x.eq_ignore_ascii_case(&slug))) {
                Some((_, state)) => json_response(StatusCode::OK, json!({"state": state, "role": "member", "url": format!("https://api.github.test/teams/{slug}/memberships/{login}")})),
                None => message(StatusCode::NOT_FOUND, "Not Found"),
            }
        }
        _ => message(StatusCode::NOT_FOUND, "Not Found"),
    }
}

fn rand_u64() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let seed = format!("{:?}{}{}", std::time::SystemTime::now(), COUNTER.fetch_add(1, Ordering::Relaxed), std::process::id());
    let digest = <sha2::Sha256 as sha2::Digest>::digest(seed.as_bytes());
    u64::from_le_bytes(digest[..8].try_into().unwrap())
}

/// Git over smart HTTP, for `x-access-token` with a live installation
/// token that covers the repository.
async fn git_http(inner: &Mutex<Inner>, repos: &Path, method: Method, uri: &Uri, headers: &HeaderMap, body: Bytes) -> Response {
    let path = uri.path();
    let full_name = &path[1..path.find(".git/").unwrap()];
    let credentials = crate::git_backend::basic_credentials(headers);
    let allowed = {
        let mut inner = inner.lock().unwrap();
        let repo = inner.repositories.iter().find(|r| r.full_name == full_name).cloned();
        let ok = match (&credentials, repo) {
            (Some((user, password)), Some(repo)) if user == "x-access-token" => live_token(&inner, password).is_some_and(|t| covers(&t, &repo)),
            (None, Some(repo)) => inner.public.contains(&repo.full_name),
            _ => false,
        };
        if ok {
            inner.git_clones.push(credentials.as_ref().map_or_else(|| format!("anonymous:{full_name}"), |c| c.1.clone()));
        }
        ok
    };
    if !allowed {
        return (StatusCode::UNAUTHORIZED, [("www-authenticate", "Basic realm=\"GitHub\"")], "Invalid username or token. Password authentication is not supported for Git operations.").into_response();
    }
    crate::git_backend::serve(repos, method, uri, headers, body, "x-access-token").await
}
