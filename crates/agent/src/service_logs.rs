//! Service logs: follows what this node's service containers print and
//! uploads it to the control plane (`POST /agent/v1/service-logs`), like
//! `logs` does for app instances.
//!
//! Every 2 s each service the supervisor knows whose container runs gets a
//! follower (from its last [`TAIL_ON_FOLLOW`] lines; the control plane
//! drops repeats). Lines have the service's secrets redacted (the values of
//! its spec's password variables, the argument after `--requirepass`, what
//! `set_password` carries), are capped at 16 KiB and wait in a bounded
//! buffer ([`MAX_SERVICE_LINES`] lines per service, the oldest going
//! first, counted as lost). An upload goes about once a second; a control
//! plane without the route (404) makes the agent drop the lines and ask
//! again [`NO_ROUTE_PAUSE`] later.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cloudweb_protocol::logs::{MAX_UPLOAD_LINES, MAX_UPLOAD_TEXT_BYTES};
use cloudweb_protocol::{LogLine, ServiceLogUpload, ServiceLogs, ServicePayload};
use futures_util::StreamExt;

use crate::client::{ClientError, ControlPlane};
use crate::redact::Redactor;
use crate::runtime::DockerRuntime;
use crate::services::Services;

/// Lines kept per service while they wait for an upload.
pub const MAX_SERVICE_LINES: usize = 1_000;
/// Lines read back when a container is first followed.
const TAIL_ON_FOLLOW: usize = 200;
const LOOK_EVERY: Duration = Duration::from_secs(2);
const UPLOAD_INTERVAL: Duration = Duration::from_secs(1);
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// How long an agent waits before asking a control plane that answered
/// 404 (an older release) again.
const NO_ROUTE_PAUSE: Duration = Duration::from_secs(600);

#[derive(Default)]
struct Pending {
    /// (sequence number, line)
    lines: VecDeque<(u64, LogLine)>,
    dropped: u64,
}

/// The bounded buffer between the followers and the uploader.
#[derive(Default)]
pub struct Buffer {
    services: BTreeMap<String, Pending>,
    next_seq: u64,
}

/// A service, the highest sequence number and the lost lines an upload
/// carries of it.
type Carried = (String, u64, u64);

impl Buffer {
    pub fn push(&mut self, service: &str, stream: &str, ts: String, text: String) {
        let pending = self.services.entry(service.to_string()).or_default();
        let mut line = LogLine { ts, stream: stream.to_string(), line: text };
        cloudweb_protocol::misc::cap_log_line(&mut line.line);
        self.next_seq += 1;
        pending.lines.push_back((self.next_seq, line));
        while pending.lines.len() > MAX_SERVICE_LINES {
            pending.lines.pop_front();
            pending.dropped += 1;
        }
    }

    /// The next upload and, per service, the highest sequence number and
    /// the lost lines it carries ([`Carried`]).
    fn take(&self) -> Option<(ServiceLogUpload, Vec<Carried>)> {
        let mut upload = ServiceLogUpload::default();
        let mut taken = Vec::new();
        let (mut lines, mut bytes) = (0, 0);
        for (service, pending) in &self.services {
            if pending.lines.is_empty() && pending.dropped == 0 {
                continue;
            }
            if lines >= MAX_UPLOAD_LINES || bytes >= MAX_UPLOAD_TEXT_BYTES {
                break;
            }
            let mut batch = Vec::new();
            let mut last = 0;
            for (seq, line) in &pending.lines {
                if lines >= MAX_UPLOAD_LINES || (bytes + line.line.len() > MAX_UPLOAD_TEXT_BYTES && lines > 0) {
                    break;
                }
                lines += 1;
                bytes += line.line.len();
                last = *seq;
                batch.push(line.clone());
            }
            taken.push((service.clone(), last, pending.dropped));
            upload.services.push(ServiceLogs { service: service.clone(), dropped: pending.dropped, lines: batch });
        }
        (!upload.services.is_empty()).then_some((upload, taken))
    }

    fn settle(&mut self, taken: &[(String, u64, u64)]) {
        for (service, last, dropped) in taken {
            let Some(pending) = self.services.get_mut(service) else { continue };
            pending.dropped -= (*dropped).min(pending.dropped);
            while pending.lines.front().is_some_and(|(seq, _)| seq <= last) {
                pending.lines.pop_front();
            }
        }
        self.services.retain(|_, p| !(p.lines.is_empty() && p.dropped == 0));
    }

    fn clear(&mut self) {
        self.services.clear();
    }
}

/// The secrets a service's lines must not carry.
pub fn secrets(spec: &ServicePayload) -> BTreeMap<String, String> {
    let mut secrets: BTreeMap<String, String> =
        spec.env.iter().filter(|(name, _)| ["PASSWORD", "AUTH", "PWD", "SECRET"].iter().any(|w| name.contains(w))).map(|(n, v)| (n.clone(), v.clone())).collect();
    if let Some(i) = spec.command.iter().position(|a| a == "--requirepass") {
        if let Some(password) = spec.command.get(i + 1) {
            secrets.insert("requirepass".into(), password.clone());
        }
    }
    if let Some(exec) = &spec.set_password {
        secrets.extend(exec.env.clone());
        for (i, word) in exec.stdin.split(|c: char| !c.is_ascii_alphanumeric()).filter(|w| w.len() >= 12).enumerate() {
            secrets.insert(format!("password{i}"), word.to_string());
        }
    }
    secrets
}

struct Shared {
    buffer: Mutex<Buffer>,
    /// Container ids followed now.
    following: Mutex<HashSet<String>>,
    /// Newest timestamp read per container id.
    last_ts: Mutex<HashMap<String, String>>,
}

/// Runs until aborted: the followers and the uploader.
pub async fn run(client: Arc<ControlPlane>, runtime: DockerRuntime, services: Services) {
    let shared = Arc::new(Shared { buffer: Mutex::new(Buffer::default()), following: Mutex::new(HashSet::new()), last_ts: Mutex::new(HashMap::new()) });
    let uploader = tokio::spawn(upload_loop(client, shared.clone()));
    let mut tasks = tokio::task::JoinSet::new();
    loop {
        for spec in services.specs() {
            let Ok(Some(container)) = runtime.service_container(&spec.service).await else { continue };
            if !container.running || !shared.following.lock().expect("following lock").insert(container.id.clone()) {
                continue;
            }
            let (runtime, shared) = (runtime.clone(), shared.clone());
            tasks.spawn(async move {
                follow(&runtime, &shared, &spec, &container.id).await;
                shared.following.lock().expect("following lock").remove(&container.id);
            });
        }
        while tasks.try_join_next().is_some() {}
        if uploader.is_finished() {
            return;
        }
        tokio::time::sleep(LOOK_EVERY).await;
    }
}

async fn follow(runtime: &DockerRuntime, shared: &Shared, spec: &ServicePayload, id: &str) {
    let redactor = Redactor::new(&secrets(spec));
    let mut output = match runtime.follow_output(id, TAIL_ON_FOLLOW) {
        Ok(output) => Box::pin(output),
        Err(err) => {
            tracing::debug!(service = %spec.service, error = %err, "service logs: cannot follow the container");
            return;
        }
    };
    let seen = shared.last_ts.lock().expect("last ts lock").get(id).cloned();
    while let Some(Ok((stream, ts, text))) = output.next().await {
        if seen.as_deref().is_some_and(|seen| ts.as_str() <= seen) {
            continue;
        }
        shared.last_ts.lock().expect("last ts lock").insert(id.to_string(), ts.clone());
        shared.buffer.lock().expect("log buffer lock").push(&spec.service, stream, ts, redactor.apply(&text));
    }
    let mut last_ts = shared.last_ts.lock().expect("last ts lock");
    if last_ts.len() > 100 {
        let following = shared.following.lock().expect("following lock");
        last_ts.retain(|id, _| following.contains(id));
    }
}

async fn upload_loop(client: Arc<ControlPlane>, shared: Arc<Shared>) {
    let mut backoff = UPLOAD_INTERVAL;
    loop {
        let next = shared.buffer.lock().expect("log buffer lock").take();
        let Some((upload, taken)) = next else {
            tokio::time::sleep(UPLOAD_INTERVAL).await;
            continue;
        };
        match client.upload_service_logs(&upload).await {
            Ok(answer) => {
                shared.buffer.lock().expect("log buffer lock").settle(&taken);
                for refused in &answer.refused {
                    tracing::debug!(service = %refused.container, reason = %refused.reason, "service logs: the control plane refused a service's lines");
                }
                backoff = UPLOAD_INTERVAL;
                tokio::time::sleep(UPLOAD_INTERVAL).await;
            }
            Err(ClientError::Status { status: 404, .. }) => {
                tracing::info!("service logs: the control plane does not take them (an older release); asking again in 10 minutes");
                shared.buffer.lock().expect("log buffer lock").clear();
                tokio::time::sleep(NO_ROUTE_PAUSE).await;
            }
            Err(ClientError::Status { status, message }) if (400..500).contains(&status) && !matches!(status, 408 | 426 | 429) => {
                tracing::warn!(status, error = %message, "service logs: the control plane refused an upload; its lines are dropped");
                shared.buffer.lock().expect("log buffer lock").settle(&taken);
            }
            Err(err) => {
                tracing::debug!(error = %err, "service logs: upload failed; trying again");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_buffer_is_bounded_per_service_and_counts_what_it_lost() {
        let mut buffer = Buffer::default();
        for i in 0..MAX_SERVICE_LINES + 3 {
            buffer.push("db", "stdout", format!("{i:09}"), "x".into());
        }
        buffer.push("kv", "stderr", "1".into(), "y".into());
        let (upload, taken) = buffer.take().unwrap();
        upload.validate().unwrap();
        assert_eq!(upload.services[0].dropped, 3);
        assert_eq!(upload.services[0].lines[0].ts, format!("{:09}", 3), "the oldest went");
        let sent: usize = upload.services.iter().map(|s| s.lines.len()).sum();
        assert!(sent <= MAX_UPLOAD_LINES);
        // A line that arrives meanwhile stays.
        buffer.push("kv", "stdout", "late".into(), "z".into());
        buffer.settle(&taken);
        let (upload, _) = buffer.take().unwrap();
        assert!(upload.services.iter().all(|s| s.dropped == 0), "reported once");
        assert!(upload.services.iter().flat_map(|s| &s.lines).any(|l| l.ts == "late"));
    }

    #[test]
    fn a_services_secrets_are_what_its_spec_carries() {
        let spec = ServicePayload {
            service: "kv".into(),
            kind: cloudweb_protocol::ServiceKind::Redis,
            image: "valkey/valkey:8".into(),
            env: BTreeMap::from([("REDISCLI_AUTH".into(), "s3cretpassword".into()), ("PGDATA".into(), "/data".into())]),
            command: vec!["redis-server".into(), "--requirepass".into(), "s3cretpassword".into()],
            volume: "svc-kv".into(),
            host_port: 20000,
            memory_bytes: None,
            health: vec!["true".into()],
            generation: 1,
            set_password: Some(cloudweb_protocol::ServiceExec {
                cmd: vec!["psql".into()],
                env: BTreeMap::from([("MYSQL_PWD".into(), "rootrootroot".into())]),
                stdin: "ALTER USER app PASSWORD 'Abcdefghijkl0123';".into(),
            }),
        };
        let redactor = Redactor::new(&secrets(&spec));
        let line = redactor.apply("auth s3cretpassword, root rootrootroot, new Abcdefghijkl0123 in /data");
        assert!(!line.contains("s3cretpassword") && !line.contains("rootrootroot") && !line.contains("Abcdefghijkl0123"), "{line}");
        assert!(line.ends_with("in /data"), "not a secret: {line}");
    }
}
