//! The cluster overview's reads (the Monitoring page): the whole cluster's
//! usage over time in buckets, the apps' recent usage and the busiest
//! hosts. Each is one query over a time range (indexes by time, migration
//! 0018), never one query per node or app.

use sqlx::Row;

use super::{Store, StoreError};

/// One time bucket of the whole cluster's usage.
#[derive(Debug, Clone, PartialEq)]
pub struct ClusterUsageBucket {
    /// The bucket's start.
    pub at_ms: i64,
    /// The mean CPU of the nodes that reported one in the bucket.
    pub cpu_pct: Option<f64>,
    /// Summed over nodes, each node's mean in the bucket.
    pub mem_used: Option<i64>,
    pub disk_used: Option<i64>,
    /// Nodes with a sample in the bucket.
    pub nodes: i64,
}

/// An app's usage over its recent samples, summed over its nodes.
#[derive(Debug, Clone, PartialEq)]
pub struct AppRecentUsage {
    pub app: String,
    pub cpu_cores: Option<f64>,
    pub mem_bytes: Option<i64>,
}

impl Store {
    /// The cluster's usage since `since_ms` in buckets of `bucket_ms`
    /// (each node's samples in a bucket averaged first, so a node sampled
    /// twice counts once), in time order.
    pub async fn cluster_usage(&self, since_ms: i64, bucket_ms: i64) -> Result<Vec<ClusterUsageBucket>, StoreError> {
        on_db!(self, pool => {
            let bucket_ms = bucket_ms.max(1);
            let rows = sqlx::query(
                "SELECT bucket, AVG(cpu) AS cpu, CAST(SUM(mem) AS BIGINT) AS mem, CAST(SUM(disk) AS BIGINT) AS disk, COUNT(*) AS nodes FROM \
             (SELECT node_id, (at / $2) * $2 AS bucket, AVG(cpu_pct) AS cpu, CAST(AVG(mem_used) AS BIGINT) AS mem, \
              CAST(AVG(disk_used) AS BIGINT) AS disk FROM node_usage WHERE at >= $1 GROUP BY node_id, bucket) AS per_node \
             GROUP BY bucket ORDER BY bucket",
            )
            .bind(since_ms)
            .bind(bucket_ms)
            .fetch_all(pool)
            .await?;
            Ok(rows
                .iter()
                .map(|r| ClusterUsageBucket {
                    at_ms: r.get("bucket"),
                    cpu_pct: r.get("cpu"),
                    mem_used: r.get("mem"),
                    disk_used: r.get("disk"),
                    nodes: r.get("nodes"),
                })
                .collect())
        })
    }

    /// Every app's usage in its samples since `since_ms`: per node the
    /// mean, summed over nodes.
    pub async fn apps_recent_usage(&self, since_ms: i64) -> Result<Vec<AppRecentUsage>, StoreError> {
        on_db!(self, pool => {
            let rows = sqlx::query(
                "SELECT app, SUM(cpu) AS cpu, CAST(SUM(mem) AS BIGINT) AS mem FROM \
             (SELECT app, node_id, AVG(cpu_cores) AS cpu, CAST(AVG(mem_bytes) AS BIGINT) AS mem FROM app_usage \
              WHERE at >= $1 GROUP BY app, node_id) AS per_node GROUP BY app ORDER BY app",
            )
            .bind(since_ms)
            .fetch_all(pool)
            .await?;
            Ok(rows.iter().map(|r| AppRecentUsage { app: r.get("app"), cpu_cores: r.get("cpu"), mem_bytes: r.get("mem") }).collect())
        })
    }

    /// The `limit` hosts with the most requests since `since_ms`:
    /// `(host, requests, 5xx)`, busiest first.
    pub async fn busiest_hosts(&self, since_ms: i64, limit: i64) -> Result<Vec<(String, i64, i64)>, StoreError> {
        on_db!(self, pool => {
            let rows = sqlx::query(
                "SELECT host, CAST(SUM(requests) AS BIGINT) AS requests, CAST(SUM(r5xx) AS BIGINT) AS r5xx FROM traffic_samples WHERE at >= $1 \
             GROUP BY host ORDER BY requests DESC, host LIMIT $2",
            )
            .bind(since_ms)
            .bind(limit)
            .fetch_all(pool)
            .await?;
            Ok(rows.iter().map(|r| (r.get("host"), r.get("requests"), r.get("r5xx"))).collect())
        })
    }
}

#[cfg(test)]
mod tests {
    use crate::usage::UsageTx;
    use crate::{AppUsage, NodeUsageRow};

    crate::test_engines::both_engines! {
        async fn the_cluster_is_summed_per_bucket_with_each_node_counted_once(store) {
            let sample = |node: &str, at: i64, cpu: f64, mem: i64, app_cpu: f64| NodeUsageRow {
                node_id: node.into(),
                at_ms: at,
                cpu_pct: Some(cpu),
                mem_used: Some(mem),
                disk_used: None,
                apps: vec![AppUsage { app: "web".into(), cpu_cores: Some(app_cpu), mem_bytes: Some(100), restarts: Some(0) }],
            };
            on_db!(store, pool => {
                let mut tx = pool.begin().await.unwrap();
                // Node a twice in the first minute (averaged), node b once.
                tx.insert_usage(&[sample("a", 0, 10.0, 1000, 0.5), sample("a", 30_000, 30.0, 3000, 1.5), sample("b", 10_000, 50.0, 500, 1.0)])
                    .await
                    .unwrap();
                tx.insert_usage(&[sample("b", 60_000, 70.0, 700, 1.0)]).await.unwrap();
                tx.commit().await.unwrap();
            });
            let buckets = store.cluster_usage(0, 60_000).await.unwrap();
            assert_eq!(buckets.len(), 2, "{buckets:?}");
            assert_eq!((buckets[0].at_ms, buckets[0].nodes, buckets[0].mem_used), (0, 2, Some(2000 + 500)));
            assert!((buckets[0].cpu_pct.unwrap() - 35.0).abs() < 1e-9, "{buckets:?}");
            assert_eq!((buckets[1].at_ms, buckets[1].nodes, buckets[1].mem_used, buckets[1].disk_used), (60_000, 1, Some(700), None));
            // Since 30 s: node a's last sample and both of b's.
            let apps = store.apps_recent_usage(30_000).await.unwrap();
            assert_eq!(apps.len(), 1);
            assert!((apps[0].cpu_cores.unwrap() - 2.5).abs() < 1e-9, "{apps:?}");
            assert_eq!(apps[0].mem_bytes, Some(200));
            assert!(store.busiest_hosts(0, 10).await.unwrap().is_empty());
        }
    }

    crate::test_engines::both_engines! {
        async fn old_samples_are_folded_into_coarse_buckets_and_pruned(store) {
            let sample = |at: i64, cpu: f64, mem: i64| NodeUsageRow {
                node_id: "a".into(),
                at_ms: at,
                cpu_pct: Some(cpu),
                mem_used: Some(mem),
                disk_used: None,
                apps: vec![AppUsage { app: "web".into(), cpu_cores: Some(cpu / 10.0), mem_bytes: Some(mem), restarts: Some(1) }],
            };
            on_db!(store, pool => {
                let mut tx = pool.begin().await.unwrap();
                tx.insert_usage(&[sample(0, 10.0, 1000), sample(60_000, 30.0, 3000)]).await.unwrap();
                tx.commit().await.unwrap();
            });
            let day = 24 * 3600 * 1000;
            store.downsample_usage(2 * day).await.unwrap();
            let rows = store.node_usage("a", 0).await.unwrap();
            assert_eq!(rows.len(), 1, "two fine samples folded into one coarse one: {rows:?}");
            let (at, _, cpu, mem, disk) = rows[0];
            assert_eq!((at, mem, disk), (0, Some(2000), None));
            assert!((cpu.unwrap() - 20.0).abs() < 1e-9);
            assert_eq!(store.app_usage("web", 0).await.unwrap().len(), 1);
            // The retention's statements (traffic roll-ups, old rows) run
            // on either engine.
            store.prune(2 * day).await.unwrap();
            store.downsample_usage(90 * day).await.unwrap();
            assert!(store.node_usage("a", 0).await.unwrap().is_empty(), "coarse rows older than 30 days are gone");
        }
    }
}
