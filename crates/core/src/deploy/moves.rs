//! Moving instances off nodes: off an unreachable node (its instances are
//! lost; replacements start elsewhere from the same image, and the node is
//! told to stop the old ones for when it comes back) and off a draining
//! node (the old instance keeps serving until its replacement runs). Where
//! nothing fits, the app waits, and the reason is kept for the node's view.

use std::collections::HashMap;

use cloudweb_protocol::StopPayload;
use serde_json::json;

use super::scheduler::{self, Placement, Request};
use super::state::DeploymentState;
use super::{deploy_payload, snapshot, DEFAULT_CPU, DEFAULT_MEMORY};
use crate::error::ApiError;
use crate::store::{AppRow, DeploymentRow};
use crate::AppState;

/// A failed replacement is not tried again for this long.
const RETRY_AFTER_MS: i64 = 30_000;

/// One pass over unreachable and draining nodes. Returns, per node, the
/// apps that could not be moved and why.
pub async fn move_instances(state: &AppState) -> Result<HashMap<String, Vec<(String, String)>>, ApiError> {
    let now = tokio::time::Instant::now();
    let mut waiting: HashMap<String, Vec<(String, String)>> = HashMap::new();
    let leaving = state.nodes.leaving(now, state.config.unreachable_after);
    if leaving.is_empty() {
        return Ok(waiting);
    }
    let active = state.store.active_instances().await?;
    for (node_id, lost) in leaving {
        for instance in active.iter().filter(|i| i.node_id.as_deref() == Some(node_id.as_str()) && i.state == "running") {
            let now_ms = state.clock.now_ms();
            if state.store.replacement_in_progress(&instance.deployment_id, instance.instance, now_ms - RETRY_AFTER_MS).await? {
                continue;
            }
            let Some(deployment) = state.store.deployment(&instance.deployment_id).await? else { continue };
            let (Some(DeploymentState::Running), Some(_)) = (DeploymentState::parse(&deployment.state), &deployment.image) else { continue };
            let Some(app) = state.store.app(&deployment.app).await? else { continue };
            let (target, number) = match start_instance(state, &app, &deployment, Some(instance.instance), &node_id).await? {
                Ok((target, number, _)) => (target, number),
                Err(reason) => {
                    waiting.entry(node_id.clone()).or_default().push((app.name.clone(), reason));
                    continue;
                }
            };
            tracing::info!(deployment = %deployment.id, from = %node_id, to = %target, instance = number, lost, "replacing an instance");
            if lost {
                // Out of the routes now; stopped on the node whenever it
                // comes back, so two generations never serve together.
                lose_instance(state, &deployment.id, instance.instance, Some(&node_id), now_ms).await?;
                crate::routes::recompute(state).await?;
            }
        }
    }
    Ok(waiting)
}

/// Places a new instance of a deployment that has its image (a replacement
/// for instance `replaced`, or one more for a scale-up), anywhere but
/// `avoid`, spread from the deployment's other instances, and queues its
/// deploy. Returns the target node, the new instance number and why that
/// node, or the scheduler's reason when nothing fits.
pub(super) async fn start_instance(
    state: &AppState,
    app: &AppRow,
    deployment: &DeploymentRow,
    replaced: Option<i64>,
    avoid: &str,
) -> Result<Result<(String, i64, String), String>, ApiError> {
    // With volumes, only their node will do: a replacement elsewhere would
    // start with empty data, so the app waits for that node instead.
    let volumes = state.store.app_volumes(&app.name).await?;
    let pin = match crate::volumes::pin_of(&volumes) {
        Ok(pin) => pin,
        Err(reason) => return Ok(Err(reason)),
    };
    let mut features = if volumes.is_empty() {
        Vec::new()
    } else {
        vec![cloudweb_protocol::features::VOLUMES.to_string()]
    };
    features.extend(super::probe_features(app));
    let request = Request {
        cpu: app.cpu.unwrap_or(DEFAULT_CPU),
        mem_bytes: app.memory_bytes.map(|m| m.max(0) as u64).unwrap_or(DEFAULT_MEMORY),
        features,
        avoid: vec![avoid.to_string()],
        pin,
        spread: super::live_nodes(state, &deployment.id).await?,
    };
    let linked = match crate::service_links::link_env(state, &app.name).await? {
        Ok(linked) => linked,
        Err(reason) => return Ok(Err(reason)),
    };
    let nodes = snapshot(state).await?;
    let target = match scheduler::place(&nodes, &request) {
        Placement::Node(target) => target,
        Placement::Nowhere(reason) => return Ok(Err(reason)),
    };
    let why = scheduler::explain_choice(&nodes, &request, &target);
    let now_ms = state.clock.now_ms();
    let number = state.store.insert_replacement(&deployment.id, replaced, now_ms).await?;
    let mut payload = deploy_payload(state, app, deployment, number, None, &volumes)?;
    payload.env.extend(linked);
    super::place_on(state, &deployment.id, &app.name, number, &target, payload).await?;
    Ok(Ok((target, number, why)))
}

/// Replaces the instances a running deployment lost with its node (the
/// node left or was removed), where there is room. Returns whether every
/// one got a replacement; where none fits, the deployment goes on with its
/// other running instances (the warning says why).
pub async fn replace_lost(state: &AppState, deployment: &DeploymentRow, lost: &[i64], node_id: &str) -> Result<bool, ApiError> {
    let Some(app) = state.store.app(&deployment.app).await? else { return Ok(false) };
    if deployment.image.is_none() {
        return Ok(false);
    }
    let mut all = true;
    for &instance in lost {
        // A drain may have started its replacement already.
        if state.store.replacement_in_progress(&deployment.id, instance, i64::MAX).await? {
            continue;
        }
        match start_instance(state, &app, deployment, Some(instance), node_id).await? {
            Ok((target, number, _)) => {
                tracing::info!(deployment = %deployment.id, from = %node_id, to = %target, instance = number, "replacing an instance of a node that left");
            }
            Err(reason) => {
                tracing::warn!(deployment = %deployment.id, instance, %reason, "no room to replace an instance of a node that left");
                all = false;
            }
        }
    }
    Ok(all)
}

/// Marks an instance replaced on an unreachable node `lost` and, when
/// `node_id` is given, queues that node's `stop` of it (for when it comes
/// back) in the same write, so two generations never serve together.
pub(crate) async fn lose_instance(state: &AppState, deployment_id: &str, instance: i64, node_id: Option<&str>, now_ms: i64) -> Result<(), ApiError> {
    let stop = node_id.map(|node_id| {
        let payload = StopPayload {
            deployment_id: deployment_id.to_string(),
            instance: Some(instance as u32),
            reason: Some("replaced while the node was unreachable".into()),
        };
        crate::store::NewCommand {
            node_id: node_id.to_string(),
            kind: cloudweb_protocol::CommandKind::Stop.as_str().to_string(),
            payload: state.sealer.seal_json(&crate::command_context(node_id), &json!(payload)),
        }
    });
    state.store.lose_instance(deployment_id, instance, stop.as_ref(), now_ms).await?;
    if let Some(node_id) = node_id {
        state.hub.notify(node_id, cloudweb_protocol::events::COMMANDS);
    }
    Ok(())
}
