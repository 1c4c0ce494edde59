//! Wall-clock time behind a seam, so tests can move it (token expiry). Node
//! liveness never uses this clock: it uses the process's monotonic clock.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use time::OffsetDateTime;

pub trait Clock: Send + Sync + 'static {
    fn now(&self) -> OffsetDateTime;

    fn now_ms(&self) -> i64 {
        (self.now().unix_timestamp_nanos() / 1_000_000) as i64
    }
}

pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> OffsetDateTime {
        OffsetDateTime::now_utc()
    }
}

/// The system clock shifted by an offset a test can change.
#[derive(Clone, Default)]
pub struct ShiftedClock {
    offset_ms: Arc<AtomicI64>,
}

impl ShiftedClock {
    pub fn advance(&self, by: std::time::Duration) {
        self.offset_ms.fetch_add(by.as_millis() as i64, Ordering::SeqCst);
    }
}

impl Clock for ShiftedClock {
    fn now(&self) -> OffsetDateTime {
        OffsetDateTime::now_utc() + time::Duration::milliseconds(self.offset_ms.load(Ordering::SeqCst))
    }
}

/// RFC 3339 text of a Unix-millisecond timestamp.
pub fn rfc3339_ms(ms: i64) -> String {
    let at = OffsetDateTime::from_unix_timestamp_nanos(ms as i128 * 1_000_000).unwrap_or(OffsetDateTime::UNIX_EPOCH);
    at.format(&time::format_description::well_known::Rfc3339).unwrap_or_default()
}

/// Unix milliseconds of an RFC 3339 time, as [`rfc3339_ms`] writes it.
pub fn parse_rfc3339_ms(text: &str) -> Option<i64> {
    let at = OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339).ok()?;
    i64::try_from(at.unix_timestamp_nanos() / 1_000_000).ok()
}
