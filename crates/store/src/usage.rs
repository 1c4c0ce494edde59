//! Usage history: written with the heartbeat batch, downsampled by
//! [`Store::downsample_usage`].

use sqlx::Row;

use super::{Store, StoreError};

/// Seconds per row of the fine and the coarse series.
pub const FINE: i64 = 30;

/// One node usage sample: `(at_ms, resolution, cpu_pct, mem_used, disk_used)`.
pub type NodeUsageSample = (i64, i64, Option<f64>, Option<i64>, Option<i64>);
pub const COARSE: i64 = 300;
const DAY_MS: i64 = 86_400_000;
const MONTH_MS: i64 = 30 * DAY_MS;

/// One node's usage sample.
#[derive(Debug, Clone)]
pub struct NodeUsageRow {
    pub node_id: String,
    pub at_ms: i64,
    pub cpu_pct: Option<f64>,
    pub mem_used: Option<i64>,
    pub disk_used: Option<i64>,
    /// Per app, summed over its containers on the node.
    pub apps: Vec<AppUsage>,
}

/// One app's containers on one node in one sample. A figure no container
/// reported is `None`, never zero.
#[derive(Debug, Clone, PartialEq)]
pub struct AppUsage {
    pub app: String,
    pub cpu_cores: Option<f64>,
    pub mem_bytes: Option<i64>,
    /// Restarts of the app's containers there (Docker's count, since each
    /// container was created).
    pub restarts: Option<i64>,
}

/// A stored sample of one app on one node.
#[derive(Debug, Clone)]
pub struct AppUsageRow {
    pub node_id: String,
    pub at_ms: i64,
    /// Seconds the row covers (30, or 300 once averaged).
    pub resolution: i64,
    pub cpu_cores: Option<f64>,
    pub mem_bytes: Option<i64>,
    pub restarts: Option<i64>,
}

impl Store {

    /// Folds fine rows older than a day into 5-minute averages, and drops
    /// coarse rows older than 30 days.
    pub async fn downsample_usage(&self, now_ms: i64) -> Result<(), StoreError> {
        on_db!(self, pool => {
            let cutoff = now_ms - DAY_MS;
            let bucket = COARSE * 1000;
            let mut tx = pool.begin_write().await?;
            sqlx::query(
                "INSERT INTO node_usage (node_id, at, resolution, cpu_pct, mem_used, disk_used) \
             SELECT node_id, (at / $1) * $1, $2, AVG(cpu_pct), CAST(AVG(mem_used) AS BIGINT), CAST(AVG(disk_used) AS BIGINT) \
             FROM node_usage WHERE resolution = $3 AND at < $4 GROUP BY node_id, at / $1",
            )
            .bind(bucket)
            .bind(COARSE)
            .bind(FINE)
            .bind(cutoff)
            .execute(&mut *tx)
            .await?;
            sqlx::query(
                "INSERT INTO app_usage (app, node_id, at, resolution, cpu_cores, mem_bytes, restarts) \
             SELECT app, node_id, (at / $1) * $1, $2, AVG(cpu_cores), CAST(AVG(mem_bytes) AS BIGINT), MAX(restarts) \
             FROM app_usage WHERE resolution = $3 AND at < $4 GROUP BY app, node_id, at / $1",
            )
            .bind(bucket)
            .bind(COARSE)
            .bind(FINE)
            .bind(cutoff)
            .execute(&mut *tx)
            .await?;
            for table in ["node_usage", "app_usage"] {
                sqlx::query(&format!("DELETE FROM {table} WHERE resolution = $1 AND at < $2")).bind(FINE).bind(cutoff).execute(&mut *tx).await?;
                sqlx::query(&format!("DELETE FROM {table} WHERE resolution = $1 AND at < $2"))
                    .bind(COARSE)
                    .bind(now_ms - MONTH_MS)
                    .execute(&mut *tx)
                    .await?;
            }
            tx.commit().await?;
            self.count_commit().await;
            Ok(())
        })
    }

    /// A node's usage since `since_ms`: `(at, resolution, cpu_pct, mem_used, disk_used)`.
    pub async fn node_usage(&self, node_id: &str, since_ms: i64) -> Result<Vec<NodeUsageSample>, StoreError> {
        on_db!(self, pool => {
            let rows = sqlx::query("SELECT at, resolution, cpu_pct, mem_used, disk_used FROM node_usage WHERE node_id = $1 AND at >= $2 ORDER BY at")
                .bind(node_id)
                .bind(since_ms)
                .fetch_all(pool)
                .await?;
            Ok(rows.iter().map(|r| (r.get("at"), r.get("resolution"), r.get("cpu_pct"), r.get("mem_used"), r.get("disk_used"))).collect())
        })
    }

    /// An app's usage since `since_ms`, per node, in time order.
    pub async fn app_usage(&self, app: &str, since_ms: i64) -> Result<Vec<AppUsageRow>, StoreError> {
        on_db!(self, pool => {
            let rows = sqlx::query(
                "SELECT node_id, at, resolution, cpu_cores, mem_bytes, restarts FROM app_usage WHERE app = $1 AND at >= $2 ORDER BY node_id, at",
            )
            .bind(app)
            .bind(since_ms)
            .fetch_all(pool)
            .await?;
            Ok(rows
                .iter()
                .map(|r| AppUsageRow {
                    node_id: r.get("node_id"),
                    at_ms: r.get("at"),
                    resolution: r.get("resolution"),
                    cpu_cores: r.get("cpu_cores"),
                    mem_bytes: r.get("mem_bytes"),
                    restarts: r.get("restarts"),
                })
                .collect())
        })
    }
}

/// What this module writes inside a caller's write transaction, once per
/// engine (see [`crate::backend::for_both_engines`]).
pub(crate) trait UsageTx {
    async fn insert_usage(&mut self, rows: &[NodeUsageRow]) -> Result<(), StoreError>;
}

crate::backend::for_both_engines! {
    impl UsageTx for sqlx::Transaction<'_, DB> {
        async fn insert_usage(&mut self, rows: &[NodeUsageRow]) -> Result<(), StoreError> {
            let tx = self;
            for row in rows {
                sqlx::query("INSERT INTO node_usage (node_id, at, resolution, cpu_pct, mem_used, disk_used) VALUES ($1, $2, $3, $4, $5, $6)")
                    .bind(&row.node_id)
                    .bind(row.at_ms)
                    .bind(FINE)
                    .bind(row.cpu_pct)
                    .bind(row.mem_used)
                    .bind(row.disk_used)
                    .execute(&mut **tx)
                    .await?;
                for app in &row.apps {
                    sqlx::query("INSERT INTO app_usage (app, node_id, at, resolution, cpu_cores, mem_bytes, restarts) VALUES ($1, $2, $3, $4, $5, $6, $7)")
                        .bind(&app.app)
                        .bind(&row.node_id)
                        .bind(row.at_ms)
                        .bind(FINE)
                        .bind(app.cpu_cores)
                        .bind(app.mem_bytes)
                        .bind(app.restarts)
                        .execute(&mut **tx)
                        .await?;
                }
            }
            Ok(())
        }
    }
}
