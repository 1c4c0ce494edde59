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
    let _ = writeln!(out, "# HELP cloudweb_node_cpu_percent CPU busy, percent of all cores, from the latest usage sample.\n# TYPE cloudweb_node_cpu_percent gauge");
    let _ = writeln!(out, "# HELP cloudweb_node_memory_used_bytes Memory in use (MemTotal - MemAvailable).\n# TYPE cloudweb_node_memory_used_bytes gauge");
    let _ = writeln!(out, "# HELP cloudweb_node_disk_used_bytes Disk in use on the agent's data dir.\n# TYPE cloudweb_node_disk_used_bytes gauge");
    let _ = writeln!(out, "# HELP cloudweb_app_cpu_cores CPU cores used by an app's containers on a node.\n# TYPE cloudweb_app_cpu_cores gauge");
    let _ = writeln!(out, "# HELP cloudweb_app_memory_bytes Memory used by an app's containers on a node.\n# TYPE cloudweb_app_memory_bytes gauge");
    for node in &nodes {
        let Some(sample) = node.metrics.as_ref() else { continue };
        let labels = format!("node=\"{}\",name=\"{}\"", node.id, node.name);
        if let Some(usage) = &sample.value.node {
            if let Some(cpu) = usage.cpu_pct {
                let _ = writeln!(out, "cloudweb_node_cpu_percent{{{labels}}} {cpu}");
            }
            if let Some(mem) = usage.mem_used {
                let _ = writeln!(out, "cloudweb_node_memory_used_bytes{{{labels}}} {mem}");
            }
            if let Some(disk) = usage.disk_used {
                let _ = writeln!(out, "cloudweb_node_disk_used_bytes{{{labels}}} {disk}");
            }
        }
        let mut apps: std::collections::BTreeMap<&str, (f64, u64)> = std::collections::BTreeMap::new();
        for container in sample.value.containers.iter().flatten() {
            if let Some(app) = crate::live::app_of_container(&container.container) {
                let entry = apps.entry(app).or_default();
                entry.0 += container.cpu_cores.unwrap_or(0.0);
                entry.1 += container.mem_bytes.unwrap_or(0);
            }
        }
        for (app, (cpu, mem)) in apps {
            let _ = writeln!(out, "cloudweb_app_cpu_cores{{app=\"{app}\",node=\"{}\"}} {cpu}", node.id);
            let _ = writeln!(out, "cloudweb_app_memory_bytes{{app=\"{app}\",node=\"{}\"}} {mem}", node.id);
        }
    }
    ([(CONTENT_TYPE, "text/plain; version=0.0.4")], out)
}
