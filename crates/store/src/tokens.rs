//! Admin API tokens and single-use join tokens. Only SHA-256 digests of
//! tokens are stored; the clear token is shown once, at creation.

use sqlx::Row;

use super::{Store, StoreError};

/// Why a join token was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenRejection {
    Unknown,
    Expired,
    AlreadyUsed,
}

impl Store {
    pub async fn insert_admin_token(&self, digest: &str, now_ms: i64) -> Result<(), StoreError> {
        on_db!(self, pool => {
            sqlx::query("INSERT INTO admin_tokens (token_sha256, created_at) VALUES ($1, $2)")
                .bind(digest)
                .bind(now_ms)
                .execute(pool)
                .await?;
            self.count_commit().await;
            Ok(())
        })
    }

    pub async fn admin_token_digests(&self) -> Result<Vec<String>, StoreError> {
        on_db!(self, pool => {
            let rows = sqlx::query("SELECT token_sha256 FROM admin_tokens").fetch_all(pool).await?;
            Ok(rows.iter().map(|r| r.get("token_sha256")).collect())
        })
    }

    pub async fn insert_join_token(&self, digest: &str, now_ms: i64, expires_ms: i64) -> Result<(), StoreError> {
        on_db!(self, pool => {
            sqlx::query("INSERT INTO join_tokens (token_sha256, created_at, expires_at) VALUES ($1, $2, $3)")
                .bind(digest)
                .bind(now_ms)
                .bind(expires_ms)
                .execute(pool)
                .await?;
            self.count_commit().await;
            Ok(())
        })
    }

    /// Whether a join token could be used now, without using it.
    pub async fn check_join_token(&self, digest: &str, now_ms: i64) -> Result<Result<(), TokenRejection>, StoreError> {
        on_db!(self, pool => {
            let row = sqlx::query("SELECT expires_at, used_at FROM join_tokens WHERE token_sha256 = $1")
                .bind(digest)
                .fetch_optional(pool)
                .await?;
            Ok(match row {
                None => Err(TokenRejection::Unknown),
                Some(row) if row.get::<Option<i64>, _>("used_at").is_some() => Err(TokenRejection::AlreadyUsed),
                Some(row) if row.get::<i64, _>("expires_at") <= now_ms => Err(TokenRejection::Expired),
                Some(_) => Ok(()),
            })
        })
    }
}
