//! The WireGuard mesh (10.77.0.0/16) on this node: full mesh, every node a
//! peer of every other, with keepalives so nodes behind NAT stay reachable.
//!
//! `run` keeps the interface up (kernel WireGuard or userspace
//! wireguard-go, see `backend.rs`; restarted with a back-off if it goes
//! away) and converges its peers to `GET /agent/v1/peers` on start, on
//! every `peers` event and every refresh interval. It also measures
//! `health.mesh` for the heartbeat and writes `mesh.json` for
//! `cloudweb-agent mesh status`.

pub mod backend;
pub mod converge;
pub mod device;
pub mod kernel;
pub mod key;
pub mod status;
pub mod uapi;

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use cloudweb_protocol::{MeshHealth, Peer};
use tokio::sync::Notify;

use crate::client::ControlPlane;
use backend::Choice;
use converge::DesiredPeer;
use device::{Device, DeviceSpec};
use key::KeyPair;
use status::MeshCache;

/// How the mesh interface is provided.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum MeshMode {
    /// No mesh: the agent leaves networking alone (several agents on one
    /// host, development).
    Off,
    /// `wireguard-go`, configured over its UAPI socket.
    Userspace,
    /// Kernel WireGuard, configured over netlink; fails without the module.
    Kernel,
    /// Kernel WireGuard when the kernel has it, otherwise `wireguard-go`
    /// (the reason is logged). What the installers use.
    Auto,
}

impl MeshMode {
    /// The backend choice, `None` for `off`.
    pub fn choice(self) -> Option<Choice> {
        match self {
            MeshMode::Off => None,
            MeshMode::Userspace => Some(Choice::Userspace),
            MeshMode::Kernel => Some(Choice::Kernel),
            MeshMode::Auto => Some(Choice::Auto),
        }
    }
}

#[derive(Debug, Clone)]
pub struct MeshOptions {
    pub choice: Choice,
    pub data_dir: PathBuf,
    pub interface: String,
    pub listen_port: u16,
    pub wireguard_go: PathBuf,
    pub key: KeyPair,
    pub mesh_address: Ipv4Addr,
    /// Re-read the peer list this often even without events.
    pub refresh: Duration,
    /// Handshake age under which a peer counts as connected.
    pub connected_within: Duration,
    /// Where the endpoint this node reports in its heartbeats comes from.
    pub endpoint: EndpointSource,
}

/// The `host:port` other nodes reach this node's WireGuard at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EndpointSource {
    /// The join's `--endpoint` (or none, behind NAT); not re-sent.
    Joined,
    /// `run --mesh-endpoint`: sent with every heartbeat.
    Fixed(String),
    /// The first IPv4 address of this interface with the listen port, read
    /// again every few seconds: a changed address is sent at the next
    /// heartbeat, and the device rebinds its socket.
    Interface(String),
}

/// What the heartbeat reads.
#[derive(Default)]
pub struct MeshShared {
    pub health: Mutex<Option<MeshHealth>>,
    /// The backend the device runs on, while it is up.
    pub backend: Mutex<Option<backend::Backend>>,
    /// The endpoint to report, when the node knows it.
    pub endpoint: Mutex<Option<String>>,
}

/// How often the device is read for `health.mesh`.
const MEASURE_EVERY: Duration = Duration::from_secs(5);

/// The mesh address of a node as the control plane lists it: inside
/// 10.77.0.0/16, neither the network nor the broadcast address.
pub fn parse_mesh_address(text: &str) -> Option<Ipv4Addr> {
    let address: Ipv4Addr = text.parse().ok()?;
    let [a, b, c, d] = address.octets();
    (a == 10 && b == 77 && !(c == 0 && d == 0) && !(c == 255 && d == 255)).then_some(address)
}

pub async fn run(client: Arc<ControlPlane>, options: MeshOptions, peers_changed: Arc<Notify>, shared: Arc<MeshShared>) {
    let mut backoff = Duration::from_secs(1);
    loop {
        let spec = DeviceSpec {
            choice: options.choice,
            wireguard_go: &options.wireguard_go,
            interface: &options.interface,
            key: &options.key,
            listen_port: options.listen_port,
            mesh_address: options.mesh_address,
        };
        let (mut device, fallback) = match Device::start(&spec).await {
            Ok(started) => started,
            Err(err) => {
                tracing::error!(interface = %options.interface, "mesh interface could not start: {err}; retrying in {backoff:?}");
                *shared.health.lock().expect("mesh lock") = None;
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(30));
                continue;
            }
        };
        *shared.backend.lock().expect("mesh lock") = Some(device.backend());
        tracing::info!(
            interface = %options.interface,
            mode = %device.backend().name(),
            fallback_reason = %fallback.as_deref().unwrap_or("-"),
            address = %options.mesh_address,
            port = options.listen_port,
            public_key = %options.key.public_base64(),
            "mesh interface up"
        );
        let mut applied: HashMap<String, Option<SocketAddr>> = HashMap::new();
        let mut peers: Vec<Peer> = Vec::new();
        let mut refresh = tokio::time::interval(options.refresh);
        let mut measure = tokio::time::interval(MEASURE_EVERY);
        let mut healthy_since = tokio::time::Instant::now();
        // health.mesh waits for a peer list: 0/0 before it would be a lie.
        let mut synced = false;
        // The address the device's socket was bound with (Interface mode).
        let mut bound_address: Option<Ipv4Addr> = None;
        let exit = loop {
            tokio::select! {
                why = device.exited() => break why,
                _ = refresh.tick() => synced |= sync(&client, &options, &device, &mut applied, &mut peers).await,
                _ = peers_changed.notified() => synced |= sync(&client, &options, &device, &mut applied, &mut peers).await,
                _ = measure.tick() => {
                    follow_endpoint(&options, &device, &shared, &mut bound_address).await;
                    if synced {
                        measure_health(&options, &device, &peers, &shared).await;
                    }
                }
            }
            if healthy_since.elapsed() > Duration::from_secs(60) {
                backoff = Duration::from_secs(1);
                healthy_since = tokio::time::Instant::now();
            }
        };
        tracing::error!(interface = %options.interface, "the mesh device is gone: {exit}; restarting the mesh interface in {backoff:?}");
        *shared.health.lock().expect("mesh lock") = None;
        *shared.backend.lock().expect("mesh lock") = None;
        drop(device);
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(30));
    }
}

/// Fetches the peer list and converges the device to it. A failure keeps
/// the device as it is (tunnels that work go on working). True when the
/// device now matches the list.
async fn sync(
    client: &ControlPlane,
    options: &MeshOptions,
    device: &Device,
    applied: &mut HashMap<String, Option<SocketAddr>>,
    peers: &mut Vec<Peer>,
) -> bool {
    let list = match client.peers().await {
        Ok(list) => list.peers,
        Err(err) => {
            tracing::warn!("mesh peers: {err}");
            return false;
        }
    };
    let (valid, desired) = desired_peers(&list, &options.key).await;
    let current = match device.get().await {
        Ok(device) => device,
        Err(err) => {
            tracing::warn!("mesh peers: reading the device: {err}");
            return false;
        }
    };
    let plan = converge::plan(&desired, &current, applied);
    if !plan.is_empty() {
        if let Err(err) = device.set(&plan.body).await {
            tracing::warn!("mesh peers: configuring the device: {err}");
            return false;
        }
        tracing::info!(added = plan.added, updated = plan.updated, removed = plan.removed, peers = desired.len(), "mesh peers converged");
    }
    *applied = desired.iter().map(|p| (p.public_key.clone(), p.endpoint)).collect();
    *peers = valid;
    let cache = MeshCache { interface: options.interface.clone(), mesh_address: options.mesh_address.to_string(), peers: peers.clone() };
    if let Err(err) = cache.save(&options.data_dir) {
        tracing::warn!("mesh peers: {err}");
    }
    true
}

/// The listed peers this node can use, and what the device should hold for
/// them. A peer with a bad key or address is left out with a warning; a
/// peer whose endpoint does not resolve is kept without one (it can still
/// reach us).
async fn desired_peers(list: &[Peer], own: &KeyPair) -> (Vec<Peer>, Vec<DesiredPeer>) {
    let mut valid = Vec::new();
    let mut desired = Vec::new();
    let own_key = own.public_hex();
    for peer in list {
        let key = peer.wireguard_public_key.as_deref().and_then(key::base64_to_hex);
        let (Some(key), Some(address)) = (key, parse_mesh_address(&peer.mesh_address)) else {
            tracing::warn!(node = %peer.node_id, "mesh peer left out: bad WireGuard key or mesh address");
            continue;
        };
        if key == own_key || desired.iter().any(|d: &DesiredPeer| d.public_key == key || d.allowed_ip == format!("{address}/32")) {
            tracing::warn!(node = %peer.node_id, "mesh peer left out: its key or address is already taken");
            continue;
        }
        let endpoint = match &peer.endpoint {
            Some(text) => resolve(text).await.or_else(|| {
                tracing::warn!(node = %peer.node_id, "mesh peer endpoint does not resolve; waiting for it to reach us");
                None
            }),
            None => None,
        };
        desired.push(DesiredPeer { public_key: key, endpoint, allowed_ip: format!("{address}/32") });
        valid.push(peer.clone());
    }
    (valid, desired)
}

/// `host:port` to one socket address (IPv4 first), within 5 s.
async fn resolve(endpoint: &str) -> Option<SocketAddr> {
    if cloudweb_protocol::validate::endpoint("endpoint", endpoint).is_err() {
        return None;
    }
    if let Ok(address) = endpoint.parse::<SocketAddr>() {
        return Some(address);
    }
    let found = tokio::time::timeout(Duration::from_secs(5), tokio::net::lookup_host(endpoint)).await.ok()?.ok()?;
    let all: Vec<SocketAddr> = found.collect();
    all.iter().find(|a| a.is_ipv4()).or(all.first()).copied()
}

/// Keeps the reported endpoint current. When the followed interface's
/// address changed, the device's UDP socket is bound again (setting the
/// listen port makes wireguard-go rebind and forget the source address it
/// cached for every peer): a safeguard against sending from the lost
/// address, which an earlier session reported; the namespace test passes
/// without it too (see ARCHITECTURE.md).
async fn follow_endpoint(options: &MeshOptions, device: &Device, shared: &MeshShared, bound: &mut Option<Ipv4Addr>) {
    let endpoint = match &options.endpoint {
        EndpointSource::Joined => None,
        EndpointSource::Fixed(endpoint) => Some(endpoint.clone()),
        EndpointSource::Interface(interface) => match device::first_ipv4(interface).await {
            Ok(Some(address)) => {
                if bound.is_some_and(|old| old != address) {
                    tracing::info!(interface, %address, previous = %bound.expect("checked"), "this node's address changed; rebinding the mesh socket");
                    if let Err(err) = device.set(&format!("listen_port={}\n", options.listen_port)).await {
                        tracing::warn!("mesh: rebinding after the address change: {err}");
                        return;
                    }
                }
                *bound = Some(address);
                Some(format!("{address}:{}", options.listen_port))
            }
            Ok(None) => {
                tracing::warn!(interface, "mesh endpoint: the interface has no IPv4 address");
                None
            }
            Err(err) => {
                tracing::warn!(interface, "mesh endpoint: {err}");
                None
            }
        },
    };
    *shared.endpoint.lock().expect("mesh lock") = endpoint;
}

async fn measure_health(options: &MeshOptions, device: &Device, peers: &[Peer], shared: &MeshShared) {
    let health = match device.get().await {
        Ok(device) => Some(status::health(&status::statuses(peers, &device, SystemTime::now(), options.connected_within))),
        Err(err) => {
            tracing::warn!("mesh health: {err}");
            None
        }
    };
    *shared.health.lock().expect("mesh lock") = health;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mesh_addresses() {
        assert_eq!(parse_mesh_address("10.77.0.1"), Some(Ipv4Addr::new(10, 77, 0, 1)));
        assert_eq!(parse_mesh_address("10.77.255.254"), Some(Ipv4Addr::new(10, 77, 255, 254)));
        for bad in ["10.77.0.0", "10.77.255.255", "10.78.0.1", "192.0.2.1", "10.77.0.1/16", "x"] {
            assert_eq!(parse_mesh_address(bad), None, "{bad}");
        }
    }

    #[tokio::test]
    async fn peers_with_bad_or_duplicate_keys_are_left_out() {
        use base64::Engine;
        let own = KeyPair::generate();
        let b64 = |b: u8| base64::engine::general_purpose::STANDARD.encode([b; 32]);
        let peer = |id: &str, key: Option<String>, ip: &str, endpoint: Option<&str>| Peer {
            node_id: id.into(),
            name: id.into(),
            mesh_address: ip.into(),
            wireguard_public_key: key,
            endpoint: endpoint.map(str::to_string),
        };
        let list = vec![
            peer("a", Some(b64(1)), "10.77.0.2", Some("192.0.2.2:51820")),
            peer("self", Some(own.public_base64()), "10.77.0.3", None),
            peer("nokey", None, "10.77.0.4", None),
            peer("badip", Some(b64(2)), "192.0.2.9", None),
            peer("dupip", Some(b64(3)), "10.77.0.2", None),
            peer("bad-endpoint", Some(b64(4)), "10.77.0.5", Some("not an endpoint")),
        ];
        let (valid, desired) = desired_peers(&list, &own).await;
        assert_eq!(valid.iter().map(|p| p.node_id.as_str()).collect::<Vec<_>>(), ["a", "bad-endpoint"]);
        assert_eq!(desired[0].endpoint, Some("192.0.2.2:51820".parse().unwrap()));
        assert_eq!(desired[1].endpoint, None);
        assert_eq!(desired[1].allowed_ip, "10.77.0.5/32");
    }
}
