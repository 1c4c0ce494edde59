//! The reads behind the ingress route table: only the columns it needs,
//! for every app at once (the safety-net pass) or for one app (an
//! incremental change).

use sqlx::Row;

use super::{Store, StoreError};

impl Store {
    /// Every app's name and custom domains (JSON array), by name.
    pub async fn app_domains_all(&self) -> Result<Vec<(String, String)>, StoreError> {
        on_db!(self, pool => {
            let rows = sqlx::query("SELECT name, domains FROM apps ORDER BY name").fetch_all(pool).await?;
            Ok(rows.iter().map(|r| (r.get("name"), r.get("domains"))).collect())
        })
    }

    /// One app's custom domains (JSON array); `None` when there is no such app.
    pub async fn app_domains(&self, name: &str) -> Result<Option<String>, StoreError> {
        on_db!(self, pool => {
            let row = sqlx::query("SELECT domains FROM apps WHERE name = $1").bind(name).fetch_optional(pool).await?;
            Ok(row.map(|r| r.get("domains")))
        })
    }

    /// Addresses of one app's running instances.
    pub async fn running_addresses_of(&self, app: &str) -> Result<Vec<String>, StoreError> {
        on_db!(self, pool => {
            let rows = sqlx::query(
                "SELECT i.address AS address FROM instances i JOIN deployments d ON d.id = i.deployment_id \
             WHERE d.app = $1 AND i.state = 'running' AND i.address IS NOT NULL",
            )
            .bind(app)
            .fetch_all(pool)
            .await?;
            Ok(rows.iter().map(|r| r.get("address")).collect())
        })
    }
}
