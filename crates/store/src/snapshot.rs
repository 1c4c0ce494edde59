//! Online snapshots of the state database, for the control plane's own
//! backups, and the full integrity check a restored copy must pass before
//! it becomes a control plane's state.

use std::path::Path;

use sqlx::Row;

use super::{Store, StoreError};
use crate::backend::Db;

impl Store {
    /// Writes a consistent copy of the whole database (what the WAL holds
    /// included) to `target`, which must not exist yet, while the control
    /// plane keeps running: `VACUUM INTO` reads one transaction's view, so
    /// writers go on and the copy is never torn.
    pub async fn snapshot_into(&self, target: &Path) -> Result<(), StoreError> {
        let Db::Sqlite(pool) = &self.db else {
            return Err(StoreError::Unsupported("an online copy of a PostgreSQL state (back it up with pg_dump, or your provider's snapshots)"));
        };
        {
            let target_text = target.display().to_string();
            sqlx::query("VACUUM INTO $1")
                .bind(&target_text)
                .execute(pool)
                .await
                .map_err(|source| StoreError::Backup { path: target_text.clone(), source })?;
            Ok(())
        }
    }

    /// `PRAGMA integrity_check`: every page, index and constraint. Slower
    /// than the `quick_check` run at every start, so it is kept for a
    /// database that comes from elsewhere (a restored backup).
    pub async fn integrity_check(&self) -> Result<(), StoreError> {
        let Db::Sqlite(pool) = &self.db else {
            // PostgreSQL checks its own pages (data checksums) and
            // constraints as it writes them.
            return Ok(());
        };
        {
            let rows = sqlx::query("PRAGMA integrity_check").fetch_all(pool).await.map_err(|err| match StoreError::Database(err) {
                err if err.is_corrupt() => StoreError::Damaged(cloudweb_protocol::misc::one_line(&err.to_string(), 300)),
                err => err,
            })?;
            let findings: Vec<String> = rows.iter().filter_map(|row| row.try_get::<String, _>(0).ok()).collect();
            match findings.first() {
                Some(first) if findings.len() == 1 && first == "ok" => Ok(()),
                Some(first) => Err(StoreError::Damaged(cloudweb_protocol::misc::one_line(first, 300))),
                None => Err(StoreError::Damaged("no result".into())),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_snapshot_holds_what_was_written_and_passes_the_integrity_check() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), "test").await.unwrap();
        store.insert_admin_token("digest-1", 1).await.unwrap();
        let copy_dir = dir.path().join("copy");
        std::fs::create_dir(&copy_dir).unwrap();
        store.snapshot_into(&copy_dir.join(crate::DATABASE_FILE)).await.unwrap();
        // A second snapshot to the same file is refused, never merged.
        assert!(store.snapshot_into(&copy_dir.join(crate::DATABASE_FILE)).await.is_err());
        let copy = Store::open(&copy_dir, "test").await.unwrap();
        copy.integrity_check().await.unwrap();
        assert_eq!(copy.admin_token_digests().await.unwrap(), vec!["digest-1".to_string()]);
    }
}
