//! `POST /agent/v1/heartbeat`: the node's capacity at the top level, plus the
//! optional `health` and `metrics` blocks. Both blocks are additive: an agent
//! that omits them is still a valid, eligible node.

use serde::{Deserialize, Serialize};

use crate::validate::{self, ValidationError};

/// The answer to a heartbeat.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct HeartbeatAnswer {
    pub node_id: String,
    pub state: String,
    /// The public URLs of the cluster's control-plane replicas, the
    /// leader's first, when there are several (PostgreSQL): where the
    /// agent goes when the one it talks to cannot be reached. Absent from
    /// single control planes and older servers.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub control_planes: Vec<String>,
}

/// Most control-plane URLs an agent keeps from a heartbeat answer.
pub const MAX_CONTROL_PLANES: usize = 16;

/// Most containers one usage sample may carry.
pub const MAX_CONTAINERS: usize = 100;
/// Most hosts one traffic sample may carry.
pub const MAX_TRAFFIC_HOSTS: usize = 200;
/// Most feature names in `health.features`.
pub const MAX_FEATURES: usize = 32;

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema))]
pub struct Heartbeat {
    pub cpu_cores: u32,
    pub mem_bytes: u64,
    pub disk_bytes: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health: Option<Health>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics: Option<Metrics>,
    /// Sent by nodes that run the ingress.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ingress: Option<IngressStatus>,
    /// `host:port` other nodes reach this node's WireGuard at now, when the
    /// agent knows it (`run --mesh-endpoint` or `--mesh-endpoint-interface`).
    /// The control plane updates the node's peer entry when it changes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mesh_endpoint: Option<String>,
}

/// What the ingress of a node serves.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema))]
pub struct IngressStatus {
    /// Version of the route table the proxy serves now.
    pub routes_version: u64,
    /// Why the newest table could not be applied, if it could not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema))]
pub struct Health {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub registry: Option<RegistryHealth>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mesh: Option<MeshHealth>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub features: Option<Vec<String>>,
    /// The managed services this node runs and how each is doing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub services: Option<Vec<crate::services::ServiceStatus>>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema))]
pub struct RegistryHealth {
    pub configured: bool,
    pub reachable: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema))]
pub struct MeshHealth {
    pub peers: u32,
    pub connected: u32,
}

/// A usage sample. Fields that could not be measured are absent, never zero.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema))]
pub struct Metrics {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<NodeUsage>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub containers: Option<Vec<ContainerUsage>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub omitted: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traffic: Option<Vec<HostTraffic>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traffic_omitted: Option<u32>,
    /// The size of each volume's data on the node (at most
    /// [`MAX_VOLUMES`]); absent when the node holds none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volumes: Option<Vec<VolumeUsage>>,
}

/// Most volumes one usage sample lists.
pub const MAX_VOLUMES: usize = 1000;

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema))]
pub struct VolumeUsage {
    pub volume: String,
    /// Bytes of the files under the volume's directory.
    pub bytes: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema))]
pub struct NodeUsage {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_pct: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mem_used: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_used: Option<u64>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema))]
pub struct ContainerUsage {
    pub container: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_cores: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mem_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mem_limit: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restarts: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<String>,
}

/// Per-host HTTP counts for one sample interval (deltas, not totals).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema))]
pub struct HostTraffic {
    pub host: String,
    pub requests: u64,
    pub r2xx: u64,
    pub r3xx: u64,
    pub r4xx: u64,
    pub r5xx: u64,
    pub dur_sum_ms: f64,
    pub slow: u64,
}

impl Heartbeat {
    /// Checks bounds a well-behaved agent never exceeds.
    pub fn validate(&self) -> Result<(), ValidationError> {
        self.validate_health()?;
        self.validate_metrics()?;
        self.validate_ingress()
    }

    /// Checks the `health` block alone; the server drops a bad one and keeps
    /// the rest of the heartbeat.
    pub fn validate_health(&self) -> Result<(), ValidationError> {
        if let Some(health) = &self.health {
            if let Some(registry) = &health.registry {
                if let Some(error) = &registry.error {
                    validate::bounded_text("health.registry.error", error, 512)?;
                }
            }
            if let Some(mesh) = &health.mesh {
                if mesh.connected > mesh.peers {
                    return Err(ValidationError::new("health.mesh", "connected exceeds peers"));
                }
            }
            if let Some(features) = &health.features {
                if features.len() > MAX_FEATURES {
                    return Err(ValidationError::new("health.features", "too many entries"));
                }
                for feature in features {
                    validate::token("health.features", feature, 64)?;
                }
            }
            if let Some(services) = &health.services {
                if services.len() > crate::services::MAX_STATUSES {
                    return Err(ValidationError::new("health.services", "too many entries"));
                }
                for service in services {
                    service.validate()?;
                }
            }
        }
        Ok(())
    }

    /// Checks the `ingress` block alone.
    /// Checks `mesh_endpoint` alone.
    pub fn validate_mesh_endpoint(&self) -> Result<(), ValidationError> {
        match &self.mesh_endpoint {
            Some(endpoint) => validate::endpoint("mesh_endpoint", endpoint),
            None => Ok(()),
        }
    }

    pub fn validate_ingress(&self) -> Result<(), ValidationError> {
        if let Some(error) = self.ingress.as_ref().and_then(|i| i.error.as_ref()) {
            validate::bounded_text("ingress.error", error, 1024)?;
        }
        Ok(())
    }

    /// Checks the `metrics` block alone.
    pub fn validate_metrics(&self) -> Result<(), ValidationError> {
        match &self.metrics {
            Some(metrics) => metrics.validate(),
            None => Ok(()),
        }
    }
}

impl Metrics {
    fn validate(&self) -> Result<(), ValidationError> {
        if let Some(node) = &self.node {
            if let Some(pct) = node.cpu_pct {
                if !(0.0..=100.0).contains(&pct) {
                    return Err(ValidationError::new("metrics.node.cpu_pct", "must be between 0 and 100"));
                }
            }
        }
        if let Some(containers) = &self.containers {
            if containers.len() > MAX_CONTAINERS {
                return Err(ValidationError::new("metrics.containers", "more than 100 entries"));
            }
            for c in containers {
                validate::token("metrics.containers.container", &c.container, 128)?;
                if let Some(cpu) = c.cpu_cores {
                    if !cpu.is_finite() || cpu < 0.0 {
                        return Err(ValidationError::new("metrics.containers.cpu_cores", "must be a non-negative number"));
                    }
                }
                if let Some(started) = &c.started_at {
                    validate::bounded_text("metrics.containers.started_at", started, 64)?;
                }
            }
        }
        if let Some(volumes) = &self.volumes {
            if volumes.len() > MAX_VOLUMES {
                return Err(ValidationError::new("metrics.volumes", "more than 1000 entries"));
            }
            for v in volumes {
                crate::volumes::name(&v.volume)?;
            }
        }
        if let Some(traffic) = &self.traffic {
            if traffic.len() > MAX_TRAFFIC_HOSTS {
                return Err(ValidationError::new("metrics.traffic", "more than 200 entries"));
            }
            for t in traffic {
                validate::hostname("metrics.traffic.host", &t.host)?;
                if !t.dur_sum_ms.is_finite() || t.dur_sum_ms < 0.0 {
                    return Err(ValidationError::new("metrics.traffic.dur_sum_ms", "must be a non-negative number"));
                }
                let classes = t.r2xx.checked_add(t.r3xx).and_then(|s| s.checked_add(t.r4xx)).and_then(|s| s.checked_add(t.r5xx));
                if classes.is_none_or(|sum| sum > t.requests) || t.slow > t.requests {
                    return Err(ValidationError::new("metrics.traffic", "class counts exceed requests"));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seed_examples_parse() {
        let with_health: Heartbeat = serde_json::from_str(
            r#"{"cpu_cores": 8, "mem_bytes": 0, "disk_bytes": 0,
                "health": {"registry": {"configured": true, "reachable": false, "error": "i/o timeout"},
                           "mesh": {"peers": 1, "connected": 0}, "features": ["static-sites"]}}"#,
        )
        .unwrap();
        assert_eq!(with_health.health.as_ref().unwrap().registry.as_ref().unwrap().error.as_deref(), Some("i/o timeout"));
        with_health.validate().unwrap();

        let with_metrics: Heartbeat = serde_json::from_str(
            r#"{"cpu_cores": 8, "mem_bytes": 0, "disk_bytes": 0,
                "metrics": {"node": {"cpu_pct": 12.5, "mem_used": 8589934592, "disk_used": 128849018880},
                "containers": [{"container": "cw-web-3", "cpu_cores": 0.25, "mem_bytes": 104857600, "mem_limit": 536870912}],
                "omitted": 0,
                "traffic": [{"host": "web.example.com", "requests": 120, "r2xx": 110, "r3xx": 4, "r4xx": 5, "r5xx": 1, "dur_sum_ms": 5400.5, "slow": 2}],
                "traffic_omitted": 0}}"#,
        )
        .unwrap();
        with_metrics.validate().unwrap();
    }

    #[test]
    fn absent_is_not_zero() {
        let sample = Metrics { node: Some(NodeUsage { cpu_pct: None, mem_used: Some(0), disk_used: None }), ..Default::default() };
        let json = serde_json::to_value(&sample).unwrap();
        assert_eq!(json, serde_json::json!({"node": {"mem_used": 0}}));
    }

    #[test]
    fn out_of_range_values_are_rejected() {
        let mut hb = Heartbeat {
            metrics: Some(Metrics { node: Some(NodeUsage { cpu_pct: Some(101.0), ..Default::default() }), ..Default::default() }),
            ..Default::default()
        };
        assert!(hb.validate().is_err());
        hb.metrics = Some(Metrics {
            traffic: Some(vec![HostTraffic { host: "a.test".into(), requests: 1, r2xx: 2, ..Default::default() }]),
            ..Default::default()
        });
        assert!(hb.validate().is_err());
        hb.metrics = None;
        hb.health = Some(Health { mesh: Some(MeshHealth { peers: 1, connected: 2 }), ..Default::default() });
        assert!(hb.validate().is_err());
    }
}
