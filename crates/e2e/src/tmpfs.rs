//! A small file system for full-disk tests (needs root, like the fault
//! suite).

use std::path::Path;
use std::process::Command;

/// A tmpfs of `size` mounted at `dir`, unmounted on drop.
pub struct Tmpfs(pub std::path::PathBuf);

impl Tmpfs {
    pub fn mount(dir: &Path, size: &str) -> Tmpfs {
        std::fs::create_dir_all(dir).unwrap();
        let status = Command::new("mount").args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"]).arg(dir).status().unwrap();
        assert!(status.success(), "mounting a tmpfs at {} (the fault suite runs as root)", dir.display());
        Tmpfs(dir.to_path_buf())
    }

    /// Fills the file system up to the last byte; returns the filler's path.
    pub fn fill(&self) -> std::path::PathBuf {
        let filler = self.0.join("filler");
        // dd stops at ENOSPC with an error, which is the point.
        let _ = Command::new("dd").args(["if=/dev/zero", "bs=64k"]).arg(format!("of={}", filler.display())).output().unwrap();
        filler
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

