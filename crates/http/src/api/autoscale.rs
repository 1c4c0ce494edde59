//! `GET`, `PUT` and `DELETE /api/apps/{name}/autoscale`: an app's
//! autoscaling settings and the autoscaler's decisions (see
//! [`cloudweb_core::autoscale`]).

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::Json;
use cloudweb_api_types::autoscale::{Autoscale, AutoscaleDecision, AutoscaleView};
use cloudweb_api_types::ErrorBody;

use crate::error::{body_bytes, parse_json, ApiError};
use crate::AppState;

/// Decisions an answer lists (the newest).
const LISTED: i64 = 50;

async fn answer(state: &AppState, name: &str) -> Result<AutoscaleView, ApiError> {
    let Some(app) = state.store.app(name).await? else { return Err(ApiError::NotFound(format!("no app {name:?}"))) };
    let settings = state.store.app_autoscale(name).await?.flatten().and_then(|s| serde_json::from_str(&s).ok());
    let decisions = state
        .store
        .autoscale_decisions(name, LISTED)
        .await?
        .into_iter()
        .map(|d| AutoscaleDecision {
            at: cloudweb_core::clock::rfc3339_ms(d.at),
            from: d.from.clamp(0, i64::from(u32::MAX)) as u32,
            to: d.to.clamp(0, i64::from(u32::MAX)) as u32,
            metric: d.metric,
            value: d.value,
            target: d.target,
            reason: d.reason,
        })
        .collect();
    Ok(AutoscaleView { app: name.to_string(), autoscale: settings, instances: app.instances, decisions })
}

/// The app's autoscaling settings (`null`: off), its instance count and
/// the autoscaler's newest decisions.
#[utoipa::path(get, path = "/api/apps/{name}/autoscale", operation_id = "apps_autoscale_show", tag = "apps",
    params(("name" = String, Path, description = "The app's name")),
    responses((status = 200, description = "Settings and decisions", body = AutoscaleView), (status = 404, description = "No such app", body = ErrorBody)))]
pub async fn show(State(state): State<Arc<AppState>>, Path(name): Path<String>) -> Result<Json<AutoscaleView>, ApiError> {
    Ok(Json(answer(&state, &name).await?))
}

/// Turns autoscaling on, or changes it: from the next look on, the
/// autoscaler keeps the running instances between `min` and `max`, near
/// the target. A manual scale is refused while it is on.
#[utoipa::path(put, path = "/api/apps/{name}/autoscale", operation_id = "apps_autoscale_set", tag = "apps",
    params(("name" = String, Path, description = "The app's name")), request_body = Autoscale,
    responses(
        (status = 200, description = "Set", body = AutoscaleView),
        (status = 400, description = "Invalid settings", body = ErrorBody),
        (status = 404, description = "No such app", body = ErrorBody),
    ))]
pub async fn set(State(state): State<Arc<AppState>>, Path(name): Path<String>, body: Result<Bytes, BytesRejection>) -> Result<Json<AutoscaleView>, ApiError> {
    let settings: Autoscale = parse_json(&body_bytes(body)?)?;
    if let Some(problem) = settings.problem() {
        return Err(ApiError::BadRequest(format!("invalid autoscale: {problem}")));
    }
    let stored = serde_json::to_string(&settings).expect("settings serialize");
    if !state.store.set_app_autoscale(&name, Some(&stored)).await? {
        return Err(ApiError::NotFound(format!("no app {name:?}")));
    }
    tracing::info!(app = %name, settings = %stored, "autoscaling set");
    Ok(Json(answer(&state, &name).await?))
}

/// Turns autoscaling off: the app keeps the count it has now.
#[utoipa::path(delete, path = "/api/apps/{name}/autoscale", operation_id = "apps_autoscale_off", tag = "apps",
    params(("name" = String, Path, description = "The app's name")),
    responses((status = 200, description = "Off", body = AutoscaleView), (status = 404, description = "No such app", body = ErrorBody)))]
pub async fn off(State(state): State<Arc<AppState>>, Path(name): Path<String>) -> Result<Json<AutoscaleView>, ApiError> {
    if !state.store.set_app_autoscale(&name, None).await? {
        return Err(ApiError::NotFound(format!("no app {name:?}")));
    }
    tracing::info!(app = %name, "autoscaling off");
    Ok(Json(answer(&state, &name).await?))
}
