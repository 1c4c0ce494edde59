//! Running containers: app instances (long-lived, labelled, published on a
//! host port) and one-shot build steps.

use std::collections::HashMap;

use bollard::models::{ContainerCreateBody, HostConfig, PortBinding, RestartPolicy, RestartPolicyNameEnum};
use bollard::query_parameters::{CreateContainerOptionsBuilder, LogsOptionsBuilder, RemoveContainerOptionsBuilder, WaitContainerOptionsBuilder};
use futures_util::StreamExt;

use super::{DockerRuntime, RuntimeError, LABEL_APP, LABEL_DEPLOYMENT, LABEL_INSTANCE, LABEL_NODE};

/// An app instance to start.
#[derive(Debug, Clone)]
pub struct AppContainer {
    pub name: String,
    pub image: String,
    pub app: String,
    pub deployment: String,
    pub instance: u32,
    pub env: Vec<String>,
    pub port: u16,
    /// Host address the port is published on.
    pub publish_ip: String,
    pub nano_cpus: Option<i64>,
    pub memory_bytes: Option<i64>,
    /// Host directories (volumes' data) bind-mounted at container paths.
    pub mounts: Vec<(String, String)>,
    /// The liveness probe and the path it probes, kept as labels so that
    /// the supervisor finds them after an agent restart too.
    pub liveness: Option<(cloudweb_protocol::Liveness, String)>,
    /// The readiness probe and the path it probes, kept as labels the same
    /// way.
    pub readiness: Option<(cloudweb_protocol::Readiness, String)>,
}

/// A container's state as the health wait needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerState {
    /// Running now (and not between restarts).
    pub running: bool,
    /// The last exit code (0 while it never exited).
    pub exit_code: Option<i64>,
    /// How often Docker restarted it (its restart policy).
    pub restart_count: i64,
    /// Whether it ever exited.
    pub finished: bool,
}

impl ContainerState {
    /// The exit code when the container has exited at least once: it is
    /// stopped now, or its restart policy brought it back.
    pub fn crashed(&self) -> Option<i64> {
        (self.finished && (!self.running || self.restart_count > 0)).then(|| self.exit_code.unwrap_or(0))
    }
}

/// A build step: run to completion in `image` with `dir` mounted at /src.
#[derive(Debug, Clone)]
pub struct OneShot {
    pub image: String,
    pub command: Vec<String>,
    pub env: Vec<String>,
    pub mount: String,
}

impl DockerRuntime {
    /// Creates and starts an app container; returns its id.
    pub async fn start_app(&self, spec: &AppContainer) -> Result<String, RuntimeError> {
        let docker = self.docker()?;
        let port_key = format!("{}/tcp", spec.port);
        let mut labels = HashMap::from([
            (LABEL_NODE.to_string(), self.node_id.clone()),
            (LABEL_APP.to_string(), spec.app.clone()),
            (LABEL_DEPLOYMENT.to_string(), spec.deployment.clone()),
            (LABEL_INSTANCE.to_string(), spec.instance.to_string()),
        ]);
        if let Some((liveness, path)) = &spec.liveness {
            labels.insert(super::LABEL_LIVENESS.to_string(), serde_json::to_string(liveness).unwrap_or_default());
            labels.insert(super::LABEL_LIVENESS_PATH.to_string(), path.clone());
        }
        if let Some((readiness, path)) = &spec.readiness {
            labels.insert(super::LABEL_READINESS.to_string(), serde_json::to_string(readiness).unwrap_or_default());
            labels.insert(super::LABEL_LIVENESS_PATH.to_string(), path.clone());
        }
        let body = ContainerCreateBody {
            image: Some(spec.image.clone()),
            env: Some(spec.env.clone()),
            labels: Some(labels),
            exposed_ports: Some(HashMap::from([(port_key.clone(), HashMap::new())])),
            host_config: Some(HostConfig {
                port_bindings: Some(HashMap::from([(
                    port_key,
                    Some(vec![PortBinding { host_ip: Some(spec.publish_ip.clone()), host_port: Some(String::new()) }]),
                )])),
                // No restarts until it passed its health check (see
                // `keep_running`): an app that exits at start stays exited,
                // with its exit code, instead of looping.
                restart_policy: Some(RestartPolicy { name: Some(RestartPolicyNameEnum::NO), maximum_retry_count: None }),
                nano_cpus: spec.nano_cpus,
                memory: spec.memory_bytes,
                mounts: (!spec.mounts.is_empty()).then(|| {
                    spec.mounts
                        .iter()
                        .map(|(source, target)| bollard::models::Mount {
                            source: Some(source.clone()),
                            target: Some(target.clone()),
                            typ: Some(bollard::models::MountTypeEnum::BIND),
                            read_only: Some(false),
                            ..Default::default()
                        })
                        .collect()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        // A leftover container of that name (from a crash before the agent
        // recorded anything) belongs to this node only if its labels say so;
        // the caller removed its own already, so a conflict here is an error.
        let created = docker.create_container(Some(CreateContainerOptionsBuilder::new().name(&spec.name).build()), body).await?;
        let started = docker.start_container(&created.id, None::<bollard::query_parameters::StartContainerOptions>).await;
        // After the start, so a sample's list cannot see it created but not
        // yet running and then trust that list.
        self.changed();
        started?;
        Ok(created.id)
    }

    /// Gives a healthy instance its restart policy, `unless-stopped`: from
    /// now on Docker restarts it when it exits or the host reboots.
    pub async fn keep_running(&self, id: &str) -> Result<(), RuntimeError> {
        let update = bollard::models::ContainerUpdateBody {
            restart_policy: Some(RestartPolicy { name: Some(RestartPolicyNameEnum::UNLESS_STOPPED), maximum_retry_count: None }),
            ..Default::default()
        };
        self.docker()?.update_container(id, update).await?;
        Ok(())
    }

    /// When the running container started (`None` once it is not
    /// running): a change means Docker restarted it.
    pub async fn started_at(&self, id: &str) -> Result<Option<String>, RuntimeError> {
        let inspect = self.docker()?.inspect_container(id, None::<bollard::query_parameters::InspectContainerOptions>).await;
        match inspect {
            Ok(inspect) => {
                let state = inspect.state.unwrap_or_default();
                Ok(if state.running.unwrap_or(false) { Some(state.started_at.unwrap_or_default()) } else { None })
            }
            Err(bollard::errors::Error::DockerResponseServerError { status_code: 404, .. }) => Ok(None),
            Err(err) => Err(err.into()),
        }
    }

    /// Whether the container is still running (false once it exited).
    pub async fn is_running(&self, id: &str) -> Result<bool, RuntimeError> {
        Ok(self.container_state(id).await?.running)
    }

    /// What became of a container: running, or exited (with its code), and
    /// how often Docker restarted it.
    pub async fn container_state(&self, id: &str) -> Result<ContainerState, RuntimeError> {
        Ok(self.container_state_and_port(id, None).await?.0)
    }

    /// [`container_state`](Self::container_state) and, when `port` is
    /// given, the host port Docker published it on, from one inspection.
    pub async fn container_state_and_port(&self, id: &str, port: Option<u16>) -> Result<(ContainerState, Option<u16>), RuntimeError> {
        let inspect = self.docker()?.inspect_container(id, None::<bollard::query_parameters::InspectContainerOptions>).await?;
        let host_port = port.and_then(|port| {
            inspect
                .network_settings
                .as_ref()
                .and_then(|n| n.ports.as_ref())
                .and_then(|ports| ports.get(&format!("{port}/tcp")).cloned().flatten())
                .and_then(|bindings| bindings.into_iter().find_map(|b| b.host_port?.parse().ok()))
        });
        let state = inspect.state.unwrap_or_default();
        let state = ContainerState {
            // Docker reports a container between restarts as running too.
            running: state.running.unwrap_or(false) && !state.restarting.unwrap_or(false),
            exit_code: state.exit_code,
            restart_count: inspect.restart_count.unwrap_or(0),
            finished: state.finished_at.is_some_and(|at| !at.starts_with("0001-")),
        };
        Ok((state, host_port))
    }

    /// The last `tail` lines of a container's output, as (stream, line).
    pub async fn logs(&self, id: &str, tail: usize) -> Result<Vec<(String, String)>, RuntimeError> {
        let docker = self.docker()?;
        let options = LogsOptionsBuilder::new().stdout(true).stderr(true).tail(&tail.to_string()).build();
        let mut stream = docker.logs(id, Some(options));
        let mut lines = Vec::new();
        while let Some(item) = stream.next().await {
            let (name, bytes) = match item? {
                bollard::container::LogOutput::StdErr { message } => ("stderr", message),
                bollard::container::LogOutput::StdOut { message } | bollard::container::LogOutput::Console { message } => ("stdout", message),
                bollard::container::LogOutput::StdIn { .. } => continue,
            };
            for line in String::from_utf8_lossy(&bytes).lines() {
                lines.push((name.to_string(), line.to_string()));
            }
        }
        Ok(lines)
    }

    /// Runs a build step to completion and returns its exit code and output.
    pub async fn run_once(&self, step: &OneShot) -> Result<(i64, Vec<(String, String)>), RuntimeError> {
        let docker = self.docker()?;
        let network = self.build_network().await?;
        let body = ContainerCreateBody {
            image: Some(step.image.clone()),
            cmd: Some(step.command.clone()),
            env: Some(step.env.clone()),
            working_dir: Some("/src".to_string()),
            // The role label lets a restarted agent find and remove a build
            // step that its killed predecessor left running.
            labels: Some(HashMap::from([
                (LABEL_NODE.to_string(), self.node_id.clone()),
                (LABEL_ROLE.to_string(), ROLE_BUILDER.to_string()),
            ])),
            host_config: Some(HostConfig {
                binds: Some(vec![format!("{}:/src", step.mount)]),
                network_mode: Some(network),
                ..Default::default()
            }),
            ..Default::default()
        };
        let created = docker.create_container(None::<bollard::query_parameters::CreateContainerOptions>, body).await?;
        // Removed however this ends, also when the caller gives up on the
        // step (build timeout, cancellation) and drops this future.
        let _guard = RemoveOnDrop { runtime: self.clone(), id: Some(created.id.clone()) };
        let result = async {
            docker.start_container(&created.id, None::<bollard::query_parameters::StartContainerOptions>).await?;
            let mut wait = docker.wait_container(&created.id, Some(WaitContainerOptionsBuilder::new().build()));
            let mut code = 0;
            while let Some(item) = wait.next().await {
                match item {
                    Ok(response) => code = response.status_code,
                    // A non-zero exit arrives as an error carrying the code.
                    Err(bollard::errors::Error::DockerContainerWaitError { code: exit, .. }) => code = exit,
                    Err(err) => return Err(RuntimeError::from(err)),
                }
            }
            let output = self.logs(&created.id, 1000).await?;
            Ok((code, output))
        }
        .await;
        result
    }
}

/// Removes a container in the background when dropped.
struct RemoveOnDrop {
    runtime: DockerRuntime,
    id: Option<String>,
}

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        if let (Some(id), Ok(handle)) = (self.id.take(), tokio::runtime::Handle::try_current()) {
            let runtime = self.runtime.clone();
            handle.spawn(async move {
                if let Err(err) = runtime.remove(&id).await {
                    tracing::warn!(container = %id, error = %err, "could not remove a build step container");
                }
            });
        }
    }
}

/// The ingress's Caddy run as a container (`--caddy-image`).
#[derive(Debug, Clone)]
pub struct CaddyContainer {
    pub name: String,
    pub image: String,
    /// The agent's Caddy dir: mounted at the same path, so the admin and
    /// access log sockets and the certificates live where the agent looks.
    pub dir: String,
    pub bootstrap: String,
}

pub const LABEL_ROLE: &str = "cloudweb.role";
/// The bridge network every build step and `docker build` runs on, apart
/// from app containers (see "What builds can reach" in docs/src/guide/builds.md).
pub const BUILD_NETWORK: &str = "cloudweb-build";
/// Its bridge interface on the host.
pub const BUILD_BRIDGE: &str = "cw-build0";
/// `cloudweb.role` of build step containers.
pub const ROLE_BUILDER: &str = "builder";

impl DockerRuntime {
    /// The network build steps run on ([`BUILD_NETWORK`]), created on first
    /// use. When it cannot be created the build fails: Docker's default
    /// bridge would let build steps reach what the build network keeps
    /// them from (fail closed).
    pub async fn build_network(&self) -> Result<String, RuntimeError> {
        match self.ensure_build_network().await {
            Ok(()) => Ok(BUILD_NETWORK.to_string()),
            Err(err) => Err(RuntimeError::Failed(format!(
                "cannot create the build network {BUILD_NETWORK}, so the build is refused rather than run on Docker's default bridge: {err}"
            ))),
        }
    }

    async fn ensure_build_network(&self) -> Result<(), RuntimeError> {
        let docker = self.docker()?;
        match docker.inspect_network(BUILD_NETWORK, None::<bollard::query_parameters::InspectNetworkOptions>).await {
            Ok(_) => return Ok(()),
            Err(bollard::errors::Error::DockerResponseServerError { status_code: 404, .. }) => {}
            Err(err) => return Err(err.into()),
        }
        let request = bollard::models::NetworkCreateRequest {
            name: BUILD_NETWORK.to_string(),
            driver: Some("bridge".to_string()),
            labels: Some(HashMap::from([(LABEL_ROLE.to_string(), "build-network".to_string())])),
            options: Some(HashMap::from([
                // A fixed interface name, so the host's firewall rules can
                // name it; builds cannot talk to each other.
                ("com.docker.network.bridge.name".to_string(), BUILD_BRIDGE.to_string()),
                ("com.docker.network.bridge.enable_icc".to_string(), "false".to_string()),
            ])),
            ..Default::default()
        };
        match docker.create_network(request).await {
            // Another agent on the same engine made it first.
            Ok(_) | Err(bollard::errors::Error::DockerResponseServerError { status_code: 409, .. }) => Ok(()),
            // Two agents creating it at the same moment: the Engine may
            // answer the loser 403 ("networks have same bridge name")
            // rather than 409. The network is there all the same.
            Err(err) => match docker.inspect_network(BUILD_NETWORK, None::<bollard::query_parameters::InspectNetworkOptions>).await {
                Ok(_) => Ok(()),
                Err(_) => Err(err.into()),
            },
        }
    }

    /// Stops and removes every container labelled with this node's id, all
    /// at once so the stop grace periods overlap: app instances, build
    /// steps, task runs, services and the ingress. For a node that is no
    /// longer in the cluster, whose instances already run elsewhere.
    /// Returns the names removed and, for each container that could not
    /// be removed, its name and the reason.
    pub async fn remove_everything_of_this_node(&self) -> Result<(Vec<String>, Vec<(String, RuntimeError)>), RuntimeError> {
        let filters = HashMap::from([("label", vec![format!("{LABEL_NODE}={}", self.node_id)])]);
        let containers = self
            .docker()?
            .list_containers(Some(bollard::query_parameters::ListContainersOptionsBuilder::new().all(true).filters(&filters).build()))
            .await?;
        let removals = containers.into_iter().filter_map(|c| {
            let id = c.id?;
            let name = c.names.unwrap_or_default().first().map(|n| n.trim_start_matches('/').to_string()).unwrap_or_else(|| id.clone());
            Some(async move { (name, self.remove(&id).await) })
        });
        let mut removed = Vec::new();
        let mut failed = Vec::new();
        for (name, result) in futures_util::future::join_all(removals).await {
            match result {
                Ok(()) => removed.push(name),
                Err(err) => failed.push((name, err)),
            }
        }
        Ok((removed, failed))
    }

    /// This node's build step containers, running or not, as (id, name,
    /// Docker's state word).
    pub async fn builders(&self) -> Result<Vec<(String, String, String)>, RuntimeError> {
        let labels = vec![format!("{}={}", super::LABEL_NODE, self.node_id), format!("{LABEL_ROLE}={ROLE_BUILDER}")];
        let filters = HashMap::from([("label", labels)]);
        let containers = self
            .docker()?
            .list_containers(Some(bollard::query_parameters::ListContainersOptionsBuilder::new().all(true).filters(&filters).build()))
            .await?;
        Ok(containers
            .into_iter()
            .filter_map(|c| {
                let name = super::first_name(c.names);
                Some((c.id?, name, c.state.map(|s| s.to_string()).unwrap_or_default()))
            })
            .collect())
    }

    /// Kills and removes one build step container at once, without a stop
    /// grace period: a build step's work is worthless once its build is
    /// abandoned, and a shell as PID 1 ignores SIGTERM, so a grace period
    /// would only hold the caller for its whole length.
    pub async fn kill_and_remove(&self, id: &str) -> Result<(), RuntimeError> {
        self.changed();
        let options = RemoveContainerOptionsBuilder::new().force(true).v(true).build();
        match self.docker()?.remove_container(id, Some(options)).await {
            Ok(()) | Err(bollard::errors::Error::DockerResponseServerError { status_code: 404, .. }) => Ok(()),
            Err(bollard::errors::Error::DockerResponseServerError { status_code: 409, message }) if message.contains("already in progress") => Ok(()),
            Err(err) => Err(err.into()),
        }
    }

    /// Stops and removes this node's containers with the given role label;
    /// returns how many there were.
    async fn remove_role(&self, role: &str) -> Result<usize, RuntimeError> {
        let labels = vec![format!("{}={}", super::LABEL_NODE, self.node_id), format!("{LABEL_ROLE}={role}")];
        let filters = HashMap::from([("label", labels)]);
        let containers = self
            .docker()?
            .list_containers(Some(bollard::query_parameters::ListContainersOptionsBuilder::new().all(true).filters(&filters).build()))
            .await?;
        for container in &containers {
            if let Some(id) = &container.id {
                self.remove(id).await?;
            }
        }
        Ok(containers.len())
    }
}

impl DockerRuntime {
    /// Starts the ingress container, or adopts it when one of this node with
    /// the same image already runs (it outlives agent restarts, so traffic
    /// goes on while the agent is upgraded). Returns its id and whether it
    /// was adopted.
    pub async fn ensure_caddy(&self, spec: &CaddyContainer) -> Result<(String, bool), RuntimeError> {
        let docker = self.docker()?;
        match docker.inspect_container(&spec.name, None::<bollard::query_parameters::InspectContainerOptions>).await {
            Ok(existing) => {
                let labels = existing.config.as_ref().and_then(|c| c.labels.clone()).unwrap_or_default();
                let ours = labels.get(super::LABEL_NODE) == Some(&self.node_id) && labels.get(LABEL_ROLE).map(String::as_str) == Some("ingress");
                if !ours {
                    return Err(RuntimeError::Failed(format!("a container named {} exists and is not this node's ingress", spec.name)));
                }
                let same_image = existing.config.as_ref().and_then(|c| c.image.as_deref()) == Some(spec.image.as_str());
                let running = existing.state.as_ref().and_then(|s| s.running).unwrap_or(false);
                let id = existing.id.unwrap_or_default();
                if same_image && running {
                    return Ok((id, true));
                }
                self.remove(&id).await?;
            }
            Err(bollard::errors::Error::DockerResponseServerError { status_code: 404, .. }) => {}
            Err(err) => return Err(err.into()),
        }
        let labels = HashMap::from([(super::LABEL_NODE.to_string(), self.node_id.clone()), (LABEL_ROLE.to_string(), "ingress".to_string())]);
        let body = ContainerCreateBody {
            image: Some(spec.image.clone()),
            cmd: Some(vec!["caddy".into(), "run".into(), "--config".into(), spec.bootstrap.clone()]),
            env: Some(vec![
                format!("XDG_DATA_HOME={}/data", spec.dir),
                format!("XDG_CONFIG_HOME={}/config", spec.dir),
                format!("HOME={}", spec.dir),
            ]),
            labels: Some(labels),
            host_config: Some(HostConfig {
                // The ports Caddy listens on and the agent's loopback
                // services are the host's.
                network_mode: Some("host".into()),
                binds: Some(vec![format!("{}:{}", spec.dir, spec.dir)]),
                restart_policy: Some(RestartPolicy { name: Some(RestartPolicyNameEnum::UNLESS_STOPPED), maximum_retry_count: None }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let created = docker.create_container(Some(CreateContainerOptionsBuilder::new().name(&spec.name).build()), body).await?;
        docker.start_container(&created.id, None::<bollard::query_parameters::StartContainerOptions>).await?;
        Ok((created.id, false))
    }

    /// Removes this node's ingress container, if any (the node leaves).
    pub async fn remove_ingress(&self) -> Result<usize, RuntimeError> {
        self.remove_role("ingress").await
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    /// A stand-in Docker Engine on a unix socket: the build network does
    /// not exist and cannot be created; every other request is a 500.
    /// Records the request lines it got.
    async fn engine_without_networks(socket: &std::path::Path) -> Arc<Mutex<Vec<String>>> {
        let listener = tokio::net::UnixListener::bind(socket).unwrap();
        let (requests, _task) = cloudweb_test_support::serve_json(listener, |request| {
            let (status, message) = if request.method == "GET" && request.path.contains("/networks/cloudweb-build") {
                ("404 Not Found", "network cloudweb-build not found")
            } else if request.method == "POST" && request.path.contains("/networks/create") {
                ("500 Internal Server Error", "failed to create the bridge: operation not permitted")
            } else {
                ("500 Internal Server Error", "unexpected request")
            };
            (status, format!("{{\"message\":\"{message}\"}}"))
        });
        requests
    }

    #[tokio::test]
    async fn builds_fail_when_the_build_network_cannot_be_created() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("docker.sock");
        let requests = engine_without_networks(&socket).await;
        let runtime = DockerRuntime::new(&format!("unix://{}", socket.display()), "n-test").unwrap();

        let step = OneShot { image: "builder".into(), command: vec!["true".into()], env: Vec::new(), mount: "/tmp".into() };
        let err = runtime.run_once(&step).await.unwrap_err().to_string();
        assert!(err.contains("cannot create the build network cloudweb-build"), "{err}");
        assert!(err.contains("operation not permitted"), "{err}");
        let err = runtime.build_image(Vec::new(), "web:1", &[], |_| {}).await.unwrap_err().to_string();
        assert!(err.contains("cannot create the build network cloudweb-build"), "{err}");

        // Nothing ran on Docker's default bridge instead.
        let requests = requests.lock().unwrap().clone();
        assert!(requests.iter().any(|r| r.contains("/networks/create")), "{requests:?}");
        assert!(!requests.iter().any(|r| r.contains("/containers/create") || r.contains("/build")), "{requests:?}");
    }
}
