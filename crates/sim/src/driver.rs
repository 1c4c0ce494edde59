//! The seeded scheduler: spawns simulated activities as stepped tasks, lets
//! one of them go on at a time, kills and reopens the control plane, and
//! checks the invariants.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cloudweb_server::clock::Clock;
use cloudweb_server::config::Config;
use cloudweb_server::deploy::Origin;
use cloudweb_server::store::steps::{stepped, step_point, Arrival, Stepper};
use cloudweb_server::store::{AppRow, JoinAnswer, NewNode};
use cloudweb_server::AppState;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use crate::agent::{self, Shared, World};
use crate::check::{self, Violation};
use crate::rng::Rng;

/// What one run simulates.
#[derive(Debug, Clone)]
pub struct Options {
    pub seed: u64,
    pub apps: usize,
    pub nodes: usize,
    /// Deploy requests over the run.
    pub requests: usize,
    /// Control-plane kills at most.
    pub kills: usize,
    /// Scheduler steps before the cluster is left to settle.
    pub steps: usize,
    /// Agents pin the commit of a deployment's first build.
    pub pin_commits: bool,
    /// Check the invariants at every commit point, not only at the end.
    pub check_every_step: bool,
    /// Times at most that every container of an app's running deployment
    /// dies (the reconciler then starts its image again).
    pub crashes: usize,
}

impl Options {
    pub fn new(seed: u64) -> Options {
        Options { seed, apps: 2, nodes: 2, requests: 8, kills: 3, steps: 300, pin_commits: true, check_every_step: true, crashes: 2 }
    }
}

/// A finished run that broke no invariant.
#[derive(Debug, Clone, Default)]
pub struct Outcome {
    pub steps: usize,
    pub kills: usize,
    /// Crashes that took every container of a running deployment.
    pub crashes: usize,
    pub deployments: usize,
    pub commits: u64,
}

/// A broken invariant, with what is needed to replay it.
#[derive(Debug, Clone)]
pub struct SimFailure {
    pub seed: u64,
    pub step: usize,
    pub violation: Violation,
    /// The apps' deployments and the last scheduler events.
    pub report: String,
}

impl std::fmt::Display for SimFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "seed {} broke \"{}\" at step {}: {}\n  replay: cloudweb-bench simulate --seed {}\n{}",
            self.seed, self.violation.invariant, self.step, self.violation.detail, self.seed, self.report
        )
    }
}

/// The control plane's wall clock, moved only by the scheduler.
#[derive(Debug, Clone)]
struct SimClock(Arc<AtomicI64>);

impl Clock for SimClock {
    fn now(&self) -> time::OffsetDateTime {
        time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(self.0.load(Ordering::SeqCst)) * 1_000_000).expect("time in range")
    }
}

/// Runs one seed on a runtime of its own (one thread: the scheduler alone
/// decides what runs).
pub fn run(options: &Options) -> Result<Outcome, SimFailure> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a tokio runtime");
    runtime.block_on(Sim::new(options.clone()).run())
}

enum Activity {
    Deploy { app: String, commit: Option<String> },
    Agent { node: String, seed: u64 },
    Reconcile,
    Crash { app: String },
}

struct Slot {
    label: String,
    go: Option<oneshot::Sender<()>>,
    handle: JoinHandle<()>,
}

struct Sim {
    options: Options,
    rng: Rng,
    dir: tempfile::TempDir,
    clock: SimClock,
    state: Option<Arc<AppState>>,
    world: Shared,
    apps: Vec<String>,
    nodes: Vec<String>,
    tasks: BTreeMap<u64, Slot>,
    next_task: u64,
    ids: Arc<AtomicU64>,
    arrivals_tx: mpsc::UnboundedSender<Arrival>,
    arrivals: mpsc::UnboundedReceiver<Arrival>,
    done_tx: mpsc::UnboundedSender<u64>,
    done: mpsc::UnboundedReceiver<u64>,
    trace: Vec<String>,
    step: usize,
    kills: usize,
    instances: BTreeMap<String, i64>,
}

impl Sim {
    fn new(options: Options) -> Sim {
        let (arrivals_tx, arrivals) = mpsc::unbounded_channel();
        let (done_tx, done) = mpsc::unbounded_channel();
        let world = World { pin_commits: options.pin_commits, ..World::default() };
        Sim {
            rng: Rng::new(options.seed),
            // In memory where the machine has /dev/shm: the runs write a
            // lot and need no durability beyond the simulated kills.
            dir: tempfile::Builder::new()
                .prefix("cloudweb-sim-")
                .tempdir_in("/dev/shm")
                .or_else(|_| tempfile::tempdir())
                .expect("a temporary directory"),
            clock: SimClock(Arc::new(AtomicI64::new(1_900_000_000_000))),
            state: None,
            world: Arc::new(Mutex::new(world)),
            apps: (0..options.apps).map(|i| format!("app{i}")).collect(),
            nodes: (0..options.nodes).map(|i| format!("node-{i}")).collect(),
            tasks: BTreeMap::new(),
            next_task: 0,
            ids: Arc::new(AtomicU64::new(1)),
            arrivals_tx,
            arrivals,
            done_tx,
            done,
            trace: Vec::new(),
            step: 0,
            kills: 0,
            instances: BTreeMap::new(),
            options,
        }
    }

    fn state(&self) -> Arc<AppState> {
        self.state.clone().expect("the control plane is open")
    }

    fn note(&mut self, line: String) {
        self.trace.push(format!("[{}] {line}", self.step));
        if self.trace.len() > 400 {
            self.trace.remove(0);
        }
    }

    fn commit_id(&mut self) -> String {
        format!("{:016x}{:016x}{:08x}", self.rng.next_u64(), self.rng.next_u64(), self.rng.next_u64() as u32)
    }

    async fn open(&mut self) {
        let mut config = Config::local(self.dir.path().to_path_buf());
        config.drain_period = Duration::from_secs(1);
        // Liveness runs on the process's monotonic clock, which the
        // simulation does not move: nodes stay reachable.
        config.unreachable_after = Duration::from_secs(24 * 3600);
        let opened = cloudweb_server::open_state(config, Arc::new(self.clock.clone())).await.expect("the control plane opens");
        // Commit statuses (for git-provider apps only) queue up unposted:
        // the queue holds 1,024, more than a run's transitions.
        self.state = Some(opened.state.clone());
        self.heartbeats();
    }

    fn heartbeats(&self) {
        let state = self.state();
        for node in &self.nodes {
            let heartbeat = cloudweb_protocol::Heartbeat { cpu_cores: 1, mem_bytes: 8 << 30, disk_bytes: 100 << 30, health: None, metrics: None, ingress: None, mesh_endpoint: None };
            state.nodes.record_heartbeat(node, heartbeat, Some("sim".into()), 1, tokio::time::Instant::now(), self.clock.0.load(Ordering::SeqCst));
        }
    }

    async fn setup(&mut self) {
        self.open().await;
        let state = self.state();
        let now = self.clock.0.load(Ordering::SeqCst);
        for node in self.nodes.clone() {
            let digest = format!("token-{node}");
            state.store.insert_join_token(&digest, now, now + 3_600_000).await.expect("a join token");
            let new = NewNode {
                id: node.clone(),
                name: node.clone(),
                hostname: node.clone(),
                ingress: false,
                wireguard_public_key: None,
                endpoint: None,
                cert_sha256: format!("cert-{node}"),
                cert_not_after: now + 3_600_000,
                agent_version: Some("sim".into()),
                protocol: 1,
            };
            let row = state.store.register_node(&digest, &new, &JoinAnswer { csr_sha256: "csr", certificate: "cert" }, now).await.expect("store").expect("node joins");
            state.nodes.insert(&row, tokio::time::Instant::now());
        }
        self.heartbeats();
        for app in self.apps.clone() {
            let instances = 1 + self.rng.below(2) as i64;
            self.instances.insert(app.clone(), instances);
            let row = AppRow {
                name: app.clone(),
                repo_url: format!("https://git.example.com/{app}.git"),
                branch: "main".into(),
                port: 8080,
                domains: "[]".into(),
                build: None,
                strategy: "dockerfile".into(),
                instances,
                cpu: None,
                memory_bytes: None,
                health_path: "/".into(),
                health_timeout_s: 30,
                build_timeout_s: None,
                env_sealed: None,
                git_credentials_sealed: None,
                created_at: now,
                rollout: "blue-green".into(),
                liveness: None,
                readiness: None,
                team_id: "team_default".into(),
            };
            state.store.insert_app(&row, &format!("{app}.localhost")).await.expect("store").expect("app created");
            let first = self.commit_id();
            self.world.lock().expect("world lock").commits.insert(app, vec![first]);
        }
    }

    fn spawn(&mut self, activity: Activity) {
        let task = self.next_task;
        self.next_task += 1;
        let stepper = Stepper { task, arrivals: self.arrivals_tx.clone(), ids: self.ids.clone() };
        let state = self.state();
        let world = self.world.clone();
        let done = self.done_tx.clone();
        let label = match &activity {
            Activity::Deploy { app, commit } => format!("deploy {app} {}", commit.as_deref().map(|c| &c[..8]).unwrap_or("head")),
            Activity::Agent { node, .. } => format!("agent {node}"),
            Activity::Reconcile => "reconcile".to_string(),
            Activity::Crash { app } => format!("crash {app}"),
        };
        let nodes = self.nodes.clone();
        let handle = tokio::spawn(stepped(stepper, async move {
            step_point().await;
            match activity {
                Activity::Deploy { app, commit } => {
                    if let Ok(Some(row)) = state.store.app(&app).await {
                        let _ = cloudweb_server::deploy::create(&state, &row, Origin::Source { commit }).await;
                    }
                }
                Activity::Agent { node, seed } => agent::work(state, world, node, seed).await,
                Activity::Reconcile => {
                    let _ = cloudweb_server::deploy::reconcile(&state).await;
                }
                Activity::Crash { app } => {
                    agent::crash(&state, &world, &app, &nodes).await;
                }
            }
            let _ = done.send(task);
        }));
        self.note(format!("spawn #{task} {label}"));
        self.tasks.insert(task, Slot { label, go: None, handle });
    }

    /// Takes one event: an arrival at a step point or a finished task.
    async fn event(&mut self) -> Result<(u64, bool), String> {
        let wait = async {
            tokio::select! {
                biased;
                Some(arrival) = self.arrivals.recv() => Some((arrival.task, Some(arrival.go))),
                Some(task) = self.done.recv() => Some((task, None)),
                else => None,
            }
        };
        match tokio::time::timeout(Duration::from_secs(20), wait).await {
            Ok(Some((task, Some(go)))) => {
                if let Some(slot) = self.tasks.get_mut(&task) {
                    slot.go = Some(go);
                }
                Ok((task, false))
            }
            Ok(Some((task, None))) => {
                self.tasks.remove(&task);
                Ok((task, true))
            }
            Ok(None) => Err("the scheduler's channels closed".into()),
            Err(_) => Err("a task neither reached a step point nor finished within 20 s".into()),
        }
    }

    /// Lets one task go on to its next commit (or its end).
    async fn release(&mut self, task: u64) -> Result<(), String> {
        // A new task first announces itself at its opening step point.
        while self.tasks.get(&task).is_some_and(|s| s.go.is_none()) {
            self.event().await?;
        }
        let Some(slot) = self.tasks.get_mut(&task) else { return Ok(()) };
        let go = slot.go.take().expect("waiting at a step point");
        let _ = go.send(());
        loop {
            let (who, finished) = self.event().await?;
            if who == task {
                if finished {
                    self.note(format!("#{task} finished"));
                }
                return Ok(());
            }
        }
    }

    /// `kill -9` of the control plane: no waiting task goes on, in-memory
    /// state is gone, and the database is opened again.
    async fn kill(&mut self) {
        let labels: Vec<String> = self.tasks.iter().map(|(id, s)| format!("#{id} {}", s.label)).collect();
        self.note(format!("KILL with {} task(s) cut: {}", labels.len(), labels.join(", ")));
        for (_, slot) in std::mem::take(&mut self.tasks) {
            slot.handle.abort();
            let _ = slot.handle.await;
        }
        while self.arrivals.try_recv().is_ok() {}
        while self.done.try_recv().is_ok() {}
        self.world.lock().expect("world lock").busy.clear();
        if let Some(state) = self.state.take() {
            let _ = tokio::time::timeout(Duration::from_secs(10), state.store.close()).await;
        }
        self.kills += 1;
        self.open().await;
    }

    async fn check_always(&mut self) -> Result<(), SimFailure> {
        let state = self.state();
        for app in self.apps.clone() {
            let deployments = state.store.app_deployments_ran(&app).await.unwrap_or_default();
            let found = {
                let world = self.world.lock().expect("world lock");
                let mut found = check::always(&app, &deployments, &world);
                if let Some(problem) = world.violations.first() {
                    found.push(Violation { invariant: "a command acked is not delivered again", detail: problem.clone() });
                }
                found
            };
            if let Some(violation) = found.into_iter().next() {
                return Err(self.failure(violation).await);
            }
        }
        Ok(())
    }

    async fn failure(&mut self, violation: Violation) -> SimFailure {
        let state = self.state();
        let mut report = String::new();
        for app in &self.apps {
            let view = check::view(&state, app).await;
            report.push_str(&format!("  {app} ({} instance(s)):\n    {}\n", self.instances[app], check::describe(&view)));
        }
        {
            let world = self.world.lock().expect("world lock");
            for (node, containers) in &world.containers {
                let names: Vec<String> = containers.iter().map(|(n, c)| format!("{n}={}", c.deployment)).collect();
                report.push_str(&format!("  containers on {node}: {}\n", names.join(", ")));
            }
        }
        report.push_str("  last events:\n");
        for line in &self.trace {
            report.push_str(&format!("    {line}\n"));
        }
        SimFailure { seed: self.options.seed, step: self.step, violation, report }
    }

    fn advance(&mut self, max_ms: u64) {
        let by = self.rng.below(max_ms) as i64;
        self.clock.0.fetch_add(by, Ordering::SeqCst);
    }

    async fn run(mut self) -> Result<Outcome, SimFailure> {
        self.setup().await;
        let (mut requests, mut crashes) = (0, 0);
        while self.step < self.options.steps || requests < self.options.requests {
            self.step += 1;
            if self.step > self.options.steps * 4 {
                break;
            }
            // Start something new now and then, at most four at once.
            if self.tasks.len() < 4 && (self.tasks.is_empty() || self.rng.chance(40)) {
                match self.rng.below(100) {
                    0..=19 if requests < self.options.requests => {
                        requests += 1;
                        let app = self.rng.pick(&self.apps).cloned().expect("apps");
                        // A push now and then moves the branch head; one
                        // commit in ten does not build.
                        if self.rng.chance(60) {
                            let commit = self.commit_id();
                            let bad = self.rng.chance(10);
                            let mut world = self.world.lock().expect("world lock");
                            if bad {
                                world.bad_commits.insert(commit.clone());
                            }
                            world.commits.entry(app.clone()).or_default().push(commit);
                        }
                        let commit = if self.rng.chance(30) {
                            let world = self.world.lock().expect("world lock");
                            let commits = world.commits[&app].clone();
                            drop(world);
                            self.rng.pick(&commits).cloned()
                        } else {
                            None
                        };
                        self.spawn(Activity::Deploy { app, commit });
                    }
                    20..=23 if crashes < self.options.crashes => {
                        crashes += 1;
                        let app = self.rng.pick(&self.apps).cloned().expect("apps");
                        self.spawn(Activity::Crash { app });
                    }
                    0..=69 => {
                        let node = self.rng.pick(&self.nodes).cloned().expect("nodes");
                        let seed = self.rng.next_u64();
                        self.spawn(Activity::Agent { node, seed });
                    }
                    _ => self.spawn(Activity::Reconcile),
                }
            }
            let ids: Vec<u64> = self.tasks.keys().copied().collect();
            if let Some(&task) = self.rng.pick(&ids) {
                if let Err(problem) = self.release(task).await {
                    return Err(self.failure(Violation { invariant: "the scheduler keeps control", detail: problem }).await);
                }
            }
            if self.kills < self.options.kills && self.rng.chance(2) {
                self.kill().await;
            }
            self.advance(700);
            if self.options.check_every_step {
                self.check_always().await?;
            }
        }
        self.settle().await?;
        let state = self.state();
        let mut deployments = 0;
        for app in &self.apps {
            deployments += state.store.app_deployments(app).await.map(|d| d.len()).unwrap_or(0);
        }
        let commits = state.store.commits();
        for (_, slot) in std::mem::take(&mut self.tasks) {
            slot.handle.abort();
        }
        state.store.close().await;
        let crashes = self.world.lock().expect("world lock").crashes;
        Ok(Outcome { steps: self.step, kills: self.kills, crashes, deployments, commits })
    }

    /// No more requests or kills: let the agents and the reconciler work
    /// until nothing is left to do, then check the end state.
    async fn settle(&mut self) -> Result<(), SimFailure> {
        for round in 0..600 {
            while let Some(&task) = self.tasks.keys().next() {
                self.step += 1;
                if let Err(problem) = self.release(task).await {
                    return Err(self.failure(Violation { invariant: "the scheduler keeps control", detail: problem }).await);
                }
                if self.options.check_every_step {
                    self.check_always().await?;
                }
            }
            let state = self.state();
            let mut pending = false;
            for node in self.nodes.clone() {
                let outbox = self.world.lock().expect("world lock").outbox.get(&node).is_some_and(|o| !o.is_empty());
                if outbox || !state.store.pending_commands(&node).await.unwrap_or_default().is_empty() {
                    pending = true;
                    let seed = self.rng.next_u64();
                    self.spawn(Activity::Agent { node, seed });
                }
            }
            let mut unfinished = false;
            for app in &self.apps {
                for d in state.store.app_deployments(app).await.unwrap_or_default() {
                    unfinished |= !matches!(d.state.as_str(), "running" | "failed" | "superseded");
                    let instances = state.store.instances(&d.id).await.unwrap_or_default();
                    for i in &instances {
                        unfinished |= i.state == "stopping" || (i.state == "pending" && d.state != "running");
                    }
                    // Running with nothing left: the reconciler is yet to
                    // start its image again.
                    unfinished |= d.state == "running" && !instances.iter().any(|i| matches!(i.state.as_str(), "pending" | "running"));
                }
            }
            if !pending && !unfinished && round > 0 {
                break;
            }
            self.spawn(Activity::Reconcile);
            self.advance(2_000);
        }
        let state = self.state();
        for app in self.apps.clone() {
            let view = check::view(&state, &app).await;
            let deployments = state.store.app_deployments_ran(&app).await.unwrap_or_default();
            let found = {
                let world = self.world.lock().expect("world lock");
                let mut found = check::always(&app, &deployments, &world);
                found.extend(check::settled(&app, &view, &world, self.instances[&app]));
                found
            };
            if let Some(violation) = found.into_iter().next() {
                return Err(self.failure(violation).await);
            }
        }
        Ok(())
    }
}

/// Failures of many seeds, by the invariant each broke first.
#[derive(Debug, Default)]
pub struct Survey {
    pub runs: u64,
    pub kills: usize,
    pub crashes: usize,
    pub deployments: usize,
    pub failures: BTreeMap<&'static str, Vec<u64>>,
    /// The first failure's full report.
    pub first: Option<SimFailure>,
}

/// Runs `count` seeds from `first`, each with the options `options` makes
/// for it, and keeps going past failures.
pub fn survey(first: u64, count: u64, options: impl Fn(u64) -> Options) -> Survey {
    let mut survey = Survey::default();
    for seed in first..first.saturating_add(count) {
        survey.runs += 1;
        match run(&options(seed)) {
            Ok(outcome) => {
                survey.kills += outcome.kills;
                survey.crashes += outcome.crashes;
                survey.deployments += outcome.deployments;
            }
            Err(failure) => {
                survey.failures.entry(failure.violation.invariant).or_default().push(seed);
                if survey.first.is_none() {
                    survey.first = Some(failure);
                }
            }
        }
    }
    survey
}
