//! Carrying out a `deploy` command: get an image (build it from the commit,
//! or pull the one given), start the instance, wait until it answers HTTP,
//! and report each step. On any failure the new container is removed and
//! the deployment reported failed; whatever served before keeps serving.
//!
//! Deploys are idempotent: a command delivered again finds its container by
//! label and only checks and reports it.
//!
//! Bounded in time: cloning and building stop after the deployment's build
//! timeout (default 30 min), and a stop for the deployment cancels the
//! deploy at any point; both end it failed with the reason. A container that
//! exits during the health wait fails it at once, with its exit code and
//! last output. Every line shipped has the app's variable values redacted.
//! A report the control plane refuses for good (a 4xx) ends the command
//! instead of retrying it forever.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cloudweb_protocol::deploy::{healthy_status, is_public_env, repo_url};
use cloudweb_protocol::deploy::DEFAULT_BUILD_TIMEOUT_SECONDS;
use cloudweb_protocol::{DeployPayload, Report, Strategy};
use tokio::sync::watch;

mod log_shipper;
pub(crate) mod registry_retry;
mod rollout;

use self::log_shipper::LogShipper;
use self::registry_retry::{with_registry_retry, REGISTRY_RETRY_DELAYS};
use self::rollout::{downtime, recreate};
use crate::build::{self, Plan};
use crate::client::ControlPlane;
use crate::redact::Redactor;
use crate::runtime::{AppContainer, DockerRuntime, RegistryAuth, RuntimeError, LABEL_COMMIT};

/// Node-level settings for deploys.
#[derive(Debug, Clone)]
pub struct DeployOptions {
    pub data_dir: PathBuf,
    /// Image that runs install and build commands of static sites.
    pub static_builder_image: String,
    /// Image with `cloudweb-static`, the server of static sites.
    pub static_server_image: String,
    /// Builder image for buildpacks (`pack build --builder`).
    pub buildpacks_builder: String,
    /// Host address instance ports are published on.
    pub publish_ip: String,
    /// Host other nodes use to reach this node's instances.
    pub advertise_host: String,
    pub allow_file_repos: bool,
    /// Docker's per-registry certificate directory.
    pub docker_certs_dir: PathBuf,
}

/// Whether the command is done (ack it) or must be retried later.
pub enum DeployOutcome {
    Done,
    Retry(String),
}

/// Resolves once `cancel` turns true; never when its sender goes away.
async fn cancelled(mut cancel: watch::Receiver<bool>) {
    if cancel.wait_for(|c| *c).await.is_err() {
        std::future::pending::<()>().await;
    }
}

pub async fn deploy(
    runtime: &DockerRuntime,
    client: &Arc<ControlPlane>,
    options: &DeployOptions,
    payload: DeployPayload,
    cancel: watch::Receiver<bool>,
) -> DeployOutcome {
    let redactor = Redactor::new(&payload.env);
    let report = |state: &str, message: Option<String>, image: Option<String>, address: Option<String>| {
        let mut report = Report::new(payload.deployment_id.clone());
        report.state = Some(state.to_string());
        report.message = message.map(|m| redactor.apply(&m));
        report.image = image;
        report.instance = Some(payload.instance);
        report.address = address;
        report
    };
    // The agent checks what it was sent, whatever the control plane checked.
    let checked = payload.validate().map_err(|e| e.to_string()).and_then(|()| match &payload.source {
        Some(source) => repo_url(&source.repo_url, options.allow_file_repos).map_err(|e| e.to_string()),
        None => Ok(()),
    });
    if let Err(reason) = checked {
        let _ = client.report(&report("failed", Some(format!("the agent refused the deploy: {reason}")), None, None)).await;
        return DeployOutcome::Done;
    }
    let logs = LogShipper::start(client.clone(), payload.deployment_id.clone(), payload.instance, redactor.clone());
    // Dropping `run` abandons whatever it was doing: a git or pack child is
    // killed, a Docker build is cancelled with its connection, a build step
    // container is removed; a started app container is removed by the stop
    // that caused the cancellation.
    let result = tokio::select! {
        // First: a shutdown's clean-up makes the build fail, which is not
        // the deploy's failure.
        biased;
        () = crate::shutdown::wait() => Err(Failure::Retry("the agent is shutting down".into())),
        result = run(runtime, client, options, &payload, &logs) => result,
        () = cancelled(cancel) => Err(Failure::Cancelled),
    };
    // A failure that raced the start of a shutdown is not reported either:
    // the command is delivered again to the next agent.
    let result = match result {
        Err(Failure::Failed(reason)) if crate::shutdown::requested() => Err(Failure::Retry(format!("the agent is shutting down ({reason})"))),
        other => other,
    };
    // Reports of intermediate states went out from `run`; the final one
    // carries the last log lines.
    let outcome = finish(runtime, client, &payload, result, logs, report).await;
    if matches!(outcome, DeployOutcome::Done) {
        // The command ends: no retry will need the commit its build fixed.
        build::pins::Pins::new(&options.data_dir).remove(&payload.deployment_id);
    }
    outcome
}

async fn finish(
    runtime: &DockerRuntime,
    client: &ControlPlane,
    payload: &DeployPayload,
    result: Result<String, Failure>,
    logs: LogShipper,
    report: impl Fn(&str, Option<String>, Option<String>, Option<String>) -> Report,
) -> DeployOutcome {
    match result {
        Ok(address) => {
            let mut running = report("running", None, None, Some(address));
            running.logs = logs.finish().await;
            match client.report(&running).await {
                Ok(()) => DeployOutcome::Done,
                Err(err) if err.is_permanent() => {
                    // The control plane will never route to it (the app was
                    // deleted, the instance moved): do not leave it running.
                    tracing::error!(deployment = %payload.deployment_id, error = %err, "the control plane refused the running report; removing the instance");
                    let _ = runtime.stop_deployment(&payload.deployment_id, Some(payload.instance)).await;
                    DeployOutcome::Done
                }
                // Without the report the control plane would wait forever:
                // keep the command so it is delivered (and checked) again.
                Err(err) => DeployOutcome::Retry(format!("could not report: {err}")),
            }
        }
        Err(Failure::Retry(reason)) => {
            logs.flush().await;
            DeployOutcome::Retry(reason)
        }
        Err(Failure::Failed(reason)) => {
            logs.line("agent", format!("deploy failed: {reason}"));
            let mut failed = report("failed", Some(reason), None, None);
            failed.logs = logs.finish().await;
            send_failed(client, failed).await
        }
        Err(Failure::Cancelled) => {
            logs.line("agent", "deploy cancelled: a stop for this deployment arrived");
            let mut failed = report("failed", Some("cancelled".into()), None, None);
            failed.logs = logs.finish().await;
            send_failed(client, failed).await
        }
        Err(Failure::Refused(reason)) => {
            logs.flush().await;
            tracing::error!(deployment = %payload.deployment_id, %reason, "the control plane refused a report of this deploy; dropping the command");
            send_failed(client, report("failed", Some(reason), None, None)).await
        }
    }
}

/// Sends a `failed` report. A 4xx answer is final: sending the same report
/// again would be refused again and hold the command forever, so the
/// command ends (one shorter report with the refusal as its reason is tried
/// first, in case only the message was the problem).
async fn send_failed(client: &ControlPlane, report: Report) -> DeployOutcome {
    match client.report(&report).await {
        Ok(()) => DeployOutcome::Done,
        Err(err) if err.is_permanent() => {
            tracing::error!(deployment = %report.deployment_id, error = %err, "the control plane refused the failure report");
            let mut short = Report::new(report.deployment_id.clone());
            short.state = report.state.clone();
            short.instance = report.instance;
            short.message = Some(format!("the deploy failed and the control plane refused the agent's report: {err}"));
            let _ = client.report(&short).await;
            DeployOutcome::Done
        }
        // Without the report the control plane would wait forever: keep the
        // command so it is delivered (and checked) again.
        Err(err) => DeployOutcome::Retry(format!("could not report: {err}")),
    }
}

enum Failure {
    /// Not the deployment's fault (the Docker Engine is down): try again.
    Retry(String),
    Failed(String),
    /// A stop for this deployment arrived.
    Cancelled,
    /// The control plane refused a report for good (4xx).
    Refused(String),
}

impl From<RuntimeError> for Failure {
    fn from(err: RuntimeError) -> Self {
        match err {
            RuntimeError::Unavailable(reason) => Failure::Retry(reason),
            other => Failure::Failed(other.to_string()),
        }
    }
}

async fn state(client: &ControlPlane, payload: &DeployPayload, state: &str, image: Option<String>) -> Result<(), Failure> {
    let mut report = Report::new(payload.deployment_id.clone());
    report.state = Some(state.to_string());
    report.image = image;
    report.instance = Some(payload.instance);
    client.report(&report).await.map_err(|e| {
        if e.is_permanent() {
            Failure::Refused(format!("the control plane refused the {state} report: {e}"))
        } else {
            Failure::Retry(format!("could not report {state}: {e}"))
        }
    })
}

/// Gets the image, starts the container and waits until it is healthy.
/// Returns the address the instance answers on.
async fn run(
    runtime: &DockerRuntime,
    client: &Arc<ControlPlane>,
    options: &DeployOptions,
    payload: &DeployPayload,
    logs: &LogShipper,
) -> Result<String, Failure> {
    // Delivered again (the agent restarted, or an ack was lost): adopt what
    // is there instead of starting a second copy.
    for existing in runtime.own_containers(Some(&payload.deployment_id)).await? {
        tracing::debug!(container = %existing.name, state = %existing.state, instance = existing.instance, "found a container of this deployment");
        if existing.instance != payload.instance {
            continue;
        }
        if existing.running {
            tracing::info!(container = %existing.name, deployment = %payload.deployment_id, "adopting a container started before a restart");
            logs.line("agent", format!("found {} already running; checking it", existing.name));
            let address = check_or_remove(runtime, options, payload, &existing.id, logs).await?;
            if payload.image.is_none() {
                // A build's instance starts while its image is pushed, so
                // the push may not have finished: push again (nothing moves
                // when the registry has it) and name the image first.
                let published = async {
                    let registry = registry(client, options).await?;
                    publish(runtime, client, payload, &build_tag(payload, registry.as_ref()), registry.as_ref(), logs).await
                };
                if let Err(failure) = published.await {
                    let _ = runtime.remove(&existing.id).await;
                    return Err(failure);
                }
            }
            return Ok(address);
        }
        runtime.remove(&existing.id).await?;
    }

    let image = match &payload.image {
        Some(image) => {
            let (registry, ()) = tokio::try_join!(registry(client, options), state(client, payload, "deploying", Some(image.clone())))?;
            logs.line("agent", format!("using image {image}"));
            if with_registry_retry(&REGISTRY_RETRY_DELAYS, |line| logs.line("agent", line), &format!("pull of {image}"), || runtime.ensure_image(image, registry.as_ref())).await? {
                logs.line("agent", format!("pulled {image}"));
            }
            let stopped_at = recreate(runtime, payload, logs).await?;
            let id = start_app(runtime, options, payload, image.clone(), logs).await?;
            let address = check_or_remove(runtime, options, payload, &id, logs).await?;
            downtime(stopped_at, logs);
            return Ok(address);
        }
        None => {
            let (registry, ()) = tokio::try_join!(registry(client, options), state(client, payload, "building", None))?;
            let tag = build_tag(payload, registry.as_ref());
            let limit = Duration::from_secs(u64::from(payload.build_timeout_seconds.unwrap_or(DEFAULT_BUILD_TIMEOUT_SECONDS)));
            match tokio::time::timeout(limit, build_from_source(runtime, client, options, payload, &tag, logs)).await {
                Ok(result) => result?,
                Err(_) => {
                    return Err(Failure::Failed(format!(
                        "the build did not finish within {} s (build timeout) and was stopped",
                        limit.as_secs()
                    )))
                }
            }
            (tag, registry)
        }
    };
    let (tag, registry) = image;
    // The push runs while the instance starts and answers its health
    // check on this node; the deployment names its image (and other nodes
    // may pull it) only once it is in the registry, and runs only then.
    if registry.is_some() {
        logs.line("build", format!("pushing {tag}"));
    }
    let publish = publish(runtime, client, payload, &tag, registry.as_ref(), logs);
    let start = async {
        // Said now, without the image, so the state shows the start; the
        // image follows with the push.
        let stopped_at = recreate(runtime, payload, logs).await?;
        let (id, ()) = tokio::try_join!(start_app(runtime, options, payload, tag.clone(), logs), state(client, payload, "deploying", None))?;
        let address = check_or_remove(runtime, options, payload, &id, logs).await?;
        downtime(stopped_at, logs);
        Ok(address)
    };
    match tokio::try_join!(publish, start) {
        Ok(((), address)) => Ok(address),
        Err(failure) => {
            // The push failed while the instance started or ran: it goes.
            if let Err(err) = runtime.stop_deployment(&payload.deployment_id, Some(payload.instance)).await {
                tracing::warn!(deployment = %payload.deployment_id, error = %err, "could not remove the instance of a failed deploy");
            }
            Err(failure)
        }
    }
}

/// The tag a build gets: in the cluster registry when there is one.
fn build_tag(payload: &DeployPayload, registry: Option<&RegistryAuth>) -> String {
    match registry {
        Some(auth) => format!("{}/{}:{}", auth.address, payload.app, payload.deployment_id),
        None => format!("cloudweb/{}:{}", payload.app, payload.deployment_id),
    }
}

/// Pushes a built image to the cluster registry (when there is one) and
/// reports it as the deployment's image: from then on other nodes and
/// rollbacks can use it.
async fn publish(runtime: &DockerRuntime, client: &ControlPlane, payload: &DeployPayload, tag: &str, registry: Option<&RegistryAuth>, logs: &LogShipper) -> Result<(), Failure> {
    if let Some(auth) = registry {
        with_registry_retry(&REGISTRY_RETRY_DELAYS, |line| logs.line("build", line), &format!("push of {tag}"), || runtime.push_image(tag, auth)).await?;
        logs.line("build", format!("pushed {tag}"));
    }
    state(client, payload, "deploying", Some(tag.to_string())).await
}

/// Creates and starts the instance's container; returns its id.
async fn start_app(runtime: &DockerRuntime, options: &DeployOptions, payload: &DeployPayload, image: String, logs: &LogShipper) -> Result<String, Failure> {
    let name = payload.container_name();
    let mut env: Vec<String> = payload.env.iter().map(|(k, v)| format!("{k}={v}")).collect();
    env.push(format!("PORT={}", payload.port));
    let mounts = crate::volumes::prepare(&options.data_dir, &payload.volumes).map_err(Failure::Failed)?;
    if !mounts.is_empty() {
        logs.line("agent", format!("mounting {} volume(s): {}", mounts.len(), payload.volumes.iter().map(|v| format!("{} at {}", v.name, v.path)).collect::<Vec<_>>().join(", ")));
    }
    let spec = AppContainer {
        name: name.clone(),
        image,
        app: payload.app.clone(),
        deployment: payload.deployment_id.clone(),
        instance: payload.instance,
        env,
        port: payload.port,
        publish_ip: options.publish_ip.clone(),
        nano_cpus: payload.limits.cpu.map(|cpu| (cpu * 1e9) as i64),
        memory_bytes: payload.limits.memory_bytes.map(|m| m as i64),
        mounts,
        liveness: payload
            .liveness
            .clone()
            .map(|l| (l, payload.health.path.clone())),
        readiness: payload
            .readiness
            .clone()
            .map(|r| (r, payload.health.path.clone())),
    };
    wait_publish_address(&options.publish_ip).await?;
    let id = match runtime.start_app(&spec).await {
        Ok(id) => id,
        // The name is taken by a copy of this very instance that a killed
        // agent's last create left behind after the adoption check looked
        // (the Engine finishes a create whose client is gone): remove that
        // copy, never anything of another deployment, and create once more.
        Err(err) if err.to_string().contains("is already in use") => {
            let mut removed = false;
            for stale in runtime.own_containers(Some(&payload.deployment_id)).await? {
                if stale.instance == payload.instance && !stale.running {
                    runtime.remove(&stale.id).await?;
                    removed = true;
                }
            }
            if !removed {
                return Err(err.into());
            }
            logs.line("agent", format!("removed a leftover copy of {name} from before a restart"));
            runtime.start_app(&spec).await?
        }
        Err(err) => return Err(err.into()),
    };
    logs.line("agent", format!("started {name}"));
    Ok(id)
}

/// How long a deploy waits for the publish address (the mesh address) to
/// appear: the mesh interface comes up within seconds of the agent's start.
const PUBLISH_ADDRESS_WAIT: Duration = Duration::from_secs(60);

/// Waits until the publish address is one of this host's, since Docker
/// cannot publish a port on an address the host does not have. With the
/// mesh on it is the mesh address, which exists only while the mesh
/// interface is up. Not the deployment's fault when it does not come:
/// the command is tried again.
async fn wait_publish_address(publish_ip: &str) -> Result<(), Failure> {
    let Ok(ip) = publish_ip.parse::<std::net::IpAddr>() else { return Ok(()) };
    if ip.is_unspecified() || ip.is_loopback() {
        return Ok(());
    }
    let started = Instant::now();
    loop {
        if std::net::TcpListener::bind((ip, 0)).is_ok() {
            return Ok(());
        }
        if started.elapsed() > PUBLISH_ADDRESS_WAIT {
            return Err(Failure::Retry(format!(
                "the publish address {ip} is not on this host after {} s (is the mesh interface up?)",
                PUBLISH_ADDRESS_WAIT.as_secs()
            )));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Waits for the instance to be healthy; when it is not, ships its last
/// output and removes it.
async fn check_or_remove(runtime: &DockerRuntime, options: &DeployOptions, payload: &DeployPayload, id: &str, logs: &LogShipper) -> Result<String, Failure> {
    match healthy_address(runtime, options, payload, id, logs).await {
        Ok(address) => Ok(address),
        Err(failure) => {
            for (stream, line) in runtime.logs(id, 50).await.unwrap_or_default() {
                logs.line(&stream, line);
            }
            let _ = runtime.remove(id).await;
            Err(failure)
        }
    }
}

/// Probes the instance over HTTP until it answers or the health timeout
/// passes. The container's state is read before every probe, so one that
/// exits at start (or exits and is restarted by its restart policy) fails
/// the deploy within a probe interval, with its exit code and last output.
async fn healthy_address(runtime: &DockerRuntime, options: &DeployOptions, payload: &DeployPayload, id: &str, logs: &LogShipper) -> Result<String, Failure> {
    let probe_host = match options.publish_ip.as_str() {
        "0.0.0.0" => "127.0.0.1",
        "::" => "::1",
        ip => ip,
    };
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(2))
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .map_err(|e| Failure::Failed(e.to_string()))?;
    let started = Instant::now();
    let timeout = Duration::from_secs(u64::from(payload.health.timeout_seconds));
    let mut port = None;
    // Most apps answer within a few tens of milliseconds of starting: probe
    // fast at first, then every 200 ms.
    let mut pause = Duration::from_millis(20);
    loop {
        // The state, and the published port until it is known, in one
        // inspection.
        let (container, published) = runtime.container_state_and_port(id, port.is_none().then_some(payload.port)).await?;
        if let Some(code) = container.crashed() {
            return Err(Failure::Failed(crash_reason(runtime, id, code, container.restart_count).await));
        }
        if container.running {
            let port = match (port, published) {
                (Some(port), _) => port,
                (None, Some(found)) => *port.insert(found),
                (None, None) => return Err(Failure::Failed(format!("container {id} has no published port for {}", payload.port))),
            };
            let url = format!("http://{}:{port}{}", bracket(probe_host), payload.health.path);
            if let Ok(response) = http.get(&url).send().await {
                let status = response.status().as_u16();
                if healthy_status(status) {
                    runtime.keep_running(id).await?;
                    logs.line("agent", format!("healthy after {:.1} s (HTTP {status} on {})", started.elapsed().as_secs_f64(), payload.health.path));
                    return Ok(format!("{}:{port}", bracket(&options.advertise_host)));
                }
            }
        }
        if started.elapsed() > timeout {
            return Err(Failure::Failed(format!(
                "no answer on {} within {} s (health check timeout)",
                payload.health.path, payload.health.timeout_seconds
            )));
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(200));
    }
}

/// Lines of output quoted in a crash's reason (all of the last 50 are
/// shipped as log lines).
const CRASH_LINES: usize = 5;

async fn crash_reason(runtime: &DockerRuntime, id: &str, code: i64, restarts: i64) -> String {
    // A container started by an older agent restarts on exit; its exit
    // code is then reset by the restart.
    let mut reason = if restarts > 0 {
        format!("the container keeps exiting (restarted {restarts} time(s)) before it answered the health check")
    } else {
        format!("the container exited with exit code {code} before it answered the health check")
    };
    let lines = runtime.logs(id, CRASH_LINES).await.unwrap_or_default();
    if !lines.is_empty() {
        let output: Vec<&str> = lines.iter().map(|(_, line)| line.as_str()).collect();
        reason.push_str(&format!("; last output: {}", output.join(" | ")));
    }
    reason
}

fn bracket(host: &str) -> String {
    if host.contains(':') {
        format!("[{host}]")
    } else {
        host.to_string()
    }
}

/// The cluster registry, with Docker told to trust its CA.
async fn registry(client: &ControlPlane, options: &DeployOptions) -> Result<Option<RegistryAuth>, Failure> {
    cluster_registry(client, &options.docker_certs_dir).await.map_err(|err| match err {
        RegistryError::Retry(reason) => Failure::Retry(reason),
        RegistryError::Failed(reason) => Failure::Failed(reason),
    })
}

/// Why the cluster registry's settings are not at hand.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RegistryError {
    /// The control plane did not answer: try again later.
    Retry(String),
    Failed(String),
}

/// The cluster registry's credentials (`None` without a registry), its CA
/// written to Docker's certificate directory `docker_certs_dir` first.
/// Also for task runs, which pull their image the way a deploy does.
pub(crate) async fn cluster_registry(client: &ControlPlane, docker_certs_dir: &Path) -> Result<Option<RegistryAuth>, RegistryError> {
    let config = client.registry().await.map_err(|e| RegistryError::Retry(format!("cannot read the registry settings: {e}")))?;
    let (true, Some(address), Some(ca), Some(username), Some(password)) = (config.configured, config.address, config.ca, config.username, config.password) else {
        return Ok(None);
    };
    cloudweb_protocol::validate::endpoint("registry address", &address).map_err(|e| RegistryError::Failed(e.to_string()))?;
    let dir = docker_certs_dir.join(&address);
    let path = dir.join("ca.crt");
    if std::fs::read_to_string(&path).ok().as_deref() != Some(ca.as_str()) {
        std::fs::create_dir_all(&dir)
            .and_then(|()| std::fs::write(&path, &ca))
            .map_err(|e| RegistryError::Failed(format!("cannot write {}: {e}", path.display())))?;
    }
    Ok(Some(RegistryAuth { address, username, password }))
}

/// Fixes the commit a deployment builds: pins it on this node (so a retry
/// builds it again, never a newer branch head) and records it on the
/// deployment before the image is used. The control plane refuses a commit
/// other than the one the deployment already has (409): the deploy ends
/// then. When the report cannot be delivered the deploy is tried again,
/// with the same pinned commit.
async fn fix_commit(client: &ControlPlane, options: &DeployOptions, payload: &DeployPayload, commit: &str) -> Result<(), Failure> {
    let pins = build::pins::Pins::new(&options.data_dir);
    if pins.get(&payload.deployment_id).as_deref() != Some(commit) {
        pins.set(&payload.deployment_id, commit).map_err(|e| Failure::Failed(format!("cannot record the commit {commit} of this deployment: {e}")))?;
    }
    let mut report = Report::new(payload.deployment_id.clone());
    report.instance = Some(payload.instance);
    report.commit = Some(commit.to_string());
    client.report(&report).await.map_err(|e| {
        if e.is_permanent() {
            Failure::Refused(format!("the control plane refused commit {commit}: {e}"))
        } else {
            Failure::Retry(format!("could not report the commit: {e}"))
        }
    })
}

/// A build's work directory, removed when the build ends, also when it is
/// abandoned (timeout, cancellation).
struct WorkDir(PathBuf);

impl Drop for WorkDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

async fn build_from_source(
    runtime: &DockerRuntime,
    client: &ControlPlane,
    options: &DeployOptions,
    payload: &DeployPayload,
    tag: &str,
    logs: &LogShipper,
) -> Result<(), Failure> {
    let source = payload.source.as_ref().ok_or_else(|| Failure::Failed("no source to build".into()))?;
    // A retry of this deployment builds the commit its first try resolved.
    let pinned = build::pins::Pins::new(&options.data_dir).get(&payload.deployment_id);
    let pinned_source;
    let source = match pinned {
        Some(commit) if source.commit.as_deref() != Some(commit.as_str()) => {
            logs.line("build", format!("building commit {commit}, which an earlier try of this deployment resolved"));
            pinned_source = cloudweb_protocol::Source { commit: Some(commit), ..source.clone() };
            &pinned_source
        }
        _ => source,
    };
    let work = options.data_dir.join("builds").join(format!("{}-{}", payload.deployment_id, payload.instance));
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).map_err(|e| Failure::Failed(format!("cannot create {}: {e}", work.display())))?;
    let work = WorkDir(work);
    build_in(runtime, client, options, payload, source, tag, &work.0, logs).await
}

#[allow(clippy::too_many_arguments)]
async fn build_in(
    runtime: &DockerRuntime,
    client: &ControlPlane,
    options: &DeployOptions,
    payload: &DeployPayload,
    source: &cloudweb_protocol::Source,
    tag: &str,
    work: &Path,
    logs: &LogShipper,
) -> Result<(), Failure> {
    let failed = |e: &dyn std::fmt::Display| Failure::Failed(e.to_string());
    let checkout = work.join("src");
    let home = work.join("home");
    std::fs::create_dir_all(&home).map_err(|e| failed(&e))?;
    logs.line("build", format!("cloning branch {} of {}", source.branch, source.repo_url));
    let mirrors = options.data_dir.join("git-mirrors");
    let mirror = build::mirror::open(&mirrors, &payload.app, source, &home, options.allow_file_repos).await.map_err(|e| failed(&e))?;
    let strategy = payload.strategy.unwrap_or(Strategy::Auto);
    let settings = payload.build.as_ref();

    // A commit the mirror has already (a redeploy): its Dockerfile build
    // runs while the fetch confirms that the commit is still on the
    // branch. The image is used only once both succeeded.
    if let Some(build::mirror::Snapshot { commit: known, archive }) = mirror.known().await {
        if build::plan_from_archive(&archive, strategy, settings).map_err(|e| failed(&e))? == Some(Plan::Dockerfile) {
            logs.line("build", format!("checked out {known} (from this node's mirror; the fetch confirms it is on branch {})", source.branch));
            let confirm = async {
                let fetched = mirror.fetch().await.map_err(|e| failed(&e))?;
                if fetched != known {
                    return Err(Failure::Failed(format!("commit {} resolves to {fetched} after the fetch, not {known}", source.commit.as_deref().unwrap_or_default())));
                }
                logs.line("build", format!("fetched branch {}: {fetched} is on it", source.branch));
                fix_commit(client, options, payload, &fetched).await
            };
            let build = async {
                logs.line("build", "building the Dockerfile");
                runtime.build_image(archive, tag, &[(LABEL_COMMIT, known.as_str())], |line| logs.line("build", line)).await.map_err(Failure::from)
            };
            if let Err(failure) = tokio::try_join!(confirm, build) {
                // Whatever the build made is not the deployment's image.
                let _ = runtime.remove_tag(tag).await;
                return Err(failure);
            }
            return Ok(());
        }
    }

    let commit = mirror.fetch().await.map_err(|e| failed(&e))?;
    logs.line("build", format!("checked out {commit}"));
    let archive = mirror.archive(&commit).await.map_err(|e| failed(&e))?;
    if build::plan_from_archive(&archive, strategy, settings).map_err(|e| failed(&e))? == Some(Plan::Dockerfile) {
        let build = async {
            logs.line("build", "building the Dockerfile");
            runtime.build_image(archive, tag, &[(LABEL_COMMIT, commit.as_str())], |line| logs.line("build", line)).await.map_err(Failure::from)
        };
        let fixed = fix_commit(client, options, payload, &commit);
        if let Err(failure) = tokio::try_join!(fixed, build) {
            let _ = runtime.remove_tag(tag).await;
            return Err(failure);
        }
        return Ok(());
    }
    // Static sites and buildpacks work on the files on disk.
    drop(archive);
    mirror.checkout(&commit, &checkout).await.map_err(|e| failed(&e))?;
    fix_commit(client, options, payload, &commit).await?;
    let plan = build::plan(&checkout, strategy, settings).map_err(|e| failed(&e))?;
    match plan {
        Plan::Dockerfile => {
            logs.line("build", "building the Dockerfile");
            let context = build::context_archive(&checkout, "", &[]).map_err(|e| failed(&e))?;
            runtime.build_image(context, tag, &[(LABEL_COMMIT, commit.as_str())], |line| logs.line("build", line)).await?;
        }
        Plan::Static(plan) => {
            logs.line("build", "building a static site");
            let public_env = payload.env.iter().filter(|(k, _)| is_public_env(k)).map(|(k, v)| format!("{k}={v}")).collect();
            let build = build::static_site::StaticBuild {
                runtime,
                checkout: &checkout,
                plan: &plan,
                builder_image: &options.static_builder_image,
                server_image: &options.static_server_image,
                port: payload.port,
                public_env,
                tag,
                labels: &[(LABEL_COMMIT, commit.as_str())],
            };
            build::build_static_site(build, |stream, line| logs.line(&stream, line)).await.map_err(|e| Failure::Failed(e.to_string()))?;
        }
        Plan::Buildpacks => {
            let Some(pack) = crate::find_on_path(Path::new("pack")) else {
                return Err(Failure::Failed(format!(
                    "no Dockerfile and no static site in the repository, and the pack CLI (buildpacks) is not installed on node {}",
                    runtime.node_id()
                )));
            };
            logs.line("build", format!("building with buildpacks ({})", options.buildpacks_builder));
            let output = tokio::process::Command::new(pack)
                .arg("build")
                .arg(tag)
                .arg("--path")
                .arg(&checkout)
                .arg("--builder")
                .arg(&options.buildpacks_builder)
                .stdin(std::process::Stdio::null())
                .kill_on_drop(true)
                .output()
                .await
                .map_err(|e| Failure::Failed(format!("cannot run pack: {e}")))?;
            for line in String::from_utf8_lossy(&output.stdout).lines().chain(String::from_utf8_lossy(&output.stderr).lines()) {
                logs.line("build", line);
            }
            if !output.status.success() {
                return Err(Failure::Failed(format!("pack build exited with {}", output.status)));
            }
        }
    }
    Ok(())
}
