//! Autoscaling an app (`cloudweb autoscale`): the count of its running
//! instances kept between `min` and `max` so that a metric stays near its
//! target, and the record of every decision.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Most instances per app, as for a manual scale.
pub const MAX_INSTANCES: u32 = 20;

/// What the autoscaler keeps near its target.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum AutoscaleTarget {
    /// The instances' average CPU use, in percent of the cores each
    /// requests (the app's `cpu`, 1 core when unset): 1 to 1000.
    CpuPercent(u32),
    /// Requests per second per instance through the ingress (the app's
    /// hosts, over the last minute): 1 to 100000.
    RequestsPerSecond(u32),
}

/// `PUT /api/apps/{name}/autoscale`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"min": 2, "max": 6, "target": {"cpu_percent": 70}}))]
pub struct Autoscale {
    /// 1 to 20.
    pub min: u32,
    /// `min` to 20.
    pub max: u32,
    pub target: AutoscaleTarget,
    /// A higher count is taken only once every recommendation of this
    /// many seconds asked for at least it (0 to 3600; 60 when absent).
    #[serde(default = "default_up_window")]
    pub up_window_seconds: u32,
    /// A lower count is taken only once every recommendation of this many
    /// seconds asked for at most it (0 to 86400; 300 when absent).
    #[serde(default = "default_down_window")]
    pub down_window_seconds: u32,
}

fn default_up_window() -> u32 {
    60
}

fn default_down_window() -> u32 {
    300
}

impl Autoscale {
    /// Why the settings cannot be used, if they cannot.
    pub fn problem(&self) -> Option<String> {
        if !(1..=MAX_INSTANCES).contains(&self.min) {
            return Some(format!("min must be 1 to {MAX_INSTANCES}"));
        }
        if self.max < self.min || self.max > MAX_INSTANCES {
            return Some(format!("max must be min ({}) to {MAX_INSTANCES}", self.min));
        }
        match self.target {
            AutoscaleTarget::CpuPercent(p) if !(1..=1000).contains(&p) => return Some("target.cpu_percent must be 1 to 1000".into()),
            AutoscaleTarget::RequestsPerSecond(r) if !(1..=100_000).contains(&r) => return Some("target.requests_per_second must be 1 to 100000".into()),
            _ => {}
        }
        if self.up_window_seconds > 3600 {
            return Some("up_window_seconds must be 0 to 3600".into());
        }
        if self.down_window_seconds > 86_400 {
            return Some("down_window_seconds must be 0 to 86400".into());
        }
        None
    }
}

/// One decision of the autoscaler: a change of the instance count, or a
/// change it could not make (with why).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct AutoscaleDecision {
    /// RFC 3339.
    pub at: String,
    pub from: u32,
    pub to: u32,
    /// `cpu_percent` or `requests_per_second`.
    pub metric: String,
    /// The metric's value per instance when it decided, if measured.
    pub value: Option<f64>,
    pub target: f64,
    pub reason: String,
}

/// `GET /api/apps/{name}/autoscale`: the settings (none: off), the
/// instance count now, and the newest decisions first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct AutoscaleView {
    pub app: String,
    pub autoscale: Option<Autoscale>,
    pub instances: i64,
    pub decisions: Vec<AutoscaleDecision>,
}
