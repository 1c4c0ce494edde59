//! One-shot messages for the next page (the flash), per browser session.
//! The session itself is the accounts module's ([`crate::auth::sessions`]);
//! a flash is keyed by the session's id digest and kept in the database
//! (`one_shot_values`, sealed: a join command holds a token), so the page
//! after a form shows it whichever control-plane replica answers it. A
//! flash that cannot be stored or read is lost, and nothing else: the
//! action it reports is done either way.

use serde::{Deserialize, Serialize};

use crate::store::one_shot::{Bounds, WhenFull};
use crate::AppState;

/// A flash not shown within this long is dropped.
const TTL_MS: i64 = 10 * 60 * 1000;
/// Flashes kept at most; the oldest go first.
const BOUNDS: Bounds = Bounds { lifetime_ms: TTL_MS, max: 10_000, when_full: WhenFull::DropOldest };
const KIND: &str = "flash";

/// A message for the next page.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Flash {
    Done,
    Error(String),
    /// A join token was made: the command to run and when it expires.
    JoinCommand { command: String, expires_at: String },
    /// A drain left apps behind: `(app, reason)`.
    Waiting(Vec<(String, String)>),
}

fn context(key: &str) -> String {
    format!("flash:{key}")
}

/// Leaves `flash` for session `key`'s next page.
pub async fn put(state: &AppState, key: &str, flash: Flash) {
    let sealed = state.sealer.seal_json(&context(key), &flash);
    if let Err(err) = state.store.put_one_shot(KIND, key, &sealed, state.clock.now_ms(), BOUNDS).await {
        tracing::warn!(error = %err, "cannot keep the message for the next page");
    }
}

/// Takes session `key`'s flash out, if one is waiting (a read only, when
/// none is).
pub async fn take(state: &AppState, key: &str) -> Option<Flash> {
    if !state.store.has_one_shot(KIND, key).await.ok()? {
        return None;
    }
    let sealed = state.store.take_one_shot(KIND, key, state.clock.now_ms(), TTL_MS).await.ok()??;
    state.sealer.open_json(&context(key), &sealed).ok()
}

/// Drops a session's flash (at logout).
pub async fn forget(state: &AppState, key: &str) {
    if let Err(err) = state.store.forget_one_shot(KIND, key).await {
        tracing::debug!(error = %err, "cannot drop the session's message");
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
    fn cookies_are_found_by_exact_name() {
        assert_eq!(cookie("a=1; cw_lang=es; b=2", "cw_lang"), Some("es"));
        assert_eq!(cookie("xcw_lang=es", "cw_lang"), None);
    }
}
