//! Login attempts, limited per account and per address in fixed windows
//! on the server's clock. Every attempt counts against both before the
//! password is checked (so parallel guesses cannot slip past the limit);
//! a successful login takes its attempt back and clears the account's
//! count. Past a limit the answer is 429 with `Retry-After`, whatever the
//! password, until the window ends.
//!
//! Memory is bounded: each table holds at most `max_entries` keys; when
//! full, finished windows are dropped first, then the oldest windows.
//! IPv6 addresses count per /64, the block one client usually holds.

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

#[derive(Debug, Clone, Copy)]
struct Window {
    start_ms: i64,
    attempts: u32,
}

struct Table {
    entries: HashMap<String, Window>,
}

impl Table {
    fn live(&self, key: &str, now_ms: i64, window_ms: i64) -> Option<Window> {
        self.entries.get(key).copied().filter(|w| now_ms < w.start_ms + window_ms)
    }

    fn bump(&mut self, key: &str, now_ms: i64, window_ms: i64, max_entries: usize) {
        match self.live(key, now_ms, window_ms) {
            Some(_) => {
                if let Some(w) = self.entries.get_mut(key) {
                    w.attempts += 1;
                }
            }
            None => {
                if !self.entries.contains_key(key) && self.entries.len() >= max_entries {
                    self.entries.retain(|_, w| now_ms < w.start_ms + window_ms);
                    while self.entries.len() >= max_entries {
                        let Some(oldest) = self.entries.iter().min_by_key(|(_, w)| w.start_ms).map(|(k, _)| k.clone()) else { break };
                        self.entries.remove(&oldest);
                    }
                }
                self.entries.insert(key.to_string(), Window { start_ms: now_ms, attempts: 1 });
            }
        }
    }

    fn take_back(&mut self, key: &str) {
        if let Some(w) = self.entries.get_mut(key) {
            w.attempts = w.attempts.saturating_sub(1);
        }
    }
}

pub struct LoginLimiter {
    limits: Limits,
    inner: Mutex<(Table, Table)>,
}

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
    pub fn new(limits: Limits) -> LoginLimiter {
        LoginLimiter { limits, inner: Mutex::new((Table { entries: HashMap::new() }, Table { entries: HashMap::new() })) }
    }

    /// Counts an attempt for `account` from `address`, or says when to come
    /// back if either is over its limit (then nothing is counted).
    pub fn begin(&self, account: &str, address: Option<IpAddr>, now_ms: i64) -> Result<(), RetryAfter> {
        let window_ms = self.limits.window.as_millis() as i64;
        let account = account.to_ascii_lowercase();
        let address = address.map(address_key);
        let mut guard = self.inner.lock().expect("login limiter lock");
        let (accounts, addresses) = &mut *guard;
        let mut retry_at = None;
        if let Some(w) = accounts.live(&account, now_ms, window_ms).filter(|w| w.attempts >= self.limits.per_account) {
            retry_at = Some(w.start_ms + window_ms);
        }
        if let Some(w) = address.as_deref().and_then(|a| addresses.live(a, now_ms, window_ms)).filter(|w| w.attempts >= self.limits.per_address) {
            retry_at = Some(retry_at.unwrap_or(0).max(w.start_ms + window_ms));
        }
        if let Some(at) = retry_at {
            return Err(RetryAfter(((at - now_ms).max(0) as u64).div_ceil(1000).max(1)));
        }
        accounts.bump(&account, now_ms, window_ms, self.limits.max_entries);
        if let Some(a) = &address {
            addresses.bump(a, now_ms, window_ms, self.limits.max_entries);
        }
        Ok(())
    }

    /// The attempt begun for `account` from `address` succeeded.
    pub fn succeeded(&self, account: &str, address: Option<IpAddr>) {
        let mut guard = self.inner.lock().expect("login limiter lock");
        let (accounts, addresses) = &mut *guard;
        accounts.entries.remove(&account.to_ascii_lowercase());
        if let Some(a) = address.map(address_key) {
            addresses.take_back(&a);
        }
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
        // Another address for the same account is refused too.
        assert!(l.begin("alice", Some("192.0.2.2".parse().unwrap()), 2_000).is_err());
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
        l.succeeded("bob", Some(ip));
        for _ in 0..3 {
            assert!(l.begin("bob", Some(ip), 0).is_ok());
        }
    }

    #[test]
    fn memory_stays_bounded() {
        let l = limiter();
        for i in 0..1000 {
            let _ = l.begin(&format!("user{i}"), Some(IpAddr::from([10, 0, (i / 256) as u8, (i % 256) as u8])), i);
        }
        let (accounts, addresses) = l.sizes();
        assert!(accounts <= 4 && addresses <= 4, "{accounts} {addresses}");
    }
}
