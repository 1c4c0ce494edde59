//! The commit a deployment builds, fixed by its first build.
//!
//! A deploy from a branch resolves the branch head once; if the command is
//! tried again (a report could not reach the control plane, the agent
//! restarted), the retry must build that same commit, not a head pushed
//! since. The first resolution is written to `<data dir>/commit-pins/<id>`
//! before it is reported, and every later try of the same deployment builds
//! the pinned commit. The pin goes when the deploy command ends.

use std::path::{Path, PathBuf};

pub struct Pins {
    dir: PathBuf,
}

impl Pins {
    pub fn new(data_dir: &Path) -> Pins {
        Pins { dir: data_dir.join("commit-pins") }
    }

    /// The file of a deployment; `None` for an id that is not a plain name
    /// (payloads are validated before this, so this only guards paths).
    fn path(&self, deployment_id: &str) -> Option<PathBuf> {
        let plain = !deployment_id.is_empty()
            && deployment_id.len() <= 64
            && deployment_id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        plain.then(|| self.dir.join(deployment_id))
    }

    /// The pinned commit of a deployment, if its first build resolved one.
    pub fn get(&self, deployment_id: &str) -> Option<String> {
        let text = std::fs::read_to_string(self.path(deployment_id)?).ok()?;
        let commit = text.trim();
        (matches!(commit.len(), 40 | 64) && commit.bytes().all(|b| b.is_ascii_hexdigit())).then(|| commit.to_string())
    }

    /// Pins `commit` for the deployment (written whole or not at all).
    pub fn set(&self, deployment_id: &str, commit: &str) -> std::io::Result<()> {
        let path = self.path(deployment_id).ok_or_else(|| std::io::Error::other(format!("not a deployment id: {deployment_id:?}")))?;
        std::fs::create_dir_all(&self.dir)?;
        let partial = self.dir.join(format!(".{deployment_id}.partial"));
        std::fs::write(&partial, format!("{commit}\n"))?;
        std::fs::rename(&partial, &path)
    }

    pub fn remove(&self, deployment_id: &str) {
        if let Some(path) = self.path(deployment_id) {
            let _ = std::fs::remove_file(path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Pins;

    #[test]
    fn a_pin_is_kept_until_removed_and_only_for_plain_ids() {
        let dir = tempfile::tempdir().unwrap();
        let pins = Pins::new(dir.path());
        let commit = "a".repeat(40);
        assert_eq!(pins.get("dep_01"), None);
        pins.set("dep_01", &commit).unwrap();
        assert_eq!(pins.get("dep_01"), Some(commit.clone()));
        assert_eq!(Pins::new(dir.path()).get("dep_01"), Some(commit), "a restarted agent finds it");
        pins.remove("dep_01");
        assert_eq!(pins.get("dep_01"), None);
        assert!(pins.set("../x", &"b".repeat(40)).is_err());
        std::fs::create_dir_all(dir.path().join("commit-pins")).unwrap();
        std::fs::write(dir.path().join("commit-pins").join("dep_02"), "not a commit").unwrap();
        assert_eq!(pins.get("dep_02"), None, "a damaged pin is no pin");
    }
}
