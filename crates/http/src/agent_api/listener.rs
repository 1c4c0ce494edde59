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
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;
use tower::ServiceExt;
use x509_parser::prelude::{FromDer, X509Certificate};

use super::{ConnectionPeer, PeerCert};
use crate::ca::{self, ClusterCa};
use crate::connections::{AcceptErrors, Activity};
use crate::listener_cert::ListenerCert;

/// How long a client may take to send a request's headers once it started.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);

pub use crate::config::ConnectionLimits;

pub use crate::listener_cert::TlsSetupError;

/// The listener's TLS configuration, the pin of its public key
/// (`sha256//<base64 of the SHA-256 of the SubjectPublicKeyInfo>`, the form
/// curl's `--pinnedpubkey` takes) and its certificate, which
/// [`listener_cert::renew`](crate::listener_cert::renew) renews.
pub fn server_config(
    ca: &ClusterCa,
    data_dir: &std::path::Path,
    hosts: &[String],
    now: time::OffsetDateTime,
    lifetime: time::Duration,
) -> Result<(ServerConfig, String, Arc<ListenerCert>), TlsSetupError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = RootCertStore::empty();
    roots.add(ca.cert_der().clone())?;
    let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .allow_unauthenticated()
        .build()?;
    let cert = Arc::new(ListenerCert::load_or_issue(ca, provider.clone(), data_dir, hosts, now, lifetime)?);
    let pin = crate::listener_cert::pin_of(&cert.leaf())?;
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_client_cert_verifier(verifier)
        .with_cert_resolver(cert.clone());
    config.session_storage = cert.sessions();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok((config, pin, cert))
}

/// Reads the node id (the certificate's common name) and fingerprint of a
/// verified client certificate.
pub fn peer_cert(der: &CertificateDer<'_>) -> Option<PeerCert> {
    let (_, cert) = X509Certificate::from_der(der).ok()?;
    let node_id = cert.subject().iter_common_name().next()?.as_str().ok()?.to_string();
    let public_key = Some(cert.public_key().subject_public_key.data.to_vec());
    Some(PeerCert { node_id, cert_sha256: ca::sha256_hex(der), public_key })
}

/// The unauthenticated connections held: the shared connection table,
/// whose tickets leave it once a handshake proved a certificate.
pub use crate::connections::{ConnectionTable as Unauthenticated, Ticket};

/// Accepts connections until the task is aborted. A connection made before
/// the certificate's latest renewal (`renewals` moved) is closed once its
/// request in flight is answered.
pub async fn serve(listener: TcpListener, tls: Arc<ServerConfig>, router: Router, limits: ConnectionLimits, renewals: tokio::sync::watch::Receiver<u64>) {
    let acceptor = TlsAcceptor::from(tls);
    let unauthenticated = Unauthenticated::new(limits.max_unauthenticated, limits.max_unauthenticated_per_address);
    let mut errors = AcceptErrors::default();
    loop {
        let (tcp, remote) = crate::connections::accept(&listener, "agent", &mut errors).await;
        let accepted = Instant::now();
        let _ = tcp.set_nodelay(true);
        let ticket = unauthenticated.admit(remote.ip(), None);
        let acceptor = acceptor.clone();
        let router = router.clone();
        let limits = limits.clone();
        let mut renewals = renewals.clone();
        renewals.mark_unchanged();
        tokio::spawn(async move {
            tokio::select! {
                () = connection(tcp, accepted, &ticket, acceptor, router, &limits, renewals) => {}
                () = ticket.shed() => tracing::debug!(%remote, "shed an unauthenticated agent-listener connection"),
            }
        });
    }
}

/// One connection from accept to close: the handshake, then HTTP until the
/// client closes or the connection has been idle too long.
async fn connection(
    tcp: tokio::net::TcpStream,
    accepted: Instant,
    ticket: &Ticket,
    acceptor: TlsAcceptor,
    router: Router,
    limits: &ConnectionLimits,
    mut renewals: tokio::sync::watch::Receiver<u64>,
) {
    let handshake_limit = limits.handshake_timeout.min(limits.unauthenticated_idle);
    let stream = match tokio::time::timeout_at(accepted + handshake_limit, acceptor.accept(tcp)).await {
        Ok(Ok(stream)) => stream,
        Ok(Err(err)) => {
            tracing::debug!(error = %err, "agent tls handshake failed");
            return;
        }
        Err(_) => return,
    };
    let peer = ConnectionPeer(stream.get_ref().1.peer_certificates().and_then(|c| c.first()).and_then(peer_cert));
    let idle_limit = if peer.0.is_some() {
        ticket.release();
        limits.authenticated_idle
    } else {
        limits.unauthenticated_idle
    };
    let activity = Activity::new(accepted, false);
    let service = {
        let activity = activity.clone();
        hyper::service::service_fn(move |mut request: hyper::Request<Incoming>| {
            let in_flight = activity.begin();
            request.extensions_mut().insert(peer.clone());
            let response = router.clone().oneshot(request);
            async move {
                let response = response.await?;
                // The request stays in flight until its body is sent.
                Ok::<_, std::convert::Infallible>(in_flight.hold(response))
            }
        })
    };
    let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    // A client that never finishes its request headers does not get
    // to hold a connection (join is open to anyone with TLS).
    // The read buffer stays at hyper's smallest, 8 KiB, instead of
    // growing with what a read returned: a fleet holds two connections
    // per node open all the time (issue 21 item 1), and agent requests'
    // heads are well under 8 KiB (bodies are streamed, not buffered).
    builder.http1().timer(TokioTimer::new()).header_read_timeout(HEADER_READ_TIMEOUT).max_buf_size(8 * 1024);
    // With upgrades: a session's dial-back becomes a stream of frames.
    let serving = builder.serve_connection_with_upgrades(TokioIo::new(stream), service);
    tokio::pin!(serving);
    let idle = activity.expired(idle_limit, None);
    tokio::pin!(idle);
    let mut closing = false;
    loop {
        tokio::select! {
            result = serving.as_mut() => {
                if let Err(err) = result {
                    tracing::debug!(error = %err, "agent connection ended with an error");
                }
                return;
            }
            () = idle.as_mut() => return,
            // Made under a certificate since renewed: no new request on it,
            // so the client's next one handshakes with the new certificate.
            changed = renewals.changed(), if !closing => {
                closing = true;
                if changed.is_ok() {
                    serving.as_mut().graceful_shutdown();
                }
            }
        }
    }
}
