//! `backup_run`: a volume's directory, or a service's logical dump made
//! inside its container and streamed into `restic backup --stdin`, then
//! the destination's retention, after a success only.

use std::time::{Duration, Instant};

use cloudweb_protocol::{BackupJobPayload, BackupJobReport, BackupSource, JobState, ServiceKind};
use cloudweb_restic::{BackupSummary, Restic, ResticError};

use super::Job;

/// How often, and how far apart, a locked repository is tried again.
const LOCK_TRIES: u32 = 6;
const LOCK_PAUSE: Duration = Duration::from_secs(10);
/// Longest wait for Redis's `BGSAVE`.
const BGSAVE_LIMIT: Duration = Duration::from_secs(600);

pub(super) async fn run(job: &Job, payload: &BackupJobPayload) -> Result<BackupJobReport, String> {
    let restic = job.restic(&payload.repository);
    for value in payload.exec_env.values() {
        job.add_secret(value);
    }
    let target = payload.source.target_tag();
    let mut tags = payload.tags.clone();
    for tag in [target.clone(), format!("job={}", job.id)] {
        if !tags.contains(&tag) {
            tags.push(tag);
        }
    }
    let started = Instant::now();
    let summary = match &payload.source {
        BackupSource::Volume { volume, pause } => volume_snapshot(job, &restic, volume, *pause, &tags).await?,
        BackupSource::Service { service, service_kind, volume, user, database } => {
            let file = payload.source.dump_file().expect("a service has a dump file");
            let env: Vec<String> = payload.exec_env.iter().map(|(k, v)| format!("{k}={v}")).collect();
            match service_kind {
                ServiceKind::Postgres => {
                    let cmd = ["pg_dump", "-Fc", "--no-password", "-U", user, "-d", database].map(String::from).to_vec();
                    dump(job, &restic, service, &cmd, &env, file, &tags).await?
                }
                ServiceKind::Mariadb => {
                    let cmd = ["mariadb-dump", "--single-transaction", "--routines", "--triggers", "-u", user, database].map(String::from).to_vec();
                    dump(job, &restic, service, &cmd, &env, file, &tags).await?
                }
                ServiceKind::Redis => redis(job, &restic, service, volume, &env, file, &tags).await?,
            }
        }
    };
    let mut report = BackupJobReport::new(JobState::Succeeded);
    report.snapshot = Some(summary.snapshot_id.clone());
    report.files = Some(summary.total_files_processed);
    report.bytes = Some(summary.total_bytes_processed);
    report.added_bytes = Some(summary.data_added);
    report.duration_ms = Some(started.elapsed().as_millis() as u64);
    tracing::info!(
        job_id = %job.id, target = %target, snapshot = %summary.snapshot_id, files = summary.total_files_processed,
        bytes = summary.total_bytes_processed, added = summary.data_added, "snapshot made"
    );
    // Only now, after a success: a failed backup never prunes.
    if let Some(retention) = payload.retention {
        match restic.retry_locked_clearing_stale(LOCK_TRIES, LOCK_PAUSE, || restic.forget_prune(&target, retention, job.left())).await {
            Ok(()) => report.pruned = Some(true),
            Err(err) => {
                tracing::warn!(job_id = %job.id, error = %err, "the retention could not be applied");
                report.pruned = Some(false);
                report.message = Some(format!("the backup succeeded, but applying the retention (forget --prune) failed: {err}"));
            }
        }
    }
    Ok(report)
}

fn said(err: ResticError) -> String {
    err.to_string()
}

async fn volume_snapshot(job: &Job, restic: &Restic, volume: &str, pause: bool, tags: &[String]) -> Result<BackupSummary, String> {
    let dir = crate::volumes::dir(job.data_dir(), volume);
    match std::fs::symlink_metadata(&dir) {
        Ok(meta) if meta.is_dir() => {}
        Ok(_) => return Err(format!("{} is not a directory", dir.display())),
        Err(err) => return Err(format!("this node holds no data for volume {volume} ({}: {err})", dir.display())),
    }
    let mut paused = Vec::new();
    if pause {
        let running = job.runtime().running_mounting(&dir.to_string_lossy()).await.map_err(|e| format!("cannot list the volume's containers: {e}"))?;
        for id in running {
            job.update(|r| r.paused.push(id.clone()))?;
            job.runtime().pause(&id).await.map_err(|e| format!("cannot pause container {id}: {e}"))?;
            paused.push(id);
        }
        if !paused.is_empty() {
            tracing::info!(job_id = %job.id, volume, containers = paused.len(), "containers paused for the snapshot");
        }
    }
    let result = restic.retry_locked_clearing_stale(LOCK_TRIES, LOCK_PAUSE, || restic.backup_dir(&dir, tags, job.left())).await;
    // Unpaused at once, whatever the outcome (and by the job's clean-up
    // when this future is dropped before).
    let mut still_paused = Vec::new();
    for id in &paused {
        if let Err(err) = job.runtime().unpause(id).await {
            tracing::warn!(job_id = %job.id, container = %id, error = %err, "could not unpause a container");
            still_paused.push(id.clone());
        }
    }
    job.update(|r| r.paused = still_paused.clone())?;
    if !still_paused.is_empty() {
        return Err(format!("containers {} could not be unpaused after the snapshot", still_paused.join(", ")));
    }
    result.map_err(said)
}

/// The id of the service's running container.
async fn service_container(job: &Job, service: &str) -> Result<String, String> {
    match job.runtime().service_container(service).await {
        Ok(Some(container)) if container.running => Ok(container.id),
        Ok(Some(_)) => Err(format!("service {service} is not running on this node, so it cannot be dumped")),
        Ok(None) => Err(format!("service {service} has no container on this node")),
        Err(err) => Err(format!("cannot find service {service}'s container: {err}")),
    }
}

/// `cmd`'s standard output, run in the service's container, as the one
/// file of a snapshot; its exit status decides whether the snapshot is
/// kept (restic is killed first when it failed).
async fn dump(job: &Job, restic: &Restic, service: &str, cmd: &[String], env: &[String], file: &str, tags: &[String]) -> Result<BackupSummary, String> {
    let container = service_container(job, service).await?;
    let program = cmd[0].clone();
    // Recorded before it starts, so an agent killed at any point leaves no
    // dump its successor does not know to kill.
    let record = |id: &str| job.update(|r| r.execs.push(id.to_string()));
    let mut exec = job.runtime().exec_attached_recorded(&container, cmd, env, true, record).await.map_err(|e| format!("cannot start {program}: {e}"))?;
    let stdout = exec.stdout.take().expect("stdout streamed");
    let done = async move {
        match exec.finish().await {
            Ok((Some(0), _)) => Ok(()),
            Ok((Some(code), text)) => Err(format!("{program} exited with code {code}: {}", cloudweb_protocol::misc::one_line(text.trim(), 1000))),
            Ok((None, _)) => Err(format!("{program} did not report how it ended")),
            Err(err) => Err(format!("{program}: {err}")),
        }
    };
    restic.backup_stdin(file, tags, job.left(), stdout, done).await.map_err(said)
}

/// One `redis-cli` command in the service's container.
async fn redis_cli(job: &Job, container: &str, env: &[String], args: &[&str]) -> Result<String, String> {
    let mut cmd = vec!["redis-cli".to_string(), "--no-auth-warning".into(), "-h".into(), "127.0.0.1".into()];
    cmd.extend(args.iter().map(|a| a.to_string()));
    match job.runtime().exec_output(container, &cmd, env, Duration::from_secs(30)).await {
        Ok((Some(0), out)) if !out.trim_start().starts_with("ERR") && !out.contains("NOAUTH") && !out.contains("WRONGPASS") => Ok(out),
        Ok((code, out)) => Err(format!("redis-cli {} failed ({code:?}): {}", args.join(" "), cloudweb_protocol::misc::one_line(out.trim(), 500))),
        Err(err) => Err(format!("redis-cli {}: {err}", args.join(" "))),
    }
}

/// A field of `INFO persistence`.
fn info_field<'a>(info: &'a str, field: &str) -> Option<&'a str> {
    info.lines().find_map(|line| line.trim().strip_prefix(field)?.strip_prefix(':'))
}

/// `BGSAVE`, waited for, then the RDB file it wrote.
async fn redis(job: &Job, restic: &Restic, service: &str, volume: &str, env: &[String], file: &str, tags: &[String]) -> Result<BackupSummary, String> {
    let container = service_container(job, service).await?;
    let last_save = |text: String| text.trim().parse::<i64>().map_err(|_| format!("redis-cli LASTSAVE answered {:?}", text.trim()));
    let before = last_save(redis_cli(job, &container, env, &["LASTSAVE"]).await?)?;
    let info = redis_cli(job, &container, env, &["INFO", "persistence"]).await?;
    let saves_before = info_field(&info, "rdb_saves").and_then(|v| v.parse::<u64>().ok());
    match redis_cli(job, &container, env, &["BGSAVE"]).await {
        Ok(_) => {}
        // One already running does as well.
        Err(err) if err.contains("already in progress") => {}
        Err(err) => return Err(err),
    }
    let waited = Instant::now();
    let limit = BGSAVE_LIMIT.min(job.left());
    loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let info = redis_cli(job, &container, env, &["INFO", "persistence"]).await?;
        let in_progress = info_field(&info, "rdb_bgsave_in_progress") == Some("1");
        let now = last_save(redis_cli(job, &container, env, &["LASTSAVE"]).await?)?;
        let saves = info_field(&info, "rdb_saves").and_then(|v| v.parse::<u64>().ok());
        let saved = now != before || matches!((saves_before, saves), (Some(a), Some(b)) if b > a);
        if saved && !in_progress {
            if info_field(&info, "rdb_last_bgsave_status") != Some("ok") {
                return Err("Redis's BGSAVE failed (rdb_last_bgsave_status is not ok); see the service's log".into());
            }
            break;
        }
        if waited.elapsed() > limit {
            return Err(format!("Redis's BGSAVE did not finish within {} s", limit.as_secs()));
        }
    }
    let path = crate::volumes::dir(job.data_dir(), volume).join("dump.rdb");
    let reader = tokio::fs::File::open(&path).await.map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    restic.backup_stdin(file, tags, job.left(), reader, async { Ok(()) }).await.map_err(said)
}

#[cfg(test)]
mod tests {
    #[test]
    fn info_fields_are_read() {
        let info = "# Persistence\r\nloading:0\r\nrdb_bgsave_in_progress:0\r\nrdb_saves:3\r\nrdb_last_bgsave_status:ok\r\n";
        assert_eq!(super::info_field(info, "rdb_saves"), Some("3"));
        assert_eq!(super::info_field(info, "rdb_last_bgsave_status"), Some("ok"));
        assert_eq!(super::info_field(info, "rdb_bgsave_in_progress"), Some("0"));
        assert_eq!(super::info_field(info, "absent"), None);
    }
}
