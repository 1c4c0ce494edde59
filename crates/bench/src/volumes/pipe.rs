//! The baseline a volume move is held against: `tar -cf -` of the volume
//! in the source node's namespace, its output over one TCP connection to
//! the target node's mesh address (the path the agents' copy takes), into
//! `tar -xf -` in a fresh directory next to the target's volumes. The two
//! ends of the connection are threads of this process, each in its node's
//! namespace (setns(2) changes the calling thread alone), copying 256 KiB
//! at a time (the agents' own buffer size) between the socket and the tar
//! processes' pipes; no checksums, no sync.

use std::fs::File;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::path::Path;
use std::process::{Child, ChildStderr, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};

/// The agents' buffer between disk and socket (`volume_moves::stream::CHUNK`).
const CHUNK: usize = 256 * 1024;
/// How long the receiving end waits for the connection, and either end
/// for the other in the middle of the copy.
const IDLE: Duration = Duration::from_secs(30);

/// One transfer: from `from_dir` in namespace `from_ns` to `to_dir` in
/// `to_ns`, over TCP to `to_address`.
pub struct Ends<'a> {
    pub from_ns: &'a str,
    pub to_ns: &'a str,
    pub to_address: Ipv4Addr,
    pub from_dir: &'a Path,
    pub to_dir: &'a Path,
}

/// Enters network namespace `name` (`/var/run/netns/<name>`) on this thread.
fn enter(name: &str) -> Result<()> {
    let file = File::open(Path::new("/var/run/netns").join(name)).with_context(|| format!("opening namespace {name}"))?;
    // SAFETY: setns only reads the descriptor; it changes this thread alone.
    if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        bail!("setns {name}: {}", std::io::Error::last_os_error());
    }
    Ok(())
}

/// A tar process, killed (and reaped) if it is dropped before [`Tar::finish`].
struct Tar {
    child: Option<Child>,
    what: &'static str,
}

impl Tar {
    fn spawn(what: &'static str, command: &mut Command) -> Result<Tar> {
        let child = command.stderr(Stdio::piped()).spawn().with_context(|| format!("starting {what}"))?;
        Ok(Tar { child: Some(child), what })
    }

    fn child(&mut self) -> &mut Child {
        self.child.as_mut().expect("a running tar")
    }

    /// Waits for it; fails with its stderr unless it exited 0.
    fn finish(mut self) -> Result<()> {
        let mut child = self.child.take().expect("a running tar");
        let mut stderr = String::new();
        if let Some(mut pipe) = child.stderr.take() {
            let _ = <ChildStderr as Read>::read_to_string(&mut pipe, &mut stderr);
        }
        let status = child.wait().with_context(|| format!("waiting for {}", self.what))?;
        if !status.success() {
            bail!("{} failed ({status}): {}", self.what, stderr.trim());
        }
        Ok(())
    }
}

impl Drop for Tar {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Copies until `from` ends; the bytes copied.
fn copy(from: &mut impl Read, to: &mut impl Write, buffer: &mut [u8]) -> Result<u64> {
    let mut total = 0u64;
    loop {
        let got = match from.read(buffer) {
            Ok(0) => return Ok(total),
            Ok(got) => got,
            Err(err) if err.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(err) => return Err(err.into()),
        };
        to.write_all(&buffer[..got])?;
        total += got as u64;
    }
}

/// The receiving end: listens on the target's mesh address (its port
/// goes to the sender), takes one connection and feeds it to `tar -x`.
fn receive(ends: &Ends, port: mpsc::Sender<u16>, sender_gave_up: &AtomicBool) -> Result<u64> {
    enter(ends.to_ns)?;
    let mut tar = Tar::spawn("tar -x", Command::new("tar").arg("-C").arg(ends.to_dir).args(["-xf", "-"]).stdin(Stdio::piped()).stdout(Stdio::null()))?;
    let listener = TcpListener::bind((ends.to_address, 0)).with_context(|| format!("listening on {} in {}", ends.to_address, ends.to_ns))?;
    port.send(listener.local_addr()?.port()).map_err(|_| anyhow!("the sending end is gone"))?;
    listener.set_nonblocking(true)?;
    let waited = Instant::now();
    let mut stream = loop {
        match listener.accept() {
            Ok((stream, _)) => break stream,
            Err(err) if err.kind() == std::io::ErrorKind::WouldBlock => {
                if sender_gave_up.load(Ordering::SeqCst) {
                    bail!("the sending end gave up before it connected");
                }
                if waited.elapsed() > IDLE {
                    bail!("no connection within {} s", IDLE.as_secs());
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            Err(err) => return Err(err).context("accepting the connection"),
        }
    };
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(IDLE))?;
    let mut stdin = tar.child().stdin.take().context("tar -x's stdin")?;
    let copied = copy(&mut stream, &mut stdin, &mut vec![0u8; CHUNK]).context("socket -> tar -x")?;
    drop(stdin);
    tar.finish()?;
    Ok(copied)
}

/// The sending end: `tar -c` of the directory, to the receiving end.
fn send(ends: &Ends, port: mpsc::Receiver<u16>) -> Result<u64> {
    enter(ends.from_ns)?;
    let port = port.recv_timeout(IDLE).map_err(|_| anyhow!("the receiving end did not listen within {} s", IDLE.as_secs()))?;
    let to = SocketAddr::from((ends.to_address, port));
    let mut stream = TcpStream::connect_timeout(&to, Duration::from_secs(10)).with_context(|| format!("connecting to {to} from {}", ends.from_ns))?;
    // As the agents' stream is set.
    stream.set_nodelay(true)?;
    stream.set_write_timeout(Some(IDLE))?;
    let mut tar = Tar::spawn("tar -c", Command::new("tar").arg("-C").arg(ends.from_dir).args(["-cf", "-", "."]).stdin(Stdio::null()).stdout(Stdio::piped()))?;
    let mut stdout = tar.child().stdout.take().context("tar -c's stdout")?;
    let copied = copy(&mut stdout, &mut stream, &mut vec![0u8; CHUNK]).context("tar -c -> socket")?;
    stream.shutdown(Shutdown::Write)?;
    tar.finish()?;
    Ok(copied)
}

/// One transfer, timed from before either tar starts until both have
/// exited; the wall clock and the bytes of tar stream sent.
pub fn tar_over(ends: &Ends) -> Result<(Duration, u64)> {
    if ends.to_dir.exists() {
        bail!("{} exists already", ends.to_dir.display());
    }
    std::fs::create_dir_all(ends.to_dir)?;
    let started = Instant::now();
    let gave_up = AtomicBool::new(false);
    let (port_tx, port_rx) = mpsc::channel();
    let (received, sent) = std::thread::scope(|scope| {
        let receiver = scope.spawn(|| receive(ends, port_tx, &gave_up));
        let sender = scope.spawn(|| {
            let sent = send(ends, port_rx);
            if sent.is_err() {
                gave_up.store(true, Ordering::SeqCst);
            }
            sent
        });
        let sent = sender.join().unwrap_or_else(|_| Err(anyhow!("the sending thread panicked")));
        let received = receiver.join().unwrap_or_else(|_| Err(anyhow!("the receiving thread panicked")));
        (received, sent)
    });
    let elapsed = started.elapsed();
    let sent = sent.context("the sending end (tar -c)")?;
    let received = received.context("the receiving end (tar -x)")?;
    if sent != received {
        bail!("sent {sent} bytes of tar stream but received {received}");
    }
    Ok((elapsed, sent))
}
