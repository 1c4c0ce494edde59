//! The target's side of a move: it listens on its mesh address, takes
//! exactly two connections from the source's mesh address that present the
//! move's grant (pass 1, then pass 2), writes into a staging directory,
//! checks every file's SHA-256 and the tree's digest, and only then puts
//! the copy in place as the volume. Anything else (a wrong grant, a cut
//! connection, a silent source, the deadline) removes the staging
//! directory and fails the move; the source still has everything.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use cloudweb_protocol::volume_moves::relative_path;
use cloudweb_protocol::{Frame, VolumeReceivePayload};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader, BufWriter};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use super::send::PassResult;
use super::stream::{flush, read_frame, with_deadline, write_frame, CHUNK};
use super::tree::{parents_are_directories, walk, TreeDigest};

/// Connections that fail the grant check before the move gives up.
const MAX_REFUSED: u32 = 20;

/// What the target holds from pass 1, by path: (size, mtime, SHA-256).
type Held = HashMap<String, (u64, i64, String)>;

/// Serves both passes and puts the copy in place at `volume_dir`.
pub async fn serve(
    listener: TcpListener,
    payload: &VolumeReceivePayload,
    staging: &Path,
    volume_dir: &Path,
    mut cancel: watch::Receiver<bool>,
) -> Result<PassResult, String> {
    let deadline = Instant::now() + Duration::from_secs(u64::from(payload.timeout_seconds));
    let from: IpAddr = payload.from.parse().map_err(|_| "bad source address".to_string())?;
    let mut held = Held::new();
    let mut refused = 0u32;
    let mut number = 1u8;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let accepted = tokio::select! {
            accepted = tokio::time::timeout(left, listener.accept()) => accepted,
            _ = cancel.wait_for(|c| *c) => return Err("the move was aborted".into()),
        };
        let (stream, peer) = match accepted {
            Err(_) => return Err(format!("the copy did not finish within {} s", payload.timeout_seconds)),
            Ok(Err(err)) => return Err(format!("accepting the source's connection: {err}")),
            Ok(Ok(accepted)) => accepted,
        };
        if peer.ip() != from {
            tracing::warn!(%peer, expected = %from, "a volume-move connection from another address; closed");
            continue;
        }
        let _ = stream.set_nodelay(true);
        let work = one_pass(stream, payload, number, staging, volume_dir, &mut held);
        let result = tokio::select! {
            result = tokio::time::timeout(deadline.saturating_duration_since(Instant::now()), work) => result,
            _ = cancel.wait_for(|c| *c) => return Err("the move was aborted".into()),
        };
        match result {
            Err(_) => return Err(format!("the copy did not finish within {} s", payload.timeout_seconds)),
            Ok(Err(Refusal::Grant(reason))) => {
                refused += 1;
                tracing::warn!(%peer, %reason, "refused a volume-move connection");
                if refused >= MAX_REFUSED {
                    return Err(format!("{refused} connections were refused; giving up"));
                }
            }
            Ok(Err(Refusal::Failed(reason))) => return Err(reason),
            Ok(Ok(result)) if number == 2 => return Ok(result),
            Ok(Ok(_)) => number = 2,
        }
    }
}

enum Refusal {
    /// The connection did not present this move's grant for this pass: it
    /// is closed and the move goes on waiting.
    Grant(String),
    /// The pass itself failed: the move fails.
    Failed(String),
}

async fn one_pass(stream: TcpStream, payload: &VolumeReceivePayload, number: u8, staging: &Path, volume_dir: &Path, held: &mut Held) -> Result<PassResult, Refusal> {
    let (read, write) = stream.into_split();
    let mut reader = BufReader::with_capacity(CHUNK, read);
    let mut writer = BufWriter::new(write);
    let hello = read_frame(&mut reader).await.map_err(Refusal::Grant)?;
    let refuse = |reason: String| Refusal::Grant(reason);
    match &hello {
        Frame::Hello { move_id, pass, grant } => {
            let grant_ok = constant_time_eq(grant.as_bytes(), payload.grant.as_bytes());
            if !grant_ok || *move_id != payload.move_id {
                let _ = write_frame(&mut writer, &Frame::Refused { reason: "not this move's grant".into() }).await;
                let _ = flush(&mut writer).await;
                return Err(refuse("a wrong grant".into()));
            }
            if *pass != number {
                let _ = write_frame(&mut writer, &Frame::Refused { reason: format!("expected pass {number}") }).await;
                let _ = flush(&mut writer).await;
                return Err(refuse(format!("pass {pass} while expecting pass {number}")));
            }
        }
        other => return Err(refuse(format!("{other:?} instead of a hello"))),
    }
    let failed = Refusal::Failed;
    if number == 1 {
        prepare_staging(staging, volume_dir).map_err(failed)?;
    } else {
        let mut listed: Vec<(&String, &(u64, i64, String))> = held.iter().collect();
        listed.sort_by(|a, b| a.0.cmp(b.0));
        for (path, (size, mtime_ns, _)) in listed {
            write_frame(&mut writer, &Frame::Have { path: path.clone(), size: *size, mtime_ns: *mtime_ns }).await.map_err(failed)?;
        }
    }
    write_frame(&mut writer, &Frame::Ready).await.map_err(failed)?;
    flush(&mut writer).await.map_err(failed)?;
    let result = receive_entries(&mut reader, staging, held).await;
    let result = match result {
        Ok(result) => result,
        Err(reason) => {
            let _ = write_frame(&mut writer, &Frame::Refused { reason: reason.clone() }).await;
            let _ = flush(&mut writer).await;
            return Err(Refusal::Failed(reason));
        }
    };
    if number == 2 {
        if let Err(reason) = commit(staging, volume_dir) {
            let _ = write_frame(&mut writer, &Frame::Refused { reason: reason.clone() }).await;
            let _ = flush(&mut writer).await;
            return Err(Refusal::Failed(reason));
        }
    }
    write_frame(&mut writer, &Frame::Done { digest: result.digest.clone() }).await.map_err(failed)?;
    flush(&mut writer).await.map_err(failed)?;
    Ok(result)
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// An empty staging directory, and no data of another volume of that
/// name on this node (a move never overwrites data).
fn prepare_staging(staging: &Path, volume_dir: &Path) -> Result<(), String> {
    if let Ok(mut entries) = std::fs::read_dir(volume_dir) {
        if entries.next().is_some() {
            return Err(format!("this node holds data at {} already; it is never overwritten", volume_dir.display()));
        }
    }
    match std::fs::remove_dir_all(staging) {
        Ok(()) => {}
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
        Err(err) => return Err(format!("cannot clear {}: {err}", staging.display())),
    }
    std::fs::create_dir_all(staging).map_err(|e| format!("cannot create {}: {e}", staging.display()))
}

/// Puts the staging directory in place as the volume, after flushing it
/// to disk.
fn commit(staging: &Path, volume_dir: &Path) -> Result<(), String> {
    // SAFETY: sync(2) takes no arguments and cannot fail.
    unsafe { libc::sync() };
    match std::fs::remove_dir(volume_dir) {
        Ok(()) => {}
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
        Err(err) => return Err(format!("{} is in the way: {err}", volume_dir.display())),
    }
    std::fs::rename(staging, volume_dir).map_err(|e| format!("cannot move the copy into place at {}: {e}", volume_dir.display()))
}

async fn receive_entries<R: tokio::io::AsyncRead + Unpin>(reader: &mut R, staging: &Path, held: &mut Held) -> Result<PassResult, String> {
    let mut digest = TreeDigest::default();
    let mut mentioned: HashSet<String> = HashSet::new();
    let mut modes: Vec<(PathBuf, u32)> = Vec::new();
    let (mut files, mut bytes) = (0u64, 0u64);
    let mut buffer = vec![0u8; CHUNK];
    loop {
        let frame = read_frame(reader).await?;
        match frame {
            Frame::Dir { path, mode, uid, gid } => {
                let target = if path.is_empty() {
                    staging.to_path_buf()
                } else {
                    checked(staging, &path)?;
                    let target = staging.join(&path);
                    match std::fs::symlink_metadata(&target) {
                        Ok(meta) if meta.is_dir() => {}
                        Ok(_) => {
                            std::fs::remove_file(&target).map_err(|e| format!("{path}: {e}"))?;
                            std::fs::create_dir(&target).map_err(|e| format!("{path}: {e}"))?;
                        }
                        Err(_) => std::fs::create_dir(&target).map_err(|e| format!("{path}: {e}"))?,
                    }
                    target
                };
                let _ = std::os::unix::fs::lchown(&target, Some(uid), Some(gid));
                modes.push((target, mode));
                digest.dir(&path);
                mentioned.insert(path);
            }
            Frame::Link { path, target, uid, gid } => {
                checked(staging, &path)?;
                let at = staging.join(&path);
                clear(&at)?;
                std::os::unix::fs::symlink(&target, &at).map_err(|e| format!("{path}: {e}"))?;
                let _ = std::os::unix::fs::lchown(&at, Some(uid), Some(gid));
                digest.link(&path, &target);
                mentioned.insert(path);
            }
            Frame::File { path, size, mode, uid, gid, mtime_ns } => {
                checked(staging, &path)?;
                let at = staging.join(&path);
                clear(&at)?;
                let sha = write_content(reader, &at, size, &mut buffer).await?;
                match read_frame(reader).await? {
                    Frame::Checksum { sha256 } if sha256 == sha => {}
                    Frame::Checksum { sha256 } => return Err(format!("{path}: arrived with SHA-256 {sha}, sent with {sha256}")),
                    other => return Err(format!("{path}: expected its checksum, got {other:?}")),
                }
                let file = std::fs::File::options().write(true).open(&at).map_err(|e| format!("{path}: {e}"))?;
                let modified = std::time::UNIX_EPOCH + Duration::from_nanos(u64::try_from(mtime_ns.max(0)).unwrap_or(0));
                file.set_modified(modified).map_err(|e| format!("{path}: {e}"))?;
                let _ = std::os::unix::fs::lchown(&at, Some(uid), Some(gid));
                std::fs::set_permissions(&at, std::fs::Permissions::from_mode(mode)).map_err(|e| format!("{path}: {e}"))?;
                files += 1;
                bytes += size;
                digest.file(&path, size, &sha);
                held.insert(path.clone(), (size, mtime_ns, sha));
                mentioned.insert(path);
            }
            Frame::Same { path } => {
                checked(staging, &path)?;
                let Some((size, _, sha)) = held.get(&path) else { return Err(format!("{path}: said unchanged, but this node never got it")) };
                if !staging.join(&path).is_file() {
                    return Err(format!("{path}: said unchanged, but it is not here"));
                }
                files += 1;
                digest.file(&path, *size, sha);
                mentioned.insert(path);
            }
            Frame::End { files: their_files, bytes: _, digest: theirs } => {
                remove_unmentioned(staging, &mentioned, held)?;
                for (dir, mode) in modes.iter().rev() {
                    let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(*mode));
                }
                let ours = digest.finish();
                if ours != theirs || their_files != files {
                    return Err(format!("the copy has digest {ours} ({files} files), the source sent {theirs} ({their_files} files)"));
                }
                return Ok(PassResult { files, bytes, digest: ours });
            }
            other => return Err(format!("unexpected {other:?}")),
        }
    }
}

fn checked(staging: &Path, path: &str) -> Result<(), String> {
    relative_path(path).map_err(|e| format!("{path:?}: {e}"))?;
    parents_are_directories(staging, path)
}

/// Removes whatever is at `at` (a file, a link or a directory tree).
fn clear(at: &Path) -> Result<(), String> {
    match std::fs::symlink_metadata(at) {
        Err(_) => Ok(()),
        Ok(meta) if meta.is_dir() => std::fs::remove_dir_all(at).map_err(|e| format!("{}: {e}", at.display())),
        Ok(_) => std::fs::remove_file(at).map_err(|e| format!("{}: {e}", at.display())),
    }
}

/// What the source no longer has goes from the copy too.
fn remove_unmentioned(staging: &Path, mentioned: &HashSet<String>, held: &mut Held) -> Result<(), String> {
    let entries = walk(staging)?;
    for entry in entries.iter().rev() {
        if !mentioned.contains(&entry.path) {
            clear(&staging.join(&entry.path))?;
            held.remove(&entry.path);
        }
    }
    held.retain(|path, _| mentioned.contains(path));
    Ok(())
}

async fn write_content<R: tokio::io::AsyncRead + Unpin>(reader: &mut R, at: &Path, size: u64, buffer: &mut [u8]) -> Result<String, String> {
    let mut hasher = Sha256::new();
    let file = tokio::fs::File::create(at).await.map_err(|e| format!("cannot create {}: {e}", at.display()))?;
    let mut file = tokio::io::BufWriter::with_capacity(CHUNK, file);
    let mut left = size;
    while left > 0 {
        let want = buffer.len().min(usize::try_from(left).unwrap_or(usize::MAX));
        with_deadline(reader.read_exact(&mut buffer[..want]), "receiving a file").await?;
        hasher.update(&buffer[..want]);
        file.write_all(&buffer[..want]).await.map_err(|e| format!("cannot write {}: {e}", at.display()))?;
        left -= want as u64;
    }
    file.flush().await.map_err(|e| format!("cannot write {}: {e}", at.display()))?;
    Ok(hex::encode(hasher.finalize()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::volume_moves::send;

    fn payload(grant: &str) -> VolumeReceivePayload {
        VolumeReceivePayload {
            move_id: "mv_0123456789abcdef".into(),
            volume: "files".into(),
            grant: grant.into(),
            listen: "127.0.0.1".into(),
            from: "127.0.0.1".into(),
            timeout_seconds: 60,
        }
    }

    /// A receiver on loopback: its address, its task, and what cancels it.
    async fn start_receiver(
        grant: &str,
        staging: &Path,
        volume_dir: &Path,
    ) -> (String, tokio::task::JoinHandle<Result<PassResult, String>>, watch::Sender<bool>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let to = listener.local_addr().unwrap().to_string();
        let (cancel, cancelled) = watch::channel(false);
        let (payload, staging, volume_dir) = (payload(grant), staging.to_path_buf(), volume_dir.to_path_buf());
        let receiver = tokio::spawn(async move { serve(listener, &payload, &staging, &volume_dir, cancelled).await });
        (to, receiver, cancel)
    }

    /// A wrong grant is refused and the receiver waits on; the right one
    /// copies a tree in two passes (the second sends only what changed and
    /// removes what the source deleted), and the copy is put in place.
    #[tokio::test]
    async fn two_passes_copy_a_tree_and_a_wrong_grant_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let source = dir.path().join("source");
        std::fs::create_dir_all(source.join("a/b")).unwrap();
        std::fs::write(source.join("a/b/one"), b"one").unwrap();
        std::fs::write(source.join("gone"), b"deleted before pass 2").unwrap();
        std::os::unix::fs::symlink("a/b/one", source.join("link")).unwrap();
        let (staging, volume_dir) = (dir.path().join("staging"), dir.path().join("volume"));
        let grant = "ab".repeat(32);
        let (to, receiver, _cancel) = start_receiver(&grant, &staging, &volume_dir).await;
        let mut sent = send::Sent::new();
        let wrong = send::pass(send::connect(&to).await.unwrap(), &source, "mv_0123456789abcdef", &"cd".repeat(32), 1, &mut sent).await;
        assert!(wrong.unwrap_err().contains("refused"));
        let first = send::pass(send::connect(&to).await.unwrap(), &source, "mv_0123456789abcdef", &grant, 1, &mut sent).await.unwrap();
        assert_eq!(first.files, 2);
        std::fs::remove_file(source.join("gone")).unwrap();
        std::fs::write(source.join("a/new"), b"written between the passes").unwrap();
        let second = send::pass(send::connect(&to).await.unwrap(), &source, "mv_0123456789abcdef", &grant, 2, &mut sent).await.unwrap();
        assert_eq!(second.bytes, "written between the passes".len() as u64, "only the new file is sent again");
        let received = receiver.await.unwrap().unwrap();
        assert_eq!(received.digest, second.digest);
        assert_eq!(std::fs::read(volume_dir.join("a/b/one")).unwrap(), b"one");
        assert_eq!(std::fs::read(volume_dir.join("a/new")).unwrap(), b"written between the passes");
        assert!(!volume_dir.join("gone").exists());
        assert_eq!(std::fs::read_link(volume_dir.join("link")).unwrap(), Path::new("a/b/one"));
        assert!(!staging.exists());
    }

    /// A sender that tries to write outside the volume (a `..` path, or a
    /// path through a symlink it sent) fails the move; nothing is written
    /// outside the staging directory.
    #[tokio::test]
    async fn paths_out_of_the_volume_fail_the_copy() {
        for attack in [vec![Frame::Dir { path: "../escape".into(), mode: 0o755, uid: 0, gid: 0 }], vec![
            Frame::Link { path: "l".into(), target: "/tmp".into(), uid: 0, gid: 0 },
            Frame::File { path: "l/escape".into(), size: 1, mode: 0o644, uid: 0, gid: 0, mtime_ns: 0 },
        ]] {
            let dir = tempfile::tempdir().unwrap();
            let (staging, volume_dir) = (dir.path().join("in/staging"), dir.path().join("volume"));
            let grant = "ab".repeat(32);
            let (to, receiver, _cancel) = start_receiver(&grant, &staging, &volume_dir).await;
            let stream = TcpStream::connect(&to).await.unwrap();
            let (mut read, mut write) = stream.into_split();
            write_frame(&mut write, &Frame::Hello { move_id: "mv_0123456789abcdef".into(), pass: 1, grant }).await.unwrap();
            assert_eq!(read_frame(&mut read).await.unwrap(), Frame::Ready);
            write_frame(&mut write, &Frame::Dir { path: String::new(), mode: 0o755, uid: 0, gid: 0 }).await.unwrap();
            for frame in &attack {
                write_frame(&mut write, frame).await.unwrap();
            }
            let _ = write.write_all(b"x").await;
            let outcome = receiver.await.unwrap();
            assert!(outcome.is_err(), "{attack:?}");
            assert!(!dir.path().join("in/escape").exists() && !Path::new("/tmp/escape").exists());
            assert!(!volume_dir.exists());
        }
    }

    #[test]
    fn grants_compare_in_constant_time_and_exactly() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"abcd"));
    }
}
