//! The state of every target's backups at a glance: the last success and
//! its size, and why a target needs attention (its last backup failed, its
//! newest verification failed, or its last success is older than twice
//! its schedule). The dashboard's banner, `GET /api/backups` and
//! `/metrics` read this.

use std::collections::HashMap;

use cloudweb_api_types::backups::{BackupOverview, TargetStatus};

use super::{all_targets, cron, effective_plan, CONTROL_PLANE_TARGET};
use crate::clock::rfc3339_ms;
use crate::error::ApiError;
use crate::store::BackupJobRow;
use crate::AppState;

/// One target's figures.
#[derive(Debug, Clone, PartialEq)]
pub struct Figures {
    pub target: String,
    pub last_success_ms: Option<i64>,
    pub last_bytes: Option<i64>,
    pub last_state: Option<String>,
    pub alert: Option<String>,
}

fn human(ms: i64) -> String {
    let hours = ms / 3_600_000;
    if hours >= 48 {
        format!("{} days", hours / 24)
    } else if hours >= 1 {
        format!("{hours} h")
    } else {
        format!("{} min", (ms / 60_000).max(1))
    }
}

pub(crate) fn alert_of(
    now: i64,
    since: i64,
    interval_ms: Option<i64>,
    latest: Option<&BackupJobRow>,
    good: Option<&BackupJobRow>,
) -> Option<String> {
    if let Some(latest) = latest.filter(|j| j.state == "failed") {
        return Some(format!("the last backup failed: {}", latest.message.as_deref().unwrap_or("no reason given")));
    }
    if let Some(good) = good.filter(|g| g.verify_state.as_deref() == Some("failed")) {
        return Some(format!(
            "the verification of backup {} failed: {}",
            good.id,
            good.verify_detail.as_deref().unwrap_or("no reason given")
        ));
    }
    let interval = interval_ms?;
    let last = good.and_then(|g| g.finished_at).unwrap_or(since);
    if now - last > 2 * interval {
        return Some(match good {
            Some(_) => format!("the last successful backup is {} old (scheduled every {})", human(now - last), human(interval)),
            None => format!("no successful backup yet, {} after it was due (scheduled every {})", human(now - last - interval), human(interval)),
        });
    }
    None
}

/// Every target's figures (and the control plane's).
pub async fn figures(state: &AppState) -> Result<Vec<Figures>, ApiError> {
    let now = state.clock.now_ms();
    let destinations = state.store.destinations().await?;
    let plans: HashMap<String, crate::store::PlanRow> = state.store.backup_plans().await?.into_iter().map(|p| (p.target.clone(), p)).collect();
    let latest: HashMap<String, BackupJobRow> =
        state.store.latest_backup_jobs().await?.into_iter().filter(|j| j.kind == "backup").map(|j| (j.target.clone(), j)).collect();
    let good: HashMap<String, BackupJobRow> = state.store.latest_good_backups().await?.into_iter().map(|j| (j.target.clone(), j)).collect();
    let first_destination = destinations.iter().map(|d| d.created_at).min();
    let mut out = Vec::new();
    for (target, created) in all_targets(state).await? {
        let key = target.key();
        let plan = effective_plan(&target, plans.get(&key), &super::team_destinations(state, &target, &destinations).await?);
        let active = plan.enabled && plan.destination.is_some();
        let interval = if active { cron::Schedule::parse(&plan.schedule).ok().and_then(|s| s.interval_ms(now)) } else { None };
        let since = created.max(first_destination.unwrap_or(created));
        let alert = if active { alert_of(now, since, interval, latest.get(&key), good.get(&key)) } else { None };
        out.push(Figures {
            target: key.clone(),
            last_success_ms: good.get(&key).and_then(|g| g.finished_at),
            last_bytes: good.get(&key).and_then(|g| g.bytes),
            last_state: latest.get(&key).map(|j| j.state.clone()),
            alert,
        });
    }
    if let Some(first) = first_destination {
        let interval = state.config.backups.control_plane_every.as_millis() as i64;
        let key = CONTROL_PLANE_TARGET.to_string();
        out.push(Figures {
            target: key.clone(),
            last_success_ms: good.get(&key).and_then(|g| g.finished_at),
            last_bytes: good.get(&key).and_then(|g| g.bytes),
            last_state: latest.get(&key).map(|j| j.state.clone()),
            alert: alert_of(now, first, Some(interval), latest.get(&key), good.get(&key)),
        });
    }
    Ok(out)
}

pub async fn overview(state: &AppState) -> Result<BackupOverview, ApiError> {
    let destinations = state.store.destinations().await?.len();
    let figures = figures(state).await?;
    let alerts = figures.iter().filter_map(|f| f.alert.as_ref().map(|a| format!("{}: {a}", f.target))).collect();
    Ok(BackupOverview {
        destinations,
        targets: figures
            .into_iter()
            .map(|f| TargetStatus {
                target: f.target,
                last_success_at: f.last_success_ms.map(rfc3339_ms),
                last_bytes: f.last_bytes,
                last_state: f.last_state,
                alert: f.alert,
            })
            .collect(),
        alerts,
    })
}

/// (target, last success in seconds since the epoch, its bytes, alert) for
/// `/metrics`.
pub async fn metrics_lines(state: &AppState) -> Vec<(String, Option<f64>, Option<f64>, bool)> {
    match figures(state).await {
        Ok(figures) => figures
            .into_iter()
            .map(|f| (f.target, f.last_success_ms.map(|ms| ms as f64 / 1000.0), f.last_bytes.map(|b| b as f64), f.alert.is_some()))
            .collect(),
        Err(err) => {
            tracing::warn!(error = %err, "cannot read the backups' figures for /metrics");
            Vec::new()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(state: &str, finished: i64) -> BackupJobRow {
        BackupJobRow { id: "bj_1".into(), kind: "backup".into(), state: state.into(), finished_at: Some(finished), message: Some("unreachable".into()), ..Default::default() }
    }

    #[test]
    fn alerts_say_why() {
        let day = 86_400_000;
        assert!(alert_of(10 * day, 0, Some(day), Some(&job("failed", 10 * day)), None).unwrap().contains("failed: unreachable"));
        let good = job("succeeded", 9 * day);
        assert_eq!(alert_of(10 * day, 0, Some(day), Some(&good), Some(&good)), None);
        assert!(alert_of(12 * day, 0, Some(day), Some(&good), Some(&good)).unwrap().contains("3 days old"));
        let checked = BackupJobRow { verify_state: Some("failed".into()), verify_detail: Some("pack damaged".into()), ..good.clone() };
        assert!(alert_of(10 * day, 0, Some(day), Some(&checked), Some(&checked)).unwrap().contains("pack damaged"));
        assert!(alert_of(3 * day, 0, Some(day), None, None).unwrap().contains("no successful backup yet"));
    }
}
