//! The dashboard: server-rendered HTML (maud) on the user API's listener
//! at `/`, with one stylesheet and one small script compiled into the
//! binary. Every page works without JavaScript (forms post and redirect);
//! the script only makes pages live (the node table and the build log
//! follow server-sent events).
//!
//! Pages act through the same handlers as the JSON API (`crate::api`), so
//! validation and effects are the API's; this module only turns forms into
//! those calls and answers into HTML. Everything printed goes through
//! maud, which escapes it.

mod apps;
mod chart;
mod deployments;
mod format;
pub mod i18n;
mod layout;
mod monitoring;
mod nodes;
pub mod session;

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::{FromRequestParts, State};
use axum::http::header::{self, HeaderValue};
use axum::http::request::Parts;
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::{Form, Router};
use maud::{html, Markup};

use crate::ca::sha256_hex;
use crate::error::ApiError;
use crate::AppState;
use i18n::Lang;
use session::{Flash, COOKIE};

/// The language cookie: remembered for a year.
const LANG_COOKIE: &str = "cw_lang";

const CSS: &str = include_str!("assets/app.css");
const JS: &str = include_str!("assets/app.js");

/// Content-Security-Policy of every page: only our own script and style,
/// nothing inline, no framing.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

pub fn router() -> Router<Arc<AppState>> {
    Router::new()
        .route("/", get(|| async { Redirect::to("/nodes") }))
        .route("/login", get(login_page).post(login))
        .route("/logout", post(logout))
        .route("/lang", post(switch_language))
        .route("/assets/app.css", get(|| async { asset(CSS, "text/css; charset=utf-8") }))
        .route("/assets/app.js", get(|| async { asset(JS, "text/javascript; charset=utf-8") }))
        .route("/nodes", get(nodes::page))
        .route("/nodes/table", get(nodes::table_stream))
        .route("/nodes/join-token", post(nodes::join_token))
        .route("/nodes/{id}/{action}", get(nodes::confirm).post(nodes::act))
        .route("/apps", get(apps::list).post(apps::create))
        .route("/apps/{name}", get(apps::show))
        .route("/apps/{name}/env", post(apps::set_env))
        .route("/apps/{name}/domains", post(apps::set_domains))
        .route("/apps/{name}/deploy", post(apps::deploy))
        .route("/apps/{name}/rollback", post(apps::rollback))
        .route("/apps/{name}/delete", get(apps::confirm_delete).post(apps::delete))
        .route("/deployments/{id}", get(deployments::page))
        .route("/deployments/{id}/logs", get(deployments::log_stream))
        .route("/monitoring", get(monitoring::page))
        .layer(middleware::from_fn(security_headers))
}

fn asset(body: &'static str, content_type: &'static str) -> Response {
    ([(header::CONTENT_TYPE, content_type), (header::CACHE_CONTROL, "public, max-age=3600")], body).into_response()
}

async fn security_headers(request: axum::extract::Request, next: Next) -> Response {
    let mut response = next.run(request).await;
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CSP));
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(header::REFERRER_POLICY, HeaderValue::from_static("same-origin"));
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    response
}

/// The language of a request: the remembered switch, else Accept-Language.
fn language(parts: &Parts) -> Lang {
    let cookies = parts.headers.get(header::COOKIE).and_then(|v| v.to_str().ok()).unwrap_or("");
    if let Some(lang) = session::cookie(cookies, LANG_COOKIE).and_then(Lang::parse) {
        return lang;
    }
    let accept = parts.headers.get(header::ACCEPT_LANGUAGE).and_then(|v| v.to_str().ok()).unwrap_or("");
    Lang::from_accept_language(accept)
}

/// What every page needs: the language, and for a logged-in user the
/// session (its CSRF token and flash).
pub struct Ctx {
    pub lang: Lang,
    pub session_id: String,
    pub csrf: String,
    pub flash: Option<Flash>,
    pub state: Arc<AppState>,
}

impl Ctx {
    pub fn t(&self, key: &'static str) -> &'static str {
        self.lang.t(key)
    }

    /// Checks the CSRF token a form posted.
    pub fn check(&self, form: &HashMap<String, String>) -> Result<(), Response> {
        let posted = form.get("csrf").map(String::as_str).unwrap_or("");
        if posted.len() == self.csrf.len() && constant_time_eq(posted.as_bytes(), self.csrf.as_bytes()) {
            Ok(())
        } else {
            Err((StatusCode::FORBIDDEN, layout::message(self, self.t("csrf.invalid"))).into_response())
        }
    }

    pub fn flash(&self, flash: Flash) {
        self.state.web_sessions.flash(&self.session_id, flash);
    }

    /// Redirects to `to` after a form, with the outcome as the flash.
    pub fn outcome<T>(&self, result: Result<T, ApiError>, to: &str) -> Response {
        match result {
            Ok(_) => self.flash(Flash::Done),
            Err(err) => self.flash(Flash::Error(error_text(&err))),
        }
        Redirect::to(to).into_response()
    }
}

/// The text of an API error for a page (never holds a secret: API errors
/// are written not to).
pub fn error_text(err: &ApiError) -> String {
    err.to_string()
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

impl FromRequestParts<Arc<AppState>> for Ctx {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &Arc<AppState>) -> Result<Ctx, Response> {
        let lang = language(parts);
        let cookies = parts.headers.get(header::COOKIE).and_then(|v| v.to_str().ok()).unwrap_or("");
        let id = session::cookie(cookies, COOKIE).unwrap_or("").to_string();
        match state.web_sessions.touch(&id, state.clock.now_ms()) {
            Some(session) => Ok(Ctx { lang, session_id: id, csrf: session.csrf, flash: session.flash, state: state.clone() }),
            None => Err(Redirect::to("/login").into_response()),
        }
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

async fn login_page(PublicLang(lang): PublicLang) -> Markup {
    layout::login(lang, None)
}

fn session_cookie(id: &str, max_age_s: i64) -> HeaderValue {
    HeaderValue::from_str(&format!("{COOKIE}={id}; Path=/; HttpOnly; SameSite=Strict; Max-Age={max_age_s}")).expect("hex cookie")
}

/// Opens a session for a valid API token. The admin token (or, once
/// accounts exist, a personal token) is the credential.
async fn login(State(state): State<Arc<AppState>>, PublicLang(lang): PublicLang, Form(form): Form<HashMap<String, String>>) -> Response {
    let token = form.get("token").map(|t| t.trim()).unwrap_or("");
    let valid = !token.is_empty() && state.admin_tokens.read().expect("admin token lock").contains(&sha256_hex(token.as_bytes()));
    if !valid {
        tracing::info!("dashboard login refused");
        return (StatusCode::UNAUTHORIZED, layout::login(lang, Some(lang.t("login.invalid")))).into_response();
    }
    let id = state.web_sessions.open(state.clock.now_ms());
    let mut response = Redirect::to("/nodes").into_response();
    response.headers_mut().insert(header::SET_COOKIE, session_cookie(&id, session::IDLE_MS / 1000));
    response
}

async fn logout(ctx: Ctx, Form(form): Form<HashMap<String, String>>) -> Response {
    if let Err(refused) = ctx.check(&form) {
        return refused;
    }
    ctx.state.web_sessions.close(&ctx.session_id);
    let mut response = Redirect::to("/login").into_response();
    response.headers_mut().insert(header::SET_COOKIE, session_cookie("", 0));
    response
}

/// Remembers the chosen language in a cookie and goes back to the page
/// the switch was on (a local path only).
async fn switch_language(Form(form): Form<HashMap<String, String>>) -> Response {
    let lang = form.get("lang").and_then(|l| Lang::parse(l)).unwrap_or(Lang::En);
    let back = form
        .get("back")
        .filter(|b| b.starts_with('/') && !b.starts_with("//") && !b.contains('\\') && b.len() < 512)
        .map(String::as_str)
        .unwrap_or("/nodes");
    let mut response = Redirect::to(back).into_response();
    let cookie = format!("{LANG_COOKIE}={}; Path=/; SameSite=Lax; Max-Age=31536000", lang.code());
    response.headers_mut().insert(header::SET_COOKIE, HeaderValue::from_str(&cookie).expect("ascii cookie"));
    response
}

/// A page for a missing thing.
pub fn not_found(ctx: &Ctx) -> Response {
    (StatusCode::NOT_FOUND, layout::message(ctx, ctx.t("common.not_found"))).into_response()
}

/// A hidden CSRF field for a form.
pub fn csrf_field(ctx: &Ctx) -> Markup {
    html! { input type="hidden" name="csrf" value=(ctx.csrf); }
}
