//! `POST /agent/v1/logs`: runtime log lines of the node's app instances.
//!
//! Each container's lines are taken only when its deployment exists and the
//! instance it names is placed on the sending node, so a node cannot write
//! into another node's apps; the app is the deployment's, never the
//! agent's word. A container that fails the check is listed as refused (the
//! agent stops following it) while the other containers' lines are stored.

use std::collections::HashMap;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::{Extension, Json};
use cloudweb_protocol::{LogUpload, LogUploadResponse, RefusedContainer};

use super::AuthedNode;
use crate::error::{body_bytes, parse_json, ApiError};
use crate::runtime_logs::Incoming;
use crate::AppState;

pub async fn upload(
    State(state): State<Arc<AppState>>,
    Extension(AuthedNode(node_id)): Extension<AuthedNode>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<LogUploadResponse>, ApiError> {
    let mut upload: LogUpload = parse_json(&body_bytes(body)?)?;
    upload.sanitize();
    upload.validate()?;
    let mut answer = LogUploadResponse::default();
    // Shown to followers once written (see `runtime_logs::Held`).
    let mut held = Vec::new();
    // deployment id -> (app, instances placed on this node), read once.
    let mut placements: HashMap<String, Option<(String, Vec<i64>)>> = HashMap::new();
    for container in &upload.containers {
        if !placements.contains_key(&container.deployment_id) {
            let found = match state.store.deployment(&container.deployment_id).await? {
                Some(deployment) => {
                    let instances = state.store.instances(&deployment.id).await?;
                    let here = instances.iter().filter(|i| i.node_id.as_deref() == Some(node_id.as_str())).map(|i| i.instance).collect();
                    Some((deployment.app, here))
                }
                None => None,
            };
            placements.insert(container.deployment_id.clone(), found);
        }
        let refuse = |reason: String| RefusedContainer { container: container.container.clone(), reason };
        match &placements[&container.deployment_id] {
            None => answer.refused.push(refuse(format!("no deployment {}", container.deployment_id))),
            Some((_, here)) if !here.contains(&i64::from(container.instance)) => answer.refused.push(refuse(format!(
                "instance {} of {} is not placed on this node",
                container.instance, container.deployment_id
            ))),
            Some((app, _)) => {
                state.runtime_logs.recall(app, &container.container).await;
                let (accepted, lines) = state.runtime_logs.append_held(Incoming {
                    app,
                    deployment_id: &container.deployment_id,
                    instance: container.instance,
                    node_id: &node_id,
                    container: &container.container,
                    dropped: container.dropped,
                    lines: &container.lines,
                    now_ms: state.clock.now_ms(),
                });
                answer.accepted += accepted;
                held.push(lines);
            }
        }
    }
    // Answered once the lines are written: what the agent saw accepted
    // outlives a crash of the control plane.
    if let Some(archive) = state.runtime_logs.archive() {
        archive.written().await;
    }
    drop(held);
    Ok(Json(answer))
}
