//! The node's identity on disk: private key, client certificate, the cluster
//! CA and the node id. Every file is created with mode 0600; the private key
//! is generated here and never leaves the node.

use std::fs;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::files::{self, FileError};

pub const KEY_FILE: &str = "node.key";
pub const CERT_FILE: &str = "node.crt";
pub const CA_FILE: &str = "ca.crt";
pub const NODE_FILE: &str = "node.json";
/// A renewed key and certificate being put in place (see
/// [`Identity::replace_certificate`]).
pub const NEXT_KEY_FILE: &str = "node.key.next";
pub const NEXT_CERT_FILE: &str = "node.crt.next";

#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    #[error("cannot read or write {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path} is not valid: {reason}")]
    Invalid { path: PathBuf, reason: String },
    #[error("this node has not joined a cluster yet (no {0}); run `cloudweb-agent join` first")]
    NotJoined(PathBuf),
    #[error("this node already joined as {node_id} and its certificate is valid until {not_after}; run `cloudweb-agent leave` before joining again (a re-join is for a node whose certificate expired)")]
    AlreadyJoined { node_id: String, not_after: String },
}

/// The same error, for a file of the data dir handled outside this module.
impl From<FileError> for IdentityError {
    fn from(err: FileError) -> IdentityError {
        match err {
            FileError::Io { path, source } => IdentityError::Io { path, source },
            FileError::Invalid { path, reason } => IdentityError::Invalid { path, reason },
        }
    }
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
        finish_replacement(dir)?;
        let info: NodeInfo = serde_json::from_str(&read(&node_path)?)
            .map_err(|e| IdentityError::Invalid { path: node_path.clone(), reason: e.to_string() })?;
        Ok(Identity {
            info,
            key_pem: read(&dir.join(KEY_FILE))?,
            cert_pem: read(&dir.join(CERT_FILE))?,
            ca_pem: read(&dir.join(CA_FILE))?,
        })
    }

    /// The identity a join may replace: none (a first join), or one whose
    /// certificate has expired (a re-join of the same node, returned).
    /// Refuses to overwrite an identity whose certificate is still valid.
    pub fn replaceable(dir: &Path) -> Result<Option<Identity>, IdentityError> {
        let Ok(existing) = Identity::load(dir) else { return Ok(None) };
        let validity = existing.validity()?;
        if validity.expired_at(std::time::SystemTime::now()) {
            return Ok(Some(existing));
        }
        Err(IdentityError::AlreadyJoined { node_id: existing.info.node_id, not_after: validity.not_after_text() })
    }

    /// When the node certificate starts and ends.
    pub fn validity(&self) -> Result<Validity, IdentityError> {
        Validity::of_pem(&self.cert_pem).ok_or_else(|| IdentityError::Invalid { path: CERT_FILE.into(), reason: "not a certificate".into() })
    }

    /// Puts a renewed key and certificate in place of the current ones.
    /// Both are written beside the old ones first, then renamed key first:
    /// an agent stopped in between finds the pair on its next start
    /// ([`Identity::load`] finishes the renames, or drops an incomplete
    /// pair, whose certificate the control plane has not seen in use).
    pub fn replace_certificate(&mut self, dir: &Path, key_pem: String, cert_pem: String) -> Result<(), IdentityError> {
        let next_key = dir.join(NEXT_KEY_FILE);
        let next_cert = dir.join(NEXT_CERT_FILE);
        // Key first: a next certificate without a next key means the key
        // is already in place.
        write_private(&next_key, key_pem.as_bytes())?;
        write_private(&next_cert, cert_pem.as_bytes())?;
        rename(&next_key, &dir.join(KEY_FILE))?;
        rename(&next_cert, &dir.join(CERT_FILE))?;
        self.key_pem = key_pem;
        self.cert_pem = cert_pem;
        Ok(())
    }

    pub fn save(&self, dir: &Path) -> Result<(), IdentityError> {
        fs::create_dir_all(dir).map_err(|source| IdentityError::Io { path: dir.to_path_buf(), source })?;
        write_private(&dir.join(KEY_FILE), self.key_pem.as_bytes())?;
        write_private(&dir.join(CERT_FILE), self.cert_pem.as_bytes())?;
        write_private(&dir.join(CA_FILE), self.ca_pem.as_bytes())?;
        // A new join may be into another cluster: the replicas kept from
        // an earlier one must not be tried.
        remove_if_present(&dir.join(crate::control_planes::FILE))?;
        let info = serde_json::to_vec_pretty(&self.info).expect("node info serializes");
        // node.json goes last: its presence means the identity is complete.
        write_private(&dir.join(NODE_FILE), &info)
    }

    /// Deletes the identity files (after leaving the cluster).
    pub fn erase(dir: &Path) -> Result<(), IdentityError> {
        for file in [
            NODE_FILE,
            CERT_FILE,
            KEY_FILE,
            CA_FILE,
            NEXT_KEY_FILE,
            NEXT_CERT_FILE,
            files::WIREGUARD_KEY_FILE,
            files::MESH_CACHE_FILE,
            crate::control_planes::FILE,
        ] {
            remove_if_present(&dir.join(file))?;
        }
        Ok(())
    }
}

fn remove_if_present(path: &Path) -> Result<(), IdentityError> {
    match fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(IdentityError::Io { path: path.to_path_buf(), source }),
    }
}

/// The validity of a certificate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Validity {
    pub not_before: std::time::SystemTime,
    pub not_after: std::time::SystemTime,
}

impl Validity {
    pub fn of_pem(pem: &str) -> Option<Validity> {
        use rustls::pki_types::pem::PemObject;
        use x509_parser::prelude::{FromDer, X509Certificate};
        let der = rustls::pki_types::CertificateDer::from_pem_slice(pem.as_bytes()).ok()?;
        let (_, cert) = X509Certificate::from_der(der.as_ref()).ok()?;
        let at = |t: i64| std::time::UNIX_EPOCH + std::time::Duration::from_secs(t.max(0) as u64);
        Some(Validity { not_before: at(cert.validity().not_before.timestamp()), not_after: at(cert.validity().not_after.timestamp()) })
    }

    pub fn expired_at(&self, now: std::time::SystemTime) -> bool {
        now >= self.not_after
    }

    /// When to renew: at two thirds of the certificate's life.
    pub fn renew_at(&self) -> std::time::SystemTime {
        let life = self.not_after.duration_since(self.not_before).unwrap_or_default();
        self.not_before + life * 2 / 3
    }

    pub fn not_after_text(&self) -> String {
        let secs = self.not_after.duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_secs() as i64;
        time::OffsetDateTime::from_unix_timestamp(secs)
            .ok()
            .and_then(|t| t.format(&time::format_description::well_known::Rfc3339).ok())
            .unwrap_or_else(|| format!("{secs} (Unix time)"))
    }
}

/// Completes or drops a replacement that an earlier agent left halfway.
fn finish_replacement(dir: &Path) -> Result<(), IdentityError> {
    let next_key = dir.join(NEXT_KEY_FILE);
    let next_cert = dir.join(NEXT_CERT_FILE);
    match (next_key.exists(), next_cert.exists()) {
        // The key was renamed, the certificate not yet.
        (false, true) => rename(&next_cert, &dir.join(CERT_FILE)),
        // Stopped before any rename: the old pair is whole; drop the new one.
        (true, _) => {
            for path in [next_key, next_cert] {
                match fs::remove_file(&path) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(source) => return Err(IdentityError::Io { path, source }),
                }
            }
            Ok(())
        }
        (false, false) => Ok(()),
    }
}

fn rename(from: &Path, to: &Path) -> Result<(), IdentityError> {
    fs::rename(from, to).map_err(|source| IdentityError::Io { path: to.to_path_buf(), source })
}

fn read(path: &Path) -> Result<String, IdentityError> {
    fs::read_to_string(path).map_err(|source| IdentityError::Io { path: path.to_path_buf(), source })
}

/// [`files::write_private`], with its error as this module's.
fn write_private(path: &Path, contents: &[u8]) -> Result<(), IdentityError> {
    Ok(files::write_private(path, contents)?)
}

#[cfg(test)]
mod erase_tests {
    use super::Identity;
    use crate::control_planes::{Replicas, FILE};

    #[test]
    fn leaving_forgets_the_replicas() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join(FILE);
        let replicas = Replicas::new("https://a:8443", Some(file.clone()));
        replicas.learn(&["https://a:8443".into(), "https://b:8443".into()]);
        assert!(file.exists());
        Identity::erase(dir.path()).unwrap();
        assert!(!file.exists(), "a node that left must not go back to its old cluster's replicas");
    }
}
