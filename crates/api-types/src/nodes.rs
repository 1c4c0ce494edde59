//! Nodes: `/api/nodes`, `/api/nodes/{id}` and its commands, drain and
//! undrain, and `POST /api/join-tokens`.

use cloudweb_protocol::{Health, Metrics};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// What a node's heartbeat says it has.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Capacity {
    pub cpu_cores: u32,
    pub mem_bytes: u64,
    pub disk_bytes: u64,
}

/// The latest usage sample a node sent, and when it came.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct MetricsView {
    pub at: String,
    pub sample: Metrics,
}

/// An app that could not be moved off a node, with the scheduler's reason.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Waiting {
    pub app: String,
    pub reason: String,
}

/// A node's client certificate.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct NodeCertificate {
    pub sha256: String,
    pub not_after: Option<String>,
    /// When the node last switched to a renewed one.
    pub renewed_at: Option<String>,
}

/// A node as the API shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct NodeView {
    pub id: String,
    pub name: String,
    pub hostname: String,
    /// `ready`, `draining` or `unreachable`.
    pub state: String,
    /// May receive new instances.
    pub eligible: bool,
    pub ingress: bool,
    pub mesh_address: String,
    /// `host:port` other nodes reach its WireGuard at (none behind NAT).
    pub mesh_endpoint: Option<String>,
    pub version: Option<String>,
    pub protocol: Option<i64>,
    pub joined_at: String,
    pub last_heartbeat: Option<String>,
    pub capacity: Option<Capacity>,
    /// `healthy`, `degraded` or `unknown`.
    pub health: String,
    pub health_reason: Option<String>,
    pub health_report: Option<Health>,
    pub features: Vec<String>,
    pub metrics: Option<MetricsView>,
    /// Apps that could not be moved off this node (draining or
    /// unreachable), with the scheduler's reason.
    pub waiting: Vec<Waiting>,
    /// The node's client certificate: its fingerprint, when it ends, and
    /// when the node last switched to a renewed one.
    pub certificate: NodeCertificate,
}

/// `GET /api/nodes`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct NodeList {
    pub nodes: Vec<NodeView>,
}

/// `POST /api/nodes/{id}/commands`: only `stop` may be queued by hand.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[schema(example = json!({"type": "stop", "payload": {"deployment_id": "d-01hx", "reason": "by hand"}}))]
pub struct CommandRequest {
    /// `stop`.
    #[serde(rename = "type")]
    pub kind: String,
    /// For `stop`: `{"deployment_id", "instance"?, "reason"?}`.
    pub payload: serde_json::Value,
}

/// A command queued for a node, as `GET /api/nodes/{id}/commands` lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct NodeCommand {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub created_at: String,
    pub acked_at: Option<String>,
    pub ack_count: i64,
}

/// `GET /api/nodes/{id}/commands`: the latest 100.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct NodeCommandList {
    pub commands: Vec<NodeCommand>,
}

/// `POST /api/join-tokens`: a single-use token and the command that uses it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct JoinToken {
    pub token: String,
    pub expires_at: String,
    /// The cluster CA's fingerprint, which the agent pins.
    pub ca_sha256: String,
    /// The shell command that joins a machine.
    pub command: String,
}
