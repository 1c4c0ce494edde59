//! Per-peer status (`cloudweb-agent mesh status`) and the `health.mesh`
//! counts: the peers the control plane lists, joined with what the device
//! says about each. A peer is connected when its latest handshake is
//! younger than the threshold (3 minutes): with keepalives flowing,
//! WireGuard renews a session at least every 2 minutes and a bit.

use std::path::Path;
use std::time::{Duration, SystemTime};

use cloudweb_protocol::{MeshHealth, Peer};
use serde::{Deserialize, Serialize};

use super::key::base64_to_hex;
use super::uapi::Device;
pub use crate::files::MESH_CACHE_FILE as CACHE_FILE;
use crate::files::{write_private, FileError};

/// Handshake age under which a peer counts as connected.
pub const CONNECTED_WITHIN: Duration = Duration::from_secs(180);

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MeshCache {
    pub interface: String,
    pub mesh_address: String,
    pub peers: Vec<Peer>,
}

impl MeshCache {
    pub fn save(&self, dir: &Path) -> Result<(), FileError> {
        write_private(&dir.join(CACHE_FILE), &serde_json::to_vec_pretty(self).expect("cache serializes"))
    }

    pub fn load(dir: &Path) -> Result<Option<MeshCache>, FileError> {
        let path = dir.join(CACHE_FILE);
        match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|e| FileError::Invalid { path, reason: e.to_string() }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(FileError::Io { path, source }),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PeerStatus {
    pub name: String,
    pub node_id: String,
    pub mesh_address: String,
    /// What the device uses now (learned from packets or set from the list).
    pub endpoint: Option<String>,
    /// Seconds since the latest handshake; `None` when there was none.
    pub handshake_age_seconds: Option<u64>,
    pub rx_bytes: u64,
    pub tx_bytes: u64,
    pub connected: bool,
    /// The name of the relay node a peer behind NAT is reached through
    /// (both ends behind NAT): its handshake and `connected` are the
    /// relay's, and its bytes are counted on the relay's line.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub via: Option<String>,
}

/// One entry per listed peer, in the list's order. A peer listed `via` a
/// relay takes the relay's handshake: it is connected when the relay is.
pub fn statuses(peers: &[Peer], device: &Device, now: SystemTime, within: Duration) -> Vec<PeerStatus> {
    let state_of = |peer: &Peer| {
        let key = peer.wireguard_public_key.as_deref().and_then(base64_to_hex);
        key.and_then(|k| device.peers.iter().find(|p| p.public_key == k))
    };
    peers
        .iter()
        .map(|peer| {
            let relay = peer.via.as_ref().and_then(|id| peers.iter().find(|p| &p.node_id == id));
            let state = match (&peer.via, relay) {
                (None, _) => state_of(peer),
                (Some(_), Some(relay)) => state_of(relay),
                (Some(_), None) => None,
            };
            let age = state.and_then(|s| s.last_handshake).map(|at| now.duration_since(at).unwrap_or_default());
            let direct = peer.via.is_none();
            PeerStatus {
                name: peer.name.clone(),
                node_id: peer.node_id.clone(),
                mesh_address: peer.mesh_address.clone(),
                endpoint: if direct { state.and_then(|s| s.endpoint).map(|e| e.to_string()).or_else(|| peer.endpoint.clone()) } else { None },
                handshake_age_seconds: age.map(|a| a.as_secs()),
                rx_bytes: if direct { state.map_or(0, |s| s.rx_bytes) } else { 0 },
                tx_bytes: if direct { state.map_or(0, |s| s.tx_bytes) } else { 0 },
                connected: age.is_some_and(|a| a < within),
                via: peer.via.as_ref().map(|id| relay.map_or_else(|| id.clone(), |r| r.name.clone())),
            }
        })
        .collect()
}

pub fn health(statuses: &[PeerStatus]) -> MeshHealth {
    MeshHealth {
        peers: u32::try_from(statuses.len()).unwrap_or(u32::MAX),
        connected: u32::try_from(statuses.iter().filter(|s| s.connected).count()).unwrap_or(u32::MAX),
    }
}

/// The table `mesh status` prints: a header, then one line per peer.
pub fn render(statuses: &[PeerStatus]) -> String {
    let mut rows = vec![[
        "NAME".to_string(),
        "MESH ADDRESS".into(),
        "ENDPOINT".into(),
        "HANDSHAKE".into(),
        "RECEIVED".into(),
        "SENT".into(),
        "CONNECTED".into(),
    ]];
    for s in statuses {
        rows.push([
            s.name.clone(),
            s.mesh_address.clone(),
            match (&s.via, &s.endpoint) {
                (Some(relay), _) => format!("via {relay}"),
                (None, Some(endpoint)) => endpoint.clone(),
                (None, None) => "-".into(),
            },
            s.handshake_age_seconds.map_or_else(|| "never".into(), |a| format!("{} ago", age(a))),
            bytes(s.rx_bytes),
            bytes(s.tx_bytes),
            if s.connected { "yes" } else { "no" }.into(),
        ]);
    }
    let widths: Vec<usize> = (0..7).map(|i| rows.iter().map(|r| r[i].len()).max().unwrap_or(0)).collect();
    let mut out = String::new();
    for row in rows {
        let line: Vec<String> = row.iter().zip(&widths).map(|(cell, w)| format!("{cell:<w$}")).collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    out
}

fn age(seconds: u64) -> String {
    match seconds {
        s if s < 60 => format!("{s}s"),
        s if s < 3600 => format!("{}m{}s", s / 60, s % 60),
        s => format!("{}h{}m", s / 3600, (s % 3600) / 60),
    }
}

fn bytes(n: u64) -> String {
    match n {
        n if n < 1024 => format!("{n} B"),
        n if n < 1024 * 1024 => format!("{:.1} KiB", n as f64 / 1024.0),
        n if n < 1024 * 1024 * 1024 => format!("{:.1} MiB", n as f64 / (1024.0 * 1024.0)),
        n => format!("{:.1} GiB", n as f64 / (1024.0 * 1024.0 * 1024.0)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mesh::uapi::PeerState;
    use base64::Engine;

    fn peer(name: &str, byte: u8, ip: &str) -> Peer {
        Peer {
            node_id: format!("n-{name}"),
            name: name.into(),
            mesh_address: ip.into(),
            wireguard_public_key: Some(base64::engine::general_purpose::STANDARD.encode([byte; 32])),
            endpoint: Some(format!("{name}.example:51820")),
            via: None,
            relayed_ips: Vec::new(),
        }
    }

    #[test]
    fn connected_means_a_handshake_within_the_threshold() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let peers = vec![peer("a", 1, "10.77.0.2"), peer("b", 2, "10.77.0.3"), peer("c", 3, "10.77.0.4")];
        let device = Device {
            listen_port: Some(51820),
            peers: vec![
                PeerState {
                    public_key: hex::encode([1u8; 32]),
                    endpoint: Some("192.0.2.2:51820".parse().unwrap()),
                    last_handshake: Some(now - Duration::from_secs(179)),
                    rx_bytes: 2048,
                    tx_bytes: 10,
                    ..Default::default()
                },
                PeerState { public_key: hex::encode([2u8; 32]), last_handshake: Some(now - Duration::from_secs(181)), ..Default::default() },
            ],
        };
        let list = statuses(&peers, &device, now, CONNECTED_WITHIN);
        assert_eq!(list.iter().map(|s| s.connected).collect::<Vec<_>>(), [true, false, false]);
        assert_eq!(list[0].endpoint.as_deref(), Some("192.0.2.2:51820"));
        assert_eq!(list[2].endpoint.as_deref(), Some("c.example:51820"));
        assert_eq!(list[2].handshake_age_seconds, None);
        assert_eq!(health(&list), MeshHealth { peers: 3, connected: 1 });
        let table = render(&list);
        assert_eq!(table.lines().count(), 4);
        assert!(table.lines().nth(1).unwrap().contains("2m59s ago"));
        assert!(table.lines().nth(1).unwrap().ends_with("yes"));
        assert!(table.lines().nth(3).unwrap().contains("never"));
        // A shorter threshold (tests) turns the first one off too.
        assert_eq!(health(&statuses(&peers, &device, now, Duration::from_secs(60))).connected, 0);
    }

    #[test]
    fn a_relayed_peer_is_connected_when_its_relay_is() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let mut relay = peer("hub", 1, "10.77.0.1");
        relay.relayed_ips = vec!["10.77.0.3/32".into()];
        let relayed = Peer { via: Some("n-hub".into()), endpoint: None, ..peer("nat-b", 3, "10.77.0.3") };
        let peers = vec![relay, relayed];
        let device = Device {
            listen_port: Some(51820),
            peers: vec![PeerState {
                public_key: hex::encode([1u8; 32]),
                endpoint: Some("192.0.2.1:51820".parse().unwrap()),
                last_handshake: Some(now - Duration::from_secs(30)),
                rx_bytes: 4096,
                tx_bytes: 4096,
                ..Default::default()
            }],
        };
        let list = statuses(&peers, &device, now, CONNECTED_WITHIN);
        assert_eq!(list[1].via.as_deref(), Some("hub"));
        assert!(list[1].connected);
        assert_eq!((list[1].handshake_age_seconds, list[1].rx_bytes, list[1].endpoint.as_deref()), (Some(30), 0, None));
        assert_eq!(health(&list), MeshHealth { peers: 2, connected: 2 });
        let table = render(&list);
        assert!(table.lines().nth(2).unwrap().contains("via hub"), "{table}");
        // The relay's handshake is too old: both are down.
        let later = now + Duration::from_secs(200);
        assert_eq!(health(&statuses(&peers, &device, later, CONNECTED_WITHIN)).connected, 0);
    }
}
