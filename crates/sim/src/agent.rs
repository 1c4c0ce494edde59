//! Simulated agents. They take the real queued commands, report through the
//! real report path (`check_report`, `save_report`, `on_report`) and ack
//! through the real queue, but build and run nothing: a "container" is an
//! entry in [`World`], an "image" a tag that remembers its commit.
//!
//! What a real agent does and these do too: commands of one deployment run
//! in order (one lane per deployment), different deployments at once; a
//! redelivered deploy adopts the container it already started; a stop that
//! is queued behind a deploy cancels it; a command whose reports could not
//! be delivered is tried again on the next read of the queue. Chance
//! decides where a report or an ack is lost on the way there, or where its
//! answer is lost on the way back (applied, but the agent does not know).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use cloudweb_protocol::{CommandKind, DeployPayload, Report, StopPayload};
use cloudweb_server::error::ApiError;
use cloudweb_server::AppState;

use crate::rng::Rng;

/// A container a simulated node runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Container {
    pub app: String,
    pub deployment: String,
    pub instance: u32,
    pub image: String,
}

/// Everything outside the control plane: git repositories, the nodes'
/// containers, images and files. It outlives control-plane kills.
#[derive(Debug, Default)]
pub struct World {
    /// Each app's branch, oldest commit first.
    pub commits: BTreeMap<String, Vec<String>>,
    /// Commits whose build fails.
    pub bad_commits: BTreeSet<String>,
    /// Per node: container name → container.
    pub containers: BTreeMap<String, BTreeMap<String, Container>>,
    /// Image tag → the commit it was built from (its label).
    pub images: BTreeMap<String, String>,
    /// Per node: the commit each deployment's first build resolved (the
    /// agent's pin file).
    pub pins: BTreeMap<String, BTreeMap<String, String>>,
    /// Per node: commands handled (the agent's handled-ids file).
    pub handled: BTreeMap<String, BTreeSet<i64>>,
    /// Commands whose ack reached the control plane.
    pub acked: BTreeSet<i64>,
    /// Lanes (node, deployment) a simulated agent works on now.
    pub busy: BTreeSet<(String, String)>,
    /// Whether agents pin the commit of a deployment's first build (the
    /// agent since 0.3.0); without it a retry builds the branch head again.
    pub pin_commits: bool,
    /// Problems seen by agents that break an invariant of the queue.
    pub violations: Vec<String>,
    /// Per node: instances whose container died, (deployment, instance),
    /// until their `failed` report is delivered (the agent's outbox).
    pub outbox: BTreeMap<String, Vec<(String, u32)>>,
    /// Apps whose containers died at least once.
    pub crashed: BTreeSet<String>,
    /// Crashes that took a deployment's containers.
    pub crashes: usize,
}

impl World {
    pub fn head(&self, app: &str) -> String {
        self.commits.get(app).and_then(|c| c.last()).cloned().unwrap_or_default()
    }
}

pub type Shared = Arc<Mutex<World>>;

/// How a report fared.
enum Sent {
    Applied,
    /// Not applied, or applied without the agent knowing: try the command
    /// again later.
    Retry,
    /// Refused for good (4xx).
    Refused(String),
}

/// Sends a report the way `POST /agent/v1/report` handles it.
async fn send(state: &AppState, node: &str, mut report: Report, rng: &mut Rng) -> Sent {
    if rng.chance(4) {
        return Sent::Retry;
    }
    report.sanitize();
    if let Err(err) = report.validate() {
        return Sent::Refused(err.to_string());
    }
    let applied: Result<(), ApiError> = async {
        cloudweb_server::deploy::check_report(state, node, &report).await?;
        state.store.save_report(node, &report, state.clock.now_ms()).await?;
        cloudweb_server::deploy::on_report(state, node, &report).await
    }
    .await;
    match applied {
        Err(err) if err.status().is_client_error() => Sent::Refused(err.to_string()),
        Err(_) => Sent::Retry,
        Ok(()) if rng.chance(4) => Sent::Retry,
        Ok(()) => Sent::Applied,
    }
}

fn report(deployment: &str, instance: u32, state: Option<&str>) -> Report {
    let mut report = Report::new(deployment.to_string());
    report.instance = Some(instance);
    report.state = state.map(str::to_string);
    report
}

/// Every container of the app's running deployment dies at once (a
/// release that exits, an out-of-memory kill of each): they are gone from
/// the world now, and each node reports them from its outbox when it next
/// reads its queue. False when the app runs nothing.
pub async fn crash(state: &AppState, world: &Shared, app: &str, nodes: &[String]) -> bool {
    let Ok(deployments) = state.store.app_deployments(app).await else { return false };
    let Some(running) = deployments.iter().find(|d| d.state == "running") else { return false };
    // A deploy command still to be acked would start the container again
    // when it is delivered again (as a real agent does): no crash then.
    for node in nodes {
        let Ok(pending) = state.store.pending_commands(node).await else { return false };
        let for_it = |row: &cloudweb_server::store::CommandRow| {
            cloudweb_server::agent_api::commands::to_wire(state, row)
                .ok()
                .is_some_and(|c| c.payload.get("deployment_id").and_then(|v| v.as_str()) == Some(running.id.as_str()))
        };
        if pending.iter().any(for_it) {
            return false;
        }
    }
    let mut world = world.lock().expect("world lock");
    let World { containers, outbox, crashed, crashes, .. } = &mut *world;
    let mut died = false;
    for (node, on_node) in containers.iter_mut() {
        let gone: Vec<(String, u32)> = on_node.iter().filter(|(_, c)| c.deployment == running.id).map(|(n, c)| (n.clone(), c.instance)).collect();
        for (name, instance) in gone {
            on_node.remove(&name);
            outbox.entry(node.clone()).or_default().push((running.id.clone(), instance));
            died = true;
        }
    }
    if died {
        crashed.insert(app.to_string());
        *crashes += 1;
    }
    died
}

/// Delivers the node's outbox: a `failed` report per dead container, kept
/// until it is applied (or refused for good).
async fn flush_outbox(state: &AppState, world: &Shared, node: &str, rng: &mut Rng) {
    let pending = world.lock().expect("world lock").outbox.get(node).cloned().unwrap_or_default();
    for (deployment, instance) in pending {
        let mut failed = report(&deployment, instance, Some("failed"));
        failed.message = Some("the container exited with code 137".into());
        let sent = send(state, node, failed, rng).await;
        if matches!(sent, Sent::Retry) {
            continue;
        }
        if let Some(outbox) = world.lock().expect("world lock").outbox.get_mut(node) {
            outbox.retain(|entry| *entry != (deployment.clone(), instance));
        }
    }
}

/// One read of the queue by `node`'s agent: its outbox first, then the
/// first command of one lane that no one works on, carried out to its end
/// or to a retry.
pub async fn work(state: Arc<AppState>, world: Shared, node: String, seed: u64) {
    let mut rng = Rng::new(seed);
    flush_outbox(&state, &world, &node, &mut rng).await;
    let Ok(pending) = state.store.pending_commands(&node).await else { return };
    let mut lanes: BTreeMap<String, Vec<cloudweb_server::store::CommandRow>> = BTreeMap::new();
    for row in pending {
        let Ok(command) = cloudweb_server::agent_api::commands::to_wire(&state, &row) else { continue };
        let lane = command.payload.get("deployment_id").and_then(|v| v.as_str()).unwrap_or_default().to_string();
        {
            let mut world = world.lock().expect("world lock");
            if world.acked.contains(&row.seq) {
                world.violations.push(format!("command {} was delivered again after its ack reached the control plane", row.seq));
            }
        }
        lanes.entry(lane).or_default().push(row);
    }
    let free: Vec<String> = {
        let world = world.lock().expect("world lock");
        lanes.keys().filter(|lane| !world.busy.contains(&(node.clone(), (*lane).clone()))).cloned().collect()
    };
    let Some(lane) = rng.pick(&free).cloned() else { return };
    world.lock().expect("world lock").busy.insert((node.clone(), lane.clone()));
    let rows = &lanes[&lane];
    let row = rows[0].clone();
    let handled = world.lock().expect("world lock").handled.get(&node).is_some_and(|h| h.contains(&row.seq));
    let done = if handled {
        true
    } else {
        match cloudweb_server::agent_api::commands::to_wire(&state, &row) {
            Ok(command) => match CommandKind::parse(&command.kind) {
                Some(CommandKind::Deploy) => match serde_json::from_value::<DeployPayload>(command.payload) {
                    Ok(payload) => {
                        let stop_queued = rows[1..].iter().any(|later| {
                            cloudweb_server::agent_api::commands::to_wire(&state, later).ok().is_some_and(|c| {
                                CommandKind::parse(&c.kind) == Some(CommandKind::Stop)
                                    && c.payload.get("instance").and_then(|v| v.as_u64()).is_none_or(|i| i == u64::from(payload.instance))
                            })
                        });
                        deploy(&state, &world, &node, &payload, stop_queued, &mut rng).await
                    }
                    Err(_) => true,
                },
                Some(CommandKind::Stop) => match serde_json::from_value::<StopPayload>(command.payload) {
                    Ok(payload) => stop(&state, &world, &node, &payload, &mut rng).await,
                    Err(_) => true,
                },
                _ => true,
            },
            Err(_) => true,
        }
    };
    if done {
        world.lock().expect("world lock").handled.entry(node.clone()).or_default().insert(row.seq);
        if !rng.chance(5) {
            if let Ok(true) = state.store.ack_command(&node, row.seq, state.clock.now_ms()).await {
                world.lock().expect("world lock").acked.insert(row.seq);
            }
        }
    }
    world.lock().expect("world lock").busy.remove(&(node, lane));
}

/// Carries out a deploy; true when it is handled (ack it), false when it
/// must be tried again.
async fn deploy(state: &AppState, world: &Shared, node: &str, payload: &DeployPayload, stop_queued: bool, rng: &mut Rng) -> bool {
    let dep = payload.deployment_id.as_str();
    let instance = payload.instance;
    let container_name = payload.container.clone().unwrap_or_else(|| format!("cw-{}-{dep}-{instance}", payload.app));
    if stop_queued {
        let mut failed = report(dep, instance, Some("failed"));
        failed.message = Some("cancelled".into());
        return !matches!(send(state, node, failed, rng).await, Sent::Retry);
    }
    // Delivered again: adopt the container that runs.
    let existing = world.lock().expect("world lock").containers.get(node).and_then(|c| c.get(&container_name)).cloned();
    if existing.is_none() {
        let image = match &payload.image {
            Some(image) => {
                if !matches!(send(state, node, report(dep, instance, Some("deploying")), rng).await, Sent::Applied) {
                    return false;
                }
                image.clone()
            }
            None => {
                let Some(source) = &payload.source else { return true };
                // The commit: the pinned one on a retry, else the typed one,
                // else the branch head now.
                let commit = {
                    let world = world.lock().expect("world lock");
                    let pinned = if world.pin_commits { world.pins.get(node).and_then(|p| p.get(dep)).cloned() } else { None };
                    match (pinned, &source.commit) {
                        (Some(pinned), _) => Some(pinned),
                        (None, Some(typed)) => world.commits.get(&payload.app).and_then(|c| c.iter().find(|c| c.starts_with(typed.as_str())).cloned()),
                        (None, None) => Some(world.head(&payload.app)),
                    }
                };
                let Some(commit) = commit else {
                    let mut failed = report(dep, instance, Some("failed"));
                    failed.message = Some("no such commit on the branch".into());
                    return !matches!(send(state, node, failed, rng).await, Sent::Retry);
                };
                {
                    let mut world = world.lock().expect("world lock");
                    if world.pin_commits {
                        world.pins.entry(node.to_string()).or_default().insert(dep.to_string(), commit.clone());
                    }
                }
                let mut resolved = report(dep, instance, None);
                resolved.commit = Some(commit.clone());
                match send(state, node, resolved, rng).await {
                    Sent::Applied => {}
                    Sent::Retry => return false,
                    Sent::Refused(reason) => {
                        let mut failed = report(dep, instance, Some("failed"));
                        failed.message = Some(reason);
                        return !matches!(send(state, node, failed, rng).await, Sent::Retry);
                    }
                }
                if !matches!(send(state, node, report(dep, instance, Some("building")), rng).await, Sent::Applied) {
                    return false;
                }
                if world.lock().expect("world lock").bad_commits.contains(&commit) {
                    let mut failed = report(dep, instance, Some("failed"));
                    failed.message = Some(format!("the build of {commit} failed"));
                    return !matches!(send(state, node, failed, rng).await, Sent::Retry);
                }
                let tag = format!("registry/{}:{dep}", payload.app);
                world.lock().expect("world lock").images.insert(tag.clone(), commit);
                let mut deploying = report(dep, instance, Some("deploying"));
                deploying.image = Some(tag.clone());
                if !matches!(send(state, node, deploying, rng).await, Sent::Applied) {
                    return false;
                }
                tag
            }
        };
        let container = Container { app: payload.app.clone(), deployment: dep.to_string(), instance, image };
        world.lock().expect("world lock").containers.entry(node.to_string()).or_default().insert(container_name.clone(), container);
    }
    let mut running = report(dep, instance, Some("running"));
    running.address = Some(format!("127.0.0.1:{}", 20000 + instance));
    match send(state, node, running, rng).await {
        Sent::Applied => true,
        Sent::Retry => false,
        Sent::Refused(_) => {
            // The control plane will never route to it: remove it.
            world.lock().expect("world lock").containers.get_mut(node).map(|c| c.remove(&container_name));
            true
        }
    }
}

async fn stop(state: &AppState, world: &Shared, node: &str, payload: &StopPayload, rng: &mut Rng) -> bool {
    {
        let mut world = world.lock().expect("world lock");
        if let Some(containers) = world.containers.get_mut(node) {
            containers.retain(|_, c| !(c.deployment == payload.deployment_id && payload.instance.is_none_or(|i| i == c.instance)));
        }
    }
    let mut stopped = Report::new(payload.deployment_id.clone());
    stopped.instance = payload.instance;
    stopped.state = payload.instance.map(|_| "stopped".to_string());
    // The real agent handles a stop whatever the report's fate.
    let _ = send(state, node, stopped, rng).await;
    true
}
