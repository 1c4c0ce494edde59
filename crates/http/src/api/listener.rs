//! The user API's accept loop (plain HTTP/1.1: the API, the dashboard,
//! the OAuth callback and webhooks, on the port that may face the
//! internet). Every connection must send a request's headers within the
//! header timeout (from the accept, or from the request's first byte on a
//! kept-alive connection), is closed once idle for the keep-alive timeout,
//! and is counted in a table with caps in total and per source address:
//! past a cap a connection is shed (see [`ConnectionTable`] for which),
//! and no more are accepted while the sockets still open (shed ones whose
//! task has not closed them yet) are over the cap by a sixteenth. The
//! total is also kept
//! under half the process's descriptor limit, so that the agent listener
//! can always accept.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::ConnectInfo;
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::time::Instant;
use tower::ServiceExt;

use crate::connections::{self, AcceptErrors, Activity, ConnectionTable, Watched};

pub use crate::config::ApiConnectionLimits;

/// Serves `router` on `listener` until the task is aborted. Each request
/// carries the peer's [`ConnectInfo<SocketAddr>`], as
/// `into_make_service_with_connect_info` would give it.
pub async fn serve(listener: TcpListener, router: Router, limits: ApiConnectionLimits) {
    let table = ConnectionTable::new(limits.max_total, limits.max_per_address);
    let mut errors = AcceptErrors::default();
    // Sockets open, shed ones included until their task has closed them.
    let open = Arc::new(AtomicUsize::new(0));
    let most = limits.max_total + limits.max_total / 16;
    loop {
        // A shed connection's socket is closed by its own task; under a
        // flood, accepting faster than those tasks run would hold far more
        // descriptors than the cap. The backlog waits meanwhile.
        while open.load(Ordering::SeqCst) > most {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let (tcp, remote) = connections::accept(&listener, "api", &mut errors).await;
        open.fetch_add(1, Ordering::SeqCst);
        let counted = Open(open.clone());
        let accepted = Instant::now();
        let _ = tcp.set_nodelay(true);
        let activity = Activity::new(accepted, true);
        let ticket = table.admit(remote.ip(), Some(activity.clone()));
        let router = router.clone();
        let limits = limits.clone();
        tokio::spawn(async move {
            let _counted = counted;
            tokio::select! {
                () = connection(tcp, remote, activity, router, &limits) => {}
                () = ticket.shed() => tracing::debug!(%remote, "shed a user API connection"),
            }
        });
    }
}

/// Counts a socket open until dropped (after the connection's socket).
struct Open(Arc<AtomicUsize>);

impl Drop for Open {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// One connection from accept to close.
async fn connection(tcp: tokio::net::TcpStream, remote: SocketAddr, activity: Arc<Activity>, router: Router, limits: &ApiConnectionLimits) {
    let service = {
        let activity = activity.clone();
        hyper::service::service_fn(move |mut request: hyper::Request<Incoming>| {
            let in_flight = activity.begin();
            // The peer address is what login attempts are limited by.
            request.extensions_mut().insert(ConnectInfo(remote));
            let response = router.clone().oneshot(request);
            async move {
                let response = response.await?;
                // The request stays in flight until its body is sent.
                Ok::<_, std::convert::Infallible>(in_flight.hold(response))
            }
        })
    };
    // hyper's own header timeout also runs while a kept-alive connection
    // waits for its next request, which would make it the idle limit too;
    // both are timed here instead (`Activity::expired`).
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder.header_read_timeout(None);
    let serving = builder.serve_connection(TokioIo::new(Watched::new(tcp, activity.clone())), service).with_upgrades();
    tokio::select! {
        result = serving => {
            if let Err(err) = result {
                tracing::debug!(error = %err, "user API connection ended with an error");
            }
        }
        () = activity.expired(limits.idle_timeout, Some(limits.header_read_timeout)) => {}
    }
}
