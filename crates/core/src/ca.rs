//! The cluster certificate authority. It is created on first start, its key
//! never leaves the data dir (mode 0600), and it signs two kinds of
//! certificates: the agent listener's server certificate and one client
//! certificate per node. A node's identity, key usage and validity always
//! come from here, never from what the node's CSR asks for.

use std::fs;
use std::io::Write;
use std::net::IpAddr;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertificateSigningRequestParams, DistinguishedName, DnType,
    ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use sha2::{Digest, Sha256};
use time::{Duration, OffsetDateTime};

pub const CA_CERT_FILE: &str = "ca.crt";
pub const CA_KEY_FILE: &str = "ca.key";
/// The agent listener's key. It persists so that its public-key pin, which
/// join commands carry, stays valid across restarts.
pub const LISTENER_KEY_FILE: &str = "listener.key";
/// The listener's certificate in force, kept so that a restart reuses it
/// until it is due for renewal.
pub const LISTENER_CERT_FILE: &str = "listener.crt";

/// How long a node's client certificate is valid unless configured
/// otherwise (`--node-cert-seconds`). Agents renew at two thirds of it.
pub const NODE_CERT_VALIDITY: Duration = Duration::days(365);
/// The listener's server certificate, unless configured otherwise
/// (`--listener-cert-seconds`); renewed at two thirds of it.
pub const LISTENER_CERT_VALIDITY: Duration = Duration::days(365);
/// How long the CA itself is valid.
const CA_VALIDITY: Duration = Duration::days(3650);

#[derive(Debug, thiserror::Error)]
pub enum CaError {
    #[error("cannot read or write {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("certificate error: {0}")]
    Cert(#[from] rcgen::Error),
    #[error("the certificate signing request is not valid: {0}")]
    BadCsr(String),
    #[error("{0} exists but {1} does not; refusing to create a new CA over half of an old one")]
    HalfPresent(PathBuf, PathBuf),
}

pub struct ClusterCa {
    cert_pem: String,
    cert_der: CertificateDer<'static>,
    issuer: Issuer<'static, KeyPair>,
    fingerprint: String,
}

/// An issued certificate with its private key, both PEM.
pub struct IssuedKeyPair {
    pub cert_pem: String,
    pub key_pem: String,
}

impl ClusterCa {
    /// Loads the CA from `dir`, or creates it when neither file exists.
    pub fn load_or_create(dir: &Path, now: OffsetDateTime) -> Result<ClusterCa, CaError> {
        let cert_path = dir.join(CA_CERT_FILE);
        let key_path = dir.join(CA_KEY_FILE);
        match (cert_path.exists(), key_path.exists()) {
            (true, true) => {
                let cert_pem = read(&cert_path)?;
                let key_pem = read(&key_path)?;
                Self::from_pem(&cert_pem, &key_pem)
            }
            (false, false) => {
                let key = KeyPair::generate()?;
                let mut params = CertificateParams::default();
                let mut name = DistinguishedName::new();
                name.push(DnType::CommonName, "cloud-web cluster CA");
                name.push(DnType::OrganizationName, "cloud-web");
                params.distinguished_name = name;
                params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
                params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
                params.not_before = now - Duration::hours(1);
                params.not_after = now + CA_VALIDITY;
                let cert = params.self_signed(&key)?;
                write_private(&key_path, key.serialize_pem().as_bytes())?;
                write_private(&cert_path, cert.pem().as_bytes())?;
                Self::from_pem(&cert.pem(), &key.serialize_pem())
            }
            (true, false) => Err(CaError::HalfPresent(cert_path, key_path)),
            (false, true) => Err(CaError::HalfPresent(key_path, cert_path)),
        }
    }

    fn from_pem(cert_pem: &str, key_pem: &str) -> Result<ClusterCa, CaError> {
        let key = KeyPair::from_pem(key_pem)?;
        let issuer = Issuer::from_ca_cert_pem(cert_pem, key)?;
        let cert_der = CertificateDer::from_pem_slice(cert_pem.as_bytes())
            .map_err(|e| CaError::BadCsr(format!("stored CA certificate: {e}")))?;
        let fingerprint = sha256_hex(&cert_der);
        Ok(ClusterCa { cert_pem: cert_pem.to_string(), cert_der, issuer, fingerprint })
    }

    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    pub fn cert_der(&self) -> &CertificateDer<'static> {
        &self.cert_der
    }

    /// Lowercase hex SHA-256 of the CA certificate's DER: what
    /// `--ca-sha256` pins.
    pub fn fingerprint(&self) -> &str {
        &self.fingerprint
    }

    /// A fresh server certificate for the agent listener, valid for `hosts`
    /// (names or IP addresses), for the listener key in `dir` (created on
    /// first use).
    pub fn issue_server_cert(&self, dir: &Path, hosts: &[String], now: OffsetDateTime) -> Result<IssuedKeyPair, CaError> {
        self.issue_server_cert_for(dir, hosts, now, LISTENER_CERT_VALIDITY)
    }

    /// The same, valid for `lifetime`. The key stays the one in `dir`, so
    /// a renewed certificate keeps the public-key pin.
    pub fn issue_server_cert_for(&self, dir: &Path, hosts: &[String], now: OffsetDateTime, lifetime: Duration) -> Result<IssuedKeyPair, CaError> {
        let key = ensure_listener_key(dir)?;
        let mut params = CertificateParams::default();
        let mut name = DistinguishedName::new();
        name.push(DnType::CommonName, "cloud-web control plane");
        params.distinguished_name = name;
        params.subject_alt_names = hosts
            .iter()
            .map(|h| match h.parse::<IpAddr>() {
                Ok(ip) => Ok(SanType::IpAddress(ip)),
                Err(_) => Ok(SanType::DnsName(h.clone().try_into()?)),
            })
            .collect::<Result<_, rcgen::Error>>()?;
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        // Backdated for clocks a little behind ours, by at most a tenth of
        // the lifetime, so renewal at two thirds stays well before expiry.
        params.not_before = now - Duration::hours(1).min(lifetime / 10);
        params.not_after = now + lifetime;
        // A serial of its own: rcgen's default derives it from the key,
        // which stays the same across renewals (RFC 5280 wants one serial
        // per certificate of a CA).
        let mut serial: [u8; 16] = rand::random();
        serial[0] &= 0x7f;
        serial[0] |= 0x01;
        params.serial_number = Some(rcgen::SerialNumber::from_slice(&serial));
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok(IssuedKeyPair { cert_pem: cert.pem(), key_pem: key.serialize_pem() })
    }

    /// Signs a node's CSR for `lifetime`. Only the CSR's public key is used
    /// (after its signature is verified, proving the node holds the private
    /// key); subject, extensions and validity are set here.
    pub fn sign_node_csr(&self, csr_pem: &str, node_id: &str, now: OffsetDateTime, lifetime: Duration) -> Result<NodeCert, CaError> {
        let csr = CertificateSigningRequestParams::from_pem(csr_pem).map_err(|e| CaError::BadCsr(e.to_string()))?;
        let not_after = now + lifetime;
        let mut params = CertificateParams::default();
        let mut name = DistinguishedName::new();
        name.push(DnType::CommonName, node_id);
        name.push(DnType::OrganizationName, "cloud-web node");
        params.distinguished_name = name;
        params.subject_alt_names = vec![SanType::DnsName(node_id.to_string().try_into()?)];
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        // Backdated for clocks a little behind ours, by at most a tenth of
        // the lifetime: agents renew at two thirds of not_before..not_after.
        params.not_before = now - Duration::minutes(5).min(lifetime / 10);
        params.not_after = not_after;
        let cert = params.signed_by(&csr.public_key, &self.issuer)?;
        let der = cert.der().clone();
        Ok(NodeCert { pem: cert.pem(), sha256: sha256_hex(&der), not_after_ms: (not_after.unix_timestamp_nanos() / 1_000_000) as i64 })
    }
}

/// A node certificate as issued.
#[derive(Debug, Clone)]
pub struct NodeCert {
    pub pem: String,
    /// What the listener sees as the node's fingerprint.
    pub sha256: String,
    /// End of validity, Unix milliseconds.
    pub not_after_ms: i64,
}

/// What a CSR says about itself: the names it asks for (common names and
/// DNS subject alternative names) and its public key (raw bytes). Its
/// signature is checked when it is signed ([`ClusterCa::sign_node_csr`]).
#[derive(Debug, Clone)]
pub struct CsrClaims {
    pub names: Vec<String>,
    pub public_key: Vec<u8>,
}

pub fn csr_claims(csr_pem: &str) -> Result<CsrClaims, CaError> {
    use x509_parser::prelude::{FromDer, GeneralName, ParsedExtension, X509CertificationRequest};
    let der = rustls_pki_types::CertificateSigningRequestDer::from_pem_slice(csr_pem.as_bytes())
        .map_err(|e| CaError::BadCsr(e.to_string()))?;
    let (_, csr) = X509CertificationRequest::from_der(der.as_ref()).map_err(|e| CaError::BadCsr(e.to_string()))?;
    let info = &csr.certification_request_info;
    let mut names: Vec<String> =
        info.subject.iter_common_name().map(|cn| cn.as_str().map(str::to_string).unwrap_or_else(|_| "?".to_string())).collect();
    for extension in csr.requested_extensions().into_iter().flatten() {
        if let ParsedExtension::SubjectAlternativeName(san) = extension {
            for name in &san.general_names {
                names.push(match name {
                    GeneralName::DNSName(dns) => dns.to_string(),
                    other => other.to_string(),
                });
            }
        }
    }
    Ok(CsrClaims { names, public_key: info.subject_pki.subject_public_key.data.to_vec() })
}

/// The raw public key of a certificate (DER).
pub fn cert_public_key(der: &[u8]) -> Option<Vec<u8>> {
    use x509_parser::prelude::{FromDer, X509Certificate};
    let (_, cert) = X509Certificate::from_der(der).ok()?;
    Some(cert.public_key().subject_public_key.data.to_vec())
}

/// Replaces a file readable by its owner only: written beside it, then
/// renamed over it, so a crash leaves the old or the new file whole.
pub fn replace_private(path: &Path, contents: &[u8]) -> Result<(), CaError> {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".new");
    let next = path.with_file_name(name);
    match fs::remove_file(&next) {
        Ok(()) => {}
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
        Err(source) => return Err(CaError::Io { path: next, source }),
    }
    write_private(&next, contents)?;
    fs::rename(&next, path).map_err(|source| CaError::Io { path: path.to_path_buf(), source })
}

/// Lowercase hex SHA-256 of some bytes.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// Parses the first certificate of a PEM text into DER.
pub fn first_cert_der(pem: &str) -> Option<CertificateDer<'static>> {
    CertificateDer::from_pem_slice(pem.as_bytes()).ok()
}

/// Parses a private key from PEM.
pub fn private_key_der(pem: &str) -> Option<PrivateKeyDer<'static>> {
    PrivateKeyDer::from_pem_slice(pem.as_bytes()).ok()
}

fn read(path: &Path) -> Result<String, CaError> {
    fs::read_to_string(path).map_err(|source| CaError::Io { path: path.to_path_buf(), source })
}

/// The agent listener's key in `dir`, made on first use. It outlives every
/// certificate issued for it, so the agents' public-key pin holds across
/// renewals (and across replicas, which share it).
pub fn ensure_listener_key(dir: &Path) -> Result<KeyPair, CaError> {
    let key_path = dir.join(LISTENER_KEY_FILE);
    if key_path.exists() {
        return Ok(KeyPair::from_pem(&read(&key_path)?)?);
    }
    let key = KeyPair::generate()?;
    write_private(&key_path, key.serialize_pem().as_bytes())?;
    Ok(key)
}

/// Writes a file readable by its owner only, creating it with mode 0600 so
/// that it is never readable by others, not even for a moment.
pub fn write_private(path: &Path, contents: &[u8]) -> Result<(), CaError> {
    let io = |source| CaError::Io { path: path.to_path_buf(), source };
    let mut file = fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path).map_err(io)?;
    file.write_all(contents).map_err(io)?;
    file.sync_all().map_err(io)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use rcgen::{CertificateParams, KeyPair};
    use x509_parser::prelude::{FromDer, GeneralName, X509Certificate};

    use super::*;

    fn now() -> OffsetDateTime {
        OffsetDateTime::now_utc()
    }

    #[test]
    fn ca_is_created_once_with_a_private_key_file() {
        let dir = tempfile::tempdir().unwrap();
        let ca = ClusterCa::load_or_create(dir.path(), now()).unwrap();
        let mode = fs::metadata(dir.path().join(CA_KEY_FILE)).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let again = ClusterCa::load_or_create(dir.path(), now()).unwrap();
        assert_eq!(ca.fingerprint(), again.fingerprint());
        assert_eq!(ca.fingerprint().len(), 64);
    }

    #[test]
    fn csr_cannot_choose_identity_or_become_a_ca() {
        let dir = tempfile::tempdir().unwrap();
        let ca = ClusterCa::load_or_create(dir.path(), now()).unwrap();
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(vec!["evil.example.com".to_string()]).unwrap();
        params.distinguished_name.push(rcgen::DnType::CommonName, "n-admin");
        params.is_ca = IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let csr = params.serialize_request(&key).unwrap().pem().unwrap();

        let signed = ca.sign_node_csr(&csr, "n-0123456789abcdef", now(), NODE_CERT_VALIDITY).unwrap();
        let der = first_cert_der(&signed.pem).unwrap();
        assert_eq!(signed.sha256, sha256_hex(&der));
        let (_, cert) = X509Certificate::from_der(&der).unwrap();
        let cn: Vec<_> = cert.subject().iter_common_name().map(|c| c.as_str().unwrap().to_string()).collect();
        assert_eq!(cn, vec!["n-0123456789abcdef"]);
        assert!(!cert.is_ca());
        let eku = cert.extended_key_usage().unwrap().unwrap().value;
        assert!(eku.client_auth && !eku.server_auth);
        let sans = cert.subject_alternative_name().unwrap().unwrap().value;
        assert_eq!(sans.general_names, vec![GeneralName::DNSName("n-0123456789abcdef")]);
        // The certified key is the CSR's key.
        assert_eq!(cert.public_key().subject_public_key.data.as_ref(), key.public_key_raw());
    }

    #[test]
    fn lifetime_is_the_callers_and_claims_are_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let ca = ClusterCa::load_or_create(dir.path(), now()).unwrap();
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(vec!["n-00000000000000aa".to_string()]).unwrap();
        params.distinguished_name.push(rcgen::DnType::CommonName, "n-00000000000000bb");
        let csr = params.serialize_request(&key).unwrap().pem().unwrap();
        let claims = csr_claims(&csr).unwrap();
        assert_eq!(claims.names, vec!["n-00000000000000bb".to_string(), "n-00000000000000aa".to_string()]);
        assert_eq!(claims.public_key, key.public_key_raw());

        let at = now();
        let signed = ca.sign_node_csr(&csr, "n-00000000000000aa", at, Duration::seconds(90)).unwrap();
        let der = first_cert_der(&signed.pem).unwrap();
        let (_, cert) = X509Certificate::from_der(&der).unwrap();
        assert_eq!(cert.validity().not_after.timestamp(), (at + Duration::seconds(90)).unix_timestamp());
        assert_eq!(signed.not_after_ms / 1000, (at + Duration::seconds(90)).unix_timestamp());
        assert_eq!(cert_public_key(&der).unwrap(), key.public_key_raw());
        assert!(csr_claims("garbage").is_err());
    }

    #[test]
    fn garbage_csr_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let ca = ClusterCa::load_or_create(dir.path(), now()).unwrap();
        assert!(matches!(ca.sign_node_csr("not a csr", "n-1", now(), NODE_CERT_VALIDITY), Err(CaError::BadCsr(_))));
    }
}
