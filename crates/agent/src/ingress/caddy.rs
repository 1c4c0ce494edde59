//! The Caddy process and its admin API. The agent starts Caddy with an
//! admin endpoint on a unix socket in its data dir (never on a TCP port),
//! owns its whole configuration, and replaces it through `POST /load`. A
//! failed load leaves the previous configuration serving.
//!
//! Caddy runs either as a child process of the agent (`--caddy-bin`; it
//! dies with the agent) or as a container on the host network
//! (`--caddy-image`; it outlives agent restarts, and a restarted agent
//! adopts it without reloading).

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
    Child(Child),
    Container { runtime: DockerRuntime, id: String },
}

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
        let caddy = Caddy { runner: Runner::Container { runtime, id }, admin_socket, adopted };
        caddy.wait_for_admin().await
    }

    /// Starts `binary run` with only the admin socket configured; routes
    /// come with the first [`Caddy::load`].
    async fn start_binary(binary: &Path, dir: &Path) -> Result<Caddy, CaddyError> {
        let (admin_socket, bootstrap) = prepare(dir)?;
        let _ = std::fs::remove_file(&admin_socket);
        let child = Command::new(binary)
            .arg("run")
            .arg("--config")
            .arg(&bootstrap)
            .env("XDG_DATA_HOME", dir.join("data"))
            .env("XDG_CONFIG_HOME", dir.join("config"))
            .env("HOME", dir)
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .map_err(|source| CaddyError::Spawn { binary: binary.to_path_buf(), source })?;
        let caddy = Caddy { runner: Runner::Child(child), admin_socket, adopted: false };
        caddy.wait_for_admin().await
    }

    async fn wait_for_admin(self) -> Result<Caddy, CaddyError> {
        let caddy = self;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while tokio::time::Instant::now() < deadline {
            if UnixStream::connect(&caddy.admin_socket).await.is_ok() {
                return Ok(caddy);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Err(CaddyError::NoAdmin)
    }

    pub fn admin_socket(&self) -> &Path {
        &self.admin_socket
    }

    /// Whether Caddy still runs. A container whose state cannot be read
    /// (the engine restarts) counts as running; the next load tells.
    pub async fn is_running(&mut self) -> bool {
        match &mut self.runner {
            Runner::Child(child) => matches!(child.try_wait(), Ok(None)),
            Runner::Container { runtime, id } => runtime.is_running(id).await.unwrap_or(true),
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

/// The admin block every configuration carries, so a load never moves the
/// admin endpoint off the socket.
pub fn admin_block(socket: &Path) -> serde_json::Value {
    serde_json::json!({"admin": {"listen": format!("unix/{}", socket.display()), "config": {"persist": false}}})
}
