//! `GET /metrics` in the Prometheus text format (OpenMetrics), written by
//! the `prometheus-client` crate. That crate writes label values as given,
//! so ours go through [`Escaped`], which applies the format's three escapes.
//! The figures are read from the live state on each scrape into
//! [`Figures`], then encoded.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use axum::extract::State;
use axum::http::header::CONTENT_TYPE;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::{EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::time::Instant;

use crate::live::NodeState;
use crate::AppState;

/// What one scrape reports.
#[derive(Default)]
pub struct Figures {
    pub nodes_by_state: Vec<(&'static str, usize)>,
    /// Runtime log lines forwarded (`--log-forward`): shipped and dropped,
    /// when forwarding is on.
    pub log_forward: Option<(u64, u64)>,
    pub heartbeats: u64,
    pub commits: u64,
    /// Whether this replica leads, and its term's fencing token (0 when it
    /// does not lead, and on SQLite).
    pub leading: bool,
    pub leader_term: i64,
    /// Per node: id, name, and its latest CPU percent, memory and disk used.
    pub nodes: Vec<NodeFigures>,
    /// Per app and node: CPU cores and memory of its containers there.
    pub apps: Vec<AppFigures>,
    /// Per volume: its node and the size of its data.
    pub volumes: Vec<(String, String, u64)>,
    /// Per managed service: its node, whether it is healthy, its restarts.
    pub services: Vec<(String, String, bool, u64)>,
    /// Per backup target (and `control-plane`): its last successful
    /// backup (seconds since the epoch), that backup's bytes, and whether
    /// it needs attention.
    pub backups: Vec<(String, Option<f64>, Option<f64>, bool)>,
    /// Per scheduled job: its app, its name, and whether its newest run
    /// failed, timed out or was lost.
    pub cron_jobs: Vec<(String, String, bool)>,
}

pub struct NodeFigures {
    pub id: String,
    pub name: String,
    pub cpu_pct: Option<f64>,
    pub mem_used: Option<u64>,
    pub disk_used: Option<u64>,
}

pub struct AppFigures {
    pub app: String,
    pub node: String,
    pub cpu_cores: f64,
    pub mem_bytes: u64,
}

/// A label value, written with `\\`, `\"` and `\n` escaped as the text
/// format requires (a raw quote or line feed would corrupt the scrape).
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct Escaped(pub String);

impl EncodeLabelValue for Escaped {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        use std::fmt::Write;
        for c in self.0.chars() {
            match c {
                '\\' => encoder.write_str("\\\\")?,
                '"' => encoder.write_str("\\\"")?,
                '\n' => encoder.write_str("\\n")?,
                c => encoder.write_char(c)?,
            }
        }
        Ok(())
    }
}

fn label(value: &str) -> Escaped {
    Escaped(value.to_string())
}

type Labels = Vec<(&'static str, Escaped)>;
type Gauges = Family<Labels, Gauge<f64, AtomicU64>>;

fn gauges(registry: &mut Registry, name: &str, help: &str) -> Gauges {
    let family = Gauges::default();
    registry.register(name, help, family.clone());
    family
}

fn gauge(registry: &mut Registry, name: &str, help: &str, value: i64) {
    let gauge: Gauge = Gauge::default();
    gauge.set(value);
    registry.register(name, help, gauge);
}

fn counter(registry: &mut Registry, name: &str, help: &str, value: u64) {
    let counter: Counter = Counter::default();
    counter.inc_by(value);
    registry.register(name, help, counter);
}

/// Reads the figures from the live state.
fn figures(state: &AppState) -> Figures {
    let now = Instant::now();
    let nodes = state.nodes.all();
    let mut figures = Figures {
        heartbeats: state.heartbeats_total.load(Ordering::Relaxed),
        commits: state.store.commits(),
        leading: state.leader.is_leading(),
        leader_term: state.leader.token(),
        log_forward: state.runtime_logs.archive().and_then(|a| {
            a.forwarding().map(|f| (f.stats.shipped.load(Ordering::Relaxed), f.stats.dropped.load(Ordering::Relaxed)))
        }),
        ..Default::default()
    };
    for node_state in [NodeState::Ready, NodeState::Unreachable, NodeState::Draining] {
        let count = nodes.iter().filter(|n| n.state(now, state.config.unreachable_after) == node_state).count();
        figures.nodes_by_state.push((node_state.as_str(), count));
    }
    for node in &nodes {
        let Some(sample) = node.metrics.as_ref() else { continue };
        if let Some(usage) = &sample.value.node {
            figures.nodes.push(NodeFigures {
                id: node.id.clone(),
                name: node.name.clone(),
                cpu_pct: usage.cpu_pct,
                mem_used: usage.mem_used,
                disk_used: usage.disk_used,
            });
        }
        let mut apps: std::collections::BTreeMap<&str, (f64, u64)> = std::collections::BTreeMap::new();
        for container in sample.value.containers.iter().flatten() {
            if let Some(app) = crate::live::app_of_container(&container.container) {
                let entry = apps.entry(app).or_default();
                entry.0 += container.cpu_cores.unwrap_or(0.0);
                entry.1 += container.mem_bytes.unwrap_or(0);
            }
        }
        for (app, (cpu_cores, mem_bytes)) in apps {
            figures.apps.push(AppFigures { app: app.to_string(), node: node.id.clone(), cpu_cores, mem_bytes });
        }
        for volume in sample.value.volumes.iter().flatten() {
            figures.volumes.push((volume.volume.clone(), node.id.clone(), volume.bytes));
        }
    }
    for node in &nodes {
        let Some(health) = node.current_health(now) else { continue };
        for service in health.services.iter().flatten() {
            figures.services.push((service.service.clone(), node.id.clone(), service.state == "healthy", service.restarts));
        }
    }
    figures
}

/// The exposition text of `figures`.
pub fn encode_figures(figures: &Figures) -> Result<String, std::fmt::Error> {
    let mut registry = Registry::default();
    let by_state = gauges(&mut registry, "cloudweb_nodes", "Registered nodes by state");
    for (node_state, count) in &figures.nodes_by_state {
        by_state.get_or_create(&vec![("state", label(node_state))]).set(*count as f64);
    }
    // Counters get their `_total` suffix from the encoder.
    counter(&mut registry, "cloudweb_heartbeats", "Heartbeats accepted", figures.heartbeats);
    counter(&mut registry, "cloudweb_store_commits", "Database write transactions committed", figures.commits);
    gauge(&mut registry, "cloudweb_leader", "1 while this control plane runs the leader's loops (always on SQLite)", if figures.leading { 1 } else { 0 });
    gauge(&mut registry, "cloudweb_leader_term", "The fencing token of the term this control plane leads; 0 when it does not, and on SQLite", figures.leader_term);
    let node_cpu = gauges(&mut registry, "cloudweb_node_cpu_percent", "CPU busy, percent of all cores, from the latest usage sample");
    let node_mem = gauges(&mut registry, "cloudweb_node_memory_used_bytes", "Memory in use (MemTotal - MemAvailable)");
    let node_disk = gauges(&mut registry, "cloudweb_node_disk_used_bytes", "Disk in use on the agent's data dir");
    let app_cpu = gauges(&mut registry, "cloudweb_app_cpu_cores", "CPU cores used by an app's containers on a node");
    let app_mem = gauges(&mut registry, "cloudweb_app_memory_bytes", "Memory used by an app's containers on a node");
    for node in &figures.nodes {
        let labels: Labels = vec![("node", label(&node.id)), ("name", label(&node.name))];
        if let Some(cpu) = node.cpu_pct {
            node_cpu.get_or_create(&labels).set(cpu);
        }
        if let Some(mem) = node.mem_used {
            node_mem.get_or_create(&labels).set(mem as f64);
        }
        if let Some(disk) = node.disk_used {
            node_disk.get_or_create(&labels).set(disk as f64);
        }
    }
    for app in &figures.apps {
        let labels: Labels = vec![("app", label(&app.app)), ("node", label(&app.node))];
        app_cpu.get_or_create(&labels).set(app.cpu_cores);
        app_mem.get_or_create(&labels).set(app.mem_bytes as f64);
    }
    let volume_bytes = gauges(&mut registry, "cloudweb_volume_bytes", "Size of a volume's data on its node, from the latest usage sample");
    for (volume, node, bytes) in &figures.volumes {
        volume_bytes.get_or_create(&vec![("volume", label(volume)), ("node", label(node))]).set(*bytes as f64);
    }
    let service_healthy = gauges(&mut registry, "cloudweb_service_healthy", "1 while a managed service's probe succeeds, else 0");
    let service_restarts = gauges(&mut registry, "cloudweb_service_restarts", "How often Docker restarted a managed service's container");
    for (service, node, healthy, restarts) in &figures.services {
        let labels: Labels = vec![("service", label(service)), ("node", label(node))];
        service_healthy.get_or_create(&labels).set(if *healthy { 1.0 } else { 0.0 });
        service_restarts.get_or_create(&labels).set(*restarts as f64);
    }
    let backup_time = gauges(&mut registry, "cloudweb_backup_last_success_timestamp_seconds", "When a target's last successful backup ended");
    let backup_bytes = gauges(&mut registry, "cloudweb_backup_last_success_bytes", "The size of a target's last successful backup");
    let backup_alert = gauges(&mut registry, "cloudweb_backup_alert", "1 while a target's backups need attention (a failure, a failed verification, or none for twice its schedule)");
    for (target, at, bytes, alert) in &figures.backups {
        let labels: Labels = vec![("target", label(target))];
        if let Some(at) = at {
            backup_time.get_or_create(&labels).set(*at);
        }
        if let Some(bytes) = bytes {
            backup_bytes.get_or_create(&labels).set(*bytes);
        }
        backup_alert.get_or_create(&labels).set(if *alert { 1.0 } else { 0.0 });
    }
    let job_alert = gauges(&mut registry, "cloudweb_cron_job_alert", "1 while a scheduled job's newest run failed, timed out or was lost, else 0");
    for (app, job, alert) in &figures.cron_jobs {
        job_alert.get_or_create(&vec![("app", label(app)), ("job", label(job))]).set(if *alert { 1.0 } else { 0.0 });
    }
    if let Some((shipped, dropped)) = figures.log_forward {
        let forwarded = Family::<Labels, Counter>::default();
        registry.register("cloudweb_log_forward_lines", "Runtime log lines shipped to the --log-forward target, or dropped (it was down, refusing or behind)", forwarded.clone());
        forwarded.get_or_create(&vec![("outcome", label("shipped"))]).inc_by(shipped);
        forwarded.get_or_create(&vec![("outcome", label("dropped"))]).inc_by(dropped);
    }
    let mut out = String::new();
    encode(&mut out, &registry)?;
    Ok(out)
}

/// The media type `/metrics` answers with, and the one its OpenAPI
/// annotation names (one constant, so they cannot disagree).
pub const METRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[utoipa::path(get, path = "/metrics", operation_id = "metrics_prometheus", tag = "metrics", responses((status = 200, description = "OpenMetrics text format (Prometheus scrapes it)", content_type = METRICS_CONTENT_TYPE, body = String)))]
pub async fn prometheus(State(state): State<Arc<AppState>>) -> impl IntoResponse {
    let mut figures = figures(&state);
    figures.backups = cloudweb_core::backups::metrics_lines(&state).await;
    figures.cron_jobs = cloudweb_core::tasks::metrics_lines(&state).await;
    match encode_figures(&figures) {
        Ok(out) => (StatusCode::OK, [(CONTENT_TYPE, METRICS_CONTENT_TYPE)], out),
        Err(_) => (StatusCode::INTERNAL_SERVER_ERROR, [(CONTENT_TYPE, "text/plain; charset=utf-8")], "cannot encode the metrics\n".to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_are_escaped_and_counters_keep_their_names() {
        let figures = Figures {
            nodes_by_state: vec![("ready", 2)],
            heartbeats: 7,
            commits: 3,
            leading: true,
            leader_term: 4,
            nodes: vec![NodeFigures { id: "n-1".into(), name: "we\"ird\\name\nx".into(), cpu_pct: Some(12.5), mem_used: None, disk_used: Some(10) }],
            apps: vec![AppFigures { app: "web".into(), node: "n-1".into(), cpu_cores: 0.25, mem_bytes: 104857600 }],
            volumes: vec![("uploads".into(), "n-1".into(), 4096)],
            services: vec![("db".into(), "n-1".into(), true, 2)],
            backups: vec![("service/db".into(), Some(1_764_640_000.0), Some(2048.0), false)],
            cron_jobs: vec![("web".into(), "nightly".into(), true)],
            log_forward: Some((90, 10)),
        };
        let text = encode_figures(&figures).unwrap();
        assert!(text.contains("cloudweb_nodes{state=\"ready\"} 2"), "{text}");
        assert!(text.contains("cloudweb_heartbeats_total 7"), "{text}");
        assert!(text.contains("cloudweb_store_commits_total 3"), "{text}");
        assert!(text.contains("cloudweb_leader 1"), "{text}");
        assert!(text.contains("cloudweb_leader_term 4"), "{text}");
        assert!(text.contains(r#"cloudweb_node_cpu_percent{node="n-1",name="we\"ird\\name\nx"} 12.5"#), "{text}");
        assert!(!text.contains("cloudweb_node_memory_used_bytes{"), "no sample, no gauge: {text}");
        assert!(text.contains("cloudweb_app_memory_bytes{app=\"web\",node=\"n-1\"} 104857600"), "{text}");
        assert!(text.contains("cloudweb_volume_bytes{volume=\"uploads\",node=\"n-1\"} 4096"), "{text}");
        assert!(text.contains("cloudweb_service_healthy{service=\"db\",node=\"n-1\"} 1"), "{text}");
        assert!(text.contains("cloudweb_service_restarts{service=\"db\",node=\"n-1\"} 2"), "{text}");
        assert!(text.contains("cloudweb_backup_last_success_bytes{target=\"service/db\"} 2048"), "{text}");
        assert!(text.contains("cloudweb_backup_alert{target=\"service/db\"} 0"), "{text}");
        assert!(text.contains("cloudweb_cron_job_alert{app=\"web\",job=\"nightly\"} 1"), "{text}");
        assert!(text.contains("cloudweb_log_forward_lines_total{outcome=\"dropped\"} 10"), "{text}");
        // Every sample line is `name{labels} value` on one line.
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            assert!(line.starts_with("cloudweb_"), "{line:?} in {text}");
        }
        assert!(text.ends_with("# EOF\n"), "{text}");
    }
}
