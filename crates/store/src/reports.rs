//! Deployment reports and log lines sent by agents.

use cloudweb_protocol::Report;

use super::{Store, StoreError};

impl Store {
    pub async fn save_report(&self, node_id: &str, report: &Report, now_ms: i64) -> Result<(), StoreError> {
        on_db!(self, pool => {
            let mut tx = pool.begin_write().await?;
            if report.state.is_some() || report.message.is_some() || report.image.is_some() {
                sqlx::query(
                    "INSERT INTO deployment_reports (deployment_id, node_id, state, message, image, created_at) \
                 VALUES ($1, $2, $3, $4, $5, $6)",
                )
                .bind(&report.deployment_id)
                .bind(node_id)
                .bind(&report.state)
                .bind(&report.message)
                .bind(&report.image)
                .bind(now_ms)
                .execute(&mut *tx)
                .await?;
            }
            for line in &report.logs {
                sqlx::query(
                    "INSERT INTO deployment_logs (deployment_id, node_id, ts, stream, line) VALUES ($1, $2, $3, $4, $5)",
                )
                .bind(&report.deployment_id)
                .bind(node_id)
                .bind(&line.ts)
                .bind(&line.stream)
                .bind(&line.line)
                .execute(&mut *tx)
                .await?;
            }
            tx.commit().await?;
            self.count_commit().await;
            Ok(())
        })
    }
}
