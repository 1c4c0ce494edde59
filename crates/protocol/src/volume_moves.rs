//! Moving a volume's data from one node to another, agent to agent over the
//! mesh, on the control plane's orders.
//!
//! 1. `volume_receive` to the target: listen on its mesh address for the
//!    source, which must present the move's grant (a single-use secret the
//!    control plane made for this move); report [`MoveReportState::Listening`]
//!    with the port.
//! 2. `volume_send` to the source: copy the volume while its containers run
//!    (pass 1), stop the containers of this node that mount it, send what
//!    changed since (pass 2), report [`MoveReportState::Sent`]. The target
//!    checks every file's SHA-256, puts the copy in place and reports
//!    [`MoveReportState::Received`] with the same digest.
//! 3. The control plane switches the volume to the target and restarts its
//!    app there; `volume_release` to the source sets its copy aside (kept,
//!    never used), `volume_purge` deletes that copy once the user confirms
//!    or the keep period ends. `volume_move_abort` (to both) ends a move
//!    that failed: the target removes its partial copy, the source starts
//!    again the containers it stopped.
//!
//! Reports go to `POST /agent/v1/volume-moves/{move_id}`
//! ([`MoveReport`]). The stream between the agents is [`Frame`]s: a 4-byte
//! big-endian length, then that many bytes of JSON; a `File` frame is
//! followed by exactly `size` bytes of content, then a `Checksum` frame.

use serde::{Deserialize, Serialize};

use crate::validate::{self, ValidationError};

/// A move's id as the control plane makes them: `mv_` and 16 hex digits.
pub fn move_id(value: &str) -> Result<(), ValidationError> {
    let ok = value.strip_prefix("mv_").is_some_and(|hex| hex.len() == 16 && hex.bytes().all(|b| b.is_ascii_hexdigit()));
    if ok {
        Ok(())
    } else {
        Err(ValidationError::new("move_id", "must be mv_ and 16 hex digits"))
    }
}

/// A grant: 64 hex digits (32 random bytes).
pub fn grant(value: &str) -> Result<(), ValidationError> {
    if value.len() == 64 && value.bytes().all(|b| b.is_ascii_hexdigit()) {
        Ok(())
    } else {
        Err(ValidationError::new("grant", "must be 64 hex digits"))
    }
}

fn ipv4(field: &str, value: &str) -> Result<std::net::Ipv4Addr, ValidationError> {
    value.parse().map_err(|_| ValidationError::new(field, "must be an IPv4 address"))
}

/// Payload of `volume_receive`, to the target node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeReceivePayload {
    pub move_id: String,
    pub volume: String,
    pub grant: String,
    /// The target's own mesh address, where it listens.
    pub listen: String,
    /// The source's mesh address: the only address it accepts.
    pub from: String,
    /// How long it waits for the copy to finish before it gives up.
    pub timeout_seconds: u32,
}

impl VolumeReceivePayload {
    pub fn validate(&self) -> Result<(), ValidationError> {
        move_id(&self.move_id)?;
        crate::volumes::name(&self.volume)?;
        grant(&self.grant)?;
        ipv4("listen", &self.listen)?;
        ipv4("from", &self.from)?;
        if !(10..=86_400).contains(&self.timeout_seconds) {
            return Err(ValidationError::new("timeout_seconds", "must be 10 to 86400"));
        }
        Ok(())
    }
}

/// Payload of `volume_send`, to the source node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeSendPayload {
    pub move_id: String,
    pub volume: String,
    pub grant: String,
    /// `mesh address:port` of the target's listener.
    pub to: String,
}

impl VolumeSendPayload {
    pub fn validate(&self) -> Result<(), ValidationError> {
        move_id(&self.move_id)?;
        crate::volumes::name(&self.volume)?;
        grant(&self.grant)?;
        let (host, port) = self.to.rsplit_once(':').ok_or_else(|| ValidationError::new("to", "must be address:port"))?;
        ipv4("to", host)?;
        match port.parse::<u16>() {
            Ok(p) if p > 0 => Ok(()),
            _ => Err(ValidationError::new("to", "must end in a port 1 to 65535")),
        }
    }
}

/// Payload of `volume_move_abort`, `volume_release` and `volume_purge`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeMoveStep {
    pub move_id: String,
    pub volume: String,
}

impl VolumeMoveStep {
    pub fn validate(&self) -> Result<(), ValidationError> {
        move_id(&self.move_id)?;
        crate::volumes::name(&self.volume)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MoveReportState {
    /// The target listens (`port`).
    Listening,
    /// The source sent everything (`files`, `bytes`, `digest`,
    /// `stopped_at`).
    Sent,
    /// The target checked and put the copy in place (`files`, `bytes`,
    /// `digest`).
    Received,
    /// Either side gave up (`message`).
    Failed,
    /// The source set its copy aside.
    Released,
    /// The source deleted its copy.
    Purged,
    /// An aborted move is cleaned up on this node.
    Aborted,
}

/// Body of `POST /agent/v1/volume-moves/{move_id}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MoveReport {
    pub state: MoveReportState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub files: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes: Option<u64>,
    /// SHA-256 over the sorted list of (path, kind, size, content SHA-256
    /// or link target), hex.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
    /// When the source stopped the volume's containers (ms since the
    /// epoch): where the app's downtime begins.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopped_at_ms: Option<i64>,
    /// Containers the source stopped for the last pass.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopped: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

impl MoveReport {
    pub fn new(state: MoveReportState) -> MoveReport {
        MoveReport { state, port: None, files: None, bytes: None, digest: None, stopped_at_ms: None, stopped: None, message: None }
    }

    pub fn validate(&self) -> Result<(), ValidationError> {
        if let Some(digest) = &self.digest {
            if digest.len() != 64 || !digest.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(ValidationError::new("digest", "must be 64 hex digits"));
            }
        }
        if let Some(message) = &self.message {
            validate::bounded_text("message", message, crate::misc::MAX_REPORT_MESSAGE)?;
        }
        if self.state == MoveReportState::Listening && self.port.is_none_or(|p| p == 0) {
            return Err(ValidationError::new("port", "a listening report names its port"));
        }
        Ok(())
    }
}

/// Longest frame header on the stream.
pub const MAX_FRAME: usize = 64 * 1024;
/// Longest relative path in a volume, in bytes.
pub const MAX_PATH: usize = 4096;

/// One frame of the agent-to-agent stream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "frame", rename_all = "snake_case")]
pub enum Frame {
    /// Source → target, first: which move, which pass (1 or 2), the grant.
    Hello { move_id: String, pass: u8, grant: String },
    /// Target → source, pass 2: a file the target holds from pass 1.
    Have { path: String, size: u64, mtime_ns: i64 },
    /// Target → source: the list of `Have` is complete (pass 2), or the
    /// hello is accepted (pass 1).
    Ready,
    /// Target → source: refused, and why.
    Refused { reason: String },
    Dir { path: String, mode: u32, uid: u32, gid: u32 },
    /// Followed by `size` bytes, then `Checksum`.
    File { path: String, size: u64, mode: u32, uid: u32, gid: u32, mtime_ns: i64 },
    /// The target's copy of `path` (same size and mtime) stays.
    Same { path: String },
    Link { path: String, target: String, uid: u32, gid: u32 },
    Checksum { sha256: String },
    /// Source → target: everything was sent.
    End { files: u64, bytes: u64, digest: String },
    /// Target → source: everything arrived and matched.
    Done { digest: String },
}

/// A relative path inside a volume: `/`-separated plain components, no
/// `.`, `..` or empty ones, no NUL, at most [`MAX_PATH`] bytes. The
/// receiving side checks every path it is sent against this before it
/// touches the disk.
pub fn relative_path(path: &str) -> Result<(), ValidationError> {
    if path.is_empty() || path.len() > MAX_PATH || path.contains('\0') || path.starts_with('/') {
        return Err(ValidationError::new("path", "must be a relative path of 1 to 4096 bytes"));
    }
    if path.split('/').any(|part| part.is_empty() || part == "." || part == "..") {
        return Err(ValidationError::new("path", "must not contain empty, '.' or '..' components"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_are_checked() {
        let grant = "ab".repeat(32);
        let receive = VolumeReceivePayload {
            move_id: "mv_0123456789abcdef".into(),
            volume: "uploads".into(),
            grant: grant.clone(),
            listen: "10.77.0.2".into(),
            from: "10.77.0.3".into(),
            timeout_seconds: 600,
        };
        receive.validate().unwrap();
        assert!(VolumeReceivePayload { listen: "0.0.0.0x".into(), ..receive.clone() }.validate().is_err());
        assert!(VolumeReceivePayload { grant: "short".into(), ..receive.clone() }.validate().is_err());
        assert!(VolumeReceivePayload { move_id: "mv_x".into(), ..receive.clone() }.validate().is_err());
        let send = VolumeSendPayload { move_id: receive.move_id.clone(), volume: "uploads".into(), grant, to: "10.77.0.2:4100".into() };
        send.validate().unwrap();
        for bad in ["10.77.0.2", "10.77.0.2:0", "host:80", "10.77.0.2:99999"] {
            assert!(VolumeSendPayload { to: bad.into(), ..send.clone() }.validate().is_err(), "{bad}");
        }
    }

    #[test]
    fn paths_stay_inside_the_volume() {
        for good in ["a", "a/b", "a.b/c d", ".hidden", "x/..y"] {
            relative_path(good).unwrap();
        }
        for bad in ["", "/etc", "..", "a/../b", "a//b", "a/", "./a", "a\0b"] {
            assert!(relative_path(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn frames_are_tagged() {
        let text = serde_json::to_string(&Frame::Same { path: "a".into() }).unwrap();
        assert_eq!(text, r#"{"frame":"same","path":"a"}"#);
    }
}
