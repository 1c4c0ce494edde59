//! The cluster's identity, shared by every control-plane replica of one
//! PostgreSQL database: the CA (certificate and key) and the agent
//! listener's key, whose public-key pin every agent holds.
//!
//! Each is kept sealed with the master key in the `cluster_secrets` table
//! and, as before, as a file under the data dir, which the rest of the
//! control plane reads. At start, [`share`] makes the two agree: what the
//! database holds wins and is written to the data dir (a different local
//! file is kept beside it, renamed, never deleted); what it does not hold
//! yet is offered from the data dir (made there first when missing), and
//! the first replica's offer is the one kept. The master key itself is
//! never in the database: every replica is given the same
//! `<data-dir>/master.key`, and a sealed check value stops a replica
//! started with another key before it could seal anything the others
//! cannot open.
//!
//! On SQLite (one control plane, its state on the same disk as these
//! files) nothing is shared and nothing changes.

use std::path::{Path, PathBuf};

use crate::ca::{self, ClusterCa};
use crate::secrets::Sealer;
use cloudweb_store::{Store, StoreError};

/// The data-dir files every replica must hold the same copy of.
pub const SHARED_FILES: [&str; 3] = [ca::CA_CERT_FILE, ca::CA_KEY_FILE, ca::LISTENER_KEY_FILE];

/// The row whose sealed value proves a replica holds the cluster's master key.
const MASTER_KEY_CHECK: &str = "master-key-check";
const CHECK_VALUE: &[u8] = b"cloud-web master key check v1";

#[derive(Debug, thiserror::Error)]
pub enum SharedSecretsError {
    #[error(
        "the master key in {0} is not the one this database's secrets are sealed with: give every control-plane replica \
         the same master.key (copy it from the first replica's data dir before this one starts)"
    )]
    OtherMasterKey(PathBuf),
    #[error("the cluster secret {name} in the database cannot be opened: {reason}")]
    Unreadable { name: String, reason: String },
    #[error("cannot write {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error(transparent)]
    Ca(#[from] ca::CaError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// What [`share`] did, for the start-up log.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Shared {
    /// Files written from the database's copy.
    pub taken: Vec<&'static str>,
    /// Files this replica stored first.
    pub offered: Vec<&'static str>,
}

fn context(name: &str) -> String {
    format!("cluster-secret:{name}")
}

/// Makes the data dir's shared files and the database's copies agree (see
/// the module's text). Runs before the CA is loaded; `stamp` names a kept
/// local file that the database's copy replaced.
pub async fn share(store: &Store, sealer: &Sealer, data_dir: &Path, stamp: &str, now: time::OffsetDateTime) -> Result<Shared, SharedSecretsError> {
    let mut shared = Shared::default();
    let held = store.cluster_secrets().await?;
    let open = |name: &str, sealed: &str| {
        sealer.open(&context(name), sealed).map_err(|err| SharedSecretsError::Unreadable { name: name.to_string(), reason: err.to_string() })
    };
    if let Some((_, sealed)) = held.iter().find(|(name, _)| name == MASTER_KEY_CHECK) {
        if sealer.open(&context(MASTER_KEY_CHECK), sealed).ok().as_deref() != Some(CHECK_VALUE) {
            return Err(SharedSecretsError::OtherMasterKey(data_dir.join(crate::secrets::MASTER_KEY_FILE)));
        }
    }
    for file in SHARED_FILES {
        if let Some((_, sealed)) = held.iter().find(|(name, _)| name == file) {
            if materialize(data_dir, file, &open(file, sealed)?, stamp)? {
                shared.taken.push(file);
            }
        }
    }
    // What the database lacks is made here (a new cluster) or comes from
    // a data dir that ran alone on SQLite or before this table existed.
    ClusterCa::load_or_create(data_dir, now)?;
    ca::ensure_listener_key(data_dir)?;
    let mut offer = vec![(MASTER_KEY_CHECK.to_string(), sealer.seal(&context(MASTER_KEY_CHECK), CHECK_VALUE))];
    for file in SHARED_FILES.iter().filter(|file| !held.iter().any(|(name, _)| name == *file)) {
        let path = data_dir.join(file);
        let bytes = std::fs::read(&path).map_err(|source| SharedSecretsError::Io { path: path.clone(), source })?;
        offer.push((file.to_string(), sealer.seal(&context(file), &bytes)));
    }
    let offered: Vec<String> = offer.iter().map(|(name, _)| name.clone()).collect();
    let kept = store.claim_cluster_secrets(&offer, now.unix_timestamp() * 1000).await?;
    for (name, sealed) in kept {
        let Some(file) = SHARED_FILES.iter().copied().find(|file| *file == name) else {
            // The check value: another replica that stored its own first
            // must have had this master key, or this opens nothing.
            if sealer.open(&context(&name), &sealed).ok().as_deref() != Some(CHECK_VALUE) {
                return Err(SharedSecretsError::OtherMasterKey(data_dir.join(crate::secrets::MASTER_KEY_FILE)));
            }
            continue;
        };
        // Another replica that started at the same moment stored its copy
        // first: that one is the cluster's.
        if materialize(data_dir, file, &open(file, &sealed)?, stamp)? {
            shared.taken.push(file);
        } else if offered.iter().any(|n| n == file) {
            shared.offered.push(file);
        }
    }
    Ok(shared)
}

/// Writes `bytes` to `<data_dir>/<file>` (mode 0600) unless it holds them
/// already; a different local copy is kept as `<file>.replaced-<stamp>`.
/// Returns whether the file changed.
fn materialize(data_dir: &Path, file: &str, bytes: &[u8], stamp: &str) -> Result<bool, SharedSecretsError> {
    let path = data_dir.join(file);
    match std::fs::read(&path) {
        Ok(local) if local == bytes => return Ok(false),
        Ok(_) => {
            let kept = data_dir.join(format!("{file}.replaced-{stamp}"));
            std::fs::rename(&path, &kept).map_err(|source| SharedSecretsError::Io { path: kept.clone(), source })?;
            tracing::warn!(file, kept = %kept.display(), "the data dir held another copy of a cluster secret than the database; the database's is used, the local one is kept");
        }
        Err(_) => {}
    }
    ca::write_private(&path, bytes)?;
    Ok(true)
}
