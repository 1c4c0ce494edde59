//! The control plane's replicas: `GET /api/control-planes`.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// One `cloudweb-server` replica.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ControlPlaneView {
    /// Its public URL (`--public-url`).
    pub url: String,
    /// Whether it leads: it runs the reconciler, the scheduler, ACME, the
    /// backups and serves the agents.
    pub leader: bool,
    /// `live` (renewed or tried for the lease within the lease's length),
    /// or `unreachable` (not heard from since; it may be stopped, frozen
    /// or cut off from the database).
    pub state: String,
    /// When it was last heard from, in the database's clock (RFC 3339).
    pub last_seen: String,
    /// Whether this is the replica that answered.
    pub this_replica: bool,
}

/// `GET /api/control-planes`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[schema(example = json!({"database": "postgres", "term": 7, "lease_seconds": 10, "replicas": [
    {"url": "https://cp1.example.com:8443", "leader": true, "state": "live", "last_seen": "2026-12-04T19:00:00.000Z", "this_replica": true},
    {"url": "https://cp2.example.com:8443", "leader": false, "state": "live", "last_seen": "2026-12-04T18:59:58.500Z", "this_replica": false}
]}))]
pub struct ControlPlaneList {
    /// `sqlite` (one control plane, which always leads) or `postgres`.
    pub database: String,
    /// The fencing token of the latest leader's term (PostgreSQL only).
    pub term: Option<i64>,
    /// The leader's lease, in seconds.
    pub lease_seconds: u64,
    /// Every replica heard from within the last hour, the leader first.
    pub replicas: Vec<ControlPlaneView>,
}
