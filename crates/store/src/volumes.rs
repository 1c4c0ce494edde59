//! Persistent volumes: which app mounts them where, and the node that holds
//! their data. Nothing here deletes a volume's row unless asked to by name
//! (`delete_volume`): deleting an app only detaches its volumes.

use crate::backend::Cols;

use super::commands::CommandsTx;
use super::{NewCommand, Store, StoreError};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeRow {
    pub name: String,
    /// `None` while detached.
    pub app: Option<String>,
    pub mount_path: Option<String>,
    /// The node that holds the data; `None` until the first placement.
    pub node_id: Option<String>,
    pub size_bytes: Option<i64>,
    pub size_at: Option<i64>,
    pub created_at: i64,
    /// The managed service whose data this is (then `app` is `None`).
    pub service: Option<String>,
}

const VOLUME_COLUMNS: &str = "name, app, mount_path, node_id, size_bytes, size_at, created_at, service";

fn volume_from_row(row: &impl Cols) -> VolumeRow {
    VolumeRow {
        name: row.col("name"),
        app: row.col("app"),
        mount_path: row.col("mount_path"),
        node_id: row.col("node_id"),
        size_bytes: row.col("size_bytes"),
        size_at: row.col("size_at"),
        created_at: row.col("created_at"),
        service: row.col("service"),
    }
}

/// Why a volume could not be attached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AttachRefusal {
    NoSuchApp,
    /// The volume is attached to this app already.
    AttachedTo(String),
    /// Another volume of the app is mounted at that path.
    PathTaken(String),
    /// The volume's data is on one node and the app's other volumes on
    /// another: (this volume's node, the other volume, its node).
    OtherNode(String, String, String),
    /// The app has as many volumes as it may.
    TooMany,
    /// It holds this managed service's data.
    Service(String),
}

/// What `attach_volume` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attached {
    /// A new, empty volume.
    Created(VolumeRow),
    /// A detached volume with its data.
    Reattached(VolumeRow),
}

/// Most volumes one app may mount.
pub const MAX_VOLUMES_PER_APP: i64 = 16;

/// What `delete_volume` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VolumeDeletion {
    /// Gone from the store; the node's delete command (if it had a node)
    /// is queued.
    Deleted(VolumeRow),
    NotFound,
    /// Still attached to this app: detach it first.
    Attached(String),
    /// The data of this managed service: delete the service first.
    Service(String),
}

impl Store {
    pub async fn volumes(&self) -> Result<Vec<VolumeRow>, StoreError> {
        on_db!(self, pool => {
            let rows = sqlx::query(&format!("SELECT {VOLUME_COLUMNS} FROM volumes ORDER BY name")).fetch_all(pool).await?;
            Ok(rows.iter().map(volume_from_row).collect())
        })
    }

    pub async fn volume(&self, name: &str) -> Result<Option<VolumeRow>, StoreError> {
        on_db!(self, pool => {
            let row = sqlx::query(&format!("SELECT {VOLUME_COLUMNS} FROM volumes WHERE name = $1")).bind(name).fetch_optional(pool).await?;
            Ok(row.as_ref().map(volume_from_row))
        })
    }

    /// The volumes an app mounts, by mount path.
    pub async fn app_volumes(&self, app: &str) -> Result<Vec<VolumeRow>, StoreError> {
        on_db!(self, pool => {
            let rows = sqlx::query(&format!("SELECT {VOLUME_COLUMNS} FROM volumes WHERE app = $1 ORDER BY mount_path"))
                .bind(app)
                .fetch_all(pool)
                .await?;
            Ok(rows.iter().map(volume_from_row).collect())
        })
    }

    /// The volumes whose data is on a node.
    pub async fn node_volumes(&self, node_id: &str) -> Result<Vec<VolumeRow>, StoreError> {
        on_db!(self, pool => {
            let rows = sqlx::query(&format!("SELECT {VOLUME_COLUMNS} FROM volumes WHERE node_id = $1 ORDER BY name"))
                .bind(node_id)
                .fetch_all(pool)
                .await?;
            Ok(rows.iter().map(volume_from_row).collect())
        })
    }

    /// Mounts volume `name` at `path` in `app`: a new volume when the name
    /// is free, or a detached one (with its data, on its node). Checked and
    /// written in one transaction.
    pub async fn attach_volume(&self, name: &str, app: &str, path: &str, now_ms: i64) -> Result<Result<Attached, AttachRefusal>, StoreError> {
        on_db!(self, pool => {
            let mut tx = pool.begin_write().await?;
            let refuse = |refusal| Ok(Err(refusal));
            if sqlx::query("SELECT 1 FROM apps WHERE name = $1").bind(app).fetch_optional(&mut *tx).await?.is_none() {
                tx.rollback().await?;
                return refuse(AttachRefusal::NoSuchApp);
            }
            let existing = sqlx::query(&format!("SELECT {VOLUME_COLUMNS} FROM volumes WHERE name = $1"))
                .bind(name)
                .fetch_optional(&mut *tx)
                .await?
                .as_ref()
                .map(volume_from_row);
            if let Some(owner) = existing.as_ref().and_then(|v| v.app.clone()) {
                tx.rollback().await?;
                return refuse(AttachRefusal::AttachedTo(owner));
            }
            if let Some(service) = existing.as_ref().and_then(|v| v.service.clone()) {
                tx.rollback().await?;
                return refuse(AttachRefusal::Service(service));
            }
            let mounted: Vec<VolumeRow> = sqlx::query(&format!("SELECT {VOLUME_COLUMNS} FROM volumes WHERE app = $1"))
                .bind(app)
                .fetch_all(&mut *tx)
                .await?
                .iter()
                .map(volume_from_row)
                .collect();
            if let Some(other) = mounted.iter().find(|v| v.mount_path.as_deref() == Some(path)) {
                tx.rollback().await?;
                return refuse(AttachRefusal::PathTaken(other.name.clone()));
            }
            if mounted.len() as i64 >= MAX_VOLUMES_PER_APP {
                tx.rollback().await?;
                return refuse(AttachRefusal::TooMany);
            }
            if let Some(node) = existing.as_ref().and_then(|v| v.node_id.clone()) {
                if let Some(other) = mounted.iter().find(|v| v.node_id.as_ref().is_some_and(|n| *n != node)) {
                    tx.rollback().await?;
                    return refuse(AttachRefusal::OtherNode(node, other.name.clone(), other.node_id.clone().unwrap_or_default()));
                }
            }
            let attached = match existing {
                Some(_) => {
                    let row = sqlx::query(&format!("UPDATE volumes SET app = $1, mount_path = $2 WHERE name = $3 RETURNING {VOLUME_COLUMNS}"))
                        .bind(app)
                        .bind(path)
                        .bind(name)
                        .fetch_one(&mut *tx)
                        .await?;
                    Attached::Reattached(volume_from_row(&row))
                }
                None => {
                    // A new volume of an app that runs already goes to the
                    // node its other volumes are on, if any; otherwise it is
                    // pinned at the next placement.
                    let node = mounted.iter().find_map(|v| v.node_id.clone());
                    let row = sqlx::query(&format!(
                        "INSERT INTO volumes (name, app, mount_path, node_id, created_at, team_id) \
                         VALUES ($1, $2, $3, $4, $5, COALESCE((SELECT team_id FROM apps WHERE name = $2), 'team_default')) RETURNING {VOLUME_COLUMNS}"
                    ))
                    .bind(name)
                    .bind(app)
                    .bind(path)
                    .bind(node)
                    .bind(now_ms)
                    .fetch_one(&mut *tx)
                    .await?;
                    Attached::Created(volume_from_row(&row))
                }
            };
            tx.commit().await?;
            self.count_commit().await;
            Ok(Ok(attached))
        })
    }

    /// Detaches a volume from its app; the data stays where it is. False
    /// when the app does not mount it.
    pub async fn detach_volume(&self, app: &str, name: &str) -> Result<bool, StoreError> {
        on_db!(self, pool => {
            let result = sqlx::query("UPDATE volumes SET app = NULL, mount_path = NULL WHERE name = $1 AND app = $2")
                .bind(name)
                .bind(app)
                .execute(pool)
                .await?;
            self.count_commit().await;
            Ok(result.rows_affected() == 1)
        })
    }

    /// Gives the app's volumes that have no node yet this one (its first
    /// placement) and returns all of the app's volumes afterwards.
    pub async fn pin_volumes(&self, app: &str, node_id: &str) -> Result<Vec<VolumeRow>, StoreError> {
        on_db!(self, pool => {
            let result = sqlx::query("UPDATE volumes SET node_id = $1 WHERE app = $2 AND node_id IS NULL")
                .bind(node_id)
                .bind(app)
                .execute(pool)
                .await?;
            if result.rows_affected() > 0 {
                self.count_commit().await;
            }
            self.app_volumes(app).await
        })
    }

    /// Deletes a detached volume and, when it has a node, queues the
    /// node's command that removes its data, in one transaction.
    pub async fn delete_volume(&self, name: &str, command: impl FnOnce(&VolumeRow) -> Option<NewCommand>, now_ms: i64) -> Result<VolumeDeletion, StoreError> {
        on_db!(self, pool => {
            let mut tx = pool.begin_write().await?;
            let Some(volume) = sqlx::query(&format!("SELECT {VOLUME_COLUMNS} FROM volumes WHERE name = $1"))
                .bind(name)
                .fetch_optional(&mut *tx)
                .await?
                .as_ref()
                .map(volume_from_row)
            else {
                tx.rollback().await?;
                return Ok(VolumeDeletion::NotFound);
            };
            if let Some(app) = &volume.app {
                tx.rollback().await?;
                return Ok(VolumeDeletion::Attached(app.clone()));
            }
            if let Some(service) = &volume.service {
                tx.rollback().await?;
                return Ok(VolumeDeletion::Service(service.clone()));
            }
            sqlx::query("DELETE FROM volumes WHERE name = $1").bind(name).execute(&mut *tx).await?;
            if let Some(command) = command(&volume) {
                tx.insert_command(&command, now_ms).await?;
            }
            tx.commit().await?;
            self.count_commit().await;
            Ok(VolumeDeletion::Deleted(volume))
        })
    }

    /// Records the sizes a node reported for the volumes it holds (only
    /// for volumes that are on that node).
    pub async fn set_volume_sizes(&self, node_id: &str, sizes: &[(String, u64)], now_ms: i64) -> Result<(), StoreError> {
        on_db!(self, pool => {
            if sizes.is_empty() {
                return Ok(());
            }
            let mut tx = pool.begin_write().await?;
            for (name, bytes) in sizes {
                sqlx::query("UPDATE volumes SET size_bytes = $1, size_at = $2 WHERE name = $3 AND node_id = $4")
                    .bind(i64::try_from(*bytes).unwrap_or(i64::MAX))
                    .bind(now_ms)
                    .bind(name)
                    .bind(node_id)
                    .execute(&mut *tx)
                    .await?;
            }
            tx.commit().await?;
            self.count_commit().await;
            Ok(())
        })
    }
}
