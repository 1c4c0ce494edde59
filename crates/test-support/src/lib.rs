//! Pieces that the tests of several crates share, kept in a crate of their
//! own so that none of them has to depend on another's test harness: the
//! agent's unit tests take it as a dev-dependency, `cloudweb-e2e` as a
//! dependency, and it depends on nothing of cloud-web.
//!
//! [`postgres`] starts a real PostgreSQL server for the store's tests and
//! the control plane's tests on PostgreSQL.

pub mod postgres;

use std::sync::{Arc, Mutex};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::UnixListener;
use tokio::task::JoinHandle;

/// One HTTP/1.1 request as a stand-in server needs it.
pub struct Request {
    /// The request line, e.g. `GET /v1.47/info HTTP/1.1`.
    pub line: String,
    pub method: String,
    /// The path without the query.
    pub path: String,
}

/// Reads the next request from `stream`: its head, then a body of
/// Content-Length bytes (which is dropped). `buffer` carries what was read
/// past it to the next call. `None` when the stream ends or fails.
pub async fn read_request<S: AsyncRead + Unpin>(stream: &mut S, buffer: &mut Vec<u8>) -> Option<Request> {
    let head_end = loop {
        if let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            break end + 4;
        }
        read_more(stream, buffer).await?;
    };
    let head = String::from_utf8_lossy(&buffer[..head_end]).to_string();
    let length: usize = head
        .lines()
        .find_map(|l| l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().parse().unwrap_or(0)))
        .unwrap_or(0);
    while buffer.len() < head_end + length {
        read_more(stream, buffer).await?;
    }
    buffer.drain(..head_end + length);
    let line = head.lines().next().unwrap_or_default().to_string();
    let mut words = line.split_whitespace();
    let method = words.next().unwrap_or_default().to_string();
    let path = words.next().unwrap_or_default().split('?').next().unwrap_or_default().to_string();
    Some(Request { line, method, path })
}

async fn read_more<S: AsyncRead + Unpin>(stream: &mut S, buffer: &mut Vec<u8>) -> Option<()> {
    let mut chunk = [0u8; 4096];
    match stream.read(&mut chunk).await {
        Ok(0) | Err(_) => None,
        Ok(n) => {
            buffer.extend_from_slice(&chunk[..n]);
            Some(())
        }
    }
}

/// Writes one answer with a JSON `body` and `status` (e.g. `404 Not Found`).
pub async fn write_json<S: AsyncWrite + Unpin>(stream: &mut S, status: &str, body: &str) -> std::io::Result<()> {
    let answer = format!("HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}", body.len());
    stream.write_all(answer.as_bytes()).await
}

/// Serves every connection on `listener` with `answer`, which maps a request
/// to a status and a JSON body, keeping connections open for further
/// requests. Returns the request lines received, in order, and the task
/// (abort it to stop).
pub fn serve_json<F>(listener: UnixListener, answer: F) -> (Arc<Mutex<Vec<String>>>, JoinHandle<()>)
where
    F: Fn(&Request) -> (&'static str, String) + Send + Sync + 'static,
{
    let requests = Arc::new(Mutex::new(Vec::new()));
    let seen = requests.clone();
    let answer = Arc::new(answer);
    let task = tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let (seen, answer) = (seen.clone(), answer.clone());
            tokio::spawn(async move {
                let mut buffer = Vec::new();
                while let Some(request) = read_request(&mut stream, &mut buffer).await {
                    seen.lock().expect("requests lock").push(request.line.clone());
                    let (status, body) = answer(&request);
                    if write_json(&mut stream, status, &body).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (requests, task)
}
