//! What the liveness supervisor needs of Docker: this node's app
//! containers that carry a liveness probe (a label set at creation), the
//! host port each is published on, whether it passed its health check
//! (its restart policy is no longer `no`), and a restart.

use std::collections::HashMap;

use bollard::query_parameters::{InspectContainerOptions, ListContainersOptionsBuilder, RestartContainerOptionsBuilder};
use cloudweb_protocol::Liveness;

use super::{DockerRuntime, RuntimeError, LABEL_APP, LABEL_DEPLOYMENT, LABEL_INSTANCE, LABEL_NODE};

/// The probe's settings, as JSON.
pub const LABEL_LIVENESS: &str = "cloudweb.liveness";
/// The HTTP path it probes (the app's health path).
pub const LABEL_LIVENESS_PATH: &str = "cloudweb.liveness-path";

/// A running app container with a liveness probe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Probed {
    pub id: String,
    pub name: String,
    pub app: String,
    pub deployment: String,
    pub instance: u32,
    pub liveness: Liveness,
    pub path: String,
    /// The host port its app port is published on.
    pub host_port: Option<u16>,
}

/// Seconds a restart waits for the container to stop before it kills it.
const RESTART_GRACE_SECONDS: i32 = 10;

impl DockerRuntime {
    /// This node's running app containers that carry a liveness probe (a
    /// label that does not parse is left out: it was not written by us).
    pub async fn probed_containers(&self) -> Result<Vec<Probed>, RuntimeError> {
        let labels = vec![format!("{LABEL_NODE}={}", self.node_id), LABEL_LIVENESS.to_string()];
        let filters = HashMap::from([("label", labels), ("status", vec!["running".to_string()])]);
        let containers = self.docker()?.list_containers(Some(ListContainersOptionsBuilder::new().filters(&filters).build())).await?;
        Ok(containers
            .into_iter()
            .filter_map(|c| {
                let labels = c.labels.unwrap_or_default();
                let liveness: Liveness = serde_json::from_str(labels.get(LABEL_LIVENESS)?).ok()?;
                liveness.validate().ok()?;
                Some(Probed {
                    id: c.id?,
                    name: c.names.unwrap_or_default().first().map(|n| n.trim_start_matches('/').to_string()).unwrap_or_default(),
                    app: labels.get(LABEL_APP).cloned().unwrap_or_default(),
                    deployment: labels.get(LABEL_DEPLOYMENT).cloned().unwrap_or_default(),
                    instance: labels.get(LABEL_INSTANCE).and_then(|n| n.parse().ok()).unwrap_or(0),
                    liveness,
                    path: labels.get(LABEL_LIVENESS_PATH).cloned().filter(|p| p.starts_with('/')).unwrap_or_else(|| "/".to_string()),
                    host_port: c.ports.unwrap_or_default().into_iter().find_map(|p| p.public_port),
                })
            })
            .collect())
    }

    /// Whether the container passed its health check: the deploy gives it
    /// the `unless-stopped` restart policy then (see `keep_running`).
    pub async fn passed_health_check(&self, id: &str) -> Result<bool, RuntimeError> {
        let inspect = self.docker()?.inspect_container(id, None::<InspectContainerOptions>).await?;
        let policy = inspect.host_config.and_then(|h| h.restart_policy).and_then(|p| p.name);
        Ok(policy.is_some_and(|name| name != bollard::models::RestartPolicyNameEnum::NO && name != bollard::models::RestartPolicyNameEnum::EMPTY))
    }

    /// Restarts a container (stop with a grace period, then start).
    pub async fn restart(&self, id: &str) -> Result<(), RuntimeError> {
        self.docker()?.restart_container(id, Some(RestartContainerOptionsBuilder::new().t(RESTART_GRACE_SECONDS).build())).await?;
        self.changed();
        Ok(())
    }
}
