//! Accounts on the control plane started in-process (the same `start` as
//! the binary) with a clock the test moves: password login and its cookie,
//! session expiry and logout, CSRF refusals, personal API tokens, the login
//! rate limit, and the OpenAPI document checked against the router and the
//! authentication gate for every route it lists.

use std::time::Duration;

use cloudweb_e2e::control::Control;
use cloudweb_server::config::Config;
use reqwest::header::{HeaderMap, SET_COOKIE};
use reqwest::Method;
use serde_json::{json, Value};

const PASSWORD: &str = "correct horse battery staple";

async fn control(tweak: impl FnOnce(&mut Config)) -> (tempfile::TempDir, Control) {
    let dir = tempfile::tempdir().unwrap();
    let cp = Control::start(dir.path(), tweak).await;
    (dir, cp)
}

async fn user(cp: &Control, name: &str) {
    let store = &cp.server.state.store;
    cloudweb_server::auth::users::create(store, cp.server.state.clock.now_ms(), name, Some(PASSWORD), Some(cloudweb_server::access::ClusterRole::Admin)).await.unwrap();
}

fn url(cp: &Control, path: &str) -> String {
    format!("http://{}{path}", cp.server.api_addr)
}

/// A browser's session, kept by hand so the test sees every cookie flag.
#[derive(Clone)]
struct Session {
    cookie: String,
    csrf: String,
    set_cookies: Vec<String>,
}

fn cookies(headers: &HeaderMap) -> Vec<String> {
    headers.get_all(SET_COOKIE).iter().map(|v| v.to_str().unwrap().to_string()).collect()
}

fn cookie_value(set_cookies: &[String], name: &str) -> Option<String> {
    set_cookies.iter().find_map(|c| c.split(';').next()?.strip_prefix(&format!("{name}=")).map(str::to_string))
}

async fn login_as(cp: &Control, name: &str, password: &str, headers: &[(&str, &str)]) -> (u16, HeaderMap, String) {
    let mut request = cp.http.post(url(cp, "/api/session")).json(&json!({"name": name, "password": password}));
    for (k, v) in headers {
        request = request.header(*k, *v);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    (status, headers, response.text().await.unwrap())
}

async fn login(cp: &Control, name: &str) -> Session {
    let (status, headers, body) = login_as(cp, name, PASSWORD, &[]).await;
    assert_eq!(status, 200, "{body}");
    let set_cookies = cookies(&headers);
    let body: Value = serde_json::from_str(&body).unwrap();
    let cookie = cookie_value(&set_cookies, "cloudweb_session").expect("session cookie");
    let csrf = body["csrf_token"].as_str().unwrap().to_string();
    assert_eq!(cookie_value(&set_cookies, "cloudweb_csrf").as_deref(), Some(csrf.as_str()));
    Session { cookie, csrf, set_cookies }
}

/// A request with the session cookie (and the CSRF token when `csrf`).
async fn with_session(cp: &Control, s: &Session, method: Method, path: &str, csrf: bool, extra: &[(&str, &str)], body: Option<Value>) -> (u16, Value) {
    let mut request = cp.http.request(method, url(cp, path)).header("cookie", format!("cloudweb_session={}", s.cookie));
    if csrf {
        request = request.header("x-csrf-token", &s.csrf);
    }
    for (k, v) in extra {
        request = request.header(*k, *v);
    }
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    (status, serde_json::from_str(&response.text().await.unwrap()).unwrap_or(Value::Null))
}

async fn with_bearer(cp: &Control, token: &str, method: Method, path: &str, body: Option<Value>) -> (u16, Value) {
    let mut request = cp.http.request(method, url(cp, path)).bearer_auth(token);
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    (status, serde_json::from_str(&response.text().await.unwrap()).unwrap_or(Value::Null))
}

fn app(name: &str) -> Value {
    json!({"name": name, "repo_url": "https://git.example.com/app.git", "port": 8080})
}

#[tokio::test]
async fn login_sets_a_flagged_session_cookie_and_wrong_passwords_are_refused() {
    let (_dir, cp) = control(|_| {}).await;
    user(&cp, "alice").await;

    // Wrong password and unknown user: the same 401, no cookie.
    for (name, password) in [("alice", "wrong password!!"), ("nobody", PASSWORD)] {
        let (status, headers, body) = login_as(&cp, name, password, &[]).await;
        assert_eq!(status, 401, "{body}");
        assert!(body.contains("wrong name or password"), "{body}");
        assert!(cookies(&headers).is_empty());
    }
    // Malformed logins are 400.
    let response = cp.http.post(url(&cp, "/api/session")).body("{").header("content-type", "application/json").send().await.unwrap();
    assert_eq!(response.status(), 400);

    let session = login(&cp, "alice").await;
    for cookie in &session.set_cookies {
        assert!(cookie.contains("; SameSite=Lax") && cookie.contains("; Path=/"), "{cookie}");
        // The browser is on the control plane's own machine, speaking
        // plain HTTP to a loopback listener: no Secure (documented).
        assert!(!cookie.contains("Secure"), "{cookie}");
    }
    let session_cookie = session.set_cookies.iter().find(|c| c.starts_with("cloudweb_session=")).unwrap();
    assert!(session_cookie.contains("; HttpOnly"), "{session_cookie}");
    assert!(session.cookie.starts_with("cws_") && session.cookie.len() == 68, "{}", session.cookie);
    // The database holds the id's digest, never the id.
    let digest = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(session.cookie.as_bytes()));
    assert!(cp.server.state.store.session(&digest).await.unwrap().is_some());

    // Reached through a proxy or by a public name: Secure.
    for header in [("host", "cp.example.com"), ("x-forwarded-proto", "https")] {
        let (status, headers, _) = login_as(&cp, "alice", PASSWORD, &[header]).await;
        assert_eq!(status, 200);
        for cookie in cookies(&headers) {
            assert!(cookie.contains("; Secure") && cookie.contains("SameSite=Lax"), "{header:?}: {cookie}");
        }
    }

    // The session says who it is, with its CSRF token.
    let (status, me) = with_session(&cp, &session, Method::GET, "/api/me", false, &[], None).await;
    assert_eq!(status, 200, "{me}");
    assert_eq!(me["auth"], "session");
    assert_eq!(me["user"]["name"], "alice");
    assert_eq!(me["csrf_token"], session.csrf.as_str());
    assert!(!me.to_string().contains(&session.cookie) && !me.to_string().contains(PASSWORD), "{me}");
    let (_, me) = cp.call(Method::GET, "/api/me", None).await;
    assert_eq!(me, json!({"auth": "admin_token", "cluster_role": "cluster-admin", "teams": []}));

    // A form login (the dashboard's) answers with a redirect to `next`.
    let response = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
        .post(url(&cp, "/api/session"))
        .form(&[("name", "alice"), ("password", PASSWORD), ("next", "/apps")])
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 303);
    assert_eq!(response.headers()["location"], "/apps");
    assert!(cookie_value(&cookies(response.headers()), "cloudweb_session").is_some());
    let response = cp.http.post(url(&cp, "/api/session")).form(&[("name", "alice"), ("password", PASSWORD), ("next", "//evil.example.com")]).send().await.unwrap();
    assert_eq!(response.status(), 400, "an open redirect is refused");
    // A login posted from another site is refused.
    let (status, _, _) = login_as(&cp, "alice", PASSWORD, &[("origin", "https://evil.example.com")]).await;
    assert_eq!(status, 403);
}

#[tokio::test]
async fn every_api_route_accepts_the_admin_token_a_personal_token_and_a_session() {
    let (_dir, cp) = control(|_| {}).await;
    user(&cp, "alice").await;
    let session = login(&cp, "alice").await;
    let (status, created) = with_session(&cp, &session, Method::POST, "/api/tokens", true, &[], Some(json!({"name": "ci"}))).await;
    assert_eq!(status, 201, "{created}");
    let token = created["token"].as_str().unwrap().to_string();

    assert_eq!(cp.call(Method::POST, "/api/apps", Some(app("by-admin"))).await.0, 201);
    assert_eq!(with_bearer(&cp, &token, Method::POST, "/api/apps", Some(app("by-token"))).await.0, 201);
    assert_eq!(with_session(&cp, &session, Method::POST, "/api/apps", true, &[], Some(app("by-session"))).await.0, 201);
    for (status, list) in [
        cp.call(Method::GET, "/api/apps", None).await,
        with_bearer(&cp, &token, Method::GET, "/api/apps", None).await,
        with_session(&cp, &session, Method::GET, "/api/apps", false, &[], None).await,
    ] {
        assert_eq!(status, 200);
        assert_eq!(list["apps"].as_array().map(Vec::len), Some(3), "{list}");
    }
    let metrics = cp.http.get(url(&cp, "/metrics")).bearer_auth(&token).send().await.unwrap();
    assert_eq!(metrics.status(), 200);
    // Users make users; the answer and the list never hold a password or hash.
    let (status, bob) = with_session(&cp, &session, Method::POST, "/api/users", true, &[], Some(json!({"name": "bob", "password": PASSWORD, "cluster_role": "cluster-admin"}))).await;
    assert_eq!(status, 201, "{bob}");
    assert_eq!(bob["name"], "bob");
    assert_eq!(with_bearer(&cp, &token, Method::POST, "/api/users", Some(json!({"name": "BOB", "password": "another password"}))).await.0, 409);
    assert_eq!(cp.call(Method::POST, "/api/users", Some(json!({"name": "carol", "password": "short"}))).await.0, 400);
    assert_eq!(cp.call(Method::POST, "/api/users", Some(json!({"name": "carol", "password": "long enough!", "admin": true}))).await.0, 400);
    let (_, users) = cp.call(Method::GET, "/api/users", None).await;
    let names: Vec<&str> = users.as_array().unwrap().iter().map(|u| u["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["alice", "bob"]);
    assert!(users[1].get("disabled_at").is_none(), "{users}");
    assert!(!users.to_string().contains("argon2") && !users.to_string().contains("password"), "{users}");
    let bob_session = login(&cp, "bob").await;
    let (_, bob_token) = with_session(&cp, &bob_session, Method::POST, "/api/tokens", true, &[], Some(json!({"name": "b"}))).await;
    let bob_token = bob_token["token"].as_str().unwrap().to_string();
    let bob_id = bob["id"].as_str().unwrap().to_string();
    // Disabling a user ends their sessions and tokens at once.
    assert_eq!(with_session(&cp, &bob_session, Method::DELETE, &format!("/api/users/{bob_id}"), true, &[], None).await.0, 409, "not yourself");
    assert_eq!(with_session(&cp, &session, Method::DELETE, &format!("/api/users/{bob_id}"), true, &[], None).await.0, 204);
    assert_eq!(with_session(&cp, &bob_session, Method::GET, "/api/me", false, &[], None).await.0, 401);
    assert_eq!(with_bearer(&cp, &bob_token, Method::GET, "/api/me", None).await.0, 401);
    assert_eq!(login_as(&cp, "bob", PASSWORD, &[]).await.0, 401);
    assert_eq!(cp.call(Method::DELETE, "/api/users/usr_nobody", None).await.0, 404);

    let (status, me) = with_bearer(&cp, &token, Method::GET, "/api/me", None).await;
    assert_eq!((status, me["auth"].as_str(), me["user"]["name"].as_str()), (200, Some("api_token"), Some("alice")), "{me}");
    assert!(me.get("csrf_token").is_none());
}

#[tokio::test]
async fn cookie_requests_that_change_things_need_the_csrf_token_and_this_origin() {
    let (_dir, cp) = control(|_| {}).await;
    user(&cp, "alice").await;
    let s = login(&cp, "alice").await;
    let post = |csrf: bool, extra: &'static [(&'static str, &'static str)], name: &'static str| {
        let cp = &cp;
        let s = s.clone();
        async move { with_session(cp, &s, Method::POST, "/api/apps", csrf, extra, Some(app(name))).await }
    };
    let (status, body) = post(false, &[], "a").await;
    assert_eq!(status, 403, "{body}");
    assert!(body["error"].as_str().unwrap().contains("CSRF"), "{body}");
    assert_eq!(post(false, &[("x-csrf-token", "0000")], "a").await.0, 403, "a wrong token");
    assert_eq!(post(true, &[("origin", "https://evil.example.com")], "a").await.0, 403, "another origin");
    assert_eq!(post(true, &[("sec-fetch-site", "cross-site")], "a").await.0, 403);
    assert_eq!(post(true, &[("sec-fetch-site", "same-site")], "a").await.0, 403, "a sibling app's host is another origin");
    let (_, apps) = cp.call(Method::GET, "/api/apps", None).await;
    assert_eq!(apps["apps"], json!([]), "nothing refused was done: {apps}");
    let origin: &'static str = Box::leak(format!("http://{}", cp.server.api_addr).into_boxed_str());
    let extra: &'static [(&'static str, &'static str)] = Box::leak(vec![("origin", origin), ("sec-fetch-site", "same-origin")].into_boxed_slice());
    assert_eq!(post(true, extra, "a").await.0, 201);
    // Reads need no token.
    assert_eq!(with_session(&cp, &s, Method::GET, "/api/apps/a", false, &[], None).await.0, 200);
    // Every method that changes something: PUT, DELETE too.
    assert_eq!(with_session(&cp, &s, Method::PUT, "/api/apps/a/env", false, &[], Some(json!({"A": "1"}))).await.0, 403);
    assert_eq!(with_session(&cp, &s, Method::DELETE, "/api/apps/a", false, &[], None).await.0, 403);
    assert_eq!(with_session(&cp, &s, Method::DELETE, "/api/session", false, &[], None).await.0, 403, "logout too");
    assert_eq!(with_session(&cp, &s, Method::GET, "/api/me", false, &[], None).await.0, 200, "the session lives on");

    // A form post may carry the token in its csrf_token field.
    let form = |token: &str| {
        cp.http
            .post(url(&cp, "/api/tokens"))
            .header("cookie", format!("cloudweb_session={}", s.cookie))
            .form(&[("csrf_token", token), ("name", "x")])
            .send()
    };
    assert_eq!(form("wrong").await.unwrap().status(), 403);
    // The gate lets it through; the route wants JSON.
    assert_eq!(form(&s.csrf).await.unwrap().status(), 400);

    // Bearer requests are exempt (no browser adds that header by itself).
    assert_eq!(cp.call(Method::DELETE, "/api/apps/a", None).await.0, 204);
}

#[tokio::test]
async fn logout_ends_the_session_on_the_server() {
    let (_dir, cp) = control(|_| {}).await;
    user(&cp, "alice").await;
    let s = login(&cp, "alice").await;
    let other = login(&cp, "alice").await;
    let response = cp
        .http
        .delete(url(&cp, "/api/session"))
        .header("cookie", format!("cloudweb_session={}", s.cookie))
        .header("x-csrf-token", &s.csrf)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 204);
    let cleared = cookies(response.headers());
    assert!(cleared.iter().any(|c| c.starts_with("cloudweb_session=;") && c.contains("Max-Age=0")), "{cleared:?}");
    // The old cookie, replayed as an attacker who copied it would: 401.
    let (status, body) = with_session(&cp, &s, Method::GET, "/api/me", false, &[], None).await;
    assert_eq!(status, 401, "{body}");
    let digest = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(s.cookie.as_bytes()));
    assert!(cp.server.state.store.session(&digest).await.unwrap().is_none(), "the row is gone");
    // Other sessions of the user go on.
    assert_eq!(with_session(&cp, &other, Method::GET, "/api/me", false, &[], None).await.0, 200);
    // Logging out with a token makes no sense.
    assert_eq!(cp.call(Method::DELETE, "/api/session", None).await.0, 400);
}

#[tokio::test]
async fn sessions_end_after_the_idle_limit_and_the_absolute_limit() {
    let (_dir, cp) = control(|c| {
        c.auth.session_idle = Duration::from_secs(30 * 60);
        c.auth.session_absolute = Duration::from_secs(2 * 3600);
    })
    .await;
    user(&cp, "alice").await;

    // Idle: 29 minutes is fine, then 31 minutes without a request ends it.
    let s = login(&cp, "alice").await;
    cp.clock.advance(Duration::from_secs(29 * 60));
    assert_eq!(with_session(&cp, &s, Method::GET, "/api/me", false, &[], None).await.0, 200);
    cp.clock.advance(Duration::from_secs(29 * 60));
    assert_eq!(with_session(&cp, &s, Method::GET, "/api/me", false, &[], None).await.0, 200, "each request restarts the idle clock");
    cp.clock.advance(Duration::from_secs(31 * 60));
    let (status, body) = with_session(&cp, &s, Method::GET, "/api/me", false, &[], None).await;
    assert_eq!(status, 401, "{body}");
    assert!(body["error"].as_str().unwrap().contains("session has ended"), "{body}");

    // Absolute: used every 20 minutes, it still ends 2 hours after login.
    let s = login(&cp, "alice").await;
    for _ in 0..5 {
        cp.clock.advance(Duration::from_secs(20 * 60));
        assert_eq!(with_session(&cp, &s, Method::GET, "/api/me", false, &[], None).await.0, 200);
    }
    cp.clock.advance(Duration::from_secs(20 * 60 + 1));
    assert_eq!(with_session(&cp, &s, Method::GET, "/api/me", false, &[], None).await.0, 401);
}

#[tokio::test]
async fn personal_tokens_are_shown_once_record_their_use_and_stop_when_revoked() {
    let (_dir, cp) = control(|_| {}).await;
    user(&cp, "alice").await;
    user(&cp, "bob").await;
    let s = login(&cp, "alice").await;
    let (status, created) = with_session(&cp, &s, Method::POST, "/api/tokens", true, &[], Some(json!({"name": "deploy script"}))).await;
    assert_eq!(status, 201, "{created}");
    let token = created["token"].as_str().unwrap().to_string();
    let id = created["id"].as_str().unwrap().to_string();
    assert!(token.starts_with("cwp_") && token.len() == 68, "{token}");
    assert!(token.starts_with(created["prefix"].as_str().unwrap()));

    // Listed without the token, never used yet.
    let (status, list) = with_session(&cp, &s, Method::GET, "/api/tokens", false, &[], None).await;
    assert_eq!(status, 200);
    assert!(!list.to_string().contains(&token), "{list}");
    assert_eq!(list[0]["name"], "deploy script");
    assert_eq!(list[0]["last_used_at"], Value::Null);
    // A second token of the same name is refused; an empty name too.
    assert_eq!(with_session(&cp, &s, Method::POST, "/api/tokens", true, &[], Some(json!({"name": "deploy script"}))).await.0, 409);
    assert_eq!(with_session(&cp, &s, Method::POST, "/api/tokens", true, &[], Some(json!({"name": " "}))).await.0, 400);

    cp.clock.advance(Duration::from_secs(90));
    assert_eq!(with_bearer(&cp, &token, Method::GET, "/api/apps", None).await.0, 200);
    let (_, list) = with_bearer(&cp, &token, Method::GET, "/api/tokens", None).await;
    let used = list[0]["last_used_at"].as_str().expect("last use recorded").to_string();
    assert!(used.as_str() > list[0]["created_at"].as_str().unwrap(), "{list}");

    // Another user cannot see or revoke it.
    let b = login(&cp, "bob").await;
    let (_, bobs) = with_session(&cp, &b, Method::GET, "/api/tokens", false, &[], None).await;
    assert_eq!(bobs, json!([]));
    assert_eq!(with_session(&cp, &b, Method::DELETE, &format!("/api/tokens/{id}"), true, &[], None).await.0, 404);
    // The admin token has no personal tokens.
    assert_eq!(cp.call(Method::GET, "/api/tokens", None).await.0, 403);

    // Revoked: 401 at once, and the list says when.
    assert_eq!(with_session(&cp, &s, Method::DELETE, &format!("/api/tokens/{id}"), true, &[], None).await.0, 204);
    let (status, body) = with_bearer(&cp, &token, Method::GET, "/api/apps", None).await;
    assert_eq!(status, 401, "{body}");
    let (_, list) = with_session(&cp, &s, Method::GET, "/api/tokens", false, &[], None).await;
    assert!(list[0]["revoked_at"].is_string(), "{list}");
    // The name is free again.
    assert_eq!(with_session(&cp, &s, Method::POST, "/api/tokens", true, &[], Some(json!({"name": "deploy script"}))).await.0, 201);
}

#[tokio::test]
async fn login_attempts_are_limited_per_account_and_per_address() {
    let (_dir, cp) = control(|c| {
        c.auth.login_limits.per_account = 3;
        c.auth.login_limits.per_address = 6;
        c.auth.login_limits.window = Duration::from_secs(600);
    })
    .await;
    user(&cp, "alice").await;
    user(&cp, "bob").await;
    for _ in 0..3 {
        assert_eq!(login_as(&cp, "alice", "not the password", &[]).await.0, 401);
    }
    // Past the limit even the right password waits, with a Retry-After.
    let (status, headers, body) = login_as(&cp, "alice", PASSWORD, &[]).await;
    assert_eq!(status, 429, "{body}");
    let retry: u64 = headers["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((590..=600).contains(&retry), "{retry}");
    assert!(body.contains("too many login attempts"), "{body}");
    // Another account from the same address is still allowed...
    assert_eq!(login_as(&cp, "bob", PASSWORD, &[]).await.0, 200, "a good login does not count");
    for _ in 0..3 {
        assert_eq!(login_as(&cp, "bob", "not the password", &[]).await.0, 401);
    }
    // ...until the address has failed 6 times, whatever the account.
    user(&cp, "carol").await;
    assert_eq!(login_as(&cp, "carol", PASSWORD, &[]).await.0, 429);
    // The window ends on the server's clock.
    cp.clock.advance(Duration::from_secs(601));
    assert_eq!(login_as(&cp, "alice", PASSWORD, &[]).await.0, 200);
    assert_eq!(login_as(&cp, "carol", PASSWORD, &[]).await.0, 200);
}

/// The paths axum's router holds, read from its debug form: axum prints
/// its path router's map of route ids to paths as `paths: {…}` before the
/// fallback router (this fails loudly if that changes).
fn router_paths(debug: &str) -> Vec<String> {
    let start = debug.find("path_router").expect("axum's router prints its path_router");
    let rest = &debug[start..];
    let rest = &rest[rest.find("paths: {").expect("the path router prints its paths")..];
    let rest = &rest[..rest.find("fallback_router").expect("then the fallback router")];
    let mut paths: Vec<String> = rest.split('"').skip(1).step_by(2).filter(|s| s.starts_with('/')).map(str::to_string).collect();
    paths.sort();
    paths.dedup();
    paths
}

/// `/api/apps/{name}` with its parameters filled in.
fn concrete(path: &str) -> String {
    path.split('/').map(|seg| if seg.starts_with('{') { "x" } else { seg }).collect::<Vec<_>>().join("/")
}

#[tokio::test]
async fn the_openapi_document_lists_every_route_and_every_listed_route_is_guarded() {
    let (_dir, cp) = control(|c| c.auth.session_idle = Duration::from_secs(600)).await;
    let response = cp.http.get(url(&cp, "/api/openapi.json")).send().await.unwrap();
    assert_eq!(response.status(), 200, "the document is public");
    let doc: Value = response.json().await.unwrap();
    assert_eq!(doc["openapi"], "3.1.0");
    assert!(doc["components"]["schemas"]["Error"]["properties"]["error"].is_object(), "the error shape");

    let mut documented = Vec::new();
    let mut public = Vec::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            let method = method.to_ascii_uppercase();
            let is_public = op["security"] == json!([{}]);
            if is_public {
                public.push(format!("{method} {path}"));
            }
            // Every error answer has the Error shape.
            for (status, answer) in op["responses"].as_object().unwrap() {
                if status.starts_with('4') || status.starts_with('5') {
                    assert_eq!(answer["content"]["application/json"]["schema"]["$ref"], "#/components/schemas/Error", "{method} {path} {status}");
                }
            }
            if !is_public {
                for status in ["401", "403", "500"] {
                    assert!(op["responses"][status].is_object(), "{method} {path} documents {status}");
                }
                // The credentials the gate takes: a bearer token, or the
                // session cookie, with the CSRF header for a change.
                let session = if method == "GET" { json!({"session": []}) } else { json!({"session": [], "csrf": []}) };
                assert_eq!(op["security"], json!([{"bearer": []}, session]), "{method} {path}");
            }
            documented.push((method, path.clone(), is_public));
        }
    }
    public.sort();
    let mut expected: Vec<String> = cloudweb_server::api::openapi::PUBLIC_OPERATIONS.iter().map(|s| s.to_string()).collect();
    expected.sort();
    assert_eq!(public, expected, "the public operations are exactly the listed ones");

    // The router and the document hold the same paths...
    let router = cloudweb_server::api::router(cp.server.state.clone());
    let in_router = router_paths(&format!("{router:?}"));
    let mut in_doc: Vec<String> = doc["paths"].as_object().unwrap().keys().cloned().collect();
    in_doc.sort();
    assert!(in_router.len() > 20, "{in_router:?}");
    assert_eq!(in_router, in_doc, "a route missing from the OpenAPI document, or the reverse");
    // ...and the same methods: each method the router answers on a path
    // (anything but 405 with the admin token) is documented.
    for path in &in_router {
        for method in [Method::GET, Method::POST, Method::PUT, Method::DELETE, Method::PATCH] {
            let response = cp.http.request(method.clone(), url(&cp, &concrete(path))).bearer_auth(&cp.admin).send().await.unwrap();
            let served = response.status() != 405;
            let listed = documented.iter().any(|(m, p, _)| m == method.as_str() && p == path);
            assert_eq!(served, listed, "{method} {path}: router answers {}", response.status());
        }
    }

    // Every non-public operation refuses anonymous, wrong-token,
    // revoked-token, expired-session and (for changes) CSRF-less requests.
    user(&cp, "alice").await;
    let s = login(&cp, "alice").await;
    let (_, created) = with_session(&cp, &s, Method::POST, "/api/tokens", true, &[], Some(json!({"name": "t"}))).await;
    let revoked = created["token"].as_str().unwrap().to_string();
    assert_eq!(with_session(&cp, &s, Method::DELETE, &format!("/api/tokens/{}", created["id"].as_str().unwrap()), true, &[], None).await.0, 204);
    let expired = login(&cp, "alice").await;
    cp.clock.advance(Duration::from_secs(601));
    let live = login(&cp, "alice").await;
    let (_, created) = with_session(&cp, &live, Method::POST, "/api/tokens", true, &[], Some(json!({"name": "live"}))).await;
    let personal = created["token"].as_str().unwrap().to_string();
    for (method, path, is_public) in &documented {
        if *is_public {
            continue;
        }
        let method = Method::from_bytes(method.as_bytes()).unwrap();
        let target = url(&cp, &concrete(path));
        let what = format!("{method} {path}");
        let anonymous = cp.http.request(method.clone(), &target).send().await.unwrap();
        assert_eq!(anonymous.status(), 401, "{what} anonymous");
        for token in ["cwa_wrong", "cwp_0000", &revoked] {
            let response = cp.http.request(method.clone(), &target).bearer_auth(token).send().await.unwrap();
            assert_eq!(response.status(), 401, "{what} with {token}");
        }
        let response = cp.http.request(method.clone(), &target).header("cookie", format!("cloudweb_session={}", expired.cookie)).header("x-csrf-token", &expired.csrf).send().await.unwrap();
        assert_eq!(response.status(), 401, "{what} with an expired session");
        if method != Method::GET {
            let response = cp.http.request(method.clone(), &target).header("cookie", format!("cloudweb_session={}", live.cookie)).send().await.unwrap();
            assert_eq!(response.status(), 403, "{what} with a session but no CSRF token");
        }
        // And it lets all three credentials through (whatever the route
        // then answers to the placeholder parameters). Logging out would
        // end the session the loop goes on with.
        if what == "DELETE /api/session" {
            continue;
        }
        for (who, request) in [
            ("admin token", cp.http.request(method.clone(), &target).bearer_auth(&cp.admin)),
            ("personal token", cp.http.request(method.clone(), &target).bearer_auth(&personal)),
            ("session", cp.http.request(method.clone(), &target).header("cookie", format!("cloudweb_session={}", live.cookie)).header("x-csrf-token", &live.csrf)),
        ] {
            let status = request.send().await.unwrap().status().as_u16();
            // The admin token has no personal tokens (a documented 403).
            let tokens_as_admin = who == "admin token" && path.starts_with("/api/tokens");
            assert!(status != 401 && (status != 403 || tokens_as_admin), "{what} with the {who}: {status}");
        }
    }
}

/// Runs `cloudweb-server admin …` with `stdin` as its standard input.
fn admin_cli(args: &[&str], stdin: &str) -> (bool, String, String) {
    use std::io::Write;
    let mut child = std::process::Command::new(cloudweb_e2e::bin("cloudweb-server"))
        .arg("admin")
        .args(args)
        .env("NO_COLOR", "1")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    match child.stdin.take().unwrap().write_all(stdin.as_bytes()) {
        Ok(()) => {}
        // A refusal that needs no password (no database yet) may end the
        // command before it reads its input; what it said is checked by
        // the caller. Seen under load: the write lost that race.
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
        Err(e) => panic!("writing the admin command's standard input: {e}"),
    }
    let out = child.wait_with_output().unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// The real binary: the first user made with `admin create-user` (the
/// password on stdin or in a file, never in argv), logs in, makes and
/// revokes a token, logs out, is rate-limited; a password reset ends the
/// sessions. No password, session id, CSRF token or API token shows up in
/// the server's log, the CLI's output or the database file.
#[tokio::test]
async fn the_binary_creates_the_first_user_who_logs_in_and_no_secret_leaks() {
    if cloudweb_e2e::state_db::skip_unless_sqlite("the admin CLI before the first start and the secrets in the database file") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("server");
    let data_arg = data.display().to_string();
    // Before the control plane ever ran there is no database to add to.
    let (ok, _, err) = admin_cli(&["create-user", "--data-dir", &data_arg, "--name", "alice"], &format!("{PASSWORD}\n"));
    assert!(!ok && err.contains("start the control plane once"), "{err}");

    let server = cloudweb_e2e::ServerProcess::start_with(tmp.path(), &["--login-attempts-per-account", "2"]).await.unwrap();
    let mut outputs = String::new();
    let (ok, out, err) = admin_cli(&["create-user", "--data-dir", &data_arg, "--name", "alice"], &format!("{PASSWORD}\n"));
    assert!(ok, "{out}{err}");
    assert!(out.starts_with("created user alice (usr_"), "{out}");
    outputs.push_str(&(out + &err));
    let (ok, out, err) = admin_cli(&["create-user", "--data-dir", &data_arg, "--name", "ALICE"], &format!("{PASSWORD}\n"));
    assert!(!ok && err.contains("already exists"), "{out}{err}");
    let (ok, _, err) = admin_cli(&["create-user", "--data-dir", &data_arg, "--name", "bob"], "short\n");
    assert!(!ok && err.contains("at least 10 characters"), "{err}");
    let (ok, _, err) = admin_cli(&["create-user", "--data-dir", &data_arg, "--name", "bad name"], &format!("{PASSWORD}\n"));
    assert!(!ok && err.contains("invalid user name"), "{err}");
    let bob_password = "bob's long password";
    let file = tmp.path().join("bob-password");
    std::fs::write(&file, format!("{bob_password}\n")).unwrap();
    let (ok, out, err) = admin_cli(&["create-user", "--data-dir", &data_arg, "--name", "bob", "--password-file", &file.display().to_string()], "");
    assert!(ok, "{out}{err}");
    outputs.push_str(&(out + &err));

    let http = reqwest::Client::new();
    let login = |name: &'static str, password: &'static str| {
        let http = http.clone();
        let target = server.api("/api/session");
        async move { http.post(target).json(&json!({"name": name, "password": password})).send().await.unwrap() }
    };
    let response = login("alice", PASSWORD).await;
    assert_eq!(response.status(), 200);
    let set_cookies = cookies(response.headers());
    let session = cookie_value(&set_cookies, "cloudweb_session").unwrap();
    let session_cookie = set_cookies.iter().find(|c| c.starts_with("cloudweb_session=")).unwrap();
    assert!(session_cookie.contains("HttpOnly") && session_cookie.contains("SameSite=Lax"), "{session_cookie}");
    let body: Value = response.json().await.unwrap();
    let csrf = body["csrf_token"].as_str().unwrap().to_string();
    assert_eq!(body["user"]["name"], "alice");
    let cookie = format!("cloudweb_session={session}");

    let me: Value = http.get(server.api("/api/me")).header("cookie", &cookie).send().await.unwrap().json().await.unwrap();
    assert_eq!(me["user"]["name"], "alice", "{me}");
    // A change without the CSRF token is refused; with it, done.
    let no_csrf = http.post(server.api("/api/tokens")).header("cookie", &cookie).json(&json!({"name": "cli"})).send().await.unwrap();
    assert_eq!(no_csrf.status(), 403);
    let created: Value =
        http.post(server.api("/api/tokens")).header("cookie", &cookie).header("x-csrf-token", &csrf).json(&json!({"name": "cli"})).send().await.unwrap().json().await.unwrap();
    let token = created["token"].as_str().unwrap().to_string();
    let nodes = http.get(server.api("/api/nodes")).bearer_auth(&token).send().await.unwrap();
    assert_eq!(nodes.status(), 200);
    let list: Value = http.get(server.api("/api/tokens")).bearer_auth(&token).send().await.unwrap().json().await.unwrap();
    assert!(list[0]["last_used_at"].is_string(), "{list}");
    let revoke = http.delete(server.api(&format!("/api/tokens/{}", created["id"].as_str().unwrap()))).bearer_auth(&token).send().await.unwrap();
    assert_eq!(revoke.status(), 204);
    assert_eq!(http.get(server.api("/api/nodes")).bearer_auth(&token).send().await.unwrap().status(), 401);
    // The admin token stays the break-glass credential.
    assert_eq!(http.get(server.api("/api/nodes")).bearer_auth(&server.admin_token).send().await.unwrap().status(), 200);

    // Logout ends the session on the server.
    let out = http.delete(server.api("/api/session")).header("cookie", &cookie).header("x-csrf-token", &csrf).send().await.unwrap();
    assert_eq!(out.status(), 204);
    assert_eq!(http.get(server.api("/api/me")).header("cookie", &cookie).send().await.unwrap().status(), 401);

    // Two wrong passwords, then 429 with Retry-After even for the right one.
    for _ in 0..2 {
        assert_eq!(login("bob", "not bob's password").await.status(), 401);
    }
    let limited = login("bob", "bob's long password").await;
    assert_eq!(limited.status(), 429);
    assert!(limited.headers()["retry-after"].to_str().unwrap().parse::<u64>().unwrap() > 0);

    // A new password (from the CLI) ends alice's sessions.
    let second = login("alice", PASSWORD).await;
    let second_cookie = format!("cloudweb_session={}", cookie_value(&cookies(second.headers()), "cloudweb_session").unwrap());
    let new_password = "a brand new password";
    let (ok, out, err) = admin_cli(&["set-password", "--data-dir", &data_arg, "--name", "alice"], &format!("{new_password}\n"));
    assert!(ok, "{out}{err}");
    outputs.push_str(&(out + &err));
    assert_eq!(http.get(server.api("/api/me")).header("cookie", &second_cookie).send().await.unwrap().status(), 401);
    assert_eq!(login("alice", PASSWORD).await.status(), 401);
    assert_eq!(login("alice", "a brand new password").await.status(), 200);

    // No secret anywhere it should not be.
    let log = server.process.log_text();
    assert!(log.contains("session started"), "the log does record logins:\n{log}");
    let db = std::fs::read(data.join("state.db")).unwrap();
    let wal = std::fs::read(data.join("state.db-wal")).unwrap_or_default();
    for secret in [PASSWORD, bob_password, new_password, &session, &csrf, &token] {
        assert!(!log.contains(secret), "{secret} in the server log");
        assert!(!outputs.contains(secret), "{secret} in the CLI's output");
        if secret != csrf {
            for bytes in [&db, &wal] {
                assert!(!bytes.windows(secret.len()).any(|w| w == secret.as_bytes()), "{secret} in the database");
            }
        }
    }

    // The login counts outlive a restart of the control plane, stored
    // under keyed digests: a password typed into the name field is not
    // kept in the database.
    let typed = "my-s3cret-typed-as-a-name";
    let attempt = |name: &'static str, password: &'static str, api: String| {
        let http = http.clone();
        async move { http.post(api).json(&json!({"name": name, "password": password})).send().await.unwrap().status() }
    };
    assert_eq!(attempt(typed, "whatever", server.api("/api/session")).await, 401);
    let mut server = server;
    server.restart().await.unwrap();
    assert_eq!(attempt("bob", bob_password, server.api("/api/session")).await, 429, "still limited after the restart");
    assert_eq!(attempt("alice", "a brand new password", server.api("/api/session")).await, 200, "other accounts are not");
    server.process.kill();
    let db = std::fs::read(data.join("state.db")).unwrap();
    let wal = std::fs::read(data.join("state.db-wal")).unwrap_or_default();
    for bytes in [&db, &wal] {
        assert!(!bytes.windows(typed.len()).any(|w| w == typed.as_bytes()), "a typed name is in the database");
    }
}
