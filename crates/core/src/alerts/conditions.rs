//! The conditions the evaluator watches, each read from what the control
//! plane already knows (see the module docs of [`super`]).

use std::collections::HashSet;

use crate::error::ApiError;
use crate::live::{HealthState, NodeState};
use crate::AppState;

use super::{raise, resolve, Change};

/// Deployment events read per look.
const EVENTS_PER_LOOK: i64 = 500;
/// A node's disk is alerted on over this share used.
pub const DISK_FULL_PCT: f64 = 90.0;
/// A certificate is alerted on this long before it expires (renewal
/// starts well before).
const CERT_WARN_MS: i64 = 14 * 24 * 3600 * 1000;

/// Resolves every open alert of `kind` whose subject is not in `holding`.
async fn resolve_others(state: &AppState, kind: &str, holding: &HashSet<String>, changes: &mut Vec<Change>) -> Result<(), ApiError> {
    for open in state.store.open_alerts_of(kind).await? {
        if !holding.contains(&open.subject) {
            resolve(state, kind, &open.subject, changes).await?;
        }
    }
    Ok(())
}

pub(super) async fn deployments(state: &AppState, changes: &mut Vec<Change>) -> Result<(), ApiError> {
    const CURSOR: &str = "deployment_events";
    let after = match state.store.alert_cursor(CURSOR).await? {
        Some(after) => after,
        None => {
            let now = state.store.last_deployment_event().await?;
            state.store.set_alert_cursor(CURSOR, now).await?;
            now
        }
    };
    let outcomes = state.store.deployment_outcomes(after, EVENTS_PER_LOOK).await?;
    let notices_wanted = !outcomes.is_empty() && super::channels_want(state, "deploy_succeeded").await?;
    for outcome in &outcomes {
        match outcome.state.as_str() {
            "failed" => {
                let reason = outcome.error.as_deref().unwrap_or("no reason recorded");
                let summary = cloudweb_protocol::misc::one_line(&format!("deployment {} of {} failed: {reason}", outcome.deployment_id, outcome.app), 500);
                raise(state, "deploy_failed", &outcome.app, "critical", &summary, None, changes).await?;
            }
            _ => {
                resolve(state, "deploy_failed", &outcome.app, changes).await?;
                if notices_wanted {
                    // A notice: opened and over at once, sent only as "opened".
                    let summary = format!("deployment {} of {} is running", outcome.deployment_id, outcome.app);
                    raise(state, "deploy_succeeded", &outcome.app, "info", &summary, None, changes).await?;
                    resolve(state, "deploy_succeeded", &outcome.app, changes).await?;
                }
            }
        }
    }
    if let Some(last) = outcomes.last() {
        state.store.set_alert_cursor(CURSOR, last.seq).await?;
    }
    Ok(())
}

pub(super) async fn crash_loops(state: &AppState, changes: &mut Vec<Change>) -> Result<(), ApiError> {
    let looping = state.store.looping_instances().await?;
    let mut holding = HashSet::new();
    for instance in &looping {
        let subject = format!("{}#{}", instance.app, instance.instance);
        let view: Option<cloudweb_api_types::scale::CrashLoopView> = serde_json::from_str(&instance.crash_loop).ok();
        let summary = match &view {
            Some(view) => format!(
                "instance {} of {} is crash-looping: {} restarts{}{}",
                instance.instance,
                instance.app,
                view.restarts,
                view.exit_code.map(|c| format!(", last exit code {c}")).unwrap_or_default(),
                view.reason.as_deref().map(|r| format!(" ({r})")).unwrap_or_default()
            ),
            None => format!("instance {} of {} is crash-looping", instance.instance, instance.app),
        };
        let detail = view.map(|v| v.last_lines.join("\n")).filter(|d| !d.is_empty());
        raise(state, "crash_loop", &subject, "critical", &cloudweb_protocol::misc::one_line(&summary, 500), detail.as_deref(), changes).await?;
        holding.insert(subject);
    }
    resolve_others(state, "crash_loop", &holding, changes).await
}

/// Unreachable, degraded (its registry unreachable) and full-disk nodes.
pub(super) async fn nodes(state: &AppState, changes: &mut Vec<Change>) -> Result<(), ApiError> {
    let now = tokio::time::Instant::now();
    let now_ms = state.clock.now_ms();
    let window_ms = i64::try_from(state.config.unreachable_after.as_millis()).unwrap_or(i64::MAX);
    let (mut down, mut degraded, mut full) = (HashSet::new(), HashSet::new(), HashSet::new());
    for node in state.nodes.all() {
        if node.state(now, state.config.unreachable_after) == NodeState::Unreachable {
            let summary = format!("node {} ({}) is unreachable: no heartbeat for over {} s", node.name, node.id, state.config.unreachable_after.as_secs());
            raise(state, "node_unreachable", &node.id, "critical", &summary, None, changes).await?;
            down.insert(node.id.clone());
            // What an unreachable node last said is not believed.
            continue;
        }
        // Not heard from since this control plane began to lead (the grace
        // a restart gives every node): an outage open from before is not
        // over yet, nor is anything else known.
        if node.heartbeat_at_ms.is_none_or(|at| now_ms.saturating_sub(at) > window_ms) {
            down.insert(node.id.clone());
            degraded.insert(node.id.clone());
            full.insert(node.id.clone());
            continue;
        }
        if let HealthState::Degraded(why) = node.health_state(now) {
            let summary = cloudweb_protocol::misc::one_line(&format!("node {} ({}) is degraded: {why}", node.name, node.id), 500);
            raise(state, "node_degraded", &node.id, "warning", &summary, None, changes).await?;
            degraded.insert(node.id.clone());
        }
        let used = node.metrics.as_ref().and_then(|m| m.value.node.as_ref()).and_then(|n| n.disk_used);
        if let (Some(used), Some(capacity)) = (used, node.capacity.as_ref().map(|c| c.disk_bytes).filter(|b| *b > 0)) {
            let pct = used as f64 * 100.0 / capacity as f64;
            if pct > DISK_FULL_PCT {
                let summary = format!(
                    "node {} ({}): its disk is {pct:.0}% full ({} of {} GiB; volumes and images live there)",
                    node.name,
                    node.id,
                    used >> 30,
                    capacity >> 30
                );
                raise(state, "disk_full", &node.id, "warning", &summary, None, changes).await?;
                full.insert(node.id.clone());
            }
        }
    }
    resolve_others(state, "node_unreachable", &down, changes).await?;
    resolve_others(state, "node_degraded", &degraded, changes).await?;
    resolve_others(state, "disk_full", &full, changes).await
}

/// Certificates that cannot be obtained, or expire within 14 days.
pub(super) async fn certificates(state: &AppState, changes: &mut Vec<Change>) -> Result<(), ApiError> {
    let now = state.clock.now_ms();
    let certificates = state.store.certificates().await?;
    let orders = state.store.certificate_orders().await?;
    let mut holding = HashSet::new();
    for (host, order) in &orders {
        let Some(error) = &order.last_error else { continue };
        let current = certificates.iter().find(|c| &c.host == host);
        if current.is_some_and(|c| c.not_after_ms - now > CERT_WARN_MS) {
            continue;
        }
        let summary = match current {
            Some(c) => format!("the certificate of {host} expires {} and cannot be renewed: {error}", crate::clock::rfc3339_ms(c.not_after_ms)),
            None => format!("no certificate can be obtained for {host}: {error}"),
        };
        raise(state, "certificate", host, "critical", &cloudweb_protocol::misc::one_line(&summary, 500), None, changes).await?;
        holding.insert(host.clone());
    }
    for certificate in &certificates {
        if certificate.not_after_ms - now <= CERT_WARN_MS && !holding.contains(&certificate.host) {
            let summary = format!("the certificate of {} expires {} and is not renewed yet", certificate.host, crate::clock::rfc3339_ms(certificate.not_after_ms));
            raise(state, "certificate", &certificate.host, "warning", &summary, None, changes).await?;
            holding.insert(certificate.host.clone());
        }
    }
    resolve_others(state, "certificate", &holding, changes).await
}

/// Targets whose backups need attention, as the backups page and
/// `/metrics` see them: the newest backup failed, its verification failed,
/// or none succeeded for twice the schedule (the control plane's too).
pub(super) async fn backups(state: &AppState, changes: &mut Vec<Change>) -> Result<(), ApiError> {
    let mut holding = HashSet::new();
    for figures in crate::backups::status::figures(state).await? {
        let Some(why) = figures.alert else {
            // A retry under way settles nothing yet: an open alert stays
            // open (no "resolved" then "opened" again per retry).
            if matches!(figures.last_state.as_deref(), Some("queued" | "running")) {
                holding.insert(figures.target);
            }
            continue;
        };
        let summary = cloudweb_protocol::misc::one_line(&format!("backups of {} need attention: {why}", figures.target), 500);
        raise(state, "backup_failed", &figures.target, "critical", &summary, None, changes).await?;
        holding.insert(figures.target);
    }
    resolve_others(state, "backup_failed", &holding, changes).await
}

/// Scheduled jobs whose newest run failed, timed out or was lost; a run
/// under way keeps the alert open, a successful (or cancelled) one
/// resolves it.
pub(super) async fn jobs(state: &AppState, changes: &mut Vec<Change>) -> Result<(), ApiError> {
    let mut holding = HashSet::new();
    for (app, job, last) in state.store.cron_jobs_last_state().await? {
        let subject = format!("{app}/{job}");
        match last.as_deref() {
            Some(outcome) if crate::tasks::is_failure(outcome) => {
                let what = match outcome {
                    "timed_out" => "timed out",
                    "lost" => "was lost (its node went away)",
                    _ => "failed",
                };
                let summary = format!("the newest run of the scheduled job {job} of {app} {what} (cloudweb runs {app} --job {job})");
                raise(state, "job_failed", &subject, "warning", &summary, None, changes).await?;
                holding.insert(subject);
            }
            Some("queued" | "running") => {
                holding.insert(subject);
            }
            _ => {}
        }
    }
    resolve_others(state, "job_failed", &holding, changes).await
}
