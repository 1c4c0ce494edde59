//! Git providers: the GitLab connection, the GitHub App, GitLab identities, which app
//! deploys from which project, handled webhook deliveries, and the clone
//! credentials of deployments that are building. Secrets arrive sealed
//! (or as digests); the store never sees them in clear.

use crate::backend::Cols;
use sqlx::Row;

use super::{Store, StoreError};

/// How long a webhook delivery id is remembered.
pub const DELIVERY_RETENTION_MS: i64 = 7 * super::retention::DAY_MS;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GitlabSettingsRow {
    pub base_url: String,
    pub client_id: String,
    pub client_secret_sealed: String,
    /// JSON array of usernames.
    pub allowed_users: String,
    /// JSON array of group full paths.
    pub allowed_groups: String,
    pub updated_at: i64,
}

/// The GitHub App (one per control plane).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GithubSettingsRow {
    pub api_url: String,
    pub app_id: i64,
    pub private_key_sealed: String,
    pub webhook_secret_sealed: String,
    pub updated_at: i64,
}

/// What a build's clone credentials were, taken back when it ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TakenCredentials {
    pub sealed: Option<String>,
    pub deploy_token_id: Option<i64>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GitlabAccountRow {
    pub gitlab_user_id: i64,
    pub username: String,
    pub local_user: Option<String>,
    pub access_token_sealed: String,
    pub refresh_token_sealed: Option<String>,
    pub expires_at: Option<i64>,
    pub updated_at: i64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppGitLinkRow {
    pub app: String,
    /// `gitlab` or `generic`.
    pub provider: String,
    pub project_id: Option<i64>,
    pub project_path: Option<String>,
    pub account: Option<i64>,
    pub hook_id: Option<i64>,
    pub webhook_secret_sha256: String,
    pub webhook_secret_sealed: Option<String>,
    pub created_at: i64,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DeploymentGitRow {
    pub deployment_id: String,
    pub credentials_sealed: Option<String>,
    pub deploy_token_id: Option<i64>,
    pub last_status: Option<String>,
}

fn account_from_row(row: &impl Cols) -> GitlabAccountRow {
    GitlabAccountRow {
        gitlab_user_id: row.col("gitlab_user_id"),
        username: row.col("username"),
        local_user: row.col("local_user"),
        access_token_sealed: row.col("access_token_sealed"),
        refresh_token_sealed: row.col("refresh_token_sealed"),
        expires_at: row.col("expires_at"),
        updated_at: row.col("updated_at"),
    }
}

fn link_from_row(row: &impl Cols) -> AppGitLinkRow {
    AppGitLinkRow {
        app: row.col("app"),
        provider: row.col("provider"),
        project_id: row.col("project_id"),
        project_path: row.col("project_path"),
        account: row.col("account"),
        hook_id: row.col("hook_id"),
        webhook_secret_sha256: row.col("webhook_secret_sha256"),
        webhook_secret_sealed: row.col("webhook_secret_sealed"),
        created_at: row.col("created_at"),
    }
}

const LINK_COLUMNS: &str = "app, provider, project_id, project_path, account, hook_id, webhook_secret_sha256, webhook_secret_sealed, created_at";
const ACCOUNT_COLUMNS: &str = "gitlab_user_id, username, local_user, access_token_sealed, refresh_token_sealed, expires_at, updated_at";

impl Store {
    pub async fn gitlab_settings(&self) -> Result<Option<GitlabSettingsRow>, StoreError> {
        on_db!(self, pool => {
            let row = sqlx::query("SELECT base_url, client_id, client_secret_sealed, allowed_users, allowed_groups, updated_at FROM gitlab_settings WHERE id = 1")
                .fetch_optional(pool)
                .await?;
            Ok(row.map(|row| GitlabSettingsRow {
                base_url: row.get("base_url"),
                client_id: row.get("client_id"),
                client_secret_sealed: row.get("client_secret_sealed"),
                allowed_users: row.get("allowed_users"),
                allowed_groups: row.get("allowed_groups"),
                updated_at: row.get("updated_at"),
            }))
        })
    }

    pub async fn put_gitlab_settings(&self, settings: &GitlabSettingsRow) -> Result<(), StoreError> {
        on_db!(self, pool => {
            sqlx::query(
                "INSERT INTO gitlab_settings (id, base_url, client_id, client_secret_sealed, allowed_users, allowed_groups, updated_at) \
             VALUES (1, $1, $2, $3, $4, $5, $6) ON CONFLICT (id) DO UPDATE SET base_url = excluded.base_url, \
             client_id = excluded.client_id, client_secret_sealed = excluded.client_secret_sealed, \
             allowed_users = excluded.allowed_users, allowed_groups = excluded.allowed_groups, updated_at = excluded.updated_at",
            )
            .bind(&settings.base_url)
            .bind(&settings.client_id)
            .bind(&settings.client_secret_sealed)
            .bind(&settings.allowed_users)
            .bind(&settings.allowed_groups)
            .bind(settings.updated_at)
            .execute(pool)
            .await?;
            self.count_commit().await;
            Ok(())
        })
    }

    pub async fn github_settings(&self) -> Result<Option<GithubSettingsRow>, StoreError> {
        on_db!(self, pool => {
            let row = sqlx::query("SELECT api_url, app_id, private_key_sealed, webhook_secret_sealed, updated_at FROM github_settings WHERE id = 1")
                .fetch_optional(pool)
                .await?;
            Ok(row.map(|row| GithubSettingsRow {
                api_url: row.get("api_url"),
                app_id: row.get("app_id"),
                private_key_sealed: row.get("private_key_sealed"),
                webhook_secret_sealed: row.get("webhook_secret_sealed"),
                updated_at: row.get("updated_at"),
            }))
        })
    }

    pub async fn put_github_settings(&self, settings: &GithubSettingsRow) -> Result<(), StoreError> {
        on_db!(self, pool => {
            sqlx::query(
                "INSERT INTO github_settings (id, api_url, app_id, private_key_sealed, webhook_secret_sealed, updated_at) \
             VALUES (1, $1, $2, $3, $4, $5) ON CONFLICT (id) DO UPDATE SET api_url = excluded.api_url, app_id = excluded.app_id, \
             private_key_sealed = excluded.private_key_sealed, webhook_secret_sealed = excluded.webhook_secret_sealed, updated_at = excluded.updated_at",
            )
            .bind(&settings.api_url)
            .bind(settings.app_id)
            .bind(&settings.private_key_sealed)
            .bind(&settings.webhook_secret_sealed)
            .bind(settings.updated_at)
            .execute(pool)
            .await?;
            self.count_commit().await;
            Ok(())
        })
    }

    pub async fn gitlab_account(&self, gitlab_user_id: i64) -> Result<Option<GitlabAccountRow>, StoreError> {
        on_db!(self, pool => {
            let row = sqlx::query(&format!("SELECT {ACCOUNT_COLUMNS} FROM gitlab_accounts WHERE gitlab_user_id = $1"))
                .bind(gitlab_user_id)
                .fetch_optional(pool)
                .await?;
            Ok(row.as_ref().map(account_from_row))
        })
    }

    pub async fn gitlab_accounts(&self) -> Result<Vec<GitlabAccountRow>, StoreError> {
        on_db!(self, pool => {
            let rows = sqlx::query(&format!("SELECT {ACCOUNT_COLUMNS} FROM gitlab_accounts ORDER BY gitlab_user_id")).fetch_all(pool).await?;
            Ok(rows.iter().map(account_from_row).collect())
        })
    }

    /// The GitLab identities linked to a local user.
    pub async fn gitlab_accounts_of_user(&self, local_user: &str) -> Result<Vec<GitlabAccountRow>, StoreError> {
        on_db!(self, pool => {
            let rows = sqlx::query(&format!("SELECT {ACCOUNT_COLUMNS} FROM gitlab_accounts WHERE local_user = $1 ORDER BY gitlab_user_id"))
                .bind(local_user)
                .fetch_all(pool)
                .await?;
            Ok(rows.iter().map(account_from_row).collect())
        })
    }

    /// Links a GitLab identity to a local user if it is linked to nobody
    /// yet. `false` when it already was (a link never moves by itself).
    pub async fn link_gitlab_account(&self, gitlab_user_id: i64, local_user: &str) -> Result<bool, StoreError> {
        on_db!(self, pool => {
            let done = sqlx::query("UPDATE gitlab_accounts SET local_user = $1 WHERE gitlab_user_id = $2 AND local_user IS NULL")
                .bind(local_user)
                .bind(gitlab_user_id)
                .execute(pool)
                .await?;
            self.count_commit().await;
            Ok(done.rows_affected() > 0)
        })
    }

    /// Saves a GitLab identity's tokens (new or refreshed). The link to a
    /// local user is kept unless `local_user` names one.
    pub async fn put_gitlab_account(&self, account: &GitlabAccountRow) -> Result<(), StoreError> {
        on_db!(self, pool => {
            sqlx::query(
                "INSERT INTO gitlab_accounts (gitlab_user_id, username, local_user, access_token_sealed, refresh_token_sealed, expires_at, updated_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (gitlab_user_id) DO UPDATE SET username = excluded.username, \
             local_user = COALESCE(excluded.local_user, gitlab_accounts.local_user), access_token_sealed = excluded.access_token_sealed, \
             refresh_token_sealed = excluded.refresh_token_sealed, expires_at = excluded.expires_at, updated_at = excluded.updated_at",
            )
            .bind(account.gitlab_user_id)
            .bind(&account.username)
            .bind(&account.local_user)
            .bind(&account.access_token_sealed)
            .bind(&account.refresh_token_sealed)
            .bind(account.expires_at)
            .bind(account.updated_at)
            .execute(pool)
            .await?;
            self.count_commit().await;
            Ok(())
        })
    }

    /// Accounts whose access token expires before `before_ms`.
    pub async fn gitlab_accounts_expiring(&self, before_ms: i64) -> Result<Vec<GitlabAccountRow>, StoreError> {
        on_db!(self, pool => {
            let rows = sqlx::query(&format!(
                "SELECT {ACCOUNT_COLUMNS} FROM gitlab_accounts WHERE expires_at IS NOT NULL AND expires_at < $1 AND refresh_token_sealed IS NOT NULL"
            ))
            .bind(before_ms)
            .fetch_all(pool)
            .await?;
            Ok(rows.iter().map(account_from_row).collect())
        })
    }

    pub async fn insert_app_git_link(&self, link: &AppGitLinkRow) -> Result<(), StoreError> {
        on_db!(self, pool => {
            sqlx::query(&format!("INSERT INTO app_git_links ({LINK_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)"))
                .bind(&link.app)
                .bind(&link.provider)
                .bind(link.project_id)
                .bind(&link.project_path)
                .bind(link.account)
                .bind(link.hook_id)
                .bind(&link.webhook_secret_sha256)
                .bind(&link.webhook_secret_sealed)
                .bind(link.created_at)
                .execute(pool)
                .await?;
            self.count_commit().await;
            Ok(())
        })
    }

    pub async fn set_app_hook_id(&self, app: &str, hook_id: i64) -> Result<(), StoreError> {
        on_db!(self, pool => {
            sqlx::query("UPDATE app_git_links SET hook_id = $1 WHERE app = $2").bind(hook_id).bind(app).execute(pool).await?;
            self.count_commit().await;
            Ok(())
        })
    }

    pub async fn app_git_link(&self, app: &str) -> Result<Option<AppGitLinkRow>, StoreError> {
        on_db!(self, pool => {
            let row = sqlx::query(&format!("SELECT {LINK_COLUMNS} FROM app_git_links WHERE app = $1")).bind(app).fetch_optional(pool).await?;
            Ok(row.as_ref().map(link_from_row))
        })
    }

    /// The app whose webhook secret has this digest.
    pub async fn app_git_link_by_secret(&self, provider: &str, secret_sha256: &str) -> Result<Option<AppGitLinkRow>, StoreError> {
        on_db!(self, pool => {
            let row = sqlx::query(&format!("SELECT {LINK_COLUMNS} FROM app_git_links WHERE provider = $1 AND webhook_secret_sha256 = $2"))
                .bind(provider)
                .bind(secret_sha256)
                .fetch_optional(pool)
                .await?;
            Ok(row.as_ref().map(link_from_row))
        })
    }

    /// The apps that deploy from one provider project.
    pub async fn app_git_links_of_project(&self, provider: &str, project_id: i64) -> Result<Vec<AppGitLinkRow>, StoreError> {
        on_db!(self, pool => {
            let rows = sqlx::query(&format!("SELECT {LINK_COLUMNS} FROM app_git_links WHERE provider = $1 AND project_id = $2 ORDER BY app"))
                .bind(provider)
                .bind(project_id)
                .fetch_all(pool)
                .await?;
            Ok(rows.iter().map(link_from_row).collect())
        })
    }

    /// Records a webhook delivery for `app`. Returns false when the same
    /// delivery was recorded before (a redelivery). Old ids are forgotten
    /// in the same transaction.
    pub async fn claim_webhook_delivery(&self, app: &str, delivery: &str, now_ms: i64) -> Result<bool, StoreError> {
        on_db!(self, pool => {
            let mut tx = pool.begin_write().await?;
            sqlx::query("DELETE FROM webhook_deliveries WHERE received_at < $1").bind(now_ms - DELIVERY_RETENTION_MS).execute(&mut *tx).await?;
            let inserted = sqlx::query("INSERT INTO webhook_deliveries (app, delivery, received_at) VALUES ($1, $2, $3) ON CONFLICT (app, delivery) DO NOTHING")
                .bind(app)
                .bind(delivery)
                .bind(now_ms)
                .execute(&mut *tx)
                .await?;
            tx.commit().await?;
            self.count_commit().await;
            Ok(inserted.rows_affected() == 1)
        })
    }

    /// The deployment a delivery created (for answering a redelivery).
    pub async fn set_webhook_delivery_deployment(&self, app: &str, delivery: &str, deployment_id: &str) -> Result<(), StoreError> {
        on_db!(self, pool => {
            sqlx::query("UPDATE webhook_deliveries SET deployment_id = $1 WHERE app = $2 AND delivery = $3")
                .bind(deployment_id)
                .bind(app)
                .bind(delivery)
                .execute(pool)
                .await?;
            self.count_commit().await;
            Ok(())
        })
    }

    pub async fn webhook_delivery_deployment(&self, app: &str, delivery: &str) -> Result<Option<String>, StoreError> {
        on_db!(self, pool => {
            let row = sqlx::query("SELECT deployment_id FROM webhook_deliveries WHERE app = $1 AND delivery = $2")
                .bind(app)
                .bind(delivery)
                .fetch_optional(pool)
                .await?;
            Ok(row.and_then(|r| r.get("deployment_id")))
        })
    }

    /// Forgets a delivery whose deployment could not be created, so the
    /// sender's retry is not taken for a redelivery.
    pub async fn release_webhook_delivery(&self, app: &str, delivery: &str) -> Result<(), StoreError> {
        on_db!(self, pool => {
            sqlx::query("DELETE FROM webhook_deliveries WHERE app = $1 AND delivery = $2").bind(app).bind(delivery).execute(pool).await?;
            self.count_commit().await;
            Ok(())
        })
    }

    pub async fn deployment_git(&self, deployment_id: &str) -> Result<Option<DeploymentGitRow>, StoreError> {
        on_db!(self, pool => {
            let row = sqlx::query("SELECT deployment_id, credentials_sealed, deploy_token_id, last_status FROM deployment_git WHERE deployment_id = $1")
                .bind(deployment_id)
                .fetch_optional(pool)
                .await?;
            Ok(row.map(|row| DeploymentGitRow {
                deployment_id: row.get("deployment_id"),
                credentials_sealed: row.get("credentials_sealed"),
                deploy_token_id: row.get("deploy_token_id"),
                last_status: row.get("last_status"),
            }))
        })
    }

    /// Stores a deployment's clone credentials (and the deploy token they
    /// are, if any); a row already there keeps its own.
    pub async fn put_deployment_credentials(&self, deployment_id: &str, sealed: &str, deploy_token_id: Option<i64>, now_ms: i64) -> Result<(), StoreError> {
        on_db!(self, pool => {
            sqlx::query(
                "INSERT INTO deployment_git (deployment_id, credentials_sealed, deploy_token_id, created_at) VALUES ($1, $2, $3, $4) \
             ON CONFLICT (deployment_id) DO UPDATE SET credentials_sealed = excluded.credentials_sealed, deploy_token_id = excluded.deploy_token_id",
            )
            .bind(deployment_id)
            .bind(sealed)
            .bind(deploy_token_id)
            .bind(now_ms)
            .execute(pool)
            .await?;
            self.count_commit().await;
            Ok(())
        })
    }

    /// Drops a deployment's clone credentials; returns what they were (still
    /// sealed) and the deploy token id, for revoking.
    pub async fn take_deployment_credentials(&self, deployment_id: &str) -> Result<Option<TakenCredentials>, StoreError> {
        on_db!(self, pool => {
            let mut tx = pool.begin_write().await?;
            let row = sqlx::query("SELECT credentials_sealed, deploy_token_id FROM deployment_git WHERE deployment_id = $1")
                .bind(deployment_id)
                .fetch_optional(&mut *tx)
                .await?;
            sqlx::query("UPDATE deployment_git SET credentials_sealed = NULL, deploy_token_id = NULL WHERE deployment_id = $1")
                .bind(deployment_id)
                .execute(&mut *tx)
                .await?;
            tx.commit().await?;
            self.count_commit().await;
            let taken = row.map(|r| TakenCredentials { sealed: r.get("credentials_sealed"), deploy_token_id: r.get("deploy_token_id") });
            Ok(taken.filter(|t| t.sealed.is_some() || t.deploy_token_id.is_some()))
        })
    }

    /// Records the commit status last posted for a deployment.
    pub async fn set_deployment_status(&self, deployment_id: &str, status: &str, now_ms: i64) -> Result<(), StoreError> {
        self.upsert_column("deployment_git", "deployment_id", deployment_id, "last_status", status, now_ms).await
    }
}
