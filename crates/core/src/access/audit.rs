//! The audit log: who did what, to what, from where, and with what
//! result. Every mutating request is written before it runs (and its
//! outcome after), as are logins, refusals for lack of permission, exec
//! and port-forward sessions, and node joins. Entries form a hash chain
//! (`cloudweb_store::audit`), so `cloudweb audit verify` finds an entry
//! changed or deleted in the database.
//!
//! When an entry cannot be written (a full disk), a mutating request is
//! refused with 503 rather than done unaudited, unless the cluster chose
//! `warn` (`--audit-failure warn`, for a single user's cluster).

use cloudweb_store::audit::NewAuditEntry;

use crate::error::ApiError;
use crate::AppState;

pub use crate::audit_policy::{AuditSettings, OnFailure};

/// A fresh id tying a request's entries together.
pub fn request_id() -> String {
    format!("req_{}", crate::auth::random_hex(8))
}

/// One entry, before its time is set.
#[derive(Debug, Clone, Default)]
pub struct Entry {
    pub request_id: String,
    pub phase: &'static str,
    pub actor: String,
    pub team: Option<String>,
    pub source: Option<String>,
    pub action: String,
    pub target: Option<String>,
    pub result: String,
}

async fn append(state: &AppState, entry: Entry) -> Result<(), cloudweb_store::StoreError> {
    let row = NewAuditEntry {
        at: state.clock.now_ms(),
        request_id: entry.request_id,
        phase: entry.phase.to_string(),
        actor: entry.actor,
        team: entry.team,
        source: entry.source,
        action: entry.action,
        target: entry.target,
        result: entry.result,
    };
    state.store.append_audit(&row).await.map(|_| ())
}

/// Writes the entry of a request about to run: `Err(503)` when it cannot
/// be written and the cluster refuses unaudited changes.
pub async fn before(state: &AppState, entry: Entry) -> Result<(), ApiError> {
    let action = entry.action.clone();
    match append(state, entry).await {
        Ok(()) => Ok(()),
        Err(err) => match state.config.auth.audit.on_failure {
            OnFailure::Refuse => {
                tracing::error!(error = %err, action = %action, "cannot write the audit log; request refused");
                // The answer the change's own write would have had (a
                // full disk, the database out of reach, another leader),
                // and 503 for anything else.
                Err(match ApiError::from(err) {
                    ApiError::Internal(_) => ApiError::Unavailable("the audit log cannot be written; changes are refused until it can".to_string()),
                    known => known,
                })
            }
            OnFailure::Warn => {
                tracing::warn!(error = %err, action = %action, "cannot write the audit log; request goes ahead unaudited (--audit-failure warn)");
                Ok(())
            }
        },
    }
}

/// Writes an entry whose action has happened (an outcome, a login, a
/// refusal): a failure is logged, since nothing is left to refuse.
pub async fn after(state: &AppState, entry: Entry) {
    let action = entry.action.clone();
    if let Err(err) = append(state, entry).await {
        tracing::error!(error = %err, action = %action, "cannot write the audit log entry of something done");
    }
}

/// Deletes entries past the retention; run now and then by the leader.
pub async fn prune(state: &AppState) {
    let before = state.clock.now_ms() - i64::try_from(state.config.auth.audit.retention.as_millis()).unwrap_or(i64::MAX);
    match state.store.prune_audit(before).await {
        Ok(0) => {}
        Ok(gone) => tracing::info!(entries = gone, "audit entries past their retention deleted"),
        Err(err) => tracing::warn!(error = %err, "cannot delete audit entries past their retention"),
    }
}
