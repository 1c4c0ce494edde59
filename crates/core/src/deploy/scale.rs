//! Scaling a running app now, not at its next deploy. Up: new instances of
//! the running deployment's image start where the scheduler spreads them
//! (no two on one node while another eligible node has room), each with
//! the scheduler's reason. Down: the surplus (first where the app has the
//! most instances, then the newest) leaves the ingress's routes first and
//! stops after the drain period, once every ingress serves the table
//! without it: the path a replaced instance takes, so no request is sent
//! to an instance that is stopping.

use super::state::DeploymentState;
use super::{moves, DeploymentRow};
use crate::error::ApiError;
use crate::store::{InstanceRow, InstanceUpdate};
use crate::AppState;

/// Most instances per app.
pub const MAX_INSTANCES: u32 = 20;

/// One instance a scale-up started.
#[derive(Debug, Clone)]
pub struct Started {
    pub instance: i64,
    pub node_id: String,
    /// The scheduler's reason for that node.
    pub why: String,
}

/// What a scale did.
#[derive(Debug, Clone, Default)]
pub struct Scaled {
    /// The running deployment that was scaled, if one runs.
    pub deployment: Option<String>,
    /// Instances that ran (or were starting) before.
    pub before: usize,
    pub started: Vec<Started>,
    /// Instances leaving the routes, stopped after the drain period.
    pub draining: Vec<i64>,
    /// Why fewer instances than asked for started (no room).
    pub waiting: Option<String>,
    /// Deployments still on their way, with the count they were requested
    /// with (they keep it; the next deployment uses the new count).
    pub in_flight: Vec<(String, usize)>,
}

/// One scale at a time, so two never count the same instances.
static SCALING: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Sets the app's instance count and brings its running deployment to it.
pub async fn scale(state: &AppState, app_name: &str, instances: u32) -> Result<Scaled, ApiError> {
    if instances == 0 || instances > MAX_INSTANCES {
        return Err(ApiError::BadRequest(format!("invalid instances: must be 1 to {MAX_INSTANCES}")));
    }
    let _one = SCALING.lock().await;
    let Some(app) = state.store.app(app_name).await? else { return Err(ApiError::NotFound(format!("no app {app_name:?}"))) };
    if !state.store.set_app_instances(&app.name, i64::from(instances)).await? {
        return Err(ApiError::NotFound(format!("no app {app_name:?}")));
    }
    let app = crate::store::AppRow { instances: i64::from(instances), ..app };
    let deployments = state.store.app_deployments(&app.name).await?;
    let mut scaled = Scaled::default();
    for d in &deployments {
        if matches!(DeploymentState::parse(&d.state), Some(DeploymentState::Queued | DeploymentState::Building | DeploymentState::Deploying)) {
            let count = state.store.instances(&d.id).await?.iter().filter(|i| i.replaces.is_none()).count();
            scaled.in_flight.push((d.id.clone(), count));
        }
    }
    let Some(running) = deployments.into_iter().find(|d| d.state == DeploymentState::Running.as_str() && d.image.is_some()) else {
        return Ok(scaled);
    };
    scaled.deployment = Some(running.id.clone());
    let serving = serving(&state.store.instances(&running.id).await?);
    scaled.before = serving.len();
    let wanted = instances as usize;
    if wanted > serving.len() {
        for _ in serving.len()..wanted {
            match moves::start_instance(state, &app, &running, None, "").await? {
                Ok((node_id, instance, why)) => {
                    tracing::info!(deployment = %running.id, app = %app.name, instance, node_id = %node_id, %why, "scaled up");
                    scaled.started.push(Started { instance, node_id, why });
                }
                Err(reason) => {
                    tracing::warn!(deployment = %running.id, app = %app.name, %reason, "no room to scale up");
                    scaled.waiting = Some(reason);
                    break;
                }
            }
        }
    } else if wanted < serving.len() {
        scaled.draining = drain(state, &running, &serving, serving.len() - wanted).await?;
    }
    Ok(scaled)
}

/// The instances that serve or are about to: running or starting, and not
/// replaced by another that runs or is starting.
fn serving(instances: &[InstanceRow]) -> Vec<InstanceRow> {
    let live: Vec<&InstanceRow> = instances.iter().filter(|i| matches!(i.state.as_str(), "pending" | "running")).collect();
    let replaced: Vec<i64> = live.iter().filter_map(|i| i.replaces).collect();
    live.into_iter().filter(|i| !replaced.contains(&i.instance)).cloned().collect()
}

/// Takes `count` instances out of the routes and stops them after the
/// drain period: those on the node with the most of them first, newest
/// first among equals.
async fn drain(state: &AppState, deployment: &DeploymentRow, serving: &[InstanceRow], count: usize) -> Result<Vec<i64>, ApiError> {
    let mut order: Vec<&InstanceRow> = serving.iter().collect();
    let on = |node: &Option<String>| serving.iter().filter(|i| i.node_id == *node).count();
    order.sort_by_key(|i| (std::cmp::Reverse(on(&i.node_id)), std::cmp::Reverse(i.instance)));
    let now = state.clock.now_ms();
    let stop_after = now + state.config.drain_period.as_millis() as i64;
    let mut draining = Vec::new();
    for instance in order.into_iter().take(count) {
        let update = match &instance.node_id {
            Some(node) => InstanceUpdate::to("stopping").on(node).stop_after(stop_after),
            // Never placed: nothing to stop.
            None => InstanceUpdate::to("stopped"),
        };
        state.store.update_instance(&deployment.id, instance.instance, update, now).await?;
        draining.push(instance.instance);
    }
    // The table without them; they stop only once every ingress serves it.
    let version = crate::routes::app_changed(state, &deployment.app).await?;
    state.store.set_stop_after_routes(&deployment.id, version as i64).await?;
    tracing::info!(deployment = %deployment.id, app = %deployment.app, instances = ?draining, "scaled down: draining");
    Ok(draining)
}
