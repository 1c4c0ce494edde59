//! The heartbeat writer: heartbeats are kept in memory (`live`) and
//! written in batches, with the periodic pruning and downsampling that
//! ride on the same timer.

use std::sync::Arc;

use crate::auth;
use crate::AppState;

/// Writes the heartbeats received since the last write, in one transaction,
/// every `heartbeat_flush_interval`.
pub async fn heartbeat_writer(state: Arc<AppState>) {
    let mut interval = tokio::time::interval(state.config.heartbeat_flush_interval);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_downsample = tokio::time::Instant::now();
    loop {
        interval.tick().await;
        flush_heartbeats(&state).await;
        crate::access::audit::flush_suppressed(&state).await;
        if last_downsample.elapsed() >= std::time::Duration::from_secs(600) {
            last_downsample = tokio::time::Instant::now();
            if let Err(err) = state.store.downsample_usage(state.clock.now_ms()).await {
                tracing::error!(error = %err, "could not downsample the usage history");
            }
            match auth::sessions::prune(&state).await {
                Ok(ended) => tracing::debug!(ended, "deleted expired sessions"),
                Err(err) => tracing::error!(error = ?err, "could not delete expired sessions"),
            }
            crate::access::audit::prune(&state).await;
            match state.store.prune(state.clock.now_ms()).await {
                Ok(pruned) => tracing::debug!(?pruned, "pruned old rows"),
                Err(err) => tracing::error!(error = %err, "could not prune old rows"),
            }
        }
    }
}

pub async fn flush_heartbeats(state: &AppState) {
    let batch = state.nodes.take_dirty();
    let traffic = state.nodes.take_traffic();
    let usage = state.nodes.take_usage();
    if let Err(err) = state.store.save_heartbeats(&batch, &traffic, &usage).await {
        tracing::error!(error = %err, nodes = batch.len(), "could not persist heartbeats");
    }
}
