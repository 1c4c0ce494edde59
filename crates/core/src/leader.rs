//! Which control-plane replica runs the loops that must run once: the
//! reconciler, the volume-move, service and backup watchers, the control
//! plane's own backups, ACME orders and renewals, and the git status and
//! token loops.
//!
//! On SQLite there is one control plane and it always leads. On
//! PostgreSQL every replica tries to hold the lease (`leader_lease`, in
//! the database's clock) and renews it every quarter of its length; the
//! one that holds it runs the loops inside [`fence::scope`] with its
//! term's token, so their write transactions are refused once the term has
//! ended. A leader stops its loops at once when a renewal fails (the
//! database unreachable), is refused, or comes later than the lease (a
//! process frozen and thawed); a renewal that is only slow keeps it
//! leading while the lease it was granted last still runs;
//! another replica takes over once the lease expired, within the lease and
//! a quarter of it.
//!
//! Only the leader serves the agent protocol: a follower answers agents
//! 503 and names the leader, so the replica that judges nodes' liveness is
//! the one they heartbeat. A follower mirrors the nodes from the database
//! for its user API and dashboard (see [`crate::follower`]).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use cloudweb_store::leader_lease::fence;
use cloudweb_store::Engine;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::AppState;

/// One of the loops only the leader runs.
pub type Loop = fn(Arc<AppState>) -> Pin<Box<dyn Future<Output = ()> + Send>>;

/// This replica's standing, for `/metrics` and the status API.
#[derive(Debug)]
pub struct Leadership {
    /// This replica's name in the lease: its public URL and a random part
    /// of this process's own, so a restarted replica starts a new term.
    pub holder: String,
    leading: AtomicBool,
    /// When the lease granted last may have run out (the claim's send
    /// time plus most of the lease): past it this replica does not count
    /// as leading, whatever its loop is doing. `None` on SQLite.
    deadline: std::sync::Mutex<Option<Instant>>,
    token: AtomicI64,
    /// The public URL of the replica that leads, as last read by a
    /// follower.
    leader_url: std::sync::Mutex<Option<String>>,
    /// The replicas' URLs as last read, the leader's first (empty on
    /// SQLite and with a single replica).
    control_planes: std::sync::Mutex<Vec<String>>,
    /// This replica's public URL.
    url: String,
}

impl Leadership {
    pub fn new(public_url: &str) -> Leadership {
        let nonce: u32 = rand::random();
        Leadership {
            holder: format!("{public_url}#{nonce:08x}"),
            leading: AtomicBool::new(false),
            deadline: Default::default(),
            token: AtomicI64::new(0),
            leader_url: Default::default(),
            control_planes: Default::default(),
            url: public_url.to_string(),
        }
    }

    /// Whether this replica runs the leader's loops now.
    pub fn is_leading(&self) -> bool {
        self.leading.load(Ordering::Relaxed) && self.deadline.lock().expect("deadline lock").is_none_or(|until| Instant::now() < until)
    }

    /// The fencing token of the term this replica leads, 0 when it does
    /// not (and on SQLite, where there are no terms).
    pub fn token(&self) -> i64 {
        self.token.load(Ordering::Relaxed)
    }

    /// The public URL of the replica that leads, when another one does.
    pub fn leader_url(&self) -> Option<String> {
        self.leader_url.lock().expect("leader url lock").clone()
    }

    /// This replica's public URL, as the others and the agents know it.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The replicas' URLs for agents, the leader's first; empty unless
    /// there are several.
    pub fn control_planes(&self) -> Vec<String> {
        self.control_planes.lock().expect("control planes lock").clone()
    }

    fn set(&self, token: Option<i64>) {
        self.token.store(token.unwrap_or(0), Ordering::Relaxed);
        self.leading.store(token.is_some(), Ordering::Relaxed);
    }

    /// A renewal succeeded: the lease runs until `until` at least.
    fn extend(&self, until: Instant) {
        *self.deadline.lock().expect("deadline lock") = Some(until);
    }
}

/// Aborts the loops when dropped (a lost term, a stopped server).
struct Running(Vec<JoinHandle<()>>);

impl Drop for Running {
    fn drop(&mut self) {
        for task in &self.0 {
            task.abort();
        }
    }
}

fn start(state: &Arc<AppState>, loops: &[Loop], term: Option<fence::Term>) -> Running {
    Running(
        loops
            .iter()
            .map(|run| {
                let future = run(state.clone());
                match term.clone() {
                    Some(term) => tokio::spawn(fence::scope(term, future)),
                    None => tokio::spawn(future),
                }
            })
            .collect(),
    )
}

/// Runs `loops` while this replica leads; never returns (abort it to stop,
/// which stops the loops too). `first` is told once the first claim of the
/// lease was answered (or failed), so the listeners open knowing whether
/// this replica leads.
pub async fn run(state: Arc<AppState>, loops: Vec<Loop>, first: tokio::sync::oneshot::Sender<()>) {
    let mut first = Some(first);
    if state.store.engine() == Engine::Sqlite {
        state.leader.set(Some(0));
        let _running = start(&state, &loops, None);
        let _ = first.take().map(|tell| tell.send(()));
        return std::future::pending().await;
    }
    let lease = state.config.leader_lease;
    let ttl_ms = i64::try_from(lease.as_millis()).unwrap_or(i64::MAX);
    let every = lease / 4;
    let holder = state.leader.holder.clone();
    let mut running: Option<(i64, Running)> = None;
    let mut last_renewal = Instant::now();
    let mut last_mirror: Option<Instant> = None;
    loop {
        // A term whose last renewal is older than the lease may already
        // belong to another replica (this process was frozen): stop first.
        if running.is_some() && last_renewal.elapsed() >= lease {
            step_down(&state, &mut running, "its last lease renewal is older than the lease (the process was stalled)");
        }
        // The lease the database grants runs from when it ran the claim,
        // which is after this instant: counting from here errs on the safe
        // side.
        let tried = Instant::now();
        let attempt = tokio::time::timeout(every.max(Duration::from_millis(500)), state.store.claim_lease(&holder, &state.leader.url, ttl_ms)).await;
        match attempt {
            Ok(Ok(Some(token))) => {
                last_renewal = tried;
                // The database's lease runs from when it ran the claim
                // (after `tried`); a sixteenth of it is the margin for the
                // two clocks' rates.
                state.leader.extend(tried + lease - lease / 16);
                if running.as_ref().map(|(held, _)| *held) != Some(token) {
                    step_down(&state, &mut running, "a new term began");
                    // Nodes joined or removed through the replica that led
                    // before are in the database, not in this memory.
                    match state.store.nodes().await {
                        Ok(rows) => state.nodes.replace_all(&rows, Instant::now()),
                        Err(err) => tracing::warn!(error = %err, "cannot reload the nodes at the start of a term; using those known so far"),
                    }
                    let term = fence::Term { holder: holder.clone(), token };
                    running = Some((token, start(&state, &loops, Some(term))));
                    state.leader.set(Some(token));
                    tracing::info!(holder = %holder, term = token, "this control plane leads now");
                }
            }
            Ok(Ok(None)) => {
                step_down(&state, &mut running, "another replica holds the lease");
                if let Ok(Ok(Some(lease))) = tokio::time::timeout(every, state.store.lease()).await {
                    let url = lease.holder.rsplit_once('#').map(|(url, _)| url.to_string()).unwrap_or(lease.holder);
                    *state.leader.leader_url.lock().expect("leader url lock") = Some(url);
                }
                // Heartbeats reach the leader only: take the nodes as it
                // wrote them (see `follower`), no more often than it writes.
                if last_mirror.is_none_or(|at: Instant| at.elapsed() >= state.config.heartbeat_flush_interval) {
                    if tokio::time::timeout(every.max(Duration::from_secs(1)), crate::follower::mirror_nodes(&state)).await.is_err() {
                        tracing::warn!("mirroring the nodes from the database did not finish in time");
                    }
                    last_mirror = Some(Instant::now());
                }
            }
            Ok(Err(err)) => {
                tracing::warn!(error = %err, "cannot renew the leader's lease");
                step_down(&state, &mut running, "the database refused or failed the lease renewal");
            }
            // Slow, not failed (a loaded host): the lease granted last
            // still runs, so a leader goes on while the next renewal (a
            // sleep and a claim, each at most a quarter of the lease) can
            // still come in time; `is_leading` ends at the lease's end
            // whatever happens to this loop. Stepping down at the first slow
            // answer made a busy leader turn its agents away and take the
            // lead again a moment later.
            Err(_) if running.is_some() && last_renewal.elapsed() + 2 * every < lease => {
                tracing::warn!(elapsed_ms = last_renewal.elapsed().as_millis() as u64, "the lease renewal is slow; still within the lease");
            }
            Err(_) => step_down(&state, &mut running, "the lease renewal did not finish in time"),
        }
        // Seen within three renewals: alive.
        if let Ok(Ok(urls)) = tokio::time::timeout(every, state.store.control_planes(ttl_ms.saturating_mul(3) / 4)).await {
            let urls = if urls.len() > 1 { urls } else { Vec::new() };
            *state.leader.control_planes.lock().expect("control planes lock") = urls;
        }
        let _ = first.take().map(|tell| tell.send(()));
        // A follower mirrors the nodes each flush interval, also under a
        // long lease.
        let pause = if running.is_some() { every } else { every.min(state.config.heartbeat_flush_interval) };
        tokio::time::sleep(pause).await;
    }
}

fn step_down(state: &AppState, running: &mut Option<(i64, Running)>, why: &str) {
    if let Some((token, loops)) = running.take() {
        drop(loops);
        state.leader.set(None);
        tracing::warn!(term = token, reason = why, "this control plane stopped leading");
    }
}
