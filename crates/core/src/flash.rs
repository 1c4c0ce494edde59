//! One-shot messages for the next page (the flash), kept in memory per
//! browser session. The session itself is the accounts module's
//! ([`crate::auth::sessions`]); a flash is keyed by the session's id digest
//! and dies with a restart of the control plane, which loses nothing but
//! the message.

use std::collections::HashMap;
use std::sync::Mutex;

/// A flash not shown within this long is dropped.
const TTL_MS: i64 = 10 * 60 * 1000;
/// Flashes kept at most; the oldest go first.
const MAX_FLASHES: usize = 10_000;

/// A message for the next page.
#[derive(Clone, Debug, PartialEq)]
pub enum Flash {
    Done,
    Error(String),
    /// A join token was made: the command to run and when it expires.
    JoinCommand { command: String, expires_at: String },
    /// A drain left apps behind: `(app, reason)`.
    Waiting(Vec<(String, String)>),
}

#[derive(Default)]
pub struct Flashes {
    inner: Mutex<HashMap<String, (Flash, i64)>>,
}

impl Flashes {
    /// Leaves `flash` for session `key`'s next page.
    pub fn put(&self, key: &str, flash: Flash, now_ms: i64) {
        let mut inner = self.inner.lock().expect("flash lock");
        inner.retain(|_, (_, at)| *at + TTL_MS > now_ms);
        if inner.len() >= MAX_FLASHES {
            if let Some(oldest) = inner.iter().min_by_key(|(_, (_, at))| *at).map(|(k, _)| k.clone()) {
                inner.remove(&oldest);
            }
        }
        inner.insert(key.to_string(), (flash, now_ms));
    }

    /// Takes session `key`'s flash out, if one is waiting.
    pub fn take(&self, key: &str, now_ms: i64) -> Option<Flash> {
        let (flash, at) = self.inner.lock().expect("flash lock").remove(key)?;
        (at + TTL_MS > now_ms).then_some(flash)
    }

    /// Drops a session's flash (at logout).
    pub fn forget(&self, key: &str) {
        self.inner.lock().expect("flash lock").remove(key);
    }
}

/// The value of cookie `name` in a `Cookie` header.
pub fn cookie<'a>(header: &'a str, name: &str) -> Option<&'a str> {
    header.split(';').filter_map(|pair| pair.trim().split_once('=')).find(|(k, _)| *k == name).map(|(_, v)| v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flash_shows_once_and_not_too_late() {
        let flashes = Flashes::default();
        assert!(flashes.take("s", 0).is_none());
        flashes.put("s", Flash::Done, 0);
        assert!(flashes.take("other", 1).is_none());
        assert_eq!(flashes.take("s", 1), Some(Flash::Done));
        assert_eq!(flashes.take("s", 2), None);
        flashes.put("s", Flash::Done, 0);
        assert_eq!(flashes.take("s", TTL_MS + 1), None, "a stale flash is dropped");
    }

    #[test]
    fn cookies_are_found_by_exact_name() {
        assert_eq!(cookie("a=1; cw_lang=es; b=2", "cw_lang"), Some("es"));
        assert_eq!(cookie("xcw_lang=es", "cw_lang"), None);
    }
}
