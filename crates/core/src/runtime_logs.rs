//! Runtime logs: the recent stdout/stderr lines of each app's instances,
//! uploaded by agents (`POST /agent/v1/logs`) and read by users
//! (`GET /api/apps/{name}/logs`, live with `?follow=1`).
//!
//! They are kept in memory only, in one ring per app, and every bound is
//! fixed here:
//! - an app keeps its newest [`MAX_APP_LINES`] lines and at most
//!   [`MAX_APP_BYTES`] of line text (the oldest go first);
//! - all apps together hold at most [`MAX_TOTAL_BYTES`]: past it, the app
//!   holding the most loses its oldest lines;
//! - a container's repeated lines (an agent that restarts sends its last
//!   lines again) are recognised by their timestamps and dropped.
//!
//! The rings are the live part: every line they take is also handed to
//! the archive ([`crate::log_archive`]), which writes it to the log store
//! in batches, where it outlives a restart and is searched. Before a ring,
//! an app's lines pass its rate limit ([`crate::log_rate`]): what is cut
//! is counted and noted in place.
//!
//! A restart of the control plane empties the rings; the tail and a
//! follower's resumption are then read from the store ([`RuntimeLogs::tail`]).
//! Line numbers (`seq`, the SSE event id) are one sequence for all apps
//! that starts at the control plane's start time in microseconds, or above
//! the highest number stored, so they keep growing across a restart and a
//! follower that reconnects with the last id it saw gets every line stored
//! since, none twice.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use serde::Serialize;
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

use crate::hub::Hub;
use crate::log_archive::LogArchive;
use crate::log_rate::{Rate, RateLimits};

/// Lines an app's ring keeps.
pub const MAX_APP_LINES: usize = 2000;
/// Bytes of line text an app's ring keeps.
pub const MAX_APP_BYTES: usize = 2 * 1024 * 1024;
/// Bytes of line text all rings keep together.
pub const MAX_TOTAL_BYTES: usize = 128 * 1024 * 1024;
/// Containers per app whose newest timestamp is remembered beyond those
/// that still have lines in the ring.
const MAX_CONTAINERS_REMEMBERED: usize = 64;
/// What one stored line costs besides its text (its fields and the ring).
const LINE_OVERHEAD: usize = 160;

/// What is passed to the other replicas (see `runtime_log_relay`, which
/// cuts it into `NOTIFY` payloads).
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Relayed {
    /// Lines of an app as they were stored (numbered).
    Lines { app: String, lines: Vec<RuntimeLine> },
    /// An app (or service) deleted: its lines go.
    Forget(String),
}

/// One stored line, as the user API shows it.
#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
pub struct RuntimeLine {
    /// Grows with every line stored (one sequence for all apps, starting
    /// at the control plane's start time in microseconds, so it keeps
    /// growing across restarts): the SSE event id, so a reconnecting client
    /// asks for what came after.
    pub seq: u64,
    pub ts: String,
    /// `stdout`, `stderr`, or `agent` for a note of the platform's own
    /// (lines lost on the node).
    pub stream: String,
    pub line: String,
    pub deployment_id: String,
    pub instance: u32,
    pub node_id: String,
    pub container: String,
}

impl RuntimeLine {
    fn cost(&self) -> usize {
        self.line.len() + self.ts.len() + self.container.len() + LINE_OVERHEAD
    }
}

#[derive(Default)]
struct Ring {
    lines: VecDeque<RuntimeLine>,
    bytes: usize,
    /// Per container: the newest timestamp stored and how many lines had
    /// exactly that timestamp, to recognise lines sent again.
    last: HashMap<String, (OffsetDateTime, u32)>,
}

impl Ring {
    /// Numbers and stores `line`; a copy goes to `stored` when given.
    fn push(&mut self, mut line: RuntimeLine, seq: &mut u64, stored: Option<&mut Vec<RuntimeLine>>) {
        *seq += 1;
        line.seq = *seq;
        if let Some(stored) = stored {
            stored.push(line.clone());
        }
        self.bytes += line.cost();
        self.lines.push_back(line);
        while self.lines.len() > MAX_APP_LINES || self.bytes > MAX_APP_BYTES {
            self.pop_oldest();
        }
    }

    fn pop_oldest(&mut self) -> usize {
        match self.lines.pop_front() {
            Some(line) => {
                let cost = line.cost();
                self.bytes -= cost;
                cost
            }
            None => 0,
        }
    }
}

/// A container's new lines, as an upload brings them.
pub struct Incoming<'a> {
    pub app: &'a str,
    pub deployment_id: &'a str,
    pub instance: u32,
    pub node_id: &'a str,
    pub container: &'a str,
    pub dropped: u64,
    pub lines: &'a [cloudweb_protocol::LogLine],
    /// The control plane's clock, for the note about lost lines when no
    /// line came with it.
    pub now_ms: i64,
}

pub struct RuntimeLogs {
    rings: Mutex<Inner>,
    /// "New lines" per app, for followers.
    hub: Hub,
    /// Where what is stored here is passed to the other control-plane
    /// replicas (PostgreSQL; see `runtime_log_relay`).
    relay: std::sync::OnceLock<tokio::sync::mpsc::Sender<Relayed>>,
    /// Where stored lines go to be kept (see [`RuntimeLogs::attach`]).
    archive: std::sync::OnceLock<std::sync::Arc<LogArchive>>,
    /// Per-app rate limits, once an archive sets them.
    limits: Mutex<Option<RateLimits>>,
}

struct Inner {
    apps: HashMap<String, Ring>,
    total: usize,
    /// The last `seq` given.
    seq: u64,
    /// Uploads whose lines are not written to the store yet: first line
    /// number → app. Lines from the lowest on are not shown (see
    /// [`Held`]).
    held: std::collections::BTreeMap<u64, String>,
}

impl Inner {
    /// The highest line number shown: every line up to it is written (or
    /// was never to be).
    fn visible(&self) -> u64 {
        self.held.keys().next().map_or(self.seq, |first| first - 1)
    }
}

/// Lines of one upload, not shown until this is dropped: a follower sees a
/// line only once the store has it, so a crash of the control plane
/// between the two cannot show a line that the agent then sends again
/// (unanswered) and the next run stores and shows a second time. The
/// upload handler drops it after `LogArchive::written`; dropping it early
/// (a cancelled request) shows the lines then.
pub struct Held<'a> {
    logs: &'a RuntimeLogs,
    first: Option<u64>,
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        let Some(first) = self.first else { return };
        let app = self.logs.rings.lock().expect("runtime log lock").held.remove(&first);
        if let Some(app) = app {
            self.logs.hub.notify(&app, "logs");
        }
    }
}

impl Default for RuntimeLogs {
    /// Numbers lines from the system clock's microseconds, so that they go
    /// on growing after a restart.
    fn default() -> RuntimeLogs {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        RuntimeLogs::numbered_after(u64::try_from(now.as_micros()).unwrap_or(u64::MAX / 2))
    }
}

impl Inner {
    /// While over [`MAX_TOTAL_BYTES`], takes the oldest line of the app
    /// holding the most.
    fn trim_total(&mut self) {
        while self.total > MAX_TOTAL_BYTES {
            let Some(largest) = self.apps.values_mut().max_by_key(|r| r.bytes) else { break };
            let freed = largest.pop_oldest();
            if freed == 0 {
                break;
            }
            self.total -= freed;
        }
    }
}

impl RuntimeLogs {
    /// Empty rings whose first line gets `seq` one above `seq`.
    pub fn numbered_after(seq: u64) -> RuntimeLogs {
        RuntimeLogs {
            rings: Mutex::new(Inner { apps: HashMap::new(), total: 0, seq, held: Default::default() }),
            hub: Hub::default(),
            relay: Default::default(),
            archive: Default::default(),
            limits: Mutex::new(None),
        }
    }

    /// Hands every line stored from now on to `archive` too, numbers lines
    /// above `stored_seq` (the highest the store holds) and limits each
    /// app to the archive's rate.
    pub fn attach(&self, archive: std::sync::Arc<LogArchive>, stored_seq: u64) {
        let settings = &archive.settings;
        let rate = Rate { per_second: f64::from(settings.lines_per_second), burst: f64::from(settings.burst_lines.max(1)) };
        *self.limits.lock().expect("log limits lock") = Some(RateLimits::new(rate));
        {
            let mut inner = self.rings.lock().expect("runtime log lock");
            inner.seq = inner.seq.max(stored_seq);
        }
        let _ = self.archive.set(archive);
    }

    /// The archive, once attached.
    pub fn archive(&self) -> Option<std::sync::Arc<LogArchive>> {
        self.archive.get().cloned()
    }

    /// Passes what is stored here from now on to `relay` too (the other
    /// replicas); a full relay drops, and the lines stay here.
    pub fn relay_to(&self, relay: tokio::sync::mpsc::Sender<Relayed>) {
        let _ = self.relay.set(relay);
    }

    fn pass_on(&self, relayed: impl FnOnce() -> Relayed) {
        if let Some(relay) = self.relay.get() {
            if relay.try_send(relayed()).is_err() {
                tracing::debug!("the runtime-log relay is full; other replicas miss these lines");
            }
        }
    }

    /// Stores a container's new lines (passing what was stored, with its
    /// line numbers, to the other replicas); returns how many were new.
    pub fn append(&self, incoming: Incoming<'_>) -> u64 {
        self.append_held(incoming).0
    }

    /// [`RuntimeLogs::append`], the lines not shown until the [`Held`] is
    /// dropped (when an archive is attached; at once otherwise).
    pub fn append_held(&self, incoming: Incoming<'_>) -> (u64, Held<'_>) {
        let mut stored = (self.relay.get().is_some() || self.archive.get().is_some()).then(Vec::new);
        let (accepted, first) = self.store(&incoming, stored.as_mut());
        let held = Held { logs: self, first };
        if let Some(lines) = stored.filter(|lines| !lines.is_empty()) {
            if let Some(archive) = self.archive.get() {
                let now_ns = incoming.now_ms.saturating_mul(1_000_000);
                archive.push(lines.iter().map(|line| to_stored(incoming.app, line, now_ns)).collect());
            }
            if self.relay.get().is_some() {
                self.pass_on(|| Relayed::Lines { app: incoming.app.to_string(), lines });
            }
        }
        (accepted, held)
    }

    /// What another replica stored (see `runtime_log_relay`): its lines
    /// keep their numbers, so a follower that reconnects to another
    /// replica with the last one it saw (`Last-Event-ID`) misses and
    /// repeats nothing; this replica's own numbering goes on above them
    /// (it may lead next).
    pub fn take_relayed(&self, relayed: Relayed) {
        let (app, lines) = match relayed {
            Relayed::Lines { app, lines } => (app, lines),
            Relayed::Forget(app) => return self.drop_app(&app),
        };
        {
            let mut inner = self.rings.lock().expect("runtime log lock");
            let inner = &mut *inner;
            let ring = inner.apps.entry(app.clone()).or_default();
            let before = ring.bytes;
            for line in lines {
                if ring.lines.back().is_some_and(|last| last.seq >= line.seq) {
                    continue;
                }
                inner.seq = inner.seq.max(line.seq);
                // What an agent that sends its last lines again is checked
                // against, should this replica lead.
                if let Ok(ts) = OffsetDateTime::parse(&line.ts, &Rfc3339) {
                    let last = ring.last.entry(line.container.clone()).or_insert((ts, 0));
                    if last.0 == ts {
                        last.1 += 1;
                    } else if ts > last.0 {
                        *last = (ts, 1);
                    }
                }
                ring.bytes += line.cost();
                ring.lines.push_back(line);
                while ring.lines.len() > MAX_APP_LINES || ring.bytes > MAX_APP_BYTES {
                    ring.pop_oldest();
                }
            }
            let after = ring.bytes;
            inner.total = (inner.total + after).saturating_sub(before);
            inner.trim_total();
        }
        self.hub.notify(&app, "logs");
    }

    /// Numbers and keeps new lines; how many, and the first number given
    /// when they are held until written.
    fn store(&self, incoming: &Incoming<'_>, mut stored: Option<&mut Vec<RuntimeLine>>) -> (u64, Option<u64>) {
        let mut accepted = 0;
        let mut first = None;
        {
            let mut inner = self.rings.lock().expect("runtime log lock");
            let inner = &mut *inner;
            let before_seq = inner.seq;
            let seq = &mut inner.seq;
            let ring = inner.apps.entry(incoming.app.to_string()).or_default();
            let before = ring.bytes;
            let make = |ts: String, stream: &str, text: String| RuntimeLine {
                seq: 0,
                ts,
                stream: stream.to_string(),
                line: text,
                deployment_id: incoming.deployment_id.to_string(),
                instance: incoming.instance,
                node_id: incoming.node_id.to_string(),
                container: incoming.container.to_string(),
            };
            if incoming.dropped > 0 {
                let ts = match incoming.lines.first() {
                    Some(first) => first.ts.clone(),
                    None => crate::clock::rfc3339_ms(incoming.now_ms),
                };
                let note = format!(
                    "[{} lines of {} were lost on the node: its log buffer was full]",
                    incoming.dropped, incoming.container
                );
                ring.push(make(ts, "agent", note), seq, stored.as_deref_mut());
            }
            // Lines sent again by an agent that restarted: every line older
            // than the newest stored one of this container, and as many
            // lines with exactly its timestamp as were stored with it.
            let mut last = ring.last.get(incoming.container).copied();
            let mut repeats = last.map_or(0, |(_, count)| count);
            let mut fresh = Vec::with_capacity(incoming.lines.len());
            for new in incoming.lines {
                // A timestamp that does not parse cannot be compared; the
                // line is stored as it is.
                if let Ok(ts) = OffsetDateTime::parse(&new.ts, &Rfc3339) {
                    match last {
                        Some((newest, _)) if ts < newest => continue,
                        Some((newest, count)) if ts == newest => {
                            if repeats > 0 {
                                repeats -= 1;
                                continue;
                            }
                            last = Some((newest, count + 1));
                        }
                        _ => {
                            last = Some((ts, 1));
                            repeats = 0;
                        }
                    }
                }
                fresh.push(new);
            }
            // The app's rate: the first lines pass, the rest are counted and
            // noted once the app is back under it (or every ten seconds).
            let allowance = match self.limits.lock().expect("log limits lock").as_mut() {
                Some(limits) => limits.take(incoming.app, fresh.len(), std::time::Instant::now()),
                None => crate::log_rate::Allowance { lines: fresh.len(), note: None },
            };
            let cut = fresh.len() - allowance.lines;
            if let Some(dropped) = allowance.note {
                let ts = fresh.first().map_or_else(|| crate::clock::rfc3339_ms(incoming.now_ms), |l| l.ts.clone());
                let rate = self.limits.lock().expect("log limits lock").as_ref().map_or(0.0, |l| l.rate().per_second);
                let note = format!("[{dropped} lines of {} were dropped: over its rate of {rate} lines per second]", incoming.app);
                ring.push(make(ts, "agent", note), seq, stored.as_deref_mut());
            }
            for new in fresh.into_iter().take(allowance.lines) {
                ring.push(make(new.ts.clone(), &new.stream, new.line.clone()), seq, stored.as_deref_mut());
                accepted += 1;
            }
            if cut > 0 {
                if let Some(archive) = self.archive.get() {
                    archive.count_dropped(incoming.app, cut as u64);
                }
            }
            if let Some(last) = last {
                ring.last.insert(incoming.container.to_string(), last);
            }
            // Containers come and go with deployments: keep the timestamps
            // of those that still have lines here.
            if ring.last.len() > MAX_CONTAINERS_REMEMBERED {
                let present: std::collections::HashSet<&str> = ring.lines.iter().map(|l| l.container.as_str()).collect();
                ring.last.retain(|container, _| present.contains(container.as_str()));
            }
            let after = ring.bytes;
            inner.total = (inner.total + after).saturating_sub(before);
            inner.trim_total();
            if inner.seq > before_seq && self.archive.get().is_some() {
                inner.held.insert(before_seq + 1, incoming.app.to_string());
                first = Some(before_seq + 1);
            }
        }
        if first.is_none() {
            self.hub.notify(incoming.app, "logs");
        }
        (accepted, first)
    }

    /// The app's newest `limit` lines with `seq` above `after`, oldest
    /// first, optionally only those of one deployment.
    pub fn recent(&self, app: &str, after: u64, limit: usize, deployment: Option<&str>) -> Vec<RuntimeLine> {
        let inner = self.rings.lock().expect("runtime log lock");
        let visible = inner.visible();
        let Some(ring) = inner.apps.get(app) else { return Vec::new() };
        let mut lines: Vec<RuntimeLine> = ring
            .lines
            .iter()
            .rev()
            .skip_while(|l| l.seq > visible)
            .take_while(|l| l.seq > after)
            .filter(|l| deployment.is_none_or(|d| l.deployment_id == d))
            .take(limit)
            .cloned()
            .collect();
        lines.reverse();
        lines
    }

    /// Before a container's first lines since this control plane started:
    /// what the store holds of it becomes what repeats are checked against,
    /// so an agent that sends a container's last lines again after both
    /// restarted (a host's reboot) stores none of them twice.
    pub async fn recall(&self, app: &str, container: &str) {
        let known = {
            let inner = self.rings.lock().expect("runtime log lock");
            inner.apps.get(app).is_some_and(|ring| ring.last.contains_key(container))
        };
        let Some(archive) = self.archive().filter(|_| !known) else { return };
        let newest = match archive.store().newest_of_container(app, container, RECALL_SCAN).await {
            Ok(Some(newest)) => newest,
            Ok(None) => return,
            Err(err) => {
                tracing::debug!(app = %app, error = %err, "runtime logs: cannot read what the store holds of a container");
                return;
            }
        };
        let Ok(at) = OffsetDateTime::from_unix_timestamp_nanos(i128::from(newest.0)) else { return };
        let mut inner = self.rings.lock().expect("runtime log lock");
        inner.apps.entry(app.to_string()).or_default().last.entry(container.to_string()).or_insert((at, newest.1));
    }

    /// The last line number given.
    pub fn last_seq(&self) -> u64 {
        self.rings.lock().expect("runtime log lock").seq
    }

    pub fn subscribe(&self, app: &str) -> tokio::sync::broadcast::Receiver<&'static str> {
        self.hub.subscribe(app)
    }

    /// Forgets a deleted app's lines (stored ones too) and ends its
    /// followers' streams, here and on the other replicas.
    pub fn forget(&self, app: &str) {
        self.drop_app(app);
        if let Some(limits) = self.limits.lock().expect("log limits lock").as_mut() {
            limits.forget(app);
        }
        if let Some(archive) = self.archive() {
            let app = app.to_string();
            tokio::spawn(async move { archive.forget(&app).await });
        }
        self.pass_on(|| Relayed::Forget(app.to_string()));
    }

    /// The app's newest `limit` lines (`after` 0), or its lines after
    /// `after` (the first `limit`), oldest first: from the ring and the
    /// store together, so the tail survives a restart and lines not yet
    /// written are there too. A store that cannot answer leaves the ring's.
    pub async fn tail(&self, app: &str, after: u64, limit: usize, deployment: Option<&str>) -> Vec<RuntimeLine> {
        let mut lines = self.recent(app, after, limit, deployment);
        let Some(archive) = self.archive() else { return lines };
        let wanted = i64::try_from(limit.min(MAX_STORED_TAIL)).unwrap_or(i64::MAX);
        let stored = if after == 0 {
            archive.store().tail(app, wanted, deployment).await
        } else {
            archive.store().after_seq(app, i64::try_from(after).unwrap_or(i64::MAX), wanted, deployment).await
        };
        match stored {
            Ok(rows) => {
                let have: std::collections::HashSet<u64> = lines.iter().map(|l| l.seq).collect();
                lines.extend(rows.into_iter().map(from_stored).filter(|l| !have.contains(&l.seq)));
                lines.sort_by_key(|l| l.seq);
                if after == 0 && lines.len() > limit {
                    lines.drain(..lines.len() - limit);
                } else {
                    lines.truncate(limit);
                }
            }
            Err(err) => tracing::warn!(app = %app, error = %err, "runtime logs: the store cannot answer; showing the live lines only"),
        }
        lines
    }

    fn drop_app(&self, app: &str) {
        let mut inner = self.rings.lock().expect("runtime log lock");
        if let Some(ring) = inner.apps.remove(app) {
            inner.total -= ring.bytes.min(inner.total);
        }
        drop(inner);
        self.hub.notify(app, "deleted");
        self.hub.remove(app);
    }

    /// Bytes held by all rings (for tests and metrics).
    pub fn total_bytes(&self) -> usize {
        self.rings.lock().expect("runtime log lock").total
    }
}

/// The app's newest stored lines [`RuntimeLogs::recall`] looks through.
const RECALL_SCAN: i64 = 5_000;

/// Most stored lines one tail reads.
const MAX_STORED_TAIL: usize = 10_000;

/// A ring's line as the store keeps it; `fallback_ns` when its time does
/// not parse.
fn to_stored(app: &str, line: &RuntimeLine, fallback_ns: i64) -> cloudweb_store::NewLogLine {
    cloudweb_store::NewLogLine {
        source: cloudweb_store::LogSource {
            app: app.to_string(),
            container: line.container.clone(),
            deployment_id: line.deployment_id.clone(),
            node_id: line.node_id.clone(),
            instance: line.instance,
        },
        ts_ns: crate::log_archive::parse_ts_ns(&line.ts).unwrap_or(fallback_ns),
        seq: i64::try_from(line.seq).unwrap_or(i64::MAX),
        stream: line.stream.clone(),
        line: line.line.clone(),
    }
}

/// A stored line as the rings hold it.
pub fn from_stored(row: cloudweb_store::LogRow) -> RuntimeLine {
    RuntimeLine {
        seq: u64::try_from(row.seq).unwrap_or(0),
        ts: crate::log_archive::format_ts_ns(row.ts_ns),
        stream: row.stream,
        line: row.line,
        deployment_id: row.deployment_id,
        instance: row.instance,
        node_id: row.node_id,
        container: row.container,
    }
}

#[cfg(test)]
mod tests {
    use cloudweb_protocol::LogLine;

    use super::*;

    fn line(ts: &str, text: &str) -> LogLine {
        LogLine { ts: ts.into(), stream: "stdout".into(), line: text.into() }
    }

    fn append(logs: &RuntimeLogs, app: &str, container: &str, dropped: u64, lines: &[LogLine]) -> u64 {
        logs.append(Incoming { app, deployment_id: "dep_1", instance: 1, node_id: "n-1", container, dropped, lines, now_ms: 0 })
    }

    #[test]
    fn relayed_lines_keep_their_numbers_and_the_next_leader_numbers_above_them() {
        let leader = RuntimeLogs::numbered_after(1_000);
        let (relay, mut relayed) = tokio::sync::mpsc::channel(8);
        leader.relay_to(relay);
        // Started earlier: its own numbering is below the leader's.
        let follower = RuntimeLogs::numbered_after(500);
        append(&leader, "web", "cw-web-1", 2, &[line("2026-11-30T10:00:00.000000001Z", "a"), line("2026-11-30T10:00:00.000000002Z", "b")]);
        follower.take_relayed(relayed.try_recv().unwrap());
        let on_leader = leader.recent("web", 0, 10, None);
        assert_eq!(follower.recent("web", 0, 10, None), on_leader, "the same lines, numbers and the lost-lines note");
        let second = on_leader[1].seq;
        assert_eq!(follower.recent("web", second, 10, None), leader.recent("web", second, 10, None), "a Last-Event-ID means the same on both");
        // Taken twice (a relay that repeats): stored once.
        leader.forget("nothing");
        append(&leader, "web", "cw-web-1", 0, &[line("2026-11-30T10:00:00.000000003Z", "c")]);
        let _ = relayed.try_recv().unwrap();
        let batch = relayed.try_recv().unwrap();
        follower.take_relayed(batch.clone());
        follower.take_relayed(batch);
        assert_eq!(follower.recent("web", 0, 10, None).len(), 4);
        // The follower leads next: its lines come after the relayed ones,
        // and the agent's repeat of an old line is recognised.
        let last = follower.recent("web", 0, 10, None).last().unwrap().seq;
        assert_eq!(append(&follower, "web", "cw-web-1", 0, &[line("2026-11-30T10:00:00.000000003Z", "c"), line("2026-11-30T10:00:00.000000004Z", "d")]), 1);
        let newest = follower.recent("web", last, 10, None);
        assert_eq!(newest.len(), 1);
        assert!(newest[0].seq > last && newest[0].line == "d");
    }

    #[tokio::test]
    async fn a_line_is_shown_only_once_it_is_written() {
        let dir = tempfile::tempdir().unwrap();
        let state = cloudweb_store::Store::open(dir.path(), "t").await.unwrap();
        let store = cloudweb_store::LogStore::beside(&state, dir.path(), "t").await.unwrap();
        let archive = LogArchive::new(store, crate::log_archive::LogSettings::default());
        let logs = RuntimeLogs::numbered_after(0);
        logs.attach(archive.clone(), 0);
        let incoming = |lines| Incoming { app: "web", deployment_id: "dep_1", instance: 1, node_id: "n-1", container: "c1", dropped: 0, lines, now_ms: 0 };
        let first = [line("2026-11-30T10:00:00.000000001Z", "a")];
        let (accepted, held) = logs.append_held(incoming(&first));
        assert_eq!(accepted, 1);
        let second = [line("2026-11-30T10:00:00.000000002Z", "b")];
        let (_, later) = logs.append_held(incoming(&second));
        assert!(logs.recent("web", 0, 10, None).is_empty(), "not shown before it is written");
        // The later upload is written first: still nothing shown past the
        // earlier one, which is not.
        drop(later);
        assert!(logs.recent("web", 0, 10, None).is_empty());
        archive.flush().await;
        drop(held);
        assert_eq!(logs.recent("web", 0, 10, None).iter().map(|l| l.line.as_str()).collect::<Vec<_>>(), ["a", "b"]);
        assert_eq!(archive.store().max_seq().await.unwrap(), 2, "both written before being shown");
    }

    #[test]
    fn lines_sent_again_are_stored_once() {
        let logs = RuntimeLogs::numbered_after(0);
        let first = [
            line("2026-11-30T10:00:00.000000001Z", "a"),
            line("2026-11-30T10:00:00.000000002Z", "b"),
            line("2026-11-30T10:00:00.000000002Z", "c"),
        ];
        assert_eq!(append(&logs, "web", "cw-web-1", 0, &first), 3);
        // An agent that restarted sends its tail again, then a new line
        // with the same timestamp as the last stored ones, then newer ones.
        let again = [
            line("2026-11-30T10:00:00.000000001Z", "a"),
            line("2026-11-30T10:00:00.000000002Z", "b"),
            line("2026-11-30T10:00:00.000000002Z", "c"),
            line("2026-11-30T10:00:00.000000002Z", "d"),
            line("2026-11-30T10:00:01Z", "e"),
        ];
        assert_eq!(append(&logs, "web", "cw-web-1", 0, &again), 2);
        let texts: Vec<String> = logs.recent("web", 0, 100, None).into_iter().map(|l| l.line).collect();
        assert_eq!(texts, ["a", "b", "c", "d", "e"]);
        // Another container of the same app has its own timestamps.
        assert_eq!(append(&logs, "web", "cw-web-2", 0, &first[..1]), 1);
        let recent = logs.recent("web", 0, 2, None);
        assert_eq!(recent.iter().map(|l| l.seq).collect::<Vec<_>>(), [5, 6], "newest two, oldest first");
        assert_eq!(logs.recent("web", 5, 100, None).len(), 1, "after a seq");
        assert!(logs.recent("other", 0, 100, None).is_empty());
    }

    #[test]
    fn rings_are_bounded_per_app_and_in_total() {
        let logs = RuntimeLogs::numbered_after(0);
        let many: Vec<LogLine> = (0..MAX_APP_LINES + 10).map(|i| line(&format!("2026-11-30T10:00:{:02}.{:09}Z", i / 1000, i), "x")).collect();
        for chunk in many.chunks(1000) {
            append(&logs, "web", "cw-web-1", 0, chunk);
        }
        let kept = logs.recent("web", 0, usize::MAX, None);
        assert_eq!(kept.len(), MAX_APP_LINES);
        assert_eq!(kept[0].seq, 11, "the oldest went first");
        // Big lines: the byte bound of an app.
        let big = "y".repeat(16 * 1024);
        let lines: Vec<LogLine> = (0..400).map(|i| line(&format!("2026-11-30T11:00:00.{i:09}Z"), &big)).collect();
        append(&logs, "big", "cw-big-1", 0, &lines);
        let bytes: usize = logs.recent("big", 0, usize::MAX, None).iter().map(|l| l.cost()).sum();
        assert!(bytes <= MAX_APP_BYTES, "{bytes}");
        assert!(logs.total_bytes() <= MAX_TOTAL_BYTES);
        // Total: enough apps to pass the global bound.
        let apps = MAX_TOTAL_BYTES / MAX_APP_BYTES + 5;
        for app in 0..apps {
            append(&logs, &format!("a{app}"), "cw-1", 0, &lines);
        }
        assert!(logs.total_bytes() <= MAX_TOTAL_BYTES, "{}", logs.total_bytes());
        let held: usize = (0..apps).map(|a| logs.recent(&format!("a{a}"), 0, usize::MAX, None).iter().map(|l| l.cost()).sum::<usize>()).sum();
        assert!(held <= MAX_TOTAL_BYTES);
        logs.forget("big");
        assert!(logs.recent("big", 0, 10, None).is_empty());
    }

    #[test]
    fn lost_lines_are_noted_where_they_were() {
        let logs = RuntimeLogs::numbered_after(0);
        append(&logs, "web", "cw-web-1", 42, &[line("2026-11-30T10:00:00Z", "after")]);
        let lines = logs.recent("web", 0, 10, None);
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0].stream, "agent");
        assert!(lines[0].line.contains("42 lines of cw-web-1"), "{}", lines[0].line);
        assert_eq!(logs.recent("web", 0, 10, Some("dep_2")).len(), 0, "filter by deployment");
    }
}
