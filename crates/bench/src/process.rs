//! Child processes a benchmark starts, stopped on drop: SIGTERM first so a
//! control plane can stop what it supervises (its image registry), then
//! SIGKILL for whatever is still there, its children included.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

pub struct Guarded {
    child: Child,
    /// How long SIGTERM gets before SIGKILL; zero kills at once.
    grace: Duration,
}

impl Guarded {
    /// Starts `command` with stdin closed and stdout and stderr appended to `log`.
    pub fn spawn(mut command: Command, log: &Path, grace: Duration) -> Result<Guarded> {
        let file = std::fs::OpenOptions::new().create(true).append(true).open(log).with_context(|| format!("opening {}", log.display()))?;
        let child = command
            .stdin(Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file)
            .spawn()
            .with_context(|| format!("starting {:?}", command.get_program()))?;
        Ok(Guarded { child, grace })
    }

    /// Wraps a child started elsewhere (one whose stdout is read, say).
    pub fn adopt(child: Child, grace: Duration) -> Guarded {
        Guarded { child, grace }
    }

    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// The exit status, when the process has exited.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// SIGKILL at once, to it and its children: a crash.
    pub fn kill_now(&mut self) {
        self.grace = Duration::ZERO;
        self.stop();
    }

    /// Stops the process and every process it started that is still alive.
    pub fn stop(&mut self) {
        if self.exited().is_some() {
            return;
        }
        let children = children_of(self.child.id());
        if !self.grace.is_zero() {
            let _ = Command::new("kill").args(["-s", "TERM", "--", &self.child.id().to_string()]).stderr(Stdio::null()).status();
            let deadline = Instant::now() + self.grace;
            while self.exited().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        // Orphans of a killed parent: kill them only if the pid still names
        // the same process (same start time), never a reused pid.
        for (pid, started) in children {
            if start_time(pid) == Some(started) {
                let _ = Command::new("kill").args(["-s", "KILL", "--", &pid.to_string()]).stderr(Stdio::null()).status();
            }
        }
    }
}

impl Drop for Guarded {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Direct children of `parent` with their start times, from /proc.
pub(crate) fn children_of(parent: u32) -> Vec<(u32, u64)> {
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    entries
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| {
            let (ppid, started) = stat_fields(pid)?;
            (ppid == parent).then_some((pid, started))
        })
        .collect()
}

fn start_time(pid: u32) -> Option<u64> {
    stat_fields(pid).map(|(_, started)| started)
}

/// Parent pid and start time (in clock ticks since boot) of a process.
fn stat_fields(pid: u32) -> Option<(u32, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name, which is in parentheses and may hold spaces.
    let fields: Vec<&str> = stat[stat.rfind(')')? + 2..].split_whitespace().collect();
    Some((fields.get(1)?.parse().ok()?, fields.get(19)?.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stopping_kills_the_children_too() {
        let dir = tempfile::tempdir().unwrap();
        let mut command = Command::new("sh");
        // The shell ignores SIGTERM, so this also covers the SIGKILL path.
        command.args(["-c", "trap '' TERM; sleep 30 & echo $! > child; wait"]).current_dir(dir.path());
        let mut parent = Guarded::spawn(command, &dir.path().join("log"), Duration::from_millis(200)).unwrap();
        let pid_file = dir.path().join("child");
        let start = Instant::now();
        while std::fs::read_to_string(&pid_file).map_or(true, |s| !s.ends_with('\n')) {
            assert!(start.elapsed() < Duration::from_secs(5), "the child did not start");
            std::thread::sleep(Duration::from_millis(10));
        }
        let child: u32 = std::fs::read_to_string(&pid_file).unwrap().trim().parse().unwrap();
        assert!(start_time(child).is_some());
        parent.stop();
        let start = Instant::now();
        // A killed orphan lingers as a zombie until init reaps it.
        while stat_fields(child).is_some() && !is_zombie(child) {
            assert!(start.elapsed() < Duration::from_secs(5), "the child outlived its parent");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn is_zombie(pid: u32) -> bool {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| stat.rsplit(')').next().is_some_and(|rest| rest.trim_start().starts_with('Z')))
    }
}
