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

    /// Upstream addresses of one app: its ready running instances, or every
    /// running one when none is ready (see [`Store::running_addresses`]).
    pub async fn running_addresses_of(&self, app: &str) -> Result<Vec<String>, StoreError> {
        on_db!(self, pool => {
            let rows = sqlx::query(
                "SELECT i.address AS address, i.unready_since AS unready_since FROM instances i JOIN deployments d ON d.id = i.deployment_id \
             WHERE d.app = $1 AND i.state = 'running' AND i.address IS NOT NULL",
            )
            .bind(app)
            .fetch_all(pool)
            .await?;
            let all = rows.iter().map(|r| (String::new(), r.get("address"), r.get::<Option<i64>, _>("unready_since").is_none())).collect();
            Ok(super::readiness::ready_or_all(all).into_iter().map(|(_, address)| address).collect())
        })
    }
}
