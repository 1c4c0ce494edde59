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

use cloudweb_store::audit::{AuditRow, NewAuditEntry};
use serde_json::json;

use crate::audit_policy::{Admit, Suppressed};
use crate::error::ApiError;
use crate::forward::{otlp_attr, syslog_field, syslog_param, syslog_time, Forwarder, Record};
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
    let written = state.store.append_audit(&row).await?;
    if let Some(forwarder) = state.auth.audit.forward.get() {
        forwarder.offer(std::slice::from_ref(&written));
    }
    Ok(())
}

/// Starts forwarding entries to `--audit-forward`, if given: the task that
/// ships them (to spawn).
pub fn start_forwarding(state: &AppState) -> Option<impl std::future::Future<Output = ()> + Send + 'static> {
    let target = state.config.auth.audit.forward.clone()?;
    tracing::info!(target = %target.describe(), "audit log: forwarding every entry written here");
    let (forwarder, task) = Forwarder::<AuditRow>::new(target);
    state.auth.audit.forward.set(forwarder).ok()?;
    Some(task)
}

/// Whether an anonymous request from `source` is written one by one (see
/// `AuditSettings::anonymous`); writes the summary of an earlier minute
/// when one is due.
pub async fn admit_anonymous(state: &AppState, source: &str) -> Admit {
    let (admit, summary) = state.auth.audit.anonymous.admit(state.config.auth.audit.anonymous, source, state.clock.now_ms());
    if let Some(summary) = summary {
        write_summary(state, summary).await;
    }
    admit
}

/// Counts an anonymous request over the budget that changed nothing.
pub fn suppressed(state: &AppState, source: &str) {
    state.auth.audit.anonymous.suppressed(source);
}

/// Writes the summary of a finished minute's unwritten anonymous
/// requests, when one is due (called now and then).
pub async fn flush_suppressed(state: &AppState) {
    if let Some(summary) = state.auth.audit.anonymous.due(state.config.auth.audit.anonymous, state.clock.now_ms()) {
        write_summary(state, summary).await;
    }
}

async fn write_summary(state: &AppState, summary: Suppressed) {
    let minute = crate::clock::rfc3339_ms(summary.minute_ms);
    let result = format!(
        "{} refused anonymous requests from {} addresses in the minute from {minute} not written one by one (over {} a minute, or {} from one address)",
        summary.requests, summary.addresses, summary.limits.per_minute, summary.limits.per_address_per_minute
    );
    tracing::warn!(requests = summary.requests, addresses = summary.addresses, %minute, "audit log: anonymous requests over the budget, summed up in one entry");
    after(state, Entry { request_id: request_id(), phase: "event", actor: "anonymous".to_string(), action: "audit.suppressed".to_string(), result, ..Default::default() }).await;
}

/// An entry as forwarded: syslog facility 13 (log audit), severity notice,
/// warning for a refusal or a failure.
impl Record for AuditRow {
    fn syslog(&self) -> String {
        let e = &self.entry;
        let severity = if refused(&e.result) { 4 } else { 5 };
        let param = |name: &str, value: Option<&str>| value.map(|v| format!(" {name}=\"{}\"", syslog_param(v))).unwrap_or_default();
        format!(
            "<{}>1 {} - cloudweb-audit - {} [cloudweb-audit@32473 seq=\"{}\" request=\"{}\" actor=\"{}\"{}{}{} result=\"{}\" hash=\"{}\"] {}",
            13 * 8 + severity,
            syslog_time(&crate::clock::rfc3339_ms(e.at)),
            syslog_field(&e.phase, 32),
            self.seq,
            syslog_param(&e.request_id),
            syslog_param(&e.actor),
            param("team", e.team.as_deref()),
            param("source", e.source.as_deref()),
            param("target", e.target.as_deref()),
            syslog_param(&e.result),
            self.hash,
            e.action
        )
    }

    fn otlp(&self) -> (String, serde_json::Value) {
        let e = &self.entry;
        let (text, number) = if refused(&e.result) { ("WARN", 13) } else { ("INFO", 9) };
        let mut attributes = vec![
            otlp_attr("cloudweb.audit.seq", &self.seq.to_string()),
            otlp_attr("cloudweb.audit.request", &e.request_id),
            otlp_attr("cloudweb.audit.phase", &e.phase),
            otlp_attr("cloudweb.audit.actor", &e.actor),
            otlp_attr("cloudweb.audit.result", &e.result),
            otlp_attr("cloudweb.audit.hash", &self.hash),
        ];
        for (key, value) in [("cloudweb.audit.team", &e.team), ("cloudweb.audit.source", &e.source), ("cloudweb.audit.target", &e.target)] {
            if let Some(value) = value {
                attributes.push(otlp_attr(key, value));
            }
        }
        let record = json!({
            "timeUnixNano": (i128::from(e.at) * 1_000_000).to_string(),
            "severityText": text,
            "severityNumber": number,
            "body": {"stringValue": e.action},
            "attributes": attributes,
        });
        ("cloudweb-audit".to_string(), record)
    }

    fn loki(&self) -> (std::collections::BTreeMap<String, String>, serde_json::Value) {
        let e = &self.entry;
        let labels = [("source", "cloud-web"), ("stream", "audit"), ("phase", e.phase.as_str())].into_iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let line = json!({
            "seq": self.seq, "request_id": e.request_id, "actor": e.actor, "team": e.team, "source": e.source,
            "action": e.action, "target": e.target, "result": e.result, "hash": self.hash,
        });
        (labels, json!([(i128::from(e.at) * 1_000_000).to_string(), line.to_string()]))
    }

    fn kind() -> &'static str {
        "audit log"
    }
}

/// Whether an entry's result is a refusal or a failure (4xx, 5xx).
fn refused(result: &str) -> bool {
    (result.len() == 3 && matches!(result.as_bytes().first(), Some(b'4' | b'5'))) || result.starts_with("refused") || result.starts_with("failed")
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

#[cfg(test)]
mod tests {
    use super::*;

    fn row(result: &str, target: Option<&str>) -> AuditRow {
        AuditRow {
            seq: 7,
            entry: NewAuditEntry {
                at: 1_764_000_000_123,
                request_id: "req_1".into(),
                phase: "response".into(),
                actor: "user:u_1".into(),
                team: Some("team_default".into()),
                source: Some("10.0.0.5".into()),
                action: "POST /api/apps/{app}/deploy".into(),
                target: target.map(str::to_string),
                result: result.into(),
            },
            prev_hash: "a".repeat(64),
            hash: "b".repeat(64),
        }
    }

    #[test]
    fn entries_go_out_in_each_targets_form() {
        let text = row("202", Some("app=\"web]\"")).syslog();
        assert!(text.starts_with("<109>1 2025-11-24T16:00:00.123Z - cloudweb-audit - response [cloudweb-audit@32473 seq=\"7\""), "{text}");
        assert!(text.contains(r#"target="app=\"web\]\"""#), "escaped: {text}");
        assert!(text.ends_with("] POST /api/apps/{app}/deploy"), "{text}");
        assert!(row("403", None).syslog().starts_with("<108>1 "), "a refusal is a warning");
        assert!(!row("403", None).syslog().contains("target="), "no empty parameters");
        let (service, record) = row("202", None).otlp();
        assert_eq!(service, "cloudweb-audit");
        assert_eq!(record["timeUnixNano"], "1764000000123000000");
        assert_eq!(record["body"]["stringValue"], "POST /api/apps/{app}/deploy");
        let (labels, value) = row("202", None).loki();
        assert_eq!(labels["stream"], "audit");
        let line: serde_json::Value = serde_json::from_str(value[1].as_str().unwrap()).unwrap();
        assert_eq!((line["actor"].as_str(), line["seq"].as_i64()), (Some("user:u_1"), Some(7)));
    }
}
