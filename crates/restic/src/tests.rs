//! Against the real restic, on a repository in a temporary directory.

use std::collections::BTreeMap;
use std::time::Duration;

use super::*;

const LIMIT: Duration = Duration::from_secs(60);

fn restic(dir: &Path, password: &str) -> Restic {
    let repository = Repository { url: dir.join("repo").to_string_lossy().into_owned(), password: password.into(), env: BTreeMap::new() };
    Restic::new(repository, &dir.join("cache"))
}

#[tokio::test]
async fn backs_up_and_restores_a_directory_and_a_stream() {
    let dir = tempfile::tempdir().unwrap();
    let repo = restic(dir.path(), "correct horse battery staple");
    repo.init(LIMIT).await.unwrap();
    assert_eq!(repo.init(LIMIT).await, Err(ResticError::AlreadyInitialized));
    let data = dir.path().join("data");
    std::fs::create_dir_all(data.join("sub")).unwrap();
    std::fs::write(data.join("a.txt"), b"alpha").unwrap();
    std::fs::write(data.join("sub/b.bin"), vec![7u8; 100_000]).unwrap();
    let tags = vec!["cloudweb".to_string(), "target=volume/data".to_string()];
    let summary = repo.backup_dir(&data, &tags, LIMIT).await.unwrap();
    assert_eq!(summary.total_files_processed, 2);
    assert_eq!(summary.total_bytes_processed, 100_005);

    let out = dir.path().join("out");
    repo.restore(&summary.snapshot_id, &out, LIMIT).await.unwrap();
    assert_eq!(std::fs::read(out.join("a.txt")).unwrap(), b"alpha");
    assert_eq!(std::fs::read(out.join("sub/b.bin")).unwrap(), vec![7u8; 100_000]);

    let stream = repo
        .backup_stdin("dump.pgdump", &tags, LIMIT, &b"a dump"[..], async { Ok(()) })
        .await
        .unwrap();
    let mut back = Vec::new();
    assert_eq!(repo.dump(&stream.snapshot_id, "dump.pgdump", &mut back, LIMIT).await.unwrap(), 6);
    assert_eq!(back, b"a dump");
    let listed = repo.snapshots(&tags, LIMIT).await.unwrap();
    assert_eq!(listed.len(), 2);
    assert!(listed.iter().any(|s| s.short_id == summary.snapshot_id));
    repo.check(100, LIMIT).await.unwrap();
    repo.forget_prune("target=volume/data", Retention { keep_daily: 1, keep_weekly: 0, keep_monthly: 0 }, LIMIT).await.unwrap();
    assert_eq!(repo.snapshots(&tags, LIMIT).await.unwrap().len(), 1, "one daily snapshot kept");
}

#[tokio::test]
async fn a_failed_feed_makes_no_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let repo = restic(dir.path(), "correct horse battery staple");
    repo.init(LIMIT).await.unwrap();
    let err = repo
        .backup_stdin("dump.pgdump", &[], LIMIT, &vec![1u8; 1 << 20][..], async { Err("pg_dump exited with 1".to_string()) })
        .await
        .unwrap_err();
    assert_eq!(err, ResticError::Io("pg_dump exited with 1".into()));
    tokio::time::sleep(Duration::from_millis(500)).await;
    repo.unlock(LIMIT).await.unwrap();
    assert!(repo.snapshots(&[], LIMIT).await.unwrap().is_empty(), "a cut dump is no snapshot");
}

#[tokio::test]
async fn a_wrong_password_or_no_repository_is_said_in_words() {
    let dir = tempfile::tempdir().unwrap();
    restic(dir.path(), "correct horse battery staple").init(LIMIT).await.unwrap();
    let wrong = restic(dir.path(), "not the right password at all");
    let err = wrong.snapshots(&[], LIMIT).await.unwrap_err();
    assert!(matches!(err, ResticError::WrongPassword(_)), "{err:?}");
    assert!(!err.to_string().contains("not the right password"), "{err}");
    let other = tempfile::tempdir().unwrap();
    let err = restic(other.path(), "correct horse battery staple").open(LIMIT).await.unwrap_err();
    assert!(matches!(err, ResticError::NoRepository(_)), "{err:?}");
    let unreachable = Restic::new(
        Repository {
            url: "s3:http://127.0.0.1:9/bucket/x".into(),
            password: "correct horse battery staple".into(),
            env: BTreeMap::from([("AWS_ACCESS_KEY_ID".into(), "id".into()), ("AWS_SECRET_ACCESS_KEY".into(), "a-secret-key".into())]),
        },
        &dir.path().join("cache"),
    );
    let err = unreachable.open(Duration::from_secs(30)).await.unwrap_err();
    assert!(err.is_transient(), "{err:?}");
    assert!(!err.to_string().contains("a-secret-key"), "{err}");
}

#[tokio::test]
async fn a_run_over_its_limit_is_killed() {
    let dir = tempfile::tempdir().unwrap();
    let repo = restic(dir.path(), "correct horse battery staple");
    repo.init(LIMIT).await.unwrap();
    let started = std::time::Instant::now();
    let err = repo
        .backup_stdin("slow", &[], Duration::from_secs(1), &b"x"[..], async {
            tokio::time::sleep(Duration::from_secs(30)).await;
            Ok(())
        })
        .await
        .unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(10), "{:?}", started.elapsed());
    assert!(matches!(err, ResticError::Io(ref text) if text.contains("limit")), "{err:?}");
}

/// The names of the lock files in the repository at `dir` (restic names
/// each by its 64-hex-digit id; a file it is still writing has another name).
fn locks(dir: &Path) -> Vec<String> {
    let names = std::fs::read_dir(dir.join("repo").join("locks")).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned());
    names.filter(|n| n.len() == 64 && n.bytes().all(|b| b.is_ascii_hexdigit())).collect()
}

/// A restic killed mid-backup leaves its lock; `forget --prune` needs an
/// exclusive one, which restic refuses while that lock is there, until the
/// stale lock is removed.
#[tokio::test]
async fn a_killed_restics_lock_does_not_block_retention() {
    let dir = tempfile::tempdir().unwrap();
    let repo = restic(dir.path(), "correct horse battery staple");
    repo.init(LIMIT).await.unwrap();
    repo.backup_stdin("dump.pgdump", &["target=service/db".to_string()], LIMIT, &b"one"[..], async { Ok(()) }).await.unwrap();
    assert_eq!(locks(dir.path()).len(), 0, "a finished backup leaves no lock");
    // Killed mid-backup, once it holds its lock (opening the repository
    // first takes restic a while, longer on a loaded machine): the dump
    // fails, and a failed dump kills restic with its input still open.
    let killed = repo
        .backup_stdin("slow", &[], LIMIT, &b"x"[..], async {
            let deadline = std::time::Instant::now() + LIMIT / 2;
            while locks(dir.path()).is_empty() {
                if std::time::Instant::now() > deadline {
                    return Err("restic took no lock".to_string());
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err("the dump failed".to_string())
        })
        .await;
    assert!(matches!(killed, Err(ResticError::Io(ref text)) if text == "the dump failed"), "{killed:?}");
    assert_eq!(locks(dir.path()).len(), 1, "the killed backup's lock");
    let retention = Retention { keep_daily: 1, keep_weekly: 0, keep_monthly: 0 };
    let plain = repo.forget_prune("target=service/db", retention, LIMIT).await;
    assert!(matches!(plain, Err(ResticError::Locked(_))), "the dead restic's lock is still there: {plain:?}");
    repo.retry_locked_clearing_stale(3, Duration::from_millis(200), || repo.forget_prune("target=service/db", retention, LIMIT)).await.unwrap();
}

#[tokio::test]
async fn retention_groups_a_targets_snapshots_whatever_their_job_tags() {
    let dir = tempfile::tempdir().unwrap();
    let repo = restic(dir.path(), "correct horse battery staple");
    repo.init(LIMIT).await.unwrap();
    for job in ["job=bj_1", "job=bj_2", "job=bj_3"] {
        let tags = vec!["target=service/db".to_string(), job.to_string()];
        repo.backup_stdin("dump.pgdump", &tags, LIMIT, job.as_bytes(), async { Ok(()) }).await.unwrap();
    }
    let other = vec!["target=service/other".to_string(), "job=bj_4".to_string()];
    repo.backup_stdin("dump.pgdump", &other, LIMIT, &b"other"[..], async { Ok(()) }).await.unwrap();
    repo.forget_prune("target=service/db", Retention { keep_daily: 1, keep_weekly: 0, keep_monthly: 0 }, LIMIT).await.unwrap();
    assert_eq!(repo.snapshots(&["target=service/db".to_string()], LIMIT).await.unwrap().len(), 1, "one daily snapshot of the target kept");
    assert_eq!(repo.snapshots(&["target=service/other".to_string()], LIMIT).await.unwrap().len(), 1, "another target's are left alone");
    repo.forget_prune_hourly("target=service/other", 1, 1, LIMIT).await.unwrap();
    assert_eq!(repo.snapshots(&[], LIMIT).await.unwrap().len(), 2);
}
