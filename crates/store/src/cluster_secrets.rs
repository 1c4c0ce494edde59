//! `cluster_secrets`: what every control-plane replica of one database
//! must share (the CA, the listener key, a master-key check), sealed by the
//! caller. A row is written once, by whichever replica comes first, and is
//! never replaced: the first writer's copy is the cluster's.

use crate::backend::Cols;
use super::{Store, StoreError};

impl Store {
    /// Every stored secret, `(name, sealed)`, by name.
    pub async fn cluster_secrets(&self) -> Result<Vec<(String, String)>, StoreError> {
        on_db!(self, pool => {
            let rows = sqlx::query("SELECT name, sealed FROM cluster_secrets ORDER BY name").fetch_all(pool).await?;
            Ok(rows.iter().map(|row| (row.col::<String>("name"), row.col::<String>("sealed"))).collect())
        })
    }

    /// Stores each `(name, sealed)` that has no row yet, in one
    /// transaction, and returns what the table holds afterwards for those
    /// names: where another replica stored a name first, its copy, not
    /// the caller's.
    pub async fn claim_cluster_secrets(&self, secrets: &[(String, String)], now_ms: i64) -> Result<Vec<(String, String)>, StoreError> {
        on_db!(self, pool => {
            let mut tx = pool.begin_write().await?;
            let mut held = Vec::with_capacity(secrets.len());
            for (name, sealed) in secrets {
                sqlx::query("INSERT INTO cluster_secrets (name, sealed, created_at) VALUES ($1, $2, $3) ON CONFLICT (name) DO NOTHING")
                    .bind(name)
                    .bind(sealed)
                    .bind(now_ms)
                    .execute(&mut *tx)
                    .await?;
                let row = sqlx::query("SELECT sealed FROM cluster_secrets WHERE name = $1").bind(name).fetch_one(&mut *tx).await?;
                held.push((name.clone(), row.col::<String>("sealed")));
            }
            tx.commit().await?;
            self.count_commit().await;
            Ok(held)
        })
    }
}

#[cfg(test)]
mod tests {
    crate::test_engines::both_engines! {
        async fn the_first_copy_of_a_secret_is_kept(store) {
            assert!(store.cluster_secrets().await.unwrap().is_empty());
            let first = vec![("ca.key".to_string(), "sealed-a".to_string())];
            assert_eq!(store.claim_cluster_secrets(&first, 1).await.unwrap(), first);
            // A second replica's own copy loses to the stored one.
            let second = vec![("ca.key".to_string(), "sealed-b".to_string()), ("listener.key".to_string(), "sealed-c".to_string())];
            let held = store.claim_cluster_secrets(&second, 2).await.unwrap();
            assert_eq!(held, vec![("ca.key".to_string(), "sealed-a".to_string()), ("listener.key".to_string(), "sealed-c".to_string())]);
            assert_eq!(store.cluster_secrets().await.unwrap(), held);
        }
    }
}
