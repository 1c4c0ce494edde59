//! Executing queued commands. A command is acked only once it was handled
//! (or found impossible to handle); a transient failure such as an
//! unreachable Docker Engine leaves it un-acked, so the control plane
//! delivers it again. Ids already handled are remembered on disk so a lost
//! ack does not run a command twice.
//!
//! Commands run concurrently in lanes, one lane per deployment: the
//! commands of one deployment (its deploy, then its stop) run in queue
//! order, while a slow stop (a container that ignores SIGTERM waits out the
//! whole grace period), a long build or a command waiting to be retried
//! holds up nothing of any other deployment, of the same app or another.
//! Different deployments never share a container, so their commands need no
//! order between them. A stop that arrives while its deployment's deploy is
//! still running cancels that deploy (the build or start is abandoned and
//! cleaned up), then runs.
//!
//! Each command executes in its own task: a panic there settles that
//! command as failed (reported and acked) and its lane goes on, rather
//! than killing the lane's worker with the command stuck at its front.

use std::collections::{HashMap, HashSet, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cloudweb_protocol::{Command, CommandKind, DeployPayload, LogLine, Report, ServicePayload, ServiceRemovePayload, StopPayload, VolumeDeletePayload};
use tokio::sync::watch;

use crate::client::ControlPlane;
use crate::deploy::{DeployOptions, DeployOutcome};
use crate::files::write_private;
use crate::runtime::{DockerRuntime, RuntimeError};
use crate::timestamp::now_rfc3339;

const HANDLED_FILE: &str = "handled-commands.json";
/// How many handled ids to remember.
const HANDLED_MEMORY: usize = 1000;
/// How long a deploy may keep asking to be retried before the agent gives
/// up on it (reports its deployment failed and acks it), so no deployment
/// waits forever. Stops keep being retried: a try is cheap, it holds up
/// only its own deployment's lane, and giving up would leave a container
/// running that nothing manages.
const RETRY_LIMIT: Duration = Duration::from_secs(30 * 60);

/// The pause before the queue is read again for a command that asked to
/// be retried for the `attempt`th time: 2 s, doubling up to 30 s (the
/// default poll interval).
fn retry_delay(attempt: u32) -> Duration {
    Duration::from_secs(2u64.saturating_mul(1u64 << attempt.saturating_sub(1).min(5)).min(30))
}

/// What became of one command.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Done (or impossible); ack it.
    Handled,
    /// Could not be done now; leave it queued.
    Retry(String),
}

/// The commands of one deployment, in queue order; the first one runs.
#[derive(Default)]
struct Lane {
    queue: VecDeque<Command>,
    /// The instance of the deploy running now, and how to cancel it.
    running_deploy: Option<(u32, watch::Sender<bool>)>,
}

#[derive(Default)]
struct Lanes {
    lanes: HashMap<String, Lane>,
    /// Ids in some lane (queued or running).
    queued: HashSet<String>,
}

struct Inner {
    runtime: DockerRuntime,
    services: crate::services::Services,
    moves: crate::volume_moves::Moves,
    backups: crate::backups::Backups,
    tasks: crate::tasks::Tasks,
    deploy_options: DeployOptions,
    handled_path: PathBuf,
    handled: Mutex<VecDeque<String>>,
    lanes: Mutex<Lanes>,
    /// When each command first asked to be retried.
    retrying: Mutex<HashMap<String, Instant>>,
    /// How many times each command asked to be retried, for the pause
    /// before the queue is read again for it ([`retry_delay`]).
    attempts: Mutex<HashMap<String, u32>>,
    /// When the lanes' recent acks completed: a queue read that started
    /// before may still list the command, which is no lost ack.
    acked: Mutex<HashMap<String, Instant>>,
}

#[derive(Clone)]
pub struct Executor {
    inner: Arc<Inner>,
}

/// The lane of a command: its deployment, or its own id when the payload
/// names none (such a command is dropped anyway).
fn lane_key(command: &Command) -> String {
    match command.payload.get("deployment_id").and_then(|v| v.as_str()) {
        Some(deployment) => format!("deployment:{deployment}"),
        None => format!("command:{}", command.id),
    }
}

fn instance_of(command: &Command) -> Option<u32> {
    command.payload.get("instance").and_then(|v| v.as_u64()).and_then(|i| u32::try_from(i).ok())
}

impl Executor {
    pub fn new(
        runtime: DockerRuntime,
        services: crate::services::Services,
        backups: crate::backups::Backups,
        tasks: crate::tasks::Tasks,
        data_dir: &Path,
        deploy_options: DeployOptions,
    ) -> Executor {
        let handled_path = data_dir.join(HANDLED_FILE);
        let handled = std::fs::read(&handled_path)
            .ok()
            .and_then(|bytes| serde_json::from_slice::<VecDeque<String>>(&bytes).ok())
            .unwrap_or_default();
        Executor {
            inner: Arc::new(Inner {
                moves: crate::volume_moves::Moves::new(runtime.clone(), data_dir),
                runtime,
                services,
                backups,
                tasks,
                deploy_options,
                handled_path,
                handled: Mutex::new(handled),
                lanes: Mutex::new(Lanes::default()),
                retrying: Mutex::new(HashMap::new()),
                attempts: Mutex::new(HashMap::new()),
                acked: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// Reads the queue, acks what was already handled and hands every other
    /// command to its deployment's lane. Returns without waiting for them.
    pub async fn run_pending(&mut self, client: &Arc<ControlPlane>) -> Result<(), crate::client::ClientError> {
        let read_at = Instant::now();
        let pending = client.commands().await?;
        self.inner.acked.lock().expect("acked lock").retain(|_, at| at.elapsed() < Duration::from_secs(300));
        // Tries of commands the queue no longer holds are forgotten.
        self.inner.attempts.lock().expect("attempts lock").retain(|id, _| pending.commands.iter().any(|c| &c.id == id));
        for command in pending.commands {
            let in_lane = self.inner.lanes.lock().expect("lanes lock").queued.contains(&command.id);
            let acked_since_read = self.inner.acked.lock().expect("acked lock").get(&command.id).is_some_and(|at| *at >= read_at);
            if in_lane || acked_since_read {
                // Running, being acked, or acked after this read started:
                // acking it again would count a second ack.
                continue;
            }
            if self.inner.is_handled(&command.id) {
                // Handled before, but the ack was lost. A failed ack must not
                // keep the commands after it from their lanes.
                match client.ack(&command.id).await {
                    Ok(()) => tracing::info!(command = %command.id, kind = %command.kind, "command acked"),
                    Err(err) => tracing::warn!(command = %command.id, error = %err, "could not ack a handled command"),
                }
                continue;
            }
            self.enqueue(client, command);
        }
        Ok(())
    }

    fn enqueue(&self, client: &Arc<ControlPlane>, command: Command) {
        let key = lane_key(&command);
        let mut lanes = self.inner.lanes.lock().expect("lanes lock");
        // Checked again under the lanes lock: a worker may have finished
        // it since the caller looked.
        if self.inner.is_handled(&command.id) || !lanes.queued.insert(command.id.clone()) {
            return;
        }
        let is_stop = CommandKind::parse(&command.kind) == Some(CommandKind::Stop);
        let stop_instance = instance_of(&command);
        match lanes.lanes.get_mut(&key) {
            Some(lane) => {
                if let (true, Some((instance, cancel))) = (is_stop, &lane.running_deploy) {
                    if stop_instance.is_none_or(|i| i == *instance) {
                        tracing::info!(command = %command.id, lane = %key, "a stop arrived for a deploy in progress; cancelling the deploy");
                        let _ = cancel.send(true);
                    }
                }
                lane.queue.push_back(command);
            }
            None => {
                lanes.lanes.insert(key.clone(), Lane { queue: VecDeque::from([command]), running_deploy: None });
                tokio::spawn(self.clone().work(client.clone(), key));
            }
        }
    }

    /// Runs a lane's commands in order until it is empty, or until one must
    /// be retried: then the rest of the lane waits for the next read of the
    /// queue, which brings them all again.
    async fn work(self, client: Arc<ControlPlane>, key: String) {
        loop {
            let (command, cancel) = {
                let mut lanes = self.inner.lanes.lock().expect("lanes lock");
                let Some(lane) = lanes.lanes.get_mut(&key) else { return };
                let Some(command) = lane.queue.front().cloned() else {
                    lanes.lanes.remove(&key);
                    return;
                };
                let is_deploy = CommandKind::parse(&command.kind) == Some(CommandKind::Deploy);
                let instance = instance_of(&command).unwrap_or(1);
                // A deploy with its stop already queued behind it (cancelled
                // before it started) starts cancelled: it would be undone.
                let stopped = is_deploy
                    && lane.queue.iter().skip(1).any(|later| {
                        CommandKind::parse(&later.kind) == Some(CommandKind::Stop) && instance_of(later).is_none_or(|i| i == instance)
                    });
                let (sender, receiver) = watch::channel(stopped);
                if is_deploy {
                    lane.running_deploy = Some((instance, sender));
                }
                (command, receiver)
            };
            let outcome = {
                let (inner, client, command) = (self.inner.clone(), client.clone(), command.clone());
                isolated(async move { inner.execute(&client, &command, cancel).await }).await
            };
            let outcome = match outcome {
                Ok(outcome) => outcome,
                Err(Isolated::Panicked(panic)) => self.inner.fail_after_panic(&client, &command, &panic).await,
                // Only when the runtime shuts down: the command stays queued.
                Err(Isolated::Cancelled) => Outcome::Retry("the agent is shutting down".into()),
            };
            let outcome = match outcome {
                Outcome::Retry(reason) => self.inner.give_up_after_limit(&client, &command, reason).await,
                Outcome::Handled => Outcome::Handled,
            };
            match outcome {
                Outcome::Handled => {
                    {
                        let mut lanes = self.inner.lanes.lock().expect("lanes lock");
                        self.inner.retrying.lock().expect("retry lock").remove(&command.id);
                        self.inner.attempts.lock().expect("attempts lock").remove(&command.id);
                        self.inner.remember(&command.id);
                        if let Some(lane) = lanes.lanes.get_mut(&key) {
                            lane.queue.pop_front();
                            lane.running_deploy = None;
                        }
                    }
                    match client.ack(&command.id).await {
                        Ok(()) => {
                            self.inner.acked.lock().expect("acked lock").insert(command.id.clone(), Instant::now());
                            tracing::info!(command = %command.id, kind = %command.kind, "command acked")
                        }
                        // Remembered as handled: the next read acks it.
                        Err(err) => tracing::warn!(command = %command.id, error = %err, "could not ack; will ack on the next read"),
                    }
                    // Only now may a read of the queue ack it again.
                    self.inner.lanes.lock().expect("lanes lock").queued.remove(&command.id);
                }
                Outcome::Retry(reason) => {
                    tracing::warn!(command = %command.id, kind = %command.kind, %reason, "command will be retried");
                    // Later commands of this deployment may depend on this one.
                    {
                        let mut lanes = self.inner.lanes.lock().expect("lanes lock");
                        if let Some(lane) = lanes.lanes.remove(&key) {
                            for queued in lane.queue {
                                lanes.queued.remove(&queued.id);
                            }
                        }
                    }
                    // The queue is read again for it after a pause that
                    // grows with its tries, rather than at the next poll
                    // (30 s by default): a volume whose containers were
                    // still stopping is deleted seconds after they are gone.
                    let attempt = {
                        let mut attempts = self.inner.attempts.lock().expect("attempts lock");
                        let n = attempts.entry(command.id.clone()).or_insert(0);
                        *n += 1;
                        *n
                    };
                    let mut again = self.clone();
                    tokio::spawn(async move {
                        tokio::time::sleep(retry_delay(attempt)).await;
                        if let Err(err) = again.run_pending(&client).await {
                            tracing::debug!(error = %err, "could not read the command queue again; the next poll will");
                        }
                    });
                    return;
                }
            }
        }
    }
}

/// Why a command's own task ended without an outcome.
#[derive(Debug, PartialEq, Eq)]
enum Isolated {
    /// It panicked; the panic's message, if it had a text one.
    Panicked(String),
    /// The runtime dropped it (shutdown).
    Cancelled,
}

/// Runs one command's execution in its own task, so a panic (a bug, or
/// input nobody foresaw) ends that task only: the lane's worker survives,
/// settles the command and goes on with the commands queued behind it,
/// instead of dying with the command still at the lane's front, never
/// acked, and every later command of the deployment (its stop) stuck.
async fn isolated<F>(work: F) -> Result<Outcome, Isolated>
where
    F: std::future::Future<Output = Outcome> + Send + 'static,
{
    match tokio::spawn(work).await {
        Ok(outcome) => Ok(outcome),
        Err(err) if err.is_panic() => {
            let panic = err.into_panic();
            let message = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic without a message".to_string());
            Err(Isolated::Panicked(message))
        }
        Err(_) => Err(Isolated::Cancelled),
    }
}

impl Inner {
    /// A command whose execution panicked is settled as failed: retrying
    /// would most likely panic again, forever. A deploy's deployment is
    /// reported failed, and so is a `task_run`'s run (unless something
    /// works on it or it ended); a stop's deployment gets the reason as a
    /// log line (its state is the control plane's to judge). Either way the command
    /// is acked. The panic's text stays in the agent's log: it may quote
    /// anything, and reports are shown to users.
    async fn fail_after_panic(&self, client: &ControlPlane, command: &Command, panic: &str) -> Outcome {
        tracing::error!(command = %command.id, kind = %command.kind, %panic, "handling a command panicked; settling it as failed");
        let reason = format!(
            "the agent hit an internal error handling {} command {}; see the agent's log on the node",
            command.kind, command.id
        );
        if let Some(id) = command.payload.get("deployment_id").and_then(|v| v.as_str()) {
            let mut report = Report::new(id);
            report.instance = instance_of(command);
            if CommandKind::parse(&command.kind) == Some(CommandKind::Deploy) {
                report.state = Some("failed".into());
                report.message = Some(cloudweb_protocol::misc::one_line(&reason, cloudweb_protocol::misc::MAX_REPORT_MESSAGE));
            } else {
                report.logs = vec![LogLine { ts: now_rfc3339(), stream: "agent".into(), line: reason.clone() }];
            }
            if report.validate().is_ok() {
                if let Err(err) = client.report(&report).await {
                    tracing::warn!(error = %err, "could not report the command that panicked");
                }
            }
        }
        if CommandKind::parse(&command.kind) == Some(CommandKind::TaskRun) {
            self.tasks.fail_unstarted(&command.payload, reason).await;
        }
        Outcome::Handled
    }

    fn is_handled(&self, id: &str) -> bool {
        self.handled.lock().expect("handled lock").contains(&id.to_string())
    }

    /// Keeps a retried command queued, unless it is a deploy retried for
    /// longer than [`RETRY_LIMIT`]: then its deployment is reported failed
    /// (with the last reason) and the command is handled.
    async fn give_up_after_limit(&self, client: &ControlPlane, command: &Command, reason: String) -> Outcome {
        if CommandKind::parse(&command.kind) != Some(CommandKind::Deploy) {
            return Outcome::Retry(reason);
        }
        let first = *self.retrying.lock().expect("retry lock").entry(command.id.clone()).or_insert_with(Instant::now);
        if first.elapsed() < RETRY_LIMIT {
            return Outcome::Retry(reason);
        }
        tracing::error!(command = %command.id, kind = %command.kind, %reason, "giving up on a command retried for {} minutes", RETRY_LIMIT.as_secs() / 60);
        if let Some(id) = command.payload.get("deployment_id").and_then(|v| v.as_str()) {
            let mut report = Report::new(id);
            report.state = Some("failed".into());
            report.instance = instance_of(command);
            report.message = Some(format!("the agent gave up after {} minutes: {reason}", RETRY_LIMIT.as_secs() / 60));
            if let Err(err) = client.report(&report).await {
                tracing::warn!(error = %err, "could not report the command it gave up on");
            }
        }
        Outcome::Handled
    }

    async fn execute(&self, client: &Arc<ControlPlane>, command: &Command, cancel: watch::Receiver<bool>) -> Outcome {
        match CommandKind::parse(&command.kind) {
            Some(CommandKind::Stop) => self.stop(client, command).await,
            Some(CommandKind::Deploy) => self.deploy(client, command, cancel).await,
            Some(CommandKind::VolumeDelete) => self.delete_volume(command).await,
            Some(CommandKind::ServiceRun) => match serde_json::from_value::<ServicePayload>(command.payload.clone()) {
                Ok(spec) => match self.services.run(spec) {
                    Ok(()) => Outcome::Handled,
                    Err(crate::services::RunRefusal::NotRecorded(reason)) => Outcome::Retry(reason),
                    Err(crate::services::RunRefusal::Invalid(reason)) => {
                        tracing::error!(command = %command.id, %reason, "invalid service_run payload; dropping the command");
                        Outcome::Handled
                    }
                },
                Err(err) => {
                    tracing::error!(command = %command.id, error = %err, "invalid service_run payload; dropping the command");
                    Outcome::Handled
                }
            },
            Some(CommandKind::ServiceRemove) => match serde_json::from_value::<ServiceRemovePayload>(command.payload.clone()) {
                Ok(payload) if payload.validate().is_ok() => match self.services.remove(&payload.service).await {
                    Ok(()) => Outcome::Handled,
                    Err(reason) => Outcome::Retry(format!("service {}: {reason}", payload.service)),
                },
                _ => {
                    tracing::error!(command = %command.id, "invalid service_remove payload; dropping the command");
                    Outcome::Handled
                }
            },
            Some(CommandKind::VolumeReceive) => self.move_step(client, command, |moves, client, p| async move { moves.receive(&client, p).await }).await,
            Some(CommandKind::VolumeSend) => self.move_step(client, command, |moves, client, p| async move { moves.send(&client, p).await }).await,
            Some(CommandKind::VolumeMoveAbort) => self.move_step(client, command, |moves, client, p| async move { moves.abort(&client, p).await }).await,
            Some(CommandKind::VolumeRelease) => self.move_step(client, command, |moves, client, p| async move { moves.release(&client, p).await }).await,
            Some(CommandKind::VolumePurge) => self.move_step(client, command, |moves, client, p| async move { moves.purge(&client, p).await }).await,
            Some(CommandKind::BackupRun) => self.backup_step(command, |backups, p| backups.run(p)),
            Some(CommandKind::BackupVerify) => self.backup_step(command, |backups, p| backups.verify(p)),
            Some(CommandKind::BackupRestore) => self.backup_step(command, |backups, p| backups.restore(p)),
            Some(CommandKind::BackupCancel) => match serde_json::from_value::<cloudweb_protocol::BackupCancelPayload>(command.payload.clone()) {
                Ok(payload) => match self.backups.cancel(&payload) {
                    Ok(true) => Outcome::Handled,
                    Ok(false) => {
                        tracing::info!(command = %command.id, job_id = %payload.job_id, "no such backup job runs here; nothing to cancel");
                        Outcome::Handled
                    }
                    Err(reason) => {
                        tracing::error!(command = %command.id, %reason, "invalid backup_cancel payload; dropping the command");
                        Outcome::Handled
                    }
                },
                Err(err) => {
                    tracing::error!(command = %command.id, error = %err, "invalid backup_cancel payload; dropping the command");
                    Outcome::Handled
                }
            },
            Some(CommandKind::TaskRun) => self.task_step(command, self.tasks.run_command(command.payload.clone()).await),
            Some(CommandKind::TaskCancel) => self.task_step(command, self.tasks.cancel_command(command.payload.clone()).await),
            Some(CommandKind::SessionOpen) => match serde_json::from_value::<cloudweb_protocol::SessionOpenPayload>(command.payload.clone()) {
                // A session runs in its own task; the command is done once
                // it started (a session delivered again finds itself
                // attached already and ends at once).
                Ok(payload) if payload.validate().is_ok() => {
                    crate::sessions::spawn(self.runtime.clone(), client.clone(), payload);
                    Outcome::Handled
                }
                _ => {
                    tracing::error!(command = %command.id, "invalid session_open payload; dropping the command");
                    Outcome::Handled
                }
            },
            None => {
                // Nothing to report to: an unknown type names no deployment.
                tracing::error!(command = %command.id, kind = %command.kind, "this agent cannot handle this command type; dropping it");
                Outcome::Handled
            }
        }
    }

    /// Runs a volume-move command with its payload, once it parses.
    async fn move_step<P, F, Fut>(&self, client: &Arc<ControlPlane>, command: &Command, run: F) -> Outcome
    where
        P: serde::de::DeserializeOwned,
        F: FnOnce(crate::volume_moves::Moves, Arc<ControlPlane>, P) -> Fut,
        Fut: std::future::Future<Output = crate::volume_moves::Step>,
    {
        let payload: P = match serde_json::from_value(command.payload.clone()) {
            Ok(payload) => payload,
            Err(err) => {
                tracing::error!(command = %command.id, kind = %command.kind, error = %err, "invalid payload; dropping the command");
                return Outcome::Handled;
            }
        };
        match run(self.moves.clone(), client.clone(), payload).await {
            crate::volume_moves::Step::Done => Outcome::Handled,
            crate::volume_moves::Step::Retry(reason) => Outcome::Retry(reason),
        }
    }

    /// Hands a backup job to [`crate::backups`], which runs it in the
    /// background and reports on it: the command is handled once taken.
    fn backup_step<P, F>(&self, command: &Command, start: F) -> Outcome
    where
        P: serde::de::DeserializeOwned,
        F: FnOnce(&crate::backups::Backups, P) -> crate::backups::Accepted,
    {
        let payload: P = match serde_json::from_value(command.payload.clone()) {
            Ok(payload) => payload,
            Err(err) => {
                tracing::error!(command = %command.id, kind = %command.kind, error = %err, "invalid payload; dropping the command");
                return Outcome::Handled;
            }
        };
        match start(&self.backups, payload) {
            crate::backups::Accepted::Invalid(reason) => tracing::error!(command = %command.id, kind = %command.kind, %reason, "invalid payload; dropping the command"),
            accepted => tracing::info!(command = %command.id, kind = %command.kind, ?accepted, "backup job taken"),
        }
        Outcome::Handled
    }

    /// A task command's outcome: acked once its run started, was taken up,
    /// was reported again or was found impossible (see [`crate::tasks`]).
    fn task_step(&self, command: &Command, taken: crate::tasks::Taken) -> Outcome {
        match taken {
            crate::tasks::Taken::Retry(reason) => Outcome::Retry(reason),
            crate::tasks::Taken::Invalid(reason) => {
                tracing::warn!(command = %command.id, kind = %command.kind, %reason, "invalid payload; dropping the command");
                Outcome::Handled
            }
            taken => {
                tracing::info!(command = %command.id, kind = %command.kind, ?taken, "task command taken");
                Outcome::Handled
            }
        }
    }

    async fn deploy(&self, client: &Arc<ControlPlane>, command: &Command, cancel: watch::Receiver<bool>) -> Outcome {
        let payload: DeployPayload = match serde_json::from_value(command.payload.clone()) {
            Ok(payload) => payload,
            Err(err) => {
                tracing::error!(command = %command.id, error = %err, "invalid deploy payload");
                // Tell the control plane if the payload at least names its deployment.
                if let Some(id) = command.payload.get("deployment_id").and_then(|v| v.as_str()) {
                    let mut report = Report::new(id);
                    report.state = Some("failed".into());
                    report.message = Some(format!("the agent could not read the deploy command: {err}"));
                    report.instance = instance_of(command);
                    if report.validate().is_ok() {
                        let _ = client.report(&report).await;
                    }
                }
                return Outcome::Handled;
            }
        };
        tracing::info!(command = %command.id, deployment = %payload.deployment_id, instance = payload.instance, "deploying");
        match crate::deploy::deploy(&self.runtime, client, &self.deploy_options, payload, cancel).await {
            DeployOutcome::Done => Outcome::Handled,
            DeployOutcome::Retry(reason) => Outcome::Retry(reason),
        }
    }

    async fn stop(&self, client: &ControlPlane, command: &Command) -> Outcome {
        let payload: StopPayload = match serde_json::from_value(command.payload.clone()) {
            Ok(payload) => payload,
            Err(err) => {
                tracing::error!(command = %command.id, error = %err, "invalid stop payload; dropping the command");
                return Outcome::Handled;
            }
        };
        if let Err(err) = payload.validate() {
            tracing::error!(command = %command.id, error = %err, "invalid stop payload; dropping the command");
            return Outcome::Handled;
        }
        tracing::info!(deployment = %payload.deployment_id, instance = ?payload.instance, command = %command.id, "stopping");
        match self.runtime.stop_deployment(&payload.deployment_id, payload.instance).await {
            Ok(count) => {
                let line = format!("stopped {count} container(s) of {}", payload.deployment_id);
                tracing::info!(command = %command.id, "{line}");
                let mut report = Report::new(payload.deployment_id.clone());
                report.state = payload.instance.map(|_| "stopped".to_string());
                report.instance = payload.instance;
                report.logs = vec![LogLine { ts: now_rfc3339(), stream: "agent".into(), line }];
                if let Err(err) = client.report(&report).await {
                    // Also when the app was deleted meanwhile (404): the
                    // containers are gone, which is what counts.
                    tracing::warn!(error = %err, "could not report the stop");
                }
                Outcome::Handled
            }
            Err(RuntimeError::Unavailable(reason)) => Outcome::Retry(reason),
            Err(RuntimeError::Engine(err)) => Outcome::Retry(err.to_string()),
            Err(RuntimeError::Failed(reason)) => Outcome::Retry(reason),
        }
    }

    async fn delete_volume(&self, command: &Command) -> Outcome {
        let payload: VolumeDeletePayload = match serde_json::from_value(command.payload.clone()) {
            Ok(payload) => payload,
            Err(err) => {
                tracing::error!(command = %command.id, error = %err, "invalid volume_delete payload; dropping the command");
                return Outcome::Handled;
            }
        };
        match crate::volumes::delete(&self.runtime, &self.deploy_options.data_dir, &payload).await {
            crate::volumes::Deletion::Deleted => {
                tracing::info!(command = %command.id, volume = %payload.volume, "deleted the volume's data on request");
                Outcome::Handled
            }
            crate::volumes::Deletion::Absent => {
                tracing::info!(command = %command.id, volume = %payload.volume, "the volume had no data on this node");
                Outcome::Handled
            }
            crate::volumes::Deletion::Retry(reason) => Outcome::Retry(format!("volume {}: {reason}", payload.volume)),
            crate::volumes::Deletion::Invalid(reason) => {
                tracing::error!(command = %command.id, %reason, "invalid volume_delete payload; dropping the command");
                Outcome::Handled
            }
        }
    }

    fn remember(&self, id: &str) {
        let mut handled = self.handled.lock().expect("handled lock");
        handled.push_back(id.to_string());
        while handled.len() > HANDLED_MEMORY {
            handled.pop_front();
        }
        let bytes = serde_json::to_vec(&*handled).expect("ids serialize");
        if let Err(err) = write_private(&self.handled_path, &bytes) {
            tracing::warn!(error = %err, "could not record handled commands");
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_retried_command_is_tried_again_sooner_then_at_the_poll_pace() {
        let delays: Vec<u64> = (1..=7).map(|n| super::retry_delay(n).as_secs()).collect();
        assert_eq!(delays, [2, 4, 8, 16, 30, 30, 30]);
        assert_eq!(super::retry_delay(u32::MAX).as_secs(), 30);
    }

    use super::*;
    use serde_json::json;

    fn command(id: &str, kind: &str, payload: serde_json::Value) -> Command {
        Command { id: id.into(), kind: kind.into(), payload, created_at: String::new() }
    }

    #[tokio::test]
    async fn a_panicking_command_is_isolated_and_its_lane_goes_on() {
        // The worker survives a panic in the command's task and gets its
        // message back, both for a literal and a formatted panic.
        let outcome = isolated(async { panic!("boom") }).await;
        assert_eq!(outcome, Err(Isolated::Panicked("boom".into())));
        let id = "dep_x";
        let outcome = isolated(async move { panic!("no container for {id}") }).await;
        assert_eq!(outcome, Err(Isolated::Panicked("no container for dep_x".into())));
        // A normal outcome passes through, and the worker goes on with the
        // next command after a panic (as `work` does with a lane).
        let mut outcomes = Vec::new();
        for step in 0..3 {
            outcomes.push(isolated(async move {
                if step == 1 {
                    panic!("step {step}");
                }
                Outcome::Handled
            })
            .await);
        }
        assert_eq!(outcomes, vec![Ok(Outcome::Handled), Err(Isolated::Panicked("step 1".into())), Ok(Outcome::Handled)]);
    }

    #[test]
    fn lanes_follow_deployments() {
        let deploy = command("c1", "deploy", json!({"deployment_id": "dep_a", "instance": 2}));
        let stop = command("c2", "stop", json!({"deployment_id": "dep_a"}));
        let other = command("c3", "stop", json!({"deployment_id": "dep_b", "instance": 1}));
        let odd = command("c4", "reboot", json!({}));
        assert_eq!(lane_key(&deploy), lane_key(&stop), "a deployment's commands keep their order");
        assert_ne!(lane_key(&deploy), lane_key(&other), "another deployment's stop does not wait");
        assert_eq!(lane_key(&odd), "command:c4");
        assert_eq!(instance_of(&deploy), Some(2));
        assert_eq!(instance_of(&stop), None);
    }
}
