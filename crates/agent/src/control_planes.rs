//! The control-plane replicas this agent knows, and which one it talks to.
//!
//! It starts with the URL it joined through (and the list it kept in
//! `control-planes.json` under the data dir, if any). Heartbeat answers of
//! a cluster with several replicas list them, the leader's first; the
//! agent keeps the one it uses as long as it answers, and moves on when it
//! does not: to the replica a "not the leader" answer names, else to the
//! next one in the list. Nothing changes for a single control plane: its
//! list is the one URL.

use std::path::PathBuf;
use std::sync::Mutex;

use cloudweb_protocol::heartbeat::MAX_CONTROL_PLANES;
use serde::{Deserialize, Serialize};

/// The file under the data dir that keeps the list across restarts.
pub const FILE: &str = "control-planes.json";

#[derive(Debug, Default, Serialize, Deserialize)]
struct Kept {
    urls: Vec<String>,
    current: Option<String>,
}

pub struct Replicas {
    inner: Mutex<Inner>,
    file: Option<PathBuf>,
    /// The replica that last answered a request with success; told (see
    /// [`Replicas::answered`]) when that changes, so a loop waiting out a
    /// back-off grown against a replica that is gone tries the one that
    /// answers now soon.
    answering: Mutex<Option<String>>,
    found: tokio::sync::Notify,
}

struct Inner {
    urls: Vec<String>,
    current: usize,
}

/// A URL a heartbeat answer may give: https, parseable, no credentials.
fn acceptable(url: &str) -> Option<String> {
    let parsed = reqwest::Url::parse(url).ok()?;
    if parsed.scheme() != "https" || parsed.host_str().is_none() || !parsed.username().is_empty() || parsed.password().is_some() || url.len() > 512 {
        return None;
    }
    Some(url.trim_end_matches('/').to_string())
}

impl Replicas {
    /// The list for an agent that joined through `joined`, with what
    /// `file` kept (an unreadable file is ignored: the joined URL works).
    pub fn new(joined: &str, file: Option<PathBuf>) -> Replicas {
        let joined = joined.trim_end_matches('/').to_string();
        let kept: Kept = file
            .as_ref()
            .and_then(|path| std::fs::read(path).ok())
            .and_then(|bytes| serde_json::from_slice(&bytes).ok())
            .unwrap_or_default();
        let mut urls: Vec<String> = kept.urls.iter().filter_map(|url| acceptable(url)).take(MAX_CONTROL_PLANES).collect();
        if !urls.contains(&joined) {
            urls.insert(0, joined.clone());
        }
        let current = kept.current.and_then(|url| urls.iter().position(|u| *u == url)).unwrap_or_else(|| urls.iter().position(|u| *u == joined).unwrap_or(0));
        Replicas { inner: Mutex::new(Inner { urls, current }), file, answering: Mutex::new(None), found: tokio::sync::Notify::new() }
    }

    /// The URL requests go to now.
    pub fn current(&self) -> String {
        let inner = self.inner.lock().expect("replicas lock");
        inner.urls[inner.current].clone()
    }

    /// Every URL known, in order.
    pub fn all(&self) -> Vec<String> {
        self.inner.lock().expect("replicas lock").urls.clone()
    }

    /// Takes the list a heartbeat answer gave (an empty one changes
    /// nothing); the current replica stays if it is still listed.
    pub fn learn(&self, listed: &[String]) {
        let urls: Vec<String> = listed.iter().filter_map(|url| acceptable(url)).take(MAX_CONTROL_PLANES).collect();
        if urls.is_empty() {
            return;
        }
        let mut inner = self.inner.lock().expect("replicas lock");
        if inner.urls == urls {
            return;
        }
        let current = inner.urls[inner.current].clone();
        inner.current = urls.iter().position(|u| *u == current).unwrap_or(0);
        inner.urls = urls;
        tracing::info!(control_planes = ?inner.urls, "the control plane's replicas changed");
        self.keep(&inner);
    }

    /// A request to `from` failed for want of an answer, or `from` said it
    /// does not lead (naming `leader`): later requests go to `leader` if it
    /// is known, else to the next replica. Returns the new URL, or `None`
    /// when there is nowhere else to go (or another request moved first).
    pub fn fail_over(&self, from: &str, leader: Option<&str>) -> Option<String> {
        let mut inner = self.inner.lock().expect("replicas lock");
        if inner.urls[inner.current] != from {
            return None;
        }
        let named = leader.and_then(acceptable).and_then(|url| inner.urls.iter().position(|u| *u == url));
        let next = match named {
            Some(index) => index,
            None if inner.urls.len() > 1 => (inner.current + 1) % inner.urls.len(),
            None => return None,
        };
        if next == inner.current {
            return None;
        }
        inner.current = next;
        let to = inner.urls[next].clone();
        tracing::warn!(from, to = %to, "moving to another control-plane replica");
        self.keep(&inner);
        Some(to)
    }

    /// `url` answered a request with success. When that is another
    /// replica than the last one that did (the agent found the new
    /// leader), whoever waits in [`Replicas::found_another`] is told.
    /// While replicas only fail or answer "not the leader", nobody is: a
    /// fleet's retries keep their back-off.
    pub fn answered(&self, url: &str) {
        let mut answering = self.answering.lock().expect("answering lock");
        if answering.as_deref() != Some(url) {
            let first = answering.is_none();
            *answering = Some(url.to_string());
            if !first {
                self.found.notify_waiters();
            }
        }
    }

    /// Returns once a replica other than the one that answered before
    /// answers with success.
    pub async fn found_another(&self) {
        self.found.notified().await;
    }

    fn keep(&self, inner: &Inner) {
        let Some(path) = &self.file else { return };
        let kept = Kept { urls: inner.urls.clone(), current: Some(inner.urls[inner.current].clone()) };
        let Ok(bytes) = serde_json::to_vec_pretty(&kept) else { return };
        let temp = path.with_extension("json.tmp");
        if let Err(err) = std::fs::write(&temp, bytes).and_then(|()| std::fs::rename(&temp, path)) {
            tracing::warn!(error = %err, path = %path.display(), "cannot keep the list of control-plane replicas");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_url_never_moves_and_a_list_is_walked_and_kept() {
        let single = Replicas::new("https://cp:8443/", None);
        assert_eq!(single.current(), "https://cp:8443");
        assert_eq!(single.fail_over("https://cp:8443", None), None);
        single.learn(&[]);
        assert_eq!(single.all(), vec!["https://cp:8443".to_string()]);

        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join(FILE);
        let replicas = Replicas::new("https://a:8443", Some(file.clone()));
        replicas.learn(&["https://b:8443".into(), "https://a:8443".into(), "http://plain:80".into(), "https://u:p@x:1".into()]);
        assert_eq!(replicas.all(), vec!["https://b:8443".to_string(), "https://a:8443".to_string()], "only https URLs without credentials");
        assert_eq!(replicas.current(), "https://a:8443", "the one in use stays while listed");
        // No answer: the next one. A second failure report about the old
        // one (a request that was already on its way) moves nothing.
        assert_eq!(replicas.fail_over("https://a:8443", None).as_deref(), Some("https://b:8443"));
        assert_eq!(replicas.fail_over("https://a:8443", None), None);
        // "Not the leader, that one is": straight there.
        replicas.learn(&["https://b:8443".into(), "https://a:8443".into(), "https://c:8443".into()]);
        assert_eq!(replicas.fail_over("https://b:8443", Some("https://c:8443/")).as_deref(), Some("https://c:8443"));
        // Kept across a restart.
        let again = Replicas::new("https://a:8443", Some(file));
        assert_eq!(again.current(), "https://c:8443");
        assert_eq!(again.all().len(), 3);
    }

    #[tokio::test]
    async fn only_another_replica_answering_wakes_the_waiters_not_a_move() {
        let replicas = std::sync::Arc::new(Replicas::new("https://a:8443", None));
        replicas.learn(&["https://a:8443".into(), "https://b:8443".into()]);
        replicas.answered("https://a:8443");
        let waiting = tokio::spawn({
            let replicas = replicas.clone();
            async move { replicas.found_another().await }
        });
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        // Moves alone (a gone replica, "not the leader") wake nobody.
        replicas.fail_over("https://a:8443", None).unwrap();
        replicas.fail_over("https://b:8443", Some("https://a:8443")).unwrap();
        replicas.answered("https://a:8443");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(!waiting.is_finished(), "no other replica answered yet");
        replicas.answered("https://b:8443");
        tokio::time::timeout(std::time::Duration::from_secs(1), waiting).await.expect("woken by the new replica's answer").unwrap();
    }
}
