//! `cloudweb exec` (a command in a running instance, optionally in a
//! terminal), `cloudweb port-forward` (local TCP connections to a port of
//! a running instance) and `cloudweb sessions` (the record of both). Each
//! session is a WebSocket of session frames through the control plane.

use std::net::IpAddr;

use clap::Args;
use cloudweb_api_types::sessions::SessionList;
use cloudweb_protocol::sessions::{SessionFrame, MAX_FRAME_PAYLOAD};
use futures_util::{SinkExt, StreamExt};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_tungstenite::tungstenite::Message;

use crate::client::{segment, Api, SessionSocket, Sessions};
use crate::render::{self, clean, table};
use crate::Failure;

/// The exit status when a session ended without the command's own (the
/// node went away, the session was closed for being idle).
pub const LOST: u8 = 255;

/// `cloudweb exec`'s arguments.
#[derive(Args)]
pub struct ExecArgs {
    /// The app (or, with --service, the managed service).
    pub app: String,
    /// The instance (see `cloudweb top`); the lowest running one by default.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1000), conflicts_with = "service")]
    pub instance: Option<u32>,
    /// Into a managed service's container (`cloudweb services`) instead
    /// of an app's instance.
    #[arg(long)]
    pub service: bool,
    /// Pass this terminal's input to the command.
    #[arg(long, short = 'i')]
    pub interactive: bool,
    /// Run the command in a terminal: keys go to it as typed (Ctrl-C
    /// included), the window size follows this one.
    #[arg(long, short = 't')]
    pub tty: bool,
    /// The program and its arguments, after `--`, passed as they are: no
    /// shell runs them unless you name one (`-- sh -c 'a && b'`).
    #[arg(last = true, required = true, value_name = "COMMAND")]
    pub command: Vec<String>,
}

/// `cloudweb port-forward`'s arguments.
#[derive(Args)]
pub struct PortForwardArgs {
    /// The app (or, with --service, the managed service).
    pub app: String,
    /// `LOCAL:REMOTE`, or `PORT` for the same port on both sides.
    #[arg(value_name = "[LOCAL:]REMOTE")]
    pub ports: String,
    /// The instance; the lowest running one by default.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1000), conflicts_with = "service")]
    pub instance: Option<u32>,
    /// To a managed service's container (e.g. 5432 of a PostgreSQL)
    /// instead of an app's instance.
    #[arg(long)]
    pub service: bool,
    /// The local address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub address: IpAddr,
}

/// The API path of an app's or a service's sessions.
fn base(name: &str, service: bool) -> String {
    format!("/api/{}/{}", if service { "services" } else { "apps" }, segment(name))
}

/// `[LOCAL:]REMOTE` as (local, remote); local 0 picks a free port.
pub fn ports(text: &str) -> Result<(u16, u16), Failure> {
    let bad = || Failure::Usage(format!("{text:?}: ports are [LOCAL:]REMOTE, each 1 to 65535 (LOCAL may be 0: any free port)"));
    let (local, remote) = match text.split_once(':') {
        Some((local, remote)) => (local.parse::<u16>().map_err(|_| bad())?, remote.parse::<u16>().map_err(|_| bad())?),
        None => {
            let port = text.parse::<u16>().map_err(|_| bad())?;
            (port, port)
        }
    };
    if remote == 0 {
        return Err(bad());
    }
    Ok((local, remote))
}

fn query(pairs: &[(&str, String)]) -> String {
    let mut out = url::form_urlencoded::Serializer::new(String::new());
    for (key, value) in pairs {
        out.append_pair(key, value);
    }
    out.finish()
}

async fn send(socket: &mut SessionSocket, frame: &SessionFrame) -> Result<(), String> {
    socket.send(Message::Binary(frame.encode().into())).await.map_err(|e| format!("the session's connection failed: {e}"))
}

/// The terminal in raw mode while this lives.
struct RawMode {
    saved: libc::termios,
}

impl RawMode {
    fn enable() -> Option<RawMode> {
        // SAFETY: termios is plain data; fd 0 is checked by tcgetattr.
        unsafe {
            let mut saved: libc::termios = std::mem::zeroed();
            if libc::tcgetattr(0, &mut saved) != 0 {
                return None;
            }
            let mut raw = saved;
            libc::cfmakeraw(&mut raw);
            if libc::tcsetattr(0, libc::TCSANOW, &raw) != 0 {
                return None;
            }
            Some(RawMode { saved })
        }
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        // SAFETY: restores what tcgetattr read.
        unsafe {
            libc::tcsetattr(0, libc::TCSANOW, &self.saved);
        }
    }
}

fn is_terminal(fd: i32) -> bool {
    // SAFETY: isatty only reads the descriptor.
    unsafe { libc::isatty(fd) == 1 }
}

/// This terminal's size (columns, rows), if stdout is one.
fn window_size() -> Option<(u16, u16)> {
    // SAFETY: winsize is plain data filled by the ioctl.
    unsafe {
        let mut size: libc::winsize = std::mem::zeroed();
        if libc::ioctl(1, libc::TIOCGWINSZ, &mut size) == 0 && size.ws_col > 0 && size.ws_row > 0 {
            Some((size.ws_col, size.ws_row))
        } else {
            None
        }
    }
}

/// Standard input in chunks, read on a thread of its own (a blocked read
/// must not keep the program from exiting); `None` at its end.
fn stdin_chunks() -> tokio::sync::mpsc::Receiver<Option<Vec<u8>>> {
    let (sender, receiver) = tokio::sync::mpsc::channel(4);
    std::thread::spawn(move || {
        use std::io::Read;
        let mut stdin = std::io::stdin().lock();
        let mut buf = vec![0u8; 32 * 1024];
        loop {
            match stdin.read(&mut buf) {
                Ok(0) | Err(_) => {
                    let _ = sender.blocking_send(None);
                    return;
                }
                Ok(n) => {
                    if sender.blocking_send(Some(buf[..n].to_vec())).is_err() {
                        return;
                    }
                }
            }
        }
    });
    receiver
}

pub async fn exec(api: &Api, args: ExecArgs) -> Result<(), Failure> {
    let (cols, rows) = window_size().unwrap_or((80, 24));
    let mut pairs: Vec<(&str, String)> = args.command.iter().map(|arg| ("command", arg.clone())).collect();
    if let Some(instance) = args.instance {
        pairs.push(("instance", instance.to_string()));
    }
    if args.tty {
        pairs.extend([("tty", "1".to_string()), ("cols", cols.to_string()), ("rows", rows.to_string())]);
    }
    let mut socket = api.sessions().open(&format!("{}/exec?{}", base(&args.app, args.service), query(&pairs))).await?;
    // Raw keys only when both ends are a terminal.
    let raw = if args.tty && args.interactive && is_terminal(0) { RawMode::enable() } else { None };
    let outcome = exec_loop(&mut socket, args.interactive, args.tty).await;
    drop(raw);
    let _ = socket.close(None).await;
    match outcome {
        Ok(0) => Ok(()),
        Ok(code) => Err(Failure::Exit(u8::try_from(code).unwrap_or(LOST), None)),
        Err(why) => Err(Failure::Exit(LOST, Some(why))),
    }
}

/// Carries frames until the command's exit status (or why there is none).
async fn exec_loop(socket: &mut SessionSocket, interactive: bool, tty: bool) -> Result<i32, String> {
    let mut stdout = tokio::io::stdout();
    let mut stderr = tokio::io::stderr();
    let mut input = if interactive { Some(stdin_chunks()) } else { None };
    if input.is_none() {
        send(socket, &SessionFrame::Eof).await?;
    }
    let mut resized = if tty { tokio::signal::unix::signal(tokio::signal::unix::SignalKind::window_change()).ok() } else { None };
    loop {
        tokio::select! {
            message = socket.next() => match message {
                Some(Ok(Message::Binary(bytes))) => match SessionFrame::decode_one(&bytes) {
                    Ok(SessionFrame::Data(data)) => {
                        stdout.write_all(&data).await.map_err(|e| format!("cannot write the output: {e}"))?;
                        stdout.flush().await.map_err(|e| format!("cannot write the output: {e}"))?;
                    }
                    Ok(SessionFrame::Stderr(data)) => {
                        let _ = stderr.write_all(&data).await;
                        let _ = stderr.flush().await;
                    }
                    Ok(SessionFrame::Exit(code)) => return Ok(code),
                    Ok(SessionFrame::Error(message)) => return Err(message),
                    Ok(_) => {}
                    Err(err) => return Err(format!("the server sent a bad frame: {err}")),
                },
                Some(Ok(Message::Close(_))) | None => return Err("the session closed without the command's exit status".to_string()),
                Some(Err(err)) => return Err(format!("the session's connection failed: {err}")),
                Some(Ok(_)) => {}
            },
            chunk = async { input.as_mut().expect("guarded").recv().await }, if input.is_some() => match chunk.flatten() {
                Some(bytes) => {
                    for piece in bytes.chunks(MAX_FRAME_PAYLOAD) {
                        send(socket, &SessionFrame::Data(piece.to_vec())).await?;
                    }
                }
                None => {
                    send(socket, &SessionFrame::Eof).await?;
                    input = None;
                }
            },
            _ = async { resized.as_mut().expect("guarded").recv().await }, if resized.is_some() => {
                if let Some((cols, rows)) = window_size() {
                    send(socket, &SessionFrame::Resize { cols, rows }).await?;
                }
            }
        }
    }
}

pub async fn port_forward(api: &Api, args: PortForwardArgs) -> Result<(), Failure> {
    let (local, remote) = ports(&args.ports)?;
    let listener = tokio::net::TcpListener::bind((args.address, local))
        .await
        .map_err(|e| Failure::Action(format!("cannot listen on {}:{local}: {e}", args.address)))?;
    let bound = listener.local_addr().map_err(|e| Failure::Action(e.to_string()))?;
    let mut pairs = vec![("port", remote.to_string())];
    if let Some(instance) = args.instance {
        pairs.push(("instance", instance.to_string()));
    }
    let path = format!("{}/port-forward?{}", base(&args.app, args.service), query(&pairs));
    let which = match (args.service, args.instance) {
        (true, _) => "(service)".to_string(),
        (false, Some(i)) => format!("instance {i}"),
        (false, None) => "its first running instance".to_string(),
    };
    println!("forwarding {bound} -> {} {which}, port {remote} (Ctrl-C to stop)", clean(&args.app));
    let sessions = api.sessions();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (tcp, peer) = accepted.map_err(|e| Failure::Action(format!("cannot accept a connection: {e}")))?;
                let (sessions, path) = (sessions.clone(), path.clone());
                tokio::spawn(async move {
                    if let Err(why) = forward_one(&sessions, &path, tcp).await {
                        eprintln!("error: connection from {peer}: {why}");
                    }
                });
            }
            _ = tokio::signal::ctrl_c() => return Ok(()),
        }
    }
}

/// One local connection through its own session.
async fn forward_one(sessions: &Sessions, path: &str, tcp: tokio::net::TcpStream) -> Result<(), String> {
    let mut socket = sessions.open(path).await.map_err(|f| f.to_string())?;
    let _ = tcp.set_nodelay(true);
    let (mut tcp_read, mut tcp_write) = tcp.into_split();
    let mut buf = vec![0u8; MAX_FRAME_PAYLOAD];
    let mut local_open = true;
    loop {
        tokio::select! {
            got = tcp_read.read(&mut buf), if local_open => match got {
                Ok(0) | Err(_) => {
                    send(&mut socket, &SessionFrame::Eof).await?;
                    local_open = false;
                }
                Ok(n) => send(&mut socket, &SessionFrame::Data(buf[..n].to_vec())).await?,
            },
            message = socket.next() => match message {
                Some(Ok(Message::Binary(bytes))) => match SessionFrame::decode_one(&bytes) {
                    Ok(SessionFrame::Data(data)) => {
                        if tcp_write.write_all(&data).await.is_err() {
                            let _ = socket.close(None).await;
                            return Ok(());
                        }
                    }
                    Ok(SessionFrame::Exit(_)) => {
                        let _ = tcp_write.shutdown().await;
                        return Ok(());
                    }
                    Ok(SessionFrame::Error(message)) => return Err(message),
                    Ok(_) => {}
                    Err(err) => return Err(format!("the server sent a bad frame: {err}")),
                },
                Some(Ok(Message::Close(_))) | None => return Ok(()),
                Some(Err(err)) => return Err(format!("the session's connection failed: {err}")),
                Some(Ok(_)) => {}
            },
        }
    }
}

pub async fn list(api: &Api, app: &str, service: bool, json: bool) -> Result<(), Failure> {
    let view: SessionList = api.get(&format!("{}/sessions", base(app, service))).await?;
    if json {
        render::json(&view);
        return Ok(());
    }
    if view.sessions.is_empty() {
        println!("{} has no exec or port-forward session yet", clean(app));
        return Ok(());
    }
    let rows: Vec<Vec<String>> = view
        .sessions
        .iter()
        .map(|s| {
            let what = match (&s.program, s.port) {
                (Some(program), _) => format!("{}{}", clean(program), if s.tty { " (tty)" } else { "" }),
                (None, Some(port)) => format!("port {port}"),
                _ => "-".to_string(),
            };
            let end = match (s.state.as_str(), s.exit_code, &s.message) {
                (_, Some(code), _) => format!("exit {code}"),
                ("failed", None, Some(message)) => format!("failed: {}", clean(message)),
                (state, _, _) => state.to_string(),
            };
            vec![
                clean(&s.id),
                s.kind.clone(),
                clean(&s.user),
                s.instance.map(|i| i.to_string()).unwrap_or_else(|| "-".to_string()),
                what,
                clean(&s.created_at),
                s.duration_ms.map(|ms| format!("{:.1}s", ms as f64 / 1000.0)).unwrap_or_else(|| "-".to_string()),
                end,
            ]
        })
        .collect();
    table(&["ID", "KIND", "USER", "INSTANCE", "WHAT", "STARTED", "DURATION", "END"], &rows);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_local_and_remote() {
        assert_eq!(ports("5432").ok(), Some((5432, 5432)));
        assert_eq!(ports("15432:5432").ok(), Some((15432, 5432)));
        assert_eq!(ports("0:80").ok(), Some((0, 80)));
        assert!(ports("80:0").is_err());
        assert!(ports("x").is_err());
        assert!(ports("1:2:3").is_err());
    }
}
