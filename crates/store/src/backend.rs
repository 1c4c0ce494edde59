//! The two SQL engines the store runs on: SQLite (the embedded default, one
//! file under the data dir) and PostgreSQL (`--database-url postgres://…`,
//! for several control-plane replicas).
//!
//! Every query is written once, in the SQL both engines speak (`$n`
//! placeholders, `BIGINT`, `ON CONFLICT`, `RETURNING`, `CAST(SUM(…) AS
//! BIGINT)` where PostgreSQL would widen a sum to `NUMERIC`). A method's
//! body is compiled once per engine by [`on_db!`], so each copy is typed
//! against its own driver and nothing is decided at run time but which
//! pool holds the connection.

use std::time::Duration;

use sqlx::postgres::PgRow;
use sqlx::sqlite::SqliteRow;
use sqlx::{PgPool, Postgres, Sqlite, SqlitePool, Transaction};

use super::StoreError;

/// The connection pool of the engine this store runs on.
#[derive(Clone)]
pub(crate) enum Db {
    Sqlite(SqlitePool),
    Postgres(PgPool),
}

/// Which engine a store runs on, for logs and for what only one of them
/// can do (an online copy with `VACUUM INTO`, `PRAGMA quick_check`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Engine {
    Sqlite,
    Postgres,
}

impl Db {
    pub(crate) fn engine(&self) -> Engine {
        match self {
            Db::Sqlite(_) => Engine::Sqlite,
            Db::Postgres(_) => Engine::Postgres,
        }
    }
}

/// Runs `$body` with `$pool` bound to the store's pool: the body is
/// compiled once for each engine.
macro_rules! on_db {
    ($store:expr, $pool:ident => $body:block) => {
        match &$store.db {
            $crate::backend::Db::Sqlite($pool) => {
                #[allow(unused_imports)]
                use $crate::backend::WritePool as _;
                $body
            }
            $crate::backend::Db::Postgres($pool) => {
                #[allow(unused_imports)]
                use $crate::backend::WritePool as _;
                $body
            }
        }
    };
}

/// Compiles the items once per engine, with `DB` naming it: a helper that
/// works inside a caller's transaction is a trait method implemented for
/// `sqlx::Transaction<'_, DB>`, so the call `tx.helper(…)` picks the copy
/// of the transaction's engine.
macro_rules! for_both_engines {
    ($($item:item)*) => {
        const _: () = {
            #[allow(dead_code)]
            type DB = sqlx::Sqlite;
            $($item)*
        };
        const _: () = {
            #[allow(dead_code)]
            type DB = sqlx::Postgres;
            $($item)*
        };
    };
}
pub(crate) use for_both_engines;

/// A value both drivers decode (the store's rows hold only text, 64-bit
/// integers, doubles, booleans and their `Option`s).
pub(crate) trait Decodes:
    for<'r> sqlx::Decode<'r, Sqlite> + sqlx::Type<Sqlite> + for<'r> sqlx::Decode<'r, Postgres> + sqlx::Type<Postgres>
{
}

impl<T> Decodes for T where
    T: for<'r> sqlx::Decode<'r, Sqlite> + sqlx::Type<Sqlite> + for<'r> sqlx::Decode<'r, Postgres> + sqlx::Type<Postgres>
{
}

/// A row of either engine, so that one function turns it into a typed row.
pub(crate) trait Cols {
    /// The column's value; panics (like `sqlx::Row::get`) when the column is
    /// missing or of another type, which is a bug in the query beside it.
    fn col<T: Decodes>(&self, column: &str) -> T;
}

impl Cols for SqliteRow {
    fn col<T: Decodes>(&self, column: &str) -> T {
        sqlx::Row::get(self, column)
    }
}

impl Cols for PgRow {
    fn col<T: Decodes>(&self, column: &str) -> T {
        sqlx::Row::get(self, column)
    }
}

/// A number that serializes PostgreSQL's write transactions (see
/// [`WritePool::begin_write`]): "cloudweb" in ASCII.
const WRITE_LOCK: i64 = 0x636c_6f75_6477_6562;

/// The fencing check of a leader's write transaction (implemented in
/// `leader_lease.rs`).
pub(crate) trait FenceCheck {
    async fn check_fence(&mut self, engine: Engine, term: &crate::fence::Term) -> Result<(), StoreError>;
}

/// Starts the transactions that write.
pub(crate) trait WritePool {
    type Engine: sqlx::Database;

    /// A transaction that holds the database's write lock from its first
    /// statement on, so that writers queue instead of failing, and one that
    /// reads and then writes sees every write committed before it began.
    ///
    /// SQLite: `BEGIN IMMEDIATE`. PostgreSQL: a transaction-scoped
    /// advisory lock taken first, which gives the same order: its later
    /// statements (read committed) see every transaction that held the lock
    /// before. The lock is released by the commit or rollback, also when
    /// the connection drops.
    ///
    /// The BEGIN runs in its own task: sqlx acknowledges a custom BEGIN
    /// before it builds the `Transaction` that would roll it back on drop,
    /// so a caller cancelled in between (an HTTP handler whose client hung
    /// up) left the pooled connection inside a transaction that nobody
    /// would end. That connection then refused every later BEGIN ("non-zero
    /// transaction depth"), held the write lock ("database is locked" for
    /// every other writer) and silently dropped what it wrote afterwards.
    /// A spawned task always finishes; if its caller is gone, the
    /// `Transaction` it returns is dropped, which rolls it back.
    ///
    /// In a leader's loop ([`crate::fence::scope`]), the
    /// transaction first checks, holding the lock, that the leader's term
    /// still holds the lease, and fails with [`StoreError::Fenced`] if not.
    async fn begin_write(&self) -> Result<Transaction<'static, Self::Engine>, StoreError>;
}

impl WritePool for SqlitePool {
    type Engine = Sqlite;

    async fn begin_write(&self) -> Result<Transaction<'static, Sqlite>, StoreError> {
        let pool = self.clone();
        let term = crate::fence::current();
        let begin = tokio::spawn(async move {
            let mut tx = pool.begin_with("BEGIN IMMEDIATE").await?;
            if let Some(term) = term {
                tx.check_fence(Engine::Sqlite, &term).await?;
            }
            Ok::<_, StoreError>(tx)
        });
        match begin.await {
            Ok(result) => result,
            Err(join) => Err(StoreError::Database(sqlx::Error::Protocol(format!("BEGIN task failed: {join}")))),
        }
    }
}

impl WritePool for PgPool {
    type Engine = Postgres;

    async fn begin_write(&self) -> Result<Transaction<'static, Postgres>, StoreError> {
        let pool = self.clone();
        let term = crate::fence::current();
        let begin = tokio::spawn(async move {
            let mut tx = pool.begin().await?;
            // A writer waits for the lock at most as long as SQLite's busy
            // timeout, then fails as SQLite's would ("database is locked").
            sqlx::query("SET LOCAL lock_timeout = '5s'").execute(&mut *tx).await?;
            sqlx::query("SELECT pg_advisory_xact_lock($1)").bind(WRITE_LOCK).execute(&mut *tx).await?;
            if let Some(term) = term {
                tx.check_fence(Engine::Postgres, &term).await?;
            }
            Ok::<_, StoreError>(tx)
        });
        match begin.await {
            Ok(result) => result,
            Err(join) => Err(StoreError::Database(sqlx::Error::Protocol(format!("BEGIN task failed: {join}")))),
        }
    }
}

/// How long a PostgreSQL connection may take to be had from the pool or
/// made, before the request that needs it fails with a readable error.
pub(crate) const PG_ACQUIRE_TIMEOUT: Duration = Duration::from_secs(5);
