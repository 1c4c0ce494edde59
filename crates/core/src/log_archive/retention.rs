//! Retention of stored runtime logs (leader only): every
//! `prune_every`, each app's lines older than the retention go, then the
//! oldest of an app past its byte bound, then, while all apps together are
//! past the total bound, the oldest of the app holding the most. Deleted
//! lines are counted in the app's usage (`pruned`). Deletes run in chunks,
//! so a large prune never holds the store for long.

use std::sync::Arc;

use cloudweb_store::{LogStore, StoreError};

use super::{LogArchive, LogSettings};
use crate::clock::Clock;

/// Lines one delete takes.
const CHUNK: i64 = 10_000;

/// What one pass deleted.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Pruned {
    pub by_age: i64,
    pub by_size: i64,
    pub bytes: i64,
}

/// One pass of retention at `now_ns`.
pub async fn prune(store: &LogStore, settings: &LogSettings, now_ns: i64) -> Result<Pruned, StoreError> {
    let mut pruned = Pruned::default();
    let cutoff = now_ns.saturating_sub(i64::try_from(settings.retention.as_nanos()).unwrap_or(i64::MAX));
    let app_max = i64::try_from(settings.app_max_bytes).unwrap_or(i64::MAX);
    for usage in store.usage().await? {
        loop {
            let (lines, bytes) = store.prune_oldest(&usage.app, Some(cutoff), CHUNK).await?;
            pruned.by_age += lines;
            pruned.bytes += bytes;
            if lines < CHUNK {
                break;
            }
        }
        pruned_to(store, &usage.app, app_max, &mut pruned).await?;
    }
    // All apps together: the largest gives up its oldest lines first.
    let total_max = i64::try_from(settings.total_max_bytes).unwrap_or(i64::MAX);
    loop {
        let usage = store.usage().await?;
        let total: i64 = usage.iter().map(|u| u.bytes).sum();
        let Some(largest) = usage.first().filter(|u| u.bytes > 0) else { break };
        if total <= total_max {
            break;
        }
        let target = largest.bytes - (total - total_max);
        let before = pruned.by_size;
        pruned_to(store, &largest.app, target.max(0), &mut pruned).await?;
        if pruned.by_size == before {
            break;
        }
    }
    if pruned.by_age + pruned.by_size > 0 {
        store.drop_unused_sources().await?;
    }
    Ok(pruned)
}

/// Deletes the app's oldest lines until it holds at most `max_bytes`.
async fn pruned_to(store: &LogStore, app: &str, max_bytes: i64, pruned: &mut Pruned) -> Result<(), StoreError> {
    loop {
        let usage = store.app_usage(app).await?;
        if usage.bytes <= max_bytes || usage.lines == 0 {
            return Ok(());
        }
        let average = (usage.bytes / usage.lines).max(1);
        let over = usage.bytes - max_bytes;
        let lines = ((over + average - 1) / average).clamp(1, CHUNK);
        let (deleted, bytes) = store.prune_oldest(app, None, lines).await?;
        pruned.by_size += deleted;
        pruned.bytes += bytes;
        if deleted == 0 {
            return Ok(());
        }
    }
}

/// Runs retention until the task is aborted (the leader's).
pub async fn run(archive: Arc<LogArchive>, clock: Arc<dyn Clock>) {
    let mut every = tokio::time::interval(archive.settings.prune_every);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        let now_ns = clock.now_ms().saturating_mul(1_000_000);
        match prune(archive.store(), &archive.settings, now_ns).await {
            Ok(pruned) if pruned.by_age + pruned.by_size > 0 => {
                tracing::info!(by_age = pruned.by_age, by_size = pruned.by_size, bytes = pruned.bytes, "runtime logs: retention deleted old lines");
            }
            Ok(_) => {}
            Err(err) => tracing::warn!(error = %err, "runtime logs: retention failed; trying again next time"),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use cloudweb_store::{LogFilter, LogSource, NewLogLine, Store};

    use super::*;

    fn lines(app: &str, from: i64, count: i64, text: &str) -> Vec<NewLogLine> {
        (from..from + count)
            .map(|i| NewLogLine {
                source: LogSource { app: app.into(), container: format!("cw-{app}-1"), deployment_id: "d".into(), node_id: "n".into(), instance: 1 },
                ts_ns: i * 1_000_000_000,
                seq: i + 1,
                stream: "stdout".into(),
                line: text.into(),
            })
            .collect()
    }

    #[tokio::test]
    async fn retention_goes_by_age_then_app_size_then_total() {
        let dir = tempfile::tempdir().unwrap();
        let state = Store::open(dir.path(), "t").await.unwrap();
        let store = LogStore::beside(&state, dir.path(), "t").await.unwrap();
        let text = "x".repeat(936); // 1000 bytes with the overhead
        store.insert(&lines("web", 0, 1000, &text)).await.unwrap();
        store.insert(&lines("api", 500, 300, &text)).await.unwrap();
        let settings = LogSettings {
            retention: Duration::from_secs(400),
            app_max_bytes: 400 * 1000,
            total_max_bytes: 500 * 1000,
            ..LogSettings::default()
        };
        // Now is 1000 s: lines before 600 s are too old.
        let pruned = prune(&store, &settings, 1000 * 1_000_000_000).await.unwrap();
        assert_eq!(pruned.by_age, 600 + 100);
        let web = store.app_usage("web").await.unwrap();
        let api = store.app_usage("api").await.unwrap();
        // web: 400 left by age, at its bound; api: 200 left. 600 in all,
        // over the 500 total: web (the largest) gives up 100 more.
        assert_eq!((web.lines, api.lines), (300, 200));
        assert_eq!(web.pruned, 700);
        assert_eq!(pruned.by_size, 100);
        let oldest = store.search(&LogFilter { app: "web", limit: 1000, ..LogFilter::default() }).await.unwrap();
        assert_eq!(oldest.last().unwrap().ts_ns, 700 * 1_000_000_000, "the oldest went first");
        // Nothing more to do.
        assert_eq!(prune(&store, &settings, 1000 * 1_000_000_000).await.unwrap(), Pruned::default());
    }
}
