//! Where alerts go and how their messages get there (issue 26): channels
//! (a webhook, a Slack-compatible webhook, an email address list), the
//! durable queue of deliveries, and every attempt of each. An alert's
//! opening and its resolution are each queued to every channel that wants
//! its kind in one transaction with the alert's `*_sent` flag, so a crash
//! neither loses nor repeats a message; the deliverer that sends them is
//! the core's (`cloudweb_core::alerts::delivery`).

use sqlx::Row;

use super::{Store, StoreError};
use crate::alerts::AlertRow;
use crate::backend::Cols;

/// One channel. `config_sealed` is opened by the caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChannelRow {
    pub id: String,
    /// `""` for the cluster's channels, else the owning user's id.
    pub owner: String,
    pub name: String,
    /// `webhook`, `slack` or `email`.
    pub kind: String,
    /// What may be shown of where it sends.
    pub target: String,
    pub config_sealed: String,
    /// JSON list of alert kinds.
    pub events: String,
    pub created_at: i64,
}

/// One message queued for one channel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeliveryRow {
    pub id: String,
    pub channel_id: String,
    pub alert_id: Option<String>,
    /// `opened`, `resolved` or `test`.
    pub event: String,
    /// The message, JSON.
    pub payload: String,
    /// `pending`, `delivered` or `failed` (given up).
    pub state: String,
    pub attempts: i64,
    pub next_attempt_at: i64,
    pub give_up_at: i64,
    pub last_error: Option<String>,
    pub created_at: i64,
    pub finished_at: Option<i64>,
}

/// One try of a delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttemptRow {
    pub delivery_id: String,
    pub attempt: i64,
    pub at: i64,
    pub duration_ms: i64,
    pub ok: bool,
    /// The answer (HTTP status, SMTP reply) or the error.
    pub outcome: String,
}

/// What follows an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterAttempt {
    Delivered,
    RetryAt(i64),
    GiveUp,
}

const CHANNEL_COLUMNS: &str = "id, owner, name, kind, target, config_sealed, events, created_at";
const DELIVERY_COLUMNS: &str = "id, channel_id, alert_id, event, payload, state, attempts, next_attempt_at, give_up_at, last_error, created_at, finished_at";

fn channel(r: &impl Cols) -> ChannelRow {
    ChannelRow {
        id: r.col("id"),
        owner: r.col("owner"),
        name: r.col("name"),
        kind: r.col("kind"),
        target: r.col("target"),
        config_sealed: r.col("config_sealed"),
        events: r.col("events"),
        created_at: r.col("created_at"),
    }
}

fn delivery(r: &impl Cols) -> DeliveryRow {
    DeliveryRow {
        id: r.col("id"),
        channel_id: r.col("channel_id"),
        alert_id: r.col("alert_id"),
        event: r.col("event"),
        payload: r.col("payload"),
        state: r.col("state"),
        attempts: r.col("attempts"),
        next_attempt_at: r.col("next_attempt_at"),
        give_up_at: r.col("give_up_at"),
        last_error: r.col("last_error"),
        created_at: r.col("created_at"),
        finished_at: r.col("finished_at"),
    }
}

/// Inserts one delivery row on `$executor`.
macro_rules! insert_delivery {
    ($executor:expr, $row:expr) => {{
        let row: &DeliveryRow = $row;
        sqlx::query(
            "INSERT INTO alert_deliveries (id, channel_id, alert_id, event, payload, state, attempts, next_attempt_at, give_up_at, last_error, created_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
        )
        .bind(&row.id)
        .bind(&row.channel_id)
        .bind(&row.alert_id)
        .bind(&row.event)
        .bind(&row.payload)
        .bind(&row.state)
        .bind(row.attempts)
        .bind(row.next_attempt_at)
        .bind(row.give_up_at)
        .bind(&row.last_error)
        .bind(row.created_at)
        .execute($executor)
        .await?;
    }};
}

impl Store {
    /// Adds a channel; `false` when its owner already has one by that name.
    pub async fn insert_alert_channel(&self, row: &ChannelRow) -> Result<bool, StoreError> {
        on_db!(self, pool => {
            let done = sqlx::query(
                "INSERT INTO alert_channels (id, owner, name, kind, target, config_sealed, events, created_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8) \
                 ON CONFLICT (owner, name) DO NOTHING",
            )
            .bind(&row.id)
            .bind(&row.owner)
            .bind(&row.name)
            .bind(&row.kind)
            .bind(&row.target)
            .bind(&row.config_sealed)
            .bind(&row.events)
            .bind(row.created_at)
            .execute(pool)
            .await?;
            self.count_commit().await;
            Ok(done.rows_affected() == 1)
        })
    }

    /// Every channel, the cluster's first.
    pub async fn alert_channels(&self) -> Result<Vec<ChannelRow>, StoreError> {
        on_db!(self, pool => {
            let rows = sqlx::query(&format!("SELECT {CHANNEL_COLUMNS} FROM alert_channels ORDER BY owner, name")).fetch_all(pool).await?;
            Ok(rows.iter().map(channel).collect())
        })
    }

    pub async fn alert_channel(&self, id: &str) -> Result<Option<ChannelRow>, StoreError> {
        on_db!(self, pool => {
            let row = sqlx::query(&format!("SELECT {CHANNEL_COLUMNS} FROM alert_channels WHERE id = $1")).bind(id).fetch_optional(pool).await?;
            Ok(row.map(|r| channel(&r)))
        })
    }

    /// Deletes a channel with its queue and its delivery history (asked
    /// for explicitly); `false` when there was none.
    pub async fn delete_alert_channel(&self, id: &str) -> Result<bool, StoreError> {
        on_db!(self, pool => {
            let mut tx = pool.begin_write().await?;
            sqlx::query("DELETE FROM alert_delivery_attempts WHERE delivery_id IN (SELECT id FROM alert_deliveries WHERE channel_id = $1)")
                .bind(id)
                .execute(&mut *tx)
                .await?;
            sqlx::query("DELETE FROM alert_deliveries WHERE channel_id = $1").bind(id).execute(&mut *tx).await?;
            let done = sqlx::query("DELETE FROM alert_channels WHERE id = $1").bind(id).execute(&mut *tx).await?;
            tx.commit().await?;
            self.count_commit().await;
            Ok(done.rows_affected() == 1)
        })
    }

    /// Alerts whose opening or resolution is not queued yet, oldest first,
    /// each with whether its opening is.
    pub async fn unsent_alerts(&self, limit: i64) -> Result<Vec<(AlertRow, bool)>, StoreError> {
        let unsent = on_db!(self, pool => {
            let rows = sqlx::query(
                "SELECT id, opened_sent FROM alerts WHERE opened_sent = 0 OR (resolved_at IS NOT NULL AND resolved_sent = 0) ORDER BY last_seen_at, id LIMIT $1",
            )
            .bind(limit)
            .fetch_all(pool)
            .await?;
            Ok::<Vec<(String, i64)>, StoreError>(rows.iter().map(|r| (r.get("id"), r.get("opened_sent"))).collect())
        })?;
        let mut rows = Vec::with_capacity(unsent.len());
        for (id, opened_sent) in unsent {
            if let Some(row) = self.alert(&id).await? {
                rows.push((row, opened_sent != 0));
            }
        }
        Ok(rows)
    }

    /// Queues `deliveries` (all for alert `alert_id`'s `event`, `opened` or
    /// `resolved`) and marks the event sent, in one transaction.
    pub async fn fan_out_alert(&self, alert_id: &str, event: &str, deliveries: &[DeliveryRow]) -> Result<(), StoreError> {
        let flag = match event {
            "opened" => "opened_sent",
            "resolved" => "resolved_sent",
            other => return Err(StoreError::Invariant(format!("not an alert event: {other}"))),
        };
        on_db!(self, pool => {
            let mut tx = pool.begin_write().await?;
            for row in deliveries {
                insert_delivery!(&mut *tx, row);
            }
            sqlx::query(&format!("UPDATE alerts SET {flag} = 1 WHERE id = $1")).bind(alert_id).execute(&mut *tx).await?;
            tx.commit().await?;
            self.count_commit().await;
            Ok(())
        })
    }

    /// Queues one delivery (a test message).
    pub async fn queue_alert_delivery(&self, row: &DeliveryRow) -> Result<(), StoreError> {
        on_db!(self, pool => {
            insert_delivery!(pool, row);
            self.count_commit().await;
            Ok(())
        })
    }

    /// Pending deliveries due at `now`, the longest waiting first.
    pub async fn due_alert_deliveries(&self, now: i64, limit: i64) -> Result<Vec<DeliveryRow>, StoreError> {
        on_db!(self, pool => {
            let rows = sqlx::query(&format!(
                "SELECT {DELIVERY_COLUMNS} FROM alert_deliveries WHERE state = 'pending' AND next_attempt_at <= $1 ORDER BY next_attempt_at, created_at LIMIT $2"
            ))
            .bind(now)
            .bind(limit)
            .fetch_all(pool)
            .await?;
            Ok(rows.iter().map(delivery).collect())
        })
    }

    /// The soonest a pending delivery is due, if any is.
    pub async fn next_alert_delivery_at(&self) -> Result<Option<i64>, StoreError> {
        on_db!(self, pool => {
            let row = sqlx::query("SELECT MIN(next_attempt_at) AS at FROM alert_deliveries WHERE state = 'pending'").fetch_one(pool).await?;
            Ok(row.get::<Option<i64>, _>("at"))
        })
    }

    /// Moves a pending delivery to `at` without counting an attempt (its
    /// channel's rate limit).
    pub async fn postpone_alert_delivery(&self, id: &str, at: i64) -> Result<(), StoreError> {
        on_db!(self, pool => {
            sqlx::query("UPDATE alert_deliveries SET next_attempt_at = $1 WHERE id = $2 AND state = 'pending'").bind(at).bind(id).execute(pool).await?;
            self.count_commit().await;
            Ok(())
        })
    }

    /// Records an attempt and what follows it.
    pub async fn record_alert_attempt(&self, attempt: &AttemptRow, after: AfterAttempt) -> Result<(), StoreError> {
        let (state, next, finished) = match after {
            AfterAttempt::Delivered => ("delivered", None, Some(attempt.at)),
            AfterAttempt::RetryAt(at) => ("pending", Some(at), None),
            AfterAttempt::GiveUp => ("failed", None, Some(attempt.at)),
        };
        let error = (!attempt.ok).then_some(attempt.outcome.as_str());
        on_db!(self, pool => {
            let mut tx = pool.begin_write().await?;
            // Only for a delivery still there (its channel may have been
            // deleted while it was being sent).
            sqlx::query(
                "INSERT INTO alert_delivery_attempts (delivery_id, attempt, at, duration_ms, ok, outcome) \
                 SELECT $1, $2, $3, $4, $5, $6 WHERE EXISTS (SELECT 1 FROM alert_deliveries WHERE id = $1) ON CONFLICT DO NOTHING",
            )
                .bind(&attempt.delivery_id)
                .bind(attempt.attempt)
                .bind(attempt.at)
                .bind(attempt.duration_ms)
                .bind(i64::from(attempt.ok))
                .bind(&attempt.outcome)
                .execute(&mut *tx)
                .await?;
            sqlx::query(
                "UPDATE alert_deliveries SET state = $1, attempts = $2, next_attempt_at = COALESCE($3, next_attempt_at), last_error = $4, finished_at = $5 WHERE id = $6",
            )
            .bind(state)
            .bind(attempt.attempt)
            .bind(next)
            .bind(error)
            .bind(finished)
            .bind(&attempt.delivery_id)
            .execute(&mut *tx)
            .await?;
            tx.commit().await?;
            self.count_commit().await;
            Ok(())
        })
    }

    /// A channel's deliveries, newest first.
    pub async fn alert_deliveries_of(&self, channel_id: &str, limit: i64) -> Result<Vec<DeliveryRow>, StoreError> {
        on_db!(self, pool => {
            let rows = sqlx::query(&format!("SELECT {DELIVERY_COLUMNS} FROM alert_deliveries WHERE channel_id = $1 ORDER BY created_at DESC, id DESC LIMIT $2"))
                .bind(channel_id)
                .bind(limit)
                .fetch_all(pool)
                .await?;
            Ok(rows.iter().map(delivery).collect())
        })
    }

    pub async fn alert_delivery(&self, id: &str) -> Result<Option<DeliveryRow>, StoreError> {
        on_db!(self, pool => {
            let row = sqlx::query(&format!("SELECT {DELIVERY_COLUMNS} FROM alert_deliveries WHERE id = $1")).bind(id).fetch_optional(pool).await?;
            Ok(row.map(|r| delivery(&r)))
        })
    }

    /// A delivery's attempts, in order.
    pub async fn alert_attempts(&self, delivery_id: &str) -> Result<Vec<AttemptRow>, StoreError> {
        on_db!(self, pool => {
            let rows = sqlx::query("SELECT delivery_id, attempt, at, duration_ms, ok, outcome FROM alert_delivery_attempts WHERE delivery_id = $1 ORDER BY attempt")
                .bind(delivery_id)
                .fetch_all(pool)
                .await?;
            Ok(rows
                .iter()
                .map(|r| AttemptRow {
                    delivery_id: r.get("delivery_id"),
                    attempt: r.get("attempt"),
                    at: r.get("at"),
                    duration_ms: r.get("duration_ms"),
                    ok: r.get::<i64, _>("ok") != 0,
                    outcome: r.get("outcome"),
                })
                .collect())
        })
    }

    /// Deletes finished deliveries (and their attempts) finished before
    /// `before`; pending ones are kept.
    pub async fn prune_alert_deliveries(&self, before: i64) -> Result<u64, StoreError> {
        on_db!(self, pool => {
            let mut tx = pool.begin_write().await?;
            sqlx::query(
                "DELETE FROM alert_delivery_attempts WHERE delivery_id IN (SELECT id FROM alert_deliveries WHERE finished_at IS NOT NULL AND finished_at < $1)",
            )
            .bind(before)
            .execute(&mut *tx)
            .await?;
            let done = sqlx::query("DELETE FROM alert_deliveries WHERE finished_at IS NOT NULL AND finished_at < $1").bind(before).execute(&mut *tx).await?;
            tx.commit().await?;
            self.count_commit().await;
            Ok(done.rows_affected())
        })
    }
}


#[cfg(test)]
mod tests {
    use super::*;
    use crate::alerts::Raise;

    fn channel(id: &str, owner: &str, name: &str) -> ChannelRow {
        ChannelRow {
            id: id.into(),
            owner: owner.into(),
            name: name.into(),
            kind: "webhook".into(),
            target: "https://hooks.example.com".into(),
            config_sealed: "sealed".into(),
            events: "[\"deploy_failed\"]".into(),
            created_at: 1,
        }
    }

    fn queued(id: &str, channel_id: &str, alert_id: &str, event: &str) -> DeliveryRow {
        DeliveryRow {
            id: id.into(),
            channel_id: channel_id.into(),
            alert_id: Some(alert_id.into()),
            event: event.into(),
            payload: "{}".into(),
            state: "pending".into(),
            attempts: 0,
            next_attempt_at: 100,
            give_up_at: 1000,
            last_error: None,
            created_at: 100,
            finished_at: None,
        }
    }

    crate::test_engines::both_engines! {
        async fn an_alert_is_queued_once_per_change_and_each_attempt_is_kept(store) {
            assert!(store.insert_alert_channel(&channel("ch_1", "", "ops")).await.unwrap());
            assert!(!store.insert_alert_channel(&channel("ch_2", "", "ops")).await.unwrap(), "one name per owner");
            assert!(store.insert_alert_channel(&channel("ch_3", "usr_1", "ops")).await.unwrap(), "another owner may use it");
            let raise = Raise { id: "alt_1", kind: "deploy_failed", subject: "web", severity: "critical", summary: "failed", detail: None, now: 50 };
            store.raise_alert(&raise).await.unwrap();
            let unsent = store.unsent_alerts(10).await.unwrap();
            assert_eq!(unsent.iter().map(|(a, sent)| (a.id.as_str(), *sent)).collect::<Vec<_>>(), [("alt_1", false)]);
            store.fan_out_alert("alt_1", "opened", &[queued("dlv_1", "ch_1", "alt_1", "opened")]).await.unwrap();
            assert!(store.unsent_alerts(10).await.unwrap().is_empty(), "the opening went out once");
            store.resolve_alert("deploy_failed", "web", 60).await.unwrap();
            assert_eq!(store.unsent_alerts(10).await.unwrap().iter().map(|(a, sent)| (a.id.as_str(), *sent)).collect::<Vec<_>>(), [("alt_1", true)], "now its resolution");
            store.fan_out_alert("alt_1", "resolved", &[queued("dlv_2", "ch_1", "alt_1", "resolved")]).await.unwrap();
            assert!(store.unsent_alerts(10).await.unwrap().is_empty());

            assert!(store.due_alert_deliveries(99, 10).await.unwrap().is_empty(), "not due yet");
            assert_eq!(store.due_alert_deliveries(100, 10).await.unwrap().len(), 2);
            assert_eq!(store.next_alert_delivery_at().await.unwrap(), Some(100));
            let failed = AttemptRow { delivery_id: "dlv_1".into(), attempt: 1, at: 100, duration_ms: 5, ok: false, outcome: "HTTP 500".into() };
            store.record_alert_attempt(&failed, AfterAttempt::RetryAt(200)).await.unwrap();
            let row = store.alert_delivery("dlv_1").await.unwrap().unwrap();
            assert_eq!((row.state.as_str(), row.attempts, row.next_attempt_at, row.last_error.as_deref()), ("pending", 1, 200, Some("HTTP 500")));
            let good = AttemptRow { delivery_id: "dlv_1".into(), attempt: 2, at: 200, duration_ms: 3, ok: true, outcome: "HTTP 204".into() };
            store.record_alert_attempt(&good, AfterAttempt::Delivered).await.unwrap();
            let row = store.alert_delivery("dlv_1").await.unwrap().unwrap();
            assert_eq!((row.state.as_str(), row.attempts, row.last_error, row.finished_at), ("delivered", 2, None, Some(200)));
            assert_eq!(store.alert_attempts("dlv_1").await.unwrap().iter().map(|a| a.ok).collect::<Vec<_>>(), [false, true]);
            store.postpone_alert_delivery("dlv_2", 500).await.unwrap();
            assert_eq!(store.next_alert_delivery_at().await.unwrap(), Some(500));
            let gone = AttemptRow { delivery_id: "dlv_2".into(), attempt: 1, at: 1000, duration_ms: 10_000, ok: false, outcome: "timed out".into() };
            store.record_alert_attempt(&gone, AfterAttempt::GiveUp).await.unwrap();
            assert_eq!(store.alert_delivery("dlv_2").await.unwrap().unwrap().state, "failed");
            assert_eq!(store.next_alert_delivery_at().await.unwrap(), None);
            assert_eq!(store.alert_deliveries_of("ch_1", 10).await.unwrap().len(), 2);
            assert_eq!(store.prune_alert_deliveries(300).await.unwrap(), 1, "the one finished before 300");
            assert!(store.delete_alert_channel("ch_1").await.unwrap());
            assert!(store.alert_deliveries_of("ch_1", 10).await.unwrap().is_empty());
            // An attempt that ends after its channel went leaves nothing.
            let late = AttemptRow { delivery_id: "dlv_1".into(), attempt: 3, at: 300, duration_ms: 1, ok: true, outcome: "HTTP 200".into() };
            store.record_alert_attempt(&late, AfterAttempt::Delivered).await.unwrap();
            assert!(store.alert_attempts("dlv_1").await.unwrap().is_empty());
            assert_eq!(store.alert_channels().await.unwrap().len(), 1);
        }
    }
}
