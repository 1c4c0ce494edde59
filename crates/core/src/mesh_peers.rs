//! The mesh's peer lists: which members each node tunnels to directly, and
//! the relay for members behind NAT. Pure functions over what the live
//! registry (`live`) knows of each member.

/// A node with a WireGuard key, as the peer list sees it.
#[derive(Debug, Clone, Copy)]
pub struct MeshMember<'a> {
    pub id: &'a str,
    pub name: &'a str,
    pub mesh_index: i64,
    pub public_key: &'a str,
    pub endpoint: Option<&'a str>,
}

/// A member with an endpoint, as the relay choice sees it.
#[derive(Debug, Clone, Copy)]
pub struct RelayCandidate<'a> {
    pub id: &'a str,
    pub mesh_index: i64,
    /// Heartbeating (ready or draining; not unreachable).
    pub up: bool,
    /// Announces [`cloudweb_protocol::features::MESH_RELAY`] (a 0.1.0
    /// agent ignores the `relay` flag).
    pub can_relay: bool,
}

/// The relay for members behind NAT, among members with an endpoint: the
/// previous relay while it is up (and can relay, or no up member can);
/// otherwise the up member that can relay with the lowest mesh index (so
/// the choice is stable), then any up member; when none is up, the
/// previous one if it is still a candidate, else the lowest.
pub fn choose_relay<'a>(candidates: &[RelayCandidate<'a>], previous: Option<&str>) -> Option<&'a str> {
    let lowest = |keep: &dyn Fn(&RelayCandidate<'a>) -> bool| candidates.iter().filter(|c| keep(c)).min_by_key(|c| c.mesh_index).map(|c| c.id);
    let any_able = candidates.iter().any(|c| c.up && c.can_relay);
    if let Some(previous) = candidates.iter().find(|c| Some(c.id) == previous) {
        if previous.up && (previous.can_relay || !any_able) {
            return Some(previous.id);
        }
    }
    lowest(&|c| c.up && c.can_relay)
        .or_else(|| lowest(&|c| c.up))
        .or_else(|| candidates.iter().find(|c| Some(c.id) == previous).map(|c| c.id))
        .or_else(|| lowest(&|_| true))
}

/// The peer list of node `node_id`: every other member, by mesh address.
///
/// Two members without an endpoint (behind NAT) cannot open a tunnel to
/// each other, so for a node without one every other such node is listed
/// with `via` = `relay` (a member with an endpoint, see [`choose_relay`]),
/// whose own entry carries their `/32`s in `relayed_ips`. The relay's list
/// says `relay` while there are two or more such nodes. Nodes with an
/// endpoint, and everyone when there is no relay, get the plain full mesh.
pub fn peer_list(members: &[MeshMember<'_>], node_id: &str, relay: Option<&str>) -> cloudweb_protocol::PeerList {
    let mut members: Vec<MeshMember<'_>> = members.to_vec();
    members.sort_by_key(|m| m.mesh_index);
    let relay = relay.and_then(|id| members.iter().find(|m| m.id == id && m.endpoint.is_some())).map(|m| m.id);
    let natted: Vec<&MeshMember<'_>> = members.iter().filter(|m| m.endpoint.is_none()).collect();
    let me_natted = natted.iter().any(|m| m.id == node_id);
    let relayed: Vec<&MeshMember<'_>> = match relay {
        Some(_) if me_natted => natted.into_iter().filter(|m| m.id != node_id).collect(),
        _ => Vec::new(),
    };
    let is_relay = relay == Some(node_id) && natted_count(&members) >= 2;
    let peers = members
        .iter()
        .filter(|m| m.id != node_id)
        .map(|m| {
            let via = relayed.iter().any(|r| r.id == m.id).then(|| relay.expect("relayed only with a relay").to_string());
            let relayed_ips = if Some(m.id) == relay { relayed.iter().map(|r| format!("{}/32", crate::mesh_address(r.mesh_index))).collect() } else { Vec::new() };
            cloudweb_protocol::Peer {
                node_id: m.id.to_string(),
                name: m.name.to_string(),
                mesh_address: crate::mesh_address(m.mesh_index),
                wireguard_public_key: Some(m.public_key.to_string()),
                endpoint: m.endpoint.map(str::to_string),
                via,
                relayed_ips,
            }
        })
        .collect();
    cloudweb_protocol::PeerList { peers, relay: is_relay }
}

fn natted_count(members: &[MeshMember<'_>]) -> usize {
    members.iter().filter(|m| m.endpoint.is_none()).count()
}
