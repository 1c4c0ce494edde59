//! Task containers (see [`crate::tasks`]): one per run, named
//! `cloudweb-task-<run id>`, labelled with this node, the role `task`, the
//! run, its app and its time limit (so an agent restarted mid-run can wait
//! for it with the time it has left), on the network an app instance gets
//! but publishing no port, with no restart policy and not auto-removed: its
//! exit code and output stay until the agent has reported them.

use std::collections::HashMap;

use bollard::models::{ContainerCreateBody, HostConfig, RestartPolicy, RestartPolicyNameEnum};
use bollard::query_parameters::{CreateContainerOptionsBuilder, InspectContainerOptions, ListContainersOptionsBuilder, WaitContainerOptionsBuilder};
use futures_util::StreamExt;

use super::containers::LABEL_ROLE;
use super::{DockerRuntime, RuntimeError, LABEL_APP, LABEL_NODE};

/// `cloudweb.role` of task containers.
pub const ROLE_TASK: &str = "task";
/// The run a task container belongs to.
pub const LABEL_TASK: &str = "cloudweb.task";
/// The run's `timeout_seconds`.
pub const LABEL_TASK_TIMEOUT: &str = "cloudweb.task-timeout";

/// A task container to create.
#[derive(Clone)]
pub struct TaskSpec {
    pub run_id: String,
    pub app: String,
    pub image: String,
    /// `NAME=value`; never logged.
    pub env: Vec<String>,
    /// The container's command (after the image's entrypoint), no shell.
    pub command: Vec<String>,
    pub timeout_seconds: u32,
    pub nano_cpus: Option<i64>,
    pub memory_bytes: Option<i64>,
}

impl std::fmt::Debug for TaskSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TaskSpec").field("run_id", &self.run_id).field("app", &self.app).field("image", &self.image).finish_non_exhaustive()
    }
}

/// What the Engine says about a run's container.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TaskContainer {
    pub id: String,
    /// Labelled as this node's container of this very run.
    pub ours: bool,
    pub app: Option<String>,
    /// Docker's word: `created`, `running`, `exited`, ...
    pub status: String,
    pub running: bool,
    pub exit_code: Option<i64>,
    pub oom_killed: bool,
    /// Why it could not start, when it could not.
    pub error: Option<String>,
    /// RFC 3339; `None` while it never started.
    pub started_at: Option<String>,
    /// From [`LABEL_TASK_TIMEOUT`].
    pub timeout_seconds: Option<u32>,
}

impl DockerRuntime {
    /// The container of run `run_id`, if there is one (ours or not).
    pub async fn task_container(&self, run_id: &str) -> Result<Option<TaskContainer>, RuntimeError> {
        self.inspect_task(&cloudweb_protocol::tasks::container_name(run_id), run_id).await
    }

    /// A task container by name or id; `run_id` is the run it should be.
    pub async fn inspect_task(&self, container: &str, run_id: &str) -> Result<Option<TaskContainer>, RuntimeError> {
        let inspect = match self.docker()?.inspect_container(container, None::<InspectContainerOptions>).await {
            Ok(inspect) => inspect,
            Err(bollard::errors::Error::DockerResponseServerError { status_code: 404, .. }) => return Ok(None),
            Err(err) => return Err(err.into()),
        };
        let labels = inspect.config.as_ref().and_then(|c| c.labels.clone()).unwrap_or_default();
        let ours = labels.get(LABEL_NODE) == Some(&self.node_id)
            && labels.get(LABEL_ROLE).map(String::as_str) == Some(ROLE_TASK)
            && labels.get(LABEL_TASK).map(String::as_str) == Some(run_id);
        let state = inspect.state.unwrap_or_default();
        Ok(Some(TaskContainer {
            id: inspect.id.unwrap_or_default(),
            ours,
            app: labels.get(LABEL_APP).cloned(),
            status: state.status.map(|s| s.to_string()).unwrap_or_default(),
            running: state.running.unwrap_or(false),
            exit_code: state.exit_code,
            oom_killed: state.oom_killed.unwrap_or(false),
            error: state.error.filter(|e| !e.is_empty()),
            // Docker's zero time says "never".
            started_at: state.started_at.filter(|at| !at.is_empty() && !at.starts_with("0001-")),
            timeout_seconds: labels.get(LABEL_TASK_TIMEOUT).and_then(|t| t.parse().ok()),
        }))
    }

    /// Creates (does not start) the run's container; its id.
    pub async fn create_task(&self, spec: &TaskSpec) -> Result<String, RuntimeError> {
        let labels = HashMap::from([
            (LABEL_NODE.to_string(), self.node_id.clone()),
            (LABEL_ROLE.to_string(), ROLE_TASK.to_string()),
            (LABEL_TASK.to_string(), spec.run_id.clone()),
            (LABEL_APP.to_string(), spec.app.clone()),
            (LABEL_TASK_TIMEOUT.to_string(), spec.timeout_seconds.to_string()),
        ]);
        let body = ContainerCreateBody {
            image: Some(spec.image.clone()),
            env: Some(spec.env.clone()),
            // An argument vector: Docker runs it as it is, no shell.
            cmd: Some(spec.command.clone()),
            labels: Some(labels),
            host_config: Some(HostConfig {
                // Docker's default network, as app instances have (so the
                // linked services' addresses in its variables work), and
                // no published port.
                restart_policy: Some(RestartPolicy { name: Some(RestartPolicyNameEnum::NO), maximum_retry_count: None }),
                auto_remove: Some(false),
                nano_cpus: spec.nano_cpus,
                memory: spec.memory_bytes,
                ..Default::default()
            }),
            ..Default::default()
        };
        let name = cloudweb_protocol::tasks::container_name(&spec.run_id);
        self.changed();
        let created = self.docker()?.create_container(Some(CreateContainerOptionsBuilder::new().name(&name).build()), body).await?;
        Ok(created.id)
    }

    /// Starts a created task container; one that runs already is fine.
    pub async fn start_task(&self, id: &str) -> Result<(), RuntimeError> {
        let started = self.docker()?.start_container(id, None::<bollard::query_parameters::StartContainerOptions>).await;
        self.changed();
        match started {
            Ok(()) | Err(bollard::errors::Error::DockerResponseServerError { status_code: 304, .. }) => Ok(()),
            Err(err) => Err(err.into()),
        }
    }

    /// Waits until the container is no longer running; its exit code.
    pub async fn wait_task(&self, id: &str) -> Result<i64, RuntimeError> {
        let docker = self.docker()?;
        let mut wait = docker.wait_container(id, Some(WaitContainerOptionsBuilder::new().condition("not-running").build()));
        let mut code = None;
        while let Some(item) = wait.next().await {
            match item {
                Ok(response) => code = Some(response.status_code),
                // A non-zero exit arrives as an error carrying the code.
                Err(bollard::errors::Error::DockerContainerWaitError { code: exit, .. }) => code = Some(exit),
                Err(err) => return Err(err.into()),
            }
        }
        code.ok_or_else(|| RuntimeError::Failed("the Docker Engine ended the wait without an exit code".into()))
    }

    /// This node's task containers, running or not, as (id, run id).
    pub async fn task_containers(&self) -> Result<Vec<(String, String)>, RuntimeError> {
        let labels = vec![format!("{LABEL_NODE}={}", self.node_id), format!("{LABEL_ROLE}={ROLE_TASK}")];
        let filters = HashMap::from([("label", labels)]);
        let containers = self.docker()?.list_containers(Some(ListContainersOptionsBuilder::new().all(true).filters(&filters).build())).await?;
        Ok(containers
            .into_iter()
            .filter_map(|c| {
                let run = c.labels.as_ref().and_then(|l| l.get(LABEL_TASK).cloned())?;
                Some((c.id?, run))
            })
            .collect())
    }
}

/// The Engine's own words of an error (its message without bollard's
/// "Docker responded with status code …" around it).
pub fn engine_message(err: &RuntimeError) -> String {
    match err {
        RuntimeError::Engine(bollard::errors::Error::DockerResponseServerError { message, .. }) => message.trim().to_string(),
        other => other.to_string(),
    }
}

impl RuntimeError {
    /// The Engine did not answer, or its connection broke (an answer of
    /// the Engine's is none): worth another try later.
    pub fn is_transient(&self) -> bool {
        use bollard::errors::Error;
        match self {
            RuntimeError::Unavailable(_) => true,
            RuntimeError::Engine(err) => matches!(
                err,
                Error::RequestTimeoutError | Error::IOError { .. } | Error::HyperResponseError { .. } | Error::HyperLegacyError { .. } | Error::SocketNotFoundError(_)
            ),
            RuntimeError::Failed(_) => false,
        }
    }

    /// The Engine's answer to a create whose name is taken.
    pub fn is_conflict(&self) -> bool {
        matches!(self, RuntimeError::Engine(bollard::errors::Error::DockerResponseServerError { status_code: 409, .. }))
    }

    /// The Engine's answer about a container it does not have.
    pub fn is_not_found(&self) -> bool {
        matches!(self, RuntimeError::Engine(bollard::errors::Error::DockerResponseServerError { status_code: 404, .. }))
    }
}
