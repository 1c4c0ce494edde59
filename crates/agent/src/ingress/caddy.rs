//! The Caddy process and its admin API. The agent starts Caddy with an
//! admin endpoint on a unix socket in its data dir (never on a TCP port),
//! owns its whole configuration, and replaces it through `POST /load`. A
//! failed load leaves the previous configuration serving.
//!
//! Caddy runs either as a child process of the agent (`--caddy-bin`; it
//! dies with the agent, even on `kill -9`, through `PR_SET_PDEATHSIG`, and
//! a Caddy that an earlier agent left anyway is found by its pid file and
//! killed before a new one starts) or as a container on the host network
//! (`--caddy-image`; it outlives agent restarts, and a restarted agent
//! adopts it without reloading).
//!
//! [`Caddy::exited`] resolves when Caddy dies (the child exits, or the
//! container stops or is restarted by Docker with an empty configuration),
//! so the ingress can start it again and reload the table at once.

use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tokio::process::{Child, Command};

use crate::runtime::{CaddyContainer, DockerRuntime};

#[derive(Debug, thiserror::Error)]
pub enum CaddyError {
    #[error("cannot start {binary}: {source}")]
    Spawn { binary: PathBuf, source: std::io::Error },
    #[error("caddy's admin socket did not come up within 10 s")]
    NoAdmin,
    /// The same, for a container, with what became of it.
    #[error("caddy's admin socket did not come up within 10 s: {0}")]
    NoAdminIn(String),
    #[error("caddy admin request failed: {0}")]
    Admin(String),
    #[error("caddy refused the configuration: {0}")]
    Refused(String),
    #[error("i/o error on {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("cannot run the caddy container: {0}")]
    Container(String),
}

/// How Caddy runs.
#[derive(Debug, Clone)]
pub enum Launch {
    Binary(PathBuf),
    Image { image: String, docker_host: String, node_id: String },
}

enum Runner {
    Child { child: Child, pid_file: cloudweb_child::PidFile },
    /// `started_at` tells a container Docker restarted (which comes back
    /// with only the bootstrap configuration) from the one configured.
    Container { runtime: DockerRuntime, id: String, started_at: Option<String> },
}

/// How often a Caddy container's state is read.
const CONTAINER_WATCH: Duration = Duration::from_millis(300);

pub struct Caddy {
    runner: Runner,
    admin_socket: PathBuf,
    /// A container found running from before this agent started: it keeps
    /// the configuration it had.
    pub adopted: bool,
}

impl Caddy {
    pub async fn start(launch: &Launch, dir: &Path) -> Result<Caddy, CaddyError> {
        match launch {
            Launch::Binary(binary) => Self::start_binary(binary, dir).await,
            Launch::Image { image, docker_host, node_id } => Self::start_container(image, docker_host, node_id, dir).await,
        }
    }

    /// Runs (or adopts) the container of `image`.
    async fn start_container(image: &str, docker_host: &str, node_id: &str, dir: &Path) -> Result<Caddy, CaddyError> {
        let (admin_socket, bootstrap) = prepare(dir)?;
        let runtime = DockerRuntime::new(docker_host, node_id).map_err(|e| CaddyError::Container(e.to_string()))?;
        let short: String = node_id.chars().filter(char::is_ascii_alphanumeric).take(24).collect();
        let spec = CaddyContainer {
            name: format!("cloudweb-caddy-{short}"),
            image: image.to_string(),
            dir: dir.display().to_string(),
            bootstrap: bootstrap.display().to_string(),
        };
        let (id, adopted) = runtime.ensure_caddy(&spec).await.map_err(|e| CaddyError::Container(e.to_string()))?;
        if !adopted {
            let _ = std::fs::remove_file(&admin_socket);
        }
        let started_at = runtime.started_at(&id).await.ok().flatten();
        let caddy = Caddy { runner: Runner::Container { runtime, id, started_at }, admin_socket, adopted };
        match caddy.wait_for_admin().await {
            Err(CaddyError::NoAdmin) => {
                // Say why. A fresh container may only be slow (a loaded
                // machine): the next try adopts it and waits again. One
                // adopted that still does not answer is stuck: it goes, and
                // the next try starts a fresh one.
                let report = caddy.container_report().await;
                if let (true, Runner::Container { runtime, id, .. }) = (caddy.adopted, &caddy.runner) {
                    match runtime.kill_and_remove(id).await {
                        Ok(()) => tracing::warn!("removed a caddy container that did not answer; the next try starts a fresh one"),
                        Err(err) => tracing::warn!(error = %err, "cannot remove the caddy container that did not answer"),
                    }
                }
                Err(CaddyError::NoAdminIn(report))
            }
            Err(err) => Err(err),
            Ok(()) => Ok(caddy),
        }
    }

    /// What became of the container, for an error that needs a reason:
    /// its state, restarts, exit code and last lines of output.
    async fn container_report(&self) -> String {
        let Runner::Container { runtime, id, .. } = &self.runner else { return String::new() };
        let state = match runtime.container_state(id).await {
            Ok(state) => format!(
                "the container is {}, restarted {} times, last exit code {}",
                if state.running { "running" } else { "not running" },
                state.restart_count,
                state.exit_code.map_or_else(|| "none".to_string(), |c| c.to_string())
            ),
            Err(err) => format!("the container cannot be inspected ({err})"),
        };
        let output = match runtime.logs(id, 5).await {
            Ok(lines) if lines.is_empty() => "no output".to_string(),
            Ok(lines) => lines
                .into_iter()
                .map(|(_, mut line)| {
                    cloudweb_protocol::misc::truncate_on_char(&mut line, 300);
                    line
                })
                .collect::<Vec<_>>()
                .join(" | "),
            Err(err) => format!("its output cannot be read ({err})"),
        };
        format!("{state}; its last output: {output}")
    }

    /// Starts `binary run` with only the admin socket configured; routes
    /// come with the first [`Caddy::load`].
    async fn start_binary(binary: &Path, dir: &Path) -> Result<Caddy, CaddyError> {
        let (admin_socket, bootstrap) = prepare(dir)?;
        // A Caddy of an earlier agent still holds the ports and serves its
        // old configuration: it goes first. Its command line names this
        // bootstrap file, which is how it is told from unrelated processes.
        let pid_file = cloudweb_child::PidFile::new(dir.join("caddy.pid"));
        let leftover = {
            let (pid_file, marker) = (pid_file.clone(), bootstrap.clone().into_os_string());
            // It may wait a moment for the old process to go.
            tokio::task::spawn_blocking(move || pid_file.kill_leftover(&marker)).await
        };
        match leftover {
            Ok(Ok(Some(pid))) => tracing::warn!(pid, "stopped a Caddy left running by an earlier agent"),
            Ok(Ok(None)) => {}
            Ok(Err(err)) => tracing::warn!(error = %err, "could not stop a Caddy left by an earlier agent"),
            Err(err) => tracing::warn!(error = %err, "could not look for a Caddy left by an earlier agent"),
        }
        let _ = std::fs::remove_file(&admin_socket);
        let mut command = Command::new(binary);
        command
            .arg("run")
            .arg("--config")
            .arg(&bootstrap)
            .env("XDG_DATA_HOME", dir.join("data"))
            .env("XDG_CONFIG_HOME", dir.join("config"))
            .env("HOME", dir)
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true);
        cloudweb_child::die_with_parent(&mut command);
        let child = command.spawn().map_err(|source| CaddyError::Spawn { binary: binary.to_path_buf(), source })?;
        if let Some(pid) = child.id() {
            pid_file.record(pid).map_err(|source| CaddyError::Io { path: pid_file.path().to_path_buf(), source })?;
        }
        let caddy = Caddy { runner: Runner::Child { child, pid_file }, admin_socket, adopted: false };
        caddy.wait_for_admin().await?;
        Ok(caddy)
    }

    async fn wait_for_admin(&self) -> Result<(), CaddyError> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while tokio::time::Instant::now() < deadline {
            if UnixStream::connect(&self.admin_socket).await.is_ok() {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Err(CaddyError::NoAdmin)
    }

    pub fn admin_socket(&self) -> &Path {
        &self.admin_socket
    }

    /// Resolves when this Caddy is gone: the child exited, or the container
    /// stopped or was restarted by Docker. A container whose state cannot
    /// be read (the engine restarts) counts as running.
    pub async fn exited(&mut self) {
        match &mut self.runner {
            Runner::Child { child, .. } => {
                let status = child.wait().await;
                tracing::error!(?status, "caddy exited");
            }
            Runner::Container { runtime, id, started_at } => loop {
                tokio::time::sleep(CONTAINER_WATCH).await;
                match runtime.started_at(id).await {
                    Ok(None) => {
                        tracing::error!("the caddy container stopped");
                        return;
                    }
                    Ok(now) if now != *started_at => {
                        tracing::error!("the caddy container was restarted and lost its configuration");
                        return;
                    }
                    _ => {}
                }
            },
        }
    }

    /// Stops a Caddy run as a child (the agent shuts down) and waits for
    /// it; a container keeps serving, as across agent restarts.
    pub async fn stop(mut self) {
        if let Runner::Child { child, pid_file } = &mut self.runner {
            if let Some(pid) = child.id() {
                // SIGTERM lets Caddy finish requests in flight; it gets 5 s.
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), nix::sys::signal::Signal::SIGTERM);
            }
            if tokio::time::timeout(Duration::from_secs(5), child.wait()).await.is_err() {
                let _ = child.kill().await;
            }
            pid_file.clear();
        }
    }

    /// The configuration Caddy runs now.
    pub async fn current(&self) -> Result<serde_json::Value, CaddyError> {
        let (status, body) = self.request(hyper::Method::GET, "/config/", Vec::new()).await?;
        if !status.is_success() {
            return Err(CaddyError::Admin(format!("GET /config/ answered {status}")));
        }
        serde_json::from_slice(&body).map_err(|e| CaddyError::Admin(e.to_string()))
    }

    /// Replaces the whole configuration.
    pub async fn load(&self, config: &serde_json::Value) -> Result<(), CaddyError> {
        let (status, text) = self.request(hyper::Method::POST, "/load", serde_json::to_vec(config).expect("json")).await?;
        if status.is_success() {
            Ok(())
        } else {
            let mut message = String::from_utf8_lossy(&text).trim().to_string();
            cloudweb_protocol::misc::truncate_on_char(&mut message, 900);
            Err(CaddyError::Refused(format!("{status}: {message}")))
        }
    }

    async fn request(&self, method: hyper::Method, path: &str, body: Vec<u8>) -> Result<(hyper::StatusCode, Bytes), CaddyError> {
        let stream = UnixStream::connect(&self.admin_socket).await.map_err(|e| CaddyError::Admin(e.to_string()))?;
        let (mut sender, connection) =
            hyper::client::conn::http1::handshake::<_, Full<Bytes>>(TokioIo::new(stream)).await.map_err(|e| CaddyError::Admin(e.to_string()))?;
        tokio::spawn(connection);
        let request = hyper::Request::builder()
            .method(method)
            .uri(path)
            .header("host", "localhost")
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| CaddyError::Admin(e.to_string()))?;
        let response = sender.send_request(request).await.map_err(|e| CaddyError::Admin(e.to_string()))?;
        let status = response.status();
        let text = response.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
        Ok((status, text))
    }
}

/// Creates the dir and writes the bootstrap configuration (the admin
/// socket only); returns the admin socket and bootstrap paths.
fn prepare(dir: &Path) -> Result<(PathBuf, PathBuf), CaddyError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| CaddyError::Io { path, source }
    };
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let admin_socket = dir.join("admin.sock");
    let bootstrap = dir.join("bootstrap.json");
    std::fs::write(&bootstrap, serde_json::to_vec(&admin_block(&admin_socket)).expect("json")).map_err(io(&bootstrap))?;
    Ok((admin_socket, bootstrap))
}

/// Caddy's storage (certmagic's file system storage): `$XDG_DATA_HOME/caddy`,
/// and both launch modes set `XDG_DATA_HOME` to `<dir>/data`.
pub fn storage_dir(dir: &Path) -> PathBuf {
    dir.join("data").join("caddy")
}

/// The admin block every configuration carries, so a load never moves the
/// admin endpoint off the socket.
pub fn admin_block(socket: &Path) -> serde_json::Value {
    serde_json::json!({"admin": {"listen": format!("unix/{}", socket.display()), "config": {"persist": false}}})
}
