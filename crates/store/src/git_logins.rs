//! Logging in with a git host other than GitLab: the GitHub App's OAuth
//! settings (the client secret arrives sealed) and the identities of
//! those hosts, keyed by (host, the host's user id), with the local user
//! each is linked to.

use crate::backend::Cols;
use sqlx::Row;

use super::{Store, StoreError};

/// The GitHub App's login settings (one per control plane).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GithubLoginRow {
    pub web_url: String,
    pub api_url: String,
    pub client_id: String,
    pub client_secret_sealed: String,
    /// JSON arrays: logins (or numeric ids), organizations, `org/team`.
    pub allowed_users: String,
    pub allowed_orgs: String,
    pub allowed_teams: String,
    pub updated_at: i64,
}

/// An identity on a git host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GitIdentityRow {
    pub provider: String,
    pub provider_user_id: i64,
    pub username: String,
    pub local_user: Option<String>,
    pub created_at: i64,
    pub updated_at: i64,
}

const IDENTITY_COLUMNS: &str = "provider, provider_user_id, username, local_user, created_at, updated_at";

fn identity_from(row: &impl Cols) -> GitIdentityRow {
    GitIdentityRow {
        provider: row.col("provider"),
        provider_user_id: row.col("provider_user_id"),
        username: row.col("username"),
        local_user: row.col("local_user"),
        created_at: row.col("created_at"),
        updated_at: row.col("updated_at"),
    }
}

impl Store {
    pub async fn github_login(&self) -> Result<Option<GithubLoginRow>, StoreError> {
        on_db!(self, pool => {
            let row = sqlx::query(
                "SELECT web_url, api_url, client_id, client_secret_sealed, allowed_users, allowed_orgs, allowed_teams, updated_at FROM github_login_settings WHERE id = 1",
            )
            .fetch_optional(pool)
            .await?;
            Ok(row.map(|row| GithubLoginRow {
                web_url: row.get("web_url"),
                api_url: row.get("api_url"),
                client_id: row.get("client_id"),
                client_secret_sealed: row.get("client_secret_sealed"),
                allowed_users: row.get("allowed_users"),
                allowed_orgs: row.get("allowed_orgs"),
                allowed_teams: row.get("allowed_teams"),
                updated_at: row.get("updated_at"),
            }))
        })
    }

    pub async fn put_github_login(&self, settings: &GithubLoginRow) -> Result<(), StoreError> {
        on_db!(self, pool => {
            sqlx::query(
                "INSERT INTO github_login_settings (id, web_url, api_url, client_id, client_secret_sealed, allowed_users, allowed_orgs, allowed_teams, updated_at) \
             VALUES (1, $1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT (id) DO UPDATE SET web_url = excluded.web_url, api_url = excluded.api_url, client_id = excluded.client_id, \
             client_secret_sealed = excluded.client_secret_sealed, allowed_users = excluded.allowed_users, allowed_orgs = excluded.allowed_orgs, \
             allowed_teams = excluded.allowed_teams, updated_at = excluded.updated_at",
            )
            .bind(&settings.web_url)
            .bind(&settings.api_url)
            .bind(&settings.client_id)
            .bind(&settings.client_secret_sealed)
            .bind(&settings.allowed_users)
            .bind(&settings.allowed_orgs)
            .bind(&settings.allowed_teams)
            .bind(settings.updated_at)
            .execute(pool)
            .await?;
            self.count_commit().await;
            Ok(())
        })
    }

    pub async fn git_identity(&self, provider: &str, provider_user_id: i64) -> Result<Option<GitIdentityRow>, StoreError> {
        on_db!(self, pool => {
            let row = sqlx::query(&format!("SELECT {IDENTITY_COLUMNS} FROM git_identities WHERE provider = $1 AND provider_user_id = $2"))
                .bind(provider)
                .bind(provider_user_id)
                .fetch_optional(pool)
                .await?;
            Ok(row.as_ref().map(identity_from))
        })
    }

    /// Every identity of `provider` linked to some local user.
    pub async fn linked_git_identities(&self, provider: &str) -> Result<Vec<GitIdentityRow>, StoreError> {
        on_db!(self, pool => {
            let rows = sqlx::query(&format!(
                "SELECT {IDENTITY_COLUMNS} FROM git_identities WHERE provider = $1 AND local_user IS NOT NULL ORDER BY provider_user_id"
            ))
            .bind(provider)
            .fetch_all(pool)
            .await?;
            Ok(rows.iter().map(identity_from).collect())
        })
    }

    /// The identities of `provider` linked to a local user.
    pub async fn git_identities_of_user(&self, provider: &str, local_user: &str) -> Result<Vec<GitIdentityRow>, StoreError> {
        on_db!(self, pool => {
            let rows = sqlx::query(&format!(
                "SELECT {IDENTITY_COLUMNS} FROM git_identities WHERE provider = $1 AND local_user = $2 ORDER BY provider_user_id"
            ))
            .bind(provider)
            .bind(local_user)
            .fetch_all(pool)
            .await?;
            Ok(rows.iter().map(identity_from).collect())
        })
    }

    /// Records an identity seen at a login (new, or its username
    /// changed); its link is kept.
    pub async fn saw_git_identity(&self, provider: &str, provider_user_id: i64, username: &str, now: i64) -> Result<(), StoreError> {
        on_db!(self, pool => {
            sqlx::query(
                "INSERT INTO git_identities (provider, provider_user_id, username, local_user, created_at, updated_at) VALUES ($1, $2, $3, NULL, $4, $4) \
             ON CONFLICT (provider, provider_user_id) DO UPDATE SET username = excluded.username, updated_at = excluded.updated_at",
            )
            .bind(provider)
            .bind(provider_user_id)
            .bind(username)
            .bind(now)
            .execute(pool)
            .await?;
            self.count_commit().await;
            Ok(())
        })
    }

    /// Links an identity to a local user if it is linked to none yet;
    /// whether it did.
    pub async fn link_git_identity(&self, provider: &str, provider_user_id: i64, local_user: &str) -> Result<bool, StoreError> {
        on_db!(self, pool => {
            let done = sqlx::query("UPDATE git_identities SET local_user = $1 WHERE provider = $2 AND provider_user_id = $3 AND local_user IS NULL")
                .bind(local_user)
                .bind(provider)
                .bind(provider_user_id)
                .execute(pool)
                .await?;
            self.count_commit().await;
            Ok(done.rows_affected() > 0)
        })
    }
}
