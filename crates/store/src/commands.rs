//! The per-node command queue. A command stays pending until its node acks
//! it; acking twice is harmless and counted.

use crate::backend::Cols;

use super::{Store, StoreError};

#[derive(Debug, Clone, PartialEq)]
pub struct CommandRow {
    pub seq: i64,
    pub node_id: String,
    pub kind: String,
    pub payload: String,
    pub created_at: i64,
    pub acked_at: Option<i64>,
    pub ack_count: i64,
}

#[derive(Debug, Clone)]
pub struct NewCommand {
    pub node_id: String,
    pub kind: String,
    pub payload: String,
}

fn command_from_row(row: &impl Cols) -> CommandRow {
    CommandRow {
        seq: row.col("seq"),
        node_id: row.col("node_id"),
        kind: row.col("kind"),
        payload: row.col("payload"),
        created_at: row.col("created_at"),
        acked_at: row.col("acked_at"),
        ack_count: row.col("ack_count"),
    }
}

const COMMAND_COLUMNS: &str = "seq, node_id, kind, payload, created_at, acked_at, ack_count";


impl Store {
    pub async fn enqueue_command(&self, command: &NewCommand, now_ms: i64) -> Result<CommandRow, StoreError> {
        on_db!(self, pool => {
            let mut tx = pool.begin_write().await?;
            let row = tx.insert_command(command, now_ms).await?;
            tx.commit().await?;
            self.count_commit().await;
            Ok(row)
        })
    }

    /// Un-acked commands of a node, oldest first.
    pub async fn pending_commands(&self, node_id: &str) -> Result<Vec<CommandRow>, StoreError> {
        on_db!(self, pool => {
            let rows = sqlx::query(&format!(
                "SELECT {COMMAND_COLUMNS} FROM commands WHERE node_id = $1 AND acked_at IS NULL ORDER BY seq"
            ))
            .bind(node_id)
            .fetch_all(pool)
            .await?;
            Ok(rows.iter().map(command_from_row).collect())
        })
    }

    /// Every command of a node, newest first, at most `limit`.
    pub async fn node_commands(&self, node_id: &str, limit: i64) -> Result<Vec<CommandRow>, StoreError> {
        on_db!(self, pool => {
            let rows = sqlx::query(&format!(
                "SELECT {COMMAND_COLUMNS} FROM commands WHERE node_id = $1 ORDER BY seq DESC LIMIT $2"
            ))
            .bind(node_id)
            .bind(limit)
            .fetch_all(pool)
            .await?;
            Ok(rows.iter().map(command_from_row).collect())
        })
    }

    /// Command `seq` of `node_id`, if that node has it.
    pub async fn node_command(&self, node_id: &str, seq: i64) -> Result<Option<CommandRow>, StoreError> {
        on_db!(self, pool => {
            let row = sqlx::query(&format!("SELECT {COMMAND_COLUMNS} FROM commands WHERE seq = $1 AND node_id = $2"))
                .bind(seq)
                .bind(node_id)
                .fetch_optional(pool)
                .await?;
            Ok(row.as_ref().map(command_from_row))
        })
    }

    /// Acks a command of this node. Returns false when the node has no such
    /// command (another node's command counts as no such command).
    pub async fn ack_command(&self, node_id: &str, seq: i64, now_ms: i64) -> Result<bool, StoreError> {
        on_db!(self, pool => {
            let updated = sqlx::query(
                "UPDATE commands SET acked_at = COALESCE(acked_at, $1), ack_count = ack_count + 1 \
             WHERE seq = $2 AND node_id = $3",
            )
            .bind(now_ms)
            .bind(seq)
            .bind(node_id)
            .execute(pool)
            .await?;
            self.count_commit().await;
            Ok(updated.rows_affected() == 1)
        })
    }
}

/// What this module writes inside a caller's write transaction, once per
/// engine (see [`crate::backend::for_both_engines`]).
pub(crate) trait CommandsTx {
    /// Queues a command inside a transaction of the caller's.
    async fn insert_command(&mut self, command: &NewCommand, now_ms: i64) -> Result<CommandRow, StoreError>;
}

crate::backend::for_both_engines! {
    impl CommandsTx for sqlx::Transaction<'_, DB> {
        async fn insert_command(&mut self, command: &NewCommand, now_ms: i64) -> Result<CommandRow, StoreError> {
            let tx = self;
            let row = sqlx::query(&format!(
                "INSERT INTO commands (node_id, kind, payload, created_at) VALUES ($1, $2, $3, $4) RETURNING {COMMAND_COLUMNS}"
            ))
            .bind(&command.node_id)
            .bind(&command.kind)
            .bind(&command.payload)
            .bind(now_ms)
            .fetch_one(&mut **tx)
            .await?;
            Ok(command_from_row(&row))
        }
    }
}
