//! `GET /agent/v1/commands` and `POST /agent/v1/commands/{id}/ack`.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::{Extension, Json};
use cloudweb_protocol::{Command, CommandList};
use serde_json::json;

use super::AuthedNode;
use crate::clock::rfc3339_ms;
use crate::error::ApiError;
use crate::store::CommandRow;
use crate::AppState;

/// Command ids on the wire are `cmd-<sequence number>`.
pub fn command_id(seq: i64) -> String {
    format!("cmd-{seq}")
}

pub fn parse_command_id(id: &str) -> Option<i64> {
    let digits = id.strip_prefix("cmd-")?;
    if digits.is_empty() || digits.len() > 18 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// The command as the agent sees it, with its payload unsealed.
pub fn to_wire(state: &AppState, row: &CommandRow) -> Result<Command, ApiError> {
    let payload = state
        .sealer
        .open_json(&crate::command_context(&row.node_id), &row.payload)
        .map_err(|e| ApiError::Internal(format!("command {}: {e}", row.seq)))?;
    Ok(Command { id: command_id(row.seq), kind: row.kind.clone(), payload, created_at: rfc3339_ms(row.created_at) })
}

pub async fn list(
    State(state): State<Arc<AppState>>,
    Extension(AuthedNode(node_id)): Extension<AuthedNode>,
) -> Result<Json<CommandList>, ApiError> {
    let pending = state.store.pending_commands(&node_id).await?;
    let commands = pending.iter().map(|row| to_wire(&state, row)).collect::<Result<_, _>>()?;
    Ok(Json(CommandList { commands }))
}

pub async fn ack(
    State(state): State<Arc<AppState>>,
    Extension(AuthedNode(node_id)): Extension<AuthedNode>,
    Path(id): Path<String>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let not_found = || ApiError::NotFound(format!("node {node_id} has no command {id:?}"));
    let seq = parse_command_id(&id).ok_or_else(not_found)?;
    if !state.store.ack_command(&node_id, seq, state.clock.now_ms()).await? {
        return Err(not_found());
    }
    // A stop's effect on what the control plane shows (see stop_acked).
    if let Some(command) = state.store.node_command(&node_id, seq).await? {
        if cloudweb_protocol::CommandKind::parse(&command.kind) == Some(cloudweb_protocol::CommandKind::Stop) {
            // The stored payload is sealed; the wire form is the clear one.
            if let Ok(payload) = serde_json::from_value::<cloudweb_protocol::StopPayload>(to_wire(&state, &command)?.payload) {
                crate::deploy::stop_acked(&state, &node_id, &payload).await?;
            }
        }
    }
    Ok(Json(json!({ "id": id, "acked": true })))
}
