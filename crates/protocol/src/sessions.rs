//! Exec and port-forward sessions: a user's terminal or TCP connection to
//! one container, carried through the control plane.
//!
//! Agents only dial out, so the control plane cannot open a connection to
//! a node. When a user opens a session, the control plane queues
//! `session_open` ([`SessionOpenPayload`]) for the node; the agent dials
//! back `POST {dial_url}/agent/v1/sessions/{session_id}/attach` with its
//! client certificate and `Upgrade: cloudweb-session/1`, and after the
//! `101` both ends speak [`SessionFrame`]s on that connection: the control
//! plane bridges them to the user's WebSocket, where each binary message
//! is one frame in the same encoding. A session is attached at most once,
//! and only by the node it was opened on.
//!
//! A frame is a type byte, a 4-byte big-endian length, then that many
//! bytes (at most [`MAX_FRAME_PAYLOAD`]).

use serde::{Deserialize, Serialize};

use crate::validate::{self, ValidationError};

/// The `Upgrade` token of the agent's dial-back.
pub const UPGRADE: &str = "cloudweb-session/1";

/// Most bytes of one frame's payload.
pub const MAX_FRAME_PAYLOAD: usize = 64 * 1024;
/// Bytes of a frame's header (type, length).
pub const HEADER: usize = 5;
/// Bytes of an `Error` frame's message.
pub const MAX_ERROR_BYTES: usize = 1024;
/// How often the agent sends `Ping` on an idle dial-back, and how long the
/// control plane waits for any frame before it takes the node for gone.
pub const PING_SECONDS: u64 = 10;
pub const PEER_GONE_SECONDS: u64 = 35;

/// A session's id as the control plane makes them: `xs_` and 16 hex digits.
pub fn session_id(value: &str) -> Result<(), ValidationError> {
    let ok = value.strip_prefix("xs_").is_some_and(|hex| hex.len() == 16 && hex.bytes().all(|b| b.is_ascii_hexdigit()));
    if ok {
        Ok(())
    } else {
        Err(ValidationError::new("session_id", "must be xs_ and 16 hex digits"))
    }
}

/// What a session reaches in its container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum SessionTarget {
    /// A process started in the container (`docker exec`), with a terminal
    /// of `cols` × `rows` when `tty`.
    Exec { command: Vec<String>, tty: bool, #[serde(default)] cols: u16, #[serde(default)] rows: u16 },
    /// A TCP connection to `port` on the container's address.
    Forward { port: u16 },
}

/// Payload of `session_open`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionOpenPayload {
    pub session_id: String,
    /// The control-plane replica that holds the user's side: the agent
    /// dials back to it (its own agent listener URL), not to whichever
    /// replica it reads commands from.
    pub dial_url: String,
    /// The container on this node.
    pub container: String,
    pub target: SessionTarget,
}

impl SessionOpenPayload {
    pub fn validate(&self) -> Result<(), ValidationError> {
        session_id(&self.session_id)?;
        validate::bounded_text("dial_url", &self.dial_url, 512)?;
        if !self.dial_url.starts_with("https://") || self.dial_url.contains(char::is_whitespace) {
            return Err(ValidationError::new("dial_url", "must be an https URL"));
        }
        validate::bounded_text("container", &self.container, 255)?;
        if self.container.starts_with('-') || !self.container.bytes().all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b)) {
            return Err(ValidationError::new("container", "is not a container name"));
        }
        match &self.target {
            SessionTarget::Exec { command, .. } => crate::tasks::command("command", command),
            SessionTarget::Forward { port } if *port == 0 => Err(ValidationError::new("port", "must be 1 to 65535")),
            SessionTarget::Forward { .. } => Ok(()),
        }
    }
}

/// One frame of a session, in either direction.
///
/// User → process: `Data` (stdin, or bytes for the forwarded port),
/// `Resize`, `Eof` (stdin closed). Process → user: `Data` (stdout, or the
/// terminal's output), `Stderr` (without a terminal), `Exit` (last: the
/// process ended with this status), `Error` (last: the session could not
/// go on, and why). `Ping` keeps an idle dial-back known to be alive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionFrame {
    Data(Vec<u8>),
    Stderr(Vec<u8>),
    Resize { cols: u16, rows: u16 },
    Eof,
    Exit(i32),
    Error(String),
    Ping,
}

/// Why bytes are not a frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FrameError {
    UnknownType(u8),
    TooLong(usize),
    BadPayload(&'static str),
}

impl std::fmt::Display for FrameError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FrameError::UnknownType(t) => write!(f, "unknown frame type {t}"),
            FrameError::TooLong(n) => write!(f, "a frame of {n} bytes is longer than {MAX_FRAME_PAYLOAD}"),
            FrameError::BadPayload(what) => write!(f, "bad frame: {what}"),
        }
    }
}

impl std::error::Error for FrameError {}

const DATA: u8 = 1;
const STDERR: u8 = 2;
const RESIZE: u8 = 3;
const EOF: u8 = 4;
const EXIT: u8 = 5;
const ERROR: u8 = 6;
const PING: u8 = 7;

impl SessionFrame {
    /// The frame's bytes. Data longer than [`MAX_FRAME_PAYLOAD`] must be
    /// cut by the caller ([`SessionFrame::data_frames`]); an error message
    /// is cut to [`MAX_ERROR_BYTES`] here.
    pub fn encode(&self) -> Vec<u8> {
        let (kind, payload): (u8, std::borrow::Cow<'_, [u8]>) = match self {
            SessionFrame::Data(bytes) => (DATA, bytes.into()),
            SessionFrame::Stderr(bytes) => (STDERR, bytes.into()),
            SessionFrame::Resize { cols, rows } => {
                let mut p = cols.to_be_bytes().to_vec();
                p.extend_from_slice(&rows.to_be_bytes());
                (RESIZE, p.into())
            }
            SessionFrame::Eof => (EOF, Vec::new().into()),
            SessionFrame::Exit(code) => (EXIT, code.to_be_bytes().to_vec().into()),
            SessionFrame::Error(message) => {
                let mut message = message.clone();
                crate::misc::truncate_on_char(&mut message, MAX_ERROR_BYTES);
                (ERROR, message.into_bytes().into())
            }
            SessionFrame::Ping => (PING, Vec::new().into()),
        };
        let mut out = Vec::with_capacity(HEADER + payload.len());
        out.push(kind);
        out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
        out.extend_from_slice(&payload);
        out
    }

    /// `bytes` as `Data` (or `Stderr`) frames of at most
    /// [`MAX_FRAME_PAYLOAD`] bytes each, encoded back to back.
    pub fn data_frames(bytes: &[u8], stderr: bool) -> Vec<u8> {
        let mut out = Vec::with_capacity(bytes.len() + HEADER);
        for chunk in bytes.chunks(MAX_FRAME_PAYLOAD) {
            out.push(if stderr { STDERR } else { DATA });
            out.extend_from_slice(&(chunk.len() as u32).to_be_bytes());
            out.extend_from_slice(chunk);
        }
        out
    }

    /// The first frame of `buf` and the bytes it took; `None` while `buf`
    /// holds only part of one.
    pub fn decode(buf: &[u8]) -> Result<Option<(SessionFrame, usize)>, FrameError> {
        if buf.len() < HEADER {
            return Ok(None);
        }
        let kind = buf[0];
        if !(DATA..=PING).contains(&kind) {
            return Err(FrameError::UnknownType(kind));
        }
        let len = u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]) as usize;
        if len > MAX_FRAME_PAYLOAD {
            return Err(FrameError::TooLong(len));
        }
        if buf.len() < HEADER + len {
            return Ok(None);
        }
        let payload = &buf[HEADER..HEADER + len];
        let frame = match kind {
            DATA => SessionFrame::Data(payload.to_vec()),
            STDERR => SessionFrame::Stderr(payload.to_vec()),
            RESIZE => match payload {
                [c0, c1, r0, r1] => SessionFrame::Resize { cols: u16::from_be_bytes([*c0, *c1]), rows: u16::from_be_bytes([*r0, *r1]) },
                _ => return Err(FrameError::BadPayload("a resize is 4 bytes")),
            },
            EOF | PING if !payload.is_empty() => return Err(FrameError::BadPayload("an end or ping frame carries nothing")),
            EOF => SessionFrame::Eof,
            PING => SessionFrame::Ping,
            EXIT => match payload {
                [a, b, c, d] => SessionFrame::Exit(i32::from_be_bytes([*a, *b, *c, *d])),
                _ => return Err(FrameError::BadPayload("an exit status is 4 bytes")),
            },
            ERROR => {
                if len > MAX_ERROR_BYTES {
                    return Err(FrameError::BadPayload("an error message is too long"));
                }
                SessionFrame::Error(String::from_utf8_lossy(payload).into_owned())
            }
            _ => unreachable!("checked above"),
        };
        Ok(Some((frame, HEADER + len)))
    }

    /// `message` when it is exactly one frame (a WebSocket message).
    pub fn decode_one(message: &[u8]) -> Result<SessionFrame, FrameError> {
        match SessionFrame::decode(message)? {
            Some((frame, used)) if used == message.len() => Ok(frame),
            Some(_) => Err(FrameError::BadPayload("a message holds more than one frame")),
            None => Err(FrameError::BadPayload("a message holds part of a frame")),
        }
    }

    /// Whether a user may send this frame (toward the process).
    pub fn is_from_user(&self) -> bool {
        matches!(self, SessionFrame::Data(_) | SessionFrame::Resize { .. } | SessionFrame::Eof | SessionFrame::Ping)
    }

    /// Whether this frame ends the session.
    pub fn is_last(&self) -> bool {
        matches!(self, SessionFrame::Exit(_) | SessionFrame::Error(_))
    }
}

/// Bounds of a terminal's size.
pub fn terminal_size(cols: u16, rows: u16) -> Result<(), ValidationError> {
    if cols == 0 || rows == 0 || cols > 1000 || rows > 1000 {
        return Err(ValidationError::new("size", "columns and rows must be 1 to 1000"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip() {
        let frames = [
            SessionFrame::Data(b"hello".to_vec()),
            SessionFrame::Stderr(vec![0, 255]),
            SessionFrame::Resize { cols: 120, rows: 40 },
            SessionFrame::Eof,
            SessionFrame::Exit(-3),
            SessionFrame::Error("node gone".into()),
            SessionFrame::Ping,
        ];
        let mut bytes = Vec::new();
        for frame in &frames {
            bytes.extend(frame.encode());
        }
        let mut at = 0;
        for frame in &frames {
            let (got, used) = SessionFrame::decode(&bytes[at..]).unwrap().unwrap();
            assert_eq!(&got, frame);
            at += used;
        }
        assert_eq!(at, bytes.len());
        // A partial frame waits for more.
        assert_eq!(SessionFrame::decode(&bytes[..3]).unwrap(), None);
        assert_eq!(SessionFrame::decode(&bytes[..7]).unwrap(), None);
    }

    #[test]
    fn bad_frames_are_refused() {
        assert_eq!(SessionFrame::decode(&[9, 0, 0, 0, 0]), Err(FrameError::UnknownType(9)));
        assert_eq!(SessionFrame::decode(&[1, 0, 2, 0, 0]), Err(FrameError::TooLong(0x20000)));
        assert!(SessionFrame::decode(&[3, 0, 0, 0, 1, 0]).is_err());
        assert!(SessionFrame::decode_one(&[4, 0, 0, 0, 0, 4, 0, 0, 0, 0]).is_err());
        assert!(SessionFrame::decode_one(&[1, 0, 0, 0, 2, 0]).is_err());
    }

    #[test]
    fn long_data_is_cut_into_frames() {
        let bytes = vec![7u8; MAX_FRAME_PAYLOAD * 2 + 5];
        let encoded = SessionFrame::data_frames(&bytes, false);
        let mut at = 0;
        let mut total = 0;
        while at < encoded.len() {
            let (frame, used) = SessionFrame::decode(&encoded[at..]).unwrap().unwrap();
            let SessionFrame::Data(chunk) = frame else { panic!("not data") };
            total += chunk.len();
            at += used;
        }
        assert_eq!(total, bytes.len());
    }

    #[test]
    fn payloads_are_checked() {
        let good = SessionOpenPayload {
            session_id: "xs_0123456789abcdef".into(),
            dial_url: "https://10.0.0.1:8443".into(),
            container: "cloudweb-web-d1-1".into(),
            target: SessionTarget::Exec { command: vec!["sh".into()], tty: true, cols: 80, rows: 24 },
        };
        good.validate().unwrap();
        let mut bad = good.clone();
        bad.dial_url = "http://x".into();
        assert!(bad.validate().is_err());
        let mut bad = good.clone();
        bad.container = "--privileged".into();
        assert!(bad.validate().is_err());
        let mut bad = good;
        bad.target = SessionTarget::Forward { port: 0 };
        assert!(bad.validate().is_err());
        assert!(session_id("xs_123").is_err());
    }
}
