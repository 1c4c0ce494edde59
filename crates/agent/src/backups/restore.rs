//! `backup_restore`: a snapshot restored into a staging directory,
//! `<data>/volumes/.restoring/<job>`, then put in place in one rename: as a
//! new volume, or (with `replace`) swapped in for an existing one whose
//! containers are stopped for the swap (a service held, so its supervisor
//! does not start it again meanwhile), the previous data kept as another
//! volume.
//!
//! A service's staging directory is made by the service's own image: a
//! throwaway container of it, with the target spec's environment and
//! command, initializes the data (so the restored database takes that
//! spec's credentials), the dump is loaded, and the database is shut down
//! cleanly before the directory is used. Redis gets its RDB file first and
//! writes its append-only file from it.
//!
//! Every step of a swap is on disk before it is made; [`settle`] reads
//! where the directories are and undoes a swap not made yet or completes
//! one half made, so neither a failure nor a kill leaves a volume without
//! its data or its containers stopped.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use cloudweb_protocol::{BackupJobReport, BackupSource, JobState, RestorePayload, ServiceKind, ServicePayload};
use cloudweb_restic::Restic;
use serde::{Deserialize, Serialize};

use super::throwaway::{self, Database};
use super::{Backups, Job, JobRecord};

/// Where restores stage their data, under `<data>/volumes`.
pub(super) const STAGING_DIR: &str = ".restoring";
/// Longest wait for Redis to write its append-only file.
const AOF_LIMIT: Duration = Duration::from_secs(300);

/// A restore into a new volume being put in place.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Commit {
    pub into: String,
    pub staging: PathBuf,
    pub files: u64,
    pub bytes: u64,
}

/// A restore in place of a volume: what is stopped and where everything
/// goes.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Swap {
    pub volume: String,
    pub keep_as: String,
    pub staging: PathBuf,
    /// Containers stopped for the swap, started again after it.
    #[serde(default)]
    pub stopped: Vec<String>,
    /// The service held for the swap.
    #[serde(default)]
    pub held: Option<String>,
    pub files: u64,
    pub bytes: u64,
}

pub(super) async fn run(job: &Job, payload: &RestorePayload) -> Result<BackupJobReport, String> {
    let restic = job.restic(&payload.repository);
    let data_dir = job.data_dir().to_path_buf();
    match &payload.replace {
        Some(replace) => {
            let keep = crate::volumes::dir(&data_dir, &replace.keep_as);
            if keep.exists() {
                return Err(format!("volume {} already has data on this node; the previous data needs a new name", replace.keep_as));
            }
        }
        None => {
            let into = crate::volumes::dir(&data_dir, &payload.into_volume);
            if into.exists() {
                return Err(format!("volume {} already has data on this node; a restore goes into a new volume", payload.into_volume));
            }
        }
    }
    let staging = job.temp_dir(STAGING_DIR)?;
    let started = Instant::now();
    let counts = match (&payload.source, &payload.service) {
        (BackupSource::Volume { .. }, _) => {
            restic.restore(&payload.snapshot, &staging, job.left()).await.map_err(|e| staging_failed(&format!("restoring snapshot {} failed: {e}", payload.snapshot)))?;
            None
        }
        (BackupSource::Service { service_kind, .. }, Some(spec)) => {
            let file = payload.source.dump_file().expect("a service has a dump file");
            Some(service(job, &restic, &payload.snapshot, file, *service_kind, &payload.source, spec, &staging).await.map_err(|e| staging_failed(&e))?)
        }
        (BackupSource::Service { .. }, None) => return Err("a service restore names the service's spec".into()),
    };
    let counted = staging.clone();
    let (files, bytes) = tokio::task::spawn_blocking(move || super::count_tree(&counted)).await.map_err(|e| e.to_string())?;
    tracing::info!(job_id = %job.id, files, bytes, seconds = started.elapsed().as_secs_f64(), "snapshot restored into the staging directory");
    let placed = match &payload.replace {
        None => {
            let into = crate::volumes::dir(&data_dir, &payload.into_volume);
            let commit = Commit { into: payload.into_volume.clone(), staging: staging.clone(), files, bytes };
            job.update(|r| r.commit = Some(commit))?;
            if into.exists() {
                return Err(format!("volume {} got data on this node during the restore", payload.into_volume));
            }
            std::fs::rename(&staging, &into).map_err(|e| super::describe_io(&format!("cannot put the restored data in place as {}", into.display()), &e))?;
            job.update(|r| {
                r.commit = None;
                r.dirs.retain(|d| d != &staging);
            })?;
            format!("as volume {}", payload.into_volume)
        }
        Some(replace) => {
            let swap = Swap { volume: replace.volume.clone(), keep_as: replace.keep_as.clone(), staging: staging.clone(), stopped: Vec::new(), held: None, files, bytes };
            swap_in(job, swap).await?;
            format!("in place of volume {}, its previous data kept as volume {}", replace.volume, replace.keep_as)
        }
    };
    tracing::info!(job_id = %job.id, snapshot = %payload.snapshot, "restored {placed}");
    let mut report = BackupJobReport::new(JobState::Succeeded);
    report.snapshot = Some(payload.snapshot.clone());
    report.files = Some(files);
    report.bytes = Some(bytes);
    report.duration_ms = Some(started.elapsed().as_millis() as u64);
    report.detail = Some(format!("restored snapshot {} {placed}", payload.snapshot));
    report.counts = counts;
    Ok(report)
}

/// A failure while the staging directory was filled, said plainly when
/// the disk is full.
fn staging_failed(reason: &str) -> String {
    if super::says_disk_full(reason) {
        format!("this node's disk is full, so the restore stopped ({reason}); the data it was for is untouched and the partial copy was removed")
    } else {
        reason.to_string()
    }
}

/// Initializes a service's data in `staging` with its image and loads the
/// dump; the counts of what was loaded.
#[allow(clippy::too_many_arguments)]
async fn service(
    job: &Job,
    restic: &Restic,
    snapshot: &str,
    file: &str,
    kind: ServiceKind,
    source: &BackupSource,
    spec: &ServicePayload,
    staging: &Path,
) -> Result<BTreeMap<String, u64>, String> {
    let BackupSource::Service { user, database, .. } = source else { unreachable!("a service source") };
    let env = |names: &[&str]| names.iter().find_map(|n| spec.env.get(*n).cloned());
    let (user, database, exec_env, command) = match kind {
        ServiceKind::Postgres => {
            let target_user = env(&["POSTGRES_USER"]).unwrap_or_else(|| "postgres".into());
            let target_db = env(&["POSTGRES_DB"]).unwrap_or_else(|| target_user.clone());
            let password = env(&["POSTGRES_PASSWORD"]).map(|p| vec![format!("PGPASSWORD={p}")]).unwrap_or_default();
            (target_user, target_db, password, spec.command.clone())
        }
        ServiceKind::Mariadb => {
            let target_db = env(&["MARIADB_DATABASE", "MYSQL_DATABASE"]).unwrap_or_else(|| database.clone());
            let root = env(&["MARIADB_ROOT_PASSWORD", "MYSQL_ROOT_PASSWORD"]).map(|p| vec![format!("MYSQL_PWD={p}")]).unwrap_or_default();
            (user.clone(), target_db, root, spec.command.clone())
        }
        ServiceKind::Redis => {
            verify_dump(job, restic, snapshot, file, &staging.join("dump.rdb")).await?;
            // The RDB file is loaded as it is; the append-only file, when
            // the spec wants one, is written from it below.
            let mut command = if spec.command.is_empty() { vec!["redis-server".to_string()] } else { spec.command.clone() };
            command.extend(["--appendonly".to_string(), "no".to_string()]);
            let auth = env(&["REDISCLI_AUTH"]).map(|p| vec![format!("REDISCLI_AUTH={p}")]).unwrap_or_default();
            (user.clone(), database.clone(), auth, command)
        }
    };
    for value in &exec_env {
        job.add_secret(value.split_once('=').map(|(_, v)| v).unwrap_or_default());
    }
    let id = throwaway::start(job, kind, &spec.image, &spec.env, &command, staging).await?;
    let db = Database { kind, id: id.clone(), user, database, env: exec_env };
    let result = async {
        let probe = if spec.health.is_empty() { throwaway::probe(kind, &db.user, &db.database) } else { spec.health.clone() };
        throwaway::wait_ready(job, &id, &probe, &db.env).await?;
        if kind != ServiceKind::Redis {
            throwaway::load(job, restic, snapshot, file, &db).await?;
        } else if wants_append_only(&spec.command) {
            append_only(job, &db).await?;
        }
        let counts = throwaway::counts(job, &db).await?;
        throwaway::stop_cleanly(job, &id).await?;
        Ok::<_, String>(counts)
    }
    .await;
    if result.is_err() {
        let _ = throwaway::remove(job, &id).await;
    }
    result
}

async fn verify_dump(job: &Job, restic: &Restic, snapshot: &str, file: &str, path: &Path) -> Result<u64, String> {
    super::verify::dump_to_file(job, restic, snapshot, file, path).await
}

/// Whether a Redis command line turns the append-only file on.
fn wants_append_only(command: &[String]) -> bool {
    command.windows(2).rev().find(|w| w[0] == "--appendonly").is_some_and(|w| w[1] == "yes")
}

/// Turns the append-only file on in the running throwaway Redis (which
/// writes it from its data) and waits until it is written.
async fn append_only(job: &Job, db: &Database) -> Result<(), String> {
    let cli = |args: &[&str]| {
        let mut cmd = vec!["redis-cli".to_string(), "--no-auth-warning".into(), "-h".into(), "127.0.0.1".into()];
        cmd.extend(args.iter().map(|a| a.to_string()));
        cmd
    };
    let out = throwaway::run(job, db, &cli(&["CONFIG", "SET", "appendonly", "yes"])).await?;
    if !out.trim().eq_ignore_ascii_case("OK") {
        return Err(format!("Redis refused to write its append-only file: {}", out.trim()));
    }
    let started = Instant::now();
    loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let info = throwaway::run(job, db, &cli(&["INFO", "persistence"])).await?;
        let field = |name: &str| info.lines().find_map(|l| l.trim().strip_prefix(name)?.strip_prefix(':').map(str::to_string));
        let busy = field("aof_rewrite_in_progress").as_deref() == Some("1") || field("aof_rewrite_scheduled").as_deref() == Some("1");
        if field("aof_enabled").as_deref() == Some("1") && !busy {
            if field("aof_last_bgrewrite_status").as_deref() != Some("ok") {
                return Err("Redis could not write its append-only file from the restored data".into());
            }
            return Ok(());
        }
        if started.elapsed() > AOF_LIMIT.min(job.left()) {
            return Err("Redis did not finish writing its append-only file in time".into());
        }
    }
}

/// Swaps the staging directory in for the volume's, the volume's
/// containers stopped meanwhile; undone when a step fails.
async fn swap_in(job: &Job, mut swap: Swap) -> Result<(), String> {
    if !job.begin_swap() {
        return Err("stopped before the restored data was put in place".into());
    }
    swap.held = job.services().specs().into_iter().find(|s| s.volume == swap.volume).map(|s| s.service);
    let result = async {
        job.update(|r| r.swap = Some(swap.clone()))?;
        if let Some(service) = &swap.held {
            job.services().hold(service, &job.id).await;
        }
        let dir = crate::volumes::dir(job.data_dir(), &swap.volume);
        let keep = crate::volumes::dir(job.data_dir(), &swap.keep_as);
        let running = job.runtime().running_mounting(&dir.to_string_lossy()).await.map_err(|e| format!("cannot list the volume's containers: {e}"))?;
        for id in running {
            swap.stopped.push(id.clone());
            job.update(|r| r.swap = Some(swap.clone()))?;
            job.runtime().stop_keep(&id).await.map_err(|e| format!("cannot stop container {id}: {e}"))?;
        }
        if dir.exists() {
            std::fs::rename(&dir, &keep).map_err(|e| format!("cannot set the previous data aside as {}: {e}", keep.display()))?;
        }
        std::fs::rename(&swap.staging, &dir).map_err(|e| format!("cannot put the restored data in place as {}: {e}", dir.display()))?;
        tracing::info!(job_id = %job.id, volume = %swap.volume, kept = %swap.keep_as, stopped = swap.stopped.len(), "restored data swapped in");
        Ok::<_, String>(())
    }
    .await;
    let settled = settle(&job.backups, &swap, result.is_ok()).await;
    job.end_swap();
    let cleared = job.update(|r| {
        r.swap = None;
        r.dirs.retain(|d| d != &swap.staging || !matches!(settled, Ok(true)));
    });
    result?;
    match settled {
        Ok(true) => cleared,
        Ok(false) => Err("the restored data could not be put in place; the volume keeps its previous data".into()),
        Err(err) => Err(err),
    }
}

/// Brings a swap to a consistent end from where its directories are: one
/// not made yet is undone, one half made is completed when `forward`
/// (the staging directory is whole once a swap begins) or undone; the
/// stopped containers are started again and the service released. Whether
/// the restored data is in place.
pub(super) async fn settle(backups: &Backups, swap: &Swap, forward: bool) -> Result<bool, String> {
    let data_dir = &backups.inner.data_dir;
    let dir = crate::volumes::dir(data_dir, &swap.volume);
    let keep = crate::volumes::dir(data_dir, &swap.keep_as);
    let rename = |from: &Path, to: &Path| std::fs::rename(from, to).map_err(|e| format!("cannot move {} to {}: {e}", from.display(), to.display()));
    let placed = match (swap.staging.exists(), dir.exists(), keep.exists()) {
        // Nothing moved yet.
        (true, true, _) => Ok(false),
        // The previous data set aside, the restored not in place yet.
        (true, false, true) if forward => rename(&swap.staging, &dir).map(|()| true),
        (true, false, true) => rename(&keep, &dir).map(|()| false),
        // There was no previous data.
        (true, false, false) if forward => rename(&swap.staging, &dir).map(|()| true),
        (true, false, false) => Ok(false),
        (false, true, _) => Ok(true),
        (false, false, _) => Err(format!("neither the restored nor the previous data of volume {} is in place", swap.volume)),
    };
    let mut problems = Vec::new();
    for id in &swap.stopped {
        if let Err(err) = backups.inner.runtime.start_existing(id).await {
            tracing::warn!(container = %id, error = %err, "could not start a volume's container again after a restore");
            problems.push(format!("container {id} could not be started again: {err}"));
        }
    }
    if let Some(service) = &swap.held {
        // The service was started again on the restored data: it is
        // released (and the job done) once it accepts connections, so
        // what follows a restore (an upgrade's switch, a user's client)
        // does not meet a database still starting.
        if matches!(placed, Ok(true)) && problems.is_empty() {
            if let Some(spec) = backups.inner.services.spec(service) {
                wait_accepting(&backups.inner.runtime, service, &spec.health).await;
            }
        }
        backups.inner.services.release(service);
    }
    match placed {
        Ok(placed) if problems.is_empty() => Ok(placed),
        Ok(_) => Err(problems.join("; ")),
        Err(err) => Err(if problems.is_empty() { err } else { format!("{err}; {}", problems.join("; ")) }),
    }
}

/// How long a restored service may take to accept connections again.
const READY_AFTER_RESTORE: Duration = Duration::from_secs(90);

/// Waits (at most [`READY_AFTER_RESTORE`]) until the service's own probe
/// passes; a service that does not come up is left to its supervisor,
/// which reports it unhealthy.
async fn wait_accepting(runtime: &crate::runtime::DockerRuntime, service: &str, probe: &[String]) {
    if probe.is_empty() {
        return;
    }
    let started = Instant::now();
    while started.elapsed() < READY_AFTER_RESTORE {
        if let Ok(true) = runtime.probe_service(service, probe, Duration::from_secs(5)).await {
            tracing::info!(service, waited_ms = started.elapsed().as_millis() as u64, "the restored service accepts connections");
            return;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    tracing::warn!(service, "the restored service did not accept connections within {} s", READY_AFTER_RESTORE.as_secs());
}

/// After an agent start: a restore whose data was being put in place is
/// completed (its files and bytes); any other is left to the clean-up.
pub(super) async fn recover(backups: &Backups, record: &JobRecord) -> Result<Option<(u64, u64)>, String> {
    if let Some(swap) = &record.swap {
        return Ok(settle(backups, swap, true).await?.then_some((swap.files, swap.bytes)));
    }
    if let Some(commit) = &record.commit {
        let into = crate::volumes::dir(&backups.inner.data_dir, &commit.into);
        if !commit.staging.exists() && into.exists() {
            return Ok(Some((commit.files, commit.bytes)));
        }
        if commit.staging.exists() && !into.exists() {
            std::fs::rename(&commit.staging, &into).map_err(|e| format!("cannot put the restored data in place as {}: {e}", into.display()))?;
            return Ok(Some((commit.files, commit.bytes)));
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_last_appendonly_argument_counts() {
        let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(super::wants_append_only(&args(&["redis-server", "--appendonly", "yes", "--dir", "/data"])));
        assert!(!super::wants_append_only(&args(&["redis-server", "--appendonly", "yes", "--appendonly", "no"])));
        assert!(!super::wants_append_only(&args(&["redis-server"])));
    }
}
