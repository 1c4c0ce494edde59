//! Ports for the processes a test starts, handed out so that two tests
//! running side by side never get the same one.
//!
//! Binding port 0 and passing the number on (what a test did before) races:
//! between the close and the child's bind, any process may be given the same
//! port, because it is in the kernel's ephemeral range, which every
//! outgoing connection and every port-0 bind also draws from. A deploy test
//! once pushed its images to another test's agent listener that way.
//!
//! Here a port comes from `10000..=19999`: below the ephemeral range
//! (32768 and up on Linux), and below the control plane's default
//! `--service-ports` (20000–29999), so nothing but this allocator hands it
//! out. A reservation is a file named for the port holding the owning
//! test's pid, created under an exclusive lock on a shared lock file; a
//! reservation whose process is gone is taken over. Children die with the
//! test process (they are killed on drop), so a dead owner means a free port.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::net::TcpListener;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

const FIRST: u16 = 10_000;
const COUNT: u16 = 10_000;

fn dir() -> PathBuf {
    std::env::temp_dir().join("cloudweb-e2e-ports")
}

fn owner_alive(path: &std::path::Path) -> bool {
    let Ok(text) = fs::read_to_string(path) else { return false };
    match text.trim().parse::<u32>() {
        Ok(pid) if pid == std::process::id() => true,
        Ok(pid) => PathBuf::from(format!("/proc/{pid}")).exists(),
        Err(_) => false,
    }
}

/// A port on 127.0.0.1 that no other test holds and nothing listens on.
pub fn reserve() -> u16 {
    reserve_run(1)
}

/// `count` consecutive ports, as [`reserve`] hands out one: the first.
pub fn reserve_run(count: u16) -> u16 {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    assert!((1..=100).contains(&count), "a run of 1 to 100 ports");
    let dir = dir();
    fs::create_dir_all(&dir).expect("port reservation dir");
    let lock = OpenOptions::new().create(true).truncate(false).write(true).open(dir.join(".lock")).expect("port lock file");
    lock.lock().expect("port lock");
    // Start somewhere that differs between processes, so they do not all
    // probe the same ports first.
    let seed = u64::from(std::process::id()).wrapping_mul(7919) + SEQ.fetch_add(1, Ordering::Relaxed) * 104_729;
    let start = (seed % u64::from(COUNT - count + 1)) as u16;
    let slots = COUNT - count + 1;
    for step in 0..slots {
        let first = FIRST + (start + step) % slots;
        let free = (first..first + count).all(|port| {
            let path = dir.join(port.to_string());
            !(path.exists() && owner_alive(&path)) && TcpListener::bind(("127.0.0.1", port)).is_ok()
        });
        if !free {
            continue;
        }
        for port in first..first + count {
            let mut file = File::create(dir.join(port.to_string())).expect("port reservation");
            write!(file, "{}", std::process::id()).expect("port reservation");
        }
        drop(lock);
        return first;
    }
    panic!("no run of {count} free ports left in {FIRST}..{}", FIRST + COUNT);
}
