//! Throwaway repositories served read-only by `git daemon` on loopback,
//! for agents to clone (the same approach as the e2e harness's GitServer).

use std::ffi::OsString;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::process::Guarded;
use crate::server::free_port;

/// Author and committer of every commit, fixed so the benchmark does not
/// depend on the machine's git configuration.
const USER_NAME: &str = "cloud-web bench";
const USER_EMAIL: &str = "bench@cloudweb.invalid";

pub struct GitDaemon {
    _daemon: Guarded,
    port: u16,
    repositories: PathBuf,
    work: PathBuf,
}

impl GitDaemon {
    /// Starts `git daemon` on a free port, keeping everything under `dir`.
    pub fn start(dir: &Path) -> Result<GitDaemon> {
        let repositories = dir.join("repositories");
        let work = dir.join("work");
        std::fs::create_dir_all(&repositories)?;
        std::fs::create_dir_all(&work)?;
        // Another process may take the free port before the daemon binds
        // it; the daemon then exits at once and another port is tried.
        let mut last_error = None;
        for _ in 0..3 {
            let port = free_port()?;
            match spawn_daemon(dir, &repositories, port) {
                Ok(daemon) => return Ok(GitDaemon { _daemon: daemon, port, repositories, work }),
                Err(error) => last_error = Some(error),
            }
        }
        Err(last_error.expect("at least one attempt"))
    }

    pub fn url(&self, repo: &str) -> String {
        format!("git://127.0.0.1:{}/{repo}.git", self.port)
    }

    /// Writes `files` (relative path, contents) into the work tree of
    /// `repo`, commits them on `main` and pushes to the served repository
    /// (created on first use). Returns the full commit id.
    pub fn commit(&self, repo: &str, files: &[(&str, &str)], message: &str) -> Result<String> {
        if repo.is_empty() || !repo.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') {
            bail!("repository name {repo:?} must be letters, digits or '-'");
        }
        let bare = self.repositories.join(format!("{repo}.git"));
        let work = self.work.join(repo);
        if !bare.exists() {
            run(git().args(["init", "--quiet", "--bare", "--initial-branch=main", "--"]).arg(&bare))?;
            run(git().args(["init", "--quiet", "--initial-branch=main", "--"]).arg(&work))?;
        }
        for (path, contents) in files {
            if path.is_empty() || !path.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_')) || path.starts_with('.') {
                bail!("file name {path:?} must be a plain name in the repository root");
            }
            std::fs::write(work.join(path), contents).with_context(|| format!("writing {path}"))?;
        }
        run(git().arg("-C").arg(&work).args(["add", "--all"]))?;
        run(git()
            .arg("-C")
            .arg(&work)
            .args(["-c", &format!("user.name={USER_NAME}"), "-c", &format!("user.email={USER_EMAIL}")])
            .args(["commit", "--quiet", "--allow-empty", "--message", message]))?;
        run(git().arg("-C").arg(&work).args(["push", "--quiet", "--"]).arg(&bare).arg("HEAD:refs/heads/main"))?;
        run(git().arg("-C").arg(&work).args(["rev-parse", "HEAD"]))
    }
}

fn spawn_daemon(dir: &Path, repositories: &Path, port: u16) -> Result<Guarded> {
    let log = dir.join(format!("git-daemon-{port}.log"));
    let mut base_path = OsString::from("--base-path=");
    base_path.push(repositories);
    // `git daemon` runs git-daemon as a child and does not pass a kill on,
    // so the program itself is started, from git's exec path.
    let exec_path = run(git().arg("--exec-path"))?;
    let mut command = isolated(Command::new(Path::new(&exec_path).join("git-daemon")));
    command
        .args(["--reuseaddr", "--export-all", "--informative-errors"])
        .arg(base_path)
        .args(["--listen=127.0.0.1", &format!("--port={port}")]);
    let mut daemon = Guarded::spawn(command, &log, Duration::ZERO)?;
    let start = Instant::now();
    loop {
        if TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return Ok(daemon);
        }
        if let Some(status) = daemon.exited() {
            bail!("git daemon on port {port} exited with {status}: {}", std::fs::read_to_string(&log).unwrap_or_default().trim());
        }
        if start.elapsed() > Duration::from_secs(10) {
            bail!("git daemon did not accept connections on port {port} within 10 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `git` without the user's or the system's configuration, never prompting.
fn git() -> Command {
    isolated(Command::new("git"))
}

fn isolated(mut command: Command) -> Command {
    command
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_TERMINAL_PROMPT", "0")
        .stdin(std::process::Stdio::null());
    command
}

/// Runs `command` to completion; its trimmed stdout, or an error with its stderr.
fn run(command: &mut Command) -> Result<String> {
    let output = command.output().with_context(|| format!("running {command:?}"))?;
    if !output.status.success() {
        bail!("{command:?} failed with {}: {}", output.status, String::from_utf8_lossy(&output.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&output.stdout).trim().to_string())
}
