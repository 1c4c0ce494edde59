//! A client for WireGuard's cross-platform configuration protocol (the
//! "UAPI"): a line-based `key=value` exchange over the unix socket
//! `/var/run/wireguard/<interface>.sock` that wireguard-go (and `wg` for
//! any userspace implementation) speaks. A request is `get=1` or `set=1`
//! followed by lines and a blank line; every answer ends with `errno=N`
//! and a blank line. Keys are lowercase hex on this socket, not base64.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;

/// Where userspace WireGuard implementations put their sockets.
pub const SOCKET_DIR: &str = "/var/run/wireguard";

/// One exchange never takes longer than this.
const TIMEOUT: Duration = Duration::from_secs(5);

/// Largest answer read (a few hundred bytes per peer; 65,534 peers fit).
const MAX_ANSWER: usize = 64 * 1024 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum UapiError {
    #[error("cannot reach the WireGuard device at {path}: {source}")]
    Connect { path: PathBuf, source: std::io::Error },
    #[error("talking to the WireGuard device: {0}")]
    Io(#[from] std::io::Error),
    #[error("the WireGuard device did not answer within {0:?}")]
    Timeout(Duration),
    #[error("the WireGuard device refused the request (errno {0})")]
    Errno(i64),
    #[error("the WireGuard device sent an answer this agent cannot read: {0}")]
    Malformed(String),
}

pub fn socket_path(interface: &str) -> PathBuf {
    Path::new(SOCKET_DIR).join(format!("{interface}.sock"))
}

/// What `get=1` tells about the device (its private key is skipped).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Device {
    pub listen_port: Option<u16>,
    pub peers: Vec<PeerState>,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct PeerState {
    /// Lowercase hex.
    pub public_key: String,
    pub endpoint: Option<SocketAddr>,
    /// `address/prefix`, as the device lists them.
    pub allowed_ips: Vec<String>,
    pub persistent_keepalive: u16,
    /// `None` when the peer never completed a handshake.
    pub last_handshake: Option<SystemTime>,
    pub rx_bytes: u64,
    pub tx_bytes: u64,
}

pub async fn get(interface: &str) -> Result<Device, UapiError> {
    let answer = exchange(interface, "get=1\n\n").await?;
    parse_get(&answer)
}

/// Sends `set=1`, then `body` (lines ending in '\n'), then the blank line.
pub async fn set(interface: &str, body: &str) -> Result<(), UapiError> {
    let answer = exchange(interface, &format!("set=1\n{body}\n")).await?;
    match errno(&answer)? {
        0 => Ok(()),
        n => Err(UapiError::Errno(n)),
    }
}

async fn exchange(interface: &str, request: &str) -> Result<String, UapiError> {
    let path = socket_path(interface);
    let work = async {
        let stream = UnixStream::connect(&path).await.map_err(|source| UapiError::Connect { path: path.clone(), source })?;
        let (read, mut write) = stream.into_split();
        write.write_all(request.as_bytes()).await?;
        let mut reader = BufReader::new(read);
        let mut answer = String::new();
        // The device keeps the connection open for more requests, so the
        // answer ends at the blank line after `errno=`, not at EOF.
        loop {
            let before = answer.len();
            if reader.read_line(&mut answer).await? == 0 {
                return Err(UapiError::Malformed("the connection closed before errno".into()));
            }
            let line = &answer[before..];
            if line == "\n" && answer[..before].lines().last().is_some_and(|l| l.starts_with("errno=")) {
                return Ok(answer);
            }
            if answer.len() > MAX_ANSWER {
                return Err(UapiError::Malformed("answer too large".into()));
            }
        }
    };
    tokio::time::timeout(TIMEOUT, work).await.map_err(|_| UapiError::Timeout(TIMEOUT))?
}

fn errno(answer: &str) -> Result<i64, UapiError> {
    answer
        .lines()
        .find_map(|l| l.strip_prefix("errno="))
        .ok_or_else(|| UapiError::Malformed("no errno".into()))?
        .parse()
        .map_err(|_| UapiError::Malformed("errno is not a number".into()))
}

/// Parses a `get=1` answer. Unknown keys are skipped (newer devices add
/// some); the private key is never kept.
pub fn parse_get(answer: &str) -> Result<Device, UapiError> {
    match errno(answer)? {
        0 => {}
        n => return Err(UapiError::Errno(n)),
    }
    let mut device = Device::default();
    let mut handshake_sec: Option<u64> = None;
    let mut handshake_nsec: u32 = 0;
    let finish = |peer: &mut PeerState, sec: &mut Option<u64>, nsec: &mut u32| {
        peer.last_handshake = match *sec {
            Some(s) if s > 0 || *nsec > 0 => Some(UNIX_EPOCH + Duration::new(s, *nsec)),
            _ => None,
        };
        *sec = None;
        *nsec = 0;
    };
    let bad = |key: &str| UapiError::Malformed(format!("bad value for {key}"));
    for line in answer.lines() {
        if line.is_empty() || line.starts_with("errno=") {
            continue;
        }
        let Some((key, value)) = line.split_once('=') else {
            return Err(UapiError::Malformed("a line without '='".into()));
        };
        if key == "public_key" {
            if let Some(peer) = device.peers.last_mut() {
                finish(peer, &mut handshake_sec, &mut handshake_nsec);
            }
            if value.len() != 64 || !value.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(bad(key));
            }
            device.peers.push(PeerState { public_key: value.to_ascii_lowercase(), ..Default::default() });
            continue;
        }
        let Some(peer) = device.peers.last_mut() else {
            if key == "listen_port" {
                device.listen_port = Some(value.parse().map_err(|_| bad(key))?);
            }
            continue;
        };
        match key {
            "endpoint" => peer.endpoint = Some(value.parse().map_err(|_| bad(key))?),
            "allowed_ip" => peer.allowed_ips.push(value.to_string()),
            "persistent_keepalive_interval" => peer.persistent_keepalive = value.parse().map_err(|_| bad(key))?,
            "last_handshake_time_sec" => handshake_sec = Some(value.parse().map_err(|_| bad(key))?),
            "last_handshake_time_nsec" => handshake_nsec = value.parse().map_err(|_| bad(key))?,
            "rx_bytes" => peer.rx_bytes = value.parse().map_err(|_| bad(key))?,
            "tx_bytes" => peer.tx_bytes = value.parse().map_err(|_| bad(key))?,
            _ => {}
        }
    }
    if let Some(peer) = device.peers.last_mut() {
        finish(peer, &mut handshake_sec, &mut handshake_nsec);
    }
    Ok(device)
}

/// A `set=1` body read back into its parts, for a backend that does not
/// speak the UAPI itself (kernel WireGuard over netlink): the convergence
/// plans in the UAPI's own terms, and every backend applies that.
#[derive(Default, PartialEq)]
pub struct SetRequest {
    /// Lowercase hex; present only when the body sets it.
    pub private_key: Option<String>,
    pub listen_port: Option<u16>,
    pub replace_peers: bool,
    pub peers: Vec<PeerChange>,
}

/// What a `set` body says about one peer. Fields the body does not name
/// stay as the device has them.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct PeerChange {
    /// Lowercase hex.
    pub public_key: String,
    pub remove: bool,
    /// Apply only when the device already has the peer.
    pub update_only: bool,
    pub endpoint: Option<SocketAddr>,
    pub persistent_keepalive: Option<u16>,
    pub replace_allowed_ips: bool,
    /// `address/prefix`, added to (or, with `replace_allowed_ips`,
    /// replacing) the peer's list.
    pub allowed_ips: Vec<String>,
}

/// Never prints the private key.
impl std::fmt::Debug for SetRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SetRequest")
            .field("private_key", &self.private_key.as_ref().map(|_| "(set)"))
            .field("listen_port", &self.listen_port)
            .field("replace_peers", &self.replace_peers)
            .field("peers", &self.peers)
            .finish()
    }
}

/// Parses a `set=1` body (without the `set=1` line and the final blank
/// line) as this agent writes them. Keys it does not use (preshared keys,
/// fwmark, protocol version) are refused rather than dropped, so a backend
/// never silently applies less than it was asked.
pub fn parse_set(body: &str) -> Result<SetRequest, UapiError> {
    let bad = |key: &str| UapiError::Malformed(format!("bad value for {key}"));
    let hex_key = |key: &str, value: &str| {
        if value.len() == 64 && value.bytes().all(|b| b.is_ascii_hexdigit()) {
            Ok(value.to_ascii_lowercase())
        } else {
            Err(bad(key))
        }
    };
    let flag = |key: &str, value: &str| match value {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err(bad(key)),
    };
    let mut request = SetRequest::default();
    for line in body.lines() {
        if line.is_empty() {
            continue;
        }
        let Some((key, value)) = line.split_once('=') else {
            return Err(UapiError::Malformed("a line without '='".into()));
        };
        if key == "public_key" {
            request.peers.push(PeerChange { public_key: hex_key(key, value)?, ..Default::default() });
            continue;
        }
        let Some(peer) = request.peers.last_mut() else {
            match key {
                "private_key" => request.private_key = Some(hex_key(key, value)?),
                "listen_port" => request.listen_port = Some(value.parse().map_err(|_| bad(key))?),
                "replace_peers" => request.replace_peers = flag(key, value)?,
                _ => return Err(UapiError::Malformed(format!("unsupported device key {key}"))),
            }
            continue;
        };
        match key {
            "remove" => peer.remove = flag(key, value)?,
            "update_only" => peer.update_only = flag(key, value)?,
            "endpoint" => peer.endpoint = Some(value.parse().map_err(|_| bad(key))?),
            "persistent_keepalive_interval" => peer.persistent_keepalive = Some(value.parse().map_err(|_| bad(key))?),
            "replace_allowed_ips" => peer.replace_allowed_ips = flag(key, value)?,
            "allowed_ip" => {
                let (address, prefix) = value.split_once('/').ok_or_else(|| bad(key))?;
                let address: std::net::IpAddr = address.parse().map_err(|_| bad(key))?;
                let prefix: u8 = prefix.parse().map_err(|_| bad(key))?;
                if prefix > if address.is_ipv4() { 32 } else { 128 } {
                    return Err(bad(key));
                }
                peer.allowed_ips.push(format!("{address}/{prefix}"));
            }
            _ => return Err(UapiError::Malformed(format!("unsupported peer key {key}"))),
        }
    }
    Ok(request)
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "58402e695ba1772b1cc9309755f043251ea77fdcf10fbe63989ceb7e19321376";
    const B: &str = "662e14fd594556f522604703340351258903b64f35553763f19426ab2a515c58";

    #[test]
    fn parses_a_get_answer() {
        let answer = format!(
            "private_key=e84b5a6d2717c1003a13b431570353dbaca9146cf150c5f8575680feba52027a\nlisten_port=51820\n\
             public_key={A}\npreshared_key=0000000000000000000000000000000000000000000000000000000000000000\n\
             protocol_version=1\nendpoint=192.0.2.3:51820\nlast_handshake_time_sec=1700000000\nlast_handshake_time_nsec=5\n\
             tx_bytes=38333\nrx_bytes=2224\npersistent_keepalive_interval=25\nallowed_ip=10.77.0.3/32\n\
             public_key={B}\nlast_handshake_time_sec=0\nlast_handshake_time_nsec=0\ntx_bytes=0\nrx_bytes=0\n\
             persistent_keepalive_interval=0\nerrno=0\n\n"
        );
        let device = parse_get(&answer).unwrap();
        assert_eq!(device.listen_port, Some(51820));
        assert_eq!(device.peers.len(), 2);
        let a = &device.peers[0];
        assert_eq!(a.public_key, A);
        assert_eq!(a.endpoint, Some("192.0.2.3:51820".parse().unwrap()));
        assert_eq!(a.allowed_ips, vec!["10.77.0.3/32".to_string()]);
        assert_eq!(a.persistent_keepalive, 25);
        assert_eq!(a.last_handshake, Some(UNIX_EPOCH + Duration::new(1_700_000_000, 5)));
        assert_eq!((a.rx_bytes, a.tx_bytes), (2224, 38333));
        let b = &device.peers[1];
        assert_eq!(b.last_handshake, None);
        assert_eq!(b.endpoint, None);
        assert!(!format!("{device:?}").contains("e84b5a6d"));
    }

    #[test]
    fn errors_and_garbage_are_refused() {
        assert!(matches!(parse_get("errno=22\n\n"), Err(UapiError::Errno(22))));
        assert!(matches!(parse_get("listen_port=1\n\n"), Err(UapiError::Malformed(_))));
        assert!(parse_get("public_key=zz\nerrno=0\n\n").is_err());
        assert!(parse_get(&format!("public_key={A}\nrx_bytes=-1\nerrno=0\n\n")).is_err());
    }

    #[test]
    fn reads_back_a_set_body() {
        let body = format!(
            "private_key=e84b5a6d2717c1003a13b431570353dbaca9146cf150c5f8575680feba52027a\nlisten_port=51820\n\
             public_key={A}\nremove=true\n\
             public_key={B}\nupdate_only=true\nendpoint=192.0.2.9:51820\npersistent_keepalive_interval=25\n\
             replace_allowed_ips=true\nallowed_ip=10.77.0.3/32\n"
        );
        let request = parse_set(&body).unwrap();
        assert_eq!(request.listen_port, Some(51820));
        assert!(request.private_key.is_some());
        assert!(!format!("{request:?}").contains("e84b5a6d"));
        assert_eq!(request.peers.len(), 2);
        assert_eq!(request.peers[0], PeerChange { public_key: A.into(), remove: true, ..Default::default() });
        assert_eq!(
            request.peers[1],
            PeerChange {
                public_key: B.into(),
                update_only: true,
                endpoint: Some("192.0.2.9:51820".parse().unwrap()),
                persistent_keepalive: Some(25),
                replace_allowed_ips: true,
                allowed_ips: vec!["10.77.0.3/32".into()],
                ..Default::default()
            }
        );
        assert_eq!(parse_set("listen_port=1\n").unwrap().peers, vec![]);
    }

    #[test]
    fn set_bodies_it_cannot_apply_fully_are_refused() {
        for body in [
            format!("public_key={A}\npreshared_key={B}\n"),
            "fwmark=1\n".to_string(),
            format!("public_key={A}\nallowed_ip=10.77.0.3/33\n"),
            format!("public_key={A}\nallowed_ip=10.77.0.3\n"),
            format!("public_key={A}\nremove=yes\n"),
            "public_key=zz\n".to_string(),
            "listen_port\n".to_string(),
        ] {
            assert!(parse_set(&body).is_err(), "{body}");
        }
    }
}
