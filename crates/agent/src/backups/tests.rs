//! Backup jobs against the real restic, on a repository in a temporary
//! directory, and the node's real Docker Engine where containers take part
//! (paused, stopped for a swap, a service container whose dump fails).
//! The databases' own tests are in `database_tests`.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cloudweb_protocol::{
    BackupCancelPayload, BackupJobPayload, BackupJobReport, BackupSource, Expected, JobState, Replace, Repository, RestorePayload, ServiceKind, VerifyPayload,
};
use futures_util::future::BoxFuture;
use sha2::{Digest, Sha256};

use super::*;

mod database_tests;

pub(super) const BUSYBOX: &str = "cloudweb-test/busybox:latest";
const PASSWORD: &str = "correct horse battery staple";

/// Every report, in order.
#[derive(Default)]
pub(super) struct Recorder {
    reports: Mutex<Vec<(String, BackupJobReport)>>,
}

impl Reporter for Recorder {
    fn report<'a>(&'a self, job_id: &'a str, report: &'a BackupJobReport) -> BoxFuture<'a, Result<(), String>> {
        self.reports.lock().unwrap().push((job_id.to_string(), report.clone()));
        Box::pin(async { Ok(()) })
    }
}

impl Recorder {
    pub fn of(&self, job_id: &str) -> Vec<BackupJobReport> {
        self.reports.lock().unwrap().iter().filter(|(id, _)| id == job_id).map(|(_, r)| r.clone()).collect()
    }

    /// The `n`th final report of a job (1 for the first), waited for.
    pub async fn final_report_n(&self, job_id: &str, n: usize, limit: Duration) -> BackupJobReport {
        let started = std::time::Instant::now();
        loop {
            let finals: Vec<BackupJobReport> = self.of(job_id).into_iter().filter(|r| r.state.is_some_and(JobState::is_final)).collect();
            if finals.len() >= n {
                return finals[n - 1].clone();
            }
            assert!(started.elapsed() < limit, "no final report of {job_id} within {limit:?}: {:?}", self.of(job_id));
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub async fn final_report(&self, job_id: &str, limit: Duration) -> BackupJobReport {
        self.final_report_n(job_id, 1, limit).await
    }

    pub async fn wait_running(&self, job_id: &str, limit: Duration) {
        let started = std::time::Instant::now();
        while !self.of(job_id).iter().any(|r| r.state == Some(JobState::Running)) {
            assert!(started.elapsed() < limit, "{job_id} did not start");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

pub(super) struct Fixture {
    pub dir: tempfile::TempDir,
    pub data: PathBuf,
    pub repository: Repository,
    pub runtime: DockerRuntime,
    pub services: Services,
    pub backups: Backups,
    pub recorder: Arc<Recorder>,
    pub node: String,
}

pub(super) fn job_id() -> String {
    use rand::Rng;
    format!("bj_{:016x}", rand::rng().random::<u64>())
}

impl Fixture {
    pub async fn new() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        std::fs::create_dir_all(data.join("volumes")).unwrap();
        let repository = Repository { url: dir.path().join("repo").to_string_lossy().into_owned(), password: PASSWORD.into(), env: BTreeMap::new() };
        Restic::new(repository.clone(), &dir.path().join("init-cache")).init(Duration::from_secs(60)).await.unwrap();
        Fixture::on(dir, data, repository)
    }

    /// Another agent (a restart) on the same data directory.
    pub fn on(dir: tempfile::TempDir, data: PathBuf, repository: Repository) -> Fixture {
        let node = format!("n-backup-test-{}", &job_id()[3..11]);
        let runtime = DockerRuntime::new("unix:///var/run/docker.sock", &node).unwrap();
        let services = Services::new(runtime.clone(), &data, Some("127.0.0.1".into()));
        let recorder = Arc::new(Recorder::default());
        let backups = Backups::new(runtime.clone(), services.clone(), &data, recorder.clone());
        Fixture { dir, data, repository, runtime, services, backups, recorder, node }
    }

    pub fn volume(&self, name: &str) -> PathBuf {
        crate::volumes::dir(&self.data, name)
    }

    pub fn backup(&self, source: BackupSource) -> BackupJobPayload {
        BackupJobPayload {
            job_id: job_id(),
            source,
            repository: self.repository.clone(),
            tags: vec!["cloudweb".into()],
            retention: None,
            exec_env: BTreeMap::new(),
            timeout_seconds: 300,
        }
    }

    pub fn restore(&self, snapshot: &str, source: BackupSource, into: &str, replace: Option<Replace>) -> RestorePayload {
        RestorePayload {
            job_id: job_id(),
            snapshot: snapshot.into(),
            source,
            repository: self.repository.clone(),
            into_volume: into.into(),
            replace,
            service: None,
            timeout_seconds: 300,
        }
    }

    pub async fn run(&self, payload: BackupJobPayload) -> BackupJobReport {
        let id = payload.job_id.clone();
        assert_eq!(self.backups.run(payload), Accepted::Started);
        self.recorder.final_report(&id, Duration::from_secs(240)).await
    }

    pub async fn run_restore(&self, payload: RestorePayload) -> BackupJobReport {
        let id = payload.job_id.clone();
        assert_eq!(self.backups.restore(payload), Accepted::Started);
        self.recorder.final_report(&id, Duration::from_secs(240)).await
    }

    pub async fn run_verify(&self, payload: VerifyPayload) -> BackupJobReport {
        let id = payload.job_id.clone();
        assert_eq!(self.backups.verify(payload), Accepted::Started);
        self.recorder.final_report(&id, Duration::from_secs(240)).await
    }

    pub async fn snapshots(&self, tags: &[String]) -> Vec<cloudweb_restic::Snapshot> {
        let restic = Restic::new(self.repository.clone(), &self.dir.path().join("init-cache"));
        restic.unlock(Duration::from_secs(60)).await.unwrap();
        restic.snapshots(tags, Duration::from_secs(60)).await.unwrap()
    }
}

/// Every entry under `root`: relative path → (mode, content digest or
/// link target).
pub(super) fn tree(root: &Path) -> BTreeMap<String, (u32, String)> {
    let mut entries = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let meta = path.symlink_metadata().unwrap();
            let name = path.strip_prefix(root).unwrap().to_string_lossy().into_owned();
            let what = if meta.is_dir() {
                stack.push(path.clone());
                "dir".to_string()
            } else if meta.file_type().is_symlink() {
                format!("-> {}", std::fs::read_link(&path).unwrap().display())
            } else {
                hex::encode(Sha256::digest(std::fs::read(&path).unwrap()))
            };
            entries.insert(name, (meta.permissions().mode() & 0o7777, what));
        }
    }
    entries
}

fn write(path: &Path, contents: &[u8], mode: u32) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, contents).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// Bytes that do not compress or deduplicate.
fn noise(len: usize, seed: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(len + 32);
    let mut block = Sha256::digest(seed.to_le_bytes()).to_vec();
    while out.len() < len {
        block = Sha256::digest(&block).to_vec();
        out.extend_from_slice(&block);
    }
    out.truncate(len);
    out
}

/// A volume of known files: modes, a symlink, an empty file, nested dirs.
fn fill_volume(dir: &Path) -> (u64, u64) {
    write(&dir.join("a.txt"), b"alpha\n", 0o640);
    write(&dir.join("bin/run.sh"), b"#!/bin/sh\necho hi\n", 0o755);
    write(&dir.join("nested/deep/big.bin"), &noise(1 << 20, 1), 0o600);
    write(&dir.join("empty"), b"", 0o644);
    std::fs::set_permissions(dir.join("nested"), std::fs::Permissions::from_mode(0o750)).unwrap();
    std::os::unix::fs::symlink("a.txt", dir.join("link")).unwrap();
    (4, 6 + 18 + (1 << 20))
}

/// Removes a container when dropped (also when the test fails).
pub(super) struct ContainerGuard(pub String);

impl Drop for ContainerGuard {
    fn drop(&mut self) {
        let _ = Command::new("docker").args(["rm", "-f", "-v", &self.0]).output();
    }
}

/// Runs `scripts/<name>` (which builds the local test images when they are
/// missing, under a lock) once per test process.
pub(super) fn ensure_script(name: &'static str) {
    static OUTCOMES: Mutex<BTreeMap<&'static str, Result<(), String>>> = Mutex::new(BTreeMap::new());
    let mut outcomes = OUTCOMES.lock().unwrap_or_else(|e| e.into_inner());
    let outcome = outcomes.entry(name).or_insert_with(|| {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts").join(name);
        let out = Command::new("bash").arg(&script).stdin(std::process::Stdio::null()).output().map_err(|e| e.to_string())?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!("{name} failed: {}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
        }
    });
    if let Err(err) = outcome {
        panic!("{err}");
    }
}

/// `docker run -d` of busybox with `args` (after the image); its id.
pub(super) fn busybox(name: &str, volume: &Path, mount: &str, script: &str) -> ContainerGuard {
    ensure_script("images.sh");
    let out = Command::new("docker")
        .args(["run", "-d", "--name", name, "-v", &format!("{}:{mount}", volume.display()), BUSYBOX, "sh", "-c", script])
        .output()
        .unwrap();
    assert!(out.status.success(), "docker run: {}", String::from_utf8_lossy(&out.stderr));
    ContainerGuard(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

pub(super) fn inspect(id: &str, format: &str) -> String {
    let out = Command::new("docker").args(["inspect", "-f", format, id]).output().unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[tokio::test]
async fn a_volume_is_backed_up_verified_and_restored_identical() {
    let fx = Fixture::new().await;
    let source = BackupSource::Volume { volume: "uploads".into(), pause: false };
    let (files, bytes) = fill_volume(&fx.volume("uploads"));
    let original = tree(&fx.volume("uploads"));

    let payload = fx.backup(source.clone());
    let job = payload.job_id.clone();
    let report = fx.run(payload.clone()).await;
    assert_eq!(report.state, Some(JobState::Succeeded), "{report:?}");
    assert_eq!((report.files, report.bytes), (Some(files), Some(bytes)), "{report:?}");
    assert!(report.added_bytes.unwrap() > 0 && report.duration_ms.is_some(), "{report:?}");
    assert_eq!(report.pruned, None, "no retention asked");
    let snapshot = report.snapshot.clone().unwrap();
    let states: Vec<_> = fx.recorder.of(&job).iter().map(|r| r.state.unwrap()).collect();
    assert_eq!(states, vec![JobState::Running, JobState::Succeeded]);
    // Tagged with the target and the job.
    let tagged = fx.snapshots(&[format!("job={job}")]).await;
    assert_eq!(tagged.len(), 1);
    assert!(tagged[0].tags.contains(&"target=volume/uploads".to_string()) && tagged[0].tags.contains(&"cloudweb".to_string()), "{:?}", tagged[0].tags);

    // Delivered again: the same report, no second snapshot.
    assert_eq!(fx.backups.run(payload), Accepted::Finished);
    let again = fx.recorder.final_report_n(&job, 2, Duration::from_secs(10)).await;
    assert_eq!(again, report);
    assert_eq!(fx.snapshots(&[]).await.len(), 1);
    let kept = fx.data.join(JOBS_DIR).join(format!("{job}.json"));
    assert_eq!(std::fs::metadata(&kept).unwrap().permissions().mode() & 0o777, 0o600);

    // Verified by restoring, against what the backup reported.
    let verify = VerifyPayload {
        job_id: job_id(),
        snapshot: snapshot.clone(),
        source: source.clone(),
        repository: fx.repository.clone(),
        image: None,
        expected: Some(Expected { files, bytes }),
        read_data_percent: 100,
        timeout_seconds: 120,
    };
    let verified = fx.run_verify(verify.clone()).await;
    assert_eq!(verified.state, Some(JobState::Succeeded), "{verified:?}");
    assert_eq!(verified.counts, Some(BTreeMap::from([("files".to_string(), files), ("bytes".to_string(), bytes)])));
    assert!(verified.detail.as_deref().unwrap().contains("as the backup had"), "{verified:?}");
    let wrong = fx.run_verify(VerifyPayload { job_id: job_id(), expected: Some(Expected { files: files + 1, bytes }), ..verify }).await;
    assert_eq!(wrong.state, Some(JobState::Failed));
    assert!(wrong.message.as_deref().unwrap().contains("but the backup had"), "{wrong:?}");
    assert_eq!(std::fs::read_dir(fx.data.join("volumes/.verify")).unwrap().count(), 0, "the verifications' copies are removed");

    // Restored into a new volume: identical, modes and link included.
    std::fs::remove_dir_all(fx.volume("uploads")).unwrap();
    let restored = fx.run_restore(fx.restore(&snapshot, source.clone(), "uploads-copy", None)).await;
    assert_eq!(restored.state, Some(JobState::Succeeded), "{restored:?}");
    assert_eq!((restored.files, restored.bytes), (Some(files), Some(bytes)));
    assert_eq!(tree(&fx.volume("uploads-copy")), original);
    assert_eq!(std::fs::read_dir(fx.data.join("volumes/.restoring")).unwrap().count(), 0);
    // Never over a volume that has data.
    let refused = fx.run_restore(fx.restore(&snapshot, source, "uploads-copy", None)).await;
    assert_eq!(refused.state, Some(JobState::Failed));
    assert!(refused.message.as_deref().unwrap().contains("already has data"), "{refused:?}");
    assert_eq!(tree(&fx.volume("uploads-copy")), original);
    // No secret anywhere in what was reported.
    for (_, report) in fx.recorder.reports.lock().unwrap().iter() {
        assert!(!serde_json::to_string(report).unwrap().contains(PASSWORD));
    }
}

#[tokio::test]
async fn retention_runs_after_a_success_and_a_failed_backup_never_prunes() {
    let fx = Fixture::new().await;
    write(&fx.volume("logs").join("one"), b"1", 0o644);
    let source = BackupSource::Volume { volume: "logs".into(), pause: false };
    for n in 0..2 {
        write(&fx.volume("logs").join(format!("more-{n}")), b"x", 0o644);
        assert_eq!(fx.run(fx.backup(source.clone())).await.state, Some(JobState::Succeeded));
    }
    assert_eq!(fx.snapshots(&[]).await.len(), 2);
    // A volume that is not there fails, and the retention does not run.
    let keep_one = Some(cloudweb_protocol::Retention { keep_daily: 1, keep_weekly: 0, keep_monthly: 0 });
    let failed = fx.run(BackupJobPayload { retention: keep_one, ..fx.backup(BackupSource::Volume { volume: "absent".into(), pause: false }) }).await;
    assert_eq!(failed.state, Some(JobState::Failed));
    assert!(failed.message.as_deref().unwrap().contains("holds no data for volume absent"), "{failed:?}");
    assert_eq!(failed.pruned, None);
    assert_eq!(fx.snapshots(&[]).await.len(), 2, "nothing pruned");
    let pruned = fx.run(BackupJobPayload { retention: keep_one, ..fx.backup(source) }).await;
    assert_eq!((pruned.state, pruned.pruned), (Some(JobState::Succeeded), Some(true)), "{pruned:?}");
    assert_eq!(fx.snapshots(&[]).await.len(), 1, "one daily snapshot kept");
}

#[tokio::test]
async fn a_paused_backup_pauses_the_volumes_containers_and_unpauses_them() {
    let fx = Fixture::new().await;
    let dir = fx.volume("busy");
    for n in 0..48 {
        write(&dir.join(format!("f{n}")), &noise(1 << 20, n), 0o644);
    }
    let container = busybox(&format!("cw-test-pause-{}", &job_id()[3..11]), &dir, "/v", "while true; do date >> /v/log; sleep 0.05; done");
    let payload = fx.backup(BackupSource::Volume { volume: "busy".into(), pause: true });
    let job = payload.job_id.clone();
    assert_eq!(fx.backups.run(payload), Accepted::Started);
    let mut seen_paused = false;
    while fx.recorder.of(&job).iter().all(|r| !r.state.unwrap().is_final()) {
        seen_paused |= inspect(&container.0, "{{.State.Paused}}") == "true";
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let report = fx.recorder.final_report(&job, Duration::from_secs(5)).await;
    assert_eq!(report.state, Some(JobState::Succeeded), "{report:?}");
    assert!(seen_paused, "the container was paused during the snapshot");
    assert_eq!(inspect(&container.0, "{{.State.Paused}} {{.State.Running}}"), "false true");
}

#[tokio::test]
async fn a_restore_in_place_keeps_the_previous_data_and_restarts_its_containers() {
    let fx = Fixture::new().await;
    let source = BackupSource::Volume { volume: "site".into(), pause: false };
    fill_volume(&fx.volume("site"));
    let original = tree(&fx.volume("site"));
    let snapshot = fx.run(fx.backup(source.clone())).await.snapshot.unwrap();
    // Changed after the backup, with a container using it.
    std::fs::remove_file(fx.volume("site/a.txt")).unwrap();
    write(&fx.volume("site/new.txt"), b"after the backup", 0o644);
    let changed = tree(&fx.volume("site"));
    let container = busybox(&format!("cw-test-swap-{}", &job_id()[3..11]), &fx.volume("site"), "/v", "sleep 3600");
    let replace = Replace { volume: "site".into(), keep_as: "site-before-restore-1".into() };
    let report = fx.run_restore(fx.restore(&snapshot, source.clone(), "site-restore", Some(replace.clone()))).await;
    assert_eq!(report.state, Some(JobState::Succeeded), "{report:?}");
    assert_eq!(tree(&fx.volume("site")), original);
    assert_eq!(tree(&fx.volume("site-before-restore-1")), changed);
    assert!(!fx.volume("site-restore").exists());
    // Started again, and it sees the restored data.
    assert_eq!(inspect(&container.0, "{{.State.Running}}"), "true");
    let out = Command::new("docker").args(["exec", &container.0, "cat", "/v/a.txt"]).output().unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "alpha\n");
    // keep_as taken: refused before anything is touched.
    let again = fx.run_restore(fx.restore(&snapshot, source, "site-restore", Some(replace))).await;
    assert_eq!(again.state, Some(JobState::Failed));
    assert!(again.message.as_deref().unwrap().contains("already has data"), "{again:?}");
    assert_eq!(tree(&fx.volume("site")), original);
}

/// A service container that is busybox with a `pg_dump` of `script`.
fn fake_database(fx: &Fixture, service: &str, script: &str) -> ContainerGuard {
    std::fs::create_dir_all(fx.volume(&format!("{service}-data"))).unwrap();
    let setup = format!("printf '%s\\n' '#!/bin/sh' '{script}' > /bin/pg_dump && chmod +x /bin/pg_dump && sleep 3600");
    busybox(&cloudweb_protocol::services::container_name(service), &fx.volume(&format!("{service}-data")), "/var/lib/postgresql/data", &setup)
}

fn service_source(service: &str) -> BackupSource {
    BackupSource::Service {
        service: service.into(),
        service_kind: ServiceKind::Postgres,
        volume: format!("{service}-data"),
        user: "app".into(),
        database: "app".into(),
    }
}

#[tokio::test]
async fn a_dump_that_fails_midway_leaves_no_snapshot() {
    let fx = Fixture::new().await;
    let service = format!("fake{}", &job_id()[3..11]);
    let _container = fake_database(&fx, &service, "head -c 3000000 /dev/zero; echo \"dump failed, secret $PGPASSWORD\" >&2; exit 3");
    // The script starts with the container; give it a moment.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut payload = fx.backup(service_source(&service));
    payload.exec_env.insert("PGPASSWORD".into(), "pg-password-of-the-test".into());
    payload.retention = Some(cloudweb_protocol::Retention::DEFAULT);
    let report = fx.run(payload).await;
    assert_eq!(report.state, Some(JobState::Failed), "{report:?}");
    let message = report.message.unwrap();
    assert!(message.contains("pg_dump exited with code 3") && message.contains("dump failed"), "{message}");
    assert!(!message.contains("pg-password-of-the-test"), "{message}");
    assert_eq!(report.pruned, None);
    assert!(fx.snapshots(&[]).await.is_empty(), "a cut dump is no snapshot");
}

#[tokio::test]
async fn a_cancelled_or_overdue_job_stops_and_leaves_nothing() {
    let fx = Fixture::new().await;
    let service = format!("slow{}", &job_id()[3..11]);
    let _container = fake_database(&fx, &service, "head -c 100000 /dev/zero; sleep 600");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let payload = fx.backup(service_source(&service));
    let job = payload.job_id.clone();
    assert_eq!(fx.backups.run(payload.clone()), Accepted::Started);
    fx.recorder.wait_running(&job, Duration::from_secs(30)).await;
    assert_eq!(fx.backups.run(payload), Accepted::Running, "a running job is not started twice");
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(fx.backups.cancel(&BackupCancelPayload { job_id: job.clone(), reason: Some("the service was deleted".into()) }).unwrap());
    let report = fx.recorder.final_report(&job, Duration::from_secs(20)).await;
    assert_eq!(report.state, Some(JobState::Cancelled), "{report:?}");
    assert!(report.message.as_deref().unwrap().contains("the service was deleted"), "{report:?}");
    assert!(!fx.backups.is_running(&job));
    assert!(!fx.data.join(JOBS_DIR).join(format!("{job}.run.json")).exists());
    // Cancelled again once it ended: its final report again.
    assert_eq!(fx.backups.cancel(&BackupCancelPayload { job_id: job.clone(), reason: None }), Ok(false));
    assert_eq!(fx.recorder.final_report_n(&job, 2, Duration::from_secs(10)).await, report);

    let overdue = BackupJobPayload { timeout_seconds: 10, ..fx.backup(service_source(&service)) };
    let report = fx.run(overdue).await;
    assert_eq!(report.state, Some(JobState::Failed), "{report:?}");
    assert!(report.message.as_deref().unwrap().contains("ran over its 10 s limit"), "{report:?}");
    assert!(fx.snapshots(&[]).await.is_empty());
    assert_eq!(fx.backups.cancel(&BackupCancelPayload { job_id: job_id(), reason: None }), Ok(false));
}

#[tokio::test]
async fn an_agent_restart_settles_what_its_predecessor_left() {
    let fx = Fixture::new().await;
    let source = BackupSource::Volume { volume: "docs".into(), pause: false };
    fill_volume(&fx.volume("docs"));
    let original = tree(&fx.volume("docs"));
    let snapshot = fx.run(fx.backup(source.clone())).await.snapshot.unwrap();
    let (dir, data, repository) = (fx.dir, fx.data, fx.repository);

    // Killed while restoring into the staging directory.
    let cut = job_id();
    let staging = data.join("volumes/.restoring").join(&cut);
    write(&staging.join("partial"), &noise(1000, 2), 0o644);
    // Killed with a container paused for a snapshot, and a throwaway
    // container running.
    let paused = busybox(&format!("cw-test-paused-{}", &cut[3..11]), &crate::volumes::dir(&data, "docs"), "/v", "sleep 3600");
    assert!(Command::new("docker").args(["pause", &paused.0]).status().unwrap().success());
    let interrupted_backup = job_id();
    // Killed in the middle of a swap: the previous data set aside, the
    // restored data not in place yet.
    let swapped = job_id();
    let swap_staging = data.join("volumes/.restoring").join(&swapped);
    let restic = Restic::new(repository.clone(), &dir.path().join("init-cache"));
    restic.restore(&snapshot, &swap_staging, Duration::from_secs(60)).await.unwrap();
    write(&crate::volumes::dir(&data, "wiki").join("old.txt"), b"previous", 0o644);
    std::fs::rename(crate::volumes::dir(&data, "wiki"), crate::volumes::dir(&data, "wiki-before-restore-1")).unwrap();
    let record = |job_id: &str, kind| JobRecord { job_id: job_id.into(), kind, started_ms: 1, paused: Vec::new(), execs: Vec::new(), throwaway: false, dirs: Vec::new(), commit: None, swap: None };
    let jobs = data.join(JOBS_DIR);
    std::fs::create_dir_all(&jobs).unwrap();
    let save = |r: &JobRecord| std::fs::write(jobs.join(format!("{}.run.json", r.job_id)), serde_json::to_vec(r).unwrap()).unwrap();
    save(&JobRecord { dirs: vec![staging.clone()], ..record(&cut, JobKind::Restore) });
    save(&JobRecord { paused: vec![paused.0.clone()], ..record(&interrupted_backup, JobKind::Backup) });
    let swap = restore::Swap {
        volume: "wiki".into(),
        keep_as: "wiki-before-restore-1".into(),
        staging: swap_staging.clone(),
        stopped: Vec::new(),
        held: None,
        files: 4,
        bytes: 10,
    };
    save(&JobRecord { dirs: vec![swap_staging.clone()], swap: Some(swap), ..record(&swapped, JobKind::Restore) });

    let fx = Fixture::on(dir, data, repository);
    ensure_script("images.sh");
    // A throwaway container of this node that no job runs.
    let leftover = Command::new("docker")
        .args(["create", "--label", &format!("cloudweb.node={}", fx.node), "--label", "cloudweb.role=backup-throwaway", "--label", "cloudweb.backup-job=bj_00000000000000aa", BUSYBOX, "true"])
        .output()
        .unwrap();
    let leftover = ContainerGuard(String::from_utf8_lossy(&leftover.stdout).trim().to_string());
    // A command delivered again meanwhile does not start the job over.
    assert_eq!(fx.backups.run(BackupJobPayload { job_id: interrupted_backup.clone(), ..fx.backup(source.clone()) }), Accepted::Running);
    fx.backups.recover().await;

    let report = fx.recorder.final_report(&cut, Duration::from_secs(10)).await;
    assert_eq!(report.state, Some(JobState::Failed));
    assert!(report.message.as_deref().unwrap().contains("agent restarted during the restore"), "{report:?}");
    assert!(!staging.exists(), "the partial copy is removed");
    assert_eq!(tree(&fx.volume("docs")), original, "the volume is untouched");
    let report = fx.recorder.final_report(&interrupted_backup, Duration::from_secs(10)).await;
    assert_eq!(report.state, Some(JobState::Failed));
    assert_eq!(inspect(&paused.0, "{{.State.Paused}}"), "false");
    let report = fx.recorder.final_report(&swapped, Duration::from_secs(10)).await;
    assert_eq!(report.state, Some(JobState::Succeeded), "{report:?}");
    assert_eq!(tree(&fx.volume("wiki")), original, "the half-made swap is completed");
    assert_eq!(std::fs::read(fx.volume("wiki-before-restore-1/old.txt")).unwrap(), b"previous");
    assert_eq!(inspect(&leftover.0, "{{.Id}}"), "", "the leftover throwaway is removed");
    assert!(std::fs::read_dir(fx.data.join(JOBS_DIR)).unwrap().all(|e| !e.unwrap().file_name().to_string_lossy().ends_with(".run.json")));

    // A retry under a new job id succeeds.
    let retried = fx.run_restore(fx.restore(&snapshot, source, "docs-restored", None)).await;
    assert_eq!(retried.state, Some(JobState::Succeeded), "{retried:?}");
    assert_eq!(tree(&fx.volume("docs-restored")), original);
}

#[tokio::test]
async fn a_restore_that_fills_the_disk_fails_plainly_and_leaves_the_volume() {
    let fx = Fixture::new().await;
    let source = BackupSource::Volume { volume: "media".into(), pause: false };
    write(&fx.volume("media/big.bin"), &noise(8 << 20, 3), 0o644);
    let snapshot = fx.run(fx.backup(source.clone())).await.snapshot.unwrap();
    // Another node whose data directory is a 4 MiB file system.
    let small = fx.dir.path().join("small");
    let _tmpfs = Tmpfs::mount(&small, "4m");
    write(&crate::volumes::dir(&small, "media").join("current.txt"), b"the data in use", 0o644);
    let other = Fixture::on(tempfile::tempdir().unwrap(), small.clone(), fx.repository.clone());
    let replace = Replace { volume: "media".into(), keep_as: "media-before-restore-1".into() };
    let report = other.run_restore(other.restore(&snapshot, source, "media-restore", Some(replace))).await;
    assert_eq!(report.state, Some(JobState::Failed), "{report:?}");
    let message = report.message.unwrap();
    assert!(message.contains("disk is full"), "{message}");
    assert_eq!(std::fs::read(crate::volumes::dir(&small, "media/current.txt")).unwrap(), b"the data in use");
    assert!(!crate::volumes::dir(&small, "media-before-restore-1").exists());
    assert_eq!(std::fs::read_dir(small.join("volumes/.restoring")).unwrap().count(), 0, "the partial copy is removed");
}

/// A tmpfs of `size` at `dir`, unmounted on drop (the tests run as root,
/// like the e2e fault suite).
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(dir: &Path, size: &str) -> Tmpfs {
        std::fs::create_dir_all(dir).unwrap();
        let status = Command::new("mount").args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"]).arg(dir).status().unwrap();
        assert!(status.success(), "mounting a tmpfs at {} (needs root)", dir.display());
        Tmpfs(dir.to_path_buf())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

#[tokio::test]
async fn at_most_two_jobs_run_at_once_and_a_waiting_one_can_be_cancelled() {
    let fx = Fixture::new().await;
    let service = format!("busy{}", &job_id()[3..11]);
    let _container = fake_database(&fx, &service, "head -c 1000 /dev/zero; sleep 600");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let jobs: Vec<BackupJobPayload> = (0..3).map(|_| fx.backup(service_source(&service))).collect();
    for job in &jobs {
        assert_eq!(fx.backups.run(job.clone()), Accepted::Started);
    }
    fx.recorder.wait_running(&jobs[0].job_id, Duration::from_secs(30)).await;
    fx.recorder.wait_running(&jobs[1].job_id, Duration::from_secs(30)).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(fx.recorder.of(&jobs[2].job_id).is_empty(), "the third waits for a slot");
    let out = Command::new("docker").args(["top", &_container.0]).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("pg_dump"), "the two dumps run");
    assert!(fx.backups.is_running(&jobs[2].job_id));
    fx.backups.cancel(&BackupCancelPayload { job_id: jobs[2].job_id.clone(), reason: None }).unwrap();
    let report = fx.recorder.final_report(&jobs[2].job_id, Duration::from_secs(10)).await;
    assert_eq!(report.state, Some(JobState::Cancelled));
    assert!(report.message.as_deref().unwrap().contains("before it started"), "{report:?}");
    for job in &jobs[..2] {
        fx.backups.cancel(&BackupCancelPayload { job_id: job.job_id.clone(), reason: None }).unwrap();
        assert_eq!(fx.recorder.final_report(&job.job_id, Duration::from_secs(20)).await.state, Some(JobState::Cancelled));
    }
    // No dump goes on in the service's container for nobody.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let out = Command::new("docker").args(["top", &_container.0]).output().unwrap();
    let processes = String::from_utf8_lossy(&out.stdout);
    assert!(!processes.contains("pg_dump"), "{processes}");
}

#[tokio::test]
async fn a_held_service_is_left_stopped_by_the_supervisor_until_released() {
    let fx = Fixture::new().await;
    ensure_script("images.sh");
    let name = format!("held{}", &job_id()[3..11]);
    let spec = cloudweb_protocol::ServicePayload {
        service: name.clone(),
        kind: ServiceKind::Redis,
        image: BUSYBOX.into(),
        env: BTreeMap::new(),
        command: vec!["sleep".into(), "3600".into()],
        volume: format!("{name}-data"),
        host_port: std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port(),
        memory_bytes: None,
        health: vec!["true".into()],
        generation: 1,
        set_password: None,
    };
    let _guard = ContainerGuard(cloudweb_protocol::services::container_name(&name));
    fx.services.run(spec).unwrap();
    let supervisor = tokio::spawn(fx.services.clone().supervise());
    let running = || async { fx.runtime.service_container(&name).await.unwrap().is_some_and(|c| c.running) };
    let started = std::time::Instant::now();
    while !running().await {
        assert!(started.elapsed() < Duration::from_secs(30), "the supervisor did not start the service");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    fx.services.hold(&name, "bj_0000000000000001").await;
    let id = fx.runtime.service_container(&name).await.unwrap().unwrap().id;
    fx.runtime.stop_keep(&id).await.unwrap();
    // Well past the supervisor's grace for a stopped container.
    tokio::time::sleep(Duration::from_secs(7)).await;
    assert!(!running().await, "a held service stays stopped");
    assert!(fx.services.statuses().iter().any(|s| s.service == name && s.state == "restarting"));
    fx.services.release(&name);
    let released = std::time::Instant::now();
    while !running().await {
        assert!(released.elapsed() < Duration::from_secs(15), "the released service was not started again");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    supervisor.abort();
    let _ = fx.runtime.remove_service(&name).await;
}

/// The restore a kill test kills: run in a child process (this test
/// binary, started again on this test alone) when
/// `CLOUDWEB_BACKUP_KILL_CHILD` names its job; a no-op in the normal run.
#[tokio::test]
async fn kill_test_child_restores_until_killed() {
    let Ok(job) = std::env::var("CLOUDWEB_BACKUP_KILL_CHILD") else { return };
    let payload: RestorePayload = serde_json::from_str(&job).unwrap();
    let data = PathBuf::from(std::env::var("CLOUDWEB_BACKUP_KILL_DATA").unwrap());
    let fx = Fixture::on(tempfile::tempdir().unwrap(), data, payload.repository.clone());
    assert_eq!(fx.backups.restore(payload), Accepted::Started);
    tokio::time::sleep(Duration::from_secs(600)).await;
}

#[tokio::test]
async fn an_agent_killed_mid_restore_leaves_the_volume_and_a_retry_succeeds() {
    let fx = Fixture::new().await;
    let source = BackupSource::Volume { volume: "bulk".into(), pause: false };
    for n in 0..6 {
        write(&fx.volume(&format!("bulk/part{n}")), &noise(16 << 20, 10 + n), 0o644);
    }
    let original = tree(&fx.volume("bulk"));
    let snapshot = fx.run(fx.backup(source.clone())).await.snapshot.unwrap();
    let payload = fx.restore(&snapshot, source.clone(), "bulk-restore", Some(Replace { volume: "bulk".into(), keep_as: "bulk-before-restore-1".into() }));
    let staging = fx.data.join("volumes/.restoring").join(&payload.job_id);
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "backups::tests::kill_test_child_restores_until_killed", "--nocapture"])
        .env("CLOUDWEB_BACKUP_KILL_CHILD", serde_json::to_string(&payload).unwrap())
        .env("CLOUDWEB_BACKUP_KILL_DATA", &fx.data)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Killed (SIGKILL) as soon as restic writes into the staging directory.
    let started = std::time::Instant::now();
    while !staging.exists() || std::fs::read_dir(&staging).unwrap().count() == 0 {
        assert!(started.elapsed() < Duration::from_secs(60), "the child never started restoring");
        std::thread::sleep(Duration::from_millis(5));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(fx.data.join(JOBS_DIR).join(format!("{}.run.json", payload.job_id)).exists());
    let (_, bytes) = count_tree(&staging);
    assert!(bytes < 96 << 20, "killed before the restore was whole ({bytes} bytes)");

    // The next agent on the same data directory.
    let (dir, data, repository) = (fx.dir, fx.data, fx.repository);
    let fx = Fixture::on(dir, data, repository);
    // restic died with its parent (no restore goes on writing).
    tokio::time::sleep(Duration::from_millis(500)).await;
    fx.backups.recover().await;
    let report = fx.recorder.final_report(&payload.job_id, Duration::from_secs(10)).await;
    assert_eq!(report.state, Some(JobState::Failed));
    assert!(report.message.as_deref().unwrap().contains("agent restarted during the restore"), "{report:?}");
    assert!(!staging.exists(), "the partial copy is removed");
    assert_eq!(tree(&fx.volume("bulk")), original, "the volume is untouched");
    assert!(!fx.volume("bulk-before-restore-1").exists());
    // Delivered again: its report, not a second run.
    assert_eq!(fx.backups.restore(payload.clone()), Accepted::Finished);
    let retried = fx.run_restore(RestorePayload { job_id: job_id(), ..payload }).await;
    assert_eq!(retried.state, Some(JobState::Succeeded), "{retried:?}");
    assert_eq!(tree(&fx.volume("bulk")), original);
    assert_eq!(tree(&fx.volume("bulk-before-restore-1")), original);
}
