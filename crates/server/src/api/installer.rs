//! The node installer: `GET /node.sh` and the agent binary it downloads,
//! `GET /downloads/cloudweb-agent`. Both are public: the script holds no
//! secret (the token is its argument) and carries the binary's SHA-256, so
//! a node refuses a binary that changed on the way.

use std::sync::Arc;

use axum::extract::State;
use axum::http::header::CONTENT_TYPE;
use axum::response::{IntoResponse, Response};

use crate::error::ApiError;
use crate::AppState;

const TEMPLATE: &str = include_str!("node.sh");

/// The agent binary the control plane offers, read once at start.
pub struct AgentBinary {
    pub bytes: Vec<u8>,
    pub sha256: String,
}

pub fn render(dashboard_url: &str, binary: Option<&AgentBinary>) -> String {
    TEMPLATE
        .replace("@AGENT_URL@", &format!("{}/downloads/cloudweb-agent", dashboard_url.trim_end_matches('/')))
        .replace("@AGENT_SHA256@", binary.map(|b| b.sha256.as_str()).unwrap_or("unavailable"))
}

pub async fn script(State(state): State<Arc<AppState>>) -> Response {
    let text = render(&state.config.dashboard_url, state.agent_binary.as_ref());
    ([(CONTENT_TYPE, "text/x-shellscript; charset=utf-8")], text).into_response()
}

pub async fn agent_binary(State(state): State<Arc<AppState>>) -> Response {
    match &state.agent_binary {
        Some(binary) => ([(CONTENT_TYPE, "application/octet-stream")], binary.bytes.clone()).into_response(),
        None => ApiError::NotFound("this control plane has no agent binary to offer (start it with --agent-binary)".into())
            .into_response(),
    }
}
