//! The agent-wide signal that the process is shutting down (SIGTERM,
//! SIGINT, or the node was removed). Commands run in tasks of their own, so
//! the shutdown cannot simply drop them: a deploy watches this signal and
//! gives its command back (no report, no ack, so the control plane delivers
//! it again to the next agent) instead of reporting the failure that the
//! shutdown's own clean-up (removing build containers) would cause.

use std::sync::LazyLock;

use tokio::sync::watch;

static SIGNAL: LazyLock<watch::Sender<bool>> = LazyLock::new(|| watch::channel(false).0);

/// Marks the process as shutting down; wakes every [`wait`].
pub fn begin() {
    SIGNAL.send_replace(true);
}

/// Whether the shutdown has begun.
pub fn requested() -> bool {
    *SIGNAL.borrow()
}

/// Resolves once the shutdown has begun.
pub async fn wait() {
    let mut receiver = SIGNAL.subscribe();
    // The sender lives as long as the process, so this only ends on `begin`.
    let _ = receiver.wait_for(|shutting_down| *shutting_down).await;
}

#[cfg(test)]
mod tests {
    #[tokio::test]
    async fn waiters_wake_when_the_shutdown_begins() {
        assert!(!super::requested());
        let waiter = tokio::spawn(super::wait());
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        super::begin();
        tokio::time::timeout(std::time::Duration::from_secs(1), waiter).await.unwrap().unwrap();
        assert!(super::requested());
    }
}
