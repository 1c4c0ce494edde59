//! restic, run the way cloud-web needs it: the backup engine of volumes,
//! managed databases and the control plane itself.
//!
//! - Every run gets a clean environment: `PATH`, the repository, its
//!   password and credentials, a cache directory of the caller's, and
//!   nothing else from the caller (no proxy variable or `RESTIC_*` of the
//!   operator's shell changes what runs). Secrets travel in the
//!   environment, never on the command line, and are cut out of every
//!   error text.
//! - Every run is bounded in time and killed (with its process group) when
//!   it runs over, when the future running it is dropped, or when this
//!   process dies.
//! - Failures come back as [`ResticError`]s that say what happened in
//!   words: wrong password, no repository there, unreachable, locked, out
//!   of space.
//!
//! restic 0.14 (Debian bookworm) is the oldest release this is used with:
//! it has no `--retry-lock`, so [`Restic::retry_locked`] waits for a lock
//! itself, a bounded number of times.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use cloudweb_protocol::{Repository, Retention};
use serde::Deserialize;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::process::{Child, Command};

/// The binary run, unless `CLOUDWEB_RESTIC` names another.
pub const DEFAULT_BINARY: &str = "restic";

/// The host name every cloud-web snapshot is made under, so snapshots of
/// one target from different nodes (after a move) form one history.
pub const SNAPSHOT_HOST: &str = "cloudweb";

/// Longest stderr kept for an error.
const MAX_ERROR_TEXT: usize = 2048;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ResticError {
    #[error("restic is not installed on this host (install Debian's restic package): {0}")]
    NotInstalled(String),
    #[error("the repository's password is wrong (restic: {0})")]
    WrongPassword(String),
    #[error("there is no restic repository there (restic: {0})")]
    NoRepository(String),
    #[error("the repository is already initialized")]
    AlreadyInitialized,
    #[error("the destination cannot be reached (restic: {0})")]
    Unreachable(String),
    #[error("the repository is locked by another restic (restic: {0})")]
    Locked(String),
    #[error("the destination is out of space (restic: {0})")]
    NoSpace(String),
    #[error("no snapshot {0} in the repository")]
    NoSnapshot(String),
    #[error("restic ran over its {0} s limit and was stopped")]
    TimedOut(u64),
    #[error("restic failed (exit {status}): {text}")]
    Failed { status: i32, text: String },
    #[error("{0}")]
    Io(String),
}

impl ResticError {
    /// Whether trying again later may succeed (the destination was away,
    /// busy or full, or the run was slow), as against a wrong setting.
    pub fn is_transient(&self) -> bool {
        matches!(self, ResticError::Unreachable(_) | ResticError::Locked(_) | ResticError::NoSpace(_) | ResticError::TimedOut(_) | ResticError::Io(_))
    }
}

/// The last line `restic backup --json` prints.
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct BackupSummary {
    pub snapshot_id: String,
    #[serde(default)]
    pub total_files_processed: u64,
    #[serde(default)]
    pub total_bytes_processed: u64,
    #[serde(default)]
    pub data_added: u64,
    #[serde(default)]
    pub total_duration: f64,
}

/// One entry of `restic snapshots --json`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct Snapshot {
    pub id: String,
    pub short_id: String,
    pub time: String,
    #[serde(default)]
    pub tags: Vec<String>,
    #[serde(default)]
    pub paths: Vec<String>,
}

/// A repository, opened with restic.
#[derive(Debug, Clone)]
pub struct Restic {
    binary: PathBuf,
    repository: Repository,
    cache_dir: PathBuf,
}

impl Restic {
    /// `cache_dir` is restic's cache (and its `HOME`): a directory of the
    /// caller's, created when missing.
    pub fn new(repository: Repository, cache_dir: &Path) -> Restic {
        let binary = std::env::var_os("CLOUDWEB_RESTIC").map(PathBuf::from).unwrap_or_else(|| PathBuf::from(DEFAULT_BINARY));
        Restic { binary, repository, cache_dir: cache_dir.to_path_buf() }
    }

    pub fn with_binary(mut self, binary: impl Into<PathBuf>) -> Restic {
        self.binary = binary.into();
        self
    }

    pub fn repository(&self) -> &Repository {
        &self.repository
    }

    /// `text` with the password and every credential cut out.
    pub fn redact(&self, text: &str) -> String {
        let mut text = text.to_string();
        let mut secrets: Vec<&str> = vec![self.repository.password.as_str()];
        secrets.extend(self.repository.env.iter().filter(|(k, _)| k.as_str() != "AWS_DEFAULT_REGION").map(|(_, v)| v.as_str()));
        for secret in secrets.into_iter().filter(|s| s.len() >= 4) {
            text = text.replace(secret, "[redacted]");
        }
        text
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(&self.binary);
        command.env_clear();
        command.env("PATH", std::env::var_os("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into()));
        command.env("HOME", &self.cache_dir);
        command.env("RESTIC_CACHE_DIR", &self.cache_dir);
        command.env("TMPDIR", std::env::temp_dir());
        command.env("RESTIC_REPOSITORY", &self.repository.url);
        command.env("RESTIC_PASSWORD", &self.repository.password);
        for (key, value) in &self.repository.env {
            command.env(key, value);
        }
        command.args(args);
        command.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
        command.kill_on_drop(true);
        command.process_group(0);
        cloudweb_child::die_with_parent(&mut command);
        command
    }

    fn spawn(&self, args: &[&str], stdin: bool) -> Result<Child, ResticError> {
        let _ = std::fs::create_dir_all(&self.cache_dir);
        let mut command = self.command(args);
        if stdin {
            command.stdin(Stdio::piped());
        }
        command.spawn().map_err(|err| match err.kind() {
            std::io::ErrorKind::NotFound => ResticError::NotInstalled(format!("{} not found", self.binary.display())),
            _ => ResticError::Io(format!("cannot start restic: {err}")),
        })
    }

    /// Runs restic to its end within `limit`: its standard output, or the
    /// error its exit status and standard error say.
    async fn run(&self, args: &[&str], limit: Duration) -> Result<Vec<u8>, ResticError> {
        let child = self.spawn(args, false)?;
        self.finish(child, limit).await
    }

    async fn finish(&self, mut child: Child, limit: Duration) -> Result<Vec<u8>, ResticError> {
        let mut stdout = child.stdout.take().expect("stdout piped");
        let mut stderr = child.stderr.take().expect("stderr piped");
        let work = async {
            let mut out = Vec::new();
            let mut err = Vec::new();
            let (read_out, read_err) = tokio::join!(stdout.read_to_end(&mut out), read_capped(&mut stderr, &mut err));
            read_out.map_err(|e| ResticError::Io(format!("cannot read restic's output: {e}")))?;
            read_err.map_err(|e| ResticError::Io(format!("cannot read restic's errors: {e}")))?;
            let status = child.wait().await.map_err(|e| ResticError::Io(format!("cannot wait for restic: {e}")))?;
            Ok::<_, ResticError>((status, out, err))
        };
        match tokio::time::timeout(limit, work).await {
            Ok(Ok((status, out, err))) if status.success() => {
                let _ = err;
                Ok(out)
            }
            Ok(Ok((status, _, err))) => Err(self.classify(status.code().unwrap_or(-1), &String::from_utf8_lossy(&err))),
            Ok(Err(err)) => Err(err),
            Err(_) => {
                kill_group(&child);
                let _ = child.kill().await;
                Err(ResticError::TimedOut(limit.as_secs()))
            }
        }
    }

    fn classify(&self, status: i32, stderr: &str) -> ResticError {
        let text = self.redact(stderr.trim());
        let text = cap(&text);
        let lower = text.to_lowercase();
        if lower.contains("wrong password") || lower.contains("no key found") {
            ResticError::WrongPassword(text)
        } else if lower.contains("config file already exists") || lower.contains("already initialized") {
            ResticError::AlreadyInitialized
        } else if lower.contains("connection refused")
            || lower.contains("no such host")
            || lower.contains("i/o timeout")
            || lower.contains("timeout")
            || lower.contains("network is unreachable")
            || lower.contains("connection reset")
            || lower.contains("nosuchbucket")
            || lower.contains("bucket does not exist")
        {
            ResticError::Unreachable(text)
        } else if lower.contains("is there a repository at the following location") || lower.contains("does not exist") && lower.contains("repository") {
            ResticError::NoRepository(text)
        } else if lower.contains("unable to create lock") || lower.contains("repository is already locked") {
            ResticError::Locked(text)
        } else if lower.contains("no space left") || lower.contains("quotaexceeded") || lower.contains("entitytoolarge") || lower.contains("insufficient storage") {
            ResticError::NoSpace(text)
        } else if lower.contains("no matching id") || lower.contains("no snapshot found") || lower.contains("no matching snapshot") {
            ResticError::NoSnapshot(text)
        } else {
            ResticError::Failed { status, text }
        }
    }

    /// `restic init`. [`ResticError::AlreadyInitialized`] when a
    /// repository is already there (whatever its password).
    pub async fn init(&self, limit: Duration) -> Result<(), ResticError> {
        self.run(&["init"], limit).await.map(|_| ())
    }

    /// `restic cat config`: the repository opens with this password.
    pub async fn open(&self, limit: Duration) -> Result<(), ResticError> {
        self.run(&["cat", "config", "--no-lock"], limit).await.map(|_| ())
    }

    /// Backs up the contents of `dir` (paths in the snapshot are relative
    /// to it, so a restore puts them straight into its target).
    pub async fn backup_dir(&self, dir: &Path, tags: &[String], limit: Duration) -> Result<BackupSummary, ResticError> {
        let mut args = vec!["backup", "--json", "-q", "--host", SNAPSHOT_HOST, "--one-file-system"];
        for tag in tags {
            args.extend(["--tag", tag.as_str()]);
        }
        args.push(".");
        let mut command = self.command(&args);
        command.current_dir(dir);
        let _ = std::fs::create_dir_all(&self.cache_dir);
        let child = command.spawn().map_err(|err| match err.kind() {
            std::io::ErrorKind::NotFound if !dir.exists() => ResticError::Io(format!("{} does not exist", dir.display())),
            std::io::ErrorKind::NotFound => ResticError::NotInstalled(format!("{} not found", self.binary.display())),
            _ => ResticError::Io(format!("cannot start restic: {err}")),
        })?;
        let out = self.finish(child, limit).await?;
        summary(&out)
    }

    /// Backs up what `reader` gives, to its end, as one file `filename`;
    /// then `done` says whether the program that produced it succeeded
    /// (its exit status). When reading or `done` fails, restic is killed
    /// while its input is still open, so a cut stream never becomes a
    /// snapshot.
    pub async fn backup_stdin<R, D>(&self, filename: &str, tags: &[String], limit: Duration, mut reader: R, done: D) -> Result<BackupSummary, ResticError>
    where
        R: AsyncRead + Unpin,
        D: std::future::Future<Output = Result<(), String>>,
    {
        let stdin_filename = format!("--stdin-filename={filename}");
        let mut args = vec!["backup", "--json", "-q", "--host", SNAPSHOT_HOST, "--stdin", stdin_filename.as_str()];
        for tag in tags {
            args.extend(["--tag", tag.as_str()]);
        }
        let started = Instant::now();
        let mut child = self.spawn(&args, true)?;
        let mut stdin = child.stdin.take().expect("stdin piped");
        let fed = async {
            let written = tokio::io::copy(&mut reader, &mut stdin).await.map_err(|e| format!("the dump was cut: {e}"))?;
            done.await?;
            Ok::<u64, String>(written)
        };
        let fed = match tokio::time::timeout(limit, fed).await {
            Ok(fed) => fed,
            Err(_) => Err(format!("the dump ran over the {} s limit", limit.as_secs())),
        };
        let written = match fed {
            Ok(written) => written,
            Err(reason) => {
                // Killed with its input still open: restic saves nothing.
                kill_group(&child);
                let _ = child.kill().await;
                drop(stdin);
                return Err(ResticError::Io(self.redact(&reason)));
            }
        };
        if let Err(err) = stdin.shutdown().await {
            kill_group(&child);
            let _ = child.kill().await;
            return Err(ResticError::Io(format!("cannot close restic's input: {err}")));
        }
        drop(stdin);
        let left = limit.saturating_sub(started.elapsed()).max(Duration::from_secs(1));
        let out = self.finish(child, left).await?;
        let summary = summary(&out)?;
        if summary.total_bytes_processed != written {
            return Err(ResticError::Io(format!("restic stored {} bytes of the {written} written", summary.total_bytes_processed)));
        }
        Ok(summary)
    }

    /// Snapshots carrying every tag of `tags`, oldest first.
    pub async fn snapshots(&self, tags: &[String], limit: Duration) -> Result<Vec<Snapshot>, ResticError> {
        let joined = tags.join(",");
        let mut args = vec!["snapshots", "--json", "--no-lock"];
        if !tags.is_empty() {
            args.extend(["--tag", joined.as_str()]);
        }
        let out = self.run(&args, limit).await?;
        serde_json::from_slice::<Option<Vec<Snapshot>>>(&out)
            .map(Option::unwrap_or_default)
            .map_err(|e| ResticError::Io(format!("cannot read restic's snapshot list: {e}")))
    }

    /// `forget --prune` of the snapshots tagged `tag`, keeping what
    /// `retention` says. They form one group whatever their other tags
    /// (each carries its own `job=<id>`) and paths: every cloud-web
    /// snapshot has the same host, [`SNAPSHOT_HOST`].
    pub async fn forget_prune(&self, tag: &str, retention: Retention, limit: Duration) -> Result<(), ResticError> {
        let (daily, weekly, monthly) = (retention.keep_daily.to_string(), retention.keep_weekly.to_string(), retention.keep_monthly.to_string());
        let args = [
            "forget", "-q", "--prune", "--group-by", "host", "--tag", tag, "--keep-daily", &daily, "--keep-weekly", &weekly, "--keep-monthly", &monthly,
        ];
        self.run(&args, limit).await.map(|_| ())
    }

    /// `forget --prune` keeping the newest `hourly` hourly and `daily`
    /// daily snapshots tagged `tag` (the control plane's own backups), as
    /// one group like [`Restic::forget_prune`].
    pub async fn forget_prune_hourly(&self, tag: &str, hourly: u32, daily: u32, limit: Duration) -> Result<(), ResticError> {
        let (hourly, daily) = (hourly.to_string(), daily.to_string());
        let args = ["forget", "-q", "--prune", "--group-by", "host", "--tag", tag, "--keep-hourly", &hourly, "--keep-daily", &daily];
        self.run(&args, limit).await.map(|_| ())
    }

    /// `restic check --read-data-subset=P%`: the repository's structure,
    /// and that share of its data read back and checked against its hashes.
    pub async fn check(&self, read_data_percent: u8, limit: Duration) -> Result<(), ResticError> {
        let subset = format!("--read-data-subset={}%", read_data_percent.clamp(1, 100));
        self.run(&["check", "-q", &subset], limit).await.map(|_| ())
    }

    /// Restores `snapshot` into `target` (created when missing).
    pub async fn restore(&self, snapshot: &str, target: &Path, limit: Duration) -> Result<(), ResticError> {
        let target = target.to_string_lossy();
        self.run(&["restore", "-q", snapshot, "--target", &target], limit).await.map(|_| ())
    }

    /// Writes `file` of `snapshot` to `writer`; the bytes written.
    pub async fn dump<W: AsyncWrite + Unpin>(&self, snapshot: &str, file: &str, writer: &mut W, limit: Duration) -> Result<u64, ResticError> {
        let path = format!("/{file}");
        let mut child = self.spawn(&["dump", "-q", snapshot, &path], false)?;
        let mut stdout = child.stdout.take().expect("stdout piped");
        let mut stderr = child.stderr.take().expect("stderr piped");
        let work = async {
            let mut err = Vec::new();
            let (copied, read_err) = tokio::join!(tokio::io::copy(&mut stdout, writer), read_capped(&mut stderr, &mut err));
            let _ = read_err;
            let status = child.wait().await.map_err(|e| ResticError::Io(format!("cannot wait for restic: {e}")))?;
            Ok::<_, ResticError>((status, copied, err))
        };
        match tokio::time::timeout(limit, work).await {
            Ok(Ok((status, copied, _))) if status.success() => {
                let copied = copied.map_err(|e| ResticError::Io(format!("cannot write the restored dump: {e}")))?;
                writer.flush().await.map_err(|e| ResticError::Io(format!("cannot write the restored dump: {e}")))?;
                Ok(copied)
            }
            Ok(Ok((status, copied, err))) => {
                if let Err(e) = copied {
                    return Err(ResticError::Io(format!("cannot write the restored dump: {e}")));
                }
                Err(self.classify(status.code().unwrap_or(-1), &String::from_utf8_lossy(&err)))
            }
            Ok(Err(err)) => Err(err),
            Err(_) => {
                kill_group(&child);
                let _ = child.kill().await;
                Err(ResticError::TimedOut(limit.as_secs()))
            }
        }
    }

    /// Removes stale locks (of restic processes that died).
    pub async fn unlock(&self, limit: Duration) -> Result<(), ResticError> {
        self.run(&["unlock", "-q"], limit).await.map(|_| ())
    }

    /// [`Restic::retry_locked`] that also removes stale locks before each
    /// new try: those of restic processes on this host that are gone (a
    /// restic killed with an agent that was killed leaves its lock, and
    /// restic refuses an exclusive lock, as `forget --prune` takes, while
    /// any other lock is there) and any older than 30 minutes. A live
    /// restic's lock is never removed: restic refreshes it every 5 minutes
    /// and checks the process on its own host.
    pub async fn retry_locked_clearing_stale<T, F, Fut>(&self, tries: u32, pause: Duration, op: F) -> Result<T, ResticError>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, ResticError>>,
    {
        retry_while_locked(tries, pause, op, || async {
            if let Err(err) = self.unlock(pause.max(Duration::from_secs(30))).await {
                tracing::warn!(error = %err, "could not remove stale locks");
            }
        })
        .await
    }

    /// Runs `op` again while the repository is locked by another restic,
    /// at most `tries` times, `pause` apart.
    pub async fn retry_locked<T, F, Fut>(tries: u32, pause: Duration, op: F) -> Result<T, ResticError>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, ResticError>>,
    {
        retry_while_locked(tries, pause, op, || async {}).await
    }
}

/// `op` at most `tries` times while it finds the repository locked, with
/// `between` and then `pause` before each new try.
async fn retry_while_locked<T, F, Fut, B, BFut>(tries: u32, pause: Duration, mut op: F, mut between: B) -> Result<T, ResticError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, ResticError>>,
    B: FnMut() -> BFut,
    BFut: std::future::Future<Output = ()>,
{
    let mut attempt = 1;
    loop {
        match op().await {
            Err(ResticError::Locked(text)) if attempt < tries => {
                tracing::info!(attempt, "the repository is locked; waiting: {text}");
                between().await;
                tokio::time::sleep(pause).await;
                attempt += 1;
            }
            other => return other,
        }
    }
}

fn summary(out: &[u8]) -> Result<BackupSummary, ResticError> {
    let text = String::from_utf8_lossy(out);
    text.lines()
        .rev()
        .filter(|line| line.contains("\"summary\""))
        .find_map(|line| serde_json::from_str::<BackupSummary>(line).ok())
        .ok_or_else(|| ResticError::Io("restic printed no backup summary".into()))
}

async fn read_capped<R: AsyncRead + Unpin>(reader: &mut R, into: &mut Vec<u8>) -> std::io::Result<()> {
    let mut buf = [0u8; 4096];
    loop {
        let n = reader.read(&mut buf).await?;
        if n == 0 {
            return Ok(());
        }
        if into.len() < 64 * 1024 {
            into.extend_from_slice(&buf[..n]);
        }
    }
}

fn cap(text: &str) -> String {
    if text.len() <= MAX_ERROR_TEXT {
        return text.to_string();
    }
    let mut end = MAX_ERROR_TEXT;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

/// SIGKILL to the child's whole process group (restic's own children, an
/// sftp or rclone it started, go with it).
fn kill_group(child: &Child) {
    if let Some(pid) = child.id() {
        let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pid as i32), nix::sys::signal::Signal::SIGKILL);
    }
}

#[cfg(test)]
mod tests;
