//! The ingress's part in ACME: the control plane orders one certificate
//! per public host for the whole cluster, and every ingress node
//! - answers the CA's HTTP-01 challenges: Caddy sends
//!   `/.well-known/acme-challenge/<token>` to a loopback responder here,
//!   which asks the control plane for the token's key authorization, so the
//!   challenge is answered whichever ingress node the CA reaches;
//! - answers its TLS-ALPN-01 challenges: Caddy (certmagic) answers an
//!   `acme-tls/1` handshake for a challenge it did not start itself only
//!   from the challenge file certmagic's distributed solver reads from its
//!   storage, so [`TlsAlpn`] writes the control plane's pending challenges
//!   there, in that format, and reports the version it put in place;
//! - serves the certificates the control plane hands out (fetched when the
//!   `certificates` event arrives and on every poll, sent only when their
//!   version changed).

use std::borrow::Cow;
use std::io::Write;
use std::net::SocketAddr;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use cloudweb_protocol::{HostCertificate, TlsAlpnChallenge};

use crate::client::ControlPlane;

/// Where Caddy sends HTTP-01 challenges.
pub const CHALLENGE_PREFIX: &str = "/.well-known/acme-challenge/";

/// How long a challenge answer may wait for the control plane.
const ASK_TIMEOUT: Duration = Duration::from_secs(10);

/// Serves the challenge responder on `preferred` when it is free; returns
/// its address.
pub async fn serve_challenges(client: Arc<ControlPlane>, preferred: u16) -> std::io::Result<SocketAddr> {
    super::local::serve(preferred, move |target| {
        let client = client.clone();
        async move { answer(&client, &target).await }
    })
    .await
}

async fn answer(client: &ControlPlane, target: &str) -> (u16, Cow<'static, str>) {
    let Some(token) = token_of(target) else {
        return (404, Cow::Borrowed("not an ACME challenge\n"));
    };
    match tokio::time::timeout(ASK_TIMEOUT, client.acme_challenge(token)).await {
        Ok(Ok(Some(key_authorization))) => {
            tracing::info!(token, "answered an ACME HTTP-01 challenge");
            (200, Cow::Owned(key_authorization))
        }
        Ok(Ok(None)) => (404, Cow::Borrowed("no such challenge\n")),
        Ok(Err(err)) => {
            tracing::warn!(error = %err, "cannot ask the control plane for an ACME challenge");
            (502, Cow::Borrowed("the control plane cannot be asked\n"))
        }
        Err(_) => (502, Cow::Borrowed("the control plane did not answer in time\n")),
    }
}

/// The token of `/.well-known/acme-challenge/<token>`, if it is one.
fn token_of(target: &str) -> Option<&str> {
    let token = target.strip_prefix(CHALLENGE_PREFIX)?;
    cloudweb_protocol::certificates::challenge_token("token", token).ok()?;
    Some(token)
}

/// certmagic's storage key of the default ACME issuer of Caddy's public
/// automation policy (`DefaultIssuers` in caddytls: Let's Encrypt's
/// production directory, `ACMEIssuer.issuerKey`: host, '-', path). Public
/// hosts have no policy of their own in the configuration, so at an
/// `acme-tls/1` handshake certmagic's `getACMEChallengeInfo` looks for
/// `acme/<this>/challenge_tokens/<host>.json` (`distributedSolver`).
pub const ISSUER_KEY: &str = "acme-v02.api.letsencrypt.org-directory";

/// The directory of challenge files in Caddy's storage.
pub fn challenge_tokens_dir(storage: &Path) -> PathBuf {
    storage.join("acme").join(ISSUER_KEY).join("challenge_tokens")
}

/// certmagic's `StorageKeys.Safe` for a host name: lowercase, and only
/// word characters, '@', '.' and '-' (route hosts hold nothing else).
fn safe_key(host: &str) -> String {
    let lower = host.trim().to_lowercase().replace(' ', "_").replace('+', "_plus_").replace('*', "wildcard_").replace(':', "-").replace("..", "");
    lower.chars().filter(|c| c.is_alphanumeric() || matches!(c, '_' | '@' | '.' | '-')).collect()
}

/// The challenge file certmagic reads: acmez's `acme.Challenge` as JSON.
/// `acmez.TLSALPN01ChallengeCert` builds the certificate from the
/// identifier and the key authorization.
fn challenge_file(challenge: &TlsAlpnChallenge) -> Vec<u8> {
    let token = challenge.key_authorization.split('.').next().unwrap_or_default();
    serde_json::to_vec(&serde_json::json!({
        "type": "tls-alpn-01",
        "status": "pending",
        "token": token,
        "keyAuthorization": challenge.key_authorization,
        "identifier": {"type": "dns", "value": challenge.host},
    }))
    .expect("json")
}

/// The TLS-ALPN-01 challenges put in Caddy's storage.
pub struct TlsAlpn {
    dir: PathBuf,
    /// The version in place, as reported to the control plane.
    applied: Option<String>,
}

impl TlsAlpn {
    pub fn new(storage: &Path) -> TlsAlpn {
        TlsAlpn { dir: challenge_tokens_dir(storage), applied: None }
    }

    /// Fetches the pending challenges and, when they changed, writes them
    /// and tells the control plane at once (an order waits on it). Bounded:
    /// three rounds, then the next poll.
    pub async fn refresh(&mut self, client: &ControlPlane) -> Result<(), crate::client::ClientError> {
        for _ in 0..3 {
            let set = client.tls_alpn(self.applied.as_deref()).await?;
            if self.applied.as_deref() == Some(set.version.as_str()) {
                return Ok(());
            }
            if cloudweb_protocol::validate::token("version", &set.version, 64).is_err() {
                tracing::warn!("the control plane sent an unusable TLS-ALPN-01 version; ignored");
                return Ok(());
            }
            let challenges: Vec<&TlsAlpnChallenge> = set
                .challenges
                .iter()
                .filter(|c| {
                    let usable = cloudweb_protocol::validate::route_host("host", &c.host).is_ok()
                        && !cloudweb_protocol::certificates::internal_host(&c.host)
                        && cloudweb_protocol::certificates::key_authorization("key_authorization", &c.key_authorization).is_ok();
                    if !usable {
                        tracing::warn!(host = %c.host, "dropping a TLS-ALPN-01 challenge the ingress cannot answer");
                    }
                    usable
                })
                .collect();
            let dir = self.dir.clone();
            let files: Vec<(String, Vec<u8>)> = challenges.iter().map(|c| (format!("{}.json", safe_key(&c.host)), challenge_file(c))).collect();
            let written = tokio::task::spawn_blocking(move || write_challenges(&dir, &files)).await.expect("challenge writer");
            if let Err(err) = written {
                // Not reported as applied: the order waits, then goes on.
                tracing::warn!(dir = %self.dir.display(), error = %err, "cannot put the TLS-ALPN-01 challenges in Caddy's storage");
                return Ok(());
            }
            if !challenges.is_empty() {
                tracing::info!(hosts = ?challenges.iter().map(|c| c.host.as_str()).collect::<Vec<_>>(), "TLS-ALPN-01 challenges in place");
            }
            self.applied = Some(set.version);
        }
        Ok(())
    }
}

/// Makes `dir` hold exactly `files` (name, content) among its `.json`
/// files: each written to a temporary name and renamed, so Caddy never
/// reads half a file.
fn write_challenges(dir: &Path, files: &[(String, Vec<u8>)]) -> std::io::Result<()> {
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)?;
    for (name, content) in files {
        let temporary = dir.join(format!(".{name}.tmp"));
        let mut file = std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(&temporary)?;
        file.write_all(content)?;
        file.sync_all()?;
        std::fs::rename(&temporary, dir.join(name))?;
    }
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.ends_with(".json") && !files.iter().any(|(n, _)| *n == name) {
            std::fs::remove_file(entry.path())?;
        }
    }
    Ok(())
}

/// The certificates an ingress serves, as last fetched.
#[derive(Default, Clone, PartialEq, Eq)]
pub struct Certificates {
    pub version: Option<String>,
    pub list: Vec<HostCertificate>,
}

impl Certificates {
    /// Fetches the set if it changed; returns whether it did. Certificates
    /// for hosts that are not valid route hosts, or whose PEM does not
    /// parse, are dropped (and logged) rather than failing Caddy's load.
    pub async fn refresh(&mut self, client: &ControlPlane) -> Result<bool, crate::client::ClientError> {
        let set = client.certificates(self.version.as_deref()).await?;
        let Some(mut list) = set.certificates else {
            return Ok(false);
        };
        list.retain(|cert| {
            let usable = cloudweb_protocol::validate::route_host("host", &cert.host).is_ok() && usable_pem(cert);
            if !usable {
                tracing::warn!(host = %cert.host, "dropping a certificate the ingress cannot load");
            }
            usable
        });
        let changed = list != self.list;
        self.version = Some(set.version);
        self.list = list;
        if changed {
            tracing::info!(certificates = self.list.len(), "ACME certificates received");
        }
        Ok(changed)
    }
}

fn usable_pem(cert: &HostCertificate) -> bool {
    use rustls_pki_types::pem::PemObject;
    let chain_ok = rustls_pki_types::CertificateDer::pem_slice_iter(cert.chain_pem.as_bytes()).next().is_some_and(|c| c.is_ok());
    let key_ok = rustls_pki_types::PrivateKeyDer::from_pem_slice(cert.key_pem.as_bytes()).is_ok();
    chain_ok && key_ok
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_well_formed_tokens_are_asked_for() {
        assert_eq!(token_of("/.well-known/acme-challenge/abc_DEF-123"), Some("abc_DEF-123"));
        for bad in ["/", "/.well-known/acme-challenge/", "/.well-known/acme-challenge/a/../b", "/.well-known/acme-challenge/a?x=1", "/other/abc"] {
            assert_eq!(token_of(bad), None, "{bad}");
        }
    }

    #[test]
    fn challenge_files_are_what_certmagic_reads() {
        assert_eq!(safe_key("Shop.Example.com"), "shop.example.com");
        assert_eq!(safe_key("a..b/c"), "abc");
        let challenge = TlsAlpnChallenge { host: "shop.example.com".into(), key_authorization: "tok_1.thumb".into() };
        let file: serde_json::Value = serde_json::from_slice(&challenge_file(&challenge)).unwrap();
        assert_eq!(file["type"], "tls-alpn-01");
        assert_eq!(file["token"], "tok_1");
        assert_eq!(file["keyAuthorization"], "tok_1.thumb");
        assert_eq!(file["identifier"], serde_json::json!({"type": "dns", "value": "shop.example.com"}));
        assert_eq!(
            challenge_tokens_dir(Path::new("/d/data/caddy")),
            Path::new("/d/data/caddy/acme/acme-v02.api.letsencrypt.org-directory/challenge_tokens")
        );
    }

    #[test]
    fn the_directory_holds_exactly_the_pending_challenges() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("challenge_tokens");
        write_challenges(&dir, &[("a.example.com.json".into(), b"A".to_vec()), ("b.example.com.json".into(), b"B".to_vec())]).unwrap();
        write_challenges(&dir, &[("b.example.com.json".into(), b"B2".to_vec())]).unwrap();
        let mut names: Vec<String> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        names.sort();
        assert_eq!(names, ["b.example.com.json"]);
        assert_eq!(std::fs::read(dir.join("b.example.com.json")).unwrap(), b"B2");
        write_challenges(&dir, &[]).unwrap();
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
    }

    #[test]
    fn unusable_pem_is_recognised() {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["a.example.com".to_string()]).unwrap().self_signed(&key).unwrap();
        let good = HostCertificate { host: "a.example.com".into(), chain_pem: cert.pem(), key_pem: key.serialize_pem(), not_after_ms: 0 };
        assert!(usable_pem(&good));
        assert!(!usable_pem(&HostCertificate { key_pem: "x".into(), ..good.clone() }));
        assert!(!usable_pem(&HostCertificate { chain_pem: "x".into(), ..good }));
    }
}
