//! Kernel WireGuard, configured over generic netlink through
//! `defguard_wireguard_rs` (its `WGApi<Kernel>`): the same device model as
//! the UAPI path (`uapi::Device` to read, a UAPI `set` body to apply), so
//! convergence does not know which backend runs.
//!
//! The crate's calls are blocking netlink round trips: each runs on the
//! blocking pool with a time limit. The link itself is created and deleted
//! with `ip` (as for the userspace device), which says plainly why a kernel
//! cannot make a `wireguard` link ("Unknown device type" without the
//! module); the crate would only say that creating it failed.
//!
//! Not exercised on the machines this was built on (no `wireguard` module):
//! it is written against the crate's documented API and compiles; the
//! decision to fall back is tested, the netlink path is not.

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::time::Duration;

use defguard_wireguard_rs::host::Host;
use defguard_wireguard_rs::key::Key;
use defguard_wireguard_rs::net::IpAddrMask;
use defguard_wireguard_rs::peer::Peer;
use defguard_wireguard_rs::{InterfaceConfiguration, Kernel, WGApi, WireguardInterfaceApi};

use super::uapi::{self, PeerChange, PeerState, SetRequest};

/// One netlink exchange never takes longer than this.
const TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    #[error("kernel WireGuard ({interface}): {message}")]
    Netlink { interface: String, message: String },
    #[error("kernel WireGuard ({0}) did not answer within 5 s")]
    Timeout(String),
    #[error("kernel WireGuard cannot apply this change: {0}")]
    Unsupported(String),
    #[error(transparent)]
    Request(#[from] uapi::UapiError),
}

/// Runs `work` with a fresh handle on `interface` on the blocking pool.
/// A handle is only the interface's name; nothing is kept between calls.
async fn with_api<T: Send + 'static>(
    interface: &str,
    work: impl FnOnce(&mut WGApi<Kernel>) -> Result<T, defguard_wireguard_rs::error::WireguardInterfaceError> + Send + 'static,
) -> Result<T, KernelError> {
    let name = interface.to_string();
    let task = tokio::task::spawn_blocking(move || {
        let mut api = WGApi::<Kernel>::new(name.clone()).map_err(|e| (name.clone(), e.to_string()))?;
        work(&mut api).map_err(|e| (name, e.to_string()))
    });
    match tokio::time::timeout(TIMEOUT, task).await {
        Err(_) => Err(KernelError::Timeout(interface.to_string())),
        Ok(Err(join)) => Err(KernelError::Netlink { interface: interface.to_string(), message: join.to_string() }),
        Ok(Ok(Err((interface, message)))) => Err(KernelError::Netlink { interface, message }),
        Ok(Ok(Ok(value))) => Ok(value),
    }
}

/// Sets the private key and listen port of a freshly created link (no
/// peers: convergence adds them) and its address `mesh_address/16`.
pub async fn configure(interface: &str, private_hex: String, listen_port: u16, mesh_address: Ipv4Addr) -> Result<(), KernelError> {
    let config = InterfaceConfiguration {
        name: interface.to_string(),
        prvkey: private_hex,
        addresses: vec![IpAddrMask::new(mesh_address.into(), 16)],
        port: listen_port,
        peers: Vec::new(),
        mtu: None,
        fwmark: None,
    };
    with_api(interface, move |api| api.configure_interface(&config)).await
}

/// What the device holds now, in the backend-independent form.
pub async fn get(interface: &str) -> Result<uapi::Device, KernelError> {
    let host = with_api(interface, |api| api.read_interface_data()).await?;
    Ok(device_of(&host))
}

fn device_of(host: &Host) -> uapi::Device {
    let mut peers: Vec<PeerState> = host
        .peers
        .values()
        .map(|peer| PeerState {
            public_key: peer.public_key.to_lower_hex(),
            endpoint: peer.endpoint,
            allowed_ips: peer.allowed_ips.iter().map(|ip| format!("{}/{}", ip.address, ip.cidr)).collect(),
            persistent_keepalive: peer.persistent_keepalive_interval.unwrap_or(0),
            // The kernel reports 0 s for "never".
            last_handshake: peer.last_handshake.filter(|at| *at > std::time::UNIX_EPOCH),
            rx_bytes: peer.rx_bytes,
            tx_bytes: peer.tx_bytes,
        })
        .collect();
    peers.sort_by(|a, b| a.public_key.cmp(&b.public_key));
    uapi::Device { listen_port: Some(host.listen_port), peers }
}

/// One netlink operation a `set` body turns into.
#[derive(Debug, Clone, PartialEq)]
pub enum Operation {
    Remove(String),
    /// Add the peer or update it in place (the kernel keeps its session):
    /// endpoint and keepalive only when given, the full allowed-IP list
    /// always (the crate always sends "replace allowed IPs").
    Upsert { public_key: String, endpoint: Option<std::net::SocketAddr>, persistent_keepalive: Option<u16>, allowed_ips: Vec<String> },
}

/// Turns a `set` body into netlink operations against the device as it is
/// (`current`). Peers the body does not name are not touched. A change of
/// the private key or a peer replacement is refused: the agent sets the
/// key only when it creates the link, and never replaces all peers.
pub fn operations(request: &SetRequest, current: &uapi::Device) -> Result<Vec<Operation>, KernelError> {
    if request.private_key.is_some() || request.replace_peers {
        return Err(KernelError::Unsupported("the private key and the whole peer set are set only when the link is created".into()));
    }
    if let (Some(want), Some(have)) = (request.listen_port, current.listen_port) {
        // Setting the same port again is how the UAPI path makes
        // wireguard-go rebind; the kernel needs no rebind (it drops a cached
        // source address that is no longer the host's by itself).
        if want != have {
            return Err(KernelError::Unsupported(format!("moving the listen port from {have} to {want}")));
        }
    }
    let mut known: HashMap<&str, Vec<String>> =
        current.peers.iter().map(|p| (p.public_key.as_str(), p.allowed_ips.clone())).collect();
    let mut operations = Vec::new();
    for change in &request.peers {
        let PeerChange { public_key, remove, update_only, endpoint, persistent_keepalive, replace_allowed_ips, allowed_ips } = change;
        if *remove {
            if known.remove(public_key.as_str()).is_some() {
                operations.push(Operation::Remove(public_key.clone()));
            }
            continue;
        }
        let existing = known.get(public_key.as_str()).cloned();
        if *update_only && existing.is_none() {
            continue;
        }
        let mut ips = if *replace_allowed_ips { Vec::new() } else { existing.unwrap_or_default() };
        for ip in allowed_ips {
            if !ips.contains(ip) {
                ips.push(ip.clone());
            }
        }
        known.insert(public_key.as_str(), ips.clone());
        operations.push(Operation::Upsert {
            public_key: public_key.clone(),
            endpoint: *endpoint,
            persistent_keepalive: *persistent_keepalive,
            allowed_ips: ips,
        });
    }
    Ok(operations)
}

/// Applies a UAPI `set` body to the kernel device, one peer per netlink
/// message (the crate's way of staying under the message size).
pub async fn set(interface: &str, body: &str) -> Result<(), KernelError> {
    let request = uapi::parse_set(body)?;
    let current = get(interface).await?;
    let operations = operations(&request, &current)?;
    enum Message {
        Remove(Key),
        Set(Peer),
    }
    let mut messages = Vec::new();
    for operation in operations {
        messages.push(match operation {
            Operation::Remove(key) => Message::Remove(parse_key(&key)?),
            Operation::Upsert { public_key, endpoint, persistent_keepalive, allowed_ips } => {
                let mut peer = Peer::new(parse_key(&public_key)?);
                peer.endpoint = endpoint;
                peer.persistent_keepalive_interval = persistent_keepalive;
                peer.allowed_ips = allowed_ips
                    .iter()
                    .map(|ip| ip.parse().map_err(|_| KernelError::Unsupported(format!("allowed IP {ip}"))))
                    .collect::<Result<_, _>>()?;
                Message::Set(peer)
            }
        });
    }
    if messages.is_empty() {
        return Ok(());
    }
    with_api(interface, move |api| {
        for message in &messages {
            match message {
                Message::Set(peer) => api.configure_peer(peer)?,
                Message::Remove(key) => api.remove_peer(key)?,
            }
        }
        Ok(())
    })
    .await
}

fn parse_key(hex: &str) -> Result<Key, KernelError> {
    Key::decode(hex).map_err(|_| KernelError::Unsupported("a public key that is not 32 bytes of hex".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(c: char) -> String {
        c.to_string().repeat(64)
    }

    fn current() -> uapi::Device {
        uapi::Device {
            listen_port: Some(51820),
            peers: vec![
                PeerState { public_key: key('a'), allowed_ips: vec!["10.77.0.2/32".into()], persistent_keepalive: 25, ..Default::default() },
                PeerState { public_key: key('b'), allowed_ips: vec!["10.77.0.3/32".into()], persistent_keepalive: 25, ..Default::default() },
            ],
        }
    }

    #[test]
    fn a_set_body_becomes_per_peer_operations_that_keep_unnamed_peers() {
        // The body the convergence writes: remove a, move b's endpoint
        // without naming its allowed IPs, add c.
        let body = format!(
            "public_key={a}\nremove=true\npublic_key={b}\nupdate_only=true\nendpoint=192.0.2.9:51820\n\
             public_key={c}\nendpoint=192.0.2.5:51820\npersistent_keepalive_interval=25\nreplace_allowed_ips=true\nallowed_ip=10.77.0.5/32\n\
             public_key={d}\nupdate_only=true\nendpoint=192.0.2.6:51820\n",
            a = key('a'),
            b = key('b'),
            c = key('c'),
            d = key('d'),
        );
        let ops = operations(&uapi::parse_set(&body).unwrap(), &current()).unwrap();
        assert_eq!(
            ops,
            vec![
                Operation::Remove(key('a')),
                // b keeps its allowed IPs: the crate replaces them, so the
                // current list is sent again.
                Operation::Upsert {
                    public_key: key('b'),
                    endpoint: Some("192.0.2.9:51820".parse().unwrap()),
                    persistent_keepalive: None,
                    allowed_ips: vec!["10.77.0.3/32".into()],
                },
                Operation::Upsert {
                    public_key: key('c'),
                    endpoint: Some("192.0.2.5:51820".parse().unwrap()),
                    persistent_keepalive: Some(25),
                    allowed_ips: vec!["10.77.0.5/32".into()],
                },
                // d is update_only and unknown: skipped, as the UAPI does.
            ]
        );
    }

    #[test]
    fn the_rebind_is_a_no_op_and_key_or_port_changes_are_refused() {
        assert_eq!(operations(&uapi::parse_set("listen_port=51820\n").unwrap(), &current()).unwrap(), vec![]);
        assert!(operations(&uapi::parse_set("listen_port=51821\n").unwrap(), &current()).is_err());
        let private = format!("private_key={}\n", key('e'));
        assert!(operations(&uapi::parse_set(&private).unwrap(), &current()).is_err());
        assert!(operations(&uapi::parse_set("replace_peers=true\n").unwrap(), &current()).is_err());
        // Removing a peer the device does not have is nothing to do.
        let gone = format!("public_key={}\nremove=true\n", key('f'));
        assert_eq!(operations(&uapi::parse_set(&gone).unwrap(), &current()).unwrap(), vec![]);
    }

    #[test]
    fn the_kernel_view_becomes_the_shared_device_model() {
        let mut host = Host::new(51820, Key::decode(key('e')).unwrap());
        let mut peer = Peer::new(Key::decode(key('a')).unwrap());
        peer.endpoint = Some("192.0.2.2:51820".parse().unwrap());
        peer.allowed_ips = vec!["10.77.0.2/32".parse().unwrap()];
        peer.persistent_keepalive_interval = Some(25);
        peer.last_handshake = Some(std::time::UNIX_EPOCH);
        peer.rx_bytes = 7;
        host.peers.insert(peer.public_key.clone(), peer);
        let device = device_of(&host);
        assert_eq!(device.listen_port, Some(51820));
        assert_eq!(
            device.peers,
            vec![PeerState {
                public_key: key('a'),
                endpoint: Some("192.0.2.2:51820".parse().unwrap()),
                allowed_ips: vec!["10.77.0.2/32".into()],
                persistent_keepalive: 25,
                last_handshake: None,
                rx_bytes: 7,
                tx_bytes: 0,
            }]
        );
    }
}
