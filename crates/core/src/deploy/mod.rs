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
pub mod scale;
mod reports;
pub mod scheduler;
/// The state machine lives below both this module and `git` (which turns
/// states into commit statuses), so neither imports the other for it.
pub use crate::deployment_state as state;
pub use crate::deployment_state::CANCELLED;

pub use reports::{check_report, on_report, stop_acked};

use std::collections::BTreeMap;
use std::time::Duration;

use cloudweb_protocol::{BuildSettings, DeployPayload, GitCredentials, HealthCheck, Limits, Source, SshAccess, StopPayload};
use rand::Rng;
use serde_json::json;

use self::scheduler::{NodeSnapshot, Placement, Request};
use self::state::DeploymentState;
use crate::error::ApiError;
use crate::live::HealthState;
use crate::store::{AppRow, DeploymentRow, InstanceRow, InstanceUpdate, Rescheduled};
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
    /// Run a failed deployment's image again elsewhere: its node left or
    /// lost every instance.
    Reschedule { of: String, image: String },
}

pub fn new_deployment_id() -> String {
    // A simulated run numbers its deployments, so a seed replays them.
    if let Some(n) = crate::store::steps::next_id() {
        return format!("dep_{n:016x}");
    }
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

/// What an app's sealed git column holds: basic credentials for https,
/// and an ssh key with the host keys it trusts. Rows sealed before ssh
/// keys existed hold only the username and password, and still read.
#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct GitAccess {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ssh_key: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub known_hosts: Option<String>,
}

impl GitAccess {
    pub fn is_empty(&self) -> bool {
        self.username.is_none() && self.ssh_key.is_none()
    }
}

/// The decrypted git access of an app (empty when it has none).
pub fn app_git(state: &AppState, app: &AppRow) -> Result<GitAccess, ApiError> {
    match &app.git_credentials_sealed {
        None => Ok(GitAccess::default()),
        Some(sealed) => state
            .sealer
            .open_json::<GitAccess>(&git_context(&app.name), sealed)
            .map_err(|e| ApiError::Internal(format!("app {}: {e}", app.name))),
    }
}

fn build_settings(app: &AppRow) -> Option<BuildSettings> {
    app.build.as_deref().and_then(|json| serde_json::from_str(json).ok())
}

/// Records a deployment and places it. A deployment that cannot be placed
/// is recorded as failed, with the scheduler's explanation as its error.
/// The newest request wins: the app's older deployments that have not run
/// yet are superseded at once and their builds cancelled.
pub async fn create(state: &AppState, app: &AppRow, origin: Origin) -> Result<DeploymentRow, ApiError> {
    create_with(state, app, origin, InFlight::Supersede).await
}

/// What a new deployment does to the app's older ones still in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InFlight {
    /// Supersede them now (cancelling their builds): the default.
    Supersede,
    /// Let them finish (`keep_in_flight`); one that finishes while this one
    /// is still on its way is superseded then, never switched to.
    Keep,
}

pub async fn create_with(state: &AppState, app: &AppRow, origin: Origin, in_flight: InFlight) -> Result<DeploymentRow, ApiError> {
    let row = new_row(app, &origin, state.clock.now_ms());
    let (deployment, superseded) = state.store.insert_deployment(&row, app.instances, in_flight == InFlight::Supersede).await?;
    tracing::info!(deployment = %deployment.id, app = %app.name, kind = %deployment.kind, "deployment queued");
    crate::git::deployment_moved(state, &deployment, DeploymentState::Queued);
    // Their stops go out now, so agents abandon those builds; a kill
    // before this line leaves them to the reconciler's next pass.
    for old in superseded {
        tracing::info!(deployment = %old, newer = %deployment.id, app = %app.name, "a newer deployment was requested; superseded before it ran");
        if let Some(old) = state.store.deployment(&old).await? {
            crate::git::deployment_moved(state, &old, DeploymentState::Superseded);
            for instance in state.store.instances(&old.id).await? {
                if instance.state == "stopping" {
                    stop_instance(state, &instance, "a newer deployment was requested").await?;
                }
            }
        }
    }
    // From code only instance 1 starts (it builds); a built image goes to
    // every instance at once.
    let first_wave: Vec<i64> = match origin {
        Origin::Source { .. } => vec![1],
        Origin::Rollback { .. } | Origin::Reschedule { .. } => (1..=app.instances).collect(),
    };
    place_instances(state, app, &deployment, &first_wave).await?;
    Ok(state.store.deployment(&deployment.id).await?.unwrap_or(deployment))
}

/// A new queued deployment of `app` (its `seq` is given on insert).
fn new_row(app: &AppRow, origin: &Origin, now: i64) -> DeploymentRow {
    let (kind, commit, rollback_of, image) = match origin {
        Origin::Source { commit } => ("source", commit.clone(), None, None),
        Origin::Rollback { of, image } => ("rollback", None, Some(of.clone()), Some(image.clone())),
        Origin::Reschedule { of, image } => ("reschedule", None, Some(of.clone()), Some(image.clone())),
    };
    DeploymentRow {
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
    }
}

/// The nodes of a deployment's placed instances that run or are starting,
/// once per instance (the scheduler's spread).
pub(crate) async fn live_nodes(state: &AppState, deployment_id: &str) -> Result<Vec<String>, ApiError> {
    let instances = state.store.instances(deployment_id).await?;
    Ok(instances.into_iter().filter(|i| matches!(i.state.as_str(), "pending" | "running")).filter_map(|i| i.node_id).collect())
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

/// The feature an agent needs for the app's probes: one with a check
/// other than the health path, or a grace period, runs only on agents
/// that know them (an older agent would refuse the whole deploy).
pub(crate) fn probe_features(app: &AppRow) -> Option<String> {
    let liveness = app
        .liveness
        .as_deref()
        .and_then(|l| serde_json::from_str::<cloudweb_protocol::Liveness>(l).ok());
    let readiness = app
        .readiness
        .as_deref()
        .and_then(|r| serde_json::from_str::<cloudweb_protocol::Readiness>(r).ok());
    let needs = liveness.is_some_and(|l| l.needs_probe_checks())
        || readiness.is_some_and(|r| r.needs_probe_checks());
    needs.then(|| cloudweb_protocol::features::PROBE_CHECKS.to_string())
}

/// Places the given instances and queues their deploy commands. When one
/// cannot be placed the deployment fails with the scheduler's reasons.
async fn place_instances(state: &AppState, app: &AppRow, deployment: &DeploymentRow, instances: &[i64]) -> Result<(), ApiError> {
    let build = if deployment.image.is_none() { build_settings(app) } else { None };
    let mut features = Vec::new();
    if build.is_some() {
        features.push(cloudweb_protocol::features::STATIC_SITES.to_string());
    }
    // An app with volumes runs only where their data is (once it is
    // somewhere), and only on agents that mount volumes.
    let volumes = state.store.app_volumes(&app.name).await?;
    let pin = match crate::volumes::pin_of(&volumes) {
        Ok(pin) => pin,
        Err(reason) => {
            fail(state, deployment, &reason).await?;
            return Ok(());
        }
    };
    if !volumes.is_empty() {
        features.push(cloudweb_protocol::features::VOLUMES.to_string());
    }
    features.extend(probe_features(app));
    // Linked services' connection URLs (where they run now).
    let linked = match crate::service_links::link_env(state, &app.name).await? {
        Ok(env) => env,
        Err(reason) => {
            fail(state, deployment, &reason).await?;
            return Ok(());
        }
    };
    let mut request = Request {
        cpu: app.cpu.unwrap_or(DEFAULT_CPU),
        mem_bytes: app.memory_bytes.map(|m| m.max(0) as u64).unwrap_or(DEFAULT_MEMORY),
        features,
        avoid: Vec::new(),
        pin,
        spread: Vec::new(),
    };
    // An app from a git provider clones with credentials made for this
    // deployment (they travel only in the sealed command).
    let clone = match &deployment.image {
        Some(_) => None,
        None => match crate::git::clone_access(state, app, deployment).await {
            Ok(crate::git::CloneAccess::Ready(clone)) => clone,
            // Left unplaced: the reconciler's next pass asks again.
            Ok(crate::git::CloneAccess::Later(_)) => return Ok(()),
            Err(err) => {
                fail(state, deployment, &format!("cannot get clone credentials from the git provider: {err}")).await?;
                return Ok(());
            }
        },
    };
    // A repository on a self-hosted GitLab behind a private CA: the nodes'
    // git trusts that CA for that host (and only there).
    let ca_pem = match &deployment.image {
        Some(_) => None,
        None => crate::git::repo_ca(state, &app.repo_url).await?,
    };
    for &instance in instances {
        // Each placement sees the reservations of the ones before it, and
        // where the deployment's other instances are.
        let nodes = snapshot(state).await?;
        request.spread = live_nodes(state, &deployment.id).await?;
        match scheduler::place(&nodes, &request) {
            Placement::Node(node_id) => {
                let mut volumes = volumes.clone();
                if !volumes.is_empty() && request.pin.is_none() {
                    // The first placement of these volumes: their data
                    // lives on this node from now on.
                    volumes = state.store.pin_volumes(&app.name, &node_id).await?;
                    match crate::volumes::pin_of(&volumes) {
                        Ok(Some(pin)) if pin.node == node_id => {
                            tracing::info!(app = %app.name, node_id = %node_id, "the app's volumes are on this node from now on");
                            request.pin = Some(pin);
                        }
                        // Pinned elsewhere meanwhile (an attach, a move):
                        // the next pass places it with the new pin.
                        _ => return Ok(()),
                    }
                }
                let mut payload = deploy_payload(state, app, deployment, instance, build.clone(), &volumes)?;
                payload.env.extend(linked.clone());
                if let Some(source) = payload.source.as_mut() {
                    if let Some(clone) = &clone {
                        source.credentials = Some(clone.clone());
                    }
                    source.ca_pem = ca_pem.clone();
                }
                if place_on(state, &deployment.id, &app.name, instance, &node_id, payload).await?.is_some() {
                    tracing::info!(deployment = %deployment.id, instance, node_id = %node_id, why = %scheduler::explain_choice(&nodes, &request, &node_id), "instance placed");
                }
            }
            Placement::Nowhere(reason) => {
                let message = if build.is_some() && reason.contains("static-sites") {
                    format!("{reason} (this app has explicit build settings, which need agents that report static-sites)")
                } else {
                    reason
                };
                // A node that just joined, or one about to be undrained,
                // may take it in a moment: wait a bounded time (from when
                // the deployment entered its current state) before failing.
                // The reconciler tries again every second.
                let waited = state.clock.now_ms() - deployment.updated_at;
                if waited < state.config.placement_wait.as_millis() as i64 {
                    // Said once; the retries every second stay quiet.
                    if waited < 1_000 {
                        tracing::info!(deployment = %deployment.id, instance, reason = %message, "no node can take the instance yet; it waits");
                    } else {
                        tracing::debug!(deployment = %deployment.id, instance, reason = %message, "still no node for the instance");
                    }
                    return Ok(());
                }
                fail(state, deployment, &message).await?;
                return Ok(());
            }
        }
    }
    Ok(())
}

/// Places instance `instance` on `node_id` and queues its deploy command
/// in the same transaction; returns the container name it got, or `None`
/// when another path placed the instance first (nothing is queued then).
pub async fn place_on(
    state: &AppState,
    deployment_id: &str,
    app: &str,
    instance: i64,
    node_id: &str,
    mut payload: DeployPayload,
) -> Result<Option<String>, ApiError> {
    let now = state.clock.now_ms();
    let container = state
        .store
        .assign_instance(deployment_id, app, instance, node_id, now, |container| {
            payload.container = Some(container.to_string());
            let value = serde_json::to_value(&payload).expect("payload serializes");
            crate::store::NewCommand {
                node_id: node_id.to_string(),
                kind: cloudweb_protocol::CommandKind::Deploy.as_str().to_string(),
                payload: state.sealer.seal_json(&crate::command_context(node_id), &value),
            }
        })
        .await?;
    if container.is_some() {
        state.hub.notify(node_id, cloudweb_protocol::events::COMMANDS);
    }
    Ok(container)
}

pub fn deploy_payload(
    state: &AppState,
    app: &AppRow,
    deployment: &DeploymentRow,
    instance: i64,
    build: Option<BuildSettings>,
    volumes: &[crate::store::VolumeRow],
) -> Result<DeployPayload, ApiError> {
    let env = app_env(state, app)?;
    let source = match &deployment.image {
        Some(_) => None,
        None => {
            let git = app_git(state, app)?;
            let credentials = match (git.username, git.password) {
                (Some(username), Some(password)) => Some(GitCredentials { username, password }),
                _ => None,
            };
            let ssh = match (git.ssh_key, git.known_hosts) {
                (Some(private_key), Some(known_hosts)) => Some(SshAccess { private_key, known_hosts }),
                _ => None,
            };
            Some(Source {
                repo_url: app.repo_url.clone(),
                branch: app.branch.clone(),
                commit: deployment.commit_sha.clone(),
                credentials,
                ssh,
                allow_private_hosts: state.config.allows_private_git(&app.repo_url),
                ca_pem: None,
            })
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
        build_timeout_seconds: match &deployment.image {
            Some(_) => None,
            None => app.build_timeout_s.map(|s| s.clamp(1, i64::from(cloudweb_protocol::deploy::MAX_BUILD_TIMEOUT_SECONDS)) as u32),
        },
        volumes: crate::volumes::mounts(volumes),
        recreate: app.rollout == "recreate",
        liveness: app.liveness.as_deref().and_then(|l| serde_json::from_str(l).ok()),
        readiness: app.readiness.as_deref().and_then(|r| serde_json::from_str(r).ok()),
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
    if from.is_terminal() {
        // A report that raced the end (a cancelled build's failure, say).
        tracing::debug!(deployment = %deployment.id, from = %from, to = %to, "the deployment has ended; the report changes nothing");
        return Ok(false);
    }
    if from.is_behind(to) {
        // A retried command reports a step the deployment has passed.
        tracing::debug!(deployment = %deployment.id, from = %from, to = %to, "a late report of an earlier step; the deployment stays");
        return Ok(false);
    }
    if let Err(illegal) = from.transition(to) {
        tracing::warn!(deployment = %deployment.id, %illegal, "ignored an illegal transition");
        return Ok(false);
    }
    let moved = state.store.transition_deployment(&deployment.id, from.as_str(), to.as_str(), error, image, state.clock.now_ms()).await?;
    if moved {
        tracing::info!(deployment = %deployment.id, app = %deployment.app, from = %from, to = %to, "deployment state");
        crate::git::deployment_moved(state, deployment, to);
    }
    Ok(moved)
}

/// Fails a deployment and stops whatever of it already started.
pub async fn fail(state: &AppState, deployment: &DeploymentRow, reason: &str) -> Result<(), ApiError> {
    fail_and_stop(state, deployment, reason, false).await.map(|_| ())
}

/// Cancels an unfinished deployment: it fails with [`CANCELLED`] and its
/// nodes get a stop at once, which makes an agent abandon the build or
/// start in progress. Returns false when the deployment had already
/// finished (another path moved it first).
pub async fn cancel(state: &AppState, deployment: &DeploymentRow) -> Result<bool, ApiError> {
    fail_and_stop(state, deployment, CANCELLED, true).await
}

/// Moves the deployment to failed; its placed instances stop after no
/// drain (queued now when `stop_now`, else by the next reconcile pass).
async fn fail_and_stop(state: &AppState, deployment: &DeploymentRow, reason: &str, stop_now: bool) -> Result<bool, ApiError> {
    if !transition(state, deployment, DeploymentState::Failed, Some(reason), None).await? {
        return Ok(false);
    }
    tracing::warn!(deployment = %deployment.id, app = %deployment.app, %reason, "deployment failed");
    let now = state.clock.now_ms();
    for instance in state.store.instances(&deployment.id).await? {
        match (instance.state.as_str(), &instance.node_id) {
            ("pending" | "running", Some(_)) if stop_now => {
                stop_instance(state, &instance, reason).await?;
            }
            ("pending" | "running", Some(node)) => {
                state.store.update_instance(&deployment.id, instance.instance, InstanceUpdate::to("stopping").on(node).stop_after(now), now).await?;
            }
            ("pending", None) => {
                state.store.update_instance(&deployment.id, instance.instance, InstanceUpdate::to("failed"), now).await?;
            }
            _ => {}
        }
    }
    Ok(true)
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
    state.store.update_instance(deployment_id, replaced, InstanceUpdate::to("stopping").stop_after(stop_after), now).await?;
    let version = crate::routes::recompute(state).await?;
    state.store.set_stop_after_routes(deployment_id, version as i64).await?;
    Ok(())
}

/// One pass of the reconciler: queue the stops that are due.
pub async fn reconcile(state: &AppState) -> Result<(), ApiError> {
    // The mesh relay follows liveness: when it changes (the relay went
    // unreachable, or the first choice), every node fetches its peers.
    if state.nodes.update_relay(tokio::time::Instant::now(), state.config.unreachable_after) {
        state.hub.notify_all(cloudweb_protocol::events::PEERS);
    }
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
    place_waiting(state).await?;
    fail_stuck_on_lost_nodes(state).await?;
    recover_running_without_instances(state).await?;
    crate::routes::recompute(state).await?;
    Ok(())
}

/// Tries again to place the instances that found no node, and fails their
/// deployment once the placement wait is over.
async fn place_waiting(state: &AppState) -> Result<(), ApiError> {
    let mut by_deployment: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    for instance in state.store.unplaced_instances().await? {
        by_deployment.entry(instance.deployment_id).or_default().push(instance.instance);
    }
    for (id, instances) in by_deployment {
        let Some(deployment) = state.store.deployment(&id).await? else { continue };
        let Some(app) = state.store.app(&deployment.app).await? else { continue };
        // From code, only instance 1 goes out before the image exists (it
        // builds it); the others follow once it does.
        let due: Vec<i64> = match deployment.image {
            Some(_) => instances,
            None => instances.into_iter().filter(|&i| i == 1).collect(),
        };
        if !due.is_empty() {
            place_instances(state, &app, &deployment, &due).await?;
        }
    }
    Ok(())
}

/// An unfinished deployment whose instance sits on a node that is
/// unreachable (or gone) would wait forever for a report. When its image
/// exists already (a rollback, a reschedule, a build that was pushed) the
/// instance starts again on another node; otherwise, or when no node has
/// room, the deployment fails. Either way it settles within the unreachable
/// period plus a tick. The node is told to stop its copy, in case it comes
/// back.
async fn fail_stuck_on_lost_nodes(state: &AppState) -> Result<(), ApiError> {
    let now = tokio::time::Instant::now();
    for (instance, deployment) in state.store.placed_unfinished_instances().await? {
        let Some(node_id) = instance.node_id.as_deref() else { continue };
        let lost = match state.nodes.get(node_id) {
            None => Some(format!("node {node_id} is no longer registered")),
            Some(node) if node.state(now, state.config.unreachable_after) == crate::live::NodeState::Unreachable => {
                Some(format!("node {} ({node_id}) became unreachable", node.name))
            }
            Some(_) => None,
        };
        let Some(lost) = lost else { continue };
        let mut reason = format!("{lost} while the deployment was {}", deployment.state);
        if deployment.image.is_some() {
            if let Some(app) = state.store.app(&deployment.app).await? {
                match moves::start_instance(state, &app, &deployment, Some(instance.instance), node_id).await? {
                    Ok((target, number, _)) => {
                        let now_ms = state.clock.now_ms();
                        let told = state.nodes.get(node_id).is_some().then_some(node_id);
                        moves::lose_instance(state, &deployment.id, instance.instance, told, now_ms).await?;
                        tracing::info!(deployment = %deployment.id, from = %node_id, to = %target, instance = number, %reason, "re-placed an unfinished instance");
                        continue;
                    }
                    Err(nowhere) => reason = format!("{reason}, and {nowhere}"),
                }
            }
        }
        fail(state, &deployment, &format!("{reason}; deploy again")).await?;
    }
    Ok(())
}

/// How long a running deployment may have no running (or starting)
/// instance before it is failed and its image started again elsewhere.
pub const NO_INSTANCE_LIMIT_MS: i64 = 60_000;

/// A running deployment that lost all its instances (they failed, or their
/// node left) is not left "running": after [`NO_INSTANCE_LIMIT_MS`] it
/// becomes failed, and its image is started again wherever there is room.
async fn recover_running_without_instances(state: &AppState) -> Result<(), ApiError> {
    let cutoff = state.clock.now_ms() - NO_INSTANCE_LIMIT_MS;
    for deployment in state.store.running_without_instances(cutoff).await? {
        fail_and_reschedule(state, &deployment, "no instance of this deployment runs any more").await?;
    }
    Ok(())
}

/// A running deployment that has nothing left running: when it is still
/// the app's newest deployment it fails and its image starts again as a
/// new `reschedule` deployment (placed where there is room, after the same
/// bounded wait as any deployment); the failure and the queued reschedule
/// are one write, so a kill between them cannot leave the app with nothing
/// running and nothing on its way. When a newer deployment is on its way
/// it is left as it is: that one takes over, or, should it fail, the next
/// pass starts this one again. Returns what happened.
async fn fail_and_reschedule(state: &AppState, deployment: &DeploymentRow, reason: &str) -> Result<Rescheduled, ApiError> {
    let app = state.store.app(&deployment.app).await?;
    let (Some(app), Some(image)) = (app, deployment.image.clone()) else {
        transition(state, deployment, DeploymentState::Failed, Some(reason), None).await?;
        return Ok(Rescheduled::Ended);
    };
    let again = new_row(&app, &Origin::Reschedule { of: deployment.id.clone(), image }, state.clock.now_ms());
    let outcome = state.store.fail_and_reschedule(&deployment.id, reason, &again, app.instances).await?;
    let Rescheduled::Queued(again) = outcome else { return Ok(outcome) };
    tracing::warn!(deployment = %deployment.id, app = %deployment.app, %reason, "running deployment failed");
    crate::git::deployment_moved(state, deployment, DeploymentState::Failed);
    crate::git::deployment_moved(state, &again, DeploymentState::Queued);
    // A kill before the placement leaves the instances to the
    // reconciler's next pass, like any unplaced instance.
    place_instances(state, &app, &again, &(1..=app.instances).collect::<Vec<_>>()).await?;
    let again = state.store.deployment(&again.id).await?.unwrap_or(again);
    tracing::info!(deployment = %again.id, of = %deployment.id, app = %app.name, state = %again.state, "started the failed deployment's image again");
    Ok(Rescheduled::Queued(again))
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
    state.store.update_instance(&instance.deployment_id, instance.instance, InstanceUpdate::to("stopped"), now).await?;
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

/// What a forced leave or removal did to the node's deployments.
#[derive(Debug, Default)]
pub struct NodeLoss {
    /// Deployments now `failed`.
    pub failed: Vec<String>,
    /// Deployments whose image starts again elsewhere: a new `reschedule`
    /// deployment for a failed one, or the same deployment when it still
    /// runs on other nodes and only the lost instance is replaced.
    pub rescheduled: Vec<String>,
}

/// A node leaves or is removed by force while instances are placed there.
/// Its instances become failed; an unfinished deployment fails; a running
/// deployment that still runs elsewhere gets a replacement instance (where
/// there is room), and one that ran only there fails and its image starts
/// again as a new deployment (spec: the node's deployments become failed,
/// and the app is not left without an instance).
pub async fn fail_node_instances(state: &AppState, node_id: &str, reason: &str) -> Result<NodeLoss, ApiError> {
    let now = state.clock.now_ms();
    let mut affected: Vec<(String, Vec<i64>)> = Vec::new();
    for instance in state.store.active_instances().await? {
        if instance.node_id.as_deref() != Some(node_id) {
            continue;
        }
        state.store.update_instance(&instance.deployment_id, instance.instance, InstanceUpdate::to("failed"), now).await?;
        match affected.iter_mut().find(|(id, _)| *id == instance.deployment_id) {
            Some((_, numbers)) => numbers.push(instance.instance),
            None => affected.push((instance.deployment_id.clone(), vec![instance.instance])),
        }
    }
    let mut loss = NodeLoss::default();
    for (id, lost) in &affected {
        let Some(deployment) = state.store.deployment(id).await? else { continue };
        match DeploymentState::parse(&deployment.state) {
            Some(DeploymentState::Running) => {
                // Instances elsewhere that run or are starting (a drain's
                // replacement) keep the deployment going.
                let others_run = state.store.instances(id).await?.iter().any(|i| matches!(i.state.as_str(), "running" | "pending"));
                if others_run {
                    if moves::replace_lost(state, &deployment, lost, node_id).await? {
                        loss.rescheduled.push(id.clone());
                    }
                } else {
                    match fail_and_reschedule(state, &deployment, reason).await? {
                        Rescheduled::Queued(again) => {
                            loss.rescheduled.push(again.id);
                            loss.failed.push(id.clone());
                        }
                        Rescheduled::Ended => loss.failed.push(id.clone()),
                        // A newer deployment takes over (or, failing, this
                        // one starts again at the next reconcile pass).
                        Rescheduled::NewerOnItsWay => {}
                    }
                }
            }
            Some(DeploymentState::Queued | DeploymentState::Building | DeploymentState::Deploying) => {
                fail(state, &deployment, reason).await?;
                loss.failed.push(id.clone());
            }
            // Superseded or failed already: its instance there was on its
            // way out anyway.
            _ => {}
        }
    }
    crate::routes::recompute(state).await?;
    Ok(loss)
}
