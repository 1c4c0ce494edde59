//! Backup jobs on this node (see `cloudweb_protocol::backups` for the
//! commands): snapshots of volumes and services' dumps made with restic
//! ([`backup`]), snapshots checked by restoring them somewhere that does
//! not matter ([`verify`]), and restores into a new volume or in place of
//! one ([`restore`]), the databases among them loaded in throwaway
//! containers ([`throwaway`]).
//!
//! - Each job runs in its own task, at most [`MAX_RUNNING`] at once (the
//!   others wait for a slot), bounded by its `timeout_seconds`, and can be
//!   cancelled (`backup_cancel`): its future is dropped, which kills its
//!   restic and the commands it streams, and then what it left is undone.
//! - What a job does that outlives it if it stops halfway (containers
//!   paused or stopped, a throwaway container, temporary directories, a
//!   swap of directories) is written to `<data>/backup-jobs/<id>.run.json`
//!   before it is done, so an agent killed in the middle undoes it (or, for
//!   a swap already half made, completes it) when it starts again
//!   ([`recover`]), and reports the job `failed`.
//! - Its final report is kept in `<data>/backup-jobs/<id>.json` (0600) for
//!   [`KEEP_FINISHED`]: a command of a job already done is answered with
//!   it again instead of running the job twice.
//! - Reports go to `POST /agent/v1/backup-jobs/{id}`, `running` first; no
//!   secret (the repository's password and credentials, the databases'
//!   passwords) is in a report or a log line.

mod backup;
mod recover;
mod restore;
mod throwaway;
mod verify;

#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cloudweb_protocol::{BackupCancelPayload, BackupJobPayload, BackupJobReport, JobState, Repository, RestorePayload, VerifyPayload};
use cloudweb_restic::Restic;
use futures_util::future::BoxFuture;
use serde::{Deserialize, Serialize};
use tokio::sync::{watch, Semaphore};

use crate::runtime::DockerRuntime;
use crate::services::Services;
use crate::volumes::VOLUMES_DIR;

/// Jobs' records and final reports, under the data directory.
pub const JOBS_DIR: &str = "backup-jobs";
/// restic's cache, under the data directory.
pub const CACHE_DIR: &str = "restic-cache";
/// Jobs that run at once; the others wait.
pub const MAX_RUNNING: usize = 2;
/// How long a final report is kept to answer a command delivered again.
pub const KEEP_FINISHED: Duration = Duration::from_secs(4 * 24 * 3600);
/// Tries of a final report before it waits for the next delivery of its
/// command (or the next agent start).
const REPORT_TRIES: u32 = 5;

/// Where a job's reports go: the control plane, or a test's recorder.
pub trait Reporter: Send + Sync + 'static {
    fn report<'a>(&'a self, job_id: &'a str, report: &'a BackupJobReport) -> BoxFuture<'a, Result<(), String>>;
}

impl Reporter for crate::client::ControlPlane {
    fn report<'a>(&'a self, job_id: &'a str, report: &'a BackupJobReport) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move { self.backup_job(job_id, report).await.map_err(|e| e.to_string()) })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum JobKind {
    Backup,
    Verify,
    Restore,
}

impl JobKind {
    fn noun(self) -> &'static str {
        match self {
            JobKind::Backup => "backup",
            JobKind::Verify => "verification",
            JobKind::Restore => "restore",
        }
    }
}

/// What a running job did that must not outlive it, written before it is
/// done.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct JobRecord {
    pub job_id: String,
    pub kind: JobKind,
    pub started_ms: i64,
    /// Containers paused for a snapshot.
    #[serde(default)]
    pub paused: Vec<String>,
    /// Dumps (`pg_dump`, `mariadb-dump`) started in a service's container:
    /// the Engine's exec ids. Only these are killed after the job, never
    /// an operator's own.
    #[serde(default)]
    pub execs: Vec<String>,
    /// A throwaway container (named after the job) may exist.
    #[serde(default)]
    pub throwaway: bool,
    /// Temporary directories (a verify's, a restore's staging).
    #[serde(default)]
    pub dirs: Vec<PathBuf>,
    /// A restore into a new volume is being put in place under this name.
    #[serde(default)]
    pub commit: Option<restore::Commit>,
    /// A restore in place of a volume is swapping directories.
    #[serde(default)]
    pub swap: Option<restore::Swap>,
}

/// A final report as kept on disk.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Finished {
    finished_ms: i64,
    sent: bool,
    report: BackupJobReport,
}

/// What became of a backup command.
#[derive(Debug, PartialEq, Eq)]
pub enum Accepted {
    /// Started, or waiting for a slot.
    Started,
    /// Already running (or being recovered after a restart): ignored.
    Running,
    /// Done before: its final report is sent again.
    Finished,
    /// The payload is wrong: dropped.
    Invalid(String),
}

#[derive(Clone)]
pub struct Backups {
    inner: Arc<Inner>,
}

struct Inner {
    runtime: DockerRuntime,
    services: Services,
    data_dir: PathBuf,
    reporter: Arc<dyn Reporter>,
    /// Jobs started and not finished, and how to cancel each (the reason).
    jobs: Mutex<HashMap<String, watch::Sender<Option<String>>>>,
    slots: Arc<Semaphore>,
    /// Serializes writes of job records.
    records: Mutex<()>,
}

/// One running job, as its work sees it.
pub(crate) struct Job {
    pub id: String,
    deadline: Instant,
    backups: Backups,
    record: Mutex<JobRecord>,
    /// Whether directories are being swapped (a cancel or the time limit
    /// then waits for the swap to end rather than cut it), and whether the
    /// job is being stopped (no swap begins then).
    gate: Mutex<Gate>,
    secrets: Mutex<Vec<String>>,
}

impl Job {
    pub fn runtime(&self) -> &DockerRuntime {
        &self.backups.inner.runtime
    }

    pub fn services(&self) -> &Services {
        &self.backups.inner.services
    }

    pub fn data_dir(&self) -> &Path {
        &self.backups.inner.data_dir
    }

    /// The time the job has left (at least a second, so a call made at the
    /// very end fails on its own limit rather than with zero).
    pub fn left(&self) -> Duration {
        self.deadline.saturating_duration_since(Instant::now()).max(Duration::from_secs(1))
    }

    /// restic on `repository`, its secrets kept out of every message.
    pub fn restic(&self, repository: &Repository) -> Restic {
        self.add_secret(&repository.password);
        for (key, value) in &repository.env {
            if key != "AWS_DEFAULT_REGION" {
                self.add_secret(value);
            }
        }
        Restic::new(repository.clone(), &self.data_dir().join(CACHE_DIR))
    }

    pub fn add_secret(&self, secret: &str) {
        if secret.len() >= 4 {
            self.secrets.lock().expect("secrets lock").push(secret.to_string());
        }
    }

    pub fn redact(&self, text: &str) -> String {
        let mut secrets = self.secrets.lock().expect("secrets lock").clone();
        secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
        let mut text = text.to_string();
        for secret in secrets {
            text = text.replace(&secret, "[redacted]");
        }
        text
    }

    /// Changes the job's record and writes it, before the change is made.
    pub fn update(&self, change: impl FnOnce(&mut JobRecord)) -> Result<(), String> {
        let mut record = self.record.lock().expect("record lock");
        change(&mut record);
        self.backups.save_record(&record)
    }

    pub fn record(&self) -> JobRecord {
        self.record.lock().expect("record lock").clone()
    }

    /// Before a swap: false when the job is being stopped (the swap must
    /// not begin); else the job cannot be stopped until [`Job::end_swap`].
    pub fn begin_swap(&self) -> bool {
        let mut gate = self.gate.lock().expect("gate lock");
        if gate.stopping {
            return false;
        }
        gate.swapping = true;
        true
    }

    pub fn end_swap(&self) {
        self.gate.lock().expect("gate lock").swapping = false;
    }

    /// For the driver: whether the job may be stopped now (not while it
    /// swaps); once it says yes no swap begins.
    fn try_stop(&self) -> bool {
        let mut gate = self.gate.lock().expect("gate lock");
        if gate.swapping {
            return false;
        }
        gate.stopping = true;
        true
    }

    /// A temporary directory of this job under `<data>/volumes/<parent>`,
    /// recorded, created empty.
    pub fn temp_dir(&self, parent: &str) -> Result<PathBuf, String> {
        let dir = self.data_dir().join(VOLUMES_DIR).join(parent).join(&self.id);
        self.update(|r| {
            if !r.dirs.contains(&dir) {
                r.dirs.push(dir.clone());
            }
        })?;
        remove_tree(&dir)?;
        std::fs::create_dir_all(&dir).map_err(|e| describe_io(&format!("cannot create {}", dir.display()), &e))?;
        Ok(dir)
    }
}

#[derive(Default)]
struct Gate {
    swapping: bool,
    stopping: bool,
}

/// How a job's run ended.
enum Ended {
    Done(Result<BackupJobReport, String>),
    Cancelled(String),
    TimedOut(u32),
}

impl Backups {
    /// Reads the records of jobs an earlier agent did not finish; a
    /// service whose data it was swapping stays held until
    /// [`Backups::recover`] has settled the swap.
    pub fn new(runtime: DockerRuntime, services: Services, data_dir: &Path, reporter: Arc<dyn Reporter>) -> Backups {
        let backups = Backups {
            inner: Arc::new(Inner {
                runtime,
                services,
                data_dir: data_dir.to_path_buf(),
                reporter,
                jobs: Mutex::new(HashMap::new()),
                slots: Arc::new(Semaphore::new(MAX_RUNNING)),
                records: Mutex::new(()),
            }),
        };
        for record in backups.unfinished() {
            if let Some(service) = record.swap.as_ref().and_then(|s| s.held.as_deref()) {
                backups.inner.services.hold_now(service, &record.job_id);
            }
        }
        backups
    }

    fn jobs_dir(&self) -> PathBuf {
        self.inner.data_dir.join(JOBS_DIR)
    }

    fn record_path(&self, job_id: &str) -> PathBuf {
        self.jobs_dir().join(format!("{job_id}.run.json"))
    }

    fn finished_path(&self, job_id: &str) -> PathBuf {
        self.jobs_dir().join(format!("{job_id}.json"))
    }

    fn save_record(&self, record: &JobRecord) -> Result<(), String> {
        let _lock = self.inner.records.lock().expect("records lock");
        let dir = self.jobs_dir();
        std::fs::create_dir_all(&dir).map_err(|e| describe_io(&format!("cannot create {}", dir.display()), &e))?;
        let path = self.record_path(&record.job_id);
        let bytes = serde_json::to_vec(record).expect("record serializes");
        crate::files::write_private(&path, &bytes).map_err(|e| format!("cannot record the job: {e}"))
    }

    fn unfinished(&self) -> Vec<JobRecord> {
        let Ok(entries) = std::fs::read_dir(self.jobs_dir()) else { return Vec::new() };
        entries
            .filter_map(Result::ok)
            .filter(|e| e.file_name().to_string_lossy().ends_with(".run.json"))
            .filter_map(|e| std::fs::read(e.path()).ok().and_then(|b| serde_json::from_slice::<JobRecord>(&b).ok()))
            .collect()
    }

    fn finished(&self, job_id: &str) -> Option<Finished> {
        std::fs::read(self.finished_path(job_id)).ok().and_then(|b| serde_json::from_slice(&b).ok())
    }

    fn save_finished(&self, job_id: &str, finished: &Finished) {
        let path = self.finished_path(job_id);
        let _ = std::fs::create_dir_all(self.jobs_dir());
        let bytes = serde_json::to_vec(finished).expect("report serializes");
        if let Err(err) = crate::files::write_private(&path, &bytes) {
            tracing::warn!(job_id, error = %err, "could not keep the job's final report");
        }
    }

    /// Whether a job is running or waiting for a slot now.
    pub fn is_running(&self, job_id: &str) -> bool {
        self.inner.jobs.lock().expect("jobs lock").contains_key(job_id)
    }

    /// `backup_run`.
    pub fn run(&self, payload: BackupJobPayload) -> Accepted {
        if let Err(err) = payload.validate() {
            return Accepted::Invalid(err.to_string());
        }
        let (job_id, timeout) = (payload.job_id.clone(), payload.timeout_seconds);
        self.start(&job_id, JobKind::Backup, timeout, move |job| Box::pin(async move { backup::run(&job, &payload).await }))
    }

    /// `backup_verify`.
    pub fn verify(&self, payload: VerifyPayload) -> Accepted {
        if let Err(err) = payload.validate() {
            return Accepted::Invalid(err.to_string());
        }
        let (job_id, timeout) = (payload.job_id.clone(), payload.timeout_seconds);
        self.start(&job_id, JobKind::Verify, timeout, move |job| Box::pin(async move { verify::run(&job, &payload).await }))
    }

    /// `backup_restore`.
    pub fn restore(&self, payload: RestorePayload) -> Accepted {
        if let Err(err) = payload.validate() {
            return Accepted::Invalid(err.to_string());
        }
        let (job_id, timeout) = (payload.job_id.clone(), payload.timeout_seconds);
        self.start(&job_id, JobKind::Restore, timeout, move |job| Box::pin(async move { restore::run(&job, &payload).await }))
    }

    /// `backup_cancel`: true when the job was running or waiting here. A
    /// job that ended before gets its final report sent again, so the
    /// control plane learns how it ended.
    pub fn cancel(&self, payload: &BackupCancelPayload) -> Result<bool, String> {
        payload.validate().map_err(|e| e.to_string())?;
        let reason = payload.reason.clone().unwrap_or_else(|| "cancelled".to_string());
        if let Some(cancel) = self.inner.jobs.lock().expect("jobs lock").get(&payload.job_id) {
            tracing::info!(job_id = %payload.job_id, %reason, "cancelling the backup job");
            let _ = cancel.send(Some(reason));
            return Ok(true);
        }
        if let Some(finished) = self.finished(&payload.job_id) {
            let (backups, job_id) = (self.clone(), payload.job_id.clone());
            tokio::spawn(async move { backups.send_final(&job_id, finished).await });
        }
        Ok(false)
    }

    fn start<F>(&self, job_id: &str, kind: JobKind, timeout_seconds: u32, work: F) -> Accepted
    where
        F: FnOnce(Arc<Job>) -> BoxFuture<'static, Result<BackupJobReport, String>> + Send + 'static,
    {
        let cancelled = {
            let mut jobs = self.inner.jobs.lock().expect("jobs lock");
            if jobs.contains_key(job_id) {
                tracing::info!(job_id, "the backup job runs already; the command delivered again is ignored");
                return Accepted::Running;
            }
            if self.record_path(job_id).exists() {
                // Left by an agent that stopped in the middle; `recover`
                // settles and reports it.
                return Accepted::Running;
            }
            if let Some(finished) = self.finished(job_id) {
                tracing::info!(job_id, state = ?finished.report.state, "the backup job is done; its report is sent again");
                let backups = self.clone();
                let job_id = job_id.to_string();
                tokio::spawn(async move { backups.send_final(&job_id, finished).await });
                return Accepted::Finished;
            }
            let (cancel, cancelled) = watch::channel(None);
            jobs.insert(job_id.to_string(), cancel);
            cancelled
        };
        let backups = self.clone();
        let job_id = job_id.to_string();
        tokio::spawn(async move { backups.drive(job_id, kind, timeout_seconds, cancelled, work).await });
        Accepted::Started
    }

    /// Runs one job from its slot to its final report.
    async fn drive<F>(self, job_id: String, kind: JobKind, timeout_seconds: u32, mut cancelled: watch::Receiver<Option<String>>, work: F)
    where
        F: FnOnce(Arc<Job>) -> BoxFuture<'static, Result<BackupJobReport, String>> + Send + 'static,
    {
        let slot = tokio::select! {
            slot = self.inner.slots.clone().acquire_owned() => slot.ok(),
            reason = reason_of(&mut cancelled) => {
                let reason = reason.unwrap_or_default();
                let mut report = BackupJobReport::new(JobState::Cancelled);
                report.message = Some(format!("cancelled before it started: {reason}"));
                self.conclude(&job_id, report).await;
                return;
            }
        };
        let started = Instant::now();
        let record = JobRecord {
            job_id: job_id.clone(),
            kind,
            started_ms: crate::timestamp::now_ms(),
            paused: Vec::new(),
            execs: Vec::new(),
            throwaway: false,
            dirs: Vec::new(),
            commit: None,
            swap: None,
        };
        let job = Arc::new(Job {
            id: job_id.clone(),
            deadline: Instant::now() + Duration::from_secs(u64::from(timeout_seconds)),
            backups: self.clone(),
            record: Mutex::new(record.clone()),
            gate: Mutex::new(Gate::default()),
            secrets: Mutex::new(Vec::new()),
        });
        if let Err(reason) = self.save_record(&record) {
            let mut report = BackupJobReport::new(JobState::Failed);
            report.message = Some(reason);
            self.conclude(&job_id, report).await;
            drop(slot);
            return;
        }
        tracing::info!(job_id, kind = kind.noun(), "backup job started");
        // One try: the work does not wait on the control plane.
        if let Err(err) = tokio::time::timeout(Duration::from_secs(10), self.inner.reporter.report(&job_id, &BackupJobReport::new(JobState::Running))).await.unwrap_or(Err("timed out".into())) {
            tracing::warn!(job_id, error = %err, "could not report the job running");
        }
        let mut task = AbortOnDrop(tokio::spawn(work(job.clone())));
        // A cancel or the time limit that comes during a swap waits for
        // it: the swap ends on its own, quickly, and cutting it would
        // leave the volume's containers stopped.
        let (mut cancel_seen, mut over_time) = (false, false);
        let deadline = tokio::time::Instant::from_std(job.deadline);
        let ended = loop {
            tokio::select! {
                result = &mut task.0 => break Ended::Done(match result {
                    Ok(result) => result,
                    Err(err) if err.is_panic() => {
                        tracing::error!(job_id, error = %err, "the backup job panicked");
                        Err(format!("the agent hit an internal error running the {}; see the agent's log on the node", kind.noun()))
                    }
                    Err(_) => Err("the job was stopped".into()),
                }),
                Ok(reason) = reason_of(&mut cancelled), if !cancel_seen => {
                    if !job.try_stop() {
                        cancel_seen = true;
                        continue;
                    }
                    task.stop().await;
                    break Ended::Cancelled(reason);
                }
                () = tokio::time::sleep_until(deadline), if !over_time => {
                    if !job.try_stop() {
                        over_time = true;
                        continue;
                    }
                    task.stop().await;
                    break Ended::TimedOut(timeout_seconds);
                }
            }
        };
        // The work's future is dropped by now: its restic and its streams
        // are gone. Undo what it left.
        let cleanup = self.clean_up(&job.record()).await;
        let mut report = match ended {
            Ended::Done(Ok(report)) => report,
            Ended::Done(Err(reason)) => {
                let mut report = BackupJobReport::new(JobState::Failed);
                report.message = Some(reason);
                report
            }
            Ended::Cancelled(reason) => {
                let mut report = BackupJobReport::new(JobState::Cancelled);
                report.message = Some(format!("cancelled: {reason}"));
                report
            }
            Ended::TimedOut(seconds) => {
                let mut report = BackupJobReport::new(JobState::Failed);
                report.message = Some(format!("the {} ran over its {seconds} s limit and was stopped", kind.noun()));
                report
            }
        };
        if let Err(problem) = cleanup {
            report.message = Some(match report.message.take() {
                Some(message) => format!("{message}; {problem}"),
                None => problem,
            });
        }
        if report.duration_ms.is_none() {
            report.duration_ms = Some(started.elapsed().as_millis() as u64);
        }
        report.message = report.message.map(|m| cloudweb_protocol::misc::one_line(&job.redact(&m), cloudweb_protocol::misc::MAX_REPORT_MESSAGE));
        report.detail = report.detail.map(|m| cloudweb_protocol::misc::one_line(&job.redact(&m), cloudweb_protocol::misc::MAX_REPORT_MESSAGE));
        tracing::info!(job_id, kind = kind.noun(), state = ?report.state, message = ?report.message, "backup job ended");
        drop(slot);
        self.conclude(&job_id, report).await;
    }

    /// Keeps the final report, forgets the job's record and sends it.
    async fn conclude(&self, job_id: &str, report: BackupJobReport) {
        let finished = Finished { finished_ms: crate::timestamp::now_ms(), sent: false, report };
        self.save_finished(job_id, &finished);
        let _ = std::fs::remove_file(self.record_path(job_id));
        self.inner.jobs.lock().expect("jobs lock").remove(job_id);
        self.send_final(job_id, finished).await;
    }

    async fn send_final(&self, job_id: &str, mut finished: Finished) {
        for attempt in 1..=REPORT_TRIES {
            match self.inner.reporter.report(job_id, &finished.report).await {
                Ok(()) => {
                    if !finished.sent {
                        finished.sent = true;
                        self.save_finished(job_id, &finished);
                    }
                    return;
                }
                Err(err) => {
                    tracing::warn!(job_id, attempt, error = %err, "could not report the backup job");
                    if attempt < REPORT_TRIES {
                        tokio::time::sleep(Duration::from_secs(u64::from(attempt) * 2)).await;
                    }
                }
            }
        }
    }

    /// Undoes what a job that ended left: containers unpaused, its
    /// throwaway container and temporary directories removed, a swap
    /// settled. An error says what could not be undone.
    async fn clean_up(&self, record: &JobRecord) -> Result<(), String> {
        let runtime = &self.inner.runtime;
        let mut problems = Vec::new();
        for id in &record.paused {
            if let Err(err) = runtime.unpause(id).await {
                tracing::warn!(job_id = %record.job_id, container = %id, error = %err, "could not unpause a container");
                problems.push(format!("container {id} could not be unpaused: {err}"));
            }
        }
        for exec in &record.execs {
            match runtime.kill_exec(exec).await {
                Ok(false) => {}
                Ok(true) => tracing::info!(job_id = %record.job_id, exec = %exec, "killed the job's dump, which was still running"),
                Err(err) => {
                    tracing::warn!(job_id = %record.job_id, exec = %exec, error = %err, "could not kill the job's dump");
                    problems.push(format!("its dump (exec {exec}) could not be killed: {err}"));
                }
            }
        }
        if record.throwaway {
            let name = crate::runtime::throwaway_name(&record.job_id);
            if let Err(err) = runtime.kill_and_remove(&name).await {
                tracing::warn!(job_id = %record.job_id, container = %name, error = %err, "could not remove the throwaway container");
                problems.push(format!("the throwaway container {name} could not be removed: {err}"));
            }
        }
        if let Some(swap) = &record.swap {
            if let Err(err) = restore::settle(self, swap, false).await {
                problems.push(err);
            }
        }
        for dir in &record.dirs {
            let dir = dir.clone();
            match tokio::task::spawn_blocking(move || remove_tree(&dir)).await {
                Ok(Ok(())) => {}
                Ok(Err(err)) => problems.push(err),
                Err(err) => problems.push(format!("removing a temporary directory did not finish: {err}")),
            }
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems.join("; "))
        }
    }

    /// The agent stops: every job is cancelled and given `limit` to clean
    /// up and report.
    pub async fn shutdown(&self, limit: Duration) {
        let senders: Vec<watch::Sender<Option<String>>> = self.inner.jobs.lock().expect("jobs lock").values().cloned().collect();
        if senders.is_empty() {
            return;
        }
        for sender in &senders {
            let _ = sender.send(Some("the agent is shutting down".into()));
        }
        let ended = async {
            while !self.inner.jobs.lock().expect("jobs lock").is_empty() {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        };
        if tokio::time::timeout(limit, ended).await.is_err() {
            tracing::warn!("backup jobs did not end within {} s of the shutdown; the next start cleans up after them", limit.as_secs());
        }
    }
}

/// Waits for a cancel: its reason (Err when it can no longer come).
async fn reason_of(cancelled: &mut watch::Receiver<Option<String>>) -> Result<String, watch::error::RecvError> {
    cancelled.wait_for(Option::is_some).await.map(|reason| reason.clone().unwrap_or_default())
}

/// A job's task, aborted when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<Result<BackupJobReport, String>>);

impl AbortOnDrop {
    /// Aborts the task and waits until its future is dropped.
    async fn stop(&mut self) {
        self.0.abort();
        let _ = (&mut self.0).await;
    }
}

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

pub(crate) fn remove_tree(path: &Path) -> Result<(), String> {
    match std::fs::remove_dir_all(path) {
        Ok(()) => Ok(()),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(err) => Err(format!("cannot remove {}: {err}", path.display())),
    }
}

/// An I/O failure in words; a full disk said so plainly.
pub(crate) fn describe_io(what: &str, err: &std::io::Error) -> String {
    if err.raw_os_error() == Some(libc::ENOSPC) {
        format!("this node's disk is full: {what}: {err}")
    } else {
        format!("{what}: {err}")
    }
}

/// Whether a message (restic's, a tool's) says the local disk is full.
pub(crate) fn says_disk_full(text: &str) -> bool {
    let lower = text.to_lowercase();
    lower.contains("no space left on device") || lower.contains("disk full") || lower.contains("disk is full")
}

/// Regular files under `root` and their bytes (symlinks not followed).
pub(crate) fn count_tree(root: &Path) -> (u64, u64) {
    let (mut files, mut bytes) = (0u64, 0u64);
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        for entry in entries.filter_map(Result::ok) {
            let Ok(meta) = entry.path().symlink_metadata() else { continue };
            if meta.is_dir() {
                stack.push(entry.path());
            } else if meta.is_file() {
                files += 1;
                bytes = bytes.saturating_add(meta.len());
            }
        }
    }
    (files, bytes)
}
