//! What the control plane knows about each registered node right now: the
//! certificate it must present, when it was last heard from (on this
//! process's monotonic clock), and its latest heartbeat. Heartbeats land here
//! first and reach SQLite in batches, so a heartbeat costs no commit.

use std::collections::HashMap;
use std::sync::RwLock;
use std::time::Duration;

use cloudweb_protocol::{Health, Heartbeat, Metrics};
use tokio::time::Instant;

use crate::store::{HeartbeatRow, NodeRow};

pub use crate::mesh_peers::{choose_relay, peer_list, MeshMember, RelayCandidate};

/// Health older than this is treated as unknown.
pub const HEALTH_MAX_AGE: Duration = Duration::from_secs(60);

#[derive(Debug, Clone)]
pub struct LiveNode {
    pub id: String,
    pub name: String,
    pub cert_sha256: String,
    /// A renewed certificate not presented yet (accepted, then current).
    pub next_cert_sha256: Option<String>,
    /// The certificate the last renewal or re-join replaced.
    pub replaced_cert_sha256: Option<String>,
    /// When the current certificate ends (Unix ms), when known.
    pub cert_not_after: Option<i64>,
    pub draining: bool,
    pub mesh_index: i64,
    pub wireguard_public_key: Option<String>,
    pub endpoint: Option<String>,
    /// Joined with `--ingress`.
    pub ingress: bool,
    /// What its ingress reported serving, when it runs one.
    pub ingress_status: Option<cloudweb_protocol::IngressStatus>,
    /// Last sign of life: join, heartbeat, or (after a restart of the
    /// control plane) the moment the node was loaded.
    pub last_seen: Instant,
    pub agent_version: Option<String>,
    pub protocol: u32,
    pub capacity: Option<Capacity>,
    pub heartbeat_at_ms: Option<i64>,
    pub health: Option<Stamped<Health>>,
    pub metrics: Option<Stamped<Metrics>>,
    dirty: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capacity {
    pub cpu_cores: u32,
    pub mem_bytes: u64,
    pub disk_bytes: u64,
}

/// A value with when it was received (monotonic and wall clock).
#[derive(Debug, Clone)]
pub struct Stamped<T> {
    pub value: T,
    pub received: Instant,
    pub at_ms: i64,
}

/// A node's state as users and the scheduler see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeState {
    Ready,
    Unreachable,
    Draining,
}

impl NodeState {
    pub fn as_str(self) -> &'static str {
        match self {
            NodeState::Ready => "ready",
            NodeState::Unreachable => "unreachable",
            NodeState::Draining => "draining",
        }
    }
}

/// The health column: degraded only when the node reports, recently, that it
/// cannot reach a configured registry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HealthState {
    Healthy,
    Degraded(String),
    Unknown,
}

impl LiveNode {
    pub fn state(&self, now: Instant, unreachable_after: Duration) -> NodeState {
        if now.saturating_duration_since(self.last_seen) > unreachable_after {
            NodeState::Unreachable
        } else if self.draining {
            NodeState::Draining
        } else {
            NodeState::Ready
        }
    }

    /// Health if it is recent enough to be believed.
    pub fn current_health(&self, now: Instant) -> Option<&Health> {
        self.health
            .as_ref()
            .filter(|h| now.saturating_duration_since(h.received) <= HEALTH_MAX_AGE)
            .map(|h| &h.value)
    }

    pub fn health_state(&self, now: Instant) -> HealthState {
        let Some(registry) = self.current_health(now).and_then(|h| h.registry.as_ref()) else {
            return HealthState::Unknown;
        };
        if registry.configured && !registry.reachable {
            HealthState::Degraded(registry.error.clone().unwrap_or_else(|| "registry unreachable".to_string()))
        } else {
            HealthState::Healthy
        }
    }

    /// Whether the scheduler may place new instances here: ready, not
    /// degraded, and with a capacity from a heartbeat (a node that just
    /// joined has not sent one yet, so nothing could be checked against
    /// it). Unknown health (an older agent, or stale health) does not count
    /// against a node.
    pub fn eligible(&self, now: Instant, unreachable_after: Duration) -> bool {
        self.state(now, unreachable_after) == NodeState::Ready
            && !matches!(self.health_state(now), HealthState::Degraded(_))
            && self.capacity.is_some()
    }

    /// Features are only believed while the health that carried them is.
    pub fn has_feature(&self, now: Instant, feature: &str) -> bool {
        self.current_health(now)
            .and_then(|h| h.features.as_ref())
            .is_some_and(|features| features.iter().any(|f| f == feature))
    }
}

/// What a presented client certificate is to its node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CertStanding {
    /// The node's current certificate.
    Current,
    /// The certificate its last renewal issued, used for the first time:
    /// it becomes current and the old one is replaced.
    Renewed,
    /// A certificate a renewal or re-join replaced.
    Replaced,
    /// Not this node's, or no such node.
    Unknown,
}

pub use cloudweb_store::TrafficRow;

#[derive(Default)]
pub struct NodeRegistry {
    nodes: RwLock<HashMap<String, LiveNode>>,
    /// The mesh relay as last chosen by [`NodeRegistry::update_relay`]
    /// (kept while it stays fit, so it does not flap).
    relay: std::sync::Mutex<Option<String>>,
    traffic: std::sync::Mutex<Vec<TrafficRow>>,
    usage: std::sync::Mutex<Vec<crate::store::NodeUsageRow>>,
}

/// The app a container `cw-<app>-<n>` belongs to.
pub fn app_of_container(name: &str) -> Option<&str> {
    let rest = name.strip_prefix("cw-")?;
    let (app, n) = rest.rsplit_once('-')?;
    (!app.is_empty() && !app.contains('.') && !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())).then_some(app)
}

impl NodeRegistry {
    /// Loads nodes from the database at startup. Each gets one full
    /// unreachable period from `now` to check in.
    pub fn load(&self, rows: &[NodeRow], now: Instant) {
        let mut nodes = self.nodes.write().expect("node registry lock");
        for row in rows {
            nodes.insert(row.id.clone(), live_from_row(row, now));
        }
    }

    /// Forgets every node and loads `rows`: a replica that begins to lead
    /// takes the nodes as the database has them (nodes joined or removed
    /// through the replica that led before), each with the grace a
    /// restart gives.
    pub fn replace_all(&self, rows: &[NodeRow], now: Instant) {
        let mut nodes = self.nodes.write().expect("node registry lock");
        nodes.clear();
        for row in rows {
            nodes.insert(row.id.clone(), live_from_row(row, now));
        }
    }

    /// A follower's view: every node as the database has it, judged by
    /// when the leader last recorded its heartbeat (`last_heartbeat_at`,
    /// written every flush), not by when this process loaded it. Health
    /// and metrics are taken with their stored age. A node that never
    /// heartbeat counts from when it joined.
    pub fn mirror(&self, rows: &[NodeRow], now: Instant, now_ms: i64) {
        // An age the monotonic clock cannot go back to (older than this
        // boot) counts as an hour: long past any unreachable period.
        let before = |at_ms: i64| {
            let age = Duration::from_millis(now_ms.saturating_sub(at_ms).max(0) as u64);
            now.checked_sub(age).or_else(|| now.checked_sub(Duration::from_secs(3600))).unwrap_or(now)
        };
        let mut mirrored = HashMap::with_capacity(rows.len());
        for row in rows {
            let mut node = live_from_row(row, now);
            node.last_seen = before(row.last_heartbeat_at.unwrap_or(row.joined_at).max(row.joined_at));
            if let (Some(json), Some(at_ms)) = (&row.health_json, row.health_at) {
                if let Ok(value) = serde_json::from_str(json) {
                    node.health = Some(Stamped { value, received: before(at_ms), at_ms });
                }
            }
            if let (Some(json), Some(at_ms)) = (&row.metrics_json, row.metrics_at) {
                if let Ok(value) = serde_json::from_str(json) {
                    node.metrics = Some(Stamped { value, received: before(at_ms), at_ms });
                }
            }
            mirrored.insert(row.id.clone(), node);
        }
        *self.nodes.write().expect("node registry lock") = mirrored;
    }

    pub fn insert(&self, row: &NodeRow, now: Instant) {
        self.nodes.write().expect("node registry lock").insert(row.id.clone(), live_from_row(row, now));
    }

    pub fn remove(&self, id: &str) -> Option<LiveNode> {
        self.nodes.write().expect("node registry lock").remove(id)
    }

    /// What a client certificate with this fingerprint is to the node it
    /// names.
    pub fn authorize(&self, id: &str, cert_sha256: &str) -> CertStanding {
        let nodes = self.nodes.read().expect("node registry lock");
        match nodes.get(id) {
            Some(node) if node.cert_sha256 == cert_sha256 => CertStanding::Current,
            Some(node) if node.next_cert_sha256.as_deref() == Some(cert_sha256) => CertStanding::Renewed,
            Some(node) if node.replaced_cert_sha256.as_deref() == Some(cert_sha256) => CertStanding::Replaced,
            _ => CertStanding::Unknown,
        }
    }

    /// Takes the certificate fields of a stored node (after a renewal, its
    /// first use, or a re-join), leaving the rest as it is.
    pub fn set_certs(&self, row: &NodeRow) {
        if let Some(node) = self.nodes.write().expect("node registry lock").get_mut(&row.id) {
            node.cert_sha256 = row.cert_sha256.clone();
            node.next_cert_sha256 = row.next_cert_sha256.clone();
            node.replaced_cert_sha256 = row.replaced_cert_sha256.clone();
            node.cert_not_after = row.cert_not_after;
        }
    }

    /// A re-join: the node's new certificate, mesh key and endpoint, and a
    /// sign of life; the rest stays. False when the node is not loaded.
    pub fn rejoined(&self, row: &NodeRow, now: Instant) -> bool {
        let mut nodes = self.nodes.write().expect("node registry lock");
        let Some(node) = nodes.get_mut(&row.id) else { return false };
        node.cert_sha256 = row.cert_sha256.clone();
        node.next_cert_sha256 = row.next_cert_sha256.clone();
        node.replaced_cert_sha256 = row.replaced_cert_sha256.clone();
        node.cert_not_after = row.cert_not_after;
        node.wireguard_public_key = row.wireguard_public_key.clone();
        node.endpoint = row.endpoint.clone();
        node.last_seen = now;
        true
    }

    /// Records a renewal's certificate as the node's next one.
    pub fn set_next_cert(&self, id: &str, next_sha256: &str) {
        if let Some(node) = self.nodes.write().expect("node registry lock").get_mut(id) {
            node.next_cert_sha256 = Some(next_sha256.to_string());
        }
    }

    pub fn get(&self, id: &str) -> Option<LiveNode> {
        self.nodes.read().expect("node registry lock").get(id).cloned()
    }

    pub fn all(&self) -> Vec<LiveNode> {
        self.nodes.read().expect("node registry lock").values().cloned().collect()
    }

    /// Mesh peers of a node: every other node that has a WireGuard key,
    /// ordered by mesh address (see [`peer_list`]). The relay is the one
    /// [`NodeRegistry::update_relay`] chose while it is still a member with
    /// an endpoint; otherwise (before the first choice, or just after the
    /// relay left) the lowest member with an endpoint, until the next
    /// choice.
    pub fn mesh_peers(&self, node_id: &str) -> cloudweb_protocol::PeerList {
        let chosen = self.relay.lock().expect("relay lock").clone();
        let nodes = self.nodes.read().expect("node registry lock");
        let members: Vec<MeshMember<'_>> = nodes
            .values()
            .filter_map(|n| {
                Some(MeshMember {
                    id: &n.id,
                    name: &n.name,
                    mesh_index: n.mesh_index,
                    public_key: n.wireguard_public_key.as_deref()?,
                    endpoint: n.endpoint.as_deref(),
                })
            })
            .collect();
        let relay = chosen
            .as_deref()
            .filter(|id| members.iter().any(|m| m.id == *id && m.endpoint.is_some()))
            .or_else(|| members.iter().filter(|m| m.endpoint.is_some()).min_by_key(|m| m.mesh_index).map(|m| m.id));
        peer_list(&members, node_id, relay)
    }

    /// Chooses the mesh relay again (see [`choose_relay`]) and returns
    /// whether the choice changed, so the caller tells every node. One pass
    /// over the nodes under the read lock: the reconciler asks every
    /// second.
    pub fn update_relay(&self, now: Instant, unreachable_after: Duration) -> bool {
        let mut relay = self.relay.lock().expect("relay lock");
        let chosen = {
            let nodes = self.nodes.read().expect("node registry lock");
            let candidates: Vec<RelayCandidate<'_>> = nodes
                .values()
                .filter(|n| n.wireguard_public_key.is_some() && n.endpoint.is_some())
                .map(|n| RelayCandidate {
                    id: &n.id,
                    mesh_index: n.mesh_index,
                    up: n.state(now, unreachable_after) != NodeState::Unreachable,
                    can_relay: n.has_feature(now, cloudweb_protocol::features::MESH_RELAY),
                })
                .collect();
            choose_relay(&candidates, relay.as_deref()).map(str::to_string)
        };
        if *relay == chosen {
            return false;
        }
        tracing::info!(previous = ?*relay, relay = ?chosen, "mesh relay changed");
        *relay = chosen;
        true
    }

    /// Nodes that instances must move off: `(id, lost)`, where `lost` means
    /// unreachable (as opposed to draining). Reads under the lock without
    /// copying nodes, since the reconciler asks every second.
    pub fn leaving(&self, now: Instant, unreachable_after: Duration) -> Vec<(String, bool)> {
        self.nodes
            .read()
            .expect("node registry lock")
            .values()
            .filter_map(|node| match node.state(now, unreachable_after) {
                NodeState::Unreachable => Some((node.id.clone(), true)),
                NodeState::Draining => Some((node.id.clone(), false)),
                NodeState::Ready => None,
            })
            .collect()
    }

    pub fn set_draining(&self, id: &str, draining: bool) {
        if let Some(node) = self.nodes.write().expect("node registry lock").get_mut(id) {
            node.draining = draining;
        }
    }

    /// The node's WireGuard endpoint as peers see it.
    pub fn set_endpoint(&self, id: &str, endpoint: &str) {
        if let Some(node) = self.nodes.write().expect("node registry lock").get_mut(id) {
            node.endpoint = Some(endpoint.to_string());
        }
    }

    pub fn len(&self) -> usize {
        self.nodes.read().expect("node registry lock").len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Records a heartbeat and returns the node's state after it, or `None`
    /// when the node is not registered.
    pub fn record_heartbeat(
        &self,
        id: &str,
        heartbeat: Heartbeat,
        agent_version: Option<String>,
        protocol: u32,
        now: Instant,
        now_ms: i64,
    ) -> Option<NodeState> {
        let mut nodes = self.nodes.write().expect("node registry lock");
        let node = nodes.get_mut(id)?;
        node.last_seen = now;
        node.heartbeat_at_ms = Some(now_ms);
        if agent_version.is_some() {
            node.agent_version = agent_version;
        }
        node.protocol = protocol;
        node.capacity = Some(Capacity {
            cpu_cores: heartbeat.cpu_cores,
            mem_bytes: heartbeat.mem_bytes,
            disk_bytes: heartbeat.disk_bytes,
        });
        if let Some(health) = heartbeat.health {
            node.health = Some(Stamped { value: health, received: now, at_ms: now_ms });
        }
        if let Some(metrics) = heartbeat.metrics {
            if let Some(traffic) = &metrics.traffic {
                self.traffic.lock().expect("traffic lock").extend(traffic.iter().map(|t| TrafficRow {
                    node_id: id.to_string(),
                    at_ms: now_ms,
                    sample: t.clone(),
                }));
            }
            if metrics.node.is_some() || metrics.containers.is_some() {
                let mut apps: Vec<crate::store::AppUsage> = Vec::new();
                for container in metrics.containers.iter().flatten() {
                    let Some(app) = app_of_container(&container.container) else { continue };
                    let mem = container.mem_bytes.map(|m| m.min(i64::MAX as u64) as i64);
                    let restarts = container.restarts.map(i64::from);
                    match apps.iter_mut().find(|entry| entry.app == app) {
                        Some(entry) => {
                            entry.cpu_cores = match (entry.cpu_cores, container.cpu_cores) { (Some(a), Some(b)) => Some(a + b), (a, b) => a.or(b) };
                            entry.mem_bytes = match (entry.mem_bytes, mem) { (Some(a), Some(b)) => Some(a + b), (a, b) => a.or(b) };
                            entry.restarts = match (entry.restarts, restarts) { (Some(a), Some(b)) => Some(a + b), (a, b) => a.or(b) };
                        }
                        None => apps.push(crate::store::AppUsage { app: app.to_string(), cpu_cores: container.cpu_cores, mem_bytes: mem, restarts }),
                    }
                }
                let usage = metrics.node.as_ref();
                self.usage.lock().expect("usage lock").push(crate::store::NodeUsageRow {
                    node_id: id.to_string(),
                    at_ms: now_ms,
                    cpu_pct: usage.and_then(|u| u.cpu_pct),
                    mem_used: usage.and_then(|u| u.mem_used).map(|m| m.min(i64::MAX as u64) as i64),
                    disk_used: usage.and_then(|u| u.disk_used).map(|m| m.min(i64::MAX as u64) as i64),
                    apps,
                });
            }
            // The agent sends the usage sample and the traffic counts on
            // their own timers, each as a partial `metrics` block: merge a
            // part into the latest sample instead of replacing the whole,
            // so the gauges of one part never vanish while the other
            // arrives.
            let merged = match node.metrics.take() {
                Some(previous) => merge_metrics(previous.value, metrics),
                None => metrics,
            };
            node.metrics = Some(Stamped { value: merged, received: now, at_ms: now_ms });
        }
        if heartbeat.ingress.is_some() {
            node.ingress_status = heartbeat.ingress;
        }
        node.dirty = true;
        Some(if node.draining { NodeState::Draining } else { NodeState::Ready })
    }

    /// Takes the usage samples received since the last call.
    pub fn take_usage(&self) -> Vec<crate::store::NodeUsageRow> {
        std::mem::take(&mut *self.usage.lock().expect("usage lock"))
    }

    /// Takes the traffic samples received since the last call.
    pub fn take_traffic(&self) -> Vec<TrafficRow> {
        std::mem::take(&mut *self.traffic.lock().expect("traffic lock"))
    }

    /// Takes the heartbeats received since the last call, for one batched
    /// write.
    pub fn take_dirty(&self) -> Vec<HeartbeatRow> {
        // Copy under the lock, serialize after it: heartbeats wait for this
        // lock, and JSON for thousands of nodes takes a while.
        /// A dirty node's heartbeat, copied: id, time, agent version,
        /// protocol, capacity, health, metrics.
        type Copied = (String, i64, Option<String>, i64, Capacity, Option<Stamped<Health>>, Option<Stamped<Metrics>>);
        let taken: Vec<Copied> = {
            let mut nodes = self.nodes.write().expect("node registry lock");
            nodes
                .values_mut()
                .filter(|n| n.dirty)
                .filter_map(|node| {
                    node.dirty = false;
                    let capacity = node.capacity?;
                    Some((
                        node.id.clone(),
                        node.heartbeat_at_ms.unwrap_or_default(),
                        node.agent_version.clone(),
                        i64::from(node.protocol),
                        capacity,
                        node.health.clone(),
                        node.metrics.clone(),
                    ))
                })
                .collect()
        };
        taken
            .into_iter()
            .map(|(node_id, at_ms, agent_version, protocol, capacity, health, metrics)| HeartbeatRow {
                node_id,
                at_ms,
                agent_version,
                protocol,
                cpu_cores: i64::from(capacity.cpu_cores),
                mem_bytes: capacity.mem_bytes.min(i64::MAX as u64) as i64,
                disk_bytes: capacity.disk_bytes.min(i64::MAX as u64) as i64,
                health_json: health.as_ref().and_then(|h| serde_json::to_string(&h.value).ok()),
                health_at: health.as_ref().map(|h| h.at_ms),
                metrics_json: metrics.as_ref().and_then(|m| serde_json::to_string(&m.value).ok()),
                metrics_at: metrics.as_ref().map(|m| m.at_ms),
            })
            .collect()
    }
}

/// The latest sample with the parts `update` carries replaced: the node
/// usage, the container list (with its `omitted` count) and the traffic
/// (with `traffic_omitted`) each move as a whole, and a part `update`
/// leaves out keeps its previous value.
pub fn merge_metrics(previous: Metrics, update: Metrics) -> Metrics {
    let containers_sent = update.containers.is_some();
    let traffic_sent = update.traffic.is_some();
    Metrics {
        node: update.node.or(previous.node),
        omitted: if containers_sent { update.omitted } else { update.omitted.or(previous.omitted) },
        containers: update.containers.or(previous.containers),
        traffic_omitted: if traffic_sent { update.traffic_omitted } else { update.traffic_omitted.or(previous.traffic_omitted) },
        traffic: update.traffic.or(previous.traffic),
        volumes: update.volumes.or(previous.volumes),
    }
}

fn live_from_row(row: &NodeRow, now: Instant) -> LiveNode {
    let capacity = match (row.cpu_cores, row.mem_bytes, row.disk_bytes) {
        (Some(cpu), Some(mem), Some(disk)) => Some(Capacity {
            cpu_cores: cpu.clamp(0, u32::MAX as i64) as u32,
            mem_bytes: mem.max(0) as u64,
            disk_bytes: disk.max(0) as u64,
        }),
        _ => None,
    };
    LiveNode {
        id: row.id.clone(),
        name: row.name.clone(),
        cert_sha256: row.cert_sha256.clone(),
        next_cert_sha256: row.next_cert_sha256.clone(),
        replaced_cert_sha256: row.replaced_cert_sha256.clone(),
        cert_not_after: row.cert_not_after,
        draining: row.draining,
        mesh_index: row.mesh_index,
        wireguard_public_key: row.wireguard_public_key.clone(),
        endpoint: row.endpoint.clone(),
        ingress: row.ingress,
        ingress_status: None,
        last_seen: now,
        agent_version: row.agent_version.clone(),
        protocol: row.protocol.unwrap_or(1).clamp(0, u32::MAX as i64) as u32,
        capacity,
        heartbeat_at_ms: row.last_heartbeat_at,
        // Health and metrics from before a restart are older than any age we
        // would believe, so they are not loaded.
        health: None,
        metrics: None,
        dirty: false,
    }
}

#[cfg(test)]
mod tests {
    use cloudweb_protocol::RegistryHealth;

    use super::*;

    fn node(now: Instant) -> LiveNode {
        LiveNode {
            id: "n-1".into(),
            name: "one".into(),
            cert_sha256: "ab".into(),
            next_cert_sha256: None,
            replaced_cert_sha256: None,
            cert_not_after: None,
            draining: false,
            mesh_index: 1,
            wireguard_public_key: None,
            endpoint: None,
            ingress: false,
            ingress_status: None,
            last_seen: now,
            agent_version: None,
            protocol: 1,
            capacity: None,
            heartbeat_at_ms: None,
            health: None,
            metrics: None,
            dirty: false,
        }
    }

    #[test]
    fn apps_of_containers() {
        assert_eq!(app_of_container("cw-web-3"), Some("web"));
        assert_eq!(app_of_container("cw-my-app-12"), Some("my-app"));
        assert_eq!(app_of_container("cw-web"), None);
        assert_eq!(app_of_container("other-1"), None);
        assert_eq!(app_of_container("cw-svc.db-2"), None, "a service's container is no app's");
    }

    #[tokio::test(start_paused = true)]
    async fn states_follow_the_monotonic_clock() {
        let start = Instant::now();
        let mut n = node(start);
        assert_eq!(n.state(start + Duration::from_secs(30), Duration::from_secs(30)), NodeState::Ready);
        assert_eq!(n.state(start + Duration::from_secs(31), Duration::from_secs(30)), NodeState::Unreachable);
        n.draining = true;
        assert_eq!(n.state(start, Duration::from_secs(30)), NodeState::Draining);
    }

    #[tokio::test(start_paused = true)]
    async fn stale_health_is_unknown_and_hides_features() {
        let start = Instant::now();
        let mut n = node(start);
        assert_eq!(n.health_state(start), HealthState::Unknown);
        n.health = Some(Stamped {
            value: Health {
                registry: Some(RegistryHealth { configured: true, reachable: false, error: Some("i/o timeout".into()) }),
                mesh: None,
                features: Some(vec!["static-sites".into()]),
                services: None,
            },
            received: start,
            at_ms: 0,
        });
        assert_eq!(n.health_state(start + Duration::from_secs(60)), HealthState::Degraded("i/o timeout".into()));
        assert!(n.has_feature(start + Duration::from_secs(60), "static-sites"));
        assert_eq!(n.health_state(start + Duration::from_secs(61)), HealthState::Unknown);
        assert!(!n.has_feature(start + Duration::from_secs(61), "static-sites"));
    }

    fn member(id: &'static str, mesh_index: i64, endpoint: Option<&'static str>) -> MeshMember<'static> {
        MeshMember { id, name: id, mesh_index, public_key: "key", endpoint }
    }

    /// The peer list with the relay the lowest member with an endpoint.
    fn lowest_relay_list(members: &[MeshMember<'_>], node_id: &str) -> cloudweb_protocol::PeerList {
        let relay = members.iter().filter(|m| m.endpoint.is_some()).min_by_key(|m| m.mesh_index).map(|m| m.id);
        peer_list(members, node_id, relay)
    }

    fn candidate(id: &'static str, mesh_index: i64, up: bool, can_relay: bool) -> RelayCandidate<'static> {
        RelayCandidate { id, mesh_index, up, can_relay }
    }

    #[test]
    fn the_relay_is_the_lowest_up_node_that_can_relay_and_stays_while_up() {
        let all = [candidate("hub", 1, true, true), candidate("public", 3, true, true), candidate("old", 2, true, false)];
        // First choice: the lowest that is up and can relay.
        assert_eq!(choose_relay(&all, None), Some("hub"));
        // The hub goes unreachable: the next one that can relay, not the
        // 0.1.0 agent with a lower index.
        let hub_down = [candidate("hub", 1, false, true), candidate("public", 3, true, true), candidate("old", 2, true, false)];
        assert_eq!(choose_relay(&hub_down, Some("hub")), Some("public"));
        // The hub comes back: the relay stays where it is (no flapping).
        assert_eq!(choose_relay(&all, Some("public")), Some("public"));
        // A relay that left the candidates (removed, or lost its endpoint)
        // is replaced.
        assert_eq!(choose_relay(&all[..1], Some("public")), Some("hub"));
        // Nobody announces the feature: the lowest up node all the same,
        // and a previous one that cannot relay is dropped for one that can.
        let old_only = [candidate("old-a", 2, true, false), candidate("old-b", 1, false, false)];
        assert_eq!(choose_relay(&old_only, None), Some("old-a"));
        assert_eq!(choose_relay(&all, Some("old")), Some("hub"));
        // Nobody up: keep the previous, else the lowest; none without
        // candidates.
        let none_up = [candidate("a", 2, false, true), candidate("b", 1, false, true)];
        assert_eq!(choose_relay(&none_up, Some("a")), Some("a"));
        assert_eq!(choose_relay(&none_up, None), Some("b"));
        assert_eq!(choose_relay(&[], Some("a")), None);
    }

    #[tokio::test(start_paused = true)]
    async fn the_registry_reports_a_relay_change_once_and_lists_peers_through_the_new_relay() {
        let start = Instant::now();
        let registry = NodeRegistry::default();
        let relay_health = || Stamped {
            value: Health { registry: None, mesh: None, features: Some(vec![cloudweb_protocol::features::MESH_RELAY.into()]), services: None },
            received: start,
            at_ms: 0,
        };
        for (id, index, endpoint) in [("hub", 1, Some("192.0.2.1:51820")), ("public", 2, Some("192.0.2.2:51820")), ("nat-a", 3, None), ("nat-b", 4, None)] {
            let mut n = node(start);
            n.id = id.into();
            n.name = id.into();
            n.mesh_index = index;
            n.wireguard_public_key = Some("key".into());
            n.endpoint = endpoint.map(str::to_string);
            n.health = Some(relay_health());
            registry.nodes.write().unwrap().insert(id.into(), n);
        }
        let after = Duration::from_secs(30);
        assert!(registry.update_relay(start, after));
        assert!(!registry.update_relay(start, after), "an unchanged choice is not a change");
        assert_eq!(registry.mesh_peers("nat-a").peers.iter().find(|p| p.name == "nat-b").unwrap().via.as_deref(), Some("hub"));
        // Only `public` keeps heartbeating; past the threshold the hub is
        // unreachable and `public` takes over, once.
        let later = start + Duration::from_secs(31);
        registry.nodes.write().unwrap().get_mut("public").unwrap().last_seen = later;
        registry.nodes.write().unwrap().get_mut("public").unwrap().health.as_mut().unwrap().received = later;
        assert!(registry.update_relay(later, after));
        assert!(!registry.update_relay(later, after));
        assert_eq!(registry.mesh_peers("nat-a").peers.iter().find(|p| p.name == "nat-b").unwrap().via.as_deref(), Some("public"));
        assert!(registry.mesh_peers("public").relay);
        assert!(!registry.mesh_peers("hub").relay);
    }

    /// `(name, via, relayed_ips)` of each entry.
    fn shape(list: &cloudweb_protocol::PeerList) -> Vec<(String, Option<String>, Vec<String>)> {
        list.peers.iter().map(|p| (p.name.clone(), p.via.clone(), p.relayed_ips.clone())).collect()
    }

    fn plain(names: &[&str]) -> Vec<(String, Option<String>, Vec<String>)> {
        names.iter().map(|n| (n.to_string(), None, Vec::new())).collect()
    }

    #[test]
    fn natted_pairs_go_through_the_lowest_node_with_an_endpoint() {
        // Unordered on purpose: the list is by mesh index.
        let members = [
            member("nat-b", 5, None),
            member("public-2", 3, Some("192.0.2.3:51820")),
            member("hub", 1, Some("192.0.2.1:51820")),
            member("nat-a", 4, None),
            member("nat-c", 2, None),
        ];
        let for_a = lowest_relay_list(&members, "nat-a");
        assert!(!for_a.relay);
        assert_eq!(
            shape(&for_a),
            [
                ("hub".to_string(), None, vec!["10.77.0.2/32".to_string(), "10.77.0.5/32".to_string()]),
                ("nat-c".to_string(), Some("hub".to_string()), vec![]),
                ("public-2".to_string(), None, vec![]),
                ("nat-b".to_string(), Some("hub".to_string()), vec![]),
            ]
        );
        assert_eq!(for_a.peers[0].endpoint.as_deref(), Some("192.0.2.1:51820"));
        assert_eq!(for_a.peers[1].mesh_address, "10.77.0.2");
        // The relay lists everyone directly and is told to forward.
        let for_hub = lowest_relay_list(&members, "hub");
        assert!(for_hub.relay);
        assert_eq!(shape(&for_hub), plain(&["nat-c", "public-2", "nat-a", "nat-b"]));
        // Another public node: full mesh, no forwarding.
        let for_public = lowest_relay_list(&members, "public-2");
        assert!(!for_public.relay);
        assert_eq!(shape(&for_public), plain(&["hub", "nat-c", "nat-a", "nat-b"]));
    }

    #[test]
    fn no_relay_without_a_natted_pair_or_without_a_public_node() {
        // One NATed node: it reaches everyone directly; nobody relays.
        let one = [member("hub", 1, Some("192.0.2.1:51820")), member("nat-a", 2, None), member("public", 3, Some("192.0.2.3:51820"))];
        for id in ["hub", "nat-a", "public"] {
            let list = lowest_relay_list(&one, id);
            assert!(!list.relay, "{id}");
            assert!(list.peers.iter().all(|p| p.via.is_none() && p.relayed_ips.is_empty()), "{id}");
        }
        // Nobody has an endpoint: nothing to relay through.
        let none = [member("nat-a", 1, None), member("nat-b", 2, None)];
        let list = lowest_relay_list(&none, "nat-a");
        assert!(!list.relay);
        assert_eq!(shape(&list), plain(&["nat-b"]));
    }

    #[test]
    fn the_relay_moves_when_a_lower_node_gains_an_endpoint_and_a_node_with_one_leaves_the_relayed_set() {
        let before = [member("nat-x", 1, None), member("public", 2, Some("192.0.2.2:51820")), member("nat-a", 3, None), member("nat-b", 4, None)];
        let list = lowest_relay_list(&before, "nat-a");
        assert_eq!(list.peers.iter().find(|p| p.name == "nat-b").unwrap().via.as_deref(), Some("public"));
        assert_eq!(list.peers.iter().find(|p| p.name == "nat-x").unwrap().via.as_deref(), Some("public"));
        assert!(lowest_relay_list(&before, "public").relay);
        // nat-x (mesh index 1) reports an endpoint: it is the relay now,
        // and no longer relayed.
        let after = [member("nat-x", 1, Some("192.0.2.1:51820")), member("public", 2, Some("192.0.2.2:51820")), member("nat-a", 3, None), member("nat-b", 4, None)];
        let list = lowest_relay_list(&after, "nat-a");
        assert_eq!(
            shape(&list),
            [
                ("nat-x".to_string(), None, vec!["10.77.0.4/32".to_string()]),
                ("public".to_string(), None, vec![]),
                ("nat-b".to_string(), Some("nat-x".to_string()), vec![]),
            ]
        );
        assert!(lowest_relay_list(&after, "nat-x").relay);
        assert!(!lowest_relay_list(&after, "public").relay);
        // 0.1.0 agents read the list without the new fields.
        let json = serde_json::to_value(lowest_relay_list(&after, "public")).unwrap();
        assert!(json.get("relay").is_none() && json["peers"][0].get("via").is_none() && json["peers"][0].get("relayed_ips").is_none(), "{json}");
    }
}
