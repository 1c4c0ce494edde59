//! Certificates for public host names, obtained once for the whole cluster.
//!
//! The control plane is the only ACME client: it places one order per host
//! with the CA (`--acme-ca`, Let's Encrypt by default), stores the
//! certificate with its key sealed, and hands the set to every ingress node
//! (`GET /agent/v1/certificates`, announced by the `certificates` event).
//! N ingress nodes therefore make one order per host, not N. Whichever
//! ingress the CA's validation reaches answers the challenge
//! (`--acme-challenge` picks the type; the other is used when the CA does
//! not offer it):
//! - HTTP-01: every ingress routes `/.well-known/acme-challenge/<token>` to
//!   its agent, which asks the control plane for the key authorization
//!   (`GET /agent/v1/acme-challenge/<token>`).
//! - TLS-ALPN-01: Caddy answers an `acme-tls/1` handshake only from what
//!   certmagic finds in its storage, so the pending challenges are pushed
//!   (`GET /agent/v1/acme-tls-alpn`, announced by the `certificates`
//!   event) and every agent writes them there; the CA is told the
//!   challenge is ready once every ready ingress node reports it applied
//!   (`?applied=<version>`), or after [`APPLY_WAIT`].
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
use cloudweb_protocol::{events, CertificateSet, HostCertificate, TlsAlpnChallenge, TlsAlpnChallenges};
use instant_acme::{
    Account, AccountCredentials, AuthorizationStatus, ChallengeType, Identifier, NewAccount, NewOrder, OrderStatus, RetryPolicy,
};
use sha2::{Digest, Sha256};
use tokio::time::Instant;

pub use settings::{AcmeSettings, Challenge, LETS_ENCRYPT};

use crate::clock::rfc3339_ms;
use crate::live::NodeState;
use crate::store::{CertificateOrders, CertificateRow};
use crate::AppState;

/// How often the manager looks for hosts to order or renew.
const CHECK_EVERY: Duration = Duration::from_secs(2);
/// How long a TLS-ALPN-01 challenge waits for every ready ingress node to
/// put it in place before the CA is told to validate anyway.
pub const APPLY_WAIT: Duration = Duration::from_secs(15);
/// First and longest wait after a failed order.
const FIRST_RETRY: Duration = Duration::from_secs(60);
const LONGEST_RETRY: Duration = Duration::from_secs(3600);

/// What the manager shares with the agent listener.
#[derive(Default)]
pub struct Acme {
    /// Pending HTTP-01 challenges: token → key authorization.
    challenges: RwLock<HashMap<String, String>>,
    /// Pending TLS-ALPN-01 challenges: host → key authorization, and the
    /// version every ingress is to apply.
    tls_alpn: RwLock<TlsAlpnPending>,
    /// Per ingress node: the TLS-ALPN-01 version it last reported applied.
    tls_alpn_applied: Mutex<HashMap<String, String>>,
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
struct TlsAlpnPending {
    challenges: std::collections::BTreeMap<String, String>,
    version: String,
}

impl TlsAlpnPending {
    fn set(&mut self, host: &str, key_authorization: Option<String>) {
        match key_authorization {
            Some(answer) => self.challenges.insert(host.to_string(), answer),
            None => self.challenges.remove(host),
        };
        let mut digest = Sha256::new();
        for (host, answer) in &self.challenges {
            digest.update(host.as_bytes());
            digest.update([0]);
            digest.update(answer.as_bytes());
            digest.update([0]);
        }
        self.version = hex::encode(&digest.finalize()[..16]);
    }
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

    /// The pending TLS-ALPN-01 challenges, for an ingress node that has
    /// put `applied` in place (recorded, so an order knows when every
    /// ingress answers).
    pub fn tls_alpn_challenges(&self, node_id: &str, applied: Option<&str>) -> TlsAlpnChallenges {
        if let Some(applied) = applied {
            self.tls_alpn_applied.lock().expect("applied lock").insert(node_id.to_string(), applied.to_string());
        }
        let pending = self.tls_alpn.read().expect("tls-alpn lock");
        let version = if pending.version.is_empty() { empty_version() } else { pending.version.clone() };
        TlsAlpnChallenges {
            version,
            challenges: pending.challenges.iter().map(|(host, answer)| TlsAlpnChallenge { host: host.clone(), key_authorization: answer.clone() }).collect(),
        }
    }

    fn tls_alpn_version(&self) -> String {
        let version = self.tls_alpn.read().expect("tls-alpn lock").version.clone();
        if version.is_empty() { empty_version() } else { version }
    }

    /// Not-after (Unix ms) of each host's certificate in force.
    pub fn expiries(&self) -> HashMap<String, i64> {
        self.served.read().expect("served lock").validity.iter().map(|(h, (_, after))| (h.clone(), *after)).collect()
    }
}

/// The version of no pending challenge.
fn empty_version() -> String {
    hex::encode(&Sha256::digest([])[..16])
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
    !ready_ingress_nodes(state).is_empty()
}

/// The ingress nodes that run Caddy with a table and are ready.
fn ready_ingress_nodes(state: &AppState) -> Vec<String> {
    let now = Instant::now();
    state
        .nodes
        .all()
        .iter()
        .filter(|n| {
            n.ingress && n.ingress_status.as_ref().is_some_and(|s| s.error.is_none()) && n.state(now, state.config.unreachable_after) == NodeState::Ready
        })
        .map(|n| n.id.clone())
        .collect()
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
        match obtain_retrying_nonces(state, host).await {
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

/// How many more times an order is tried at once after the CA refused a
/// nonce. A refused nonce says nothing about the host (RFC 8555 section
/// 6.5: the client retries with a fresh one); instant-acme already does
/// that twice per request, and when a CA (Pebble rejects 5% of nonces by
/// default) refuses three in a row the order is tried again here, a second
/// apart, rather than after the first backoff of a minute.
const NONCE_RETRIES: u32 = 3;

impl AcmeError {
    /// The CA refused the request's nonce (`badNonce`).
    fn is_bad_nonce(&self) -> bool {
        match self {
            AcmeError::Acme(instant_acme::Error::Api(problem)) => problem.r#type.as_deref() == Some("urn:ietf:params:acme:error:badNonce"),
            AcmeError::Other(text) => text.contains("urn:ietf:params:acme:error:badNonce"),
            _ => false,
        }
    }
}

/// [`obtain`], tried again at once (boundedly) when only a nonce failed.
async fn obtain_retrying_nonces(state: &AppState, host: &str) -> Result<CertificateRow, AcmeError> {
    let mut retries = 0;
    loop {
        match obtain(state, host).await {
            Err(err) if err.is_bad_nonce() && retries < NONCE_RETRIES => {
                retries += 1;
                tracing::info!(%host, retries, "the CA refused a nonce; trying the order again");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            outcome => return outcome,
        }
    }
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
    state: &'a AppState,
    tokens: Vec<String>,
    /// Hosts with a pending TLS-ALPN-01 challenge.
    hosts: Vec<String>,
}

impl Drop for PendingTokens<'_> {
    fn drop(&mut self) {
        let mut challenges = self.state.acme.challenges.write().expect("challenges lock");
        for token in &self.tokens {
            challenges.remove(token);
        }
        if !self.hosts.is_empty() {
            let mut pending = self.state.acme.tls_alpn.write().expect("tls-alpn lock");
            for host in &self.hosts {
                pending.set(host, None);
            }
            drop(pending);
            // The ingress nodes delete what they put in place.
            self.state.hub.notify_all(events::CERTIFICATES);
        }
    }
}

/// The challenge of `authorization` to answer: the preferred type when the
/// CA offers it, else the other one.
fn pick_challenge(offered: &[ChallengeType], preferred: Challenge) -> Option<Challenge> {
    let of = |kind: Challenge| match kind {
        Challenge::Http01 => ChallengeType::Http01,
        Challenge::TlsAlpn01 => ChallengeType::TlsAlpn01,
    };
    [preferred, preferred.other()].into_iter().find(|kind| offered.contains(&of(*kind)))
}

/// A challenge type as RFC 8555 and its extensions name it.
fn challenge_name(kind: &ChallengeType) -> String {
    match kind {
        ChallengeType::Http01 => "http-01".to_string(),
        ChallengeType::Dns01 => "dns-01".to_string(),
        ChallengeType::TlsAlpn01 => "tls-alpn-01".to_string(),
        other => format!("{other:?}").to_lowercase(),
    }
}

/// Waits until every ready ingress node reports the TLS-ALPN-01 version in
/// force applied, at most [`APPLY_WAIT`]; says which did not.
async fn wait_applied(state: &AppState, host: &str) {
    let version = state.acme.tls_alpn_version();
    let deadline = Instant::now() + APPLY_WAIT;
    loop {
        let missing: Vec<String> = {
            let applied = state.acme.tls_alpn_applied.lock().expect("applied lock");
            ready_ingress_nodes(state).into_iter().filter(|id| applied.get(id) != Some(&version)).collect()
        };
        if missing.is_empty() {
            return;
        }
        if Instant::now() >= deadline {
            // An agent older than TLS-ALPN-01, or one that cannot write
            // Caddy's storage: the CA may still reach another node.
            tracing::warn!(%host, nodes = ?missing, "ingress nodes did not report the TLS-ALPN-01 challenge in place; asking the CA to validate anyway");
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// One order for `host`, through the preferred challenge type (or the
/// other one, when the CA does not offer it).
async fn obtain(state: &AppState, host: &str) -> Result<CertificateRow, AcmeError> {
    let account = account(state).await?;
    let identifiers = [Identifier::Dns(host.to_string())];
    let mut order = account.new_order(&NewOrder::new(&identifiers)).await?;
    tracing::info!(%host, order = %order.url(), "placed an ACME order");
    state.store.count_certificate_order(host).await?;
    state.acme.orders.lock().expect("orders lock").entry(host.to_string()).or_default().orders += 1;
    let mut pending = PendingTokens { state, tokens: Vec::new(), hosts: Vec::new() };
    {
        let mut authorizations = order.authorizations();
        while let Some(authorization) = authorizations.next().await {
            let mut authorization = authorization?;
            match authorization.status {
                AuthorizationStatus::Pending => {}
                AuthorizationStatus::Valid => continue,
                other => return Err(AcmeError::Other(format!("authorization for {host} is {other:?}"))),
            }
            let offered: Vec<ChallengeType> = authorization.challenges.iter().map(|c| c.r#type.clone()).collect();
            let Some(kind) = pick_challenge(&offered, state.config.acme.challenge) else {
                let names: Vec<String> = offered.iter().map(challenge_name).collect();
                return Err(AcmeError::Other(format!(
                    "the CA offers neither HTTP-01 nor TLS-ALPN-01 for {host} (it offers: {}); the cluster can answer no other type",
                    if names.is_empty() { "nothing".to_string() } else { names.join(", ") }
                )));
            };
            let challenge_type = match kind {
                Challenge::Http01 => ChallengeType::Http01,
                Challenge::TlsAlpn01 => ChallengeType::TlsAlpn01,
            };
            let mut challenge = authorization.challenge(challenge_type).expect("offered");
            let token = challenge.token.clone();
            cloudweb_protocol::certificates::challenge_token("token", &token).map_err(|e| AcmeError::Other(format!("the CA sent an unusable challenge: {e}")))?;
            let key_authorization = challenge.key_authorization().as_str().to_string();
            match kind {
                Challenge::Http01 => {
                    state.acme.challenges.write().expect("challenges lock").insert(token.clone(), key_authorization);
                    pending.tokens.push(token);
                }
                Challenge::TlsAlpn01 => {
                    state.acme.tls_alpn.write().expect("tls-alpn lock").set(host, Some(key_authorization));
                    pending.hosts.push(host.to_string());
                    state.hub.notify_all(events::CERTIFICATES);
                    wait_applied(state, host).await;
                }
            }
            tracing::info!(%host, challenge = kind.name(), "answering the ACME challenge");
            challenge.set_ready().await?;
        }
    }
    // The CA validates within seconds; Let's Encrypt asks for patience of
    // up to a minute or two under load.
    let retry = RetryPolicy::new().initial_delay(Duration::from_millis(250)).backoff(1.5).timeout(Duration::from_secs(120));
    let status = order.poll_ready(&retry).await?;
    if status != OrderStatus::Ready {
        let why = invalid_reasons(&mut order).await;
        return Err(AcmeError::Other(format!("the order for {host} is {status:?}: the CA did not validate the challenge{why}")));
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

/// What the CA says about the challenges that failed (their problem
/// documents), as ` (<type>: <detail>; …)`, for a CA that marks the order
/// invalid without an error of its own (pebble sets one, which
/// `poll_ready` returns as the error); empty when it cannot be read.
async fn invalid_reasons(order: &mut instant_acme::Order) -> String {
    let mut reasons = Vec::new();
    let mut authorizations = order.authorizations();
    while let Some(Ok(mut authorization)) = authorizations.next().await {
        let Ok(state) = authorization.refresh().await else { break };
        for challenge in &state.challenges {
            if let Some(problem) = &challenge.error {
                let detail = problem.detail.as_deref().unwrap_or("no detail");
                reasons.push(format!("{}: {detail}", challenge_name(&challenge.r#type)));
            }
        }
    }
    if reasons.is_empty() {
        String::new()
    } else {
        format!(" ({})", reasons.join("; "))
    }
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
    fn only_a_refused_nonce_is_retried_at_once() {
        let problem = |kind: &str| {
            let problem: instant_acme::Problem = serde_json::from_value(serde_json::json!({"type": kind, "detail": "x", "status": 400})).unwrap();
            AcmeError::Acme(instant_acme::Error::Api(problem))
        };
        assert!(problem("urn:ietf:params:acme:error:badNonce").is_bad_nonce());
        assert!(!problem("urn:ietf:params:acme:error:rateLimited").is_bad_nonce());
        assert!(!problem("urn:ietf:params:acme:error:unauthorized").is_bad_nonce());
        assert!(!AcmeError::Other("the order for x is Invalid".into()).is_bad_nonce());
    }

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
    fn picks_the_preferred_challenge_then_the_other() {
        use ChallengeType::*;
        assert_eq!(pick_challenge(&[Http01, Dns01, TlsAlpn01], Challenge::TlsAlpn01), Some(Challenge::TlsAlpn01));
        assert_eq!(pick_challenge(&[Http01, Dns01, TlsAlpn01], Challenge::Http01), Some(Challenge::Http01));
        assert_eq!(pick_challenge(&[Dns01, Http01], Challenge::TlsAlpn01), Some(Challenge::Http01));
        assert_eq!(pick_challenge(&[TlsAlpn01], Challenge::Http01), Some(Challenge::TlsAlpn01));
        assert_eq!(pick_challenge(&[Dns01], Challenge::Http01), None);
        assert_eq!(pick_challenge(&[], Challenge::TlsAlpn01), None);
        assert_eq!(challenge_name(&Dns01), "dns-01");
    }

    #[test]
    fn tls_alpn_challenges_are_versioned_and_acknowledged() {
        let acme = Acme::default();
        let empty = acme.tls_alpn_challenges("n-1", None);
        assert!(empty.challenges.is_empty());
        assert_eq!(empty.version, empty_version());
        acme.tls_alpn.write().unwrap().set("a.example.com", Some("t.k".into()));
        let one = acme.tls_alpn_challenges("n-1", Some(&empty.version));
        assert_ne!(one.version, empty.version);
        assert_eq!(one.challenges, vec![TlsAlpnChallenge { host: "a.example.com".into(), key_authorization: "t.k".into() }]);
        assert_eq!(acme.tls_alpn_applied.lock().unwrap().get("n-1"), Some(&empty.version));
        acme.tls_alpn_challenges("n-1", Some(&one.version));
        assert_eq!(acme.tls_alpn_applied.lock().unwrap().get("n-1"), Some(&one.version));
        assert_eq!(acme.tls_alpn_version(), one.version);
        acme.tls_alpn.write().unwrap().set("a.example.com", None);
        assert_eq!(acme.tls_alpn_challenges("n-2", None).version, empty.version, "back to no challenge");
        assert!(!acme.tls_alpn_applied.lock().unwrap().contains_key("n-2"));
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
