//! Volume moves: the record of each `volumes move`, and the transactions
//! that start one (with its first command), switch the volume to its new
//! node, and fail one (with the commands that undo it).

use crate::backend::Cols;
use sqlx::Row;

use super::commands::CommandsTx;
use super::{NewCommand, Store, StoreError};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeMoveRow {
    pub id: String,
    pub volume: String,
    pub from_node: String,
    pub to_node: String,
    /// `copying`, `switched`, `done` or `failed`.
    pub state: String,
    pub reason: Option<String>,
    pub grant_sealed: String,
    pub port: Option<i64>,
    pub files: Option<i64>,
    pub bytes: Option<i64>,
    pub sent_digest: Option<String>,
    pub received_digest: Option<String>,
    pub stopped_at: Option<i64>,
    pub switched_at: Option<i64>,
    pub finished_at: Option<i64>,
    pub deployment_id: Option<String>,
    pub downtime_ms: Option<i64>,
    /// `in-use`, `kept` or `purged`.
    pub source_copy: String,
    pub keep_until: Option<i64>,
    pub created_at: i64,
    pub deadline: i64,
}

const MOVE_COLUMNS: &str = "id, volume, from_node, to_node, state, reason, grant_sealed, port, files, bytes, sent_digest, received_digest, \
    stopped_at, switched_at, finished_at, deployment_id, downtime_ms, source_copy, keep_until, created_at, deadline";

fn move_from_row(row: &impl Cols) -> VolumeMoveRow {
    VolumeMoveRow {
        id: row.col("id"),
        volume: row.col("volume"),
        from_node: row.col("from_node"),
        to_node: row.col("to_node"),
        state: row.col("state"),
        reason: row.col("reason"),
        grant_sealed: row.col("grant_sealed"),
        port: row.col("port"),
        files: row.col("files"),
        bytes: row.col("bytes"),
        sent_digest: row.col("sent_digest"),
        received_digest: row.col("received_digest"),
        stopped_at: row.col("stopped_at"),
        switched_at: row.col("switched_at"),
        finished_at: row.col("finished_at"),
        deployment_id: row.col("deployment_id"),
        downtime_ms: row.col("downtime_ms"),
        source_copy: row.col("source_copy"),
        keep_until: row.col("keep_until"),
        created_at: row.col("created_at"),
        deadline: row.col("deadline"),
    }
}

/// Why a move could not start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MoveRefusal {
    /// The volume is gone, or no longer on the node the move was planned from.
    Changed,
    /// Another move of the volume is unfinished: its id.
    Busy(String),
}

impl Store {
    /// Records a new move and queues its first command, unless the volume
    /// moved meanwhile or another move of it is unfinished.
    pub async fn start_volume_move(&self, row: &VolumeMoveRow, first: &NewCommand, now_ms: i64) -> Result<Result<(), MoveRefusal>, StoreError> {
        on_db!(self, pool => {
            let mut tx = pool.begin_write().await?;
            let here = sqlx::query("SELECT 1 FROM volumes WHERE name = $1 AND node_id = $2")
                .bind(&row.volume)
                .bind(&row.from_node)
                .fetch_optional(&mut *tx)
                .await?;
            if here.is_none() {
                tx.rollback().await?;
                return Ok(Err(MoveRefusal::Changed));
            }
            let busy: Option<String> = sqlx::query("SELECT id FROM volume_moves WHERE volume = $1 AND state IN ('copying', 'switched')")
                .bind(&row.volume)
                .fetch_optional(&mut *tx)
                .await?
                .map(|r| r.get("id"));
            if let Some(id) = busy {
                tx.rollback().await?;
                return Ok(Err(MoveRefusal::Busy(id)));
            }
            sqlx::query(
                "INSERT INTO volume_moves (id, volume, from_node, to_node, state, grant_sealed, source_copy, created_at, deadline) \
             VALUES ($1, $2, $3, $4, 'copying', $5, 'in-use', $6, $7)",
            )
            .bind(&row.id)
            .bind(&row.volume)
            .bind(&row.from_node)
            .bind(&row.to_node)
            .bind(&row.grant_sealed)
            .bind(row.created_at)
            .bind(row.deadline)
            .execute(&mut *tx)
            .await?;
            tx.insert_command(first, now_ms).await?;
            tx.commit().await?;
            self.count_commit().await;
            Ok(Ok(()))
        })
    }

    pub async fn volume_move(&self, id: &str) -> Result<Option<VolumeMoveRow>, StoreError> {
        on_db!(self, pool => {
            let row = sqlx::query(&format!("SELECT {MOVE_COLUMNS} FROM volume_moves WHERE id = $1")).bind(id).fetch_optional(pool).await?;
            Ok(row.as_ref().map(move_from_row))
        })
    }

    /// A volume's moves, newest first (at most 50).
    pub async fn volume_moves_of(&self, volume: &str) -> Result<Vec<VolumeMoveRow>, StoreError> {
        on_db!(self, pool => {
            let rows = sqlx::query(&format!("SELECT {MOVE_COLUMNS} FROM volume_moves WHERE volume = $1 ORDER BY created_at DESC, id DESC LIMIT 50"))
                .bind(volume)
                .fetch_all(pool)
                .await?;
            Ok(rows.iter().map(move_from_row).collect())
        })
    }

    /// Moves that need the watcher: unfinished ones, and kept copies.
    pub async fn volume_moves_to_watch(&self) -> Result<Vec<VolumeMoveRow>, StoreError> {
        on_db!(self, pool => {
            let rows = sqlx::query(&format!(
                "SELECT {MOVE_COLUMNS} FROM volume_moves WHERE state IN ('copying', 'switched') OR source_copy = 'kept' ORDER BY created_at"
            ))
            .fetch_all(pool)
            .await?;
            Ok(rows.iter().map(move_from_row).collect())
        })
    }

    /// The target's port, once (while copying). Returns whether it was set.
    pub async fn set_volume_move_port(&self, id: &str, port: u16, command: &NewCommand, now_ms: i64) -> Result<bool, StoreError> {
        on_db!(self, pool => {
            let mut tx = pool.begin_write().await?;
            let result = sqlx::query("UPDATE volume_moves SET port = $1 WHERE id = $2 AND state = 'copying' AND port IS NULL")
                .bind(i64::from(port))
                .bind(id)
                .execute(&mut *tx)
                .await?;
            if result.rows_affected() == 0 {
                tx.rollback().await?;
                return Ok(false);
            }
            tx.insert_command(command, now_ms).await?;
            tx.commit().await?;
            self.count_commit().await;
            Ok(true)
        })
    }

    /// What the source reported sending.
    pub async fn set_volume_move_sent(&self, id: &str, digest: &str, bytes: Option<i64>, stopped_at: Option<i64>) -> Result<(), StoreError> {
        on_db!(self, pool => {
            sqlx::query("UPDATE volume_moves SET sent_digest = $1, bytes = COALESCE($2, bytes), stopped_at = $3 WHERE id = $4 AND state = 'copying'")
                .bind(digest)
                .bind(bytes)
                .bind(stopped_at)
                .bind(id)
                .execute(pool)
                .await?;
            self.count_commit().await;
            Ok(())
        })
    }

    /// What the target reported receiving.
    pub async fn set_volume_move_received(&self, id: &str, digest: &str, files: Option<i64>) -> Result<(), StoreError> {
        on_db!(self, pool => {
            sqlx::query("UPDATE volume_moves SET received_digest = $1, files = COALESCE($2, files) WHERE id = $3 AND state = 'copying'")
                .bind(digest)
                .bind(files)
                .bind(id)
                .execute(pool)
                .await?;
            self.count_commit().await;
            Ok(())
        })
    }

    /// Switches the volume to the target node and queues the source's
    /// release, in one transaction; false when the move is not copying any
    /// more or the volume is not where the move found it.
    pub async fn switch_volume_move(&self, moved: &VolumeMoveRow, release: &NewCommand, keep_until: i64, now_ms: i64) -> Result<bool, StoreError> {
        on_db!(self, pool => {
            let mut tx = pool.begin_write().await?;
            let volume = sqlx::query("UPDATE volumes SET node_id = $1, size_bytes = NULL, size_at = NULL WHERE name = $2 AND node_id = $3")
                .bind(&moved.to_node)
                .bind(&moved.volume)
                .bind(&moved.from_node)
                .execute(&mut *tx)
                .await?;
            let row = sqlx::query(
                "UPDATE volume_moves SET state = 'switched', switched_at = $1, source_copy = 'kept', keep_until = $2 WHERE id = $3 AND state = 'copying'",
            )
            .bind(now_ms)
            .bind(keep_until)
            .bind(&moved.id)
            .execute(&mut *tx)
            .await?;
            if volume.rows_affected() != 1 || row.rows_affected() != 1 {
                tx.rollback().await?;
                return Ok(false);
            }
            tx.insert_command(release, now_ms).await?;
            tx.commit().await?;
            self.count_commit().await;
            Ok(true)
        })
    }

    pub async fn set_volume_move_deployment(&self, id: &str, deployment_id: &str) -> Result<(), StoreError> {
        on_db!(self, pool => {
            sqlx::query("UPDATE volume_moves SET deployment_id = $1 WHERE id = $2").bind(deployment_id).bind(id).execute(pool).await?;
            self.count_commit().await;
            Ok(())
        })
    }

    /// A switched move is done: its app runs on the new node (with the
    /// downtime measured), or could not start there (`reason`), or had
    /// nothing to start.
    pub async fn finish_volume_move(&self, id: &str, reason: Option<&str>, downtime_ms: Option<i64>, now_ms: i64) -> Result<bool, StoreError> {
        on_db!(self, pool => {
            let result = sqlx::query("UPDATE volume_moves SET state = 'done', reason = $1, downtime_ms = $2, finished_at = $3 WHERE id = $4 AND state = 'switched'")
                .bind(reason)
                .bind(downtime_ms)
                .bind(now_ms)
                .bind(id)
                .execute(pool)
                .await?;
            self.count_commit().await;
            Ok(result.rows_affected() == 1)
        })
    }

    /// Fails a move that is still copying and queues the commands that
    /// undo it on both nodes, in one transaction. False when it was not
    /// copying (already failed, or switched).
    pub async fn fail_volume_move(&self, id: &str, reason: &str, undo: &[NewCommand], now_ms: i64) -> Result<bool, StoreError> {
        on_db!(self, pool => {
            let mut tx = pool.begin_write().await?;
            let result = sqlx::query("UPDATE volume_moves SET state = 'failed', reason = $1, finished_at = $2 WHERE id = $3 AND state = 'copying'")
                .bind(reason)
                .bind(now_ms)
                .bind(id)
                .execute(&mut *tx)
                .await?;
            if result.rows_affected() == 0 {
                tx.rollback().await?;
                return Ok(false);
            }
            for command in undo {
                tx.insert_command(command, now_ms).await?;
            }
            tx.commit().await?;
            self.count_commit().await;
            Ok(true)
        })
    }

    /// Records what became of the source's copy (`kept` → `purging` →
    /// `purged`), queuing `command` in the same transaction when given.
    /// False when it was not `from` any more.
    pub async fn set_volume_move_source_copy(&self, id: &str, from: &str, to: &str, command: Option<&NewCommand>, now_ms: i64) -> Result<bool, StoreError> {
        on_db!(self, pool => {
            let mut tx = pool.begin_write().await?;
            let result = sqlx::query("UPDATE volume_moves SET source_copy = $1 WHERE id = $2 AND source_copy = $3")
                .bind(to)
                .bind(id)
                .bind(from)
                .execute(&mut *tx)
                .await?;
            if result.rows_affected() == 0 {
                tx.rollback().await?;
                return Ok(false);
            }
            if let Some(command) = command {
                tx.insert_command(command, now_ms).await?;
            }
            tx.commit().await?;
            self.count_commit().await;
            Ok(true)
        })
    }
}
