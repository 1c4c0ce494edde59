//! Carrying out a `deploy` command: get an image (build it from the commit,
//! or pull the one given), start the instance, wait until it answers HTTP,
//! and report each step. On any failure the new container is removed and
//! the deployment reported failed; whatever served before keeps serving.
//!
//! Deploys are idempotent: a command delivered again finds its container by
//! label and only checks and reports it.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cloudweb_protocol::deploy::{healthy_status, is_public_env, repo_url};
use cloudweb_protocol::{DeployPayload, LogLine, Report, Strategy};
use tokio::sync::mpsc;

use crate::build::{self, Plan};
use crate::client::ControlPlane;
use crate::commands::now_rfc3339;
use crate::runtime::{AppContainer, DockerRuntime, RegistryAuth, RuntimeError};

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

/// Sends log lines to the control plane in batches, from its own task, so
/// a slow control plane never stalls a build.
struct LogShipper {
    sender: mpsc::UnboundedSender<LogLine>,
    task: tokio::task::JoinHandle<()>,
}

impl LogShipper {
    fn start(client: Arc<ControlPlane>, deployment_id: String, instance: u32) -> LogShipper {
        let (sender, mut receiver) = mpsc::unbounded_channel::<LogLine>();
        let task = tokio::spawn(async move {
            let mut open = true;
            while open {
                let mut batch = Vec::new();
                match receiver.recv().await {
                    Some(line) => batch.push(line),
                    None => break,
                }
                // Gather what arrives in the next moment into the same report.
                let deadline = tokio::time::sleep(Duration::from_millis(300));
                tokio::pin!(deadline);
                while batch.len() < cloudweb_protocol::misc::MAX_REPORT_LINES {
                    tokio::select! {
                        line = receiver.recv() => match line {
                            Some(line) => batch.push(line),
                            None => { open = false; break; }
                        },
                        _ = &mut deadline => break,
                    }
                }
                let report = Report {
                    deployment_id: deployment_id.clone(),
                    state: None,
                    message: None,
                    image: None,
                    instance: Some(instance),
                    address: None,
                    logs: batch,
                };
                if let Err(err) = client.report(&report).await {
                    tracing::warn!(error = %err, "could not ship log lines");
                }
            }
        });
        LogShipper { sender, task }
    }

    fn line(&self, stream: &str, line: impl Into<String>) {
        let mut line: String = line.into();
        if line.len() > 16 * 1024 {
            line.truncate(16 * 1024);
        }
        let _ = self.sender.send(LogLine { ts: now_rfc3339(), stream: stream.to_string(), line });
    }

    async fn finish(self) {
        drop(self.sender);
        let _ = self.task.await;
    }
}

/// Whether the command is done (ack it) or must be retried later.
pub enum DeployOutcome {
    Done,
    Retry(String),
}

pub async fn deploy(runtime: &DockerRuntime, client: &Arc<ControlPlane>, options: &DeployOptions, payload: DeployPayload) -> DeployOutcome {
    let report = |state: &str, message: Option<String>, image: Option<String>, address: Option<String>| Report {
        deployment_id: payload.deployment_id.clone(),
        state: Some(state.to_string()),
        message,
        image,
        instance: Some(payload.instance),
        address,
        logs: Vec::new(),
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
    let logs = LogShipper::start(client.clone(), payload.deployment_id.clone(), payload.instance);
    let result = run(runtime, client, options, &payload, &logs).await;
    let outcome = match result {
        Ok(address) => {
            logs.finish().await;
            send(client, report("running", None, None, Some(address))).await
        }
        Err(Failure::Retry(reason)) => {
            logs.finish().await;
            DeployOutcome::Retry(reason)
        }
        Err(Failure::Failed(reason)) => {
            logs.line("agent", format!("deploy failed: {reason}"));
            logs.finish().await;
            send(client, report("failed", Some(reason), None, None)).await
        }
    };
    // Reports of intermediate states went out from `run`.
    outcome
}

async fn send(client: &ControlPlane, report: Report) -> DeployOutcome {
    match client.report(&report).await {
        Ok(()) => DeployOutcome::Done,
        // Without the report the control plane would wait forever: keep the
        // command so it is delivered (and checked) again.
        Err(err) => DeployOutcome::Retry(format!("could not report: {err}")),
    }
}

enum Failure {
    /// Not the deployment's fault (the Docker Engine is down): try again.
    Retry(String),
    Failed(String),
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
    let report = Report {
        deployment_id: payload.deployment_id.clone(),
        state: Some(state.to_string()),
        message: None,
        image,
        instance: Some(payload.instance),
        address: None,
        logs: Vec::new(),
    };
    client.report(&report).await.map_err(|e| Failure::Retry(format!("could not report {state}: {e}")))
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
    let name = payload.container_name();
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
            return check_or_remove(runtime, options, payload, &existing.id, logs).await;
        }
        runtime.remove(&existing.id).await?;
    }

    let registry = registry(client, options).await?;
    let image = match &payload.image {
        Some(image) => {
            state(client, payload, "deploying", Some(image.clone())).await?;
            logs.line("agent", format!("using image {image}"));
            if runtime.ensure_image(image, registry.as_ref()).await? {
                logs.line("agent", format!("pulled {image}"));
            }
            image.clone()
        }
        None => {
            state(client, payload, "building", None).await?;
            let tag = match &registry {
                Some(auth) => format!("{}/{}:{}", auth.address, payload.app, payload.deployment_id),
                None => format!("cloudweb/{}:{}", payload.app, payload.deployment_id),
            };
            build_from_source(runtime, options, payload, &tag, logs).await?;
            if let Some(auth) = &registry {
                logs.line("build", format!("pushing {tag}"));
                runtime.push_image(&tag, auth).await?;
            }
            state(client, payload, "deploying", Some(tag.clone())).await?;
            tag
        }
    };

    let mut env: Vec<String> = payload.env.iter().map(|(k, v)| format!("{k}={v}")).collect();
    env.push(format!("PORT={}", payload.port));
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
    };
    let id = runtime.start_app(&spec).await?;
    logs.line("agent", format!("started {name}"));
    check_or_remove(runtime, options, payload, &id, logs).await
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
/// passes; fails early when the container exits.
async fn healthy_address(runtime: &DockerRuntime, options: &DeployOptions, payload: &DeployPayload, id: &str, logs: &LogShipper) -> Result<String, Failure> {
    let port = runtime.host_port(id, payload.port).await?;
    let probe_host = if options.publish_ip == "0.0.0.0" { "127.0.0.1" } else { options.publish_ip.as_str() };
    let url = format!("http://{}:{port}{}", bracket(probe_host), payload.health.path);
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(2))
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .map_err(|e| Failure::Failed(e.to_string()))?;
    let started = Instant::now();
    let timeout = Duration::from_secs(u64::from(payload.health.timeout_seconds));
    // Most apps answer within a few tens of milliseconds of starting: probe
    // fast at first, then every 200 ms.
    let mut pause = Duration::from_millis(20);
    loop {
        if let Ok(response) = http.get(&url).send().await {
            let status = response.status().as_u16();
            if healthy_status(status) {
                logs.line("agent", format!("healthy after {:.1} s (HTTP {status} on {})", started.elapsed().as_secs_f64(), payload.health.path));
                return Ok(format!("{}:{port}", bracket(&options.advertise_host)));
            }
        }
        if !runtime.is_running(id).await? {
            return Err(Failure::Failed("the container exited before it answered the health check".into()));
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

fn bracket(host: &str) -> String {
    if host.contains(':') {
        format!("[{host}]")
    } else {
        host.to_string()
    }
}

/// The cluster registry, with Docker told to trust its CA.
async fn registry(client: &ControlPlane, options: &DeployOptions) -> Result<Option<RegistryAuth>, Failure> {
    let config = client.registry().await.map_err(|e| Failure::Retry(format!("cannot read the registry settings: {e}")))?;
    let (true, Some(address), Some(ca), Some(username), Some(password)) = (config.configured, config.address, config.ca, config.username, config.password) else {
        return Ok(None);
    };
    cloudweb_protocol::validate::endpoint("registry address", &address).map_err(|e| Failure::Failed(e.to_string()))?;
    let dir = options.docker_certs_dir.join(&address);
    let path = dir.join("ca.crt");
    if std::fs::read_to_string(&path).ok().as_deref() != Some(ca.as_str()) {
        std::fs::create_dir_all(&dir).and_then(|()| std::fs::write(&path, &ca)).map_err(|e| Failure::Failed(format!("cannot write {}: {e}", path.display())))?;
    }
    Ok(Some(RegistryAuth { address, username, password }))
}

async fn build_from_source(runtime: &DockerRuntime, options: &DeployOptions, payload: &DeployPayload, tag: &str, logs: &LogShipper) -> Result<(), Failure> {
    let source = payload.source.as_ref().ok_or_else(|| Failure::Failed("no source to build".into()))?;
    let work = options.data_dir.join("builds").join(format!("{}-{}", payload.deployment_id, payload.instance));
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).map_err(|e| Failure::Failed(format!("cannot create {}: {e}", work.display())))?;
    let result = build_in(runtime, options, payload, source, tag, &work, logs).await;
    let _ = std::fs::remove_dir_all(&work);
    result
}

async fn build_in(
    runtime: &DockerRuntime,
    options: &DeployOptions,
    payload: &DeployPayload,
    source: &cloudweb_protocol::Source,
    tag: &str,
    work: &Path,
    logs: &LogShipper,
) -> Result<(), Failure> {
    let checkout = work.join("src");
    let home = work.join("home");
    std::fs::create_dir_all(&home).map_err(|e| Failure::Failed(e.to_string()))?;
    logs.line("build", format!("cloning branch {} of {}", source.branch, source.repo_url));
    let mirrors = options.data_dir.join("git-mirrors");
    let commit = build::mirror::checkout(&mirrors, &payload.app, source, &checkout, &home, options.allow_file_repos).await.map_err(|e| Failure::Failed(e.to_string()))?;
    logs.line("build", format!("checked out {commit}"));
    let strategy = payload.strategy.unwrap_or(Strategy::Auto);
    let plan = build::plan(&checkout, strategy, payload.build.as_ref()).map_err(|e| Failure::Failed(e.to_string()))?;
    match plan {
        Plan::Dockerfile => {
            logs.line("build", "building the Dockerfile");
            let context = build::context_archive(&checkout, "", &[]).map_err(|e| Failure::Failed(e.to_string()))?;
            runtime.build_image(context, tag, |line| logs.line("build", line)).await?;
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

