//! Opening the database: WAL mode, versioned migrations, and a backup copy
//! written before any migration touches an existing database.

use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use sqlx::migrate::Migrator;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::Row;

use super::{Store, StoreError};

static MIGRATOR: Migrator = sqlx::migrate!("./migrations");

/// File name of the state database inside the data dir.
pub const DATABASE_FILE: &str = "state.db";

impl Store {
    /// Opens (or creates) `<data_dir>/state.db` and brings its schema up to
    /// date. `backup_stamp` names the backup file when one is needed.
    pub async fn open(data_dir: &Path, backup_stamp: &str) -> Result<Store, StoreError> {
        let path = data_dir.join(DATABASE_FILE);
        let existed = path.exists();
        let options = SqliteConnectOptions::from_str("sqlite:")?
            .filename(&path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .foreign_keys(true)
            .busy_timeout(Duration::from_secs(5));
        let pool = SqlitePoolOptions::new()
            .max_connections(4)
            // A connection goes back to the pool only outside a
            // transaction. When a COMMIT fails for a full disk, SQLite
            // rolls the transaction back itself; the driver still counts
            // it open (the ROLLBACK of the dropped transaction then fails
            // too), and every later BEGIN on that connection would fail
            // with "begin_with at non-zero transaction depth" until a
            // restart. Such a connection is closed instead. The ping runs
            // after that queued ROLLBACK, so the depth read is final.
            .after_release(|conn, _| {
                Box::pin(async move {
                    use sqlx::Connection;
                    if conn.ping().await.is_err() || conn.is_in_transaction() {
                        tracing::warn!("closed a database connection left inside a failed transaction");
                        return Ok(false);
                    }
                    Ok(true)
                })
            })
            .connect_with(options)
            .await?;
        let store = Store { pool, commits: Arc::new(AtomicU64::new(0)) };

        if existed {
            store.quick_check().await?;
            let pending = store.pending_migrations().await?;
            if !pending.is_empty() {
                let backup = store.backup(data_dir, backup_stamp).await?;
                tracing::info!(
                    backup = %backup.display(),
                    migrations = ?pending,
                    "backed up the database before migrating it"
                );
            }
        }
        MIGRATOR.run(&store.pool).await?;
        Ok(store)
    }

    /// Refuses a damaged database at start-up. Opening reads only the
    /// pages the migrations touch, so damage elsewhere (a torn write, a
    /// bad copy) would otherwise surface later as failed requests.
    /// `quick_check` reads every page (without the slower index
    /// cross-checks of `integrity_check`).
    async fn quick_check(&self) -> Result<(), StoreError> {
        // Damage bad enough to stop the check itself (a page that is not a
        // b-tree page) is a finding too.
        let rows = sqlx::query("PRAGMA quick_check").fetch_all(&self.pool).await.map_err(|err| match StoreError::Database(err) {
            err if err.is_corrupt() => StoreError::Damaged(cloudweb_protocol::misc::one_line(&err.to_string(), 300)),
            err => err,
        })?;
        let findings: Vec<String> = rows.iter().filter_map(|row| row.try_get::<String, _>(0).ok()).collect();
        match findings.first() {
            Some(first) if findings.len() == 1 && first == "ok" => Ok(()),
            Some(first) => Err(StoreError::Damaged(cloudweb_protocol::misc::one_line(first, 300))),
            None => Err(StoreError::Damaged("no result".into())),
        }
    }

    async fn pending_migrations(&self) -> Result<Vec<i64>, StoreError> {
        let has_table = sqlx::query(
            "SELECT COUNT(*) AS n FROM sqlite_master WHERE type = 'table' AND name = '_sqlx_migrations'",
        )
        .fetch_one(&self.pool)
        .await?
        .get::<i64, _>("n")
            > 0;
        let applied: Vec<i64> = if has_table {
            sqlx::query("SELECT version FROM _sqlx_migrations WHERE success = TRUE")
                .fetch_all(&self.pool)
                .await?
                .iter()
                .map(|row| row.get::<i64, _>("version"))
                .collect()
        } else {
            Vec::new()
        };
        Ok(MIGRATOR.iter().map(|m| m.version).filter(|v| !applied.contains(v)).collect())
    }

    /// Writes a consistent copy of the database (WAL included) next to it.
    async fn backup(&self, data_dir: &Path, stamp: &str) -> Result<PathBuf, StoreError> {
        let dir = data_dir.join("backups");
        std::fs::create_dir_all(&dir)
            .map_err(|source| StoreError::Io { path: dir.display().to_string(), source })?;
        let target = dir.join(format!("state-{stamp}.db"));
        let target_text = target.display().to_string();
        sqlx::query("VACUUM INTO $1")
            .bind(&target_text)
            .execute(&self.pool)
            .await
            .map_err(|source| StoreError::Backup { path: target_text.clone(), source })?;
        Ok(target)
    }

    /// Versions of the migrations this build knows, for tests and logs.
    pub fn known_migrations() -> Vec<i64> {
        MIGRATOR.iter().map(|m| m.version).collect()
    }
}
