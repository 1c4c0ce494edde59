//! Reaping the restic processes a killed agent leaves behind.
//!
//! A process killed with its parent is reparented to the nearest
//! subreaper, or to PID 1, and stays a zombie until that process waits for
//! it. On a host whose PID 1 never waits for adopted children (this test
//! machine's PID 1 is one), a restic killed with its agent stays a zombie
//! for good, and restic takes a lock whose holder's pid still answers
//! signal 0 for alive: every later restic on that repository waits for
//! restic's 30-minute stale timeout. A real init (systemd) reaps at once.
//!
//! So the harness makes itself the subreaper of what it starts, and a
//! thread reaps the restic zombies it adopts. It reaps only processes named
//! `restic` that lead their own process group (the agent starts restic that
//! way); a restic a test runs itself shares the test's group and is waited
//! for by its own `Command`.

use std::sync::Once;
use std::time::Duration;

use nix::sys::wait::{waitpid, WaitPidFlag};
use nix::unistd::Pid;

/// Makes this process the subreaper of its descendants and starts the
/// reaping thread, once.
pub fn adopt() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        if let Err(err) = nix::sys::prctl::set_child_subreaper(true) {
            eprintln!("cannot become a subreaper ({err}); a restic killed with its agent may linger as a zombie");
            return;
        }
        let spawned = std::thread::Builder::new().name("reap-orphans".into()).spawn(|| loop {
            std::thread::sleep(Duration::from_millis(100));
            reap();
        });
        if let Err(err) = spawned {
            eprintln!("cannot start the orphan reaper: {err}");
        }
    });
}

fn reap() {
    let me = std::process::id();
    let Ok(entries) = std::fs::read_dir("/proc") else { return };
    for entry in entries.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else { continue };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else { continue };
        if let Some(zombie) = Stat::parse(&stat) {
            if zombie.state == 'Z' && zombie.ppid == me && zombie.pgrp == pid as u32 && zombie.comm == "restic" {
                let _ = waitpid(Pid::from_raw(pid), Some(WaitPidFlag::WNOHANG));
            }
        }
    }
}

/// The fields of `/proc/<pid>/stat` the reaper looks at.
#[derive(Debug, PartialEq)]
struct Stat<'a> {
    comm: &'a str,
    state: char,
    ppid: u32,
    pgrp: u32,
}

impl<'a> Stat<'a> {
    /// `pid (comm) state ppid pgrp …`; the command name may itself hold
    /// spaces and parentheses, so it ends at the last `)`.
    fn parse(line: &'a str) -> Option<Stat<'a>> {
        let open = line.find('(')?;
        let close = line.rfind(')')?;
        let comm = line.get(open + 1..close)?;
        let mut rest = line.get(close + 1..)?.split_whitespace();
        let state = rest.next()?.chars().next()?;
        let ppid = rest.next()?.parse().ok()?;
        let pgrp = rest.next()?.parse().ok()?;
        Some(Stat { comm, state, ppid, pgrp })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_parse_with_odd_command_names() {
        assert_eq!(
            Stat::parse("4242 (restic) Z 17 4242 17 0 -1 4194572"),
            Some(Stat { comm: "restic", state: 'Z', ppid: 17, pgrp: 4242 })
        );
        assert_eq!(Stat::parse("9 (a) b (c)) S 1 9 9").map(|s| (s.comm, s.ppid)), Some(("a) b (c)", 1)));
        assert_eq!(Stat::parse("9 (cut"), None);
    }
}
