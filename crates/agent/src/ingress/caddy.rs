//! The Caddy process and its admin API. The agent starts Caddy with an
//! admin endpoint on a unix socket in its data dir (never on a TCP port),
//! owns its whole configuration, and replaces it through `POST /load`. A
//! failed load leaves the previous configuration serving.

use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tokio::process::{Child, Command};

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
}

pub struct Caddy {
    child: Child,
    admin_socket: PathBuf,
}

impl Caddy {
    /// Starts `binary run` with only the admin socket configured; routes
    /// come with the first [`Caddy::load`].
    pub async fn start(binary: &Path, dir: &Path) -> Result<Caddy, CaddyError> {
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| CaddyError::Io { path, source }
        };
        std::fs::create_dir_all(dir).map_err(io(dir))?;
        let admin_socket = dir.join("admin.sock");
        let _ = std::fs::remove_file(&admin_socket);
        let bootstrap = dir.join("bootstrap.json");
        std::fs::write(&bootstrap, serde_json::to_vec(&admin_block(&admin_socket)).expect("json")).map_err(io(&bootstrap))?;
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
        let caddy = Caddy { child, admin_socket };
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

    /// Whether the process is still alive.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Replaces the whole configuration.
    pub async fn load(&self, config: &serde_json::Value) -> Result<(), CaddyError> {
        let body = serde_json::to_vec(config).expect("json");
        let stream = UnixStream::connect(&self.admin_socket).await.map_err(|e| CaddyError::Admin(e.to_string()))?;
        let (mut sender, connection) =
            hyper::client::conn::http1::handshake::<_, Full<Bytes>>(TokioIo::new(stream)).await.map_err(|e| CaddyError::Admin(e.to_string()))?;
        tokio::spawn(connection);
        let request = hyper::Request::post("/load")
            .header("host", "localhost")
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| CaddyError::Admin(e.to_string()))?;
        let response = sender.send_request(request).await.map_err(|e| CaddyError::Admin(e.to_string()))?;
        let status = response.status();
        let text = response.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
        if status.is_success() {
            Ok(())
        } else {
            let mut message = String::from_utf8_lossy(&text).trim().to_string();
            message.truncate(900);
            Err(CaddyError::Refused(format!("{status}: {message}")))
        }
    }
}

/// The admin block every configuration carries, so a load never moves the
/// admin endpoint off the socket.
pub fn admin_block(socket: &Path) -> serde_json::Value {
    serde_json::json!({"admin": {"listen": format!("unix/{}", socket.display()), "config": {"persist": false}}})
}
