//! The runtime-log archive (issue 26): every line the live rings take is
//! also written, in batches, to the log store (`cloudweb_store::LogStore`:
//! `logs.db` beside the state on SQLite, the state database on
//! PostgreSQL), where it outlives a restart, is searched ([`search`]) and
//! is pruned by age and size ([`retention`]).
//!
//! Between the rings and the store is one bounded queue
//! ([`MAX_QUEUED_BYTES`]): a store that falls behind (a slow disk, a full
//! one) costs lines past that bound, counted per app and said by a note
//! line once the store takes writes again, never memory or the uploads'
//! time. Each replica writes the lines its agents upload to it.

pub mod forward;
pub mod retention;
pub mod search;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cloudweb_store::{LogStore, NewLogLine};
use tokio::sync::Notify;

/// Bytes of line text the queue holds before it drops.
pub const MAX_QUEUED_BYTES: usize = 32 * 1024 * 1024;
/// Lines one write transaction carries.
const WRITE_BATCH: usize = 5_000;
/// How long the writer lets lines gather before a write when few are
/// queued (under load, lines gather while the write before runs).
const GATHER: Duration = Duration::from_millis(10);
/// How often a failing store is reported in the log.
const WARN_EVERY: Duration = Duration::from_secs(60);

/// Bounds and pace of the runtime-log store, from the server's flags.
#[derive(Debug, Clone)]
pub struct LogSettings {
    /// Lines older than this are deleted (`--log-retention-days`, 7).
    pub retention: Duration,
    /// Bytes one app's lines may take (`--log-max-mib-per-app`, 200 MiB).
    pub app_max_bytes: u64,
    /// Bytes all lines may take (`--log-max-mib`, 4 GiB).
    pub total_max_bytes: u64,
    /// Lines per second an app may send (`--log-lines-per-second`).
    pub lines_per_second: u32,
    /// Lines an app may send at once after a quiet time
    /// (`--log-burst-lines`).
    pub burst_lines: u32,
    /// How often retention runs (leader only).
    pub prune_every: Duration,
    /// Where lines are also shipped (`--log-forward`), if anywhere.
    pub forward: Option<forward::ForwardTarget>,
}

impl Default for LogSettings {
    fn default() -> Self {
        LogSettings {
            retention: Duration::from_secs(7 * 24 * 3600),
            app_max_bytes: 200 * 1024 * 1024,
            total_max_bytes: 4 * 1024 * 1024 * 1024,
            lines_per_second: 5_000,
            burst_lines: 100_000,
            prune_every: Duration::from_secs(60),
            forward: None,
        }
    }
}

#[derive(Default)]
struct Queue {
    lines: Vec<NewLogLine>,
    bytes: usize,
    /// Lines the queue could not take, per app (with the number of the
    /// first, to place the note).
    unstored: BTreeMap<String, (u64, NewLogLine)>,
    /// Lines cut at an app's rate, to count in its usage.
    dropped: BTreeMap<String, u64>,
}

pub struct LogArchive {
    store: LogStore,
    queue: Mutex<Queue>,
    wake: Notify,
    /// Pushes so far, and the newest push whose lines the store has taken
    /// (or counted as not stored): an upload is answered once its lines
    /// are written, so a line the agent saw accepted survives a crash.
    pushed: std::sync::atomic::AtomicU64,
    written: tokio::sync::watch::Sender<u64>,
    pub settings: LogSettings,
    /// Where written batches are also offered (see [`forward`]).
    forward: std::sync::OnceLock<forward::Forwarder>,
}

/// How long an upload waits for its lines to be written before it is
/// answered anyway (the lines are then in memory only, or counted).
pub const WRITE_WAIT: Duration = Duration::from_secs(5);

impl LogArchive {
    pub fn new(store: LogStore, settings: LogSettings) -> Arc<LogArchive> {
        Arc::new(LogArchive {
            store,
            queue: Mutex::new(Queue::default()),
            wake: Notify::new(),
            pushed: std::sync::atomic::AtomicU64::new(0),
            written: tokio::sync::watch::Sender::new(0),
            settings,
            forward: std::sync::OnceLock::new(),
        })
    }

    /// Starts forwarding to the settings' target, if any: the task that
    /// ships (to spawn beside the writer).
    pub fn start_forwarding(&self) -> Option<impl std::future::Future<Output = ()> + Send + 'static> {
        let target = self.settings.forward.clone()?;
        tracing::info!(target = %target.describe(), "runtime logs: forwarding every stored line");
        let (forwarder, task) = forward::Forwarder::new(target);
        self.forward.set(forwarder).ok()?;
        Some(task)
    }

    /// What forwarding did so far, when it is on.
    pub fn forwarding(&self) -> Option<&forward::Forwarder> {
        self.forward.get()
    }

    /// Waits (at most [`WRITE_WAIT`]) until every line pushed before this
    /// call is written or counted.
    pub async fn written(&self) {
        let ticket = self.pushed.load(std::sync::atomic::Ordering::SeqCst);
        let mut written = self.written.subscribe();
        let _ = tokio::time::timeout(WRITE_WAIT, written.wait_for(|done| *done >= ticket)).await;
    }

    pub fn store(&self) -> &LogStore {
        &self.store
    }

    /// Queues lines for the store; past [`MAX_QUEUED_BYTES`] they are
    /// counted instead.
    pub fn push(&self, lines: Vec<NewLogLine>) {
        if lines.is_empty() {
            return;
        }
        let mut queue = self.queue.lock().expect("log queue lock");
        self.pushed.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        for line in lines {
            if queue.bytes + line.line.len() > MAX_QUEUED_BYTES {
                let entry = queue.unstored.entry(line.source.app.clone()).or_insert_with(|| (0, line.clone()));
                entry.0 += 1;
                continue;
            }
            queue.bytes += line.line.len();
            queue.lines.push(line);
        }
        drop(queue);
        self.wake.notify_one();
    }

    /// Counts lines an app's rate cut (they are in its usage's `dropped`).
    pub fn count_dropped(&self, app: &str, lines: u64) {
        *self.queue.lock().expect("log queue lock").dropped.entry(app.to_string()).or_default() += lines;
        self.wake.notify_one();
    }

    /// Writes what is queued now; false when the store refused it (the
    /// lines are then counted as not stored).
    pub async fn flush(&self) -> bool {
        let (taken, ticket) = {
            let mut queue = self.queue.lock().expect("log queue lock");
            (std::mem::take(&mut *queue), self.pushed.load(std::sync::atomic::Ordering::SeqCst))
        };
        let ok = self.write(taken).await;
        self.written.send_if_modified(|done| {
            let moved = *done < ticket;
            *done = (*done).max(ticket);
            moved
        });
        ok
    }

    async fn write(&self, taken: Queue) -> bool {
        let mut ok = true;
        for (app, lines) in &taken.dropped {
            if let Err(err) = self.store.count_dropped(app, i64::try_from(*lines).unwrap_or(i64::MAX)).await {
                tracing::debug!(error = %err, app = %app, "runtime logs: cannot count dropped lines");
                ok = false;
            }
        }
        if let Some(forwarder) = self.forward.get() {
            forwarder.offer(&taken.lines);
        }
        let mut unstored = taken.unstored;
        for batch in taken.lines.chunks(WRITE_BATCH) {
            if let Err(err) = self.store.insert(batch).await {
                warn_sometimes(&err);
                ok = false;
                for line in batch {
                    let entry = unstored.entry(line.source.app.clone()).or_insert_with(|| (0, line.clone()));
                    entry.0 += 1;
                }
            }
        }
        if !unstored.is_empty() {
            self.note_unstored(unstored).await;
        }
        ok
    }

    /// Says, where they were, how many lines of each app the store did not
    /// take; tried again with the next write when it cannot even take that.
    async fn note_unstored(&self, unstored: BTreeMap<String, (u64, NewLogLine)>) {
        for (app, (count, first)) in unstored {
            let note = NewLogLine {
                stream: "agent".into(),
                line: format!("[{count} lines of {app} were not stored: the log store was full or behind]"),
                ..first.clone()
            };
            let counted = self.store.count_dropped(&app, i64::try_from(count).unwrap_or(i64::MAX)).await;
            if counted.is_err() || self.store.insert(std::slice::from_ref(&note)).await.is_err() {
                let mut queue = self.queue.lock().expect("log queue lock");
                let entry = queue.unstored.entry(app.clone()).or_insert_with(|| (0, first));
                entry.0 += count;
            }
        }
    }

    /// Writes queued lines until the task is aborted (every replica runs
    /// one for the lines its agents upload).
    pub async fn writer(self: Arc<Self>) {
        loop {
            let _ = tokio::time::timeout(Duration::from_secs(5), self.wake.notified()).await;
            let queued = self.queue.lock().expect("log queue lock").lines.len();
            if queued < WRITE_BATCH {
                tokio::time::sleep(GATHER).await;
            }
            if !self.flush().await {
                // A refusing store is not hammered.
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }

    /// Deletes an app's stored lines (the app was deleted).
    pub async fn forget(&self, app: &str) {
        {
            let mut queue = self.queue.lock().expect("log queue lock");
            queue.lines.retain(|l| l.source.app != app);
            queue.bytes = queue.lines.iter().map(|l| l.line.len()).sum();
            queue.unstored.remove(app);
            queue.dropped.remove(app);
        }
        if let Err(err) = self.store.forget(app).await {
            tracing::warn!(app = %app, error = %err, "runtime logs: cannot delete a deleted app's stored lines; retention will");
        }
    }
}

fn warn_sometimes(err: &cloudweb_store::StoreError) {
    static LAST: Mutex<Option<std::time::Instant>> = Mutex::new(None);
    let mut last = LAST.lock().expect("warn lock");
    if last.is_none_or(|at| at.elapsed() >= WARN_EVERY) {
        *last = Some(std::time::Instant::now());
        tracing::warn!(error = %err, disk_full = err.is_disk_full(), "runtime logs: the log store refused a write; those lines are counted as not stored");
    }
}

/// Nanoseconds since the epoch of an RFC 3339 time.
pub fn parse_ts_ns(ts: &str) -> Option<i64> {
    let at = time::OffsetDateTime::parse(ts, &time::format_description::well_known::Rfc3339).ok()?;
    i64::try_from(at.unix_timestamp_nanos()).ok()
}

/// RFC 3339 with nine digits of fraction, as the Engine writes them.
pub fn format_ts_ns(ns: i64) -> String {
    let Ok(at) = time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(ns)) else { return String::new() };
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:09}Z",
        at.year(),
        u8::from(at.month()),
        at.day(),
        at.hour(),
        at.minute(),
        at.second(),
        at.nanosecond()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_go_to_nanoseconds_and_back() {
        let ns = parse_ts_ns("2026-11-30T10:00:00.000000001Z").unwrap();
        assert_eq!(format_ts_ns(ns), "2026-11-30T10:00:00.000000001Z");
        assert_eq!(parse_ts_ns("2026-11-30T11:00:00+01:00"), parse_ts_ns("2026-11-30T10:00:00Z"));
        assert_eq!(parse_ts_ns("yesterday"), None);
        assert_eq!(format_ts_ns(0), "1970-01-01T00:00:00.000000000Z");
    }
}
