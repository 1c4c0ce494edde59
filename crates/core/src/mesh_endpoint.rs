//! Which WireGuard endpoints a node may announce (at join or in a
//! heartbeat). Every peer sends handshakes to what a node announces, so an
//! endpoint is also a way to make the whole cluster send packets somewhere:
//! to a cloud metadata service (169.254.169.254), to the peers' own
//! loopback, or into the mesh itself. Refused unless the operator allowed
//! that exact endpoint (`--mesh-allow-endpoint`):
//!
//! - unspecified (`0.0.0.0`, `::`), loopback, link-local, multicast and
//!   broadcast addresses, and IPv4-mapped forms of them;
//! - addresses inside the mesh's own range (10.77.0.0/16);
//! - ports below 1024 (WireGuard needs none, and they are where a
//!   redirected handshake would reach a real service);
//! - host names, unless the cluster allows them (`--mesh-endpoint-names`):
//!   a name is resolved by every peer, at a time nobody chose.
//!
//! The syntax (`host:port`) is checked by the protocol crate first.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// The operator's exceptions to the rules above.
#[derive(Debug, Clone, Default)]
pub struct EndpointPolicy {
    /// Exact `host:port` endpoints accepted whatever they are.
    pub allowed: Vec<String>,
    /// Host names accepted (resolved by each peer).
    pub names: bool,
}

/// The mesh's range: 10.77.0.0/16.
fn in_mesh(v4: Ipv4Addr) -> bool {
    let [a, b, _, _] = v4.octets();
    a == 10 && b == 77
}

fn refused_v4(v4: Ipv4Addr) -> Option<&'static str> {
    if v4.is_unspecified() {
        Some("is the unspecified address")
    } else if v4.is_loopback() {
        Some("is a loopback address")
    } else if v4.is_link_local() {
        Some("is a link-local address (such as a cloud metadata service)")
    } else if v4.is_multicast() || v4.is_broadcast() {
        Some("is a multicast or broadcast address")
    } else if in_mesh(v4) {
        Some("is inside the mesh's own range 10.77.0.0/16")
    } else {
        None
    }
}

fn refused_v6(v6: Ipv6Addr) -> Option<&'static str> {
    if let Some(v4) = v6.to_ipv4_mapped() {
        return refused_v4(v4);
    }
    if v6.is_unspecified() {
        Some("is the unspecified address")
    } else if v6.is_loopback() {
        Some("is a loopback address")
    } else if v6.is_unicast_link_local() {
        Some("is a link-local address")
    } else if v6.is_multicast() {
        Some("is a multicast address")
    } else {
        None
    }
}

impl EndpointPolicy {
    /// Why `endpoint` may not be announced, or `None` when it may. The
    /// endpoint is `host:port` as the protocol crate validated it.
    pub fn refusal(&self, endpoint: &str) -> Option<String> {
        if self.allowed.iter().any(|allowed| allowed.eq_ignore_ascii_case(endpoint)) {
            return None;
        }
        let (host, port) = endpoint.rsplit_once(':')?;
        let port: u16 = port.parse().ok()?;
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let reason = match host.parse::<IpAddr>() {
            Ok(IpAddr::V4(v4)) => refused_v4(v4),
            Ok(IpAddr::V6(v6)) => refused_v6(v6),
            Err(_) if !self.names => Some("is a host name, and this cluster takes addresses only"),
            Err(_) => None,
        };
        if let Some(reason) = reason {
            return Some(format!(
                "mesh endpoint {endpoint} is refused: {host} {reason} (an operator can allow it with --mesh-allow-endpoint {endpoint})"
            ));
        }
        if port < 1024 {
            return Some(format!(
                "mesh endpoint {endpoint} is refused: port {port} is below 1024 (an operator can allow it with --mesh-allow-endpoint {endpoint})"
            ));
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dangerous_endpoints_are_refused_and_ordinary_ones_pass() {
        let policy = EndpointPolicy::default();
        for bad in [
            "169.254.169.254:80",
            "169.254.169.254:51820",
            "0.0.0.0:1",
            "0.0.0.0:51820",
            "[::1]:51820",
            "[::]:51820",
            "127.0.0.1:51820",
            "127.8.9.1:51820",
            "[fe80::1]:51820",
            "224.0.0.1:51820",
            "255.255.255.255:51820",
            "[ff02::1]:51820",
            "10.77.0.1:51820",
            "10.77.200.3:51820",
            "[::ffff:127.0.0.1]:51820",
            "[::ffff:169.254.169.254]:51820",
            "203.0.113.5:22",
            "203.0.113.5:443",
            "node.example.com:51820",
        ] {
            let why = policy.refusal(bad).unwrap_or_else(|| panic!("{bad} was accepted"));
            assert!(why.contains(bad) && why.contains("--mesh-allow-endpoint"), "{why}");
        }
        for good in ["203.0.113.5:51820", "192.0.2.11:51820", "10.0.0.4:51820", "192.168.1.9:40000", "[2001:db8::5]:51820"] {
            assert_eq!(policy.refusal(good), None, "{good}");
        }
    }

    #[test]
    fn the_operator_allows_exact_endpoints_and_names() {
        let policy = EndpointPolicy { allowed: vec!["127.0.0.1:51820".into(), "203.0.113.5:443".into()], names: false };
        assert_eq!(policy.refusal("127.0.0.1:51820"), None);
        assert_eq!(policy.refusal("203.0.113.5:443"), None);
        assert!(policy.refusal("127.0.0.1:51821").is_some(), "only the exact endpoint");
        let names = EndpointPolicy { allowed: vec![], names: true };
        assert_eq!(names.refusal("node.example.com:51820"), None);
        assert!(names.refusal("node.example.com:80").is_some(), "the port rule still holds for names");
        assert!(names.refusal("127.0.0.1:51820").is_some(), "names do not open addresses");
    }
}
