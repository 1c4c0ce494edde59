//! The test git host: bare repositories behind `git daemon` on loopback,
//! and `git` commands isolated from the machine's git configuration.

use std::ffi::OsString;
use std::fs::File;
use std::net::TcpStream;
use std::path::{Component, Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::{free_port, run_command};

/// Author and committer of every fixture commit, fixed so that tests do not
/// depend on the machine's git configuration.
const GIT_USER_NAME: &str = "cloud-web tests";
const GIT_USER_EMAIL: &str = "tests@cloudweb.invalid";

/// Bare repositories served read-write by `git daemon` on loopback, with a
/// work clone per repository for making commits. The daemon is killed on
/// drop.
pub struct GitServer {
    daemon: Child,
    port: u16,
    /// `--base-path` of the daemon: one `<repo>.git` per app.
    repositories: PathBuf,
    /// One work clone per repository, kept so later commits build on earlier ones.
    work: PathBuf,
    /// Serializes commits: two at once in one work clone would trample each other.
    commit_lock: Mutex<()>,
}

impl GitServer {
    /// Starts `git daemon` on a free port, keeping everything under `dir`.
    pub fn start(dir: &Path) -> Result<GitServer> {
        let repositories = dir.join("git-repositories");
        let work = dir.join("git-work");
        std::fs::create_dir_all(&repositories)?;
        std::fs::create_dir_all(&work)?;
        // free_port() leaves a window in which another process may take the
        // port; the daemon then exits at once, and a fresh port is tried.
        let mut last_error = None;
        for _ in 0..3 {
            let port = free_port();
            match Self::spawn_daemon(dir, &repositories, port) {
                Ok(daemon) => {
                    return Ok(GitServer { daemon, port, repositories, work, commit_lock: Mutex::new(()) });
                }
                Err(error) => last_error = Some(error),
            }
        }
        Err(last_error.expect("at least one attempt"))
    }

    fn spawn_daemon(dir: &Path, repositories: &Path, port: u16) -> Result<Child> {
        let log_path = dir.join(format!("git-daemon-{port}.log"));
        let log = File::create(&log_path)?;
        let mut base_path = OsString::from("--base-path=");
        base_path.push(repositories);
        // `git daemon` runs git-daemon as a child and does not pass on a
        // kill, which would leave the daemon running after the test; so the
        // program itself is started, from git's exec path.
        let exec_path = run_command(git_command().arg("--exec-path"))?;
        let mut command = isolated_from_git_config(Command::new(Path::new(&exec_path).join("git-daemon")));
        command
            .args(["--reuseaddr", "--export-all", "--enable=receive-pack", "--informative-errors"])
            .arg(base_path)
            .args(["--listen=127.0.0.1", &format!("--port={port}")])
            .stdout(log.try_clone()?)
            .stderr(log);
        // Dies with the test process, even one killed with `kill -9`.
        let mut daemon = crate::tied::spawn(command).context("starting git daemon")?;
        let start = Instant::now();
        loop {
            if TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return Ok(daemon);
            }
            if let Some(status) = daemon.try_wait()? {
                let log = std::fs::read_to_string(&log_path).unwrap_or_default();
                bail!("git daemon on port {port} exited with {status}:\n{log}");
            }
            if start.elapsed() > Duration::from_secs(10) {
                let _ = daemon.kill();
                let _ = daemon.wait();
                bail!("git daemon did not accept connections on port {port} within 10 s");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The bare repository of `repo` as a `file://` URL (for agents that
    /// cannot reach the daemon on this host's loopback, e.g. in another
    /// network namespace; needs `--allow-file-repos`).
    pub fn file_url(&self, repo: &str) -> String {
        format!("file://{}", self.repositories.join(format!("{repo}.git")).display())
    }

    /// The clone URL of `repo`.
    pub fn url(&self, repo: &str) -> String {
        format!("git://127.0.0.1:{}/{repo}.git", self.port)
    }

    /// Writes `files` (path relative to the repository root, contents) into
    /// the work clone of `repo`, over earlier versions and beside earlier
    /// files, commits them on `main` and pushes through the daemon. Creates
    /// the repository on first use. Returns the full commit sha. A commit is
    /// made even when nothing changed, so every call yields a new revision.
    pub fn commit(&self, repo: &str, files: &[(&str, &str)], message: &str) -> Result<String> {
        check_repository_name(repo)?;
        let _guard = self.commit_lock.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let bare = self.repositories.join(format!("{repo}.git"));
        if !bare.exists() {
            run_command(git_command().args(["init", "--quiet", "--bare", "--initial-branch=main", "--"]).arg(&bare))?;
        }
        let work = self.work.join(repo);
        if !work.exists() {
            // init.defaultBranch covers a git too old to learn the unborn
            // branch name from the daemon when cloning an empty repository.
            run_command(
                git_command()
                    .args(["-c", "init.defaultBranch=main", "clone", "--quiet", "--", &self.url(repo)])
                    .arg(&work),
            )?;
        }
        for (path, contents) in files {
            let relative = Path::new(path);
            let plain = relative.components().all(|component| matches!(component, Component::Normal(_)));
            if !plain || path.is_empty() || relative.starts_with(".git") {
                bail!("fixture file path {path:?} must be relative, without `..`, and outside .git");
            }
            let target = work.join(relative);
            if let Some(parent) = target.parent() {
                std::fs::create_dir_all(parent)?;
            }
            std::fs::write(&target, contents).with_context(|| format!("writing {}", target.display()))?;
        }
        run_command(git_command().arg("-C").arg(&work).args(["add", "--all"]))?;
        run_command(
            git_command()
                .arg("-C")
                .arg(&work)
                .args(["-c", &format!("user.name={GIT_USER_NAME}"), "-c", &format!("user.email={GIT_USER_EMAIL}")])
                .args(["commit", "--quiet", "--allow-empty", "--message", message]),
        )?;
        run_command(git_command().arg("-C").arg(&work).args(["push", "--quiet", "origin", "HEAD:refs/heads/main"]))?;
        run_command(git_command().arg("-C").arg(&work).args(["rev-parse", "HEAD"]))
    }
}

impl GitServer {
    /// Moves `repo`'s `main` back to `commit`, as a force-push does (later
    /// commits leave the branch); the next `commit` builds on it.
    pub fn reset_branch(&self, repo: &str, commit: &str) -> Result<()> {
        check_repository_name(repo)?;
        let _guard = self.commit_lock.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let work = self.work.join(repo);
        run_command(git_command().arg("-C").arg(&work).args(["reset", "--quiet", "--hard", commit]))?;
        run_command(git_command().arg("-C").arg(&work).args(["push", "--quiet", "--force", "origin", "HEAD:refs/heads/main"]))?;
        Ok(())
    }
}

impl Drop for GitServer {
    fn drop(&mut self) {
        let _ = self.daemon.kill();
        let _ = self.daemon.wait();
    }
}

/// Repository names become directory names under the daemon's base path,
/// so they are kept to a plain, unambiguous alphabet.
fn check_repository_name(repo: &str) -> Result<()> {
    let plain = repo.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if repo.is_empty() || repo.starts_with('.') || !plain {
        bail!("repository name {repo:?} must be letters, digits, '-', '_' or '.', not starting with '.'");
    }
    Ok(())
}

/// A `git` command isolated from the user's and system's configuration
/// (signing, hooks paths, default branch) and never prompting.
pub fn git_command() -> Command {
    isolated_from_git_config(Command::new("git"))
}

fn isolated_from_git_config(mut command: Command) -> Command {
    command
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_TERMINAL_PROMPT", "0")
        .stdin(Stdio::null());
    command
}

