//! The ingress of a node that joined with `--ingress`: Caddy driven from the
//! control plane's route table, and the traffic counts its access log feeds.
//!
//! The route table is fetched when the event stream says `routes` (and every
//! few seconds as a safety net). Instances reach Caddy through the agent's
//! upstream directory ([`dns`]), so a change of instances only rewrites the
//! directory; Caddy is reloaded only when the set of hosts changes. The
//! version served goes out with each heartbeat once Caddy can no longer hold
//! an older answer, and the control plane stops a replaced instance only
//! once every ingress serves a table without it.

pub mod acme;
pub mod caddy;
pub mod config;
pub mod dns;
pub mod local;
pub mod traffic;

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cloudweb_protocol::{IngressStatus, RouteTable};
use tokio::sync::Notify;

use self::caddy::{Caddy, Launch};
use self::config::Ports;
use self::traffic::TrafficCounter;
use crate::client::ControlPlane;

#[derive(Debug, Clone)]
pub struct IngressOptions {
    pub launch: Launch,
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

/// Runs the ingress until `stop` turns true; then stops a Caddy run as a
/// child process and returns.
pub async fn run(
    client: Arc<ControlPlane>,
    options: IngressOptions,
    wake: Arc<Notify>,
    shared: Arc<IngressShared>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let access_socket = options.dir.join("access.sock");
    if let Err(err) = std::fs::create_dir_all(&options.dir) {
        tracing::error!(dir = %options.dir.display(), error = %err, "cannot create the ingress dir; ingress disabled");
        return;
    }
    let directory = dns::Directory::default();
    let allowed = local::Allowed::default();
    // The ports of the last run when they are free again: a Caddy container
    // that outlived the agent keeps calling them.
    let ports_file = options.dir.join("local-ports.json");
    let mut previous: Vec<u16> = std::fs::read(&ports_file).ok().and_then(|b| serde_json::from_slice(&b).ok()).unwrap_or_default();
    previous.resize(4, 0);
    let bound = async {
        let resolver = dns::serve(directory.clone(), previous[0]).await?;
        let permission = local::serve_permission(allowed.clone(), previous[1]).await?;
        let unavailable = local::serve_unavailable(previous[2]).await?;
        let challenges = acme::serve_challenges(client.clone(), previous[3]).await?;
        let ports = [resolver.port(), permission.port(), unavailable.port(), challenges.port()];
        std::fs::write(&ports_file, serde_json::to_vec(&ports).expect("json"))?;
        std::io::Result::Ok((config::Local { resolver, permission, challenges }, unavailable))
    };
    let (local, unavailable) = match bound.await {
        Ok(bound) => bound,
        Err(err) => {
            tracing::error!(error = %err, "cannot bind the ingress's loopback services; ingress disabled");
            set_error(&shared, 0, format!("cannot bind the ingress's loopback services: {err}"));
            return;
        }
    };
    let mut state = Applied { directory, allowed, local, unavailable, table: None, loaded: None, certificates: acme::Certificates::default(), certificates_changed: false };
    let mut tls_alpn = acme::TlsAlpn::new(&caddy::storage_dir(&options.dir));
    {
        let counter = shared.counter.clone();
        let socket = access_socket.clone();
        tokio::spawn(async move {
            if let Err(err) = traffic::listen(&socket, counter).await {
                tracing::error!(error = %err, "the access log socket failed; traffic is not counted");
            }
        });
    }
    // The table last fetched: a Caddy started again after a crash gets it
    // at once, without waiting for the control plane.
    let mut last_table: Option<RouteTable> = None;
    let mut crashes_in_a_row = 0u32;
    loop {
        let started = tokio::select! {
            started = Caddy::start(&options.launch, &options.dir) => started,
            _ = stopped(&mut stop) => return,
        };
        let mut caddy = match started {
            Ok(caddy) => caddy,
            Err(err) => {
                tracing::error!(error = %err, "cannot start Caddy; retrying in 10 s");
                set_error(&shared, 0, err.to_string());
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_secs(10)) => continue,
                    _ = stopped(&mut stop) => return,
                }
            }
        };
        let running_since = tokio::time::Instant::now();
        tracing::info!(admin = %caddy.admin_socket().display(), adopted = caddy.adopted, "caddy started");
        // A new Caddy has no configuration yet; an adopted one keeps its own,
        // and is reloaded only if the table renders differently.
        state.loaded = if caddy.adopted { caddy.current().await.ok() } else { None };
        state.table = None;
        if let Some(table) = last_table.clone() {
            apply(&caddy, &options, &access_socket, &shared, &mut state, table).await;
        }
        loop {
            // Certificates first: a host's certificate, once issued, goes
            // into the same load as a table change.
            match state.certificates.refresh(&client).await {
                Ok(true) => state.certificates_changed = true,
                Ok(false) => {}
                // Held by the 426 gate, or a control plane older than ACME.
                Err(err @ (crate::client::ClientError::Held { .. } | crate::client::ClientError::Status { status: 404, .. })) => {
                    tracing::debug!(error = %err, "certificates not read")
                }
                Err(err) => tracing::warn!(error = %err, "cannot read the ACME certificates"),
            }
            match tls_alpn.refresh(&client).await {
                Ok(()) => {}
                Err(err @ (crate::client::ClientError::Held { .. } | crate::client::ClientError::Status { status: 404, .. })) => {
                    tracing::debug!(error = %err, "TLS-ALPN-01 challenges not read")
                }
                Err(err) => tracing::warn!(error = %err, "cannot read the TLS-ALPN-01 challenges"),
            }
            match client.routes().await {
                Ok(table) => {
                    last_table = Some(table.clone());
                    apply(&caddy, &options, &access_socket, &shared, &mut state, table).await;
                }
                Err(err @ crate::client::ClientError::Held { .. }) => tracing::debug!(error = %err, "route table not read"),
                Err(err) => tracing::warn!(error = %err, "cannot read the route table"),
            }
            tokio::select! {
                _ = wake.notified() => {}
                _ = tokio::time::sleep(POLL) => {}
                _ = caddy.exited() => break,
                _ = stopped(&mut stop) => {
                    shared.active.store(false, std::sync::atomic::Ordering::Relaxed);
                    caddy.stop().await;
                    tracing::info!("ingress stopped");
                    return;
                }
            }
        }
        shared.active.store(false, std::sync::atomic::Ordering::Relaxed);
        // Restart at once; only a Caddy that keeps dying right after its
        // start is restarted ever more slowly (up to 10 s).
        crashes_in_a_row = if running_since.elapsed() > Duration::from_secs(30) { 1 } else { crashes_in_a_row + 1 };
        let delay = Duration::from_millis(100 * 2u64.pow(crashes_in_a_row.saturating_sub(1).min(7))).min(Duration::from_secs(10));
        tracing::error!(retry_in_ms = delay.as_millis() as u64, "caddy is gone; starting it again with the current route table");
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = stopped(&mut stop) => return,
        }
    }
}

/// Resolves once `stop` turns true (or its sender is gone).
async fn stopped(stop: &mut tokio::sync::watch::Receiver<bool>) {
    while !*stop.borrow_and_update() {
        if stop.changed().await.is_err() {
            return;
        }
    }
}

/// What the ingress has put in force.
struct Applied {
    directory: dns::Directory,
    /// Hosts on-demand TLS may obtain a certificate for.
    allowed: local::Allowed,
    local: config::Local,
    /// The 503 responder hosts without instances point at.
    unavailable: SocketAddr,
    table: Option<RouteTable>,
    /// The configuration Caddy runs, to skip identical loads.
    loaded: Option<serde_json::Value>,
    /// The control plane's ACME certificates, as last fetched.
    certificates: acme::Certificates,
    /// They changed since Caddy last loaded them.
    certificates_changed: bool,
}

async fn apply(caddy: &Caddy, options: &IngressOptions, access_socket: &std::path::Path, shared: &Arc<IngressShared>, state: &mut Applied, mut table: RouteTable) {
    // Hosts end up in Caddy's matchers and in directory names: anything the
    // control plane should never have sent is left out, not served.
    table.routes.retain(|route| match cloudweb_protocol::validate::route_host("host", &route.host) {
        Ok(()) => true,
        Err(err) => {
            tracing::warn!(host = %route.host, error = %err, "dropping a route whose host the ingress cannot serve");
            false
        }
    });
    let routes_changed = state.table.as_ref().is_none_or(|current| current.routes != table.routes);
    if routes_changed || state.certificates_changed {
        let previous_zone = state.table.as_ref().map(|t| t.routes.clone());
        let zone = directory_zone(&table, state.unavailable).await;
        // Names first: a host Caddy is about to serve must already resolve
        // and be allowed a certificate.
        state.directory.replace(zone.clone());
        let hosts: Vec<String> = table.routes.iter().map(|r| r.host.clone()).collect();
        // Only internal hosts: a public host's certificate comes from the
        // control plane, and Caddy must never order one itself.
        let mut allowed: HashSet<String> = hosts.iter().filter(|h| config::internal_host(h)).cloned().collect();
        if let Some(current) = &state.table {
            // Until the new configuration loads, the old one still serves.
            allowed.extend(current.routes.iter().map(|r| r.host.clone()).filter(|h| config::internal_host(h)));
        }
        state.allowed.replace(allowed);
        let rendered = config::render(&hosts, &state.certificates.list, &options.ports, caddy.admin_socket(), access_socket, state.local);
        state.certificates_changed = false;
        if state.loaded.as_ref() != Some(&rendered) {
            if let Err(err) = caddy.load(&rendered).await {
                // Caddy keeps serving the previous configuration; keep the
                // names it refers to resolving too.
                state.certificates_changed = true;
                if let Some(previous) = previous_zone {
                    let old = directory_zone(&RouteTable { version: 0, routes: previous }, state.unavailable).await;
                    let mut merged = old;
                    merged.extend(zone);
                    state.directory.replace(merged);
                }
                tracing::error!(version = table.version, error = %err, "caddy refused the route table; the previous one keeps serving");
                set_error(shared, state.table.as_ref().map(|t| t.version).unwrap_or(0), err.to_string());
                return;
            }
            state.loaded = Some(rendered);
            state.allowed.replace(hosts.iter().filter(|h| config::internal_host(h)).cloned().collect());
            tracing::info!(version = table.version, routes = table.routes.len(), reloaded = true, "route table applied");
        } else {
            tracing::info!(version = table.version, routes = table.routes.len(), reloaded = false, "route table applied");
        }
    }
    *shared.known_hosts.lock().expect("hosts lock") = table.routes.iter().map(|r| r.host.clone()).collect();
    shared.active.store(true, std::sync::atomic::Ordering::Relaxed);
    if routes_changed {
        // Caddy may hold an answer read just before the change for one
        // refresh interval; only then does the new table really serve. The
        // loop goes on meanwhile, so a next change is not held up.
        let (shared, version) = (shared.clone(), table.version);
        tokio::spawn(async move {
            tokio::time::sleep(dns::REFRESH + std::time::Duration::from_millis(20)).await;
            publish(&shared, version);
        });
    } else {
        publish(shared, table.version);
    }
    state.table = Some(table);
}

/// Reports `version` as served, unless a newer version (or a failure of
/// this one) was reported meanwhile.
fn publish(shared: &IngressShared, version: u64) {
    let mut status = shared.status.lock().expect("status lock");
    let newer = match status.as_ref() {
        None => true,
        Some(current) => current.routes_version < version || (current.routes_version == version && current.error.is_none()),
    };
    if newer {
        *status = Some(IngressStatus { routes_version: version, error: None });
    }
}

/// The directory for a table: each host's service name with its usable
/// upstreams, or the 503 responder when it has none. Upstreams given by
/// name are resolved here, once per change.
async fn directory_zone(table: &RouteTable, unavailable: SocketAddr) -> HashMap<String, Vec<dns::Target>> {
    let mut zone = HashMap::with_capacity(table.routes.len());
    for route in &table.routes {
        let mut targets = Vec::new();
        for upstream in &route.upstreams {
            if !config::usable_upstream(upstream) {
                tracing::warn!(host = %route.host, %upstream, "dropping an upstream that is not host:port");
                continue;
            }
            match upstream.parse::<SocketAddr>() {
                Ok(address) => targets.push(dns::Target::of(address)),
                Err(_) => match tokio::net::lookup_host(upstream.as_str()).await {
                    Ok(mut found) => match found.next() {
                        Some(address) => targets.push(dns::Target::of(address)),
                        None => tracing::warn!(host = %route.host, %upstream, "an upstream name resolves to nothing"),
                    },
                    Err(err) => tracing::warn!(host = %route.host, %upstream, error = %err, "cannot resolve an upstream name"),
                },
            }
        }
        if targets.is_empty() {
            targets.push(dns::Target::of(unavailable));
        }
        zone.insert(dns::service_name(&route.host), targets);
    }
    zone
}

fn set_error(shared: &IngressShared, version: u64, error: String) {
    let mut error = error;
    cloudweb_protocol::misc::truncate_on_char(&mut error, 1000);
    *shared.status.lock().expect("status lock") = Some(IngressStatus { routes_version: version, error: Some(error) });
}
