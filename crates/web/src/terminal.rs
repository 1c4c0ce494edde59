//! The dashboard terminal: a shell in a running instance of an app, in the
//! browser, for users without the command line. The page runs xterm.js
//! (served from the binary, MIT licence beside it) and opens a WebSocket
//! to `/apps/{name}/terminal/session`, which opens the same exec session
//! as `cloudweb exec APP -it -- sh` (recorded the same way, under the
//! logged-in user) and speaks the same session frames.
//!
//! The WebSocket carries the session cookie, so a page on another site
//! must not be able to open one: the route takes the page's CSRF token in
//! its query and an `Origin` equal to the dashboard's own host.

use axum::extract::ws::WebSocketUpgrade;
use axum::extract::{Path, RawQuery, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use maud::html;

use super::{layout, Ctx};
use crate::api;

pub const XTERM_JS: &str = include_str!("assets/xterm/xterm.min.js");
pub const XTERM_FIT_JS: &str = include_str!("assets/xterm/xterm-addon-fit.min.js");
pub const XTERM_CSS: &str = include_str!("assets/xterm/xterm.min.css");
pub const TERMINAL_JS: &str = include_str!("assets/terminal.js");

/// The shell the terminal runs.
const SHELL: &str = "sh";

/// `GET /apps/{name}/terminal[?instance=N]`.
pub async fn page(ctx: Ctx, Path(name): Path<String>, RawQuery(raw): RawQuery) -> Response {
    let instance: Option<u32> = url::form_urlencoded::parse(raw.unwrap_or_default().as_bytes()).find(|(k, _)| k == "instance").and_then(|(_, v)| v.parse().ok());
    match ctx.state.store.app(&name).await {
        Ok(Some(_)) => {}
        Ok(None) => return (StatusCode::NOT_FOUND, layout::message(&ctx, ctx.t("term.no_app"))).into_response(),
        Err(err) => return crate::error::ApiError::from(err).into_response(),
    }
    let body = html! {
        link rel="stylesheet" href="/assets/xterm/xterm.min.css";
        p { a href=(format!("/apps/{name}")) { "← " (name) } }
        p.help { (ctx.t("term.help")) }
        p id="terminal-status" role="status" { (ctx.t("term.opening")) }
        div id="terminal" data-url=(format!("/apps/{name}/terminal/session")) data-csrf=(ctx.csrf) data-instance=[instance]
            data-open=(ctx.t("term.open")) data-exited=(ctx.t("term.exited")) data-closed=(ctx.t("term.closed")) data-refused=(ctx.t("term.refused")) {}
        script src="/assets/xterm/xterm.min.js" {}
        script src="/assets/xterm/xterm-addon-fit.min.js" {}
        script src="/assets/terminal.js" {}
    };
    layout::page(&ctx, &format!("{name} · {}", ctx.t("term.title")), layout::Nav::Apps, &format!("/apps/{name}/terminal"), body).into_response()
}

/// Whether `Origin` names the host the request came to.
fn same_origin(headers: &HeaderMap) -> bool {
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok());
    let origin = headers.get(header::ORIGIN).and_then(|o| o.to_str().ok());
    match (host, origin) {
        (Some(host), Some(origin)) => origin == format!("https://{host}") || origin == format!("http://{host}"),
        _ => false,
    }
}

/// `GET /apps/{name}/terminal/session?csrf=…&cols=…&rows=…[&instance=N]`:
/// the WebSocket of the terminal's exec session.
pub async fn session(ctx: Ctx, headers: HeaderMap, Path(name): Path<String>, RawQuery(raw): RawQuery, upgrade: WebSocketUpgrade) -> Response {
    let mut pairs: Vec<(String, String)> = Vec::new();
    let mut csrf_ok = false;
    for (key, value) in url::form_urlencoded::parse(raw.unwrap_or_default().as_bytes()) {
        match key.as_ref() {
            "csrf" => csrf_ok = crate::auth::constant_time_eq(value.as_bytes(), ctx.csrf.as_bytes()),
            "cols" | "rows" | "instance" => pairs.push((key.into_owned(), value.into_owned())),
            _ => return (StatusCode::BAD_REQUEST, format!("{key}: unknown parameter")).into_response(),
        }
    }
    if !csrf_ok || !same_origin(&headers) {
        return (StatusCode::FORBIDDEN, ctx.t("csrf.invalid")).into_response();
    }
    pairs.push(("tty".into(), "1".into()));
    pairs.push(("command".into(), SHELL.into()));
    let query = url::form_urlencoded::Serializer::new(String::new()).extend_pairs(&pairs).finish();
    match api::sessions::exec(State(ctx.state.clone()), Extension(ctx.principal.clone()), Path(name), RawQuery(Some(query)), upgrade).await {
        Ok(response) => response,
        Err(err) => err.into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_dashboards_own_origin_opens_a_terminal() {
        let headers = |origin: Option<&str>| {
            let mut h = HeaderMap::new();
            h.insert(header::HOST, "cp.example:8443".parse().unwrap());
            if let Some(origin) = origin {
                h.insert(header::ORIGIN, origin.parse().unwrap());
            }
            h
        };
        assert!(same_origin(&headers(Some("https://cp.example:8443"))));
        assert!(!same_origin(&headers(Some("https://evil.example"))));
        assert!(!same_origin(&headers(Some("https://cp.example"))));
        assert!(!same_origin(&headers(None)));
    }
}
