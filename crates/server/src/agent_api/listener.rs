//! TLS for the agent listener: a TLS 1.3-only server whose certificate is
//! issued by the cluster CA, which asks for (but does not demand) a client
//! certificate. Chain validation happens in the handshake, so a certificate
//! from another CA never reaches a handler; which routes need a certificate
//! is decided by the router.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use rustls_pki_types::CertificateDer;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tower::ServiceExt;
use base64::Engine;
use sha2::Digest;
use x509_parser::prelude::{FromDer, X509Certificate};

use super::{ConnectionPeer, PeerCert};
use crate::ca::{self, ClusterCa};

/// How long a client may take to finish the TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a client may take to send a request's headers.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);

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

/// The listener's TLS configuration and the pin of its public key:
/// `sha256//<base64 of the SHA-256 of the SubjectPublicKeyInfo>`, the form
/// curl's `--pinnedpubkey` takes.
pub fn server_config(
    ca: &ClusterCa,
    data_dir: &std::path::Path,
    hosts: &[String],
    now: time::OffsetDateTime,
) -> Result<(ServerConfig, String), TlsSetupError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = RootCertStore::empty();
    roots.add(ca.cert_der().clone())?;
    let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .allow_unauthenticated()
        .build()?;
    let issued = ca.issue_server_cert(data_dir, hosts, now)?;
    let leaf = ca::first_cert_der(&issued.cert_pem).ok_or(TlsSetupError::Pem)?;
    let (_, parsed) = X509Certificate::from_der(&leaf).map_err(|_| TlsSetupError::Pem)?;
    let spki_sha256 = sha2::Sha256::digest(parsed.tbs_certificate.subject_pki.raw);
    let pin = format!("sha256//{}", base64::engine::general_purpose::STANDARD.encode(spki_sha256));
    let key = ca::private_key_der(&issued.key_pem).ok_or(TlsSetupError::Pem)?;
    // The CA goes into the chain so an agent can pin it by fingerprint
    // before it trusts anything else.
    let chain = vec![leaf, ca.cert_der().clone()];
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok((config, pin))
}

/// Reads the node id (the certificate's common name) and fingerprint of a
/// verified client certificate.
pub fn peer_cert(der: &CertificateDer<'_>) -> Option<PeerCert> {
    let (_, cert) = X509Certificate::from_der(der).ok()?;
    let node_id = cert.subject().iter_common_name().next()?.as_str().ok()?.to_string();
    Some(PeerCert { node_id, cert_sha256: ca::sha256_hex(der) })
}

/// Accepts connections until the task is aborted.
pub async fn serve(listener: TcpListener, tls: Arc<ServerConfig>, router: Router) {
    let acceptor = TlsAcceptor::from(tls);
    loop {
        let (tcp, _remote) = match listener.accept().await {
            Ok(conn) => conn,
            Err(err) => {
                // Usually EMFILE under load; back off instead of spinning.
                tracing::warn!(error = %err, "agent listener accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = tcp.set_nodelay(true);
        let acceptor = acceptor.clone();
        let router = router.clone();
        tokio::spawn(async move {
            let stream = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                Ok(Ok(stream)) => stream,
                Ok(Err(err)) => {
                    tracing::debug!(error = %err, "agent tls handshake failed");
                    return;
                }
                Err(_) => return,
            };
            let peer = ConnectionPeer(stream.get_ref().1.peer_certificates().and_then(|c| c.first()).and_then(peer_cert));
            let service = hyper::service::service_fn(move |mut request: hyper::Request<Incoming>| {
                request.extensions_mut().insert(peer.clone());
                router.clone().oneshot(request)
            });
            let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            // A client that never finishes its request headers does not get
            // to hold a connection (join is open to anyone with TLS).
            builder.http1().timer(TokioTimer::new()).header_read_timeout(HEADER_READ_TIMEOUT);
            if let Err(err) = builder.serve_connection(TokioIo::new(stream), service).await {
                tracing::debug!(error = %err, "agent connection ended with an error");
            }
        });
    }
}
