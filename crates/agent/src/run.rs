//! `cloudweb-agent run`: the heartbeat loop and the command loop.
//!
//! Commands arrive through the event stream, which only says "look again";
//! the agent then reads its queue. When the stream is down it polls. When the
//! control plane answers 426, both loops log the supported range as an error
//! and slow to one try per `upgrade_retry` until they are accepted again.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
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
}

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Identity(#[from] IdentityError),
    #[error(transparent)]
    Client(#[from] ClientError),
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
}

pub async fn run(options: RunOptions) -> Result<(), RunError> {
    let identity = Identity::load(&options.data_dir)?;
    let client = Arc::new(ControlPlane::for_node(&identity, options.protocol)?);
    let runtime = DockerRuntime::new(&options.docker_host, &identity.info.node_id)?;
    let executor = Executor::new(runtime.clone(), &options.data_dir, options.deploy.clone());
    let samples = Arc::new(crate::usage::Latest::default());
    tokio::spawn(crate::usage::sampler(runtime.clone(), options.data_dir.clone(), options.metrics_interval, samples.clone()));
    let health = Arc::new(crate::health::Latest::default());
    tokio::spawn(crate::health::checker(client.clone(), runtime, options.health_interval, options.registry_check_address.clone(), health.clone()));
    tracing::info!(node_id = %identity.info.node_id, server = %identity.info.server, "agent running");
    let shared = Arc::new(IngressShared::default());
    let routes_changed = Arc::new(Notify::new());
    if let Some(ingress) = options.ingress.clone() {
        tokio::spawn(crate::ingress::run(client.clone(), ingress, routes_changed.clone(), shared.clone()));
    }
    let mesh = Arc::new(crate::mesh::MeshShared::default());
    let peers_changed = Arc::new(Notify::new());
    if let Some(mesh_options) = options.mesh.clone() {
        tokio::spawn(crate::mesh::run(client.clone(), mesh_options, peers_changed.clone(), mesh.clone()));
    }
    let heartbeats = tokio::spawn(heartbeat_loop(client.clone(), options.clone(), shared, samples, health, mesh));
    let commands = tokio::spawn(command_loop(client, executor, options, routes_changed, peers_changed));
    // Both loops run until the process is stopped.
    let _ = tokio::join!(heartbeats, commands);
    Ok(())
}

/// How long to wait before the next try, given the last result.
pub fn next_delay(result: &Result<(), ClientError>, normal: Duration, upgrade_retry: Duration) -> Duration {
    match result {
        Err(ClientError::UpgradeRequired(_)) => upgrade_retry,
        _ => normal,
    }
}

fn log_failure(what: &str, err: &ClientError, upgrade_retry: Duration) {
    match err {
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
) {
    let mut refused = false;
    let mut last_traffic = tokio::time::Instant::now();
    loop {
        let mut heartbeat = capacity::measure(&options.data_dir);
        // This agent builds static sites (it ships the static server); it
        // reports traffic only while its ingress actually runs.
        let ingress_active = ingress.active.load(std::sync::atomic::Ordering::Relaxed);
        let mut features = vec![cloudweb_protocol::features::STATIC_SITES.to_string()];
        if ingress_active {
            features.push(cloudweb_protocol::features::TRAFFIC_METRICS.to_string());
        }
        let registry = health.registry.lock().expect("health lock").clone();
        let mesh = mesh.health.lock().expect("mesh lock").clone();
        // Which WireGuard the mesh runs on, while it runs.
        if mesh.is_some() {
            features.push(cloudweb_protocol::features::MESH_USERSPACE.to_string());
        }
        heartbeat.health = Some(cloudweb_protocol::Health { registry, mesh, features: Some(features) });
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
        let result = client.heartbeat(&heartbeat).await;
        match &result {
            Ok(()) if refused => {
                tracing::info!("the control plane accepts this agent again; back to the normal heartbeat pace");
                refused = false;
            }
            Ok(()) => tracing::debug!("heartbeat sent"),
            Err(err) => {
                refused = matches!(err, ClientError::UpgradeRequired(_));
                log_failure("heartbeat", err, options.upgrade_retry);
            }
        }
        tokio::time::sleep(next_delay(&result, options.heartbeat_interval, options.upgrade_retry)).await;
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
                            Some(name) if name == cloudweb_protocol::events::ROUTES => routes_changed.notify_one(),
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
                if matches!(err, ClientError::UpgradeRequired(_)) {
                    tokio::time::sleep(options.upgrade_retry).await;
                    continue;
                }
                sync(&client, &mut executor, &options).await;
            }
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(30));
    }
}

async fn sync(client: &Arc<ControlPlane>, executor: &mut Executor, options: &RunOptions) {
    if let Err(err) = executor.run_pending(client).await {
        log_failure("commands", &err, options.upgrade_retry);
    }
}

/// Reads server-sent events and yields their names. Only the `event:` field
/// matters here: data is a hint-free `{}`.
pub struct SseReader<S> {
    stream: S,
    buffer: BytesMut,
}

impl<S, E> SseReader<S>
where
    S: Stream<Item = Result<bytes::Bytes, E>> + Unpin,
{
    pub fn new(stream: S) -> Self {
        SseReader { stream, buffer: BytesMut::new() }
    }

    /// The next event's name (`message` when it has none); `None` when the
    /// stream ends or fails.
    pub async fn next_event(&mut self) -> Option<String> {
        loop {
            if let Some(name) = self.take_event() {
                return Some(name);
            }
            match self.stream.next().await {
                Some(Ok(chunk)) => {
                    self.buffer.extend_from_slice(&chunk);
                    if self.buffer.len() > 64 * 1024 {
                        // A well-behaved server never sends this much without
                        // a blank line.
                        return None;
                    }
                }
                _ => return None,
            }
        }
    }

    fn take_event(&mut self) -> Option<String> {
        loop {
            // Blocks end with a blank line; "\r\n" line ends are allowed.
            let (end, separator) = find_blank_line(&self.buffer)?;
            let block = self.buffer.split_to(end + separator);
            let text = String::from_utf8_lossy(&block[..end]);
            let mut name = None;
            let mut has_data = false;
            for line in text.lines() {
                if let Some(value) = line.strip_prefix("event:") {
                    name = Some(value.trim().to_string());
                } else if line.starts_with("data:") {
                    has_data = true;
                }
            }
            if name.is_some() || has_data {
                return Some(name.unwrap_or_else(|| "message".to_string()));
            }
            // A comment-only block (keep-alive): keep reading.
        }
    }
}

/// Position and length of the first blank-line separator.
fn find_blank_line(buffer: &[u8]) -> Option<(usize, usize)> {
    (0..buffer.len()).find_map(|i| {
        if buffer[i..].starts_with(b"\r\n\r\n") {
            Some((i, 4))
        } else if buffer[i..].starts_with(b"\n\n") {
            Some((i, 2))
        } else {
            None
        }
    })
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
