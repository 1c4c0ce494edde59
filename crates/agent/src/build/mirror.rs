//! A bare mirror per app and repository on the node, so a build fetches
//! only what is new instead of cloning the whole repository again.
//!
//! - Where: `<data dir>/git-mirrors/<app>-<first 16 hex of SHA-256(repo URL)>.git`,
//!   so an app whose repository changes gets a fresh mirror.
//! - What is stored: objects and one ref per branch built. The repository
//!   URL is passed to each fetch and never written to the mirror's
//!   configuration, and credentials travel only in the environment of the
//!   fetch (see `git`), so neither is at rest in the mirror.
//! - Checkout: the commit is written into a fresh work tree with `git
//!   read-tree -u` and an index of its own, so nothing in the mirror (no
//!   HEAD, no index) changes while it is read.
//! - Concurrency: one lock per mirror, held from the fetch to the end of
//!   the checkout, so two builds of the same app never write the mirror at
//!   once (builds of different apps do not wait for each other).
//! - Bounds: a mirror not used for [`UNUSED_DAYS`] days is removed (checked
//!   at each build). The agent is not told when an app is deleted, so age
//!   is what bounds the directory.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, SystemTime};

use cloudweb_protocol::Source;
use sha2::{Digest, Sha256};

use super::git::{git, route, run, GitError, Route};

/// A mirror unused this long is removed.
pub const UNUSED_DAYS: u64 = 7;

/// Touched on each use; its modification time is the last use.
const USED_MARKER: &str = "cloudweb-last-used";

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

/// Brings `app`'s mirror of `source` up to date and writes the requested
/// commit (the branch head when none) into `dir`, which must not exist.
/// Returns the full commit id.
pub async fn checkout(root: &Path, app: &str, source: &Source, dir: &Path, home: &Path, allow_file: bool) -> Result<String, GitError> {
    let io = |step: &'static str| move |e: std::io::Error| GitError::Failed { step, message: e.to_string() };
    if source.repo_url.starts_with("file://") && !allow_file {
        return Err(GitError::Setup("file:// repositories are not allowed on this node".into()));
    }
    // The repository's resolved address is checked and git pinned to it
    // before anything is fetched (see `git::route`).
    let remote = route(source, home).await?;
    let local = Route::local();
    std::fs::create_dir_all(root).map_err(io("mirror"))?;
    prune(root, Duration::from_secs(UNUSED_DAYS * 86_400));
    let mirror = mirror_dir(root, app, &source.repo_url);
    let lock = lock_for(&mirror);
    let _held = lock.lock().await;
    if !mirror.join("HEAD").exists() {
        // A half-made mirror (the agent stopped during init) is started over.
        let _ = std::fs::remove_dir_all(&mirror);
        let mut init = git(home, &local, None);
        init.arg("init").arg("--quiet").arg("--bare").arg("--").arg(&mirror);
        run(init, "mirror init", None).await?;
    }
    std::fs::write(mirror.join(USED_MARKER), b"").map_err(io("mirror"))?;

    let credentials = source.credentials.as_ref();
    let secret = credentials.map(|c| c.password.as_str());
    let branch_ref = format!("refs/heads/{}", source.branch);
    let mut fetch = git(home, &remote, credentials);
    fetch
        .arg("--git-dir")
        .arg(&mirror)
        .arg("fetch")
        .arg("--quiet")
        .arg("--no-tags")
        .arg("--no-write-fetch-head")
        .arg("--")
        .arg(&remote.url)
        .arg(format!("+{branch_ref}:{branch_ref}"));
    run(fetch, "fetch", secret).await?;

    let not_on_branch = |target: &str| GitError::Failed { step: "checkout", message: format!("commit {target} is not on branch {}", source.branch) };
    let commit = match &source.commit {
        None => {
            let mut resolve = git(home, &local, None);
            resolve.arg("--git-dir").arg(&mirror).arg("rev-parse").arg("--verify").arg("--end-of-options").arg(format!("{branch_ref}^{{commit}}"));
            run(resolve, "rev-parse", None).await?
        }
        Some(target) => {
            let mut resolve = git(home, &local, None);
            resolve.arg("--git-dir").arg(&mirror).arg("rev-parse").arg("--verify").arg("--end-of-options").arg(format!("{target}^{{commit}}"));
            let commit = run(resolve, "rev-parse", None).await.map_err(|_| not_on_branch(target))?;
            // The mirror keeps objects of earlier fetches; the commit must
            // still be on the branch, as in a fresh clone of it.
            let mut on_branch = git(home, &local, None);
            on_branch.arg("--git-dir").arg(&mirror).arg("merge-base").arg("--is-ancestor").arg(&commit).arg(&branch_ref);
            run(on_branch, "merge-base", None).await.map_err(|_| not_on_branch(target))?;
            commit
        }
    };

    std::fs::create_dir_all(dir).map_err(io("checkout"))?;
    let index = dir.with_extension("index");
    let mut read_tree = git(home, &local, None);
    read_tree
        .env("GIT_INDEX_FILE", &index)
        .arg("--git-dir")
        .arg(&mirror)
        .arg("--work-tree")
        .arg(dir)
        .arg("read-tree")
        .arg("--reset")
        .arg("-u")
        .arg(&commit);
    let result = run(read_tree, "checkout", None).await;
    let _ = std::fs::remove_file(&index);
    result?;
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
        Source { repo_url: format!("file://{}", repo.display()), branch: "main".into(), commit: commit.map(str::to_string), credentials: None, ssh: None, allow_private_hosts: false }
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
