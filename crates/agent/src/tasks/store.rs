//! The final reports of runs that ended on this node, one file each,
//! `<data>/task-runs/<run id>.json` (0600): a `task_run` delivered again
//! for a run that ended is answered with its report instead of running it
//! a second time, and a report the control plane did not take yet is sent
//! again later. A report keeps its output lines only until it was sent.
//! Records go after [`KEEP`], and the oldest once there are more than
//! [`MAX_RECORDS`].

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use cloudweb_protocol::TaskRunReport;
use serde::{Deserialize, Serialize};

/// The records' directory, under the data directory.
pub const DIR: &str = "task-runs";
/// How long a final report is kept.
pub const KEEP: Duration = Duration::from_secs(7 * 24 * 3600);
/// Most records kept.
pub const MAX_RECORDS: usize = 2000;

/// A run's final report as kept on disk.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Finished {
    pub finished_ms: i64,
    /// The control plane took it (or refused it for good).
    pub sent: bool,
    pub report: TaskRunReport,
}

pub struct Store {
    dir: PathBuf,
    max_records: usize,
    /// Serializes the read-modify-writes.
    lock: Mutex<()>,
}

impl Store {
    pub fn new(data_dir: &Path) -> Store {
        Store::with_max(data_dir, MAX_RECORDS)
    }

    pub fn with_max(data_dir: &Path, max_records: usize) -> Store {
        Store { dir: data_dir.join(DIR), max_records, lock: Mutex::new(()) }
    }

    /// A record's file. Run ids are checked (`tr_` and 16 hex digits)
    /// before they get here; anything else gets no file.
    fn path(&self, run_id: &str) -> Option<PathBuf> {
        cloudweb_protocol::tasks::run_id(run_id).ok().map(|()| self.dir.join(format!("{run_id}.json")))
    }

    pub fn get(&self, run_id: &str) -> Option<Finished> {
        let path = self.path(run_id)?;
        std::fs::read(path).ok().and_then(|bytes| serde_json::from_slice(&bytes).ok())
    }

    pub fn put(&self, run_id: &str, finished: &Finished) -> Result<(), String> {
        let _lock = self.lock.lock().expect("task store lock");
        self.write(run_id, finished)?;
        self.prune_locked(SystemTime::now(), true);
        Ok(())
    }

    fn write(&self, run_id: &str, finished: &Finished) -> Result<(), String> {
        let path = self.path(run_id).ok_or_else(|| format!("{run_id:?} is not a run id"))?;
        std::fs::create_dir_all(&self.dir).map_err(|e| format!("cannot create {}: {e}", self.dir.display()))?;
        let bytes = serde_json::to_vec(finished).expect("a report serializes");
        crate::files::write_private(&path, &bytes).map_err(|e| format!("cannot keep the run's final report: {e}"))
    }

    /// The report went out: kept without its lines from now on.
    pub fn mark_sent(&self, run_id: &str) {
        let _lock = self.lock.lock().expect("task store lock");
        let Some(mut finished) = self.get(run_id) else { return };
        finished.sent = true;
        finished.report.lines.clear();
        if let Err(err) = self.write(run_id, &finished) {
            tracing::warn!(run_id, error = %err, "could not note the run's final report as sent");
        }
    }

    /// The ids of the reports not sent yet.
    pub fn unsent(&self) -> Vec<String> {
        let Ok(entries) = std::fs::read_dir(&self.dir) else { return Vec::new() };
        entries
            .filter_map(Result::ok)
            .filter_map(|e| e.file_name().to_string_lossy().strip_suffix(".json").map(str::to_string))
            .filter(|id| self.get(id).is_some_and(|f| !f.sent))
            .collect()
    }

    /// Removes the records older than [`KEEP`] at `now`, files that are no
    /// record, and the oldest records beyond [`MAX_RECORDS`]. Goes by the
    /// files' times, so it reads no record. Returns how many went.
    pub fn prune(&self, now: SystemTime) -> usize {
        let _lock = self.lock.lock().expect("task store lock");
        self.prune_locked(now, false)
    }

    /// `only_over_count`: only the oldest beyond the bound, and only when
    /// there are too many (after each write: a directory listing, no more).
    fn prune_locked(&self, now: SystemTime, only_over_count: bool) -> usize {
        if only_over_count && std::fs::read_dir(&self.dir).map_or(0, |entries| entries.count()) <= self.max_records {
            return 0;
        }
        let Ok(entries) = std::fs::read_dir(&self.dir) else { return 0 };
        let mut records: Vec<(SystemTime, PathBuf)> = Vec::new();
        let mut removed = 0;
        for entry in entries.filter_map(Result::ok) {
            let name = entry.file_name().to_string_lossy().into_owned();
            let is_record = name.strip_suffix(".json").is_some_and(|id| cloudweb_protocol::tasks::run_id(id).is_ok());
            let modified = entry.metadata().and_then(|m| m.modified()).unwrap_or(now);
            if !is_record {
                // A `write_private` temporary file left by a crash, or
                // anything else: nothing reads it.
                if !only_over_count && now.duration_since(modified).unwrap_or_default() > Duration::from_secs(3600) {
                    removed += usize::from(std::fs::remove_file(entry.path()).is_ok());
                }
                continue;
            }
            if !only_over_count && now.duration_since(modified).unwrap_or_default() > KEEP {
                removed += usize::from(std::fs::remove_file(entry.path()).is_ok());
                continue;
            }
            records.push((modified, entry.path()));
        }
        if records.len() > self.max_records {
            records.sort();
            let excess = records.len() - self.max_records;
            for (_, path) in records.into_iter().take(excess) {
                removed += usize::from(std::fs::remove_file(path).is_ok());
            }
        }
        removed
    }
}
