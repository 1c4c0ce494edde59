//! The only module that talks to the Docker Engine API. Every container the
//! agent creates carries the labels below, and every query filters on this
//! node's id, so an agent never touches containers that are not its own
//! (other agents may share the same daemon).

mod backup_containers;
pub mod cgroup;
mod containers;
mod die_events;
mod images;
mod liveness_containers;
mod logs;
mod output_lines;
mod service_containers;
mod task_containers;
mod exec_sessions;
pub use exec_sessions::{Exec, ExecStatus};
mod usage;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bollard::query_parameters::{ListContainersOptionsBuilder, RemoveContainerOptionsBuilder, StopContainerOptionsBuilder};
use bollard::Docker;

pub use backup_containers::{throwaway_name, AttachedExec, Throwaway, LABEL_BACKUP_JOB, ROLE_BACKUP};
pub use containers::{AppContainer, CaddyContainer, ContainerState, OneShot, BUILD_BRIDGE, BUILD_NETWORK};
pub use die_events::Died;
pub use images::{is_transient_registry_error, AppImage, RegistryAuth};
pub use liveness_containers::{Probed, LABEL_LIVENESS, LABEL_LIVENESS_PATH, LABEL_READINESS};
pub use logs::{AppInstance, OutputLine};
pub use service_containers::{ServiceContainer, LABEL_GENERATION, LABEL_SERVICE};
pub use task_containers::{engine_message, TaskContainer, TaskSpec, LABEL_TASK, LABEL_TASK_TIMEOUT, ROLE_TASK};
pub use usage::{Sample, UsageTracker};

pub const LABEL_NODE: &str = "cloudweb.node";
pub const LABEL_APP: &str = "cloudweb.app";
pub const LABEL_DEPLOYMENT: &str = "cloudweb.deployment";
/// On images built from code: the full commit they were built from.
pub const LABEL_COMMIT: &str = "cloudweb.commit";
pub const LABEL_INSTANCE: &str = "cloudweb.instance";
/// On images this agent builds: its node id (images also carry
/// [`LABEL_APP`], the app, which [`crate::prune`] goes by).
pub const LABEL_BUILT_BY: &str = "cloudweb.built-by";

/// Seconds a container gets to exit after SIGTERM before it is killed.
const STOP_GRACE_SECONDS: i32 = 10;

#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("docker engine unavailable: {0}")]
    Unavailable(String),
    #[error("docker engine error: {0}")]
    Engine(#[from] bollard::errors::Error),
    #[error("{0}")]
    Failed(String),
}

/// This node's Docker Engine. The connection is made on each use, so an
/// engine that is down when the agent starts (or restarts later) only delays
/// the commands that need it; heartbeats go on.
#[derive(Clone)]
pub struct DockerRuntime {
    socket: String,
    node_id: String,
    /// Bumped whenever this agent starts or removes a container, so the
    /// usage sampler knows when its last container list may be stale.
    changes: Arc<AtomicU64>,
}

/// A container of this node, as found by its labels.
#[derive(Debug, Clone)]
pub struct OwnContainer {
    pub id: String,
    pub name: String,
    pub deployment: String,
    pub instance: u32,
    pub running: bool,
    /// Docker's word for it: `running`, `exited`, `restarting`, ...
    pub state: String,
    /// When it was created (Unix seconds).
    pub created: Option<i64>,
}

impl DockerRuntime {
    /// `host` is `unix:///path/to/docker.sock`.
    pub fn new(host: &str, node_id: &str) -> Result<DockerRuntime, RuntimeError> {
        let socket = host
            .strip_prefix("unix://")
            .filter(|path| path.starts_with('/'))
            .ok_or_else(|| RuntimeError::Unavailable(format!("docker host must be unix:///path, got {host:?}")))?;
        Ok(DockerRuntime { socket: socket.to_string(), node_id: node_id.to_string(), changes: Arc::default() })
    }

    pub fn node_id(&self) -> &str {
        &self.node_id
    }

    fn changes(&self) -> u64 {
        self.changes.load(Ordering::SeqCst)
    }

    fn changed(&self) {
        self.changes.fetch_add(1, Ordering::SeqCst);
    }

    fn docker(&self) -> Result<Docker, RuntimeError> {
        Docker::connect_with_unix(&self.socket, 600, bollard::API_DEFAULT_VERSION)
            .map_err(|e| RuntimeError::Unavailable(format!("{}: {e}", self.socket)))
    }

    /// Every container labelled with this node's id, whatever its role (app
    /// instances, build steps, task runs, the ingress), as (id, name). For `leave`,
    /// which must not leave any of them behind with their ports.
    pub async fn all_node_containers(&self) -> Result<Vec<(String, String)>, RuntimeError> {
        let containers = self.labelled(vec![format!("{LABEL_NODE}={}", self.node_id)]).await?;
        Ok(containers
            .into_iter()
            .filter_map(|c| {
                let name = first_name(c.names);
                Some((c.id?, name))
            })
            .collect())
    }

    /// Names of the containers on this host (running or not) that mount
    /// host directory `source`.
    pub async fn containers_mounting(&self, source: &str) -> Result<Vec<String>, RuntimeError> {
        let containers = self.docker()?.list_containers(Some(ListContainersOptionsBuilder::new().all(true).build())).await?;
        Ok(containers
            .into_iter()
            .filter(|c| c.mounts.as_ref().is_some_and(|mounts| mounts.iter().any(|m| m.source.as_deref() == Some(source))))
            .map(|c| first_name(c.names))
            .collect())
    }

    /// The running containers that bind-mount `source`, by id.
    pub async fn running_mounting(&self, source: &str) -> Result<Vec<String>, RuntimeError> {
        let containers = self.docker()?.list_containers(Some(ListContainersOptionsBuilder::new().build())).await?;
        Ok(containers
            .into_iter()
            .filter(|c| c.mounts.as_ref().is_some_and(|mounts| mounts.iter().any(|m| m.source.as_deref() == Some(source))))
            .filter_map(|c| c.id)
            .collect())
    }

    /// Stops a container (with the grace period) and keeps it, so it can
    /// start again as it was.
    pub async fn stop_keep(&self, id: &str) -> Result<(), RuntimeError> {
        let stop = StopContainerOptionsBuilder::new().t(STOP_GRACE_SECONDS).build();
        self.changed();
        match self.docker()?.stop_container(id, Some(stop)).await {
            Ok(()) | Err(bollard::errors::Error::DockerResponseServerError { status_code: 304, .. }) => Ok(()),
            Err(err) => Err(err.into()),
        }
    }

    /// Starts a stopped container again; one that runs or is gone is fine.
    pub async fn start_existing(&self, id: &str) -> Result<(), RuntimeError> {
        self.changed();
        match self.docker()?.start_container(id, None::<bollard::query_parameters::StartContainerOptions>).await {
            Ok(()) | Err(bollard::errors::Error::DockerResponseServerError { status_code: 304 | 404, .. }) => Ok(()),
            Err(err) => Err(err.into()),
        }
    }

    /// Every container (running or not) carrying all of `labels`.
    async fn labelled(&self, labels: Vec<String>) -> Result<Vec<bollard::models::ContainerSummary>, RuntimeError> {
        let filters = HashMap::from([("label", labels)]);
        Ok(self
            .docker()?
            .list_containers(Some(ListContainersOptionsBuilder::new().all(true).filters(&filters).build()))
            .await?)
    }

    /// This node's containers of deployments (app instances), optionally
    /// only those of one deployment. Containers without a deployment label
    /// (build steps, task runs, the ingress, services) are not among them.
    pub async fn own_containers(&self, deployment_id: Option<&str>) -> Result<Vec<OwnContainer>, RuntimeError> {
        let mut labels = vec![format!("{LABEL_NODE}={}", self.node_id)];
        if let Some(deployment) = deployment_id {
            labels.push(format!("{LABEL_DEPLOYMENT}={deployment}"));
        }
        let containers = self.labelled(labels).await?;
        Ok(containers
            .into_iter()
            .filter_map(|c| {
                let labels = c.labels.unwrap_or_default();
                Some(OwnContainer {
                    id: c.id?,
                    name: first_name(c.names),
                    deployment: labels.get(LABEL_DEPLOYMENT)?.clone(),
                    instance: labels.get(LABEL_INSTANCE).and_then(|i| i.parse().ok()).unwrap_or(0),
                    running: c.state.as_ref().is_some_and(|s| s.to_string() == "running"),
                    state: c.state.map(|s| s.to_string()).unwrap_or_default(),
                    created: c.created,
                })
            })
            .collect())
    }

    /// Stops and removes this node's containers of one deployment (or of one
    /// instance of it). Returns how many there were; zero is success.
    pub async fn stop_deployment(&self, deployment_id: &str, instance: Option<u32>) -> Result<usize, RuntimeError> {
        let containers: Vec<OwnContainer> = self
            .own_containers(Some(deployment_id))
            .await?
            .into_iter()
            .filter(|c| instance.is_none_or(|i| c.instance == i))
            .collect();
        for container in &containers {
            self.remove(&container.id).await?;
        }
        Ok(containers.len())
    }

    /// For a `recreate` rollout: stops and removes this node's instances of
    /// `app` that are older than container number `number` (container
    /// names grow with every instance the app ever had, so a late command
    /// of an older deployment never stops a newer one). Returns how many.
    pub async fn stop_older_instances(&self, app: &str, number: u64) -> Result<usize, RuntimeError> {
        let prefix = format!("cw-{app}-");
        let older: Vec<OwnContainer> = self
            .own_containers(None)
            .await?
            .into_iter()
            .filter(|c| c.name.strip_prefix(&prefix).and_then(|n| n.parse::<u64>().ok()).is_some_and(|n| n < number))
            .collect();
        for container in &older {
            self.remove(&container.id).await?;
        }
        Ok(older.len())
    }

    /// Stops (with a grace period) and removes one container.
    pub async fn remove(&self, id: &str) -> Result<(), RuntimeError> {
        let docker = self.docker()?;
        self.changed();
        let stop = StopContainerOptionsBuilder::new().t(STOP_GRACE_SECONDS).build();
        match docker.stop_container(id, Some(stop)).await {
            Ok(()) => {}
            // Already stopped (304) or already gone (404) are both fine.
            Err(bollard::errors::Error::DockerResponseServerError { status_code: 304 | 404, .. }) => {}
            Err(err) => return Err(err.into()),
        }
        match docker.remove_container(id, Some(RemoveContainerOptionsBuilder::new().force(true).v(true).build())).await {
            Ok(()) | Err(bollard::errors::Error::DockerResponseServerError { status_code: 404, .. }) => Ok(()),
            // A container started with auto-remove is being removed by the
            // Engine once stopped: it is going, which is what was asked.
            Err(bollard::errors::Error::DockerResponseServerError { status_code: 409, message }) if message.contains("already in progress") => Ok(()),
            Err(err) => Err(err.into()),
        }
    }
}

/// A container's first name as Docker lists it, without the leading '/'.
fn first_name(names: Option<Vec<String>>) -> String {
    names.unwrap_or_default().first().map(|n| n.trim_start_matches('/').to_string()).unwrap_or_default()
}
