//! What moves backups along: nodes' reports, and a tick every few seconds
//! that starts what is due (schedules, retries, verifications), ends jobs
//! whose node went away or that ran over their deadline, and deletes a
//! restore's kept data when its keep period ends.

use std::collections::HashMap;
use std::sync::Arc;

use cloudweb_protocol::{BackupCancelPayload, BackupJobReport, CommandKind, JobState};

use super::jobs::{cancel_job, command, queue_backup, queue_verify};
use super::restore::{after_restore, purge_kept, SETTLING};
use super::{all_targets, cron, effective_plan, Target, MAX_RETRIES};
use crate::error::ApiError;
use crate::store::{BackupJobRow, JobOutcome};
use crate::AppState;

fn state_text(state: JobState) -> &'static str {
    match state {
        JobState::Running => "running",
        JobState::Succeeded => "succeeded",
        JobState::Failed => "failed",
        JobState::Cancelled => "cancelled",
    }
}

/// `POST /agent/v1/backup-jobs/{id}` from node `node_id`.
pub async fn on_report(state: &AppState, node_id: &str, job_id: &str, report: &BackupJobReport) -> Result<(), ApiError> {
    cloudweb_protocol::backups::job_id(job_id).map_err(|e| ApiError::BadRequest(e.to_string()))?;
    report.validate().map_err(|e| ApiError::BadRequest(e.to_string()))?;
    let job = state.store.backup_job(job_id).await?.ok_or_else(|| ApiError::NotFound(format!("no backup job {job_id}")))?;
    if job.node_id != node_id {
        return Err(ApiError::Forbidden(format!("job {job_id} is not this node's")));
    }
    let reported = report.state.expect("validated");
    let now = state.clock.now_ms();
    if reported == JobState::Running {
        state.store.start_backup_job(job_id, now).await?;
        return Ok(());
    }
    let outcome = JobOutcome {
        state: state_text(reported).to_string(),
        snapshot: report.snapshot.clone(),
        files: report.files.map(|v| v.min(i64::MAX as u64) as i64),
        bytes: report.bytes.map(|v| v.min(i64::MAX as u64) as i64),
        added_bytes: report.added_bytes.map(|v| v.min(i64::MAX as u64) as i64),
        duration_ms: report.duration_ms.map(|v| v.min(i64::MAX as u64) as i64),
        counts: report.counts.as_ref().map(|c| serde_json::to_string(c).expect("counts serialize")),
        detail: report.detail.clone(),
        message: report.message.clone(),
        pruned: report.pruned,
        kept_state: (reported == JobState::Succeeded && job.kind == "restore").then(|| SETTLING.to_string()),
        // A verification's finding lands on its backup in the same write.
        verified: (job.kind == "verify").then_some(job.of_job.clone()).flatten().map(|backup_id| {
            let passed = reported == JobState::Succeeded;
            crate::store::Verified {
                backup_id,
                state: if passed { "passed" } else { "failed" }.to_string(),
                detail: if passed { report.detail.clone() } else { report.message.clone().or(report.detail.clone()) },
            }
        }),
    };
    if reported == JobState::Succeeded && job.kind == "backup" && report.snapshot.is_none() {
        return Err(ApiError::BadRequest("a successful backup names its snapshot".into()));
    }
    if !state.store.finish_backup_job(job_id, &outcome, &[], now).await? {
        // Ended already: cancelled or failed by the watcher (the node's
        // word comes too late), or this is a retried report of a restore
        // whose last step did not run to its end.
        if job.kind == "restore" && job.kept_state.as_deref() == Some(SETTLING) {
            after_restore(state, &job).await?;
        }
        return Ok(());
    }
    let job = state.store.backup_job(job_id).await?.unwrap_or(job);
    match (job.kind.as_str(), reported) {
        ("backup", JobState::Succeeded) => {
            tracing::info!(job = %job.id, target = %job.target, snapshot = ?job.snapshot, bytes = ?job.bytes, "backup done");
        }
        ("backup", _) => {
            tracing::warn!(job = %job.id, target = %job.target, state = %job.state, message = ?job.message, "backup did not succeed");
        }
        ("verify", _) => {
            let passed = reported == JobState::Succeeded;
            let detail = if passed { job.detail.clone() } else { job.message.clone().or(job.detail.clone()) };
            if passed {
                tracing::info!(job = %job.id, backup = ?job.of_job, detail = ?detail, "backup verified");
            } else {
                tracing::warn!(job = %job.id, backup = ?job.of_job, detail = ?detail, "backup verification failed");
            }
        }
        ("restore", JobState::Succeeded) => {
            after_restore(state, &job).await?;
            tracing::info!(job = %job.id, target = %job.target, "restore done");
        }
        ("restore", _) => {
            tracing::warn!(job = %job.id, target = %job.target, message = ?job.message, "restore did not succeed; the data it would have replaced is untouched");
        }
        _ => {}
    }
    Ok(())
}

/// Ends an unfinished job from the control plane's side and tells its node
/// to stop it (if it ever comes back).
async fn give_up(state: &AppState, job: &BackupJobRow, reason: &str) -> Result<(), ApiError> {
    let now = state.clock.now_ms();
    let cancel = command(state, &job.node_id, CommandKind::BackupCancel, &BackupCancelPayload { job_id: job.id.clone(), reason: Some(reason.to_string()) });
    let outcome = JobOutcome { state: "failed".into(), message: Some(reason.to_string()), ..JobOutcome::default() };
    if state.store.finish_backup_job(&job.id, &outcome, &[cancel], now).await? {
        state.hub.notify(&job.node_id, cloudweb_protocol::events::COMMANDS);
        tracing::warn!(job = %job.id, target = %job.target, reason, "backup job given up");
    }
    Ok(())
}

/// Cancels the unfinished jobs of a target (its service or volume is being
/// deleted): they end `cancelled` and their node stops them.
pub async fn cancel_jobs_of(state: &AppState, target: &Target, reason: &str) -> Result<(), ApiError> {
    for job in state.store.backup_jobs_of(&target.key(), None, 20).await? {
        cancel_job(state, &job, reason).await?;
    }
    Ok(())
}

/// A scheduled backup that could not even be queued is recorded as a
/// failed job, so it shows and alerts.
async fn record_refusal(state: &AppState, target: &Target, destination: &str, trigger: &str, attempt: i64, reason: &str) -> Result<(), ApiError> {
    let now = state.clock.now_ms();
    let row = BackupJobRow {
        id: super::new_job_id(),
        kind: "backup".into(),
        target: target.key(),
        destination: destination.to_string(),
        node_id: String::new(),
        state: "queued".into(),
        trigger: trigger.into(),
        attempt,
        created_at: now,
        deadline: now,
        ..BackupJobRow::default()
    };
    if state.store.insert_backup_job(&row, None, now).await?.is_ok() {
        let outcome = JobOutcome { state: "failed".into(), message: Some(reason.to_string()), ..JobOutcome::default() };
        state.store.finish_backup_job(&row.id, &outcome, &[], now).await?;
    }
    Ok(())
}

/// The wait before retry number `attempt` (the first retry is attempt 2).
fn retry_wait_ms(state: &AppState, attempt: i64) -> i64 {
    backoff_ms(state.config.backups.retry_after.as_millis() as i64, attempt)
}

/// `base`, then four times longer for each later retry.
fn backoff_ms(base: i64, attempt: i64) -> i64 {
    base.saturating_mul(4i64.saturating_pow((attempt - 2).clamp(0, 8) as u32))
}

/// Deadlines, nodes gone away, a restore's last step and its kept data's
/// end, for one watched job.
async fn watch_job(state: &AppState, job: &BackupJobRow, now: i64, instant: tokio::time::Instant) -> Result<(), ApiError> {
    if matches!(job.state.as_str(), "queued" | "running") {
        if job.node_id.is_empty() || job.node_id == super::CONTROL_PLANE_TARGET {
            return Ok(());
        }
        if now > job.deadline {
            return give_up(state, job, "the job ran over its time limit").await;
        }
        let gone = match state.nodes.get(&job.node_id) {
            None => true,
            Some(node) => node.state(instant, state.config.unreachable_after) == crate::live::NodeState::Unreachable,
        };
        if gone {
            give_up(state, job, &format!("node {} went away during the job", job.node_id)).await?;
        }
    } else if job.kept_state.as_deref() == Some(SETTLING) {
        after_restore(state, job).await?;
    } else if job.kept_state.as_deref() == Some("kept") && job.keep_until.is_some_and(|until| until <= now) {
        purge_kept(state, job).await?;
    }
    Ok(())
}

/// One pass of the watcher.
pub async fn tick(state: &AppState) -> Result<(), ApiError> {
    let now = state.clock.now_ms();
    let instant = tokio::time::Instant::now();
    // Unfinished jobs: deadlines and nodes that went away; kept data. One
    // job's failure here is logged and holds up neither the others nor the
    // schedules below.
    for job in state.store.backup_jobs_to_watch().await? {
        if let Err(err) = watch_job(state, &job, now, instant).await {
            tracing::warn!(job = %job.id, target = %job.target, error = %err, "backup job not moved on; trying again next pass");
        }
    }
    // Major version upgrades move on with their jobs.
    super::upgrade::drive(state).await?;
    let destinations = state.store.destinations().await?;
    if destinations.is_empty() {
        return Ok(());
    }
    let plans: HashMap<String, crate::store::PlanRow> = state.store.backup_plans().await?.into_iter().map(|p| (p.target.clone(), p)).collect();
    let latest: HashMap<(String, String), BackupJobRow> =
        state.store.latest_backup_jobs().await?.into_iter().map(|j| ((j.target.clone(), j.kind.clone()), j)).collect();
    let good: HashMap<String, BackupJobRow> = state.store.latest_good_backups().await?.into_iter().map(|j| (j.target.clone(), j)).collect();
    let first_destination = destinations.iter().map(|d| d.created_at).min().unwrap_or(now);
    for (target, created) in all_targets(state).await? {
        let key = target.key();
        let plan = effective_plan(&target, plans.get(&key), &super::team_destinations(state, &target, &destinations).await?);
        let Some(destination) = plan.destination.clone().filter(|_| plan.enabled) else { continue };
        let newest = latest.get(&(key.clone(), "backup".to_string()));
        let unfinished = newest.is_some_and(|j| matches!(j.state.as_str(), "queued" | "running"));
        // A retry of a failed scheduled backup, with back-off.
        if let Some(failed) = newest.filter(|j| j.state == "failed" && !matches!(j.trigger.as_str(), "manual" | "upgrade") && j.attempt <= MAX_RETRIES) {
            let next = failed.attempt + 1;
            if now >= failed.finished_at.unwrap_or(failed.created_at) + retry_wait_ms(state, next) {
                if let Err(err) = queue_backup(state, &target, "retry", next).await {
                    record_refusal(state, &target, &destination, "retry", next, &err.to_string()).await?;
                }
                continue;
            }
        }
        let Ok(schedule) = cron::Schedule::parse(&plan.schedule) else { continue };
        let reference = newest.map(|j| j.created_at).unwrap_or(created.max(first_destination));
        if !unfinished && schedule.next_after(reference).is_some_and(|due| due <= now) {
            if let Err(err) = queue_backup(state, &target, "schedule", 1).await {
                record_refusal(state, &target, &destination, "schedule", 1, &err.to_string()).await?;
            }
            continue;
        }
        // The newest good backup's weekly verification.
        if let (Some(backup), Ok(verify)) = (good.get(&key), cron::Schedule::parse(&plan.verify_schedule)) {
            let last_verify = latest.get(&(key.clone(), "verify".to_string()));
            let busy = last_verify.is_some_and(|j| matches!(j.state.as_str(), "queued" | "running"));
            let reference = last_verify.map(|j| j.created_at).unwrap_or(backup.finished_at.unwrap_or(backup.created_at));
            if !busy && verify.next_after(reference).is_some_and(|due| due <= now) {
                if let Err(err) = queue_verify(state, backup, "schedule").await {
                    tracing::warn!(target = %key, error = %err, "cannot verify the newest backup");
                }
            }
        }
    }
    Ok(())
}

/// Runs [`tick`] every `config.backups.tick` until the task is aborted.
pub async fn watcher(state: Arc<AppState>) {
    let mut every = tokio::time::interval(state.config.backups.tick);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        if let Err(err) = tick(&state).await {
            tracing::warn!(error = %err, "backup watcher pass failed");
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn retries_wait_four_times_longer_each_time() {
        let minute = 60_000;
        let waits: Vec<i64> = (2..=4).map(|attempt| super::backoff_ms(minute, attempt)).collect();
        assert_eq!(waits, vec![minute, 4 * minute, 16 * minute]);
        assert_eq!(super::backoff_ms(i64::MAX / 2, 10), i64::MAX, "no overflow");
    }
}
