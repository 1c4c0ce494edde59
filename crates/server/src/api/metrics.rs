//! `GET /metrics` in the Prometheus text format.

use std::fmt::Write;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::extract::State;
use axum::http::header::CONTENT_TYPE;
use axum::response::IntoResponse;
use tokio::time::Instant;

use crate::live::NodeState;
use crate::AppState;

pub async fn prometheus(State(state): State<Arc<AppState>>) -> impl IntoResponse {
    let now = Instant::now();
    let nodes = state.nodes.all();
    let count = |wanted: NodeState| nodes.iter().filter(|n| n.state(now, state.config.unreachable_after) == wanted).count();
    let mut out = String::new();
    let _ = writeln!(out, "# HELP cloudweb_nodes Registered nodes by state.\n# TYPE cloudweb_nodes gauge");
    for node_state in [NodeState::Ready, NodeState::Unreachable, NodeState::Draining] {
        let _ = writeln!(out, "cloudweb_nodes{{state=\"{}\"}} {}", node_state.as_str(), count(node_state));
    }
    let _ = writeln!(out, "# HELP cloudweb_heartbeats_total Heartbeats accepted.\n# TYPE cloudweb_heartbeats_total counter");
    let _ = writeln!(out, "cloudweb_heartbeats_total {}", state.heartbeats_total.load(Ordering::Relaxed));
    let _ = writeln!(out, "# HELP cloudweb_store_commits_total Database write transactions committed.\n# TYPE cloudweb_store_commits_total counter");
    let _ = writeln!(out, "cloudweb_store_commits_total {}", state.store.commits());
    ([(CONTENT_TYPE, "text/plain; version=0.0.4")], out)
}
