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
pub mod device_error;
pub mod kernel;
pub mod key;
pub mod relay;
pub mod status;
pub mod uapi;

use std::collections::{HashMap, HashSet};
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
    /// Notified (once per change) when the followed interface's address
    /// changed and `endpoint` holds the new one: the heartbeat goes out now.
    pub address_changed: Notify,
}

/// How often the device is read for `health.mesh`.
const MEASURE_EVERY: Duration = Duration::from_secs(5);
/// How often the followed interface's address is read
/// (`--mesh-endpoint-interface`): one `ip` call, so a moved node tells the
/// control plane within about a second.
const FOLLOW_EVERY: Duration = Duration::from_secs(1);

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
        let mut follow = tokio::time::interval(FOLLOW_EVERY);
        let mut healthy_since = tokio::time::Instant::now();
        // health.mesh waits for a peer list: 0/0 before it would be a lie.
        let mut synced = false;
        // The address the device's socket was bound with (Interface mode).
        let mut bound_address: Option<Ipv4Addr> = None;
        // Reading it failed and was said once (it is read every second).
        let mut follow_warned = false;
        // A new interface: nothing known about forwarding on it yet.
        let mut relay_state = RelayState::default();
        let exit = loop {
            tokio::select! {
                why = device.exited() => break why,
                _ = refresh.tick() => synced |= sync(&client, &options, &device, &mut applied, &mut peers, &mut relay_state).await,
                _ = peers_changed.notified() => synced |= sync(&client, &options, &device, &mut applied, &mut peers, &mut relay_state).await,
                // Only the interface's address needs reading this often.
                _ = follow.tick(), if matches!(options.endpoint, EndpointSource::Interface(_)) => {
                    follow_endpoint(&client, &options, &device, &shared, &mut bound_address, &mut follow_warned).await;
                }
                _ = measure.tick() => {
                    if !matches!(options.endpoint, EndpointSource::Interface(_)) {
                        follow_endpoint(&client, &options, &device, &shared, &mut bound_address, &mut follow_warned).await;
                    }
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
    relay_state: &mut RelayState,
) -> bool {
    let (list, relaying) = match client.peers().await {
        Ok(list) => (list.peers, list.relay),
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
    apply_relay(&options.interface, relaying, relay_state).await;
    let cache = MeshCache { interface: options.interface.clone(), mesh_address: options.mesh_address.to_string(), peers: peers.clone() };
    if let Err(err) = cache.save(&options.data_dir) {
        tracing::warn!("mesh peers: {err}");
    }
    true
}

/// The listed peers this node can use, and what the device should hold for
/// them. A peer with a bad key or address is left out with a warning; a
/// peer whose endpoint does not resolve is kept without one (it can still
/// reach us). A peer listed `via` a relay (both of us behind NAT) is no
/// device peer: its address rides on the relay's tunnel (the relay's
/// `relayed_ips`), and it is kept for the status only when that holds.
async fn desired_peers(list: &[Peer], own: &KeyPair) -> (Vec<Peer>, Vec<DesiredPeer>) {
    let mut keep = vec![false; list.len()];
    let mut desired: Vec<DesiredPeer> = Vec::new();
    // Index in `list` of each entry of `desired`.
    let mut desired_of: Vec<usize> = Vec::new();
    let mut taken: HashSet<String> = HashSet::new();
    let own_key = own.public_hex();
    for (i, peer) in list.iter().enumerate().filter(|(_, p)| p.via.is_none()) {
        let key = peer.wireguard_public_key.as_deref().and_then(key::base64_to_hex);
        let (Some(key), Some(address)) = (key, parse_mesh_address(&peer.mesh_address)) else {
            tracing::warn!(node = %peer.node_id, "mesh peer left out: bad WireGuard key or mesh address");
            continue;
        };
        let allowed = format!("{address}/32");
        if key == own_key || taken.contains(&allowed) || desired.iter().any(|d| d.public_key == key) {
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
        taken.insert(allowed.clone());
        desired.push(DesiredPeer { public_key: key, endpoint, allowed_ips: vec![allowed] });
        desired_of.push(i);
        keep[i] = true;
    }
    // The relayed addresses go onto their relay's tunnel, each once.
    for (d, &i) in desired.iter_mut().zip(&desired_of) {
        for ip in &list[i].relayed_ips {
            let address = ip.strip_suffix("/32").and_then(parse_mesh_address);
            let Some(address) = address.map(|a| format!("{a}/32")).filter(|a| !taken.contains(a)) else {
                tracing::warn!(node = %list[i].node_id, ip, "relayed address left out: not a free mesh /32");
                continue;
            };
            taken.insert(address.clone());
            d.allowed_ips.push(address);
        }
    }
    for (i, peer) in list.iter().enumerate() {
        let Some(relay) = &peer.via else { continue };
        let on_relay = desired_of.iter().zip(&desired).any(|(&r, d)| {
            &list[r].node_id == relay && parse_mesh_address(&peer.mesh_address).is_some_and(|a| d.allowed_ips[1..].contains(&format!("{a}/32")))
        });
        if on_relay {
            keep[i] = true;
        } else {
            tracing::warn!(node = %peer.node_id, relay, "mesh peer left out: its relay is not listed or does not carry its address");
        }
    }
    let valid = list.iter().zip(keep).filter(|(_, k)| *k).map(|(p, _)| p.clone()).collect();
    (valid, desired)
}

/// Whether this node forwards between peers behind NAT, as last applied.
#[derive(Debug, Default)]
struct RelayState {
    /// `None` until the first peer list on this interface.
    on: Option<bool>,
    /// Forwarding was off on the interface before relaying turned it on.
    forwarding_off_later: bool,
}

/// Turns relaying on (checked again with every list: the rule may have
/// been flushed) or off (once; also the first time, which removes a rule
/// an earlier run left behind).
async fn apply_relay(interface: &str, want: bool, state: &mut RelayState) {
    if want {
        match relay::enable(interface).await {
            Ok(turned_on) => {
                state.forwarding_off_later |= turned_on;
                if state.on != Some(true) {
                    tracing::info!(interface, "mesh relay: this node forwards between the nodes behind NAT");
                }
                state.on = Some(true);
            }
            Err(err) => tracing::warn!(interface, "mesh relay: {err}; nodes behind NAT may not reach each other"),
        }
    } else if state.on != Some(false) {
        if let Err(err) = relay::disable(interface, state.forwarding_off_later).await {
            // Logged once: no rule or no iptables at all is the usual case.
            if state.on == Some(true) {
                tracing::warn!(interface, "mesh relay: turning it off: {err}");
            } else {
                tracing::debug!(interface, "mesh relay: clearing an earlier rule: {err}");
            }
        } else if state.on == Some(true) {
            tracing::info!(interface, "mesh relay: this node no longer forwards");
        }
        state.on = Some(false);
        state.forwarding_off_later = false;
    }
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
/// without it too (see ARCHITECTURE.md). The pooled connections to the
/// control plane are dropped too (they are bound to the lost address) and
/// a heartbeat with the new endpoint goes out at once.
async fn follow_endpoint(client: &ControlPlane, options: &MeshOptions, device: &Device, shared: &MeshShared, bound: &mut Option<Ipv4Addr>, warned: &mut bool) {
    let mut moved = false;
    let endpoint = match &options.endpoint {
        EndpointSource::Joined => None,
        EndpointSource::Fixed(endpoint) => Some(endpoint.clone()),
        EndpointSource::Interface(interface) => match device::first_ipv4(interface).await {
            Ok(Some(address)) => {
                if bound.is_some_and(|old| old != address) {
                    tracing::info!(interface, %address, previous = %bound.expect("checked"), "this node's address changed; rebinding the mesh socket");
                    moved = true;
                    if let Err(err) = client.reset_connections() {
                        tracing::warn!("mesh: new connections to the control plane after the address change: {err}");
                    }
                    if let Err(err) = device.set(&format!("listen_port={}\n", options.listen_port)).await {
                        tracing::warn!("mesh: rebinding after the address change: {err}");
                    }
                }
                *bound = Some(address);
                *warned = false;
                Some(format!("{address}:{}", options.listen_port))
            }
            Ok(None) => {
                if !std::mem::replace(warned, true) {
                    tracing::warn!(interface, "mesh endpoint: the interface has no IPv4 address");
                }
                None
            }
            Err(err) => {
                if !std::mem::replace(warned, true) {
                    tracing::warn!(interface, "mesh endpoint: {err}");
                }
                None
            }
        },
    };
    *shared.endpoint.lock().expect("mesh lock") = endpoint;
    if moved {
        shared.address_changed.notify_one();
    }
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
            via: None,
            relayed_ips: Vec::new(),
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
        assert_eq!(desired[1].allowed_ips, ["10.77.0.5/32"]);
    }

    #[tokio::test]
    async fn relayed_peers_ride_on_the_relays_tunnel() {
        use base64::Engine;
        let own = KeyPair::generate();
        let b64 = |b: u8| base64::engine::general_purpose::STANDARD.encode([b; 32]);
        let peer = |id: &str, byte: u8, ip: &str| Peer {
            node_id: id.into(),
            name: id.into(),
            mesh_address: ip.into(),
            wireguard_public_key: Some(b64(byte)),
            endpoint: None,
            via: None,
            relayed_ips: Vec::new(),
        };
        let mut hub = peer("hub", 1, "10.77.0.1");
        hub.endpoint = Some("192.0.2.1:51820".into());
        // .3 is relayed; .2 is a direct peer (not the relay's to take);
        // junk is refused.
        hub.relayed_ips = vec!["10.77.0.3/32".into(), "10.77.0.2/32".into(), "10.77.0.9/24".into(), "192.0.2.1/32".into()];
        let direct = peer("direct", 2, "10.77.0.2");
        let relayed = Peer { via: Some("hub".into()), ..peer("nat-b", 3, "10.77.0.3") };
        let orphan = Peer { via: Some("hub".into()), ..peer("orphan", 4, "10.77.0.4") };
        let unknown_relay = Peer { via: Some("gone".into()), ..peer("lost", 5, "10.77.0.5") };
        let list = vec![hub, direct, relayed, orphan, unknown_relay];
        let (valid, desired) = desired_peers(&list, &own).await;
        assert_eq!(valid.iter().map(|p| p.node_id.as_str()).collect::<Vec<_>>(), ["hub", "direct", "nat-b"]);
        assert_eq!(desired.len(), 2, "a relayed peer is no device peer");
        assert_eq!(desired[0].allowed_ips, ["10.77.0.1/32", "10.77.0.3/32"]);
        assert_eq!(desired[1].allowed_ips, ["10.77.0.2/32"]);
    }
}
