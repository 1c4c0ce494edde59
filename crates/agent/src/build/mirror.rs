//! A bare mirror per app and repository on the node, so a build fetches
//! only what is new instead of cloning the whole repository again.
//!
//! - Where: `<data dir>/git-mirrors/<app>-<first 16 hex of SHA-256(repo URL)>.git`,
//!   so an app whose repository changes gets a fresh mirror.
//! - What is stored: objects and one ref per branch built. The repository
//!   URL is passed to each fetch and never written to the mirror's
//!   configuration, and credentials travel only in the environment of the
//!   fetch (see `git`), so neither is at rest in the mirror.
//! - The files of a commit: `git archive` writes them straight out of the
//!   object store as a tar archive, which is the Docker build context as it
//!   is (no work tree, no second tar). The mirror's `info/attributes`
//!   switches off `export-ignore` and `export-subst`, so the archive holds
//!   exactly the files a checkout has; modes follow the agent's umask, as a
//!   checkout's do. Builds that need the files on disk (static sites,
//!   buildpacks) get them with `git read-tree -u` and an index of their
//!   own. Neither changes anything in the mirror (no HEAD, no index).
//! - A commit the mirror already has (a redeploy, a rollback by commit) is
//!   archived before the fetch, so its build can run while the fetch
//!   confirms that the commit is still on the branch: see [`Mirror::known`]
//!   and [`Mirror::fetch`]. Nothing built from it is used before the fetch
//!   confirmed it.
//! - Concurrency: one lock per mirror, held for the init and the fetch and
//!   its checks, so two builds of the same app never write the mirror at
//!   once (builds of different apps do not wait for each other). Reading
//!   objects (archive, read-tree) needs no lock: git writes objects and refs
//!   atomically.
//! - Bounds: a mirror not used for [`UNUSED_DAYS`] days is removed (checked
//!   at each build). The agent is not told when an app is deleted, so age
//!   is what bounds the directory.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, SystemTime};

use cloudweb_protocol::Source;
use sha2::{Digest, Sha256};

use super::git::{git, route, run, run_bytes, GitError, Route};

/// A mirror unused this long is removed.
pub const UNUSED_DAYS: u64 = 7;

/// Touched on each use; its modification time is the last use.
const USED_MARKER: &str = "cloudweb-last-used";

/// Attributes of highest precedence for every archive of the mirror: a
/// repository's own `.gitattributes` cannot drop files from the build
/// context or rewrite them, which a checkout would not do either.
const ARCHIVE_ATTRIBUTES: &str = "* -export-ignore -export-subst\n";

/// One async lock per mirror directory, shared by every build in this agent.
fn lock_for(dir: &Path) -> Arc<tokio::sync::Mutex<()>> {
    static LOCKS: OnceLock<Mutex<HashMap<PathBuf, Arc<tokio::sync::Mutex<()>>>>> = OnceLock::new();
    let mut locks = LOCKS.get_or_init(Default::default).lock().expect("mirror locks");
    locks.entry(dir.to_path_buf()).or_default().clone()
}

/// The mirror directory of an app's repository.
pub fn mirror_dir(root: &Path, app: &str, repo_url: &str) -> PathBuf {
    let digest = hex::encode(Sha256::digest(repo_url.as_bytes()));
    root.join(format!("{app}-{}.git", &digest[..16]))
}

/// The files of one commit, as a tar archive (a Docker build context).
pub struct Snapshot {
    /// The full commit id.
    pub commit: String,
    pub archive: Vec<u8>,
}

/// An app's mirror of one repository, ready for fetches and reads.
pub struct Mirror {
    dir: PathBuf,
    home: PathBuf,
    remote: Route,
    source: Source,
}

/// Opens (creating it on first use) `app`'s mirror of `source`. `home` is
/// the build's own empty home directory.
pub async fn open(root: &Path, app: &str, source: &Source, home: &Path, allow_file: bool) -> Result<Mirror, GitError> {
    let io = |step: &'static str| move |e: std::io::Error| GitError::Failed { step, message: e.to_string() };
    if source.repo_url.starts_with("file://") && !allow_file {
        return Err(GitError::Setup("file:// repositories are not allowed on this node".into()));
    }
    // The repository's resolved address is checked and git pinned to it
    // before anything is fetched (see `git::route`).
    let remote = route(source, home).await?;
    std::fs::create_dir_all(root).map_err(io("mirror"))?;
    prune(root, Duration::from_secs(UNUSED_DAYS * 86_400));
    let dir = mirror_dir(root, app, &source.repo_url);
    {
        let lock = lock_for(&dir);
        let _held = lock.lock().await;
        if !dir.join("HEAD").exists() {
            // A half-made mirror (the agent stopped during init) is started over.
            let _ = std::fs::remove_dir_all(&dir);
            let mut init = git(home, &Route::local(), None);
            init.arg("init").arg("--quiet").arg("--bare").arg("--").arg(&dir);
            run(init, "mirror init", None).await?;
        }
        let attributes = dir.join("info").join("attributes");
        if std::fs::read_to_string(&attributes).ok().as_deref() != Some(ARCHIVE_ATTRIBUTES) {
            std::fs::create_dir_all(dir.join("info")).and_then(|()| std::fs::write(&attributes, ARCHIVE_ATTRIBUTES)).map_err(io("mirror"))?;
        }
        std::fs::write(dir.join(USED_MARKER), b"").map_err(io("mirror"))?;
    }
    Ok(Mirror { dir, home: home.to_path_buf(), remote, source: source.clone() })
}

impl Mirror {
    fn local(&self) -> tokio::process::Command {
        let mut command = git(&self.home, &Route::local(), None);
        command.arg("--git-dir").arg(&self.dir);
        command
    }

    /// The requested commit's files, straight from the mirror, when a
    /// commit was named and the mirror has it from an earlier fetch; `None`
    /// otherwise. Not checked against the branch yet: only a [`fetch`]
    /// returning the same commit makes it usable.
    ///
    /// [`fetch`]: Mirror::fetch
    pub async fn known(&self) -> Option<Snapshot> {
        let target = self.source.commit.as_ref()?;
        cloudweb_protocol::deploy::commit(target).ok()?;
        let snapshot = self.snapshot(&format!("{target}^{{commit}}")).await.ok()?;
        // An abbreviation is resolved again after the fetch, which may
        // bring a second object it matches: then it is refused there.
        Some(snapshot)
    }

    /// Brings the branch up to date from the repository and resolves the
    /// commit to build: the branch head, or the requested commit, which
    /// must be on the branch (as in a fresh clone of it). Returns the full
    /// commit id.
    pub async fn fetch(&self) -> Result<String, GitError> {
        let lock = lock_for(&self.dir);
        let _held = lock.lock().await;
        std::fs::write(self.dir.join(USED_MARKER), b"").map_err(|e| GitError::Failed { step: "mirror", message: e.to_string() })?;
        let source = &self.source;
        let credentials = source.credentials.as_ref();
        let secret = credentials.map(|c| c.password.as_str());
        let branch_ref = format!("refs/heads/{}", source.branch);
        let mut fetch = git(&self.home, &self.remote, credentials);
        fetch
            .arg("--git-dir")
            .arg(&self.dir)
            .arg("fetch")
            .arg("--quiet")
            .arg("--no-tags")
            .arg("--no-write-fetch-head")
            .arg("--")
            .arg(&self.remote.url)
            .arg(format!("+{branch_ref}:{branch_ref}"));
        run(fetch, "fetch", secret).await?;

        let not_on_branch = |target: &str| GitError::Failed { step: "checkout", message: format!("commit {target} is not on branch {}", source.branch) };
        match &source.commit {
            None => {
                let mut resolve = self.local();
                resolve.arg("rev-parse").arg("--verify").arg("--end-of-options").arg(format!("{branch_ref}^{{commit}}"));
                run(resolve, "rev-parse", None).await
            }
            Some(target) => {
                let mut resolve = self.local();
                resolve.arg("rev-parse").arg("--verify").arg("--end-of-options").arg(format!("{target}^{{commit}}"));
                let commit = run(resolve, "rev-parse", None).await.map_err(|_| not_on_branch(target))?;
                // The mirror keeps objects of earlier fetches; the commit must
                // still be on the branch, as in a fresh clone of it.
                let mut on_branch = self.local();
                on_branch.arg("merge-base").arg("--is-ancestor").arg(&commit).arg(&branch_ref);
                run(on_branch, "merge-base", None).await.map_err(|_| not_on_branch(target))?;
                Ok(commit)
            }
        }
    }

    /// The files of `commit` (a full id from [`fetch`]) as a tar archive.
    ///
    /// [`fetch`]: Mirror::fetch
    pub async fn archive(&self, commit: &str) -> Result<Vec<u8>, GitError> {
        let snapshot = self.snapshot(commit).await?;
        if snapshot.commit != commit {
            return Err(GitError::Failed { step: "archive", message: format!("archived commit {} instead of {commit}", snapshot.commit) });
        }
        Ok(snapshot.archive)
    }

    /// `git archive` of a commit-ish; the full commit id comes from the
    /// archive's own header (git writes it there for a commit).
    async fn snapshot(&self, commit_ish: &str) -> Result<Snapshot, GitError> {
        let mut archive = self.local();
        // File modes follow the agent's umask, as those of a checkout.
        archive.arg("-c").arg("tar.umask=user");
        archive.arg("archive").arg("--format=tar").arg("--end-of-options").arg(commit_ish);
        let archive = run_bytes(archive, "archive").await?;
        let commit = archived_commit(&archive).ok_or_else(|| GitError::Failed { step: "archive", message: "the archive names no commit".into() })?;
        Ok(Snapshot { commit, archive })
    }

    /// Writes the files of `commit` into `dir`, which must not exist.
    pub async fn checkout(&self, commit: &str, dir: &Path) -> Result<(), GitError> {
        std::fs::create_dir_all(dir).map_err(|e| GitError::Failed { step: "checkout", message: e.to_string() })?;
        let index = dir.with_extension("index");
        let mut read_tree = self.local();
        read_tree.env("GIT_INDEX_FILE", &index).arg("--work-tree").arg(dir).arg("read-tree").arg("--reset").arg("-u").arg(commit);
        let result = run(read_tree, "checkout", None).await;
        let _ = std::fs::remove_file(&index);
        result.map(|_| ())
    }
}

/// The commit id `git archive` records in the pax global header of an
/// archive of a commit (what `git get-tar-commit-id` reads).
pub fn archived_commit(archive: &[u8]) -> Option<String> {
    let mut entries = tar::Archive::new(archive);
    let mut first = entries.entries().ok()?.next()?.ok()?;
    if first.header().entry_type() != tar::EntryType::XGlobalHeader {
        return None;
    }
    let mut records = Vec::new();
    std::io::Read::read_to_end(&mut first, &mut records).ok()?;
    // Records are `<length> <key>=<value>\n`.
    String::from_utf8(records).ok()?.lines().find_map(|record| {
        let (_, pair) = record.split_once(' ')?;
        let id = pair.strip_prefix("comment=")?;
        cloudweb_protocol::deploy::full_commit(id).ok().map(|()| id.to_string())
    })
}

/// Brings `app`'s mirror of `source` up to date and writes the requested
/// commit (the branch head when none) into `dir`, which must not exist.
/// Returns the full commit id.
pub async fn checkout(root: &Path, app: &str, source: &Source, dir: &Path, home: &Path, allow_file: bool) -> Result<String, GitError> {
    let mirror = open(root, app, source, home, allow_file).await?;
    let commit = mirror.fetch().await?;
    mirror.checkout(&commit, dir).await?;
    Ok(commit)
}

/// Removes mirrors whose last use is older than `unused`, skipping any a
/// build holds right now.
pub fn prune(root: &Path, unused: Duration) {
    let Ok(entries) = std::fs::read_dir(root) else { return };
    let now = SystemTime::now();
    for entry in entries.flatten() {
        let path = entry.path();
        if path.extension().is_none_or(|e| e != "git") {
            continue;
        }
        let last_used = std::fs::metadata(path.join(USED_MARKER)).and_then(|m| m.modified()).or_else(|_| entry.metadata().and_then(|m| m.modified()));
        let stale = last_used.ok().and_then(|t| now.duration_since(t).ok()).is_some_and(|age| age > unused);
        if !stale {
            continue;
        }
        let lock = lock_for(&path);
        let Ok(_held) = lock.try_lock() else { continue };
        match std::fs::remove_dir_all(&path) {
            Ok(()) => tracing::info!(mirror = %path.display(), "removed a git mirror unused for {UNUSED_DAYS} days"),
            Err(err) => tracing::warn!(mirror = %path.display(), error = %err, "cannot remove an unused git mirror"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command as StdCommand;

    fn sh_git(dir: &Path, args: &[&str]) -> String {
        let out = StdCommand::new("git")
            .args(args)
            .current_dir(dir)
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("HOME", dir)
            .env("GIT_AUTHOR_NAME", "t")
            .env("GIT_AUTHOR_EMAIL", "t@example.com")
            .env("GIT_COMMITTER_NAME", "t")
            .env("GIT_COMMITTER_EMAIL", "t@example.com")
            .output()
            .unwrap();
        assert!(out.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    fn commit(repo: &Path, file: &str, text: &str) -> String {
        std::fs::write(repo.join(file), text).unwrap();
        sh_git(repo, &["add", "."]);
        sh_git(repo, &["commit", "--quiet", "-m", file]);
        sh_git(repo, &["rev-parse", "HEAD"])
    }

    fn source(repo: &Path, commit: Option<&str>) -> Source {
        Source { repo_url: format!("file://{}", repo.display()), branch: "main".into(), commit: commit.map(str::to_string), credentials: None, ssh: None, allow_private_hosts: false, ca_pem: None }
    }

    #[tokio::test]
    async fn fetches_into_one_mirror_and_checks_out_exact_commits() {
        let tmp = tempfile::tempdir().unwrap();
        let repo = tmp.path().join("repo");
        std::fs::create_dir(&repo).unwrap();
        sh_git(&repo, &["init", "--quiet", "--initial-branch", "main"]);
        let first = commit(&repo, "a.txt", "one");
        let root = tmp.path().join("mirrors");
        let home = tmp.path().join("home");
        std::fs::create_dir(&home).unwrap();

        let got = checkout(&root, "web", &source(&repo, None), &tmp.path().join("w1"), &home, true).await.unwrap();
        assert_eq!(got, first);
        assert_eq!(std::fs::read_to_string(tmp.path().join("w1/a.txt")).unwrap(), "one");
        assert!(!tmp.path().join("w1/.git").exists());

        let second = commit(&repo, "b.txt", "two");
        // The branch head, then an exact older commit by abbreviation.
        assert_eq!(checkout(&root, "web", &source(&repo, None), &tmp.path().join("w2"), &home, true).await.unwrap(), second);
        assert!(tmp.path().join("w2/b.txt").exists());
        assert_eq!(checkout(&root, "web", &source(&repo, Some(&first[..10])), &tmp.path().join("w3"), &home, true).await.unwrap(), first);
        assert!(!tmp.path().join("w3/b.txt").exists(), "the older commit's tree, not the head's");

        // One mirror for the app, holding no URL in its configuration.
        let mirrors: Vec<_> = std::fs::read_dir(&root).unwrap().flatten().collect();
        assert_eq!(mirrors.len(), 1);
        let config = std::fs::read_to_string(mirrors[0].path().join("config")).unwrap();
        assert!(!config.contains("[remote") && !config.contains(&repo.display().to_string()), "{config}");

        // A commit that left the branch (force-push) is refused although
        // the mirror still has it.
        sh_git(&repo, &["reset", "--quiet", "--hard", &first]);
        let third = commit(&repo, "c.txt", "three");
        let err = checkout(&root, "web", &source(&repo, Some(&second)), &tmp.path().join("w4"), &home, true).await.unwrap_err();
        assert!(err.to_string().contains("is not on branch main"), "{err}");
        assert_eq!(checkout(&root, "web", &source(&repo, Some(&third)), &tmp.path().join("w5"), &home, true).await.unwrap(), third);
    }

    /// The paths and modes of a tar archive's files.
    fn listing(archive: &[u8]) -> Vec<(String, u32)> {
        let mut entries = tar::Archive::new(archive);
        entries
            .entries()
            .unwrap()
            .map(|e| e.unwrap())
            .filter(|e| e.header().entry_type().is_file())
            .map(|e| (e.path().unwrap().display().to_string(), e.header().mode().unwrap()))
            .collect()
    }

    #[tokio::test]
    async fn a_known_commit_is_archived_at_once_and_only_the_fetch_makes_it_usable() {
        let tmp = tempfile::tempdir().unwrap();
        let repo = tmp.path().join("repo");
        std::fs::create_dir(&repo).unwrap();
        sh_git(&repo, &["init", "--quiet", "--initial-branch", "main"]);
        // The repository's attributes would drop and rewrite files in a
        // plain `git archive`; a build context has them as checked out.
        std::fs::write(repo.join(".gitattributes"), "secret.txt export-ignore\nversion.txt export-subst\n").unwrap();
        std::fs::write(repo.join("version.txt"), "$Format:%H$").unwrap();
        std::fs::write(repo.join("secret.txt"), "kept").unwrap();
        let first = commit(&repo, "Dockerfile", "FROM scratch\n");
        let root = tmp.path().join("mirrors");
        let home = tmp.path().join("home");
        std::fs::create_dir(&home).unwrap();

        // Not fetched yet: nothing known; the fetch resolves the commit.
        let mirror = open(&root, "web", &source(&repo, Some(&first)), &home, true).await.unwrap();
        assert!(mirror.known().await.is_none());
        assert_eq!(mirror.fetch().await.unwrap(), first);
        let archive = mirror.archive(&first).await.unwrap();
        assert_eq!(archived_commit(&archive).as_deref(), Some(first.as_str()));
        let files = listing(&archive);
        let names: Vec<&str> = files.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, [".gitattributes", "Dockerfile", "secret.txt", "version.txt"]);
        let entries = tar::Archive::new(archive.as_slice()).entries().unwrap().map(|e| e.unwrap()).filter(|e| e.header().entry_type().is_file()).count();
        assert_eq!(entries, 4);
        let mut version = String::new();
        for mut entry in tar::Archive::new(archive.as_slice()).entries().unwrap().map(|e| e.unwrap()) {
            if entry.path().unwrap().as_os_str() == "version.txt" {
                std::io::Read::read_to_string(&mut entry, &mut version).unwrap();
            }
        }
        assert_eq!(version, "$Format:%H$", "not substituted");

        // Known now, by full id or abbreviation, before any fetch.
        let again = open(&root, "web", &source(&repo, Some(&first[..12])), &home, true).await.unwrap();
        let known = again.known().await.expect("the mirror has it");
        assert_eq!(known.commit, first);
        assert_eq!(listing(&known.archive), files);
        assert_eq!(again.fetch().await.unwrap(), first);

        // A commit that left the branch (force-push) is still in the mirror,
        // so it is archived, but the fetch refuses it.
        let second = commit(&repo, "b.txt", "two");
        let mirror = open(&root, "web", &source(&repo, None), &home, true).await.unwrap();
        assert_eq!(mirror.fetch().await.unwrap(), second);
        sh_git(&repo, &["reset", "--quiet", "--hard", &first]);
        commit(&repo, "c.txt", "three");
        let gone = open(&root, "web", &source(&repo, Some(&second)), &home, true).await.unwrap();
        assert_eq!(gone.known().await.expect("still in the mirror").commit, second);
        let err = gone.fetch().await.unwrap_err();
        assert!(err.to_string().contains("is not on branch main"), "{err}");

        // A branch head is never "known": it needs the fetch.
        let head = open(&root, "web", &source(&repo, None), &home, true).await.unwrap();
        assert!(head.known().await.is_none());
    }

    #[tokio::test]
    async fn concurrent_builds_of_one_app_share_the_mirror_safely() {
        let tmp = tempfile::tempdir().unwrap();
        let repo = tmp.path().join("repo");
        std::fs::create_dir(&repo).unwrap();
        sh_git(&repo, &["init", "--quiet", "--initial-branch", "main"]);
        let head = commit(&repo, "a.txt", "one");
        let root = tmp.path().join("mirrors");
        let home = tmp.path().join("home");
        std::fs::create_dir(&home).unwrap();
        let builds = (0..6).map(|i| {
            let (root, home, src, dir) = (root.clone(), home.clone(), source(&repo, None), tmp.path().join(format!("w{i}")));
            tokio::spawn(async move { checkout(&root, "web", &src, &dir, &home, true).await })
        });
        for build in futures_util::future::join_all(builds).await {
            assert_eq!(build.unwrap().unwrap(), head);
        }
        let mut fsck = StdCommand::new("git");
        fsck.arg("--git-dir").arg(mirror_dir(&root, "web", &source(&repo, None).repo_url)).arg("fsck").arg("--strict");
        assert!(fsck.output().unwrap().status.success());
    }

    #[test]
    fn unused_mirrors_are_removed() {
        let root = tempfile::tempdir().unwrap();
        let old = root.path().join("old-0123456789abcdef.git");
        let fresh = root.path().join("fresh-0123456789abcdef.git");
        for dir in [&old, &fresh] {
            std::fs::create_dir(dir).unwrap();
            std::fs::write(dir.join(USED_MARKER), b"").unwrap();
        }
        let long_ago = SystemTime::now() - Duration::from_secs(8 * 86_400);
        std::fs::File::options().write(true).open(old.join(USED_MARKER)).unwrap().set_modified(long_ago).unwrap();
        prune(root.path(), Duration::from_secs(UNUSED_DAYS * 86_400));
        assert!(!old.exists());
        assert!(fresh.exists());
    }
}
