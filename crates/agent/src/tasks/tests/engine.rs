//! A stand-in Docker Engine on a unix socket in a temporary directory, for
//! the tests that follow a run through its container without any real
//! Docker: every request is recorded (with its body), and a test's
//! function answers it, maybe after a pause, or never.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};

/// One request the engine got.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: String,
    /// Path and query, without the API version (`/containers/create?name=…`).
    pub target: String,
    pub body: String,
}

impl Seen {
    pub fn is(&self, method: &str, prefix: &str) -> bool {
        self.method == method && self.target.starts_with(prefix)
    }
}

/// An answer.
pub enum Reply {
    Json(&'static str, String),
    /// 204, no body.
    Empty,
    /// A container's output: (stream 1 or 2, line with its timestamp).
    Output(Vec<(u8, String)>),
    /// The answer after a pause.
    After(Duration, Box<Reply>),
    /// No answer at all (the connection stays open).
    Never,
}

pub struct Engine {
    pub seen: Arc<Mutex<Vec<Seen>>>,
    _task: tokio::task::JoinHandle<()>,
}

impl Engine {
    pub fn start<F>(socket: &Path, answer: F) -> Engine
    where
        F: Fn(&Seen) -> Reply + Send + Sync + 'static,
    {
        let listener = UnixListener::bind(socket).unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let answer = Arc::new(answer);
        let log = seen.clone();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(serve(stream, log.clone(), answer.clone()));
            }
        });
        Engine { seen, _task: task }
    }

    pub fn requests(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    pub fn count(&self, method: &str, prefix: &str) -> usize {
        self.requests().iter().filter(|r| r.is(method, prefix)).count()
    }
}

async fn serve<F>(mut stream: UnixStream, log: Arc<Mutex<Vec<Seen>>>, answer: Arc<F>)
where
    F: Fn(&Seen) -> Reply + Send + Sync + 'static,
{
    let mut buffer = Vec::new();
    loop {
        let Some(request) = read(&mut stream, &mut buffer).await else { return };
        log.lock().unwrap().push(request.clone());
        let mut reply = answer(&request);
        loop {
            match reply {
                Reply::After(pause, then) => {
                    tokio::time::sleep(pause).await;
                    reply = *then;
                }
                Reply::Never => {
                    // Holds the connection until the client drops it.
                    let mut rest = [0u8; 1];
                    let _ = stream.read(&mut rest).await;
                    return;
                }
                _ => break,
            }
        }
        let (status, content_type, body) = match reply {
            Reply::Json(status, body) => (status, "application/json", body.into_bytes()),
            Reply::Empty => ("204 No Content", "", Vec::new()),
            Reply::Output(lines) => {
                let mut body = Vec::new();
                for (kind, line) in lines {
                    let payload = format!("{line}\n").into_bytes();
                    body.extend_from_slice(&[kind, 0, 0, 0]);
                    body.extend_from_slice(&(payload.len() as u32).to_be_bytes());
                    body.extend_from_slice(&payload);
                }
                ("200 OK", "application/vnd.docker.raw-stream", body)
            }
            Reply::After(..) | Reply::Never => unreachable!(),
        };
        let mut head = format!("HTTP/1.1 {status}\r\n");
        if !content_type.is_empty() {
            head.push_str(&format!("Content-Type: {content_type}\r\nContent-Length: {}\r\n", body.len()));
        }
        head.push_str("\r\n");
        if stream.write_all(head.as_bytes()).await.is_err() || stream.write_all(&body).await.is_err() {
            return;
        }
    }
}

async fn read(stream: &mut UnixStream, buffer: &mut Vec<u8>) -> Option<Seen> {
    let head_end = loop {
        if let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            break end + 4;
        }
        let mut chunk = [0u8; 4096];
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
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
            Ok(0) | Err(_) => return None,
            Ok(n) => buffer.extend_from_slice(&chunk[..n]),
        }
    }
    let body = String::from_utf8_lossy(&buffer[head_end..head_end + length]).to_string();
    buffer.drain(..head_end + length);
    let line = head.lines().next().unwrap_or_default().to_string();
    let mut words = line.split_whitespace();
    let method = words.next().unwrap_or_default().to_string();
    let raw = words.next().unwrap_or_default();
    // `/v1.49/containers/…` → `/containers/…`
    let target = match raw.strip_prefix("/v").and_then(|rest| rest.find('/').map(|slash| &rest[slash..])) {
        Some(rest) => rest.to_string(),
        None => raw.to_string(),
    };
    Some(Seen { method, target, body })
}
