//! What a follower replica keeps of the live state it does not receive.
//!
//! Only the leader serves agents, so only the leader hears heartbeats. A
//! follower still answers the user API and the dashboard, and its node
//! list must not call every node unreachable: it mirrors the nodes from
//! the database (the leader writes each node's last heartbeat there every
//! flush), judging each by the stored time of its last heartbeat. Its view
//! lags the leader's by at most the flush interval and the mirror's own.

use tokio::time::Instant;

use crate::AppState;

/// Replaces this follower's node registry with the database's nodes.
pub async fn mirror_nodes(state: &AppState) {
    match state.store.nodes().await {
        Ok(rows) => state.nodes.mirror(&rows, Instant::now(), state.clock.now_ms()),
        Err(err) => tracing::warn!(error = %err, "cannot mirror the nodes from the database; the node list keeps its last view"),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::live::{NodeRegistry, NodeState};
    use crate::store::NodeRow;

    fn row(id: &str, last_heartbeat_at: Option<i64>) -> NodeRow {
        NodeRow {
            id: id.into(),
            name: id.into(),
            hostname: id.into(),
            ingress: false,
            mesh_index: 1,
            wireguard_public_key: None,
            endpoint: None,
            cert_sha256: "ab".into(),
            draining: false,
            joined_at: 1_000,
            agent_version: Some("0.9.0".into()),
            protocol: Some(1),
            last_heartbeat_at,
            cpu_cores: Some(2),
            mem_bytes: Some(1 << 30),
            disk_bytes: Some(1 << 34),
            health_json: Some(r#"{"features":["static-sites"]}"#.into()),
            health_at: last_heartbeat_at,
            metrics_json: None,
            metrics_at: None,
            cert_not_after: None,
            next_cert_sha256: None,
            replaced_cert_sha256: None,
            cert_renewed_at: None,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_follower_judges_nodes_by_their_stored_heartbeat_not_by_when_it_loaded_them() {
        let registry = NodeRegistry::default();
        let now = tokio::time::Instant::now() + Duration::from_secs(3600);
        let now_ms = 1_000_000;
        let unreachable_after = Duration::from_secs(30);
        registry.mirror(&[row("fresh", Some(now_ms - 4_000)), row("gone", Some(now_ms - 45_000)), row("never", None)], now, now_ms);
        let fresh = registry.get("fresh").unwrap();
        assert_eq!(fresh.state(now, unreachable_after), NodeState::Ready);
        assert_eq!(fresh.state(now + Duration::from_secs(27), unreachable_after), NodeState::Unreachable, "its age counts from the stored heartbeat");
        assert!(fresh.has_feature(now, "static-sites"), "stored health is believed while it is recent");
        assert_eq!(registry.get("gone").unwrap().state(now, unreachable_after), NodeState::Unreachable);
        assert!(!registry.get("gone").unwrap().has_feature(now + Duration::from_secs(20), "static-sites"), "old health is not");
        assert_eq!(registry.get("never").unwrap().state(now, unreachable_after), NodeState::Unreachable, "joined long ago and never heard from");
        // A node removed through the leader is gone from the next mirror.
        registry.mirror(&[row("fresh", Some(now_ms))], now, now_ms);
        assert!(registry.get("gone").is_none() && registry.len() == 1);
    }
}
