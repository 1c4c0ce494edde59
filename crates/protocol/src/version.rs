//! Protocol versioning: the two request headers, the range a control plane
//! accepts, and the decision that turns a request's headers into "go on",
//! "400" or "426 with this body".

use serde::{Deserialize, Serialize};

/// Header carrying the agent binary's version, e.g. `0.1.0`.
pub const HEADER_AGENT_VERSION: &str = "x-cloudweb-agent-version";
/// Header carrying the protocol integer the agent speaks.
pub const HEADER_PROTOCOL: &str = "x-cloudweb-protocol";

/// The protocol this build of the agent speaks.
pub const PROTOCOL: u32 = 1;
/// Oldest agent protocol this build of the control plane accepts.
pub const MIN_AGENT_PROTOCOL: u32 = 1;
/// Newest agent protocol this build of the control plane accepts.
pub const MAX_AGENT_PROTOCOL: u32 = 1;

/// Agents that predate versioning send no protocol header; they speak 1.
pub const PROTOCOL_WITHOUT_HEADER: u32 = 1;

/// Inclusive range of agent protocols a control plane understands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SupportedRange {
    pub min: u32,
    pub max: u32,
}

impl Default for SupportedRange {
    fn default() -> Self {
        SupportedRange { min: MIN_AGENT_PROTOCOL, max: MAX_AGENT_PROTOCOL }
    }
}

/// Which side has to be upgraded for the two to talk again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Upgrade {
    Agent,
    ControlPlane,
}

impl Upgrade {
    fn phrase(self) -> &'static str {
        match self {
            Upgrade::Agent => "upgrade the agent",
            Upgrade::ControlPlane => "upgrade the control-plane",
        }
    }
}

/// Body of a `426 Upgrade Required` answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UpgradeRequired {
    pub error: String,
    pub agent_version: String,
    pub agent_protocol: u32,
    pub supported_min: u32,
    pub supported_max: u32,
    pub upgrade: Upgrade,
}

/// Outcome of checking a request's version headers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Negotiation {
    /// The request may go on; it speaks this protocol.
    Accepted(u32),
    /// A header is not well formed: answer 400 with this message.
    Malformed(String),
    /// The protocol is outside the range: answer 426 with this body.
    Unsupported(UpgradeRequired),
}

/// Longest agent version string accepted in the header.
pub const MAX_AGENT_VERSION_LEN: usize = 64;

/// Decides what to do with a request from its two version headers (raw
/// values, `None` when absent). Pure, so both the server and tests use it.
pub fn negotiate(
    range: SupportedRange,
    protocol_header: Option<&[u8]>,
    agent_version_header: Option<&[u8]>,
) -> Negotiation {
    let agent_version = match agent_version_header {
        None => "unknown".to_string(),
        Some(raw) => match parse_agent_version(raw) {
            Some(v) => v,
            None => {
                return Negotiation::Malformed(format!(
                    "malformed {HEADER_AGENT_VERSION} header: expected 1 to {MAX_AGENT_VERSION_LEN} characters of [0-9A-Za-z.+-]"
                ))
            }
        },
    };
    let protocol = match protocol_header {
        None => PROTOCOL_WITHOUT_HEADER,
        Some(raw) => match parse_protocol(raw) {
            Some(p) => p,
            None => {
                return Negotiation::Malformed(format!(
                    "malformed {HEADER_PROTOCOL} header {:?}: expected a non-negative integer",
                    String::from_utf8_lossy(&raw[..raw.len().min(32)])
                ))
            }
        },
    };
    let upgrade = if protocol < range.min {
        Upgrade::Agent
    } else if protocol > range.max {
        Upgrade::ControlPlane
    } else {
        return Negotiation::Accepted(protocol);
    };
    Negotiation::Unsupported(UpgradeRequired {
        error: format!(
            "protocol {protocol} is not supported: this control plane supports protocols {} to {}; {}",
            range.min,
            range.max,
            upgrade.phrase()
        ),
        agent_version,
        agent_protocol: protocol,
        supported_min: range.min,
        supported_max: range.max,
        upgrade,
    })
}

fn parse_protocol(raw: &[u8]) -> Option<u32> {
    let text = std::str::from_utf8(raw).ok()?.trim();
    if text.is_empty() || text.len() > 9 || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

fn parse_agent_version(raw: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(raw).ok()?.trim();
    let ok = !text.is_empty()
        && text.len() <= MAX_AGENT_VERSION_LEN
        && text.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'+' | b'-'));
    ok.then(|| text.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(protocol: Option<&str>, version: Option<&str>) -> Negotiation {
        negotiate(SupportedRange { min: 1, max: 1 }, protocol.map(str::as_bytes), version.map(str::as_bytes))
    }

    #[test]
    fn missing_header_means_protocol_one() {
        assert_eq!(check(None, None), Negotiation::Accepted(1));
        assert_eq!(check(Some("1"), Some("0.1.0")), Negotiation::Accepted(1));
        assert_eq!(check(Some(" 1 "), Some("0.1.0")), Negotiation::Accepted(1));
    }

    #[test]
    fn newer_agent_asks_for_control_plane_upgrade() {
        let Negotiation::Unsupported(body) = check(Some("2"), Some("0.3.0")) else { panic!() };
        assert_eq!(
            serde_json::to_value(&body).unwrap(),
            serde_json::json!({
                "error": "protocol 2 is not supported: this control plane supports protocols 1 to 1; upgrade the control-plane",
                "agent_version": "0.3.0",
                "agent_protocol": 2,
                "supported_min": 1,
                "supported_max": 1,
                "upgrade": "control-plane"
            })
        );
    }

    #[test]
    fn older_agent_asks_for_agent_upgrade() {
        let Negotiation::Unsupported(body) = check(Some("0"), None) else { panic!() };
        assert_eq!(body.upgrade, Upgrade::Agent);
        assert_eq!(body.agent_version, "unknown");
        assert!(body.error.ends_with("; upgrade the agent"), "{}", body.error);
    }

    #[test]
    fn malformed_headers_are_rejected() {
        for bad in ["abc", "", "-1", "+1", "1.0", "99999999999", "1 2"] {
            assert!(matches!(check(Some(bad), None), Negotiation::Malformed(_)), "{bad:?}");
        }
        for bad in ["", "0.1.0; rm -rf", "x".repeat(65).as_str(), "0.1.0 beta"] {
            assert!(matches!(check(Some("1"), Some(bad)), Negotiation::Malformed(_)), "{bad:?}");
        }
    }
}
