//! Files in the agent's data dir that more than one module handles: writing
//! one that only its owner can read, the error for one that cannot be read,
//! written or parsed, and the names of the mesh's files, which leaving the
//! cluster removes along with the identity. Below both `identity` and
//! `mesh`, so that neither imports the other for them.

use std::fs;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// The node's WireGuard private key (see `mesh::key`).
pub const WIREGUARD_KEY_FILE: &str = "wireguard.key";

/// Written by the running agent after every peer list it applies, so that
/// `mesh status` (another process) knows the interface and peer names (see
/// `mesh::status`).
pub const MESH_CACHE_FILE: &str = "mesh.json";

#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error("cannot read or write {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path} is not valid: {reason}")]
    Invalid { path: PathBuf, reason: String },
}

/// Writes a file that only its owner can read, replacing any old one.
pub fn write_private(path: &Path, contents: &[u8]) -> Result<(), FileError> {
    let io = |source| FileError::Io { path: path.to_path_buf(), source };
    let tmp = path.with_extension("tmp");
    let _ = fs::remove_file(&tmp);
    let mut file = fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&tmp).map_err(io)?;
    file.write_all(contents).map_err(io)?;
    file.sync_all().map_err(io)?;
    fs::rename(&tmp, path).map_err(io)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::{write_private, FileError};

    #[test]
    fn writes_owner_only_and_replaces() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("secret.json");
        std::fs::write(&path, "old").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        // A temporary file an interrupted write left behind is replaced too.
        std::fs::write(dir.path().join("secret.tmp"), "stale").unwrap();
        write_private(&path, b"new").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "new");
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        assert!(!dir.path().join("secret.tmp").exists());
        let err = write_private(&dir.path().join("absent/x"), b"").unwrap_err();
        assert!(matches!(&err, FileError::Io { path, .. } if path.ends_with("absent/x")), "{err}");
    }
}
