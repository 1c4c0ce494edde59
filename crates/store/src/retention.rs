//! Retention: what the control plane keeps, and for how long, so no table
//! grows without bound. [`Store::prune`] runs with the usage downsampling
//! (every 10 minutes) and takes the time from the injectable clock.
//!
//! - build and run logs (`deployment_logs`) and progress reports
//!   (`deployment_reports`) of a finished deployment (failed or superseded)
//!   go once it is [`LOG_RETENTION_MS`] old, except for each app's last
//!   [`KEEP_DEPLOYMENTS`] deployments; those of deleted deployments go at
//!   once;
//! - acked commands go [`ACKED_COMMAND_RETENTION_MS`] after their ack;
//! - traffic samples: 30 s rows for a day, then 5-minute sums for 30 days
//!   (as the usage history);
//! - `Idempotency-Key` answers: [`IDEMPOTENCY_RETENTION_MS`], and at most
//!   [`IDEMPOTENCY_MAX_KEYS`].

use super::{Store, StoreError};

pub const DAY_MS: i64 = 86_400_000;
pub const LOG_RETENTION_MS: i64 = 7 * DAY_MS;
pub const KEEP_DEPLOYMENTS: i64 = 10;
pub const ACKED_COMMAND_RETENTION_MS: i64 = 7 * DAY_MS;
pub const TRAFFIC_FINE_MS: i64 = DAY_MS;
pub const TRAFFIC_COARSE_MS: i64 = 30 * DAY_MS;
pub const IDEMPOTENCY_RETENTION_MS: i64 = DAY_MS;
pub const IDEMPOTENCY_MAX_KEYS: i64 = 100_000;

/// Rows removed by one [`Store::prune`] pass, per table.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Pruned {
    pub logs: u64,
    pub reports: u64,
    pub commands: u64,
    pub traffic: u64,
    pub idempotency_keys: u64,
}

/// The finished deployments whose logs and reports may go: older than the
/// retention and not among their app's newest [`KEEP_DEPLOYMENTS`], or
/// deleted altogether. `$1` is the cutoff, `$2` the number kept per app.
const EXPIRED_DEPLOYMENTS: &str = "SELECT d.id FROM deployments d \
     WHERE d.state IN ('failed', 'superseded') AND d.updated_at < $1 \
     AND (SELECT COUNT(*) FROM deployments n WHERE n.app = d.app AND n.seq > d.seq) >= $2";

impl Store {
    pub async fn prune(&self, now_ms: i64) -> Result<Pruned, StoreError> {
        on_db!(self, pool => {
            let mut pruned = Pruned::default();
            let mut tx = pool.begin_write().await?;
            let cutoff = now_ms - LOG_RETENTION_MS;
            for (table, count) in [("deployment_logs", &mut pruned.logs), ("deployment_reports", &mut pruned.reports)] {
                *count += sqlx::query(&format!("DELETE FROM {table} WHERE deployment_id IN ({EXPIRED_DEPLOYMENTS})"))
                    .bind(cutoff)
                    .bind(KEEP_DEPLOYMENTS)
                    .execute(&mut *tx)
                    .await?
                    .rows_affected();
                *count += sqlx::query(&format!(
                    "DELETE FROM {table} WHERE NOT EXISTS (SELECT 1 FROM deployments d WHERE d.id = {table}.deployment_id)"
                ))
                .execute(&mut *tx)
                .await?
                .rows_affected();
            }
            pruned.commands = sqlx::query("DELETE FROM commands WHERE acked_at IS NOT NULL AND acked_at < $1")
                .bind(now_ms - ACKED_COMMAND_RETENTION_MS)
                .execute(&mut *tx)
                .await?
                .rows_affected();

            // Traffic: fold day-old 30 s rows into 5-minute sums per node and
            // host, then drop what is past the coarse retention.
            let bucket = super::usage::COARSE * 1000;
            let fine_cutoff = now_ms - TRAFFIC_FINE_MS;
            sqlx::query(
                "INSERT INTO traffic_samples (node_id, host, at, resolution, requests, r2xx, r3xx, r4xx, r5xx, dur_sum_ms, slow) \
             SELECT node_id, host, (at / $1) * $1, $2, SUM(requests), SUM(r2xx), SUM(r3xx), SUM(r4xx), SUM(r5xx), SUM(dur_sum_ms), SUM(slow) \
             FROM traffic_samples WHERE resolution = $3 AND at < $4 GROUP BY node_id, host, at / $1",
            )
            .bind(bucket)
            .bind(super::usage::COARSE)
            .bind(super::usage::FINE)
            .bind(fine_cutoff)
            .execute(&mut *tx)
            .await?;
            pruned.traffic = sqlx::query("DELETE FROM traffic_samples WHERE resolution = $1 AND at < $2")
                .bind(super::usage::FINE)
                .bind(fine_cutoff)
                .execute(&mut *tx)
                .await?
                .rows_affected();
            pruned.traffic += sqlx::query("DELETE FROM traffic_samples WHERE at < $1")
                .bind(now_ms - TRAFFIC_COARSE_MS)
                .execute(&mut *tx)
                .await?
                .rows_affected();

            pruned.idempotency_keys = sqlx::query("DELETE FROM idempotency_keys WHERE created_at < $1")
                .bind(now_ms - IDEMPOTENCY_RETENTION_MS)
                .execute(&mut *tx)
                .await?
                .rows_affected();
            pruned.idempotency_keys += sqlx::query(
                "DELETE FROM idempotency_keys WHERE created_at < \
             (SELECT created_at FROM idempotency_keys ORDER BY created_at DESC LIMIT 1 OFFSET $1)",
            )
            .bind(IDEMPOTENCY_MAX_KEYS)
            .execute(&mut *tx)
            .await?
            .rows_affected();
            tx.commit().await?;
            self.count_commit().await;
            Ok(pruned)
        })
    }
}
