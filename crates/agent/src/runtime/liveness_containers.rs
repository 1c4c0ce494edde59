//! What the probe supervisor needs of Docker: this node's running app
//! instance containers with the host port each is published on and the
//! liveness and readiness probes some carry (labels set at creation), whether one passed
//! its health check (its restart policy is no longer `no`), and a
//! restart.

use std::collections::HashMap;

use bollard::query_parameters::{InspectContainerOptions, ListContainersOptionsBuilder, RestartContainerOptionsBuilder};
use cloudweb_protocol::{Liveness, Readiness};

use super::{DockerRuntime, RuntimeError, LABEL_APP, LABEL_DEPLOYMENT, LABEL_INSTANCE, LABEL_NODE};

/// The probe's settings, as JSON.
pub const LABEL_LIVENESS: &str = "cloudweb.liveness";
/// The HTTP path the probes ask (the app's health path).
pub const LABEL_LIVENESS_PATH: &str = "cloudweb.liveness-path";
/// The readiness probe's settings, as JSON.
pub const LABEL_READINESS: &str = "cloudweb.readiness";

/// A running app instance container, with its liveness probe if it has
/// one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Probed {
    pub id: String,
    pub name: String,
    pub app: String,
    pub deployment: String,
    pub instance: u32,
    pub liveness: Option<Liveness>,
    pub readiness: Option<Readiness>,
    pub path: String,
    /// The host port its app port is published on.
    pub host_port: Option<u16>,
    /// Running now (not stopped, nor between restarts).
    pub running: bool,
    /// Its addresses on its networks (where a TCP probe connects).
    pub addresses: Vec<std::net::IpAddr>,
}

/// Seconds a restart waits for the container to stop before it kills it.
const RESTART_GRACE_SECONDS: i32 = 10;

impl DockerRuntime {
    /// This node's app instance containers, running or not (a probe label
    /// that does not parse counts as none: it was not written by us).
    pub async fn instance_containers(&self) -> Result<Vec<Probed>, RuntimeError> {
        let labels = vec![format!("{LABEL_NODE}={}", self.node_id), LABEL_DEPLOYMENT.to_string(), LABEL_INSTANCE.to_string()];
        // Stopped ones too: one Docker is restarting is between its runs,
        // and its watch (with the port last reported) must outlive that.
        let filters = HashMap::from([("label", labels)]);
        let containers = self.docker()?.list_containers(Some(ListContainersOptionsBuilder::new().all(true).filters(&filters).build())).await?;
        Ok(containers
            .into_iter()
            .filter_map(|c| {
                let labels = c.labels.unwrap_or_default();
                let liveness = labels.get(LABEL_LIVENESS).and_then(|l| serde_json::from_str::<Liveness>(l).ok()).filter(|l| l.validate().is_ok());
                let readiness = labels.get(LABEL_READINESS).and_then(|r| serde_json::from_str::<Readiness>(r).ok()).filter(|r| r.validate().is_ok());
                Some(Probed {
                    id: c.id?,
                    name: c.names.unwrap_or_default().first().map(|n| n.trim_start_matches('/').to_string()).unwrap_or_default(),
                    app: labels.get(LABEL_APP).cloned().unwrap_or_default(),
                    deployment: labels.get(LABEL_DEPLOYMENT).cloned().unwrap_or_default(),
                    instance: labels.get(LABEL_INSTANCE).and_then(|n| n.parse().ok())?,
                    liveness,
                    readiness,
                    path: labels.get(LABEL_LIVENESS_PATH).cloned().filter(|p| p.starts_with('/')).unwrap_or_else(|| "/".to_string()),
                    host_port: c.ports.unwrap_or_default().into_iter().find_map(|p| p.public_port),
                    running: c.state == Some(bollard::models::ContainerSummaryStateEnum::RUNNING),
                    addresses: c
                        .network_settings
                        .and_then(|n| n.networks)
                        .map(|networks| {
                            networks
                                .into_values()
                                .filter_map(|n| {
                                    n.ip_address.filter(|ip| !ip.is_empty())?.parse().ok()
                                })
                                .collect()
                        })
                        .unwrap_or_default(),
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
