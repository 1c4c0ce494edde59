//! Persistent volumes: `GET /api/volumes`, `GET|POST /api/apps/{name}/volumes`,
//! `DELETE /api/apps/{name}/volumes/{volume}` (detach) and
//! `DELETE /api/volumes/{name}` (delete the data).

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// `POST /api/apps/{name}/volumes`: mount a volume in the app, creating it
/// when the name is new or attaching a detached one with its data.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"name": "uploads", "path": "/app/uploads"}))]
pub struct AttachVolume {
    /// 1 to 63 lowercase letters, digits or '-'; unique in the cluster.
    pub name: String,
    /// Absolute path inside the app's containers.
    pub path: String,
}

/// A volume as the API shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct VolumeView {
    pub name: String,
    /// `attached`, `service` (a managed service's data) or `detached` (its
    /// app was deleted with the volumes kept, or it was detached; the data
    /// stays until it is deleted by name).
    pub state: String,
    /// The managed service whose data it holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<String>,
    /// The app that mounts it, `null` while detached.
    pub app: Option<String>,
    /// Where the app mounts it, `null` while detached.
    pub path: Option<String>,
    /// The node that holds the data: `null` until the app's first
    /// placement after the volume was created.
    pub node_id: Option<String>,
    pub node_name: Option<String>,
    /// Size of the data as the node last reported it.
    pub size_bytes: Option<i64>,
    pub size_at: Option<String>,
    pub created_at: String,
    /// Set while the disk of the node holding it is 80 % full or more.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warning: Option<String>,
}

/// `GET /api/volumes`, `GET /api/apps/{name}/volumes`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct VolumeList {
    pub volumes: Vec<VolumeView>,
}

/// `DELETE /api/apps/{name}`'s query: what becomes of the app's volumes.
/// An app with volumes is deleted only when this says.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum VolumesOnDelete {
    /// Refuse (409, naming the volumes) when the app has any: the default.
    #[default]
    Refuse,
    /// Detach them: they stay, with their data, listed as detached.
    Keep,
    /// Delete them and their data with the app.
    Delete,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DeleteAppQuery {
    /// `keep` or `delete`; required when the app has volumes.
    #[serde(default)]
    pub volumes: VolumesOnDelete,
}

/// `POST /api/volumes/{name}/move`: copy the volume's data to another node
/// over the mesh and switch its app there.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"to": "node-b"}))]
pub struct MoveVolume {
    /// The target node's name or id; when absent, the ready node (not
    /// draining, running the mesh) with the most free disk.
    #[serde(default)]
    pub to: Option<String>,
}

/// A volume move as the API shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct VolumeMoveView {
    pub id: String,
    pub volume: String,
    pub from_node_id: String,
    pub from_node_name: Option<String>,
    pub to_node_id: String,
    pub to_node_name: Option<String>,
    /// `copying` (the volume is still on its old node), `switched` (it is
    /// on the new node; its app is starting there), `done` or `failed`.
    pub state: String,
    /// Why it failed, or, when done, why the app did not start on the new
    /// node.
    pub reason: Option<String>,
    /// Files in the copy, checked one by one (SHA-256).
    pub files: Option<i64>,
    /// Bytes sent over both passes.
    pub bytes: Option<i64>,
    /// Digest of the whole tree, the same on both nodes.
    pub digest: Option<String>,
    /// When the volume's containers stopped for the last pass.
    pub stopped_at: Option<String>,
    pub switched_at: Option<String>,
    pub finished_at: Option<String>,
    /// The deployment that runs the app on the new node.
    pub deployment_id: Option<String>,
    /// From the containers' stop on the old node to the app running on
    /// the new one.
    pub downtime_ms: Option<i64>,
    /// The data left on the old node: `in-use` (still the volume),
    /// `kept` (set aside until `keep_until`, or until the move is
    /// confirmed), `purging`, `purged`.
    pub source_copy: String,
    pub keep_until: Option<String>,
    pub created_at: String,
}

/// `GET /api/volumes/{name}/moves`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct VolumeMoveList {
    pub moves: Vec<VolumeMoveView>,
}
