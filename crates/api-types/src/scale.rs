//! Scaling an app's running deployment now (`cloudweb scale`).

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// `POST /api/apps/{name}/scale`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"instances": 3}))]
pub struct ScaleRequest {
    /// 1 to 20: the app's instance count from now on.
    pub instances: u32,
}

/// An instance a scale-up started, and why the scheduler chose its node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct StartedInstance {
    pub instance: i64,
    pub node_id: String,
    pub why: String,
}

/// A deployment still on its way, with the instance count it was
/// requested with (it keeps it; the next deployment has the new count).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct InFlightCount {
    pub deployment: String,
    pub instances: usize,
}

/// What a scale did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ScaleView {
    pub app: String,
    /// The app's instance count now.
    pub instances: u32,
    /// The running deployment that was scaled (none: the count applies
    /// from the next deployment on).
    pub deployment: Option<String>,
    /// Instances that ran or were starting before.
    pub before: usize,
    /// Instances started, each with the scheduler's reason.
    pub started: Vec<StartedInstance>,
    /// Instances taken out of the routes now, stopped after the drain
    /// period.
    pub draining: Vec<i64>,
    /// Why fewer instances than asked for started (no room): the count is
    /// kept, and the next deployment tries again.
    pub waiting: Option<String>,
    pub in_flight: Vec<InFlightCount>,
}

/// One instance's latest usage sample (`cloudweb top`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct InstanceUsage {
    pub deployment: String,
    pub instance: i64,
    pub node_id: Option<String>,
    pub container: Option<String>,
    /// `pending`, `running` or `stopping`.
    pub state: String,
    /// Cores in use (1.0 = one core), from the node's latest sample.
    pub cpu_cores: Option<f64>,
    /// `cpu_cores` as a percentage of the cores the app requests.
    pub cpu_pct_of_request: Option<f64>,
    pub mem_bytes: Option<u64>,
    pub mem_limit: Option<u64>,
    /// Container restarts counted by Docker.
    pub restarts: Option<u32>,
    /// RFC 3339, when the container started.
    pub started_at: Option<String>,
    /// RFC 3339, when the node took the sample (none: no sample yet).
    pub sampled_at: Option<String>,
    /// False while the app's readiness probe fails on it (it gets no
    /// requests then); always true without a probe.
    pub ready: bool,
    /// Why its readiness probe fails, while it does.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unready_reason: Option<String>,
    /// While its container keeps stopping (3 stops within 10 minutes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub crash_loop: Option<CrashLoopView>,
    /// Why its liveness probe cannot run as set (it restarts nothing then).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe_problem: Option<String>,
}

/// An instance whose container keeps stopping, as its node reported it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct CrashLoopView {
    /// RFC 3339, when its node reported the loop.
    pub since: String,
    /// Its stops within the last 10 minutes, as of the report.
    pub restarts: u32,
    /// The exit code of its last run, when it exited on its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i64>,
    /// Why it stopped last: a failed liveness probe, or its exit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Its last output lines before the report.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub last_lines: Vec<String>,
}

/// `GET /api/apps/{name}/top`: the app's instances that run, are starting
/// or are stopping, with their latest usage.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct AppTop {
    pub app: String,
    /// The cores each instance requests (the app's `cpu`, or the default).
    pub cpu_request: f64,
    pub instances: Vec<InstanceUsage>,
}
