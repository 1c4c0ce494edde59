//! Apps: what to build and how to run it. Secrets arrive here already
//! sealed; the store never sees them in clear.

use sqlx::sqlite::SqliteRow;
use sqlx::Row;

use super::{Store, StoreError};

#[derive(Debug, Clone, PartialEq)]
pub struct AppRow {
    pub name: String,
    pub repo_url: String,
    pub branch: String,
    pub port: i64,
    /// JSON array of host names.
    pub domains: String,
    /// JSON build settings, when the user set any.
    pub build: Option<String>,
    /// `auto`, `dockerfile`, `static` or `buildpacks`.
    pub strategy: String,
    pub instances: i64,
    pub cpu: Option<f64>,
    pub memory_bytes: Option<i64>,
    pub health_path: String,
    pub health_timeout_s: i64,
    /// Build time limit; the agent's default when `None`.
    pub build_timeout_s: Option<i64>,
    pub env_sealed: Option<String>,
    pub git_credentials_sealed: Option<String>,
    pub created_at: i64,
}

const APP_COLUMNS: &str = "name, repo_url, branch, port, domains, build, strategy, instances, cpu, memory_bytes, health_path, \
     health_timeout_s, env_sealed, git_credentials_sealed, created_at, build_timeout_s";

fn app_from_row(row: &SqliteRow) -> AppRow {
    AppRow {
        name: row.get("name"),
        repo_url: row.get("repo_url"),
        branch: row.get("branch"),
        port: row.get("port"),
        domains: row.get("domains"),
        build: row.get("build"),
        strategy: row.get("strategy"),
        instances: row.get("instances"),
        cpu: row.get("cpu"),
        memory_bytes: row.get("memory_bytes"),
        health_path: row.get("health_path"),
        health_timeout_s: row.get("health_timeout_s"),
        env_sealed: row.get("env_sealed"),
        git_credentials_sealed: row.get("git_credentials_sealed"),
        created_at: row.get("created_at"),
        build_timeout_s: row.get("build_timeout_s"),
    }
}

impl Store {
    /// Inserts an app; returns false when the name is taken.
    pub async fn insert_app(&self, app: &AppRow) -> Result<bool, StoreError> {
        let result = sqlx::query(&format!(
            "INSERT INTO apps ({APP_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16) \
             ON CONFLICT (name) DO NOTHING"
        ))
        .bind(&app.name)
        .bind(&app.repo_url)
        .bind(&app.branch)
        .bind(app.port)
        .bind(&app.domains)
        .bind(&app.build)
        .bind(&app.strategy)
        .bind(app.instances)
        .bind(app.cpu)
        .bind(app.memory_bytes)
        .bind(&app.health_path)
        .bind(app.health_timeout_s)
        .bind(&app.env_sealed)
        .bind(&app.git_credentials_sealed)
        .bind(app.created_at)
        .bind(app.build_timeout_s)
        .execute(&self.pool)
        .await?;
        self.count_commit();
        Ok(result.rows_affected() == 1)
    }

    pub async fn app(&self, name: &str) -> Result<Option<AppRow>, StoreError> {
        let row = sqlx::query(&format!("SELECT {APP_COLUMNS} FROM apps WHERE name = $1")).bind(name).fetch_optional(&self.pool).await?;
        Ok(row.as_ref().map(app_from_row))
    }

    pub async fn apps(&self) -> Result<Vec<AppRow>, StoreError> {
        let rows = sqlx::query(&format!("SELECT {APP_COLUMNS} FROM apps ORDER BY name")).fetch_all(&self.pool).await?;
        Ok(rows.iter().map(app_from_row).collect())
    }

    pub async fn set_app_env(&self, name: &str, env_sealed: &str) -> Result<bool, StoreError> {
        let result = sqlx::query("UPDATE apps SET env_sealed = $1 WHERE name = $2").bind(env_sealed).bind(name).execute(&self.pool).await?;
        self.count_commit();
        Ok(result.rows_affected() == 1)
    }

    pub async fn set_app_domains(&self, name: &str, domains_json: &str) -> Result<bool, StoreError> {
        let result = sqlx::query("UPDATE apps SET domains = $1 WHERE name = $2").bind(domains_json).bind(name).execute(&self.pool).await?;
        self.count_commit();
        Ok(result.rows_affected() == 1)
    }

    /// Deletes an app with its deployments, instance records, reports and
    /// log lines (an app's output may hold its secrets: nothing of it stays).
    pub async fn delete_app(&self, name: &str) -> Result<bool, StoreError> {
        let mut tx = self.write_transaction().await?;
        for table in ["deployment_logs", "deployment_reports"] {
            sqlx::query(&format!("DELETE FROM {table} WHERE deployment_id IN (SELECT id FROM deployments WHERE app = $1)"))
                .bind(name)
                .execute(&mut *tx)
                .await?;
        }
        sqlx::query("DELETE FROM instances WHERE deployment_id IN (SELECT id FROM deployments WHERE app = $1)")
            .bind(name)
            .execute(&mut *tx)
            .await?;
        sqlx::query("DELETE FROM deployments WHERE app = $1").bind(name).execute(&mut *tx).await?;
        let deleted = sqlx::query("DELETE FROM apps WHERE name = $1").bind(name).execute(&mut *tx).await?;
        tx.commit().await?;
        self.count_commit();
        Ok(deleted.rows_affected() == 1)
    }
}
