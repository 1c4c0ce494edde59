//! A stand-in Docker Engine on a unix socket, for what the real engine of
//! the test machine cannot be: `GET /info` answers with the operating
//! system a test chooses (e.g. "Docker Desktop"), `/_ping` and `/version`
//! answer, the container list is empty, and every other request is a 500
//! that says it is a stand-in. An agent started with
//! `--docker-host unix://<socket>` talks to it instead of Docker.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

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
        let requests = Arc::new(Mutex::new(Vec::new()));
        let seen = requests.clone();
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
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(serve(stream, seen.clone(), info.clone()));
            }
        });
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

async fn serve(mut stream: tokio::net::UnixStream, seen: Arc<Mutex<Vec<String>>>, info: String) {
    let mut buffer = Vec::new();
    loop {
        let head_end = loop {
            if let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
                break end + 4;
            }
            let mut chunk = [0u8; 4096];
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buffer.extend_from_slice(&chunk[..n]),
            }
        };
        let head = String::from_utf8_lossy(&buffer[..head_end]).to_string();
        let length: usize = head
            .lines()
            .find_map(|l| l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().parse().unwrap_or(0)))
            .unwrap_or(0);
        while buffer.len() < head_end + length {
            let mut chunk = [0u8; 4096];
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buffer.extend_from_slice(&chunk[..n]),
            }
        }
        buffer.drain(..head_end + length);
        let line = head.lines().next().unwrap_or_default().to_string();
        seen.lock().expect("requests lock").push(line.clone());
        let path = line.split_whitespace().nth(1).unwrap_or_default();
        let path = path.split('?').next().unwrap_or_default();
        // Without the API version prefix bollard adds (`/v1.47/info`).
        let bare = match path.strip_prefix("/v").and_then(|rest| rest.split_once('/')) {
            Some((version, rest)) if version.chars().all(|c| c.is_ascii_digit() || c == '.') => format!("/{rest}"),
            _ => path.to_string(),
        };
        let (status, body) = match (line.split_whitespace().next().unwrap_or_default(), bare.as_str()) {
            ("GET", "/info") => ("200 OK", info.clone()),
            ("GET" | "HEAD", "/_ping") => ("200 OK", "OK".to_string()),
            ("GET", "/version") => ("200 OK", r#"{"Version":"27.0.0","ApiVersion":"1.47"}"#.to_string()),
            ("GET", "/containers/json") => ("200 OK", "[]".to_string()),
            _ => ("500 Internal Server Error", r#"{"message":"stand-in engine: this request is outside what the Docker Desktop test needs (only /info, /_ping, /version and /containers/json are answered)"}"#.to_string()),
        };
        let answer = format!("HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}", body.len());
        if stream.write_all(answer.as_bytes()).await.is_err() {
            return;
        }
    }
}
