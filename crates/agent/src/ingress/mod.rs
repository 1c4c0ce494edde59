//! The ingress of a node that joined with `--ingress`: Caddy driven from the
//! control plane's route table, and the traffic counts its access log feeds.
//!
//! The route table is fetched when the event stream says `routes` (and every
//! few seconds as a safety net). Caddy is reloaded only when the table's
//! content changed; the version it serves goes out with each heartbeat, and
//! the control plane stops a replaced instance only once every ingress
//! serves a table without it.

pub mod caddy;
pub mod config;
pub mod traffic;

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cloudweb_protocol::{IngressStatus, RouteTable};
use tokio::sync::Notify;

use self::caddy::Caddy;
use self::config::Ports;
use self::traffic::TrafficCounter;
use crate::client::ControlPlane;

#[derive(Debug, Clone)]
pub struct IngressOptions {
    pub caddy_bin: PathBuf,
    pub ports: Ports,
    /// Where Caddy keeps its state (certificates) and sockets live.
    pub dir: PathBuf,
}

/// What the ingress shares with the heartbeat loop.
#[derive(Default)]
pub struct IngressShared {
    pub status: Mutex<Option<IngressStatus>>,
    /// Hosts of the table in force: the only hosts whose traffic counts.
    pub known_hosts: Mutex<HashSet<String>>,
    pub counter: Arc<TrafficCounter>,
    /// Caddy runs and has loaded a table.
    pub active: std::sync::atomic::AtomicBool,
}

/// How often the table is re-read when no event arrives.
const POLL: Duration = Duration::from_secs(10);

pub async fn run(client: Arc<ControlPlane>, options: IngressOptions, wake: Arc<Notify>, shared: Arc<IngressShared>) {
    let access_socket = options.dir.join("access.sock");
    if let Err(err) = std::fs::create_dir_all(&options.dir) {
        tracing::error!(dir = %options.dir.display(), error = %err, "cannot create the ingress dir; ingress disabled");
        return;
    }
    {
        let counter = shared.counter.clone();
        let socket = access_socket.clone();
        tokio::spawn(async move {
            if let Err(err) = traffic::listen(&socket, counter).await {
                tracing::error!(error = %err, "the access log socket failed; traffic is not counted");
            }
        });
    }
    loop {
        let mut caddy = match Caddy::start(&options.caddy_bin, &options.dir).await {
            Ok(caddy) => caddy,
            Err(err) => {
                tracing::error!(error = %err, "cannot start Caddy; retrying in 10 s");
                set_error(&shared, 0, err.to_string());
                tokio::time::sleep(Duration::from_secs(10)).await;
                continue;
            }
        };
        tracing::info!(admin = %caddy.admin_socket().display(), "caddy started");
        let mut applied: Option<RouteTable> = None;
        while caddy.is_running() {
            match client.routes().await {
                Ok(table) => apply(&caddy, &options, &access_socket, &shared, &mut applied, table).await,
                Err(err) => tracing::warn!(error = %err, "cannot read the route table"),
            }
            tokio::select! {
                _ = wake.notified() => {}
                _ = tokio::time::sleep(POLL) => {}
            }
        }
        shared.active.store(false, std::sync::atomic::Ordering::Relaxed);
        tracing::error!("caddy exited; restarting it");
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

async fn apply(
    caddy: &Caddy,
    options: &IngressOptions,
    access_socket: &std::path::Path,
    shared: &IngressShared,
    applied: &mut Option<RouteTable>,
    table: RouteTable,
) {
    let unchanged = applied.as_ref().is_some_and(|current| current.routes == table.routes);
    if !unchanged {
        for route in &table.routes {
            for upstream in route.upstreams.iter().filter(|u| !config::usable_upstream(u)) {
                tracing::warn!(host = %route.host, %upstream, "dropping an upstream that is not host:port");
            }
        }
        let rendered = config::render(&table, &options.ports, caddy.admin_socket(), access_socket);
        if let Err(err) = caddy.load(&rendered).await {
            // Caddy keeps serving the previous configuration.
            tracing::error!(version = table.version, error = %err, "caddy refused the route table; the previous one keeps serving");
            set_error(shared, applied.as_ref().map(|t| t.version).unwrap_or(0), err.to_string());
            return;
        }
        tracing::info!(version = table.version, routes = table.routes.len(), "route table applied");
    }
    *shared.known_hosts.lock().expect("hosts lock") = table.routes.iter().map(|r| r.host.clone()).collect();
    *shared.status.lock().expect("status lock") = Some(IngressStatus { routes_version: table.version, error: None });
    shared.active.store(true, std::sync::atomic::Ordering::Relaxed);
    *applied = Some(table);
}

fn set_error(shared: &IngressShared, version: u64, error: String) {
    let mut error = error;
    error.truncate(1000);
    *shared.status.lock().expect("status lock") = Some(IngressStatus { routes_version: version, error: Some(error) });
}
