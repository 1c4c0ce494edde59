//! `/api/deployments/{id}` and `/api/apps/{name}/deployments`, and the
//! live log stream.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, State};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::Json;
use futures_util::stream::{self, Stream, StreamExt};
use cloudweb_api_types::deployments::{BuildLogEnd, BuildLogLine, DeploymentList, DeploymentView, InstanceView, TimelineEntry};
use cloudweb_api_types::ErrorBody;

use crate::clock::rfc3339_ms;
use crate::deploy::state::DeploymentState;
use crate::error::ApiError;
use crate::store::DeploymentRow;
use crate::AppState;

async fn view(state: &AppState, deployment: &DeploymentRow) -> Result<DeploymentView, ApiError> {
    let instances = state
        .store
        .instances(&deployment.id)
        .await?
        .into_iter()
        .map(|i| InstanceView { instance: i.instance, node_id: i.node_id, container: i.container, state: i.state, address: i.address })
        .collect();
    // The states it went through, oldest first.
    let timeline = state
        .store
        .deployment_events(&deployment.id)
        .await?
        .into_iter()
        .map(|(step, at)| TimelineEntry { state: step, at: rfc3339_ms(at) })
        .collect();
    Ok(DeploymentView {
        id: deployment.id.clone(),
        app: deployment.app.clone(),
        kind: deployment.kind.clone(),
        state: deployment.state.clone(),
        commit: deployment.commit_sha.clone(),
        rollback_of: deployment.rollback_of.clone(),
        image: deployment.image.clone(),
        error: deployment.error.clone(),
        created_at: rfc3339_ms(deployment.created_at),
        updated_at: rfc3339_ms(deployment.updated_at),
        instances,
        timeline,
    })
}

#[utoipa::path(get, path = "/api/deployments/{id}", operation_id = "deployments_show", tag = "deployments", params(("id" = String, Path, description = "The deployment's id")),
    responses((status = 200, description = "The deployment and its instances", body = DeploymentView), (status = 404, description = "No such deployment", body = ErrorBody)))]
pub async fn show(State(state): State<Arc<AppState>>, Path(id): Path<String>) -> Result<Json<DeploymentView>, ApiError> {
    let deployment = state.store.deployment(&id).await?.ok_or_else(|| ApiError::NotFound(format!("no deployment {id:?}")))?;
    Ok(Json(view(&state, &deployment).await?))
}

#[utoipa::path(get, path = "/api/apps/{name}/deployments", operation_id = "apps_deployments_list", tag = "deployments", params(("name" = String, Path, description = "The app's name")),
    responses((status = 200, description = "The app's deployments, newest first", body = DeploymentList), (status = 404, description = "No such app", body = ErrorBody)))]
pub async fn of_app(State(state): State<Arc<AppState>>, Path(name): Path<String>) -> Result<Json<DeploymentList>, ApiError> {
    if state.store.app(&name).await?.is_none() {
        return Err(ApiError::NotFound(format!("no app {name:?}")));
    }
    let mut deployments = Vec::new();
    for deployment in state.store.app_deployments(&name).await? {
        deployments.push(view(&state, &deployment).await?);
    }
    Ok(Json(DeploymentList { deployments }))
}

/// `POST /api/deployments/{id}/cancel`: ends a queued, building or
/// deploying deployment as `failed` ("cancelled by the user"); the node
/// stops its build or container. 409 once it has finished or runs (a
/// running deployment is replaced by deploying or rolling back).
#[utoipa::path(post, path = "/api/deployments/{id}/cancel", operation_id = "deployments_cancel", tag = "deployments", params(("id" = String, Path, description = "The deployment's id")),
    responses(
        (status = 200, description = "The deployment, failed (cancelled)", body = DeploymentView),
        (status = 404, description = "No such deployment", body = ErrorBody),
        (status = 409, description = "It has finished or runs", body = ErrorBody),
    ))]
pub async fn cancel(State(state): State<Arc<AppState>>, Path(id): Path<String>) -> Result<Json<DeploymentView>, ApiError> {
    let deployment = state.store.deployment(&id).await?.ok_or_else(|| ApiError::NotFound(format!("no deployment {id:?}")))?;
    let unfinished = matches!(
        DeploymentState::parse(&deployment.state),
        Some(DeploymentState::Queued | DeploymentState::Building | DeploymentState::Deploying)
    );
    if !unfinished || !crate::deploy::cancel(&state, &deployment).await? {
        let now = state.store.deployment(&id).await?.map(|d| d.state).unwrap_or(deployment.state);
        return Err(ApiError::Conflict(format!(
            "deployment {id} is {now}; only a queued, building or deploying deployment can be cancelled"
        )));
    }
    crate::routes::recompute(&state).await?;
    state.log_hub.notify(&id, "logs");
    let deployment = state.store.deployment(&id).await?.ok_or_else(|| ApiError::NotFound(format!("no deployment {id:?}")))?;
    Ok(Json(view(&state, &deployment).await?))
}

/// How long a finished deployment's stream stays open for late lines.
const LINGER: Duration = Duration::from_secs(3);

struct Cursor {
    state: Arc<AppState>,
    id: String,
    last_seq: i64,
    quiet_since: Option<tokio::time::Instant>,
    wake: tokio::sync::broadcast::Receiver<&'static str>,
    done: bool,
}

/// Server-sent events: every stored line (`event: log`, data
/// `{"ts","stream","line"}`), then new ones as agents report them; the
/// stream ends with `event: end` (data `{"state"}`) once the deployment has
/// settled and no line came for a few seconds.
#[utoipa::path(get, path = "/api/deployments/{id}/logs", operation_id = "deployments_logs", tag = "deployments", params(("id" = String, Path, description = "The deployment's id")),
    responses(
        (status = 200, description = "Server-sent events: `log` events (data: a BuildLogLine), then one `end` (data: a BuildLogEnd)", content_type = "text/event-stream", body = String),
        (status = 404, description = "No such deployment", body = ErrorBody),
    ))]
pub async fn logs(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, ApiError> {
    if state.store.deployment(&id).await?.is_none() {
        return Err(ApiError::NotFound(format!("no deployment {id:?}")));
    }
    Ok(Sse::new(log_events(state, id, 0)).keep_alive(KeepAlive::new().interval(Duration::from_secs(15))))
}

/// The log stream of [`logs`], starting after line `after_seq` (the
/// dashboard renders the stored lines itself and follows from there).
pub fn log_events(state: Arc<AppState>, id: String, after_seq: i64) -> impl Stream<Item = Result<Event, Infallible>> {
    let wake = state.log_hub.subscribe(&id);
    let cursor = Cursor { state, id, last_seq: after_seq, quiet_since: None, wake, done: false };
    stream::unfold(cursor, |mut cursor| async move {
        if cursor.done {
            return None;
        }
        loop {
            let lines = cursor.state.store.deployment_logs(&cursor.id, cursor.last_seq, 500).await.ok()?;
            if let Some(last) = lines.last() {
                cursor.last_seq = last.0;
                cursor.quiet_since = None;
                let events: Vec<Event> = lines
                    .into_iter()
                    .map(|(_, ts, stream, line)| Event::default().event("log").data(json_text(&BuildLogLine { ts, stream, line })))
                    .collect();
                return Some((events, cursor));
            }
            let deployment = cursor.state.store.deployment(&cursor.id).await.ok()??;
            let settled = DeploymentState::parse(&deployment.state).is_some_and(|s| s.is_terminal() || s == DeploymentState::Running);
            if settled {
                let since = *cursor.quiet_since.get_or_insert_with(tokio::time::Instant::now);
                if since.elapsed() >= LINGER {
                    cursor.done = true;
                    let end = Event::default().event("end").data(json_text(&BuildLogEnd { state: deployment.state }));
                    return Some((vec![end], cursor));
                }
            }
            tokio::select! {
                _ = cursor.wake.recv() => {}
                _ = tokio::time::sleep(Duration::from_millis(500)) => {}
            }
        }
    })
    .flat_map(|events| stream::iter(events.into_iter().map(Ok)))
}

/// An event's data.
fn json_text(value: &impl serde::Serialize) -> String {
    serde_json::to_string(value).unwrap_or_default()
}
