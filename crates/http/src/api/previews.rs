//! `/api/apps/{name}/previews...`: an app's preview environments (see
//! `cloudweb_core::previews`), their settings, the approval a fork's
//! request waits for, and the variables previews never get.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::{Extension, Json};
use cloudweb_api_types::apps::{EnvVars, EnvView};
use cloudweb_api_types::previews::{PreviewList, PreviewSettingsInput, PreviewSettingsView, PreviewView, ProductionOnly};
use cloudweb_api_types::ErrorBody;
use cloudweb_core::previews::{self, Outcome};
use cloudweb_protocol::validate;

use crate::auth::Principal;
use crate::clock::rfc3339_ms;
use crate::error::{body_bytes, parse_json, ApiError};
use crate::store::{AppRow, PreviewRow, PreviewSettingsRow};
use crate::AppState;

/// Most production-only names per app.
const MAX_NAMES: usize = 200;

async fn load(state: &AppState, name: &str) -> Result<AppRow, ApiError> {
    state.store.app(name).await?.ok_or_else(|| ApiError::NotFound(format!("no app {name:?}")))
}

fn settings_view(row: &PreviewSettingsRow) -> PreviewSettingsView {
    PreviewSettingsView {
        enabled: row.enabled,
        max: row.max_previews,
        ttl_seconds: row.ttl_s,
        database: row.database.clone(),
        instances: row.instances,
        cpu: row.cpu,
        memory: row.memory_bytes,
    }
}

async fn preview_view(state: &AppState, row: &PreviewRow) -> Result<PreviewView, ApiError> {
    let deployment = state.store.app_deployments(&row.preview_app).await?.into_iter().next().map(|d| d.state);
    Ok(PreviewView {
        number: row.number,
        app: row.preview_app.clone(),
        state: row.state.clone(),
        url: format!("https://{}", previews::preview_host(state, &row.app, row.number)),
        branch: row.head_ref.clone(),
        commit: row.head_sha.clone(),
        from_fork: row.from_fork,
        approved_by: row.approved_by.clone(),
        deployment,
        services: row.services.clone(),
        created_at: rfc3339_ms(row.created_at),
        updated_at: rfc3339_ms(row.updated_at),
    })
}

#[utoipa::path(get, path = "/api/apps/{name}/previews", operation_id = "previews_list", tag = "apps", params(("name" = String, Path, description = "The app's name")),
    responses((status = 200, description = "The app's preview settings, production-only variables and previews (oldest first)", body = PreviewList), (status = 404, description = "No such app", body = ErrorBody)))]
pub async fn list(State(state): State<Arc<AppState>>, Path(name): Path<String>) -> Result<Json<PreviewList>, ApiError> {
    load(&state, &name).await?;
    let settings = previews::settings(&state, &name).await?;
    let mut list = Vec::new();
    for row in state.store.previews_of(&name).await? {
        list.push(preview_view(&state, &row).await?);
    }
    let preview_env = previews::overrides(&state, &settings)?.into_keys().collect();
    Ok(Json(PreviewList { settings: settings_view(&settings), production_only: state.store.production_only_env(&name).await?, preview_env, previews: list }))
}

#[utoipa::path(put, path = "/api/apps/{name}/previews/settings", operation_id = "previews_settings_replace", tag = "apps", params(("name" = String, Path, description = "The app's name")), request_body = PreviewSettingsInput,
    responses(
        (status = 200, description = "Saved", body = PreviewSettingsView),
        (status = 400, description = "Invalid settings, or the app is itself a preview", body = ErrorBody),
        (status = 404, description = "No such app", body = ErrorBody),
    ))]
pub async fn put_settings(State(state): State<Arc<AppState>>, Path(name): Path<String>, body: Result<Bytes, BytesRejection>) -> Result<Json<PreviewSettingsView>, ApiError> {
    let input: PreviewSettingsInput = parse_json(&body_bytes(body)?)?;
    load(&state, &name).await?;
    let change = previews::SettingsChange {
        enabled: input.enabled,
        max: input.max,
        ttl_s: input.ttl_seconds,
        database: input.database.as_deref(),
        instances: input.instances,
        cpu: input.cpu,
        memory: input.memory,
    };
    let row = previews::apply_settings(&state, &name, change).await?;
    Ok(Json(settings_view(&row)))
}

#[utoipa::path(put, path = "/api/apps/{name}/env/production-only", operation_id = "apps_env_production_only_replace", tag = "apps", params(("name" = String, Path, description = "The app's name")), request_body = ProductionOnly,
    responses(
        (status = 200, description = "The names now production-only", body = ProductionOnly),
        (status = 400, description = "Invalid names", body = ErrorBody),
        (status = 404, description = "No such app", body = ErrorBody),
    ))]
pub async fn put_production_only(State(state): State<Arc<AppState>>, Path(name): Path<String>, body: Result<Bytes, BytesRejection>) -> Result<Json<ProductionOnly>, ApiError> {
    let ProductionOnly { mut names } = parse_json(&body_bytes(body)?)?;
    if names.len() > MAX_NAMES {
        return Err(ApiError::BadRequest(format!("at most {MAX_NAMES} names")));
    }
    for variable in &names {
        validate::bounded_text("names", variable, 256)?;
        if variable.is_empty() || variable.contains('=') || variable.contains('\0') {
            return Err(ApiError::BadRequest(format!("invalid names entry {variable:?}: a variable name")));
        }
    }
    names.sort();
    names.dedup();
    load(&state, &name).await?;
    state.store.set_production_only_env(&name, &names).await?;
    Ok(Json(ProductionOnly { names }))
}

#[utoipa::path(put, path = "/api/apps/{name}/previews/env", operation_id = "previews_env_replace", tag = "apps", params(("name" = String, Path, description = "The app's name")),
    request_body(content = EnvVars, description = "A JSON object of string values: every variable previews get on top of the app's (a fork's preview never does)"),
    responses(
        (status = 200, description = "The names now set", body = EnvView),
        (status = 400, description = "Invalid variables", body = ErrorBody),
        (status = 404, description = "No such app", body = ErrorBody),
    ))]
pub async fn put_env(State(state): State<Arc<AppState>>, Path(name): Path<String>, body: Result<Bytes, BytesRejection>) -> Result<Json<EnvView>, ApiError> {
    let EnvVars(vars) = parse_json(&body_bytes(body)?).map_err(|_| ApiError::BadRequest("the body must be a JSON object of string values".into()))?;
    load(&state, &name).await?;
    previews::set_overrides(&state, &name, &vars).await?;
    Ok(Json(EnvView { app: name, env: vars.into_keys().collect() }))
}

#[utoipa::path(post, path = "/api/apps/{name}/previews/{number}/approve", operation_id = "previews_approve", tag = "apps",
    params(("name" = String, Path, description = "The app's name"), ("number" = i64, Path, description = "The pull or merge request's number")),
    responses(
        (status = 202, description = "Approved: the head is deploying (or will once its databases answer), with no variable of the app", body = PreviewView),
        (status = 404, description = "No such app or preview", body = ErrorBody),
        (status = 409, description = "The preview waits for no approval", body = ErrorBody),
    ))]
pub async fn approve(State(state): State<Arc<AppState>>, Extension(principal): Extension<Principal>, Path((name, number)): Path<(String, i64)>) -> Result<(StatusCode, Json<PreviewView>), ApiError> {
    let app = load(&state, &name).await?;
    let by = principal.user().map_or_else(|| "admin".to_string(), |u| u.name.clone());
    match previews::approve(&state, &app, number, &by).await? {
        Outcome::Deployed(_) | Outcome::Already(_) | Outcome::Starting => {}
        other => return Err(ApiError::Internal(format!("approving preview {number} of {name}: {other:?}"))),
    }
    let row = state.store.preview(&name, number).await?.ok_or_else(|| ApiError::NotFound(format!("{name} has no preview of request {number}")))?;
    Ok((StatusCode::ACCEPTED, Json(preview_view(&state, &row).await?)))
}

#[utoipa::path(delete, path = "/api/apps/{name}/previews/{number}", operation_id = "previews_delete", tag = "apps",
    params(("name" = String, Path, description = "The app's name"), ("number" = i64, Path, description = "The pull or merge request's number")),
    responses((status = 204, description = "Removed: builds cancelled, instances stopped, app and routes gone"), (status = 404, description = "No such app or preview", body = ErrorBody)))]
pub async fn remove(State(state): State<Arc<AppState>>, Path((name, number)): Path<(String, i64)>) -> Result<StatusCode, ApiError> {
    load(&state, &name).await?;
    if !previews::remove(&state, &name, number, "removed by a user", true).await? {
        return Err(ApiError::NotFound(format!("{name} has no preview of request {number}")));
    }
    Ok(StatusCode::NO_CONTENT)
}
