//! The node's identity on disk: private key, client certificate, the cluster
//! CA and the node id. Every file is created with mode 0600; the private key
//! is generated here and never leaves the node.

use std::fs;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub const KEY_FILE: &str = "node.key";
pub const CERT_FILE: &str = "node.crt";
pub const CA_FILE: &str = "ca.crt";
pub const NODE_FILE: &str = "node.json";

#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    #[error("cannot read or write {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path} is not valid: {reason}")]
    Invalid { path: PathBuf, reason: String },
    #[error("this node has not joined a cluster yet (no {0}); run `cloudweb-agent join` first")]
    NotJoined(PathBuf),
    #[error("this node already joined as {node_id}; run `cloudweb-agent leave` before joining again")]
    AlreadyJoined { node_id: String },
}

/// `node.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeInfo {
    pub node_id: String,
    pub name: String,
    /// `https://host:port` of the control plane's agent listener.
    pub server: String,
    pub mesh_address: String,
    pub ingress: bool,
}

/// Everything needed to talk to the control plane after joining.
#[derive(Debug, Clone)]
pub struct Identity {
    pub info: NodeInfo,
    pub key_pem: String,
    pub cert_pem: String,
    pub ca_pem: String,
}

impl Identity {
    pub fn load(dir: &Path) -> Result<Identity, IdentityError> {
        let node_path = dir.join(NODE_FILE);
        if !node_path.exists() {
            return Err(IdentityError::NotJoined(node_path));
        }
        let info: NodeInfo = serde_json::from_str(&read(&node_path)?)
            .map_err(|e| IdentityError::Invalid { path: node_path.clone(), reason: e.to_string() })?;
        Ok(Identity {
            info,
            key_pem: read(&dir.join(KEY_FILE))?,
            cert_pem: read(&dir.join(CERT_FILE))?,
            ca_pem: read(&dir.join(CA_FILE))?,
        })
    }

    /// Refuses to overwrite an existing identity.
    pub fn ensure_absent(dir: &Path) -> Result<(), IdentityError> {
        match Identity::load(dir) {
            Ok(existing) => Err(IdentityError::AlreadyJoined { node_id: existing.info.node_id }),
            Err(_) => Ok(()),
        }
    }

    pub fn save(&self, dir: &Path) -> Result<(), IdentityError> {
        fs::create_dir_all(dir).map_err(|source| IdentityError::Io { path: dir.to_path_buf(), source })?;
        write_private(&dir.join(KEY_FILE), self.key_pem.as_bytes())?;
        write_private(&dir.join(CERT_FILE), self.cert_pem.as_bytes())?;
        write_private(&dir.join(CA_FILE), self.ca_pem.as_bytes())?;
        let info = serde_json::to_vec_pretty(&self.info).expect("node info serializes");
        // node.json goes last: its presence means the identity is complete.
        write_private(&dir.join(NODE_FILE), &info)
    }

    /// Deletes the identity files (after leaving the cluster).
    pub fn erase(dir: &Path) -> Result<(), IdentityError> {
        for file in [NODE_FILE, CERT_FILE, KEY_FILE, CA_FILE, crate::mesh::key::KEY_FILE, crate::mesh::status::CACHE_FILE] {
            let path = dir.join(file);
            match fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(source) => return Err(IdentityError::Io { path, source }),
            }
        }
        Ok(())
    }
}

fn read(path: &Path) -> Result<String, IdentityError> {
    fs::read_to_string(path).map_err(|source| IdentityError::Io { path: path.to_path_buf(), source })
}

/// Writes a file that only its owner can read, replacing any old one.
pub fn write_private(path: &Path, contents: &[u8]) -> Result<(), IdentityError> {
    let io = |source| IdentityError::Io { path: path.to_path_buf(), source };
    let tmp = path.with_extension("tmp");
    let _ = fs::remove_file(&tmp);
    let mut file = fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&tmp).map_err(io)?;
    file.write_all(contents).map_err(io)?;
    file.sync_all().map_err(io)?;
    fs::rename(&tmp, path).map_err(io)
}
