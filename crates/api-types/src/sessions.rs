//! Exec and port-forward sessions (`cloudweb exec`, `cloudweb
//! port-forward`): the record of each. The sessions themselves are
//! WebSockets (`GET /api/apps/{name}/exec`, `…/port-forward`, and the same
//! under `/api/services/{name}`) whose binary messages are
//! `cloudweb_protocol::sessions::SessionFrame`s.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// One session: who opened it into which instance, when, for how long,
/// and how it ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct SessionView {
    pub id: String,
    /// The app it went into (absent for a service's session).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub app: Option<String>,
    /// The managed service it went into (absent for an app's session).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub service: Option<String>,
    /// `exec` or `port-forward`.
    pub kind: String,
    /// The user who opened it (`admin` for the admin token).
    pub user: String,
    pub node_id: String,
    /// An app's session: the deployment and instance it went into.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deployment: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub instance: Option<i64>,
    /// An exec's program (its first argument; the rest is not kept).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub program: Option<String>,
    /// A port-forward's port in the container.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub port: Option<i64>,
    pub tty: bool,
    /// `opening`, `open`, `ended` or `failed`.
    pub state: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i64>,
    /// Why it failed, or how it ended when no process exit said so.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Bytes from the user into the container, and back.
    pub bytes_in: i64,
    pub bytes_out: i64,
    /// RFC 3339.
    pub created_at: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ended_at: Option<String>,
    /// From the node's dial-back to the end (or to now).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<i64>,
}

/// `GET /api/apps/{name}/sessions`, `GET /api/services/{name}/sessions`:
/// the newest first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct SessionList {
    pub sessions: Vec<SessionView>,
}
