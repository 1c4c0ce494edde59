//! The dashboard: server-rendered HTML (maud) on the user API's listener
//! at `/`, with one stylesheet and one small script compiled into the
//! binary. Every page works without JavaScript (forms post and redirect, or
//! show the page again with a refused form's reason next to it); the
//! script only makes pages live (the node table, a deployment's state and
//! build log, and an app's runtime log follow server-sent events; a task
//! run's output is polled).
//!
//! Who may see the pages is the accounts module's business: the login
//! form checks a user's name and password under the same rate limits as
//! `POST /api/session` and starts an [`auth::sessions`] session, whose
//! cookie opens the dashboard and the API alike; forms carry that
//! session's CSRF token (field `csrf_token`).
//!
//! Pages act through the same handlers as the JSON API (`cloudweb_http::api`), so
//! validation and effects are the API's; this module only turns forms into
//! those calls and answers into HTML. Everything printed goes through
//! maud, which escapes it.
//!
//! This crate sits on top of `cloudweb-http` and must never reach below it
//! for a change: no SQL of its own and no effect that bypasses the API's
//! handlers; it may read the shared state to render a page.

mod alerts;
mod app_sources;
mod audit;
mod apps;
mod chart;
mod deployments;
mod format;
pub mod i18n;
mod instances;
mod layout;
mod monitoring;
mod node_page;
mod nodes;
mod paging;
mod permissions;
mod previews;
mod services;
mod app_logs;
mod autoscaling;
mod exec_sessions;
mod tasks;
mod terminal;
mod usage_charts;
mod volumes;
mod backups;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{ConnectInfo, FromRequestParts, Request, State};
use axum::http::header::{self, HeaderValue};
use axum::http::request::Parts;
use axum::http::{HeaderMap, Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::{Form, Router};
use maud::{html, Markup};

// The layers below under the paths these modules use (`crate::store`,
// `crate::api`, ...).
pub(crate) use cloudweb_core::{acme, ca, clock, deploy, flash, routes, store, AppState};
pub(crate) use cloudweb_http::{api, auth, error, git};

use crate::auth::sessions;
use crate::error::ApiError;
use flash::Flash;
use i18n::Lang;

/// The language cookie: remembered for a year.
const LANG_COOKIE: &str = "cw_lang";

const CSS: &str = include_str!("assets/app.css");
const JS: &str = include_str!("assets/app.js");

/// Content-Security-Policy of every page: only our own script and style,
/// nothing inline, no framing.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

pub fn router(state: Arc<AppState>) -> Router<Arc<AppState>> {
    Router::new()
        .route("/", get(home))
        .route("/login", get(login_page).post(login))
        .route("/logout", post(logout))
        .route("/lang", post(switch_language))
        .route("/team", post(switch_team))
        .route("/assets/app.css", get(|| async { asset(CSS, "text/css; charset=utf-8") }))
        .route("/assets/app.js", get(|| async { asset(JS, "text/javascript; charset=utf-8") }))
        .route("/assets/terminal.js", get(|| async { asset(terminal::TERMINAL_JS, "text/javascript; charset=utf-8") }))
        .route("/assets/xterm/xterm.min.js", get(|| async { asset(terminal::XTERM_JS, "text/javascript; charset=utf-8") }))
        .route("/assets/xterm/xterm-addon-fit.min.js", get(|| async { asset(terminal::XTERM_FIT_JS, "text/javascript; charset=utf-8") }))
        .route("/assets/xterm/xterm.min.css", get(|| async { asset(terminal::XTERM_CSS, "text/css; charset=utf-8") }))
        .route("/nodes", get(nodes::page))
        .route("/nodes/table", get(nodes::table_stream))
        .route("/nodes/join-token", post(nodes::join_token))
        .route("/nodes/{id}", get(node_page::page))
        .route("/nodes/{id}/{action}", get(nodes::confirm).post(nodes::act))
        .route("/apps", get(apps::list).post(apps::create))
        .route("/apps/{name}", get(apps::show))
        .route("/apps/{name}/env", post(apps::set_env))
        .route("/apps/{name}/domains", post(apps::set_domains))
        .route("/apps/{name}/settings", post(apps::set_settings))
        .route("/apps/{name}/deploy", post(apps::deploy))
        .route("/apps/{name}/logs", get(app_logs::page))
        .route("/apps/{name}/terminal", get(terminal::page))
        .route("/apps/{name}/terminal/session", get(terminal::session))
        .route("/apps/{name}/rollback", post(apps::rollback))
        .route("/apps/{name}/delete", get(apps::confirm_delete).post(apps::delete))
        .route("/apps/{name}/cron/{job}/run", post(tasks::run_now))
        .route("/apps/{name}/runs/{id}", get(tasks::run_page))
        .route("/apps/{name}/runs/{id}/cancel", post(tasks::cancel))
        .route("/apps/{name}/previews/{number}/approve", post(previews::approve))
        .route("/apps/{name}/previews/{number}/remove", post(previews::remove))
        .route("/apps/{name}/volumes", post(volumes::attach))
        .route("/apps/{name}/volumes/{volume}/detach", post(volumes::detach))
        .route("/services", get(services::page).post(services::create))
        .route("/services/{name}/links", post(services::link))
        .route("/services/{name}/links/{app}/delete", post(services::unlink))
        .route("/services/{name}/rotate-password", post(services::rotate_password))
        .route("/services/{name}/upgrade", post(services::upgrade))
        .route("/services/{name}/delete", get(services::confirm_delete).post(services::delete))
        .route("/volumes", get(volumes::page))
        .route("/backups", get(backups::page))
        .route("/backups/destinations", axum::routing::post(backups::add_destination))
        .route("/backups/run/{kind}/{name}", axum::routing::post(backups::run))
        .route("/backups/jobs/{id}/confirm", axum::routing::post(backups::confirm_restore))
        .route("/volumes/{name}/delete", get(volumes::confirm_delete).post(volumes::delete))
        .route("/volumes/{name}/move", post(volumes::start_move))
        .route("/deployments/{id}", get(deployments::page))
        .route("/deployments/{id}/logs", get(deployments::log_stream))
        .route("/monitoring", get(monitoring::page))
        .route("/alerts", get(alerts::page))
        .route("/audit", get(audit::page))
        .route("/alerts/channels", post(alerts::add))
        .route("/alerts/channels/{id}/test", post(alerts::test))
        .route("/alerts/channels/{id}/delete", post(alerts::delete))
        .route_layer(middleware::from_fn_with_state(state, permissions::authorize))
        .layer(middleware::from_fn(security_headers))
}

/// The first page: the nodes for a cluster role, the apps for the rest.
async fn home(State(state): State<Arc<AppState>>, headers: HeaderMap) -> Redirect {
    let cookie = sessions::session_cookie(&headers).unwrap_or("").to_string();
    match sessions::lookup(&state, &cookie).await {
        Ok(Some(session)) if session.user.cluster_role.is_none() => Redirect::to("/apps"),
        _ => Redirect::to("/nodes"),
    }
}

fn asset(body: &'static str, content_type: &'static str) -> Response {
    ([(header::CONTENT_TYPE, content_type), (header::CACHE_CONTROL, "public, max-age=3600")], body).into_response()
}

async fn security_headers(request: axum::extract::Request, next: Next) -> Response {
    let mut response = next.run(request).await;
    add_security_headers(&mut response);
    response
}

fn add_security_headers(response: &mut Response) {
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CSP));
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(header::REFERRER_POLICY, HeaderValue::from_static("same-origin"));
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
}

/// What a browser gets for a path nothing serves (outside `/api/`, where
/// the API answers JSON): the 404 page, or the login page's redirect
/// without a session, like every page.
pub async fn not_found_page(State(state): State<Arc<AppState>>, request: Request) -> Response {
    let (mut parts, _) = request.into_parts();
    let mut response = match Ctx::from_request_parts(&mut parts, &state).await {
        Ok(ctx) => not_found(&ctx),
        Err(rejection) => rejection,
    };
    add_security_headers(&mut response);
    response
}

/// The language of a request: the remembered switch, else Accept-Language.
fn language(parts: &Parts) -> Lang {
    let cookies = parts.headers.get(header::COOKIE).and_then(|v| v.to_str().ok()).unwrap_or("");
    if let Some(lang) = flash::cookie(cookies, LANG_COOKIE).and_then(Lang::parse) {
        return lang;
    }
    let accept = parts.headers.get(header::ACCEPT_LANGUAGE).and_then(|v| v.to_str().ok()).unwrap_or("");
    Lang::from_accept_language(accept)
}

/// What every page needs: the language, and the logged-in user's
/// session (the accounts module's: its CSRF token, and the flash).
pub struct Ctx {
    pub lang: Lang,
    /// The session's id digest (the flash is kept under it).
    pub session_key: String,
    pub csrf: String,
    pub user_name: String,
    /// The logged-in user as the API sees them (their session), so forms
    /// act with the user's own rights and linked identities.
    pub principal: auth::Principal,
    /// What the user may do (see `permissions`).
    pub access: cloudweb_core::access::Access,
    /// The team a new thing goes to (the checked `Create` need's).
    pub team: cloudweb_http::auth::authorize::RequestTeam,
    /// The team chosen in the header's form (cookie `cloudweb_team`).
    pub current_team: Option<String>,
    pub flash: Option<Flash>,
    pub state: Arc<AppState>,
    /// Backups that need attention (the banner on every page).
    pub backup_alerts: Vec<String>,
    /// Open alerts (the bell on every page).
    pub open_alerts: usize,
}

impl Ctx {
    pub fn t(&self, key: &'static str) -> &'static str {
        self.lang.t(key)
    }

    /// Checks the session's CSRF token a form posted (field `csrf_token`):
    /// the 403 page to answer when it is wrong, `None` when it is right.
    pub fn refusal(&self, form: &HashMap<String, String>) -> Option<Response> {
        let posted = form.get(sessions::CSRF_FIELD).map(String::as_str).unwrap_or("");
        if auth::constant_time_eq(posted.as_bytes(), self.csrf.as_bytes()) {
            None
        } else {
            Some((StatusCode::FORBIDDEN, layout::message(self, self.t("csrf.invalid"))).into_response())
        }
    }

    pub async fn flash(&self, flash: Flash) {
        crate::flash::put(&self.state, &self.session_key, flash).await;
    }

    /// Redirects to `to` after a form, with the outcome as the flash.
    pub async fn outcome<T>(&self, result: Result<T, ApiError>, to: &str) -> Response {
        match result {
            Ok(_) => self.flash(Flash::Done).await,
            Err(err) => self.flash(Flash::Error(error_text(&err))).await,
        }
        Redirect::to(to).into_response()
    }
}

/// The text of an API error for a page (never holds a secret: API errors
/// are written not to).
pub fn error_text(err: &ApiError) -> String {
    err.to_string()
}

/// Pages need the accounts module's session cookie; without a live one
/// the browser goes to the login page. A form post must also come from
/// this site (the same check the API makes) before its CSRF token is read.
impl FromRequestParts<Arc<AppState>> for Ctx {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &Arc<AppState>) -> Result<Ctx, Response> {
        let lang = language(parts);
        let cookie = sessions::session_cookie(&parts.headers).unwrap_or("").to_string();
        let session = match sessions::lookup(state, &cookie).await {
            Ok(Some(session)) => session,
            Ok(None) => return Err(Redirect::to("/login").into_response()),
            Err(err) => return Err(err.into_response()),
        };
        if !matches!(parts.method, Method::GET | Method::HEAD) {
            if let Err(err) = auth::guard::same_origin(&parts.headers) {
                return Err(err.into_response());
            }
        }
        let flash = crate::flash::take(state, &session.id_sha256).await;
        let via = auth::Via::Session { id_sha256: session.id_sha256.clone(), csrf_token: session.csrf_token.clone(), expires_at: session.expires_at };
        let principal = auth::Principal::User { user: session.user.clone(), via };
        // Checked pages carry the caller's access; the not-found page
        // (outside the table) works it out.
        let access = match parts.extensions.get::<cloudweb_core::access::Access>().cloned() {
            Some(access) => access,
            None => cloudweb_core::access::access_of(state, &principal).await.map_err(IntoResponse::into_response)?,
        };
        let team = parts.extensions.get::<cloudweb_http::auth::authorize::RequestTeam>().cloned().unwrap_or(cloudweb_http::auth::authorize::RequestTeam(None));
        let sees_all = access.sees_all();
        Ok(Ctx {
            lang,
            session_key: session.id_sha256,
            csrf: session.csrf_token,
            user_name: session.user.name.clone(),
            principal,
            access,
            team,
            current_team: permissions::team_cookie(&parts.headers),
            flash,
            // The banner and the bell are the cluster's: for cluster roles.
            backup_alerts: if sees_all { backups::alerts(state).await } else { Vec::new() },
            open_alerts: if sees_all { alerts::open_count(state).await } else { 0 },
            state: state.clone(),
        })
    }
}

/// The language of a request that needs no session (the login page).
pub struct PublicLang(pub Lang);

impl<S: Send + Sync> FromRequestParts<S> for PublicLang {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<PublicLang, Self::Rejection> {
        Ok(PublicLang(language(parts)))
    }
}

async fn login_page(State(state): State<Arc<AppState>>, PublicLang(lang): PublicLang) -> Markup {
    layout::login(lang, None, &login_hosts(&state).await)
}

/// The git hosts set up for logging in (a store error shows none: the
/// password form still works).
async fn login_hosts(state: &AppState) -> Vec<layout::LoginHost> {
    let mut hosts = Vec::new();
    if matches!(state.store.gitlab_settings().await, Ok(Some(_))) {
        hosts.push(layout::LoginHost { label: "GitLab", href: "/api/auth/gitlab/login" });
    }
    if matches!(state.store.github_login().await, Ok(Some(_))) {
        hosts.push(layout::LoginHost { label: "GitHub", href: "/api/auth/github/login" });
    }
    if matches!(state.store.gitea_settings().await, Ok(Some(_))) {
        hosts.push(layout::LoginHost { label: "Gitea", href: "/api/auth/gitea/login" });
    }
    hosts
}

/// Logs a user in with a name and password: the accounts module's check
/// (same rate limits as `POST /api/session`) and its session, so one
/// cookie opens both the dashboard and the API.
async fn login(State(state): State<Arc<AppState>>, PublicLang(lang): PublicLang, request: Request) -> Response {
    let address = request.extensions().get::<ConnectInfo<SocketAddr>>().map(|c| c.0.ip());
    let (parts, body) = request.into_parts();
    let headers = parts.headers;
    let hosts = login_hosts(&state).await;
    let refuse = |status: StatusCode, text: &str| (status, layout::login(lang, Some(text), &hosts)).into_response();
    // A cross-site login would log a victim into the attacker's account.
    if auth::guard::same_origin(&headers).is_err() {
        return refuse(StatusCode::FORBIDDEN, lang.t("csrf.invalid"));
    }
    let Ok(bytes) = axum::body::to_bytes(body, 64 * 1024).await else {
        return refuse(StatusCode::PAYLOAD_TOO_LARGE, lang.t("login.invalid"));
    };
    let form: HashMap<String, String> = url::form_urlencoded::parse(&bytes).into_owned().collect();
    let name = form.get("name").map(|n| n.trim()).unwrap_or("");
    let password = form.get("password").map(String::as_str).unwrap_or("");
    let user = match auth::routes::check_login(&state, name, password, address).await {
        Ok(user) => user,
        Err(ApiError::TooManyRequests { retry_after_s, .. }) => {
            let text = format!("{} ({retry_after_s} s)", lang.t("login.too_many"));
            let mut response = refuse(StatusCode::TOO_MANY_REQUESTS, &text);
            response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(retry_after_s));
            return response;
        }
        Err(ApiError::Unauthorized(_)) => return refuse(StatusCode::UNAUTHORIZED, lang.t("login.invalid")),
        Err(err) => return err.into_response(),
    };
    // A new login replaces the session this browser had.
    if let Some(old) = sessions::session_cookie(&headers) {
        if let Err(err) = sessions::end(&state, &crate::ca::sha256_hex(old.as_bytes())).await {
            return err.into_response();
        }
    }
    let session = match sessions::start(&state, &user.id).await {
        Ok(session) => session,
        Err(ApiError::Forbidden(_)) => return refuse(StatusCode::UNAUTHORIZED, lang.t("login.invalid")),
        Err(err) => return err.into_response(),
    };
    let mut response = Redirect::to("/nodes").into_response();
    for cookie in sessions::set_cookie_headers(&state, &headers, &session) {
        response.headers_mut().append(header::SET_COOKIE, cookie);
    }
    response
}

/// Ends the session on the server (its cookie stops opening the API too)
/// and clears the cookies.
async fn logout(ctx: Ctx, headers: HeaderMap, Form(form): Form<HashMap<String, String>>) -> Response {
    if let Some(refused) = ctx.refusal(&form) {
        return refused;
    }
    if let Err(err) = sessions::end(&ctx.state, &ctx.session_key).await {
        return err.into_response();
    }
    crate::flash::forget(&ctx.state, &ctx.session_key).await;
    tracing::info!(user = %ctx.user_name, "session ended by dashboard logout");
    let mut response = Redirect::to("/login").into_response();
    for cookie in sessions::clear_cookie_headers(&ctx.state, &headers) {
        response.headers_mut().append(header::SET_COOKIE, cookie);
    }
    response
}

/// Remembers the chosen language in a cookie and goes back to the page
/// the switch was on (a local path only). Like every form it is refused
/// from another site.
async fn switch_language(headers: HeaderMap, Form(form): Form<HashMap<String, String>>) -> Response {
    if let Err(err) = auth::guard::same_origin(&headers) {
        return err.into_response();
    }
    let lang = form.get("lang").and_then(|l| Lang::parse(l)).unwrap_or(Lang::En);
    let back = form.get("back").and_then(|b| local_path(b)).unwrap_or_else(|| "/nodes".to_string());
    let mut response = Redirect::to(&back).into_response();
    let cookie = format!("{LANG_COOKIE}={}; Path=/; SameSite=Lax; Max-Age=31536000", lang.code());
    response.headers_mut().insert(header::SET_COOKIE, HeaderValue::from_str(&cookie).expect("ascii cookie"));
    response
}

/// The header's team form: new apps, services and destinations made in
/// the dashboard go to this team (a cookie the checks read as the
/// `X-Cloudweb-Team` header), which must be one of the user's.
async fn switch_team(ctx: Ctx, Form(form): Form<HashMap<String, String>>) -> Response {
    if let Some(refused) = ctx.refusal(&form) {
        return refused;
    }
    let back = form.get("back").and_then(|b| local_path(b)).unwrap_or_else(|| "/apps".to_string());
    let Some(grant) = form.get("team").and_then(|t| ctx.access.grants.iter().find(|g| &g.team_name == t)) else {
        return ctx.outcome::<()>(Err(ApiError::NotFound("no such team among yours".to_string())), &back).await;
    };
    let mut response = Redirect::to(&back).into_response();
    let cookie = format!("{}={}; Path=/; SameSite=Lax; HttpOnly; Max-Age=31536000", permissions::TEAM_COOKIE, grant.team_name);
    response.headers_mut().insert(header::SET_COOKIE, HeaderValue::from_str(&cookie).expect("team names are ASCII"));
    response
}

/// `back` as a path on this site (path and query, percent-encoded by the
/// URL parser), or `None` for anything a browser could read as another
/// site: a scheme, `//host`, a backslash, or a control character anywhere
/// (browsers drop tabs and newlines, so `/\t/evil.example/` is
/// `//evil.example/` to them).
fn local_path(back: &str) -> Option<String> {
    if back.len() >= 512 || !back.starts_with('/') || back.starts_with("//") || back.contains('\\') || back.chars().any(char::is_control) {
        return None;
    }
    let base = url::Url::parse("http://this.invalid/").expect("literal base URL");
    let joined = base.join(back).ok()?;
    if joined.origin() != base.origin() || joined.path().starts_with("//") {
        return None;
    }
    Some(match joined.query() {
        Some(query) => format!("{}?{query}", joined.path()),
        None => joined.path().to_string(),
    })
}

/// A page for a missing thing.
pub fn not_found(ctx: &Ctx) -> Response {
    (StatusCode::NOT_FOUND, layout::message(ctx, ctx.t("common.not_found"))).into_response()
}

/// A hidden CSRF field for a form.
pub fn csrf_field(ctx: &Ctx) -> Markup {
    html! { input type="hidden" name=(sessions::CSRF_FIELD) value=(ctx.csrf); }
}

#[cfg(test)]
mod tests {
    use super::local_path;

    #[test]
    fn the_language_switch_goes_back_only_to_a_local_path() {
        assert_eq!(local_path("/apps").as_deref(), Some("/apps"));
        assert_eq!(local_path("/apps/web?tab=logs").as_deref(), Some("/apps/web?tab=logs"));
        assert_eq!(local_path("/apps/ü").as_deref(), Some("/apps/%C3%BC"));
        for bad in ["//evil.example/", "/\t/evil.example/", "/\n/evil.example/", "/\r\nSet-Cookie: x=1", "/\\evil.example", "https://evil.example/", "apps", "", "/\u{7f}"] {
            assert_eq!(local_path(bad), None, "{bad:?}");
        }
    }
}
