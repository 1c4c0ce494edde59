//! All SQL lives here. The rest of the control plane calls typed methods and
//! never sees a query, so a PostgreSQL backend can later sit behind the same
//! methods. Queries use `$n` placeholders and portable types for that reason.
//!
//! Every method that writes counts its commit in [`Store::commits`], which the
//! heartbeat benchmark reads to prove heartbeats are persisted in batches.

mod apps;
mod commands;
mod deployments;
mod nodes;
mod open;
mod reports;
mod routes;
mod tokens;
mod usage;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use sqlx::SqlitePool;

pub use apps::AppRow;
pub use commands::{CommandRow, NewCommand};
pub use deployments::{DeploymentRow, InstanceRow};
pub use nodes::{HeartbeatRow, JoinRefusal, NewNode, NodeRow};
pub use tokens::TokenRejection;
pub use usage::NodeUsageRow;

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
}

/// Handle to the control plane's state. Cheap to clone.
#[derive(Clone)]
pub struct Store {
    pool: SqlitePool,
    commits: Arc<AtomicU64>,
}

impl Store {
    /// Number of write transactions committed since the process started.
    pub fn commits(&self) -> u64 {
        self.commits.load(Ordering::Relaxed)
    }

    /// Starts a transaction that takes the write lock up front. A deferred
    /// SQLite transaction that reads and then writes can fail with "database
    /// is locked" when another writer got in between; taking the lock at
    /// BEGIN makes concurrent writers queue (up to the busy timeout) instead.
    async fn write_transaction(&self) -> Result<sqlx::Transaction<'static, sqlx::Sqlite>, StoreError> {
        Ok(self.pool.begin_with("BEGIN IMMEDIATE").await?)
    }

    fn count_commit(&self) {
        self.commits.fetch_add(1, Ordering::Relaxed);
    }
}
