//! Exec and port-forward sessions (see `cloudweb_protocol::sessions`): on
//! `session_open` the agent dials back to the control plane with its
//! certificate and carries frames between that connection and a process
//! started in the container (`docker exec`) or a TCP connection to the
//! container's port.
//!
//! Each session is its own task with its own connection: a slow user holds
//! up only their session. The process's input is written by a task of its
//! own, so a process that does not read its input still has its output
//! passed on. When the user side goes away (the control plane closed the
//! dial-back, the agent stops), the process is ended: `SIGHUP` to its
//! process group, then `SIGKILL` two seconds later.

use std::net::IpAddr;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bollard::container::LogOutput;
use cloudweb_protocol::sessions::{terminal_size, SessionFrame, SessionOpenPayload, SessionTarget, PING_SECONDS};
use futures_util::StreamExt;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::client::ControlPlane;
use crate::runtime::DockerRuntime;

/// How long a forwarded port may take to accept the connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Starts the session in a task of its own and returns at once.
pub fn spawn(runtime: DockerRuntime, client: Arc<ControlPlane>, payload: SessionOpenPayload) {
    tokio::spawn(async move {
        let id = payload.session_id.clone();
        match run(runtime, &client, payload).await {
            Ok(()) => tracing::info!(session = %id, "session ended"),
            Err(why) => tracing::warn!(session = %id, %why, "session ended early"),
        }
    });
}

/// Reads whole frames from a byte stream.
pub struct FrameReader<R> {
    inner: R,
    buf: Vec<u8>,
}

impl<R: AsyncRead + Unpin> FrameReader<R> {
    pub fn new(inner: R) -> Self {
        FrameReader { inner, buf: Vec::with_capacity(64 * 1024) }
    }

    /// The next frame; `None` when the stream ended between frames.
    pub async fn next(&mut self) -> std::io::Result<Option<SessionFrame>> {
        loop {
            match SessionFrame::decode(&self.buf) {
                Ok(Some((frame, used))) => {
                    self.buf.drain(..used);
                    return Ok(Some(frame));
                }
                Ok(None) => {}
                Err(err) => return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, err)),
            }
            let mut chunk = [0u8; 16 * 1024];
            let n = self.inner.read(&mut chunk).await?;
            if n == 0 {
                return if self.buf.is_empty() { Ok(None) } else { Err(std::io::ErrorKind::UnexpectedEof.into()) };
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }
}

async fn run(runtime: DockerRuntime, client: &ControlPlane, payload: SessionOpenPayload) -> Result<(), String> {
    // The container is checked first, the answer sent once dialed: the
    // user reads why, not a timeout.
    let checked = runtime.session_container(&payload.container).await;
    let stream = client.dial_session(&payload.dial_url, &payload.session_id).await.map_err(|e| format!("dial-back: {e}"))?;
    let (reader, mut writer) = tokio::io::split(stream);
    let addresses = match checked {
        Ok(addresses) => addresses,
        Err(err) => {
            let _ = writer.write_all(&SessionFrame::Error(err.to_string()).encode()).await;
            return Err(err.to_string());
        }
    };
    match payload.target {
        SessionTarget::Exec { command, tty, cols, rows } => exec(&runtime, &payload.container, &command, tty, (cols, rows), FrameReader::new(reader), writer).await,
        SessionTarget::Forward { port } => forward(&addresses, port, FrameReader::new(reader), writer).await,
    }
}

/// Ends a process when dropped, unless disarmed (its pid set to 0): the
/// session's user went away, or the agent stops. The pid is learnt from
/// the Engine once the process runs (it is 0 until then).
struct EndProcess {
    pid: Arc<AtomicI32>,
}

impl Drop for EndProcess {
    fn drop(&mut self) {
        let pid = self.pid.swap(0, Ordering::SeqCst);
        if pid <= 1 {
            return;
        }
        use nix::sys::signal::{kill, Signal};
        use nix::unistd::Pid;
        // A terminal's process leads its own group; without one only the
        // process itself is known.
        let _ = kill(Pid::from_raw(-pid), Signal::SIGHUP);
        let _ = kill(Pid::from_raw(pid), Signal::SIGHUP);
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_secs(2));
            let _ = kill(Pid::from_raw(-pid), Signal::SIGKILL);
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        });
    }
}

/// Sets its flag when dropped (on every way out of the task holding it).
struct DropSignal(tokio::sync::watch::Sender<bool>);

impl Drop for DropSignal {
    fn drop(&mut self) {
        let _ = self.0.send(true);
    }
}

async fn exec<R, W>(
    runtime: &DockerRuntime,
    container: &str,
    command: &[String],
    tty: bool,
    size: (u16, u16),
    mut from_user: FrameReader<R>,
    mut to_user: W,
) -> Result<(), String>
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin,
{
    let size = if terminal_size(size.0, size.1).is_ok() { size } else { (80, 24) };
    let started = match runtime.exec_start(container, command, tty, size).await {
        Ok(started) => started,
        Err(err) => {
            let why = format!("cannot start {:?} in {container}: {err}", command[0]);
            let _ = to_user.write_all(&SessionFrame::Error(why.clone()).encode()).await;
            return Err(why);
        }
    };
    let crate::runtime::Exec { id, mut output, mut input } = started;
    let guard = EndProcess { pid: Arc::new(AtomicI32::new(0)) };
    // The Engine knows the pid (and applies a terminal's size) only once
    // the process runs, shortly after the start.
    // Input waits (2 s at most) until then, so what the user typed first
    // meets a terminal of the size asked for.
    let (ready_tx, mut ready) = tokio::sync::watch::channel(false);
    let learn = {
        let (runtime, id, pid) = (runtime.clone(), id.clone(), guard.pid.clone());
        tokio::spawn(async move {
            let _ready = DropSignal(ready_tx);
            for _ in 0..100 {
                if let Ok(status) = runtime.exec_status(&id).await {
                    if let Some(found) = status.pid.and_then(|p| i32::try_from(p).ok()).filter(|p| *p > 1) {
                        pid.store(found, Ordering::SeqCst);
                        if tty {
                            if let Err(err) = runtime.exec_resize(&id, size.0, size.1).await {
                                tracing::debug!(error = %err, "could not size an exec's terminal");
                            }
                        }
                        return;
                    }
                    if !status.running && status.exit_code.is_some() {
                        return;
                    }
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };

    // The user's frames, in a task of its own: writing input to a process
    // that does not read it must not stop its output.
    let (gone_tx, mut gone) = tokio::sync::oneshot::channel::<()>();
    let input_runtime = runtime.clone();
    let input_id = id.clone();
    let input_task = tokio::spawn(async move {
        let _ = tokio::time::timeout(Duration::from_secs(2), ready.wait_for(|ready| *ready)).await;
        let mut input_open = true;
        loop {
            match from_user.next().await {
                Ok(Some(SessionFrame::Data(bytes))) if input_open => {
                    if input.write_all(&bytes).await.is_err() || input.flush().await.is_err() {
                        input_open = false;
                    }
                }
                Ok(Some(SessionFrame::Eof)) if input_open => {
                    let _ = input.shutdown().await;
                    input_open = false;
                }
                Ok(Some(SessionFrame::Resize { cols, rows })) if tty && terminal_size(cols, rows).is_ok() => {
                    if let Err(err) = input_runtime.exec_resize(&input_id, cols, rows).await {
                        tracing::debug!(error = %err, "could not resize an exec's terminal");
                    }
                }
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => break,
            }
        }
        let _ = gone_tx.send(());
    });

    let mut ping = tokio::time::interval(Duration::from_secs(PING_SECONDS));
    ping.tick().await;
    let result = loop {
        tokio::select! {
            chunk = output.next() => {
                let bytes = match chunk {
                    Some(Ok(LogOutput::StdOut { message } | LogOutput::Console { message })) => SessionFrame::data_frames(&message, false),
                    Some(Ok(LogOutput::StdErr { message })) => SessionFrame::data_frames(&message, true),
                    Some(Ok(LogOutput::StdIn { .. })) => continue,
                    // The process closed its output: it ended.
                    Some(Err(_)) | None => break Ok(()),
                };
                if to_user.write_all(&bytes).await.is_err() {
                    break Err("the control plane closed the session".to_string());
                }
            }
            _ = &mut gone => break Err("the user closed the session".to_string()),
            _ = ping.tick() => {
                if to_user.write_all(&SessionFrame::Ping.encode()).await.is_err() {
                    break Err("the control plane closed the session".to_string());
                }
            }
        }
    };
    input_task.abort();
    learn.abort();
    if let Err(why) = result {
        // The guard ends the process.
        return Err(why);
    }
    // Its output ended; the Engine may take a moment to see it exit.
    let mut status = runtime.exec_status(&id).await;
    for _ in 0..50 {
        if !matches!(status, Ok(s) if s.running) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        status = runtime.exec_status(&id).await;
    }
    let frame = match status {
        Ok(s) if !s.running => {
            guard.pid.store(0, Ordering::SeqCst);
            SessionFrame::Exit(s.exit_code.and_then(|c| i32::try_from(c).ok()).unwrap_or(-1))
        }
        Ok(_) => SessionFrame::Error("the process closed its output but still runs; it is ended".to_string()),
        Err(err) => SessionFrame::Error(format!("cannot read the process's exit status: {err}")),
    };
    let _ = to_user.write_all(&frame.encode()).await;
    let _ = to_user.shutdown().await;
    Ok(())
}

async fn forward<R, W>(addresses: &[IpAddr], port: u16, mut from_user: FrameReader<R>, mut to_user: W) -> Result<(), String>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let Some(address) = addresses.first() else {
        let why = "the container has no address on a network".to_string();
        let _ = to_user.write_all(&SessionFrame::Error(why.clone()).encode()).await;
        return Err(why);
    };
    let tcp = match tokio::time::timeout(CONNECT_TIMEOUT, tokio::net::TcpStream::connect((*address, port))).await {
        Ok(Ok(tcp)) => tcp,
        Ok(Err(err)) => {
            let why = format!("cannot connect to port {port} of the container: {err}");
            let _ = to_user.write_all(&SessionFrame::Error(why.clone()).encode()).await;
            return Err(why);
        }
        Err(_) => {
            let why = format!("port {port} of the container did not accept a connection within {} s", CONNECT_TIMEOUT.as_secs());
            let _ = to_user.write_all(&SessionFrame::Error(why.clone()).encode()).await;
            return Err(why);
        }
    };
    let _ = tcp.set_nodelay(true);
    let (mut tcp_read, mut tcp_write) = tcp.into_split();
    let mut ping = tokio::time::interval(Duration::from_secs(PING_SECONDS));
    ping.tick().await;
    let mut read = vec![0u8; 64 * 1024];
    loop {
        tokio::select! {
            got = tcp_read.read(&mut read) => match got {
                Ok(0) | Err(_) => {
                    // The port closed the connection: the session is over.
                    let _ = to_user.write_all(&SessionFrame::Exit(0).encode()).await;
                    let _ = to_user.shutdown().await;
                    return Ok(());
                }
                Ok(n) => {
                    if to_user.write_all(&SessionFrame::data_frames(&read[..n], false)).await.is_err() {
                        return Err("the control plane closed the session".to_string());
                    }
                }
            },
            frame = from_user.next() => match frame {
                Ok(Some(SessionFrame::Data(bytes))) => {
                    if tcp_write.write_all(&bytes).await.is_err() {
                        let _ = to_user.write_all(&SessionFrame::Exit(0).encode()).await;
                        return Ok(());
                    }
                }
                Ok(Some(SessionFrame::Eof)) => {
                    let _ = tcp_write.shutdown().await;
                }
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => return Err("the user closed the session".to_string()),
            },
            _ = ping.tick() => {
                if to_user.write_all(&SessionFrame::Ping.encode()).await.is_err() {
                    return Err("the control plane closed the session".to_string());
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn frames_are_read_whole_across_reads() {
        let (mut a, b) = tokio::io::duplex(8);
        let mut bytes = SessionFrame::Data(b"hello world".to_vec()).encode();
        bytes.extend(SessionFrame::Exit(3).encode());
        tokio::spawn(async move {
            for chunk in bytes.chunks(3) {
                a.write_all(chunk).await.unwrap();
            }
        });
        let mut reader = FrameReader::new(b);
        assert_eq!(reader.next().await.unwrap(), Some(SessionFrame::Data(b"hello world".to_vec())));
        assert_eq!(reader.next().await.unwrap(), Some(SessionFrame::Exit(3)));
        assert_eq!(reader.next().await.unwrap(), None);
    }

    #[tokio::test]
    async fn a_port_forward_carries_bytes_both_ways_and_ends_when_the_port_closes() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut got = [0u8; 4];
            socket.read_exact(&mut got).await.unwrap();
            socket.write_all(&[got, *b"!!!!"].concat()).await.unwrap();
        });
        let (user_in, agent_in) = tokio::io::duplex(1024);
        let (agent_out, mut user_out) = tokio::io::duplex(1024);
        let (_, mut user_in_w) = tokio::io::split(user_in);
        user_in_w.write_all(&SessionFrame::Data(b"ping".to_vec()).encode()).await.unwrap();
        let session = tokio::spawn(async move {
            forward(&["127.0.0.1".parse().unwrap()], port, FrameReader::new(agent_in), agent_out).await
        });
        let mut reader = FrameReader::new(&mut user_out);
        let mut data = Vec::new();
        loop {
            match reader.next().await.unwrap() {
                Some(SessionFrame::Data(bytes)) => data.extend(bytes),
                Some(SessionFrame::Exit(0)) => break,
                other => panic!("unexpected {other:?}"),
            }
        }
        assert_eq!(data, b"ping!!!!");
        session.await.unwrap().unwrap();
        drop(user_in_w);
    }

    #[tokio::test]
    async fn a_closed_port_is_a_readable_error() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        drop(listener);
        let (_user, agent_in) = tokio::io::duplex(64);
        let (agent_out, mut user_out) = tokio::io::duplex(1024);
        let err = forward(&["127.0.0.1".parse().unwrap()], port, FrameReader::new(agent_in), agent_out).await.unwrap_err();
        assert!(err.contains("cannot connect"), "{err}");
        let frame = FrameReader::new(&mut user_out).next().await.unwrap();
        assert!(matches!(frame, Some(SessionFrame::Error(m)) if m.contains(&port.to_string())));
    }
}
