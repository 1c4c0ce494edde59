//! What the ingress serves and counts (`/api/routes`, `/api/traffic/{host}`),
//! a node's usage history and an app's runtime logs.

use cloudweb_protocol::{IngressStatus, Route};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// An ingress node and what its proxy serves.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct IngressNode {
    pub node_id: String,
    pub name: String,
    /// From its latest heartbeat; `null` before one came.
    pub status: Option<IngressStatus>,
}

/// `GET /api/routes`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct RouteTableView {
    pub version: u64,
    pub routes: Vec<Route>,
    pub ingress: Vec<IngressNode>,
}

/// A host's request counts over one sample, summed over ingress nodes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct TrafficSample {
    pub at: String,
    pub requests: i64,
    pub r2xx: i64,
    pub r3xx: i64,
    pub r4xx: i64,
    pub r5xx: i64,
    pub avg_ms: f64,
    pub slow: i64,
}

/// `GET /api/traffic/{host}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct TrafficView {
    pub host: String,
    pub samples: Vec<TrafficSample>,
}

/// A node's usage at one time.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct UsageSample {
    pub at: String,
    /// 30 for the last day, 300 before that.
    pub resolution_seconds: i64,
    pub cpu_pct: Option<f64>,
    pub mem_used: Option<i64>,
    pub disk_used: Option<i64>,
}

/// `GET /api/nodes/{id}/usage`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct UsageView {
    pub node_id: String,
    pub samples: Vec<UsageSample>,
}

/// One runtime log line of an app: also the data of a `log` event of
/// `GET /api/apps/{name}/logs?follow=1`, whose id is `seq`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct RuntimeLine {
    /// Grows with every line stored, across restarts: a reconnecting
    /// client asks for what came after it.
    pub seq: u64,
    pub ts: String,
    /// `stdout`, `stderr`, or `agent` for a note of the platform's own
    /// (lines lost on the node).
    pub stream: String,
    pub line: String,
    pub deployment_id: String,
    pub instance: u32,
    pub node_id: String,
    pub container: String,
}

/// `GET /api/apps/{name}/logs`: the tail (oldest first), or a page of a
/// search (newest first, with `next` when there may be more).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct RuntimeLogs {
    pub app: String,
    pub lines: Vec<RuntimeLine>,
    /// A search's cursor for the next page (`cursor=`), when there may be
    /// one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next: Option<String>,
    /// What the store holds of the app (with a search).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stored: Option<StoredLogs>,
}

/// What the log store holds of an app, and what it lost.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct StoredLogs {
    pub lines: u64,
    pub bytes: u64,
    /// Lines deleted by retention (older than it, or past the app's or
    /// the store's size bound), oldest first.
    pub pruned: u64,
    /// Lines that never reached the store: over the app's rate, or the
    /// store was full or behind. Each such cut is also noted by a line of
    /// stream `agent` where it happened.
    pub dropped: u64,
}

/// The data of the `end` event of a followed runtime log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct RuntimeLogEnd {
    /// `app deleted`.
    pub reason: String,
}
