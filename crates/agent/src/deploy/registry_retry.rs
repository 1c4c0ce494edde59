//! Pushes and pulls tried again while the registry restarts, and their
//! errors named after what failed.

use std::time::Duration;

use crate::runtime::{is_transient_registry_error, RuntimeError};

/// The pauses between tries of a push or pull that failed for a moment
/// (see [`is_transient_registry_error`]): eight tries over about 30 s,
/// which covers a registry restart by the control plane and a restart of
/// the control plane itself (the registry is its child).
pub(crate) const REGISTRY_RETRY_DELAYS: [Duration; 7] = [
    Duration::from_secs(1),
    Duration::from_secs(2),
    Duration::from_secs(3),
    Duration::from_secs(4),
    Duration::from_secs(5),
    Duration::from_secs(5),
    Duration::from_secs(5),
];

/// Runs a push or pull (`what`), again after each of `delays` while it
/// fails with a transient registry error; each retry goes to `log` (the
/// deployment's log) and the agent's log.
pub(crate) async fn with_registry_retry<T, F, Fut>(delays: &[Duration], log: impl Fn(String), what: &str, mut attempt: F) -> Result<T, RuntimeError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, RuntimeError>>,
{
    let mut delays = delays.iter();
    loop {
        match attempt().await {
            Err(err) if is_transient_registry_error(&err) => match delays.next() {
                Some(delay) => {
                    tracing::warn!(error = %err, "{what} failed for a moment; trying again in {} s", delay.as_secs());
                    log(format!("{what} failed ({err}); the registry may be restarting, trying again in {} s", delay.as_secs()));
                    tokio::time::sleep(*delay).await;
                }
                None => return Err(named(what, err)),
            },
            result => return result.map_err(|err| named(what, err)),
        }
    }
}

/// The error of `what` (`pull of IMAGE`), saying so: the Engine's own
/// words ("received unexpected HTTP status: 500") do not say what failed.
fn named(what: &str, err: RuntimeError) -> RuntimeError {
    match err {
        RuntimeError::Failed(text) if text.starts_with(what) => RuntimeError::Failed(text),
        // An engine that is down is tried again later: it stays what it is.
        RuntimeError::Unavailable(text) => RuntimeError::Unavailable(format!("{what} failed: {text}")),
        other => RuntimeError::Failed(format!("{what} failed: {other}")),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    /// Runs `with_registry_retry` without pauses against attempts that
    /// answer `results` in turn; returns the result, the number of
    /// attempts and the lines logged.
    async fn retried(results: Vec<Result<u8, RuntimeError>>) -> (Result<u8, RuntimeError>, usize, Vec<String>) {
        let results = Mutex::new(results.into_iter());
        let attempts = Mutex::new(0);
        let lines = Mutex::new(Vec::new());
        let result = with_registry_retry(&[Duration::ZERO; 4], |line| lines.lock().unwrap().push(line), "push of r/web:d1", || {
            *attempts.lock().unwrap() += 1;
            let next = results.lock().unwrap().next().expect("no more attempts than results");
            async move { next }
        })
        .await;
        let attempts = *attempts.lock().unwrap();
        (result, attempts, lines.into_inner().unwrap())
    }

    fn refused() -> RuntimeError {
        RuntimeError::Failed("push of r/web:d1 failed: dial tcp 127.0.0.1:5000: connect: connection refused".into())
    }

    #[tokio::test]
    async fn a_push_is_tried_again_while_the_registry_restarts_and_no_longer() {
        let (result, attempts, lines) = retried(vec![Err(refused()), Err(refused()), Ok(7)]).await;
        assert_eq!(result.unwrap(), 7);
        assert_eq!(attempts, 3);
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert!(lines[0].contains("push of r/web:d1 failed") && lines[0].contains("trying again"), "{lines:?}");

        // Bounded: five tries, then the last error.
        let (result, attempts, lines) = retried((0..5).map(|_| Err(refused())).collect()).await;
        assert!(result.unwrap_err().to_string().contains("connection refused"));
        assert_eq!((attempts, lines.len()), (5, 4));

        // Anything else fails at once.
        let denied = RuntimeError::Failed("push of r/web:d1 failed: unauthorized: authentication required".into());
        let (result, attempts, lines) = retried(vec![Err(denied)]).await;
        assert!(result.unwrap_err().to_string().contains("unauthorized"));
        assert_eq!((attempts, lines.len()), (1, 0));

        // The Engine's words get what failed in front of them, once.
        let engine = RuntimeError::Engine(bollard::errors::Error::DockerStreamError { error: "received unexpected HTTP status: 500 Internal Server Error".into() });
        let (result, _, _) = retried(vec![Err(engine)]).await;
        let text = result.unwrap_err().to_string();
        assert!(text.starts_with("push of r/web:d1 failed: ") && text.contains("500"), "{text}");
        let (result, _, _) = retried((0..5).map(|_| Err(refused())).collect()).await;
        assert_eq!(result.unwrap_err().to_string().matches("push of r/web:d1").count(), 1);
        // An engine that is down stays so (the command is retried later).
        let (result, _, _) = retried(vec![Err(RuntimeError::Unavailable("socket gone".into()))]).await;
        assert!(matches!(result, Err(RuntimeError::Unavailable(ref t)) if t.contains("push of r/web:d1") && t.contains("socket gone")), "{result:?}");
    }
}
