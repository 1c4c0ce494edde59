//! Login attempts, limited in fixed windows on the server's clock:
//!
//! - per account *and address* (`per_account` attempts): past it, that
//!   address gets 429 for that account until the window ends;
//! - per address, whatever the account (`per_address`);
//! - per account from every address together, by delay only: past
//!   `per_account` attempts in the window, each further attempt waits its
//!   turn, 250 ms doubling per attempt up to 3 s, one turn after another,
//!   so guesses from many addresses together get through at most one per
//!   3 s (1,200 an hour). A turn further away than 10 s is a 429 for that
//!   request only. An address this account logged in from before skips
//!   the queue.
//!
//! So knowing a user's name no longer lets anyone lock the user out: the
//! attacker's addresses are limited, the user's own is not, and a new
//! address waits seconds at worst (or logs in through GitLab). Every
//! attempt counts before the password is checked (so parallel guesses
//! cannot slip past a limit); a successful login takes its attempt back
//! and clears its account-and-address count.
//!
//! Memory is bounded: each table holds at most `max_entries` keys; when
//! full, finished windows are dropped first, then the oldest windows.
//! IPv6 addresses count per /64, the block one client usually holds.
//!
//! The counts outlive a restart: every change is returned as
//! [`Change`]s, which the caller writes to the database (table
//! `login_attempts`), and [`LoginLimiter::restore`] loads them at start.
//! Keys go through the limiter's digest (a keyed hash in the server, see
//! [`LoginLimiter::keyed`]), so what is stored is never a typed name, which
//! may be a password typed into the wrong field.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::Duration;

#[derive(Debug, Clone)]
pub struct Limits {
    pub per_account: u32,
    pub per_address: u32,
    pub window: Duration,
    pub max_entries: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { per_account: 5, per_address: 20, window: Duration::from_secs(15 * 60), max_entries: 10_000 }
    }
}

pub use cloudweb_store::login_attempts::{Change, Kind, Window};

/// The first delay past the account's limit, doubled per attempt.
const DELAY_BASE_MS: i64 = 250;
/// The longest delay of one attempt.
const DELAY_CAP_MS: i64 = 3_000;
/// The furthest turn an attempt may be given; later is a 429.
const MAX_WAIT_MS: i64 = 10_000;

/// One account's attempts from every address in its window, and when the
/// next delayed attempt may run. Memory only: a restart forgets it.
#[derive(Debug, Clone, Copy)]
struct Pressure {
    start_ms: i64,
    attempts: u32,
    next_turn_ms: i64,
}

/// An attempt that may go ahead: what to store, and how long it must wait
/// before its password is checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Begun {
    pub changes: Vec<Change>,
    pub wait: Duration,
}

struct Table {
    kind: Kind,
    entries: HashMap<String, Window>,
}

impl Table {
    fn live(&self, key: &str, now_ms: i64, window_ms: i64) -> Option<Window> {
        self.entries.get(key).copied().filter(|w| now_ms < w.start_ms + window_ms)
    }

    fn change(&self, key: &str) -> Change {
        Change { kind: self.kind, key: key.to_string(), window: self.entries.get(key).copied() }
    }

    /// Counts an attempt; the changes, with the keys dropped to make room.
    fn bump(&mut self, key: &str, now_ms: i64, window_ms: i64, max_entries: usize, changes: &mut Vec<Change>) {
        match self.live(key, now_ms, window_ms) {
            Some(_) => {
                if let Some(w) = self.entries.get_mut(key) {
                    w.attempts += 1;
                }
            }
            None => {
                if !self.entries.contains_key(key) && self.entries.len() >= max_entries {
                    let kind = self.kind;
                    self.entries.retain(|key, w| {
                        let live = now_ms < w.start_ms + window_ms;
                        if !live {
                            changes.push(Change { kind, key: key.clone(), window: None });
                        }
                        live
                    });
                    while self.entries.len() >= max_entries {
                        let Some(oldest) = self.entries.iter().min_by_key(|(_, w)| w.start_ms).map(|(k, _)| k.clone()) else { break };
                        self.entries.remove(&oldest);
                        changes.push(Change { kind, key: oldest, window: None });
                    }
                }
                self.entries.insert(key.to_string(), Window { start_ms: now_ms, attempts: 1 });
            }
        }
        changes.push(self.change(key));
    }

    fn take_back(&mut self, key: &str) -> Option<Change> {
        let w = self.entries.get_mut(key)?;
        w.attempts = w.attempts.saturating_sub(1);
        Some(self.change(key))
    }
}

pub struct LoginLimiter {
    limits: Limits,
    /// (account and address, address), stored.
    inner: Mutex<(Table, Table)>,
    /// Per account (digest): the delay queue. Per account and address
    /// (digest): when it last logged in. Memory only, bounded.
    pressure: Mutex<(HashMap<String, Pressure>, HashMap<String, i64>)>,
    /// Turns a key (an account name in lower case, an address key) into
    /// the key that is kept and stored.
    digest: Digest,
}

/// What [`LoginLimiter::keyed`] keeps keys as.
type Digest = Box<dyn Fn(Kind, &str) -> String + Send + Sync>;

/// Past a limit: try again after this many seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryAfter(pub u64);

/// The key an address counts under.
fn address_key(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(v4) => v4.to_string(),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => v4.to_string(),
            None => {
                let s = v6.segments();
                format!("{:x}:{:x}:{:x}:{:x}::/64", s[0], s[1], s[2], s[3])
            }
        },
    }
}

impl LoginLimiter {
    /// A limiter that keeps keys as they are (names in lower case).
    pub fn new(limits: Limits) -> LoginLimiter {
        LoginLimiter::keyed(limits, |_, key| key.to_string())
    }

    /// A limiter that keeps (and hands out for storing) `digest(kind, key)`
    /// instead of each key.
    pub fn keyed(limits: Limits, digest: impl Fn(Kind, &str) -> String + Send + Sync + 'static) -> LoginLimiter {
        let tables = (Table { kind: Kind::Account, entries: HashMap::new() }, Table { kind: Kind::Address, entries: HashMap::new() });
        LoginLimiter { limits, inner: Mutex::new(tables), pressure: Mutex::new(Default::default()), digest: Box::new(digest) }
    }

    /// (account, account and address, address) keys. Without an address
    /// the pair is the account alone.
    fn keys(&self, account: &str, address: Option<IpAddr>) -> (String, String, Option<String>) {
        let name = account.to_ascii_lowercase();
        let pair = match address {
            Some(a) => (self.digest)(Kind::Account, &format!("{name}\u{0}{}", address_key(a))),
            None => (self.digest)(Kind::Account, &name),
        };
        let account = (self.digest)(Kind::Account, &name);
        let address = address.map(|a| (self.digest)(Kind::Address, &address_key(a)));
        (account, pair, address)
    }

    /// The account's queue: the wait of an attempt now (0 below the
    /// limit or from a known address), counting it, or the 429 when its
    /// turn is too far away (then nothing is counted).
    fn queue(&self, account: &str, pair: &str, now_ms: i64) -> Result<i64, RetryAfter> {
        let window_ms = self.window_ms();
        let mut guard = self.pressure.lock().expect("login pressure lock");
        let (accounts, known) = &mut *guard;
        let known = known.contains_key(pair);
        let live = accounts.get(account).copied().filter(|p| now_ms < p.start_ms + window_ms);
        let mut p = live.unwrap_or(Pressure { start_ms: now_ms, attempts: 0, next_turn_ms: now_ms });
        let over = (p.attempts + 1).saturating_sub(self.limits.per_account);
        let wait = if known || over == 0 {
            0
        } else {
            let delay = (DELAY_BASE_MS << (over - 1).min(8)).min(DELAY_CAP_MS);
            let turn = p.next_turn_ms.max(now_ms) + delay;
            if turn - now_ms > MAX_WAIT_MS {
                return Err(RetryAfter(((turn - now_ms) as u64).div_ceil(1000)));
            }
            p.next_turn_ms = turn;
            turn - now_ms
        };
        p.attempts += 1;
        if live.is_none() && accounts.len() >= self.limits.max_entries {
            accounts.retain(|_, q| now_ms < q.start_ms + window_ms);
            if accounts.len() >= self.limits.max_entries {
                if let Some(oldest) = accounts.iter().min_by_key(|(_, q)| q.start_ms).map(|(k, _)| k.clone()) {
                    accounts.remove(&oldest);
                }
            }
        }
        accounts.insert(account.to_string(), p);
        Ok(wait)
    }

    /// How long a window lasts, in ms: stored windows that started before
    /// `now - window_ms` are over.
    pub fn window_ms(&self) -> i64 {
        self.limits.window.as_millis() as i64
    }

    /// Loads stored windows (at start): those still running at `now_ms`,
    /// up to the bound of each table.
    pub fn restore(&self, stored: impl IntoIterator<Item = Change>, now_ms: i64) {
        let window_ms = self.window_ms();
        let mut guard = self.inner.lock().expect("login limiter lock");
        let (accounts, addresses) = &mut *guard;
        for change in stored {
            let Some(window) = change.window.filter(|w| now_ms < w.start_ms + window_ms) else { continue };
            let table = match change.kind {
                Kind::Account => &mut *accounts,
                Kind::Address => &mut *addresses,
            };
            if table.entries.len() < self.limits.max_entries || table.entries.contains_key(&change.key) {
                table.entries.insert(change.key, window);
            }
        }
    }

    /// The stored keys an attempt for `account` from `address` counts
    /// under (account and address, address), to read before
    /// [`LoginLimiter::begin`] when other replicas count too.
    pub fn stored_keys(&self, account: &str, address: Option<IpAddr>) -> Vec<(Kind, String)> {
        let (_, pair, address) = self.keys(account, address);
        let mut keys = vec![(Kind::Account, pair)];
        keys.extend(address.map(|a| (Kind::Address, a)));
        keys
    }

    /// Takes windows other replicas stored: a stored window replaces the
    /// one held here when it started later (a success elsewhere stores a
    /// new, empty window), or counts more attempts in the same window, so
    /// that attempts on every replica count against one limit. A key the
    /// store does not have changes nothing here: an attempt on this replica
    /// not stored yet (or not stored at all, a full disk) still counts.
    pub fn merge(&self, asked: &[(Kind, String)], stored: &[Change], now_ms: i64) {
        let window_ms = self.window_ms();
        let mut guard = self.inner.lock().expect("login limiter lock");
        let (pairs, addresses) = &mut *guard;
        for (kind, key) in asked {
            let table = match kind {
                Kind::Account => &mut *pairs,
                Kind::Address => &mut *addresses,
            };
            let theirs = stored.iter().find(|c| c.kind == *kind && c.key == *key).and_then(|c| c.window).filter(|w| now_ms < w.start_ms + window_ms);
            match (theirs, table.entries.get(key).copied()) {
                (None, _) => {}
                (Some(w), Some(ours)) if ours.start_ms > w.start_ms || (ours.start_ms == w.start_ms && ours.attempts >= w.attempts) => {}
                (Some(w), held) => {
                    if held.is_some() || table.entries.len() < self.limits.max_entries {
                        table.entries.insert(key.clone(), w);
                    }
                }
            }
        }
    }

    /// Counts an attempt for `account` from `address` (returning what
    /// changed, to store, and how long to wait before checking the
    /// password), or says when to come back if a limit is reached (then
    /// nothing is counted).
    pub fn begin(&self, account: &str, address: Option<IpAddr>, now_ms: i64) -> Result<Begun, RetryAfter> {
        let window_ms = self.window_ms();
        let (account, pair, address) = self.keys(account, address);
        let mut guard = self.inner.lock().expect("login limiter lock");
        let (pairs, addresses) = &mut *guard;
        let mut retry_at = None;
        if let Some(w) = pairs.live(&pair, now_ms, window_ms).filter(|w| w.attempts >= self.limits.per_account) {
            retry_at = Some(w.start_ms + window_ms);
        }
        if let Some(w) = address.as_deref().and_then(|a| addresses.live(a, now_ms, window_ms)).filter(|w| w.attempts >= self.limits.per_address) {
            retry_at = Some(retry_at.unwrap_or(0).max(w.start_ms + window_ms));
        }
        if let Some(at) = retry_at {
            return Err(RetryAfter(((at - now_ms).max(0) as u64).div_ceil(1000).max(1)));
        }
        let wait = self.queue(&account, &pair, now_ms)?;
        let mut changes = Vec::new();
        pairs.bump(&pair, now_ms, window_ms, self.limits.max_entries, &mut changes);
        if let Some(a) = &address {
            addresses.bump(a, now_ms, window_ms, self.limits.max_entries, &mut changes);
        }
        Ok(Begun { changes, wait: Duration::from_millis(wait as u64) })
    }

    /// The attempt begun for `account` from `address` succeeded; returns
    /// what changed, to store. The address is known for the account from
    /// now on (it skips the account's queue).
    pub fn succeeded(&self, account: &str, address: Option<IpAddr>, now_ms: i64) -> Vec<Change> {
        let (account, pair, address) = self.keys(account, address);
        {
            let mut guard = self.pressure.lock().expect("login pressure lock");
            let (accounts, known) = &mut *guard;
            if let Some(p) = accounts.get_mut(&account) {
                p.attempts = p.attempts.saturating_sub(1);
            }
            if !known.contains_key(&pair) && known.len() >= self.limits.max_entries {
                if let Some(oldest) = known.iter().min_by_key(|(_, at)| **at).map(|(k, _)| k.clone()) {
                    known.remove(&oldest);
                }
            }
            known.insert(pair.clone(), now_ms);
        }
        let mut guard = self.inner.lock().expect("login limiter lock");
        let (pairs, addresses) = &mut *guard;
        // An empty window from now rather than none: stored, it tells the
        // other replicas the count was cleared (see `merge`).
        let cleared = Window { start_ms: now_ms, attempts: 0 };
        if pairs.entries.contains_key(&pair) || pairs.entries.len() < self.limits.max_entries {
            pairs.entries.insert(pair.clone(), cleared);
        }
        let mut changes = vec![Change { kind: Kind::Account, key: pair, window: Some(cleared) }];
        changes.extend(address.and_then(|a| addresses.take_back(&a)));
        changes
    }

    /// Keys held now (accounts, addresses), for tests of the bound.
    pub fn sizes(&self) -> (usize, usize) {
        let guard = self.inner.lock().expect("login limiter lock");
        (guard.0.entries.len(), guard.1.entries.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limiter() -> LoginLimiter {
        LoginLimiter::new(Limits { per_account: 3, per_address: 5, window: Duration::from_secs(60), max_entries: 4 })
    }

    #[test]
    fn an_account_is_limited_until_its_window_ends() {
        let l = limiter();
        let ip: IpAddr = "192.0.2.1".parse().unwrap();
        for _ in 0..3 {
            assert!(l.begin("Alice", Some(ip), 1_000).is_ok());
        }
        assert_eq!(l.begin("alice", Some(ip), 2_000), Err(RetryAfter(59)));
        // Another address for the same account is not refused: it waits
        // its turn in the account's queue.
        let other = l.begin("alice", Some("192.0.2.2".parse().unwrap()), 2_000).unwrap();
        assert_eq!(other.wait, Duration::from_millis(250));
        assert!(l.begin("alice", Some(ip), 61_000).is_ok(), "a new window");
    }

    #[test]
    fn an_address_is_limited_across_accounts_and_ipv6_counts_per_64() {
        let l = LoginLimiter::new(Limits { per_account: 100, per_address: 2, window: Duration::from_secs(60), max_entries: 100 });
        assert!(l.begin("a", Some("2001:db8::1".parse().unwrap()), 0).is_ok());
        assert!(l.begin("b", Some("2001:db8::2".parse().unwrap()), 0).is_ok());
        assert!(l.begin("c", Some("2001:db8::ffff".parse().unwrap()), 0).is_err());
        assert!(l.begin("c", Some("2001:db8:0:1::1".parse().unwrap()), 0).is_ok(), "another /64");
    }

    #[test]
    fn success_clears_the_account_and_takes_the_attempt_back() {
        let l = limiter();
        let ip: IpAddr = "192.0.2.1".parse().unwrap();
        for _ in 0..2 {
            l.begin("bob", Some(ip), 0).unwrap();
        }
        l.begin("bob", Some(ip), 0).unwrap();
        l.succeeded("bob", Some(ip), 0);
        for _ in 0..3 {
            assert!(l.begin("bob", Some(ip), 0).is_ok());
        }
    }

    #[test]
    fn counts_survive_a_restart_through_the_changes() {
        let digest = |kind: Kind, key: &str| format!("{}:{}", kind.as_str(), key.len());
        let first = LoginLimiter::keyed(Limits { per_account: 3, per_address: 5, window: Duration::from_secs(60), max_entries: 4 }, digest);
        let ip: IpAddr = "192.0.2.1".parse().unwrap();
        // The stored rows: the newest change of each key wins.
        let mut stored: HashMap<(&str, String), Change> = HashMap::new();
        for _ in 0..3 {
            for change in first.begin("Carol", Some(ip), 1_000).unwrap().changes {
                assert!(!change.key.contains("carol"), "keys go through the digest: {change:?}");
                stored.insert((change.kind.as_str(), change.key.clone()), change);
            }
        }
        assert_eq!(stored.len(), 2);
        let second = LoginLimiter::keyed(Limits { per_account: 3, per_address: 5, window: Duration::from_secs(60), max_entries: 4 }, digest);
        second.restore(stored.values().cloned(), 2_000);
        assert_eq!(second.begin("carol", Some(ip), 2_000), Err(RetryAfter(59)), "still limited after the restart");
        // Windows that are over are not restored.
        let third = LoginLimiter::keyed(Limits { per_account: 3, per_address: 5, window: Duration::from_secs(60), max_entries: 4 }, digest);
        third.restore(stored.values().cloned(), 61_000);
        assert_eq!(third.sizes(), (0, 0));
        // A success is stored as the account dropped and the address's
        // attempt taken back.
        let changes = second.succeeded("carol", Some(ip), 2_000);
        assert_eq!(changes[0].window, Some(Window { start_ms: 2_000, attempts: 0 }), "cleared, as an empty window");
        assert_eq!(changes[1].window.map(|w| w.attempts), Some(2));
    }

    #[test]
    fn many_addresses_get_one_delayed_turn_after_another_and_the_user_is_not_locked_out() {
        let l = LoginLimiter::new(Limits { per_account: 5, per_address: 20, window: Duration::from_secs(900), max_entries: 1000 });
        let home: IpAddr = "198.51.100.7".parse().unwrap();
        l.begin("dana", Some(home), 0).unwrap();
        l.succeeded("dana", Some(home), 0);
        // 20 addresses, 5 guesses each, all at once.
        let mut waits = Vec::new();
        let mut refused = 0;
        for a in 0..20u8 {
            for _ in 0..5 {
                match l.begin("dana", Some(IpAddr::from([203, 0, 113, a])), 1_000) {
                    Ok(begun) => waits.push(begun.wait.as_millis() as i64),
                    Err(_) => refused += 1,
                }
            }
            // A sixth from the same address is refused for that address only.
            assert!(l.begin("dana", Some(IpAddr::from([203, 0, 113, a])), 1_000).is_err());
        }
        // The first five went at once, then turns 250, 500, 1000, 2000,
        // 3000, 3000 ms apart, until the queue is 10 s long.
        assert_eq!(&waits[..5], &[0, 0, 0, 0, 0]);
        assert_eq!(&waits[5..9], &[250, 750, 1750, 3750]);
        assert!(waits.iter().all(|w| *w <= MAX_WAIT_MS), "{waits:?}");
        assert!(refused > 0, "the queue is bounded");
        // The user's own address goes at once, even now.
        let own = l.begin("dana", Some(home), 1_000).unwrap();
        assert_eq!(own.wait, Duration::ZERO);
        // A new address of the user's waits its turn, at most 10 s, or is
        // told when to come back.
        match l.begin("dana", Some("198.51.100.8".parse().unwrap()), 1_000) {
            Ok(begun) => assert!(begun.wait <= Duration::from_millis(MAX_WAIT_MS as u64)),
            Err(RetryAfter(s)) => assert!(s <= 14, "{s}"),
        }
        // Sustained, the account takes one guess per 3 s from everywhere.
        assert_eq!(3_600_000 / DELAY_CAP_MS, 1_200);
    }

    #[test]
    fn replicas_that_share_their_stored_windows_count_against_one_limit() {
        let limits = Limits { per_account: 4, per_address: 100, window: Duration::from_secs(60), max_entries: 100 };
        let replicas = [LoginLimiter::new(limits.clone()), LoginLimiter::new(limits)];
        let ip: IpAddr = "192.0.2.9".parse().unwrap();
        // The database: the newest change of each key wins.
        let mut stored: HashMap<(Kind, String), Change> = HashMap::new();
        let attempt = |replica: &LoginLimiter, now_ms: i64, stored: &mut HashMap<(Kind, String), Change>| {
            let keys = replica.stored_keys("erin", Some(ip));
            let rows: Vec<Change> = stored.values().cloned().collect();
            replica.merge(&keys, &rows, now_ms);
            let begun = replica.begin("erin", Some(ip), now_ms)?;
            for change in begun.changes {
                stored.insert((change.kind, change.key.clone()), change);
            }
            Ok::<(), RetryAfter>(())
        };
        // Alternating between the replicas, the fifth attempt is refused:
        // without sharing, each would allow four.
        for n in 0..4 {
            attempt(&replicas[n % 2], 1_000, &mut stored).unwrap();
        }
        assert!(attempt(&replicas[0], 1_000, &mut stored).is_err());
        assert!(attempt(&replicas[1], 1_000, &mut stored).is_err());
        // A success on one replica clears the account for the other too.
        for change in replicas[0].succeeded("erin", Some(ip), 2_000) {
            match change.window {
                Some(_) => stored.insert((change.kind, change.key.clone()), change),
                None => stored.remove(&(change.kind, change.key.clone())),
            };
        }
        attempt(&replicas[1], 2_000, &mut stored).unwrap();
        // An attempt this replica could not store (or not yet) still
        // counts here: a store without the key resets nothing.
        let lone = LoginLimiter::new(Limits { per_account: 2, per_address: 100, window: Duration::from_secs(60), max_entries: 100 });
        let keys = lone.stored_keys("finn", Some(ip));
        for _ in 0..2 {
            lone.merge(&keys, &[], 3_000);
            lone.begin("finn", Some(ip), 3_000).unwrap();
        }
        lone.merge(&keys, &[], 3_000);
        assert!(lone.begin("finn", Some(ip), 3_000).is_err(), "the unstored attempts count");
    }

    #[test]
    fn memory_stays_bounded() {
        let l = limiter();
        let mut dropped = 0;
        for i in 0..1000 {
            if let Ok(begun) = l.begin(&format!("user{i}"), Some(IpAddr::from([10, 0, (i / 256) as u8, (i % 256) as u8])), i) {
                dropped += begun.changes.iter().filter(|c| c.window.is_none()).count();
            }
        }
        assert!(dropped >= 2 * (1000 - 4), "the keys dropped for room are reported, to be deleted from the store: {dropped}");
        let (accounts, addresses) = l.sizes();
        assert!(accounts <= 4 && addresses <= 4, "{accounts} {addresses}");
    }
}
