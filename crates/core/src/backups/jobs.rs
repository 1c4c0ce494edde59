//! Queuing backup and verification jobs, and showing jobs.

use std::collections::BTreeMap;

use cloudweb_api_types::backups::{BackupJobView, VerificationView};
use cloudweb_protocol::{BackupCancelPayload, BackupJobPayload, BackupSource, CommandKind, Expected, ServiceKind, VerifyPayload};

use super::{locate, new_job_id, repository, retention, Target, JOB_TIMEOUT_SECONDS, VERIFY_READ_PERCENT, VERIFY_TIMEOUT_SECONDS};
use crate::clock::rfc3339_ms;
use crate::error::ApiError;
use crate::store::{BackupJobRow, DestinationRow, JobOutcome, JobRefusal, NewCommand};
use crate::AppState;

/// How often a target's retention runs at most.
const PRUNE_EVERY_MS: i64 = 20 * 3600 * 1000;

/// Slack past a job's own limit before the control plane gives up on it.
const DEADLINE_SLACK_MS: i64 = 5 * 60 * 1000;

pub(crate) fn command(state: &AppState, node_id: &str, kind: CommandKind, payload: &impl serde::Serialize) -> NewCommand {
    NewCommand {
        node_id: node_id.to_string(),
        kind: kind.as_str().to_string(),
        payload: state.sealer.seal_json(&crate::command_context(node_id), &serde_json::to_value(payload).expect("payload serializes")),
    }
}

/// The password variable a service's tools read, with its value.
pub(crate) fn exec_env(state: &AppState, service: &crate::store::ServiceRow) -> Result<BTreeMap<String, String>, ApiError> {
    let secret = crate::service_links::secret(state, service)?;
    let kind = crate::service_links::kind_of(service)?;
    let name = match kind {
        ServiceKind::Postgres => "PGPASSWORD",
        ServiceKind::Mariadb => "MYSQL_PWD",
        ServiceKind::Redis => "REDISCLI_AUTH",
    };
    Ok(BTreeMap::from([(name.to_string(), secret.password)]))
}

pub(crate) async fn destination_of(state: &AppState, name: Option<&str>) -> Result<DestinationRow, ApiError> {
    let Some(name) = name else {
        return Err(ApiError::Conflict("no backup destination is set up: add one first (cloudweb backups destinations add)".into()));
    };
    state.store.destination(name).await?.ok_or_else(|| ApiError::NotFound(format!("no backup destination named {name}")))
}

/// The node of a job is reachable now (else the job would sit queued).
fn node_ready(state: &AppState, node_id: &str) -> Result<(), ApiError> {
    let now = tokio::time::Instant::now();
    let node = state.nodes.get(node_id).ok_or_else(|| ApiError::Conflict(format!("node {node_id} is not registered")))?;
    if node.state(now, state.config.unreachable_after) == crate::live::NodeState::Unreachable {
        return Err(ApiError::Conflict(format!("node {} ({node_id}) that holds the data is unreachable", node.name)));
    }
    if !node.has_feature(now, cloudweb_protocol::features::BACKUPS) {
        return Err(ApiError::Conflict(format!("node {} ({node_id}) runs an agent that cannot back up; upgrade it", node.name)));
    }
    Ok(())
}

fn busy(refusal: JobRefusal, what: &str, target: &Target) -> ApiError {
    match refusal {
        JobRefusal::Busy(id) => ApiError::Conflict(format!("a {what} of {} is unfinished already: {id}", target.key())),
    }
}

/// Queues a backup of `target` (`trigger`: `manual`, `schedule`,
/// `retry`, or `upgrade` before a major version upgrade).
pub async fn queue_backup(state: &AppState, target: &Target, trigger: &str, attempt: i64) -> Result<BackupJobRow, ApiError> {
    let plan = super::plan(state, target).await?;
    let destination = destination_of(state, plan.destination.as_deref()).await?;
    let located = locate(state, target, plan.pause).await?;
    node_ready(state, &located.node_id)?;
    let exec_env = match &located.service {
        Some(service) => exec_env(state, service)?,
        None => BTreeMap::new(),
    };
    let now = state.clock.now_ms();
    let id = new_job_id();
    // Retention (forget --prune, which rewrites pack files) runs with the
    // first successful backup of a day, not after every one: the daily,
    // weekly and monthly buckets need no more, and a prune costs more than
    // a small backup.
    let recent = state.store.backup_jobs_of(&target.key(), Some("backup"), 50).await?;
    let pruned_lately = recent.iter().any(|j| j.pruned == Some(true) && j.destination == destination.name && j.finished_at.is_some_and(|at| now - at < PRUNE_EVERY_MS));
    let payload = BackupJobPayload {
        job_id: id.clone(),
        source: located.source.clone(),
        repository: repository(state, &destination, "data")?,
        tags: vec!["cloudweb".into()],
        retention: (!pruned_lately).then(|| retention(&destination)),
        exec_env,
        timeout_seconds: JOB_TIMEOUT_SECONDS,
    };
    payload.validate().map_err(|e| ApiError::Internal(format!("backup payload: {e}")))?;
    let row = BackupJobRow {
        id: id.clone(),
        kind: "backup".into(),
        target: target.key(),
        destination: destination.name.clone(),
        node_id: located.node_id.clone(),
        state: "queued".into(),
        trigger: trigger.into(),
        attempt,
        created_at: now,
        deadline: now + i64::from(JOB_TIMEOUT_SECONDS) * 1000 + DEADLINE_SLACK_MS,
        ..BackupJobRow::default()
    };
    let command = command(state, &located.node_id, CommandKind::BackupRun, &payload);
    state.store.insert_backup_job(&row, Some(&command), now).await?.map_err(|r| busy(r, "backup", target))?;
    state.hub.notify(&located.node_id, cloudweb_protocol::events::COMMANDS);
    tracing::info!(job = %id, target = %target.key(), node_id = %located.node_id, destination = %destination.name, trigger, "backup queued");
    Ok(row)
}

/// `cloudweb backups run`: a backup now.
pub async fn run_now(state: &AppState, target: &Target) -> Result<BackupJobRow, ApiError> {
    queue_backup(state, target, "manual", 1).await
}

/// The node a verification runs on: the data's node (it holds the image
/// and has had room for the data), or when it is away, the ready node
/// with the most free disk that can back up.
fn verify_node(state: &AppState, preferred: &str) -> Result<String, ApiError> {
    if node_ready(state, preferred).is_ok() {
        return Ok(preferred.to_string());
    }
    let now = tokio::time::Instant::now();
    let mut best: Option<(u64, String)> = None;
    for node in state.nodes.all() {
        if node_ready(state, &node.id).is_err() || node.draining || !node.has_feature(now, cloudweb_protocol::features::SERVICES) {
            continue;
        }
        let free = match (node.capacity, node.metrics.as_ref().and_then(|m| m.value.node.as_ref()).and_then(|n| n.disk_used)) {
            (Some(capacity), Some(used)) => capacity.disk_bytes.saturating_sub(used),
            (Some(capacity), None) => capacity.disk_bytes,
            _ => 0,
        };
        if best.as_ref().is_none_or(|(most, _)| free > *most) {
            best = Some((free, node.id.clone()));
        }
    }
    best.map(|(_, id)| id).ok_or_else(|| ApiError::Conflict("no ready node can verify the backup".into()))
}

/// Queues a verification of backup job `backup` (its snapshot restored
/// into a throwaway place and checked).
pub async fn queue_verify(state: &AppState, backup: &BackupJobRow, trigger: &str) -> Result<BackupJobRow, ApiError> {
    let target = Target::parse(&backup.target).ok_or_else(|| ApiError::BadRequest(format!("{} cannot be verified", backup.target)))?;
    if backup.kind != "backup" || backup.state != "succeeded" {
        return Err(ApiError::Conflict(format!("job {} is not a successful backup", backup.id)));
    }
    let snapshot = backup.snapshot.clone().ok_or_else(|| ApiError::Conflict(format!("backup {} has no snapshot", backup.id)))?;
    let destination = destination_of(state, Some(&backup.destination)).await?;
    let located = locate(state, &target, false).await;
    // The target may be gone (its backups stay verifiable); its source is
    // rebuilt from the backup's record then.
    let (node_hint, source, image) = match (located, &target) {
        (Ok(located), _) => (located.node_id.clone(), located.source.clone(), located.service.as_ref().map(|s| s.image.clone())),
        (Err(_), Target::Volume(name)) => (backup.node_id.clone(), BackupSource::Volume { volume: name.clone(), pause: false }, None),
        (Err(err), Target::Service(_)) => return Err(err),
    };
    let node_id = verify_node(state, &node_hint)?;
    let now = state.clock.now_ms();
    let id = new_job_id();
    let expected = match (&source, backup.files, backup.bytes) {
        (BackupSource::Volume { .. }, Some(files), Some(bytes)) => Some(Expected { files: files.max(0) as u64, bytes: bytes.max(0) as u64 }),
        _ => None,
    };
    let payload = VerifyPayload {
        job_id: id.clone(),
        snapshot: snapshot.clone(),
        source,
        repository: repository(state, &destination, "data")?,
        image,
        expected,
        read_data_percent: VERIFY_READ_PERCENT,
        timeout_seconds: VERIFY_TIMEOUT_SECONDS,
    };
    payload.validate().map_err(|e| ApiError::Internal(format!("verify payload: {e}")))?;
    let row = BackupJobRow {
        id: id.clone(),
        kind: "verify".into(),
        target: backup.target.clone(),
        destination: destination.name.clone(),
        node_id: node_id.clone(),
        state: "queued".into(),
        trigger: trigger.into(),
        attempt: 1,
        of_job: Some(backup.id.clone()),
        snapshot: Some(snapshot),
        created_at: now,
        deadline: now + i64::from(VERIFY_TIMEOUT_SECONDS) * 1000 + DEADLINE_SLACK_MS,
        ..BackupJobRow::default()
    };
    let command = command(state, &node_id, CommandKind::BackupVerify, &payload);
    state.store.insert_backup_job(&row, Some(&command), now).await?.map_err(|r| busy(r, "verification", &target))?;
    state.hub.notify(&node_id, cloudweb_protocol::events::COMMANDS);
    tracing::info!(job = %id, backup = %backup.id, target = %backup.target, node_id = %node_id, trigger, "verification queued");
    Ok(row)
}

/// `cloudweb backups verify`: verify backup `backup_id` now.
pub async fn verify_now(state: &AppState, backup_id: &str) -> Result<BackupJobRow, ApiError> {
    let backup = state.store.backup_job(backup_id).await?.ok_or_else(|| ApiError::NotFound(format!("no backup {backup_id}")))?;
    queue_verify(state, &backup, "manual").await
}

pub async fn jobs_of(state: &AppState, target: &Target) -> Result<Vec<BackupJobRow>, ApiError> {
    Ok(state.store.backup_jobs_of(&target.key(), None, 100).await?)
}

pub fn job_view(job: &BackupJobRow) -> BackupJobView {
    BackupJobView {
        id: job.id.clone(),
        kind: job.kind.clone(),
        target: job.target.clone(),
        destination: job.destination.clone(),
        node_id: job.node_id.clone(),
        state: job.state.clone(),
        trigger: job.trigger.clone(),
        attempt: job.attempt,
        snapshot: job.snapshot.clone(),
        of_backup: job.of_job.clone(),
        files: job.files,
        bytes: job.bytes,
        added_bytes: job.added_bytes,
        duration_ms: job.duration_ms,
        counts: job.counts.as_deref().and_then(|c| serde_json::from_str(c).ok()),
        detail: job.detail.clone(),
        message: job.message.clone(),
        pruned: job.pruned,
        verification: match (&job.verify_state, &job.verify_job, job.verified_at) {
            (Some(state), Some(verify), Some(at)) => {
                Some(VerificationView { state: state.clone(), job: verify.clone(), at: rfc3339_ms(at), detail: job.verify_detail.clone() })
            }
            _ => None,
        },
        restore_to: job.restore_to.clone(),
        kept_volume: job.kept_volume.clone(),
        kept_state: job.kept_state.clone(),
        keep_until: job.keep_until.map(rfc3339_ms),
        created_at: rfc3339_ms(job.created_at),
        started_at: job.started_at.map(rfc3339_ms),
        finished_at: job.finished_at.map(rfc3339_ms),
    }
}

/// Ends `job` `cancelled` if it is unfinished, and tells its node to stop
/// it.
pub(crate) async fn cancel_job(state: &AppState, job: &BackupJobRow, reason: &str) -> Result<(), ApiError> {
    if !matches!(job.state.as_str(), "queued" | "running") {
        return Ok(());
    }
    let now = state.clock.now_ms();
    let cancel = command(state, &job.node_id, CommandKind::BackupCancel, &BackupCancelPayload { job_id: job.id.clone(), reason: Some(reason.to_string()) });
    let outcome = JobOutcome { state: "cancelled".into(), message: Some(reason.to_string()), ..JobOutcome::default() };
    if state.store.finish_backup_job(&job.id, &outcome, &[cancel], now).await? {
        state.hub.notify(&job.node_id, cloudweb_protocol::events::COMMANDS);
        tracing::info!(job = %job.id, target = %job.target, reason, "backup job cancelled");
    }
    Ok(())
}
