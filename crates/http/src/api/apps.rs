//! `/api/apps`: create, list, inspect and delete apps, set their
//! environment, deploy them and roll them back.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::header::CONTENT_TYPE;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use sha2::Digest;
use cloudweb_protocol::deploy::{self, BuildSettings, Strategy};
use cloudweb_protocol::validate;
use cloudweb_api_types::apps::{
    AppList, AppPatch, AppView, BuildInput, CertificateList, CertificateStatus, CreateApp, DeployRequest, DeploymentQueued, DomainList,
    DomainsView, EnvPatch, EnvVars, EnvView, RollbackRequest,
};
use cloudweb_api_types::volumes::{DeleteAppQuery, VolumesOnDelete};
use cloudweb_api_types::ErrorBody;
use serde_json::Value;

use crate::clock::rfc3339_ms;
use crate::deploy::{app_env, env_context, git_context, Origin};
use crate::error::{body_bytes, parse_json, ApiError};
use crate::store::{AppRefusal, AppRow, IdempotencyClaim};
use crate::AppState;

/// Most instances and domains per app.
pub use cloudweb_core::deploy::scale::MAX_INSTANCES;
pub const MAX_DOMAINS: usize = 20;

/// A readiness probe as stored: checked, as JSON.
fn readiness_column(readiness: Option<&cloudweb_api_types::apps::Readiness>) -> Result<Option<String>, ApiError> {
    let Some(readiness) = readiness else { return Ok(None) };
    readiness.validate().map_err(|e| ApiError::BadRequest(e.to_string()))?;
    Ok(Some(serde_json::to_string(readiness).expect("settings serialize")))
}

/// A liveness probe as stored: checked, as JSON.
fn liveness_column(liveness: Option<&cloudweb_api_types::apps::Liveness>) -> Result<Option<String>, ApiError> {
    let Some(liveness) = liveness else { return Ok(None) };
    liveness.validate().map_err(|e| ApiError::BadRequest(e.to_string()))?;
    Ok(Some(serde_json::to_string(liveness).expect("settings serialize")))
}

/// Checks build settings as a user sent them.
fn build_settings(input: BuildInput) -> Result<BuildSettings, ApiError> {
    let settings = BuildSettings::from(input);
    settings.validate()?;
    Ok(settings)
}

/// How a strategy is stored (`auto`, `dockerfile`, `static`, `buildpacks`).
fn strategy_name(strategy: Strategy) -> String {
    serde_json::to_value(strategy).ok().and_then(|v| v.as_str().map(str::to_string)).unwrap_or_else(|| "auto".into())
}

/// The settings that creation and `PATCH` check alike (each only when
/// given).
struct Settings<'a> {
    branch: Option<&'a str>,
    port: Option<u16>,
    instances: Option<u32>,
    cpu: Option<f64>,
    memory: Option<u64>,
    health_path: Option<&'a str>,
    health_timeout_seconds: Option<u32>,
    build_timeout_seconds: Option<u32>,
}

fn validate_settings(settings: &Settings<'_>) -> Result<(), ApiError> {
    if let Some(branch) = settings.branch {
        deploy::branch(branch)?;
    }
    if settings.port == Some(0) {
        return Err(ApiError::BadRequest("invalid port: must be 1 to 65535".into()));
    }
    if let Some(instances) = settings.instances {
        if instances == 0 || instances > MAX_INSTANCES {
            return Err(ApiError::BadRequest(format!("invalid instances: must be 1 to {MAX_INSTANCES}")));
        }
    }
    if let Some(cpu) = settings.cpu {
        if !(0.01..=64.0).contains(&cpu) {
            return Err(ApiError::BadRequest("invalid cpu: must be 0.01 to 64 cores".into()));
        }
    }
    if let Some(memory) = settings.memory {
        if !(16 << 20..=1 << 40).contains(&memory) {
            return Err(ApiError::BadRequest("invalid memory: must be 16 MiB to 1 TiB, in bytes".into()));
        }
    }
    if let Some(path) = settings.health_path {
        if !path.starts_with('/') {
            return Err(ApiError::BadRequest("invalid health_path: must start with '/'".into()));
        }
        validate::bounded_text("health_path", path, 256)?;
    }
    if let Some(timeout) = settings.health_timeout_seconds {
        if timeout == 0 || timeout > 3600 {
            return Err(ApiError::BadRequest("invalid health_timeout_seconds: must be 1 to 3600".into()));
        }
    }
    if let Some(seconds) = settings.build_timeout_seconds {
        deploy::build_timeout(seconds)?;
    }
    Ok(())
}

/// Build settings only go with a static site (or `auto`, which they turn
/// into `static`).
fn check_build_strategy(build: bool, strategy: Option<Strategy>) -> Result<(), ApiError> {
    if build && matches!(strategy, Some(Strategy::Dockerfile | Strategy::Buildpacks)) {
        return Err(ApiError::BadRequest("build settings only apply to static sites; drop them or use strategy static".into()));
    }
    Ok(())
}

fn validate_create(request: &CreateApp, allow_file_repos: bool, allow_private_git_hosts: bool) -> Result<(), ApiError> {
    validate::node_name("name", &request.name)?;
    deploy::repo_url(&request.repo_url, allow_file_repos)?;
    deploy::repo_destination(&request.repo_url, allow_private_git_hosts)?;
    validate_settings(&Settings {
        branch: Some(request.branch.as_deref().unwrap_or_default()),
        port: Some(request.port),
        instances: request.instances,
        cpu: request.cpu,
        memory: request.memory,
        health_path: request.health_path.as_deref(),
        health_timeout_seconds: request.health_timeout_seconds,
        build_timeout_seconds: request.build_timeout_seconds,
    })?;
    validate_domains(&request.domains)?;
    match (&request.git_username, &request.git_password) {
        (Some(user), Some(password)) => {
            validate::bounded_text("git_username", user, 256)?;
            validate::bounded_text("git_password", password, 4096)?;
        }
        (None, None) => {}
        _ => return Err(ApiError::BadRequest("git_username and git_password go together".into())),
    }
    match (&request.git_ssh_key, &request.git_known_hosts) {
        (Some(key), Some(hosts)) => {
            deploy::ssh_private_key(key)?;
            deploy::known_hosts(hosts)?;
        }
        (None, None) => {}
        _ => return Err(ApiError::BadRequest("git_ssh_key and git_known_hosts go together".into())),
    }
    let over_ssh = deploy::repo_host(&request.repo_url)?.is_some_and(|target| target.scheme == deploy::RepoScheme::Ssh);
    if over_ssh && request.git_ssh_key.is_none() {
        // ssh would otherwise offer whatever keys the node's user has.
        return Err(ApiError::BadRequest("an ssh repository needs git_ssh_key and git_known_hosts".into()));
    }
    check_build_strategy(request.build.is_some(), request.strategy)
}

pub fn view(state: &AppState, app: &AppRow) -> AppView {
    let env_names: Vec<String> = app_env(state, app).map(|env| env.into_keys().collect()).unwrap_or_default();
    let git = crate::deploy::app_git(state, app).unwrap_or_default();
    AppView {
        name: app.name.clone(),
        repo_url: app.repo_url.clone(),
        branch: app.branch.clone(),
        port: app.port,
        domains: serde_json::from_str(&app.domains).unwrap_or_default(),
        build: app.build.as_deref().and_then(|b| serde_json::from_str(b).ok()),
        strategy: app.strategy.clone(),
        instances: app.instances,
        cpu: app.cpu,
        memory: app.memory_bytes,
        health_path: app.health_path.clone(),
        health_timeout_seconds: app.health_timeout_s,
        build_timeout_seconds: app.build_timeout_s.unwrap_or(i64::from(deploy::DEFAULT_BUILD_TIMEOUT_SECONDS)),
        rollout: app.rollout.clone(),
        liveness: app.liveness.as_deref().and_then(|l| serde_json::from_str(l).ok()),
        readiness: app.readiness.as_deref().and_then(|r| serde_json::from_str(r).ok()),
        // Names only: values never leave the control plane through the API.
        env: env_names,
        git_credentials: git.username.is_some(),
        git_ssh_key: git.ssh_key.is_some(),
        created_at: rfc3339_ms(app.created_at),
        git: None,
        waiting: waiting_reason(state, &app.name),
        crash_looping: 0,
    }
}

/// Why the app could not be moved off a node, if it waits (see
/// `deploy::moves`).
fn waiting_reason(state: &AppState, app: &str) -> Option<String> {
    let waiting = state.waiting.lock().expect("waiting lock");
    waiting.values().flatten().find(|(name, _)| name == app).map(|(_, reason)| reason.clone())
}

#[utoipa::path(post, path = "/api/apps", operation_id = "apps_create", tag = "apps", request_body = CreateApp,
    responses(
        (status = 201, description = "Created; `git.webhook` (a generic webhook's URL and secret) is shown only now", body = AppView),
        (status = 400, description = "Invalid app", body = ErrorBody),
        (status = 403, description = "The named GitLab account is not linked to the caller", body = ErrorBody),
        (status = 404, description = "No such GitLab project or account", body = ErrorBody),
        (status = 409, description = "The name or a host is taken", body = ErrorBody),
        (status = 413, description = "Body over 1 MiB", body = ErrorBody),
        (status = 502, description = "GitLab failed", body = ErrorBody),
    ))]
pub async fn create_as_caller(
    State(state): State<Arc<AppState>>,
    Extension(principal): Extension<crate::auth::Principal>,
    Extension(team): Extension<crate::auth::authorize::RequestTeam>,
    body: Result<Bytes, BytesRejection>,
) -> Result<(StatusCode, Json<AppView>), ApiError> {
    create_for(state, &principal, &team.id(), body).await
}

/// Creates an app for `principal`: an app from a GitLab project uses the
/// caller's own linked GitLab identity by default.
pub async fn create_for(state: Arc<AppState>, principal: &crate::auth::Principal, team_id: &str, body: Result<Bytes, BytesRejection>) -> Result<(StatusCode, Json<AppView>), ApiError> {
    let mut request: CreateApp = parse_json(&body_bytes(body)?)?;
    // Made from a provider's repository: its clone URL and default branch.
    let plan = crate::git::api::plan_for(&state, principal, &mut request).await?;
    if request.repo_url.is_empty() {
        return Err(ApiError::BadRequest("repo_url is required (or gitlab_project, github_repository or gitea_repository)".into()));
    }
    let branch = request.branch.get_or_insert_with(|| "main".to_string()).clone();
    validate_create(&request, state.config.allow_file_repos, state.config.allows_private_git(&request.repo_url))?;
    let build = request.build.map(build_settings).transpose()?;
    let strategy = match (request.strategy, &build) {
        (Some(strategy), _) => strategy,
        (None, Some(_)) => Strategy::Static,
        (None, None) => Strategy::Auto,
    };
    let git = crate::deploy::GitAccess {
        username: request.git_username,
        password: request.git_password,
        ssh_key: request.git_ssh_key,
        known_hosts: request.git_known_hosts,
    };
    let git_credentials_sealed = (!git.is_empty()).then(|| state.sealer.seal_json(&git_context(&request.name), &git));
    let app = AppRow {
        name: request.name.clone(),
        repo_url: request.repo_url,
        branch: branch.clone(),
        port: i64::from(request.port),
        domains: serde_json::to_string(&request.domains.iter().map(|d| d.to_ascii_lowercase()).collect::<Vec<_>>()).expect("strings serialize"),
        build: build.as_ref().map(|b| serde_json::to_string(b).expect("settings serialize")),
        strategy: strategy_name(strategy),
        instances: i64::from(request.instances.unwrap_or(1)),
        cpu: request.cpu,
        memory_bytes: request.memory.map(|m| m as i64),
        health_path: request.health_path.unwrap_or_else(|| "/".to_string()),
        health_timeout_s: i64::from(request.health_timeout_seconds.unwrap_or(60)),
        build_timeout_s: request.build_timeout_seconds.map(i64::from),
        env_sealed: None,
        git_credentials_sealed,
        created_at: state.clock.now_ms(),
        rollout: request.rollout.unwrap_or_default().as_str().to_string(),
        liveness: liveness_column(request.liveness.as_ref())?,
        readiness: readiness_column(request.readiness.as_ref())?,
        team_id: team_id.to_string(),
    };
    let default_host = format!("{}.{}", app.name, state.config.base_domain);
    state.access_cache.forget_app(&app.name);
    match state.store.insert_app(&app, &default_host).await? {
        Ok(()) => {}
        Err(AppRefusal::NameTaken) => return Err(ApiError::Conflict(format!("an app named {} already exists", app.name))),
        Err(refusal) => return Err(refusal_error(&app.name, refusal)),
    }
    let mut answer = view(&state, &app);
    if let Some(plan) = plan {
        match crate::git::api::link_app(&state, &app.name, &branch, plan).await {
            Ok(git) => answer.git = Some(git),
            Err(err) => {
                // No half-made app: without its webhook it would never deploy on push.
                state.store.delete_app(&app.name).await?;
                return Err(err);
            }
        }
    }
    tracing::info!(app = %app.name, "app created");
    crate::routes::app_changed(&state, &app.name).await?;
    Ok((StatusCode::CREATED, Json(answer)))
}

#[utoipa::path(get, path = "/api/apps", operation_id = "apps_list", tag = "apps", responses((status = 200, description = "Every app", body = AppList)))]
pub async fn list(State(state): State<Arc<AppState>>, Extension(access): Extension<crate::access::Access>) -> Result<Json<AppList>, ApiError> {
    let looping = state.store.crash_looping_counts().await?;
    let apps = state
        .store
        .apps()
        .await?
        .iter()
        .filter(|app| access.sees(&app.team_id, Some(&app.name)))
        .map(|app| {
            let mut view = view(&state, app);
            view.crash_looping = looping.get(&app.name).copied().unwrap_or(0);
            view
        })
        .collect();
    Ok(Json(AppList { apps }))
}

async fn load(state: &AppState, name: &str) -> Result<AppRow, ApiError> {
    state.store.app(name).await?.ok_or_else(|| ApiError::NotFound(format!("no app {name:?}")))
}

#[utoipa::path(get, path = "/api/apps/{name}", operation_id = "apps_show", tag = "apps", params(("name" = String, Path, description = "The app's name")),
    responses((status = 200, description = "The app", body = AppView), (status = 404, description = "No such app", body = ErrorBody)))]
pub async fn show(State(state): State<Arc<AppState>>, Path(name): Path<String>) -> Result<Json<AppView>, ApiError> {
    let mut answer = view(&state, &load(&state, &name).await?);
    answer.crash_looping = state
        .store
        .crash_looping_counts()
        .await?
        .get(&name)
        .copied()
        .unwrap_or(0);
    if let Some(link) = state.store.app_git_link(&name).await? {
        answer.git = Some(crate::git::link_view(&link));
    }
    Ok(Json(answer))
}

/// The certificate of each host the app is served under: state, dates,
/// issuer, orders placed and the last failure's reason.
#[utoipa::path(get, path = "/api/apps/{name}/certificates", operation_id = "apps_certificates", tag = "apps", params(("name" = String, Path, description = "The app's name")),
    responses((status = 200, description = "The certificate of each host the app is served under", body = CertificateList), (status = 404, description = "No such app", body = ErrorBody)))]
pub async fn certificates(State(state): State<Arc<AppState>>, Path(name): Path<String>) -> Result<Json<CertificateList>, ApiError> {
    let app = load(&state, &name).await?;
    let hosts = crate::routes::app_hosts(&app.name, &state.config.base_domain, &app.domains);
    let certificates = crate::acme::host_status(&state, &hosts)
        .into_iter()
        .map(|status| CertificateStatus {
            host: status.host,
            state: status.state.to_string(),
            not_before: status.not_before,
            not_after: status.not_after,
            issuer: status.issuer,
            orders: status.orders,
            last_error: status.last_error,
            last_error_at: status.last_error_at,
            next_attempt_at: status.next_attempt_at,
        })
        .collect();
    Ok(Json(CertificateList { certificates }))
}

/// Checks a settings change as creation checks the same fields, and
/// applies it to `app`.
fn apply_patch(patch: AppPatch, app: &mut AppRow) -> Result<(), ApiError> {
    validate_settings(&Settings {
        branch: patch.branch.as_deref(),
        port: patch.port,
        instances: patch.instances,
        cpu: patch.cpu.flatten(),
        memory: patch.memory.flatten(),
        health_path: patch.health_path.as_deref(),
        health_timeout_seconds: patch.health_timeout_seconds,
        build_timeout_seconds: patch.build_timeout_seconds.flatten(),
    })?;
    if let Some(rollout) = patch.rollout {
        app.rollout = rollout.as_str().to_string();
    }
    if let Some(liveness) = &patch.liveness {
        app.liveness = liveness_column(liveness.as_ref())?;
    }
    if let Some(readiness) = &patch.readiness {
        app.readiness = readiness_column(readiness.as_ref())?;
    }
    if let Some(build) = patch.build {
        app.build = build.map(build_settings).transpose()?.map(|b| serde_json::to_string(&b).expect("settings serialize"));
    }
    let strategy = match patch.strategy.or_else(|| serde_json::from_value(Value::String(app.strategy.clone())).ok()) {
        // Build settings make an `auto` app a static site, as at
        // creation.
        Some(Strategy::Auto) | None if app.build.is_some() => Some(Strategy::Static),
        strategy => strategy,
    };
    check_build_strategy(app.build.is_some(), strategy)?;
    if let Some(strategy) = strategy {
        app.strategy = strategy_name(strategy);
    }
    if let Some(branch) = patch.branch {
        app.branch = branch;
    }
    if let Some(port) = patch.port {
        app.port = i64::from(port);
    }
    if let Some(instances) = patch.instances {
        app.instances = i64::from(instances);
    }
    if let Some(cpu) = patch.cpu {
        app.cpu = cpu;
    }
    if let Some(memory) = patch.memory {
        app.memory_bytes = memory.map(|m| m as i64);
    }
    if let Some(path) = patch.health_path {
        app.health_path = path;
    }
    if let Some(timeout) = patch.health_timeout_seconds {
        app.health_timeout_s = i64::from(timeout);
    }
    if let Some(timeout) = patch.build_timeout_seconds {
        app.build_timeout_s = timeout.map(i64::from);
    }
    Ok(())
}

/// One settings change at a time, so two `PATCH`es (read, change, write)
/// never lose one of them.
static SETTINGS_WRITES: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Changes an app's branch and build and run settings. Running instances
/// keep what they were started with: the change applies from the next
/// deployment on (a deploy, a rollback, an instance placed again).
#[utoipa::path(patch, path = "/api/apps/{name}", operation_id = "apps_update", tag = "apps", params(("name" = String, Path, description = "The app's name")), request_body = AppPatch,
    responses(
        (status = 200, description = "The app", body = AppView),
        (status = 400, description = "Invalid settings", body = ErrorBody),
        (status = 404, description = "No such app", body = ErrorBody),
        (status = 413, description = "Body over 1 MiB", body = ErrorBody),
    ))]
pub async fn update(
    State(state): State<Arc<AppState>>,
    Path(name): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<AppView>, ApiError> {
    let patch: AppPatch = parse_json(&body_bytes(body)?)?;
    Ok(Json(update_settings(&state, &name, patch).await?))
}

/// Applies a settings change (the API's and the dashboard form's).
async fn update_settings(state: &AppState, name: &str, patch: AppPatch) -> Result<AppView, ApiError> {
    let _one_writer = SETTINGS_WRITES.lock().await;
    let mut app = load(state, name).await?;
    let link = state.store.app_git_link(name).await?;
    if patch.branch.as_ref().is_some_and(|branch| *branch != app.branch) && link.as_ref().is_some_and(|l| matches!(l.provider.as_str(), "gitlab" | "gitea")) {
        // GitLab and Gitea filter the pushes they send by the branch the
        // webhook was registered with.
        return Err(ApiError::BadRequest(
            "the branch of an app made from a GitLab project or a Gitea repository is fixed by its webhook; make a new app for another branch".into(),
        ));
    }
    apply_patch(patch, &mut app)?;
    if !state.store.update_app_settings(&app).await? {
        return Err(ApiError::NotFound(format!("no app {name:?}")));
    }
    tracing::info!(app = %name, "app settings changed");
    let mut answer = view(state, &app);
    if let Some(link) = &link {
        answer.git = Some(crate::git::link_view(link));
    }
    Ok(answer)
}

/// Deletes an app after queueing a stop for every instance it still runs.
/// An app with volumes needs `volumes=keep` (they stay, detached, with
/// their data) or `volumes=delete`.
#[utoipa::path(delete, path = "/api/apps/{name}", operation_id = "apps_delete", tag = "apps",
    params(("name" = String, Path, description = "The app's name"),
        ("volumes" = Option<String>, Query, description = "`keep` or `delete`: what becomes of the app's volumes; required when it has any")),
    responses(
        (status = 204, description = "Deleted"),
        (status = 400, description = "Invalid query", body = ErrorBody),
        (status = 404, description = "No such app", body = ErrorBody),
        (status = 409, description = "The app has volumes and the query does not say what becomes of them", body = ErrorBody),
    ))]
pub async fn remove(
    State(state): State<Arc<AppState>>,
    Path(name): Path<String>,
    query: Result<Query<DeleteAppQuery>, QueryRejection>,
) -> Result<StatusCode, ApiError> {
    let choice = super::volumes::delete_query(query)?;
    delete_app(&state, &name, choice).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// What `DELETE /api/apps/{name}` does (the dashboard's delete button too).
pub async fn delete_app(state: &AppState, name: &str, volumes: VolumesOnDelete) -> Result<(), ApiError> {
    load(state, name).await?;
    let doomed = super::volumes::before_app_delete(state, name, volumes).await?;
    crate::git::api::app_removed(state, name).await;
    cloudweb_core::previews::remove_all(state, name).await?;
    cloudweb_core::tasks::app_deleting(state, name).await?;
    crate::deploy::stop_app(state, name).await?;
    state.store.delete_app(name).await?;
    state.runtime_logs.forget(name);
    crate::routes::app_changed(state, name).await?;
    tracing::info!(app = %name, "app deleted");
    super::volumes::after_app_delete(state, &doomed).await?;
    Ok(())
}

/// Replaces the app's environment. Values are sealed before they are
/// stored and are never returned.
#[utoipa::path(put, path = "/api/apps/{name}/env", operation_id = "apps_env_replace", tag = "apps", params(("name" = String, Path, description = "The app's name")),
    request_body(content = EnvVars, description = "A JSON object of string values: the whole environment"),
    responses(
        (status = 200, description = "The names of the variables now set", body = EnvView),
        (status = 400, description = "Invalid environment", body = ErrorBody),
        (status = 404, description = "No such app", body = ErrorBody),
        (status = 413, description = "Body over 1 MiB", body = ErrorBody),
    ))]
pub async fn set_env(
    State(state): State<Arc<AppState>>,
    Path(name): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<EnvView>, ApiError> {
    let EnvVars(vars) = parse_json(&body_bytes(body)?)
        .map_err(|_| ApiError::BadRequest("the body must be a JSON object of string values".into()))?;
    deploy::env(&vars)?;
    let _one_writer = ENV_WRITES.lock().await;
    load(&state, &name).await?;
    let sealed = state.sealer.seal_json(&env_context(&name), &vars);
    state.store.set_app_env(&name, &sealed).await?;
    Ok(Json(EnvView { app: name, env: vars.into_keys().collect() }))
}

/// One environment change at a time, so two `PATCH`es (read, change,
/// write) never lose one of them.
static ENV_WRITES: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// `PATCH /api/apps/{name}/env`: sets some variables and removes others,
/// keeping the rest (whose values a client cannot read back). A name both
/// set and unset is a 400.
#[utoipa::path(patch, path = "/api/apps/{name}/env", operation_id = "apps_env_update", tag = "apps", params(("name" = String, Path, description = "The app's name")), request_body = EnvPatch,
    responses(
        (status = 200, description = "The names of the variables now set", body = EnvView),
        (status = 400, description = "Invalid change", body = ErrorBody),
        (status = 404, description = "No such app", body = ErrorBody),
        (status = 413, description = "Body over 1 MiB", body = ErrorBody),
    ))]
pub async fn patch_env(
    State(state): State<Arc<AppState>>,
    Path(name): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<EnvView>, ApiError> {
    let patch: EnvPatch = parse_json(&body_bytes(body)?)?;
    for unset in &patch.unset {
        validate::bounded_text("unset", unset, 256)?;
        if patch.set.contains_key(unset) {
            return Err(ApiError::BadRequest("invalid unset: a variable cannot be both set and unset".into()));
        }
    }
    deploy::env(&patch.set)?;
    let _one_writer = ENV_WRITES.lock().await;
    let app = load(&state, &name).await?;
    let mut vars = app_env(&state, &app)?;
    for unset in &patch.unset {
        vars.remove(unset);
    }
    vars.extend(patch.set);
    deploy::env(&vars)?;
    let sealed = state.sealer.seal_json(&env_context(&name), &vars);
    state.store.set_app_env(&name, &sealed).await?;
    Ok(Json(EnvView { app: name, env: vars.into_keys().collect() }))
}

/// Checks a list of custom domains.
fn validate_domains(domains: &[String]) -> Result<(), ApiError> {
    if domains.len() > MAX_DOMAINS {
        return Err(ApiError::BadRequest(format!("invalid domains: at most {MAX_DOMAINS}")));
    }
    for domain in domains {
        validate::route_host("domains", domain)?;
        if !domain.contains('.') {
            return Err(ApiError::BadRequest("invalid domains: a domain needs at least one dot".into()));
        }
    }
    Ok(())
}

/// The answer to a refused create or domain change. A host serves one app
/// only: taking over another app's host would silently move its traffic.
fn refusal_error(app: &str, refusal: AppRefusal) -> ApiError {
    match refusal {
        AppRefusal::NameTaken => ApiError::Conflict(format!("an app named {app} already exists")),
        AppRefusal::NotFound => ApiError::NotFound(format!("no app {app:?}")),
        AppRefusal::HostTaken { host, owner } => {
            ApiError::Conflict(format!("host {host} already belongs to app {owner}; remove it there first"))
        }
    }
}

/// Replaces the app's custom domains; the ingress picks them up at once.
#[utoipa::path(put, path = "/api/apps/{name}/domains", operation_id = "apps_domains_replace", tag = "apps", params(("name" = String, Path, description = "The app's name")),
    request_body(content = DomainList, description = "Host names: every custom domain, replacing the old"),
    responses(
        (status = 200, description = "The app's custom domains now", body = DomainsView),
        (status = 400, description = "Invalid domains", body = ErrorBody),
        (status = 404, description = "No such app", body = ErrorBody),
        (status = 409, description = "A host belongs to another app", body = ErrorBody),
        (status = 413, description = "Body over 1 MiB", body = ErrorBody),
    ))]
pub async fn set_domains(
    State(state): State<Arc<AppState>>,
    Path(name): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<DomainsView>, ApiError> {
    let DomainList(domains) = parse_json(&body_bytes(body)?)
        .map_err(|_| ApiError::BadRequest("the body must be a JSON array of host names".into()))?;
    validate_domains(&domains)?;
    let domains: Vec<String> = domains.into_iter().map(|d| d.to_ascii_lowercase()).collect();
    if let Err(refusal) = state.store.set_app_domains(&name, &domains).await? {
        return Err(refusal_error(&name, refusal));
    }
    crate::routes::app_changed(&state, &name).await?;
    Ok(Json(DomainsView { app: name, domains }))
}

#[utoipa::path(post, path = "/api/apps/{name}/deploy", operation_id = "apps_deploy", tag = "apps",
    params(("name" = String, Path, description = "The app's name"), ("Idempotency-Key" = Option<String>, Header, description = "Deploy at most once per key")),
    request_body(content = Option<DeployRequest>, description = "Optional: an empty body deploys the branch's head"),
    responses(
        (status = 201, description = "A deployment is queued", body = DeploymentQueued),
        (status = 400, description = "Invalid request", body = ErrorBody),
        (status = 404, description = "No such app", body = ErrorBody),
        (status = 409, description = "The same Idempotency-Key is still running", body = ErrorBody),
        (status = 413, description = "Body over 1 MiB", body = ErrorBody),
        (status = 422, description = "The Idempotency-Key was used with another request", body = ErrorBody),
    ))]
pub async fn deploy(
    State(state): State<Arc<AppState>>,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let bytes = body_bytes(body)?;
    let route = format!("POST /api/apps/{name}/deploy");
    idempotent(&state, &headers, &route, &bytes, async {
        let request: DeployRequest = if bytes.is_empty() { DeployRequest::default() } else { parse_json(&bytes)? };
        if let Some(commit) = &request.commit {
            deploy::commit(commit)?;
        }
        let app = load(&state, &name).await?;
        let in_flight = if request.keep_in_flight { crate::deploy::InFlight::Keep } else { crate::deploy::InFlight::Supersede };
        let deployment = crate::deploy::create_with(&state, &app, Origin::Source { commit: request.commit }, in_flight).await?;
        Ok((StatusCode::CREATED, DeploymentQueued { id: deployment.id, state: deployment.state, error: deployment.error }))
    })
    .await
}

/// The request header that makes a deploy or rollback safe to retry.
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";

/// Runs `work` at most once per `Idempotency-Key`: the same key with the
/// same route and body answers what the first request answered (without
/// creating a second deployment), the same key with another request is a
/// 422, and a key whose first request is still running is a 409. Only
/// successful answers are kept (24 hours); after an error the key is free
/// again, so a retry runs. Without the header, `work` just runs.
async fn idempotent(
    state: &AppState,
    headers: &HeaderMap,
    route: &str,
    body: &[u8],
    work: impl std::future::Future<Output = Result<(StatusCode, DeploymentQueued), ApiError>>,
) -> Result<Response, ApiError> {
    let Some(key) = headers.get(IDEMPOTENCY_KEY) else {
        let (status, value) = work.await?;
        return Ok((status, Json(value)).into_response());
    };
    let key = key
        .to_str()
        .ok()
        .filter(|k| !k.is_empty() && k.len() <= 255 && k.bytes().all(|b| b.is_ascii_graphic()))
        .ok_or_else(|| ApiError::BadRequest("invalid Idempotency-Key: 1 to 255 visible ASCII characters".into()))?
        .to_string();
    let mut digest = sha2::Sha256::new();
    digest.update(route.as_bytes());
    digest.update(b"\n");
    digest.update(body);
    let request_sha256 = hex::encode(digest.finalize());
    match state.store.claim_idempotency_key(&key, &request_sha256, state.clock.now_ms()).await? {
        IdempotencyClaim::New => {}
        IdempotencyClaim::Replay { status, response } => {
            let status = StatusCode::from_u16(status).unwrap_or(StatusCode::OK);
            let mut answer = (status, [(CONTENT_TYPE, "application/json")], response).into_response();
            answer.headers_mut().insert("idempotent-replayed", axum::http::HeaderValue::from_static("true"));
            return Ok(answer);
        }
        IdempotencyClaim::Mismatch => {
            return Err(ApiError::Unprocessable("this Idempotency-Key was used with a different request; use a new key".into()))
        }
        IdempotencyClaim::InProgress => {
            return Err(ApiError::Conflict("a request with this Idempotency-Key is still running; retry shortly".into()))
        }
    }
    match work.await {
        Ok((status, value)) => {
            let stored = serde_json::to_string(&value).map_err(|e| ApiError::Internal(format!("cannot serialize the answer: {e}")))?;
            state.store.finish_idempotency_key(&key, status.as_u16(), &stored).await?;
            Ok((status, Json(value)).into_response())
        }
        Err(err) => {
            if let Err(release) = state.store.release_idempotency_key(&key).await {
                tracing::error!(error = %release, "could not release an idempotency key");
            }
            Err(err)
        }
    }
}

/// Runs an earlier deployment's image again: no build.
#[utoipa::path(post, path = "/api/apps/{name}/rollback", operation_id = "apps_rollback", tag = "apps",
    params(("name" = String, Path, description = "The app's name"), ("Idempotency-Key" = Option<String>, Header, description = "Roll back at most once per key")),
    request_body = RollbackRequest,
    responses(
        (status = 201, description = "A deployment of the earlier image is queued", body = DeploymentQueued),
        (status = 400, description = "Invalid request", body = ErrorBody),
        (status = 404, description = "No such app or deployment", body = ErrorBody),
        (status = 409, description = "That deployment cannot be rolled back to, or the same Idempotency-Key is still running", body = ErrorBody),
        (status = 413, description = "Body over 1 MiB", body = ErrorBody),
        (status = 422, description = "The Idempotency-Key was used with another request", body = ErrorBody),
    ))]
pub async fn rollback(
    State(state): State<Arc<AppState>>,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let bytes = body_bytes(body)?;
    let route = format!("POST /api/apps/{name}/rollback");
    idempotent(&state, &headers, &route, &bytes, async {
        let request: RollbackRequest = parse_json(&bytes)?;
        validate::token("deployment_id", &request.deployment_id, 64)?;
        let app = load(&state, &name).await?;
        let target = state
            .store
            .deployment(&request.deployment_id)
            .await?
            .filter(|d| d.app == app.name)
            .ok_or_else(|| ApiError::NotFound(format!("app {name} has no deployment {:?}", request.deployment_id)))?;
        let image = match (&target.image, target.state.as_str()) {
            (Some(image), "running" | "superseded") => image.clone(),
            _ => {
                return Err(ApiError::Conflict(format!(
                    "deployment {} never ran (state {}); only a deployment that ran can be rolled back to",
                    target.id, target.state
                )))
            }
        };
        let deployment = crate::deploy::create(&state, &app, Origin::Rollback { of: target.id.clone(), image }).await?;
        Ok((StatusCode::CREATED, DeploymentQueued { id: deployment.id, state: deployment.state, error: deployment.error }))
    })
    .await
}
