//! Deployments and their instances. State names are checked by the
//! deployment state machine before they reach this module.

use crate::backend::Cols;
use sqlx::Row;

use super::commands::CommandsTx;
use super::{Store, StoreError};

#[derive(Debug, Clone, PartialEq)]
pub struct DeploymentRow {
    pub id: String,
    pub seq: i64,
    pub app: String,
    /// `source`, `rollback` or `reschedule`.
    pub kind: String,
    pub commit_sha: Option<String>,
    pub rollback_of: Option<String>,
    pub state: String,
    pub image: Option<String>,
    pub error: Option<String>,
    pub created_at: i64,
    pub updated_at: i64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct InstanceRow {
    pub deployment_id: String,
    pub instance: i64,
    pub node_id: Option<String>,
    pub container: Option<String>,
    /// `pending`, `running`, `failed`, `stopping`, `stopped`.
    pub state: String,
    pub address: Option<String>,
    pub stop_after: Option<i64>,
    /// Route table version every ready ingress must serve before the stop.
    pub stop_after_routes: Option<i64>,
    /// The instance of the same deployment this one replaces.
    pub replaces: Option<i64>,
    pub updated_at: i64,
}

const DEPLOYMENT_COLUMNS: &str = "id, seq, app, kind, commit_sha, rollback_of, state, image, error, created_at, updated_at";
const INSTANCE_COLUMNS: &str =
    "deployment_id, instance, node_id, container, state, address, stop_after, stop_after_routes, replaces, updated_at";

fn deployment_from_row(row: &impl Cols) -> DeploymentRow {
    DeploymentRow {
        id: row.col("id"),
        seq: row.col("seq"),
        app: row.col("app"),
        kind: row.col("kind"),
        commit_sha: row.col("commit_sha"),
        rollback_of: row.col("rollback_of"),
        state: row.col("state"),
        image: row.col("image"),
        error: row.col("error"),
        created_at: row.col("created_at"),
        updated_at: row.col("updated_at"),
    }
}

fn instance_from_row(row: &impl Cols) -> InstanceRow {
    InstanceRow {
        deployment_id: row.col("deployment_id"),
        instance: row.col("instance"),
        node_id: row.col("node_id"),
        container: row.col("container"),
        state: row.col("state"),
        address: row.col("address"),
        stop_after: row.col("stop_after"),
        stop_after_routes: row.col("stop_after_routes"),
        replaces: row.col("replaces"),
        updated_at: row.col("updated_at"),
    }
}

/// An instance's new state for [`Store::update_instance`]: the node and
/// address are kept where not given; `stop_after` is cleared where not
/// given.
#[derive(Debug, Clone, Copy)]
pub struct InstanceUpdate<'a> {
    state: &'a str,
    node_id: Option<&'a str>,
    address: Option<&'a str>,
    stop_after: Option<i64>,
}

impl<'a> InstanceUpdate<'a> {
    pub fn to(state: &'a str) -> InstanceUpdate<'a> {
        InstanceUpdate { state, node_id: None, address: None, stop_after: None }
    }

    pub fn on(self, node_id: &'a str) -> InstanceUpdate<'a> {
        InstanceUpdate { node_id: Some(node_id), ..self }
    }

    pub fn address(self, address: Option<&'a str>) -> InstanceUpdate<'a> {
        InstanceUpdate { address, ..self }
    }

    /// Stop it once the drain period ends at `at_ms`.
    pub fn stop_after(self, at_ms: i64) -> InstanceUpdate<'a> {
        InstanceUpdate { stop_after: Some(at_ms), ..self }
    }
}

/// What [`Store::settle_running`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Settled {
    /// The deployment runs; these older ones were superseded.
    Running { superseded: Vec<String> },
    /// A newer deployment (this one) runs or is on its way: the deployment
    /// was superseded and its instances stop.
    Newer(String),
    /// It was no longer in the expected state: another path moved it.
    Moved,
}



impl Store {
    /// Records a new deployment with `instances` pending instance rows.
    /// With `supersede_in_flight`, the app's older deployments that have
    /// not run yet (queued, building, deploying) are superseded in the same
    /// transaction and their placed instances set to stop now; their ids
    /// come back with the new row.
    pub async fn insert_deployment(
        &self,
        deployment: &DeploymentRow,
        instances: i64,
        supersede_in_flight: bool,
    ) -> Result<(DeploymentRow, Vec<String>), StoreError> {
        on_db!(self, pool => {
            let mut tx = pool.begin_write().await?;
            let mut superseded = Vec::new();
            if supersede_in_flight {
                let in_flight: Vec<(String, String)> =
                    sqlx::query("SELECT id, state FROM deployments WHERE app = $1 AND state IN ('queued', 'building', 'deploying') ORDER BY seq")
                        .bind(&deployment.app)
                        .fetch_all(&mut *tx)
                        .await?
                        .iter()
                        .map(|r| (r.get("id"), r.get("state")))
                        .collect();
                let reason = format!("a newer deployment ({}) was requested", deployment.id);
                for (id, state) in in_flight {
                    tx.move_deployment(&id, &state, "superseded", Some(&reason), None, deployment.created_at).await?;
                    tx.retire_instances(&id, deployment.created_at, deployment.created_at).await?;
                    superseded.push(id);
                }
            }
            let seq = tx.insert_new_deployment(deployment, instances).await?;
            tx.commit().await?;
            self.count_commit().await;
            Ok((DeploymentRow { seq, ..deployment.clone() }, superseded))
        })
    }

    pub async fn deployment(&self, id: &str) -> Result<Option<DeploymentRow>, StoreError> {
        on_db!(self, pool => {
            let row = sqlx::query(&format!("SELECT {DEPLOYMENT_COLUMNS} FROM deployments WHERE id = $1"))
                .bind(id)
                .fetch_optional(pool)
                .await?;
            Ok(row.as_ref().map(deployment_from_row))
        })
    }

    /// An app's deployments, newest first.
    pub async fn app_deployments(&self, app: &str) -> Result<Vec<DeploymentRow>, StoreError> {
        on_db!(self, pool => {
            let rows = sqlx::query(&format!("SELECT {DEPLOYMENT_COLUMNS} FROM deployments WHERE app = $1 ORDER BY seq DESC"))
                .bind(app)
                .fetch_all(pool)
                .await?;
            Ok(rows.iter().map(deployment_from_row).collect())
        })
    }

    /// Moves a deployment from `from` to `to` (compare and set), recording
    /// the step in the same transaction. Returns false when it was no
    /// longer in `from`.
    pub async fn transition_deployment(
        &self,
        id: &str,
        from: &str,
        to: &str,
        error: Option<&str>,
        image: Option<&str>,
        now_ms: i64,
    ) -> Result<bool, StoreError> {
        on_db!(self, pool => {
            let mut tx = pool.begin_write().await?;
            let moved = tx.move_deployment(id, from, to, error, image, now_ms).await?;
            if !moved {
                tx.rollback().await?;
                return Ok(false);
            }
            tx.commit().await?;
            self.count_commit().await;
            Ok(true)
        })
    }

    /// A running deployment lost every instance. When a newer deployment
    /// of the app is on its way (or runs), nothing changes: that one takes
    /// over, and should it fail this one is still here to start again.
    /// Otherwise, in one transaction, it becomes failed and `again` (a
    /// `reschedule` of its image, with `instances` unplaced instances) is
    /// queued, so a kill cannot leave the failure without its reschedule.
    pub async fn fail_and_reschedule(&self, id: &str, error: &str, again: &DeploymentRow, instances: i64) -> Result<Rescheduled, StoreError> {
        on_db!(self, pool => {
            let mut tx = pool.begin_write().await?;
            let newer: i64 = sqlx::query(
                "SELECT COUNT(*) AS n FROM deployments WHERE app = $1 AND state NOT IN ('failed', 'superseded') \
                 AND seq > (SELECT seq FROM deployments WHERE id = $2)",
            )
            .bind(&again.app)
            .bind(id)
            .fetch_one(&mut *tx)
            .await?
            .get("n");
            if newer > 0 {
                tx.rollback().await?;
                return Ok(Rescheduled::NewerOnItsWay);
            }
            if !tx.move_deployment(id, "running", "failed", Some(error), None, again.created_at).await? {
                tx.rollback().await?;
                return Ok(Rescheduled::Ended);
            }
            let seq = tx.insert_new_deployment(again, instances).await?;
            tx.commit().await?;
            self.count_commit().await;
            Ok(Rescheduled::Queued(DeploymentRow { seq, ..again.clone() }))
        })
    }

    /// A deployment's instances reported running: it becomes the app's
    /// running deployment and supersedes the older running ones, whose
    /// instances stop after `stop_after_ms` — or, when a newer deployment
    /// of the app runs or is still on its way, it is superseded itself and
    /// its instances stop now. One transaction, so there is no moment (and
    /// no kill) at which the app has two running deployments, or none.
    pub async fn settle_running(&self, id: &str, from: &str, now_ms: i64, stop_after_ms: i64) -> Result<Settled, StoreError> {
        on_db!(self, pool => {
            let mut tx = pool.begin_write().await?;
            let Some(row) = sqlx::query("SELECT app, seq, state FROM deployments WHERE id = $1").bind(id).fetch_optional(&mut *tx).await? else {
                tx.rollback().await?;
                return Ok(Settled::Moved);
            };
            let (app, seq, state): (String, i64, String) = (row.get("app"), row.get("seq"), row.get("state"));
            if state != from {
                tx.rollback().await?;
                return Ok(Settled::Moved);
            }
            let newer: Option<String> = sqlx::query(
                "SELECT id FROM deployments WHERE app = $1 AND seq > $2 AND state IN ('queued', 'building', 'deploying', 'running') \
             ORDER BY seq DESC LIMIT 1",
            )
            .bind(&app)
            .bind(seq)
            .fetch_optional(&mut *tx)
            .await?
            .map(|r| r.get("id"));
            if let Some(newer) = newer {
                let reason = format!("a newer deployment ({newer}) was requested");
                tx.move_deployment(id, from, "superseded", Some(&reason), None, now_ms).await?;
                tx.retire_instances(id, now_ms, now_ms).await?;
                tx.commit().await?;
                self.count_commit().await;
                return Ok(Settled::Newer(newer));
            }
            tx.move_deployment(id, from, "running", None, None, now_ms).await?;
            let older: Vec<String> = sqlx::query("SELECT id FROM deployments WHERE app = $1 AND seq < $2 AND state = 'running' ORDER BY seq")
                .bind(&app)
                .bind(seq)
                .fetch_all(&mut *tx)
                .await?
                .iter()
                .map(|r| r.get("id"))
                .collect();
            for old in &older {
                tx.move_deployment(old, "running", "superseded", None, None, now_ms).await?;
                tx.retire_instances(old, stop_after_ms, now_ms).await?;
            }
            // The invariant, checked where it is made: one running deployment.
            let running: i64 = sqlx::query("SELECT COUNT(*) AS n FROM deployments WHERE app = $1 AND state = 'running'")
                .bind(&app)
                .fetch_one(&mut *tx)
                .await?
                .get("n");
            if running != 1 {
                tx.rollback().await?;
                return Err(StoreError::Invariant(format!("app {app} would have {running} running deployments; nothing was changed")));
            }
            tx.commit().await?;
            self.count_commit().await;
            Ok(Settled::Running { superseded: older })
        })
    }

    /// An app's deployments, newest first, each with whether it ever ran
    /// (one query: the simulation reads this after every commit).
    pub async fn app_deployments_ran(&self, app: &str) -> Result<Vec<(DeploymentRow, bool)>, StoreError> {
        on_db!(self, pool => {
            let rows = sqlx::query(&format!(
                "SELECT {DEPLOYMENT_COLUMNS}, EXISTS (SELECT 1 FROM deployment_events e WHERE e.deployment_id = deployments.id AND e.state = 'running') AS ran \
             FROM deployments WHERE app = $1 ORDER BY seq DESC"
            ))
            .bind(app)
            .fetch_all(pool)
            .await?;
            Ok(rows.iter().map(|r| (deployment_from_row(r), r.get::<bool, _>("ran"))).collect())
        })
    }

    /// The states a deployment went through, oldest first: `(state, at_ms)`.
    pub async fn deployment_events(&self, id: &str) -> Result<Vec<(String, i64)>, StoreError> {
        on_db!(self, pool => {
            let rows = sqlx::query("SELECT state, at FROM deployment_events WHERE deployment_id = $1 ORDER BY at, seq")
                .bind(id)
                .fetch_all(pool)
                .await?;
            Ok(rows.iter().map(|r| (r.get("state"), r.get("at"))).collect())
        })
    }

    pub async fn set_deployment_commit(&self, id: &str, commit: &str, now_ms: i64) -> Result<(), StoreError> {
        on_db!(self, pool => {
            sqlx::query("UPDATE deployments SET commit_sha = $1, updated_at = $2 WHERE id = $3").bind(commit).bind(now_ms).bind(id).execute(pool).await?;
            self.count_commit().await;
            Ok(())
        })
    }

    pub async fn set_deployment_image(&self, id: &str, image: &str, now_ms: i64) -> Result<(), StoreError> {
        on_db!(self, pool => {
            sqlx::query("UPDATE deployments SET image = $1, updated_at = $2 WHERE id = $3").bind(image).bind(now_ms).bind(id).execute(pool).await?;
            self.count_commit().await;
            Ok(())
        })
    }

    pub async fn instances(&self, deployment_id: &str) -> Result<Vec<InstanceRow>, StoreError> {
        on_db!(self, pool => {
            let rows = sqlx::query(&format!("SELECT {INSTANCE_COLUMNS} FROM instances WHERE deployment_id = $1 ORDER BY instance"))
                .bind(deployment_id)
                .fetch_all(pool)
                .await?;
            Ok(rows.iter().map(instance_from_row).collect())
        })
    }

    /// Instances that hold resources (placed and not stopped or failed).
    pub async fn active_instances(&self) -> Result<Vec<InstanceRow>, StoreError> {
        on_db!(self, pool => {
            let rows = sqlx::query(&format!(
                "SELECT {INSTANCE_COLUMNS} FROM instances WHERE node_id IS NOT NULL AND state IN ('pending', 'running', 'stopping')"
            ))
            .fetch_all(pool)
            .await?;
            Ok(rows.iter().map(instance_from_row).collect())
        })
    }

    pub async fn update_instance(&self, deployment_id: &str, instance: i64, update: InstanceUpdate<'_>, now_ms: i64) -> Result<(), StoreError> {
        on_db!(self, pool => {
            sqlx::query(
                "UPDATE instances SET node_id = COALESCE($1, node_id), state = $2, address = COALESCE($3, address), \
             stop_after = $4, updated_at = $5 WHERE deployment_id = $6 AND instance = $7",
            )
            .bind(update.node_id)
            .bind(update.state)
            .bind(update.address)
            .bind(update.stop_after)
            .bind(now_ms)
            .bind(deployment_id)
            .bind(instance)
            .execute(pool)
            .await?;
            self.count_commit().await;
            Ok(())
        })
    }

    /// Marks an instance `lost` and queues its node's `stop` in the same
    /// transaction: whoever sees it lost sees the stop queued too.
    pub async fn lose_instance(&self, deployment_id: &str, instance: i64, stop: Option<&super::NewCommand>, now_ms: i64) -> Result<(), StoreError> {
        on_db!(self, pool => {
            let mut tx = pool.begin_write().await?;
            sqlx::query("UPDATE instances SET state = 'lost', stop_after = NULL, updated_at = $1 WHERE deployment_id = $2 AND instance = $3")
                .bind(now_ms)
                .bind(deployment_id)
                .bind(instance)
                .execute(&mut *tx)
                .await?;
            if let Some(stop) = stop {
                tx.insert_command(stop, now_ms).await?;
            }
            tx.commit().await?;
            self.count_commit().await;
            Ok(())
        })
    }

    /// Instances waiting to be stopped whose drain period is over.
    pub async fn instances_to_stop(&self, now_ms: i64) -> Result<Vec<InstanceRow>, StoreError> {
        on_db!(self, pool => {
            let rows = sqlx::query(&format!(
                "SELECT {INSTANCE_COLUMNS} FROM instances WHERE state = 'stopping' AND stop_after IS NOT NULL AND stop_after <= $1"
            ))
            .bind(now_ms)
            .fetch_all(pool)
            .await?;
            Ok(rows.iter().map(instance_from_row).collect())
        })
    }

    /// Log lines of a deployment after `after_seq`, oldest first.
    pub async fn deployment_logs(&self, deployment_id: &str, after_seq: i64, limit: i64) -> Result<Vec<(i64, String, String, String)>, StoreError> {
        on_db!(self, pool => {
            let rows = sqlx::query(
                "SELECT seq, ts, stream, line FROM deployment_logs WHERE deployment_id = $1 AND seq > $2 ORDER BY seq LIMIT $3",
            )
            .bind(deployment_id)
            .bind(after_seq)
            .bind(limit)
            .fetch_all(pool)
            .await?;
            Ok(rows.iter().map(|r| (r.get("seq"), r.get("ts"), r.get("stream"), r.get("line"))).collect())
        })
    }
}

impl Store {
    /// What every active instance reserves on its node: `(node_id, cpu,
    /// memory_bytes)` from its app's limits (absent when the app sets none).
    pub async fn reservations(&self) -> Result<Vec<(String, Option<f64>, Option<i64>)>, StoreError> {
        on_db!(self, pool => {
            let rows = sqlx::query(
                "SELECT i.node_id AS node_id, a.cpu AS cpu, a.memory_bytes AS memory_bytes \
             FROM instances i JOIN deployments d ON d.id = i.deployment_id JOIN apps a ON a.name = d.app \
             WHERE i.node_id IS NOT NULL AND i.state IN ('pending', 'running', 'stopping')",
            )
            .fetch_all(pool)
            .await?;
            Ok(rows.iter().map(|r| (r.get("node_id"), r.get("cpu"), r.get("memory_bytes"))).collect())
        })
    }

    /// Apps with active instances on a node, by name.
    pub async fn apps_on_node(&self, node_id: &str) -> Result<Vec<String>, StoreError> {
        on_db!(self, pool => {
            let rows = sqlx::query(
                "SELECT DISTINCT d.app AS app FROM instances i JOIN deployments d ON d.id = i.deployment_id \
             WHERE i.node_id = $1 AND i.state IN ('pending', 'running', 'stopping') ORDER BY d.app",
            )
            .bind(node_id)
            .fetch_all(pool)
            .await?;
            Ok(rows.iter().map(|r| r.get("app")).collect())
        })
    }
}

impl Store {
    /// Places an instance and queues its deploy command, in one
    /// transaction, so an instance is never placed without the command that
    /// starts it (a kill in between would leave it waiting forever). The
    /// instance gets the next container name of its app, `cw-<app>-<n>`,
    /// which `command` receives to build the command. Only an unplaced
    /// instance is placed (compare and set): `None` when another path
    /// placed it first, which would otherwise start a second container.
    pub async fn assign_instance(
        &self,
        deployment_id: &str,
        app: &str,
        instance: i64,
        node_id: &str,
        now_ms: i64,
        command: impl FnOnce(&str) -> super::NewCommand,
    ) -> Result<Option<String>, StoreError> {
        on_db!(self, pool => {
            let mut tx = pool.begin_write().await?;
            let placed: i64 = sqlx::query(
                "SELECT COUNT(*) AS n FROM instances i JOIN deployments d ON d.id = i.deployment_id \
             WHERE d.app = $1 AND i.container IS NOT NULL",
            )
            .bind(app)
            .fetch_one(&mut *tx)
            .await?
            .get("n");
            let container = format!("cw-{app}-{}", placed + 1);
            let updated = sqlx::query(
                "UPDATE instances SET node_id = $1, container = $2, state = 'pending', updated_at = $3 \
             WHERE deployment_id = $4 AND instance = $5 AND node_id IS NULL AND state = 'pending'",
            )
            .bind(node_id)
            .bind(&container)
            .bind(now_ms)
            .bind(deployment_id)
            .bind(instance)
            .execute(&mut *tx)
            .await?;
            if updated.rows_affected() != 1 {
                tx.rollback().await?;
                return Ok(None);
            }
            let command = command(&container);
            tx.insert_command(&command, now_ms).await?;
            tx.commit().await?;
            self.count_commit().await;
            Ok(Some(container))
        })
    }
}

impl Store {
    /// Every app's upstream addresses, as (app, address): its running
    /// instances with an address that are ready; every running one when
    /// none of the app's is (an app whose probes all fail keeps serving
    /// what it can rather than nothing).
    pub async fn running_addresses(&self) -> Result<Vec<(String, String)>, StoreError> {
        on_db!(self, pool => {
            let rows = sqlx::query(
                "SELECT d.app AS app, i.address AS address, i.unready_since AS unready_since FROM instances i JOIN deployments d ON d.id = i.deployment_id \
             WHERE i.state = 'running' AND i.address IS NOT NULL",
            )
            .fetch_all(pool)
            .await?;
            let all: Vec<(String, String, bool)> =
                rows.iter().map(|r| (r.get("app"), r.get("address"), r.get::<Option<i64>, _>("unready_since").is_none())).collect();
            Ok(super::readiness::ready_or_all(all))
        })
    }
}

impl Store {
    /// Records the route table version a stopping deployment's instances
    /// wait for.
    pub async fn set_stop_after_routes(&self, deployment_id: &str, version: i64) -> Result<(), StoreError> {
        on_db!(self, pool => {
            sqlx::query("UPDATE instances SET stop_after_routes = $1 WHERE deployment_id = $2 AND state = 'stopping'")
                .bind(version)
                .bind(deployment_id)
                .execute(pool)
                .await?;
            self.count_commit().await;
            Ok(())
        })
    }
}

impl Store {
    /// Adds an instance to a deployment that replaces instance `replaces`;
    /// returns its number.
    pub async fn insert_replacement(&self, deployment_id: &str, replaces: Option<i64>, now_ms: i64) -> Result<i64, StoreError> {
        on_db!(self, pool => {
            let mut tx = pool.begin_write().await?;
            let next: i64 = sqlx::query("SELECT COALESCE(MAX(instance), 0) + 1 AS n FROM instances WHERE deployment_id = $1")
                .bind(deployment_id)
                .fetch_one(&mut *tx)
                .await?
                .get("n");
            sqlx::query("INSERT INTO instances (deployment_id, instance, state, replaces, updated_at) VALUES ($1, $2, 'pending', $3, $4)")
                .bind(deployment_id)
                .bind(next)
                .bind(replaces)
                .bind(now_ms)
                .execute(&mut *tx)
                .await?;
            tx.commit().await?;
            self.count_commit().await;
            Ok(next)
        })
    }

    /// Whether instance `instance` already has a replacement that is
    /// pending or running, or one that was tried since `since_ms`.
    pub async fn replacement_in_progress(&self, deployment_id: &str, instance: i64, since_ms: i64) -> Result<bool, StoreError> {
        on_db!(self, pool => {
            let n: i64 = sqlx::query(
                "SELECT COUNT(*) AS n FROM instances WHERE deployment_id = $1 AND replaces = $2 \
             AND (state IN ('pending', 'running') OR updated_at >= $3)",
            )
            .bind(deployment_id)
            .bind(instance)
            .bind(since_ms)
            .fetch_one(pool)
            .await?
            .get("n");
            Ok(n > 0)
        })
    }
}

impl Store {
    /// Pending instances that have no node yet, of deployments that are
    /// not finished (they wait for a node).
    pub async fn unplaced_instances(&self) -> Result<Vec<InstanceRow>, StoreError> {
        on_db!(self, pool => {
            let rows = sqlx::query(&format!(
                "SELECT {} FROM instances i JOIN deployments d ON d.id = i.deployment_id \
             WHERE i.node_id IS NULL AND i.state = 'pending' AND d.state IN ('queued', 'building', 'deploying') \
             ORDER BY i.deployment_id, i.instance",
                instance_columns("i")
            ))
            .fetch_all(pool)
            .await?;
            Ok(rows.iter().map(instance_from_row).collect())
        })
    }

    /// Pending instances placed on a node, with their unfinished
    /// deployment: the node has yet to report them running.
    pub async fn placed_unfinished_instances(&self) -> Result<Vec<(InstanceRow, DeploymentRow)>, StoreError> {
        on_db!(self, pool => {
            let rows = sqlx::query(&format!(
                "SELECT {}, d.id AS id, d.seq AS seq, d.app AS app, d.kind AS kind, d.commit_sha AS commit_sha, \
             d.rollback_of AS rollback_of, d.state AS d_state, d.image AS image, d.error AS error, \
             d.created_at AS created_at, d.updated_at AS d_updated_at \
             FROM instances i JOIN deployments d ON d.id = i.deployment_id \
             WHERE i.node_id IS NOT NULL AND i.state = 'pending' AND d.state IN ('queued', 'building', 'deploying')",
                instance_columns("i")
            ))
            .fetch_all(pool)
            .await?;
            Ok(rows
                .iter()
                .map(|row| {
                    let deployment = DeploymentRow {
                        id: row.get("id"),
                        seq: row.get("seq"),
                        app: row.get("app"),
                        kind: row.get("kind"),
                        commit_sha: row.get("commit_sha"),
                        rollback_of: row.get("rollback_of"),
                        state: row.get("d_state"),
                        image: row.get("image"),
                        error: row.get("error"),
                        created_at: row.get("created_at"),
                        updated_at: row.get("d_updated_at"),
                    };
                    (instance_from_row(row), deployment)
                })
                .collect())
        })
    }

    /// Running deployments with no instance running or starting, whose
    /// instances last changed at or before `cutoff_ms`.
    pub async fn running_without_instances(&self, cutoff_ms: i64) -> Result<Vec<DeploymentRow>, StoreError> {
        on_db!(self, pool => {
            let rows = sqlx::query(&format!(
                "SELECT {DEPLOYMENT_COLUMNS} FROM deployments d WHERE d.state = 'running' \
             AND NOT EXISTS (SELECT 1 FROM instances i WHERE i.deployment_id = d.id AND i.state IN ('pending', 'running')) \
             AND (SELECT COALESCE(MAX(i.updated_at), 0) FROM instances i WHERE i.deployment_id = d.id) <= $1"
            ))
            .bind(cutoff_ms)
            .fetch_all(pool)
            .await?;
            Ok(rows.iter().map(deployment_from_row).collect())
        })
    }
}

/// The instance columns under a table alias, named as [`instance_from_row`]
/// reads them.
fn instance_columns(alias: &str) -> String {
    INSTANCE_COLUMNS.split(", ").map(|c| format!("{alias}.{c} AS {c}")).collect::<Vec<_>>().join(", ")
}

/// What [`Store::fail_and_reschedule`] did.
#[derive(Debug, Clone)]
pub enum Rescheduled {
    /// The deployment had already ended (another path moved it first).
    Ended,
    /// A newer deployment of the app is on its way or runs: the deployment
    /// was left as it is.
    NewerOnItsWay,
    /// The deployment failed and its reschedule is queued.
    Queued(DeploymentRow),
}

/// What this module writes inside a caller's write transaction, once per
/// engine (see [`crate::backend::for_both_engines`]).
pub(crate) trait DeploymentsTx {
    /// Compare-and-set of a deployment's state with its event, inside the
    /// caller's transaction.
    async fn move_deployment(&mut self, id: &str, from: &str, to: &str, error: Option<&str>, image: Option<&str>, now_ms: i64) -> Result<bool, StoreError>;
    /// The instances of a deployment that ended: placed ones stop at
    /// `stop_after_ms` (the reconciler sends the stop), unplaced ones fail.
    async fn retire_instances(&mut self, id: &str, stop_after_ms: i64, now_ms: i64) -> Result<(), StoreError>;
    /// Inserts a new deployment (the next `seq`), its first event and its
    /// `instances` pending instances; returns its `seq`.
    async fn insert_new_deployment(&mut self, deployment: &DeploymentRow, instances: i64) -> Result<i64, StoreError>;
}

crate::backend::for_both_engines! {
    impl DeploymentsTx for sqlx::Transaction<'_, DB> {
        async fn move_deployment(&mut self, id: &str, from: &str, to: &str, error: Option<&str>, image: Option<&str>, now_ms: i64) -> Result<bool, StoreError> {
            let tx = self;
            let result = sqlx::query(
                "UPDATE deployments SET state = $1, error = COALESCE($2, error), image = COALESCE($3, image), updated_at = $4 \
                 WHERE id = $5 AND state = $6",
            )
            .bind(to)
            .bind(error)
            .bind(image)
            .bind(now_ms)
            .bind(id)
            .bind(from)
            .execute(&mut **tx)
            .await?;
            if result.rows_affected() != 1 {
                return Ok(false);
            }
            // Only the compare-and-set winner records the step, so each state
            // appears once.
            sqlx::query("INSERT INTO deployment_events (deployment_id, state, at) VALUES ($1, $2, $3)")
                .bind(id)
                .bind(to)
                .bind(now_ms)
                .execute(&mut **tx)
                .await?;
            Ok(true)
        }

        async fn insert_new_deployment(&mut self, deployment: &DeploymentRow, instances: i64) -> Result<i64, StoreError> {
            let tx = self;
            let seq: i64 = sqlx::query("SELECT COALESCE(MAX(seq), 0) + 1 AS seq FROM deployments").fetch_one(&mut **tx).await?.get("seq");
            sqlx::query(&format!(
                "INSERT INTO deployments ({DEPLOYMENT_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)"
            ))
            .bind(&deployment.id)
            .bind(seq)
            .bind(&deployment.app)
            .bind(&deployment.kind)
            .bind(&deployment.commit_sha)
            .bind(&deployment.rollback_of)
            .bind(&deployment.state)
            .bind(&deployment.image)
            .bind(&deployment.error)
            .bind(deployment.created_at)
            .bind(deployment.updated_at)
            .execute(&mut **tx)
            .await?;
            sqlx::query("INSERT INTO deployment_events (deployment_id, state, at) VALUES ($1, $2, $3)")
                .bind(&deployment.id)
                .bind(&deployment.state)
                .bind(deployment.created_at)
                .execute(&mut **tx)
                .await?;
            for instance in 1..=instances {
                sqlx::query("INSERT INTO instances (deployment_id, instance, state, updated_at) VALUES ($1, $2, 'pending', $3)")
                    .bind(&deployment.id)
                    .bind(instance)
                    .bind(deployment.created_at)
                    .execute(&mut **tx)
                    .await?;
            }
            Ok(seq)
        }

        async fn retire_instances(&mut self, id: &str, stop_after_ms: i64, now_ms: i64) -> Result<(), StoreError> {
            let tx = self;
            sqlx::query(
                "UPDATE instances SET state = 'stopping', stop_after = $1, updated_at = $2 \
                 WHERE deployment_id = $3 AND node_id IS NOT NULL AND state IN ('pending', 'running')",
            )
            .bind(stop_after_ms)
            .bind(now_ms)
            .bind(id)
            .execute(&mut **tx)
            .await?;
            sqlx::query("UPDATE instances SET state = 'failed', updated_at = $1 WHERE deployment_id = $2 AND node_id IS NULL AND state = 'pending'")
                .bind(now_ms)
                .bind(id)
                .execute(&mut **tx)
                .await?;
            Ok(())
        }
    }
}
