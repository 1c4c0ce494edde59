//! Input checks shared by both sides. The control plane checks what users and
//! agents send; the agent checks again what the control plane sends, because
//! it does not trust it either.

use std::fmt;

use base64::Engine;

/// A rejected field, with the field's name and what is wrong. The message
/// never repeats the value, which may be a secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValidationError {
    pub field: String,
    pub problem: String,
}

impl ValidationError {
    pub fn new(field: impl Into<String>, problem: impl Into<String>) -> Self {
        ValidationError { field: field.into(), problem: problem.into() }
    }
}

impl fmt::Display for ValidationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid {}: {}", self.field, self.problem)
    }
}

impl std::error::Error for ValidationError {}

/// Printable text of bounded length without control characters.
pub fn bounded_text(field: &str, value: &str, max: usize) -> Result<(), ValidationError> {
    if value.len() > max {
        return Err(ValidationError::new(field, format!("longer than {max} bytes")));
    }
    if value.chars().any(char::is_control) {
        return Err(ValidationError::new(field, "contains control characters"));
    }
    Ok(())
}

/// An identifier-like value: `[A-Za-z0-9._:-]`, 1..=max bytes.
pub fn token(field: &str, value: &str, max: usize) -> Result<(), ValidationError> {
    if value.is_empty() || value.len() > max {
        return Err(ValidationError::new(field, format!("must be 1 to {max} characters")));
    }
    if !value.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-')) {
        return Err(ValidationError::new(field, "may only contain letters, digits, '.', '_', ':' and '-'"));
    }
    Ok(())
}

/// A node id as the control plane makes them: `n-` and 16 lowercase hex
/// digits.
pub fn node_id(field: &str, value: &str) -> Result<(), ValidationError> {
    let ok = value
        .strip_prefix("n-")
        .is_some_and(|hex| hex.len() == 16 && hex.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)));
    if ok {
        Ok(())
    } else {
        Err(ValidationError::new(field, "must be a node id: n- and 16 lowercase hexadecimal digits"))
    }
}

/// A node or app name: lowercase DNS label, 1 to 63 characters, starting
/// with a letter or digit (so it can never be read as a command-line flag).
pub fn node_name(field: &str, value: &str) -> Result<(), ValidationError> {
    let ok = !value.is_empty()
        && value.len() <= 63
        && value.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !value.starts_with('-')
        && !value.ends_with('-');
    if ok {
        Ok(())
    } else {
        Err(ValidationError::new(
            field,
            "must be 1 to 63 lowercase letters, digits or '-', not starting or ending with '-'",
        ))
    }
}

/// A DNS host name (labels of letters, digits, '-' and '_'), at most 253
/// characters. Case is not folded here.
pub fn hostname(field: &str, value: &str) -> Result<(), ValidationError> {
    let labels_ok = value.split('.').all(|label| {
        !label.is_empty()
            && label.len() <= 63
            && !label.starts_with('-')
            && label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    });
    if value.is_empty() || value.len() > 253 || !labels_ok {
        return Err(ValidationError::new(field, "is not a valid host name"));
    }
    Ok(())
}

/// The longest host an app can be served on. The ingress looks a host up as
/// `<host>.h.cloudweb.` in its upstream directory, and a DNS name holds at
/// most 253 characters.
pub const MAX_ROUTE_HOST_LEN: usize = 240;

/// A host name the ingress can route: [`hostname`] and at most
/// [`MAX_ROUTE_HOST_LEN`] characters.
pub fn route_host(field: &str, value: &str) -> Result<(), ValidationError> {
    hostname(field, value)?;
    if value.len() > MAX_ROUTE_HOST_LEN {
        return Err(ValidationError::new(field, "is longer than the 240 characters the ingress can route"));
    }
    Ok(())
}

/// `host:port`, where host is a host name, an IPv4 address or `[IPv6]`.
pub fn endpoint(field: &str, value: &str) -> Result<(), ValidationError> {
    let bad = || ValidationError::new(field, "must be host:port");
    let (host, port) = value.rsplit_once(':').ok_or_else(bad)?;
    let port: u16 = port.parse().map_err(|_| bad())?;
    if port == 0 {
        return Err(bad());
    }
    if let Some(v6) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        v6.parse::<std::net::Ipv6Addr>().map_err(|_| bad())?;
        return Ok(());
    }
    if host.parse::<std::net::Ipv4Addr>().is_ok() {
        return Ok(());
    }
    hostname(field, host).map_err(|_| bad())
}

/// A WireGuard public key: base64 of 32 bytes.
pub fn wireguard_key(field: &str, value: &str) -> Result<(), ValidationError> {
    match base64::engine::general_purpose::STANDARD.decode(value) {
        Ok(bytes) if bytes.len() == 32 && value.len() == 44 => Ok(()),
        _ => Err(ValidationError::new(field, "must be a base64 WireGuard public key (32 bytes)")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        for good in ["web", "n1", "a-b", "x".repeat(63).as_str()] {
            node_name("name", good).unwrap();
        }
        for bad in ["", "-x", "x-", "Web", "a b", "a;rm", "x".repeat(64).as_str(), "a/b", "$(id)"] {
            assert!(node_name("name", bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn hosts_and_endpoints() {
        hostname("h", "node-1.example.com").unwrap();
        assert!(hostname("h", "a..b").is_err());
        assert!(hostname("h", "a b").is_err());
        // 4 labels of 59 plus dots: 239 characters, routable; one more label is not.
        let long = vec!["x".repeat(59); 4].join(".");
        assert_eq!(long.len(), 239);
        route_host("h", &long).unwrap();
        let too_long = format!("{long}.ab");
        hostname("h", &too_long).unwrap();
        assert!(route_host("h", &too_long).is_err());
        assert!(route_host("h", "a b").is_err());
        endpoint("e", "10.0.0.1:51820").unwrap();
        endpoint("e", "[::1]:51820").unwrap();
        endpoint("e", "node.example.com:51820").unwrap();
        for bad in ["10.0.0.1", "x:0", "x:99999", ":1", "a b:1"] {
            assert!(endpoint("e", bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn wireguard_keys() {
        wireguard_key("k", "YWJjZGVmZ2hpamtsbW5vcHFyc3R1dnd4eXphYmNkZWY=").unwrap();
        assert!(wireguard_key("k", "short").is_err());
    }

    #[test]
    fn errors_never_echo_the_value() {
        let err = token("token", "secret value!", 64).unwrap_err();
        assert!(!err.to_string().contains("secret"));
    }
}
