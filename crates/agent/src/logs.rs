//! Runtime logs: follows what this node's app instances print and uploads
//! it to the control plane (`POST /agent/v1/logs`).
//!
//! One task watches the Engine's `start` events of this node's app
//! containers (and lists the running ones whenever that watch (re)starts),
//! and follows each container's output: one that just started from its
//! start, one found running from its last [`TAIL_ON_FOLLOW`] lines on. Lines have the app's variable values redacted, are capped at
//! 16 KiB and wait in one bounded buffer ([`MAX_BUFFER_LINES`] lines,
//! [`MAX_BUFFER_BYTES`] bytes, [`MAX_CONTAINER_LINES`] per container).
//! When it is full and uploads are not failing (the control plane is
//! only slower than the app, e.g. on a busy machine), a follower stops
//! reading for up to [`WAIT_FOR_ROOM`] until an upload makes room: the
//! Engine keeps what the container prints meanwhile, so nothing is lost.
//! When it is full otherwise, the oldest lines go and the next upload
//! says how many were lost. Another task uploads the buffer about once a second, in
//! batches of at most 1,000 lines and 256 KiB; a batch leaves the buffer
//! only once the control plane took it, so an unreachable control plane
//! costs the oldest lines, never unbounded memory.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cloudweb_protocol::logs::{MAX_UPLOAD_LINES, MAX_UPLOAD_TEXT_BYTES};
use cloudweb_protocol::{ContainerLogs, LogLine, LogUpload};
use futures_util::StreamExt;
use tokio::sync::Notify;

use crate::client::{ClientError, ControlPlane};
use crate::redact::Redactor;
use crate::runtime::{AppInstance, DockerRuntime};

/// Lines the buffer holds, over all containers.
pub const MAX_BUFFER_LINES: usize = 20_000;
/// Bytes of line text the buffer holds.
pub const MAX_BUFFER_BYTES: usize = 8 * 1024 * 1024;
/// Lines one container may hold in the buffer, so a chatty app cannot push
/// out every other app's lines.
pub const MAX_CONTAINER_LINES: usize = 5_000;
/// Lines read back when a container is first followed (the agent may have
/// restarted after it printed them; the control plane drops repeats).
pub const TAIL_ON_FOLLOW: usize = 200;
/// Pause between two uploads.
const UPLOAD_INTERVAL: Duration = Duration::from_secs(1);
/// How long a follower waits, per line, for an upload to make room in a
/// full buffer, while uploads are going through.
pub const WAIT_FOR_ROOM: Duration = Duration::from_secs(5);
/// Longest pause after a failed upload or a lost Engine event stream.
const MAX_BACKOFF: Duration = Duration::from_secs(30);

struct Pending {
    deployment: String,
    instance: u32,
    name: String,
    /// (sequence number in the buffer, line)
    lines: VecDeque<(u64, LogLine)>,
    bytes: usize,
    dropped: u64,
    /// The control plane refused this container's lines.
    refused: bool,
    /// No follower runs for it any more.
    ended: bool,
    /// The highest sequence number of the upload in flight (0: none).
    /// Lines up to it are not dropped when the buffer is full: they may
    /// already be stored, and would be counted as lost though they were not.
    sent_upto: u64,
}

impl Pending {
    /// Lines of the upload in flight (the front of `lines`).
    fn in_flight(&self) -> usize {
        self.lines.partition_point(|(seq, _)| *seq <= self.sent_upto)
    }
}

/// The bounded buffer between the followers and the uploader.
#[derive(Default)]
pub struct Buffer {
    containers: BTreeMap<String, Pending>,
    lines: usize,
    bytes: usize,
    next_seq: u64,
}

/// What an upload took from the buffer, to settle it once answered:
/// (container id, highest sequence number sent, lost lines reported).
type Taken = Vec<(String, u64, u64)>;

impl Buffer {
    /// Adds a line; false once the container's lines are refused (its
    /// follower then stops).
    pub fn push(&mut self, instance: &AppInstance, stream: &str, ts: String, text: String) -> bool {
        let pending = self.containers.entry(instance.id.clone()).or_insert_with(|| Pending {
            deployment: instance.deployment.clone(),
            instance: instance.instance,
            name: instance.name.clone(),
            lines: VecDeque::new(),
            bytes: 0,
            dropped: 0,
            refused: false,
            ended: false,
            sent_upto: 0,
        });
        if pending.refused {
            return false;
        }
        pending.ended = false;
        let mut line = LogLine { ts, stream: stream.to_string(), line: text };
        cloudweb_protocol::misc::cap_log_line(&mut line.line);
        self.next_seq += 1;
        pending.bytes += line.line.len();
        self.bytes += line.line.len();
        pending.lines.push_back((self.next_seq, line));
        self.lines += 1;
        if pending.lines.len() - pending.in_flight() > MAX_CONTAINER_LINES {
            let id = instance.id.clone();
            self.drop_oldest(&id);
        }
        while self.lines > MAX_BUFFER_LINES || self.bytes > MAX_BUFFER_BYTES {
            let Some(fullest) = self.containers.iter().max_by_key(|(_, p)| p.lines.len()).map(|(id, _)| id.clone()) else { break };
            if !self.drop_oldest(&fullest) {
                break;
            }
        }
        true
    }

    /// Whether the next line of container `id` would push a line out.
    fn full_for(&self, id: &str) -> bool {
        let own = self.containers.get(id).is_some_and(|p| p.lines.len() - p.in_flight() >= MAX_CONTAINER_LINES);
        own || self.lines >= MAX_BUFFER_LINES || self.bytes >= MAX_BUFFER_BYTES
    }

    /// Drops the container's oldest line that is not in flight.
    fn drop_oldest(&mut self, id: &str) -> bool {
        let Some(pending) = self.containers.get_mut(id) else { return false };
        let at = pending.in_flight();
        let Some((_, line)) = pending.lines.remove(at) else { return false };
        pending.bytes -= line.line.len();
        pending.dropped += 1;
        self.bytes -= line.line.len();
        self.lines -= 1;
        true
    }

    /// The next upload, or None when there is nothing to send.
    fn take(&mut self) -> Option<(LogUpload, Taken)> {
        let mut upload = LogUpload::default();
        let mut taken = Vec::new();
        let (mut lines, mut bytes) = (0, 0);
        for (id, pending) in &mut self.containers {
            if pending.refused || (pending.lines.is_empty() && pending.dropped == 0) {
                continue;
            }
            if lines >= MAX_UPLOAD_LINES || bytes >= MAX_UPLOAD_TEXT_BYTES || upload.containers.len() >= cloudweb_protocol::logs::MAX_UPLOAD_CONTAINERS {
                break;
            }
            let mut batch = Vec::new();
            let mut last_seq = 0;
            for (seq, line) in &pending.lines {
                if lines >= MAX_UPLOAD_LINES || (bytes + line.line.len() > MAX_UPLOAD_TEXT_BYTES && !(batch.is_empty() && lines == 0)) {
                    break;
                }
                lines += 1;
                bytes += line.line.len();
                last_seq = *seq;
                batch.push(line.clone());
            }
            pending.sent_upto = last_seq;
            taken.push((id.clone(), last_seq, pending.dropped));
            upload.containers.push(ContainerLogs {
                deployment_id: pending.deployment.clone(),
                instance: pending.instance,
                container: pending.name.clone(),
                dropped: pending.dropped,
                lines: batch,
            });
        }
        (!upload.containers.is_empty()).then_some((upload, taken))
    }

    /// Removes what an upload carried.
    fn settle(&mut self, taken: &Taken) {
        for (id, last_seq, dropped) in taken {
            let Some(pending) = self.containers.get_mut(id) else { continue };
            pending.sent_upto = 0;
            pending.dropped -= (*dropped).min(pending.dropped);
            while pending.lines.front().is_some_and(|(seq, _)| seq <= last_seq) {
                let (_, line) = pending.lines.pop_front().expect("front");
                pending.bytes -= line.line.len();
                self.bytes -= line.line.len();
                self.lines -= 1;
            }
        }
        self.containers.retain(|_, p| !(p.ended && p.lines.is_empty() && p.dropped == 0));
    }

    /// An upload failed: its lines are the buffer's again (and may be
    /// dropped when it is full).
    fn release(&mut self, taken: &Taken) {
        for (id, _, _) in taken {
            if let Some(pending) = self.containers.get_mut(id) {
                pending.sent_upto = 0;
            }
        }
    }

    /// The control plane will not take this container's lines.
    fn refuse(&mut self, name: &str) {
        for pending in self.containers.values_mut().filter(|p| p.name == name) {
            pending.refused = true;
            self.lines -= pending.lines.len();
            self.bytes -= pending.bytes;
            pending.lines.clear();
            pending.bytes = 0;
            pending.dropped = 0;
        }
    }

    fn ended(&mut self, id: &str) {
        if let Some(pending) = self.containers.get_mut(id) {
            pending.ended = true;
            if pending.refused || (pending.lines.is_empty() && pending.dropped == 0) {
                self.containers.remove(id);
            }
        }
    }

    /// Upload again without pausing: the buffer holds a whole upload's
    /// worth, or one container more than half its share (a chatty
    /// container is not held to one upload a second).
    fn pressing(&self) -> bool {
        self.lines >= MAX_UPLOAD_LINES
            || self.bytes >= MAX_UPLOAD_TEXT_BYTES
            || self.containers.values().any(|p| !p.refused && p.lines.len() > MAX_CONTAINER_LINES / 2)
    }
}

struct Shared {
    buffer: Mutex<Buffer>,
    lines: Notify,
    /// Newest timestamp read per container id, so a follower started again
    /// for a restarted container skips the tail already read.
    last_ts: Mutex<HashMap<String, String>>,
    /// Containers being followed now.
    following: Mutex<std::collections::HashSet<String>>,
    /// The last upload failed (the control plane is unreachable or
    /// failing): a full buffer then drops its oldest lines at once.
    stalled: std::sync::atomic::AtomicBool,
}

impl Shared {
    /// Waits (bounded) until the buffer has room for container `id`'s next
    /// line, as long as uploads are going through.
    async fn room_for(&self, id: &str) {
        let started = std::time::Instant::now();
        loop {
            let full = self.buffer.lock().expect("log buffer lock").full_for(id);
            let stalled = self.stalled.load(std::sync::atomic::Ordering::Relaxed);
            if !full || stalled || started.elapsed() >= WAIT_FOR_ROOM {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// Runs until aborted: the followers and the uploader.
pub async fn run(client: Arc<ControlPlane>, runtime: DockerRuntime) {
    let shared = Arc::new(Shared {
        buffer: Mutex::new(Buffer::default()),
        lines: Notify::new(),
        last_ts: Mutex::new(HashMap::new()),
        following: Mutex::new(Default::default()),
        stalled: std::sync::atomic::AtomicBool::new(false),
    });
    let mut tasks = tokio::task::JoinSet::new();
    tasks.spawn(upload_loop(client, shared.clone()));
    let mut backoff = Duration::from_secs(1);
    loop {
        // Watch first, then list, so a container that starts in between is
        // seen by one or the other.
        match runtime.instance_starts() {
            Ok(starts) => {
                let mut starts = Box::pin(starts);
                match runtime.running_instances().await {
                    Ok(running) => {
                        backoff = Duration::from_secs(1);
                        for instance in running {
                            follow(&mut tasks, &runtime, &shared, instance, false);
                        }
                    }
                    Err(err) => tracing::warn!(error = %err, "runtime logs: cannot list this node's containers"),
                }
                loop {
                    tokio::select! {
                        event = starts.next() => match event {
                            Some(Ok(instance)) => follow(&mut tasks, &runtime, &shared, instance, true),
                            Some(Err(err)) => {
                                tracing::debug!(error = %err, "runtime logs: the Engine's event stream ended");
                                break;
                            }
                            None => break,
                        },
                        // Reap finished followers so the set stays small.
                        Some(_) = tasks.join_next(), if tasks.len() > 1 => {}
                    }
                }
            }
            Err(err) => tracing::warn!(error = %err, "runtime logs: the Docker Engine is unavailable"),
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

type Followed = std::pin::Pin<Box<dyn futures_util::Stream<Item = Result<crate::runtime::OutputLine, crate::runtime::RuntimeError>> + Send>>;

/// Follows a container: one that just started from its start (`fresh`),
/// one found running from its last [`TAIL_ON_FOLLOW`] lines.
fn follow(tasks: &mut tokio::task::JoinSet<()>, runtime: &DockerRuntime, shared: &Arc<Shared>, instance: AppInstance, fresh: bool) {
    if !shared.following.lock().expect("following lock").insert(instance.id.clone()) {
        return;
    }
    let runtime = runtime.clone();
    let shared = shared.clone();
    tasks.spawn(async move {
        let id = instance.id.clone();
        follow_one(&runtime, &shared, &instance, fresh).await;
        shared.following.lock().expect("following lock").remove(&id);
        shared.buffer.lock().expect("log buffer lock").ended(&id);
    });
}

async fn follow_one(runtime: &DockerRuntime, shared: &Shared, instance: &AppInstance, fresh: bool) {
    let env = match runtime.app_env(&instance.id).await {
        Ok(env) => env,
        Err(err) => {
            // Without its variables the lines cannot be redacted: better
            // none than a leaked secret.
            tracing::warn!(container = %instance.name, error = %err, "runtime logs: cannot read the container's variables; not following it");
            return;
        }
    };
    let redactor = Redactor::new(&env);
    // A second before the start: the Engine's `since` is in whole seconds,
    // and what an earlier run printed in that second is skipped below (or
    // recognised as a repeat by the control plane).
    let since = match fresh {
        true => runtime.started_at(&instance.id).await.ok().flatten().and_then(|at| {
            let at = time::OffsetDateTime::parse(&at, &time::format_description::well_known::Rfc3339).ok()?;
            i32::try_from(at.unix_timestamp() - 1).ok()
        }),
        false => None,
    };
    let followed = match since {
        Some(since) => runtime.follow_output_since(&instance.id, since).map(|s| Box::pin(s) as Followed),
        None => runtime.follow_output(&instance.id, TAIL_ON_FOLLOW).map(|s| Box::pin(s) as Followed),
    };
    let mut output = match followed {
        Ok(output) => output,
        Err(err) => {
            tracing::warn!(container = %instance.name, error = %err, "runtime logs: cannot follow the container");
            return;
        }
    };
    let seen = shared.last_ts.lock().expect("last ts lock").get(&instance.id).cloned();
    while let Some(item) = output.next().await {
        let (stream, ts, text) = match item {
            Ok(line) => line,
            Err(err) => {
                tracing::debug!(container = %instance.name, error = %err, "runtime logs: the output stream ended");
                break;
            }
        };
        // The Engine writes fixed-width nanosecond timestamps, so text
        // order is time order.
        if seen.as_deref().is_some_and(|seen| ts.as_str() <= seen) {
            continue;
        }
        shared.room_for(&instance.id).await;
        shared.last_ts.lock().expect("last ts lock").insert(instance.id.clone(), ts.clone());
        let kept = shared.buffer.lock().expect("log buffer lock").push(instance, stream, ts, redactor.apply(&text));
        if !kept {
            break;
        }
        shared.lines.notify_one();
    }
    let mut last_ts = shared.last_ts.lock().expect("last ts lock");
    // Forget stopped containers' timestamps once there are many.
    if last_ts.len() > 1000 {
        let following = shared.following.lock().expect("following lock");
        last_ts.retain(|id, _| following.contains(id));
    }
}

async fn upload_loop(client: Arc<ControlPlane>, shared: Arc<Shared>) {
    let mut backoff = UPLOAD_INTERVAL;
    loop {
        let next = shared.buffer.lock().expect("log buffer lock").take();
        let Some((upload, taken)) = next else {
            shared.lines.notified().await;
            tokio::time::sleep(UPLOAD_INTERVAL).await;
            continue;
        };
        match client.upload_logs(&upload).await {
            Ok(answer) => {
                let pressing = {
                    let mut buffer = shared.buffer.lock().expect("log buffer lock");
                    buffer.settle(&taken);
                    for refused in &answer.refused {
                        tracing::warn!(container = %refused.container, reason = %refused.reason, "runtime logs: the control plane refused a container's lines; no longer following it");
                        buffer.refuse(&refused.container);
                    }
                    buffer.pressing()
                };
                shared.stalled.store(false, std::sync::atomic::Ordering::Relaxed);
                backoff = UPLOAD_INTERVAL;
                if !pressing {
                    tokio::time::sleep(UPLOAD_INTERVAL).await;
                }
            }
            Err(ClientError::Status { status, message }) if (400..500).contains(&status) && !matches!(status, 408 | 426 | 429) => {
                // The same batch would be refused again.
                tracing::warn!(status, error = %message, "runtime logs: the control plane refused an upload; its lines are dropped");
                shared.buffer.lock().expect("log buffer lock").settle(&taken);
            }
            Err(err) => {
                tracing::debug!(error = %err, "runtime logs: upload failed; trying again");
                shared.stalled.store(true, std::sync::atomic::Ordering::Relaxed);
                shared.buffer.lock().expect("log buffer lock").release(&taken);
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn instance(id: &str) -> AppInstance {
        AppInstance { id: id.into(), name: format!("cw-{id}"), deployment: "dep_1".into(), instance: 1 }
    }

    #[test]
    fn a_container_at_its_bound_is_full_and_an_upload_frees_it() {
        let mut buffer = Buffer::default();
        let chatty = instance("chatty");
        for i in 0..MAX_CONTAINER_LINES {
            assert!(!buffer.full_for(&chatty.id), "line {i}");
            buffer.push(&chatty, "stdout", format!("{i:09}"), "x".into());
        }
        assert!(buffer.full_for(&chatty.id));
        assert!(!buffer.full_for(&instance("quiet").id), "another container still has room");
        let (_, taken) = buffer.take().unwrap();
        buffer.settle(&taken);
        assert!(!buffer.full_for(&chatty.id), "an upload made room");
    }

    #[test]
    fn the_buffer_is_bounded_and_counts_what_it_lost() {
        let mut buffer = Buffer::default();
        let chatty = instance("a");
        for i in 0..MAX_CONTAINER_LINES + 5 {
            assert!(buffer.push(&chatty, "stdout", format!("{i:09}"), "x".into()));
        }
        assert_eq!(buffer.lines, MAX_CONTAINER_LINES);
        let (upload, taken) = buffer.take().unwrap();
        assert_eq!(upload.containers[0].dropped, 5);
        assert_eq!(upload.containers[0].lines.len(), MAX_UPLOAD_LINES);
        assert_eq!(upload.containers[0].lines[0].ts, format!("{:09}", 5), "the oldest went");
        upload.validate().unwrap();
        buffer.settle(&taken);
        assert_eq!(buffer.lines, MAX_CONTAINER_LINES - MAX_UPLOAD_LINES);
        let (upload, _) = buffer.take().unwrap();
        assert_eq!(upload.containers[0].dropped, 0, "reported once");
        // Bytes: a batch stays under the upload's text bound.
        let mut buffer = Buffer::default();
        for i in 0..100 {
            buffer.push(&instance("b"), "stderr", format!("{i:09}"), "y".repeat(16 * 1024));
        }
        let (upload, _) = buffer.take().unwrap();
        let bytes: usize = upload.containers.iter().flat_map(|c| &c.lines).map(|l| l.line.len()).sum();
        assert!(bytes <= MAX_UPLOAD_TEXT_BYTES && bytes > 0);
        // The whole buffer's byte bound, over many containers.
        let mut buffer = Buffer::default();
        for c in 0..20 {
            for i in 0..100 {
                buffer.push(&instance(&format!("c{c}")), "stdout", format!("{i:09}"), "z".repeat(16 * 1024));
            }
        }
        assert!(buffer.bytes <= MAX_BUFFER_BYTES && buffer.lines <= MAX_BUFFER_LINES);
        let counted: usize = buffer.containers.values().map(|p| p.bytes).sum();
        assert_eq!(counted, buffer.bytes);
    }

    #[test]
    fn lines_in_flight_are_neither_dropped_nor_counted_as_lost() {
        let mut buffer = Buffer::default();
        let chatty = instance("a");
        for i in 0..MAX_UPLOAD_LINES {
            buffer.push(&chatty, "stdout", format!("{i:09}"), "x".into());
        }
        let (upload, taken) = buffer.take().unwrap();
        assert_eq!(upload.containers[0].lines.len(), MAX_UPLOAD_LINES);
        // While that upload is in flight, a burst fills the container's share.
        for i in MAX_UPLOAD_LINES..MAX_UPLOAD_LINES + MAX_CONTAINER_LINES + 3 {
            buffer.push(&chatty, "stdout", format!("{i:09}"), "x".into());
        }
        buffer.settle(&taken);
        let (next, taken) = buffer.take().unwrap();
        // Only the 3 oldest lines that were not in flight were lost.
        assert_eq!(next.containers[0].dropped, 3);
        assert_eq!(next.containers[0].lines[0].ts, format!("{:09}", MAX_UPLOAD_LINES + 3));
        // A failed upload gives its lines back to the buffer's bounds.
        buffer.release(&taken);
        assert_eq!(buffer.containers.values().next().unwrap().in_flight(), 0);
        assert!(buffer.pressing(), "a whole upload's worth is waiting");
    }

    #[test]
    fn lines_arriving_during_an_upload_stay_and_refused_containers_stop() {
        let mut buffer = Buffer::default();
        let a = instance("a");
        buffer.push(&a, "stdout", "1".into(), "one".into());
        let (_, taken) = buffer.take().unwrap();
        buffer.push(&a, "stdout", "2".into(), "two".into());
        buffer.settle(&taken);
        let (upload, _) = buffer.take().unwrap();
        assert_eq!(upload.containers[0].lines.iter().map(|l| l.line.as_str()).collect::<Vec<_>>(), ["two"]);
        buffer.refuse("cw-a");
        assert!(buffer.take().is_none());
        assert!(!buffer.push(&a, "stdout", "3".into(), "three".into()), "the follower stops");
        buffer.ended("a");
        assert!(buffer.containers.is_empty());
    }
}
