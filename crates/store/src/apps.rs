//! Apps: what to build and how to run it. Secrets arrive here already
//! sealed; the store never sees them in clear.

use crate::backend::Cols;
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
    /// `blue-green` or `recreate`.
    pub rollout: String,
    /// JSON liveness probe settings, when the app has one.
    pub liveness: Option<String>,
    /// JSON readiness probe settings, when the app has one.
    pub readiness: Option<String>,
    /// The team that owns it.
    pub team_id: String,
}

const APP_COLUMNS: &str = "name, repo_url, branch, port, domains, build, strategy, instances, cpu, memory_bytes, health_path, \
     health_timeout_s, env_sealed, git_credentials_sealed, created_at, build_timeout_s, rollout, liveness, readiness, team_id";

fn app_from_row(row: &impl Cols) -> AppRow {
    AppRow {
        name: row.col("name"),
        repo_url: row.col("repo_url"),
        branch: row.col("branch"),
        port: row.col("port"),
        domains: row.col("domains"),
        build: row.col("build"),
        strategy: row.col("strategy"),
        instances: row.col("instances"),
        cpu: row.col("cpu"),
        memory_bytes: row.col("memory_bytes"),
        health_path: row.col("health_path"),
        health_timeout_s: row.col("health_timeout_s"),
        env_sealed: row.col("env_sealed"),
        git_credentials_sealed: row.col("git_credentials_sealed"),
        created_at: row.col("created_at"),
        build_timeout_s: row.col("build_timeout_s"),
        rollout: row.col("rollout"),
        liveness: row.col("liveness"),
        readiness: row.col("readiness"),
        team_id: row.col("team_id"),
    }
}

/// Why an app could not be created or changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AppRefusal {
    NameTaken,
    NotFound,
    /// `host` already belongs to app `owner`.
    HostTaken { host: String, owner: String },
}

fn domains_of(app: &AppRow) -> Vec<String> {
    serde_json::from_str(&app.domains).unwrap_or_default()
}


impl Store {
    /// Inserts an app and claims its hosts (`default_host` and its custom
    /// domains) in one transaction; nothing is written when the name or a
    /// host is taken.
    pub async fn insert_app(&self, app: &AppRow, default_host: &str) -> Result<Result<(), AppRefusal>, StoreError> {
        on_db!(self, pool => {
            let mut tx = pool.begin_write().await?;
            let result = sqlx::query(&format!(
                "INSERT INTO apps ({APP_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20) \
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
            .bind(&app.rollout)
            .bind(&app.liveness)
            .bind(&app.readiness)
            .bind(&app.team_id)
            .execute(&mut *tx)
            .await?;
            if result.rows_affected() != 1 {
                tx.rollback().await?;
                return Ok(Err(AppRefusal::NameTaken));
            }
            if let Err(taken) = tx.claim_host(&app.name, default_host, true).await? {
                tx.rollback().await?;
                return Ok(Err(taken));
            }
            for domain in domains_of(app) {
                if let Err(taken) = tx.claim_host(&app.name, &domain, false).await? {
                    tx.rollback().await?;
                    return Ok(Err(taken));
                }
            }
            tx.commit().await?;
            self.count_commit().await;
            Ok(Ok(()))
        })
    }

    pub async fn app(&self, name: &str) -> Result<Option<AppRow>, StoreError> {
        on_db!(self, pool => {
            let row = sqlx::query(&format!("SELECT {APP_COLUMNS} FROM apps WHERE name = $1")).bind(name).fetch_optional(pool).await?;
            Ok(row.as_ref().map(app_from_row))
        })
    }

    pub async fn apps(&self) -> Result<Vec<AppRow>, StoreError> {
        on_db!(self, pool => {
            let rows = sqlx::query(&format!("SELECT {APP_COLUMNS} FROM apps ORDER BY name")).fetch_all(pool).await?;
            Ok(rows.iter().map(app_from_row).collect())
        })
    }

    /// Writes what `PATCH /api/apps/{name}` may change: the branch and the
    /// build and run settings (not the name, repository, domains, secrets).
    pub async fn update_app_settings(&self, app: &AppRow) -> Result<bool, StoreError> {
        on_db!(self, pool => {
            let result = sqlx::query(
                "UPDATE apps SET branch = $1, port = $2, build = $3, strategy = $4, instances = $5, cpu = $6, memory_bytes = $7, \
             health_path = $8, health_timeout_s = $9, build_timeout_s = $10, rollout = $11, liveness = $12, readiness = $13 WHERE name = $14",
            )
            .bind(&app.branch)
            .bind(app.port)
            .bind(&app.build)
            .bind(&app.strategy)
            .bind(app.instances)
            .bind(app.cpu)
            .bind(app.memory_bytes)
            .bind(&app.health_path)
            .bind(app.health_timeout_s)
            .bind(app.build_timeout_s)
            .bind(&app.rollout)
            .bind(&app.liveness)
            .bind(&app.readiness)
            .bind(&app.name)
            .execute(pool)
            .await?;
            self.count_commit().await;
            Ok(result.rows_affected() == 1)
        })
    }

    /// The app's instance count alone (a scale), so that it races no
    /// other setting.
    pub async fn set_app_instances(&self, name: &str, instances: i64) -> Result<bool, StoreError> {
        on_db!(self, pool => {
            let result = sqlx::query("UPDATE apps SET instances = $1 WHERE name = $2").bind(instances).bind(name).execute(pool).await?;
            self.count_commit().await;
            Ok(result.rows_affected() == 1)
        })
    }

    pub async fn set_app_env(&self, name: &str, env_sealed: &str) -> Result<bool, StoreError> {
        on_db!(self, pool => {
            let result = sqlx::query("UPDATE apps SET env_sealed = $1 WHERE name = $2").bind(env_sealed).bind(name).execute(pool).await?;
            self.count_commit().await;
            Ok(result.rows_affected() == 1)
        })
    }

    /// Replaces an app's custom domains and their claims in one
    /// transaction. Returns `Ok(Err(HostTaken))` (and changes nothing) when
    /// another app holds one of them, and `Ok(Err(NotFound))` for no app.
    pub async fn set_app_domains(&self, name: &str, domains: &[String]) -> Result<Result<(), AppRefusal>, StoreError> {
        on_db!(self, pool => {
            let mut tx = pool.begin_write().await?;
            let json = serde_json::to_string(domains).expect("strings serialize");
            let result = sqlx::query("UPDATE apps SET domains = $1 WHERE name = $2").bind(&json).bind(name).execute(&mut *tx).await?;
            if result.rows_affected() != 1 {
                tx.rollback().await?;
                return Ok(Err(AppRefusal::NotFound));
            }
            sqlx::query("DELETE FROM app_hosts WHERE app = $1 AND is_default = FALSE").bind(name).execute(&mut *tx).await?;
            for domain in domains {
                if let Err(taken) = tx.claim_host(name, domain, false).await? {
                    tx.rollback().await?;
                    return Ok(Err(taken));
                }
            }
            tx.commit().await?;
            self.count_commit().await;
            Ok(Ok(()))
        })
    }

    /// Makes the default-host claims match `<app>.<base_domain>` (the base
    /// domain may have changed since the last start). A default host that
    /// another app already holds as a custom domain stays with that app;
    /// the names of the apps that lost their default host are returned.
    pub async fn sync_default_hosts(&self, base_domain: &str) -> Result<Vec<String>, StoreError> {
        on_db!(self, pool => {
            let mut tx = pool.begin_write().await?;
            sqlx::query("DELETE FROM app_hosts WHERE is_default = TRUE").execute(&mut *tx).await?;
            let names: Vec<String> = sqlx::query("SELECT name FROM apps ORDER BY created_at, name")
                .fetch_all(&mut *tx)
                .await?
                .iter()
                .map(|r| r.get("name"))
                .collect();
            let mut lost = Vec::new();
            for name in names {
                let host = format!("{name}.{base_domain}");
                if tx.claim_host(&name, &host, true).await?.is_err() {
                    lost.push(name);
                }
            }
            tx.commit().await?;
            self.count_commit().await;
            Ok(lost)
        })
    }

    /// The app that holds a host, if any.
    pub async fn host_owner(&self, host: &str) -> Result<Option<String>, StoreError> {
        on_db!(self, pool => {
            let row = sqlx::query("SELECT app FROM app_hosts WHERE host = $1").bind(host).fetch_optional(pool).await?;
            Ok(row.map(|r| r.get("app")))
        })
    }

    /// Deletes an app with its deployments, instance records, reports and
    /// log lines (an app's output may hold its secrets: nothing of it stays).
    /// Its volumes are detached, never deleted.
    pub async fn delete_app(&self, name: &str) -> Result<bool, StoreError> {
        on_db!(self, pool => {
            let mut tx = pool.begin_write().await?;
            for table in ["deployment_logs", "deployment_reports", "deployment_events"] {
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
            // Its scheduled jobs and the history of its runs, output included.
            sqlx::query("DELETE FROM task_run_lines WHERE run_id IN (SELECT id FROM task_runs WHERE app = $1)").bind(name).execute(&mut *tx).await?;
            sqlx::query("DELETE FROM task_runs WHERE app = $1").bind(name).execute(&mut *tx).await?;
            sqlx::query("DELETE FROM cron_jobs WHERE app = $1").bind(name).execute(&mut *tx).await?;
            // The record of its exec and port-forward sessions.
            sqlx::query("DELETE FROM exec_sessions WHERE subject = 'app' AND name = $1").bind(name).execute(&mut *tx).await?;
            sqlx::query("DELETE FROM autoscale_decisions WHERE app = $1").bind(name).execute(&mut *tx).await?;
            sqlx::query("DELETE FROM app_hosts WHERE app = $1").bind(name).execute(&mut *tx).await?;
            // Its previews' records (the preview apps are apps of their
            // own, removed before), or its own record as a preview.
            sqlx::query("DELETE FROM previews WHERE app = $1 OR preview_app = $1").bind(name).execute(&mut *tx).await?;
            sqlx::query("DELETE FROM preview_settings WHERE app = $1").bind(name).execute(&mut *tx).await?;
            sqlx::query("DELETE FROM env_production_only WHERE app = $1").bind(name).execute(&mut *tx).await?;
            // Its links go (the services stay); its volumes stay, detached:
            // data goes only on an explicit delete.
            sqlx::query("DELETE FROM service_links WHERE app = $1").bind(name).execute(&mut *tx).await?;
            sqlx::query("UPDATE volumes SET app = NULL, mount_path = NULL WHERE app = $1").bind(name).execute(&mut *tx).await?;
            let deleted = sqlx::query("DELETE FROM apps WHERE name = $1").bind(name).execute(&mut *tx).await?;
            tx.commit().await?;
            self.count_commit().await;
            Ok(deleted.rows_affected() == 1)
        })
    }
}

/// What this module writes inside a caller's write transaction, once per
/// engine (see [`crate::backend::for_both_engines`]).
pub(crate) trait AppsTx {
    /// Claims `host` for `app` unless another app holds it. A host the same app
    /// already holds (its default host listed again as a domain) is no conflict.
    async fn claim_host(&mut self, app: &str, host: &str, is_default: bool) -> Result<Result<(), AppRefusal>, StoreError>;
}

crate::backend::for_both_engines! {
    impl AppsTx for sqlx::Transaction<'_, DB> {
        async fn claim_host(&mut self, app: &str, host: &str, is_default: bool) -> Result<Result<(), AppRefusal>, StoreError> {
            let tx = self;
            let host = host.to_ascii_lowercase();
            let inserted = sqlx::query("INSERT INTO app_hosts (host, app, is_default) VALUES ($1, $2, $3) ON CONFLICT (host) DO NOTHING")
                .bind(&host)
                .bind(app)
                .bind(is_default)
                .execute(&mut **tx)
                .await?;
            if inserted.rows_affected() == 1 {
                return Ok(Ok(()));
            }
            let owner: String = sqlx::query("SELECT app FROM app_hosts WHERE host = $1").bind(&host).fetch_one(&mut **tx).await?.get("app");
            if owner == app {
                Ok(Ok(()))
            } else {
                Ok(Err(AppRefusal::HostTaken { host, owner }))
            }
        }
    }
}
