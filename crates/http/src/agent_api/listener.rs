//! TLS for the agent listener: a TLS 1.3-only server whose certificate is
//! issued by the cluster CA, which asks for (but does not demand) a client
//! certificate. Chain validation happens in the handshake, so a certificate
//! from another CA never reaches a handler; which routes need a certificate
//! is decided by the router.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use rustls_pki_types::CertificateDer;
use tokio::net::TcpListener;
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;
use tower::ServiceExt;
use x509_parser::prelude::{FromDer, X509Certificate};

use super::{ConnectionPeer, PeerCert};
use crate::ca::{self, ClusterCa};
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

/// The unauthenticated connections held, oldest first, with the signal
/// that sheds each. New connections are always admitted (a node's next
/// connection looks like any other until its handshake ends); the caps are
/// kept by shedding the oldest unauthenticated ones, which are the ones
/// most likely to be idle or slow on purpose.
#[derive(Debug)]
pub struct Unauthenticated {
    max_total: usize,
    max_per_address: usize,
    inner: Mutex<Held>,
}

#[derive(Debug, Default)]
struct Held {
    next_id: u64,
    by_age: BTreeMap<u64, (IpAddr, Arc<Notify>)>,
    per_address: HashMap<IpAddr, usize>,
    shed: u64,
}

/// One admitted connection's place in [`Unauthenticated`]; leaves it on
/// drop or on [`Ticket::authenticated`].
pub struct Ticket {
    id: u64,
    shed: Arc<Notify>,
    held: Arc<Unauthenticated>,
}

impl Unauthenticated {
    pub fn new(max_total: usize, max_per_address: usize) -> Arc<Unauthenticated> {
        Arc::new(Unauthenticated { max_total, max_per_address, inner: Mutex::new(Held::default()) })
    }

    /// Admits a connection from `address`, shedding the oldest ones over
    /// either cap.
    pub fn admit(self: &Arc<Self>, address: IpAddr) -> Ticket {
        let mut held = self.inner.lock().expect("connection table lock");
        let id = held.next_id;
        held.next_id += 1;
        let shed = Arc::new(Notify::new());
        held.by_age.insert(id, (address, shed.clone()));
        *held.per_address.entry(address).or_default() += 1;
        while held.per_address.get(&address).copied().unwrap_or(0) > self.max_per_address {
            let oldest = held.by_age.iter().find(|(_, (a, _))| *a == address).map(|(id, _)| *id);
            match oldest {
                Some(oldest) => held.shed(oldest),
                None => break,
            }
        }
        while held.by_age.len() > self.max_total {
            let oldest = *held.by_age.keys().next().expect("not empty");
            held.shed(oldest);
        }
        Ticket { id, shed, held: self.clone() }
    }

    /// Unauthenticated connections held now.
    pub fn len(&self) -> usize {
        self.inner.lock().expect("connection table lock").by_age.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Connections shed so far.
    pub fn shed_total(&self) -> u64 {
        self.inner.lock().expect("connection table lock").shed
    }

    fn release(&self, id: u64) {
        self.inner.lock().expect("connection table lock").remove(id);
    }
}

impl Held {
    fn remove(&mut self, id: u64) -> Option<Arc<Notify>> {
        let (address, shed) = self.by_age.remove(&id)?;
        if let Some(count) = self.per_address.get_mut(&address) {
            *count -= 1;
            if *count == 0 {
                self.per_address.remove(&address);
            }
        }
        Some(shed)
    }

    fn shed(&mut self, id: u64) {
        if let Some(signal) = self.remove(id) {
            self.shed += 1;
            // Stored if the connection is not waiting yet.
            signal.notify_one();
        }
    }
}

impl Ticket {
    /// The handshake proved a client certificate: no longer shed.
    pub fn authenticated(&self) {
        self.held.release(self.id);
    }

    /// Resolves when this connection has been shed.
    pub async fn shed(&self) {
        self.shed.notified().await
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.held.release(self.id);
    }
}

/// Requests in flight on one connection, and when it last had one.
struct Activity {
    in_flight: AtomicUsize,
    last: Mutex<Instant>,
}

/// Marks a request in flight until its response body is done or dropped.
struct InFlight(Arc<Activity>);

impl Activity {
    fn begin(self: &Arc<Self>) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        *self.last.lock().expect("activity lock") = Instant::now();
        InFlight(self.clone())
    }

    /// Resolves once the connection had nothing in flight for `limit`.
    async fn idle_for(&self, limit: Duration) {
        loop {
            let last = *self.last.lock().expect("activity lock");
            if self.in_flight.load(Ordering::SeqCst) > 0 {
                // A long request (an event stream, a download) is not idle.
                tokio::time::sleep(limit.min(Duration::from_secs(1))).await;
            } else if last.elapsed() >= limit {
                return;
            } else {
                tokio::time::sleep_until(last + limit).await;
            }
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        *self.0.last.lock().expect("activity lock") = Instant::now();
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Accepts connections until the task is aborted. A connection made before
/// the certificate's latest renewal (`renewals` moved) is closed once its
/// request in flight is answered.
pub async fn serve(listener: TcpListener, tls: Arc<ServerConfig>, router: Router, limits: ConnectionLimits, renewals: tokio::sync::watch::Receiver<u64>) {
    let acceptor = TlsAcceptor::from(tls);
    let unauthenticated = Unauthenticated::new(limits.max_unauthenticated, limits.max_unauthenticated_per_address);
    loop {
        let (tcp, remote) = match listener.accept().await {
            Ok(conn) => conn,
            Err(err) => {
                // Usually EMFILE under load; back off instead of spinning.
                tracing::warn!(error = %err, "agent listener accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let accepted = Instant::now();
        let _ = tcp.set_nodelay(true);
        let ticket = unauthenticated.admit(remote.ip());
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
        ticket.authenticated();
        limits.authenticated_idle
    } else {
        limits.unauthenticated_idle
    };
    let activity = Arc::new(Activity { in_flight: AtomicUsize::new(0), last: Mutex::new(accepted) });
    let service = {
        let activity = activity.clone();
        hyper::service::service_fn(move |mut request: hyper::Request<Incoming>| {
            let in_flight = activity.begin();
            request.extensions_mut().insert(peer.clone());
            let response = router.clone().oneshot(request);
            async move {
                let response = response.await?;
                // The request stays in flight until its body is sent.
                Ok::<_, std::convert::Infallible>(response.map(|body| {
                    axum::body::Body::new(body.map_frame(move |frame| {
                        let _ = &in_flight;
                        frame
                    }))
                }))
            }
        })
    };
    let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    // A client that never finishes its request headers does not get
    // to hold a connection (join is open to anyone with TLS).
    builder.http1().timer(TokioTimer::new()).header_read_timeout(HEADER_READ_TIMEOUT);
    let serving = builder.serve_connection(TokioIo::new(stream), service);
    tokio::pin!(serving);
    let idle = activity.idle_for(idle_limit);
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

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([192, 0, 2, last])
    }

    #[tokio::test]
    async fn the_oldest_unauthenticated_connections_are_shed_first() {
        let held = Unauthenticated::new(4, 2);
        let a1 = held.admit(ip(1));
        let a2 = held.admit(ip(1));
        // A third from the same address sheds that address's oldest.
        let a3 = held.admit(ip(1));
        tokio::time::timeout(Duration::from_millis(100), a1.shed()).await.expect("a1 shed");
        assert_eq!(held.len(), 2);
        let b1 = held.admit(ip(2));
        let b2 = held.admit(ip(2));
        assert_eq!(held.len(), 4);
        // Over the total: the oldest of all (a2) goes, not the newcomer.
        let _c1 = held.admit(ip(3));
        tokio::time::timeout(Duration::from_millis(100), a2.shed()).await.expect("a2 shed");
        assert_eq!(held.len(), 4);
        // An authenticated connection leaves the table and is never shed.
        b1.authenticated();
        assert_eq!(held.len(), 3);
        let _c2 = held.admit(ip(3));
        let _c3 = held.admit(ip(4));
        assert!(tokio::time::timeout(Duration::from_millis(50), b1.shed()).await.is_err(), "b1 is authenticated");
        tokio::time::timeout(Duration::from_millis(100), a3.shed()).await.expect("a3 shed");
        drop(b2);
        assert_eq!(held.len(), 3);
        assert_eq!(held.shed_total(), 3);
    }
}
