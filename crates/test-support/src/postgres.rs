//! A real PostgreSQL server for a test: Debian's `initdb` and `postgres`
//! on a Unix socket in a temporary directory, listening on no TCP port, and
//! gone with the test (SIGKILL to the server when the test process dies,
//! a fast shutdown when the handle drops). No system service is involved.
//!
//! PostgreSQL refuses to run as root, so a test running as root starts it
//! as the `postgres` user (Debian's package makes it) in a directory that
//! user owns.

use std::io;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::{Pid, User};

/// How long the server may take to accept connections.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// A running server; dropping it stops the server and removes its files.
pub struct TestPostgres {
    dir: tempfile::TempDir,
    child: Child,
}

/// The directory holding Debian's PostgreSQL programs
/// (`/usr/lib/postgresql/<major>/bin`, the newest major), or `None` when
/// the server package is not installed.
pub fn bin_dir() -> Option<PathBuf> {
    let mut majors: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .flatten()
        .filter_map(|entry| {
            let major = entry.file_name().to_str()?.parse().ok()?;
            let bin = entry.path().join("bin");
            bin.join("postgres").exists().then_some((major, bin))
        })
        .collect();
    majors.sort();
    majors.pop().map(|(_, bin)| bin)
}

impl TestPostgres {
    /// Makes a cluster with `initdb` (trust authentication on the socket
    /// only, no fsync: a test's data need not survive a power cut) and
    /// starts its server. Panics with the server's log when it does not
    /// come up, since no test can go on without it.
    pub fn start() -> TestPostgres {
        let bin = bin_dir().expect("PostgreSQL's server is not installed (apt-get install postgresql; scripts/deps.sh does)");
        let dir = tempfile::Builder::new().prefix("cloudweb-pg-").tempdir().expect("temp dir");
        let owner = run_as();
        let data = dir.path().join("data");
        if let Some(user) = &owner {
            std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod temp dir");
            nix::unistd::chown(dir.path(), Some(user.uid), Some(user.gid)).expect("chown temp dir");
        }
        let mut initdb = Command::new(bin.join("initdb"));
        initdb
            .arg("--pgdata")
            .arg(&data)
            .args(["--auth=trust", "--username=postgres", "--encoding=UTF8", "--locale=C", "--no-sync"])
            .stdin(Stdio::null());
        as_owner(&mut initdb, &owner);
        let out = initdb.output().expect("cannot run initdb");
        assert!(out.status.success(), "initdb failed: {}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));

        std::fs::File::create(dir.path().join("server.log")).expect("server log");
        if let Some(user) = &owner {
            nix::unistd::chown(&dir.path().join("server.log"), Some(user.uid), Some(user.gid)).expect("chown log");
        }
        let child = spawn_from_lasting_thread(server_command(dir.path(), &owner)).expect("cannot start postgres");
        let postgres = TestPostgres { dir, child };
        postgres.wait_ready();
        postgres
    }

    /// Stops the server (a fast shutdown: every session ends, every
    /// committed transaction is on disk) and starts it again on the same
    /// data and socket, as a restart of a database server does.
    pub fn restart(&mut self) {
        self.stop_server();
        self.start_again();
    }

    /// Stops the server (a fast shutdown), keeping its data for
    /// [`TestPostgres::start_again`].
    pub fn stop_server(&mut self) {
        stop(self.child.id());
        let _ = self.child.wait();
    }

    /// Starts a stopped server again on the same data and socket.
    pub fn start_again(&mut self) {
        let _ = std::fs::remove_file(self.dir.path().join("data").join("postmaster.pid"));
        self.child = spawn_from_lasting_thread(server_command(self.dir.path(), &run_as())).expect("cannot start postgres again");
        self.wait_ready();
    }

    /// The directory of the server's Unix socket.
    pub fn socket_dir(&self) -> &Path {
        self.dir.path()
    }

    /// A `postgres://` URL of `database` on this server, as the superuser
    /// `postgres` (no password: trust on the socket).
    pub fn url(&self, database: &str) -> String {
        format!("postgres://postgres@localhost/{database}?host={}", self.socket_dir().display())
    }

    /// Runs one SQL statement as the superuser on database `postgres`
    /// with Debian's `psql`, and returns what it printed (unaligned, tuples
    /// only); panics with psql's error when it fails.
    pub fn psql(&self, sql: &str) -> String {
        self.psql_in("postgres", sql)
    }

    /// [`TestPostgres::psql`] on database `database`.
    pub fn psql_in(&self, database: &str, sql: &str) -> String {
        let psql = bin_dir().map(|bin| bin.join("psql")).filter(|p| p.exists()).unwrap_or_else(|| "psql".into());
        let out = Command::new(psql)
            .arg("-h")
            .arg(self.socket_dir())
            .args(["-U", "postgres", "-d", database, "-v", "ON_ERROR_STOP=1", "-tAc", sql])
            .stdin(Stdio::null())
            .output()
            .expect("cannot run psql");
        assert!(out.status.success(), "psql {sql:?} failed: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// Makes database `name` unless it exists.
    pub fn create_database(&self, name: &str) {
        if self.psql(&format!("SELECT 1 FROM pg_database WHERE datname = '{name}'")) != "1" {
            self.psql(&format!("CREATE DATABASE \"{name}\""));
        }
    }

    /// The pid of the server (the postmaster), for tests that stop or
    /// freeze it.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// What the server wrote to its log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default()
    }

    /// Stops the server (fast shutdown, then SIGKILL after 10 s) and
    /// removes its files, for a handle that is never dropped (a static).
    pub fn stop_and_remove(&self) {
        stop(self.child.id());
        let _ = std::fs::remove_dir_all(self.dir.path());
    }

    fn wait_ready(&self) {
        let socket = self.dir.path().join(".s.PGSQL.5432");
        let deadline = Instant::now() + READY_TIMEOUT;
        // The socket appears before the server accepts connections; the
        // pid file's last line says "ready" once it does.
        let pidfile = self.dir.path().join("data").join("postmaster.pid");
        loop {
            let ready = socket.exists() && std::fs::read_to_string(&pidfile).is_ok_and(|text| text.lines().any(|l| l.trim() == "ready"));
            if ready {
                return;
            }
            assert!(Instant::now() < deadline, "postgres did not accept connections within {READY_TIMEOUT:?}: {}", self.log());
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for TestPostgres {
    fn drop(&mut self) {
        stop(self.child.id());
        let _ = self.child.wait();
    }
}

/// SIGINT (PostgreSQL's fast shutdown: it ends every session), then
/// SIGKILL if the server is still there after 10 s.
fn stop(pid: u32) {
    let pid = Pid::from_raw(pid as i32);
    let _ = kill(pid, Signal::SIGINT);
    let deadline = Instant::now() + Duration::from_secs(10);
    // Signal 0 fails once the process is gone (or a zombie is reaped).
    while Instant::now() < deadline {
        match nix::sys::wait::waitpid(pid, Some(nix::sys::wait::WaitPidFlag::WNOHANG)) {
            Ok(nix::sys::wait::WaitStatus::StillAlive) => std::thread::sleep(Duration::from_millis(20)),
            _ => return,
        }
    }
    let _ = kill(pid, Signal::SIGKILL);
}

/// The `postgres` server of the cluster in `<dir>/data`, its socket in
/// `dir`, appending to `<dir>/server.log`: trust on the socket only, no TCP
/// port, no fsync.
fn server_command(dir: &Path, owner: &Option<User>) -> Command {
    let bin = bin_dir().expect("PostgreSQL's server is not installed");
    let log = std::fs::OpenOptions::new().append(true).open(dir.join("server.log")).expect("server log");
    let mut server = Command::new(bin.join("postgres"));
    server
        .arg("-D")
        .arg(dir.join("data"))
        .arg("-k")
        .arg(dir)
        .args(["-c", "listen_addresses=", "-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off"])
        .args(["-c", "max_connections=200"])
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("log"))
        .stderr(log);
    as_owner(&mut server, owner);
    die_with_parent(&mut server);
    server
}

/// The user to run PostgreSQL as: `postgres` when this process is root.
fn run_as() -> Option<User> {
    if !nix::unistd::geteuid().is_root() {
        return None;
    }
    Some(User::from_name("postgres").ok().flatten().expect("running as root needs the postgres user (Debian's postgresql package makes it)"))
}

fn as_owner(command: &mut Command, owner: &Option<User>) {
    if let Some(user) = owner {
        command.uid(user.uid.as_raw()).gid(user.gid.as_raw()).env("HOME", "/").current_dir("/");
    }
}

/// Spawns `command` from one thread that lives as long as the process.
///
/// The kernel sends the death signal of [`die_with_parent`] when the
/// *thread* that forked the child ends, not the process. Callers start a
/// server from whatever thread they are on, often a `spawn_blocking` thread
/// of tokio, which exits after ten idle seconds: the server was then killed
/// under a test or bench that was still using it (the heartbeat bench on
/// PostgreSQL lost its database that way, 10 s after the start, and its
/// pool then timed out on every request).
fn spawn_from_lasting_thread(command: Command) -> io::Result<Child> {
    type Request = (Command, std::sync::mpsc::Sender<io::Result<Child>>);
    static SPAWNER: std::sync::OnceLock<std::sync::Mutex<std::sync::mpsc::Sender<Request>>> = std::sync::OnceLock::new();
    let spawner = SPAWNER.get_or_init(|| {
        let (requests, incoming) = std::sync::mpsc::channel::<Request>();
        std::thread::Builder::new()
            .name("test-postgres-spawner".into())
            .spawn(move || {
                for (mut command, answer) in incoming {
                    let _ = answer.send(command.spawn());
                }
            })
            .expect("cannot start the spawner thread");
        std::sync::Mutex::new(requests)
    });
    let (answer, spawned) = std::sync::mpsc::channel();
    spawner.lock().expect("spawner lock").send((command, answer)).map_err(|_| io::Error::other("the spawner thread is gone"))?;
    spawned.recv().map_err(|_| io::Error::other("the spawner thread is gone"))?
}

/// SIGKILL to the child when this process dies, so a killed test leaves no
/// server behind.
fn die_with_parent(command: &mut Command) {
    let parent = nix::unistd::getpid();
    // SAFETY: runs in the forked child before exec; prctl and getppid are
    // async-signal-safe and nothing is allocated.
    unsafe {
        command.pre_exec(move || {
            nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(io::Error::from)?;
            if nix::unistd::getppid() != parent {
                return Err(io::Error::other("parent exited before the child started"));
            }
            Ok(())
        });
    }
}

#[cfg(test)]
mod tests {
    use super::TestPostgres;

    /// A server started from a thread that then ends (as tokio's blocking
    /// threads do when idle) keeps running for its handle's owner.
    #[test]
    fn the_server_outlives_the_thread_that_started_it() {
        let postgres = std::thread::spawn(TestPostgres::start).join().unwrap();
        // The death signal, had it been armed for that thread, is sent at
        // once; give the kernel a moment to deliver it.
        std::thread::sleep(std::time::Duration::from_millis(500));
        assert_eq!(postgres.psql("SELECT 1 + 1"), "2", "the server still answers: {}", postgres.log());
    }
}
