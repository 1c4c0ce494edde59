//! Preview environments: each app's preview settings, its previews (one
//! per pull or merge request, run by an app of its own), and the
//! variables its previews never get.

use crate::backend::Cols;

use super::{Store, StoreError};

#[derive(Debug, Clone, PartialEq)]
pub struct PreviewSettingsRow {
    pub app: String,
    pub enabled: bool,
    pub max_previews: i64,
    pub ttl_s: i64,
    /// `none`, `empty` or `latest-backup`.
    pub database: String,
    /// Variables previews get on top of the app's (sealed).
    pub env_sealed: Option<String>,
    /// Each preview's resources (`None`: the app's).
    pub instances: Option<i64>,
    pub cpu: Option<f64>,
    pub memory_bytes: Option<i64>,
    pub updated_at: i64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreviewRow {
    pub app: String,
    pub number: i64,
    pub preview_app: String,
    pub head_ref: String,
    pub head_sha: String,
    pub head_clone_url: String,
    pub from_fork: bool,
    pub approved_by: Option<String>,
    /// `awaiting-approval` or `active`.
    pub state: String,
    /// The comment on the request that says where the preview stands.
    pub comment_id: Option<i64>,
    /// The services made for this preview.
    pub services: Vec<String>,
    pub created_at: i64,
    pub updated_at: i64,
}

const COLUMNS: &str = "app, number, preview_app, head_ref, head_sha, head_clone_url, from_fork, approved_by, state, comment_id, services, created_at, updated_at";

fn preview_from(row: &impl Cols) -> PreviewRow {
    PreviewRow {
        app: row.col("app"),
        number: row.col("number"),
        preview_app: row.col("preview_app"),
        head_ref: row.col("head_ref"),
        head_sha: row.col("head_sha"),
        head_clone_url: row.col("head_clone_url"),
        from_fork: row.col("from_fork"),
        approved_by: row.col("approved_by"),
        state: row.col("state"),
        comment_id: row.col("comment_id"),
        services: serde_json::from_str(&row.col::<String>("services")).unwrap_or_default(),
        created_at: row.col("created_at"),
        updated_at: row.col("updated_at"),
    }
}

impl Store {
    pub async fn preview_settings(&self, app: &str) -> Result<Option<PreviewSettingsRow>, StoreError> {
        on_db!(self, pool => {
            let row = sqlx::query("SELECT app, enabled, max_previews, ttl_s, database, env_sealed, instances, cpu, memory_bytes, updated_at FROM preview_settings WHERE app = $1").bind(app).fetch_optional(pool).await?;
            Ok(row.map(|row| PreviewSettingsRow {
                app: row.col("app"),
                enabled: row.col("enabled"),
                max_previews: row.col("max_previews"),
                ttl_s: row.col("ttl_s"),
                database: row.col("database"),
                env_sealed: row.col("env_sealed"),
                instances: row.col("instances"),
                cpu: row.col("cpu"),
                memory_bytes: row.col("memory_bytes"),
                updated_at: row.col("updated_at"),
            }))
        })
    }

    pub async fn put_preview_settings(&self, settings: &PreviewSettingsRow) -> Result<(), StoreError> {
        on_db!(self, pool => {
            sqlx::query(
                "INSERT INTO preview_settings (app, enabled, max_previews, ttl_s, database, env_sealed, instances, cpu, memory_bytes, updated_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) \
             ON CONFLICT (app) DO UPDATE SET enabled = excluded.enabled, max_previews = excluded.max_previews, ttl_s = excluded.ttl_s, \
             database = excluded.database, env_sealed = excluded.env_sealed, instances = excluded.instances, cpu = excluded.cpu, \
             memory_bytes = excluded.memory_bytes, updated_at = excluded.updated_at",
            )
            .bind(&settings.app)
            .bind(settings.enabled)
            .bind(settings.max_previews)
            .bind(settings.ttl_s)
            .bind(&settings.database)
            .bind(&settings.env_sealed)
            .bind(settings.instances)
            .bind(settings.cpu)
            .bind(settings.memory_bytes)
            .bind(settings.updated_at)
            .execute(pool)
            .await?;
            self.count_commit().await;
            Ok(())
        })
    }

    /// An app's previews, oldest first.
    pub async fn previews_of(&self, app: &str) -> Result<Vec<PreviewRow>, StoreError> {
        on_db!(self, pool => {
            let rows = sqlx::query(&format!("SELECT {COLUMNS} FROM previews WHERE app = $1 ORDER BY created_at, number")).bind(app).fetch_all(pool).await?;
            Ok(rows.iter().map(preview_from).collect())
        })
    }

    pub async fn preview(&self, app: &str, number: i64) -> Result<Option<PreviewRow>, StoreError> {
        on_db!(self, pool => {
            let row = sqlx::query(&format!("SELECT {COLUMNS} FROM previews WHERE app = $1 AND number = $2")).bind(app).bind(number).fetch_optional(pool).await?;
            Ok(row.as_ref().map(preview_from))
        })
    }

    /// The preview an app runs, if it is one.
    pub async fn preview_by_app(&self, preview_app: &str) -> Result<Option<PreviewRow>, StoreError> {
        on_db!(self, pool => {
            let row = sqlx::query(&format!("SELECT {COLUMNS} FROM previews WHERE preview_app = $1")).bind(preview_app).fetch_optional(pool).await?;
            Ok(row.as_ref().map(preview_from))
        })
    }

    /// Active previews of every app with no push since `before` (unix ms).
    pub async fn previews_idle_since(&self, before: i64) -> Result<Vec<PreviewRow>, StoreError> {
        on_db!(self, pool => {
            let rows = sqlx::query(&format!("SELECT {COLUMNS} FROM previews WHERE updated_at < $1 ORDER BY updated_at")).bind(before).fetch_all(pool).await?;
            Ok(rows.iter().map(preview_from).collect())
        })
    }

    pub async fn put_preview(&self, preview: &PreviewRow) -> Result<(), StoreError> {
        on_db!(self, pool => {
            sqlx::query(&format!(
                "INSERT INTO previews ({COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13) ON CONFLICT (app, number) DO UPDATE SET \
             preview_app = excluded.preview_app, head_ref = excluded.head_ref, head_sha = excluded.head_sha, head_clone_url = excluded.head_clone_url, \
             from_fork = excluded.from_fork, approved_by = excluded.approved_by, state = excluded.state, services = excluded.services, updated_at = excluded.updated_at"
            ))
            .bind(&preview.app)
            .bind(preview.number)
            .bind(&preview.preview_app)
            .bind(&preview.head_ref)
            .bind(&preview.head_sha)
            .bind(&preview.head_clone_url)
            .bind(preview.from_fork)
            .bind(&preview.approved_by)
            .bind(&preview.state)
            .bind(preview.comment_id)
            .bind(serde_json::to_string(&preview.services).expect("names serialize"))
            .bind(preview.created_at)
            .bind(preview.updated_at)
            .execute(pool)
            .await?;
            self.count_commit().await;
            Ok(())
        })
    }

    /// Records the request's comment (the upsert above keeps it).
    pub async fn set_preview_comment(&self, app: &str, number: i64, comment_id: i64) -> Result<(), StoreError> {
        on_db!(self, pool => {
            sqlx::query("UPDATE previews SET comment_id = $1 WHERE app = $2 AND number = $3").bind(comment_id).bind(app).bind(number).execute(pool).await?;
            self.count_commit().await;
            Ok(())
        })
    }

    pub async fn delete_preview(&self, app: &str, number: i64) -> Result<bool, StoreError> {
        on_db!(self, pool => {
            let done = sqlx::query("DELETE FROM previews WHERE app = $1 AND number = $2").bind(app).bind(number).execute(pool).await?;
            self.count_commit().await;
            Ok(done.rows_affected() > 0)
        })
    }

    /// The app's variables its previews never get.
    pub async fn production_only_env(&self, app: &str) -> Result<Vec<String>, StoreError> {
        on_db!(self, pool => {
            let rows = sqlx::query("SELECT name FROM env_production_only WHERE app = $1 ORDER BY name").bind(app).fetch_all(pool).await?;
            Ok(rows.iter().map(|row| row.col("name")).collect())
        })
    }

    /// Replaces the app's production-only variable names.
    pub async fn set_production_only_env(&self, app: &str, names: &[String]) -> Result<(), StoreError> {
        on_db!(self, pool => {
            let mut tx = pool.begin_write().await?;
            sqlx::query("DELETE FROM env_production_only WHERE app = $1").bind(app).execute(&mut *tx).await?;
            for name in names {
                sqlx::query("INSERT INTO env_production_only (app, name) VALUES ($1, $2)").bind(app).bind(name).execute(&mut *tx).await?;
            }
            tx.commit().await?;
            self.count_commit().await;
            Ok(())
        })
    }
}
