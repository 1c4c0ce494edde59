//! The usage sample sent with a heartbeat every `--metrics-interval-seconds`:
//! the node's CPU, memory and disk, and its app containers. It is taken in
//! its own task with a 10 s bound on the Docker part, so a slow or failing
//! Docker Engine never delays a heartbeat; what could not be measured is
//! left out, never reported as zero.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cloudweb_protocol::heartbeat::{VolumeUsage, MAX_CONTAINERS};
use cloudweb_protocol::{Metrics, NodeUsage};

use crate::capacity::meminfo_field;
use crate::runtime::DockerRuntime;

/// How long the Docker part of one sample may take.
const DOCKER_BOUND: Duration = Duration::from_secs(10);

/// Idle and total jiffies from the first line of /proc/stat.
pub fn cpu_times(stat: &str) -> Option<(u64, u64)> {
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let values: Vec<u64> = line.split_whitespace().skip(1).take(8).map(|v| v.parse().ok()).collect::<Option<_>>()?;
    if values.len() < 5 {
        return None;
    }
    let idle = values[3] + values[4];
    Some((idle, values.iter().sum()))
}

/// Percentage of all cores busy between two readings.
pub fn cpu_percent(before: (u64, u64), after: (u64, u64)) -> Option<f64> {
    let total = after.1.checked_sub(before.1)?;
    let idle = after.0.checked_sub(before.0)?;
    if total == 0 {
        return None;
    }
    Some((100.0 * (total.saturating_sub(idle)) as f64 / total as f64).clamp(0.0, 100.0))
}

fn disk_used(dir: &Path) -> Option<u64> {
    let stat = nix::sys::statvfs::statvfs(dir).ok()?;
    Some((stat.blocks() as u64).saturating_sub(stat.blocks_free() as u64) * stat.fragment_size() as u64)
}

/// The newest sample not yet sent.
#[derive(Default)]
pub struct Latest {
    pub sample: Mutex<Option<Metrics>>,
}

/// Takes a sample every `interval` until the task is aborted.
pub async fn sampler(runtime: DockerRuntime, data_dir: std::path::PathBuf, interval: Duration, latest: Arc<Latest>) {
    let mut previous_cpu: Option<(u64, u64)> = None;
    let mut tracker = crate::runtime::UsageTracker::host();
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let started = Instant::now();
        let cpu_now = std::fs::read_to_string("/proc/stat").ok().and_then(|s| cpu_times(&s));
        // The first sample after a start has nothing to compare with.
        let cpu_pct = match (previous_cpu, cpu_now) {
            (Some(before), Some(after)) => cpu_percent(before, after),
            _ => None,
        };
        previous_cpu = cpu_now;
        let mem_used = match (meminfo_field("MemTotal:"), meminfo_field("MemAvailable:")) {
            (Some(total), Some(available)) => Some(total.saturating_sub(available)),
            _ => None,
        };
        let node = NodeUsage { cpu_pct, mem_used, disk_used: disk_used(&data_dir) };
        let mut docker_calls = None;
        let (containers, omitted) = match tokio::time::timeout(DOCKER_BOUND, runtime.container_usage(&mut tracker)).await {
            Ok(Ok(sample)) => {
                docker_calls = Some(sample.docker_calls);
                let mut containers = sample.containers;
                containers.sort_by_key(|c| std::cmp::Reverse(c.mem_bytes.unwrap_or(0)));
                let omitted = containers.len().saturating_sub(MAX_CONTAINERS) as u32;
                containers.truncate(MAX_CONTAINERS);
                (Some(containers), Some(omitted))
            }
            Ok(Err(err)) => {
                tracing::warn!(error = %err, "container usage unavailable for this sample");
                (None, None)
            }
            Err(_) => {
                tracing::warn!("container usage took longer than 10 s; left out of this sample");
                (None, None)
            }
        };
        tracing::info!(took_ms = started.elapsed().as_millis() as u64, containers = containers.as_ref().map(Vec::len), docker_calls, "usage sample taken");
        // Volumes' sizes: a walk of their directories, off the runtime's
        // threads and bounded like the Docker calls.
        let dir = data_dir.clone();
        let volumes = match tokio::time::timeout(DOCKER_BOUND, tokio::task::spawn_blocking(move || crate::volumes::sizes(&dir))).await {
            Ok(Ok(sizes)) if !sizes.is_empty() => {
                let mut list: Vec<VolumeUsage> = sizes.into_iter().map(|(volume, bytes)| VolumeUsage { volume, bytes }).collect();
                list.truncate(cloudweb_protocol::heartbeat::MAX_VOLUMES);
                Some(list)
            }
            Ok(_) => None,
            Err(_) => {
                tracing::warn!("measuring the volumes took longer than 10 s; left out of this sample");
                None
            }
        };
        *latest.sample.lock().expect("sample lock") = Some(Metrics { node: Some(node), containers, omitted, traffic: None, traffic_omitted: None, volumes });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_from_proc_stat() {
        let before = cpu_times("cpu  100 0 100 800 0 0 0 0 0 0\ncpu0 1 2 3 4\n").unwrap();
        let after = cpu_times("cpu  150 0 150 900 0 0 0 0 0 0\n").unwrap();
        assert_eq!(before, (800, 1000));
        assert_eq!(cpu_percent(before, after), Some(50.0));
        assert_eq!(cpu_percent(after, after), None, "no time passed: no data, not zero");
        assert!(cpu_times("garbage").is_none());
    }
}
