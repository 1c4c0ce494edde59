//! Instances' readiness (issue 25): what their nodes' readiness probes
//! last said, and the rule the ingress's upstreams follow (ready
//! instances only, unless none of an app's is).

use sqlx::Row;

use super::{Store, StoreError};

/// Per app, its ready addresses, or all of them when none is ready.
pub(crate) fn ready_or_all(all: Vec<(String, String, bool)>) -> Vec<(String, String)> {
    let some_ready: std::collections::HashSet<String> = all.iter().filter(|(_, _, ready)| *ready).map(|(app, _, _)| app.clone()).collect();
    all.into_iter().filter(|(app, _, ready)| *ready || !some_ready.contains(app)).map(|(app, address, _)| (app, address)).collect()
}

impl Store {
    /// A running instance's readiness as its node reported it: `ready`
    /// clears `unready_since`, not ready sets it (once: the first report's
    /// time stays) with `reason`. The app whose upstreams this may change,
    /// or `None` when nothing changed (the instance is not running on
    /// `node_id`, or already in that state).
    pub async fn set_instance_readiness(
        &self,
        deployment_id: &str,
        instance: i64,
        node_id: &str,
        ready: bool,
        reason: Option<&str>,
        now_ms: i64,
    ) -> Result<Option<String>, StoreError> {
        on_db!(self, pool => {
            let mut tx = pool.begin_write().await?;
            let changed = if ready {
                sqlx::query(
                    "UPDATE instances SET unready_since = NULL, unready_reason = NULL WHERE deployment_id = $1 AND instance = $2 AND node_id = $3 \
                     AND state = 'running' AND unready_since IS NOT NULL",
                )
                .bind(deployment_id)
                .bind(instance)
                .bind(node_id)
                .execute(&mut *tx)
                .await?
            } else {
                sqlx::query(
                    "UPDATE instances SET unready_since = $4, unready_reason = $5 WHERE deployment_id = $1 AND instance = $2 AND node_id = $3 \
                     AND state = 'running' AND unready_since IS NULL",
                )
                .bind(deployment_id)
                .bind(instance)
                .bind(node_id)
                .bind(now_ms)
                .bind(reason)
                .execute(&mut *tx)
                .await?
            };
            if changed.rows_affected() == 0 {
                tx.rollback().await?;
                return Ok(None);
            }
            let app: String = sqlx::query("SELECT app FROM deployments WHERE id = $1").bind(deployment_id).fetch_one(&mut *tx).await?.get("app");
            tx.commit().await?;
            self.count_commit().await;
            Ok(Some(app))
        })
    }

    /// The unready instances of a deployment: (instance, since ms, reason).
    pub async fn unready_instances(&self, deployment_id: &str) -> Result<Vec<(i64, i64, Option<String>)>, StoreError> {
        on_db!(self, pool => {
            let rows = sqlx::query("SELECT instance, unready_since, unready_reason FROM instances WHERE deployment_id = $1 AND unready_since IS NOT NULL ORDER BY instance")
                .bind(deployment_id)
                .fetch_all(pool)
                .await?;
            Ok(rows.iter().map(|r| (r.get("instance"), r.get("unready_since"), r.get("unready_reason"))).collect())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::ready_or_all;

    #[test]
    fn upstreams_are_the_ready_instances_or_all_when_none_is() {
        let all = vec![
            ("web".to_string(), "a:1".to_string(), true),
            ("web".to_string(), "a:2".to_string(), false),
            ("api".to_string(), "b:1".to_string(), false),
            ("api".to_string(), "b:2".to_string(), false),
        ];
        let got = ready_or_all(all);
        assert_eq!(got, [("web".to_string(), "a:1".to_string()), ("api".to_string(), "b:1".to_string()), ("api".to_string(), "b:2".to_string())]);
    }
}
