//! The autoscaler (leader only). Every `--autoscale-interval-seconds` it
//! looks at each app with autoscaling on and a running deployment: it
//! measures the app's metric per running instance (CPU from the nodes'
//! latest usage samples, in percent of the cores each instance requests;
//! or requests per second through the ingress over the last minute, from
//! the traffic samples of the app's hosts), turns it into a
//! recommendation and a decision ([`policy`]), and scales the running
//! deployment as `cloudweb scale` does (spread over nodes; a scale-down
//! drains first). Every change, and every change it could not make, is
//! recorded with its reason (`GET /api/apps/{name}/autoscale`).
//!
//! An app whose metric cannot be measured (no sample yet, samples older
//! than two minutes) keeps its count; so does one that is being deployed.

pub mod policy;

use std::collections::HashMap;
use std::sync::Arc;

use cloudweb_api_types::autoscale::{Autoscale, AutoscaleTarget};

use crate::deployment_state::DeploymentState;
use crate::error::ApiError;
use crate::store::autoscale::DecisionRow;
use crate::AppState;

/// Samples older than this do not count.
const FRESH_MS: i64 = 120_000;
/// The traffic window requests per second are taken over.
const TRAFFIC_WINDOW_MS: i64 = 60_000;

/// What a look measured.
#[derive(Debug, Clone, PartialEq)]
pub struct Measured {
    /// Per running instance.
    pub value: f64,
    pub running: u32,
}

/// The metric's name and target.
pub fn target_of(settings: &Autoscale) -> (&'static str, f64) {
    match settings.target {
        AutoscaleTarget::CpuPercent(p) => ("cpu_percent", f64::from(p)),
        AutoscaleTarget::RequestsPerSecond(r) => ("requests_per_second", f64::from(r)),
    }
}

/// The app's metric per running instance of `deployment`, or why not.
async fn measure(state: &AppState, app: &crate::store::AppRow, deployment: &str, settings: &Autoscale) -> Result<Result<Measured, String>, ApiError> {
    let now = state.clock.now_ms();
    let instances: Vec<_> = state.store.instances(deployment).await?.into_iter().filter(|i| i.state == "running").collect();
    let running = instances.len() as u32;
    if running == 0 {
        return Ok(Err("no instance runs".into()));
    }
    match settings.target {
        AutoscaleTarget::CpuPercent(_) => {
            let request = app.cpu.unwrap_or(crate::deploy::DEFAULT_CPU);
            let nodes = state.nodes.all();
            let mut total = 0.0;
            let mut measured = 0u32;
            for instance in &instances {
                let sample = instance.node_id.as_ref().and_then(|id| nodes.iter().find(|n| n.id == *id)).and_then(|n| n.metrics.as_ref()).filter(|s| now - s.at_ms <= FRESH_MS);
                let usage = sample.and_then(|s| {
                    let container = instance.container.as_deref()?;
                    s.value.containers.iter().flatten().find(|c| c.container == container)?.cpu_cores
                });
                if let Some(cores) = usage {
                    total += cores;
                    measured += 1;
                }
            }
            if measured == 0 {
                return Ok(Err("no fresh usage sample of its instances yet".into()));
            }
            Ok(Ok(Measured { value: total / f64::from(measured) / request * 100.0, running }))
        }
        AutoscaleTarget::RequestsPerSecond(_) => {
            let mut hosts = vec![format!("{}.{}", app.name, state.config.base_domain)];
            hosts.extend(serde_json::from_str::<Vec<String>>(&app.domains).unwrap_or_default());
            let since = now - TRAFFIC_WINDOW_MS;
            let mut requests = 0i64;
            let mut seen = false;
            for host in &hosts {
                for sample in state.store.traffic(host, since).await? {
                    requests += sample.1;
                    seen = true;
                }
            }
            if !seen {
                return Ok(Err("no traffic sample of its hosts in the last minute".into()));
            }
            let per_second = requests as f64 / (TRAFFIC_WINDOW_MS as f64 / 1000.0);
            Ok(Ok(Measured { value: per_second / f64::from(running), running }))
        }
    }
}

/// What the autoscaler remembers between looks, per app.
#[derive(Default)]
struct Memory {
    settings: String,
    stabilizer: policy::Stabilizer,
    /// The last reason recorded for a change it could not make (recorded
    /// once while it lasts).
    blocked: Option<String>,
}

/// One look at one app.
async fn look(state: &AppState, name: &str, settings_json: &str, memory: &mut Memory) -> Result<(), ApiError> {
    let Ok(settings) = serde_json::from_str::<Autoscale>(settings_json) else { return Ok(()) };
    if memory.settings != settings_json {
        memory.settings = settings_json.to_string();
        memory.stabilizer.reset();
        memory.blocked = None;
    }
    let Some(app) = state.store.app(name).await? else { return Ok(()) };
    let deployments = state.store.app_deployments(name).await?;
    // Mid-deploy: the new deployment takes the count when it runs.
    if deployments.iter().any(|d| matches!(DeploymentState::parse(&d.state), Some(DeploymentState::Queued | DeploymentState::Building | DeploymentState::Deploying))) {
        return Ok(());
    }
    let Some(running) = deployments.iter().find(|d| d.state == DeploymentState::Running.as_str() && d.image.is_some()) else { return Ok(()) };
    let (metric, target) = target_of(&settings);
    let current = app.instances.clamp(0, i64::from(u32::MAX)) as u32;
    let now = state.clock.now_ms();
    let (value, recommendation, why) = match measure(state, &app, &running.id, &settings).await? {
        Ok(measured) => {
            let recommendation = policy::recommend(current, measured.value, target, settings.min, settings.max);
            (Some(measured.value), recommendation, format!("{metric} {:.1} per instance against a target of {target}", measured.value))
        }
        // Unmeasured: only the bounds can move it.
        Err(reason) => (None, current.clamp(settings.min, settings.max), reason),
    };
    let bounds = policy::Bounds {
        min: settings.min,
        max: settings.max,
        up_window_ms: i64::from(settings.up_window_seconds) * 1000,
        down_window_ms: i64::from(settings.down_window_seconds) * 1000,
    };
    let Some(to) = memory.stabilizer.decide(now, recommendation, current, &bounds) else { return Ok(()) };
    let reason = if current < settings.min || current > settings.max {
        format!("{current} instances is outside {}–{}", settings.min, settings.max)
    } else if to > current {
        format!("{why}; every look of the last {} s asked for at least {to}", settings.up_window_seconds)
    } else {
        format!("{why}; every look of the last {} s asked for at most {to}", settings.down_window_seconds)
    };
    let scaled = crate::deploy::scale::scale(state, name, to).await;
    let (reason, to_recorded) = match &scaled {
        Ok(done) => match &done.waiting {
            Some(waiting) => (format!("{reason}; fewer started: {waiting}"), to),
            None => (reason, to),
        },
        Err(err) => (format!("{reason}; the scale failed: {err}"), current),
    };
    if to_recorded == current && memory.blocked.as_deref() == Some(reason.as_str()) {
        return Ok(());
    }
    memory.blocked = (to_recorded == current).then(|| reason.clone());
    tracing::info!(app = %name, from = current, to, %reason, "autoscaler decision");
    let decision = DecisionRow { at: now, from: i64::from(current), to: i64::from(to_recorded), metric: metric.to_string(), value, target, reason };
    state.store.record_autoscale_decision(name, &decision).await?;
    Ok(())
}

/// Runs the autoscaler until the task is aborted (the leader's).
pub async fn watcher(state: Arc<AppState>) {
    let mut memory: HashMap<String, Memory> = HashMap::new();
    let mut every = tokio::time::interval(state.config.autoscale_interval);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        let apps = match state.store.autoscaled_apps().await {
            Ok(apps) => apps,
            Err(err) => {
                tracing::warn!(error = %err, "autoscaler: cannot list the apps");
                continue;
            }
        };
        memory.retain(|name, _| apps.iter().any(|(app, _)| app == name));
        for (name, settings) in apps {
            let entry = memory.entry(name.clone()).or_default();
            // One app's failure holds up neither the others nor the next look.
            if let Err(err) = look(&state, &name, &settings, entry).await {
                tracing::warn!(app = %name, error = %err, "autoscaler: look failed; trying again next time");
            }
        }
    }
}
