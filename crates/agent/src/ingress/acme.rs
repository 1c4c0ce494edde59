//! The ingress's part in ACME: the control plane orders one certificate
//! per public host for the whole cluster, and every ingress node
//! - answers the CA's HTTP-01 challenges: Caddy sends
//!   `/.well-known/acme-challenge/<token>` to a loopback responder here,
//!   which asks the control plane for the token's key authorization, so the
//!   challenge is answered whichever ingress node the CA reaches;
//! - serves the certificates the control plane hands out (fetched when the
//!   `certificates` event arrives and on every poll, sent only when their
//!   version changed).

use std::borrow::Cow;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use cloudweb_protocol::HostCertificate;

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
    fn unusable_pem_is_recognised() {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["a.example.com".to_string()]).unwrap().self_signed(&key).unwrap();
        let good = HostCertificate { host: "a.example.com".into(), chain_pem: cert.pem(), key_pem: key.serialize_pem(), not_after_ms: 0 };
        assert!(usable_pem(&good));
        assert!(!usable_pem(&HostCertificate { key_pem: "x".into(), ..good.clone() }));
        assert!(!usable_pem(&HostCertificate { chain_pem: "x".into(), ..good }));
    }
}
