//! The Apps pages: the list with status and URL, the create form (one of
//! the user's GitLab projects, or a git URL, and build settings), and one app's page: settings, domains, write-only
//! environment, deploy, deployments with rollback, delete.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Redirect, Response};
use axum::Form;
use maud::{html, Markup};
use cloudweb_api_types::apps::{DeployRequest, DeploymentQueued, DomainList, EnvVars, RollbackRequest};
use cloudweb_api_types::volumes::VolumesOnDelete;
use serde_json::{json, Map, Value};

use super::layout::{self, Nav};
use super::paging::{self, ListQuery, PageInfo};
use super::usage_charts::{self, RangeQuery};
use super::app_sources::{self, Sources};
use super::{csrf_field, deployments, Ctx};
use crate::api;
use crate::error::ApiError;
use crate::store::{AppRow, DeploymentRow};
use crate::AppState;

/// The address an app answers on by default.
pub fn default_url(state: &AppState, app: &str) -> String {
    format!("https://{app}.{}/", state.config.base_domain)
}

/// The state an app is in, from its newest deployments: `running` when one
/// runs, else the newest one's state; `None` before the first deploy.
fn status(deployments: &[DeploymentRow]) -> Option<&str> {
    if deployments.iter().any(|d| d.state == "running") && !deployments.first().is_some_and(|d| matches!(d.state.as_str(), "queued" | "building" | "deploying")) {
        return Some("running");
    }
    deployments.first().map(|d| d.state.as_str())
}

/// A form on the app pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FormId {
    Create,
    Deploy,
    Settings,
    Domains,
    Env,
}

impl FormId {
    fn id(self) -> &'static str {
        match self {
            FormId::Create => "create",
            FormId::Deploy => "deploy",
            FormId::Settings => "settings",
            FormId::Domains => "domains",
            FormId::Env => "env",
        }
    }
}

/// A form the API refused. The page is shown again (not redirected to)
/// with the reason next to that form, which may be far down the page, and
/// the fields as the user filled them in.
pub struct Refused<'a> {
    pub form: FormId,
    pub error: String,
    pub values: &'a HashMap<String, String>,
}

/// What the user typed in `key` when `form` was the one refused (empty if
/// they left it out), `None` otherwise.
fn typed<'a>(refused: Option<&'a Refused<'a>>, form: FormId, key: &str) -> Option<&'a str> {
    refused.filter(|r| r.form == form).map(|r| r.values.get(key).map_or("", String::as_str))
}

/// The reason `form` was refused, inside it; the first field takes the
/// focus so the browser scrolls there.
fn form_error(ctx: &Ctx, refused: Option<&Refused>, form: FormId) -> Markup {
    match refused.filter(|r| r.form == form) {
        Some(refused) => html! {
            p.flash.error.form-error role="alert" id=(format!("{}-error", form.id())) { strong { (ctx.t("common.error")) ": " } (refused.error) }
        },
        None => html! {},
    }
}

/// The answer to a refused form: the page again, not cached (it may hold
/// what the user typed, an env value too), with the API's status.
fn refused_page(err: &ApiError, page: Markup) -> Response {
    (err.status(), [(axum::http::header::CACHE_CONTROL, "no-store")], page).into_response()
}

pub fn list_body(ctx: &Ctx, page: &AppPage, sources: &Sources, refused: Option<&Refused>) -> Markup {
    let apps = &page.rows;
    html! {
        @if page.info.total == 0 && page.query.search().is_none() { p.empty { (ctx.t("apps.empty")) } }
        @else {
            (paging::search_form(ctx, "/apps", &page.query, &[]))
            div.scroll { table {
                thead { tr {
                    th scope="col" { (ctx.t("apps.name")) }
                    th scope="col" { (ctx.t("apps.status")) }
                    th scope="col" { (ctx.t("apps.url")) }
                    th scope="col" { (ctx.t("apps.instances")) }
                } }
                tbody {
                    @for (app, deployments) in apps {
                        @let url = default_url(&ctx.state, &app.name);
                        tr data-app=(app.name) {
                            th scope="row" { a href=(format!("/apps/{}", app.name)) { (app.name) } }
                            td data-label=(ctx.t("apps.status")) { @match status(deployments) { Some(s) => { (deployments::state_badge(ctx.lang, s)) }, None => { (ctx.t("apps.no_deployments")) } } }
                            td data-label=(ctx.t("apps.url")) { a href=(url) { (url) } }
                            td.num data-label=(ctx.t("apps.instances")) { (app.instances) }
                        }
                    }
                }
            } }
            (paging::pager(ctx, "/apps", &page.query, &page.info))
        }
        h2 { (ctx.t("apps.create")) }
        (create_form(ctx, sources, refused))
    }
}

fn field(id: &str, label: &str, input: Markup) -> Markup {
    html! { p.field { label for=(id) { (label) } (input) } }
}

fn create_form(ctx: &Ctx, sources: &Sources, refused: Option<&Refused>) -> Markup {
    let from_provider = sources.offers_any();
    let typed = |key: &str| typed(refused, FormId::Create, key);
    let failed = typed("name").is_some();
    let chosen = |key: &str, value: &str, default: bool| typed(key).map_or(default, |t| t == value);
    html! {
        form.create method="post" action="/apps" {
            (csrf_field(ctx))
            (form_error(ctx, refused, FormId::Create))
            (field("name", ctx.t("apps.name"), html! { input id="name" name="name" required pattern="[a-z0-9]([a-z0-9-]*[a-z0-9])?" maxlength="63" value=[typed("name")] autofocus[failed]; }))
            (sources.fields(ctx, &|key: &str| typed(key).map(str::to_string)))
            (field("repo_url", ctx.t("apps.repo"), html! { input id="repo_url" name="repo_url" required[!from_provider] placeholder="https://gitlab.example.com/team/app.git" value=[typed("repo_url")]; }))
            (field("branch", ctx.t("apps.branch"), html! { input id="branch" name="branch" placeholder=(if from_provider { ctx.t("apps.branch_default") } else { "main" }) value=[typed("branch").or((!from_provider).then_some("main"))]; }))
            (field("port", ctx.t("apps.port"), html! { input id="port" name="port" type="number" min="1" max="65535" value=(typed("port").unwrap_or("8080")) required; }))
            (field("strategy", ctx.t("apps.strategy"), html! {
                select id="strategy" name="strategy" {
                    @for strategy in ["auto", "dockerfile", "static", "buildpacks"] {
                        option value=(strategy) selected[chosen("strategy", strategy, false)] { (ctx.t(strategy_key(strategy))) }
                    }
                }
            }))
            (field("install_cmd", ctx.t("apps.install_cmd"), html! { input id="install_cmd" name="install_cmd" placeholder="npm ci" value=[typed("install_cmd")]; }))
            (field("build_cmd", ctx.t("apps.build_cmd"), html! { input id="build_cmd" name="build_cmd" placeholder="npm run build" value=[typed("build_cmd")]; }))
            (field("output_dir", ctx.t("apps.output_dir"), html! { input id="output_dir" name="output_dir" placeholder="dist" value=[typed("output_dir")]; }))
            (field("spa", ctx.t("apps.spa"), html! {
                select id="spa" name="spa" {
                    option value="auto" { (ctx.t("apps.spa.auto")) }
                    option value="yes" selected[chosen("spa", "yes", false)] { (ctx.t("common.yes")) }
                    option value="no" selected[chosen("spa", "no", false)] { (ctx.t("common.no")) }
                }
            }))
            (field("instances", ctx.t("apps.instances"), html! { input id="instances" name="instances" type="number" min="1" max="20" value=(typed("instances").unwrap_or("1")); }))
            (field("cpu", ctx.t("apps.cpu"), html! { input id="cpu" name="cpu" type="number" min="0.01" step="0.01" placeholder="0.5" value=[typed("cpu")]; }))
            (field("memory", ctx.t("apps.memory"), html! { input id="memory" name="memory" type="number" min="16" placeholder="256" value=[typed("memory")]; }))
            (field("domains", ctx.t("apps.domains"), html! { textarea id="domains" name="domains" rows="2" { (typed("domains").unwrap_or("")) } }))
            button type="submit" { (ctx.t("apps.create")) }
        }
    }
}

/// The apps of one page of the list (search and page from `query`), with
/// their deployments: read for those apps only.
async fn load_page(state: &AppState, access: &cloudweb_core::access::Access, query: &ListQuery) -> Result<AppPage, ApiError> {
    let search = query.search();
    let apps: Vec<AppRow> = state
        .store
        .apps()
        .await?
        .into_iter()
        .filter(|a| access.sees(&a.team_id, Some(&a.name)) && paging::matches(search.as_deref(), &[&a.name, &a.repo_url]))
        .collect();
    let paged = paging::page_of(&apps, query.page());
    let mut rows = Vec::with_capacity(paged.rows.len());
    for app in paged.rows {
        let deployments = state.store.app_deployments(&app.name).await?;
        rows.push((app.clone(), deployments));
    }
    Ok(AppPage { rows, info: paged.info, query: query.clone() })
}

/// One page of the app list.
pub struct AppPage {
    rows: Vec<(AppRow, Vec<DeploymentRow>)>,
    info: PageInfo,
    query: ListQuery,
}

pub async fn list(ctx: Ctx, Query(query): Query<ListQuery>) -> Response {
    match load_page(&ctx.state, &ctx.access, &query).await {
        Ok(apps) => {
            let sources = app_sources::sources(&ctx).await;
            let qs = query.at_page(apps.info.page);
            let here = if qs.is_empty() { "/apps".to_string() } else { format!("/apps?{qs}") };
            layout::page(&ctx, ctx.t("apps.title"), Nav::Apps, &here, list_body(&ctx, &apps, &sources, None)).into_response()
        }
        Err(err) => err.into_response(),
    }
}

fn non_empty<'a>(form: &'a HashMap<String, String>, key: &str) -> Option<&'a str> {
    form.get(key).map(|v| v.trim()).filter(|v| !v.is_empty())
}

fn lines(text: &str) -> Vec<String> {
    text.split(|c: char| c == '\n' || c == ',' || c.is_whitespace()).map(str::trim).filter(|l| !l.is_empty()).map(str::to_string).collect()
}

/// The static-site build settings a form fills in (empty: none).
fn build_settings(form: &HashMap<String, String>) -> Map<String, Value> {
    let mut build = Map::new();
    for key in ["install_cmd", "build_cmd", "output_dir"] {
        if let Some(value) = non_empty(form, key) {
            build.insert(key.into(), json!(value));
        }
    }
    if let Some(spa) = non_empty(form, "spa").filter(|v| *v != "auto") {
        build.insert("spa".into(), json!(spa));
    }
    build
}

/// The API's create request from the form's fields.
///
/// Still a JSON map, not `cloudweb_api_types::apps::CreateApp` (issue 19):
/// the type cannot say what this body says. It always sends `domains`
/// (`[]` when the form has none, where this leaves the field out), it
/// drops an empty `repo_url` (this sends `""` when no GitLab project is
/// chosen), and its `strategy` and `build.spa` are enums, where the form
/// may post any string and the handler's own parse error names it.
fn create_request(form: &HashMap<String, String>) -> Result<Value, ApiError> {
    let number = |key: &str| -> Result<Option<f64>, ApiError> {
        non_empty(form, key).map(|v| v.parse::<f64>().map_err(|_| ApiError::BadRequest(format!("invalid {key}: not a number")))).transpose()
    };
    let mut request = Map::new();
    request.insert("name".into(), json!(non_empty(form, "name").unwrap_or("")));
    app_sources::add_source(form, &mut request)?;
    if let Some(branch) = non_empty(form, "branch") {
        request.insert("branch".into(), json!(branch));
    }
    let port = non_empty(form, "port").unwrap_or("").parse::<u16>().map_err(|_| ApiError::BadRequest("invalid port: must be 1 to 65535".into()))?;
    request.insert("port".into(), json!(port));
    let strategy = non_empty(form, "strategy").unwrap_or("auto");
    let build = build_settings(form);
    if strategy != "auto" || !build.is_empty() {
        request.insert("strategy".into(), json!(if strategy == "auto" { "static" } else { strategy }));
    }
    if !build.is_empty() {
        request.insert("build".into(), Value::Object(build));
    }
    if let Some(instances) = number("instances")? {
        request.insert("instances".into(), json!(instances as u32));
    }
    if let Some(cpu) = number("cpu")? {
        request.insert("cpu".into(), json!(cpu));
    }
    if let Some(memory) = number("memory")? {
        request.insert("memory".into(), json!((memory * 1024.0 * 1024.0) as u64));
    }
    let domains = lines(form.get("domains").map(String::as_str).unwrap_or(""));
    if !domains.is_empty() {
        request.insert("domains".into(), json!(domains));
    }
    Ok(Value::Object(request))
}

pub async fn create(ctx: Ctx, Form(form): Form<HashMap<String, String>>) -> Response {
    if let Some(refused) = ctx.refusal(&form) {
        return refused;
    }
    let result = match create_request(&form) {
        // As the logged-in user: a GitLab project is reached through their
        // own linked identity, never another user's.
        Ok(request) => api::apps::create_for(ctx.state.clone(), &ctx.principal, &ctx.team.id(), Ok(Bytes::from(request.to_string()))).await,
        Err(err) => Err(err),
    };
    match result {
        Ok(_) => {
            let name = non_empty(&form, "name").unwrap_or("");
            ctx.outcome(Ok::<(), ApiError>(()), &format!("/apps/{name}")).await
        }
        Err(err) => {
            let apps = match load_page(&ctx.state, &ctx.access, &ListQuery::default()).await {
                Ok(apps) => apps,
                Err(err) => return err.into_response(),
            };
            let sources = app_sources::sources(&ctx).await;
            let refused = Refused { form: FormId::Create, error: super::error_text(&err), values: &form };
            refused_page(&err, layout::page(&ctx, ctx.t("apps.title"), Nav::Apps, "/apps", list_body(&ctx, &apps, &sources, Some(&refused))))
        }
    }
}

fn certificate_state_key(state: &str) -> &'static str {
    match state {
        "internal" => "cert.internal",
        "issuing" => "cert.issuing",
        "valid" => "cert.valid",
        "renewing" => "cert.renewing",
        _ => "cert.failed",
    }
}

/// The certificate of each host the app answers on.
fn certificates(ctx: &Ctx, app: &AppRow) -> Markup {
    let hosts = crate::routes::app_hosts(&app.name, &ctx.state.config.base_domain, &app.domains);
    let statuses = crate::acme::host_status(&ctx.state, &hosts);
    html! {
        h3 { (ctx.t("apps.certificates")) }
        div.scroll { table.certificates {
            thead { tr {
                th scope="col" { (ctx.t("apps.cert_host")) }
                th scope="col" { (ctx.t("apps.cert_state")) }
                th scope="col" { (ctx.t("apps.cert_not_after")) }
                th scope="col" { (ctx.t("apps.cert_issuer")) }
                th scope="col" { (ctx.t("apps.cert_orders")) }
                th scope="col" { (ctx.t("apps.cert_error")) }
            } }
            tbody {
                @for status in &statuses {
                    tr data-host=(status.host) data-state=(status.state) {
                        td data-label=(ctx.t("apps.cert_host")) { code { (status.host) } }
                        td data-label=(ctx.t("apps.cert_state")) { (ctx.t(certificate_state_key(status.state))) }
                        td data-label=(ctx.t("apps.cert_not_after")) { @if let Some(ms) = status.not_after_ms { (super::format::datetime(ms)) } @else { "–" } }
                        td data-label=(ctx.t("apps.cert_issuer")) { (status.issuer.as_deref().unwrap_or("–")) }
                        td data-label=(ctx.t("apps.cert_orders")) { (status.orders) }
                        td data-label=(ctx.t("apps.cert_error")) { (status.last_error.as_deref().unwrap_or("–")) }
                    }
                }
            }
        } }
    }
}

/// One app's page body. `env_names` are the names only: values are never
/// read back for display. `refused`: the form the API just refused.
pub fn app_body(ctx: &Ctx, app: &AppRow, env_names: &[String], deployments: &[DeploymentRow], refused: Option<&Refused>) -> Markup {
    let domains: Vec<String> = serde_json::from_str(&app.domains).unwrap_or_default();
    let build: Option<Value> = app.build.as_deref().and_then(|b| serde_json::from_str(b).ok());
    let url = default_url(&ctx.state, &app.name);
    let base = format!("/apps/{}", app.name);
    html! {
        p { a href=(url) { (url) } @for domain in &domains { " · " a href=(format!("https://{domain}/")) { (domain) } } }
        section {
            form.inline method="post" action=(format!("{base}/deploy")) {
                (csrf_field(ctx))
                (form_error(ctx, refused, FormId::Deploy))
                label for="commit" { (ctx.t("apps.commit")) }
                @let commit = typed(refused, FormId::Deploy, "commit");
                input id="commit" name="commit" size="12" maxlength="64" value=[commit] autofocus[commit.is_some()];
                button type="submit" { @if deployments.is_empty() { (ctx.t("apps.deploy")) } @else { (ctx.t("apps.redeploy")) } }
            }
        }
        section {
            h2 { (ctx.t("apps.deployments")) }
            (deployments::list(ctx, &app.name, deployments))
        }
        section {
            h2 { (ctx.t("apps.settings")) }
            dl.settings {
                dt { (ctx.t("apps.repo")) } dd { code { (app.repo_url) } }
                dt { (ctx.t("apps.branch")) } dd { (app.branch) }
                dt { (ctx.t("apps.port")) } dd { (app.port) }
                dt { (ctx.t("apps.strategy")) } dd { (app.strategy)
                    @if let Some(build) = &build {
                        @for (key, value) in build.as_object().into_iter().flatten() { br; small { (key) ": " code { (value.as_str().map(str::to_string).unwrap_or_else(|| value.to_string())) } } }
                    }
                }
                dt { (ctx.t("apps.health_path")) } dd { code { (app.health_path) } }
                dt { (ctx.t("apps.instances")) } dd { (app.instances) }
                dt { (ctx.t("apps.resources")) } dd {
                    (ctx.t("apps.cpu")) ": " (app.cpu.map(|c| c.to_string()).unwrap_or_else(|| ctx.t("apps.unlimited").to_string()))
                    br;
                    (ctx.t("apps.memory")) ": " (app.memory_bytes.map(|m| (m >> 20).to_string()).unwrap_or_else(|| ctx.t("apps.unlimited").to_string()))
                }
            }
        }
        section {
            (settings_form(ctx, app, build.as_ref(), refused))
        }
        section {
            h2 { (ctx.t("apps.domains")) }
            form method="post" action=(format!("{base}/domains")) {
                (csrf_field(ctx))
                (form_error(ctx, refused, FormId::Domains))
                label for="domains" { (ctx.t("apps.domains_help")) }
                @let typed_domains = typed(refused, FormId::Domains, "domains");
                textarea id="domains" name="domains" rows="3" autofocus[typed_domains.is_some()] { (typed_domains.map_or_else(|| domains.join("\n"), str::to_string)) }
                button type="submit" { (ctx.t("apps.save")) }
            }
            (certificates(ctx, app))
        }
        section {
            h2 { (ctx.t("apps.env")) }
            p.help { (ctx.t("apps.env_help")) }
            @if env_names.is_empty() { p { (ctx.t("apps.env_none")) } }
            ul.env {
                @for name in env_names {
                    li {
                        code { (name) }
                        form.inline method="post" action=(format!("{base}/env")) {
                            (csrf_field(ctx))
                            input type="hidden" name="unset" value=(name);
                            button type="submit" aria-label=(format!("{} {name}", ctx.t("apps.env_unset"))) { (ctx.t("apps.env_unset")) }
                        }
                    }
                }
            }
            form.inline method="post" action=(format!("{base}/env")) {
                (csrf_field(ctx))
                (form_error(ctx, refused, FormId::Env))
                @let env_name = typed(refused, FormId::Env, "name");
                label for="env-name" { (ctx.t("apps.env_name")) }
                input id="env-name" name="name" required maxlength="128" autocomplete="off" value=[env_name] autofocus[env_name.is_some()];
                label for="env-value" { (ctx.t("apps.env_value")) }
                // The value may be a secret: never sent back, also not in a
                // refused form (the name is).
                input id="env-value" name="value" type="password" autocomplete="off";
                button type="submit" { (ctx.t("apps.env_set")) }
            }
        }
        section {
            a.button.danger href=(format!("{base}/delete")) { (ctx.t("apps.delete")) }
        }
    }
}

/// The form that changes an app's settings (`PATCH /api/apps/{name}`),
/// filled with the current ones.
fn settings_form(ctx: &Ctx, app: &AppRow, build: Option<&Value>, refused: Option<&Refused>) -> Markup {
    // What the user typed when this form was refused, else the current value.
    let value = |key: &str, current: String| typed(refused, FormId::Settings, key).map_or(current, str::to_string);
    let build_field = |key: &str| value(key, build.and_then(|b| b.get(key)).and_then(Value::as_str).unwrap_or_default().to_string());
    let spa = build_field("spa");
    let strategy = value("strategy", app.strategy.clone());
    let build_timeout = app.build_timeout_s.unwrap_or(i64::from(cloudweb_protocol::deploy::DEFAULT_BUILD_TIMEOUT_SECONDS));
    let failed = typed(refused, FormId::Settings, "branch").is_some();
    html! {
        details #edit-settings open[failed] {
            summary { (ctx.t("apps.edit_settings")) }
            p.help { (ctx.t("apps.edit_settings_help")) }
            form.settings method="post" action=(format!("/apps/{}/settings", app.name)) {
                (csrf_field(ctx))
                (form_error(ctx, refused, FormId::Settings))
                (field("set-branch", ctx.t("apps.branch"), html! { input id="set-branch" name="branch" required value=(value("branch", app.branch.clone())) autofocus[failed]; }))
                (field("set-port", ctx.t("apps.port"), html! { input id="set-port" name="port" type="number" min="1" max="65535" required value=(value("port", app.port.to_string())); }))
                (field("set-strategy", ctx.t("apps.strategy"), html! {
                    select id="set-strategy" name="strategy" {
                        @for option in ["auto", "dockerfile", "static", "buildpacks"] {
                            option value=(option) selected[strategy == option] { (ctx.t(strategy_key(option))) }
                        }
                    }
                }))
                (field("set-install_cmd", ctx.t("apps.install_cmd"), html! { input id="set-install_cmd" name="install_cmd" value=(build_field("install_cmd")); }))
                (field("set-build_cmd", ctx.t("apps.build_cmd"), html! { input id="set-build_cmd" name="build_cmd" value=(build_field("build_cmd")); }))
                (field("set-output_dir", ctx.t("apps.output_dir"), html! { input id="set-output_dir" name="output_dir" value=(build_field("output_dir")); }))
                (field("set-spa", ctx.t("apps.spa"), html! {
                    select id="set-spa" name="spa" {
                        option value="auto" selected[spa.is_empty() || spa == "auto"] { (ctx.t("apps.spa.auto")) }
                        option value="yes" selected[spa == "yes"] { (ctx.t("common.yes")) }
                        option value="no" selected[spa == "no"] { (ctx.t("common.no")) }
                    }
                }))
                (field("set-health_path", ctx.t("apps.health_path"), html! { input id="set-health_path" name="health_path" required value=(value("health_path", app.health_path.clone())); }))
                (field("set-health_timeout", ctx.t("apps.health_timeout"), html! { input id="set-health_timeout" name="health_timeout_seconds" type="number" min="1" max="3600" required value=(value("health_timeout_seconds", app.health_timeout_s.to_string())); }))
                (field("set-build_timeout", ctx.t("apps.build_timeout"), html! { input id="set-build_timeout" name="build_timeout_seconds" type="number" min="1" max="7200" required value=(value("build_timeout_seconds", build_timeout.to_string())); }))
                (field("set-instances", ctx.t("apps.instances"), html! { input id="set-instances" name="instances" type="number" min="1" max="20" required value=(value("instances", app.instances.to_string())); }))
                (field("set-cpu", ctx.t("apps.cpu"), html! { input id="set-cpu" name="cpu" type="number" min="0.01" step="0.01" value=(value("cpu", app.cpu.map(|c| c.to_string()).unwrap_or_default())); }))
                (field("set-memory", ctx.t("apps.memory"), html! { input id="set-memory" name="memory" type="number" min="16" value=(value("memory", app.memory_bytes.map(|m| (m >> 20).to_string()).unwrap_or_default())); }))
                button type="submit" { (ctx.t("apps.save")) }
            }
        }
    }
}

fn strategy_key(strategy: &str) -> &'static str {
    match strategy {
        "dockerfile" => "apps.strategy.dockerfile",
        "static" => "apps.strategy.static",
        "buildpacks" => "apps.strategy.buildpacks",
        _ => "apps.strategy.auto",
    }
}

/// The API's `PATCH` request from the settings form: every field is sent,
/// an empty CPU, memory or build field as `null` (the default).
///
/// Still a JSON map, not `cloudweb_api_types::apps::AppPatch` (issue 19):
/// the form may post a `strategy` or `spa` outside the enums (an empty
/// `strategy` when the field is missing) and whole numbers beyond `u16` or
/// `u32`, which this hands on for the handler to refuse with its own
/// message (the JSON parse error, with its position); the type cannot
/// hold those values, so typing the body would change the message.
fn settings_request(form: &HashMap<String, String>) -> Result<Value, ApiError> {
    let whole = |key: &str| -> Result<Value, ApiError> {
        non_empty(form, key)
            .map(|v| v.parse::<u64>().map(|n| json!(n)).map_err(|_| ApiError::BadRequest(format!("invalid {key}: not a whole number"))))
            .transpose()
            .map(|v| v.unwrap_or(Value::Null))
    };
    let mut request = Map::new();
    for key in ["branch", "health_path", "strategy"] {
        request.insert(key.into(), json!(non_empty(form, key).unwrap_or("")));
    }
    for key in ["port", "instances", "health_timeout_seconds", "build_timeout_seconds"] {
        let value = whole(key)?;
        if value.is_null() {
            return Err(ApiError::BadRequest(format!("invalid {key}: required")));
        }
        request.insert(key.into(), value);
    }
    let cpu = non_empty(form, "cpu").map(|v| v.parse::<f64>().map_err(|_| ApiError::BadRequest("invalid cpu: not a number".into()))).transpose()?;
    request.insert("cpu".into(), json!(cpu));
    let memory = whole("memory")?;
    request.insert("memory".into(), memory.as_u64().map_or(Value::Null, |mib| json!(mib.saturating_mul(1 << 20))));
    let build = build_settings(form);
    request.insert("build".into(), if build.is_empty() { Value::Null } else { Value::Object(build) });
    Ok(Value::Object(request))
}

pub async fn set_settings(ctx: Ctx, Path(name): Path<String>, Form(form): Form<HashMap<String, String>>) -> Response {
    if let Some(refused) = ctx.refusal(&form) {
        return refused;
    }
    let result = match settings_request(&form) {
        Ok(request) => api::apps::update(State(ctx.state.clone()), Path(name.clone()), Ok(Bytes::from(request.to_string()))).await,
        Err(err) => Err(err),
    };
    answer(&ctx, &name, FormId::Settings, &form, result).await
}

/// After a form on the app page: back to the page with "Done", or, when
/// the API refused it, the page again with the reason next to the form.
async fn answer<T>(ctx: &Ctx, name: &str, form_id: FormId, form: &HashMap<String, String>, result: Result<T, ApiError>) -> Response {
    let err = match result {
        Ok(_) => return ctx.outcome(Ok::<(), ApiError>(()), &format!("/apps/{name}")).await,
        Err(err) => err,
    };
    match load(&ctx.state, name).await {
        Ok(Some((app, deployments))) => {
            let refused = Refused { form: form_id, error: super::error_text(&err), values: form };
            refused_page(&err, app_page(ctx, &app, &deployments, Some(&refused)))
        }
        Ok(None) => super::not_found(ctx),
        Err(err) => err.into_response(),
    }
}

async fn load(state: &Arc<AppState>, name: &str) -> Result<Option<(AppRow, Vec<DeploymentRow>)>, ApiError> {
    let Some(app) = state.store.app(name).await? else { return Ok(None) };
    let deployments = state.store.app_deployments(name).await?;
    Ok(Some((app, deployments)))
}

fn app_page(ctx: &Ctx, app: &AppRow, deployments: &[DeploymentRow], refused: Option<&Refused>) -> Markup {
    let env_names: Vec<String> = crate::deploy::app_env(&ctx.state, app).map(|env| env.into_keys().collect()).unwrap_or_default();
    let body = app_body(ctx, app, &env_names, deployments, refused);
    layout::page(ctx, &app.name, Nav::Apps, &format!("/apps/{}", app.name), body)
}

pub async fn show(ctx: Ctx, Path(name): Path<String>, Query(range): Query<RangeQuery>) -> Response {
    let (app, deployments) = match load(&ctx.state, &name).await {
        Ok(Some(loaded)) => loaded,
        Ok(None) => return super::not_found(&ctx),
        Err(err) => return err.into_response(),
    };
    let (range_name, seconds) = range.range();
    let charts = match usage_charts::app(&ctx, &app, seconds).await {
        Ok(charts) => charts,
        Err(err) => return err.into_response(),
    };
    let env_names: Vec<String> = crate::deploy::app_env(&ctx.state, &app).map(|env| env.into_keys().collect()).unwrap_or_default();
    let volumes = match ctx.state.store.app_volumes(&app.name).await {
        Ok(volumes) => volumes,
        Err(err) => return ApiError::from(err).into_response(),
    };
    let waiting = api::apps::view(&ctx.state, &app).waiting;
    let (instances, tasks) = (crate::instances::app_section(&ctx, &app.name).await, crate::tasks::app_section(&ctx, &app.name).await);
    let (sessions, autoscaling) = (crate::exec_sessions::app_section(&ctx, &app.name).await, crate::autoscaling::app_section(&ctx, &app.name).await);
    let logs = crate::app_logs::app_section(&ctx, &app.name).await;
    let previews = crate::previews::app_section(&ctx, &app.name).await;
    let source = app_sources::source_note(&ctx, &app.name).await;
    let body = html! {
        (source)
        (app_body(&ctx, &app, &env_names, &deployments, None))
        (logs)
        (crate::volumes::app_section(&ctx, &app.name, &volumes, waiting.as_deref()))
        (instances) (previews) (autoscaling) (tasks) (sessions)
        h2 id="charts" { (ctx.t("apps.charts")) }
        (usage_charts::range_nav(&ctx, &format!("/apps/{}", app.name), "#charts", range_name))
        p.help { (ctx.t("mon.gap_note")) }
        (charts)
    };
    layout::page(&ctx, &app.name, Nav::Apps, &format!("/apps/{}", app.name), body).into_response()
}

/// Sets or unsets one variable: the API replaces the whole environment, so
/// the others are read (sealed values, opened here only) and sent back.
pub async fn set_env(ctx: Ctx, Path(name): Path<String>, Form(form): Form<HashMap<String, String>>) -> Response {
    if let Some(refused) = ctx.refusal(&form) {
        return refused;
    }
    let result = async {
        let app = ctx.state.store.app(&name).await?.ok_or_else(|| ApiError::NotFound(format!("no app {name:?}")))?;
        let mut env: BTreeMap<String, String> = crate::deploy::app_env(&ctx.state, &app)?;
        if let Some(unset) = form.get("unset") {
            env.remove(unset);
        } else {
            let key = form.get("name").map(|n| n.trim()).unwrap_or("");
            env.insert(key.to_string(), form.get("value").cloned().unwrap_or_default());
        }
        let body = serde_json::to_vec(&EnvVars(env)).expect("strings serialize");
        api::apps::set_env(State(ctx.state.clone()), Path(name.clone()), Ok(Bytes::from(body))).await
    }
    .await;
    answer(&ctx, &name, FormId::Env, &form, result).await
}

pub async fn set_domains(ctx: Ctx, Path(name): Path<String>, Form(form): Form<HashMap<String, String>>) -> Response {
    if let Some(refused) = ctx.refusal(&form) {
        return refused;
    }
    let domains = DomainList(lines(form.get("domains").map(String::as_str).unwrap_or("")));
    let body = serde_json::to_vec(&domains).expect("strings serialize");
    let result = api::apps::set_domains(State(ctx.state.clone()), Path(name.clone()), Ok(Bytes::from(body))).await;
    answer(&ctx, &name, FormId::Domains, &form, result).await
}

/// The id of the deployment a deploy or rollback answer names.
async fn created_id(response: Response) -> Option<String> {
    let bytes = axum::body::to_bytes(response.into_body(), 64 * 1024).await.ok()?;
    let queued: DeploymentQueued = serde_json::from_slice(&bytes).ok()?;
    Some(queued.id)
}

/// The deploy request from the form: `{"commit": ...}`, or no body at all
/// (the branch's head) when the field is empty.
fn deploy_body(form: &HashMap<String, String>) -> Vec<u8> {
    match non_empty(form, "commit") {
        Some(commit) => serde_json::to_vec(&DeployRequest { commit: Some(commit.to_string()), keep_in_flight: false }).expect("strings serialize"),
        None => Vec::new(),
    }
}

fn rollback_body(form: &HashMap<String, String>) -> Vec<u8> {
    serde_json::to_vec(&RollbackRequest { deployment_id: form.get("deployment_id").cloned().unwrap_or_default() }).expect("strings serialize")
}

pub async fn deploy(ctx: Ctx, Path(name): Path<String>, Form(form): Form<HashMap<String, String>>) -> Response {
    if let Some(refused) = ctx.refusal(&form) {
        return refused;
    }
    let body = deploy_body(&form);
    match api::apps::deploy(State(ctx.state.clone()), Path(name.clone()), HeaderMap::new(), Ok(Bytes::from(body))).await {
        Ok(response) => match created_id(response).await {
            Some(id) => Redirect::to(&format!("/deployments/{id}")).into_response(),
            None => Redirect::to(&format!("/apps/{name}")).into_response(),
        },
        Err(err) => answer(&ctx, &name, FormId::Deploy, &form, Err::<(), _>(err)).await,
    }
}

pub async fn rollback(ctx: Ctx, Path(name): Path<String>, Form(form): Form<HashMap<String, String>>) -> Response {
    if let Some(refused) = ctx.refusal(&form) {
        return refused;
    }
    let body = rollback_body(&form);
    match api::apps::rollback(State(ctx.state.clone()), Path(name.clone()), HeaderMap::new(), Ok(Bytes::from(body))).await {
        Ok(response) => match created_id(response).await {
            Some(id) => Redirect::to(&format!("/deployments/{id}")).into_response(),
            None => Redirect::to(&format!("/apps/{name}")).into_response(),
        },
        Err(err) => ctx.outcome(Err::<(), _>(err), &format!("/apps/{name}")).await,
    }
}

pub async fn confirm_delete(ctx: Ctx, Path(name): Path<String>) -> Response {
    if !matches!(ctx.state.store.app(&name).await, Ok(Some(_))) {
        return super::not_found(&ctx);
    }
    let here = format!("/apps/{name}/delete");
    let title = format!("{}: {name}", ctx.t("apps.delete"));
    let volumes = ctx.state.store.app_volumes(&name).await.unwrap_or_default();
    let extra = crate::volumes::delete_choice(&ctx, &volumes);
    layout::confirm(&ctx, &title, Nav::Apps, &here, ctx.t("apps.confirm_delete"), extra, &format!("/apps/{name}")).into_response()
}

pub async fn delete(ctx: Ctx, Path(name): Path<String>, Form(form): Form<HashMap<String, String>>) -> Response {
    if let Some(refused) = ctx.refusal(&form) {
        return refused;
    }
    let volumes = match form.get("volumes").map(String::as_str) {
        Some("keep") => VolumesOnDelete::Keep,
        Some("delete") => VolumesOnDelete::Delete,
        _ => VolumesOnDelete::Refuse,
    };
    match api::apps::delete_app(&ctx.state, &name, volumes).await {
        Ok(_) => ctx.outcome(Ok::<(), ApiError>(()), "/apps").await,
        Err(err) => ctx.outcome(Err::<(), _>(err), &format!("/apps/{name}")).await,
    }
}


#[cfg(test)]
mod tests {
    use super::*;

    fn form(fields: &[(&str, &str)]) -> HashMap<String, String> {
        fields.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    /// The typed bodies send the bytes the `json!` ones did: no
    /// `keep_in_flight`, and no body without a commit.
    #[test]
    fn deploy_and_rollback_bodies_are_unchanged() {
        assert_eq!(deploy_body(&form(&[("commit", " abc123 ")])), br#"{"commit":"abc123"}"#);
        assert!(deploy_body(&form(&[("commit", "  ")])).is_empty() && deploy_body(&form(&[])).is_empty());
        assert_eq!(rollback_body(&form(&[("deployment_id", "d-1")])), br#"{"deployment_id":"d-1"}"#);
        assert_eq!(rollback_body(&form(&[])), br#"{"deployment_id":""}"#);
        let env = EnvVars(BTreeMap::from([("B".to_string(), "2".to_string()), ("A".to_string(), String::new())]));
        assert_eq!(serde_json::to_vec(&env).unwrap(), br#"{"A":"","B":"2"}"#);
        assert_eq!(serde_json::to_vec(&DomainList(lines("b.example, a.example"))).unwrap(), br#"["b.example","a.example"]"#);
    }
}
