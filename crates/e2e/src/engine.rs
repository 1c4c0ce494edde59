//! A stand-in Docker Engine on a unix socket, for what the real engine of
//! the test machine cannot be: `GET /info` answers with the operating
//! system a test chooses (e.g. "Docker Desktop"), `/_ping` and `/version`
//! answer, the container list is empty, and every other request is a 500
//! that says it is a stand-in. An agent started with
//! `--docker-host unix://<socket>` talks to it instead of Docker.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use cloudweb_test_support::Request;

pub struct StandInEngine {
    pub socket: PathBuf,
    /// Request lines received, in order.
    pub requests: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl StandInEngine {
    /// Listens on `socket`; `/info` reports `operating_system`.
    pub fn start(socket: &Path, operating_system: &str) -> std::io::Result<StandInEngine> {
        let listener = tokio::net::UnixListener::bind(socket)?;
        let info = serde_json::json!({
            "ID": "standin",
            "Name": "standin",
            "OperatingSystem": operating_system,
            "OSType": "linux",
            "NCPU": 2,
            "MemTotal": 4_294_967_296u64,
            "ServerVersion": "27.0.0",
        })
        .to_string();
        let (requests, task) = cloudweb_test_support::serve_json(listener, move |request| answer(request, &info));
        Ok(StandInEngine { socket: socket.to_path_buf(), requests, task })
    }

    /// `unix://<socket>`, for `--docker-host`.
    pub fn host(&self) -> String {
        format!("unix://{}", self.socket.display())
    }
}

impl Drop for StandInEngine {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn answer(request: &Request, info: &str) -> (&'static str, String) {
    let path = request.path.as_str();
    // Without the API version prefix bollard adds (`/v1.47/info`).
    let bare = match path.strip_prefix("/v").and_then(|rest| rest.split_once('/')) {
        Some((version, rest)) if version.chars().all(|c| c.is_ascii_digit() || c == '.') => format!("/{rest}"),
        _ => path.to_string(),
    };
    match (request.method.as_str(), bare.as_str()) {
        ("GET", "/info") => ("200 OK", info.to_string()),
        ("GET" | "HEAD", "/_ping") => ("200 OK", "OK".to_string()),
        ("GET", "/version") => ("200 OK", r#"{"Version":"27.0.0","ApiVersion":"1.47"}"#.to_string()),
        ("GET", "/containers/json") => ("200 OK", "[]".to_string()),
        _ => ("500 Internal Server Error", r#"{"message":"stand-in engine: this request is outside what the Docker Desktop test needs (only /info, /_ping, /version and /containers/json are answered)"}"#.to_string()),
    }
}
