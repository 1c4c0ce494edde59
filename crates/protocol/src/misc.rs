//! The smaller bodies: errors, leave, deployment reports, the ingress route
//! table and the registry settings.

use serde::{Deserialize, Serialize};

use crate::validate::{self, ValidationError};

/// Every non-2xx answer of the agent listener except 426 carries this body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub error: String,
    /// A machine-readable reason, for the answers an agent acts on (see
    /// [`error_codes`]); absent on the others.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
}

/// Values of [`ErrorBody::code`].
pub mod error_codes {
    /// 403: the client certificate is the cluster CA's, but its node is not
    /// registered (an administrator removed it, or it left). An agent that
    /// gets this stops for good instead of retrying.
    pub const NODE_NOT_REGISTERED: &str = "node_not_registered";
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaveResponse {
    pub node_id: String,
    /// Deployments marked failed because the node left with `force=1`.
    pub failed_deployments: Vec<String>,
}

/// Body of a 409 from `POST /agent/v1/leave` without `force=1`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaveConflict {
    pub error: String,
    pub apps: Vec<String>,
}

/// Most log lines in one report.
pub const MAX_REPORT_LINES: usize = 1000;

/// `POST /agent/v1/report`: a deployment's progress and log lines.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Report {
    pub deployment_id: String,
    /// New state reached by the deployment on this node, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Which instance the state is about (1-based).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance: Option<u32>,
    /// `host:port` where the instance answers, once it runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    #[serde(default)]
    pub logs: Vec<LogLine>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogLine {
    /// RFC 3339, UTC.
    pub ts: String,
    /// `build`, `stdout`, `stderr` or `agent`.
    pub stream: String,
    pub line: String,
}

impl Report {
    pub fn validate(&self) -> Result<(), ValidationError> {
        validate::token("deployment_id", &self.deployment_id, 64)?;
        if let Some(state) = &self.state {
            validate::token("state", state, 32)?;
        }
        if let Some(message) = &self.message {
            validate::bounded_text("message", message, 4096)?;
        }
        if let Some(image) = &self.image {
            validate::bounded_text("image", image, 512)?;
        }
        if let Some(instance) = self.instance {
            if instance == 0 || instance > 100 {
                return Err(ValidationError::new("instance", "must be 1 to 100"));
            }
        }
        if let Some(address) = &self.address {
            validate::endpoint("address", address)?;
        }
        if self.logs.len() > MAX_REPORT_LINES {
            return Err(ValidationError::new("logs", "more than 1000 lines"));
        }
        for line in &self.logs {
            validate::bounded_text("logs.ts", &line.ts, 64)?;
            validate::token("logs.stream", &line.stream, 16)?;
            if line.line.len() > 16 * 1024 {
                return Err(ValidationError::new("logs.line", "longer than 16 KiB"));
            }
        }
        Ok(())
    }
}

/// `GET /agent/v1/routes`: what every ingress node should serve.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RouteTable {
    /// Grows on every change; an agent reloads its proxy only when it moves.
    pub version: u64,
    pub routes: Vec<Route>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Route {
    pub host: String,
    /// `address:port` of healthy instances.
    pub upstreams: Vec<String>,
}

/// `GET /agent/v1/registry`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegistryConfig {
    pub configured: bool,
    /// `host:port` to push to and pull from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    /// CA certificate (PEM) the registry's TLS certificate chains to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password: Option<String>,
}
