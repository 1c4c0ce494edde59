//! Managed services' containers: one per service, `cw-svc.<name>` (a dot no app name has, so never an app instance's `cw-<app>-<n>`),
//! labelled with its generation, published on one address and port only,
//! restarted by Docker (`unless-stopped`) when it dies, probed with
//! `docker exec` of the service's own tool.

use std::collections::HashMap;
use std::time::Duration;

use bollard::models::{ContainerCreateBody, ExecConfig, HostConfig, Mount, MountTypeEnum, PortBinding, RestartPolicy, RestartPolicyNameEnum};
use bollard::query_parameters::{CreateContainerOptionsBuilder, RemoveContainerOptionsBuilder};
use cloudweb_protocol::{ServiceExec, ServicePayload};
use futures_util::StreamExt;
use tokio::io::AsyncWriteExt;

use super::{DockerRuntime, RuntimeError, LABEL_NODE};

pub const LABEL_SERVICE: &str = "cloudweb.service";
pub const LABEL_GENERATION: &str = "cloudweb.generation";

/// What Docker says about a service's container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceContainer {
    pub id: String,
    pub generation: u64,
    pub running: bool,
    pub restarting: bool,
    pub restart_count: u64,
    pub exit_code: Option<i64>,
    pub error: Option<String>,
}

impl DockerRuntime {
    pub async fn service_container(&self, name: &str) -> Result<Option<ServiceContainer>, RuntimeError> {
        let container = cloudweb_protocol::services::container_name(name);
        match self.docker()?.inspect_container(&container, None::<bollard::query_parameters::InspectContainerOptions>).await {
            Ok(inspect) => {
                let labels = inspect.config.as_ref().and_then(|c| c.labels.clone()).unwrap_or_default();
                let state = inspect.state.unwrap_or_default();
                Ok(Some(ServiceContainer {
                    id: inspect.id.unwrap_or_default(),
                    generation: labels.get(LABEL_GENERATION).and_then(|g| g.parse().ok()).unwrap_or(0),
                    running: state.running.unwrap_or(false),
                    restarting: state.restarting.unwrap_or(false),
                    restart_count: inspect.restart_count.unwrap_or(0).max(0) as u64,
                    exit_code: state.exit_code,
                    error: state.error.filter(|e| !e.is_empty()),
                }))
            }
            Err(bollard::errors::Error::DockerResponseServerError { status_code: 404, .. }) => Ok(None),
            Err(err) => Err(err.into()),
        }
    }

    /// Creates and starts the service's container with its data directory
    /// mounted and its port published on `bind_ip` only.
    pub async fn start_service(&self, spec: &ServicePayload, bind_ip: &str, data_dir: &str) -> Result<String, RuntimeError> {
        let docker = self.docker()?;
        let port_key = format!("{}/tcp", spec.kind.port());
        let labels = HashMap::from([
            (LABEL_NODE.to_string(), self.node_id.clone()),
            (LABEL_SERVICE.to_string(), spec.service.clone()),
            (LABEL_GENERATION.to_string(), spec.generation.to_string()),
        ]);
        let body = ContainerCreateBody {
            image: Some(spec.image.clone()),
            env: Some(spec.env.iter().map(|(k, v)| format!("{k}={v}")).collect()),
            cmd: (!spec.command.is_empty()).then(|| spec.command.clone()),
            labels: Some(labels),
            exposed_ports: Some(HashMap::from([(port_key.clone(), HashMap::new())])),
            host_config: Some(HostConfig {
                port_bindings: Some(HashMap::from([(
                    port_key,
                    Some(vec![PortBinding { host_ip: Some(bind_ip.to_string()), host_port: Some(spec.host_port.to_string()) }]),
                )])),
                // Docker brings it back when it dies, with its growing
                // delay, and after a reboot.
                restart_policy: Some(RestartPolicy { name: Some(RestartPolicyNameEnum::UNLESS_STOPPED), maximum_retry_count: None }),
                memory: spec.memory_bytes.map(|m| m as i64),
                mounts: Some(vec![Mount {
                    source: Some(data_dir.to_string()),
                    target: Some(spec.kind.data_path().to_string()),
                    typ: Some(MountTypeEnum::BIND),
                    read_only: Some(false),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        };
        let name = cloudweb_protocol::services::container_name(&spec.service);
        let created = docker.create_container(Some(CreateContainerOptionsBuilder::new().name(&name).build()), body).await?;
        let started = docker.start_container(&created.id, None::<bollard::query_parameters::StartContainerOptions>).await;
        self.changed();
        started?;
        Ok(created.id)
    }

    /// Starts the service's existing (stopped) container again.
    pub async fn start_service_container(&self, name: &str) -> Result<(), RuntimeError> {
        let container = cloudweb_protocol::services::container_name(name);
        self.docker()?.start_container(&container, None::<bollard::query_parameters::StartContainerOptions>).await?;
        self.changed();
        Ok(())
    }

    /// Stops (10 s grace) and removes the service's container; false when
    /// there was none.
    pub async fn remove_service(&self, name: &str) -> Result<bool, RuntimeError> {
        let docker = self.docker()?;
        let container = cloudweb_protocol::services::container_name(name);
        let _ = docker
            .stop_container(&container, Some(bollard::query_parameters::StopContainerOptionsBuilder::new().t(super::STOP_GRACE_SECONDS).build()))
            .await;
        match docker.remove_container(&container, Some(RemoveContainerOptionsBuilder::new().force(true).build())).await {
            Ok(()) => {
                self.changed();
                Ok(true)
            }
            Err(bollard::errors::Error::DockerResponseServerError { status_code: 404, .. }) => Ok(false),
            Err(err) => Err(err.into()),
        }
    }

    /// Runs `cmd` in the service's container; Ok(true) when it exits 0
    /// within `limit`.
    pub async fn probe_service(&self, name: &str, cmd: &[String], limit: Duration) -> Result<bool, RuntimeError> {
        let docker = self.docker()?;
        let container = cloudweb_protocol::services::container_name(name);
        let config = ExecConfig { cmd: Some(cmd.to_vec()), attach_stdout: Some(true), attach_stderr: Some(true), ..Default::default() };
        let run = async {
            let exec = docker.create_exec(&container, config).await?;
            if let bollard::exec::StartExecResults::Attached { mut output, .. } = docker.start_exec(&exec.id, None).await? {
                while output.next().await.is_some() {}
            }
            let inspect = docker.inspect_exec(&exec.id).await?;
            Ok::<_, bollard::errors::Error>(inspect.exit_code == Some(0))
        };
        match tokio::time::timeout(limit, run).await {
            Ok(result) => Ok(result?),
            Err(_) => Ok(false),
        }
    }

    /// Runs `exec` in the service's container with its secret on standard
    /// input (then closed) and in the exec's own environment, never on a
    /// command line. Its exit code (None when it did not end within
    /// `limit`) and its output.
    pub async fn exec_service(&self, name: &str, exec: &ServiceExec, limit: Duration) -> Result<(Option<i64>, String), RuntimeError> {
        let docker = self.docker()?;
        let container = cloudweb_protocol::services::container_name(name);
        let config = ExecConfig {
            cmd: Some(exec.cmd.clone()),
            env: (!exec.env.is_empty()).then(|| exec.env.iter().map(|(k, v)| format!("{k}={v}")).collect()),
            attach_stdin: Some(true),
            attach_stdout: Some(true),
            attach_stderr: Some(true),
            ..Default::default()
        };
        let run = async {
            let created = docker.create_exec(&container, config).await?;
            let mut text = String::new();
            if let bollard::exec::StartExecResults::Attached { mut output, mut input } = docker.start_exec(&created.id, None).await? {
                // A write error means it exited early; its code says why.
                let _ = input.write_all(exec.stdin.as_bytes()).await;
                let _ = input.shutdown().await;
                drop(input);
                while let Some(Ok(chunk)) = output.next().await {
                    if text.len() < 4096 {
                        text.push_str(&String::from_utf8_lossy(&chunk.into_bytes()));
                    }
                }
            }
            let inspect = docker.inspect_exec(&created.id).await?;
            Ok::<_, bollard::errors::Error>((inspect.exit_code, text))
        };
        match tokio::time::timeout(limit, run).await {
            Ok(result) => Ok(result?),
            Err(_) => Ok((None, String::new())),
        }
    }

    /// The default bridge's gateway address on the host: where containers
    /// on this node reach a service when there is no mesh.
    pub async fn bridge_gateway(&self) -> Result<Option<String>, RuntimeError> {
        let network = self.docker()?.inspect_network("bridge", None::<bollard::query_parameters::InspectNetworkOptions>).await?;
        let configs = network.ipam.and_then(|ipam| ipam.config).unwrap_or_default();
        // The Engine leaves `Gateway` out when it picked the default (the
        // subnet's first address).
        Ok(configs.iter().find_map(|c| c.gateway.clone().filter(|g| g.parse::<std::net::Ipv4Addr>().is_ok())).or_else(|| {
            configs.iter().find_map(|c| c.subnet.as_deref().and_then(first_host)).map(|ip| ip.to_string())
        }))
    }
}

/// The first host address of an IPv4 subnet (`172.17.0.0/16` → `172.17.0.1`).
fn first_host(subnet: &str) -> Option<std::net::Ipv4Addr> {
    let (network, bits) = subnet.split_once('/')?;
    let network: std::net::Ipv4Addr = network.parse().ok()?;
    let bits: u32 = bits.parse().ok()?;
    if !(1..=30).contains(&bits) {
        return None;
    }
    let mask = u32::MAX << (32 - bits);
    Some(std::net::Ipv4Addr::from((u32::from(network) & mask) + 1))
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_default_gateway_is_the_subnets_first_address() {
        assert_eq!(super::first_host("172.17.0.0/16"), Some("172.17.0.1".parse().unwrap()));
        assert_eq!(super::first_host("10.1.2.0/24"), Some("10.1.2.1".parse().unwrap()));
        assert_eq!(super::first_host("fd00::/64"), None);
        assert_eq!(super::first_host("10.0.0.0/32"), None);
    }
}
