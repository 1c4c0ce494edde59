//! `POST /api/apps/{name}/scale`: an app's running deployment to a new
//! instance count, now (see [`cloudweb_core::deploy::scale`]), and
//! `GET /api/apps/{name}/top`: its instances' latest usage.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::Json;
use cloudweb_api_types::scale::{AppTop, InFlightCount, InstanceUsage, ScaleRequest, ScaleView, StartedInstance};
use cloudweb_api_types::ErrorBody;
use cloudweb_core::deploy::scale;

use crate::error::{body_bytes, parse_json, ApiError};
use crate::AppState;

/// Sets the app's instance count and brings its running deployment to it:
/// new instances start spread over the nodes (each with the scheduler's
/// reason); surplus ones leave the routes first and stop after the drain
/// period, so no request reaches a stopping instance.
#[utoipa::path(post, path = "/api/apps/{name}/scale", operation_id = "apps_scale", tag = "apps",
    params(("name" = String, Path, description = "The app's name")), request_body = ScaleRequest,
    responses(
        (status = 200, description = "What the scale did", body = ScaleView),
        (status = 400, description = "Invalid count", body = ErrorBody),
        (status = 404, description = "No such app", body = ErrorBody),
        (status = 409, description = "The app is autoscaled: change its bounds, or turn autoscaling off", body = ErrorBody),
    ))]
pub async fn scale(State(state): State<Arc<AppState>>, Path(name): Path<String>, body: Result<Bytes, BytesRejection>) -> Result<Json<ScaleView>, ApiError> {
    let request: ScaleRequest = parse_json(&body_bytes(body)?)?;
    if let Some(Some(_)) = state.store.app_autoscale(&name).await? {
        return Err(ApiError::Conflict(format!(
            "{name} is autoscaled: its count follows its load; change min and max (cloudweb autoscale {name} --min N --max M) or turn autoscaling off (--off)"
        )));
    }
    let done = scale::scale(&state, &name, request.instances).await?;
    Ok(Json(ScaleView {
        app: name,
        instances: request.instances,
        deployment: done.deployment,
        before: done.before,
        started: done.started.into_iter().map(|s| StartedInstance { instance: s.instance, node_id: s.node_id, why: s.why }).collect(),
        draining: done.draining,
        waiting: done.waiting,
        in_flight: done.in_flight.into_iter().map(|(deployment, instances)| InFlightCount { deployment, instances }).collect(),
    }))
}

/// The app's instances that run, are starting or are stopping, each with
/// its node's latest usage sample of its container (CPU, memory, restarts).
#[utoipa::path(get, path = "/api/apps/{name}/top", operation_id = "apps_top", tag = "apps",
    params(("name" = String, Path, description = "The app's name")),
    responses((status = 200, description = "The instances and their usage", body = AppTop), (status = 404, description = "No such app", body = ErrorBody)))]
pub async fn top(State(state): State<Arc<AppState>>, Path(name): Path<String>) -> Result<Json<AppTop>, ApiError> {
    let Some(app) = state.store.app(&name).await? else { return Err(ApiError::NotFound(format!("no app {name:?}"))) };
    let cpu_request = app.cpu.unwrap_or(cloudweb_core::deploy::DEFAULT_CPU);
    let nodes = state.nodes.all();
    let mut instances = Vec::new();
    for deployment in state.store.app_deployments(&name).await? {
        let unready = state.store.unready_instances(&deployment.id).await?;
        let troubles = state.store.instance_troubles(&deployment.id).await?;
        for instance in state.store.instances(&deployment.id).await? {
            let unready_reason = unready.iter().find(|(number, _, _)| *number == instance.instance).map(|(_, _, reason)| reason.clone().unwrap_or_default());
            if !matches!(instance.state.as_str(), "pending" | "running" | "stopping") {
                continue;
            }
            let node = instance.node_id.as_ref().and_then(|id| nodes.iter().find(|n| n.id == *id));
            let sample = node.and_then(|n| n.metrics.as_ref());
            let usage = sample.and_then(|s| {
                let container = instance.container.as_deref()?;
                s.value.containers.iter().flatten().find(|c| c.container == container)
            });
            let cpu_cores = usage.and_then(|u| u.cpu_cores);
            let trouble = troubles.iter().find(|t| t.instance == instance.instance);
            instances.push(InstanceUsage {
                deployment: deployment.id.clone(),
                instance: instance.instance,
                node_id: instance.node_id.clone(),
                container: instance.container.clone(),
                state: instance.state.clone(),
                cpu_cores,
                cpu_pct_of_request: cpu_cores.map(|c| (c / cpu_request * 1000.0).round() / 10.0),
                mem_bytes: usage.and_then(|u| u.mem_bytes),
                mem_limit: usage.and_then(|u| u.mem_limit),
                restarts: usage.and_then(|u| u.restarts),
                started_at: usage.and_then(|u| u.started_at.clone()),
                sampled_at: usage.and(sample).map(|s| cloudweb_core::clock::rfc3339_ms(s.at_ms)),
                ready: unready_reason.is_none(),
                unready_reason,
                crash_loop: trouble
                    .filter(|_| instance.state == "running")
                    .and_then(|t| t.crash_loop.as_deref())
                    .and_then(|j| serde_json::from_str(j).ok()),
                probe_problem: trouble
                    .filter(|_| instance.state == "running")
                    .and_then(|t| t.probe_problem.clone()),
            });
        }
    }
    Ok(Json(AppTop { app: name, cpu_request, instances }))
}
