//! Autoscaling (issue 25): an app's settings (`apps.autoscale`, JSON as
//! the API checked it) and the record of the autoscaler's decisions, the
//! newest [`KEPT`] per app.

use sqlx::Row;

use super::{Store, StoreError};

/// Decisions kept per app.
pub const KEPT: i64 = 200;

/// One recorded decision.
#[derive(Debug, Clone, PartialEq)]
pub struct DecisionRow {
    pub at: i64,
    pub from: i64,
    pub to: i64,
    pub metric: String,
    pub value: Option<f64>,
    pub target: f64,
    pub reason: String,
}

impl Store {
    /// Sets (or clears, with `None`) an app's autoscaling; false when there
    /// is no such app.
    pub async fn set_app_autoscale(&self, app: &str, settings: Option<&str>) -> Result<bool, StoreError> {
        on_db!(self, pool => {
            let result = sqlx::query("UPDATE apps SET autoscale = $1 WHERE name = $2").bind(settings).bind(app).execute(pool).await?;
            self.count_commit().await;
            Ok(result.rows_affected() == 1)
        })
    }

    /// An app's autoscaling settings: `None` when there is no such app,
    /// `Some(None)` when it is off.
    pub async fn app_autoscale(&self, app: &str) -> Result<Option<Option<String>>, StoreError> {
        on_db!(self, pool => {
            let row = sqlx::query("SELECT autoscale FROM apps WHERE name = $1").bind(app).fetch_optional(pool).await?;
            Ok(row.map(|r| r.get("autoscale")))
        })
    }

    /// Every app with autoscaling on: (name, settings).
    pub async fn autoscaled_apps(&self) -> Result<Vec<(String, String)>, StoreError> {
        on_db!(self, pool => {
            let rows = sqlx::query("SELECT name, autoscale FROM apps WHERE autoscale IS NOT NULL ORDER BY name").fetch_all(pool).await?;
            Ok(rows.iter().map(|r| (r.get("name"), r.get("autoscale"))).collect())
        })
    }

    /// Records a decision and drops the app's older ones beyond [`KEPT`].
    pub async fn record_autoscale_decision(&self, app: &str, decision: &DecisionRow) -> Result<(), StoreError> {
        on_db!(self, pool => {
            let mut tx = pool.begin_write().await?;
            sqlx::query("INSERT INTO autoscale_decisions (app, at, from_count, to_count, metric, value, target, reason) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)")
                .bind(app)
                .bind(decision.at)
                .bind(decision.from)
                .bind(decision.to)
                .bind(&decision.metric)
                .bind(decision.value)
                .bind(decision.target)
                .bind(&decision.reason)
                .execute(&mut *tx)
                .await?;
            sqlx::query("DELETE FROM autoscale_decisions WHERE app = $1 AND id NOT IN (SELECT id FROM autoscale_decisions WHERE app = $1 ORDER BY id DESC LIMIT $2)")
                .bind(app)
                .bind(KEPT)
                .execute(&mut *tx)
                .await?;
            tx.commit().await?;
            self.count_commit().await;
            Ok(())
        })
    }

    /// An app's decisions, newest first.
    pub async fn autoscale_decisions(&self, app: &str, limit: i64) -> Result<Vec<DecisionRow>, StoreError> {
        on_db!(self, pool => {
            let rows = sqlx::query("SELECT at, from_count, to_count, metric, value, target, reason FROM autoscale_decisions WHERE app = $1 ORDER BY id DESC LIMIT $2")
                .bind(app)
                .bind(limit)
                .fetch_all(pool)
                .await?;
            Ok(rows
                .iter()
                .map(|r| DecisionRow {
                    at: r.get("at"),
                    from: r.get("from_count"),
                    to: r.get("to_count"),
                    metric: r.get("metric"),
                    value: r.get("value"),
                    target: r.get("target"),
                    reason: r.get("reason"),
                })
                .collect())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    crate::test_engines::both_engines! {
        async fn settings_and_decisions_are_kept_and_go_with_the_app(store) {
            store.insert_app(&crate::deployment_tests::app(), "web.example").await.unwrap().unwrap();
            assert_eq!(store.app_autoscale("web").await.unwrap(), Some(None));
            assert_eq!(store.app_autoscale("nope").await.unwrap(), None);
            assert!(store.set_app_autoscale("web", Some(r#"{"min":1}"#)).await.unwrap());
            assert!(!store.set_app_autoscale("nope", Some("{}")).await.unwrap());
            assert_eq!(store.autoscaled_apps().await.unwrap(), [("web".to_string(), r#"{"min":1}"#.to_string())]);
            for n in 0..(KEPT + 5) {
                let decision = DecisionRow { at: n, from: 1, to: 2, metric: "cpu_percent".into(), value: Some(90.5), target: 70.0, reason: format!("d{n}") };
                store.record_autoscale_decision("web", &decision).await.unwrap();
            }
            let kept = store.autoscale_decisions("web", 1000).await.unwrap();
            assert_eq!(kept.len() as i64, KEPT);
            assert_eq!(kept[0].reason, format!("d{}", KEPT + 4), "newest first");
            assert_eq!(kept[0].value, Some(90.5));
            assert!(store.delete_app("web").await.unwrap());
            assert!(store.autoscale_decisions("web", 10).await.unwrap().is_empty());
        }
    }
}
