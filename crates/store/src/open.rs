//! Opening the database: SQLite in WAL mode or a PostgreSQL pool, the
//! versioned migrations of its engine, and a backup copy written before any
//! migration touches an existing database (`VACUUM INTO` for SQLite,
//! `pg_dump` for PostgreSQL).

use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use sqlx::migrate::Migrator;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::Row;

use super::{Store, StoreError};
use crate::backend::{Db, PG_ACQUIRE_TIMEOUT};
use crate::database_url::DatabaseUrl;

/// The same versions for both engines, one file each, side by side.
static SQLITE_MIGRATIONS: Migrator = sqlx::migrate!("./migrations/sqlite");
static POSTGRES_MIGRATIONS: Migrator = sqlx::migrate!("./migrations/postgres");

/// How long the `pg_dump` before a migration may take.
const PG_DUMP_TIMEOUT: Duration = Duration::from_secs(600);

/// File name of the state database inside the data dir.
pub const DATABASE_FILE: &str = "state.db";

impl Store {
    /// Opens (or creates) `<data_dir>/state.db` and brings its schema up to
    /// date. `backup_stamp` names the backup file when one is needed.
    pub async fn open(data_dir: &Path, backup_stamp: &str) -> Result<Store, StoreError> {
        Store::connect(&DatabaseUrl::sqlite_in(data_dir), data_dir, backup_stamp).await
    }

    /// Opens the database `url` names and brings its schema up to date; a
    /// backup before a migration goes to `<data_dir>/backups/`.
    pub async fn connect(url: &DatabaseUrl, data_dir: &Path, backup_stamp: &str) -> Result<Store, StoreError> {
        match url {
            DatabaseUrl::Sqlite(path) => Store::open_sqlite(path, data_dir, backup_stamp).await,
            DatabaseUrl::Postgres(_) => Store::open_postgres(url, data_dir, backup_stamp).await,
        }
    }

    async fn open_sqlite(path: &Path, data_dir: &Path, backup_stamp: &str) -> Result<Store, StoreError> {
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
        let store = Store { db: Db::Sqlite(pool.clone()), commits: Arc::new(AtomicU64::new(0)) };

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
        SQLITE_MIGRATIONS.run(&pool).await?;
        Ok(store)
    }

    async fn open_postgres(url: &DatabaseUrl, data_dir: &Path, backup_stamp: &str) -> Result<Store, StoreError> {
        let DatabaseUrl::Postgres(text) = url else { unreachable!("open_postgres is called for postgres:// URLs") };
        let options = PgConnectOptions::from_str(text.as_str())?.application_name("cloudweb-server");
        let pool = PgPoolOptions::new()
            .max_connections(8)
            .acquire_timeout(PG_ACQUIRE_TIMEOUT)
            .connect_with(options)
            .await?;
        let store = Store { db: Db::Postgres(pool.clone()), commits: Arc::new(AtomicU64::new(0)) };
        let pending = store.pending_migrations().await?;
        // A database that holds no migration yet is new: nothing to keep.
        if !pending.is_empty() && pending.len() < POSTGRES_MIGRATIONS.iter().count() {
            let backup = pg_dump(url, data_dir, backup_stamp).await?;
            tracing::info!(
                backup = %backup.display(),
                migrations = ?pending,
                "backed up the database before migrating it"
            );
        }
        // sqlx takes an advisory lock while it migrates, so replicas that
        // start together migrate once.
        POSTGRES_MIGRATIONS.run(&pool).await?;
        Ok(store)
    }

    /// Refuses a damaged database at start-up. Opening reads only the
    /// pages the migrations touch, so damage elsewhere (a torn write, a
    /// bad copy) would otherwise surface later as failed requests.
    /// `quick_check` reads every page (without the slower index
    /// cross-checks of `integrity_check`).
    async fn quick_check(&self) -> Result<(), StoreError> {
        let Db::Sqlite(pool) = &self.db else { return Ok(()) };
        // Damage bad enough to stop the check itself (a page that is not a
        // b-tree page) is a finding too.
        let rows = sqlx::query("PRAGMA quick_check").fetch_all(pool).await.map_err(|err| match StoreError::Database(err) {
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
        let (applied, migrator) = match &self.db {
            Db::Sqlite(pool) => {
                let has_table = sqlx::query(
                    "SELECT COUNT(*) AS n FROM sqlite_master WHERE type = 'table' AND name = '_sqlx_migrations'",
                )
                .fetch_one(pool)
                .await?
                .get::<i64, _>("n")
                    > 0;
                let applied = if has_table { applied_versions(pool).await? } else { Vec::new() };
                (applied, &SQLITE_MIGRATIONS)
            }
            Db::Postgres(pool) => {
                let has_table: bool =
                    sqlx::query("SELECT to_regclass('_sqlx_migrations') IS NOT NULL AS present").fetch_one(pool).await?.get("present");
                let applied = if has_table { applied_versions(pool).await? } else { Vec::new() };
                (applied, &POSTGRES_MIGRATIONS)
            }
        };
        Ok(migrator.iter().map(|m| m.version).filter(|v| !applied.contains(v)).collect())
    }

    /// Writes a consistent copy of the database (WAL included) next to it.
    async fn backup(&self, data_dir: &Path, stamp: &str) -> Result<PathBuf, StoreError> {
        let Db::Sqlite(pool) = &self.db else { return Err(StoreError::Unsupported("VACUUM INTO on PostgreSQL")) };
        let dir = data_dir.join("backups");
        std::fs::create_dir_all(&dir)
            .map_err(|source| StoreError::Io { path: dir.display().to_string(), source })?;
        let target = dir.join(format!("state-{stamp}.db"));
        let target_text = target.display().to_string();
        sqlx::query("VACUUM INTO $1")
            .bind(&target_text)
            .execute(pool)
            .await
            .map_err(|source| StoreError::Backup { path: target_text.clone(), source })?;
        Ok(target)
    }

    /// Versions of the migrations this build knows, for tests and logs.
    pub fn known_migrations() -> Vec<i64> {
        SQLITE_MIGRATIONS.iter().map(|m| m.version).collect()
    }
}

async fn applied_versions<'a, E>(pool: E) -> Result<Vec<i64>, StoreError>
where
    E: sqlx::Executor<'a>,
    i64: sqlx::Type<E::Database> + for<'r> sqlx::Decode<'r, E::Database>,
    for<'q> <E::Database as sqlx::Database>::Arguments<'q>: sqlx::IntoArguments<'q, E::Database>,
    usize: sqlx::ColumnIndex<<E::Database as sqlx::Database>::Row>,
{
    let rows = sqlx::query("SELECT version FROM _sqlx_migrations WHERE success = TRUE").fetch_all(pool).await?;
    Ok(rows.iter().map(|row| row.get::<i64, _>(0)).collect())
}

/// `pg_dump -Fc` of the whole database into
/// `<data_dir>/backups/state-<stamp>.pgdump`, before a migration changes it.
/// The password reaches pg_dump in its environment, never its arguments.
async fn pg_dump(url: &DatabaseUrl, data_dir: &Path, stamp: &str) -> Result<PathBuf, StoreError> {
    let dir = data_dir.join("backups");
    std::fs::create_dir_all(&dir).map_err(|source| StoreError::Io { path: dir.display().to_string(), source })?;
    let target = dir.join(format!("state-{stamp}.pgdump"));
    let mut command = tokio::process::Command::new("pg_dump");
    command
        .arg("--format=custom")
        .arg("--no-password")
        .arg("--file")
        .arg(&target)
        .arg("--dbname")
        .arg(url.without_password())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    if let Some(password) = url.password() {
        command.env("PGPASSWORD", password);
    }
    let failed = |reason: String| StoreError::PgDump { path: target.display().to_string(), reason };
    let child = command.spawn().map_err(|err| failed(format!("cannot start pg_dump: {err}")))?;
    let output = match tokio::time::timeout(PG_DUMP_TIMEOUT, child.wait_with_output()).await {
        Ok(output) => output.map_err(|err| failed(err.to_string()))?,
        Err(_) => return Err(failed(format!("pg_dump did not finish within {} s", PG_DUMP_TIMEOUT.as_secs()))),
    };
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        return Err(failed(cloudweb_protocol::misc::one_line(stderr.trim(), 300)));
    }
    Ok(target)
}

#[cfg(test)]
mod tests {
    use crate::test_engines::{open, Arg};
    use crate::{DatabaseUrl, Engine, Store};

    /// A PostgreSQL database that holds a cluster is dumped with pg_dump
    /// before a migration changes it, and the migration then runs.
    #[tokio::test]
    async fn a_postgresql_state_is_dumped_before_it_is_migrated() {
        let store = open(Engine::Postgres).await;
        store.insert_admin_token("digest-1", 1).await.unwrap();
        // As if this state came from the release before the newest
        // migration.
        let newest = *Store::known_migrations().last().unwrap();
        store
            .test_execute(
                "DELETE FROM _sqlx_migrations WHERE version = $1",
                &[Arg::Int(newest)],
            )
            .await;
        // What the newest migration (0042, teams and the audit log) added
        // goes with its row.
        for table in ["audit_anchor", "audit_log", "deploy_tokens", "team_mappings", "team_members", "teams"] {
            store.test_execute(&format!("DROP TABLE {table}"), &[]).await;
        }
        for (table, column) in [
            ("users", "cluster_role"),
            ("apps", "team_id"),
            ("services", "team_id"),
            ("volumes", "team_id"),
            ("backup_destinations", "team_id"),
            ("api_tokens", "role"),
            ("api_tokens", "apps"),
            ("api_tokens", "expires_at"),
        ] {
            store.test_execute(&format!("ALTER TABLE {table} DROP COLUMN {column}"), &[]).await;
        }
        let url = store.url.clone().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let again = Store::connect(&DatabaseUrl::parse(&url).unwrap(), dir.path(), "before").await.unwrap();
        let dump = dir.path().join("backups").join("state-before.pgdump");
        let bytes = std::fs::read(&dump).unwrap();
        assert!(bytes.starts_with(b"PGDMP"), "a pg_dump archive");
        again.test_execute("SELECT count(*) FROM team_members", &[]).await;
        assert_eq!(
            again.admin_token_digests().await.unwrap(),
            vec!["digest-1".to_string()]
        );
        // Up to date: no second dump.
        drop(again);
        let dir2 = tempfile::tempdir().unwrap();
        Store::connect(&DatabaseUrl::parse(&url).unwrap(), dir2.path(), "after").await.unwrap();
        assert!(!dir2.path().join("backups").exists());
    }
}
