//! Managed services: `GET|POST /api/services`, `GET|DELETE
//! /api/services/{name}`, `POST /api/services/{name}/links`, `DELETE
//! /api/services/{name}/links/{app}`, `POST
//! /api/services/{name}/rotate-password`, `POST
//! /api/services/{name}/upgrade` and `GET /api/services/{name}/logs`.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

pub use cloudweb_protocol::ServiceKind;

/// `POST /api/services`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"name": "db", "type": "postgres", "version": "16", "memory": 1073741824}))]
pub struct CreateService {
    /// 1 to 63 lowercase letters, digits or '-'.
    pub name: String,
    #[serde(rename = "type")]
    pub kind: ServiceKind,
    /// The image's tag when the cluster runs the official images (digits
    /// and dots); the operator's `--service-image` is used as given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// A node's id or name; the scheduler's choice when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// Memory limit in bytes (64 MiB to 1 TiB); none when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<u64>,
}

/// A service as the API shows it (never its password).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ServiceView {
    pub name: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub version: Option<String>,
    pub image: String,
    pub node_id: String,
    pub node_name: Option<String>,
    /// `pending` until its node reports it, then the node's word:
    /// `starting`, `healthy`, `degraded` (its disk is full), `restarting`,
    /// `unhealthy`, `failed`;
    /// `unknown` while the node is silent.
    pub state: String,
    pub detail: Option<String>,
    /// Where linked apps connect (the node's service address).
    pub address: Option<String>,
    pub restarts: u64,
    /// The volume holding its data.
    pub volume: String,
    pub memory: Option<i64>,
    pub links: Vec<LinkView>,
    pub created_at: String,
    /// Present while a password rotation is unfinished: linked apps get
    /// the old password until the node runs the new one, then they are
    /// redeployed and the old one stops working.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rotation: Option<RotationView>,
    /// The newest major version upgrade from or to this service, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upgrade: Option<MajorUpgradeView>,
}

/// A major version upgrade (PostgreSQL): a fresh backup of `service`,
/// restored into the new service `to_service` of `version`, then the links
/// of `service` moved to it and its apps redeployed. `service` is kept,
/// running, until it is deleted by name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct MajorUpgradeView {
    pub id: String,
    pub service: String,
    pub to_service: String,
    pub from_version: String,
    pub version: String,
    /// `backing_up`, `restoring`, `switching`, then `switched` or `failed`.
    pub state: String,
    /// Why it failed, or what is left to do.
    pub message: Option<String>,
    /// The backup it restores (a job id of `GET /api/backups/{id}`).
    pub backup_job: Option<String>,
    /// The restore into `to_service`.
    pub restore_job: Option<String>,
    pub created_at: String,
    pub finished_at: Option<String>,
}

/// An unfinished password rotation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct RotationView {
    /// When it was asked for (RFC 3339).
    pub since: String,
    /// What it waits for.
    pub detail: String,
}

/// `POST /api/services/{name}/upgrade`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"version": "16.4"}))]
pub struct UpgradeService {
    /// The version to run (digits and dots): the image's tag.
    pub version: String,
    /// For a newer major PostgreSQL version only, which goes through a
    /// backup: the caller has stopped writes to the service (or accepts
    /// that writes made after the backup starts stay in the old service).
    /// Without it such an upgrade is refused (409), saying why.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub writes_stopped: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct LinkView {
    pub app: String,
    /// The variable the app gets.
    pub variable: String,
}

/// `GET /api/services`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ServiceList {
    pub services: Vec<ServiceView>,
}

/// `POST /api/services/{name}/links`: from the app's next deploy on, it
/// gets the service's connection URL in `variable` (`DATABASE_URL` for
/// PostgreSQL and MariaDB, `REDIS_URL` for Redis, when absent).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"app": "web"}))]
pub struct CreateLink {
    pub app: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub variable: Option<String>,
}

/// `DELETE /api/services/{name}`'s query.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DeleteServiceQuery {
    /// `keep` (the default: its volume stays, detached, with the data) or
    /// `delete`.
    #[serde(default)]
    pub data: DataOnDelete,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum DataOnDelete {
    #[default]
    Keep,
    Delete,
}

/// `GET /api/services/{name}/logs`: the recent output of the service's
/// container (its secrets redacted by the node), oldest first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ServiceLogsView {
    pub service: String,
    pub lines: Vec<ServiceLogLine>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ServiceLogLine {
    /// Grows with every line stored.
    pub seq: u64,
    /// The Docker Engine's time of the line (RFC 3339).
    pub ts: String,
    /// `stdout`, `stderr`, or `agent` for a note of the platform's own
    /// (lines lost on the node).
    pub stream: String,
    pub line: String,
    pub node_id: String,
    pub container: String,
}
