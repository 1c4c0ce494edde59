//! Alerts (issue 26; leader only): conditions the control plane watches,
//! each an alert open while it holds and resolved when it is over, one
//! per condition however often it is seen (`cloudweb_store::alerts`), and
//! the messages that carry them to people ([`channels`], [`delivery`],
//! [`send`]). Every `alert_interval` the evaluator looks at what the
//! control plane already knows ([`conditions`]):
//! - `deploy_failed` (an app): a deployment failed, with its reason;
//!   resolved when a later deployment of the app runs. Deployment events
//!   are followed with a cursor kept in the database, so a restart neither
//!   repeats nor skips one, and a first run starts from now.
//! - `deploy_succeeded` (an app): a notice, raised only when a channel
//!   wants it; over as soon as it is raised.
//! - `crash_loop` (`<app>#<instance>`): a running instance crash-loops as
//!   its node reported it; resolved when it no longer does or is gone.
//! - `node_unreachable` (a node id): no heartbeat for
//!   `--unreachable-after-seconds`; resolved when it is back or removed.
//! - `node_degraded` (a node id): it reports its registry unreachable.
//! - `disk_full` (a node id): its disk over 90% used (volumes live there).
//! - `certificate` (a host): no certificate can be obtained, or the
//!   current one expires within 14 days.
//! - `backup_failed` (a backup target): its backups need attention as the
//!   backups page says (the newest failed, its verification failed, or
//!   none for twice its schedule); a retry under way keeps it open.
//! - `job_failed` (`<app>/<job>`): a scheduled job's newest run failed,
//!   timed out or was lost; resolved by a run that does not.

use std::sync::Arc;

use cloudweb_api_types::alerts::AlertView;
use cloudweb_store::alerts::{AlertRow, Raise, Raised};

use crate::error::ApiError;
use crate::AppState;

pub mod channels;
mod conditions;
pub mod delivery;
pub mod send;

pub use conditions::DISK_FULL_PCT;

/// Resolved alerts are kept this long.
const KEEP_RESOLVED_MS: i64 = 30 * 24 * 3600 * 1000;

/// What a look changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    Opened(AlertRow),
    Resolved(AlertRow),
}

fn new_id() -> String {
    let bytes: [u8; 8] = rand::random();
    format!("alt_{}", hex::encode(bytes))
}

async fn raise(state: &AppState, kind: &str, subject: &str, severity: &str, summary: &str, detail: Option<&str>, changes: &mut Vec<Change>) -> Result<(), ApiError> {
    let id = new_id();
    let now = state.clock.now_ms();
    if let Raised::Opened(alert) = state.store.raise_alert(&Raise { id: &id, kind, subject, severity, summary, detail, now }).await? {
        tracing::warn!(alert = %alert.id, kind, subject, summary, "alert opened");
        changes.push(Change::Opened(alert));
    }
    Ok(())
}

async fn resolve(state: &AppState, kind: &str, subject: &str, changes: &mut Vec<Change>) -> Result<(), ApiError> {
    if let Some(alert) = state.store.resolve_alert(kind, subject, state.clock.now_ms()).await? {
        tracing::info!(alert = %alert.id, kind, subject, "alert resolved");
        changes.push(Change::Resolved(alert));
    }
    Ok(())
}

/// One look at every condition.
pub async fn evaluate(state: &AppState) -> Result<Vec<Change>, ApiError> {
    let mut changes = Vec::new();
    conditions::deployments(state, &mut changes).await?;
    conditions::crash_loops(state, &mut changes).await?;
    conditions::nodes(state, &mut changes).await?;
    conditions::certificates(state, &mut changes).await?;
    conditions::backups(state, &mut changes).await?;
    conditions::jobs(state, &mut changes).await?;
    state.store.prune_alerts(state.clock.now_ms() - KEEP_RESOLVED_MS).await?;
    Ok(changes)
}

/// Runs the evaluator until the task is aborted (the leader's).
pub async fn evaluator(state: Arc<AppState>) {
    let mut every = tokio::time::interval(state.config.alert_interval);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        if let Err(err) = evaluate(&state).await {
            tracing::warn!(error = %err, "alerts: a look failed; trying again next time");
        }
    }
}

/// Whether some channel wants alerts of `kind`.
async fn channels_want(state: &AppState, kind: &str) -> Result<bool, ApiError> {
    Ok(state.store.alert_channels().await?.iter().any(|c| serde_json::from_str::<Vec<String>>(&c.events).is_ok_and(|events| events.iter().any(|e| e == kind))))
}

/// An alert as the API shows and channels send it.
pub fn view(row: AlertRow) -> AlertView {
    AlertView {
        id: row.id,
        kind: row.kind,
        subject: row.subject,
        severity: row.severity,
        summary: row.summary,
        detail: row.detail,
        opened_at: crate::clock::rfc3339_ms(row.opened_at),
        last_seen_at: crate::clock::rfc3339_ms(row.last_seen_at),
        resolved_at: row.resolved_at.map(crate::clock::rfc3339_ms),
        occurrences: u64::try_from(row.occurrences).unwrap_or(0),
    }
}
