//! Major version upgrades of managed services: one row per upgrade, moved
//! along by the backups watcher (see migration 0025).

use sqlx::Row;

use crate::backend::Cols;
use crate::{Store, StoreError};

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UpgradeRow {
    pub id: String,
    pub service: String,
    pub to_service: String,
    pub from_version: String,
    pub version: String,
    pub state: String,
    pub backup_job: Option<String>,
    pub restore_job: Option<String>,
    pub message: Option<String>,
    pub created_at: i64,
    pub finished_at: Option<i64>,
}

const COLUMNS: &str = "id, service, to_service, from_version, version, state, backup_job, restore_job, message, created_at, finished_at";

fn from_row(row: &impl Cols) -> UpgradeRow {
    UpgradeRow {
        id: row.col("id"),
        service: row.col("service"),
        to_service: row.col("to_service"),
        from_version: row.col("from_version"),
        version: row.col("version"),
        state: row.col("state"),
        backup_job: row.col("backup_job"),
        restore_job: row.col("restore_job"),
        message: row.col("message"),
        created_at: row.col("created_at"),
        finished_at: row.col("finished_at"),
    }
}

/// The states an upgrade is unfinished in.
pub const UNFINISHED: [&str; 3] = ["backing_up", "restoring", "switching"];

/// What [`Store::switch_upgrade_links`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Switch {
    /// The links moved; the upgrade is `switching`.
    Moved,
    /// It was not `restoring` (moved already, or ended).
    NotRestoring,
    /// The new service is gone (deleted meanwhile): nothing moved.
    NewServiceGone,
    /// These apps are linked to both services: nothing moved.
    LinkedToBoth(Vec<String>),
}

impl Store {
    /// Records a new upgrade; `Err(why)` when either service is in an
    /// unfinished upgrade already (from it or into it), or the new service
    /// exists.
    pub async fn insert_upgrade(&self, row: &UpgradeRow) -> Result<Result<(), String>, StoreError> {
        on_db!(self, pool => {
            let mut tx = pool.begin_write().await?;
            // Neither service may be in another unfinished upgrade, and the new
            // one must not exist: checked in the write that starts it.
            let busy: Option<String> = sqlx::query(
                "SELECT id FROM service_upgrades WHERE (service IN ($1, $2) OR to_service IN ($1, $2)) AND state IN ('backing_up', 'restoring', 'switching')",
            )
            .bind(&row.service)
            .bind(&row.to_service)
            .fetch_optional(&mut *tx)
            .await?
            .map(|r| format!("the unfinished upgrade {} involves {} or {} already", r.get::<String, _>("id"), row.service, row.to_service));
            let taken = match busy {
                Some(busy) => Some(busy),
                None => sqlx::query("SELECT name FROM services WHERE name = $1")
                    .bind(&row.to_service)
                    .fetch_optional(&mut *tx)
                    .await?
                    .map(|_| format!("a service named {} exists already", row.to_service)),
            };
            if let Some(refusal) = taken {
                tx.rollback().await?;
                return Ok(Err(refusal));
            }
            sqlx::query(&format!("INSERT INTO service_upgrades ({COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)"))
                .bind(&row.id)
                .bind(&row.service)
                .bind(&row.to_service)
                .bind(&row.from_version)
                .bind(&row.version)
                .bind(&row.state)
                .bind(&row.backup_job)
                .bind(&row.restore_job)
                .bind(&row.message)
                .bind(row.created_at)
                .bind(row.finished_at)
                .execute(&mut *tx)
                .await?;
            tx.commit().await?;
            self.count_commit().await;
            Ok(Ok(()))
        })
    }

    /// The unfinished upgrades, oldest first.
    pub async fn unfinished_upgrades(&self) -> Result<Vec<UpgradeRow>, StoreError> {
        on_db!(self, pool => {
            let rows = sqlx::query(&format!(
                "SELECT {COLUMNS} FROM service_upgrades WHERE state IN ('backing_up', 'restoring', 'switching') ORDER BY created_at"
            ))
            .fetch_all(pool)
            .await?;
            Ok(rows.iter().map(from_row).collect())
        })
    }

    /// The newest upgrade from or to `service`.
    /// Upgrade `id`.
    pub async fn upgrade(&self, id: &str) -> Result<Option<UpgradeRow>, StoreError> {
        on_db!(self, pool => {
            let row = sqlx::query(&format!("SELECT {COLUMNS} FROM service_upgrades WHERE id = $1")).bind(id).fetch_optional(pool).await?;
            Ok(row.as_ref().map(from_row))
        })
    }

    pub async fn latest_upgrade(&self, service: &str) -> Result<Option<UpgradeRow>, StoreError> {
        on_db!(self, pool => {
            let row = sqlx::query(&format!(
                "SELECT {COLUMNS} FROM service_upgrades WHERE service = $1 OR to_service = $1 ORDER BY created_at DESC, id DESC LIMIT 1"
            ))
            .bind(service)
            .fetch_optional(pool)
            .await?;
            Ok(row.as_ref().map(from_row))
        })
    }

    /// Moves an upgrade from state `from` to `to` (with the restore job it
    /// started, or why it failed); false when it was not in `from`.
    pub async fn advance_upgrade(&self, id: &str, from: &str, to: &str, restore_job: Option<&str>, message: Option<&str>, now_ms: i64) -> Result<bool, StoreError> {
        on_db!(self, pool => {
            let finished = (!UNFINISHED.contains(&to)).then_some(now_ms);
            let result = sqlx::query(
                "UPDATE service_upgrades SET state = $1, restore_job = COALESCE($2, restore_job), message = COALESCE($3, message), \
             finished_at = COALESCE($4, finished_at) WHERE id = $5 AND state = $6",
            )
            .bind(to)
            .bind(restore_job)
            .bind(message)
            .bind(finished)
            .bind(id)
            .bind(from)
            .execute(pool)
            .await?;
            self.count_commit().await;
            Ok(result.rows_affected() == 1)
        })
    }

    /// The unfinished upgrade from or into `service`, if any.
    pub async fn unfinished_upgrade_of(&self, service: &str) -> Result<Option<UpgradeRow>, StoreError> {
        on_db!(self, pool => {
            let row = sqlx::query(&format!(
                "SELECT {COLUMNS} FROM service_upgrades WHERE (service = $1 OR to_service = $1) AND state IN ('backing_up', 'restoring', 'switching') LIMIT 1"
            ))
            .bind(service)
            .fetch_optional(pool)
            .await?;
            Ok(row.as_ref().map(from_row))
        })
    }

    /// In one write: every link of the upgrade's service moves to its new
    /// service, and the upgrade becomes `switching` (its apps are then
    /// redeployed, again after a crash). Nothing moves when it is not
    /// `restoring`, when the new service is gone, or when an app is linked
    /// to both (it would have two links to one service).
    pub async fn switch_upgrade_links(&self, upgrade: &UpgradeRow) -> Result<Switch, StoreError> {
        on_db!(self, pool => {
            let mut tx = pool.begin_write().await?;
            let restoring = sqlx::query("SELECT 1 FROM service_upgrades WHERE id = $1 AND state = 'restoring'").bind(&upgrade.id).fetch_optional(&mut *tx).await?;
            if restoring.is_none() {
                tx.rollback().await?;
                return Ok(Switch::NotRestoring);
            }
            let exists = sqlx::query("SELECT 1 FROM services WHERE name = $1").bind(&upgrade.to_service).fetch_optional(&mut *tx).await?;
            if exists.is_none() {
                tx.rollback().await?;
                return Ok(Switch::NewServiceGone);
            }
            let both: Vec<String> = sqlx::query(
                "SELECT app FROM service_links WHERE service = $1 AND app IN (SELECT app FROM service_links WHERE service = $2) ORDER BY app",
            )
            .bind(&upgrade.service)
            .bind(&upgrade.to_service)
            .fetch_all(&mut *tx)
            .await?
            .iter()
            .map(|r| r.get("app"))
            .collect();
            if !both.is_empty() {
                tx.rollback().await?;
                return Ok(Switch::LinkedToBoth(both));
            }
            sqlx::query("UPDATE service_upgrades SET state = 'switching' WHERE id = $1").bind(&upgrade.id).execute(&mut *tx).await?;
            sqlx::query("UPDATE service_links SET service = $1 WHERE service = $2")
                .bind(&upgrade.to_service)
                .bind(&upgrade.service)
                .execute(&mut *tx)
                .await?;
            tx.commit().await?;
            self.count_commit().await;
            Ok(Switch::Moved)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_engines::Arg;
    use crate::{NewCommand, ServiceRow};

    crate::test_engines::both_engines! {
        async fn one_unfinished_upgrade_per_service_and_each_step_once(store) {
            let row = UpgradeRow {
                id: "up_1".into(),
                service: "db".into(),
                to_service: "db-17".into(),
                from_version: "15".into(),
                version: "17".into(),
                state: "backing_up".into(),
                backup_job: Some("bj_1".into()),
                created_at: 10,
                ..UpgradeRow::default()
            };
            store.insert_upgrade(&row).await.unwrap().unwrap();
            let second = UpgradeRow { id: "up_2".into(), created_at: 11, ..row.clone() };
            assert!(store.insert_upgrade(&second).await.unwrap().unwrap_err().contains("up_1"));
            let into_same = UpgradeRow { id: "up_9".into(), service: "other".into(), ..row.clone() };
            assert!(store.insert_upgrade(&into_same).await.unwrap().unwrap_err().contains("up_1"), "not into another upgrade's new service");
            assert!(!store.advance_upgrade("up_1", "restoring", "switched", None, None, 12).await.unwrap(), "only from its state");
            assert!(store.advance_upgrade("up_1", "backing_up", "restoring", Some("bj_2"), None, 12).await.unwrap());
            assert_eq!(store.switch_upgrade_links(&row).await.unwrap(), Switch::NewServiceGone, "db-17 was never made here");
            for (name, port) in [("db", 20000), ("db-17", 20001)] {
                store
                    .test_execute(
                        "INSERT INTO services (name, kind, image, node_id, host_port, volume, secret_sealed, created_at) VALUES ($1, 'postgres', 'p', 'n', $2, $1, 's', 1)",
                        &[Arg::Text(name), Arg::Int(port)],
                    )
                    .await;
            }
            let link = |service: &'static str, app: &'static str| async move {
                let variable = format!("V_{service}");
                store
                    .test_execute(
                        "INSERT INTO service_links (service, app, variable, created_at) VALUES ($1, $2, $3, 1)",
                        &[Arg::Text(service), Arg::Text(app), Arg::Text(&variable)],
                    )
                    .await
            };
            link("db", "web").await;
            link("db-17", "web").await;
            assert_eq!(store.switch_upgrade_links(&row).await.unwrap(), Switch::LinkedToBoth(vec!["web".into()]));
            let remove = |s: &ServiceRow| NewCommand { node_id: s.node_id.clone(), kind: "service_remove".into(), payload: "sealed".into() };
            for name in ["db", "db-17"] {
                assert_eq!(store.delete_service(name, remove, 12).await.unwrap().map(|r| r.map(|_| ())), Some(Err("up_1".into())), "{name} is in an unfinished upgrade");
                assert!(store.service(name).await.unwrap().is_some());
            }
            store.test_execute("DELETE FROM service_links WHERE service = 'db-17'", &[]).await;
            link("db", "api").await;
            assert_eq!(store.switch_upgrade_links(&row).await.unwrap(), Switch::Moved);
            assert_eq!(store.switch_upgrade_links(&row).await.unwrap(), Switch::NotRestoring, "once");
            let moved = store.test_pairs("SELECT service, app FROM service_links ORDER BY app").await;
            assert_eq!(moved, vec![("db-17".into(), "api".into()), ("db-17".into(), "web".into())]);
            assert_eq!(store.unfinished_upgrade_of("db-17").await.unwrap().map(|u| u.id), Some("up_1".into()));
            assert!(store.advance_upgrade("up_1", "switching", "switched", None, None, 13).await.unwrap());
            let done = store.latest_upgrade("db-17").await.unwrap().unwrap();
            assert_eq!((done.state.as_str(), done.restore_job.as_deref(), done.finished_at), ("switched", Some("bj_2"), Some(13)));
            assert!(store.unfinished_upgrades().await.unwrap().is_empty());
            assert_eq!(store.unfinished_upgrade_of("db").await.unwrap(), None);
            let into_db17 = UpgradeRow { id: "up_3".into(), service: "db-17".into(), to_service: "db-18".into(), ..row.clone() };
            store.insert_upgrade(&into_db17).await.unwrap().unwrap();
            let from_db18 = UpgradeRow { id: "up_4".into(), service: "db-18".into(), to_service: "db-19".into(), ..row.clone() };
            assert!(store.insert_upgrade(&from_db18).await.unwrap().unwrap_err().contains("up_3"), "not from a service an upgrade is restoring into");
            assert!(store.advance_upgrade("up_3", "backing_up", "failed", None, None, 13).await.unwrap());
            assert_eq!(store.insert_upgrade(&second).await.unwrap(), Err("a service named db-17 exists already".into()));
            let second = UpgradeRow { to_service: "db-17b".into(), ..second };
            store.insert_upgrade(&second).await.unwrap().unwrap();
            assert_eq!(store.upgrade("up_2").await.unwrap().map(|u| u.to_service), Some("db-17b".into()));
            assert!(store.advance_upgrade("up_2", "backing_up", "failed", None, Some("the backup failed"), 14).await.unwrap());
            assert_eq!(store.latest_upgrade("db").await.unwrap().unwrap().message.as_deref(), Some("the backup failed"));
        }
    }
}
