//! ACME accounts and the certificates issued for public hosts. Keys arrive
//! here already sealed; this module never sees them in the clear.

use std::collections::HashMap;

use sqlx::Row;

use super::{Store, StoreError};

/// One stored certificate; `key_sealed` is opened by the caller.
#[derive(Clone)]
pub struct CertificateRow {
    pub host: String,
    pub chain_pem: String,
    pub key_sealed: String,
    pub not_before_ms: i64,
    pub not_after_ms: i64,
    pub issued_at_ms: i64,
}

/// Orders placed for one host and its last failure, if any since the
/// last success.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CertificateOrders {
    pub orders: i64,
    pub last_error: Option<String>,
    pub last_error_at_ms: Option<i64>,
}

impl Store {
    pub async fn acme_account(&self, directory: &str) -> Result<Option<String>, StoreError> {
        on_db!(self, pool => {
            let row = sqlx::query("SELECT credentials_sealed FROM acme_accounts WHERE directory = $1")
                .bind(directory)
                .fetch_optional(pool)
                .await?;
            Ok(row.map(|r| r.get("credentials_sealed")))
        })
    }

    pub async fn save_acme_account(&self, directory: &str, credentials_sealed: &str, now_ms: i64) -> Result<(), StoreError> {
        self.upsert_column("acme_accounts", "directory", directory, "credentials_sealed", credentials_sealed, now_ms).await
    }

    pub async fn certificates(&self) -> Result<Vec<CertificateRow>, StoreError> {
        on_db!(self, pool => {
            let rows = sqlx::query("SELECT host, chain_pem, key_sealed, not_before, not_after, issued_at FROM certificates ORDER BY host")
                .fetch_all(pool)
                .await?;
            Ok(rows
                .iter()
                .map(|r| CertificateRow {
                    host: r.get("host"),
                    chain_pem: r.get("chain_pem"),
                    key_sealed: r.get("key_sealed"),
                    not_before_ms: r.get("not_before"),
                    not_after_ms: r.get("not_after"),
                    issued_at_ms: r.get("issued_at"),
                })
                .collect())
        })
    }

    /// Stores a host's certificate, replacing the one it renews.
    pub async fn save_certificate(&self, row: &CertificateRow) -> Result<(), StoreError> {
        on_db!(self, pool => {
            sqlx::query(
                "INSERT INTO certificates (host, chain_pem, key_sealed, not_before, not_after, issued_at) VALUES ($1, $2, $3, $4, $5, $6) \
             ON CONFLICT (host) DO UPDATE SET chain_pem = excluded.chain_pem, key_sealed = excluded.key_sealed, \
             not_before = excluded.not_before, not_after = excluded.not_after, issued_at = excluded.issued_at",
            )
            .bind(&row.host)
            .bind(&row.chain_pem)
            .bind(&row.key_sealed)
            .bind(row.not_before_ms)
            .bind(row.not_after_ms)
            .bind(row.issued_at_ms)
            .execute(pool)
            .await?;
            self.count_commit().await;
            Ok(())
        })
    }

    pub async fn delete_certificate(&self, host: &str) -> Result<(), StoreError> {
        on_db!(self, pool => {
            sqlx::query("DELETE FROM certificates WHERE host = $1").bind(host).execute(pool).await?;
            self.count_commit().await;
            Ok(())
        })
    }

    pub async fn certificate_orders(&self) -> Result<HashMap<String, CertificateOrders>, StoreError> {
        on_db!(self, pool => {
            let rows = sqlx::query("SELECT host, orders, last_error, last_error_at FROM certificate_orders").fetch_all(pool).await?;
            Ok(rows
                .iter()
                .map(|r| {
                    let orders = CertificateOrders { orders: r.get("orders"), last_error: r.get("last_error"), last_error_at_ms: r.get("last_error_at") };
                    (r.get("host"), orders)
                })
                .collect())
        })
    }

    /// Counts one more order placed for `host`.
    pub async fn count_certificate_order(&self, host: &str) -> Result<(), StoreError> {
        on_db!(self, pool => {
            sqlx::query("INSERT INTO certificate_orders (host, orders) VALUES ($1, 1) ON CONFLICT (host) DO UPDATE SET orders = certificate_orders.orders + 1")
                .bind(host)
                .execute(pool)
                .await?;
            self.count_commit().await;
            Ok(())
        })
    }

    /// Records how the last order for `host` ended: `None` clears the
    /// failure.
    pub async fn set_certificate_error(&self, host: &str, error: Option<&str>, at_ms: i64) -> Result<(), StoreError> {
        on_db!(self, pool => {
            sqlx::query(
                "INSERT INTO certificate_orders (host, orders, last_error, last_error_at) VALUES ($1, 0, $2, $3) \
             ON CONFLICT (host) DO UPDATE SET last_error = excluded.last_error, last_error_at = excluded.last_error_at",
            )
            .bind(host)
            .bind(error)
            .bind(error.map(|_| at_ms))
            .execute(pool)
            .await?;
            self.count_commit().await;
            Ok(())
        })
    }

    /// Forgets the orders of a host no longer served.
    pub async fn delete_certificate_orders(&self, host: &str) -> Result<(), StoreError> {
        on_db!(self, pool => {
            sqlx::query("DELETE FROM certificate_orders WHERE host = $1").bind(host).execute(pool).await?;
            self.count_commit().await;
            Ok(())
        })
    }
}
