//! The node installer: `GET /node.sh` and the agent binary it downloads,
//! `GET /downloads/cloudweb-agent`, on the agent listener. Neither needs a
//! client certificate: a new node has none yet. Trust comes from the join
//! command instead, which carries the listener's public-key pin: curl
//! fetches the script only from the key it names, the script fetches the
//! binary the same way, and checks the binary's SHA-256 before running it.

use std::sync::Arc;

use axum::extract::State;
use axum::http::header::{CONTENT_LENGTH, CONTENT_TYPE};
use axum::response::{IntoResponse, Response};

use crate::error::ApiError;
use crate::AppState;

const TEMPLATE: &str = include_str!("node.sh");

pub use crate::AgentBinary;

pub fn render(public_url: &str, pin: &str, binary: Option<&AgentBinary>) -> String {
    TEMPLATE
        .replace("@AGENT_URL@", &format!("{public_url}/downloads/cloudweb-agent"))
        .replace("@PIN@", pin)
        .replace("@AGENT_SHA256@", binary.map(|b| b.sha256.as_str()).unwrap_or("unavailable"))
}

/// The line a user pastes on a new node.
pub fn join_command(public_url: &str, pin: &str, token: &str, ca_sha256: &str) -> String {
    // --insecure only lifts the check against system CAs (the cluster CA is
    // private); --pinnedpubkey still refuses any other server key.
    format!(
        "curl -fsSL --insecure --pinnedpubkey {pin} {public_url}/node.sh | sudo sh -s -- --join {public_url} --token {token} --ca-sha256 {ca_sha256}"
    )
}

pub async fn script(State(state): State<Arc<AppState>>) -> Response {
    let text = render(&state.config.public_url.to_string(), &state.listener_pin, state.agent_binary.as_ref());
    ([(CONTENT_TYPE, "text/x-shellscript; charset=utf-8")], text).into_response()
}

/// Streams the binary in 64 KiB chunks from the file held open since
/// start: a download costs a buffer, not a copy of the binary.
pub async fn agent_binary(State(state): State<Arc<AppState>>) -> Response {
    let Some(binary) = &state.agent_binary else {
        return ApiError::NotFound("this control plane has no agent binary to offer (start it with --agent-binary)".into()).into_response();
    };
    let file = match binary.reader() {
        Ok(file) => tokio::fs::File::from_std(file),
        Err(err) => return ApiError::Internal(format!("cannot open the agent binary: {err}")).into_response(),
    };
    let chunks = futures_util::stream::unfold((file, binary.len), |(mut file, left)| async move {
        use tokio::io::AsyncReadExt;
        if left == 0 {
            return None;
        }
        let mut buffer = vec![0u8; 64 * 1024];
        match file.read(&mut buffer).await {
            // Shorter than at start: end the body early, the length and
            // the node's SHA-256 check both fail on it.
            Ok(0) => Some((Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "the agent binary shrank")), (file, 0))),
            Ok(read) => {
                let read = read.min(left as usize);
                buffer.truncate(read);
                Some((Ok(axum::body::Bytes::from(buffer)), (file, left - read as u64)))
            }
            Err(err) => Some((Err(err), (file, 0))),
        }
    });
    ([(CONTENT_TYPE, "application/octet-stream".to_string()), (CONTENT_LENGTH, binary.len.to_string())], axum::body::Body::from_stream(chunks)).into_response()
}
