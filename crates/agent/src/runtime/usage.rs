//! Container usage for the usage sample: CPU (in cores), memory and limit,
//! restarts and start time of this node's app containers.
//!
//! CPU and memory come from each container's cgroup files (see `cgroup`),
//! not from the Engine, and the Engine is asked only when something may
//! have changed, so a sample costs:
//!
//! - no Docker call when the set of container cgroups and the agent's own
//!   container changes (starts, removals) are the same as at the last
//!   list: the last list still says which of them are this node's `cw-*`
//!   containers. With no container cgroup at all, nothing runs, and no
//!   call is made either, not even in the first sample;
//! - one call (list this node's containers) when that set changed;
//! - a second call (`GET /events`, the `start` events of this node's
//!   containers since the last look) only when a container is new to the
//!   agent or restarted (its first process changed), for `restarts`.
//!
//! Where a container's cgroup cannot be read (a layout the `cgroup` module
//! does not know, rootless Docker), that container is measured through the
//! Engine as before: its stats and an inspect, two calls each.
//!
//! CPU is the time used between two samples over the time between them; a
//! container's first sample gives its average since its current run
//! started (or nothing when that start is unknown).

use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;
use std::time::Instant;

use bollard::query_parameters::{EventsOptionsBuilder, InspectContainerOptions, StatsOptionsBuilder};
use cloudweb_protocol::ContainerUsage;
use futures_util::StreamExt;

use super::cgroup::{self, Cgroups};
use super::{DockerRuntime, OwnContainer, RuntimeError, LABEL_NODE};

/// What the sampler remembers between samples.
pub struct UsageTracker {
    cgroups: Cgroups,
    proc_root: PathBuf,
    /// The state the last list was made in; `None` before the first sample.
    listed: Option<ListedAt>,
    /// This node's running `cw-*` containers, as of the last list.
    running: Vec<OwnContainer>,
    known: HashMap<String, Known>,
    /// Start events were counted up to here (Unix time in nanoseconds).
    events_until: i64,
}

#[derive(PartialEq)]
struct ListedAt {
    scan: Option<BTreeSet<String>>,
    changes: u64,
    /// Some container could not be read from its cgroup: list every time.
    engine_fallback: bool,
}

#[derive(Default)]
struct Known {
    cpu: Option<(u64, Instant)>,
    start_ticks: Option<u64>,
    restarts: Option<u32>,
    started_at: Option<String>,
}

/// One sample's container part.
pub struct Sample {
    pub containers: Vec<ContainerUsage>,
    /// Docker Engine requests this sample made.
    pub docker_calls: u32,
}

impl UsageTracker {
    /// Reads the host's cgroups and processes.
    pub fn host() -> UsageTracker {
        UsageTracker::new(Cgroups::host(), PathBuf::from("/proc"))
    }

    pub fn new(cgroups: Cgroups, proc_root: PathBuf) -> UsageTracker {
        UsageTracker { cgroups, proc_root, listed: None, running: Vec::new(), known: HashMap::new(), events_until: 0 }
    }

    /// When a process that started `ticks` after boot started, in RFC 3339.
    fn started_at(&self, ticks: u64) -> Option<String> {
        let boot = cgroup::boot_time(&std::fs::read_to_string(self.proc_root.join("stat")).ok()?)?;
        let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK).ok().flatten().filter(|hz| *hz > 0)? as u64;
        let nanos = i128::from(boot) * 1_000_000_000 + i128::from(ticks / hz) * 1_000_000_000 + i128::from(ticks % hz) * 1_000_000_000 / i128::from(hz);
        let at = time::OffsetDateTime::from_unix_timestamp_nanos(nanos).ok()?;
        at.format(&time::format_description::well_known::Rfc3339).ok()
    }
}

pub(super) fn now_nanos() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0)
}

/// `seconds.nanoseconds`, the form the Engine's `since`/`until` take.
pub(super) fn engine_time(nanos: i64) -> String {
    format!(
        "{}.{:09}",
        nanos.div_euclid(1_000_000_000),
        nanos.rem_euclid(1_000_000_000)
    )
}

impl DockerRuntime {
    /// Usage of this node's running app containers (`cw-*`), asking the
    /// Engine as little as the module doc says.
    pub async fn container_usage(&self, tracker: &mut UsageTracker) -> Result<Sample, RuntimeError> {
        let mut calls = 0;
        let scan = tracker.cgroups.scan();
        let changes = self.changes();
        let need_list = match &tracker.listed {
            // Nothing runs at all: nothing to list.
            None => scan.as_ref().is_none_or(|ids| !ids.is_empty()),
            Some(at) => at.engine_fallback || at.scan != scan || at.changes != changes,
        };
        if need_list {
            calls += 1;
            tracker.running = self.own_containers(None).await?.into_iter().filter(|c| c.running && c.name.starts_with("cw-")).collect();
        }
        let now = Instant::now();
        let mut usages = Vec::new();
        let mut by_engine = Vec::new();
        // Containers whose restart count needs the start events: (id, count
        // events after this time, restarts already counted for this look).
        let mut need_events: Vec<(String, i64, u32)> = Vec::new();
        for container in &tracker.running {
            let Some(reading) = tracker.cgroups.read(&container.id) else {
                by_engine.push(container.clone());
                continue;
            };
            let start_ticks = cgroup::oldest_start_ticks(&tracker.proc_root, &reading.pids);
            let started_at = start_ticks.and_then(|t| tracker.started_at(t));
            let known = tracker.known.get(&container.id);
            let cpu_cores = match (known.and_then(|k| k.cpu), reading.cpu_ns) {
                (Some((before, at)), Some(ns)) if ns >= before && now > at => Some((ns - before) as f64 / now.duration_since(at).as_nanos() as f64),
                // First look: the average since the current run started.
                (None, Some(ns)) => started_at
                    .as_deref()
                    .and_then(|s| time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339).ok())
                    .map(|s| (time::OffsetDateTime::now_utc() - s).whole_nanoseconds())
                    .filter(|run| *run > 0)
                    .map(|run| ns as f64 / run as f64),
                _ => None,
            };
            let restarted = match known {
                None => {
                    need_events.push((container.id.clone(), i64::MIN, 0));
                    false
                }
                // Without its processes' start times a restart cannot be
                // seen here: the events tell.
                Some(_) if start_ticks.is_none() => {
                    need_events.push((container.id.clone(), tracker.events_until, 0));
                    false
                }
                Some(k) => {
                    let restarted = k.start_ticks != start_ticks;
                    if restarted {
                        need_events.push((container.id.clone(), tracker.events_until, 1));
                    }
                    restarted
                }
            };
            let entry = tracker.known.entry(container.id.clone()).or_default();
            entry.cpu = reading.cpu_ns.map(|ns| (ns, now));
            if restarted {
                // Its first process changed: at least one restart, even if
                // the events below are unavailable.
                entry.restarts = entry.restarts.map(|r| r + 1);
            }
            entry.start_ticks = start_ticks;
            if started_at.is_some() {
                entry.started_at = started_at;
            }
            let mem_limit = reading.mem_limit.or_else(|| crate::capacity::meminfo_field("MemTotal:"));
            usages.push((container.id.clone(), ContainerUsage { container: container.name.clone(), cpu_cores, mem_bytes: reading.mem_bytes, mem_limit, ..Default::default() }));
        }
        if !need_events.is_empty() {
            calls += 1;
            let created = tracker.running.iter().filter(|c| need_events.iter().any(|(id, after, _)| *after == i64::MIN && *id == c.id)).filter_map(|c| c.created);
            let since_nanos = created.map(|s| (s - 1).saturating_mul(1_000_000_000)).chain(std::iter::once(tracker.events_until)).min().unwrap_or(0).max(0);
            let until_nanos = now_nanos();
            match self.start_events(since_nanos, until_nanos).await {
                Ok(events) => {
                    for (id, after, counted) in &need_events {
                        let starts: Vec<i64> = events.iter().filter(|(e, at)| e == id && *at > *after).map(|(_, at)| *at).collect();
                        let entry = tracker.known.entry(id.clone()).or_default();
                        if *after == i64::MIN {
                            // New to the agent: its first start must be among the events,
                            // or the count is unknown (the Engine keeps only recent ones).
                            entry.restarts = starts.len().checked_sub(1).map(|n| n as u32);
                        } else if let Some(restarts) = entry.restarts.as_mut() {
                            *restarts += (starts.len() as u32).saturating_sub(*counted);
                        }
                        if entry.started_at.is_none() {
                            entry.started_at = starts.iter().max().and_then(|n| time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(*n)).ok()).and_then(|t| t.format(&time::format_description::well_known::Rfc3339).ok());
                        }
                    }
                    tracker.events_until = until_nanos;
                }
                Err(err) => tracing::debug!(error = %err, "start events unavailable; restarts left out for new containers"),
            }
        }
        let mut containers: Vec<ContainerUsage> = usages
            .into_iter()
            .map(|(id, mut usage)| {
                if let Some(known) = tracker.known.get(&id) {
                    usage.restarts = known.restarts;
                    usage.started_at = known.started_at.clone();
                }
                usage
            })
            .collect();
        calls += 2 * by_engine.len() as u32;
        containers.extend(self.engine_usage(&by_engine).await?);
        let running: BTreeSet<&str> = tracker.running.iter().map(|c| c.id.as_str()).collect();
        tracker.known.retain(|id, _| running.contains(id.as_str()));
        tracker.listed = Some(ListedAt { scan, changes, engine_fallback: !by_engine.is_empty() });
        Ok(Sample { containers, docker_calls: calls })
    }

    /// `start` events of this node's containers between two instants, as
    /// (container id, time in nanoseconds): one request.
    async fn start_events(&self, since_nanos: i64, until_nanos: i64) -> Result<Vec<(String, i64)>, RuntimeError> {
        let filters = HashMap::from([
            ("type", vec!["container".to_string()]),
            ("event", vec!["start".to_string()]),
            ("label", vec![format!("{LABEL_NODE}={}", self.node_id)]),
        ]);
        let options = EventsOptionsBuilder::new().since(&engine_time(since_nanos)).until(&engine_time(until_nanos)).filters(&filters).build();
        let docker = self.docker()?;
        let mut stream = docker.events(Some(options));
        let mut events = Vec::new();
        while let Some(event) = stream.next().await {
            let event = event?;
            if let (Some(id), Some(at)) = (event.actor.and_then(|a| a.id), event.time_nano.or(event.time.map(|s| s.saturating_mul(1_000_000_000)))) {
                events.push((id, at));
            }
        }
        Ok(events)
    }

    /// The Engine's view of containers whose cgroup could not be read: their
    /// stats and an inspect each, concurrently.
    async fn engine_usage(&self, containers: &[OwnContainer]) -> Result<Vec<ContainerUsage>, RuntimeError> {
        if containers.is_empty() {
            return Ok(Vec::new());
        }
        let docker = self.docker()?;
        let samples = containers.iter().map(|container| {
            let docker = docker.clone();
            async move {
                // stream=false makes the daemon take two readings, so the
                // answer carries a CPU delta.
                let stats = docker
                    .stats(&container.id, Some(StatsOptionsBuilder::new().stream(false).build()))
                    .next()
                    .await
                    .and_then(Result::ok);
                let inspect = docker.inspect_container(&container.id, None::<InspectContainerOptions>).await.ok();
                let mut usage = ContainerUsage { container: container.name.clone(), ..Default::default() };
                if let Some(stats) = stats {
                    let cpu = stats.cpu_stats.as_ref();
                    let pre = stats.precpu_stats.as_ref();
                    let total = |s: Option<&bollard::models::ContainerCpuStats>| s.and_then(|s| s.cpu_usage.as_ref()).and_then(|u| u.total_usage);
                    let system = |s: Option<&bollard::models::ContainerCpuStats>| s.and_then(|s| s.system_cpu_usage);
                    if let (Some(t1), Some(t0), Some(s1), Some(s0), Some(cpus)) = (total(cpu), total(pre), system(cpu), system(pre), cpu.and_then(|c| c.online_cpus)) {
                        if s1 > s0 && t1 >= t0 {
                            usage.cpu_cores = Some((t1 - t0) as f64 / (s1 - s0) as f64 * f64::from(cpus));
                        }
                    }
                    if let Some(memory) = stats.memory_stats {
                        // Like `docker stats`: page cache that can be
                        // reclaimed does not count.
                        let cache = memory.stats.as_ref().and_then(|s| s.get("inactive_file").or_else(|| s.get("total_inactive_file")).copied()).unwrap_or(0);
                        usage.mem_bytes = memory.usage.map(|u| u.saturating_sub(cache));
                        usage.mem_limit = memory.limit;
                    }
                }
                if let Some(inspect) = inspect {
                    usage.restarts = inspect.restart_count.map(|r| r.max(0) as u32);
                    usage.started_at = inspect.state.and_then(|s| s.started_at).filter(|s| !s.starts_with("0001-"));
                }
                usage
            }
        });
        Ok(futures_util::future::join_all(samples).await)
    }

    /// Whether the engine is Docker Desktop, whose daemon runs in a VM that
    /// cannot reach the mesh.
    pub async fn is_docker_desktop(&self) -> Result<bool, RuntimeError> {
        let info = self.docker()?.info().await?;
        Ok(info.operating_system.as_deref().is_some_and(|os| os.contains("Docker Desktop")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stand-in engine whose `/info` reports `os`; anything else is a 500.
    fn engine_reporting(socket: &std::path::Path, os: &'static str) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::UnixListener::bind(socket).unwrap();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut head = Vec::new();
                    let mut chunk = [0u8; 1024];
                    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                        match stream.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => head.extend_from_slice(&chunk[..n]),
                        }
                    }
                    let line = String::from_utf8_lossy(&head).lines().next().unwrap_or_default().to_string();
                    let (status, body) = if line.starts_with("GET ") && line.contains("/info ") {
                        ("200 OK", format!("{{\"OperatingSystem\":\"{os}\",\"ID\":\"x\"}}"))
                    } else {
                        ("500 Internal Server Error", "{\"message\":\"no\"}".to_string())
                    };
                    let answer = format!("HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len());
                    let _ = stream.write_all(answer.as_bytes()).await;
                });
            }
        });
    }

    #[tokio::test]
    async fn docker_desktop_is_recognised_from_the_engines_info() {
        let dir = tempfile::tempdir().unwrap();
        for (os, desktop) in [("Docker Desktop", true), ("Debian GNU/Linux 13 (trixie)", false)] {
            let socket = dir.path().join(format!("{desktop}.sock"));
            engine_reporting(&socket, os);
            let runtime = DockerRuntime::new(&format!("unix://{}", socket.display()), "n-test").unwrap();
            assert_eq!(runtime.is_docker_desktop().await.unwrap(), desktop, "{os}");
        }
        // No engine: an error, not a guess.
        let runtime = DockerRuntime::new("unix:///nonexistent/docker.sock", "n-test").unwrap();
        assert!(runtime.is_docker_desktop().await.is_err());
    }

    #[test]
    fn engine_times_keep_nanoseconds() {
        assert_eq!(engine_time(1_764_500_000_123_456_789), "1764500000.123456789");
        assert_eq!(engine_time(5), "0.000000005");
    }

    /// With no container cgroup at all, the first sample and every later
    /// one are taken without asking Docker: the runtime points at a socket
    /// that does not exist, so any call would fail the sample.
    #[tokio::test]
    async fn no_docker_call_when_nothing_runs() {
        let root = tempfile::tempdir().unwrap();
        std::fs::write(root.path().join("cgroup.controllers"), "cpu memory\n").unwrap();
        std::fs::create_dir_all(root.path().join("system.slice/cron.service")).unwrap();
        let runtime = DockerRuntime::new("unix:///nonexistent/docker.sock", "n-test").unwrap();
        let mut tracker = UsageTracker::new(Cgroups::new(root.path()), PathBuf::from("/proc"));
        for _ in 0..3 {
            let sample = runtime.container_usage(&mut tracker).await.unwrap();
            assert!(sample.containers.is_empty());
            assert_eq!(sample.docker_calls, 0);
        }
        // A container cgroup appears: now the Engine must be asked (and
        // here it is unreachable, which the sample reports).
        std::fs::create_dir_all(root.path().join(format!("system.slice/docker-{}.scope", "a".repeat(64)))).unwrap();
        assert!(runtime.container_usage(&mut tracker).await.is_err());
    }
}
