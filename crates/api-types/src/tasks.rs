//! Tasks: scheduled jobs (`cloudweb cron`) and one-off runs
//! (`cloudweb run`) of a command in a container of an app's running image,
//! with the app's environment, and the history of their runs.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

pub use cloudweb_protocol::tasks::TaskLine;

/// `POST /api/apps/{app}/cron`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewCronJob {
    /// 1 to 63 lowercase letters, digits or '-', unique in the app.
    pub name: String,
    /// Five cron fields (`minute hour day-of-month month day-of-week`),
    /// or `@hourly`, `@daily`, `@weekly`, `@monthly`.
    pub schedule: String,
    /// An IANA time zone (`Europe/Madrid`) the schedule is read in;
    /// default `UTC`.
    #[serde(default)]
    pub timezone: Option<String>,
    /// The program and its arguments, run as the container's command
    /// (no shell unless you name one: `["sh", "-c", "..."]`).
    pub command: Vec<String>,
    /// Killed and recorded `timed_out` after this; default 3600 s, at most
    /// a day.
    #[serde(default)]
    pub timeout_seconds: Option<u32>,
    /// What a tick does while the job's previous run is unfinished:
    /// `forbid` (default: the tick is recorded `skipped`), `replace` (the
    /// previous run is cancelled) or `allow` (both run).
    #[serde(default)]
    pub concurrency: Option<String>,
    /// Run again once when the node of a run is lost; default true.
    #[serde(default)]
    pub retry_lost: Option<bool>,
    /// A tick missed while the control plane was down runs once when it
    /// is back if it is at most this late; default 3600 s.
    #[serde(default)]
    pub starting_deadline_seconds: Option<u32>,
    /// Created without running until resumed; default false.
    #[serde(default)]
    pub suspended: Option<bool>,
}

/// `PATCH /api/apps/{app}/cron/{name}`: only the fields given change.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CronJobChange {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timezone: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_seconds: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_lost: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub starting_deadline_seconds: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suspended: Option<bool>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct CronJobView {
    pub app: String,
    pub name: String,
    pub schedule: String,
    pub timezone: String,
    pub command: Vec<String>,
    pub timeout_seconds: u32,
    pub concurrency: String,
    pub retry_lost: bool,
    pub starting_deadline_seconds: u32,
    pub suspended: bool,
    /// The next tick (RFC 3339, UTC); absent while suspended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_run_at: Option<String>,
    /// The newest run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_run: Option<TaskRunView>,
    /// Set while the newest run failed, timed out or was lost: what
    /// happened, in words.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alert: Option<String>,
    pub created_at: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct CronJobList {
    pub jobs: Vec<CronJobView>,
}

/// `POST /api/apps/{app}/runs`: a one-off run of a command.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewTaskRun {
    pub command: Vec<String>,
    /// Default 3600 s, at most a day.
    #[serde(default)]
    pub timeout_seconds: Option<u32>,
}

/// One run of a command: a scheduled job's tick, a `cron run`, or a
/// one-off `cloudweb run`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct TaskRunView {
    pub id: String,
    pub app: String,
    /// The scheduled job it ran for; absent for a one-off run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job: Option<String>,
    /// `schedule`, `manual` (`cron run`), `one-off` or `retry` (after a
    /// lost node).
    pub trigger: String,
    /// The tick it ran for (RFC 3339, UTC).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduled_for: Option<String>,
    /// `queued`, `running`, `succeeded`, `failed`, `timed_out`,
    /// `cancelled`, `lost` (its node went away), `skipped` (the previous
    /// run was unfinished, or the tick was missed past its deadline).
    pub state: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i64>,
    /// Why it ended as it did, in words.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    pub command: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_id: Option<String>,
    /// The image it ran and the deployment that image came from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deployment_id: Option<String>,
    pub attempt: u32,
    pub created_at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<u64>,
}

impl TaskRunView {
    /// Whether the run has ended (nothing about it changes any more).
    pub fn is_final(&self) -> bool {
        !matches!(self.state.as_str(), "queued" | "running")
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct TaskRunList {
    pub runs: Vec<TaskRunView>,
}

/// `GET /api/apps/{app}/runs/{id}/logs?after=N`: the run and its output
/// lines numbered after `N`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct TaskRunLogs {
    pub run: TaskRunView,
    pub lines: Vec<TaskLine>,
    /// Lines before the first one kept were dropped (a run keeps its last
    /// 2,000).
    pub truncated: bool,
}
