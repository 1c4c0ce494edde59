//! `cloudweb-agent run`: the heartbeat loop and the command loop.
//!
//! Commands arrive through the event stream, which only says "look again";
//! the agent then reads its queue. When the stream is down it polls. When the
//! control plane answers 426, the client holds every request (see
//! [`crate::client`]) and the loops log the supported range as an error.
//!
//! `run` returns on SIGTERM or SIGINT after a clean shutdown (Caddy run as
//! a child stopped, builder containers removed), and with
//! [`RunError::Removed`] when the control plane says this node is no
//! longer registered: retrying could never succeed, so the agent removes
//! every container labelled with its node id (its instances already run
//! elsewhere) and stops.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures_util::{Stream, StreamExt};

use crate::capacity;
use crate::client::{ClientError, ControlPlane};
use crate::commands::Executor;
use crate::deploy::DeployOptions;
use crate::ingress::{IngressOptions, IngressShared};
use tokio::sync::Notify;
use crate::identity::{Identity, IdentityError};
use crate::runtime::{DockerRuntime, RuntimeError};

#[derive(Debug, Clone)]
pub struct RunOptions {
    pub data_dir: PathBuf,
    pub heartbeat_interval: Duration,
    /// Poll the queue this often even while the stream is up.
    pub poll_interval: Duration,
    /// Pace after a 426.
    pub upgrade_retry: Duration,
    pub docker_host: String,
    pub protocol: u32,
    pub deploy: DeployOptions,
    /// Set on nodes that joined with `--ingress`.
    pub ingress: Option<IngressOptions>,
    /// Set when the agent runs the WireGuard mesh.
    pub mesh: Option<crate::mesh::MeshOptions>,
    /// How often a usage sample goes out with a heartbeat.
    pub metrics_interval: Duration,
    /// How often the registry is checked.
    pub health_interval: Duration,
    /// Check this registry address instead of the one the control plane gives.
    pub registry_check_address: Option<String>,
    /// Images of each app kept on the node, and how often the rest of the
    /// superseded ones are pruned (see [`crate::prune`]).
    pub keep_images: usize,
    pub image_prune_interval: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Identity(#[from] IdentityError),
    #[error(transparent)]
    Client(#[from] ClientError),
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    #[error("cannot handle signals: {0}")]
    Signals(std::io::Error),
    #[error("this node was removed from the cluster ({0}); join again with a new token to bring it back")]
    Removed(String),
    #[error("this node's certificate expired at {0} (the agent was not running when it was due for renewal); create a join token and run `cloudweb-agent join --server ... --token ... --ca-sha256 ...` on this node: it re-joins as the same node, with its name and instances")]
    CertificateExpired(String),
}

/// Exit status of `cloudweb-agent run` when the node's certificate has
/// expired (also in the unit's `RestartPreventExitStatus`).
pub const EXIT_CERT_EXPIRED: u8 = 77;

/// Exit status of `cloudweb-agent run` when the node was removed (the
/// systemd unit lists it in `RestartPreventExitStatus`, so it is not
/// restarted).
pub const EXIT_REMOVED: u8 = 78;

/// How long the shutdown may take before the agent exits anyway.
const SHUTDOWN_LIMIT: Duration = Duration::from_secs(15);

pub async fn run(options: RunOptions) -> Result<(), RunError> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut terminate = signal(SignalKind::terminate()).map_err(RunError::Signals)?;
    let mut interrupt = signal(SignalKind::interrupt()).map_err(RunError::Signals)?;
    let identity = Identity::load(&options.data_dir)?;
    let validity = identity.validity()?;
    if validity.expired_at(std::time::SystemTime::now()) {
        return Err(RunError::CertificateExpired(validity.not_after_text()));
    }
    let client = Arc::new(
        ControlPlane::for_node(&identity, options.protocol)?
            .with_upgrade_retry(options.upgrade_retry)
            .keeping_replicas_in(options.data_dir.join(crate::control_planes::FILE)),
    );
    let runtime = DockerRuntime::new(&options.docker_host, &identity.info.node_id)?;
    // A builder container left by an agent that was killed mid-build would
    // run on beside the one the redelivered deploy starts. It goes in the
    // background: heartbeats start at once, and only the command loop
    // waits for it (so never two builders run).
    let (builders_gone, leftovers_removed) = tokio::sync::watch::channel(false);
    let services = crate::services::Services::new(runtime.clone(), &options.data_dir, options.mesh.as_ref().map(|m| m.mesh_address.to_string()));
    // Before the services' supervisor starts: a service whose data an
    // earlier agent was swapping stays held until the swap is settled.
    let backups = crate::backups::Backups::new(runtime.clone(), services.clone(), &options.data_dir, client.clone());
    let task_runs = crate::tasks::Tasks::new(
        runtime.clone(),
        &options.data_dir,
        Arc::new(crate::tasks::Link::new(client.clone(), options.deploy.docker_certs_dir.clone())),
    );
    {
        let (runtime, backups, task_runs) = (runtime.clone(), backups.clone(), task_runs.clone());
        tokio::spawn(async move {
            remove_builders(&runtime, "left by an earlier agent").await;
            // Backup jobs an earlier agent left halfway are settled before
            // a command delivered again could find their leftovers.
            if tokio::time::timeout(BACKUP_RECOVERY_LIMIT, backups.recover()).await.is_err() {
                tracing::warn!("settling the backup jobs of an earlier agent took over {} s; going on", BACKUP_RECOVERY_LIMIT.as_secs());
            }
            // Task containers an earlier agent waited for are waited for
            // again (their slots taken) before a command delivered again
            // could start a second one; the periodic sweep catches what
            // this one misses.
            if tokio::time::timeout(TASK_RECOVERY_LIMIT, task_runs.sweep()).await.is_err() {
                tracing::warn!("taking up the task runs of an earlier agent took over {} s; going on", TASK_RECOVERY_LIMIT.as_secs());
            }
            let _ = builders_gone.send(true);
        });
    }
    match crate::build::firewall::isolate(crate::runtime::BUILD_BRIDGE).await {
        Ok(0) => {}
        Ok(added) => tracing::info!(added, bridge = crate::runtime::BUILD_BRIDGE, "firewall rules keep builds off the host and private networks"),
        Err(err) => tracing::warn!(error = %err, "builds can reach the host's services and private networks"),
    }
    let executor = Executor::new(runtime.clone(), services.clone(), backups.clone(), task_runs.clone(), &options.data_dir, options.deploy.clone());
    let samples = Arc::new(crate::usage::Latest::default());
    let mut tasks = vec![tokio::spawn(crate::renew::renewer(client.clone(), identity.clone(), options.data_dir.clone()))];
    tasks.push(tokio::spawn(crate::usage::sampler(runtime.clone(), options.data_dir.clone(), options.metrics_interval, samples.clone())));
    let probe_host = match options.deploy.publish_ip.as_str() {
        "0.0.0.0" => "127.0.0.1".to_string(),
        "::" => "::1".to_string(),
        ip => ip.to_string(),
    };
    let restart_reasons = crate::crash_loops::RestartReasons::default();
    tasks.push(tokio::spawn(crate::liveness::supervise(
        runtime.clone(),
        client.clone(),
        probe_host,
        options.deploy.advertise_host.clone(),
        restart_reasons.clone(),
    )));
    tasks.push(tokio::spawn(crate::crash_loops::watch(
        runtime.clone(),
        client.clone(),
        restart_reasons,
    )));
    let health = Arc::new(crate::health::Latest::default());
    tasks.push(tokio::spawn(crate::health::checker(
        client.clone(),
        runtime.clone(),
        options.health_interval,
        options.registry_check_address.clone(),
        health.clone(),
    )));
    tracing::info!(node_id = %identity.info.node_id, server = %identity.info.server, "agent running");
    let shared = Arc::new(IngressShared::default());
    let routes_changed = Arc::new(Notify::new());
    let (stop_ingress, ingress_stopped) = tokio::sync::watch::channel(false);
    let ingress = options
        .ingress
        .clone()
        .map(|ingress| tokio::spawn(crate::ingress::run(client.clone(), ingress, routes_changed.clone(), shared.clone(), ingress_stopped)));
    let mesh = Arc::new(crate::mesh::MeshShared::default());
    let peers_changed = Arc::new(Notify::new());
    if let Some(mesh_options) = options.mesh.clone() {
        tasks.push(tokio::spawn(crate::mesh::run(client.clone(), mesh_options, peers_changed.clone(), mesh.clone())));
    }
    tasks.push(tokio::spawn(crate::logs::run(client.clone(), runtime.clone())));
    tasks.push(tokio::spawn(crate::prune::pruner(client.clone(), runtime.clone(), options.image_prune_interval, options.keep_images)));
    tasks.push(tokio::spawn(services.clone().supervise()));
    tasks.push(tokio::spawn(task_runs.housekeeping()));
    tasks.push(tokio::spawn(crate::service_logs::run(client.clone(), runtime.clone(), services.clone())));
    tasks.push(tokio::spawn(heartbeat_loop(client.clone(), options.clone(), shared, samples, health, mesh, services)));
    let commands_client = client.clone();
    tasks.push(tokio::spawn(async move {
        let mut leftovers_removed = leftovers_removed;
        let _ = leftovers_removed.wait_for(|gone| *gone).await;
        command_loop(commands_client, executor, options, routes_changed, peers_changed).await
    }));
    // The loops run until one of these happens.
    let removed = tokio::select! {
        _ = client.removed() => true,
        _ = terminate.recv() => {
            tracing::info!("SIGTERM: shutting down");
            false
        }
        _ = interrupt.recv() => {
            tracing::info!("SIGINT: shutting down");
            false
        }
    };
    // First, so that a deploy in progress gives its command back instead of
    // reporting the failure the clean-up below would cause.
    crate::shutdown::begin();
    let shutdown = async {
        // Paused containers unpaused, throwaways removed, reports sent.
        backups.shutdown(BACKUP_SHUTDOWN_LIMIT).await;
        for task in &tasks {
            task.abort();
        }
        let _ = stop_ingress.send(true);
        if let Some(ingress) = ingress {
            let _ = ingress.await;
        }
        for task in tasks {
            let _ = task.await;
        }
        // A deploy cut off mid-build was not acked and comes again.
        remove_builders(&runtime, "of an interrupted build").await;
    };
    if tokio::time::timeout(SHUTDOWN_LIMIT, shutdown).await.is_err() {
        tracing::warn!("the shutdown took longer than {} s; exiting anyway", SHUTDOWN_LIMIT.as_secs());
    }
    if removed {
        // The control plane has already placed this node's instances
        // elsewhere; copies left here would keep their published ports
        // (and the ingress its :80/:443) on a machine that is no longer
        // part of the cluster.
        remove_everything(&runtime).await;
        let err = RunError::Removed(format!("the control plane answers 403 {}", cloudweb_protocol::error_codes::NODE_NOT_REGISTERED));
        tracing::error!(exit_code = EXIT_REMOVED, "{err}");
        return Err(err);
    }
    tracing::info!("agent stopped");
    Ok(())
}

/// How long settling an earlier agent's backup jobs may hold the command
/// loop.
const BACKUP_RECOVERY_LIMIT: Duration = Duration::from_secs(120);
/// How long taking up an earlier agent's task runs may hold the command
/// loop.
const TASK_RECOVERY_LIMIT: Duration = Duration::from_secs(60);
/// How long the running backup jobs get to stop at a shutdown.
const BACKUP_SHUTDOWN_LIMIT: Duration = Duration::from_secs(8);

/// How long listing the builder containers, and then killing and
/// removing each, may take.
const BUILDER_REMOVAL_LIMIT: Duration = Duration::from_secs(10);

/// Kills and removes this node's build step containers; `why` goes in
/// the log, which says which step did not work: the Docker Engine did not
/// list the containers, or did not remove one of them (and why).
async fn remove_builders(runtime: &DockerRuntime, why: &str) {
    let limit = BUILDER_REMOVAL_LIMIT.as_secs();
    let found = match tokio::time::timeout(BUILDER_REMOVAL_LIMIT, runtime.builders()).await {
        Ok(Ok(found)) => found,
        Ok(Err(err)) => {
            tracing::warn!(error = %err, "could not list builder containers {why}; any there remain");
            return;
        }
        Err(_) => {
            tracing::warn!("the Docker Engine did not list containers within {limit} s; builder containers {why} may remain");
            return;
        }
    };
    let mut removed = Vec::new();
    for (id, name, state) in found {
        match tokio::time::timeout(BUILDER_REMOVAL_LIMIT, runtime.kill_and_remove(&id)).await {
            Ok(Ok(())) => removed.push(format!("{name} ({state})")),
            Ok(Err(err)) => tracing::warn!(container = %name, state = %state, error = %err, "could not remove a builder container {why}"),
            Err(_) => tracing::warn!(
                container = %name,
                state = %state,
                "the Docker Engine had not finished removing the builder container {why} after {limit} s; the engine goes on removing it, and the next start removes it if it is still there"
            ),
        }
    }
    if !removed.is_empty() {
        tracing::info!(count = removed.len(), containers = %removed.join(", "), "removed builder containers {why}");
    }
}

/// How long removing a removed node's containers may take: one stop
/// grace period (they stop together) and some room for the engine.
const REMOVAL_LIMIT: Duration = Duration::from_secs(30);

/// Stops and removes every container of this node (see
/// [`DockerRuntime::remove_everything_of_this_node`]), within
/// [`REMOVAL_LIMIT`], logging what was removed and what was not.
async fn remove_everything(runtime: &DockerRuntime) {
    match tokio::time::timeout(REMOVAL_LIMIT, runtime.remove_everything_of_this_node()).await {
        Ok(Ok((removed, failed))) => {
            for name in removed {
                tracing::info!(container = %name, "removed this removed node's container");
            }
            for (name, err) in failed {
                tracing::error!(container = %name, error = %err, "could not remove this removed node's container");
            }
        }
        Ok(Err(err)) => tracing::error!(error = %err, "could not list this removed node's containers; they may still run"),
        Err(_) => tracing::error!("the Docker Engine did not remove this node's containers within {} s; some may still run", REMOVAL_LIMIT.as_secs()),
    }
}

/// How long to wait before the next try, given the last result.
pub fn next_delay(result: &Result<(), ClientError>, normal: Duration, upgrade_retry: Duration) -> Duration {
    match result {
        Err(ClientError::UpgradeRequired(_)) => upgrade_retry,
        _ => normal,
    }
}

pub(crate) fn log_failure(what: &str, err: &ClientError, upgrade_retry: Duration) {
    match err {
        // Nothing was sent; the 426 that closed the gate was logged.
        ClientError::Held { .. } => tracing::debug!("{what}: {err}"),
        // `run` logs this once and stops.
        ClientError::Removed(_) => tracing::debug!("{what}: {err}"),
        ClientError::UpgradeRequired(body) => tracing::error!(
            agent_protocol = body.agent_protocol,
            supported_min = body.supported_min,
            supported_max = body.supported_max,
            upgrade = ?body.upgrade,
            retry_in_seconds = upgrade_retry.as_secs(),
            "{what}: the control plane supports protocols {} to {}: {}",
            body.supported_min,
            body.supported_max,
            body.error
        ),
        ClientError::Status { status: 401 | 403, message } => {
            tracing::error!("{what}: the control plane refused this node: {message}")
        }
        other => tracing::warn!("{what}: {other}"),
    }
}

async fn heartbeat_loop(
    client: Arc<ControlPlane>,
    options: RunOptions,
    ingress: Arc<IngressShared>,
    samples: Arc<crate::usage::Latest>,
    health: Arc<crate::health::Latest>,
    mesh: Arc<crate::mesh::MeshShared>,
    services: crate::services::Services,
) {
    let mut last_traffic = tokio::time::Instant::now();
    loop {
        let mut heartbeat = capacity::measure(&options.data_dir);
        // This agent builds static sites (it ships the static server); it
        // reports traffic only while its ingress actually runs.
        let ingress_active = ingress.active.load(std::sync::atomic::Ordering::Relaxed);
        let mut features = vec![
            cloudweb_protocol::features::STATIC_SITES.to_string(),
            cloudweb_protocol::features::VOLUMES.to_string(),
            cloudweb_protocol::features::SERVICES.to_string(),
            cloudweb_protocol::features::VOLUME_MOVES.to_string(),
            cloudweb_protocol::features::SERVICE_OPS.to_string(),
            cloudweb_protocol::features::BACKUPS.to_string(),
            cloudweb_protocol::features::TASKS.to_string(),
            cloudweb_protocol::features::SESSIONS.to_string(),
            cloudweb_protocol::features::PROBE_CHECKS.to_string(),
        ];
        if ingress_active {
            features.push(cloudweb_protocol::features::TRAFFIC_METRICS.to_string());
        }
        let registry = health.registry.lock().expect("health lock").clone();
        heartbeat.mesh_endpoint = mesh.endpoint.lock().expect("mesh lock").clone();
        let backend = *mesh.backend.lock().expect("mesh lock");
        let mesh_health = mesh.health.lock().expect("mesh lock").clone();
        // Which WireGuard the mesh runs on, while it runs.
        if let (Some(_), Some(backend)) = (&mesh_health, backend) {
            features.push(backend.feature().to_string());
            features.push(cloudweb_protocol::features::MESH_RELAY.to_string());
        }
        let statuses = services.statuses();
        heartbeat.health = Some(cloudweb_protocol::Health {
            registry,
            mesh: mesh_health,
            features: Some(features),
            services: (!statuses.is_empty()).then_some(statuses),
        });
        heartbeat.ingress = ingress.status.lock().expect("status lock").clone();
        // A usage sample goes out once, with the first heartbeat after it
        // was taken; traffic rides along at the same pace.
        let mut metrics = samples.sample.lock().expect("sample lock").take();
        if ingress_active && last_traffic.elapsed() >= options.metrics_interval {
            last_traffic = tokio::time::Instant::now();
            let known = ingress.known_hosts.lock().expect("hosts lock").clone();
            let (traffic, omitted) = ingress.counter.take_sample(&known, cloudweb_protocol::heartbeat::MAX_TRAFFIC_HOSTS);
            let sample = metrics.get_or_insert_with(Default::default);
            sample.traffic = Some(traffic);
            sample.traffic_omitted = Some(omitted);
        }
        heartbeat.metrics = metrics;
        // This node's address changed: the heartbeat in flight is stuck on
        // a connection from the lost address (it would time out after
        // 30 s); a new one, with the new endpoint, goes out at once on a
        // new connection. A usage sample it carried is lost with it.
        let result = tokio::select! {
            result = client.heartbeat(&heartbeat) => result,
            () = mesh.address_changed.notified() => {
                tracing::info!("this node's address changed: sending a heartbeat now");
                continue;
            }
        };
        match &result {
            Ok(()) => tracing::debug!("heartbeat sent"),
            Err(err) => log_failure("heartbeat", err, options.upgrade_retry),
        }
        tokio::select! {
            () = tokio::time::sleep(next_delay(&result, options.heartbeat_interval, options.upgrade_retry)) => {}
            () = mesh.address_changed.notified() => tracing::info!("this node's address changed: sending a heartbeat now"),
        }
    }
}

async fn command_loop(
    client: Arc<ControlPlane>,
    mut executor: Executor,
    options: RunOptions,
    routes_changed: Arc<Notify>,
    peers_changed: Arc<Notify>,
) {
    let mut backoff = Duration::from_secs(1);
    loop {
        match client.open_stream().await {
            Ok(response) => {
                backoff = Duration::from_secs(1);
                tracing::info!("event stream connected");
                // Peers may have changed while the stream was down.
                peers_changed.notify_one();
                sync(&client, &mut executor, &options).await;
                let mut events = SseReader::new(response.bytes_stream());
                let mut poll = tokio::time::interval(options.poll_interval);
                poll.tick().await;
                loop {
                    tokio::select! {
                        event = events.next_event() => match event {
                            Some(name) if name == cloudweb_protocol::events::COMMANDS => sync(&client, &mut executor, &options).await,
                            Some(name) if name == cloudweb_protocol::events::ROUTES || name == cloudweb_protocol::events::CERTIFICATES => routes_changed.notify_one(),
                            Some(name) if name == cloudweb_protocol::events::PEERS => peers_changed.notify_one(),
                            Some(other) => tracing::debug!(event = %other, "event"),
                            None => break,
                        },
                        _ = poll.tick() => sync(&client, &mut executor, &options).await,
                    }
                }
                tracing::warn!("event stream closed; polling until it is back");
            }
            Err(err) => {
                log_failure("event stream", &err, options.upgrade_retry);
                match err {
                    ClientError::UpgradeRequired(_) => {
                        tokio::time::sleep(options.upgrade_retry).await;
                        continue;
                    }
                    ClientError::Held { retry_in_seconds, .. } => {
                        tokio::time::sleep(Duration::from_secs(retry_in_seconds.max(1))).await;
                        continue;
                    }
                    _ => {}
                }
                sync(&client, &mut executor, &options).await;
            }
        }
        // Against a replica that is gone the back-off grows; once another
        // replica answers (the heartbeats found the new leader), the
        // stream is tried there without waiting the grown back-off out.
        // Failures and "not the leader" answers wake nothing, so a fleet's
        // retries keep their back-off during an election.
        tokio::select! {
            () = tokio::time::sleep(backoff) => backoff = (backoff * 2).min(Duration::from_secs(30)),
            () = client.found_another_replica() => backoff = Duration::from_secs(1),
        }
    }
}

async fn sync(client: &Arc<ControlPlane>, executor: &mut Executor, options: &RunOptions) {
    if let Err(err) = executor.run_pending(client).await {
        log_failure("commands", &err, options.upgrade_retry);
    }
}

/// Reads server-sent events and yields their names. Only the event name
/// matters here: data is a hint-free `{}`. The parsing is the
/// `eventsource-stream` crate's; this only bounds what may arrive between
/// two events.
pub struct SseReader<S> {
    events: eventsource_stream::EventStream<Bounded<S>>,
    since_event: Arc<std::sync::atomic::AtomicUsize>,
}

/// Most bytes accepted between two events: a well-behaved server never
/// sends this much without finishing one (keep-alive comments included:
/// past this the stream is dropped and opened again, which is harmless).
const MAX_BYTES_BETWEEN_EVENTS: usize = 64 * 1024;

/// The byte stream, ended once more than [`MAX_BYTES_BETWEEN_EVENTS`]
/// arrived since the reader last yielded an event.
pub struct Bounded<S> {
    stream: S,
    since_event: Arc<std::sync::atomic::AtomicUsize>,
}

impl<S, E> Stream for Bounded<S>
where
    S: Stream<Item = Result<bytes::Bytes, E>> + Unpin,
{
    type Item = Result<bytes::Bytes, E>;

    fn poll_next(mut self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<Option<Self::Item>> {
        if self.since_event.load(std::sync::atomic::Ordering::Relaxed) > MAX_BYTES_BETWEEN_EVENTS {
            return std::task::Poll::Ready(None);
        }
        let polled = std::pin::Pin::new(&mut self.stream).poll_next(cx);
        if let std::task::Poll::Ready(Some(Ok(chunk))) = &polled {
            self.since_event.fetch_add(chunk.len(), std::sync::atomic::Ordering::Relaxed);
        }
        polled
    }
}

impl<S, E> SseReader<S>
where
    S: Stream<Item = Result<bytes::Bytes, E>> + Unpin,
{
    pub fn new(stream: S) -> Self {
        let since_event = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let bounded = Bounded { stream, since_event: since_event.clone() };
        SseReader { events: eventsource_stream::Eventsource::eventsource(bounded), since_event }
    }

    /// The next event's name (`message` when it has none); `None` when the
    /// stream ends or fails.
    pub async fn next_event(&mut self) -> Option<String> {
        match self.events.next().await {
            Some(Ok(event)) => {
                self.since_event.store(0, std::sync::atomic::Ordering::Relaxed);
                Some(event.event)
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn reads_event_names_and_skips_comments() {
        let chunks: Vec<Result<bytes::Bytes, std::io::Error>> = vec![
            Ok(bytes::Bytes::from(": keep-alive\n\nevent: comm")),
            Ok(bytes::Bytes::from("ands\ndata: {}\n\n")),
            Ok(bytes::Bytes::from("event: routes\r\ndata: {}\r\n\r\n")),
        ];
        let mut reader = SseReader::new(futures_util::stream::iter(chunks));
        assert_eq!(reader.next_event().await.as_deref(), Some("commands"));
        assert_eq!(reader.next_event().await.as_deref(), Some("routes"));
        assert_eq!(reader.next_event().await, None);
    }

    #[tokio::test]
    async fn a_stream_that_never_finishes_an_event_is_dropped() {
        let endless = futures_util::stream::repeat_with(|| Ok::<_, std::io::Error>(bytes::Bytes::from(vec![b'x'; 4096])));
        let mut reader = SseReader::new(Box::pin(endless));
        let ended = tokio::time::timeout(Duration::from_secs(5), reader.next_event()).await;
        assert_eq!(ended.expect("the reader gives up"), None);
    }

    #[test]
    fn upgrade_required_slows_the_pace() {
        let normal = Duration::from_secs(10);
        let slow = Duration::from_secs(300);
        let refused = Err(ClientError::UpgradeRequired(cloudweb_protocol::UpgradeRequired {
            error: "x".into(),
            agent_version: "0.1.0".into(),
            agent_protocol: 2,
            supported_min: 1,
            supported_max: 1,
            upgrade: cloudweb_protocol::Upgrade::ControlPlane,
        }));
        assert_eq!(next_delay(&refused, normal, slow), slow);
        assert_eq!(next_delay(&Ok(()), normal, slow), normal);
        let other = Err(ClientError::Transport("refused".into()));
        assert_eq!(next_delay(&other, normal, slow), normal);
    }
}
