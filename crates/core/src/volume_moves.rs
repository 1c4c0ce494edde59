//! Moving a volume to another node: the control plane's half of the
//! sequence in `cloudweb_protocol::volume_moves`. It checks the request,
//! makes the single-use grant, hands each agent its step, switches the
//! volume once both ends report the same digest, restarts the volume's app
//! on the new node (a `reschedule` deployment of the image that ran) and
//! measures the app's downtime. A move that fails or runs out of time is
//! undone on both nodes: the app starts again on the source, which never
//! gave up its data, and the target's partial copy is removed.
//!
//! Invariant: the volume's row points at the source until both digests
//! match; the source's copy is deleted only on `confirm` or when the keep
//! period (`--volume-move-keep-days`) ends, never by the move itself.

use std::sync::Arc;

use cloudweb_protocol::{CommandKind, MoveReport, MoveReportState, VolumeMoveStep, VolumeReceivePayload, VolumeSendPayload};
use rand::Rng;

use crate::deploy::{self, Origin};
use crate::error::ApiError;
use crate::store::{MoveRefusal, NewCommand, VolumeMoveRow};
use crate::AppState;

/// How long the agents have for the copy before the move fails.
pub const COPY_TIMEOUT_SECONDS: u32 = 3600;

fn grant_context(move_id: &str) -> String {
    format!("volume-move-grant:{move_id}")
}

fn new_move_id() -> String {
    let bytes: [u8; 8] = rand::rng().random();
    format!("mv_{}", hex::encode(bytes))
}

fn command(state: &AppState, node_id: &str, kind: CommandKind, payload: &impl serde::Serialize) -> NewCommand {
    NewCommand {
        node_id: node_id.to_string(),
        kind: kind.as_str().to_string(),
        payload: state.sealer.seal_json(&crate::command_context(node_id), &serde_json::to_value(payload).expect("payload serializes")),
    }
}

/// A node for a move: found by id or name, ready (not draining, not
/// unreachable), with an agent that moves volumes and a running mesh.
/// Returns (id, mesh address).
fn usable_node(state: &AppState, wanted: &str, role: &str) -> Result<(String, String), ApiError> {
    let now = tokio::time::Instant::now();
    let node = state
        .nodes
        .all()
        .into_iter()
        .find(|n| n.id == wanted || n.name == wanted)
        .ok_or_else(|| ApiError::NotFound(format!("no node {wanted:?}")))?;
    let label = format!("{role} node {} ({})", node.name, node.id);
    let node_state = node.state(now, state.config.unreachable_after);
    if node_state == crate::live::NodeState::Unreachable {
        return Err(ApiError::Conflict(format!("{label} is unreachable")));
    }
    if role == "target" && node.draining {
        return Err(ApiError::Conflict(format!("{label} is draining")));
    }
    if !node.has_feature(now, cloudweb_protocol::features::VOLUME_MOVES) {
        return Err(ApiError::Conflict(format!("{label} runs an agent that cannot move volumes; upgrade it")));
    }
    if node.current_health(now).and_then(|h| h.mesh.as_ref()).is_none() {
        return Err(ApiError::Conflict(format!("{label} does not run the mesh; volumes move between nodes over the mesh")));
    }
    Ok((node.id.clone(), crate::mesh_address(node.mesh_index)))
}

/// The node a volume goes to when the user names none: a ready node
/// other than `from` that can take part, with the most free disk (and
/// room for `size` bytes, when known).
fn pick_target(state: &AppState, from: &str, size: Option<i64>) -> Result<String, ApiError> {
    let mut best: Option<(u64, String)> = None;
    for node in state.nodes.all() {
        if node.id == from || usable_node(state, &node.id, "target").is_err() {
            continue;
        }
        let free = match (node.capacity, node.metrics.as_ref().and_then(|m| m.value.node.as_ref()).and_then(|n| n.disk_used)) {
            (Some(capacity), Some(used)) => capacity.disk_bytes.saturating_sub(used),
            (Some(capacity), None) => capacity.disk_bytes,
            _ => 0,
        };
        if size.is_some_and(|s| free < s.max(0) as u64) {
            continue;
        }
        if best.as_ref().is_none_or(|(most, _)| free > *most) {
            best = Some((free, node.id.clone()));
        }
    }
    best.map(|(_, id)| id).ok_or_else(|| {
        ApiError::Conflict("no other node can take the volume (each must be ready, not draining, run the mesh and have room)".into())
    })
}

/// Starts moving volume `name` to node `to` (id or name; picked when
/// `None`).
pub async fn start(state: &AppState, name: &str, to: Option<&str>) -> Result<VolumeMoveRow, ApiError> {
    cloudweb_protocol::volumes::name(name).map_err(|e| ApiError::BadRequest(e.to_string()))?;
    let volume = state.store.volume(name).await?.ok_or_else(|| ApiError::NotFound(format!("no volume named {name}")))?;
    if let Some(service) = &volume.service {
        return Err(ApiError::Conflict(format!(
            "volume {name} holds the data of service {service}; services are not moved this way (restore a backup on the other node)"
        )));
    }
    let Some(from) = volume.node_id.clone() else {
        return Err(ApiError::Conflict(format!("volume {name} has no data on any node yet; it is created where its app is first placed")));
    };
    let to = match to {
        Some(to) => to.to_string(),
        None => pick_target(state, &from, volume.size_bytes)?,
    };
    let (to_id, to_mesh) = usable_node(state, &to, "target")?;
    if to_id == from {
        return Err(ApiError::Conflict(format!("volume {name} is on node {to} already")));
    }
    let (_, from_mesh) = usable_node(state, &from, "source")?;
    if let Some(app) = &volume.app {
        let others: Vec<String> = state.store.app_volumes(app).await?.into_iter().filter(|v| v.name != name && v.node_id.is_some()).map(|v| v.name).collect();
        if !others.is_empty() {
            return Err(ApiError::Conflict(format!(
                "app {app} also mounts {} on the same node; an app's volumes stay on one node, so detach them first",
                others.join(", ")
            )));
        }
    }
    let now = state.clock.now_ms();
    let id = new_move_id();
    let grant = hex::encode(rand::rng().random::<[u8; 32]>());
    let receive = VolumeReceivePayload {
        move_id: id.clone(),
        volume: name.to_string(),
        grant: grant.clone(),
        listen: to_mesh,
        from: from_mesh,
        timeout_seconds: COPY_TIMEOUT_SECONDS,
    };
    let row = VolumeMoveRow {
        id: id.clone(),
        volume: name.to_string(),
        from_node: from.clone(),
        to_node: to_id.clone(),
        state: "copying".into(),
        reason: None,
        grant_sealed: state.sealer.seal(&grant_context(&id), grant.as_bytes()),
        port: None,
        files: None,
        bytes: None,
        sent_digest: None,
        received_digest: None,
        stopped_at: None,
        switched_at: None,
        finished_at: None,
        deployment_id: None,
        downtime_ms: None,
        source_copy: "in-use".into(),
        keep_until: None,
        created_at: now,
        // Slack over the agents' own bound, so they report first.
        deadline: now + (i64::from(COPY_TIMEOUT_SECONDS) + 120) * 1000,
    };
    match state.store.start_volume_move(&row, &command(state, &to_id, CommandKind::VolumeReceive, &receive), now).await? {
        Ok(()) => {}
        Err(MoveRefusal::Changed) => return Err(ApiError::Conflict(format!("volume {name} changed meanwhile; try again"))),
        Err(MoveRefusal::Busy(other)) => return Err(ApiError::Conflict(format!("volume {name} is being moved already ({other})"))),
    }
    state.hub.notify(&to_id, cloudweb_protocol::events::COMMANDS);
    tracing::info!(move_id = %id, volume = name, from = %from, to = %to_id, "volume move started");
    Ok(state.store.volume_move(&id).await?.unwrap_or(row))
}

/// A node's report on a move.
pub async fn on_report(state: &AppState, node_id: &str, move_id: &str, report: &MoveReport) -> Result<(), ApiError> {
    cloudweb_protocol::volume_moves::move_id(move_id)?;
    report.validate()?;
    let moved = state.store.volume_move(move_id).await?.ok_or_else(|| ApiError::NotFound(format!("no volume move {move_id}")))?;
    let source = moved.from_node == node_id;
    if !source && moved.to_node != node_id {
        return Err(ApiError::Forbidden(format!("volume move {move_id} is not this node's")));
    }
    tracing::info!(move_id, node = node_id, state = ?report.state, message = ?report.message, "volume move report");
    let now = state.clock.now_ms();
    match report.state {
        MoveReportState::Listening if !source => {
            let Some(port) = report.port else { return Ok(()) };
            let grant = state
                .sealer
                .open(&grant_context(move_id), &moved.grant_sealed)
                .map_err(|e| ApiError::Internal(format!("volume move {move_id}: {e}")))?;
            let grant = String::from_utf8(grant).map_err(|_| ApiError::Internal("a grant that is not text".into()))?;
            let to_mesh = state.nodes.get(&moved.to_node).map(|n| crate::mesh_address(n.mesh_index)).unwrap_or_default();
            let send = VolumeSendPayload { move_id: move_id.to_string(), volume: moved.volume.clone(), grant, to: format!("{to_mesh}:{port}") };
            if state.store.set_volume_move_port(move_id, port, &command(state, &moved.from_node, CommandKind::VolumeSend, &send), now).await? {
                state.hub.notify(&moved.from_node, cloudweb_protocol::events::COMMANDS);
            }
        }
        MoveReportState::Sent if source => {
            let digest = report.digest.as_deref().ok_or_else(|| ApiError::BadRequest("a sent report names its digest".into()))?;
            state.store.set_volume_move_sent(move_id, digest, report.bytes.map(|b| b as i64), report.stopped_at_ms).await?;
            maybe_switch(state, move_id).await?;
        }
        MoveReportState::Received if !source => {
            let digest = report.digest.as_deref().ok_or_else(|| ApiError::BadRequest("a received report names its digest".into()))?;
            state.store.set_volume_move_received(move_id, digest, report.files.map(|f| f as i64)).await?;
            maybe_switch(state, move_id).await?;
        }
        MoveReportState::Failed => {
            let side = if source { "the source" } else { "the target" };
            let reason = report.message.clone().unwrap_or_else(|| format!("{side} gave up"));
            fail(state, &moved, &reason).await?;
        }
        MoveReportState::Released if source => {
            tracing::info!(move_id, volume = %moved.volume, "the moved volume's old copy is set aside on the source");
        }
        MoveReportState::Purged if source => {
            state.store.set_volume_move_source_copy(move_id, "purging", "purged", None, now).await?;
        }
        MoveReportState::Aborted => {}
        other => {
            return Err(ApiError::BadRequest(format!("a {other:?} report from the {} of the move", if source { "source" } else { "target" })));
        }
    }
    Ok(())
}

/// Fails a move that is still copying and queues its undoing on both nodes.
async fn fail(state: &AppState, moved: &VolumeMoveRow, reason: &str) -> Result<(), ApiError> {
    let step = VolumeMoveStep { move_id: moved.id.clone(), volume: moved.volume.clone() };
    let undo = [
        command(state, &moved.to_node, CommandKind::VolumeMoveAbort, &step),
        command(state, &moved.from_node, CommandKind::VolumeMoveAbort, &step),
    ];
    let reason = cloudweb_protocol::misc::one_line(reason, 1000);
    if state.store.fail_volume_move(&moved.id, &reason, &undo, state.clock.now_ms()).await? {
        tracing::warn!(move_id = %moved.id, volume = %moved.volume, %reason, "volume move failed; the volume stays on its node");
        state.hub.notify(&moved.to_node, cloudweb_protocol::events::COMMANDS);
        state.hub.notify(&moved.from_node, cloudweb_protocol::events::COMMANDS);
    }
    Ok(())
}

/// Once both ends reported the same digest: the volume is the target's,
/// the source sets its copy aside, and the app starts on the target.
async fn maybe_switch(state: &AppState, move_id: &str) -> Result<(), ApiError> {
    let Some(moved) = state.store.volume_move(move_id).await? else { return Ok(()) };
    let (Some(sent), Some(received)) = (&moved.sent_digest, &moved.received_digest) else { return Ok(()) };
    if sent != received {
        return fail(state, &moved, &format!("the copy's digest {received} differs from the source's {sent}")).await;
    }
    let now = state.clock.now_ms();
    let keep_until = now + state.config.volume_move_keep.as_millis() as i64;
    let step = VolumeMoveStep { move_id: moved.id.clone(), volume: moved.volume.clone() };
    let release = command(state, &moved.from_node, CommandKind::VolumeRelease, &step);
    if !state.store.switch_volume_move(&moved, &release, keep_until, now).await? {
        return Ok(());
    }
    state.hub.notify(&moved.from_node, cloudweb_protocol::events::COMMANDS);
    tracing::info!(move_id, volume = %moved.volume, to = %moved.to_node, "volume switched to its new node");
    let restarted = restart_app(state, &moved).await?;
    match restarted {
        Some(deployment) => state.store.set_volume_move_deployment(move_id, &deployment).await?,
        None => {
            state.store.finish_volume_move(move_id, None, None, now).await?;
        }
    }
    Ok(())
}

/// Starts the volume's app on its new node: the image of its running
/// deployment, as a `reschedule` deployment the scheduler pins to the
/// volume's node. None when the app has no running deployment.
async fn restart_app(state: &AppState, moved: &VolumeMoveRow) -> Result<Option<String>, ApiError> {
    let Some(volume) = state.store.volume(&moved.volume).await? else { return Ok(None) };
    let Some(app_name) = volume.app else { return Ok(None) };
    let Some(app) = state.store.app(&app_name).await? else { return Ok(None) };
    let deployments = state.store.app_deployments(&app_name).await?;
    let Some(running) = deployments.iter().filter(|d| d.state == "running").max_by_key(|d| d.seq) else { return Ok(None) };
    let Some(image) = running.image.clone() else { return Ok(None) };
    let deployment = deploy::create(state, &app, Origin::Reschedule { of: running.id.clone(), image }).await?;
    tracing::info!(move_id = %moved.id, app = %app_name, deployment = %deployment.id, "the moved volume's app starts on its new node");
    Ok(Some(deployment.id))
}

/// The user confirms a move: the source's copy is deleted now.
pub async fn confirm(state: &AppState, move_id: &str) -> Result<VolumeMoveRow, ApiError> {
    cloudweb_protocol::volume_moves::move_id(move_id).map_err(|e| ApiError::BadRequest(e.to_string()))?;
    let moved = state.store.volume_move(move_id).await?.ok_or_else(|| ApiError::NotFound(format!("no volume move {move_id}")))?;
    match moved.source_copy.as_str() {
        "kept" => {}
        "purging" | "purged" => return Ok(moved),
        _ => return Err(ApiError::Conflict(format!("volume move {move_id} has no old copy to delete (it is {})", moved.state))),
    }
    purge(state, &moved).await?;
    Ok(state.store.volume_move(move_id).await?.unwrap_or(moved))
}

async fn purge(state: &AppState, moved: &VolumeMoveRow) -> Result<(), ApiError> {
    let step = VolumeMoveStep { move_id: moved.id.clone(), volume: moved.volume.clone() };
    let purge = command(state, &moved.from_node, CommandKind::VolumePurge, &step);
    if state.store.set_volume_move_source_copy(&moved.id, "kept", "purging", Some(&purge), state.clock.now_ms()).await? {
        state.hub.notify(&moved.from_node, cloudweb_protocol::events::COMMANDS);
        tracing::info!(move_id = %moved.id, volume = %moved.volume, node = %moved.from_node, "deleting the moved volume's old copy");
    }
    Ok(())
}

/// One pass over the moves that need watching: copies past their
/// deadline fail; a switched move is done once its app runs on the new
/// node (or could not start there); kept copies past their keep period
/// are deleted.
pub async fn watch_once(state: &AppState) -> Result<(), ApiError> {
    let now = state.clock.now_ms();
    for moved in state.store.volume_moves_to_watch().await? {
        match moved.state.as_str() {
            "copying" if now > moved.deadline => {
                fail(state, &moved, &format!("the copy did not finish within {} s", (moved.deadline - moved.created_at) / 1000)).await?;
            }
            "switched" => {
                let Some(id) = &moved.deployment_id else {
                    // Switched but killed before its deployment was made.
                    if now - moved.switched_at.unwrap_or(now) > 10_000 {
                        match restart_app(state, &moved).await? {
                            Some(deployment) => state.store.set_volume_move_deployment(&moved.id, &deployment).await?,
                            None => {
                                state.store.finish_volume_move(&moved.id, None, None, now).await?;
                            }
                        }
                    }
                    continue;
                };
                let Some(deployment) = state.store.deployment(id).await? else { continue };
                match deployment.state.as_str() {
                    "running" | "superseded" => {
                        let downtime = moved.stopped_at.map(|at| (deployment.updated_at.max(at) - at).max(0));
                        if state.store.finish_volume_move(&moved.id, None, downtime, now).await? {
                            tracing::info!(move_id = %moved.id, volume = %moved.volume, downtime_ms = ?downtime, "volume move done");
                        }
                    }
                    "failed" => {
                        let reason = format!(
                            "the data is on the new node, but the app did not start there: {}",
                            deployment.error.as_deref().unwrap_or("its deployment failed")
                        );
                        state.store.finish_volume_move(&moved.id, Some(&reason), None, now).await?;
                    }
                    _ => {}
                }
            }
            _ => {}
        }
        if moved.source_copy == "kept" && moved.keep_until.is_some_and(|until| now > until) {
            purge(state, &moved).await?;
        }
    }
    Ok(())
}

/// Runs [`watch_once`] every two seconds.
pub async fn watcher(state: Arc<AppState>) {
    let mut tick = tokio::time::interval(std::time::Duration::from_secs(2));
    loop {
        tick.tick().await;
        if let Err(err) = watch_once(&state).await {
            tracing::warn!(error = %err, "watching volume moves");
        }
    }
}
