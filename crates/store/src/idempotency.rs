//! `Idempotency-Key` answers: a deploy or rollback request that carries a
//! key records its answer here, and the same key with the same request
//! gets that answer again instead of a second deployment.

use sqlx::Row;

use super::retention::IDEMPOTENCY_RETENTION_MS;
use super::{Store, StoreError};

/// How long an unfinished claim holds its key. Creating a deployment takes
/// milliseconds; a claim this old belongs to a request that died with its
/// process (killed mid-request) or never recorded its answer, and keeping
/// it would answer every retry 409 until retention removes it (a day).
pub const IDEMPOTENCY_IN_PROGRESS_MS: i64 = 60_000;

/// What a key means for a request that arrives with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IdempotencyClaim {
    /// First use (or the old use expired): run the request.
    New,
    /// Same key, same request, finished: answer this again.
    Replay { status: u16, response: String },
    /// Same key, another request.
    Mismatch,
    /// Same key, same request, still running.
    InProgress,
}

impl Store {
    /// Claims `key` for a request whose digest is `request_sha256`.
    pub async fn claim_idempotency_key(&self, key: &str, request_sha256: &str, now_ms: i64) -> Result<IdempotencyClaim, StoreError> {
        on_db!(self, pool => {
            let mut tx = pool.begin_write().await?;
            // An expired key is free again.
            sqlx::query("DELETE FROM idempotency_keys WHERE key = $1 AND created_at < $2")
                .bind(key)
                .bind(now_ms - IDEMPOTENCY_RETENTION_MS)
                .execute(&mut *tx)
                .await?;
            // So is a claim whose request never finished within the limit.
            sqlx::query("DELETE FROM idempotency_keys WHERE key = $1 AND status IS NULL AND created_at < $2")
                .bind(key)
                .bind(now_ms - IDEMPOTENCY_IN_PROGRESS_MS)
                .execute(&mut *tx)
                .await?;
            let inserted = sqlx::query(
                "INSERT INTO idempotency_keys (key, request_sha256, created_at) VALUES ($1, $2, $3) ON CONFLICT (key) DO NOTHING",
            )
            .bind(key)
            .bind(request_sha256)
            .bind(now_ms)
            .execute(&mut *tx)
            .await?;
            let claim = if inserted.rows_affected() == 1 {
                IdempotencyClaim::New
            } else {
                let row = sqlx::query("SELECT request_sha256, status, response FROM idempotency_keys WHERE key = $1")
                    .bind(key)
                    .fetch_one(&mut *tx)
                    .await?;
                let stored: String = row.get("request_sha256");
                match (stored == request_sha256, row.get::<Option<i64>, _>("status"), row.get::<Option<String>, _>("response")) {
                    (false, _, _) => IdempotencyClaim::Mismatch,
                    (true, Some(status), Some(response)) => IdempotencyClaim::Replay { status: status.clamp(0, 999) as u16, response },
                    (true, _, _) => IdempotencyClaim::InProgress,
                }
            };
            tx.commit().await?;
            self.count_commit().await;
            Ok(claim)
        })
    }

    /// Records the answer of the request that claimed `key`.
    pub async fn finish_idempotency_key(&self, key: &str, status: u16, response: &str) -> Result<(), StoreError> {
        on_db!(self, pool => {
            sqlx::query("UPDATE idempotency_keys SET status = $1, response = $2 WHERE key = $3")
                .bind(i64::from(status))
                .bind(response)
                .bind(key)
                .execute(pool)
                .await?;
            self.count_commit().await;
            Ok(())
        })
    }

    /// Frees every unfinished claim. Called once at start-up, before the
    /// API listens: no request of this process is running yet, so each
    /// unfinished claim was made by an earlier start that was killed or
    /// crashed mid-request, and its key must not answer "still running".
    /// (One control plane owns the database, so this stands in for a
    /// boot id on each claim.) Returns how many were freed.
    pub async fn release_unfinished_idempotency_keys(&self) -> Result<u64, StoreError> {
        on_db!(self, pool => {
            let freed = sqlx::query("DELETE FROM idempotency_keys WHERE status IS NULL").execute(pool).await?.rows_affected();
            self.count_commit().await;
            Ok(freed)
        })
    }

    /// Frees `key` after its request failed, so a retry runs it again.
    pub async fn release_idempotency_key(&self, key: &str) -> Result<(), StoreError> {
        on_db!(self, pool => {
            sqlx::query("DELETE FROM idempotency_keys WHERE key = $1 AND status IS NULL").bind(key).execute(pool).await?;
            self.count_commit().await;
            Ok(())
        })
    }
}
