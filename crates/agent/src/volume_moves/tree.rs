//! A volume's tree as a move sees it: every directory, regular file and
//! symlink under the volume's root, by relative path, and the digest both
//! ends compute over it. Other file types (sockets, FIFOs, devices) are
//! skipped: a container recreates them at start.

use std::collections::BTreeMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    Dir { mode: u32 },
    File { size: u64, mode: u32, mtime_ns: i64 },
    Link { target: String },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Relative to the volume's root, `/`-separated.
    pub path: String,
    pub kind: Kind,
    pub uid: u32,
    pub gid: u32,
}

/// Every entry under `root`, parents before children, sorted by path
/// within a directory. Symlinks are listed, never followed. Names that are
/// not UTF-8 cannot travel in a frame: the walk stops with an error
/// naming them rather than leaving them behind.
pub fn walk(root: &Path) -> Result<Vec<Entry>, String> {
    let mut entries = Vec::new();
    let mut stack: Vec<(PathBuf, String)> = vec![(root.to_path_buf(), String::new())];
    while let Some((dir, prefix)) = stack.pop() {
        let mut children: Vec<(String, std::fs::Metadata, PathBuf)> = Vec::new();
        for child in std::fs::read_dir(&dir).map_err(|e| format!("cannot read {}: {e}", dir.display()))? {
            let child = child.map_err(|e| format!("cannot read {}: {e}", dir.display()))?;
            let name = child.file_name().into_string().map_err(|n| format!("{}: a name that is not UTF-8 ({n:?})", dir.display()))?;
            let meta = std::fs::symlink_metadata(child.path()).map_err(|e| format!("{}: {e}", child.path().display()))?;
            children.push((name, meta, child.path()));
        }
        children.sort_by(|a, b| a.0.cmp(&b.0));
        let mut subdirs = Vec::new();
        for (name, meta, path) in children {
            let rel = if prefix.is_empty() { name } else { format!("{prefix}/{name}") };
            let (uid, gid) = (meta.uid(), meta.gid());
            let file_type = meta.file_type();
            let kind = if file_type.is_symlink() {
                let target = std::fs::read_link(&path).map_err(|e| format!("{}: {e}", path.display()))?;
                let target = target.into_os_string().into_string().map_err(|t| format!("{}: a link target that is not UTF-8 ({t:?})", path.display()))?;
                Kind::Link { target }
            } else if file_type.is_dir() {
                subdirs.push((path, rel.clone()));
                Kind::Dir { mode: meta.permissions().mode() & 0o7777 }
            } else if file_type.is_file() {
                Kind::File { size: meta.len(), mode: meta.permissions().mode() & 0o7777, mtime_ns: mtime_ns(&meta) }
            } else {
                continue;
            };
            entries.push(Entry { path: rel, kind, uid, gid });
        }
        // Reversed so the stack hands them out in order.
        stack.extend(subdirs.into_iter().rev());
    }
    Ok(entries)
}

pub fn mtime_ns(meta: &std::fs::Metadata) -> i64 {
    meta.mtime().saturating_mul(1_000_000_000).saturating_add(meta.mtime_nsec())
}

/// The digest of a tree: SHA-256 over one line per entry, sorted by path:
/// `path \0 kind \0 size-or-target \0 content-sha256`. Both ends compute
/// it from what they hold, so equal digests mean equal trees (names,
/// kinds, contents and link targets; not times, owners or modes).
#[derive(Debug, Default)]
pub struct TreeDigest {
    lines: BTreeMap<String, String>,
}

impl TreeDigest {
    pub fn dir(&mut self, path: &str) {
        self.lines.insert(path.to_string(), format!("{path}\0d\0\0"));
    }

    pub fn file(&mut self, path: &str, size: u64, sha256: &str) {
        self.lines.insert(path.to_string(), format!("{path}\0f\0{size}\0{sha256}"));
    }

    pub fn link(&mut self, path: &str, target: &str) {
        self.lines.insert(path.to_string(), format!("{path}\0l\0{target}\0"));
    }

    pub fn finish(&self) -> String {
        let mut hasher = Sha256::new();
        for line in self.lines.values() {
            hasher.update(line.as_bytes());
            hasher.update(b"\n");
        }
        hex::encode(hasher.finalize())
    }
}

/// Checks that every existing ancestor of `rel` under `root` is a real
/// directory, never a symlink, so a link sent earlier in the stream cannot
/// redirect a later write outside the volume.
pub fn parents_are_directories(root: &Path, rel: &str) -> Result<(), String> {
    let mut path = root.to_path_buf();
    let mut parts: Vec<&str> = rel.split('/').collect();
    parts.pop();
    for part in parts {
        path.push(part);
        match std::fs::symlink_metadata(&path) {
            Ok(meta) if meta.file_type().is_dir() => {}
            Ok(_) => return Err(format!("{rel}: {} is not a directory", path.display())),
            Err(e) => return Err(format!("{rel}: {}: {e}", path.display())),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn walks_in_order_without_following_links() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("b/c")).unwrap();
        std::fs::write(root.join("a"), b"1").unwrap();
        std::fs::write(root.join("b/c/d"), b"22").unwrap();
        std::os::unix::fs::symlink("/etc", root.join("b/link")).unwrap();
        let paths: Vec<String> = walk(root).unwrap().into_iter().map(|e| e.path).collect();
        assert_eq!(paths, ["a", "b", "b/c", "b/link", "b/c/d"]);
        assert!(parents_are_directories(root, "b/c/d").is_ok());
        assert!(parents_are_directories(root, "b/link/passwd").unwrap_err().contains("not a directory"));
    }

    #[test]
    fn the_digest_ignores_the_order_it_was_fed_in() {
        let mut one = TreeDigest::default();
        one.dir("a");
        one.file("a/b", 3, "x");
        let mut two = TreeDigest::default();
        two.file("a/b", 3, "x");
        two.dir("a");
        assert_eq!(one.finish(), two.finish());
        two.link("c", "a");
        assert_ne!(one.finish(), two.finish());
    }
}
