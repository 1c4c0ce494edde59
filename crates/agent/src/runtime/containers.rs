//! Running containers: app instances (long-lived, labelled, published on a
//! host port) and one-shot build steps.

use std::collections::HashMap;

use bollard::models::{ContainerCreateBody, HostConfig, PortBinding, RestartPolicy, RestartPolicyNameEnum};
use bollard::query_parameters::{CreateContainerOptionsBuilder, LogsOptionsBuilder, WaitContainerOptionsBuilder};
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
        let labels = HashMap::from([
            (LABEL_NODE.to_string(), self.node_id.clone()),
            (LABEL_APP.to_string(), spec.app.clone()),
            (LABEL_DEPLOYMENT.to_string(), spec.deployment.clone()),
            (LABEL_INSTANCE.to_string(), spec.instance.to_string()),
        ]);
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
                restart_policy: Some(RestartPolicy { name: Some(RestartPolicyNameEnum::UNLESS_STOPPED), maximum_retry_count: None }),
                nano_cpus: spec.nano_cpus,
                memory: spec.memory_bytes,
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

    /// The host port Docker chose for the container's `port`.
    pub async fn host_port(&self, id: &str, port: u16) -> Result<u16, RuntimeError> {
        let inspect = self.docker()?.inspect_container(id, None::<bollard::query_parameters::InspectContainerOptions>).await?;
        inspect
            .network_settings
            .and_then(|n| n.ports)
            .and_then(|ports| ports.get(&format!("{port}/tcp")).cloned().flatten())
            .and_then(|bindings| bindings.into_iter().find_map(|b| b.host_port?.parse().ok()))
            .ok_or_else(|| RuntimeError::Failed(format!("container {id} has no published port for {port}")))
    }

    /// Whether the container is still running (false once it exited).
    pub async fn is_running(&self, id: &str) -> Result<bool, RuntimeError> {
        let inspect = self.docker()?.inspect_container(id, None::<bollard::query_parameters::InspectContainerOptions>).await?;
        Ok(inspect.state.and_then(|s| s.running).unwrap_or(false))
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
        let body = ContainerCreateBody {
            image: Some(step.image.clone()),
            cmd: Some(step.command.clone()),
            env: Some(step.env.clone()),
            working_dir: Some("/src".to_string()),
            labels: Some(HashMap::from([(LABEL_NODE.to_string(), self.node_id.clone())])),
            host_config: Some(HostConfig { binds: Some(vec![format!("{}:/src", step.mount)]), ..Default::default() }),
            ..Default::default()
        };
        let created = docker.create_container(None::<bollard::query_parameters::CreateContainerOptions>, body).await?;
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
        let _ = self.remove(&created.id).await;
        result
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
        let labels = vec![format!("{}={}", super::LABEL_NODE, self.node_id), format!("{LABEL_ROLE}=ingress")];
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
