//! Child processes that never outlive the binary that started them: Caddy
//! under the agent, the image registry under the control plane.
//!
//! Two mechanisms, because neither covers every case alone:
//! - [`die_with_parent`] asks the kernel (`PR_SET_PDEATHSIG`) to SIGKILL the
//!   child when its parent dies, `kill -9` included;
//! - [`PidFile`] records the child's pid, so the next start can find a
//!   child the kernel did not stop (one started by an older binary, or one
//!   whose parent thread was not the one that died) and kill it before
//!   starting its own, instead of fighting it for ports and sockets.
//!
//! The death signal is SIGKILL, not SIGTERM: a child shutting down
//! gracefully can still delete files (Caddy removes its admin socket) that
//! the parent's successor has already recreated.

use std::ffi::OsStr;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

/// Makes the child of `command` receive SIGKILL when this process dies.
///
/// The kernel sends the signal when the *thread* that forked the child
/// exits; the callers spawn from tokio worker threads, which live as long
/// as the runtime, i.e. the process. If the parent died between the fork
/// and the `prctl`, the child would never be signalled, so it checks that
/// its parent is still the process that forked it and refuses to start
/// otherwise.
pub fn die_with_parent(command: &mut tokio::process::Command) {
    let parent = nix::unistd::getpid();
    // SAFETY: the closure runs in the forked child before exec and only
    // makes two system calls (prctl, getppid), both async-signal-safe; it
    // allocates nothing.
    unsafe {
        command.pre_exec(move || {
            nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(io::Error::from)?;
            if nix::unistd::getppid() != parent {
                return Err(io::Error::other("the parent exited before the child started"));
            }
            Ok(())
        });
    }
}

/// A file holding the pid of a child, next to the state it works on.
#[derive(Debug, Clone)]
pub struct PidFile {
    path: PathBuf,
}

impl PidFile {
    pub fn new(path: impl Into<PathBuf>) -> PidFile {
        PidFile { path: path.into() }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Records `pid` (replacing the file atomically).
    pub fn record(&self, pid: u32) -> io::Result<()> {
        let temporary = self.path.with_extension("pid.tmp");
        std::fs::write(&temporary, format!("{pid}\n"))?;
        std::fs::rename(&temporary, &self.path)
    }

    /// Removes the file (the child is gone).
    pub fn clear(&self) {
        let _ = std::fs::remove_file(&self.path);
    }

    /// Kills the process the file names, if it still runs and its command
    /// line contains `marker` (a path only that child is given, so a pid
    /// that an unrelated process reused is never touched), and waits up to
    /// 5 s for it to be gone. Returns its pid when there was one.
    pub fn kill_leftover(&self, marker: &OsStr) -> io::Result<Option<u32>> {
        let text = match std::fs::read_to_string(&self.path) {
            Ok(text) => text,
            Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(err) => return Err(err),
        };
        let Ok(pid) = text.trim().parse::<u32>() else {
            self.clear();
            return Ok(None);
        };
        if pid <= 1 || pid == std::process::id() || !alive(pid) || !command_line_contains(pid, marker) {
            self.clear();
            return Ok(None);
        }
        let _ = kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
        let deadline = Instant::now() + Duration::from_secs(5);
        while alive(pid) {
            if Instant::now() > deadline {
                return Err(io::Error::other(format!("process {pid} did not exit after SIGKILL")));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.clear();
        Ok(Some(pid))
    }
}

/// Whether `pid` runs (a zombie, which holds no ports or files any more,
/// counts as gone).
pub fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the command name, which is in parentheses and
        // may itself contain spaces or parentheses.
        Ok(stat) => stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().next()).is_some_and(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}

fn command_line_contains(pid: u32, marker: &OsStr) -> bool {
    let Ok(command_line) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    let marker = marker.as_bytes();
    !marker.is_empty() && command_line.windows(marker.len()).any(|window| window == marker)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_leftover_is_killed_only_when_it_is_ours() {
        let dir = tempfile::tempdir().unwrap();
        let marker = dir.path().join("marker-arg");
        // A long-running process with no children whose command line names
        // the marker.
        std::fs::write(&marker, "").unwrap();
        let child = tokio::process::Command::new("tail")
            .arg("-f")
            .arg(&marker)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn();
        let mut child = child.unwrap();
        let pid = child.id().unwrap();
        // Until the fork has exec'd `tail`, its command line is still this
        // test's, which does not name the marker (on a loaded machine that
        // took long enough for the kill below to find nothing of ours, and
        // the wait for the child then never ended).
        let started = std::time::Instant::now();
        while !command_line_contains(pid, marker.as_os_str()) {
            assert!(started.elapsed() < Duration::from_secs(10), "tail did not start within 10 s");
            std::thread::sleep(Duration::from_millis(10));
        }
        let file = PidFile::new(dir.path().join("x.pid"));
        file.record(pid).unwrap();
        // Another marker: not ours, left alone.
        assert_eq!(file.kill_leftover(OsStr::new("/no/such/marker")).unwrap(), None);
        assert!(alive(pid));
        file.record(pid).unwrap();
        let killed = tokio::task::spawn_blocking({
            let file = file.clone();
            let marker = marker.clone();
            move || file.kill_leftover(marker.as_os_str())
        });
        // The child is ours here, so reap it while the helper waits
        // (bounded: a kill that missed fails the test, not hangs it).
        let status = match tokio::time::timeout(Duration::from_secs(20), child.wait()).await {
            Ok(status) => status.unwrap(),
            Err(_) => {
                let _ = child.start_kill();
                panic!("the leftover was not killed: kill_leftover gave {:?}", killed.await.unwrap());
            }
        };
        assert!(!status.success());
        assert_eq!(killed.await.unwrap().unwrap(), Some(pid));
        assert!(!file.path().exists());
    }

    #[tokio::test]
    async fn a_child_dies_with_its_parent() {
        // PR_SET_PDEATHSIG fires when the forking thread ends, so a
        // short-lived thread stands in for a parent that is killed.
        let pid = std::thread::spawn(|| {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            runtime.block_on(async {
                let mut command = tokio::process::Command::new("sleep");
                command.arg("60");
                die_with_parent(&mut command);
                let child = command.spawn().unwrap();
                let pid = child.id().unwrap();
                std::mem::forget(child);
                pid
            })
        })
        .join()
        .unwrap();
        // The thread that forked it has exited: the kernel kills the child.
        // Only ever poll (WNOHANG): a blocking wait would wait out the
        // `sleep 60` and pass without the death signal. 10 s is slack for a
        // loaded machine; the signal is sent when the thread exits.
        use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
        let deadline = Instant::now() + Duration::from_secs(10);
        let status = loop {
            match waitpid(Pid::from_raw(pid as i32), Some(WaitPidFlag::WNOHANG)).unwrap() {
                WaitStatus::StillAlive => {
                    assert!(Instant::now() < deadline, "the child outlived the thread that started it by 10 s");
                    std::thread::sleep(Duration::from_millis(20));
                }
                status => break status,
            }
        };
        assert_eq!(status, WaitStatus::Signaled(Pid::from_raw(pid as i32), Signal::SIGKILL, false), "the child ended otherwise than by the death signal");
        assert!(!alive(pid));
    }
}
