//! What the user API's listener answers where nobody may be looking
//! (issue 31): an unknown path gets the dashboard's HTML 404 page when a
//! browser asks outside `/api/` and JSON under `/api/`; `/metrics` answers
//! with the media type its OpenAPI document names. The control plane runs
//! in-process.

use std::sync::Arc;

use cloudweb_server::clock::ShiftedClock;
use cloudweb_server::config::Config;
use cloudweb_server::RunningServer;
use reqwest::header::{CONTENT_TYPE, COOKIE, LOCATION, SET_COOKIE};
use reqwest::redirect::Policy;

const USER: &str = "ana";
const PASSWORD: &str = "correct horse battery";

async fn start() -> (tempfile::TempDir, RunningServer, String, reqwest::Client) {
    let dir = tempfile::tempdir().unwrap();
    let server = cloudweb_server::start(Config::local(dir.path().to_path_buf()), Arc::new(ShiftedClock::default())).await.unwrap();
    let admin = std::fs::read_to_string(dir.path().join("admin-token")).unwrap().trim().to_string();
    cloudweb_server::auth::users::create(&server.state.store, server.state.clock.now_ms(), USER, Some(PASSWORD), Some(cloudweb_server::access::ClusterRole::Admin)).await.unwrap();
    let http = reqwest::Client::builder().redirect(Policy::none()).build().unwrap();
    (dir, server, admin, http)
}

/// The media type of a Content-Type value, without parameters.
fn media_type(value: &str) -> String {
    value.split(';').next().unwrap_or("").trim().to_ascii_lowercase()
}

#[tokio::test]
async fn an_unknown_path_is_an_html_page_for_a_browser_and_json_under_api() {
    let (_dir, server, admin, http) = start().await;
    let url = |path: &str| format!("http://{}{path}", server.api_addr);
    let login = http.post(url("/login")).form(&[("name", USER), ("password", PASSWORD)]).send().await.unwrap();
    assert_eq!(login.status(), 303, "the login is accepted");
    let cookie: Vec<String> =
        login.headers().get_all(SET_COOKIE).iter().map(|v| v.to_str().unwrap().split(';').next().unwrap().to_string()).collect();
    let cookie = cookie.join("; ");

    for path in ["/no-such-page", "/apps/x/no-such-tab", "/nodes/a/b/c", "/apix"] {
        let response = http.get(url(path)).header(COOKIE, &cookie).header("accept", "text/html").send().await.unwrap();
        let status = response.status().as_u16();
        let content_type = response.headers().get(CONTENT_TYPE).map(|v| v.to_str().unwrap().to_string()).unwrap_or_default();
        let csp = response.headers().contains_key("content-security-policy");
        let body = response.text().await.unwrap();
        assert_eq!(status, 404, "{path}: {body}");
        assert_eq!(media_type(&content_type), "text/html", "{path} answers {content_type}: {body}");
        assert!(body.contains("<html") && body.contains("Not found."), "{path}: the dashboard's 404 page, got: {body}");
        assert!(!body.contains("no such endpoint"), "{path}: {body}");
        assert!(csp, "{path}: the page carries the dashboard's security headers");
    }
    // Without a session the browser goes to the login page, as on every page.
    let response = http.get(url("/no-such-page")).send().await.unwrap();
    assert_eq!(response.status(), 303);
    assert_eq!(response.headers().get(LOCATION).unwrap(), "/login");

    // Under /api/ a program asked: JSON, with or without a browser's cookie.
    for (path, credential) in [("/api/no-such-endpoint", None), ("/api/no-such-endpoint", Some(&cookie)), ("/api/v9/x", None)] {
        let mut request = http.get(url(path)).bearer_auth(&admin);
        if let Some(cookie) = credential {
            request = http.get(url(path)).header(COOKIE, cookie);
        }
        let response = request.send().await.unwrap();
        assert_eq!(response.status(), 404, "{path}");
        let content_type = response.headers().get(CONTENT_TYPE).unwrap().to_str().unwrap().to_string();
        assert_eq!(media_type(&content_type), "application/json", "{path}");
        let body: serde_json::Value = response.json().await.unwrap();
        assert_eq!(body["error"], "no such endpoint", "{path}: {body}");
    }
}

#[tokio::test]
async fn metrics_answer_the_media_type_the_openapi_document_names() {
    let (_dir, server, admin, http) = start().await;
    let url = |path: &str| format!("http://{}{path}", server.api_addr);
    let response = http.get(url("/metrics")).bearer_auth(&admin).send().await.unwrap();
    assert_eq!(response.status(), 200);
    let served = response.headers().get(CONTENT_TYPE).unwrap().to_str().unwrap().to_string();
    assert_eq!(media_type(&served), "application/openmetrics-text", "what Prometheus negotiates for: {served}");
    let document: serde_json::Value = http.get(url("/api/openapi.json")).send().await.unwrap().json().await.unwrap();
    let content = document["paths"]["/metrics"]["get"]["responses"]["200"]["content"].as_object().expect("the 200 of /metrics has content");
    let documented: Vec<String> = content.keys().map(|k| media_type(k)).collect();
    assert_eq!(documented, vec![media_type(&served)], "the document names {content:?}, the server answers {served}");
}
