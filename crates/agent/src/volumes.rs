//! Volumes' data on this node: one directory per volume,
//! `<data dir>/volumes/<name>`, owned by the agent, bind-mounted into the
//! app's containers. A deploy creates it when missing; only a
//! `volume_delete` command removes it, and never while a container of
//! this node still mounts it.

use std::path::{Path, PathBuf};

use cloudweb_protocol::{VolumeDeletePayload, VolumeMount};

use crate::runtime::{DockerRuntime, RuntimeError};

/// Where volumes live under the agent's data directory.
pub const VOLUMES_DIR: &str = "volumes";

pub fn dir(data_dir: &Path, name: &str) -> PathBuf {
    data_dir.join(VOLUMES_DIR).join(name)
}

/// Makes sure every mount's directory exists (a real directory, not a
/// symlink someone planted) and returns the (host directory, container
/// path) pairs to bind. The names were validated with the payload.
pub fn prepare(data_dir: &Path, mounts: &[VolumeMount]) -> Result<Vec<(String, String)>, String> {
    let root = data_dir.join(VOLUMES_DIR);
    std::fs::create_dir_all(&root).map_err(|e| format!("cannot create {}: {e}", root.display()))?;
    let mut binds = Vec::with_capacity(mounts.len());
    for mount in mounts {
        cloudweb_protocol::volumes::name(&mount.name).map_err(|e| e.to_string())?;
        cloudweb_protocol::volumes::mount_path(&mount.path).map_err(|e| e.to_string())?;
        let path = root.join(&mount.name);
        match std::fs::symlink_metadata(&path) {
            Ok(meta) if meta.is_dir() => {}
            Ok(_) => return Err(format!("volume {}: {} exists and is not a directory", mount.name, path.display())),
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
                std::fs::create_dir(&path).map_err(|e| format!("volume {}: cannot create {}: {e}", mount.name, path.display()))?;
                tracing::info!(volume = %mount.name, dir = %path.display(), "created the volume's directory");
            }
            Err(err) => return Err(format!("volume {}: {}: {err}", mount.name, path.display())),
        }
        binds.push((path.to_string_lossy().into_owned(), mount.path.clone()));
    }
    Ok(binds)
}

/// What became of a `volume_delete`.
#[derive(Debug, PartialEq, Eq)]
pub enum Deletion {
    Deleted,
    /// Nothing to delete (already gone).
    Absent,
    /// Try again later: a container still mounts it, or Docker is away.
    Retry(String),
    /// The command was wrong; dropped.
    Invalid(String),
}

/// Removes a volume's directory once no container of this node mounts it.
pub async fn delete(runtime: &DockerRuntime, data_dir: &Path, payload: &VolumeDeletePayload) -> Deletion {
    if let Err(err) = payload.validate() {
        return Deletion::Invalid(err.to_string());
    }
    let path = dir(data_dir, &payload.volume);
    let source = path.to_string_lossy().into_owned();
    match runtime.containers_mounting(&source).await {
        Ok(users) if !users.is_empty() => return Deletion::Retry(format!("still mounted by {}", users.join(", "))),
        Ok(_) => {}
        Err(RuntimeError::Unavailable(reason)) => return Deletion::Retry(reason),
        Err(err) => return Deletion::Retry(err.to_string()),
    }
    let result = tokio::task::spawn_blocking(move || match std::fs::symlink_metadata(&path) {
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(false),
        // A symlink is removed itself, never followed.
        Ok(meta) if !meta.is_dir() => std::fs::remove_file(&path).map(|()| true),
        Ok(_) => std::fs::remove_dir_all(&path).map(|()| true),
        Err(err) => Err(err),
    })
    .await;
    match result {
        Ok(Ok(true)) => Deletion::Deleted,
        Ok(Ok(false)) => Deletion::Absent,
        Ok(Err(err)) => Deletion::Retry(format!("cannot remove {source}: {err}")),
        Err(err) => Deletion::Retry(format!("the removal did not finish: {err}")),
    }
}

/// Bytes under each volume's directory (files' apparent sizes; symlinks
/// are not followed), for the usage samples.
pub fn sizes(data_dir: &Path) -> Vec<(String, u64)> {
    let Ok(entries) = std::fs::read_dir(data_dir.join(VOLUMES_DIR)) else { return Vec::new() };
    let mut sizes: Vec<(String, u64)> = entries
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            cloudweb_protocol::volumes::name(&name).ok()?;
            Some((name, tree_size(&e.path())))
        })
        .collect();
    sizes.sort();
    sizes
}

fn tree_size(root: &Path) -> u64 {
    let mut total = 0u64;
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        for entry in entries.filter_map(Result::ok) {
            let Ok(meta) = entry.metadata() else { continue };
            if meta.is_dir() {
                stack.push(entry.path());
            } else {
                total = total.saturating_add(meta.len());
            }
        }
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn directories_are_made_once_and_symlinks_refused() {
        let dir = tempfile::tempdir().unwrap();
        let mounts = vec![VolumeMount { name: "uploads".into(), path: "/app/uploads".into() }];
        let binds = prepare(dir.path(), &mounts).unwrap();
        assert_eq!(binds, vec![(dir.path().join("volumes/uploads").to_string_lossy().into_owned(), "/app/uploads".to_string())]);
        std::fs::write(dir.path().join("volumes/uploads/a"), b"12345").unwrap();
        // Again: the data is still there.
        prepare(dir.path(), &mounts).unwrap();
        assert_eq!(std::fs::read(dir.path().join("volumes/uploads/a")).unwrap(), b"12345");
        std::fs::create_dir(dir.path().join("volumes/uploads/sub")).unwrap();
        std::fs::write(dir.path().join("volumes/uploads/sub/b"), b"xy").unwrap();
        assert_eq!(sizes(dir.path()), vec![("uploads".to_string(), 7)]);

        std::os::unix::fs::symlink("/etc", dir.path().join("volumes/evil")).unwrap();
        let evil = vec![VolumeMount { name: "evil".into(), path: "/x".into() }];
        assert!(prepare(dir.path(), &evil).unwrap_err().contains("not a directory"));
        let bad = vec![VolumeMount { name: "../x".into(), path: "/x".into() }];
        assert!(prepare(dir.path(), &bad).is_err());
    }
}
