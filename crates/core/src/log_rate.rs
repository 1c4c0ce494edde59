//! The per-app rate limit of runtime logs (issue 26): a token bucket per
//! app, so that a burst from one app is cut at its rate and never starves
//! the others of the store's writes. What is cut is counted and said where
//! it happened, by a note line ("N lines … were dropped"), never lost in
//! silence.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// How often a note is written while an app goes on over its rate.
const NOTE_EVERY: Duration = Duration::from_secs(10);
/// Buckets remembered; past it, the full ones (idle apps) are forgotten.
const MAX_BUCKETS: usize = 10_000;

/// Lines per second an app may store, and the burst it may have saved up.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rate {
    pub per_second: f64,
    pub burst: f64,
}

struct Bucket {
    tokens: f64,
    at: Instant,
    dropped: u64,
    noted_at: Instant,
}

/// What an upload of `n` lines may store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Allowance {
    /// Lines to store (the first ones; the rest are dropped).
    pub lines: usize,
    /// A note is due: this many lines were dropped since the last one.
    pub note: Option<u64>,
}

pub struct RateLimits {
    rate: Rate,
    apps: HashMap<String, Bucket>,
}

impl RateLimits {
    pub fn new(rate: Rate) -> RateLimits {
        RateLimits { rate, apps: HashMap::new() }
    }

    pub fn rate(&self) -> Rate {
        self.rate
    }

    /// Takes up to `n` lines from the app's bucket at `now`.
    pub fn take(&mut self, app: &str, n: usize, now: Instant) -> Allowance {
        if self.apps.len() >= MAX_BUCKETS && !self.apps.contains_key(app) {
            let rate = self.rate;
            self.apps.retain(|_, b| b.dropped > 0 || b.tokens + now.duration_since(b.at).as_secs_f64() * rate.per_second < rate.burst);
        }
        let rate = self.rate;
        let bucket = self.apps.entry(app.to_string()).or_insert(Bucket { tokens: rate.burst, at: now, dropped: 0, noted_at: now });
        let elapsed = now.saturating_duration_since(bucket.at).as_secs_f64();
        bucket.tokens = (bucket.tokens + elapsed * rate.per_second).min(rate.burst);
        bucket.at = now;
        let lines = n.min(bucket.tokens.floor().max(0.0) as usize);
        bucket.tokens -= lines as f64;
        let cut = (n - lines) as u64;
        bucket.dropped += cut;
        let note = if bucket.dropped > 0 && (cut == 0 || now.saturating_duration_since(bucket.noted_at) >= NOTE_EVERY) {
            bucket.noted_at = now;
            Some(std::mem::take(&mut bucket.dropped))
        } else {
            None
        };
        Allowance { lines, note }
    }

    /// Forgets a deleted app.
    pub fn forget(&mut self, app: &str) {
        self.apps.remove(app);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_is_cut_at_the_rate_and_the_cut_is_noted_once() {
        let mut limits = RateLimits::new(Rate { per_second: 100.0, burst: 1000.0 });
        let start = Instant::now();
        // The saved-up burst passes whole.
        assert_eq!(limits.take("web", 1000, start), Allowance { lines: 1000, note: None });
        // Then only what the rate refills.
        let a = limits.take("web", 500, start + Duration::from_secs(1));
        assert_eq!(a, Allowance { lines: 100, note: None });
        // Another app is not touched.
        assert_eq!(limits.take("api", 1000, start + Duration::from_secs(1)).lines, 1000);
        // Back under the rate: everything passes and the cut is noted.
        let b = limits.take("web", 50, start + Duration::from_secs(2));
        assert_eq!(b, Allowance { lines: 50, note: Some(400) });
        assert_eq!(limits.take("web", 10, start + Duration::from_secs(3)).note, None, "noted once");
    }

    #[test]
    fn an_app_that_stays_over_its_rate_is_noted_every_ten_seconds() {
        let mut limits = RateLimits::new(Rate { per_second: 10.0, burst: 10.0 });
        let start = Instant::now();
        let mut notes = Vec::new();
        for second in 0..=25u64 {
            let a = limits.take("web", 100, start + Duration::from_secs(second));
            notes.extend(a.note);
        }
        // Noted at 10 s and 20 s: 90 cut each second.
        assert_eq!(notes, [900 + 90, 900]);
    }
}
