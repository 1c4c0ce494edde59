//! The invariants the simulation checks, read from the control plane's
//! database and the simulated world.

use std::collections::BTreeMap;

use cloudweb_server::store::DeploymentRow;
use cloudweb_server::AppState;

use crate::agent::World;

/// A broken invariant: which one, and what was seen.
#[derive(Debug, Clone)]
pub struct Violation {
    pub invariant: &'static str,
    pub detail: String,
}

fn violation(invariant: &'static str, detail: String) -> Violation {
    Violation { invariant, detail }
}

pub struct AppView {
    pub deployments: Vec<DeploymentRow>,
    /// Deployment id → the states it went through.
    pub events: BTreeMap<String, Vec<String>>,
    /// Deployment id → its instances, as `n:container@node=state`.
    pub instances: BTreeMap<String, Vec<String>>,
}

pub async fn view(state: &AppState, app: &str) -> AppView {
    let deployments = state.store.app_deployments(app).await.unwrap_or_default();
    let mut events = BTreeMap::new();
    let mut instances = BTreeMap::new();
    for d in &deployments {
        let states = state.store.deployment_events(&d.id).await.unwrap_or_default().into_iter().map(|(s, _)| s).collect();
        events.insert(d.id.clone(), states);
        let rows = state.store.instances(&d.id).await.unwrap_or_default();
        let described = rows
            .iter()
            .map(|i| format!("{}:{}@{}={}", i.instance, i.container.as_deref().unwrap_or("-"), i.node_id.as_deref().unwrap_or("-"), i.state))
            .collect();
        instances.insert(d.id.clone(), described);
    }
    AppView { deployments, events, instances }
}

pub fn describe(view: &AppView) -> String {
    view.deployments
        .iter()
        .rev()
        .map(|d| {
            format!(
                "{} seq {} {} {} commit {} image {} [{}] instances {}{}",
                d.id,
                d.seq,
                d.kind,
                d.state,
                d.commit_sha.as_deref().map(|c| &c[..c.len().min(8)]).unwrap_or("-"),
                d.image.as_deref().unwrap_or("-"),
                view.events.get(&d.id).map(|e| e.join(">")).unwrap_or_default(),
                view.instances.get(&d.id).map(|e| e.join(" ")).unwrap_or_default(),
                d.error.as_deref().map(|e| format!(" error: {e}")).unwrap_or_default(),
            )
        })
        .collect::<Vec<_>>()
        .join("\n    ")
}

fn ran(view: &AppView, id: &str) -> bool {
    view.events.get(id).is_some_and(|e| e.iter().any(|s| s == "running"))
}

/// What must hold at every commit point (a kill may leave any of them as
/// the state a restart finds): `deployments` newest first, each with
/// whether it ever ran.
pub fn always(app: &str, deployments: &[(DeploymentRow, bool)], world: &World) -> Vec<Violation> {
    let mut found = Vec::new();
    let running: Vec<&DeploymentRow> = deployments.iter().map(|(d, _)| d).filter(|d| d.state == "running").collect();
    if running.len() > 1 {
        found.push(violation("one running deployment", format!("app {app} has {} running deployments", running.len())));
    }
    // No node is lost in the simulation. Without crashes a deployment that
    // ran ends only by being superseded. When a crash took every instance,
    // the lost deployment fails only together with its reschedule; should
    // a newer request supersede that one and fail, the app honestly runs
    // nothing (the failure says why), but the newest deployment is never
    // the lost one with nothing on its way.
    if running.is_empty() {
        if !world.crashed.contains(app) && deployments.iter().any(|(_, ran)| *ran) {
            found.push(violation("an app that ran keeps running", format!("app {app} had a running deployment and has none now")));
        }
        if let Some((newest, true)) = deployments.first() {
            if newest.state == "failed" {
                found.push(violation(
                    "an app that ran keeps running",
                    format!("deployment {} of {app} ran and failed, and nothing starts its image again", newest.id),
                ));
            }
        }
    }
    for d in &running {
        if let (Some(commit), Some(image)) = (&d.commit_sha, &d.image) {
            if let Some(built) = world.images.get(image) {
                if built != commit && d.kind == "source" {
                    found.push(violation(
                        "a deployment names the commit it runs",
                        format!("deployment {} says commit {commit} but its image {image} was built from {built}", d.id),
                    ));
                }
            }
        }
    }
    found
}

/// What must hold once the cluster has settled (no request, no kill, every
/// command handled).
pub fn settled(app: &str, view: &AppView, world: &World, instances: i64) -> Vec<Violation> {
    let mut found = Vec::new();
    for d in &view.deployments {
        if !matches!(d.state.as_str(), "running" | "failed" | "superseded") {
            found.push(violation("no deployment stays unfinished", format!("deployment {} of {app} is still {}", d.id, d.state)));
        }
    }
    let running: Vec<&DeploymentRow> = view.deployments.iter().filter(|d| d.state == "running").collect();
    if let Some(newest) = view.deployments.first() {
        if newest.state != "failed" && newest.state != "running" {
            found.push(violation(
                "the newest requested deployment wins",
                format!("the newest deployment {} of {app} is {}, not running", newest.id, newest.state),
            ));
        }
    }
    if let Some(current) = running.first() {
        if let Some(newer) = view.deployments.iter().find(|d| d.seq > current.seq && ran(view, &d.id)) {
            found.push(violation(
                "the newest requested deployment wins",
                format!("deployment {} of {app} runs although the newer {} ran", current.id, newer.id),
            ));
        }
    }
    // Exactly the running deployment's containers run.
    let containers: Vec<_> = world.containers.values().flat_map(|c| c.iter()).filter(|(_, c)| c.app == app).collect();
    match running.first() {
        Some(current) => {
            let stray: Vec<String> = containers.iter().filter(|(_, c)| c.deployment != current.id).map(|(n, c)| format!("{n} ({})", c.deployment)).collect();
            if !stray.is_empty() {
                found.push(violation("only the running deployment's containers run", format!("app {app} still runs {}", stray.join(", "))));
            }
            let own = containers.len() - stray.len();
            if own as i64 != instances {
                found.push(violation(
                    "only the running deployment's containers run",
                    format!("app {app} runs {own} containers of {} for {instances} instances", current.id),
                ));
            }
        }
        None if !containers.is_empty() => {
            found.push(violation("only the running deployment's containers run", format!("app {app} runs {} containers and no deployment", containers.len())));
        }
        None => {}
    }
    found
}
