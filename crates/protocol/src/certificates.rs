//! Certificates the control plane obtains from the ACME CA for public host
//! names and hands to every ingress node, and the HTTP-01 and TLS-ALPN-01
//! challenge answers every ingress node serves on its behalf.
//!
//! One certificate per host serves the whole cluster: the control plane
//! places one order per host, any ingress node answers the CA's challenge
//! (it asks the control plane for the key authorization of the token), and
//! each ingress loads the certificates of [`CertificateSet`].

use serde::{Deserialize, Serialize};

use crate::validate::ValidationError;

/// Body of `GET /agent/v1/certificates`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CertificateSet {
    /// Names the content: equal versions hold the same certificates.
    pub version: String,
    /// Absent when the agent asked with `?known=<version>` and already
    /// holds this version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub certificates: Option<Vec<HostCertificate>>,
}

/// One host's certificate and key, as PEM.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostCertificate {
    pub host: String,
    /// The leaf first, then the intermediates.
    pub chain_pem: String,
    /// The private key (PKCS#8 PEM).
    pub key_pem: String,
    /// Unix milliseconds.
    pub not_after_ms: i64,
}

impl std::fmt::Debug for HostCertificate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostCertificate").field("host", &self.host).field("not_after_ms", &self.not_after_ms).finish_non_exhaustive()
    }
}

/// Body of `GET /agent/v1/acme-tls-alpn`: the TLS-ALPN-01 challenges the
/// control plane's orders wait on. Every ingress node puts them where its
/// Caddy looks for them at an `acme-tls/1` handshake.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct TlsAlpnChallenges {
    /// Names the content: equal versions hold the same challenges. The
    /// agent sends the version it has put in place as `?applied=`; the
    /// control plane tells the CA a challenge is ready once every ready
    /// ingress node applied it (or after a bounded wait).
    pub version: String,
    #[serde(default)]
    pub challenges: Vec<TlsAlpnChallenge>,
}

/// One pending TLS-ALPN-01 challenge (RFC 8737).
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TlsAlpnChallenge {
    /// The DNS name being validated (the handshake's SNI).
    pub host: String,
    /// `token.thumbprint`: its SHA-256 goes into the `acmeIdentifier`
    /// extension of the certificate shown to the CA.
    pub key_authorization: String,
}

impl std::fmt::Debug for TlsAlpnChallenge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsAlpnChallenge").field("host", &self.host).finish_non_exhaustive()
    }
}

/// A key authorization as RFC 8555 8.1 builds it: `token.thumbprint`, both
/// base64url.
pub fn key_authorization(field: &str, value: &str) -> Result<(), ValidationError> {
    let Some((token, thumbprint)) = value.split_once('.') else {
        return Err(ValidationError::new(field, "must be token.thumbprint"));
    };
    challenge_token(field, token)?;
    challenge_token(field, thumbprint)
}

/// Whether a host gets its certificate from the ingress's own internal CA
/// (`localhost`, `*.localhost`, `*.test`, `*.internal`, `*.local`,
/// `*.invalid` and IP addresses: names no public CA issues for) rather
/// than from the ACME CA through the control plane.
pub fn internal_host(host: &str) -> bool {
    host.parse::<std::net::IpAddr>().is_ok()
        || host == "localhost"
        || [".localhost", ".test", ".internal", ".local", ".invalid"].iter().any(|suffix| host.ends_with(suffix))
}

/// Longest ACME challenge token accepted (RFC 8555 asks for at least 128
/// bits of entropy, base64url; CAs send 43 characters).
pub const MAX_TOKEN_LEN: usize = 128;

/// An HTTP-01 token: base64url characters only, so it can never leave the
/// path segment it is put in.
pub fn challenge_token(field: &str, value: &str) -> Result<(), ValidationError> {
    if value.is_empty() || value.len() > MAX_TOKEN_LEN {
        return Err(ValidationError::new(field, format!("must be 1 to {MAX_TOKEN_LEN} characters")));
    }
    if !value.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_') {
        return Err(ValidationError::new(field, "may only contain base64url characters"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_authorizations() {
        assert!(key_authorization("k", "abc_DEF-1.thumb_print").is_ok());
        for bad in ["", "abc", "abc.", ".abc", "a.b.c", "a/b.c", "a.b\n"] {
            assert!(key_authorization("k", bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn internal_and_public_hosts() {
        for host in ["localhost", "web.localhost", "a.test", "db.internal", "x.local", "10.0.0.1", "::1"] {
            assert!(internal_host(host), "{host}");
        }
        for host in ["www.example.com", "shop.example.org", "testing.com"] {
            assert!(!internal_host(host), "{host}");
        }
    }

    #[test]
    fn tokens() {
        assert!(challenge_token("token", "LoqXcYV8q5ONbJQxbmR7SCTNo3tiAXDfowyjxAjEuX0").is_ok());
        for bad in ["", "../x", "a b", "a/b", "a?b", &"a".repeat(129)] {
            assert!(challenge_token("token", bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn keys_stay_out_of_debug_output() {
        let cert = HostCertificate { host: "a.example.com".into(), chain_pem: "C".into(), key_pem: "SECRET".into(), not_after_ms: 1 };
        assert!(!format!("{cert:?}").contains("SECRET"));
    }
}
