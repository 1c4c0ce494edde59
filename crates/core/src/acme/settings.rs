//! `--acme-ca`, `--acme-email`, `--acme-ca-root` and `--acme-challenge`,
//! checked once at start.

use std::path::PathBuf;

/// Let's Encrypt's production directory, the default CA.
pub const LETS_ENCRYPT: &str = "https://acme-v02.api.letsencrypt.org/directory";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AcmeSettings {
    /// The CA's directory URL.
    pub directory: String,
    /// The account's contact address, if any.
    pub email: Option<String>,
    /// A PEM file with the one root the CA's directory is served under,
    /// instead of the system's roots (a test or private CA).
    pub ca_root: Option<PathBuf>,
    /// The challenge type orders use when the CA offers it.
    pub challenge: Challenge,
}

/// The ACME challenge types the cluster can answer on every ingress node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Challenge {
    /// RFC 8555 8.3: the CA fetches `http://<host>/.well-known/acme-challenge/<token>`
    /// (port 80).
    #[default]
    Http01,
    /// RFC 8737: the CA opens TLS with ALPN `acme-tls/1` to the host
    /// (port 443) and checks the certificate it is shown.
    TlsAlpn01,
}

impl Challenge {
    pub fn name(self) -> &'static str {
        match self {
            Challenge::Http01 => "http-01",
            Challenge::TlsAlpn01 => "tls-alpn-01",
        }
    }

    /// The other type, tried when the CA does not offer this one.
    pub fn other(self) -> Challenge {
        match self {
            Challenge::Http01 => Challenge::TlsAlpn01,
            Challenge::TlsAlpn01 => Challenge::Http01,
        }
    }

    /// `--acme-challenge`'s value.
    pub fn parse(value: &str) -> Result<Challenge, String> {
        match value {
            "http-01" => Ok(Challenge::Http01),
            "tls-alpn-01" => Ok(Challenge::TlsAlpn01),
            _ => Err(format!("--acme-challenge {value:?} must be http-01 or tls-alpn-01")),
        }
    }
}

impl Default for AcmeSettings {
    fn default() -> Self {
        AcmeSettings { directory: LETS_ENCRYPT.to_string(), email: None, ca_root: None, challenge: Challenge::Http01 }
    }
}

impl AcmeSettings {
    /// Checks the flags' values; errors name the flag, and say what is
    /// wrong without echoing more than the flag's own value.
    pub fn parse(directory: &str, email: Option<&str>, ca_root: Option<PathBuf>) -> Result<AcmeSettings, String> {
        let url = url::Url::parse(directory).map_err(|e| format!("--acme-ca {directory:?} is not a URL: {e}"))?;
        if url.scheme() != "https" {
            return Err(format!("--acme-ca {directory:?} must be an https:// URL (ACME requires HTTPS)"));
        }
        if url.host().is_none() || !url.username().is_empty() || url.password().is_some() || url.fragment().is_some() {
            return Err(format!("--acme-ca {directory:?} must be https://host[:port]/path, without credentials or fragment"));
        }
        let email = match email {
            Some(email) => {
                check_email(email)?;
                Some(email.to_string())
            }
            None => None,
        };
        if let Some(path) = &ca_root {
            let text = std::fs::read(path).map_err(|e| format!("--acme-ca-root {}: {e}", path.display()))?;
            let mut certs = rustls_pki_types::CertificateDer::pem_slice_iter(&text);
            match certs.next() {
                Some(Ok(_)) => {}
                _ => return Err(format!("--acme-ca-root {} holds no PEM certificate", path.display())),
            }
        }
        Ok(AcmeSettings { directory: url.to_string(), email, ca_root, challenge: Challenge::Http01 })
    }

    /// Sets the preferred challenge type from `--acme-challenge`.
    pub fn with_challenge(mut self, value: &str) -> Result<AcmeSettings, String> {
        self.challenge = Challenge::parse(value)?;
        Ok(self)
    }
}

use rustls_pki_types::pem::PemObject;

/// A plain `local@domain` address: the CA sends expiry notices there, and
/// `mailto:` URLs break on spaces, commas and control characters.
fn check_email(email: &str) -> Result<(), String> {
    let bad = |why: &str| Err(format!("--acme-email must be an address like ops@example.com: {why}"));
    if email.len() > 254 {
        return bad("longer than 254 characters");
    }
    let Some((local, domain)) = email.split_once('@') else {
        return bad("no '@'");
    };
    if local.is_empty() || local.len() > 64 {
        return bad("the part before '@' must be 1 to 64 characters");
    }
    if !local.bytes().all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+/=?^_`{|}~.-".contains(&b)) || local.starts_with('.') || local.ends_with('.') {
        return bad("the part before '@' has characters an address cannot hold");
    }
    if cloudweb_protocol::validate::hostname("domain", domain).is_err() || !domain.contains('.') {
        return bad("the part after '@' is not a domain name");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_to_lets_encrypt() {
        assert_eq!(AcmeSettings::default().directory, LETS_ENCRYPT);
        assert_eq!(AcmeSettings::parse(LETS_ENCRYPT, None, None).unwrap(), AcmeSettings::default());
    }

    #[test]
    fn checks_the_directory_url() {
        assert!(AcmeSettings::parse("https://127.0.0.1:14000/dir", None, None).is_ok());
        for bad in ["http://ca.example.com/dir", "ca.example.com", "https://user:pw@ca.example.com/dir", "https://ca.example.com/dir#x", "file:///etc/x"] {
            let err = AcmeSettings::parse(bad, None, None).unwrap_err();
            assert!(err.starts_with("--acme-ca"), "{bad}: {err}");
        }
    }

    #[test]
    fn checks_the_email() {
        assert_eq!(AcmeSettings::parse(LETS_ENCRYPT, Some("ops+certs@example.com"), None).unwrap().email.as_deref(), Some("ops+certs@example.com"));
        for bad in ["", "ops", "@example.com", "ops@", "ops@localhost", "o ps@example.com", "ops@exa mple.com", "a,b@example.com", "ops@example.com\n"] {
            let err = AcmeSettings::parse(LETS_ENCRYPT, Some(bad), None).unwrap_err();
            assert!(err.starts_with("--acme-email"), "{bad:?}: {err}");
        }
    }

    #[test]
    fn checks_the_challenge() {
        assert_eq!(AcmeSettings::default().challenge, Challenge::Http01);
        let settings = AcmeSettings::default().with_challenge("tls-alpn-01").unwrap();
        assert_eq!(settings.challenge, Challenge::TlsAlpn01);
        assert_eq!(settings.challenge.other(), Challenge::Http01);
        assert_eq!(AcmeSettings::default().with_challenge("http-01").unwrap().challenge, Challenge::Http01);
        for bad in ["", "dns-01", "HTTP-01", "tls-alpn-01 "] {
            assert!(AcmeSettings::default().with_challenge(bad).unwrap_err().starts_with("--acme-challenge"), "{bad:?}");
        }
    }

    #[test]
    fn checks_the_root_file() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.pem");
        assert!(AcmeSettings::parse(LETS_ENCRYPT, None, Some(missing)).unwrap_err().contains("--acme-ca-root"));
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "not a certificate").unwrap();
        assert!(AcmeSettings::parse(LETS_ENCRYPT, None, Some(empty)).unwrap_err().contains("no PEM certificate"));
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["ca.test".to_string()]).unwrap().self_signed(&key).unwrap();
        let good = dir.path().join("root.pem");
        std::fs::write(&good, cert.pem()).unwrap();
        assert!(AcmeSettings::parse(LETS_ENCRYPT, None, Some(good)).is_ok());
    }
}
