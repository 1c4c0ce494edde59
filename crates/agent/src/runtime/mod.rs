//! The only module that talks to the Docker Engine API. Every container the
//! agent creates carries the labels below, and every query filters on this
//! node's id, so an agent never touches containers that are not its own
//! (other agents may share the same daemon).

use std::collections::HashMap;

use bollard::query_parameters::{ListContainersOptionsBuilder, RemoveContainerOptionsBuilder, StopContainerOptionsBuilder};
use bollard::Docker;

pub const LABEL_NODE: &str = "cloudweb.node";
pub const LABEL_APP: &str = "cloudweb.app";
pub const LABEL_DEPLOYMENT: &str = "cloudweb.deployment";
pub const LABEL_INSTANCE: &str = "cloudweb.instance";

/// Seconds a container gets to exit after SIGTERM before it is killed.
const STOP_GRACE_SECONDS: i32 = 10;

#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("docker engine unavailable: {0}")]
    Unavailable(String),
    #[error("docker engine error: {0}")]
    Engine(#[from] bollard::errors::Error),
}

/// This node's Docker Engine. The connection is made on each use, so an
/// engine that is down when the agent starts (or restarts later) only delays
/// the commands that need it; heartbeats go on.
#[derive(Clone)]
pub struct DockerRuntime {
    socket: String,
    node_id: String,
}

impl DockerRuntime {
    /// `host` is `unix:///path/to/docker.sock`.
    pub fn new(host: &str, node_id: &str) -> Result<DockerRuntime, RuntimeError> {
        let socket = host
            .strip_prefix("unix://")
            .filter(|path| path.starts_with('/'))
            .ok_or_else(|| RuntimeError::Unavailable(format!("docker host must be unix:///path, got {host:?}")))?;
        Ok(DockerRuntime { socket: socket.to_string(), node_id: node_id.to_string() })
    }

    fn docker(&self) -> Result<Docker, RuntimeError> {
        Docker::connect_with_unix(&self.socket, 60, bollard::API_DEFAULT_VERSION)
            .map_err(|e| RuntimeError::Unavailable(format!("{}: {e}", self.socket)))
    }

    /// Stops and removes this node's containers of one deployment. Returns
    /// how many there were; zero is success (stopping is idempotent).
    pub async fn stop_deployment(&self, deployment_id: &str) -> Result<usize, RuntimeError> {
        let filters = HashMap::from([(
            "label",
            vec![format!("{LABEL_NODE}={}", self.node_id), format!("{LABEL_DEPLOYMENT}={deployment_id}")],
        )]);
        let docker = self.docker()?;
        let containers = docker
            .list_containers(Some(ListContainersOptionsBuilder::new().all(true).filters(&filters).build()))
            .await?;
        for container in &containers {
            let Some(id) = container.id.as_deref() else { continue };
            let stop = StopContainerOptionsBuilder::new().t(STOP_GRACE_SECONDS).build();
            match docker.stop_container(id, Some(stop)).await {
                Ok(()) => {}
                // Already stopped (304) or already gone (404) are both fine.
                Err(bollard::errors::Error::DockerResponseServerError { status_code: 304 | 404, .. }) => {}
                Err(err) => return Err(err.into()),
            }
            match docker.remove_container(id, Some(RemoveContainerOptionsBuilder::new().force(true).build())).await {
                Ok(()) | Err(bollard::errors::Error::DockerResponseServerError { status_code: 404, .. }) => {}
                Err(err) => return Err(err.into()),
            }
        }
        Ok(containers.len())
    }
}
