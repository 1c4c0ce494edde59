//! Instances' crash loops and broken liveness probes (issue 25), as their
//! nodes reported them: shown on the app page, in `cloudweb apps` and
//! `cloudweb top`. Only a running instance on the reporting node changes.

use std::collections::HashMap;

use sqlx::Row;

use super::{Store, StoreError};

/// What a node said is wrong with a running instance.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InstanceTrouble {
    pub instance: i64,
    /// JSON, as the control plane wrote it (see `deploy::reports`).
    pub crash_loop: Option<String>,
    pub probe_problem: Option<String>,
}

impl Store {
    /// Sets (or clears, with `None`) a running instance's crash loop; the
    /// app, or `None` when nothing changed.
    pub async fn set_instance_crash_loop(
        &self,
        deployment_id: &str,
        instance: i64,
        node_id: &str,
        crash_loop: Option<&str>,
    ) -> Result<Option<String>, StoreError> {
        self.set_trouble("crash_loop", deployment_id, instance, node_id, crash_loop)
            .await
    }

    /// Sets (or clears, with `None`) why a running instance's liveness
    /// probe cannot run; the app, or `None` when nothing changed.
    pub async fn set_instance_probe_problem(
        &self,
        deployment_id: &str,
        instance: i64,
        node_id: &str,
        problem: Option<&str>,
    ) -> Result<Option<String>, StoreError> {
        self.set_trouble("probe_problem", deployment_id, instance, node_id, problem)
            .await
    }

    async fn set_trouble(
        &self,
        column: &'static str,
        deployment_id: &str,
        instance: i64,
        node_id: &str,
        value: Option<&str>,
    ) -> Result<Option<String>, StoreError> {
        // `column` is one of the two names above, never an input.
        let sql = format!(
            "UPDATE instances SET {column} = $4 WHERE deployment_id = $1 AND instance = $2 AND node_id = $3 AND state = 'running' \
             AND {column} IS DISTINCT FROM $4"
        );
        on_db!(self, pool => {
            let mut tx = pool.begin_write().await?;
            let changed = sqlx::query(&sql).bind(deployment_id).bind(instance).bind(node_id).bind(value).execute(&mut *tx).await?;
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

    /// A deployment's instances with a crash loop or a broken probe.
    pub async fn instance_troubles(
        &self,
        deployment_id: &str,
    ) -> Result<Vec<InstanceTrouble>, StoreError> {
        on_db!(self, pool => {
            let rows = sqlx::query(
                "SELECT instance, crash_loop, probe_problem FROM instances WHERE deployment_id = $1 AND (crash_loop IS NOT NULL OR probe_problem IS NOT NULL) ORDER BY instance",
            )
            .bind(deployment_id)
            .fetch_all(pool)
            .await?;
            Ok(rows.iter().map(|r| InstanceTrouble { instance: r.get("instance"), crash_loop: r.get("crash_loop"), probe_problem: r.get("probe_problem") }).collect())
        })
    }

    /// Per app, how many of its running instances crash-loop now.
    pub async fn crash_looping_counts(&self) -> Result<HashMap<String, i64>, StoreError> {
        on_db!(self, pool => {
            let rows = sqlx::query(
                "SELECT d.app AS app, COUNT(*) AS n FROM instances i JOIN deployments d ON d.id = i.deployment_id \
                 WHERE i.state = 'running' AND i.crash_loop IS NOT NULL GROUP BY d.app",
            )
            .fetch_all(pool)
            .await?;
            Ok(rows.iter().map(|r| (r.get("app"), r.get("n"))).collect())
        })
    }
}
