//! The agent listener's server certificate over time. It is issued by the
//! cluster CA for the listener's key (`listener.key`, which never changes,
//! so the public-key pin in join commands stays valid), kept in
//! `listener.crt` so a restart reuses it, and renewed while the server runs
//! at two thirds of its life ([`renew`]). The TLS configuration asks
//! [`ListenerCert`] for the certificate at every handshake, so a renewed one
//! is served from the next handshake on; connections made under the old one
//! are closed once their request in flight is answered, and the TLS session
//! cache is emptied (a resumed session would skip the certificate), so
//! agents move to the new certificate, verifying it, within a request.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use rustls::client::danger::ServerCertVerifier;
use rustls::crypto::CryptoProvider;
use rustls::server::{ClientHello, ResolvesServerCert, ServerSessionMemoryCache, StoresServerSessions};
use rustls::sign::CertifiedKey;
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};
use sha2::Digest;
use x509_parser::prelude::{FromDer, X509Certificate};

use crate::ca::{self, ClusterCa, IssuedKeyPair};
use crate::AppState;

/// The longest wait between two looks at the certificate's age, so a
/// moved clock is noticed.
const LOOK_AT_LEAST_EVERY: Duration = Duration::from_secs(60);
/// First and longest wait after a failed renewal.
pub const FIRST_RETRY: Duration = Duration::from_secs(5);
pub const LONGEST_RETRY: Duration = Duration::from_secs(600);

/// What is known of the certificate in force.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertInfo {
    /// Lowercase hex of the serial number's bytes.
    pub serial: String,
    /// Lowercase hex SHA-256 of the certificate's DER.
    pub sha256: String,
    pub not_before_ms: i64,
    pub not_after_ms: i64,
}

/// The listener's certificate resolver: one certified key, swapped on
/// renewal.
pub struct ListenerCert {
    provider: Arc<CryptoProvider>,
    ca_der: CertificateDer<'static>,
    data_dir: PathBuf,
    hosts: Vec<String>,
    lifetime: time::Duration,
    current: RwLock<(Arc<CertifiedKey>, CertInfo)>,
    sessions: Arc<Sessions>,
    /// Counts renewals; connections watch it to close once it moves.
    renewed: tokio::sync::watch::Sender<u64>,
}

impl fmt::Debug for ListenerCert {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ListenerCert").field("info", &self.info()).finish_non_exhaustive()
    }
}

impl ResolvesServerCert for ListenerCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.read().expect("listener cert lock").0.clone())
    }
}

impl ListenerCert {
    /// The certificate kept in `data_dir` if it still suits (issued by this
    /// CA for the listener key, valid for every one of `hosts` at `now`,
    /// not yet due for renewal), else a new one, which is kept.
    pub fn load_or_issue(
        ca: &ClusterCa,
        provider: Arc<CryptoProvider>,
        data_dir: &Path,
        hosts: &[String],
        now: time::OffsetDateTime,
        lifetime: time::Duration,
    ) -> Result<ListenerCert, TlsSetupError> {
        let kept = reusable(ca, &provider, data_dir, hosts, now);
        let issued = match kept {
            Some(issued) => issued,
            None => {
                let issued = ca.issue_server_cert_for(data_dir, hosts, now, lifetime)?;
                ca::replace_private(&data_dir.join(ca::LISTENER_CERT_FILE), issued.cert_pem.as_bytes())?;
                issued
            }
        };
        let (key, info) = certified(&provider, &issued, ca.cert_der())?;
        Ok(ListenerCert {
            provider,
            ca_der: ca.cert_der().clone(),
            data_dir: data_dir.to_path_buf(),
            hosts: hosts.to_vec(),
            lifetime,
            current: RwLock::new((key, info)),
            sessions: Arc::new(Sessions::new()),
            renewed: tokio::sync::watch::Sender::new(0),
        })
    }

    pub fn info(&self) -> CertInfo {
        self.current.read().expect("listener cert lock").1.clone()
    }

    /// The served leaf, DER.
    pub fn leaf(&self) -> CertificateDer<'static> {
        self.current.read().expect("listener cert lock").0.cert[0].clone()
    }

    /// The TLS session cache, emptied on every renewal.
    pub fn sessions(&self) -> Arc<Sessions> {
        self.sessions.clone()
    }

    /// Moves on every renewal.
    pub fn renewals(&self) -> tokio::sync::watch::Receiver<u64> {
        self.renewed.subscribe()
    }

    /// Issues, keeps and serves a new certificate for the same key.
    pub fn renew_now(&self, ca: &ClusterCa, now: time::OffsetDateTime) -> Result<CertInfo, TlsSetupError> {
        let issued = ca.issue_server_cert_for(&self.data_dir, &self.hosts, now, self.lifetime)?;
        let (key, info) = certified(&self.provider, &issued, &self.ca_der)?;
        ca::replace_private(&self.data_dir.join(ca::LISTENER_CERT_FILE), issued.cert_pem.as_bytes())?;
        *self.current.write().expect("listener cert lock") = (key, info.clone());
        self.sessions.clear();
        self.renewed.send_modify(|n| *n += 1);
        Ok(info)
    }
}

/// Sessions that can resume (rustls's memory cache, as by default), emptied
/// when the certificate is renewed so that every client handshakes in full
/// and verifies the new certificate.
#[derive(Debug)]
pub struct Sessions {
    inner: RwLock<Arc<ServerSessionMemoryCache>>,
}

/// Sessions kept, as rustls's default.
const SESSIONS: usize = 256;

impl Sessions {
    fn new() -> Sessions {
        Sessions { inner: RwLock::new(ServerSessionMemoryCache::new(SESSIONS)) }
    }

    fn clear(&self) {
        *self.inner.write().expect("sessions lock") = ServerSessionMemoryCache::new(SESSIONS);
    }

    fn cache(&self) -> Arc<ServerSessionMemoryCache> {
        self.inner.read().expect("sessions lock").clone()
    }
}

impl StoresServerSessions for Sessions {
    fn put(&self, key: Vec<u8>, value: Vec<u8>) -> bool {
        self.cache().put(key, value)
    }

    fn get(&self, key: &[u8]) -> Option<Vec<u8>> {
        self.cache().get(key)
    }

    fn take(&self, key: &[u8]) -> Option<Vec<u8>> {
        self.cache().take(key)
    }

    fn can_cache(&self) -> bool {
        true
    }
}

/// The public-key pin of a leaf: `sha256//<base64 of the SHA-256 of its
/// SubjectPublicKeyInfo>`.
pub fn pin_of(leaf: &[u8]) -> Result<String, TlsSetupError> {
    use base64::Engine;
    let (_, parsed) = X509Certificate::from_der(leaf).map_err(|_| TlsSetupError::Pem)?;
    let spki_sha256 = sha2::Sha256::digest(parsed.tbs_certificate.subject_pki.raw);
    Ok(format!("sha256//{}", base64::engine::general_purpose::STANDARD.encode(spki_sha256)))
}

fn certified(provider: &CryptoProvider, issued: &IssuedKeyPair, ca_der: &CertificateDer<'static>) -> Result<(Arc<CertifiedKey>, CertInfo), TlsSetupError> {
    let leaf = ca::first_cert_der(&issued.cert_pem).ok_or(TlsSetupError::Pem)?;
    let key = ca::private_key_der(&issued.key_pem).ok_or(TlsSetupError::Pem)?;
    let info = info_of(&leaf).ok_or(TlsSetupError::Pem)?;
    // The CA goes into the chain so an agent can pin it by fingerprint
    // before it trusts anything else.
    let certified = CertifiedKey::from_der(vec![leaf, ca_der.clone()], key, provider)?;
    Ok((Arc::new(certified), info))
}

/// What is known of a leaf (DER), if it parses.
pub fn info_of(leaf: &[u8]) -> Option<CertInfo> {
    let (_, cert) = X509Certificate::from_der(leaf).ok()?;
    let validity = cert.validity();
    Some(CertInfo {
        serial: hex::encode(cert.raw_serial()),
        sha256: ca::sha256_hex(leaf),
        not_before_ms: validity.not_before.timestamp() * 1000,
        not_after_ms: validity.not_after.timestamp() * 1000,
    })
}

/// The kept certificate with the listener key, if it is still the one to
/// serve.
fn reusable(ca: &ClusterCa, provider: &Arc<CryptoProvider>, data_dir: &Path, hosts: &[String], now: time::OffsetDateTime) -> Option<IssuedKeyPair> {
    let cert_pem = std::fs::read_to_string(data_dir.join(ca::LISTENER_CERT_FILE)).ok()?;
    let key_pem = std::fs::read_to_string(data_dir.join(ca::LISTENER_KEY_FILE)).ok()?;
    let leaf = ca::first_cert_der(&cert_pem)?;
    let (_, parsed) = X509Certificate::from_der(&leaf).ok()?;
    let key = rcgen::KeyPair::from_pem(&key_pem).ok()?;
    if parsed.public_key().subject_public_key.data.as_ref() != key.public_key_raw() {
        return None;
    }
    let info = info_of(&leaf)?;
    let now_ms = (now.unix_timestamp_nanos() / 1_000_000) as i64;
    if crate::acme::renewal_due(now_ms, info.not_before_ms, info.not_after_ms) {
        return None;
    }
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.cert_der().clone()).ok()?;
    let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone()).build().ok()?;
    let at = UnixTime::since_unix_epoch(Duration::from_secs(u64::try_from(now.unix_timestamp()).ok()?));
    for host in hosts {
        let name = ServerName::try_from(host.as_str()).ok()?.to_owned();
        verifier.verify_server_cert(&leaf, &[], &name, &[], at).ok()?;
    }
    Some(IssuedKeyPair { cert_pem, key_pem })
}

/// How long to wait before looking again at a certificate due for renewal
/// at two thirds of its life, or None when it is due now. The wait is at
/// least 100 ms and at most a minute, so a moved clock is noticed.
pub fn renewal_wait(info: &CertInfo, now_ms: i64) -> Option<Duration> {
    let life = (info.not_after_ms - info.not_before_ms).max(0);
    let due_ms = info.not_before_ms + life / 3 * 2;
    (now_ms < due_ms).then(|| Duration::from_millis((due_ms - now_ms) as u64).clamp(Duration::from_millis(100), LOOK_AT_LEAST_EVERY))
}

/// Renews the listener's certificate at two thirds of its life, for the
/// life of the control plane. A failed renewal is tried again after 5 s,
/// doubling up to 10 minutes; the certificate in force keeps serving.
pub async fn renew(state: Arc<AppState>, cert: Arc<ListenerCert>) {
    let mut retry = FIRST_RETRY;
    loop {
        let info = cert.info();
        if let Some(wait) = renewal_wait(&info, state.clock.now_ms()) {
            tokio::time::sleep(wait).await;
            continue;
        }
        match cert.renew_now(&state.ca, state.clock.now()) {
            Ok(new) => {
                retry = FIRST_RETRY;
                tracing::info!(
                    old_serial = %info.serial,
                    serial = %new.serial,
                    sha256 = %new.sha256,
                    not_after = %crate::clock::rfc3339_ms(new.not_after_ms),
                    "renewed the agent listener's certificate"
                );
            }
            Err(err) => {
                tracing::error!(error = %err, retry_in_s = retry.as_secs(), "cannot renew the agent listener's certificate");
                tokio::time::sleep(retry).await;
                retry = (retry * 2).min(LONGEST_RETRY);
            }
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TlsSetupError {
    #[error("tls configuration: {0}")]
    Rustls(#[from] rustls::Error),
    #[error("client verifier: {0}")]
    Verifier(#[from] rustls::server::VerifierBuilderError),
    #[error("certificate: {0}")]
    Ca(#[from] ca::CaError),
    #[error("issued certificate or key could not be parsed")]
    Pem,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn provider() -> Arc<CryptoProvider> {
        Arc::new(rustls::crypto::ring::default_provider())
    }

    #[test]
    fn due_at_two_thirds_and_looked_at_least_every_minute() {
        let info = |not_before_ms, not_after_ms| CertInfo { serial: String::new(), sha256: String::new(), not_before_ms, not_after_ms };
        // 12 s of life from 0: due at 8 s.
        let short = info(0, 12_000);
        assert_eq!(renewal_wait(&short, 0), Some(Duration::from_secs(8)));
        assert_eq!(renewal_wait(&short, 7_950), Some(Duration::from_millis(100)), "at least 100 ms");
        assert_eq!(renewal_wait(&short, 8_000), None);
        assert_eq!(renewal_wait(&short, 20_000), None, "expired: due at once");
        // A year: the next look is within a minute, so a moved clock is seen.
        let year = info(0, 365 * 24 * 3600 * 1000);
        assert_eq!(renewal_wait(&year, 0), Some(LOOK_AT_LEAST_EVERY));
    }

    #[test]
    fn kept_until_due_then_renewed_with_the_same_key() {
        let dir = tempfile::tempdir().unwrap();
        let start = time::OffsetDateTime::now_utc();
        let ca = ClusterCa::load_or_create(dir.path(), start).unwrap();
        let hosts = vec!["127.0.0.1".to_string(), "localhost".to_string()];
        let life = time::Duration::seconds(300);
        let first = ListenerCert::load_or_issue(&ca, provider(), dir.path(), &hosts, start, life).unwrap();
        let pin = pin_of(&first.leaf()).unwrap();
        // A restart before two thirds of the life serves the kept one.
        let again = ListenerCert::load_or_issue(&ca, provider(), dir.path(), &hosts, start + time::Duration::seconds(60), life).unwrap();
        assert_eq!(again.info(), first.info());
        // Another host: a new certificate.
        let more = vec!["127.0.0.1".to_string(), "cp.example.com".to_string()];
        let other = ListenerCert::load_or_issue(&ca, provider(), dir.path(), &more, start, life).unwrap();
        assert_ne!(other.info().serial, first.info().serial);
        // Past two thirds: a new one, same key, kept for the next start.
        let later = start + time::Duration::seconds(220);
        let renewed = ListenerCert::load_or_issue(&ca, provider(), dir.path(), &more, later, life).unwrap();
        assert_ne!(renewed.info().serial, other.info().serial);
        assert_eq!(pin_of(&renewed.leaf()).unwrap(), pin);
        let mut watch = renewed.renewals();
        let swapped = renewed.renew_now(&ca, later).unwrap();
        assert!(watch.has_changed().unwrap());
        watch.mark_unchanged();
        assert_eq!(renewed.info(), swapped);
        assert_eq!(pin_of(&renewed.leaf()).unwrap(), pin, "renewal keeps the key");
        let kept = ListenerCert::load_or_issue(&ca, provider(), dir.path(), &more, later, life).unwrap();
        assert_eq!(kept.info(), swapped, "the renewed certificate is what a restart serves");
        assert!(swapped.not_after_ms - swapped.not_before_ms <= 330_000);
    }
}
