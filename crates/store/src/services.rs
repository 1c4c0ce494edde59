//! Managed services and the apps linked to them. A service's credentials
//! arrive sealed; its data is a volume row marked with the service, made
//! in the same transaction as the service and kept when it is deleted
//! unless the caller deletes the volume by name afterwards.

use crate::backend::Cols;
use sqlx::Row;

use super::commands::CommandsTx;
use super::{NewCommand, Store, StoreError};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceRow {
    pub name: String,
    /// `postgres`, `redis` or `mariadb`.
    pub kind: String,
    pub version: Option<String>,
    pub image: String,
    pub node_id: String,
    pub host_port: i64,
    pub memory_bytes: Option<i64>,
    /// The volume holding its data.
    pub volume: String,
    /// The sealed credentials.
    pub secret_sealed: String,
    pub generation: i64,
    pub created_at: i64,
    /// While a password rotation is unfinished: the credentials before it
    /// (sealed), which the database may still be the only one to accept.
    pub previous_secret_sealed: Option<String>,
    pub rotation_started_at: Option<i64>,
    /// The team that owns it.
    pub team_id: String,
}

/// The columns a new service is inserted with.
const INSERT_COLUMNS: &str = "name, kind, version, image, node_id, host_port, memory_bytes, volume, secret_sealed, generation, created_at, team_id";
const SERVICE_COLUMNS: &str =
    "name, kind, version, image, node_id, host_port, memory_bytes, volume, secret_sealed, generation, created_at, previous_secret_sealed, rotation_started_at, team_id";

/// What a change of a service sets (a rotated password, another version).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceChange {
    pub version: Option<String>,
    pub image: String,
    pub secret_sealed: String,
    pub previous_secret_sealed: Option<String>,
    pub rotation_started_at: Option<i64>,
}

fn service_from_row(row: &impl Cols) -> ServiceRow {
    ServiceRow {
        name: row.col("name"),
        kind: row.col("kind"),
        version: row.col("version"),
        image: row.col("image"),
        node_id: row.col("node_id"),
        host_port: row.col("host_port"),
        memory_bytes: row.col("memory_bytes"),
        volume: row.col("volume"),
        secret_sealed: row.col("secret_sealed"),
        generation: row.col("generation"),
        created_at: row.col("created_at"),
        previous_secret_sealed: row.col("previous_secret_sealed"),
        rotation_started_at: row.col("rotation_started_at"),
        team_id: row.col("team_id"),
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceLinkRow {
    pub service: String,
    pub app: String,
    pub variable: String,
    pub created_at: i64,
}

fn link_from_row(row: &impl Cols) -> ServiceLinkRow {
    ServiceLinkRow { service: row.col("service"), app: row.col("app"), variable: row.col("variable"), created_at: row.col("created_at") }
}

/// Why a service could not be created.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServiceRefusal {
    NameTaken,
    /// A volume of that name exists already.
    VolumeTaken,
    /// Every port of the service range is taken on that node.
    NoPort,
}

/// Why a link could not be made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LinkRefusal {
    NoSuchService,
    NoSuchApp,
    /// The app has this variable from another service already.
    VariableTaken(String),
}

impl Store {
    pub async fn services(&self) -> Result<Vec<ServiceRow>, StoreError> {
        on_db!(self, pool => {
            let rows = sqlx::query(&format!("SELECT {SERVICE_COLUMNS} FROM services ORDER BY name")).fetch_all(pool).await?;
            Ok(rows.iter().map(service_from_row).collect())
        })
    }

    pub async fn service(&self, name: &str) -> Result<Option<ServiceRow>, StoreError> {
        on_db!(self, pool => {
            let row = sqlx::query(&format!("SELECT {SERVICE_COLUMNS} FROM services WHERE name = $1")).bind(name).fetch_optional(pool).await?;
            Ok(row.as_ref().map(service_from_row))
        })
    }

    /// Creates the service, its data volume (on the same node) and the
    /// node's `service_run` command in one transaction. The host port is
    /// the node's lowest free one in the service range; `command` gets it.
    pub async fn insert_service(
        &self,
        service: &ServiceRow,
        ports: std::ops::RangeInclusive<u16>,
        command: impl FnOnce(i64) -> NewCommand,
        now_ms: i64,
    ) -> Result<Result<ServiceRow, ServiceRefusal>, StoreError> {
        on_db!(self, pool => {
            let mut tx = pool.begin_write().await?;
            if sqlx::query("SELECT 1 FROM services WHERE name = $1").bind(&service.name).fetch_optional(&mut *tx).await?.is_some() {
                tx.rollback().await?;
                return Ok(Err(ServiceRefusal::NameTaken));
            }
            if sqlx::query("SELECT 1 FROM volumes WHERE name = $1").bind(&service.volume).fetch_optional(&mut *tx).await?.is_some() {
                tx.rollback().await?;
                return Ok(Err(ServiceRefusal::VolumeTaken));
            }
            let used: Vec<i64> = sqlx::query("SELECT host_port FROM services WHERE node_id = $1 ORDER BY host_port")
                .bind(&service.node_id)
                .fetch_all(&mut *tx)
                .await?
                .iter()
                .map(|r| r.get("host_port"))
                .collect();
            let Some(port) = ports.map(i64::from).find(|p| !used.contains(p)) else {
                tx.rollback().await?;
                return Ok(Err(ServiceRefusal::NoPort));
            };
            let row = sqlx::query(&format!(
                "INSERT INTO services ({INSERT_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12) RETURNING {SERVICE_COLUMNS}"
            ))
            .bind(&service.name)
            .bind(&service.kind)
            .bind(&service.version)
            .bind(&service.image)
            .bind(&service.node_id)
            .bind(port)
            .bind(service.memory_bytes)
            .bind(&service.volume)
            .bind(&service.secret_sealed)
            .bind(service.generation)
            .bind(service.created_at)
            .bind(&service.team_id)
            .fetch_one(&mut *tx)
            .await?;
            sqlx::query("INSERT INTO volumes (name, node_id, service, created_at, team_id) VALUES ($1, $2, $3, $4, $5)")
                .bind(&service.volume)
                .bind(&service.node_id)
                .bind(&service.name)
                .bind(now_ms)
                .bind(&service.team_id)
                .execute(&mut *tx)
                .await?;
            tx.insert_command(&command(port), now_ms).await?;
            tx.commit().await?;
            self.count_commit().await;
            Ok(Ok(service_from_row(&row)))
        })
    }

    /// Deletes the service and its links, queues the node's
    /// `service_remove`, and leaves its volume detached (with its data).
    /// Returns the deleted row; `Err(id)` (nothing deleted) when an
    /// unfinished major version upgrade goes from or into it.
    pub async fn delete_service(
        &self,
        name: &str,
        command: impl FnOnce(&ServiceRow) -> NewCommand,
        now_ms: i64,
    ) -> Result<Option<Result<ServiceRow, String>>, StoreError> {
        on_db!(self, pool => {
            let mut tx = pool.begin_write().await?;
            let Some(service) = sqlx::query(&format!("SELECT {SERVICE_COLUMNS} FROM services WHERE name = $1"))
                .bind(name)
                .fetch_optional(&mut *tx)
                .await?
                .as_ref()
                .map(service_from_row)
            else {
                tx.rollback().await?;
                return Ok(None);
            };
            let upgrading: Option<String> = sqlx::query(
                "SELECT id FROM service_upgrades WHERE (service = $1 OR to_service = $1) AND state IN ('backing_up', 'restoring', 'switching') LIMIT 1",
            )
            .bind(name)
            .fetch_optional(&mut *tx)
            .await?
            .map(|r| r.get("id"));
            if let Some(upgrade) = upgrading {
                tx.rollback().await?;
                return Ok(Some(Err(upgrade)));
            }
            sqlx::query("DELETE FROM service_links WHERE service = $1").bind(name).execute(&mut *tx).await?;
            // The record of its exec and port-forward sessions.
            sqlx::query("DELETE FROM exec_sessions WHERE subject = 'service' AND name = $1").bind(name).execute(&mut *tx).await?;
            sqlx::query("DELETE FROM services WHERE name = $1").bind(name).execute(&mut *tx).await?;
            sqlx::query("UPDATE volumes SET service = NULL WHERE name = $1").bind(&service.volume).execute(&mut *tx).await?;
            tx.insert_command(&command(&service), now_ms).await?;
            tx.commit().await?;
            self.count_commit().await;
            Ok(Some(Ok(service)))
        })
    }

    /// Changes a service still at `generation` to the next one and queues
    /// its node's `service_run` (made from the changed row) in the same
    /// transaction. None when it is gone or changed meanwhile.
    pub async fn change_service(
        &self,
        name: &str,
        generation: i64,
        change: &ServiceChange,
        command: impl FnOnce(&ServiceRow) -> NewCommand,
        now_ms: i64,
    ) -> Result<Option<ServiceRow>, StoreError> {
        on_db!(self, pool => {
            let mut tx = pool.begin_write().await?;
            let row = sqlx::query(&format!(
                "UPDATE services SET version = $3, image = $4, secret_sealed = $5, previous_secret_sealed = $6, rotation_started_at = $7, \
             generation = generation + 1 WHERE name = $1 AND generation = $2 RETURNING {SERVICE_COLUMNS}"
            ))
            .bind(name)
            .bind(generation)
            .bind(&change.version)
            .bind(&change.image)
            .bind(&change.secret_sealed)
            .bind(&change.previous_secret_sealed)
            .bind(change.rotation_started_at)
            .fetch_optional(&mut *tx)
            .await?;
            let Some(service) = row.as_ref().map(service_from_row) else {
                tx.rollback().await?;
                return Ok(None);
            };
            tx.insert_command(&command(&service), now_ms).await?;
            tx.commit().await?;
            self.count_commit().await;
            Ok(Some(service))
        })
    }

    /// The services whose password rotation is unfinished.
    pub async fn rotating_services(&self) -> Result<Vec<ServiceRow>, StoreError> {
        on_db!(self, pool => {
            let rows = sqlx::query(&format!("SELECT {SERVICE_COLUMNS} FROM services WHERE previous_secret_sealed IS NOT NULL ORDER BY name"))
                .fetch_all(pool)
                .await?;
            Ok(rows.iter().map(service_from_row).collect())
        })
    }

    /// Ends a rotation once the node runs `generation` with the new
    /// password: the old one is forgotten. False when the service is gone
    /// or at another generation.
    pub async fn finish_rotation(&self, name: &str, generation: i64) -> Result<bool, StoreError> {
        on_db!(self, pool => {
            let result = sqlx::query(
                "UPDATE services SET previous_secret_sealed = NULL, rotation_started_at = NULL \
             WHERE name = $1 AND generation = $2 AND previous_secret_sealed IS NOT NULL",
            )
            .bind(name)
            .bind(generation)
            .execute(pool)
            .await?;
            self.count_commit().await;
            Ok(result.rows_affected() == 1)
        })
    }

    pub async fn service_links(&self, service: &str) -> Result<Vec<ServiceLinkRow>, StoreError> {
        on_db!(self, pool => {
            let rows = sqlx::query("SELECT service, app, variable, created_at FROM service_links WHERE service = $1 ORDER BY app")
                .bind(service)
                .fetch_all(pool)
                .await?;
            Ok(rows.iter().map(link_from_row).collect())
        })
    }

    pub async fn app_links(&self, app: &str) -> Result<Vec<ServiceLinkRow>, StoreError> {
        on_db!(self, pool => {
            let rows = sqlx::query("SELECT service, app, variable, created_at FROM service_links WHERE app = $1 ORDER BY variable")
                .bind(app)
                .fetch_all(pool)
                .await?;
            Ok(rows.iter().map(link_from_row).collect())
        })
    }

    /// Links (or relinks under another variable) an app to a service.
    pub async fn link_service(&self, service: &str, app: &str, variable: &str, now_ms: i64) -> Result<Result<ServiceLinkRow, LinkRefusal>, StoreError> {
        on_db!(self, pool => {
            let mut tx = pool.begin_write().await?;
            if sqlx::query("SELECT 1 FROM services WHERE name = $1").bind(service).fetch_optional(&mut *tx).await?.is_none() {
                tx.rollback().await?;
                return Ok(Err(LinkRefusal::NoSuchService));
            }
            if sqlx::query("SELECT 1 FROM apps WHERE name = $1").bind(app).fetch_optional(&mut *tx).await?.is_none() {
                tx.rollback().await?;
                return Ok(Err(LinkRefusal::NoSuchApp));
            }
            let holder: Option<String> = sqlx::query("SELECT service FROM service_links WHERE app = $1 AND variable = $2 AND service <> $3")
                .bind(app)
                .bind(variable)
                .bind(service)
                .fetch_optional(&mut *tx)
                .await?
                .map(|r| r.get("service"));
            if let Some(holder) = holder {
                tx.rollback().await?;
                return Ok(Err(LinkRefusal::VariableTaken(holder)));
            }
            let row = sqlx::query(
                "INSERT INTO service_links (service, app, variable, created_at) VALUES ($1, $2, $3, $4) \
             ON CONFLICT (service, app) DO UPDATE SET variable = excluded.variable RETURNING service, app, variable, created_at",
            )
            .bind(service)
            .bind(app)
            .bind(variable)
            .bind(now_ms)
            .fetch_one(&mut *tx)
            .await?;
            tx.commit().await?;
            self.count_commit().await;
            Ok(Ok(link_from_row(&row)))
        })
    }

    pub async fn unlink_service(&self, service: &str, app: &str) -> Result<bool, StoreError> {
        on_db!(self, pool => {
            let result = sqlx::query("DELETE FROM service_links WHERE service = $1 AND app = $2").bind(service).bind(app).execute(pool).await?;
            self.count_commit().await;
            Ok(result.rows_affected() == 1)
        })
    }
}
