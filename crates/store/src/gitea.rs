//! Gitea and Forgejo: the OAuth application's settings (the client secret
//! arrives sealed) and the sealed tokens of each identity. The identities
//! themselves, and the local user each is linked to, are
//! `git_identities` (provider `gitea`, see `git_logins.rs`).

use crate::backend::Cols;

use super::{Store, StoreError};

/// The Gitea or Forgejo instance (one per control plane).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GiteaSettingsRow {
    pub base_url: String,
    pub client_id: String,
    pub client_secret_sealed: String,
    /// JSON arrays: user names (or `id:<number>`), organization names.
    pub allowed_users: String,
    pub allowed_orgs: String,
    pub updated_at: i64,
}

/// A Gitea identity's tokens, sealed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GiteaTokensRow {
    pub gitea_user_id: i64,
    pub access_token_sealed: String,
    pub refresh_token_sealed: Option<String>,
    pub expires_at: Option<i64>,
    pub updated_at: i64,
}

const TOKEN_COLUMNS: &str = "gitea_user_id, access_token_sealed, refresh_token_sealed, expires_at, updated_at";

fn tokens_from(row: &impl Cols) -> GiteaTokensRow {
    GiteaTokensRow {
        gitea_user_id: row.col("gitea_user_id"),
        access_token_sealed: row.col("access_token_sealed"),
        refresh_token_sealed: row.col("refresh_token_sealed"),
        expires_at: row.col("expires_at"),
        updated_at: row.col("updated_at"),
    }
}

impl Store {
    pub async fn gitea_settings(&self) -> Result<Option<GiteaSettingsRow>, StoreError> {
        on_db!(self, pool => {
            let row = sqlx::query("SELECT base_url, client_id, client_secret_sealed, allowed_users, allowed_orgs, updated_at FROM gitea_settings WHERE id = 1")
                .fetch_optional(pool)
                .await?;
            Ok(row.map(|row| GiteaSettingsRow {
                base_url: row.col("base_url"),
                client_id: row.col("client_id"),
                client_secret_sealed: row.col("client_secret_sealed"),
                allowed_users: row.col("allowed_users"),
                allowed_orgs: row.col("allowed_orgs"),
                updated_at: row.col("updated_at"),
            }))
        })
    }

    pub async fn put_gitea_settings(&self, settings: &GiteaSettingsRow) -> Result<(), StoreError> {
        on_db!(self, pool => {
            sqlx::query(
                "INSERT INTO gitea_settings (id, base_url, client_id, client_secret_sealed, allowed_users, allowed_orgs, updated_at) VALUES (1, $1, $2, $3, $4, $5, $6) \
             ON CONFLICT (id) DO UPDATE SET base_url = excluded.base_url, client_id = excluded.client_id, client_secret_sealed = excluded.client_secret_sealed, \
             allowed_users = excluded.allowed_users, allowed_orgs = excluded.allowed_orgs, updated_at = excluded.updated_at",
            )
            .bind(&settings.base_url)
            .bind(&settings.client_id)
            .bind(&settings.client_secret_sealed)
            .bind(&settings.allowed_users)
            .bind(&settings.allowed_orgs)
            .bind(settings.updated_at)
            .execute(pool)
            .await?;
            self.count_commit().await;
            Ok(())
        })
    }

    pub async fn gitea_tokens(&self, gitea_user_id: i64) -> Result<Option<GiteaTokensRow>, StoreError> {
        on_db!(self, pool => {
            let row = sqlx::query(&format!("SELECT {TOKEN_COLUMNS} FROM gitea_tokens WHERE gitea_user_id = $1"))
                .bind(gitea_user_id)
                .fetch_optional(pool)
                .await?;
            Ok(row.as_ref().map(tokens_from))
        })
    }

    /// Every Gitea identity that has tokens, by id.
    pub async fn gitea_token_holders(&self) -> Result<Vec<i64>, StoreError> {
        on_db!(self, pool => {
            let rows = sqlx::query("SELECT gitea_user_id FROM gitea_tokens ORDER BY gitea_user_id").fetch_all(pool).await?;
            Ok(rows.iter().map(|row| row.col("gitea_user_id")).collect())
        })
    }

    pub async fn put_gitea_tokens(&self, tokens: &GiteaTokensRow) -> Result<(), StoreError> {
        on_db!(self, pool => {
            sqlx::query(&format!(
                "INSERT INTO gitea_tokens ({TOKEN_COLUMNS}) VALUES ($1, $2, $3, $4, $5) ON CONFLICT (gitea_user_id) DO UPDATE SET \
             access_token_sealed = excluded.access_token_sealed, refresh_token_sealed = excluded.refresh_token_sealed, \
             expires_at = excluded.expires_at, updated_at = excluded.updated_at"
            ))
            .bind(tokens.gitea_user_id)
            .bind(&tokens.access_token_sealed)
            .bind(&tokens.refresh_token_sealed)
            .bind(tokens.expires_at)
            .bind(tokens.updated_at)
            .execute(pool)
            .await?;
            self.count_commit().await;
            Ok(())
        })
    }
}
