//! A GitLab stand-in for tests: a small HTTP server on loopback that
//! speaks the parts of GitLab cloud-web uses, as GitLab documents them:
//! OAuth 2 (`/oauth/authorize` with PKCE S256, `/oauth/token` for codes
//! and refresh tokens), `/api/v4/user`, `/groups`, `/projects`, branches,
//! hooks, deploy tokens and commit statuses, and git over smart HTTP
//! (`git http-backend`) with the credentials checked: a project deploy
//! token or `oauth2` with a valid access token. It records what the
//! control plane sent, and sends push webhooks shaped like GitLab's.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use anyhow::{bail, Result};
use axum::body::Bytes;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use crate::{git_command, run_command};

pub const CLIENT_ID: &str = "cloudweb-test-client";
pub const CLIENT_SECRET: &str = "gloas-test-client-secret-5f1c";

#[derive(Debug, Clone)]
pub struct User {
    pub id: i64,
    pub username: String,
    pub email: String,
    pub email_confirmed: bool,
    pub groups: Vec<String>,
}

#[derive(Debug, Clone)]
pub struct Hook {
    pub id: i64,
    pub project: i64,
    pub url: String,
    pub token: String,
    pub branch_filter: Option<String>,
    pub removed: bool,
}

#[derive(Debug, Clone)]
pub struct Status {
    pub project: i64,
    pub sha: String,
    pub state: String,
    pub target_url: String,
    pub reference: String,
}

#[derive(Debug, Clone)]
pub struct DeployToken {
    pub id: i64,
    pub project: i64,
    pub username: String,
    pub token: String,
    pub expires_at: Option<String>,
    pub revoked: bool,
}

/// One `/oauth/token` request as received.
#[derive(Debug, Clone)]
pub struct TokenRequest {
    pub grant_type: String,
    pub client_id: String,
    pub client_secret: String,
    pub code_verifier: Option<String>,
    pub redirect_uri: Option<String>,
    /// What happened: "ok" or the OAuth error sent back.
    pub outcome: String,
}

#[derive(Debug, Clone)]
struct Project {
    id: i64,
    path: String,
}

struct Code {
    user: i64,
    challenge: String,
    redirect_uri: String,
}

#[derive(Default)]
struct Inner {
    users: Vec<User>,
    /// Who "is logged in" at the authorize page.
    login_as: Option<i64>,
    projects: Vec<Project>,
    codes: HashMap<String, Code>,
    /// access token → user
    access: HashMap<String, i64>,
    refresh: HashMap<String, i64>,
    expires_in: i64,
    token_requests: Vec<TokenRequest>,
    hooks: Vec<Hook>,
    statuses: Vec<Status>,
    deploy_tokens: Vec<DeployToken>,
    /// Notes on merge requests: (id, iid, every text it had).
    notes: Vec<(i64, i64, Vec<String>)>,
    /// Credentials (user name) git clones were made with.
    git_clones: Vec<String>,
    /// `Authorization` values of API calls, in order.
    api_tokens: Vec<String>,
    /// GitLab user ids that authorized API calls were made as, in order.
    api_callers: Vec<i64>,
    next_id: i64,
}

/// The running stand-in; stops when dropped.
pub struct FakeGitlab {
    pub addr: SocketAddr,
    /// With [`FakeGitlab::start_https`]: the private CA its certificate is
    /// from (PEM), like a self-hosted GitLab's.
    pub ca_pem: Option<String>,
    root: PathBuf,
    inner: Arc<Mutex<Inner>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FakeGitlab {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// TLS over the stand-in's listener. A handshake that fails (a client
/// that does not trust the CA) drops that connection only.
struct TlsListener {
    tcp: tokio::net::TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
}

impl axum::serve::Listener for TlsListener {
    type Io = tokio_rustls::server::TlsStream<tokio::net::TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let Ok((stream, peer)) = self.tcp.accept().await else {
                // Out of file descriptors, say: try again in a moment.
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            };
            let handshake = tokio::time::timeout(std::time::Duration::from_secs(10), self.acceptor.accept(stream));
            if let Ok(Ok(tls)) = handshake.await {
                return (tls, peer);
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.tcp.local_addr()
    }
}

pub(crate) fn random_token(prefix: &str) -> String {
    let bytes: [u8; 16] = rand_bytes();
    format!("{prefix}{}", hex::encode(bytes))
}

fn rand_bytes() -> [u8; 16] {
    // Enough for test tokens: the time and a counter, hashed.
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let seed = format!("{:?}{}{}", std::time::SystemTime::now(), COUNTER.fetch_add(1, Ordering::Relaxed), std::process::id());
    let digest = Sha256::digest(seed.as_bytes());
    let mut out = [0u8; 16];
    out.copy_from_slice(&digest[..16]);
    out
}

pub(crate) fn s256(verifier: &str) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(Sha256::digest(verifier.as_bytes()))
}

pub(crate) fn json_response(status: StatusCode, value: Value) -> Response {
    (status, axum::Json(value)).into_response()
}

pub(crate) fn query_map(uri: &Uri) -> HashMap<String, String> {
    url::form_urlencoded::parse(uri.query().unwrap_or("").as_bytes()).into_owned().collect()
}

impl FakeGitlab {
    /// On plain http (the control plane and agents need
    /// `--allow-private-git-hosts`, as for any loopback git host).
    pub async fn start(root: &Path) -> Result<FakeGitlab> {
        FakeGitlab::start_on(root, None).await
    }

    /// On https, with a certificate for 127.0.0.1 from a CA of its own
    /// that nobody trusts until told ([`FakeGitlab::ca_pem`]).
    pub async fn start_https(root: &Path) -> Result<FakeGitlab> {
        let ca_key = rcgen::KeyPair::generate()?;
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new())?;
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca_params.distinguished_name.push(rcgen::DnType::CommonName, "self-hosted GitLab test CA");
        let ca_cert = ca_params.self_signed(&ca_key)?;
        let issuer = rcgen::Issuer::new(ca_params, ca_key);
        let key = rcgen::KeyPair::generate()?;
        let cert = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string()])?.signed_by(&key, &issuer)?;
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(vec![cert.der().clone()], rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()))?;
        FakeGitlab::start_on(root, Some((Arc::new(config), ca_cert.pem()))).await
    }

    async fn start_on(root: &Path, tls: Option<(Arc<rustls::ServerConfig>, String)>) -> Result<FakeGitlab> {
        std::fs::create_dir_all(root.join("repos"))?;
        let inner = Arc::new(Mutex::new(Inner { expires_in: 7200, next_id: 100, ..Inner::default() }));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let scheme = if tls.is_some() { "https" } else { "http" };
        let shared = (inner.clone(), root.join("repos"));
        let app = axum::Router::new().fallback(move |method: Method, uri: Uri, headers: HeaderMap, body: Bytes| {
            let (inner, repos) = shared.clone();
            async move { handle(&inner, &repos, scheme, method, uri, headers, body).await }
        });
        let (task, ca_pem) = match tls {
            None => (
                tokio::spawn(async move {
                    let _ = axum::serve(listener, app).await;
                }),
                None,
            ),
            Some((config, ca_pem)) => {
                let acceptor = tokio_rustls::TlsAcceptor::from(config);
                (
                    tokio::spawn(async move {
                        let _ = axum::serve(TlsListener { tcp: listener, acceptor }, app).await;
                    }),
                    Some(ca_pem),
                )
            }
        };
        Ok(FakeGitlab { addr, ca_pem, root: root.to_path_buf(), inner, task })
    }

    pub fn url(&self) -> String {
        match self.ca_pem {
            None => format!("http://{}", self.addr),
            Some(_) => format!("https://{}", self.addr),
        }
    }

    pub fn add_user(&self, id: i64, username: &str, email: &str, email_confirmed: bool, groups: &[&str]) {
        self.inner.lock().unwrap().users.push(User {
            id,
            username: username.into(),
            email: email.into(),
            email_confirmed,
            groups: groups.iter().map(|g| g.to_string()).collect(),
        });
    }

    /// Replaces a user's groups (as when an administrator removes them
    /// from one).
    pub fn set_groups(&self, id: i64, groups: &[&str]) {
        let mut inner = self.inner.lock().unwrap();
        if let Some(user) = inner.users.iter_mut().find(|u| u.id == id) {
            user.groups = groups.iter().map(|g| g.to_string()).collect();
        }
    }

    /// The user the authorize page logs in and approves as.
    pub fn login_as(&self, id: i64) {
        self.inner.lock().unwrap().login_as = Some(id);
    }

    /// Lifetime of access tokens handed out from now on.
    pub fn set_expires_in(&self, seconds: i64) {
        self.inner.lock().unwrap().expires_in = seconds;
    }

    /// Creates a project with a bare repository; returns its id.
    pub fn add_project(&self, path: &str) -> Result<i64> {
        crate::git_backend::init_bare(&self.root, path)?;
        let mut inner = self.inner.lock().unwrap();
        inner.next_id += 1;
        let id = inner.next_id;
        inner.projects.push(Project { id, path: path.into() });
        Ok(id)
    }

    /// Commits `files` on `branch` of the project (creating the branch
    /// from main when new) and pushes them into its repository; returns
    /// the commit id.
    pub fn commit(&self, path: &str, branch: &str, files: &[(&str, &str)], message: &str) -> Result<String> {
        crate::git_backend::commit(&self.root, path, branch, files, message)
    }

    /// Tags the head of `branch` and pushes the tag.
    pub fn tag(&self, path: &str, tag: &str) -> Result<String> {
        let work = self.root.join("work").join(path.replace('/', "__"));
        run_command(git_command().arg("-C").arg(&work).args(["tag", tag]))?;
        run_command(git_command().arg("-C").arg(&work).args(["push", "--quiet", "origin", &format!("refs/tags/{tag}")]))?;
        run_command(git_command().arg("-C").arg(&work).args(["rev-parse", "HEAD"]))
    }

    pub fn hooks(&self) -> Vec<Hook> {
        self.inner.lock().unwrap().hooks.clone()
    }

    pub fn statuses(&self, sha: &str) -> Vec<Status> {
        self.inner.lock().unwrap().statuses.iter().filter(|s| s.sha == sha).cloned().collect()
    }

    pub fn deploy_tokens(&self) -> Vec<DeployToken> {
        self.inner.lock().unwrap().deploy_tokens.clone()
    }

    pub fn token_requests(&self) -> Vec<TokenRequest> {
        self.inner.lock().unwrap().token_requests.clone()
    }

    pub fn git_clones(&self) -> Vec<String> {
        self.inner.lock().unwrap().git_clones.clone()
    }

    /// Every access token handed out (to grep for them).
    pub fn access_tokens(&self) -> Vec<String> {
        self.inner.lock().unwrap().access.keys().cloned().collect()
    }

    /// The GitLab users that API calls were made as, in order.
    pub fn api_callers(&self) -> Vec<i64> {
        self.inner.lock().unwrap().api_callers.clone()
    }

    pub fn api_tokens(&self) -> Vec<String> {
        self.inner.lock().unwrap().api_tokens.clone()
    }

    /// A push event body as GitLab sends it (doc/user/project/integrations/
    /// webhook_events.md, "Push events"): `checkout_sha` is the newest commit.
    pub fn push_body(&self, project: i64, reference: &str, before: &str, commits: &[&str]) -> Value {
        let path = self.inner.lock().unwrap().projects.iter().find(|p| p.id == project).map(|p| p.path.clone()).unwrap_or_default();
        let after = commits.last().copied().unwrap_or("0000000000000000000000000000000000000000");
        let tag = reference.starts_with("refs/tags/");
        json!({
            "object_kind": if tag { "tag_push" } else { "push" },
            "event_name": if tag { "tag_push" } else { "push" },
            "before": before,
            "after": after,
            "ref": reference,
            "ref_protected": true,
            "checkout_sha": commits.last(),
            "user_id": 4,
            "user_name": "John Smith",
            "user_username": "jsmith",
            "user_email": "john@example.com",
            "project_id": project,
            "project": {
                "id": project,
                "name": path.rsplit('/').next(),
                "path_with_namespace": path,
                "default_branch": "main",
                "git_http_url": format!("{}/{path}.git", self.url()),
            },
            "commits": commits.iter().map(|c| json!({"id": c, "message": "change", "title": "change", "timestamp": "2026-11-30T10:00:00+00:00"})).collect::<Vec<_>>(),
            "total_commits_count": commits.len(),
            "repository": { "name": path.rsplit('/').next(), "homepage": format!("{}/{path}", self.url()) },
        })
    }

    /// A merge request event as GitLab sends it (webhook_events.md, "Merge
    /// request events"): request `iid` from `source_branch` (same project)
    /// into main, its head `sha`; `oldrev` set on an update that pushed.
    pub fn merge_request_body(&self, project: i64, iid: i64, action: &str, source_branch: &str, sha: &str, oldrev: Option<&str>) -> Value {
        let path = self.inner.lock().unwrap().projects.iter().find(|p| p.id == project).map(|p| p.path.clone()).unwrap_or_default();
        let side = json!({"id": project, "path_with_namespace": path, "git_http_url": format!("{}/{path}.git", self.url())});
        json!({
            "object_kind": "merge_request",
            "event_type": "merge_request",
            "user": {"id": 4, "username": "jsmith"},
            "project": {"id": project, "path_with_namespace": path, "git_http_url": format!("{}/{path}.git", self.url())},
            "object_attributes": {
                "id": 9000 + iid, "iid": iid, "action": action,
                "state": match action { "close" => "closed", "merge" => "merged", _ => "opened" },
                "source_branch": source_branch, "target_branch": "main",
                "source_project_id": project, "target_project_id": project,
                "source": side, "target": side,
                "last_commit": {"id": sha, "message": "change"},
                "oldrev": oldrev,
            },
        })
    }

    /// The notes written on merge requests: (iid, every text it had).
    pub fn notes(&self) -> Vec<(i64, Vec<String>)> {
        self.inner.lock().unwrap().notes.iter().map(|n| (n.1, n.2.clone())).collect()
    }

    /// Delivers `body` to every live hook of `project` the way GitLab
    /// does (`X-Gitlab-Event`, `X-Gitlab-Token`, `X-Gitlab-Event-UUID`);
    /// returns each hook's answer.
    pub async fn deliver(&self, project: i64, body: &Value, event_uuid: &str) -> Result<Vec<(u16, Value)>> {
        let hooks: Vec<Hook> = self.hooks().into_iter().filter(|h| h.project == project && !h.removed).collect();
        if hooks.is_empty() {
            bail!("project {project} has no webhook");
        }
        let event = match body["object_kind"].as_str() {
            Some("tag_push") => "Tag Push Hook",
            Some("merge_request") => "Merge Request Hook",
            _ => "Push Hook",
        };
        let http = reqwest::Client::new();
        let mut answers = Vec::new();
        for hook in hooks {
            let response = http
                .post(&hook.url)
                .header("Content-Type", "application/json")
                .header("X-Gitlab-Event", event)
                .header("X-Gitlab-Token", &hook.token)
                .header("X-Gitlab-Event-UUID", event_uuid)
                .header("X-Gitlab-Webhook-UUID", format!("hook-{}", hook.id))
                .header("X-Gitlab-Instance", self.url())
                .body(serde_json::to_vec(body)?)
                .send()
                .await?;
            let status = response.status().as_u16();
            let text = response.text().await?;
            answers.push((status, serde_json::from_str(&text).unwrap_or(Value::String(text))));
        }
        Ok(answers)
    }
}

fn authorized_user(inner: &mut Inner, headers: &HeaderMap) -> Option<User> {
    let value = headers.get("authorization")?.to_str().ok()?.to_string();
    inner.api_tokens.push(value.clone());
    let token = value.strip_prefix("Bearer ")?;
    let id = *inner.access.get(token)?;
    inner.api_callers.push(id);
    inner.users.iter().find(|u| u.id == id).cloned()
}

fn project_json(base: &str, project: &Project) -> Value {
    json!({
        "id": project.id,
        "name": project.path.rsplit('/').next(),
        "path_with_namespace": project.path,
        "http_url_to_repo": format!("{base}/{}.git", project.path),
        "default_branch": "main",
        "web_url": format!("{base}/{}", project.path),
    })
}

async fn handle(inner: &Mutex<Inner>, repos: &Path, scheme: &str, method: Method, uri: Uri, headers: HeaderMap, body: Bytes) -> Response {
    let path = uri.path().to_string();
    let base = format!("{scheme}://{}", headers.get("host").and_then(|h| h.to_str().ok()).unwrap_or("127.0.0.1"));
    if path.contains(".git/") {
        return git_http(inner, repos, method, &uri, &headers, body).await;
    }
    if path == "/oauth/authorize" && method == Method::GET {
        let q = query_map(&uri);
        let mut inner = inner.lock().unwrap();
        if q.get("client_id").map(String::as_str) != Some(CLIENT_ID) || q.get("response_type").map(String::as_str) != Some("code") {
            return json_response(StatusCode::BAD_REQUEST, json!({"error": "invalid_client"}));
        }
        if q.get("code_challenge_method").map(String::as_str) != Some("S256") || q.get("code_challenge").is_none_or(|c| c.len() < 43) {
            return json_response(StatusCode::BAD_REQUEST, json!({"error": "invalid_request", "error_description": "PKCE S256 required"}));
        }
        let Some(user) = inner.login_as else {
            return json_response(StatusCode::UNAUTHORIZED, json!({"error": "not logged in"}));
        };
        let code = random_token("code-");
        let redirect = q["redirect_uri"].clone();
        inner.codes.insert(code.clone(), Code { user, challenge: q["code_challenge"].clone(), redirect_uri: redirect.clone() });
        let mut target = url::Url::parse(&redirect).unwrap();
        target.query_pairs_mut().append_pair("code", &code).append_pair("state", q.get("state").map(String::as_str).unwrap_or(""));
        return (StatusCode::FOUND, [("location", target.to_string())]).into_response();
    }
    if path == "/oauth/token" && method == Method::POST {
        let form: HashMap<String, String> = url::form_urlencoded::parse(&body).into_owned().collect();
        let mut inner = inner.lock().unwrap();
        let mut request = TokenRequest {
            grant_type: form.get("grant_type").cloned().unwrap_or_default(),
            client_id: form.get("client_id").cloned().unwrap_or_default(),
            client_secret: form.get("client_secret").cloned().unwrap_or_default(),
            code_verifier: form.get("code_verifier").cloned(),
            redirect_uri: form.get("redirect_uri").cloned(),
            outcome: "ok".into(),
        };
        let user = if request.client_id != CLIENT_ID || request.client_secret != CLIENT_SECRET {
            Err("invalid_client")
        } else if request.grant_type == "authorization_code" {
            match form.get("code").and_then(|c| inner.codes.remove(c)) {
                None => Err("invalid_grant"),
                Some(code) if Some(&code.redirect_uri) != request.redirect_uri.as_ref() => Err("invalid_grant"),
                Some(code) if request.code_verifier.as_deref().map(s256).as_ref() != Some(&code.challenge) => Err("invalid_grant"),
                Some(code) => Ok(code.user),
            }
        } else if request.grant_type == "refresh_token" {
            form.get("refresh_token").and_then(|r| inner.refresh.remove(r)).ok_or("invalid_grant")
        } else {
            Err("unsupported_grant_type")
        };
        let answer = match user {
            Err(error) => {
                request.outcome = error.into();
                json_response(StatusCode::BAD_REQUEST, json!({"error": error, "error_description": "The provided authorization grant is invalid"}))
            }
            Ok(user) => {
                let access = random_token("gloat-");
                let refresh = random_token("glort-");
                inner.access.insert(access.clone(), user);
                inner.refresh.insert(refresh.clone(), user);
                json_response(
                    StatusCode::OK,
                    json!({"access_token": access, "token_type": "Bearer", "expires_in": inner.expires_in, "refresh_token": refresh, "created_at": 1_700_000_000, "scope": "api read_user"}),
                )
            }
        };
        inner.token_requests.push(request);
        return answer;
    }
    let Some(api) = path.strip_prefix("/api/v4") else {
        return json_response(StatusCode::NOT_FOUND, json!({"message": "404 Not Found"}));
    };
    let mut inner = inner.lock().unwrap();
    let Some(user) = authorized_user(&mut inner, &headers) else {
        return json_response(StatusCode::UNAUTHORIZED, json!({"message": "401 Unauthorized"}));
    };
    let segments: Vec<String> = api.trim_start_matches('/').split('/').map(|s| url::form_urlencoded::parse(format!("x={s}").as_bytes()).next().unwrap().1.into_owned()).collect();
    let segments: Vec<&str> = segments.iter().map(String::as_str).collect();
    let request: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let find = |inner: &Inner, key: &str| inner.projects.iter().find(|p| p.id.to_string() == key || p.path == key).cloned();
    match (method.clone(), segments.as_slice()) {
        (Method::GET, ["user"]) => json_response(
            StatusCode::OK,
            json!({
                "id": user.id, "username": user.username, "name": user.username, "state": "active",
                "email": user.email,
                "confirmed_at": if user.email_confirmed { Value::String("2026-01-01T00:00:00Z".into()) } else { Value::Null },
            }),
        ),
        (Method::GET, ["groups"]) => json_response(StatusCode::OK, Value::Array(user.groups.iter().map(|g| json!({"full_path": g, "path": g.rsplit('/').next()})).collect())),
        (Method::GET, ["projects"]) => {
            let q = query_map(&uri);
            let list: Vec<Value> = inner
                .projects
                .iter()
                .filter(|p| q.get("search").is_none_or(|s| p.path.contains(s.as_str())))
                .map(|p| project_json(&base, p))
                .collect();
            json_response(StatusCode::OK, Value::Array(list))
        }
        (Method::GET, ["projects", key]) => match find(&inner, key) {
            Some(p) => json_response(StatusCode::OK, project_json(&base, &p)),
            None => json_response(StatusCode::NOT_FOUND, json!({"message": "404 Project Not Found"})),
        },
        (Method::GET, ["projects", key, "repository", "branches"]) => {
            let Some(project) = find(&inner, key) else {
                return json_response(StatusCode::NOT_FOUND, json!({"message": "404 Project Not Found"}));
            };
            let bare = repos.join(format!("{}.git", project.path));
            let refs = run_command(git_command().arg("--git-dir").arg(&bare).args(["for-each-ref", "--format=%(refname:short) %(objectname)", "refs/heads"])).unwrap_or_default();
            let list: Vec<Value> = refs.lines().filter_map(|l| l.split_once(' ')).map(|(name, id)| json!({"name": name, "commit": {"id": id}})).collect();
            json_response(StatusCode::OK, Value::Array(list))
        }
        (Method::POST, ["projects", key, "hooks"]) => {
            let Some(project) = find(&inner, key) else {
                return json_response(StatusCode::NOT_FOUND, json!({"message": "404 Project Not Found"}));
            };
            inner.next_id += 1;
            let hook = Hook {
                id: inner.next_id,
                project: project.id,
                url: request["url"].as_str().unwrap_or_default().into(),
                token: request["token"].as_str().unwrap_or_default().into(),
                branch_filter: request["push_events_branch_filter"].as_str().map(str::to_string),
                removed: false,
            };
            inner.hooks.push(hook.clone());
            json_response(StatusCode::CREATED, json!({"id": hook.id, "url": hook.url, "project_id": project.id, "push_events": true}))
        }
        (Method::DELETE, ["projects", _key, "hooks", id]) => match inner.hooks.iter_mut().find(|h| h.id.to_string() == *id && !h.removed) {
            Some(hook) => {
                hook.removed = true;
                StatusCode::NO_CONTENT.into_response()
            }
            None => json_response(StatusCode::NOT_FOUND, json!({"message": "404 Not found"})),
        },
        (Method::POST, ["projects", key, "deploy_tokens"]) => {
            let Some(project) = find(&inner, key) else {
                return json_response(StatusCode::NOT_FOUND, json!({"message": "404 Project Not Found"}));
            };
            if request["scopes"] != json!(["read_repository"]) {
                return json_response(StatusCode::BAD_REQUEST, json!({"message": "expected scopes [read_repository]"}));
            }
            inner.next_id += 1;
            let id = inner.next_id;
            let token = DeployToken {
                id,
                project: project.id,
                username: format!("gitlab+deploy-token-{id}"),
                token: random_token("gldt-"),
                expires_at: request["expires_at"].as_str().map(str::to_string),
                revoked: false,
            };
            inner.deploy_tokens.push(token.clone());
            json_response(
                StatusCode::CREATED,
                json!({"id": id, "name": request["name"], "username": token.username, "token": token.token, "expires_at": token.expires_at, "scopes": ["read_repository"]}),
            )
        }
        (Method::DELETE, ["projects", _key, "deploy_tokens", id]) => match inner.deploy_tokens.iter_mut().find(|t| t.id.to_string() == *id) {
            Some(token) => {
                token.revoked = true;
                StatusCode::NO_CONTENT.into_response()
            }
            None => json_response(StatusCode::NOT_FOUND, json!({"message": "404 Not found"})),
        },
        (Method::POST, ["projects", key, "statuses", sha]) => {
            let Some(project) = find(&inner, key) else {
                return json_response(StatusCode::NOT_FOUND, json!({"message": "404 Project Not Found"}));
            };
            let state = request["state"].as_str().unwrap_or_default().to_string();
            if !["pending", "running", "success", "failed", "canceled"].contains(&state.as_str()) {
                return json_response(StatusCode::BAD_REQUEST, json!({"message": "state does not have a valid value"}));
            }
            inner.statuses.push(Status {
                project: project.id,
                sha: sha.to_string(),
                state: state.clone(),
                target_url: request["target_url"].as_str().unwrap_or_default().into(),
                reference: request["ref"].as_str().unwrap_or_default().into(),
            });
            json_response(StatusCode::CREATED, json!({"id": inner.statuses.len(), "sha": sha, "status": state, "name": request["name"]}))
        }
        (Method::POST, ["projects", key, "merge_requests", iid, "notes"]) => {
            let (Some(_), Ok(iid), Some(text)) = (find(&inner, key), iid.parse::<i64>(), request["body"].as_str()) else {
                return json_response(StatusCode::BAD_REQUEST, json!({"message": "body is missing"}));
            };
            inner.next_id += 1;
            let id = inner.next_id;
            inner.notes.push((id, iid, vec![text.to_string()]));
            json_response(StatusCode::CREATED, json!({"id": id, "body": text, "noteable_iid": iid}))
        }
        (Method::PUT, ["projects", _key, "merge_requests", iid, "notes", id]) => {
            let Some(text) = request["body"].as_str() else { return json_response(StatusCode::BAD_REQUEST, json!({"message": "body is missing"})) };
            match inner.notes.iter_mut().find(|n| n.0.to_string() == *id && n.1.to_string() == *iid) {
                Some(note) => {
                    note.2.push(text.to_string());
                    json_response(StatusCode::OK, json!({"id": note.0, "body": text}))
                }
                None => json_response(StatusCode::NOT_FOUND, json!({"message": "404 Not found"})),
            }
        }
        _ => json_response(StatusCode::NOT_FOUND, json!({"message": format!("404 {method} {path} not handled by the stand-in")})),
    }
}

/// Git over smart HTTP through `git http-backend` (CGI), after checking
/// Basic credentials: a live deploy token of the project, or `oauth2`
/// with a valid access token.
async fn git_http(inner: &Mutex<Inner>, repos: &Path, method: Method, uri: &Uri, headers: &HeaderMap, body: Bytes) -> Response {
    let path = uri.path();
    let project_path = &path[1..path.find(".git/").unwrap()];
    let credentials = crate::git_backend::basic_credentials(headers);
    let allowed = {
        let mut inner = inner.lock().unwrap();
        let project = inner.projects.iter().find(|p| p.path == project_path).cloned();
        let ok = match (&credentials, &project) {
            (Some((user, password)), Some(project)) if user == "oauth2" => inner.access.contains_key(password) && project.id > 0,
            (Some((user, password)), Some(project)) => {
                inner.deploy_tokens.iter().any(|t| !t.revoked && t.project == project.id && &t.username == user && &t.token == password)
            }
            _ => false,
        };
        if ok {
            inner.git_clones.push(credentials.as_ref().map(|c| c.0.clone()).unwrap_or_default());
        }
        ok
    };
    if !allowed {
        return (StatusCode::UNAUTHORIZED, [("www-authenticate", "Basic realm=\"GitLab\"")], "HTTP Basic: Access denied").into_response();
    }
    crate::git_backend::serve(repos, method, uri, headers, body, &credentials.map(|c| c.0).unwrap_or_default()).await
}
