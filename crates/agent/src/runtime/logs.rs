//! What the runtime-log follower needs from the Engine: this node's running
//! app containers, their `start` events as they happen, a container's
//! variables (to redact their values) and its output, followed.

use std::collections::{BTreeMap, HashMap};

use bollard::query_parameters::{EventsOptionsBuilder, InspectContainerOptions, LogsOptionsBuilder};
use futures_util::{Stream, StreamExt};

use super::{first_name, DockerRuntime, RuntimeError, LABEL_APP, LABEL_DEPLOYMENT, LABEL_INSTANCE, LABEL_NODE};

/// An app instance container of this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppInstance {
    pub id: String,
    pub name: String,
    pub deployment: String,
    pub instance: u32,
}

pub use super::output_lines::OutputLine;

impl DockerRuntime {
    fn app_labels(&self) -> HashMap<&'static str, Vec<String>> {
        HashMap::from([("label", vec![format!("{LABEL_NODE}={}", self.node_id), LABEL_APP.to_string()])])
    }

    /// This node's running app instances.
    pub async fn running_instances(&self) -> Result<Vec<AppInstance>, RuntimeError> {
        let filters = self.app_labels();
        let options = bollard::query_parameters::ListContainersOptionsBuilder::new().filters(&filters).build();
        let containers = self.docker()?.list_containers(Some(options)).await?;
        Ok(containers
            .into_iter()
            .filter_map(|c| {
                let labels = c.labels.unwrap_or_default();
                Some(AppInstance {
                    id: c.id?,
                    name: first_name(c.names),
                    deployment: labels.get(LABEL_DEPLOYMENT)?.clone(),
                    instance: labels.get(LABEL_INSTANCE)?.parse().ok()?,
                })
            })
            .collect())
    }

    /// `start` events of this node's app containers from now on, as they
    /// happen. The stream ends when the Engine closes the connection.
    pub fn instance_starts(&self) -> Result<impl Stream<Item = Result<AppInstance, RuntimeError>> + Send + 'static, RuntimeError> {
        let mut filters = self.app_labels();
        filters.insert("type", vec!["container".to_string()]);
        filters.insert("event", vec!["start".to_string()]);
        let options = EventsOptionsBuilder::new().filters(&filters).build();
        let docker = self.docker()?;
        Ok(docker.events(Some(options)).filter_map(|event| async move {
            match event {
                Err(err) => Some(Err(RuntimeError::from(err))),
                Ok(event) => {
                    let actor = event.actor?;
                    let attributes = actor.attributes.unwrap_or_default();
                    Some(Ok(AppInstance {
                        id: actor.id?,
                        name: attributes.get("name").cloned().unwrap_or_default(),
                        deployment: attributes.get(LABEL_DEPLOYMENT)?.clone(),
                        instance: attributes.get(LABEL_INSTANCE)?.parse().ok()?,
                    }))
                }
            }
        }))
    }

    /// The variables the agent gave a container (the app's, without
    /// `PORT`): its environment less what its image sets (`PATH`, ...).
    pub async fn app_env(&self, id: &str) -> Result<BTreeMap<String, String>, RuntimeError> {
        let docker = self.docker()?;
        let inspect = docker.inspect_container(id, None::<InspectContainerOptions>).await?;
        let image_env: Vec<String> = match inspect.image.as_deref() {
            Some(image) => docker.inspect_image(image).await.ok().and_then(|i| i.config).and_then(|c| c.env).unwrap_or_default(),
            None => Vec::new(),
        };
        let env = inspect.config.and_then(|c| c.env).unwrap_or_default();
        Ok(env
            .into_iter()
            .filter(|pair| !image_env.contains(pair))
            .filter_map(|pair| pair.split_once('=').map(|(name, value)| (name.to_string(), value.to_string())))
            .filter(|(name, _)| name != "PORT")
            .collect())
    }

    /// A container's output, followed until it stops, from its last
    /// `tail` lines on.
    pub fn follow_output(&self, id: &str, tail: usize) -> Result<impl Stream<Item = Result<OutputLine, RuntimeError>> + Send + 'static, RuntimeError> {
        self.follow(id, &tail.to_string())
    }

    /// A container's output from second `since` (a UNIX time) on,
    /// followed until it stops: a container that just started is read from
    /// its start, so nothing it printed before the follower attached is
    /// missed.
    pub fn follow_output_since(&self, id: &str, since: i32) -> Result<impl Stream<Item = Result<OutputLine, RuntimeError>> + Send + 'static, RuntimeError> {
        let options = LogsOptionsBuilder::new().follow(true).stdout(true).stderr(true).timestamps(true).since(since).tail("all");
        let docker = self.docker()?;
        let stream = docker.logs(id, Some(options.build()));
        Ok(super::output_lines::lines(stream))
    }

    /// A container's whole output from its first line, followed until it
    /// stops: a task's lines are numbered from the first, so none may be
    /// missed between its start and the follow.
    pub fn follow_whole_output(&self, id: &str) -> Result<impl Stream<Item = Result<OutputLine, RuntimeError>> + Send + 'static, RuntimeError> {
        self.follow(id, "all")
    }

    fn follow(&self, id: &str, tail: &str) -> Result<impl Stream<Item = Result<OutputLine, RuntimeError>> + Send + 'static, RuntimeError> {
        let options = LogsOptionsBuilder::new().follow(true).stdout(true).stderr(true).timestamps(true).tail(tail);
        let docker = self.docker()?;
        let stream = docker.logs(id, Some(options.build()));
        Ok(super::output_lines::lines(stream))
    }
}
