//! The ingress route table: every app's hosts (its default host under the
//! base domain, and its custom domains) mapped to the addresses of its
//! running instances. An instance counts only once it answered its health
//! check, and stops counting the moment its deployment is replaced, so the
//! table is what ingress nodes should send traffic to right now.
//!
//! The version grows on every change and starts from the wall clock, so it
//! keeps growing across restarts of the control plane.

use std::collections::{BTreeMap, HashMap};

use cloudweb_protocol::{events, Route};

use crate::error::ApiError;
use crate::AppState;

/// Computes the table from the store; when it differs from the current one,
/// installs it with a new version and tells every node. Returns the version
/// in force afterwards.
pub async fn recompute(state: &AppState) -> Result<u64, ApiError> {
    use std::sync::atomic::Ordering;
    // Callers ask after their store write, so any pass that starts after
    // this ticket sees that write.
    let ticket = state.routes_requested.fetch_add(1, Ordering::SeqCst) + 1;
    // One at a time: two passes reading the store at different moments must
    // not install their tables in the wrong order.
    let mut covered = state.routes_turn.lock().await;
    if *covered >= ticket {
        // A pass that started after this request finished while we waited
        // (many app changes at once share one pass).
        return Ok(version(state));
    }
    let starting = state.routes_requested.load(Ordering::SeqCst);
    let result = compute_and_install(state).await;
    if result.is_ok() {
        *covered = starting;
    }
    result
}

async fn compute_and_install(state: &AppState) -> Result<u64, ApiError> {
    let apps = state.store.apps().await?;
    let running = state.store.running_addresses().await?;
    // Grouped once, so a pass is linear in apps plus instances.
    let mut by_app: HashMap<&str, Vec<String>> = HashMap::new();
    for (name, address) in &running {
        by_app.entry(name.as_str()).or_default().push(address.clone());
    }
    let mut hosts: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for app in &apps {
        let mut upstreams = by_app.remove(app.name.as_str()).unwrap_or_default();
        upstreams.sort();
        upstreams.dedup();
        let domains: Vec<String> = serde_json::from_str(&app.domains).unwrap_or_default();
        let default_host = format!("{}.{}", app.name, state.config.base_domain);
        for host in std::iter::once(default_host).chain(domains) {
            // A custom domain claimed by two apps goes to the older app.
            hosts.entry(host.to_ascii_lowercase()).or_insert_with(|| upstreams.clone());
        }
    }
    let routes: Vec<Route> = hosts.into_iter().map(|(host, upstreams)| Route { host, upstreams }).collect();
    let mut table = state.routes.write().expect("routes lock");
    if table.routes == routes && table.version > 0 {
        return Ok(table.version);
    }
    let now = state.clock.now_ms().max(0) as u64;
    table.version = (table.version + 1).max(now);
    table.routes = routes;
    let version = table.version;
    drop(table);
    tracing::debug!(version, "route table changed");
    state.hub.notify_all(events::ROUTES);
    Ok(version)
}

/// The current version of the table.
pub fn version(state: &AppState) -> u64 {
    state.routes.read().expect("routes lock").version
}
