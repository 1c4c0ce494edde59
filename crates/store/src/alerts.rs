//! Alerts (issue 26): conditions the control plane watches, open while
//! they hold and resolved when they are over; a condition (`dedupe_key`)
//! is open at most once. The evaluator that raises and resolves them is
//! the core's (`cloudweb_core::alerts`); the cursor it keeps in the tables
//! it follows is here too.

use sqlx::Row;

use super::{Store, StoreError};
use crate::backend::Cols;

/// One alert.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AlertRow {
    pub id: String,
    pub kind: String,
    pub subject: String,
    pub dedupe_key: String,
    pub severity: String,
    pub summary: String,
    pub detail: Option<String>,
    pub opened_at: i64,
    pub last_seen_at: i64,
    pub resolved_at: Option<i64>,
    pub occurrences: i64,
}

/// A condition seen to hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Raise<'a> {
    /// A new alert's id (used only when none is open for the key).
    pub id: &'a str,
    pub kind: &'a str,
    pub subject: &'a str,
    pub severity: &'a str,
    pub summary: &'a str,
    pub detail: Option<&'a str>,
    pub now: i64,
}

/// What a raise did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Raised {
    /// A new alert opened.
    Opened(AlertRow),
    /// The open one was seen again.
    Seen(AlertRow),
}

/// A running instance that crash-loops, with its app.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoopingInstance {
    pub app: String,
    pub deployment_id: String,
    pub instance: i64,
    /// JSON, as the control plane wrote it.
    pub crash_loop: String,
}

/// A deployment that reached `failed` or `running`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeploymentOutcome {
    pub seq: i64,
    pub deployment_id: String,
    pub app: String,
    pub state: String,
    pub error: Option<String>,
    pub at: i64,
}

const COLUMNS: &str = "id, kind, subject, dedupe_key, severity, summary, detail, opened_at, last_seen_at, resolved_at, occurrences";

fn alert(r: &impl Cols) -> AlertRow {
    AlertRow {
        id: r.col("id"),
        kind: r.col("kind"),
        subject: r.col("subject"),
        dedupe_key: r.col("dedupe_key"),
        severity: r.col("severity"),
        summary: r.col("summary"),
        detail: r.col("detail"),
        opened_at: r.col("opened_at"),
        last_seen_at: r.col("last_seen_at"),
        resolved_at: r.col("resolved_at"),
        occurrences: r.col("occurrences"),
    }
}

/// The key a condition is open under.
pub fn dedupe_key(kind: &str, subject: &str) -> String {
    format!("{kind}:{subject}")
}

impl Store {
    /// Opens an alert for a condition, or counts it again when one is open.
    pub async fn raise_alert(&self, raise: &Raise<'_>) -> Result<Raised, StoreError> {
        let key = dedupe_key(raise.kind, raise.subject);
        on_db!(self, pool => {
            let mut tx = pool.begin_write().await?;
            let open = sqlx::query(&format!("SELECT {COLUMNS} FROM alerts WHERE dedupe_key = $1 AND resolved_at IS NULL"))
                .bind(&key)
                .fetch_optional(&mut *tx)
                .await?;
            let raised = match open {
                Some(row) => {
                    let row = alert(&row);
                    sqlx::query("UPDATE alerts SET last_seen_at = $1, occurrences = occurrences + 1, summary = $2, detail = $3 WHERE id = $4")
                        .bind(raise.now)
                        .bind(raise.summary)
                        .bind(raise.detail)
                        .bind(&row.id)
                        .execute(&mut *tx)
                        .await?;
                    Raised::Seen(AlertRow { last_seen_at: raise.now, occurrences: row.occurrences + 1, summary: raise.summary.to_string(), detail: raise.detail.map(str::to_string), ..row })
                }
                None => {
                    sqlx::query(
                        "INSERT INTO alerts (id, kind, subject, dedupe_key, severity, summary, detail, opened_at, last_seen_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $8)",
                    )
                    .bind(raise.id)
                    .bind(raise.kind)
                    .bind(raise.subject)
                    .bind(&key)
                    .bind(raise.severity)
                    .bind(raise.summary)
                    .bind(raise.detail)
                    .bind(raise.now)
                    .execute(&mut *tx)
                    .await?;
                    Raised::Opened(AlertRow {
                        id: raise.id.to_string(),
                        kind: raise.kind.to_string(),
                        subject: raise.subject.to_string(),
                        dedupe_key: key,
                        severity: raise.severity.to_string(),
                        summary: raise.summary.to_string(),
                        detail: raise.detail.map(str::to_string),
                        opened_at: raise.now,
                        last_seen_at: raise.now,
                        resolved_at: None,
                        occurrences: 1,
                    })
                }
            };
            tx.commit().await?;
            self.count_commit().await;
            Ok(raised)
        })
    }

    /// Resolves the open alert of a condition; the alert, or `None` when
    /// none was open.
    pub async fn resolve_alert(&self, kind: &str, subject: &str, now: i64) -> Result<Option<AlertRow>, StoreError> {
        let key = dedupe_key(kind, subject);
        on_db!(self, pool => {
            let row = sqlx::query(&format!("UPDATE alerts SET resolved_at = $1 WHERE dedupe_key = $2 AND resolved_at IS NULL RETURNING {COLUMNS}"))
                .bind(now)
                .bind(&key)
                .fetch_optional(pool)
                .await?;
            self.count_commit().await;
            Ok(row.map(|r| alert(&r)))
        })
    }

    pub async fn alert(&self, id: &str) -> Result<Option<AlertRow>, StoreError> {
        on_db!(self, pool => {
            let row = sqlx::query(&format!("SELECT {COLUMNS} FROM alerts WHERE id = $1")).bind(id).fetch_optional(pool).await?;
            Ok(row.map(|r| alert(&r)))
        })
    }

    /// Alerts, newest first: the open ones only, or all (at most `limit`).
    pub async fn alerts(&self, open_only: bool, limit: i64) -> Result<Vec<AlertRow>, StoreError> {
        on_db!(self, pool => {
            let rows = sqlx::query(&format!(
                "SELECT {COLUMNS} FROM alerts WHERE ($1 = 0 OR resolved_at IS NULL) ORDER BY opened_at DESC, id DESC LIMIT $2"
            ))
            .bind(i64::from(open_only))
            .bind(limit)
            .fetch_all(pool)
            .await?;
            Ok(rows.iter().map(alert).collect())
        })
    }

    /// The open alerts of one kind.
    pub async fn open_alerts_of(&self, kind: &str) -> Result<Vec<AlertRow>, StoreError> {
        on_db!(self, pool => {
            let rows = sqlx::query(&format!("SELECT {COLUMNS} FROM alerts WHERE kind = $1 AND resolved_at IS NULL ORDER BY opened_at"))
                .bind(kind)
                .fetch_all(pool)
                .await?;
            Ok(rows.iter().map(alert).collect())
        })
    }

    /// Deletes resolved alerts resolved before `before` (retention).
    pub async fn prune_alerts(&self, before: i64) -> Result<u64, StoreError> {
        on_db!(self, pool => {
            let done = sqlx::query("DELETE FROM alerts WHERE resolved_at IS NOT NULL AND resolved_at < $1").bind(before).execute(pool).await?;
            self.count_commit().await;
            Ok(done.rows_affected())
        })
    }

    /// The evaluator's cursor `name`, or `None` before its first run.
    pub async fn alert_cursor(&self, name: &str) -> Result<Option<i64>, StoreError> {
        on_db!(self, pool => {
            let row = sqlx::query("SELECT value FROM alert_cursor WHERE name = $1").bind(name).fetch_optional(pool).await?;
            Ok(row.map(|r| r.get("value")))
        })
    }

    pub async fn set_alert_cursor(&self, name: &str, value: i64) -> Result<(), StoreError> {
        on_db!(self, pool => {
            sqlx::query("INSERT INTO alert_cursor (name, value) VALUES ($1, $2) ON CONFLICT (name) DO UPDATE SET value = excluded.value")
                .bind(name)
                .bind(value)
                .execute(pool)
                .await?;
            self.count_commit().await;
            Ok(())
        })
    }

    /// The newest deployment event's number (where a first run starts).
    pub async fn last_deployment_event(&self) -> Result<i64, StoreError> {
        on_db!(self, pool => {
            let row = sqlx::query("SELECT CAST(COALESCE(MAX(seq), 0) AS BIGINT) AS seq FROM deployment_events").fetch_one(pool).await?;
            Ok(row.get("seq"))
        })
    }

    /// Deployments that reached `failed` or `running` after event `after`,
    /// in order (at most `limit`).
    pub async fn deployment_outcomes(&self, after: i64, limit: i64) -> Result<Vec<DeploymentOutcome>, StoreError> {
        on_db!(self, pool => {
            let rows = sqlx::query(
                "SELECT e.seq, e.deployment_id, e.state, e.at, d.app, d.error FROM deployment_events e JOIN deployments d ON d.id = e.deployment_id \
                 WHERE e.seq > $1 AND e.state IN ('failed', 'running') ORDER BY e.seq LIMIT $2",
            )
            .bind(after)
            .bind(limit)
            .fetch_all(pool)
            .await?;
            Ok(rows
                .iter()
                .map(|r| DeploymentOutcome {
                    seq: r.get("seq"),
                    deployment_id: r.get("deployment_id"),
                    app: r.get("app"),
                    state: r.get("state"),
                    error: r.get("error"),
                    at: r.get("at"),
                })
                .collect())
        })
    }

    /// Every running instance that crash-loops.
    pub async fn looping_instances(&self) -> Result<Vec<LoopingInstance>, StoreError> {
        on_db!(self, pool => {
            let rows = sqlx::query(
                "SELECT d.app, i.deployment_id, i.instance, i.crash_loop FROM instances i JOIN deployments d ON d.id = i.deployment_id \
                 WHERE i.crash_loop IS NOT NULL AND i.state = 'running' ORDER BY d.app, i.instance",
            )
            .fetch_all(pool)
            .await?;
            Ok(rows
                .iter()
                .map(|r| LoopingInstance { app: r.get("app"), deployment_id: r.get("deployment_id"), instance: r.get("instance"), crash_loop: r.get("crash_loop") })
                .collect())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raise<'a>(id: &'a str, subject: &'a str, now: i64) -> Raise<'a> {
        Raise { id, kind: "node_unreachable", subject, severity: "critical", summary: "node n-1 is unreachable", detail: None, now }
    }

    crate::test_engines::both_engines! {
        async fn a_condition_is_open_once_and_resolved_once(store) {
            let Raised::Opened(first) = store.raise_alert(&raise("alt_1", "n-1", 10)).await.unwrap() else { panic!("opened") };
            assert_eq!(first.occurrences, 1);
            // Seen again: the same alert, counted.
            let Raised::Seen(again) = store.raise_alert(&raise("alt_2", "n-1", 20)).await.unwrap() else { panic!("seen") };
            assert_eq!((again.id.as_str(), again.occurrences, again.last_seen_at), ("alt_1", 2, 20));
            // Another subject is another alert.
            assert!(matches!(store.raise_alert(&raise("alt_3", "n-2", 30)).await.unwrap(), Raised::Opened(_)));
            assert_eq!(store.alerts(true, 10).await.unwrap().len(), 2);
            let resolved = store.resolve_alert("node_unreachable", "n-1", 40).await.unwrap().unwrap();
            assert_eq!((resolved.id.as_str(), resolved.resolved_at), ("alt_1", Some(40)));
            assert_eq!(store.resolve_alert("node_unreachable", "n-1", 41).await.unwrap(), None, "resolved once");
            // The next outage is a new alert.
            assert!(matches!(store.raise_alert(&raise("alt_4", "n-1", 50)).await.unwrap(), Raised::Opened(a) if a.id == "alt_4"));
            assert_eq!(store.alerts(false, 10).await.unwrap().iter().map(|a| a.id.as_str()).collect::<Vec<_>>(), ["alt_4", "alt_3", "alt_1"]);
            assert_eq!(store.open_alerts_of("node_unreachable").await.unwrap().len(), 2);
            assert_eq!(store.prune_alerts(45).await.unwrap(), 1);
            assert_eq!(store.alert_cursor("deployments").await.unwrap(), None);
            store.set_alert_cursor("deployments", 7).await.unwrap();
            store.set_alert_cursor("deployments", 9).await.unwrap();
            assert_eq!(store.alert_cursor("deployments").await.unwrap(), Some(9));
            assert_eq!(store.last_deployment_event().await.unwrap(), 0);
            assert!(store.deployment_outcomes(0, 10).await.unwrap().is_empty());
            assert!(store.looping_instances().await.unwrap().is_empty());
        }
    }
}
