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
//! A restart of the control plane empties the rings; the agents go on
//! uploading new lines. Line numbers (`seq`, the SSE event id) are one
//! sequence for all apps that starts at the control plane's start time in
//! microseconds, so they keep growing across a restart (as long as the
//! clock does not go back) and a follower that reconnects with the last id
//! it saw gets every line the new run has, none twice. Lines are not written to the database, so a chatty
//! app costs no disk writes on the control plane.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use serde::Serialize;
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

use crate::hub::Hub;

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
}

struct Inner {
    apps: HashMap<String, Ring>,
    total: usize,
    /// The last `seq` given.
    seq: u64,
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
        RuntimeLogs { rings: Mutex::new(Inner { apps: HashMap::new(), total: 0, seq }), hub: Hub::default(), relay: Default::default() }
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
        let mut stored = self.relay.get().map(|_| Vec::new());
        let accepted = self.store(&incoming, stored.as_mut());
        if let Some(lines) = stored.filter(|lines| !lines.is_empty()) {
            self.pass_on(|| Relayed::Lines { app: incoming.app.to_string(), lines });
        }
        accepted
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

    fn store(&self, incoming: &Incoming<'_>, mut stored: Option<&mut Vec<RuntimeLine>>) -> u64 {
        let mut accepted = 0;
        {
            let mut inner = self.rings.lock().expect("runtime log lock");
            let inner = &mut *inner;
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
                ring.push(make(new.ts.clone(), &new.stream, new.line.clone()), seq, stored.as_deref_mut());
                accepted += 1;
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
        }
        self.hub.notify(incoming.app, "logs");
        accepted
    }

    /// The app's newest `limit` lines with `seq` above `after`, oldest
    /// first, optionally only those of one deployment.
    pub fn recent(&self, app: &str, after: u64, limit: usize, deployment: Option<&str>) -> Vec<RuntimeLine> {
        let inner = self.rings.lock().expect("runtime log lock");
        let Some(ring) = inner.apps.get(app) else { return Vec::new() };
        let mut lines: Vec<RuntimeLine> = ring
            .lines
            .iter()
            .rev()
            .take_while(|l| l.seq > after)
            .filter(|l| deployment.is_none_or(|d| l.deployment_id == d))
            .take(limit)
            .cloned()
            .collect();
        lines.reverse();
        lines
    }

    pub fn subscribe(&self, app: &str) -> tokio::sync::broadcast::Receiver<&'static str> {
        self.hub.subscribe(app)
    }

    /// Forgets a deleted app's lines and ends its followers' streams, here
    /// and on the other replicas.
    pub fn forget(&self, app: &str) {
        self.drop_app(app);
        self.pass_on(|| Relayed::Forget(app.to_string()));
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
