//! Deployments: from a request (a push, the redeploy button, a rollback) to
//! instances running on nodes, and from there to the previous deployment
//! being replaced.
//!
//! - [`create`] records a deployment and places its first instances;
//! - [`on_report`] moves the deployment along as agents report progress;
//! - [`reconcile`] runs every second and sends the stops whose drain period
//!   has passed (and anything a restart left half done).
//!
//! A deploy from code builds once, on the node of instance 1, which pushes
//! the image to the cluster registry; the other instances (and any later
//! rollback or reschedule) run that image without building.

pub mod moves;
pub mod scheduler;
pub mod state;

use std::collections::BTreeMap;
use std::time::Duration;

use cloudweb_protocol::{BuildSettings, DeployPayload, GitCredentials, HealthCheck, Limits, Report, Source, StopPayload};
use rand::Rng;
use serde_json::json;

use self::scheduler::{NodeSnapshot, Placement, Request};
use self::state::DeploymentState;
use crate::error::ApiError;
use crate::live::HealthState;
use crate::store::{AppRow, DeploymentRow, InstanceRow};
use crate::AppState;

/// What an instance reserves when its app sets no limits.
pub const DEFAULT_CPU: f64 = 0.25;
pub const DEFAULT_MEMORY: u64 = 256 << 20;

/// How a deployment gets its image.
#[derive(Debug, Clone)]
pub enum Origin {
    /// Build this commit (the branch head when `None`).
    Source { commit: Option<String> },
    /// Run the image of an earlier deployment.
    Rollback { of: String, image: String },
}

pub fn new_deployment_id() -> String {
    let bytes: [u8; 8] = rand::rng().random();
    format!("dep_{}", hex::encode(bytes))
}

/// The decrypted environment of an app.
pub fn app_env(state: &AppState, app: &AppRow) -> Result<BTreeMap<String, String>, ApiError> {
    match &app.env_sealed {
        None => Ok(BTreeMap::new()),
        Some(sealed) => state
            .sealer
            .open_json(&env_context(&app.name), sealed)
            .map_err(|e| ApiError::Internal(format!("app {}: {e}", app.name))),
    }
}

pub fn env_context(app: &str) -> String {
    format!("app-env:{app}")
}

pub fn git_context(app: &str) -> String {
    format!("app-git:{app}")
}

fn build_settings(app: &AppRow) -> Option<BuildSettings> {
    app.build.as_deref().and_then(|json| serde_json::from_str(json).ok())
}

/// Records a deployment and places it. A deployment that cannot be placed
/// is recorded as failed, with the scheduler's explanation as its error.
pub async fn create(state: &AppState, app: &AppRow, origin: Origin) -> Result<DeploymentRow, ApiError> {
    let now = state.clock.now_ms();
    let (kind, commit, rollback_of, image) = match &origin {
        Origin::Source { commit } => ("source", commit.clone(), None, None),
        Origin::Rollback { of, image } => ("rollback", None, Some(of.clone()), Some(image.clone())),
    };
    let row = DeploymentRow {
        id: new_deployment_id(),
        seq: 0,
        app: app.name.clone(),
        kind: kind.to_string(),
        commit_sha: commit,
        rollback_of,
        state: DeploymentState::Queued.as_str().to_string(),
        image,
        error: None,
        created_at: now,
        updated_at: now,
    };
    let deployment = state.store.insert_deployment(&row, app.instances).await?;
    tracing::info!(deployment = %deployment.id, app = %app.name, kind, "deployment queued");
    // From code only instance 1 starts (it builds); a built image goes to
    // every instance at once.
    let first_wave: Vec<i64> = match origin {
        Origin::Source { .. } => vec![1],
        Origin::Rollback { .. } => (1..=app.instances).collect(),
    };
    place_instances(state, app, &deployment, &first_wave).await?;
    Ok(state.store.deployment(&deployment.id).await?.unwrap_or(deployment))
}

/// A snapshot of every node for the scheduler: state, health, features,
/// capacity, and what active instances reserve.
pub async fn snapshot(state: &AppState) -> Result<Vec<NodeSnapshot>, ApiError> {
    let now = tokio::time::Instant::now();
    let reservations = state.store.reservations().await?;
    let mut nodes: Vec<NodeSnapshot> = state
        .nodes
        .all()
        .into_iter()
        .map(|live| {
            let capacity = live.capacity;
            NodeSnapshot {
                id: live.id.clone(),
                name: live.name.clone(),
                state: live.state(now, state.config.unreachable_after).as_str(),
                degraded: match live.health_state(now) {
                    HealthState::Degraded(reason) => Some(reason),
                    _ => None,
                },
                features: live.current_health(now).and_then(|h| h.features.clone()).unwrap_or_default(),
                version: live.agent_version.clone(),
                cpu_cores: capacity.map(|c| f64::from(c.cpu_cores)).unwrap_or(0.0),
                mem_bytes: capacity.map(|c| c.mem_bytes).unwrap_or(0),
                cpu_reserved: 0.0,
                mem_reserved: 0,
                instances: 0,
            }
        })
        .collect();
    for (node_id, cpu, memory) in reservations {
        if let Some(node) = nodes.iter_mut().find(|n| n.id == node_id) {
            node.cpu_reserved += cpu.unwrap_or(DEFAULT_CPU);
            node.mem_reserved += memory.map(|m| m.max(0) as u64).unwrap_or(DEFAULT_MEMORY);
            node.instances += 1;
        }
    }
    nodes.sort_by(|a, b| a.id.cmp(&b.id));
    Ok(nodes)
}

/// Places the given instances and queues their deploy commands. When one
/// cannot be placed the deployment fails with the scheduler's reasons.
async fn place_instances(state: &AppState, app: &AppRow, deployment: &DeploymentRow, instances: &[i64]) -> Result<(), ApiError> {
    let build = if deployment.image.is_none() { build_settings(app) } else { None };
    let mut features = Vec::new();
    if build.is_some() {
        features.push(cloudweb_protocol::features::STATIC_SITES.to_string());
    }
    let request = Request {
        cpu: app.cpu.unwrap_or(DEFAULT_CPU),
        mem_bytes: app.memory_bytes.map(|m| m.max(0) as u64).unwrap_or(DEFAULT_MEMORY),
        features,
        avoid: Vec::new(),
    };
    for &instance in instances {
        // Each placement sees the reservations of the ones before it.
        let nodes = snapshot(state).await?;
        match scheduler::place(&nodes, &request) {
            Placement::Node(node_id) => {
                let now = state.clock.now_ms();
                let container = state.store.assign_instance(&deployment.id, &app.name, instance, &node_id, now).await?;
                let mut payload = deploy_payload(state, app, deployment, instance, build.clone())?;
                payload.container = Some(container);
                crate::queue_command(state, &node_id, cloudweb_protocol::CommandKind::Deploy, &serde_json::to_value(&payload).expect("payload serializes")).await?;
                tracing::info!(deployment = %deployment.id, instance, node_id = %node_id, "instance placed");
            }
            Placement::Nowhere(reason) => {
                let message = if build.is_some() && reason.contains("static-sites") {
                    format!("{reason} (this app has explicit build settings, which need agents that report static-sites)")
                } else {
                    reason
                };
                fail(state, deployment, &message).await?;
                return Ok(());
            }
        }
    }
    Ok(())
}

pub(crate) fn deploy_payload(
    state: &AppState,
    app: &AppRow,
    deployment: &DeploymentRow,
    instance: i64,
    build: Option<BuildSettings>,
) -> Result<DeployPayload, ApiError> {
    let env = app_env(state, app)?;
    let source = match &deployment.image {
        Some(_) => None,
        None => {
            let credentials = match &app.git_credentials_sealed {
                Some(sealed) => Some(
                    state
                        .sealer
                        .open_json::<GitCredentials>(&git_context(&app.name), sealed)
                        .map_err(|e| ApiError::Internal(format!("app {}: {e}", app.name)))?,
                ),
                None => None,
            };
            Some(Source { repo_url: app.repo_url.clone(), branch: app.branch.clone(), commit: deployment.commit_sha.clone(), credentials })
        }
    };
    Ok(DeployPayload {
        deployment_id: deployment.id.clone(),
        app: app.name.clone(),
        instance: instance as u32,
        container: None,
        source,
        env,
        port: app.port as u16,
        strategy: match &deployment.image {
            Some(_) => None,
            None => serde_json::from_value(serde_json::Value::String(app.strategy.clone())).ok(),
        },
        build,
        image: deployment.image.clone(),
        limits: Limits { cpu: app.cpu, memory_bytes: app.memory_bytes.map(|m| m.max(0) as u64) },
        health: HealthCheck { path: app.health_path.clone(), timeout_seconds: app.health_timeout_s as u32 },
    })
}

/// Moves a deployment to `to`, checking the state machine. Returns false
/// when another path got there first (the state changed under us).
async fn transition(state: &AppState, deployment: &DeploymentRow, to: DeploymentState, error: Option<&str>, image: Option<&str>) -> Result<bool, ApiError> {
    let from = DeploymentState::parse(&deployment.state)
        .ok_or_else(|| ApiError::Internal(format!("deployment {} has unknown state {}", deployment.id, deployment.state)))?;
    if from == to {
        return Ok(false);
    }
    if let Err(illegal) = from.transition(to) {
        tracing::warn!(deployment = %deployment.id, %illegal, "ignored an illegal transition");
        return Ok(false);
    }
    let moved = state.store.transition_deployment(&deployment.id, from.as_str(), to.as_str(), error, image, state.clock.now_ms()).await?;
    if moved {
        tracing::info!(deployment = %deployment.id, app = %deployment.app, from = %from, to = %to, "deployment state");
    }
    Ok(moved)
}

/// Fails a deployment and stops whatever of it already started.
pub async fn fail(state: &AppState, deployment: &DeploymentRow, reason: &str) -> Result<(), ApiError> {
    if !transition(state, deployment, DeploymentState::Failed, Some(reason), None).await? {
        return Ok(());
    }
    tracing::warn!(deployment = %deployment.id, app = %deployment.app, %reason, "deployment failed");
    let now = state.clock.now_ms();
    for instance in state.store.instances(&deployment.id).await? {
        match (instance.state.as_str(), &instance.node_id) {
            ("pending" | "running", Some(node)) => {
                state.store.update_instance(&deployment.id, instance.instance, Some(node), "stopping", None, Some(now), now).await?;
            }
            ("pending", None) => {
                state.store.update_instance(&deployment.id, instance.instance, None, "failed", None, None, now).await?;
            }
            _ => {}
        }
    }
    Ok(())
}

/// Applies an agent's report about one of its instances.
pub async fn on_report(state: &AppState, node_id: &str, report: &Report) -> Result<(), ApiError> {
    let Some(reported) = report.state.as_deref() else { return Ok(()) };
    let Some(deployment) = state.store.deployment(&report.deployment_id).await? else {
        tracing::debug!(deployment = %report.deployment_id, "report for an unknown deployment");
        return Ok(());
    };
    let app = deployment.app.clone();
    let instance_no = i64::from(report.instance.unwrap_or(1));
    let instances = state.store.instances(&deployment.id).await?;
    let Some(instance) = instances.iter().find(|i| i.instance == instance_no) else {
        return Err(ApiError::BadRequest(format!("deployment {} has no instance {instance_no}", deployment.id)));
    };
    if instance.node_id.as_deref() != Some(node_id) {
        return Err(ApiError::Forbidden(format!("instance {instance_no} of {} is not placed on this node", deployment.id)));
    }
    let now = state.clock.now_ms();
    match reported {
        // A replacement instance of a deployment that already runs moves
        // only its own state.
        "building" | "deploying" if DeploymentState::parse(&deployment.state) == Some(DeploymentState::Running) => {}
        "building" => {
            transition(state, &deployment, DeploymentState::Building, None, None).await?;
        }
        "deploying" => {
            let image = report.image.as_deref();
            let had_image = deployment.image.is_some();
            transition(state, &deployment, DeploymentState::Deploying, None, image).await?;
            // The image exists now: start the other instances with it.
            if let (false, Some(image)) = (had_image, image) {
                state.store.set_deployment_image(&deployment.id, image, now).await?;
                let waiting: Vec<i64> = instances.iter().filter(|i| i.node_id.is_none() && i.state == "pending").map(|i| i.instance).collect();
                if !waiting.is_empty() {
                    if let Some(app) = state.store.app(&deployment.app).await? {
                        let deployment = state.store.deployment(&deployment.id).await?.unwrap_or(deployment.clone());
                        place_instances(state, &app, &deployment, &waiting).await?;
                    }
                }
            }
        }
        "running" => {
            state.store.update_instance(&deployment.id, instance_no, Some(node_id), "running", report.address.as_deref(), None, now).await?;
            if let Some(replaced) = instance.replaces {
                retire_replaced(state, &deployment.id, replaced).await?;
            }
            let instances = state.store.instances(&deployment.id).await?;
            let live: Vec<_> = instances.iter().filter(|i| matches!(i.state.as_str(), "pending" | "running")).collect();
            let all_running = !live.is_empty() && live.iter().all(|i| i.state == "running");
            if all_running {
                let deployment = state.store.deployment(&deployment.id).await?.unwrap_or(deployment);
                if transition(state, &deployment, DeploymentState::Running, None, None).await? {
                    supersede_others(state, &deployment).await?;
                }
            }
        }
        "failed" => {
            state.store.update_instance(&deployment.id, instance_no, Some(node_id), "failed", None, None, now).await?;
            let reason = report.message.clone().unwrap_or_else(|| format!("instance {instance_no} failed"));
            if DeploymentState::parse(&deployment.state) == Some(DeploymentState::Running) {
                tracing::warn!(deployment = %deployment.id, %reason, "an instance of a running deployment failed");
            } else {
                fail(state, &deployment, &reason).await?;
            }
        }
        "stopped" => {
            if !matches!(instance.state.as_str(), "failed") {
                state.store.update_instance(&deployment.id, instance_no, Some(node_id), "stopped", None, None, now).await?;
            }
        }
        other => return Err(ApiError::BadRequest(format!("unknown instance state {other:?}"))),
    }
    crate::routes::app_changed(state, &app).await?;
    Ok(())
}

/// Marks the app's other running deployments superseded and schedules
/// their instances to stop once the drain period has passed.
async fn supersede_others(state: &AppState, current: &DeploymentRow) -> Result<(), ApiError> {
    let now = state.clock.now_ms();
    let stop_after = now + state.config.drain_period.as_millis() as i64;
    for old in state.store.app_deployments(&current.app).await? {
        if old.id == current.id || DeploymentState::parse(&old.state) != Some(DeploymentState::Running) {
            continue;
        }
        if transition(state, &old, DeploymentState::Superseded, None, None).await? {
            for instance in state.store.instances(&old.id).await? {
                if matches!(instance.state.as_str(), "running" | "pending") {
                    state.store.update_instance(&old.id, instance.instance, None, "stopping", None, Some(stop_after), now).await?;
                }
            }
            // The table without the old instances; they stop only once
            // every ingress serves it.
            let version = crate::routes::app_changed(state, &current.app).await?;
            state.store.set_stop_after_routes(&old.id, version as i64).await?;
        }
    }
    Ok(())
}

/// How long past its drain period a replaced instance waits for a lagging
/// ingress before it is stopped anyway.
const INGRESS_WAIT_LIMIT_MS: i64 = 60_000;

/// Whether every ready ingress node serves route table `version` or newer.
fn ingress_caught_up(state: &AppState, version: i64) -> bool {
    let now = tokio::time::Instant::now();
    state
        .nodes
        .all()
        .iter()
        .filter(|n| n.ingress && n.state(now, state.config.unreachable_after) != crate::live::NodeState::Unreachable)
        .all(|n| n.ingress_status.as_ref().is_some_and(|s| s.routes_version as i64 >= version))
}

/// Once its replacement runs, a replaced instance (on a draining node)
/// leaves the routes and stops after the drain period.
async fn retire_replaced(state: &AppState, deployment_id: &str, replaced: i64) -> Result<(), ApiError> {
    let now = state.clock.now_ms();
    let Some(old) = state.store.instances(deployment_id).await?.into_iter().find(|i| i.instance == replaced) else { return Ok(()) };
    if old.state != "running" {
        return Ok(());
    }
    let stop_after = now + state.config.drain_period.as_millis() as i64;
    state.store.update_instance(deployment_id, replaced, None, "stopping", None, Some(stop_after), now).await?;
    let version = crate::routes::recompute(state).await?;
    state.store.set_stop_after_routes(deployment_id, version as i64).await?;
    Ok(())
}

/// One pass of the reconciler: queue the stops that are due.
pub async fn reconcile(state: &AppState) -> Result<(), ApiError> {
    let now = state.clock.now_ms();
    for instance in state.store.instances_to_stop(now).await? {
        if let Some(version) = instance.stop_after_routes {
            if !ingress_caught_up(state, version) {
                let overdue = instance.stop_after.is_some_and(|at| now > at + INGRESS_WAIT_LIMIT_MS);
                if !overdue {
                    continue;
                }
                tracing::warn!(deployment = %instance.deployment_id, version, "an ingress node has not applied the route table; stopping the old instance anyway");
            }
        }
        stop_instance(state, &instance, "replaced").await?;
    }
    let waiting = moves::move_instances(state).await?;
    *state.waiting.lock().expect("waiting lock") = waiting;
    crate::routes::recompute(state).await?;
    Ok(())
}

async fn stop_instance(state: &AppState, instance: &InstanceRow, reason: &str) -> Result<(), ApiError> {
    let now = state.clock.now_ms();
    if let Some(node_id) = &instance.node_id {
        let payload = StopPayload {
            deployment_id: instance.deployment_id.clone(),
            instance: Some(instance.instance as u32),
            reason: Some(reason.to_string()),
        };
        crate::queue_command(state, node_id, cloudweb_protocol::CommandKind::Stop, &json!(payload)).await?;
    }
    // The stop is in the node's durable queue: it will happen.
    state.store.update_instance(&instance.deployment_id, instance.instance, None, "stopped", None, None, now).await?;
    Ok(())
}

/// Runs [`reconcile`] every second until the task is aborted.
pub async fn reconciler(state: std::sync::Arc<AppState>) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if let Err(err) = reconcile(&state).await {
            tracing::error!(error = %err, "reconcile pass failed");
        }
    }
}

/// Queues a stop for every instance an app still runs (before the app is
/// deleted).
pub async fn stop_app(state: &AppState, app: &str) -> Result<(), ApiError> {
    for deployment in state.store.app_deployments(app).await? {
        for instance in state.store.instances(&deployment.id).await? {
            if matches!(instance.state.as_str(), "pending" | "running" | "stopping") {
                stop_instance(state, &instance, "app deleted").await?;
            }
        }
    }
    Ok(())
}

/// Marks every active instance on a node failed (the node is leaving or
/// being removed by force) and fails the deployments that had not finished.
/// Returns the affected deployments.
pub async fn fail_node_instances(state: &AppState, node_id: &str, reason: &str) -> Result<Vec<String>, ApiError> {
    let now = state.clock.now_ms();
    let mut affected = Vec::new();
    for instance in state.store.active_instances().await? {
        if instance.node_id.as_deref() != Some(node_id) {
            continue;
        }
        state.store.update_instance(&instance.deployment_id, instance.instance, None, "failed", None, None, now).await?;
        if !affected.contains(&instance.deployment_id) {
            affected.push(instance.deployment_id.clone());
        }
    }
    for id in &affected {
        if let Some(deployment) = state.store.deployment(id).await? {
            fail(state, &deployment, reason).await?;
        }
    }
    Ok(affected)
}
