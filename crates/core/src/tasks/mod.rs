//! Tasks: a command run to its end in a one-off container of an app's
//! running image, with the app's environment (its linked services' URLs
//! included), on a node with room. Scheduled jobs run one at each tick of
//! their cron schedule ([`watcher`]); `cloudweb cron run` and `cloudweb run`
//! start one now.
//!
//! - A run is a `task_runs` row queued with its `task_run` command in one
//!   write; its node reports `running`, its output lines and its end
//!   (`POST /agent/v1/task-runs/{id}`, [`on_report`]).
//! - A tick is recorded once: the leader moves a job's `next_run_at` on in
//!   the same write as the tick's run, and only from the value it read.
//! - A run whose node goes away ends `lost` (a job's run is tried again
//!   once on another node when `retry_lost`); one with no word from its
//!   node past its time limit ends `lost` too. Nothing waits forever.
//! - History: the newest [`KEEP_RUNS_PER_JOB`] runs of a job and
//!   [`KEEP_ONE_OFF_RUNS`] one-off runs of an app are kept, with their
//!   last 2,000 output lines.

mod jobs;
mod runs;
mod watcher;

pub use jobs::{change_job, create_job, job_view, jobs_of, remove_job, run_job_now};
pub use runs::{app_deleting, cancel, cancel_runs_of, lines, run_of, run_once, run_view, runs_of};
pub use watcher::{on_report, tick, watcher};

use rand::Rng;

/// A run's default time limit, and the longest allowed (a day).
pub const DEFAULT_TIMEOUT_SECONDS: u32 = 3600;
pub const MAX_TIMEOUT_SECONDS: u32 = cloudweb_protocol::tasks::MAX_TIMEOUT_SECONDS;
/// How late a missed tick may still run, by default and at most.
pub const DEFAULT_STARTING_DEADLINE_SECONDS: u32 = 3600;
pub const MAX_STARTING_DEADLINE_SECONDS: u32 = cloudweb_protocol::tasks::MAX_STARTING_DEADLINE_SECONDS;
/// Scheduled jobs an app may have.
pub const MAX_JOBS_PER_APP: usize = 50;
/// Runs kept in the history.
pub const KEEP_RUNS_PER_JOB: i64 = 100;
pub const KEEP_ONE_OFF_RUNS: i64 = 200;
/// What a queued run may take beyond its own time limit before the control
/// plane stops waiting for its node: pulling the image and starting (an
/// agent keeps trying a start for up to 30 minutes), reporting.
pub const DEADLINE_SLACK_MS: i64 = 40 * 60 * 1000;
/// Once it runs, its deadline counts from its start: its limit, the grace
/// of its stop, and reporting.
pub const RUNNING_SLACK_MS: i64 = 5 * 60 * 1000;
/// How long a run's node may be silent before the run counts as lost (a
/// short network cut must not lose, and run again, a long run).
pub const LOST_AFTER: std::time::Duration = std::time::Duration::from_secs(120);

pub(crate) fn new_run_id() -> String {
    if let Some(n) = crate::store::steps::next_id() {
        return format!("tr_{n:016x}");
    }
    let bytes: [u8; 8] = rand::rng().random();
    format!("tr_{}", hex::encode(bytes))
}

/// (app, job, whether its newest run failed) for `/metrics`.
pub async fn metrics_lines(state: &crate::AppState) -> Vec<(String, String, bool)> {
    match state.store.cron_jobs_last_state().await {
        Ok(rows) => rows.into_iter().map(|(app, job, last)| (app, job, last.as_deref().is_some_and(is_failure))).collect(),
        Err(err) => {
            tracing::warn!(error = %err, "cannot read the scheduled jobs for /metrics");
            Vec::new()
        }
    }
}

/// The states a run ends in, and whether each is a failure worth an alert.
pub(crate) fn is_failure(state: &str) -> bool {
    matches!(state, "failed" | "timed_out" | "lost")
}
