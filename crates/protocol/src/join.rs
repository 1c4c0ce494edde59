//! `POST /agent/v1/join` and `GET /agent/v1/peers`.

use serde::{Deserialize, Serialize};

use crate::validate::{self, ValidationError};

/// Largest CSR (PEM) the server will parse.
pub const MAX_CSR_LEN: usize = 16 * 1024;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JoinRequest {
    pub token: String,
    /// PKCS#10 request in PEM. Only its public key is used.
    pub csr: String,
    pub hostname: String,
    #[serde(default)]
    pub ingress: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wireguard_public_key: Option<String>,
    /// `host:port` where other nodes reach this node's WireGuard.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    /// Display name; the hostname is used when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The id of the node this machine was before, for a node whose client
    /// certificate expired while it was offline: with a valid token it gets
    /// a new certificate under the same id, name and instances. Absent on
    /// a first join (and from agents older than 0.2.0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rejoin: Option<String>,
}

impl JoinRequest {
    pub fn validate(&self) -> Result<(), ValidationError> {
        validate::token("token", &self.token, 128)?;
        if self.csr.len() > MAX_CSR_LEN {
            return Err(ValidationError::new("csr", "longer than 16 KiB"));
        }
        validate::hostname("hostname", &self.hostname)?;
        if let Some(name) = &self.name {
            validate::node_name("name", name)?;
        }
        if let Some(key) = &self.wireguard_public_key {
            validate::wireguard_key("wireguard_public_key", key)?;
        }
        if let Some(endpoint) = &self.endpoint {
            validate::endpoint("endpoint", endpoint)?;
        }
        if let Some(node_id) = &self.rejoin {
            validate::node_id("rejoin", node_id)?;
        }
        Ok(())
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JoinResponse {
    pub node_id: String,
    pub name: String,
    /// The node's client certificate (PEM), signed by the cluster CA.
    pub certificate: String,
    /// The cluster CA certificate (PEM).
    pub ca: String,
    pub peers: Vec<Peer>,
    /// This node's address on the WireGuard mesh.
    pub mesh_address: String,
}

/// Another node of the WireGuard mesh.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Peer {
    pub node_id: String,
    pub name: String,
    pub mesh_address: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wireguard_public_key: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    /// Set when neither this node nor the one the list is for has an
    /// endpoint (both behind NAT): the `node_id` of the relay node through
    /// which it is reached. Such a peer is not a WireGuard peer of its own;
    /// its address is one of the relay's allowed IPs. Absent from servers
    /// older than 0.2.0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub via: Option<String>,
    /// On the relay's own entry: the `10.77.x.y/32` of every peer reached
    /// through it, to be allowed on its tunnel besides its own address.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub relayed_ips: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerList {
    pub peers: Vec<Peer>,
    /// True for the relay node while two or more nodes without an
    /// endpoint exist: it forwards between them on its mesh interface.
    /// Absent (false) from servers older than 0.2.0.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub relay: bool,
}
