//! Dashboard sessions: a random id in an `HttpOnly`, `SameSite=Strict`
//! cookie, held in memory (a restart of the control plane logs everyone
//! out). Each session has its own CSRF token that every form posts back,
//! and a one-shot message shown on the next page (the flash).
//!
//! A session is opened by presenting a valid API token; the token itself
//! is never stored in the session or the cookie.

use std::collections::HashMap;
use std::sync::Mutex;

use rand::Rng;

/// How long a session lasts without use.
pub const IDLE_MS: i64 = 12 * 3600 * 1000;
/// Sessions kept at most; the oldest go first.
const MAX_SESSIONS: usize = 10_000;

pub const COOKIE: &str = "cw_session";

#[derive(Clone, Debug)]
pub struct Session {
    pub csrf: String,
    pub expires_ms: i64,
    pub flash: Option<Flash>,
}

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
pub struct Sessions {
    inner: Mutex<HashMap<String, Session>>,
}

fn random_hex() -> String {
    let bytes: [u8; 32] = rand::rng().random();
    hex::encode(bytes)
}

impl Sessions {
    /// Opens a session; returns its id (the cookie value).
    pub fn open(&self, now_ms: i64) -> String {
        let id = random_hex();
        let mut inner = self.inner.lock().expect("sessions lock");
        inner.retain(|_, s| s.expires_ms > now_ms);
        if inner.len() >= MAX_SESSIONS {
            if let Some(oldest) = inner.iter().min_by_key(|(_, s)| s.expires_ms).map(|(k, _)| k.clone()) {
                inner.remove(&oldest);
            }
        }
        inner.insert(id.clone(), Session { csrf: random_hex(), expires_ms: now_ms + IDLE_MS, flash: None });
        id
    }

    /// The live session `id`, extended, with its flash taken out.
    pub fn touch(&self, id: &str, now_ms: i64) -> Option<Session> {
        let mut inner = self.inner.lock().expect("sessions lock");
        let session = inner.get_mut(id)?;
        if session.expires_ms <= now_ms {
            inner.remove(id);
            return None;
        }
        session.expires_ms = now_ms + IDLE_MS;
        let mut copy = session.clone();
        copy.flash = session.flash.take();
        Some(copy)
    }

    pub fn flash(&self, id: &str, flash: Flash) {
        if let Some(session) = self.inner.lock().expect("sessions lock").get_mut(id) {
            session.flash = Some(flash);
        }
    }

    pub fn close(&self, id: &str) {
        self.inner.lock().expect("sessions lock").remove(id);
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
    fn sessions_expire_and_flash_shows_once() {
        let sessions = Sessions::default();
        let id = sessions.open(0);
        assert!(sessions.touch("nope", 1).is_none());
        sessions.flash(&id, Flash::Done);
        assert_eq!(sessions.touch(&id, 1).unwrap().flash, Some(Flash::Done));
        assert_eq!(sessions.touch(&id, 2).unwrap().flash, None);
        assert!(sessions.touch(&id, 2 + IDLE_MS + 1).is_none(), "idle too long");
        assert!(sessions.touch(&id, 3).is_none(), "an expired session is gone");
    }

    #[test]
    fn cookies_are_found_by_exact_name() {
        assert_eq!(cookie("a=1; cw_session=abc; b=2", COOKIE), Some("abc"));
        assert_eq!(cookie("xcw_session=abc", COOKIE), None);
    }
}
