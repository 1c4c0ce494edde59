//! The node installer: `GET /node.sh` and the agent binary it downloads,
//! `GET /downloads/cloudweb-agent`, on the agent listener. Neither needs a
//! client certificate: a new node has none yet. Trust comes from the join
//! command instead, which carries the listener's public-key pin: curl
//! fetches the script only from the key it names, the script fetches the
//! binary the same way, and checks the binary's SHA-256 before running it.

use std::sync::Arc;

use axum::extract::State;
use axum::http::header::CONTENT_TYPE;
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

pub async fn agent_binary(State(state): State<Arc<AppState>>) -> Response {
    match &state.agent_binary {
        Some(binary) => ([(CONTENT_TYPE, "application/octet-stream")], binary.bytes.clone()).into_response(),
        None => ApiError::NotFound("this control plane has no agent binary to offer (start it with --agent-binary)".into())
            .into_response(),
    }
}
