//! The source's side of a move: two passes over the same tree. The first
//! copies everything while the app runs; then the containers of this node
//! that mount the volume stop, and the second sends only what changed
//! since (the target lists what it holds), so the app is down only for
//! that second pass and its restart on the target.

use std::collections::HashMap;
use std::path::Path;

use cloudweb_protocol::Frame;
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader, BufWriter};
use tokio::net::TcpStream;

use super::stream::{flush, read_frame, with_deadline, write_frame, CHUNK};
use super::tree::{walk, Kind, TreeDigest};

/// What the first pass learned about each file it sent: (size, mtime) →
/// its SHA-256, so the second pass names an unchanged file without
/// reading it again.
pub type Sent = HashMap<String, (u64, i64, String)>;

/// The outcome of one pass: files, bytes of content sent, digest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PassResult {
    pub files: u64,
    pub bytes: u64,
    pub digest: String,
}

pub async fn connect(to: &str) -> Result<TcpStream, String> {
    match tokio::time::timeout(std::time::Duration::from_secs(10), TcpStream::connect(to)).await {
        Ok(Ok(stream)) => {
            let _ = stream.set_nodelay(true);
            Ok(stream)
        }
        Ok(Err(err)) => Err(format!("cannot reach the target at {to}: {err}")),
        Err(_) => Err(format!("the target at {to} did not answer within 10 s")),
    }
}

/// One pass: hello, (for pass 2) the target's list of what it holds, then
/// every entry of the tree, then the end and the target's verdict.
pub async fn pass(stream: TcpStream, root: &Path, move_id: &str, grant: &str, number: u8, sent: &mut Sent) -> Result<PassResult, String> {
    let (read, write) = stream.into_split();
    let mut reader = BufReader::new(read);
    let mut writer = BufWriter::with_capacity(CHUNK, write);
    write_frame(&mut writer, &Frame::Hello { move_id: move_id.to_string(), pass: number, grant: grant.to_string() }).await?;
    flush(&mut writer).await?;
    let mut have: HashMap<String, (u64, i64)> = HashMap::new();
    loop {
        match read_frame(&mut reader).await? {
            Frame::Ready => break,
            Frame::Have { path, size, mtime_ns } => {
                if have.len() > 10_000_000 {
                    return Err("the target listed more than 10 million files".into());
                }
                have.insert(path, (size, mtime_ns));
            }
            Frame::Refused { reason } => return Err(format!("the target refused: {reason}")),
            other => return Err(format!("the target sent {other:?} before it was ready")),
        }
    }
    let entries = {
        let root = root.to_path_buf();
        tokio::task::spawn_blocking(move || walk(&root)).await.map_err(|e| e.to_string())??
    };
    let mut digest = TreeDigest::default();
    // The volume's root first (path ""), for its owner and mode: a
    // database's data directory must keep them.
    let meta = std::fs::metadata(root).map_err(|e| format!("{}: {e}", root.display()))?;
    {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let frame = Frame::Dir { path: String::new(), mode: meta.permissions().mode() & 0o7777, uid: meta.uid(), gid: meta.gid() };
        write_frame(&mut writer, &frame).await?;
    }
    digest.dir("");
    let (mut files, mut bytes) = (0u64, 0u64);
    let mut buffer = vec![0u8; CHUNK];
    for entry in entries {
        let (uid, gid) = (entry.uid, entry.gid);
        match entry.kind {
            Kind::Dir { mode } => {
                digest.dir(&entry.path);
                write_frame(&mut writer, &Frame::Dir { path: entry.path, mode, uid, gid }).await?;
            }
            Kind::Link { target } => {
                digest.link(&entry.path, &target);
                write_frame(&mut writer, &Frame::Link { path: entry.path, target, uid, gid }).await?;
            }
            Kind::File { size, mode, mtime_ns } => {
                files += 1;
                let known = sent.get(&entry.path).filter(|(s, m, _)| *s == size && *m == mtime_ns).map(|(_, _, sha)| sha.clone());
                if let (Some(sha), Some(&(their_size, their_mtime))) = (known, have.get(&entry.path)) {
                    if their_size == size && their_mtime == mtime_ns {
                        digest.file(&entry.path, size, &sha);
                        write_frame(&mut writer, &Frame::Same { path: entry.path }).await?;
                        continue;
                    }
                }
                write_frame(&mut writer, &Frame::File { path: entry.path.clone(), size, mode, uid, gid, mtime_ns }).await?;
                let sha = send_content(&mut writer, &root.join(&entry.path), size, &mut buffer).await?;
                bytes += size;
                digest.file(&entry.path, size, &sha);
                write_frame(&mut writer, &Frame::Checksum { sha256: sha.clone() }).await?;
                sent.insert(entry.path, (size, mtime_ns, sha));
            }
        }
    }
    let ours = digest.finish();
    write_frame(&mut writer, &Frame::End { files, bytes, digest: ours.clone() }).await?;
    flush(&mut writer).await?;
    match read_frame(&mut reader).await? {
        Frame::Done { digest } if digest == ours => Ok(PassResult { files, bytes, digest }),
        Frame::Done { digest } => Err(format!("the target's copy has digest {digest}, this node's {ours}")),
        Frame::Refused { reason } => Err(format!("the target refused the copy: {reason}")),
        other => Err(format!("the target answered {other:?}")),
    }
}

/// Sends exactly `size` bytes of the file (it was measured just before):
/// one that shrank since is padded with zeros, one that grew is cut at
/// `size`. Either way its mtime changed, so the second pass sends it again.
async fn send_content<W: tokio::io::AsyncWrite + Unpin>(writer: &mut W, path: &Path, size: u64, buffer: &mut [u8]) -> Result<String, String> {
    let mut hasher = Sha256::new();
    let mut file = tokio::fs::File::open(path).await.map_err(|e| format!("cannot open {}: {e}", path.display()))?;
    let mut left = size;
    while left > 0 {
        let want = buffer.len().min(usize::try_from(left).unwrap_or(usize::MAX));
        let got = file.read(&mut buffer[..want]).await.map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let chunk: &[u8] = if got == 0 {
            buffer[..want].fill(0);
            &buffer[..want]
        } else {
            &buffer[..got]
        };
        hasher.update(chunk);
        with_deadline(writer.write_all(chunk), "sending").await?;
        left -= chunk.len() as u64;
    }
    Ok(hex::encode(hasher.finalize()))
}
