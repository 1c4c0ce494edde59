//! The control plane's own backups, and a new control plane rebuilt from
//! one (disaster recovery).
//!
//! - Every `--control-plane-backup-minutes` (and on demand), for each
//!   destination: an online snapshot of the state database (`VACUUM INTO`,
//!   never a copy of the live file), the cluster CA, the listener's
//!   certificate and key, the master key, the admin token file and the
//!   nodes' registry credentials are gathered in a private directory
//!   (0700, in the data dir, removed after) and backed up with restic into
//!   the destination's `control-plane` repository, tagged `cloudweb` and
//!   `control-plane`. Only after a success, `forget --prune` keeps 24
//!   hourly and 7 daily snapshots. Each run is a `backup_jobs` row of
//!   target `control-plane` run by the control plane itself (node
//!   `control-plane`), so the status, the alerts and `/metrics` show it.
//!   The registry's image blobs are not backed up: they are rebuilt or
//!   pushed again.
//! - [`restore`] is `cloudweb-server restore`: it opens the repository
//!   with the recovery key before it creates anything (a wrong key writes
//!   nothing), refuses a data dir that holds a cluster already, restores
//!   the snapshot beside the data dir, checks it is complete and that the
//!   database passes `PRAGMA integrity_check`, fails what was in flight
//!   when the backup was taken (deployments, backup jobs: not resumed
//!   blind), and only then moves the files into the data dir.
//!
//! Invariant: the recovery key is never written next to the backup; it
//! is the destination's password, sealed in the state and shown once in
//! the recovery kit.

use std::collections::HashSet;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cloudweb_protocol::Repository;
use cloudweb_restic::{Restic, ResticError, Snapshot};
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

use super::{cache_dir, new_job_id, repository, CONTROL_PLANE_TARGET};
use crate::error::ApiError;
use crate::store::{BackupJobRow, DestinationRow, JobOutcome, JobRefusal, Store, DATABASE_FILE};
use crate::AppState;

/// The tags of every control-plane snapshot.
pub const TAGS: [&str; 2] = ["cloudweb", "control-plane"];
/// What `forget --prune` keeps after each success.
pub const KEEP_HOURLY: u32 = 24;
pub const KEEP_DAILY: u32 = 7;
/// The file in each snapshot that says what it is; not restored into the
/// data dir.
pub const MANIFEST_FILE: &str = "cloudweb-control-plane.json";
/// The files of the data dir that are backed up, besides the database and
/// the registry credentials.
pub const FILES: [&str; 6] = [
    crate::ca::CA_CERT_FILE,
    crate::ca::CA_KEY_FILE,
    crate::ca::LISTENER_CERT_FILE,
    crate::ca::LISTENER_KEY_FILE,
    crate::secrets::MASTER_KEY_FILE,
    crate::ADMIN_TOKEN_FILE,
];
/// The files without which a restored data dir is not this cluster: the
/// database, the CA (the agents' pin), the listener key (its public-key
/// pin) and the master key (every sealed secret).
pub const REQUIRED: [&str; 4] = [DATABASE_FILE, crate::ca::CA_KEY_FILE, crate::ca::LISTENER_KEY_FILE, crate::secrets::MASTER_KEY_FILE];
/// The gathering place of a backup, in the data dir.
const STAGING_DIR: &str = "control-plane-backup.tmp";
/// Where the registry's per-node credentials live in the data dir.
const REGISTRY_DIR: &str = "registry";
const REGISTRY_FILES: [&str; 2] = ["nodes", "htpasswd"];
/// Each restic run's time bound.
const RESTIC_LIMIT: Duration = Duration::from_secs(30 * 60);
/// The deadline written on a job row (the watcher skips these rows; the
/// store wants one).
const JOB_DEADLINE_MS: i64 = 2 * 30 * 60 * 1000;

/// What a snapshot says about itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub format: u32,
    pub server_version: String,
    pub created_at: String,
    /// The `--public-url` agents dial: the restored control plane must be
    /// started with it.
    pub public_url: String,
    pub base_domain: String,
}

/// Data dirs with a control-plane backup under way in this process (one
/// at a time: they share the staging directory and the target's row).
static RUNNING: Mutex<Option<HashSet<PathBuf>>> = Mutex::new(None);

struct Running(PathBuf);

impl Running {
    fn claim(data_dir: &Path) -> Option<Running> {
        let mut running = RUNNING.lock().expect("running lock");
        running.get_or_insert_with(HashSet::new).insert(data_dir.to_path_buf()).then(|| Running(data_dir.to_path_buf()))
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(running) = RUNNING.lock().expect("running lock").as_mut() {
            running.remove(&self.0);
        }
    }
}

fn under_way() -> ApiError {
    ApiError::Conflict("a backup of the control plane is under way already".into())
}

/// Runs the control plane's backups on their schedule until aborted.
pub async fn scheduler(state: Arc<AppState>) {
    if let Err(err) = fail_left_over(&state).await {
        tracing::warn!(error = %err, "cannot end the control-plane backups a stop cut short");
    }
    let mut every = tokio::time::interval(state.config.backups.tick);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        if let Err(err) = run_if_due(&state).await {
            tracing::warn!(error = %err, "control-plane backup pass failed");
        }
    }
}

/// A run cut short by a stop of the control plane stays `running` in the
/// state; it ends failed, so the next run may start.
async fn fail_left_over(state: &AppState) -> Result<(), ApiError> {
    let Some(_running) = Running::claim(&state.config.data_dir) else { return Ok(()) };
    let now = state.clock.now_ms();
    for job in state.store.backup_jobs_of(CONTROL_PLANE_TARGET, Some("backup"), 20).await? {
        if matches!(job.state.as_str(), "queued" | "running") {
            let outcome = JobOutcome { state: "failed".into(), message: Some("the control plane stopped during this backup".into()), ..JobOutcome::default() };
            state.store.finish_backup_job(&job.id, &outcome, &[], now).await?;
        }
    }
    Ok(())
}

/// The wait after the newest run before the next: the schedule after a
/// success, a back-off (capped by the schedule) after a failure.
fn wait_after_ms(state: &AppState, newest: &BackupJobRow) -> i64 {
    let every = state.config.backups.control_plane_every.as_millis() as i64;
    if newest.state != "failed" {
        return every;
    }
    let base = state.config.backups.retry_after.as_millis() as i64;
    base.saturating_mul(4i64.saturating_pow((newest.attempt - 1).clamp(0, 8) as u32)).min(every)
}

async fn run_if_due(state: &Arc<AppState>) -> Result<(), ApiError> {
    let destinations = state.store.destinations().await?;
    if destinations.is_empty() {
        return Ok(());
    }
    let newest = state.store.backup_jobs_of(CONTROL_PLANE_TARGET, Some("backup"), 1).await?.into_iter().next();
    let (trigger, attempt) = match &newest {
        Some(job) if matches!(job.state.as_str(), "queued" | "running") => return Ok(()),
        Some(job) if state.clock.now_ms() < job.created_at + wait_after_ms(state, job) => return Ok(()),
        Some(job) if job.state == "failed" => ("retry", job.attempt + 1),
        _ => ("schedule", 1),
    };
    let Some(running) = Running::claim(&state.config.data_dir) else { return Ok(()) };
    for destination in &destinations {
        let job = begin(state, destination, trigger, attempt).await?;
        work(state, destination, job).await?;
    }
    drop(running);
    Ok(())
}

/// `POST /api/control-plane/backups`: backs the control plane up now to
/// every destination, one after the other. Answers at once with the first
/// destination's job.
pub async fn run_now(state: &Arc<AppState>) -> Result<BackupJobRow, ApiError> {
    let destinations = state.store.destinations().await?;
    if destinations.is_empty() {
        return Err(ApiError::Conflict("no backup destination is set up: add one first (cloudweb backups destinations add)".into()));
    }
    let running = Running::claim(&state.config.data_dir).ok_or_else(under_way)?;
    let first = begin(state, &destinations[0], "manual", 1).await?;
    let (task_state, job) = (state.clone(), first.clone());
    tokio::spawn(async move {
        let _running = running;
        let mut job = Some(job);
        for destination in &destinations {
            let next = match job.take() {
                Some(job) => Ok(job),
                None => begin(&task_state, destination, "manual", 1).await,
            };
            let done = match next {
                Ok(job) => work(&task_state, destination, job).await,
                Err(err) => Err(err),
            };
            if let Err(err) = done {
                tracing::warn!(error = %err, destination = %destination.name, "control-plane backup could not run");
            }
        }
    });
    Ok(first)
}

/// Records the run as a job of the control plane's own.
async fn begin(state: &AppState, destination: &DestinationRow, trigger: &str, attempt: i64) -> Result<BackupJobRow, ApiError> {
    let now = state.clock.now_ms();
    let row = BackupJobRow {
        id: new_job_id(),
        kind: "backup".into(),
        target: CONTROL_PLANE_TARGET.into(),
        destination: destination.name.clone(),
        node_id: CONTROL_PLANE_TARGET.into(),
        state: "queued".into(),
        trigger: trigger.into(),
        attempt,
        created_at: now,
        deadline: now + JOB_DEADLINE_MS,
        ..BackupJobRow::default()
    };
    state.store.insert_backup_job(&row, None, now).await?.map_err(|JobRefusal::Busy(_)| under_way())?;
    state.store.start_backup_job(&row.id, now).await?;
    Ok(BackupJobRow { state: "running".into(), started_at: Some(now), ..row })
}

/// Gathers, backs up and prunes; the job ends with what happened.
async fn work(state: &AppState, destination: &DestinationRow, job: BackupJobRow) -> Result<(), ApiError> {
    let started = std::time::Instant::now();
    let staging = state.config.data_dir.join(STAGING_DIR);
    let result = back_up(state, destination, &staging).await;
    if let Err(err) = std::fs::remove_dir_all(&staging) {
        if err.kind() != std::io::ErrorKind::NotFound {
            tracing::warn!(error = %err, path = %staging.display(), "cannot remove the control-plane backup's staging directory");
        }
    }
    let duration_ms = Some(started.elapsed().as_millis().min(i64::MAX as u128) as i64);
    let outcome = match &result {
        Ok((summary, pruned)) => JobOutcome {
            state: "succeeded".into(),
            snapshot: Some(summary.snapshot_id.clone()),
            files: Some(summary.total_files_processed.min(i64::MAX as u64) as i64),
            bytes: Some(summary.total_bytes_processed.min(i64::MAX as u64) as i64),
            added_bytes: Some(summary.data_added.min(i64::MAX as u64) as i64),
            duration_ms,
            pruned: Some(pruned.is_ok()),
            detail: pruned.as_ref().err().map(|e| format!("the snapshot is saved, but pruning old ones failed: {e}")),
            ..JobOutcome::default()
        },
        Err(reason) => JobOutcome { state: "failed".into(), message: Some(reason.clone()), duration_ms, pruned: Some(false), ..JobOutcome::default() },
    };
    state.store.finish_backup_job(&job.id, &outcome, &[], state.clock.now_ms()).await?;
    match result {
        Ok((summary, _)) => tracing::info!(job = %job.id, destination = %destination.name, snapshot = %summary.snapshot_id, bytes = summary.total_bytes_processed, "control plane backed up"),
        Err(reason) => tracing::warn!(job = %job.id, destination = %destination.name, %reason, "control-plane backup failed"),
    }
    Ok(())
}

type Done = (cloudweb_restic::BackupSummary, Result<(), ResticError>);

async fn back_up(state: &AppState, destination: &DestinationRow, staging: &Path) -> Result<Done, String> {
    gather(state, staging).await?;
    let restic = Restic::new(repository(state, destination, CONTROL_PLANE_TARGET).map_err(|e| e.to_string())?, &cache_dir(state));
    let tags: Vec<String> = TAGS.iter().map(|t| t.to_string()).collect();
    let summary = restic.backup_dir(staging, &tags, RESTIC_LIMIT).await.map_err(|e| format!("{}: {e}", restic.repository().url))?;
    // Retention only after a success: a failed backup never prunes.
    let pruned = restic.retry_locked_clearing_stale(3, Duration::from_secs(5), || restic.forget_prune_hourly(CONTROL_PLANE_TARGET, KEEP_HOURLY, KEEP_DAILY, RESTIC_LIMIT)).await;
    Ok((summary, pruned))
}

/// Fills `staging` (made afresh, 0700) with what a new control plane
/// needs.
async fn gather(state: &AppState, staging: &Path) -> Result<(), String> {
    let data_dir = &state.config.data_dir;
    match std::fs::remove_dir_all(staging) {
        Ok(()) => {}
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
        Err(err) => return Err(format!("cannot clear {}: {err}", staging.display())),
    }
    private_dir(staging)?;
    state.store.snapshot_into(&staging.join(DATABASE_FILE)).await.map_err(|e| format!("cannot snapshot the database: {e}"))?;
    for name in FILES {
        let from = data_dir.join(name);
        if from.exists() {
            copy_private(&from, &staging.join(name))?;
        } else if REQUIRED.contains(&name) {
            return Err(format!("{} is missing", from.display()));
        }
    }
    let registry = data_dir.join(REGISTRY_DIR);
    for name in REGISTRY_FILES {
        let from = registry.join(name);
        if from.is_dir() {
            private_dir(&staging.join(REGISTRY_DIR))?;
            private_dir(&staging.join(REGISTRY_DIR).join(name))?;
            for entry in std::fs::read_dir(&from).map_err(|e| format!("cannot read {}: {e}", from.display()))? {
                let entry = entry.map_err(|e| format!("cannot read {}: {e}", from.display()))?;
                if entry.file_type().is_ok_and(|t| t.is_file()) {
                    copy_private(&entry.path(), &staging.join(REGISTRY_DIR).join(name).join(entry.file_name()))?;
                }
            }
        } else if from.is_file() {
            private_dir(&staging.join(REGISTRY_DIR))?;
            copy_private(&from, &staging.join(REGISTRY_DIR).join(name))?;
        }
    }
    let manifest = Manifest {
        format: 1,
        server_version: env!("CARGO_PKG_VERSION").to_string(),
        created_at: crate::clock::rfc3339_ms(state.clock.now_ms()),
        public_url: state.config.public_url.to_string(),
        base_domain: state.config.base_domain.clone(),
    };
    let text = serde_json::to_vec_pretty(&manifest).expect("manifest serializes");
    crate::ca::write_private(&staging.join(MANIFEST_FILE), &text).map_err(|e| e.to_string())
}

fn private_dir(path: &Path) -> Result<(), String> {
    match std::fs::DirBuilder::new().mode(0o700).create(path) {
        Ok(()) => Ok(()),
        Err(err) if err.kind() == std::io::ErrorKind::AlreadyExists && path.is_dir() => Ok(()),
        Err(err) => Err(format!("cannot create {}: {err}", path.display())),
    }
}

fn copy_private(from: &Path, to: &Path) -> Result<(), String> {
    let contents = std::fs::read(from).map_err(|e| format!("cannot read {}: {e}", from.display()))?;
    crate::ca::write_private(to, &contents).map_err(|e| e.to_string())
}

/// What `cloudweb-server restore` is asked.
#[derive(Debug, Clone)]
pub struct RestoreRequest {
    /// The control-plane repository (`<destination>/control-plane`), its
    /// password the recovery key, S3 credentials in `env`.
    pub repository: Repository,
    pub data_dir: PathBuf,
    /// A snapshot id (or a prefix); the newest when `None`.
    pub snapshot: Option<String>,
}

/// What a restore did.
#[derive(Debug, Clone)]
pub struct Restored {
    pub snapshot: Snapshot,
    /// Snapshot time → now.
    pub age: Duration,
    pub manifest: Option<Manifest>,
    /// Deployments that were in flight, now failed.
    pub failed_deployments: Vec<String>,
    /// Backup jobs that were unfinished, now failed.
    pub failed_jobs: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    #[error("{dir} already holds a cluster ({file} is there): refusing to overwrite it; restore into a new, empty data dir", dir = .dir.display())]
    DataDirInUse { file: &'static str, dir: PathBuf },
    #[error("the recovery key does not open {0}: check --recovery-key-file (it is the password in the destination's recovery kit); nothing was written")]
    WrongKey(String),
    #[error("there is no restic repository at {0}: --from takes the recovery kit's control-plane repository (it ends in /control-plane); nothing was written")]
    NoRepository(String),
    #[error("{0} holds no control-plane snapshot{1}; nothing was written")]
    NoSnapshot(String, String),
    #[error("cannot read {0}: {1}; nothing was written")]
    Restic(String, ResticError),
    #[error("the restored snapshot {0} is not a usable control-plane state: {1}; nothing was written to the data dir")]
    Unusable(String, String),
    #[error("{0}")]
    Io(String),
}

/// The newest snapshot, or the one `wanted` names (its id or a prefix).
fn pick(snapshots: Vec<Snapshot>, wanted: Option<&str>) -> Option<Snapshot> {
    match wanted {
        None => snapshots.into_iter().max_by_key(|s| snapshot_time(s).map(|t| t.unix_timestamp_nanos()).unwrap_or_default()),
        Some(wanted) => snapshots.into_iter().find(|s| s.id.starts_with(wanted) || s.short_id == wanted),
    }
}

fn snapshot_time(snapshot: &Snapshot) -> Option<OffsetDateTime> {
    OffsetDateTime::parse(&snapshot.time, &time::format_description::well_known::Rfc3339).ok()
}

/// "3 h 12 min", "4 min", "2 days 5 h".
pub fn human_age(age: Duration) -> String {
    let minutes = age.as_secs() / 60;
    let (days, hours, minutes) = (minutes / 1440, minutes / 60 % 24, minutes % 60);
    match (days, hours) {
        (0, 0) if age.as_secs() < 60 => format!("{} s", age.as_secs()),
        (0, 0) => format!("{minutes} min"),
        (0, _) => format!("{hours} h {minutes} min"),
        (1, _) => format!("1 day {hours} h"),
        _ => format!("{days} days {hours} h"),
    }
}

/// Rebuilds a data dir from a control-plane snapshot (see the module's
/// documentation). `cache_dir` is restic's cache, outside the data dir.
pub async fn restore(request: &RestoreRequest, cache_dir: &Path, now: OffsetDateTime) -> Result<Restored, RestoreError> {
    let data_dir = &request.data_dir;
    for name in [DATABASE_FILE, crate::ca::CA_KEY_FILE, crate::secrets::MASTER_KEY_FILE] {
        if data_dir.join(name).exists() {
            return Err(RestoreError::DataDirInUse { file: name, dir: data_dir.clone() });
        }
    }
    let url = request.repository.url.clone();
    let restic = Restic::new(request.repository.clone(), cache_dir);
    match restic.open(RESTIC_LIMIT).await {
        Ok(()) => {}
        Err(ResticError::WrongPassword(_)) => return Err(RestoreError::WrongKey(url)),
        Err(ResticError::NoRepository(_)) => return Err(RestoreError::NoRepository(url)),
        Err(err) => return Err(RestoreError::Restic(url, err)),
    }
    let tags: Vec<String> = TAGS.iter().map(|t| t.to_string()).collect();
    let snapshots = restic.snapshots(&tags, RESTIC_LIMIT).await.map_err(|e| RestoreError::Restic(url.clone(), e))?;
    let snapshot = pick(snapshots, request.snapshot.as_deref())
        .ok_or_else(|| RestoreError::NoSnapshot(url.clone(), request.snapshot.as_deref().map(|s| format!(" {s}")).unwrap_or_default()))?;
    let taken = snapshot_time(&snapshot).ok_or_else(|| RestoreError::Unusable(snapshot.short_id.clone(), format!("its time {:?} cannot be read", snapshot.time)))?;
    let age = Duration::try_from(now - taken).unwrap_or_default();

    // Everything is made beside the data dir and checked there; the data
    // dir gets the files only once they passed.
    let parent = match data_dir.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent.to_path_buf(),
        _ => PathBuf::from("."),
    };
    std::fs::create_dir_all(&parent).map_err(|e| RestoreError::Io(format!("cannot create {}: {e}", parent.display())))?;
    let name = data_dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "data".into());
    let staging = parent.join(format!(".{name}.restore-{}", &new_job_id()[3..]));
    private_dir(&staging).map_err(RestoreError::Io)?;
    let result = restore_into(&restic, &snapshot, &staging, age, now).await;
    let result = match result {
        Ok((manifest, failed_deployments, failed_jobs)) => move_into(&staging, data_dir).map(|()| Restored {
            snapshot: snapshot.clone(),
            age,
            manifest,
            failed_deployments,
            failed_jobs,
        }),
        Err(err) => Err(err),
    };
    let _ = std::fs::remove_dir_all(&staging);
    result
}

type Settled = (Option<Manifest>, Vec<String>, u64);

async fn restore_into(restic: &Restic, snapshot: &Snapshot, staging: &Path, age: Duration, now: OffsetDateTime) -> Result<Settled, RestoreError> {
    let unusable = |why: String| RestoreError::Unusable(snapshot.short_id.clone(), why);
    restic.restore(&snapshot.id, staging, RESTIC_LIMIT).await.map_err(|e| RestoreError::Restic(restic.repository().url.clone(), e))?;
    for name in REQUIRED {
        if !staging.join(name).is_file() {
            return Err(unusable(format!("{name} is missing from it")));
        }
    }
    let manifest_path = staging.join(MANIFEST_FILE);
    let manifest = std::fs::read(&manifest_path).ok().and_then(|bytes| serde_json::from_slice::<Manifest>(&bytes).ok());
    let _ = std::fs::remove_file(&manifest_path);
    let stamp = now.format(time::macros::format_description!("[year][month][day]T[hour][minute][second]Z")).unwrap_or_else(|_| "restore".into());
    let store = Store::open(staging, &stamp).await.map_err(|e| unusable(format!("its database does not open: {e}")))?;
    let settled = async {
        store.integrity_check().await.map_err(|e| unusable(format!("its database fails the integrity check: {e}")))?;
        let now_ms = i64::try_from(now.unix_timestamp_nanos() / 1_000_000).unwrap_or(i64::MAX);
        let failed_deployments = fail_in_flight_deployments(&store, age, now_ms).await.map_err(|e| unusable(format!("cannot end its deployments in flight: {e}")))?;
        let taken_ms = snapshot_time(snapshot).map(|t| i64::try_from(t.unix_timestamp_nanos() / 1_000_000).unwrap_or(now_ms)).unwrap_or(now_ms);
        end_own_job(&store, snapshot, taken_ms).await.map_err(|e| unusable(format!("cannot end its own backup job: {e}")))?;
        let reason = format!("the control plane was restored from a backup {} old, taken while this job ran", human_age(age));
        let failed_jobs = store.fail_unfinished_backup_jobs(&reason, now_ms).await.map_err(|e| unusable(format!("cannot end its backup jobs in flight: {e}")))?;
        Ok::<_, RestoreError>((failed_deployments, failed_jobs))
    }
    .await;
    store.close().await;
    let (failed_deployments, failed_jobs) = settled?;
    Ok((manifest, failed_deployments, failed_jobs))
}

/// The database was snapshotted while the control-plane backup that made
/// `snapshot` ran, so that job is unfinished in it: it succeeded, with this
/// snapshot, when the snapshot was taken.
async fn end_own_job(store: &Store, snapshot: &Snapshot, taken_ms: i64) -> Result<(), crate::store::StoreError> {
    for job in store.backup_jobs_of(CONTROL_PLANE_TARGET, Some("backup"), 5).await? {
        if matches!(job.state.as_str(), "queued" | "running") && job.created_at <= taken_ms {
            let outcome = JobOutcome {
                state: "succeeded".into(),
                snapshot: Some(snapshot.id.clone()),
                pruned: Some(false),
                detail: Some("this control plane was restored from this backup".into()),
                ..JobOutcome::default()
            };
            store.finish_backup_job(&job.id, &outcome, &[], taken_ms).await?;
        }
    }
    Ok(())
}

/// Deployments on their way (queued, building, deploying) when the backup
/// was taken have moved on since, or died with the old control plane:
/// they fail with the backup's age in their reason, and their placed
/// instances are stopped by the reconciler once the control plane runs.
/// A running deployment stays running: its containers kept serving.
async fn fail_in_flight_deployments(store: &Store, age: Duration, now_ms: i64) -> Result<Vec<String>, crate::store::StoreError> {
    let mut failed = Vec::new();
    for app in store.apps().await? {
        for deployment in store.app_deployments(&app.name).await? {
            if !matches!(deployment.state.as_str(), "queued" | "building" | "deploying") {
                continue;
            }
            let reason = format!(
                "the control plane was restored from a backup {} old, taken while this deployment was {}; deploy again",
                human_age(age),
                deployment.state
            );
            if !store.transition_deployment(&deployment.id, &deployment.state, "failed", Some(&reason), None, now_ms).await? {
                continue;
            }
            for instance in store.instances(&deployment.id).await? {
                match (instance.state.as_str(), instance.node_id.as_deref()) {
                    ("pending" | "running", Some(node)) => {
                        let update = crate::store::InstanceUpdate::to("stopping").on(node).stop_after(now_ms);
                        store.update_instance(&deployment.id, instance.instance, update, now_ms).await?;
                    }
                    ("pending", None) => store.update_instance(&deployment.id, instance.instance, crate::store::InstanceUpdate::to("failed"), now_ms).await?,
                    _ => {}
                }
            }
            failed.push(deployment.id.clone());
        }
    }
    Ok(failed)
}

/// Moves the checked files into the data dir (made 0700 when missing),
/// files 0600 and directories 0700.
fn move_into(staging: &Path, data_dir: &Path) -> Result<(), RestoreError> {
    let io = |what: &str, path: &Path, err: std::io::Error| RestoreError::Io(format!("cannot {what} {}: {err}", path.display()));
    tighten(staging).map_err(|e| io("set the modes under", staging, e))?;
    if !data_dir.exists() {
        return std::fs::rename(staging, data_dir).map_err(|e| io("move the restored files to", data_dir, e));
    }
    std::fs::set_permissions(data_dir, std::fs::Permissions::from_mode(0o700)).map_err(|e| io("set the mode of", data_dir, e))?;
    for entry in std::fs::read_dir(staging).map_err(|e| io("read", staging, e))? {
        let entry = entry.map_err(|e| io("read", staging, e))?;
        let to = data_dir.join(entry.file_name());
        if to.exists() {
            // Something of the new host's own (a registry storage dir, a
            // cache) is left as it is, and ours goes beside it.
            if to.is_dir() && entry.path().is_dir() {
                move_into(&entry.path(), &to)?;
                continue;
            }
            return Err(RestoreError::Io(format!("{} exists already; move it away and restore again", to.display())));
        }
        std::fs::rename(entry.path(), &to).map_err(|e| io("move the restored file to", &to, e))?;
    }
    Ok(())
}

fn tighten(path: &Path) -> std::io::Result<()> {
    let meta = std::fs::symlink_metadata(path)?;
    if meta.is_dir() {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o700))?;
        for entry in std::fs::read_dir(path)? {
            tighten(&entry?.path())?;
        }
    } else if meta.is_file() {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_read_plainly() {
        assert_eq!(human_age(Duration::from_secs(42)), "42 s");
        assert_eq!(human_age(Duration::from_secs(4 * 60 + 5)), "4 min");
        assert_eq!(human_age(Duration::from_secs(3 * 3600 + 12 * 60)), "3 h 12 min");
        assert_eq!(human_age(Duration::from_secs(26 * 3600)), "1 day 2 h");
        assert_eq!(human_age(Duration::from_secs(50 * 3600)), "2 days 2 h");
    }

    #[test]
    fn the_newest_snapshot_or_the_one_named_is_picked() {
        let snapshot = |id: &str, time: &str| Snapshot { id: id.into(), short_id: id[..4].into(), time: time.into(), tags: vec![], paths: vec![] };
        let list = vec![snapshot("aaaa1111", "2026-01-02T03:00:00Z"), snapshot("bbbb2222", "2026-01-02T05:00:00.5+00:00"), snapshot("cccc3333", "2026-01-02T04:00:00Z")];
        assert_eq!(pick(list.clone(), None).unwrap().id, "bbbb2222");
        assert_eq!(pick(list.clone(), Some("cccc")).unwrap().id, "cccc3333");
        assert!(pick(list, Some("dddd")).is_none());
    }
}
