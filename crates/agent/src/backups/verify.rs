//! `backup_verify`: a snapshot is trusted once it has been restored. A
//! volume's goes into a temporary directory and is counted against what
//! the backup reported; a service's dump is loaded into a throwaway
//! container of its image and counted (rows per table, keys). Both add
//! `restic check --read-data-subset`, which reads back that share of the
//! repository's data and checks it against its hashes.

use std::collections::BTreeMap;

use cloudweb_protocol::{BackupJobReport, BackupSource, JobState, ServiceKind, VerifyPayload};
use cloudweb_restic::Restic;

use super::throwaway::{self, Database};
use super::Job;

/// Where verifications restore, under `<data>/volumes`.
pub(super) const TEMP_DIR: &str = ".verify";

pub(super) async fn run(job: &Job, payload: &VerifyPayload) -> Result<BackupJobReport, String> {
    let restic = job.restic(&payload.repository);
    restic
        .check(payload.read_data_percent, job.left())
        .await
        .map_err(|e| format!("restic check --read-data-subset={}% failed: {e}", payload.read_data_percent))?;
    let checked = format!("restic check read {}% of the repository's data back", payload.read_data_percent);
    let dir = job.temp_dir(TEMP_DIR)?;
    let mut report = BackupJobReport::new(JobState::Succeeded);
    report.snapshot = Some(payload.snapshot.clone());
    match &payload.source {
        BackupSource::Volume { .. } => {
            restic.restore(&payload.snapshot, &dir, job.left()).await.map_err(|e| format!("restoring snapshot {} failed: {e}", payload.snapshot))?;
            let counted = dir.clone();
            let (files, bytes) = tokio::task::spawn_blocking(move || super::count_tree(&counted)).await.map_err(|e| e.to_string())?;
            if let Some(expected) = payload.expected {
                if (files, bytes) != (expected.files, expected.bytes) {
                    return Err(format!(
                        "snapshot {} restores {files} files of {bytes} bytes, but the backup had {} files of {} bytes",
                        payload.snapshot, expected.files, expected.bytes
                    ));
                }
            }
            report.files = Some(files);
            report.bytes = Some(bytes);
            report.counts = Some(BTreeMap::from([("files".to_string(), files), ("bytes".to_string(), bytes)]));
            let matched = if payload.expected.is_some() { ", as the backup had" } else { "" };
            report.detail = Some(format!("restored snapshot {}: {files} files, {bytes} bytes{matched}; {checked}", payload.snapshot));
        }
        BackupSource::Service { service_kind, user, database, .. } => {
            let image = payload.image.as_deref().ok_or("verifying a service's snapshot needs the service's image")?;
            let file = payload.source.dump_file().expect("a service has a dump file");
            let (bytes, counts) = service(job, &restic, &payload.snapshot, file, *service_kind, image, user, database, &dir).await?;
            if let Some(expected) = payload.expected {
                if bytes != expected.bytes {
                    return Err(format!("snapshot {}'s dump has {bytes} bytes, but the backup stored {}", payload.snapshot, expected.bytes));
                }
            }
            report.files = Some(1);
            report.bytes = Some(bytes);
            report.detail = Some(match service_kind {
                ServiceKind::Redis => format!("loaded snapshot {} into a throwaway Redis: {} keys; {checked}", payload.snapshot, counts.get("keys").copied().unwrap_or(0)),
                _ => format!(
                    "restored snapshot {} into a throwaway {}: {} tables, {} rows; {checked}",
                    payload.snapshot,
                    service_kind.as_str(),
                    counts.len(),
                    counts.values().sum::<u64>()
                ),
            });
            report.counts = Some(counts);
        }
    }
    Ok(report)
}

/// Loads a service's dump into a throwaway database on `dir` and counts
/// it: the dump's bytes and the counts.
#[allow(clippy::too_many_arguments)]
async fn service(
    job: &Job,
    restic: &Restic,
    snapshot: &str,
    file: &str,
    kind: ServiceKind,
    image: &str,
    user: &str,
    database: &str,
    dir: &std::path::Path,
) -> Result<(u64, BTreeMap<String, u64>), String> {
    let password = throwaway::random_password();
    let root_password = throwaway::random_password();
    let (env, command, exec_env): (BTreeMap<String, String>, Vec<String>, Vec<String>) = match kind {
        ServiceKind::Postgres => (
            BTreeMap::from([
                ("POSTGRES_PASSWORD".into(), password.clone()),
                ("POSTGRES_USER".into(), user.to_string()),
                ("POSTGRES_DB".into(), database.to_string()),
                ("PGDATA".into(), kind.data_path().to_string()),
            ]),
            Vec::new(),
            vec![format!("PGPASSWORD={password}")],
        ),
        ServiceKind::Mariadb => (
            BTreeMap::from([
                ("MARIADB_ROOT_PASSWORD".into(), root_password.clone()),
                ("MARIADB_USER".into(), user.to_string()),
                ("MARIADB_PASSWORD".into(), password.clone()),
                ("MARIADB_DATABASE".into(), database.to_string()),
            ]),
            Vec::new(),
            vec![format!("MYSQL_PWD={root_password}")],
        ),
        // Nothing reaches it: no password, no persistence of its own.
        ServiceKind::Redis => (
            BTreeMap::new(),
            ["redis-server", "--appendonly", "no", "--save", "", "--dir", "/data"].map(String::from).to_vec(),
            Vec::new(),
        ),
    };
    let mut bytes = 0;
    if kind == ServiceKind::Redis {
        // Redis reads its RDB file as it starts.
        bytes = dump_to_file(job, restic, snapshot, file, &dir.join("dump.rdb")).await?;
    }
    let id = throwaway::start(job, kind, image, &env, &command, dir).await?;
    let db = Database { kind, id: id.clone(), user: user.to_string(), database: database.to_string(), env: exec_env };
    let result = async {
        throwaway::wait_ready(job, &id, &throwaway::probe(kind, user, database), &db.env).await?;
        if kind != ServiceKind::Redis {
            bytes = throwaway::load(job, restic, snapshot, file, &db).await?;
        }
        throwaway::counts(job, &db).await
    }
    .await;
    let removed = throwaway::remove(job, &id).await;
    let counts = result?;
    removed?;
    Ok((bytes, counts))
}

/// `file` of `snapshot` written to `path`; its bytes.
pub(super) async fn dump_to_file(job: &Job, restic: &Restic, snapshot: &str, file: &str, path: &std::path::Path) -> Result<u64, String> {
    let mut out = tokio::fs::File::create(path).await.map_err(|e| super::describe_io(&format!("cannot create {}", path.display()), &e))?;
    let bytes = restic.dump(snapshot, file, &mut out, job.left()).await.map_err(|e| format!("reading the dump back from the repository failed: {e}"))?;
    out.sync_all().await.map_err(|e| super::describe_io(&format!("cannot write {}", path.display()), &e))?;
    Ok(bytes)
}
