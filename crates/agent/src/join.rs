//! `cloudweb-agent join`: generate the TLS key and the WireGuard key pair,
//! pin the CA, spend the token, and store the resulting identity.
//!
//! On a node that already joined and whose certificate has expired (it was
//! offline through its renewal), the same command re-joins: it asks for a
//! certificate under the old node id, so the node keeps its name, mesh
//! address, WireGuard key and instances.

use std::path::Path;

use cloudweb_protocol::JoinRequest;
use rcgen::{CertificateParams, KeyPair};

use crate::client::{ClientError, ControlPlane};
use crate::identity::{Identity, IdentityError, NodeInfo};
use crate::mesh::key::KeyPair as WireguardKey;

#[derive(Debug, thiserror::Error)]
pub enum JoinError {
    #[error(transparent)]
    Identity(#[from] IdentityError),
    #[error(transparent)]
    Client(#[from] ClientError),
    #[error("cannot create a key or CSR: {0}")]
    Key(#[from] rcgen::Error),
    #[error(transparent)]
    WireguardKey(#[from] crate::mesh::key::KeyError),
    #[error("{0}")]
    Input(String),
}

pub struct JoinOptions<'a> {
    pub server: &'a str,
    pub token: &'a str,
    pub ca_sha256: [u8; 32],
    pub data_dir: &'a Path,
    pub ingress: bool,
    pub name: Option<String>,
    pub hostname: String,
    pub endpoint: Option<String>,
    pub protocol: u32,
}

pub async fn join(options: JoinOptions<'_>) -> Result<NodeInfo, JoinError> {
    let previous = Identity::replaceable(options.data_dir)?;
    let wireguard = match &previous {
        Some(_) => WireguardKey::load(options.data_dir).unwrap_or_else(|_| WireguardKey::generate()),
        None => WireguardKey::generate(),
    };
    if let Some(previous) = &previous {
        tracing::info!(node_id = %previous.info.node_id, name = %previous.info.name, "this node's certificate expired; re-joining as the same node");
    }
    let ingress = previous.as_ref().map_or(options.ingress, |p| p.info.ingress);
    let request_for_checks = JoinRequest {
        token: options.token.to_string(),
        csr: String::new(),
        hostname: options.hostname.clone(),
        ingress,
        // Made here, kept in the data dir; only the public half is sent.
        wireguard_public_key: Some(wireguard.public_base64()),
        endpoint: options.endpoint.clone(),
        name: options.name.clone(),
        rejoin: previous.as_ref().map(|p| p.info.node_id.clone()),
    };
    // Same checks as the server, so a typo fails here without using the token.
    request_for_checks.validate().map_err(|e| JoinError::Input(e.to_string()))?;

    let key = KeyPair::generate()?;
    let csr = CertificateParams::default().serialize_request(&key)?.pem()?;
    // Saved before the join, so a node that joined always has its key.
    std::fs::create_dir_all(options.data_dir)
        .map_err(|source| IdentityError::Io { path: options.data_dir.to_path_buf(), source })?;
    wireguard.save(options.data_dir)?;
    let client = ControlPlane::for_join(options.server, options.ca_sha256, options.protocol)?;
    let request = JoinRequest { csr, ..request_for_checks };
    // A join whose answer is lost (the connection drops after the server
    // spent the token) is sent again, same key and CSR: the control plane
    // answers the same request with the same certificate. Only failures
    // without an HTTP answer are retried, three times at most.
    let mut attempt = 1;
    let response = loop {
        match client.join(&request).await {
            Err(err) if err.status().is_none() && attempt < 3 => {
                tracing::warn!(error = %err, attempt, "join got no answer; sending the same request again");
                tokio::time::sleep(std::time::Duration::from_secs(attempt)).await;
                attempt += 1;
            }
            other => break other?,
        }
    };
    let identity = Identity {
        info: NodeInfo {
            node_id: response.node_id,
            name: response.name,
            server: options.server.trim_end_matches('/').to_string(),
            mesh_address: response.mesh_address,
            ingress,
        },
        key_pem: key.serialize_pem(),
        cert_pem: response.certificate,
        ca_pem: response.ca,
    };
    identity.save(options.data_dir)?;
    Ok(identity.info)
}
