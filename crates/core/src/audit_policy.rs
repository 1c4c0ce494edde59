//! What the audit log keeps, where it is forwarded, what a failed write
//! does, and how much anonymous traffic it writes one by one: settings and
//! in-memory state, a leaf (the log itself is `access::audit`).

use std::collections::{HashMap, HashSet};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use cloudweb_store::audit::AuditRow;

use crate::forward::{ForwardTarget, Forwarder};

/// What a change does when its audit log entry cannot be written (see
/// `access::audit`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnFailure {
    /// The request is refused with 503.
    Refuse,
    /// The request goes ahead; the failure is logged.
    Warn,
}

impl OnFailure {
    pub fn parse(text: &str) -> Option<OnFailure> {
        match text {
            "refuse" => Some(OnFailure::Refuse),
            "warn" => Some(OnFailure::Warn),
            _ => None,
        }
    }
}

#[derive(Debug, Clone)]
pub struct AuditSettings {
    /// Entries older than this are deleted (the chain's anchor moves).
    pub retention: Duration,
    pub on_failure: OnFailure,
    /// Where every entry is also shipped (`--audit-forward`), if anywhere.
    pub forward: Option<ForwardTarget>,
    /// Anonymous requests (webhooks, logins' public endpoints) written one
    /// by one per minute, in all and per address; past that, refused
    /// ones are counted into one summary entry a minute.
    pub anonymous: AnonymousLimits,
}

impl Default for AuditSettings {
    fn default() -> Self {
        AuditSettings {
            retention: Duration::from_secs(365 * 24 * 3600),
            on_failure: OnFailure::Refuse,
            forward: None,
            anonymous: AnonymousLimits::default(),
        }
    }
}

/// See [`AuditSettings::anonymous`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AnonymousLimits {
    pub per_minute: u32,
    pub per_address_per_minute: u32,
}

impl Default for AnonymousLimits {
    fn default() -> Self {
        AnonymousLimits { per_minute: 120, per_address_per_minute: 20 }
    }
}

/// The audit log's state in memory.
#[derive(Default)]
pub struct AuditRuntime {
    /// Set once at start when `--audit-forward` is given.
    pub forward: OnceLock<Forwarder<AuditRow>>,
    pub anonymous: AnonymousBudget,
}

/// Whether an anonymous request is written one by one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    Write,
    /// Over the minute's budget: written only if it changed something,
    /// else counted into the minute's summary.
    OverBudget,
}

/// What a past minute left unwritten.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Suppressed {
    /// Unix ms of the minute's start.
    pub minute_ms: i64,
    pub requests: u64,
    /// Distinct addresses (counted up to [`MAX_TRACKED`]).
    pub addresses: usize,
    pub limits: AnonymousLimits,
}

/// Addresses tracked in one minute; past it, new addresses share one
/// bucket (memory stays bounded under a spray from many addresses).
pub const MAX_TRACKED: usize = 10_000;

/// Counts anonymous requests per minute (by the clock given).
#[derive(Default)]
pub struct AnonymousBudget {
    window: Mutex<Window>,
}

#[derive(Default)]
struct Window {
    minute_ms: i64,
    written: u32,
    per_address: HashMap<String, u32>,
    suppressed: u64,
    suppressed_from: HashSet<String>,
}

impl AnonymousBudget {
    /// Whether a request from `address` at `now_ms` is written one by one,
    /// and the summary of an earlier minute that had unwritten ones (to
    /// write now).
    pub fn admit(&self, limits: AnonymousLimits, address: &str, now_ms: i64) -> (Admit, Option<Suppressed>) {
        let mut window = self.window.lock().expect("audit budget");
        let summary = roll(&mut window, limits, now_ms);
        let tracked = window.per_address.len() < MAX_TRACKED || window.per_address.contains_key(address);
        let key = if tracked { address.to_string() } else { "*".to_string() };
        let from_here = window.per_address.get(&key).copied().unwrap_or(0);
        if window.written >= limits.per_minute || from_here >= limits.per_address_per_minute {
            return (Admit::OverBudget, summary);
        }
        window.written += 1;
        window.per_address.insert(key, from_here + 1);
        (Admit::Write, summary)
    }

    /// Counts an over-budget request that was not written.
    pub fn suppressed(&self, address: &str) {
        let mut window = self.window.lock().expect("audit budget");
        window.suppressed += 1;
        if window.suppressed_from.len() < MAX_TRACKED {
            window.suppressed_from.insert(address.to_string());
        }
    }

    /// The summary of a finished minute with unwritten requests, if any
    /// is due at `now_ms`.
    pub fn due(&self, limits: AnonymousLimits, now_ms: i64) -> Option<Suppressed> {
        roll(&mut self.window.lock().expect("audit budget"), limits, now_ms)
    }
}

/// Starts a new minute when `now_ms` is past the window's, returning the
/// old one's summary when it left requests unwritten.
fn roll(window: &mut Window, limits: AnonymousLimits, now_ms: i64) -> Option<Suppressed> {
    let minute_ms = now_ms - now_ms.rem_euclid(60_000);
    if minute_ms == window.minute_ms {
        return None;
    }
    let old = std::mem::replace(window, Window { minute_ms, ..Window::default() });
    (old.suppressed > 0).then_some(Suppressed { minute_ms: old.minute_ms, requests: old.suppressed, addresses: old.suppressed_from.len(), limits })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn anonymous_requests_past_the_budget_are_summed_up_once_a_minute() {
        let limits = AnonymousLimits { per_minute: 5, per_address_per_minute: 2 };
        let budget = AnonymousBudget::default();
        // A minute's start (a multiple of 60,000 ms).
        let t0: i64 = 1_800_000_000_000;
        let admit = |address: &str, at: i64| budget.admit(limits, address, at);
        assert_eq!(admit("10.0.0.1", t0), (Admit::Write, None));
        assert_eq!(admit("10.0.0.1", t0 + 1).0, Admit::Write);
        // The address's share is spent; others still have theirs.
        assert_eq!(admit("10.0.0.1", t0 + 2).0, Admit::OverBudget);
        budget.suppressed("10.0.0.1");
        for n in 2..=4 {
            assert_eq!(admit(&format!("10.0.0.{n}"), t0 + 3).0, Admit::Write);
        }
        // The minute's total is spent.
        assert_eq!(admit("10.0.0.9", t0 + 4).0, Admit::OverBudget);
        budget.suppressed("10.0.0.9");
        assert_eq!(budget.due(limits, t0 + 59_999), None, "not before the minute ends");
        // The next minute: a fresh budget, and the last one's summary once.
        let (admit_next, summary) = admit("10.0.0.1", t0 + 60_000);
        assert_eq!(admit_next, Admit::Write);
        assert_eq!(summary, Some(Suppressed { minute_ms: t0, requests: 2, addresses: 2, limits }));
        assert_eq!(budget.due(limits, t0 + 200_000), None, "a quiet minute has nothing to say");
    }
}

