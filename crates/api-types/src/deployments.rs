//! Deployments: `/api/deployments/{id}`, `/api/apps/{name}/deployments`
//! and the events of their log stream.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// One instance of a deployment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct InstanceView {
    pub instance: i64,
    /// `null` until the scheduler places it.
    pub node_id: Option<String>,
    pub container: Option<String>,
    /// `pending`, `running`, `failed`, `stopping` or `stopped`.
    pub state: String,
    /// `address:port` on the mesh, once it runs.
    pub address: Option<String>,
}

/// A state a deployment went through, and when.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct TimelineEntry {
    pub state: String,
    /// RFC 3339.
    pub at: String,
}

/// A deployment, its instances and the states it went through.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct DeploymentView {
    pub id: String,
    pub app: String,
    /// `source`, `rollback` or `reschedule`.
    pub kind: String,
    /// `queued`, `building`, `deploying`, `running`, `failed` or `superseded`.
    pub state: String,
    pub commit: Option<String>,
    /// The deployment whose image a rollback runs again.
    pub rollback_of: Option<String>,
    pub image: Option<String>,
    pub error: Option<String>,
    pub created_at: String,
    pub updated_at: String,
    pub instances: Vec<InstanceView>,
    /// Oldest first.
    pub timeline: Vec<TimelineEntry>,
}

/// `GET /api/apps/{name}/deployments`: newest first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct DeploymentList {
    pub deployments: Vec<DeploymentView>,
}

/// The data of a `log` event of `GET /api/deployments/{id}/logs`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct BuildLogLine {
    pub ts: String,
    /// `stdout`, `stderr` or `agent`.
    pub stream: String,
    pub line: String,
}

/// The data of the `end` event of `GET /api/deployments/{id}/logs`: the
/// state the deployment settled in.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct BuildLogEnd {
    pub state: String,
}
