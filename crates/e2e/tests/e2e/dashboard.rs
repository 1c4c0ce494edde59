//! The dashboard over HTTP, with the control plane in-process so a test
//! can put hostile text straight into the store: login as a user (the
//! accounts module's sessions, shared with the API), CSRF,
//! language choice, security headers, escaping, and the monitoring charts'
//! gaps. The browser test (`browser.rs`) drives the same pages in Chromium
//! with a real agent.

use std::collections::BTreeMap;
use std::sync::Arc;

use cloudweb_e2e::{key_and_csr, RawClient};
use cloudweb_protocol::{LogLine, Report};
use cloudweb_server::clock::ShiftedClock;
use cloudweb_server::config::Config;
use cloudweb_server::store::{AppRow, DeploymentRow, NodeUsageRow};
use cloudweb_server::runtime_logs::Incoming;
use cloudweb_server::RunningServer;
use reqwest::header::{ACCEPT_LANGUAGE, CONTENT_SECURITY_POLICY, COOKIE, LOCATION, SET_COOKIE};
use reqwest::redirect::Policy;

const HOSTILE: &str = "<script>alert(1)</script>";

struct Dashboard {
    _dir: tempfile::TempDir,
    server: RunningServer,
    admin: String,
    http: reqwest::Client,
}

/// The user every test logs in as (made through the accounts module).
const USER: &str = "ana";
const PASSWORD: &str = "correct horse battery";

impl Dashboard {
    async fn start() -> Dashboard {
        let dir = tempfile::tempdir().unwrap();
        let server = cloudweb_server::start(Config::local(dir.path().to_path_buf()), Arc::new(ShiftedClock::default())).await.unwrap();
        let admin = std::fs::read_to_string(dir.path().join("admin-token")).unwrap().trim().to_string();
        let http = reqwest::Client::builder().redirect(Policy::none()).build().unwrap();
        cloudweb_server::auth::users::create(&server.state.store, server.state.clock.now_ms(), USER, Some(PASSWORD), Some(cloudweb_server::access::ClusterRole::Admin)).await.unwrap();
        Dashboard { _dir: dir, server, admin, http }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.server.api_addr)
    }

    /// Logs in through the dashboard's form; returns the cookies it set
    /// (`name=value; name=value`), `None` when refused.
    async fn login_as(&self, name: &str, password: &str) -> Option<String> {
        let response = self.http.post(self.url("/login")).form(&[("name", name), ("password", password)]).send().await.unwrap();
        let cookies: Vec<String> =
            response.headers().get_all(SET_COOKIE).iter().map(|v| v.to_str().unwrap().split(';').next().unwrap().to_string()).collect();
        if cookies.is_empty() {
            return None;
        }
        assert_eq!(response.status(), 303, "a good login redirects");
        Some(cookies.join("; "))
    }

    async fn login(&self) -> Option<String> {
        self.login_as(USER, PASSWORD).await
    }

    async fn get(&self, cookie: &str, path: &str) -> (u16, String) {
        let response = self.http.get(self.url(path)).header(COOKIE, cookie).send().await.unwrap();
        let status = response.status().as_u16();
        (status, response.text().await.unwrap())
    }

    /// Joins a node by hand through the agent listener; returns its id.
    async fn join(&self, name: &str) -> String {
        let token = {
            let response = self.http.post(self.url("/api/join-tokens")).bearer_auth(&self.admin).send().await.unwrap();
            response.json::<serde_json::Value>().await.unwrap()["token"].as_str().unwrap().to_string()
        };
        let (_, csr) = key_and_csr(|_| {});
        let body = serde_json::json!({"token": token, "csr": csr, "hostname": "h", "name": name}).to_string();
        let agent_url = format!("https://127.0.0.1:{}/agent/v1/join", self.server.agent_addr.port());
        let (status, text) = RawClient::new(self.server.state.ca.cert_pem(), None).send(reqwest::Method::POST, &agent_url, &[], Some(&body)).await.unwrap();
        assert_eq!(status, 200, "{text}");
        serde_json::from_str::<serde_json::Value>(&text).unwrap()["node_id"].as_str().unwrap().to_string()
    }

    /// An app as the create form would make it, written to the store.
    async fn app(&self, name: &str) {
        let now = self.server.state.clock.now_ms();
        let app = AppRow {
            name: name.into(),
            repo_url: format!("https://example.com/{name}.git"),
            branch: "main".into(),
            port: 8080,
            domains: "[]".into(),
            build: None,
            strategy: "auto".into(),
            instances: 1,
            cpu: None,
            memory_bytes: None,
            health_path: "/".into(),
            health_timeout_s: 60,
            build_timeout_s: None,
            env_sealed: None,
            git_credentials_sealed: None,
            created_at: now,
            rollout: "blue-green".into(),
            liveness: None,
            readiness: None,
            team_id: "team_default".into(),
        };
        self.server.state.store.insert_app(&app, &format!("{name}.localhost")).await.unwrap().unwrap();
    }

    /// A deployment of `app` in `state`, written to the store.
    async fn deployment(&self, id: &str, app: &str, state: &str) {
        let now = self.server.state.clock.now_ms();
        let deployment = DeploymentRow {
            id: id.into(),
            seq: 0,
            app: app.into(),
            kind: "source".into(),
            commit_sha: None,
            rollback_of: None,
            state: state.into(),
            image: None,
            error: None,
            created_at: now,
            updated_at: now,
        };
        self.server.state.store.insert_deployment(&deployment, 1, false).await.unwrap();
    }

    /// The CSRF token in a page's forms.
    fn csrf(page: &str) -> String {
        let field = "name=\"csrf_token\" value=\"";
        let at = page.find(field).expect("a form with a CSRF token") + field.len();
        page[at..at + 64].to_string()
    }
}

#[tokio::test]
async fn pages_need_a_user_session_shared_with_the_api() {
    let dashboard = Dashboard::start().await;
    let response = dashboard.http.get(dashboard.url("/nodes")).send().await.unwrap();
    assert_eq!(response.status(), 303);
    assert_eq!(response.headers()[LOCATION], "/login");
    let (_, login_page) = dashboard.get("", "/login").await;
    assert!(login_page.contains("name=\"name\"") && login_page.contains("type=\"password\""), "{login_page}");

    // A wrong password, an unknown user and the admin token are refused.
    for (name, password) in [(USER, "wrong password!"), ("nobody", PASSWORD), (USER, dashboard.admin.as_str())] {
        let refused = dashboard.http.post(dashboard.url("/login")).form(&[("name", name), ("password", password)]).send().await.unwrap();
        assert_eq!(refused.status(), 401, "{name}");
        assert!(refused.headers().get(SET_COOKIE).is_none());
        assert!(refused.text().await.unwrap().contains("Wrong name or password"));
    }
    // A login posted from another site is refused.
    let cross = dashboard.http.post(dashboard.url("/login")).header("origin", "https://evil.example").form(&[("name", USER), ("password", PASSWORD)]).send().await.unwrap();
    assert_eq!(cross.status(), 403);
    assert!(cross.headers().get(SET_COOKIE).is_none());

    let cookie = dashboard.login().await.expect("a session cookie");
    assert!(cookie.contains("cloudweb_session=cws_") && cookie.contains("cloudweb_csrf="), "the accounts module's cookies: {cookie}");
    let response = dashboard.http.get(dashboard.url("/nodes")).header(COOKIE, &cookie).send().await.unwrap();
    assert_eq!(response.status(), 200);
    let csp = response.headers()[CONTENT_SECURITY_POLICY].to_str().unwrap().to_string();
    assert!(csp.contains("script-src 'self'") && !csp.contains("unsafe-inline"), "{csp}");
    let page = response.text().await.unwrap();
    assert!(page.contains("Generate join token") && page.contains(USER), "{page}");
    assert!(!page.contains("<script>") && page.contains(r#"<script src="/assets/app.js" defer></script>"#), "only the external script");

    // The same cookie opens the API, and the forms carry that session's CSRF token.
    let me: serde_json::Value = dashboard.http.get(dashboard.url("/api/me")).header(COOKIE, &cookie).send().await.unwrap().json().await.unwrap();
    assert_eq!((me["auth"].as_str(), me["user"]["name"].as_str()), (Some("session"), Some(USER)), "{me}");
    let csrf = Dashboard::csrf(&page);
    assert_eq!(me["csrf_token"].as_str(), Some(csrf.as_str()));

    // A form without the session's CSRF token, or with another, changes nothing.
    let forged = dashboard.http.post(dashboard.url("/apps")).header(COOKIE, &cookie).form(&[("name", "web"), ("repo_url", "https://example.com/x.git"), ("port", "80")]).send().await.unwrap();
    assert_eq!(forged.status(), 403);
    let wrong = "0".repeat(64);
    let forged = dashboard.http.post(dashboard.url("/apps")).header(COOKIE, &cookie).form(&[("name", "web"), ("repo_url", "https://example.com/x.git"), ("port", "80"), ("csrf_token", wrong.as_str())]).send().await.unwrap();
    assert_eq!(forged.status(), 403);
    // Nor does one posted from another site, even with the token.
    let cross = dashboard.http.post(dashboard.url("/apps")).header(COOKIE, &cookie).header("origin", "https://evil.example").form(&[("name", "web"), ("repo_url", "https://example.com/x.git"), ("port", "80"), ("csrf_token", csrf.as_str())]).send().await.unwrap();
    assert_eq!(cross.status(), 403);
    assert!(dashboard.server.state.store.app("web").await.unwrap().is_none());

    // Logging out ends the session on the server: neither pages nor the API open with the old cookie.
    let out = dashboard.http.post(dashboard.url("/logout")).header(COOKIE, &cookie).form(&[("csrf_token", csrf.as_str())]).send().await.unwrap();
    assert_eq!(out.status(), 303);
    assert!(out.headers().get_all(SET_COOKIE).iter().any(|v| v.to_str().unwrap().starts_with("cloudweb_session=;")), "the cookie is cleared");
    let (status, _) = dashboard.get(&cookie, "/nodes").await;
    assert_eq!(status, 303, "the old cookie no longer opens pages");
    let api = dashboard.http.get(dashboard.url("/api/me")).header(COOKIE, &cookie).send().await.unwrap();
    assert_eq!(api.status(), 401, "nor the API");
}

/// Anything before the doctype (it once came after `<html>`) puts a
/// browser in quirks mode; every page, error pages too, starts with it.
#[tokio::test]
async fn every_page_starts_with_the_doctype() {
    let dashboard = Dashboard::start().await;
    let node_id = dashboard.join("n1").await;
    dashboard.app("web").await;
    dashboard.deployment("dep_1", "web", "running").await;
    let cookie = dashboard.login().await.unwrap();
    let mut pages = vec![("/login".to_string(), dashboard.get("", "/login").await)];
    for path in ["/nodes", "/apps", "/apps/web", "/apps/web/delete", "/deployments/dep_1", "/monitoring", &format!("/nodes/{node_id}/drain")] {
        let (status, page) = dashboard.get(&cookie, path).await;
        assert_eq!(status, 200, "{path}");
        pages.push((path.to_string(), (status, page)));
    }
    for path in ["/no-such-page", "/apps/missing", "/deployments/missing"] {
        let (status, page) = dashboard.get(&cookie, path).await;
        assert_eq!(status, 404, "{path}");
        pages.push((path.to_string(), (status, page)));
    }
    let forged = dashboard.http.post(dashboard.url("/apps")).header(COOKIE, &cookie).form(&[("name", "x")]).send().await.unwrap();
    assert_eq!(forged.status(), 403);
    pages.push(("403".to_string(), (403, forged.text().await.unwrap())));
    for (path, (_, page)) in pages {
        assert!(page.starts_with("<!DOCTYPE html><html lang=\"en\"><head>"), "{path} starts: {}", &page[..page.len().min(80)]);
    }
}

/// The next `event: state` of a deployment page's stream, as JSON
/// (other events, log lines, are skipped).
async fn next_state(stream: &mut reqwest::Response, buffer: &mut String) -> serde_json::Value {
    tokio::time::timeout(std::time::Duration::from_secs(10), async {
        loop {
            while let Some(end) = buffer.find("\n\n") {
                let event: String = buffer.drain(..end + 2).collect();
                if let Some(data) = event.strip_prefix("event: state\ndata: ") {
                    return serde_json::from_str(data.trim_end()).unwrap();
                }
            }
            let chunk = stream.chunk().await.unwrap().expect("the stream ended before a state event");
            buffer.push_str(std::str::from_utf8(&chunk).unwrap());
        }
    })
    .await
    .expect("a state event within 10 s")
}

/// The deployment page's stream carries the state, commit and image as
/// they change (the page's script puts them in place), not only log lines.
#[tokio::test]
async fn the_deployment_stream_follows_state_commit_and_image() {
    let dashboard = Dashboard::start().await;
    let state = &dashboard.server.state;
    dashboard.app("web").await;
    dashboard.deployment("dep_live", "web", "queued").await;
    let cookie = dashboard.login().await.unwrap();
    let (_, page) = dashboard.get(&cookie, "/deployments/dep_live").await;
    assert!(page.contains(r#"data-stream="/deployments/dep_live/logs?after=0&amp;lang=en""#), "{page}");
    assert!(page.contains(r#"<code id="deployment-commit">–</code>"#) && page.contains(r#"id="deployment-image">–<"#), "{page}");

    let mut stream = dashboard.http.get(dashboard.url("/deployments/dep_live/logs?after=0&lang=es")).header(COOKIE, &cookie).send().await.unwrap();
    assert_eq!(stream.status(), 200);
    let mut buffer = String::new();
    let first = next_state(&mut stream, &mut buffer).await;
    assert_eq!((first["state"].as_str(), first["commit"].as_str()), (Some("queued"), None), "{first}");

    let now = state.clock.now_ms();
    assert!(state.store.transition_deployment("dep_live", "queued", "building", None, None, now).await.unwrap());
    state.store.set_deployment_commit("dep_live", "0123456789abcdef", now).await.unwrap();
    let building = wait_for_state(&mut stream, &mut buffer, |s| s["commit"].is_string()).await;
    assert_eq!((building["state"].as_str(), building["state_label"].as_str()), (Some("building"), Some("construyendo")), "the page's language: {building}");
    assert_eq!(building["commit"], "0123456789abcdef");
    let timeline: Vec<&str> = building["timeline"].as_array().unwrap().iter().map(|e| e["state"].as_str().unwrap()).collect();
    assert!(timeline.ends_with(&["building"]), "{building}");

    assert!(state.store.transition_deployment("dep_live", "building", "failed", Some("<b>no</b>"), Some("registry/web:1"), now).await.unwrap());
    let failed = wait_for_state(&mut stream, &mut buffer, |s| s["state"] == "failed").await;
    assert_eq!((failed["image"].as_str(), failed["error"].as_str()), (Some("registry/web:1"), Some("<b>no</b>")), "{failed}");
}

/// State events until one passes `wanted`.
async fn wait_for_state(stream: &mut reqwest::Response, buffer: &mut String, wanted: impl Fn(&serde_json::Value) -> bool) -> serde_json::Value {
    loop {
        let event = next_state(stream, buffer).await;
        if wanted(&event) {
            return event;
        }
    }
}

#[tokio::test]
async fn dashboard_logins_count_against_the_same_limit_as_the_api() {
    let dashboard = Dashboard::start().await;
    let limit = dashboard.server.state.config.auth.login_limits.per_account;
    for _ in 0..limit {
        let refused = dashboard.http.post(dashboard.url("/login")).form(&[("name", USER), ("password", "wrong password!")]).send().await.unwrap();
        assert_eq!(refused.status(), 401);
    }
    // The next attempt, even with the right password, waits, on the form and on the API alike.
    let waiting = dashboard.http.post(dashboard.url("/login")).form(&[("name", USER), ("password", PASSWORD)]).send().await.unwrap();
    assert_eq!(waiting.status(), 429);
    assert!(waiting.headers().contains_key("retry-after") && waiting.headers().get(SET_COOKIE).is_none());
    assert!(waiting.text().await.unwrap().contains("Too many login attempts"));
    let api = dashboard.http.post(dashboard.url("/api/session")).json(&serde_json::json!({"name": USER, "password": PASSWORD})).send().await.unwrap();
    assert_eq!(api.status(), 429);
}

#[tokio::test]
async fn the_language_follows_accept_language_until_the_switch_is_used() {
    let dashboard = Dashboard::start().await;
    let cookie = dashboard.login().await.unwrap();
    let spanish = dashboard.http.get(dashboard.url("/nodes")).header(COOKIE, &cookie).header(ACCEPT_LANGUAGE, "es-ES,es;q=0.9").send().await.unwrap();
    let page = spanish.text().await.unwrap();
    assert!(page.contains("Generar token de unión") && page.contains("<html lang=\"es\">"), "{page}");

    let switch = dashboard.http.post(dashboard.url("/lang")).form(&[("lang", "en"), ("back", "/apps")]).send().await.unwrap();
    assert_eq!(switch.status(), 303);
    assert_eq!(switch.headers()[LOCATION], "/apps");
    let remembered = switch.headers()[SET_COOKIE].to_str().unwrap().split(';').next().unwrap().to_string();
    let both = format!("{cookie}; {remembered}");
    let english = dashboard.http.get(dashboard.url("/nodes")).header(COOKIE, &both).header(ACCEPT_LANGUAGE, "es").send().await.unwrap();
    assert!(english.text().await.unwrap().contains("Generate join token"), "the remembered choice wins over the header");

    // The switch only goes back to a local page.
    let away = dashboard.http.post(dashboard.url("/lang")).form(&[("lang", "es"), ("back", "//evil.example/")]).send().await.unwrap();
    assert_eq!(away.headers()[LOCATION], "/nodes");
}

#[tokio::test]
async fn an_env_name_a_log_line_and_a_commit_holding_script_render_as_text() {
    let dashboard = Dashboard::start().await;
    let state = &dashboard.server.state;
    let now = state.clock.now_ms();
    dashboard.app("web").await;
    // The API refuses such a name; the store is written directly so the
    // page's own escaping is what is tested.
    let env: BTreeMap<String, String> = [(HOSTILE.to_string(), "value-never-shown".to_string())].into();
    let sealed = state.sealer.seal_json(&cloudweb_server::deploy::env_context("web"), &env);
    state.store.set_app_env("web", &sealed).await.unwrap();
    let deployment = DeploymentRow {
        id: "dep_hostile".into(),
        seq: 0,
        app: "web".into(),
        kind: "source".into(),
        commit_sha: Some(format!("fix: {HOSTILE}")),
        rollback_of: None,
        state: "failed".into(),
        image: None,
        error: Some(HOSTILE.into()),
        created_at: now,
        updated_at: now,
    };
    state.store.insert_deployment(&deployment, 1, false).await.unwrap();
    let report = Report {
        deployment_id: "dep_hostile".into(),
        state: None,
        message: None,
        image: None,
        instance: None,
        address: None,
        commit: None,
        ready: None,
        crash_loop: None,
        probe_problem: None,
        logs: vec![LogLine {
            ts: "2026-01-01T00:00:00Z".into(),
            stream: "build".into(),
            line: format!("step 1 {HOSTILE}"),
        }],
    };
    state.store.save_report("n-1", &report, now).await.unwrap();
    // A runtime line the app printed, as an agent's upload brings it.
    let printed = [LogLine { ts: "2026-01-01T00:00:01Z".into(), stream: "stdout".into(), line: format!("listening {HOSTILE}") }];
    state.runtime_logs.append(Incoming { app: "web", deployment_id: "dep_hostile", instance: 0, node_id: "n-1", container: "c1", dropped: 0, lines: &printed, now_ms: now });

    let cookie = dashboard.login().await.unwrap();
    let (status, app_page) = dashboard.get(&cookie, "/apps/web").await;
    assert_eq!(status, 200);
    let (status, deployment_page) = dashboard.get(&cookie, "/deployments/dep_hostile").await;
    assert_eq!(status, 200);
    for (what, page) in [("app page", &app_page), ("deployment page", &deployment_page)] {
        assert!(!page.contains("<script>alert"), "{what} printed a raw script tag:\n{page}");
        assert!(page.contains("&lt;script&gt;alert(1)&lt;/script&gt;"), "{what} lost the text:\n{page}");
    }
    assert!(!app_page.contains("value-never-shown"), "env values are write-only");
    assert!(deployment_page.contains("step 1 &lt;script&gt;"), "the log line is shown as text");
    assert!(app_page.contains("listening &lt;script&gt;alert(1)&lt;/script&gt;"), "the runtime line, as text: {app_page}");
    let seq = state.runtime_logs.recent("web", 0, 1, None)[0].seq;
    assert!(app_page.contains(r#"data-follow="/api/apps/web/logs?follow=1""#) && app_page.contains(&format!(r#"data-after="{seq}""#)), "{app_page}");
    // The stream the page's script follows opens with the page's cookie.
    let follow = dashboard.http.get(dashboard.url("/api/apps/web/logs?follow=1")).header(COOKIE, &cookie).send().await.unwrap();
    assert_eq!(follow.status(), 200);
    assert!(follow.headers()["content-type"].to_str().unwrap().starts_with("text/event-stream"));
    // The search page: the stored line found by its words, as text, with
    // the form filled in and a live follow of the same search; a bad
    // pattern is a 400 that says why.
    let found = cloudweb_e2e::wait_for(std::time::Duration::from_secs(10), "the line to be stored and found", || async {
        let (status, page) = dashboard.get(&cookie, "/apps/web/logs?q=listening&grep=alert").await;
        (status == 200 && page.contains("listening &lt;script&gt;alert(1)&lt;/script&gt;")).then_some(page)
    })
    .await
    .unwrap();
    assert!(!found.contains("<script>alert"), "{found}");
    assert!(found.contains(r#"value="listening""#) && found.contains(r#"id="log-stored""#), "{found}");
    assert!(found.contains(r#"data-follow="/api/apps/web/logs?q=listening&amp;grep=alert&amp;follow=1""#), "{found}");
    let (status, bad) = dashboard.get(&cookie, "/apps/web/logs?grep=%28").await;
    assert_eq!(status, 400);
    assert!(bad.contains("grep is not a regular expression"), "{bad}");
    assert!(app_page.contains(r#"id="log-search""#), "the app page has the search form");
}

#[tokio::test]
async fn forms_create_an_app_set_env_and_domains_and_delete_it() {
    let dashboard = Dashboard::start().await;
    let cookie = dashboard.login().await.unwrap();
    let (_, page) = dashboard.get(&cookie, "/apps").await;
    let csrf = Dashboard::csrf(&page);
    let post = |path: &str, form: Vec<(&str, &str)>| {
        let mut form = form;
        form.push(("csrf_token", csrf.as_str()));
        dashboard.http.post(dashboard.url(path)).header(COOKIE, &cookie).form(&form).send()
    };
    let created = post("/apps", vec![("name", "shop"), ("repo_url", "https://example.com/shop.git"), ("branch", "main"), ("port", "3000"), ("strategy", "static"), ("build_cmd", "npm run build"), ("output_dir", "dist"), ("spa", "yes"), ("instances", "2"), ("memory", "128")]).await.unwrap();
    assert_eq!(created.status(), 303);
    if created.headers()[LOCATION] != "/apps/shop" {
        panic!("not created: {}", dashboard.get(&cookie, "/apps").await.1);
    }
    let app = dashboard.server.state.store.app("shop").await.unwrap().expect("created");
    assert_eq!((app.strategy.as_str(), app.instances, app.memory_bytes), ("static", 2, Some(128 << 20)));
    assert!(app.build.as_deref().unwrap().contains("\"spa\":\"yes\""), "{:?}", app.build);

    // A bad form comes back at once with the API's reason inside it and
    // the fields as they were filled in.
    let refused = post("/apps", vec![("name", "Bad Name"), ("repo_url", "https://example.com/x.git"), ("port", "80"), ("strategy", "dockerfile")]).await.unwrap();
    assert_eq!(refused.status(), 400);
    let page = refused.text().await.unwrap();
    let form = form_of(&page, "method=\"post\" action=\"/apps\"");
    assert!(form.contains(r#"role="alert" id="create-error""#) && form.contains("invalid name"), "{form}");
    assert!(form.contains(r#"value="Bad Name""#) && form.contains(r#"value="https://example.com/x.git""#) && form.contains(r#"value="80""#), "{form}");
    assert!(form.contains(r#"<option value="dockerfile" selected>"#), "{form}");

    assert_eq!(post("/apps/shop/env", vec![("name", "API_KEY"), ("value", "s3cret")]).await.unwrap().status(), 303);
    assert_eq!(post("/apps/shop/env", vec![("name", "MODE"), ("value", "prod")]).await.unwrap().status(), 303);
    assert_eq!(post("/apps/shop/env", vec![("unset", "MODE")]).await.unwrap().status(), 303);
    let (_, page) = dashboard.get(&cookie, "/apps/shop").await;
    assert!(page.contains("API_KEY") && !page.contains("s3cret") && !page.contains(">MODE<"), "{page}");
    let (status, app_json) = {
        let response = dashboard.http.get(dashboard.url("/api/apps/shop")).bearer_auth(&dashboard.admin).send().await.unwrap();
        (response.status(), response.json::<serde_json::Value>().await.unwrap())
    };
    assert_eq!(status, 200);
    assert_eq!(app_json["env"], serde_json::json!(["API_KEY"]));

    assert_eq!(post("/apps/shop/domains", vec![("domains", "shop.example.com\nwww.shop.example.com")]).await.unwrap().status(), 303);
    let app = dashboard.server.state.store.app("shop").await.unwrap().unwrap();
    assert_eq!(app.domains, r#"["shop.example.com","www.shop.example.com"]"#);
    // The app page shows each host's certificate: public names wait for
    // their first order (no ingress runs here), the default host is internal.
    let (_, page) = dashboard.get(&cookie, "/apps/shop").await;
    assert!(page.contains("Certificates"), "{page}");
    assert!(page.contains(r#"data-host="shop.example.com" data-state="issuing""#), "{page}");
    assert!(page.contains(r#"data-host="shop.localhost" data-state="internal""#), "{page}");

    // The settings form, filled with the current settings, changes them.
    let (_, page) = dashboard.get(&cookie, "/apps/shop").await;
    assert!(page.contains(r#"action="/apps/shop/settings""#) && page.contains(r#"name="build_cmd" value="npm run build""#), "{page}");
    let settings = |port: &'static str, health_path: &'static str| {
        vec![("branch", "release"), ("port", port), ("strategy", "static"), ("install_cmd", ""), ("build_cmd", "make"), ("output_dir", "public"), ("spa", "no"),
             ("health_path", health_path), ("health_timeout_seconds", "20"), ("build_timeout_seconds", "900"), ("instances", "1"), ("cpu", ""), ("memory", "")]
    };
    assert_eq!(post("/apps/shop/settings", settings("4000", "/up")).await.unwrap().headers()[LOCATION], "/apps/shop");
    let app = dashboard.server.state.store.app("shop").await.unwrap().unwrap();
    assert_eq!((app.branch.as_str(), app.port, app.health_path.as_str(), app.health_timeout_s, app.build_timeout_s), ("release", 4000, "/up", 20, Some(900)));
    assert_eq!((app.instances, app.memory_bytes, app.cpu), (1, None, None), "empty fields are the defaults");
    assert_eq!(app.build.as_deref(), Some(r#"{"build_cmd":"make","output_dir":"public","spa":"no"}"#));
    // Refused like the API: the reason in the (opened) settings form, the
    // values as typed, nothing changed.
    let refused = post("/apps/shop/settings", settings("4001", "no-slash")).await.unwrap();
    assert_eq!(refused.status(), 400);
    let page = refused.text().await.unwrap();
    assert!(page.contains(r#"<details id="edit-settings" open>"#), "{page}");
    let form = form_of(&page, "action=\"/apps/shop/settings\"");
    assert!(form.contains(r#"role="alert" id="settings-error""#) && form.contains("invalid health_path"), "{form}");
    assert!(form.contains(r#"value="no-slash""#) && form.contains(r#"value="4001""#), "{form}");
    assert_eq!(dashboard.server.state.store.app("shop").await.unwrap().unwrap().port, 4000);
    assert_eq!(dashboard.http.post(dashboard.url("/apps/shop/settings")).header(COOKIE, &cookie).form(&settings("1", "/")).send().await.unwrap().status(), 403, "no CSRF token");

    let (status, confirm) = dashboard.get(&cookie, "/apps/shop/delete").await;
    assert_eq!(status, 200);
    assert!(confirm.contains("Delete this app?"), "{confirm}");
    assert_eq!(post("/apps/shop/delete", vec![]).await.unwrap().headers()[LOCATION], "/apps");
    assert!(dashboard.server.state.store.app("shop").await.unwrap().is_none());
}

/// The `<form …>` element of `page` whose opening tag holds `attribute`.
fn form_of<'a>(page: &'a str, attribute: &str) -> &'a str {
    let at = page.find(attribute).unwrap_or_else(|| panic!("no form with {attribute}: {page}"));
    let start = page[..at].rfind("<form").unwrap();
    let end = at + page[at..].find("</form>").unwrap();
    &page[start..end]
}

/// The env form is at the bottom of a long page: a refused one shows its
/// reason there, not at the top, and keeps what was typed (not cached).
#[tokio::test]
async fn a_refused_env_form_shows_its_error_next_to_it_with_the_input_kept() {
    let dashboard = Dashboard::start().await;
    dashboard.app("web").await;
    let cookie = dashboard.login().await.unwrap();
    let (_, page) = dashboard.get(&cookie, "/apps/web").await;
    let csrf = Dashboard::csrf(&page);
    let form = [("name", "1 BAD NAME"), ("value", "typed <value>"), ("csrf_token", csrf.as_str())];
    let refused = dashboard.http.post(dashboard.url("/apps/web/env")).header(COOKIE, &cookie).form(&form).send().await.unwrap();
    assert_eq!(refused.status(), 400);
    assert_eq!(refused.headers()["cache-control"], "no-store");
    let page = refused.text().await.unwrap();
    let env_form = form_of(&page, "action=\"/apps/web/env\"");
    assert!(env_form.contains(r#"role="alert" id="env-error""#) && env_form.contains("variable names must match"), "{env_form}");
    assert!(env_form.contains(r#"value="1 BAD NAME" autofocus"#), "{env_form}");
    assert!(!page.contains("typed &lt;value&gt;") && !page.contains("typed <value>"), "a value, maybe a secret, is never sent back: {env_form}");
    let top = &page[..page.find("<h2").unwrap()];
    assert!(!top.contains("role=\"alert\""), "no error at the top of the page: {top}");
    assert_eq!(page.matches("variable names must match").count(), 1, "{page}");
    // The other forms are as they were.
    assert!(form_of(&page, "action=\"/apps/web/domains\"").contains("<textarea id=\"domains\" name=\"domains\" rows=\"3\"></textarea>"), "{page}");
    assert!(dashboard.server.state.store.app("web").await.unwrap().unwrap().env_sealed.is_none(), "nothing was set");
    // A refused domain list likewise, in its own form.
    let form = [("domains", "not a domain!"), ("csrf_token", csrf.as_str())];
    let refused = dashboard.http.post(dashboard.url("/apps/web/domains")).header(COOKIE, &cookie).form(&form).send().await.unwrap();
    assert_eq!(refused.status(), 400);
    let page = refused.text().await.unwrap();
    let domains = form_of(&page, "action=\"/apps/web/domains\"");
    assert!(domains.contains(r#"id="domains-error""#) && domains.contains("not a domain!</textarea>"), "{domains}");
}

#[tokio::test]
async fn a_missing_usage_sample_is_a_gap_in_the_chart() {
    let dashboard = Dashboard::start().await;
    let state = &dashboard.server.state;
    let now = state.clock.now_ms();
    // A node joins (by hand, as an agent would); it has samples every 30 s
    // with two missing in the middle.
    let node_id = dashboard.join("gap-node").await;
    let sample = |ago_s: i64| NodeUsageRow { node_id: node_id.clone(), at_ms: now - ago_s * 1000, cpu_pct: Some(20.0), mem_used: Some(1 << 30), disk_used: Some(2 << 30), apps: vec![] };
    let rows: Vec<NodeUsageRow> = [300, 270, 240, 150, 120, 90].into_iter().map(sample).collect();
    state.store.save_heartbeats(&[], &[], &rows).await.unwrap();

    let cookie = dashboard.login().await.unwrap();
    let (status, page) = dashboard.get(&cookie, &format!("/nodes/{node_id}?range=1h")).await;
    assert_eq!(status, 200);
    let node = &page[page.find("data-node=\"gap-node\"").expect("the node's charts")..];
    assert!(node.contains(r#"data-points="6" data-segments="2""#), "six points in two runs: {node}");
    // The hole, and the time since the last sample, are shaded gaps; the
    // hour is mostly empty, so the axis starts at the first sample.
    let cpu = &node[..node.find("</figure>").unwrap()];
    assert!(cpu.contains(r#"data-gaps="2""#) && cpu.contains(&format!(r#"data-from="{}""#, now - 300_000)), "{cpu}");
    assert!(cpu.contains(">since ") && cpu.contains(r#"<rect class="gap""#) && cpu.contains("<title>no data: "), "{cpu}");
}

#[tokio::test]
async fn nodes_are_drained_reactivated_and_removed_after_confirmation() {
    let dashboard = Dashboard::start().await;
    let node_id = dashboard.join("n1").await;
    let cookie = dashboard.login().await.unwrap();
    let (_, page) = dashboard.get(&cookie, "/nodes").await;
    assert!(page.contains(&format!("data-node=\"{node_id}\"")) && page.contains(">n1<"), "{page}");
    // Every cell names its column, for the card layout of narrow screens.
    assert!(page.contains(r#"<td class="health" data-label="Health">"#), "{page}");
    let csrf = Dashboard::csrf(&page);
    let post = |path: String, form: Vec<(&'static str, &'static str)>| {
        let mut form: Vec<(&str, &str)> = form;
        form.push(("csrf_token", csrf.as_str()));
        dashboard.http.post(dashboard.url(&path)).header(COOKIE, &cookie).form(&form).send()
    };

    let (status, confirm) = dashboard.get(&cookie, &format!("/nodes/{node_id}/drain")).await;
    assert_eq!(status, 200);
    assert!(confirm.contains("Drain this node?") && confirm.contains("<form class=\"confirm\" method=\"post\""), "{confirm}");
    assert!(!dashboard.server.state.store.node(&node_id).await.unwrap().unwrap().draining, "showing the question changes nothing");
    assert_eq!(post(format!("/nodes/{node_id}/drain"), vec![]).await.unwrap().status(), 303);
    assert!(dashboard.server.state.store.node(&node_id).await.unwrap().unwrap().draining);
    let (_, page) = dashboard.get(&cookie, "/nodes").await;
    assert!(page.contains(&format!("href=\"/nodes/{node_id}/undrain\"")), "a drained node offers Reactivate: {page}");
    assert_eq!(post(format!("/nodes/{node_id}/undrain"), vec![]).await.unwrap().status(), 303);
    assert!(!dashboard.server.state.store.node(&node_id).await.unwrap().unwrap().draining);

    let (_, confirm) = dashboard.get(&cookie, &format!("/nodes/{node_id}/remove")).await;
    assert!(confirm.contains("name=\"force\"") && confirm.contains("become failed"), "the force option and its warning: {confirm}");
    assert_eq!(post(format!("/nodes/{node_id}/remove"), vec![]).await.unwrap().status(), 303);
    assert!(dashboard.server.state.store.node(&node_id).await.unwrap().is_none());
    let (_, page) = dashboard.get(&cookie, "/nodes").await;
    assert!(page.contains("Done.") && !page.contains(&node_id), "{page}");
}

/// Issue 21 item 5: long lists come a page at a time with a search and a
/// filter, and the Monitoring page is an overview of the cluster (one
/// set of charts for all nodes, the nodes needing attention, top lists)
/// with each node's and app's charts on its own page.
#[tokio::test]
async fn long_lists_are_paged_and_searched_and_monitoring_is_an_overview() {
    let dashboard = Dashboard::start().await;
    let state = &dashboard.server.state;
    let now = state.clock.now_ms();
    let mut ids = Vec::new();
    for i in 0..60 {
        ids.push(dashboard.join(&format!("node-{i:02}")).await);
    }
    for i in 0..55 {
        dashboard.app(&format!("app-{i:02}")).await;
    }
    let rows: Vec<NodeUsageRow> = ids
        .iter()
        .enumerate()
        .map(|(i, id)| NodeUsageRow { node_id: id.clone(), at_ms: now - 60_000, cpu_pct: Some(i as f64), mem_used: Some(1 << 20), disk_used: Some(1 << 30), apps: vec![] })
        .collect();
    state.store.save_heartbeats(&[], &[], &rows).await.unwrap();
    let drained = dashboard.http.post(dashboard.url(&format!("/api/nodes/{}/drain", ids[7]))).bearer_auth(&dashboard.admin).send().await.unwrap();
    assert_eq!(drained.status(), 200);
    let cookie = dashboard.login().await.unwrap();
    let count = |page: &str, needle: &str| page.matches(needle).count();

    let (status, page) = dashboard.get(&cookie, "/nodes").await;
    assert_eq!(status, 200);
    assert_eq!(count(&page, "<tr data-node="), 50, "one page of nodes");
    assert!(page.contains("1–50 of 60") && page.contains(r#"rel="next" href="/nodes?page=2""#), "the pager: {page}");
    let (_, second) = dashboard.get(&cookie, "/nodes?page=2").await;
    assert_eq!(count(&second, "<tr data-node="), 10);
    assert!(second.contains(r#"data-live="/nodes/table?page=2""#), "the live table follows the same page");
    let (_, found) = dashboard.get(&cookie, "/nodes?q=NODE-07").await;
    assert_eq!(count(&found, "<tr data-node="), 1, "the search ignores case");
    assert!(found.contains(&format!(r#"<a href="/nodes/{}">node-07</a>"#, ids[7])), "rows link to the node's page");
    let (_, draining) = dashboard.get(&cookie, "/nodes?filter=draining").await;
    assert_eq!(count(&draining, "<tr data-node="), 1);
    assert!(draining.contains(&format!(r#"data-node="{}""#, ids[7])));
    let (_, nothing) = dashboard.get(&cookie, "/nodes?q=%3Cscript%3E").await;
    assert!(nothing.contains("Nothing matches.") && !nothing.contains("<script>"), "{nothing}");

    let (_, apps) = dashboard.get(&cookie, "/apps").await;
    assert_eq!(count(&apps, "<tr data-app="), 50);
    let (_, apps2) = dashboard.get(&cookie, "/apps?page=2").await;
    assert_eq!(count(&apps2, "<tr data-app="), 5);
    let (_, one) = dashboard.get(&cookie, "/apps?q=app-03").await;
    assert_eq!(count(&one, "<tr data-app="), 1);

    let (status, overview) = dashboard.get(&cookie, "/monitoring?range=1h").await;
    assert_eq!(status, 200);
    assert!(!overview.contains("section class=\"charts\" data-node"), "no per-node charts on the overview");
    assert!(overview.contains(r#"data-nodes="60""#) && overview.contains(r#"data-apps="55""#), "the counts");
    let cluster_cpu = &overview[overview.find("Mean CPU (%)").unwrap()..];
    assert!(cluster_cpu.contains(r#"data-points="1""#), "one bucket of the whole cluster: {cluster_cpu:.600}");
    // Attention: the overview and the Nodes page's filter agree.
    let listed: usize = overview.split("data-attention=\"").nth(1).unwrap().split('"').next().unwrap().parse().unwrap();
    assert!(listed >= 1, "the drained node needs attention");
    let (_, attention) = dashboard.get(&cookie, "/nodes?filter=attention").await;
    assert!(attention.contains(&format!("of {listed}<")) || count(&attention, "<tr data-node=") == listed, "{listed} on the overview");
    assert!(overview.contains(&format!(r#"<a href="/nodes/{}">node-07</a>"#, ids[7])), "the drained node is listed with a link");
    // Each node's charts are on its page.
    let (status, node_page) = dashboard.get(&cookie, &format!("/nodes/{}?range=24h", ids[59])).await;
    assert_eq!(status, 200);
    assert!(node_page.contains(r#"data-node="node-59""#) && node_page.contains(r#"data-points="1""#), "{node_page:.2000}");
    assert_eq!(dashboard.get(&cookie, "/nodes/n-nonexistent").await.0, 404);
    let (_, app_page) = dashboard.get(&cookie, "/apps/app-00?range=7d").await;
    assert!(app_page.contains(r#"<section class="charts" data-app="app-00">"#) && app_page.contains(r#"aria-current="page">7d<"#), "the app's charts");
    for (path, page) in [("/nodes", &page), ("/apps", &apps), ("/monitoring", &overview), ("/nodes/{id}", &node_page), ("/apps/{name}", &app_page)] {
        assert!(page.len() < 150_000, "{path} is {} bytes", page.len());
    }
}

/// The Data page's buttons act through the API's handlers: a rotation its
/// node cannot take is refused with the reason shown, a version change is
/// recorded and queued, a major PostgreSQL one refused, and neither goes
/// without the CSRF token.
#[tokio::test]
async fn the_data_page_rotates_passwords_and_changes_versions_through_the_api() {
    let dashboard = Dashboard::start().await;
    let node = dashboard.join("db-node").await;
    let state = &dashboard.server.state;
    let secret = state.sealer.seal_json("service:db", &serde_json::json!({"password": "Pw0123456789abcdefghijklmnopqrst"}));
    let row = cloudweb_server::store::ServiceRow {
        name: "db".into(),
        kind: "postgres".into(),
        version: None,
        image: "postgres:16".into(),
        node_id: node.clone(),
        host_port: 0,
        memory_bytes: None,
        volume: "svc-db".into(),
        secret_sealed: secret,
        generation: 1,
        created_at: state.clock.now_ms(),
        previous_secret_sealed: None,
        rotation_started_at: None,
        team_id: "team_default".into(),
    };
    let command = |_| cloudweb_server::store::NewCommand { node_id: node.clone(), kind: "service_run".into(), payload: "{}".into() };
    state.store.insert_service(&row, 20000..=20001, command, state.clock.now_ms()).await.unwrap().unwrap();
    let cookie = dashboard.login().await.unwrap();
    let (status, page) = dashboard.get(&cookie, "/services").await;
    assert_eq!(status, 200);
    assert!(page.contains(r#"action="/services/db/rotate-password""#) && page.contains("Rotate password"), "{page}");
    assert!(page.contains(r#"action="/services/db/upgrade""#), "{page}");
    let csrf = Dashboard::csrf(&page);
    let post = |path: &'static str, form: Vec<(&'static str, String)>| {
        let request = dashboard.http.post(dashboard.url(path)).header(COOKIE, &cookie).form(&form);
        async move { request.send().await.unwrap().status().as_u16() }
    };
    assert_eq!(post("/services/db/rotate-password", vec![]).await, 403, "no CSRF token");
    assert_eq!(post("/services/db/rotate-password", vec![("csrf_token", csrf.clone())]).await, 303);
    let (_, page) = dashboard.get(&cookie, "/services").await;
    assert!(page.contains("the password was not changed"), "its silent node refuses it: {page}");
    assert!(state.store.service("db").await.unwrap().unwrap().previous_secret_sealed.is_none());

    assert_eq!(post("/services/db/upgrade", vec![("csrf_token", csrf.clone()), ("version", "16.4".into())]).await, 303);
    let upgraded = state.store.service("db").await.unwrap().unwrap();
    assert_eq!((upgraded.version.as_deref(), upgraded.image.as_str(), upgraded.generation), (Some("16.4"), "postgres:16.4", 2));
    let queued = state.store.pending_commands(&node).await.unwrap();
    assert_eq!(queued.iter().filter(|c| c.kind == "service_run").count(), 2, "the new generation is queued");
    assert_eq!(post("/services/db/upgrade", vec![("csrf_token", csrf), ("version", "17".into())]).await, 303);
    let (_, page) = dashboard.get(&cookie, "/services").await;
    assert!(page.contains("major version change"), "{page}");
    assert_eq!(state.store.service("db").await.unwrap().unwrap().generation, 2);
}

#[tokio::test]
async fn the_bell_counts_open_alerts_and_the_alerts_page_adds_and_tests_a_channel() {
    let dashboard = Dashboard::start().await;
    let store = &dashboard.server.state.store;
    let raise = cloudweb_server::store::alerts::Raise { id: "alt_1", kind: "deploy_failed", subject: "web", severity: "critical", summary: HOSTILE, detail: None, now: 1 };
    store.raise_alert(&raise).await.unwrap();
    let cookie = dashboard.login().await.unwrap();
    let (_, nodes) = dashboard.get(&cookie, "/nodes").await;
    let at = nodes.find("id=\"alerts-bell\"").expect("the bell");
    let bell = &nodes[at..at + nodes[at..].find("</a>").unwrap()];
    assert!(bell.contains("<span class=\"count\""), "{bell}");
    let (status, page) = dashboard.get(&cookie, "/alerts").await;
    assert_eq!(status, 200);
    assert!(page.contains("id=\"open-alerts\"") && page.contains("&lt;script&gt;alert(1)&lt;/script&gt;") && !page.contains(HOSTILE), "escaped");
    assert!(page.contains("id=\"no-channels\""));
    let csrf = Dashboard::csrf(&page);
    let add = |form: Vec<(&'static str, &'static str)>| {
        let mut form = form;
        form.push(("csrf_token", csrf.as_str()));
        dashboard.http.post(dashboard.url("/alerts/channels")).header(COOKIE, &cookie).form(&form).send()
    };
    // A plain-http URL is refused (this server allows no private targets);
    // the page says why.
    assert_eq!(add(vec![("name", "chat"), ("kind", "slack"), ("url", "http://127.0.0.1:9/x"), ("event.deploy_failed", "1")]).await.unwrap().status(), 303);
    let (_, page) = dashboard.get(&cookie, "/alerts").await;
    assert!(page.contains("must be https"), "the reason is shown");
    assert!(store.alert_channels().await.unwrap().is_empty());
    let done = add(vec![("name", "chat"), ("kind", "slack"), ("url", "https://hooks.example.com/services/T0/B0/SECRETPATH"), ("personal", "1"), ("event.deploy_failed", "1")]).await.unwrap();
    assert_eq!(done.status(), 303);
    let channels = store.alert_channels().await.unwrap();
    assert_eq!(channels.len(), 1);
    assert_eq!((channels[0].kind.as_str(), channels[0].events.as_str()), ("slack", "[\"deploy_failed\"]"));
    assert!(!channels[0].owner.is_empty(), "personal: owned by the user");
    let (_, page) = dashboard.get(&cookie, "/alerts").await;
    assert!(page.contains("https://hooks.example.com") && !page.contains("SECRETPATH"), "the URL's path is never shown");
    let test = dashboard.http.post(dashboard.url(&format!("/alerts/channels/{}/test", channels[0].id))).header(COOKIE, &cookie).form(&[("csrf_token", csrf.as_str())]).send().await.unwrap();
    assert_eq!(test.status(), 303);
    let queued = store.alert_deliveries_of(&channels[0].id, 10).await.unwrap();
    assert_eq!((queued.len(), queued[0].event.as_str()), (1, "test"));
    let (_, page) = dashboard.get(&cookie, "/alerts").await;
    assert!(page.contains("class=\"delivery-pending\""), "the queued test shows");
}
