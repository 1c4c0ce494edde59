//! All SQL lives here. The rest of the control plane calls typed methods and
//! never sees a query, so a PostgreSQL backend can later sit behind the same
//! methods. Queries use `$n` placeholders and portable types for that reason.
//!
//! Every method that writes counts its commit in [`Store::commits`], which the
//! heartbeat benchmark reads to prove heartbeats are persisted in batches.
//!
//! This crate is the bottom of the control plane (`cloudweb-store`): the
//! state database, its migrations (`migrations/`) and the typed rows. It
//! must never depend on the layers above it, decide anything (what a row
//! means is the core's), speak HTTP or start tasks of its own.

#[macro_use]
mod backend;
mod accounts;
pub mod audit;
pub mod alert_delivery;
pub mod alerts;
mod backups;
mod apps;
mod certificates;
mod cluster_secrets;
mod commands;
mod copy;
mod database_url;
mod deployments;
pub mod exec_sessions;
mod git;
mod git_logins;
mod gitea;
mod previews;
pub mod fence;
mod idempotency;
pub mod leader_lease;
pub mod login_attempts;
mod nodes;
pub mod notify;
pub mod one_shot;
mod open;
mod overview;
mod readiness;
pub mod autoscale;
mod crash_loops;
pub use crash_loops::InstanceTrouble;
mod reports;
pub mod retention;
pub mod runtime_logs;
pub use runtime_logs::{LogFilter, LogRow, LogSource, LogStore, LogUsageRow, NewLogLine};
mod services;
mod service_upgrades;
mod routes;
mod snapshot;
pub mod tasks;
pub mod teams;
pub mod steps;
#[cfg(test)]
mod deployment_tests;
#[cfg(test)]
#[macro_use]
mod test_engines;
mod tokens;
mod usage;
mod volume_moves;
mod volumes;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

pub use backend::Engine;
use backend::Db;

pub use accounts::{ApiTokenRow, SessionRow, UserRow};
pub use teams::{mappings_revision, DeployTokenRow, MappingRow, MemberRefusal, MemberRow, Owned, TeamHoldings, TeamRow};
pub use backups::{BackupJobRow, DestinationRemoval, DestinationRow, JobOutcome, JobRefusal, PlanRow, Verified};
pub use apps::{AppRefusal, AppRow};
pub use certificates::{CertificateOrders, CertificateRow};
pub use commands::{CommandRow, NewCommand};
pub use deployments::{DeploymentRow, InstanceRow, InstanceUpdate, Rescheduled, Settled};
pub use git_logins::{GitIdentityRow, GithubLoginRow};
pub use gitea::{GiteaSettingsRow, GiteaTokensRow};
pub use previews::{PreviewRow, PreviewSettingsRow};
pub use git::{AppGitLinkRow, DeploymentGitRow, GithubSettingsRow, GitlabAccountRow, GitlabSettingsRow, TakenCredentials};
pub use idempotency::IdempotencyClaim;
pub use nodes::{
    HeartbeatRow, JoinAnswer, JoinRefusal, NewNode, NodeRow, TrafficRow, TrafficSample,
};
pub use copy::TableCopy;
pub use database_url::DatabaseUrl;
pub use open::DATABASE_FILE;
pub use overview::{AppRecentUsage, ClusterUsageBucket};
pub use tokens::TokenRejection;
pub use service_upgrades::{Switch, UpgradeRow};
pub use services::{LinkRefusal, ServiceChange, ServiceLinkRow, ServiceRefusal, ServiceRow};
pub use tasks::{CronJobRow, CronRefusal, TaskLineRow, TaskRunRow, Tick};
pub use volume_moves::{MoveRefusal, VolumeMoveRow};
pub use volumes::{AttachRefusal, Attached, VolumeDeletion, VolumeRow, MAX_VOLUMES_PER_APP};
pub use usage::{AppUsage, AppUsageRow, NodeUsageRow, NodeUsageSample, FINE as USAGE_FINE_SECONDS};

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    #[error("migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("cannot back up the database to {path}: {source}")]
    Backup { path: String, source: sqlx::Error },
    #[error("i/o error on {path}: {source}")]
    Io { path: String, source: std::io::Error },
    /// A change would have broken an invariant of the state; it was rolled
    /// back.
    #[error("refused: {0}")]
    Invariant(String),
    /// SQLite's `quick_check` found damage (its first finding).
    #[error("the integrity check failed: {0}")]
    Damaged(String),
    /// `pg_dump` before a migration failed; nothing was migrated.
    #[error("cannot back up the database to {path} before migrating it: {reason}")]
    PgDump { path: String, reason: String },
    /// What only the other engine can do.
    #[error("not possible on this database engine: {0}")]
    Unsupported(&'static str),
    /// A write of a leader's term that no longer holds the lease (it was
    /// frozen or cut off past it, and another replica leads now).
    #[error("refused: this control plane's leadership (term {0}) has ended; another replica leads")]
    Fenced(i64),
}

/// SQLite's primary result codes that say the disk is full, or that the
/// database file is not a database.
const SQLITE_FULL: &str = "13";
const SQLITE_CORRUPT: &str = "11";
const SQLITE_NOTADB: &str = "26";
/// errno ENOSPC.
const ENOSPC: i32 = 28;

impl StoreError {
    fn sqlx(&self) -> Option<&sqlx::Error> {
        match self {
            StoreError::Database(err) | StoreError::Backup { source: err, .. } => Some(err),
            StoreError::Migrate(sqlx::migrate::MigrateError::Execute(err))
            | StoreError::Migrate(sqlx::migrate::MigrateError::ExecuteMigration(err, _)) => Some(err),
            _ => None,
        }
    }

    /// SQLite's primary result code (the extended code's low byte).
    fn sqlite_code(&self) -> Option<String> {
        let sqlx::Error::Database(db) = self.sqlx()? else { return None };
        let code: i64 = db.code()?.parse().ok()?;
        Some((code & 0xff).to_string())
    }

    /// The write failed because the disk (or the file system's quota) is
    /// full: SQLITE_FULL, or ENOSPC from the file system.
    pub fn is_disk_full(&self) -> bool {
        if self.sqlite_code().as_deref() == Some(SQLITE_FULL) {
            return true;
        }
        match self {
            StoreError::Io { source, .. } => source.raw_os_error() == Some(ENOSPC),
            _ => matches!(self.sqlx(), Some(sqlx::Error::Io(io)) if io.raw_os_error() == Some(ENOSPC)),
        }
    }

    /// The database could not be reached: no connection within the pool's
    /// wait, a connection that broke, a closed pool (PostgreSQL down or cut
    /// off). Nothing was written.
    pub fn is_unreachable(&self) -> bool {
        matches!(self.sqlx(), Some(sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed | sqlx::Error::Io(_)))
            && !self.is_disk_full()
    }

    /// The database file is damaged or not a SQLite database at all.
    pub fn is_corrupt(&self) -> bool {
        matches!(self, StoreError::Damaged(_)) || matches!(self.sqlite_code().as_deref(), Some(SQLITE_CORRUPT | SQLITE_NOTADB))
    }
}

/// Handle to the control plane's state. Cheap to clone.
#[derive(Clone)]
pub struct Store {
    db: Db,
    commits: Arc<AtomicU64>,
}

impl Store {
    /// Number of write transactions committed since the process started.
    pub fn commits(&self) -> u64 {
        self.commits.load(Ordering::Relaxed)
    }

    /// The engine this store runs on.
    pub fn engine(&self) -> Engine {
        self.db.engine()
    }

    /// Closes every connection (waiting for those in use), which also
    /// folds the write-ahead log into the database file.
    pub async fn close(&self) {
        on_db!(self, pool => { pool.close().await })
    }

    /// Counts a commit and passes a [`steps::step_point`], where a
    /// simulation may hand control to another task or stop the process.
    async fn count_commit(&self) {
        self.commits.fetch_add(1, Ordering::Relaxed);
        steps::step_point().await;
    }

    /// Sets one text column of the row of `table` whose `key_column` is
    /// `key`, making that row (with `created_at = now_ms`) where there is
    /// none. Table and column names are the caller's constants, never input.
    async fn upsert_column(
        &self,
        table: &'static str,
        key_column: &'static str,
        key: &str,
        column: &'static str,
        value: &str,
        now_ms: i64,
    ) -> Result<(), StoreError> {
        let sql = format!(
            "INSERT INTO {table} ({key_column}, {column}, created_at) VALUES ($1, $2, $3) \
             ON CONFLICT ({key_column}) DO UPDATE SET {column} = excluded.{column}"
        );
        on_db!(self, pool => { sqlx::query(&sql).bind(key).bind(value).bind(now_ms).execute(pool).await?; });
        self.count_commit().await;
        Ok(())
    }
}
