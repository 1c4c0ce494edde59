//! Frames on the agent-to-agent stream of a volume move: a 4-byte
//! big-endian length, then that many bytes of JSON
//! ([`cloudweb_protocol::Frame`]). Every read and write has a deadline, so
//! a silent or vanished peer ends the move within a bound.

use std::time::Duration;

use cloudweb_protocol::volume_moves::MAX_FRAME;
use cloudweb_protocol::Frame;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Longest a peer may stay silent in the middle of a move.
pub const IDLE: Duration = Duration::from_secs(30);
/// Size of the buffers between disk and socket.
pub const CHUNK: usize = 256 * 1024;

pub async fn write_frame<W: AsyncWrite + Unpin>(writer: &mut W, frame: &Frame) -> Result<(), String> {
    let body = serde_json::to_vec(frame).map_err(|e| e.to_string())?;
    if body.len() > MAX_FRAME {
        return Err(format!("a frame of {} bytes is longer than {MAX_FRAME}", body.len()));
    }
    let write = async {
        writer.write_all(&(body.len() as u32).to_be_bytes()).await?;
        writer.write_all(&body).await
    };
    with_deadline(write, "sending").await
}

pub async fn read_frame<R: AsyncRead + Unpin>(reader: &mut R) -> Result<Frame, String> {
    let mut length = [0u8; 4];
    with_deadline(reader.read_exact(&mut length), "waiting for the peer").await?;
    let length = u32::from_be_bytes(length) as usize;
    if length == 0 || length > MAX_FRAME {
        return Err(format!("the peer sent a frame of {length} bytes"));
    }
    let mut body = vec![0u8; length];
    with_deadline(reader.read_exact(&mut body), "waiting for the peer").await?;
    serde_json::from_slice(&body).map_err(|e| format!("the peer sent a frame this agent cannot read: {e}"))
}

pub async fn flush<W: AsyncWrite + Unpin>(writer: &mut W) -> Result<(), String> {
    with_deadline(writer.flush(), "sending").await
}

pub async fn with_deadline<T>(work: impl std::future::Future<Output = std::io::Result<T>>, doing: &str) -> Result<T, String> {
    match tokio::time::timeout(IDLE, work).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(err)) if err.kind() == std::io::ErrorKind::UnexpectedEof => Err(format!("the peer closed the connection while {doing}")),
        Ok(Err(err)) => Err(format!("{doing}: {err}")),
        Err(_) => Err(format!("the peer was silent for {} s while {doing}", IDLE.as_secs())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn frames_round_trip_and_bad_lengths_are_refused() {
        let (mut a, mut b) = tokio::io::duplex(1 << 16);
        write_frame(&mut a, &Frame::Same { path: "x".into() }).await.unwrap();
        assert_eq!(read_frame(&mut b).await.unwrap(), Frame::Same { path: "x".into() });
        a.write_all(&(10_000_000u32).to_be_bytes()).await.unwrap();
        assert!(read_frame(&mut b).await.unwrap_err().contains("10000000 bytes"));
        drop(a);
        assert!(read_frame(&mut b).await.unwrap_err().contains("closed"));
    }
}
