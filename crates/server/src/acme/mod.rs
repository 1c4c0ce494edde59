//! Certificates for public host names, obtained once for the whole cluster.
//!
//! The control plane is the only ACME client: it places one order per host
//! with the CA (`--acme-ca`, Let's Encrypt by default) through the HTTP-01
//! challenge, stores the certificate with its key sealed, and hands the set
//! to every ingress node (`GET /agent/v1/certificates`, announced by the
//! `certificates` event). Every ingress routes
//! `/.well-known/acme-challenge/<token>` to its agent, which asks the
//! control plane for the key authorization (`GET
//! /agent/v1/acme-challenge/<token>`), so whichever ingress the CA's
//! validation reaches answers it. N ingress nodes therefore make one order
//! per host, not N.
//!
//! [`run`] checks every few seconds, and at once when the route table
//! changes, while at least one ingress node is ready: hosts of the route table that are public (see
//! [`cloudweb_protocol::certificates::internal_host`]) and have no
//! certificate, or one past two thirds of its life, get an order, one at a
//! time. A failed order is tried again after 1 minute, doubling up to 1
//! hour; the certificate in force (if any) keeps serving meanwhile.
//! Certificates of hosts no longer routed are deleted.
//!
//! [`host_status`] is what users see of it (`GET
//! /api/apps/{name}/certificates`, `cloudweb domains certificates`, the
//! dashboard's app page): per host, issuing, valid, renewing or failed,
//! with the certificate's dates and issuer, the orders placed and the last
//! failure's reason.

mod settings;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use cloudweb_protocol::certificates::internal_host;
use cloudweb_protocol::{events, CertificateSet, HostCertificate};
use instant_acme::{
    Account, AccountCredentials, AuthorizationStatus, ChallengeType, Identifier, NewAccount, NewOrder, OrderStatus, RetryPolicy,
};
use sha2::{Digest, Sha256};
use tokio::time::Instant;

pub use settings::{AcmeSettings, LETS_ENCRYPT};

use crate::clock::rfc3339_ms;
use crate::live::NodeState;
use crate::store::{CertificateOrders, CertificateRow};
use crate::AppState;

/// How often the manager looks for hosts to order or renew.
const CHECK_EVERY: Duration = Duration::from_secs(2);
/// First and longest wait after a failed order.
const FIRST_RETRY: Duration = Duration::from_secs(60);
const LONGEST_RETRY: Duration = Duration::from_secs(3600);

/// What the manager shares with the agent listener.
#[derive(Default)]
pub struct Acme {
    /// Pending HTTP-01 challenges: token → key authorization.
    challenges: RwLock<HashMap<String, String>>,
    /// The certificates in force, keys opened, as agents get them.
    served: RwLock<Arc<Served>>,
    /// Hosts whose last order failed, and when to try again.
    failures: Mutex<HashMap<String, Failure>>,
    account: tokio::sync::Mutex<Option<Account>>,
    /// Per host: orders placed and the last failure, as stored.
    orders: Mutex<HashMap<String, CertificateOrders>>,
    /// Wakes the manager before its next check (the route table changed).
    wake: tokio::sync::Notify,
}

#[derive(Default)]
struct Served {
    version: String,
    certificates: Vec<HostCertificate>,
    /// Per host: not before and not after, Unix ms.
    validity: HashMap<String, (i64, i64)>,
    /// Per host: the leaf's issuer (its common name, else the whole name).
    issuers: HashMap<String, String>,
}

struct Failure {
    attempts: u32,
    next: Instant,
}

#[derive(Debug, thiserror::Error)]
pub enum AcmeError {
    #[error("ACME: {0}")]
    Acme(#[from] instant_acme::Error),
    #[error("{0}")]
    Other(String),
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
}

impl Acme {
    /// Makes the manager look at the hosts now rather than at its next
    /// check.
    pub fn wake(&self) {
        self.wake.notify_one();
    }

    /// The key authorization of a pending HTTP-01 challenge.
    pub fn key_authorization(&self, token: &str) -> Option<String> {
        self.challenges.read().expect("challenges lock").get(token).cloned()
    }

    /// The set for an agent that holds `known` (its version), if any.
    pub fn certificate_set(&self, known: Option<&str>) -> CertificateSet {
        let served = self.served.read().expect("served lock").clone();
        let certificates = (known != Some(served.version.as_str())).then(|| served.certificates.clone());
        CertificateSet { version: served.version.clone(), certificates }
    }

    /// Not-after (Unix ms) of each host's certificate in force.
    pub fn expiries(&self) -> HashMap<String, i64> {
        self.served.read().expect("served lock").validity.iter().map(|(h, (_, after))| (h.clone(), *after)).collect()
    }
}

/// The sealing context of a host's certificate key.
fn key_context(host: &str) -> String {
    format!("certificate-key:{host}")
}

fn account_context(directory: &str) -> String {
    format!("acme-account:{directory}")
}

/// Reads the stored certificates into the served set. Run at start and
/// after every change.
pub async fn reload(state: &AppState) -> Result<(), AcmeError> {
    let rows = state.store.certificates().await?;
    let mut certificates = Vec::with_capacity(rows.len());
    let mut validity = HashMap::with_capacity(rows.len());
    let mut issuers = HashMap::with_capacity(rows.len());
    let mut digest = Sha256::new();
    for row in rows {
        let key = match state.sealer.open(&key_context(&row.host), &row.key_sealed) {
            Ok(key) => String::from_utf8_lossy(&key).into_owned(),
            Err(err) => {
                // It is ordered again, as if it were missing.
                tracing::error!(host = %row.host, error = %err, "cannot open a stored certificate key; ordering a new certificate");
                continue;
            }
        };
        digest.update(row.host.as_bytes());
        digest.update([0]);
        digest.update(row.chain_pem.as_bytes());
        digest.update([0]);
        validity.insert(row.host.clone(), (row.not_before_ms, row.not_after_ms));
        if let Some(issuer) = issuer_of(&row.chain_pem) {
            issuers.insert(row.host.clone(), issuer);
        }
        certificates.push(HostCertificate { host: row.host, chain_pem: row.chain_pem, key_pem: key, not_after_ms: row.not_after_ms });
    }
    let version = hex::encode(&digest.finalize()[..16]);
    *state.acme.served.write().expect("served lock") = Arc::new(Served { version, certificates, validity, issuers });
    Ok(())
}

/// Whether a certificate valid from `not_before` to `not_after` should be
/// renewed at `now` (all Unix ms): past two thirds of its life, as Let's
/// Encrypt advises for its 90-day certificates.
pub fn renewal_due(now: i64, not_before: i64, not_after: i64) -> bool {
    let life = (not_after - not_before).max(0);
    now >= not_before + life / 3 * 2
}

/// Hosts the manager should hold certificates for: the public hosts of
/// the route table.
fn wanted_hosts(state: &AppState) -> HashSet<String> {
    let table = state.routes.read().expect("routes lock");
    table.routes.iter().filter(|r| !internal_host(&r.host)).map(|r| r.host.clone()).collect()
}

/// Whether some ingress node runs Caddy with a table: only then can a
/// challenge be answered.
fn ingress_ready(state: &AppState) -> bool {
    let now = Instant::now();
    state.nodes.all().iter().any(|n| {
        n.ingress && n.ingress_status.as_ref().is_some_and(|s| s.error.is_none()) && n.state(now, state.config.unreachable_after) == NodeState::Ready
    })
}

/// The certificate manager; runs for the life of the control plane.
pub async fn run(state: Arc<AppState>) {
    if let Err(err) = reload(&state).await {
        tracing::error!(error = %err, "cannot read the stored certificates");
    }
    match state.store.certificate_orders().await {
        Ok(orders) => *state.acme.orders.lock().expect("orders lock") = orders,
        Err(err) => tracing::error!(error = %err, "cannot read the certificate orders"),
    }
    let mut interval = tokio::time::interval(CHECK_EVERY);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = interval.tick() => {}
            () = state.acme.wake.notified() => {}
        }
        if let Err(err) = pass(&state).await {
            tracing::error!(error = %err, "certificate pass failed");
        }
    }
}

/// One look at every host: delete what is no longer routed, order what is
/// missing or due (one host at a time).
async fn pass(state: &Arc<AppState>) -> Result<(), AcmeError> {
    let wanted = wanted_hosts(state);
    let validity = state.acme.served.read().expect("served lock").validity.clone();
    let mut changed = false;
    for host in validity.keys().filter(|h| !wanted.contains(*h)) {
        state.store.delete_certificate(host).await?;
        tracing::info!(%host, "deleted the certificate of a host no longer served");
        changed = true;
    }
    state.acme.failures.lock().expect("failures lock").retain(|host, _| wanted.contains(host));
    let forgotten: Vec<String> = state.acme.orders.lock().expect("orders lock").keys().filter(|h| !wanted.contains(*h)).cloned().collect();
    for host in forgotten {
        state.store.delete_certificate_orders(&host).await?;
        state.acme.orders.lock().expect("orders lock").remove(&host);
    }
    if changed {
        reload(state).await?;
        state.hub.notify_all(events::CERTIFICATES);
    }
    if wanted.is_empty() || !ingress_ready(state) {
        return Ok(());
    }
    let now_ms = state.clock.now_ms();
    let mut due: Vec<&String> = wanted
        .iter()
        .filter(|host| match validity.get(*host) {
            None => true,
            Some((before, after)) => renewal_due(now_ms, *before, *after),
        })
        .filter(|host| state.acme.failures.lock().expect("failures lock").get(*host).is_none_or(|f| Instant::now() >= f.next))
        .collect();
    due.sort();
    for host in due {
        let renewing = validity.contains_key(host);
        let started = Instant::now();
        match obtain(state, host).await {
            Ok(row) => {
                state.acme.failures.lock().expect("failures lock").remove(host);
                state.store.save_certificate(&row).await?;
                record_outcome(state, host, None).await?;
                reload(state).await?;
                state.hub.notify_all(events::CERTIFICATES);
                tracing::info!(%host, renewal = renewing, seconds = started.elapsed().as_secs_f64(), not_after_ms = row.not_after_ms, "certificate issued");
            }
            Err(err) => {
                let (attempts, wait) = {
                    let mut failures = state.acme.failures.lock().expect("failures lock");
                    let attempts = failures.get(host).map(|f| f.attempts + 1).unwrap_or(1);
                    let wait = FIRST_RETRY.saturating_mul(1 << (attempts - 1).min(10)).min(LONGEST_RETRY);
                    failures.insert(host.clone(), Failure { attempts, next: Instant::now() + wait });
                    (attempts, wait)
                };
                let message = cloudweb_protocol::misc::one_line(&err.to_string(), 1000);
                tracing::warn!(%host, attempts, retry_in_s = wait.as_secs(), error = %message, "could not obtain a certificate");
                record_outcome(state, host, Some(&message)).await?;
            }
        }
    }
    Ok(())
}

/// The ACME account for the configured directory: loaded from the store,
/// or registered (and stored sealed) on first use.
async fn account(state: &AppState) -> Result<Account, AcmeError> {
    let mut cached = state.acme.account.lock().await;
    if let Some(account) = cached.as_ref() {
        return Ok(account.clone());
    }
    let settings = &state.config.acme;
    let builder = || match &settings.ca_root {
        Some(root) => Account::builder_with_root(root),
        None => Account::builder(),
    };
    let context = account_context(&settings.directory);
    let stored = state.store.acme_account(&settings.directory).await?;
    let account = match stored.and_then(|sealed| state.sealer.open_json::<AccountCredentials>(&context, &sealed).ok()) {
        Some(credentials) => builder()?.from_credentials(credentials).await?,
        None => {
            let contact = settings.email.as_ref().map(|e| format!("mailto:{e}"));
            let contacts: Vec<&str> = contact.iter().map(String::as_str).collect();
            let new = NewAccount { contact: &contacts, terms_of_service_agreed: true, only_return_existing: false };
            let (account, credentials) = builder()?.create(&new, settings.directory.clone(), None).await?;
            state.store.save_acme_account(&settings.directory, &state.sealer.seal_json(&context, &credentials), state.clock.now_ms()).await?;
            tracing::info!(directory = %settings.directory, "registered an ACME account");
            account
        }
    };
    *cached = Some(account.clone());
    Ok(account)
}

/// Removes its tokens from the pending challenges when the order ends,
/// however it ends.
struct PendingTokens<'a> {
    acme: &'a Acme,
    tokens: Vec<String>,
}

impl Drop for PendingTokens<'_> {
    fn drop(&mut self) {
        let mut challenges = self.acme.challenges.write().expect("challenges lock");
        for token in &self.tokens {
            challenges.remove(token);
        }
    }
}

/// One order for `host`, through HTTP-01.
async fn obtain(state: &AppState, host: &str) -> Result<CertificateRow, AcmeError> {
    let account = account(state).await?;
    let identifiers = [Identifier::Dns(host.to_string())];
    let mut order = account.new_order(&NewOrder::new(&identifiers)).await?;
    tracing::info!(%host, order = %order.url(), "placed an ACME order");
    state.store.count_certificate_order(host).await?;
    state.acme.orders.lock().expect("orders lock").entry(host.to_string()).or_default().orders += 1;
    let mut pending = PendingTokens { acme: &state.acme, tokens: Vec::new() };
    {
        let mut authorizations = order.authorizations();
        while let Some(authorization) = authorizations.next().await {
            let mut authorization = authorization?;
            match authorization.status {
                AuthorizationStatus::Pending => {}
                AuthorizationStatus::Valid => continue,
                other => return Err(AcmeError::Other(format!("authorization for {host} is {other:?}"))),
            }
            let mut challenge = authorization
                .challenge(ChallengeType::Http01)
                .ok_or_else(|| AcmeError::Other(format!("the CA offers no HTTP-01 challenge for {host}")))?;
            let token = challenge.token.clone();
            cloudweb_protocol::certificates::challenge_token("token", &token).map_err(|e| AcmeError::Other(format!("the CA sent an unusable challenge: {e}")))?;
            let key_authorization = challenge.key_authorization().as_str().to_string();
            state.acme.challenges.write().expect("challenges lock").insert(token.clone(), key_authorization);
            pending.tokens.push(token);
            challenge.set_ready().await?;
        }
    }
    // The CA validates within seconds; Let's Encrypt asks for patience of
    // up to a minute or two under load.
    let retry = RetryPolicy::new().initial_delay(Duration::from_millis(250)).backoff(1.5).timeout(Duration::from_secs(120));
    let status = order.poll_ready(&retry).await?;
    if status != OrderStatus::Ready {
        let reason = challenge_problems(&mut order).await.unwrap_or_else(|| "the challenge was not validated".to_string());
        return Err(AcmeError::Other(format!("the order for {host} is {status:?}: {reason}")));
    }
    drop(pending);
    let key_pem = order.finalize().await?;
    let chain_pem = order.poll_certificate(&retry).await?;
    let (not_before_ms, not_after_ms) = validity_of(&chain_pem)?;
    Ok(CertificateRow {
        host: host.to_string(),
        chain_pem,
        key_sealed: state.sealer.seal(&key_context(host), key_pem.as_bytes()),
        not_before_ms,
        not_after_ms,
        issued_at_ms: state.clock.now_ms(),
    })
}

/// What the CA said about the failed challenges of an order, if anything.
async fn challenge_problems(order: &mut instant_acme::Order) -> Option<String> {
    let mut problems = Vec::new();
    let mut authorizations = order.authorizations();
    while let Some(Ok(authorization)) = authorizations.next().await {
        for challenge in &authorization.challenges {
            if let Some(problem) = &challenge.error {
                problems.push(problem.detail.clone().unwrap_or_else(|| problem.to_string()));
            }
        }
    }
    (!problems.is_empty()).then(|| problems.join("; "))
}

/// Keeps how the last order for `host` ended, in memory and in the store.
async fn record_outcome(state: &AppState, host: &str, error: Option<&str>) -> Result<(), AcmeError> {
    let now_ms = state.clock.now_ms();
    state.store.set_certificate_error(host, error, now_ms).await?;
    let mut orders = state.acme.orders.lock().expect("orders lock");
    let entry = orders.entry(host.to_string()).or_default();
    entry.last_error = error.map(str::to_string);
    entry.last_error_at_ms = error.map(|_| now_ms);
    Ok(())
}

/// What users see of one host's certificate.
#[derive(Debug, Clone, serde::Serialize)]
pub struct HostStatus {
    pub host: String,
    /// `internal` (no ACME: a name that cannot be public), `issuing` (no
    /// certificate yet), `valid`, `renewing` (past two thirds of its
    /// life, or expired while a new order is under way), `failed` (no
    /// usable certificate and the last order failed).
    pub state: &'static str,
    pub not_before: Option<String>,
    pub not_after: Option<String>,
    /// The issuing CA's name, as the certificate gives it.
    pub issuer: Option<String>,
    /// ACME orders placed for the host.
    pub orders: i64,
    /// Why the last order failed, unless one succeeded since.
    pub last_error: Option<String>,
    pub last_error_at: Option<String>,
    /// When the next order will be placed, after a failure.
    pub next_attempt_at: Option<String>,
    /// `not_after` as Unix ms, for the dashboard.
    #[serde(skip)]
    pub not_after_ms: Option<i64>,
}

/// The certificate state of each of `hosts`, in that order.
pub fn host_status(state: &AppState, hosts: &[String]) -> Vec<HostStatus> {
    let served = state.acme.served.read().expect("served lock").clone();
    let orders = state.acme.orders.lock().expect("orders lock").clone();
    let now_ms = state.clock.now_ms();
    let now = Instant::now();
    hosts
        .iter()
        .map(|host| {
            let internal = internal_host(host);
            let validity = served.validity.get(host).copied();
            let stats = orders.get(host).cloned().unwrap_or_default();
            let failed = stats.last_error.is_some();
            let state_name = match validity {
                _ if internal => "internal",
                None if failed => "failed",
                None => "issuing",
                Some((_, after)) if now_ms >= after => {
                    if failed {
                        "failed"
                    } else {
                        "renewing"
                    }
                }
                Some((before, after)) if renewal_due(now_ms, before, after) => "renewing",
                Some(_) => "valid",
            };
            let next_attempt_at = state.acme.failures.lock().expect("failures lock").get(host).filter(|_| failed && !internal).map(|f| {
                let wait = f.next.saturating_duration_since(now).as_millis() as i64;
                rfc3339_ms(now_ms + wait)
            });
            HostStatus {
                host: host.clone(),
                state: state_name,
                not_before: validity.map(|(before, _)| rfc3339_ms(before)),
                not_after: validity.map(|(_, after)| rfc3339_ms(after)),
                issuer: served.issuers.get(host).cloned(),
                orders: stats.orders,
                last_error: stats.last_error,
                last_error_at: stats.last_error_at_ms.map(rfc3339_ms),
                next_attempt_at,
                not_after_ms: validity.map(|(_, after)| after),
            }
        })
        .collect()
}

/// The issuer of the chain's leaf: its common name, else the whole name.
fn issuer_of(chain_pem: &str) -> Option<String> {
    use rustls_pki_types::pem::PemObject;
    let leaf = rustls_pki_types::CertificateDer::pem_slice_iter(chain_pem.as_bytes()).next()?.ok()?;
    let (_, cert) = x509_parser::parse_x509_certificate(&leaf).ok()?;
    let issuer = cert.issuer();
    let name = issuer.iter_common_name().next().and_then(|cn| cn.as_str().ok()).map(str::to_string).unwrap_or_else(|| issuer.to_string());
    Some(cloudweb_protocol::misc::one_line(&name, 200))
}

/// Not before and not after of the chain's first (leaf) certificate.
fn validity_of(chain_pem: &str) -> Result<(i64, i64), AcmeError> {
    use rustls_pki_types::pem::PemObject;
    let leaf = rustls_pki_types::CertificateDer::pem_slice_iter(chain_pem.as_bytes())
        .next()
        .and_then(Result::ok)
        .ok_or_else(|| AcmeError::Other("the CA's chain holds no certificate".to_string()))?;
    let (_, cert) = x509_parser::parse_x509_certificate(&leaf).map_err(|e| AcmeError::Other(format!("the CA's certificate does not parse: {e}")))?;
    let validity = cert.validity();
    Ok((validity.not_before.timestamp() * 1000, validity.not_after.timestamp() * 1000))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renews_after_two_thirds_of_the_life() {
        let day = 86_400_000;
        assert!(!renewal_due(59 * day, 0, 90 * day));
        assert!(renewal_due(60 * day, 0, 90 * day));
        assert!(!renewal_due(39_000, 0, 60_000));
        assert!(renewal_due(40_000, 0, 60_000));
        assert!(renewal_due(10, 10, 10), "an empty life is due at once");
    }

    #[test]
    fn reads_the_leaf_validity() {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(vec!["shop.example.com".to_string()]).unwrap();
        params.not_before = time::OffsetDateTime::from_unix_timestamp(1_700_000_000).unwrap();
        params.not_after = time::OffsetDateTime::from_unix_timestamp(1_700_086_400).unwrap();
        let cert = params.self_signed(&key).unwrap();
        assert_eq!(validity_of(&cert.pem()).unwrap(), (1_700_000_000_000, 1_700_086_400_000));
        assert!(validity_of("nothing").is_err());
    }

    #[test]
    fn agents_holding_the_version_get_no_keys() {
        let acme = Acme::default();
        *acme.served.write().unwrap() = Arc::new(Served {
            version: "v1".into(),
            certificates: vec![HostCertificate { host: "a.example.com".into(), chain_pem: "c".into(), key_pem: "k".into(), not_after_ms: 1 }],
            validity: HashMap::new(),
            issuers: HashMap::new(),
        });
        assert_eq!(acme.certificate_set(None).certificates.unwrap().len(), 1);
        assert_eq!(acme.certificate_set(Some("v0")).certificates.unwrap().len(), 1);
        let same = acme.certificate_set(Some("v1"));
        assert!(same.certificates.is_none() && same.version == "v1");
    }
}
