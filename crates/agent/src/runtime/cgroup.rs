//! Container CPU and memory read from the kernel's cgroup files instead of
//! the Docker Engine: a read of a few small files per container, where
//! `GET /containers/{id}/stats` costs about a second (the daemon takes two
//! readings) and a request per container.
//!
//! Docker puts a container's cgroup at one of these places, by cgroup
//! version and driver (the root is `/sys/fs/cgroup` on a host):
//!
//! | version | driver | directory |
//! |---|---|---|
//! | v2 | systemd | `system.slice/docker-<id>.scope` |
//! | v2 | cgroupfs | `docker/<id>` |
//! | v1 | systemd | `<controller>/system.slice/docker-<id>.scope` |
//! | v1 | cgroupfs | `<controller>/docker/<id>` |
//!
//! Containers are found by id in those directories; a layout not listed
//! (rootless Docker, a custom `--cgroup-parent`, Docker Desktop) is simply
//! not found, and the caller falls back to the Engine API.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// One reading of a container's cgroup.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Reading {
    /// CPU time used since the cgroup was created, in nanoseconds.
    pub cpu_ns: Option<u64>,
    /// Memory in use without reclaimable page cache (`inactive_file`),
    /// as `docker stats` counts it.
    pub mem_bytes: Option<u64>,
    /// The memory limit; `None` when unlimited.
    pub mem_limit: Option<u64>,
    /// The processes in the container (to find when its current run started).
    pub pids: Vec<u32>,
}

/// Reads container cgroups under a root (`/sys/fs/cgroup` on a host; a
/// fixture directory in tests).
#[derive(Debug, Clone)]
pub struct Cgroups {
    root: PathBuf,
}

/// Limits at or above this are the kernel's "unlimited" on cgroup v1
/// (a page-rounded `i64::MAX`).
const V1_UNLIMITED: u64 = 1 << 62;

fn is_container_id(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// The container id in a cgroup directory name (`<id>` or `docker-<id>.scope`).
fn id_of(dir_name: &str) -> Option<&str> {
    let id = dir_name.strip_prefix("docker-").and_then(|s| s.strip_suffix(".scope")).unwrap_or(dir_name);
    is_container_id(id).then_some(id)
}

/// A `key value` line's value in a flat-keyed file (`cpu.stat`, `memory.stat`).
pub fn keyed(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let (k, v) = line.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

/// A file holding one number (`memory.current`); `max` reads as `None`.
pub fn single(text: &str) -> Option<u64> {
    text.trim().parse().ok()
}

/// `cgroup.procs`: one pid per line.
pub fn pids(text: &str) -> Vec<u32> {
    text.lines().filter_map(|l| l.trim().parse().ok()).collect()
}

fn read(path: &Path) -> Option<String> {
    std::fs::read_to_string(path).ok()
}

impl Cgroups {
    pub fn new(root: impl Into<PathBuf>) -> Cgroups {
        Cgroups { root: root.into() }
    }

    /// The host's cgroup mount.
    pub fn host() -> Cgroups {
        Cgroups::new("/sys/fs/cgroup")
    }

    fn unified(&self) -> bool {
        self.root.join("cgroup.controllers").exists()
    }

    /// Where container cgroups live for one controller (`None`: v2).
    fn parents(&self, controller: Option<&str>) -> [PathBuf; 2] {
        let base = match controller {
            Some(c) => self.root.join(c),
            None => self.root.clone(),
        };
        [base.join("system.slice"), base.join("docker")]
    }

    /// Ids of the containers that have a cgroup now (running or
    /// restarting), or `None` when no directory Docker uses exists here,
    /// so this says nothing about which containers run.
    pub fn scan(&self) -> Option<BTreeSet<String>> {
        let controller = if self.unified() { None } else { Some("memory") };
        let mut found = None;
        for parent in self.parents(controller) {
            let Ok(entries) = std::fs::read_dir(&parent) else { continue };
            let ids = found.get_or_insert_with(BTreeSet::new);
            for entry in entries.flatten() {
                if let Some(id) = entry.file_name().to_str().and_then(id_of) {
                    ids.insert(id.to_string());
                }
            }
        }
        found
    }

    /// The cgroup directory of container `id` for one controller.
    fn dir(&self, controller: Option<&str>, id: &str) -> Option<PathBuf> {
        let [slice, docker] = self.parents(controller);
        [slice.join(format!("docker-{id}.scope")), docker.join(id)].into_iter().find(|d| d.is_dir())
    }

    /// CPU and memory of container `id`; `None` when its cgroup is not
    /// found or its memory cannot be read.
    pub fn read(&self, id: &str) -> Option<Reading> {
        if !is_container_id(id) {
            return None;
        }
        if self.unified() {
            let dir = self.dir(None, id)?;
            let current = single(&read(&dir.join("memory.current"))?)?;
            let inactive = read(&dir.join("memory.stat")).and_then(|s| keyed(&s, "inactive_file")).unwrap_or(0);
            Some(Reading {
                cpu_ns: read(&dir.join("cpu.stat")).and_then(|s| keyed(&s, "usage_usec")).map(|us| us.saturating_mul(1000)),
                mem_bytes: Some(current.saturating_sub(inactive)),
                mem_limit: read(&dir.join("memory.max")).and_then(|s| single(&s)),
                pids: read(&dir.join("cgroup.procs")).map(|s| pids(&s)).unwrap_or_default(),
            })
        } else {
            let memory = self.dir(Some("memory"), id)?;
            let usage = single(&read(&memory.join("memory.usage_in_bytes"))?)?;
            let inactive = read(&memory.join("memory.stat")).and_then(|s| keyed(&s, "total_inactive_file")).unwrap_or(0);
            let cpu_ns = self.dir(Some("cpuacct"), id).and_then(|d| read(&d.join("cpuacct.usage"))).and_then(|s| single(&s));
            Some(Reading {
                cpu_ns,
                mem_bytes: Some(usage.saturating_sub(inactive)),
                mem_limit: read(&memory.join("memory.limit_in_bytes")).and_then(|s| single(&s)).filter(|l| *l < V1_UNLIMITED),
                pids: read(&memory.join("cgroup.procs")).map(|s| pids(&s)).unwrap_or_default(),
            })
        }
    }
}

/// When the oldest of `pids` started, in clock ticks since boot, from
/// `/proc/<pid>/stat` under `proc_root`. That process is the container's
/// first, so a different answer for the same container means it restarted.
pub fn oldest_start_ticks(proc_root: &Path, pids: &[u32]) -> Option<u64> {
    pids.iter().filter_map(|pid| read(&proc_root.join(pid.to_string()).join("stat")).and_then(|s| start_ticks(&s))).min()
}

/// Field 22 (`starttime`) of a `/proc/<pid>/stat` line. The command name
/// (field 2) may hold spaces and parentheses, so fields count from the last `)`.
pub fn start_ticks(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    // After the name: state is field 3, so starttime is the 20th from here.
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// Boot time (seconds since the epoch) from `/proc/stat`.
pub fn boot_time(proc_stat: &str) -> Option<i64> {
    proc_stat.lines().find_map(|l| l.strip_prefix("btime ")).and_then(|v| v.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "3f2a9c0d1e4b5a6877f1c2d3e4f5a6b7c8d9e0f1a2b3c4d5e6f7a8b9c0d1e2f3";

    fn write(path: &Path, text: &str) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }

    #[test]
    fn v2_systemd_layout() {
        let root = tempfile::tempdir().unwrap();
        write(&root.path().join("cgroup.controllers"), "cpu memory io pids\n");
        let dir = root.path().join(format!("system.slice/docker-{ID}.scope"));
        write(&dir.join("memory.current"), "10485760\n");
        write(&dir.join("memory.stat"), "anon 8000000\nfile 3000000\nactive_file 1000000\ninactive_file 2097152\n");
        write(&dir.join("memory.max"), "67108864\n");
        write(&dir.join("cpu.stat"), "usage_usec 2500000\nuser_usec 2000000\nsystem_usec 500000\n");
        write(&dir.join("cgroup.procs"), "4242\n4250\n");
        // Not containers: other units, and a scope that is not Docker's.
        std::fs::create_dir_all(root.path().join("system.slice/ssh.service")).unwrap();
        std::fs::create_dir_all(root.path().join("system.slice/docker-abc.scope")).unwrap();
        let cgroups = Cgroups::new(root.path());
        assert_eq!(cgroups.scan(), Some(BTreeSet::from([ID.to_string()])));
        assert_eq!(
            cgroups.read(ID),
            Some(Reading { cpu_ns: Some(2_500_000_000), mem_bytes: Some(8388608), mem_limit: Some(67108864), pids: vec![4242, 4250] })
        );
        // Unlimited memory reads as no limit.
        write(&dir.join("memory.max"), "max\n");
        assert_eq!(cgroups.read(ID).unwrap().mem_limit, None);
        assert_eq!(cgroups.read(&"0".repeat(64)), None, "no such container");
        assert_eq!(cgroups.read("../../etc"), None, "only container ids make paths");
    }

    #[test]
    fn v2_cgroupfs_layout() {
        let root = tempfile::tempdir().unwrap();
        write(&root.path().join("cgroup.controllers"), "cpu memory\n");
        std::fs::create_dir_all(root.path().join("system.slice")).unwrap();
        let dir = root.path().join("docker").join(ID);
        write(&dir.join("memory.current"), "4096\n");
        write(&dir.join("cpu.stat"), "usage_usec 7\n");
        let cgroups = Cgroups::new(root.path());
        assert_eq!(cgroups.scan(), Some(BTreeSet::from([ID.to_string()])));
        let reading = cgroups.read(ID).unwrap();
        assert_eq!((reading.cpu_ns, reading.mem_bytes, reading.mem_limit), (Some(7000), Some(4096), None));
    }

    #[test]
    fn v1_cgroupfs_layout() {
        let root = tempfile::tempdir().unwrap();
        let memory = root.path().join("memory/docker").join(ID);
        write(&memory.join("memory.usage_in_bytes"), "20971520\n");
        write(&memory.join("memory.stat"), "cache 5242880\ninactive_file 100\ntotal_inactive_file 4194304\n");
        write(&memory.join("memory.limit_in_bytes"), "9223372036854771712\n");
        write(&memory.join("cgroup.procs"), "77\n");
        write(&root.path().join("cpuacct/docker").join(ID).join("cpuacct.usage"), "123456789\n");
        let cgroups = Cgroups::new(root.path());
        assert_eq!(cgroups.scan(), Some(BTreeSet::from([ID.to_string()])));
        assert_eq!(cgroups.read(ID), Some(Reading { cpu_ns: Some(123456789), mem_bytes: Some(16777216), mem_limit: None, pids: vec![77] }));
        write(&memory.join("memory.limit_in_bytes"), "67108864\n");
        assert_eq!(cgroups.read(ID).unwrap().mem_limit, Some(67108864));
    }

    #[test]
    fn unknown_layout_says_nothing() {
        let root = tempfile::tempdir().unwrap();
        write(&root.path().join("cgroup.controllers"), "cpu memory\n");
        assert_eq!(Cgroups::new(root.path()).scan(), None);
        // A systemd host with no container running: known to run none.
        std::fs::create_dir_all(root.path().join("system.slice/cron.service")).unwrap();
        assert_eq!(Cgroups::new(root.path()).scan(), Some(BTreeSet::new()));
    }

    #[test]
    fn process_start_times() {
        // A command name with spaces and parentheses.
        let stat = "4242 (my (odd) app) S 4200 4242 4242 0 -1 4194560 120 0 0 0 1 2 0 0 20 0 1 0 987654 1234567 300";
        assert_eq!(start_ticks(stat), Some(987654));
        assert_eq!(start_ticks("garbage"), None);
        let proc_root = tempfile::tempdir().unwrap();
        write(&proc_root.path().join("10/stat"), "10 (sh) S 1 10 10 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 500 0 0");
        write(&proc_root.path().join("11/stat"), "11 (sleep) S 10 10 10 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 900 0 0");
        assert_eq!(oldest_start_ticks(proc_root.path(), &[11, 10, 12]), Some(500));
        assert_eq!(boot_time("cpu  1 2 3\nbtime 1764500000\nprocesses 5\n"), Some(1764500000));
    }
}
