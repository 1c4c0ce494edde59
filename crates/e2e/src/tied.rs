//! Processes a test starts that die with the test process, however it ends.
//!
//! A test's control planes and agents run in process groups of their own
//! (so that killing one also kills what it started), and their `Drop` kills
//! them. But a test process that is killed runs no `Drop`: when the runner
//! interrupts a run (Ctrl-C, a timeout, a cancelled CI job) it signals the
//! test's process group, which they are not in, and they ran on, orphaned,
//! holding ports, containers and CPU (seen: eight servers and agents left
//! by one interrupted run).
//!
//! So they are started with `PR_SET_PDEATHSIG` = SIGKILL. The kernel sends
//! that signal when the *thread* that forked the child ends, and a test
//! starts processes from whatever thread it runs on (tokio workers, a
//! runtime's blocking pool, its own threads), some of which end before the
//! test does. So every such process is forked by one thread that lives as
//! long as the test process: [`spawn`] hands the command to it and waits
//! for the child.

use std::io;
use std::process::{Child, Command};
use std::sync::{mpsc, OnceLock};

use nix::sys::signal::Signal;

type Request = (Command, mpsc::Sender<io::Result<Child>>);

/// Starts `command` from the process-long spawner thread, its child set to
/// receive SIGKILL when this process dies (`kill -9` included).
pub fn spawn(mut command: Command) -> io::Result<Child> {
    let parent = nix::unistd::getpid();
    // SAFETY: the closure runs in the forked child before exec and makes
    // two system calls (prctl, getppid), both async-signal-safe; it
    // allocates nothing.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut command, move || {
            nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(io::Error::from)?;
            // The parent died between the fork and the prctl: no signal
            // will come, so do not start.
            if nix::unistd::getppid() != parent {
                return Err(io::Error::other("the test process exited before its child started"));
            }
            Ok(())
        });
    }
    let (answer, answered) = mpsc::channel();
    spawner().send((command, answer)).map_err(|_| io::Error::other("the spawner thread is gone"))?;
    answered.recv().map_err(|_| io::Error::other("the spawner thread did not answer"))?
}

fn spawner() -> &'static mpsc::Sender<Request> {
    static SPAWNER: OnceLock<mpsc::Sender<Request>> = OnceLock::new();
    SPAWNER.get_or_init(|| {
        let (requests, incoming) = mpsc::channel::<Request>();
        // The sender is kept in this static for the life of the process,
        // so `recv` never fails and the thread never ends before the process.
        std::thread::Builder::new()
            .name("tied-spawner".into())
            .spawn(move || {
                while let Ok((mut command, answer)) = incoming.recv() {
                    let _ = answer.send(command.spawn());
                }
            })
            .expect("the spawner thread starts");
        requests
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    fn alive(pid: u32) -> bool {
        // A zombie has no cmdline left; a running `sleep` has one.
        std::fs::read(format!("/proc/{pid}/cmdline")).map(|c| !c.is_empty()).unwrap_or(false)
    }

    #[test]
    fn a_child_started_from_a_short_lived_thread_outlives_that_thread() {
        let mut child = std::thread::spawn(|| {
            let mut command = Command::new("sleep");
            command.arg("60");
            spawn(command).unwrap()
        })
        .join()
        .unwrap();
        // The calling thread is gone; the child must still run (with a
        // plain pre_exec prctl it would be killed now).
        std::thread::sleep(Duration::from_millis(300));
        assert!(child.try_wait().unwrap().is_none(), "the child died with the thread that asked for it");
        child.kill().unwrap();
        child.wait().unwrap();
    }

    #[test]
    fn a_child_dies_when_the_test_process_is_killed() {
        // This test binary, run again as the "test process", starts a
        // `sleep` through `spawn`, prints its pid and waits; it is then
        // killed with SIGKILL, which runs no destructor.
        if std::env::var_os("TIED_CHILD_PROBE").is_some() {
            let mut command = Command::new("sleep");
            command.arg("60");
            let child = spawn(command).unwrap();
            println!("tied-child-pid={}", child.id());
            std::thread::sleep(Duration::from_secs(60));
            return;
        }
        let mut probe = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "tied::tests::a_child_dies_when_the_test_process_is_killed", "--nocapture", "--test-threads", "1"])
            .env("TIED_CHILD_PROBE", "1")
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut out = io::BufReader::new(probe.stdout.take().unwrap());
        let pid = loop {
            let mut line = String::new();
            assert!(io::BufRead::read_line(&mut out, &mut line).unwrap() > 0, "the probe ended without a pid");
            // libtest may print the test's name on the same line first.
            if let Some(Ok(pid)) = line.split("tied-child-pid=").nth(1).map(|pid| pid.trim().parse::<u32>()) {
                break pid;
            }
        };
        let started = alive(pid);
        // Killed before any assertion, so a failing check leaves no probe.
        probe.kill().unwrap();
        probe.wait().unwrap();
        assert!(started, "the probe's child is not running");
        let deadline = Instant::now() + Duration::from_secs(10);
        while alive(pid) {
            assert!(Instant::now() < deadline, "the child outlived its killed test process by 10 s");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}
