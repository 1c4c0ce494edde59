//! Restores: a backup back into its own service or volume (the data it
//! replaces kept as a volume of its own), or into a new service or volume
//! of another name, on any node.

use cloudweb_protocol::{BackupSource, CommandKind, Replace, RestorePayload};

use super::jobs::{command, destination_of};
use super::{locate, new_job_id, repository, Target, JOB_TIMEOUT_SECONDS};
use crate::error::ApiError;
use crate::services::NewService;
use crate::store::{BackupJobRow, JobRefusal};
use crate::AppState;

/// `<volume>-before-restore-<UTC time>`, cut to a volume name's 63
/// characters.
fn kept_name(volume: &str, now_ms: i64) -> String {
    let at = time::OffsetDateTime::from_unix_timestamp(now_ms / 1000).unwrap_or(time::OffsetDateTime::UNIX_EPOCH);
    let stamp = format!("{:04}{:02}{:02}t{:02}{:02}{:02}", at.year(), u8::from(at.month()), at.day(), at.hour(), at.minute(), at.second());
    let suffix = format!("-before-restore-{stamp}");
    let mut base = volume.to_string();
    base.truncate(63 - suffix.len());
    format!("{}{suffix}", base.trim_end_matches('-'))
}

/// Starts restoring backup `backup_id`: into its own target when `to` is
/// `None`, else into a new service (or volume) named `to`, on `node` when
/// given.
pub async fn restore(state: &AppState, backup_id: &str, to: Option<&str>, node: Option<&str>) -> Result<BackupJobRow, ApiError> {
    restore_into(state, backup_id, to, node, None).await
}

/// A major version upgrade's restore: the new service runs `version`
/// rather than its source's, and one of its name made since `since_ms`
/// (by an earlier pass of the same upgrade, cut off before it recorded
/// its restore) is restored into rather than refused.
#[derive(Debug, Clone, Copy)]
pub(crate) struct NewVersion<'a> {
    pub version: &'a str,
    pub since_ms: i64,
}

/// [`restore`], into a new service `to` of another version: a major
/// version upgrade.
pub(crate) async fn restore_into(state: &AppState, backup_id: &str, to: Option<&str>, node: Option<&str>, upgrade: Option<NewVersion<'_>>) -> Result<BackupJobRow, ApiError> {
    let version = upgrade.map(|u| u.version);
    let backup = state.store.backup_job(backup_id).await?.ok_or_else(|| ApiError::NotFound(format!("no backup {backup_id}")))?;
    if backup.kind != "backup" || backup.state != "succeeded" {
        return Err(ApiError::Conflict(format!("job {backup_id} is not a successful backup")));
    }
    let snapshot = backup.snapshot.clone().ok_or_else(|| ApiError::Conflict(format!("backup {backup_id} has no snapshot")))?;
    let target = Target::parse(&backup.target).ok_or_else(|| ApiError::Conflict(format!("{} cannot be restored this way", backup.target)))?;
    let destination = destination_of(state, Some(&backup.destination)).await?;
    if node.is_some() && to.is_none() {
        return Err(ApiError::BadRequest("node goes with to: a restore in place stays on the data's node".into()));
    }
    let now = state.clock.now_ms();
    let id = new_job_id();
    let (job_target, node_id, source, into_volume, replace, service) = match (&target, to) {
        (Target::Service(_), None) => {
            let located = locate(state, &target, false).await?;
            let service = located.service.expect("a service target has its row");
            let keep_as = kept_name(&service.volume, now);
            let spec = crate::services::payload(state, &service)?;
            (target.clone(), service.node_id.clone(), located.source, service.volume.clone(), Some(Replace { volume: service.volume.clone(), keep_as }), Some(spec))
        }
        (Target::Service(name), Some(new_name)) => {
            cloudweb_protocol::validate::node_name("to", new_name).map_err(|e| ApiError::BadRequest(e.to_string()))?;
            let made_by_upgrade = match state.store.service(new_name).await? {
                Some(row) if upgrade.is_some_and(|u| row.created_at >= u.since_ms && row.version.as_deref() == Some(u.version)) => Some(row),
                Some(_) => {
                    return Err(ApiError::Conflict(format!("a service named {new_name} exists already; restore into a new name, or into {new_name} itself from its own backups")))
                }
                None => None,
            };
            let source_row = state.store.service(name).await?;
            let kind = match &source_row {
                Some(row) => crate::service_links::kind_of(row)?,
                None => return Err(ApiError::Conflict(format!("service {name} no longer exists, so its kind and version are unknown; create {new_name} yourself and restore into it"))),
            };
            let new = NewService {
                name: new_name.to_string(),
                kind,
                version: version.map(str::to_string).or_else(|| source_row.as_ref().and_then(|r| r.version.clone())),
                node: node.map(str::to_string),
                memory_bytes: source_row.as_ref().and_then(|r| r.memory_bytes).map(|m| m.max(0) as u64),
                team_id: source_row.as_ref().map(|r| r.team_id.clone()).unwrap_or_else(|| destination.team_id.clone()),
            };
            // Nobody else can make a service of the name an unfinished
            // upgrade restores into (`services::create` refuses it), so
            // one found is this upgrade's own.
            let created = match (made_by_upgrade, upgrade) {
                (Some(row), _) => row,
                (None, Some(_)) => crate::services::create_unreserved(state, new).await?,
                (None, None) => crate::services::create(state, new).await?,
            };
            let spec = crate::services::payload(state, &created)?;
            let source = BackupSource::Service {
                service: name.clone(),
                service_kind: kind,
                volume: created.volume.clone(),
                user: crate::service_links::USER.to_string(),
                database: crate::service_links::DATABASE.to_string(),
            };
            let keep_as = kept_name(&created.volume, now);
            (Target::Service(new_name.to_string()), created.node_id.clone(), source, created.volume.clone(), Some(Replace { volume: created.volume.clone(), keep_as }), Some(spec))
        }
        (Target::Volume(_), None) => {
            let located = locate(state, &target, false).await?;
            let volume = target.name().to_string();
            let keep_as = kept_name(&volume, now);
            (target.clone(), located.node_id, located.source, volume.clone(), Some(Replace { volume, keep_as }), None)
        }
        (Target::Volume(name), Some(new_name)) => {
            cloudweb_protocol::volumes::name(new_name).map_err(|e| ApiError::BadRequest(e.to_string()))?;
            if state.store.volume(new_name).await?.is_some() {
                return Err(ApiError::Conflict(format!("a volume named {new_name} exists already")));
            }
            let node_id = match node {
                Some(wanted) => state
                    .nodes
                    .all()
                    .into_iter()
                    .find(|n| n.id == wanted || n.name == wanted)
                    .map(|n| n.id)
                    .ok_or_else(|| ApiError::NotFound(format!("no node named {wanted}")))?,
                None => match state.store.volume(name).await?.and_then(|v| v.node_id) {
                    Some(node) => node,
                    None => backup.node_id.clone(),
                },
            };
            (Target::Volume(new_name.to_string()), node_id, BackupSource::Volume { volume: name.clone(), pause: false }, new_name.to_string(), None, None)
        }
    };
    let payload = RestorePayload {
        job_id: id.clone(),
        snapshot: snapshot.clone(),
        source,
        repository: repository(state, &destination, "data")?,
        into_volume,
        replace: replace.clone(),
        service,
        timeout_seconds: JOB_TIMEOUT_SECONDS,
    };
    payload.validate().map_err(|e| ApiError::Internal(format!("restore payload: {e}")))?;
    let row = BackupJobRow {
        id: id.clone(),
        kind: "restore".into(),
        target: job_target.key(),
        destination: destination.name.clone(),
        node_id: node_id.clone(),
        state: "queued".into(),
        trigger: "manual".into(),
        attempt: 1,
        of_job: Some(backup.id.clone()),
        snapshot: Some(snapshot),
        restore_to: to.map(str::to_string),
        kept_volume: replace.map(|r| r.keep_as),
        created_at: now,
        deadline: now + i64::from(JOB_TIMEOUT_SECONDS) * 1000 + 5 * 60 * 1000,
        ..BackupJobRow::default()
    };
    let command = command(state, &node_id, CommandKind::BackupRestore, &payload);
    match state.store.insert_backup_job(&row, Some(&command), now).await? {
        Ok(()) => {}
        Err(JobRefusal::Busy(other)) => return Err(ApiError::Conflict(format!("a restore of {} is unfinished already: {other}", job_target.key()))),
    }
    state.hub.notify(&node_id, cloudweb_protocol::events::COMMANDS);
    tracing::info!(job = %id, backup = %backup.id, target = %job_target.key(), node_id = %node_id, "restore queued");
    Ok(row)
}

/// After a successful restore: the replaced data becomes a volume of its
/// own, kept for the keep period (or, for a service this restore created,
/// whose replaced data is only its empty first start, deleted now).
///
/// The job was ended `succeeded` with its kept state `settling` in one
/// write; this moves it on, and is run again (by a retried report or the
/// watcher) until it has, so a failure here is never forgotten. Every step
/// may run twice.
pub(crate) async fn after_restore(state: &AppState, job: &BackupJobRow) -> Result<(), ApiError> {
    if job.kept_state.as_deref() != Some(SETTLING) {
        return Ok(());
    }
    let now = state.clock.now_ms();
    match (&job.kept_volume, &job.restore_to) {
        (Some(kept), restore_to) => {
            // A new service's replaced data is only its empty first start,
            // made by this request: due at once. Otherwise the keep period.
            let until = if restore_to.is_some() { now } else { now + state.config.backups.keep_restored.as_millis() as i64 };
            if !state.store.settle_kept_volume(&job.id, kept, &job.node_id, until, now).await? {
                return Ok(());
            }
            if restore_to.is_some() {
                let settled = BackupJobRow { kept_state: Some("kept".into()), keep_until: Some(until), ..job.clone() };
                // The watcher tries again if this fails.
                purge_kept(state, &settled).await?;
            } else {
                tracing::info!(job = %job.id, kept = %kept, "restore done; the data it replaced is kept as a volume of its own");
            }
        }
        (None, Some(new_volume)) => {
            state.store.settle_new_volume(&job.id, new_volume, &job.node_id, now).await?;
        }
        (None, None) => {
            state.store.set_kept_state(&job.id, Some(SETTLING), None, None, None, now).await?;
        }
    }
    Ok(())
}

/// A successful restore whose replaced data the control plane has not yet
/// recorded.
pub(crate) const SETTLING: &str = "settling";

/// `cloudweb backups confirm-restore`: the restore is good; the data it
/// replaced is deleted now.
pub async fn confirm_restore(state: &AppState, job_id: &str) -> Result<BackupJobRow, ApiError> {
    let job = state.store.backup_job(job_id).await?.ok_or_else(|| ApiError::NotFound(format!("no restore {job_id}")))?;
    if job.kind != "restore" {
        return Err(ApiError::BadRequest(format!("job {job_id} is not a restore")));
    }
    if job.kept_state.as_deref() != Some("kept") {
        return Err(ApiError::Conflict(format!("restore {job_id} keeps no replaced data ({})", job.kept_state.as_deref().unwrap_or(&job.state))));
    }
    purge_kept(state, &job).await?;
    Ok(state.store.backup_job(job_id).await?.unwrap_or(job))
}

pub(crate) async fn purge_kept(state: &AppState, job: &BackupJobRow) -> Result<(), ApiError> {
    let Some(kept) = &job.kept_volume else { return Ok(()) };
    let now = state.clock.now_ms();
    match crate::volumes::delete(state, kept).await {
        Ok(_) | Err(ApiError::NotFound(_)) => {}
        Err(err) => return Err(err),
    }
    state.store.set_kept_state(&job.id, Some("kept"), Some("purged"), None, None, now).await?;
    tracing::info!(job = %job.id, kept = %kept, "a restore's replaced data deleted");
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn kept_names_are_volume_names() {
        let name = super::kept_name("svc-db", 1_764_640_000_000);
        assert_eq!(name, "svc-db-before-restore-20251202t014640");
        cloudweb_protocol::volumes::name(&name).unwrap();
        let long = super::kept_name(&"a".repeat(63), 0);
        assert!(long.len() <= 63);
        cloudweb_protocol::volumes::name(&long).unwrap();
    }
}
