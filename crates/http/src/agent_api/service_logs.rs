//! `POST /agent/v1/service-logs`: output lines of the node's managed
//! services' containers. A service's lines are taken only when it exists
//! and runs on the sending node, so a node cannot write into another
//! node's services; the others are listed as refused.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::{Extension, Json};
use cloudweb_protocol::{LogUploadResponse, RefusedContainer, ServiceLogUpload};

use super::AuthedNode;
use crate::error::{body_bytes, parse_json, ApiError};
use crate::runtime_logs::Incoming;
use crate::AppState;

pub async fn upload(
    State(state): State<Arc<AppState>>,
    Extension(AuthedNode(node_id)): Extension<AuthedNode>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<LogUploadResponse>, ApiError> {
    let mut upload: ServiceLogUpload = parse_json(&body_bytes(body)?)?;
    upload.sanitize();
    upload.validate()?;
    let mut answer = LogUploadResponse::default();
    // Shown to followers once written (see `runtime_logs::Held`).
    let mut held = Vec::new();
    for logs in &upload.services {
        let refuse = |reason: String| RefusedContainer { container: logs.service.clone(), reason };
        match state.store.service(&logs.service).await? {
            None => answer.refused.push(refuse(format!("no service {}", logs.service))),
            Some(service) if service.node_id != node_id => answer.refused.push(refuse(format!("service {} does not run on this node", logs.service))),
            Some(service) => {
                state.runtime_logs.recall(&crate::services::logs_key(&service.name), &cloudweb_protocol::services::container_name(&service.name)).await;
                let (accepted, lines) = state.runtime_logs.append_held(Incoming {
                    app: &crate::services::logs_key(&service.name),
                    deployment_id: "",
                    instance: 0,
                    node_id: &node_id,
                    container: &cloudweb_protocol::services::container_name(&service.name),
                    dropped: logs.dropped,
                    lines: &logs.lines,
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
