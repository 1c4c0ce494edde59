//! The difference between the peers the control plane lists and the peers
//! the device has, as one UAPI `set` body. Peers that did not change get no
//! line at all, so their sessions and counters go on untouched.

use std::collections::{HashMap, HashSet};
use std::fmt::Write;
use std::net::SocketAddr;

use super::uapi::Device;

/// Seconds between keepalives towards every peer: keeps a NAT mapping
/// open (most expire UDP state after 30 s or more) and makes handshakes
/// happen without application traffic.
pub const KEEPALIVE_SECONDS: u16 = 25;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DesiredPeer {
    /// Lowercase hex, as the device names it.
    pub public_key: String,
    /// Resolved endpoint; `None` for a node without one (behind NAT): it
    /// reaches us, and the device learns its address from its packets.
    pub endpoint: Option<SocketAddr>,
    /// `10.77.x.y/32` first; on the relay's entry (for a node behind NAT)
    /// also the `/32`s of the peers reached through it. WireGuard routes by
    /// these, so each address is on one peer only.
    pub allowed_ips: Vec<String>,
}

#[derive(Debug, Default, PartialEq, Eq)]
pub struct Plan {
    pub body: String,
    pub added: usize,
    pub updated: usize,
    pub removed: usize,
}

impl Plan {
    pub fn is_empty(&self) -> bool {
        self.body.is_empty()
    }
}

/// `applied` holds the endpoint this agent last set per peer. An endpoint
/// is written only when the control plane's value changed since then (or
/// the peer is new): the device updates a peer's endpoint by itself when
/// authenticated packets come from a new address (roaming), and writing
/// back a stale value would break that.
pub fn plan(desired: &[DesiredPeer], current: &Device, applied: &HashMap<String, Option<SocketAddr>>) -> Plan {
    let mut plan = Plan::default();
    let wanted: HashSet<&str> = desired.iter().map(|p| p.public_key.as_str()).collect();
    for peer in &current.peers {
        if !wanted.contains(peer.public_key.as_str()) {
            let _ = writeln!(plan.body, "public_key={}\nremove=true", peer.public_key);
            plan.removed += 1;
        }
    }
    for want in desired {
        let Some(have) = current.peers.iter().find(|p| p.public_key == want.public_key) else {
            let _ = writeln!(plan.body, "public_key={}", want.public_key);
            if let Some(endpoint) = want.endpoint {
                let _ = writeln!(plan.body, "endpoint={endpoint}");
            }
            let _ = writeln!(plan.body, "persistent_keepalive_interval={KEEPALIVE_SECONDS}");
            allowed_ip_lines(&mut plan.body, &want.allowed_ips);
            plan.added += 1;
            continue;
        };
        let mut lines = String::new();
        let endpoint_changed = applied.get(&want.public_key) != Some(&want.endpoint);
        if let Some(endpoint) = want.endpoint {
            if endpoint_changed && have.endpoint != Some(endpoint) {
                let _ = writeln!(lines, "endpoint={endpoint}");
            }
        }
        if have.persistent_keepalive != KEEPALIVE_SECONDS {
            let _ = writeln!(lines, "persistent_keepalive_interval={KEEPALIVE_SECONDS}");
        }
        let mut have_ips: Vec<&str> = have.allowed_ips.iter().map(String::as_str).collect();
        let mut want_ips: Vec<&str> = want.allowed_ips.iter().map(String::as_str).collect();
        have_ips.sort_unstable();
        want_ips.sort_unstable();
        if have_ips != want_ips {
            allowed_ip_lines(&mut lines, &want.allowed_ips);
        }
        if !lines.is_empty() {
            let _ = writeln!(plan.body, "public_key={}\nupdate_only=true", want.public_key);
            plan.body.push_str(&lines);
            plan.updated += 1;
        }
    }
    plan
}

fn allowed_ip_lines(body: &mut String, ips: &[String]) {
    body.push_str("replace_allowed_ips=true\n");
    for ip in ips {
        let _ = writeln!(body, "allowed_ip={ip}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mesh::uapi::PeerState;

    fn key(c: char) -> String {
        c.to_string().repeat(64)
    }

    fn desired(c: char, endpoint: Option<&str>, ip: &str) -> DesiredPeer {
        DesiredPeer { public_key: key(c), endpoint: endpoint.map(|e| e.parse().unwrap()), allowed_ips: vec![format!("{ip}/32")] }
    }

    fn state(c: char, endpoint: Option<&str>, ip: &str) -> PeerState {
        PeerState {
            public_key: key(c),
            endpoint: endpoint.map(|e| e.parse().unwrap()),
            allowed_ips: vec![format!("{ip}/32")],
            persistent_keepalive: KEEPALIVE_SECONDS,
            ..Default::default()
        }
    }

    #[test]
    fn adds_updates_and_removes_only_what_changed() {
        let current = Device {
            listen_port: Some(51820),
            peers: vec![
                state('a', Some("192.0.2.2:51820"), "10.77.0.2"),
                state('b', Some("192.0.2.3:51820"), "10.77.0.3"),
                state('c', None, "10.77.0.4"),
            ],
        };
        let applied: HashMap<_, _> = [
            (key('a'), Some("192.0.2.2:51820".parse().unwrap())),
            (key('b'), Some("192.0.2.3:51820".parse().unwrap())),
        ]
        .into();
        let want = vec![
            desired('a', Some("192.0.2.2:51820"), "10.77.0.2"),  // unchanged
            desired('b', Some("192.0.2.9:51820"), "10.77.0.3"),  // endpoint moved
            desired('d', Some("192.0.2.5:51820"), "10.77.0.5"),  // new
        ];
        let plan = plan(&want, &current, &applied);
        assert_eq!((plan.added, plan.updated, plan.removed), (1, 1, 1));
        assert!(!plan.body.contains(&key('a')), "an unchanged peer is not touched:\n{}", plan.body);
        assert!(plan.body.contains(&format!("public_key={}\nremove=true\n", key('c'))));
        assert!(plan.body.contains(&format!("public_key={}\nupdate_only=true\nendpoint=192.0.2.9:51820\n", key('b'))));
        assert!(plan.body.contains(&format!(
            "public_key={}\nendpoint=192.0.2.5:51820\npersistent_keepalive_interval=25\nreplace_allowed_ips=true\nallowed_ip=10.77.0.5/32\n",
            key('d')
        )));
    }

    #[test]
    fn a_roamed_endpoint_is_kept_while_the_control_plane_value_stays() {
        // The device learned 198.51.100.7 from the peer's packets; the
        // control plane still says 192.0.2.2, which we applied before.
        let current = Device { listen_port: None, peers: vec![state('a', Some("198.51.100.7:40000"), "10.77.0.2")] };
        let applied: HashMap<_, _> = [(key('a'), Some("192.0.2.2:51820".parse().unwrap()))].into();
        let want = vec![desired('a', Some("192.0.2.2:51820"), "10.77.0.2")];
        assert!(plan(&want, &current, &applied).is_empty());
        // After a restart nothing was applied yet: the listed value is set.
        let fresh = plan(&want, &current, &HashMap::new());
        assert_eq!(fresh.updated, 1);
        assert!(fresh.body.contains("endpoint=192.0.2.2:51820"));
    }

    #[test]
    fn a_moved_mesh_address_replaces_the_allowed_ips() {
        let current = Device { listen_port: None, peers: vec![state('a', None, "10.77.0.2")] };
        let want = vec![desired('a', None, "10.77.0.9")];
        let plan = plan(&want, &current, &HashMap::new());
        assert_eq!(plan.updated, 1);
        assert!(plan.body.ends_with("update_only=true\nreplace_allowed_ips=true\nallowed_ip=10.77.0.9/32\n"));
        assert!(!plan.body.contains("endpoint="));
    }

    #[test]
    fn relayed_addresses_ride_on_the_relay_and_move_off_it() {
        // a is the relay; c was a peer of its own and is relayed now.
        let current = Device { listen_port: None, peers: vec![state('a', Some("192.0.2.1:51820"), "10.77.0.1"), state('c', None, "10.77.0.4")] };
        let applied: HashMap<_, _> = [(key('a'), Some("192.0.2.1:51820".parse().unwrap())), (key('c'), None)].into();
        let mut relay = desired('a', Some("192.0.2.1:51820"), "10.77.0.1");
        relay.allowed_ips.push("10.77.0.4/32".into());
        let plan = plan(&[relay.clone()], &current, &applied);
        assert_eq!((plan.added, plan.updated, plan.removed), (0, 1, 1));
        assert!(plan.body.contains(&format!("public_key={}\nremove=true\n", key('c'))));
        assert!(plan.body.ends_with(&format!(
            "public_key={}\nupdate_only=true\nreplace_allowed_ips=true\nallowed_ip=10.77.0.1/32\nallowed_ip=10.77.0.4/32\n",
            key('a')
        )));
        // Same set in another order: nothing to do.
        let mut have = state('a', Some("192.0.2.1:51820"), "10.77.0.4");
        have.allowed_ips.push("10.77.0.1/32".into());
        let settled = Device { listen_port: None, peers: vec![have] };
        assert!(super::plan(&[relay], &settled, &applied).is_empty());
        // c gained an endpoint: its own peer again, off the relay.
        let back = vec![desired('a', Some("192.0.2.1:51820"), "10.77.0.1"), desired('c', Some("192.0.2.4:51820"), "10.77.0.4")];
        let plan = super::plan(&back, &settled, &applied);
        assert_eq!((plan.added, plan.updated, plan.removed), (1, 1, 0));
        assert!(plan.body.contains("update_only=true\nreplace_allowed_ips=true\nallowed_ip=10.77.0.1/32\n"));
        assert!(plan.body.contains("endpoint=192.0.2.4:51820\npersistent_keepalive_interval=25\nreplace_allowed_ips=true\nallowed_ip=10.77.0.4/32\n"));
    }
}
