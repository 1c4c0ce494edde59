//! Persistent volumes on the wire: the mounts a `deploy` command carries,
//! the `volume_delete` command, and the checks both sides run on names and
//! mount paths.
//!
//! A volume's data is a directory the agent owns,
//! `<agent data dir>/volumes/<name>`, bind-mounted into the app's
//! containers; it is created at the first deploy that mounts it and removed
//! only by a `volume_delete` command.

use serde::{Deserialize, Serialize};

use crate::validate::{self, ValidationError};

/// One volume mounted into an app's container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema))]
pub struct VolumeMount {
    /// The volume's name, unique in the cluster.
    pub name: String,
    /// Absolute path inside the container.
    pub path: String,
}

/// Payload of `volume_delete`: remove this volume's data from the node.
/// Sent only when a user deletes the volume by name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeDeletePayload {
    pub volume: String,
}

impl VolumeDeletePayload {
    pub fn validate(&self) -> Result<(), ValidationError> {
        name(&self.volume)
    }
}

/// Most volumes one container mounts.
pub const MAX_MOUNTS: usize = 16;

/// A volume name: like an app name (1 to 63 lowercase letters, digits or
/// '-'), so it is safe as a directory name on every node.
pub fn name(value: &str) -> Result<(), ValidationError> {
    validate::node_name("volume", value)
}

/// Directories a volume may not hide or sit in: the container runtime's
/// own mounts and the root.
const RESERVED: [&str; 6] = ["/proc", "/sys", "/dev", "/etc/hosts", "/etc/hostname", "/etc/resolv.conf"];

/// A mount path: absolute, at most 256 bytes, plain components
/// (`[A-Za-z0-9._@+-]`, no `.` or `..`, no empty component), not `/` and
/// not in or over the runtime's own mounts.
pub fn mount_path(path: &str) -> Result<(), ValidationError> {
    const FIELD: &str = "path";
    validate::bounded_text(FIELD, path, 256)?;
    let Some(rest) = path.strip_prefix('/') else {
        return Err(ValidationError::new(FIELD, "must be an absolute path inside the container"));
    };
    if rest.is_empty() {
        return Err(ValidationError::new(FIELD, "must not be the container's root"));
    }
    for part in rest.split('/') {
        if part.is_empty() || part == "." || part == ".." {
            return Err(ValidationError::new(FIELD, "must not contain empty, '.' or '..' components (nor end with '/')"));
        }
        if !part.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b'@' | b'+')) {
            return Err(ValidationError::new(FIELD, "may only contain letters, digits, '/' and . _ - @ +"));
        }
    }
    for reserved in RESERVED {
        if path == reserved || path.starts_with(&format!("{reserved}/")) {
            return Err(ValidationError::new(FIELD, format!("must not be in {reserved}, which the container runtime provides")));
        }
    }
    Ok(())
}

/// The mounts of one deploy: valid names and paths, no name or path twice.
pub fn mounts(list: &[VolumeMount]) -> Result<(), ValidationError> {
    if list.len() > MAX_MOUNTS {
        return Err(ValidationError::new("volumes", format!("at most {MAX_MOUNTS} volumes")));
    }
    for (i, mount) in list.iter().enumerate() {
        name(&mount.name)?;
        mount_path(&mount.path)?;
        if list[..i].iter().any(|m| m.name == mount.name || m.path == mount.path) {
            return Err(ValidationError::new("volumes", format!("volume {} or its path {} is listed twice", mount.name, mount.path)));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mount_paths() {
        for good in ["/data", "/app/uploads", "/var/lib/postgresql/data", "/srv/a.b_c-d@e+f"] {
            mount_path(good).unwrap();
        }
        for bad in [
            "", "/", "data", "./data", "/data/", "/a//b", "/a/../b", "/a/./b", "/proc", "/proc/1", "/sys/x", "/dev", "/etc/hosts",
            "/a b", "/a\nb", "/$(id)", "/a;b",
        ] {
            assert!(mount_path(bad).is_err(), "{bad:?}");
        }
        // Near a reserved name is fine.
        mount_path("/devices").unwrap();
        mount_path(&format!("/{}", "a".repeat(300))).unwrap_err();
    }

    #[test]
    fn names_and_lists() {
        name("uploads").unwrap();
        for bad in ["", "Uploads", "-x", "x-", "a/b", "..", "a.b"] {
            assert!(name(bad).is_err(), "{bad:?}");
        }
        let mount = |n: &str, p: &str| VolumeMount { name: n.into(), path: p.into() };
        mounts(&[mount("a", "/a"), mount("b", "/b")]).unwrap();
        assert!(mounts(&[mount("a", "/a"), mount("a", "/b")]).is_err());
        assert!(mounts(&[mount("a", "/a"), mount("b", "/a")]).is_err());
        let many: Vec<VolumeMount> = (0..17).map(|i| mount(&format!("v{i}"), &format!("/v{i}"))).collect();
        assert!(mounts(&many).is_err());
    }
}
