//! GitLab login and push-to-deploy against a GitLab stand-in
//! (`cloudweb_e2e::gitlab`) with real git underneath: the OAuth flow with
//! `state` and PKCE, the allow-list, tokens sealed and refreshed; a push
//! webhook that deploys exactly its `checkout_sha` through the real agent,
//! Docker and registry, with commit statuses posted back and the clone
//! credentials made for that one deploy; every refused or ignored webhook;
//! and the generic, HMAC-signed webhook.

use std::path::Path;
use std::time::Duration;

use cloudweb_e2e::gitlab::{FakeGitlab, CLIENT_ID, CLIENT_SECRET};
use cloudweb_e2e::{security_summary, start_platform, unique_name, wait_for, AgentNode, Platform, ServerProcess};
use reqwest::Method;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

pub(crate) const DOCKERFILE: &str = "FROM cloudweb-test/busybox:latest\nCOPY index.html /www/index.html\nCMD [\"httpd\", \"-f\", \"-p\", \"8080\", \"-h\", \"/www\"]\n";

pub(crate) fn no_redirects() -> reqwest::Client {
    reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).timeout(Duration::from_secs(20)).build().unwrap()
}

pub(crate) async fn configure(server: &ServerProcess, gitlab: &FakeGitlab, users: &[&str], groups: &[&str]) {
    let (status, body) = server
        .call(
            Method::PUT,
            "/api/gitlab/settings",
            Some(json!({"base_url": gitlab.url(), "client_id": CLIENT_ID, "client_secret": CLIENT_SECRET, "allowed_users": users, "allowed_groups": groups})),
        )
        .await
        .unwrap();
    assert_eq!(status, 200, "{body}");
    assert!(!body.to_string().contains(CLIENT_SECRET), "the client secret must not come back: {body}");
}

/// The `Set-Cookie` line that sets cookie `name`, if any.
pub(crate) fn set_cookie(headers: &reqwest::header::HeaderMap, name: &str) -> Option<String> {
    headers.get_all("set-cookie").iter().filter_map(|v| v.to_str().ok()).find(|v| v.starts_with(&format!("{name}="))).map(str::to_string)
}

/// `name=value` of a `Set-Cookie` line, as a `Cookie` header sends it back.
pub(crate) fn cookie_pair(set_cookie: &str) -> String {
    set_cookie.split(';').next().unwrap().to_string()
}

/// Starts a login with `host` (`gitlab`, `github`) at the control plane:
/// the authorize URL it redirects to, and the login cookie it gave this
/// browser (`name=value`), checked for its flags.
pub(crate) async fn start_login_with(server: &ServerProcess, host: &str) -> (url::Url, String) {
    let response = no_redirects().get(server.api(&format!("/api/auth/{host}/login"))).send().await.unwrap();
    assert_eq!(response.status().as_u16(), 302);
    let line = set_cookie(response.headers(), &format!("cloudweb_{host}_login")).expect("the login sets its cookie");
    for flag in ["HttpOnly", "SameSite=Lax", &format!("Path=/api/auth/{host}"), "Max-Age="] {
        assert!(line.contains(flag), "{line}");
    }
    let url = url::Url::parse(response.headers()["location"].to_str().unwrap()).unwrap();
    (url, cookie_pair(&line))
}

async fn start_login(server: &ServerProcess) -> (url::Url, String) {
    start_login_with(server, "gitlab").await
}

/// The authorize URL with its PKCE challenge replaced by another (an
/// attacker's): the code it yields does not match the server's verifier.
pub(crate) fn with_other_challenge(authorize_url: &url::Url) -> url::Url {
    let mut swapped = authorize_url.clone();
    let pairs: Vec<(String, String)> = authorize_url
        .query_pairs()
        .map(|(k, v)| {
            let value = if k == "code_challenge" { "A".repeat(43) } else { v.into_owned() };
            (k.into_owned(), value)
        })
        .collect();
    swapped.query_pairs_mut().clear().extend_pairs(pairs);
    swapped
}

/// Calls a callback URL with these cookies: status, body, headers.
pub(crate) async fn callback(url: &str, accept: &str, cookies: &[&str]) -> (u16, String, reqwest::header::HeaderMap) {
    let mut request = no_redirects().get(url).header("accept", accept);
    if !cookies.is_empty() {
        request = request.header("cookie", cookies.join("; "));
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    (status, response.text().await.unwrap(), headers)
}

/// A whole login as the stand-in's current user, from a browser that
/// sends these other cookies too: the callback's status, body, headers.
async fn login_with(server: &ServerProcess, accept: &str, cookies: &[&str]) -> (u16, String, reqwest::header::HeaderMap) {
    host_login(server, "gitlab", accept, cookies).await
}

/// A whole login with `host` as its stand-in's current user.
pub(crate) async fn host_login(server: &ServerProcess, host: &str, accept: &str, cookies: &[&str]) -> (u16, String, reqwest::header::HeaderMap) {
    let (authorize_url, login_cookie) = start_login_with(server, host).await;
    let callback_url = authorize(&authorize_url).await;
    let mut all = vec![login_cookie.as_str()];
    all.extend_from_slice(cookies);
    callback(&callback_url, accept, &all).await
}

pub(crate) fn param(url: &url::Url, name: &str) -> Option<String> {
    url.query_pairs().find(|(k, _)| k == name).map(|(_, v)| v.into_owned())
}

/// Follows an authorize URL at the stand-in: the callback URL it sends the browser to.
pub(crate) async fn authorize(authorize_url: &url::Url) -> String {
    let response = no_redirects().get(authorize_url.as_str()).send().await.unwrap();
    assert_eq!(response.status().as_u16(), 302, "{}", response.text().await.unwrap());
    response.headers()["location"].to_str().unwrap().to_string()
}

pub(crate) async fn get_json(url: &str, accept: &str) -> (u16, String) {
    let response = no_redirects().get(url).header("accept", accept).send().await.unwrap();
    (response.status().as_u16(), response.text().await.unwrap())
}

/// A whole login as the stand-in's current user: the callback's answer.
pub(crate) async fn login(server: &ServerProcess) -> (u16, String) {
    let (status, body, _) = login_with(server, "application/json", &[]).await;
    (status, body)
}

pub(crate) fn grep_dir(dir: &Path, needle: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        for entry in entries.flatten() {
            let path = entry.path();
            let Ok(kind) = entry.file_type() else { continue };
            if kind.is_dir() {
                stack.push(path);
            } else if kind.is_file() {
                if let Ok(bytes) = std::fs::read(&path) {
                    if bytes.windows(needle.len()).any(|w| w == needle.as_bytes()) {
                        found.push(path.display().to_string());
                    }
                }
            }
        }
    }
    found
}

#[tokio::test]
async fn oauth_login_with_state_pkce_and_allow_list() {
    let tmp = tempfile::tempdir().unwrap();
    let gitlab = FakeGitlab::start(&tmp.path().join("gitlab")).await.unwrap();
    gitlab.add_user(11, "alice", "alice@example.com", true, &[]);
    gitlab.add_user(12, "bob", "bob@example.com", true, &["other"]);
    gitlab.add_user(13, "carol", "carol@example.com", true, &["acme/deployers"]);
    gitlab.add_user(14, "mallory", "alice@example.com", false, &["acme/deployers"]);
    let project = gitlab.add_project("acme/site").unwrap();
    gitlab.commit("acme/site", "main", &[("README", "hello")], "first").unwrap();
    let server = ServerProcess::start_with(tmp.path(), &["--allow-private-git-hosts"]).await.unwrap();

    // Not configured yet: a clear 404.
    let (status, body) = get_json(&server.api("/api/auth/gitlab/login"), "application/json").await;
    assert_eq!(status, 404, "{body}");
    configure(&server, &gitlab, &["alice"], &["acme/deployers"]).await;
    // A local user who happens to be called alice, made with a password.
    let (status, local_alice) = server.call(Method::POST, "/api/users", Some(json!({"name": "alice", "password": "local alice's password", "cluster_role": "cluster-admin"}))).await.unwrap();
    assert_eq!(status, 201, "{local_alice}");

    // The redirect carries state and an S256 challenge.
    let (authorize_url, login_cookie) = start_login(&server).await;
    assert!(authorize_url.as_str().starts_with(&format!("{}/oauth/authorize?", gitlab.url())), "{authorize_url}");
    assert_eq!(param(&authorize_url, "client_id").as_deref(), Some(CLIENT_ID));
    assert_eq!(param(&authorize_url, "code_challenge_method").as_deref(), Some("S256"));
    assert_eq!(param(&authorize_url, "redirect_uri").unwrap(), server.api("/api/auth/gitlab/callback"));
    let state = param(&authorize_url, "state").unwrap();
    let challenge = param(&authorize_url, "code_challenge").unwrap();
    assert!(state.len() >= 32 && challenge.len() == 43, "{authorize_url}");

    // Alice logs in: the server sent the verifier that matches the challenge.
    gitlab.login_as(11);
    let callback_url = authorize(&authorize_url).await;
    let (status, body, _) = callback(&callback_url, "application/json", &[&login_cookie]).await;
    assert_eq!(status, 200, "{body}");
    let answer: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(answer["gitlab_user"]["id"], 11);
    // GitLab's alice is not the local alice: a user of her own, by GitLab id.
    assert_ne!(answer["linked_user"], local_alice["id"], "{body}");
    assert_eq!(answer["user"]["name"], "alice-2", "{body}");
    let exchange = gitlab.token_requests().last().cloned().unwrap();
    assert_eq!(exchange.grant_type, "authorization_code");
    assert_eq!(exchange.outcome, "ok");
    assert_eq!(exchange.client_secret, CLIENT_SECRET);
    let verifier = exchange.code_verifier.clone().unwrap();
    assert!(verifier.len() >= 43, "RFC 7636: 43 to 128 characters");
    let digest = Sha256::digest(verifier.as_bytes());
    use base64::Engine;
    assert_eq!(base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(digest), challenge);

    // The same callback again, cookie and all: the state was used.
    let (status, body, _) = callback(&callback_url, "application/json", &[&login_cookie]).await;
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("state"), "{body}");
    // Missing and made-up states.
    let mut without_state = url::Url::parse(&callback_url).unwrap();
    let code = param(&without_state, "code").unwrap();
    without_state.set_query(Some(&format!("code={code}")));
    let (status, body) = get_json(without_state.as_str(), "application/json").await;
    assert_eq!(status, 400, "{body}");
    let (status, body) = get_json(&server.api(&format!("/api/auth/gitlab/callback?code={code}&state=made-up")), "application/json").await;
    assert_eq!(status, 400, "{body}");

    // A code bound to another challenge (an attacker's): the server's
    // verifier does not match and GitLab's refusal is the answer.
    let (authorize_url, swapped_cookie) = start_login(&server).await;
    let (status, body, _) = callback(&authorize(&with_other_challenge(&authorize_url)).await, "application/json", &[&swapped_cookie]).await;
    assert_eq!(status, 401, "{body}");
    assert_eq!(gitlab.token_requests().last().unwrap().outcome, "invalid_grant");

    // Bob is neither listed nor in an allowed group: a clear refusal, as a
    // page for a browser.
    gitlab.login_as(12);
    let (status, body, headers) = login_with(&server, "text/html", &[]).await;
    assert_eq!(status, 403, "{body}");
    assert!(set_cookie(&headers, "cloudweb_session").is_none(), "a refused user gets no session");
    assert!(body.contains("<html") && body.contains("not allowed to log in"), "{body}");
    gitlab.login_as(12);
    let (status, body) = login(&server).await;
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("bob") && body.contains("allow-list"), "{body}");

    // Carol comes in through her group.
    gitlab.login_as(13);
    let (status, body) = login(&server).await;
    assert_eq!(status, 200, "{body}");

    // Mallory's unconfirmed email is Alice's: she gets her own user,
    // linked by her GitLab id, never Alice's (local or GitLab).
    gitlab.login_as(14);
    let (status, body) = login(&server).await;
    assert_eq!(status, 200, "{body}");
    let mallory: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(mallory["gitlab_user"]["id"], 14);
    assert_eq!(mallory["user"]["name"], "mallory", "{body}");
    assert_ne!(mallory["linked_user"], local_alice["id"]);
    assert_ne!(mallory["linked_user"], answer["linked_user"]);
    let (_, accounts) = server.call(Method::GET, "/api/gitlab/accounts", None).await.unwrap();
    let ids: Vec<i64> = accounts["accounts"].as_array().unwrap().iter().map(|a| a["gitlab_user_id"].as_i64().unwrap()).collect();
    assert_eq!(ids, vec![11, 13, 14], "{accounts}");

    // Tokens are sealed at rest and never answered.
    for token in gitlab.access_tokens() {
        assert!(grep_dir(&tmp.path().join("server"), &token).is_empty(), "an access token is stored in clear");
        assert!(!accounts.to_string().contains(&token));
        assert!(!server.process.log_text().contains(&token), "an access token is in the log");
    }
    assert!(grep_dir(&tmp.path().join("server"), CLIENT_SECRET).is_empty(), "the client secret is stored in clear");

    // Projects and branches through Alice's token; a token about to expire
    // is refreshed first.
    gitlab.set_expires_in(60);
    gitlab.login_as(11);
    assert_eq!(login(&server).await.0, 200);
    let refreshes_before = gitlab.token_requests().iter().filter(|r| r.grant_type == "refresh_token").count();
    let (status, body) = server.call(Method::GET, "/api/gitlab/projects?account=11", None).await.unwrap();
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["projects"][0]["path"], "acme/site");
    assert_eq!(body["projects"][0]["id"], project);
    let refreshes: Vec<_> = gitlab.token_requests().into_iter().filter(|r| r.grant_type == "refresh_token").collect();
    assert_eq!(refreshes.len(), refreshes_before + 1, "the token expiring within 10 minutes was refreshed");
    assert_eq!(refreshes.last().unwrap().outcome, "ok");
    let (status, body) = server.call(Method::GET, &format!("/api/gitlab/projects/{project}/branches?account=11"), None).await.unwrap();
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["branches"][0]["name"], "main");
    // Several accounts: which one must be said.
    let (status, _) = server.call(Method::GET, "/api/gitlab/projects", None).await.unwrap();
    assert_eq!(status, 400);
}

/// A request on the user API with these cookies (no token): status and JSON.
async fn with_cookies(server: &ServerProcess, method: Method, path: &str, cookies: &[&str], csrf: Option<&str>, body: Option<Value>) -> (u16, Value) {
    let mut request = no_redirects().request(method, server.api(path)).header("cookie", cookies.join("; "));
    if let Some(csrf) = csrf {
        request = request.header("x-csrf-token", csrf);
    }
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let text = response.text().await.unwrap();
    (status, serde_json::from_str(&text).unwrap_or(Value::String(text)))
}

#[tokio::test]
async fn gitlab_login_starts_a_session_for_a_user_linked_by_gitlab_id() {
    let tmp = tempfile::tempdir().unwrap();
    let gitlab = FakeGitlab::start(&tmp.path().join("gitlab")).await.unwrap();
    gitlab.add_user(31, "erin", "erin@example.com", false, &[]);
    gitlab.add_user(32, "frank", "frank@example.com", true, &["team/devs"]);
    gitlab.add_user(33, "gina", "gina@example.com", true, &[]);
    gitlab.add_user(34, "henry", "hank@example.com", true, &[]);
    let project = gitlab.add_project("team/app").unwrap();
    gitlab.commit("team/app", "main", &[("README", "hello")], "first").unwrap();
    let server = ServerProcess::start_with(tmp.path(), &["--allow-private-git-hosts"]).await.unwrap();
    configure(&server, &gitlab, &["erin", "frank", "henry"], &[]).await;
    let (_, local_erin) = server.call(Method::POST, "/api/users", Some(json!({"name": "erin", "password": "local erin's password", "cluster_role": "cluster-admin"}))).await.unwrap();
    let (_, hank) = server.call(Method::POST, "/api/users", Some(json!({"name": "hank", "password": "hank's own password", "cluster_role": "cluster-admin"}))).await.unwrap();
    // Members of the GitLab group team/devs are admins of the default team.
    let mapping = json!({"mappings": [{"provider": "gitlab", "group": "team/devs", "team": "default", "role": "admin"}]});
    let (status, body) = server.call(Method::PUT, "/api/team-mappings", Some(mapping)).await.unwrap();
    assert_eq!(status, 200, "{body}");

    // A browser: the callback sets the session and sends it to the dashboard.
    gitlab.login_as(32);
    let (status, body, headers) = login_with(&server, "text/html,application/xhtml+xml,*/*;q=0.8", &[]).await;
    assert_eq!(status, 303, "{body}");
    assert_eq!(headers["location"], "/");
    let session_line = set_cookie(&headers, "cloudweb_session").expect("a session cookie");
    assert!(session_line.contains("HttpOnly") && session_line.contains("SameSite=Lax"), "{session_line}");
    let csrf_line = set_cookie(&headers, "cloudweb_csrf").expect("a CSRF cookie");
    let cleared = set_cookie(&headers, "cloudweb_gitlab_login").expect("the login cookie is cleared");
    assert!(cleared.contains("Max-Age=0"), "{cleared}");
    let session = cookie_pair(&session_line);
    let csrf = cookie_pair(&csrf_line).split_once('=').unwrap().1.to_string();

    // The session opens the API as frank's new local user.
    let (status, me) = with_cookies(&server, Method::GET, "/api/me", &[&session], None, None).await;
    assert_eq!(status, 200, "{me}");
    assert_eq!(me["auth"], "session");
    assert_eq!(me["user"]["name"], "frank", "{me}");
    assert_eq!(me["teams"], json!([{"team": "default", "role": "admin"}]), "the group's mapping: {me}");
    let frank_id = me["user"]["id"].clone();

    // Erin's GitLab email is unconfirmed and her name is a local user's:
    // neither links; she gets a user of her own.
    gitlab.login_as(31);
    let (status, body) = login(&server).await;
    assert_eq!(status, 200, "{body}");
    let erin: Value = serde_json::from_str(&body).unwrap();
    assert_ne!(erin["linked_user"], local_erin["id"]);
    assert_eq!(erin["user"]["name"], "erin-2", "{body}");

    // Frank's projects, through frank's own GitLab identity although there
    // are several.
    let (status, projects) = with_cookies(&server, Method::GET, "/api/gitlab/projects", &[&session], None, None).await;
    assert_eq!(status, 200, "{projects}");
    assert_eq!(projects["projects"][0]["id"], project);
    assert_eq!(gitlab.api_callers().last(), Some(&32));
    let (status, body) = with_cookies(&server, Method::GET, "/api/gitlab/projects?account=31", &[&session], None, None).await;
    assert_eq!(status, 403, "another user's GitLab identity: {body}");
    // ... and an app from a project, as frank.
    let app = unique_name("gl");
    let (status, created) = with_cookies(&server, Method::POST, "/api/apps", &[&session], Some(&csrf), Some(json!({"name": app, "gitlab_project": "team/app", "port": 8080}))).await;
    assert_eq!(status, 201, "{created}");
    assert_eq!(created["git"]["account"], 32, "{created}");
    assert_eq!(gitlab.hooks().len(), 1);
    // The admin token with several identities must still name one.
    let (status, _) = server.call(Method::GET, "/api/gitlab/projects", None).await.unwrap();
    assert_eq!(status, 400);

    // A second login of the same GitLab id is the same user; out of the
    // group by then, frank is out of the team.
    gitlab.set_groups(32, &[]);
    gitlab.login_as(32);
    let (status, body, headers) = login_with(&server, "application/json", &[]).await;
    assert_eq!(status, 200, "{body}");
    let again: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(again["linked_user"], frank_id);
    assert_eq!(again["user"]["name"], "frank");
    let later = cookie_pair(&set_cookie(&headers, "cloudweb_session").unwrap());
    let (_, me) = with_cookies(&server, Method::GET, "/api/me", &[&later], None, None).await;
    assert_eq!(me["teams"], json!([]), "{me}");
    let (status, body) = with_cookies(&server, Method::GET, &format!("/api/apps/{app}"), &[&later], None, None).await;
    assert_eq!(status, 404, "no longer frank's to see: {body}");

    // A state without its browser's cookie, or with another browser's, is
    // refused and starts no session.
    let (authorize_url, _) = start_login(&server).await;
    let callback_url = authorize(&authorize_url).await;
    let (_, other_cookie) = start_login(&server).await;
    let (status, body, headers) = callback(&callback_url, "application/json", &[]).await;
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("cookie"), "{body}");
    assert!(set_cookie(&headers, "cloudweb_session").is_none());
    let (authorize_url, _) = start_login(&server).await;
    let callback_url = authorize(&authorize_url).await;
    let (status, body, headers) = callback(&callback_url, "application/json", &[&other_cookie]).await;
    assert_eq!(status, 400, "{body}");
    assert!(set_cookie(&headers, "cloudweb_session").is_none());
    let (status, body, _) = callback(&callback_url, "application/json", &["cloudweb_gitlab_login=forged"]).await;
    assert_eq!(status, 400, "{body}");

    // Gina is not on the allow-list: no session.
    gitlab.login_as(33);
    let (status, body, headers) = login_with(&server, "application/json", &[]).await;
    assert_eq!(status, 403, "{body}");
    assert!(set_cookie(&headers, "cloudweb_session").is_none());

    // Hank, logged in with his password, connects his GitLab identity: it
    // links to him, not to a new user.
    let response = no_redirects().post(server.api("/api/session")).json(&json!({"name": "hank", "password": "hank's own password"})).send().await.unwrap();
    assert_eq!(response.status().as_u16(), 200);
    let hank_session = cookie_pair(&set_cookie(response.headers(), "cloudweb_session").unwrap());
    gitlab.login_as(34);
    let (status, body, headers) = login_with(&server, "application/json", &[&hank_session]).await;
    assert_eq!(status, 200, "{body}");
    let linked: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(linked["linked_user"], hank["id"], "{body}");
    let hank_session = cookie_pair(&set_cookie(&headers, "cloudweb_session").unwrap());
    // Frank's identity is frank's: hank's browser cannot take it.
    gitlab.login_as(32);
    let (status, body, headers) = login_with(&server, "application/json", &[&hank_session]).await;
    assert_eq!(status, 409, "{body}");
    assert!(set_cookie(&headers, "cloudweb_session").is_none());

    // A disabled user is refused.
    let (status, _) = server.call(Method::DELETE, &format!("/api/users/{}", frank_id.as_str().unwrap()), None).await.unwrap();
    assert_eq!(status, 204);
    let (status, body, headers) = login_with(&server, "application/json", &[]).await;
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("disabled"), "{body}");
    assert!(set_cookie(&headers, "cloudweb_session").is_none());
}

/// A dashboard page (HTML) with these cookies: status and body.
pub(crate) async fn page(server: &ServerProcess, path: &str, cookies: &[&str]) -> (u16, String) {
    let response = no_redirects().get(server.api(path)).header("cookie", cookies.join("; ")).send().await.unwrap();
    let status = response.status().as_u16();
    (status, response.text().await.unwrap())
}

/// The CSRF token of a dashboard page's forms.
pub(crate) fn page_csrf(page: &str) -> String {
    let field = "name=\"csrf_token\" value=\"";
    let start = page.find(field).expect("a form with a CSRF field") + field.len();
    page[start..start + page[start..].find('"').unwrap()].to_string()
}

#[tokio::test]
async fn the_dashboard_creates_an_app_from_the_users_own_gitlab_project() {
    let tmp = tempfile::tempdir().unwrap();
    let gitlab = FakeGitlab::start(&tmp.path().join("gitlab")).await.unwrap();
    gitlab.add_user(41, "ivy", "ivy@example.com", true, &["ivy"]);
    gitlab.add_user(42, "jon", "jon@example.com", true, &[]);
    let project = gitlab.add_project("ivy/site").unwrap();
    gitlab.commit("ivy/site", "main", &[("index.html", "hello\n")], "first").unwrap();
    let server = ServerProcess::start_with(tmp.path(), &["--allow-private-git-hosts"]).await.unwrap();
    let accept = "text/html,application/xhtml+xml,*/*;q=0.8";

    // Before GitLab is configured, the form asks for a git URL only.
    let (_, password_user) = server.call(Method::POST, "/api/users", Some(json!({"name": "kim", "password": "kim's own password", "cluster_role": "cluster-admin"}))).await.unwrap();
    assert!(password_user["id"].is_string(), "{password_user}");
    let response = no_redirects().post(server.api("/login")).form(&[("name", "kim"), ("password", "kim's own password")]).send().await.unwrap();
    assert_eq!(response.status().as_u16(), 303);
    let kim = cookie_pair(&set_cookie(response.headers(), "cloudweb_session").unwrap());
    let (status, body) = page(&server, "/apps", &[&kim]).await;
    assert_eq!(status, 200, "{body}");
    assert!(!body.contains("gitlab_project"), "no GitLab projects without GitLab: {body}");
    assert!(body.contains("name=\"repo_url\" required"), "{body}");

    configure(&server, &gitlab, &["ivy", "jon"], &[]).await;
    let mapping = json!({"mappings": [{"provider": "gitlab", "group": "ivy", "team": "default", "role": "admin"}]});
    assert_eq!(server.call(Method::PUT, "/api/team-mappings", Some(mapping)).await.unwrap().0, 200);
    // Jon logs in with GitLab first: two identities exist, and ivy's page
    // must still list through ivy's own one.
    gitlab.login_as(42);
    assert_eq!(login(&server).await.0, 200);
    gitlab.login_as(41);
    let (status, body, headers) = login_with(&server, accept, &[]).await;
    assert_eq!(status, 303, "{body}");
    let session = cookie_pair(&set_cookie(&headers, "cloudweb_session").expect("a session cookie"));

    let callers_before = gitlab.api_callers().len();
    let (status, body) = page(&server, "/apps", &[&session]).await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains(&format!("<option value=\"{project}\">ivy/site</option>")), "ivy's project is offered: {body}");
    assert!(gitlab.api_callers()[callers_before..].iter().all(|c| *c == 41), "listed as ivy: {:?}", gitlab.api_callers());
    assert!(!body.contains("name=\"repo_url\" required"), "the git URL is optional next to a project: {body}");
    // A user with no GitLab identity still gets the git-URL form only.
    let (_, body_kim) = page(&server, "/apps", &[&kim]).await;
    assert!(!body_kim.contains("gitlab_project") && body_kim.contains("name=\"repo_url\" required"), "{body_kim}");

    // Creating from it: the app's git account is ivy's, its webhook registered.
    let csrf = page_csrf(&body);
    let app = unique_name("dash");
    let response = no_redirects()
        .post(server.api("/apps"))
        .header("cookie", &session)
        .form(&[("name", app.as_str()), ("gitlab_project", project.to_string().as_str()), ("repo_url", ""), ("branch", ""), ("port", "8080"), ("csrf_token", csrf.as_str())])
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 303);
    assert_eq!(response.headers()["location"], format!("/apps/{app}").as_str());
    let (status, created) = server.call(Method::GET, &format!("/api/apps/{app}"), None).await.unwrap();
    assert_eq!(status, 200, "{created}");
    assert_eq!(created["git"]["provider"], "gitlab", "{created}");
    assert_eq!(created["git"]["account"], 41, "{created}");
    assert_eq!(created["repo_url"], format!("{}/ivy/site.git", gitlab.url()));
    assert_eq!(created["branch"], "main", "the project's default branch");
    let hooks = gitlab.hooks();
    assert_eq!(hooks.len(), 1, "{hooks:?}");
    assert_eq!(hooks[0].project, project);
    assert_eq!(hooks[0].url, server.api("/api/webhooks/gitlab"));
    let (status, body) = page(&server, &format!("/apps/{app}"), &[&session]).await;
    assert_eq!(status, 200);
    assert!(body.contains("ivy/site.git"), "{body}");

    // A project id that is not a number is refused with a clear message.
    let response = no_redirects()
        .post(server.api("/apps"))
        .header("cookie", &session)
        .form(&[("name", "other"), ("gitlab_project", "../x"), ("port", "8080"), ("csrf_token", csrf.as_str())])
        .send()
        .await
        .unwrap();
    // The form comes back with the reason next to it (issue 21 item 11).
    assert_eq!(response.status(), 400);
    let body = response.text().await.unwrap();
    assert!(body.contains("invalid gitlab_project"), "{body}");
    assert_eq!(gitlab.hooks().len(), 1);

    // GitLab unreachable: the page says why and the git-URL form still works.
    let (status, body) = server
        .call(Method::PUT, "/api/gitlab/settings", Some(json!({"base_url": "http://127.0.0.1:9", "client_id": CLIENT_ID, "allowed_users": ["ivy", "jon"]})))
        .await
        .unwrap();
    assert_eq!(status, 200, "{body}");
    let (status, body) = page(&server, "/apps", &[&session]).await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("id=\"gitlab-projects-error\""), "the reason is shown: {body}");
    assert!(!body.contains("<option value=\"{project}\""), "{body}");
    assert!(body.contains("name=\"repo_url\" required"), "{body}");
    let plain = unique_name("url");
    let response = no_redirects()
        .post(server.api("/apps"))
        .header("cookie", &session)
        .form(&[("name", plain.as_str()), ("repo_url", "https://example.com/team/site.git"), ("branch", "main"), ("port", "8080"), ("csrf_token", page_csrf(&body).as_str())])
        .send()
        .await
        .unwrap();
    assert_eq!(response.headers()["location"], format!("/apps/{plain}").as_str());
    let (status, created) = server.call(Method::GET, &format!("/api/apps/{plain}"), None).await.unwrap();
    assert_eq!(status, 200, "{created}");
    assert_eq!(created["repo_url"], "https://example.com/team/site.git");
}

pub(crate) const AGENT_FLAGS: [&str; 6] = ["--heartbeat-interval-seconds", "1", "--publish-ip", "127.0.0.1", "--advertise-host", "127.0.0.1"];

pub(crate) async fn deployments(server: &ServerProcess, app: &str) -> Vec<Value> {
    let (status, body) = server.call(Method::GET, &format!("/api/apps/{app}/deployments"), None).await.unwrap();
    assert_eq!(status, 200, "{body}");
    body["deployments"].as_array().unwrap().clone()
}

pub(crate) async fn settle(server: &ServerProcess, agent: &AgentNode, id: &str) -> Value {
    let result = wait_for(Duration::from_secs(180), "the deployment to settle", || async {
        let (_, body) = server.call(Method::GET, &format!("/api/deployments/{id}"), None).await.ok()?;
        matches!(body["state"].as_str(), Some("running" | "failed")).then_some(body)
    })
    .await;
    match result {
        Ok(body) => body,
        Err(err) => panic!("{err}\nagent log:\n{}\nserver log:\n{}", agent.log_text(), server.process.log_text()),
    }
}

pub(crate) async fn post_webhook(server: &ServerProcess, path: &str, headers: &[(&str, &str)], body: Vec<u8>) -> (u16, Value) {
    let mut request = reqwest::Client::new().post(server.api(path)).header("content-type", "application/json").body(body);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let text = response.text().await.unwrap();
    (status, serde_json::from_str(&text).unwrap_or(Value::String(text)))
}

pub(crate) fn hmac_sha256(key: &[u8], body: &[u8]) -> String {
    // HMAC (RFC 2104) over SHA-256, written out so the test does not share
    // the server's implementation.
    let mut block = [0u8; 64];
    if key.len() > 64 {
        block[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        block[..key.len()].copy_from_slice(key);
    }
    let inner_key: Vec<u8> = block.iter().map(|b| b ^ 0x36).collect();
    let outer_key: Vec<u8> = block.iter().map(|b| b ^ 0x5c).collect();
    let inner = Sha256::new().chain_update(&inner_key).chain_update(body).finalize();
    let outer = Sha256::new().chain_update(&outer_key).chain_update(inner).finalize();
    format!("sha256={}", hex::encode(outer))
}

#[tokio::test]
async fn a_push_deploys_its_checkout_sha_with_statuses_and_one_time_credentials() {
    let Platform { tmp, git, server } = start_platform(&[]).await.unwrap();
    let gitlab = FakeGitlab::start(&tmp.path().join("gitlab")).await.unwrap();
    gitlab.add_user(21, "alice", "alice@example.com", true, &[]);
    let project = gitlab.add_project("acme/site").unwrap();
    let first = gitlab.commit("acme/site", "main", &[("Dockerfile", DOCKERFILE), ("index.html", "first\n")], "first").unwrap();
    configure(&server, &gitlab, &["alice"], &[]).await;
    gitlab.login_as(21);
    assert_eq!(login(&server).await.0, 200);

    let (token, ca) = server.join_token().await.unwrap();
    let mut agent = AgentNode::join(&server, &tmp.path().join("node"), "builder", &token, &ca, &[]).unwrap().unwrap();
    agent.start(&AGENT_FLAGS).unwrap();
    let node_id = agent.node_id.clone();
    wait_for(Duration::from_secs(20), "node ready", || async { (server.node(&node_id).await.ok()?["state"] == "ready").then_some(()) }).await.unwrap();

    // The app from the GitLab project: clone URL and branch from GitLab, a
    // push webhook with its own secret registered there.
    let app = unique_name("gl");
    let (status, created) = server.call(Method::POST, "/api/apps", Some(json!({"name": app, "gitlab_project": "acme/site", "port": 8080}))).await.unwrap();
    assert_eq!(status, 201, "{created}");
    assert_eq!(created["repo_url"], format!("{}/acme/site.git", gitlab.url()));
    assert_eq!(created["branch"], "main");
    assert_eq!(created["git"]["provider"], "gitlab");
    let hooks = gitlab.hooks();
    assert_eq!(hooks.len(), 1);
    let hook = hooks[0].clone();
    assert_eq!(hook.url, server.api("/api/webhooks/gitlab"));
    assert_eq!(hook.branch_filter.as_deref(), Some("main"));
    assert!(hook.token.len() >= 32);
    assert!(!created.to_string().contains(&hook.token), "the webhook secret is not in the answer");
    assert!(deployments(&server, &app).await.is_empty());

    // One push of two commits deploys the last one, once.
    let second = gitlab.commit("acme/site", "main", &[("index.html", "second\n")], "second").unwrap();
    let third = gitlab.commit("acme/site", "main", &[("index.html", "third\n")], "third").unwrap();
    let push = gitlab.push_body(project, "refs/heads/main", &first, &[&second, &third]);
    let answers = gitlab.deliver(project, &push, "7b0b4c4e-1f7a-4a2e-9d7c-2b6c1f0e9a11").await.unwrap();
    assert_eq!(answers[0].0, 202, "{:?}", answers);
    let id = answers[0].1["deployment"].as_str().unwrap().to_string();
    let deployment = settle(&server, &agent, &id).await;
    assert_eq!(deployment["state"], "running", "{deployment}");
    assert_eq!(deployment["commit"], third.as_str());
    let address = deployment["instances"][0]["address"].as_str().unwrap().to_string();
    let served = reqwest::get(format!("http://{address}/index.html")).await.unwrap().text().await.unwrap();
    assert_eq!(served, "third\n");

    // Statuses pending → running → success, linking to the deployment.
    let statuses = wait_for(Duration::from_secs(20), "the success status", || async {
        let statuses = gitlab.statuses(&third);
        statuses.iter().any(|s| s.state == "success").then_some(statuses)
    })
    .await
    .unwrap();
    let states: Vec<&str> = statuses.iter().map(|s| s.state.as_str()).collect();
    assert_eq!(states, vec!["pending", "running", "success"], "{statuses:?}");
    assert!(statuses.iter().all(|s| s.target_url.ends_with(&format!("/deployments/{id}")) && !s.target_url.contains("/api/") && s.reference == "main" && s.project == project));

    // The clone used a deploy token made for this deploy, now revoked.
    let tokens = wait_for(Duration::from_secs(20), "the deploy token revoked", || async {
        let tokens = gitlab.deploy_tokens();
        (tokens.len() == 1 && tokens[0].revoked).then_some(tokens)
    })
    .await
    .unwrap();
    let clone_token = tokens[0].token.clone();
    assert!(tokens[0].expires_at.is_some());
    assert_eq!(gitlab.git_clones().iter().filter(|u| **u == tokens[0].username).count(), gitlab.git_clones().len(), "every clone used the deploy token");
    assert!(!gitlab.git_clones().is_empty());
    // Nowhere on the node's disk, in any log or API answer.
    assert!(grep_dir(&agent.dir, &clone_token).is_empty(), "the clone token stayed on the node's disk");
    assert!(grep_dir(&tmp.path().join("server"), &clone_token).is_empty(), "the clone token is stored in clear");
    assert!(!agent.log_text().contains(&clone_token), "the clone token is in the agent's log");
    assert!(!server.process.log_text().contains(&clone_token), "the clone token is in the server's log");
    let (_, app_view) = server.call(Method::GET, &format!("/api/apps/{app}"), None).await.unwrap();
    let logs = server.http.get(server.api(&format!("/api/deployments/{id}/logs"))).bearer_auth(&server.admin_token).send().await.unwrap().text().await.unwrap();
    assert!(logs.contains("event: end"), "{logs}");
    let (_, commands) = server.call(Method::GET, &format!("/api/nodes/{node_id}/commands"), None).await.unwrap();
    for answer in [app_view.to_string(), deployment.to_string(), logs.to_string(), commands.to_string(), json!(deployments(&server, &app).await).to_string()] {
        assert!(!answer.contains(&clone_token) && !answer.contains(&hook.token));
        for access in gitlab.access_tokens() {
            assert!(!answer.contains(&access));
        }
    }

    // The same delivery again: nothing more.
    let answers = gitlab.deliver(project, &push, "7b0b4c4e-1f7a-4a2e-9d7c-2b6c1f0e9a11").await.unwrap();
    assert_eq!(answers[0].0, 200, "{:?}", answers);
    assert_eq!(answers[0].1["ignored"], "redelivery");
    assert_eq!(answers[0].1["deployment"], id.as_str());
    // Issue 20 item 6: a captured push replayed under a fresh event UUID
    // (not signed, so a replay may carry any) is the same delivery...
    let answers = gitlab.deliver(project, &push, "0f0e0d0c-aaaa-4bbb-8ccc-000000000001").await.unwrap();
    assert_eq!((answers[0].0, answers[0].1["ignored"].as_str()), (200, Some("redelivery")), "{answers:?}");
    // ...and another push of the commit the app already runs starts nothing.
    let again = gitlab.push_body(project, "refs/heads/main", &second, &[&third]);
    let answers = gitlab.deliver(project, &again, "0f0e0d0c-aaaa-4bbb-8ccc-000000000002").await.unwrap();
    assert_eq!((answers[0].0, answers[0].1["ignored"].as_str()), (200, Some("already running this commit")), "{answers:?}");
    assert_eq!(answers[0].1["deployment"], id.as_str());
    // Another branch and a tag: acknowledged, ignored.
    let other = gitlab.commit("acme/site", "feature", &[("index.html", "feature\n")], "feature").unwrap();
    let answers = gitlab.deliver(project, &gitlab.push_body(project, "refs/heads/feature", &third, &[&other]), "uuid-other-branch").await.unwrap();
    assert_eq!((answers[0].0, answers[0].1["ignored"].as_str()), (200, Some("push to another branch")));
    let tagged = gitlab.tag("acme/site", "v1").unwrap();
    let answers = gitlab.deliver(project, &gitlab.push_body(project, "refs/tags/v1", "0000000000000000000000000000000000000000", &[&tagged]), "uuid-tag").await.unwrap();
    assert_eq!((answers[0].0, answers[0].1["ignored"].as_str()), (200, Some("tag push")));
    // Wrong and empty tokens.
    let body = serde_json::to_vec(&push).unwrap();
    let event = [("x-gitlab-event", "Push Hook"), ("x-gitlab-event-uuid", "uuid-bad-token")];
    let (status, answer) = post_webhook(&server, "/api/webhooks/gitlab", &[event[0], event[1], ("x-gitlab-token", "not-the-secret")], body.clone()).await;
    assert_eq!(status, 401, "{answer}");
    let (status, answer) = post_webhook(&server, "/api/webhooks/gitlab", &[event[0], event[1], ("x-gitlab-token", "")], body.clone()).await;
    assert_eq!(status, 401, "{answer}");
    let (status, _) = post_webhook(&server, "/api/webhooks/gitlab", &event, body.clone()).await;
    assert_eq!(status, 401);
    // 1 MiB + 1 and 2 MiB bodies, even with the right token. Sent with
    // curl, which asks `Expect: 100-continue` for a large body as GitLab's
    // HTTP client and other real senders do, so the early 413 is read
    // instead of the connection being cut mid-upload.
    for size in [(1 << 20) + 1, 2 << 20] {
        let mut big = body.clone();
        big.resize(size, b' ');
        let file = tmp.path().join("big.json");
        std::fs::write(&file, &big).unwrap();
        let output = std::process::Command::new("curl")
            .args(["-sS", "-X", "POST", "-H", "content-type: application/json", "-H", "x-gitlab-event: Push Hook", "-H", "x-gitlab-event-uuid: uuid-big"])
            .args(["-H", &format!("x-gitlab-token: {}", hook.token)])
            .args(["--data-binary", &format!("@{}", file.display()), "-w", "\n%{http_code}", &server.api("/api/webhooks/gitlab")])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&output.stdout).into_owned();
        let (answer, status) = text.rsplit_once('\n').unwrap();
        assert_eq!(status, "413", "{size} bytes: {text} {}", String::from_utf8_lossy(&output.stderr));
        assert!(answer.contains("larger than 1 MiB"), "{answer}");
    }
    let all = deployments(&server, &app).await;
    assert_eq!(all.len(), 1, "exactly one deployment: {all:?}");

    // The generic provider: any git URL, a signed webhook.
    let generic = unique_name("gen");
    let commit = git.commit(&generic, &[("Dockerfile", DOCKERFILE), ("index.html", "generic\n")], "first").unwrap();
    let (status, created) = server.call(Method::POST, "/api/apps", Some(json!({"name": generic, "repo_url": git.url(&generic), "port": 8080, "webhook": true}))).await.unwrap();
    assert_eq!(status, 201, "{created}");
    let url = created["git"]["webhook"]["url"].as_str().unwrap().to_string();
    let secret = created["git"]["webhook"]["secret"].as_str().unwrap().to_string();
    assert_eq!(url, server.api(&format!("/api/webhooks/generic/{generic}")));
    let (_, shown) = server.call(Method::GET, &format!("/api/apps/{generic}"), None).await.unwrap();
    assert!(!shown.to_string().contains(&secret), "the secret is shown once only");
    let path = format!("/api/webhooks/generic/{generic}");
    let body = serde_json::to_vec(&json!({"ref": "refs/heads/main", "after": commit})).unwrap();
    // Signed with the time: "<unix seconds>.<body>".
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64;
    let timed = |key: &[u8], at: i64| (at.to_string(), hmac_sha256(key, &[at.to_string().as_bytes(), b".", &body].concat()));
    let (at, wrong) = timed(b"wrong", now);
    let (status, answer) = post_webhook(&server, &path, &[("x-cloudweb-timestamp", at.as_str()), ("x-cloudweb-signature", wrong.as_str())], body.clone()).await;
    assert_eq!(status, 401, "{answer}");
    let (status, _) = post_webhook(&server, &path, &[], body.clone()).await;
    assert_eq!(status, 401);
    // Issue 20 item 6: the body signed alone under our header, or a
    // signature from more than 5 minutes ago, is refused.
    let untimed = hmac_sha256(secret.as_bytes(), &body);
    let (status, answer) = post_webhook(&server, &path, &[("x-cloudweb-signature", untimed.as_str())], body.clone()).await;
    assert!(status == 401 && answer.to_string().contains("X-Cloudweb-Timestamp"), "{status} {answer}");
    let (old, stale) = timed(secret.as_bytes(), now - 600);
    let (status, answer) = post_webhook(&server, &path, &[("x-cloudweb-timestamp", old.as_str()), ("x-cloudweb-signature", stale.as_str())], body.clone()).await;
    assert!(status == 401 && answer.to_string().contains("from the server's clock"), "{status} {answer}");
    let (at, signature) = timed(secret.as_bytes(), now);
    let signed = [("x-cloudweb-timestamp", at.as_str()), ("x-cloudweb-signature", signature.as_str())];
    let (status, answer) = post_webhook(&server, &path, &[signed[0], signed[1], ("x-cloudweb-delivery", "d-1")], body.clone()).await;
    assert_eq!(status, 202, "{answer}");
    let generic_id = answer["deployment"].as_str().unwrap().to_string();
    // Replayed within the 5 minutes under another delivery id: the same delivery.
    let (status, answer) = post_webhook(&server, &path, &[signed[0], signed[1], ("x-cloudweb-delivery", "d-2")], body.clone()).await;
    assert_eq!((status, answer["ignored"].as_str()), (200, Some("redelivery")));
    // GitHub's body-only header for the same commit, freshly signed: the newest deployment is that commit already.
    let (status, answer) = post_webhook(&server, &path, &[("x-hub-signature-256", untimed.as_str())], body.clone()).await;
    assert!(status == 200 && answer["ignored"].as_str().unwrap_or_default().starts_with("already"), "{status} {answer}");
    security_summary(
        "6 webhook replay",
        "GitLab push replayed under a new event UUID: redelivery; a push of the running commit: ignored; generic webhook unsigned time, 10-minute-old signature: 401; replay within 5 minutes under a new delivery id: redelivery",
    );
    let tag = serde_json::to_vec(&json!({"ref": "refs/tags/v1", "after": commit})).unwrap();
    let (status, answer) = post_webhook(&server, &path, &[("x-hub-signature-256", hmac_sha256(secret.as_bytes(), &tag).as_str())], tag).await;
    assert_eq!((status, answer["ignored"].as_str()), (200, Some("tag push")));
    // Forgejo's header (bare hex) is taken too; a wrong one is not.
    let tag = serde_json::to_vec(&json!({"ref": "refs/tags/v2", "after": commit})).unwrap();
    let bare = hmac_sha256(secret.as_bytes(), &tag).trim_start_matches("sha256=").to_string();
    let (status, _) = post_webhook(&server, &path, &[("x-forgejo-signature", &bare[1..])], tag.clone()).await;
    assert_eq!(status, 401);
    let (status, answer) = post_webhook(&server, &path, &[("x-forgejo-signature", bare.as_str())], tag).await;
    assert_eq!((status, answer["ignored"].as_str()), (200, Some("tag push")));
    let deployment = settle(&server, &agent, &generic_id).await;
    assert_eq!(deployment["state"], "running", "{deployment}");
    assert_eq!(deployment["commit"], commit.as_str());
    assert_eq!(deployments(&server, &generic).await.len(), 1);

    // Deleting the GitLab app removes its hook at GitLab.
    let (status, _) = server.call(Method::DELETE, &format!("/api/apps/{app}"), None).await.unwrap();
    assert_eq!(status, 204);
    assert!(gitlab.hooks()[0].removed);
    agent.remove_containers();
}
