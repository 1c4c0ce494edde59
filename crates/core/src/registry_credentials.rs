//! One registry credential per node, so removing a node also takes away
//! its access to the cluster registry. A node's password is generated the
//! first time the node asks for the registry settings, kept sealed (context
//! `registry-password:<node id>`) in `<data-dir>/registry/nodes/<node
//! id>.sealed` together with its bcrypt hash, and listed in the registry's
//! htpasswd file while the node is registered.
//!
//! The Docker distribution registry Debian ships (2.8) reads htpasswd once,
//! at start, so every change of the file is followed by a restart of the
//! registry: each write of the file gets a version number and wakes the
//! supervisor, which restarts the registry and reports which version the
//! running registry loaded. A node is handed its password only once the
//! running registry has loaded every version written so far. Changes
//! happen only when a node gets its first credential or is removed.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rand::Rng;
use serde::{Deserialize, Serialize};
use tokio::sync::{watch, Mutex, Notify};

use crate::ca::write_private;
use crate::secrets::Sealer;

/// How long a new node waits for the registry to restart with its entry.
const RESTART_WAIT: Duration = Duration::from_secs(20);

#[derive(Debug, thiserror::Error)]
pub enum CredentialError {
    #[error("registry credentials in {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("registry credentials: {0}")]
    Hash(String),
    #[error("node id {0:?} cannot name a registry user")]
    BadNodeId(String),
}

#[derive(Serialize, Deserialize)]
struct Stored {
    password: String,
    /// bcrypt of the password, so htpasswd can be rewritten without
    /// hashing every node's password again.
    hash: String,
}

pub struct Credentials {
    dir: PathBuf,
    htpasswd: PathBuf,
    sealer: Sealer,
    /// Passwords handed out, per node id; serializes every change.
    known: Mutex<HashMap<String, String>>,
    restart: Arc<Notify>,
    /// Versions of htpasswd: the last written, and the one the running
    /// registry loaded.
    written: AtomicU64,
    loaded: watch::Sender<u64>,
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> CredentialError + '_ {
    move |source| CredentialError::Io { path: path.to_path_buf(), source }
}

fn context(node_id: &str) -> String {
    format!("registry-password:{node_id}")
}

/// Node ids become file names and htpasswd user names (`user:hash`).
fn check_node_id(node_id: &str) -> Result<(), CredentialError> {
    let plain = node_id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if node_id.is_empty() || node_id.len() > 64 || !plain {
        return Err(CredentialError::BadNodeId(node_id.to_string()));
    }
    Ok(())
}

impl Credentials {
    /// `registry_dir` is the registry's directory in the data dir.
    pub fn new(registry_dir: &Path, sealer: Sealer) -> Credentials {
        Credentials {
            dir: registry_dir.join("nodes"),
            htpasswd: registry_dir.join("htpasswd"),
            sealer,
            known: Mutex::new(HashMap::new()),
            restart: Arc::new(Notify::new()),
            written: AtomicU64::new(0),
            loaded: watch::channel(0).0,
        }
    }

    pub fn htpasswd_path(&self) -> &Path {
        &self.htpasswd
    }

    /// Woken when htpasswd changed and the registry must restart.
    pub fn restart_signal(&self) -> Arc<Notify> {
        self.restart.clone()
    }

    /// The version of htpasswd a registry started now loads.
    pub fn written_version(&self) -> u64 {
        self.written.load(Ordering::SeqCst)
    }

    /// The registry started with `version` of htpasswd is listening.
    pub fn loaded(&self, version: u64) {
        self.loaded.send_modify(|loaded| *loaded = (*loaded).max(version));
    }

    /// Writes htpasswd for the `registered` nodes and deletes the
    /// credentials of nodes that are gone (removed while the control plane
    /// was down). Called before the registry starts.
    pub async fn prepare(&self, registered: &HashSet<String>) -> Result<(), CredentialError> {
        let mut known = self.known.lock().await;
        known.retain(|node_id, _| registered.contains(node_id));
        std::fs::create_dir_all(&self.dir).map_err(io(&self.dir))?;
        for node_id in self.stored_node_ids()? {
            if !registered.contains(&node_id) {
                let path = self.path(&node_id);
                std::fs::remove_file(&path).map_err(io(&path))?;
            }
        }
        self.write_htpasswd()
    }

    /// The node's registry password, created on first use. It is returned
    /// once the running registry loaded the latest htpasswd (or after
    /// [`RESTART_WAIT`], when the registry is slow to come back).
    pub async fn for_node(&self, node_id: &str) -> Result<String, CredentialError> {
        check_node_id(node_id)?;
        let password = self.get_or_create(node_id).await?;
        let needed = self.written_version();
        let mut loaded = self.loaded.subscribe();
        let _ = tokio::time::timeout(RESTART_WAIT, loaded.wait_for(|loaded| *loaded >= needed)).await;
        Ok(password)
    }

    async fn get_or_create(&self, node_id: &str) -> Result<String, CredentialError> {
        let mut known = self.known.lock().await;
        if let Some(password) = known.get(node_id) {
            return Ok(password.clone());
        }
        if let Some(stored) = self.load(node_id) {
            known.insert(node_id.to_string(), stored.password.clone());
            return Ok(stored.password);
        }
        let bytes: [u8; 24] = rand::rng().random();
        let password = hex::encode(bytes);
        // The password is 192 random bits, so a slow hash adds nothing but
        // latency on every push and pull: the lowest cost will do.
        let hash = bcrypt::hash(&password, 4).map_err(|e| CredentialError::Hash(e.to_string()))?;
        let path = self.path(node_id);
        std::fs::create_dir_all(&self.dir).map_err(io(&self.dir))?;
        let sealed = self.sealer.seal_json(&context(node_id), &Stored { password: password.clone(), hash });
        replace_private(&path, sealed.as_bytes())?;
        self.write_htpasswd()?;
        known.insert(node_id.to_string(), password.clone());
        self.restart.notify_one();
        tracing::info!(node_id, "created the node's registry credential");
        Ok(password)
    }

    /// Deletes the node's credential; the registry refuses it once it has
    /// restarted (within seconds).
    pub async fn revoke(&self, node_id: &str) -> Result<(), CredentialError> {
        if check_node_id(node_id).is_err() {
            return Ok(());
        }
        let mut known = self.known.lock().await;
        known.remove(node_id);
        let path = self.path(node_id);
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(source) => return Err(CredentialError::Io { path, source }),
        }
        self.write_htpasswd()?;
        self.restart.notify_one();
        tracing::info!(node_id, "revoked the node's registry credential");
        Ok(())
    }

    fn path(&self, node_id: &str) -> PathBuf {
        self.dir.join(format!("{node_id}.sealed"))
    }

    fn load(&self, node_id: &str) -> Option<Stored> {
        let sealed = std::fs::read_to_string(self.path(node_id)).ok()?;
        self.sealer.open_json(&context(node_id), sealed.trim()).ok()
    }

    fn stored_node_ids(&self) -> Result<Vec<String>, CredentialError> {
        let entries = std::fs::read_dir(&self.dir).map_err(io(&self.dir))?;
        let mut ids = Vec::new();
        for entry in entries {
            let entry = entry.map_err(io(&self.dir))?;
            let name = entry.file_name();
            if let Some(id) = name.to_str().and_then(|n| n.strip_suffix(".sealed")) {
                if check_node_id(id).is_ok() {
                    ids.push(id.to_string());
                }
            }
        }
        ids.sort();
        Ok(ids)
    }

    /// htpasswd from the stored credentials; a credential that does not
    /// open (another master key) is left out, and the node gets a new one
    /// at its next request.
    fn write_htpasswd(&self) -> Result<(), CredentialError> {
        let mut text = String::new();
        for node_id in self.stored_node_ids()? {
            match self.load(&node_id) {
                Some(stored) => text.push_str(&format!("{node_id}:{}\n", stored.hash)),
                None => {
                    let path = self.path(&node_id);
                    tracing::warn!(node_id, "a stored registry credential does not open; the node gets a new one");
                    std::fs::remove_file(&path).map_err(io(&path))?;
                }
            }
        }
        replace_private(&self.htpasswd, text.as_bytes())?;
        self.written.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

/// Writes through a temporary file and a rename, so the registry never
/// reads half a file.
fn replace_private(path: &Path, contents: &[u8]) -> Result<(), CredentialError> {
    let temporary = path.with_extension("new");
    let _ = std::fs::remove_file(&temporary);
    write_private(&temporary, contents).map_err(|e| CredentialError::Io {
        path: temporary.clone(),
        source: std::io::Error::other(e.to_string()),
    })?;
    std::fs::rename(&temporary, path).map_err(io(path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn one_credential_per_node_listed_while_registered() {
        let dir = tempfile::tempdir().unwrap();
        let sealer = Sealer::load_or_create(dir.path()).unwrap();
        let credentials = Credentials::new(&dir.path().join("registry"), sealer);
        credentials.prepare(&HashSet::new()).await.unwrap();
        let credentials = Arc::new(credentials);
        // A stand-in supervisor: "restarts" at once with the latest file.
        let supervisor = credentials.clone();
        tokio::spawn(async move {
            let signal = supervisor.restart_signal();
            loop {
                signal.notified().await;
                supervisor.loaded(supervisor.written_version());
            }
        });
        let a = credentials.for_node("n_a").await.unwrap();
        let b = credentials.for_node("n_b").await.unwrap();
        assert_ne!(a, b);
        assert_eq!(*credentials.loaded.borrow(), credentials.written_version(), "handed out once loaded");
        assert_eq!(credentials.for_node("n_a").await.unwrap(), a, "stable");
        let htpasswd = std::fs::read_to_string(credentials.htpasswd_path()).unwrap();
        let users: Vec<&str> = htpasswd.lines().map(|l| l.split(':').next().unwrap()).collect();
        assert_eq!(users, ["n_a", "n_b"]);
        let hash = htpasswd.lines().next().unwrap().split_once(':').unwrap().1;
        assert!(bcrypt::verify(&a, hash).unwrap());
        let stored = std::fs::read_to_string(dir.path().join("registry/nodes/n_a.sealed")).unwrap();
        assert!(!stored.contains(&a), "sealed at rest");

        credentials.revoke("n_a").await.unwrap();
        let htpasswd = std::fs::read_to_string(credentials.htpasswd_path()).unwrap();
        assert!(!htpasswd.contains("n_a:") && htpasswd.contains("n_b:"));
        assert!(credentials.for_node("../x").await.is_err());

        // A restart with n_b gone drops it too.
        credentials.prepare(&HashSet::new()).await.unwrap();
        assert_eq!(std::fs::read_to_string(credentials.htpasswd_path()).unwrap(), "");
        assert!(!dir.path().join("registry/nodes/n_b.sealed").exists());
    }
}
