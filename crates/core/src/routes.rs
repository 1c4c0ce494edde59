//! The ingress route table: every app's hosts (its default host under the
//! base domain, and its custom domains) mapped to the addresses of its
//! running instances. An instance counts only once it answered its health
//! check, and stops counting the moment its deployment is replaced, so the
//! table is what ingress nodes should send traffic to right now.
//!
//! The version grows on every change and starts from the wall clock, so it
//! keeps growing across restarts of the control plane.
//!
//! The table is kept incrementally: a change to one app ([`app_changed`])
//! reads only that app's domains and running instances and touches only its
//! hosts, so its cost does not grow with the number of apps. [`recompute`]
//! rebuilds from every app (at start, after a node removal, and as the
//! reconciler's safety net) and only touches the hosts whose entry differs.
//!
//! Passes read the store without holding any lock, so a slow full pass never
//! holds up an app's change. Each pass takes a ticket before it reads; an
//! app's entry is only replaced by a pass with a newer ticket, so a pass
//! that read the store earlier never overwrites what a later one saw.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use cloudweb_protocol::{events, Route};

use crate::error::ApiError;
use crate::AppState;

/// The per-app view behind the table.
#[derive(Default)]
pub struct Index {
    tickets: AtomicU64,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    apps: HashMap<String, Entry>,
    /// Which apps claim each host. The first in name order serves it (a
    /// custom domain claimed by two apps goes to the app whose name sorts
    /// first, as before the table was incremental).
    claims: HashMap<String, BTreeSet<String>>,
}

struct Entry {
    /// The ticket of the pass that installed this entry.
    ticket: u64,
    /// `None`: the app is gone (kept until a newer full pass, so an older
    /// pass cannot bring it back).
    routes: Option<AppRoutes>,
}

/// One app's hosts (lowercase, sorted, unique) and upstreams (sorted, unique).
#[derive(Clone, PartialEq, Eq, Debug)]
struct AppRoutes {
    hosts: Vec<String>,
    upstreams: Vec<String>,
}

impl AppRoutes {
    fn new(name: &str, base_domain: &str, domains_json: &str, mut upstreams: Vec<String>) -> AppRoutes {
        let domains: Vec<String> = serde_json::from_str(domains_json).unwrap_or_default();
        let mut hosts: Vec<String> = std::iter::once(format!("{name}.{base_domain}")).chain(domains).map(|h| h.to_ascii_lowercase()).collect();
        hosts.sort();
        hosts.dedup();
        upstreams.sort();
        upstreams.dedup();
        AppRoutes { hosts, upstreams }
    }
}

/// Every host an app is served under (its name under the base domain, then
/// its custom domains): lowercase, sorted, unique.
pub fn app_hosts(name: &str, base_domain: &str, domains_json: &str) -> Vec<String> {
    AppRoutes::new(name, base_domain, domains_json, Vec::new()).hosts
}

impl Index {
    fn ticket(&self) -> u64 {
        self.tickets.fetch_add(1, Ordering::SeqCst) + 1
    }
}

impl Inner {
    /// Installs what a pass with `ticket` read for `app`, unless a newer pass
    /// already did; adds the hosts whose owner or upstreams may change to
    /// `touched`.
    fn set(&mut self, app: &str, ticket: u64, routes: Option<AppRoutes>, touched: &mut BTreeSet<String>) {
        if let Some(entry) = self.apps.get_mut(app) {
            if entry.ticket > ticket {
                return;
            }
            if entry.routes == routes {
                entry.ticket = ticket;
                return;
            }
        }
        let old = self.apps.insert(app.to_string(), Entry { ticket, routes: routes.clone() });
        if let Some(old) = old.and_then(|e| e.routes) {
            for host in old.hosts {
                if let Some(claimants) = self.claims.get_mut(&host) {
                    claimants.remove(app);
                    if claimants.is_empty() {
                        self.claims.remove(&host);
                    }
                }
                touched.insert(host);
            }
        }
        if let Some(new) = routes {
            for host in new.hosts {
                self.claims.entry(host.clone()).or_default().insert(app.to_string());
                touched.insert(host);
            }
        }
    }

    /// The upstreams the table should hold for `host`; `None`: no route.
    fn wanted(&self, host: &str) -> Option<&Vec<String>> {
        let owner = self.claims.get(host)?.first()?;
        self.apps.get(owner)?.routes.as_ref().map(|r| &r.upstreams)
    }
}

/// Re-reads one app after a change to it (created, deleted, domains, an
/// instance that started or stopped running) and updates its hosts in the
/// table. Returns the version in force afterwards.
pub async fn app_changed(state: &AppState, app: &str) -> Result<u64, ApiError> {
    // Taken after the caller's store write, so this read sees it.
    let ticket = state.route_index.ticket();
    let routes = match state.store.app_domains(app).await? {
        Some(domains) => {
            let upstreams = state.store.running_addresses_of(app).await?;
            Some(AppRoutes::new(app, &state.config.base_domain, &domains, upstreams))
        }
        None => None,
    };
    Ok(install(state, ticket, vec![(app.to_string(), routes)], false))
}

/// Recomputes the table from every app in the store; installs what differs
/// and tells every node when that changed the table. Returns the version in
/// force afterwards.
pub async fn recompute(state: &AppState) -> Result<u64, ApiError> {
    let ticket = state.route_index.ticket();
    let apps = state.store.app_domains_all().await?;
    let running = state.store.running_addresses().await?;
    // Grouped once, so a pass is linear in apps plus instances.
    let mut by_app: HashMap<String, Vec<String>> = HashMap::new();
    for (name, address) in running {
        by_app.entry(name).or_default().push(address);
    }
    let updates = apps
        .into_iter()
        .map(|(name, domains)| {
            let upstreams = by_app.remove(&name).unwrap_or_default();
            let routes = AppRoutes::new(&name, &state.config.base_domain, &domains, upstreams);
            (name, Some(routes))
        })
        .collect();
    Ok(install(state, ticket, updates, true))
}

/// Applies a pass's reads, then bumps the version and tells every node when
/// the table changed.
fn install(state: &AppState, ticket: u64, updates: Vec<(String, Option<AppRoutes>)>, full: bool) -> u64 {
    let mut inner = state.route_index.inner.lock().expect("route index lock");
    let mut table = state.routes.write().expect("routes lock");
    let changed = inner.apply(ticket, updates, full, &mut table.routes);
    drop(inner);
    if !changed && table.version > 0 {
        return table.version;
    }
    let now = state.clock.now_ms().max(0) as u64;
    table.version = (table.version + 1).max(now);
    let version = table.version;
    drop(table);
    tracing::debug!(version, "route table changed");
    state.hub.notify_all(events::ROUTES);
    // A new public host gets its order now, not at the next check.
    state.acme.wake();
    version
}

impl Inner {
    /// Installs a pass's reads and updates the touched hosts of `routes`
    /// (sorted by host). A full pass also forgets apps it did not see
    /// (unless a newer pass installed them). Returns whether `routes` changed.
    fn apply(&mut self, ticket: u64, updates: Vec<(String, Option<AppRoutes>)>, full: bool, routes: &mut Vec<Route>) -> bool {
        let mut touched = BTreeSet::new();
        let mut seen = HashSet::new();
        for (app, app_routes) in updates {
            self.set(&app, ticket, app_routes, &mut touched);
            if full {
                seen.insert(app);
            }
        }
        if full {
            let gone: Vec<String> = self.apps.iter().filter(|(name, e)| e.ticket < ticket && !seen.contains(*name)).map(|(name, _)| name.clone()).collect();
            for app in gone {
                self.set(&app, ticket, None, &mut touched);
            }
            // Tombstones this pass has covered are no longer needed.
            self.apps.retain(|_, e| e.routes.is_some() || e.ticket > ticket);
        }
        let mut changed = false;
        for host in touched {
            let wanted = self.wanted(&host);
            match (routes.binary_search_by(|r| r.host.as_str().cmp(&host)), wanted) {
                (Ok(i), Some(upstreams)) => {
                    if &routes[i].upstreams != upstreams {
                        routes[i].upstreams = upstreams.clone();
                        changed = true;
                    }
                }
                (Ok(i), None) => {
                    routes.remove(i);
                    changed = true;
                }
                (Err(i), Some(upstreams)) => {
                    routes.insert(i, Route { host, upstreams: upstreams.clone() });
                    changed = true;
                }
                (Err(_), None) => {}
            }
        }
        changed
    }
}

/// The current version of the table.
pub fn version(state: &AppState) -> u64 {
    state.routes.read().expect("routes lock").version
}

#[cfg(test)]
mod tests {
    use super::*;

    fn app(name: &str, domains: &[&str], upstreams: &[&str]) -> (String, Option<AppRoutes>) {
        let domains = serde_json::to_string(domains).unwrap();
        (name.to_string(), Some(AppRoutes::new(name, "test", &domains, upstreams.iter().map(|u| u.to_string()).collect())))
    }

    fn hosts(routes: &[Route]) -> Vec<(&str, Vec<&str>)> {
        routes.iter().map(|r| (r.host.as_str(), r.upstreams.iter().map(String::as_str).collect())).collect()
    }

    #[test]
    fn one_app_changes_only_its_hosts_and_the_table_stays_sorted() {
        let mut index = Inner::default();
        let mut routes = Vec::new();
        assert!(index.apply(1, vec![app("b", &[], &[]), app("a", &["WWW.Example.com"], &["10.0.0.1:1"])], true, &mut routes));
        assert_eq!(hosts(&routes), vec![("a.test", vec!["10.0.0.1:1"]), ("b.test", vec![]), ("www.example.com", vec!["10.0.0.1:1"])]);
        // An instance of b starts running: only b's host changes.
        assert!(index.apply(2, vec![app("b", &[], &["10.0.0.2:2", "10.0.0.2:2"])], false, &mut routes));
        assert_eq!(hosts(&routes)[1], ("b.test", vec!["10.0.0.2:2"]));
        // The same read again changes nothing (no new version).
        assert!(!index.apply(3, vec![app("b", &[], &["10.0.0.2:2"])], false, &mut routes));
        // a drops its domain, then is deleted.
        assert!(index.apply(4, vec![app("a", &[], &["10.0.0.1:1"])], false, &mut routes));
        assert_eq!(routes.len(), 2);
        assert!(index.apply(5, vec![("a".to_string(), None)], false, &mut routes));
        assert_eq!(hosts(&routes), vec![("b.test", vec!["10.0.0.2:2"])]);
    }

    #[test]
    fn a_shared_domain_goes_to_the_first_app_by_name_and_moves_when_it_leaves() {
        let mut index = Inner::default();
        let mut routes = Vec::new();
        index.apply(1, vec![app("zed", &["shop.example.com"], &["10.0.0.9:9"]), app("abc", &["shop.example.com"], &["10.0.0.1:1"])], true, &mut routes);
        let shop = |routes: &[Route]| routes.iter().find(|r| r.host == "shop.example.com").map(|r| r.upstreams.clone());
        assert_eq!(shop(&routes), Some(vec!["10.0.0.1:1".to_string()]));
        index.apply(2, vec![("abc".to_string(), None)], false, &mut routes);
        assert_eq!(shop(&routes), Some(vec!["10.0.0.9:9".to_string()]), "the other claimant serves it now");
        index.apply(3, vec![app("zed", &[], &["10.0.0.9:9"])], false, &mut routes);
        assert_eq!(shop(&routes), None);
    }

    #[test]
    fn an_older_read_never_overwrites_a_newer_one() {
        let mut index = Inner::default();
        let mut routes = Vec::new();
        index.apply(1, vec![app("web", &[], &[])], true, &mut routes);
        // A change read at ticket 3 lands before a full pass that read at 2.
        index.apply(3, vec![app("web", &[], &["10.0.0.1:1"])], false, &mut routes);
        index.apply(2, vec![app("web", &[], &[])], true, &mut routes);
        assert_eq!(hosts(&routes), vec![("web.test", vec!["10.0.0.1:1"])]);
        // A deletion read at 5 beats a full pass that read at 4 and still saw the app...
        index.apply(5, vec![("web".to_string(), None)], false, &mut routes);
        index.apply(4, vec![app("web", &[], &["10.0.0.1:1"])], true, &mut routes);
        assert!(routes.is_empty());
        // ...and a full pass that read later forgets the tombstone.
        index.apply(6, vec![], true, &mut routes);
        assert!(index.apps.is_empty());
    }

    #[test]
    fn a_full_pass_forgets_apps_it_did_not_see() {
        let mut index = Inner::default();
        let mut routes = Vec::new();
        index.apply(1, vec![app("a", &[], &[]), app("b", &["b.example.com"], &[])], true, &mut routes);
        assert_eq!(routes.len(), 3);
        assert!(index.apply(2, vec![app("a", &[], &[])], true, &mut routes));
        assert_eq!(hosts(&routes), vec![("a.test", vec![])]);
        assert!(!index.claims.contains_key("b.example.com"));
    }
}
