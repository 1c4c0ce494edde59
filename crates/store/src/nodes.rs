//! Nodes: registration (which spends a join token in the same transaction),
//! listing, removal, and the batched write of the latest heartbeats.

use crate::backend::Cols;
use sqlx::Row;

use super::usage::UsageTx;
use super::{Store, StoreError, TokenRejection};

/// A node as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeRow {
    pub id: String,
    pub name: String,
    pub hostname: String,
    pub ingress: bool,
    pub mesh_index: i64,
    pub wireguard_public_key: Option<String>,
    pub endpoint: Option<String>,
    pub cert_sha256: String,
    pub draining: bool,
    pub joined_at: i64,
    pub agent_version: Option<String>,
    pub protocol: Option<i64>,
    pub last_heartbeat_at: Option<i64>,
    pub cpu_cores: Option<i64>,
    pub mem_bytes: Option<i64>,
    pub disk_bytes: Option<i64>,
    pub health_json: Option<String>,
    pub health_at: Option<i64>,
    pub metrics_json: Option<String>,
    pub metrics_at: Option<i64>,
    /// When the current certificate ends (Unix ms); unknown for nodes that
    /// joined before 0.2.0.
    pub cert_not_after: Option<i64>,
    /// A certificate a renewal issued that the node has not presented yet.
    pub next_cert_sha256: Option<String>,
    /// The certificate the last renewal or re-join replaced.
    pub replaced_cert_sha256: Option<String>,
    /// When the node last switched to a renewed certificate (Unix ms).
    pub cert_renewed_at: Option<i64>,
}

/// What a join writes.
#[derive(Debug, Clone)]
pub struct NewNode {
    pub id: String,
    pub name: String,
    pub hostname: String,
    pub ingress: bool,
    pub wireguard_public_key: Option<String>,
    pub endpoint: Option<String>,
    pub cert_sha256: String,
    pub cert_not_after: i64,
    pub agent_version: Option<String>,
    pub protocol: i64,
}

/// The latest heartbeat of one node, as the batch writer persists it.
#[derive(Debug, Clone)]
pub struct HeartbeatRow {
    pub node_id: String,
    pub at_ms: i64,
    pub agent_version: Option<String>,
    pub protocol: i64,
    pub cpu_cores: i64,
    pub mem_bytes: i64,
    pub disk_bytes: i64,
    pub health_json: Option<String>,
    pub health_at: Option<i64>,
    pub metrics_json: Option<String>,
    pub metrics_at: Option<i64>,
}

const NODE_COLUMNS: &str = "id, name, hostname, ingress, mesh_index, wireguard_public_key, endpoint, cert_sha256, \
     draining, joined_at, agent_version, protocol, last_heartbeat_at, cpu_cores, mem_bytes, disk_bytes, \
     health_json, health_at, metrics_json, metrics_at, cert_not_after, next_cert_sha256, replaced_cert_sha256, \
     cert_renewed_at";

fn node_from_row(row: &impl Cols) -> NodeRow {
    NodeRow {
        id: row.col("id"),
        name: row.col("name"),
        hostname: row.col("hostname"),
        ingress: row.col("ingress"),
        mesh_index: row.col("mesh_index"),
        wireguard_public_key: row.col("wireguard_public_key"),
        endpoint: row.col("endpoint"),
        cert_sha256: row.col("cert_sha256"),
        draining: row.col("draining"),
        joined_at: row.col("joined_at"),
        agent_version: row.col("agent_version"),
        protocol: row.col("protocol"),
        last_heartbeat_at: row.col("last_heartbeat_at"),
        cpu_cores: row.col("cpu_cores"),
        mem_bytes: row.col("mem_bytes"),
        disk_bytes: row.col("disk_bytes"),
        health_json: row.col("health_json"),
        health_at: row.col("health_at"),
        metrics_json: row.col("metrics_json"),
        metrics_at: row.col("metrics_at"),
        cert_not_after: row.col("cert_not_after"),
        next_cert_sha256: row.col("next_cert_sha256"),
        replaced_cert_sha256: row.col("replaced_cert_sha256"),
        cert_renewed_at: row.col("cert_renewed_at"),
    }
}

/// What a join answered, kept with the spent token so that the same
/// request can be answered again.
#[derive(Debug, Clone, Copy)]
pub struct JoinAnswer<'a> {
    /// SHA-256 (hex) of the CSR the node sent.
    pub csr_sha256: &'a str,
    /// The certificate issued to it (public).
    pub certificate: &'a str,
}

/// Why a join could not be recorded.
#[derive(Debug)]
pub enum JoinRefusal {
    Token(TokenRejection),
    NameTaken,
    /// Every address of the mesh is taken.
    MeshFull,
    /// A re-join named a node that is not registered.
    NoSuchNode,
    /// Another node already uses the WireGuard public key the join sent:
    /// two peers under one key would make every other node route one's
    /// traffic to the other.
    KeyTaken,
}

/// Highest usable index in 10.77.0.0/16 (10.77.255.254).
pub const MAX_MESH_INDEX: i64 = 65534;

/// One traffic sample of a host, summed over nodes:
/// `(at_ms, requests, r2xx, r3xx, r4xx, r5xx, dur_sum_ms, slow)`.
pub type TrafficSample = (i64, i64, i64, i64, i64, i64, f64, i64);

impl Store {
    /// Spends the join token and records the node, in one transaction, so a
    /// token is never spent without a node or the other way round.
    pub async fn register_node(
        &self,
        token_digest: &str,
        node: &NewNode,
        answer: &JoinAnswer<'_>,
        now_ms: i64,
    ) -> Result<Result<NodeRow, JoinRefusal>, StoreError> {
        on_db!(self, pool => {
            let mut tx = pool.begin_write().await?;
            if let Some(rejection) = tx.token_rejection(token_digest, now_ms).await? {
                return Ok(Err(JoinRefusal::Token(rejection)));
            }
            let taken = sqlx::query("SELECT COUNT(*) AS n FROM nodes WHERE name = $1")
                .bind(&node.name)
                .fetch_one(&mut *tx)
                .await?
                .get::<i64, _>("n");
            if taken > 0 {
                return Ok(Err(JoinRefusal::NameTaken));
            }
            if tx.key_taken(node.wireguard_public_key.as_deref(), &node.id).await? {
                return Ok(Err(JoinRefusal::KeyTaken));
            }
            if !tx.spend_token(token_digest, &node.id, answer, now_ms).await? {
                return Ok(Err(JoinRefusal::Token(TokenRejection::AlreadyUsed)));
            }
            // Next after the highest index; when the /16 is used up to the top,
            // the lowest gap left by removed nodes.
            let highest: Option<i64> = sqlx::query("SELECT MAX(mesh_index) AS m FROM nodes").fetch_one(&mut *tx).await?.get("m");
            let mesh_index = match highest {
                None => 1,
                Some(top) if top < MAX_MESH_INDEX => top + 1,
                Some(_) => {
                    let gap: Option<i64> = sqlx::query(
                        "SELECT MIN(n.mesh_index + 1) AS idx FROM nodes n \
                     WHERE NOT EXISTS (SELECT 1 FROM nodes m WHERE m.mesh_index = n.mesh_index + 1) \
                     AND n.mesh_index < $1",
                    )
                    .bind(MAX_MESH_INDEX)
                    .fetch_one(&mut *tx)
                    .await?
                    .get("idx");
                    let lowest_free = if tx.mesh_index_free(1).await? { Some(1) } else { gap };
                    match lowest_free {
                        Some(index) => index,
                        None => return Ok(Err(JoinRefusal::MeshFull)),
                    }
                }
            };
            sqlx::query(
                "INSERT INTO nodes (id, name, hostname, ingress, mesh_index, wireguard_public_key, endpoint, cert_sha256, \
             joined_at, agent_version, protocol, cert_not_after) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)",
            )
            .bind(&node.id)
            .bind(&node.name)
            .bind(&node.hostname)
            .bind(node.ingress)
            .bind(mesh_index)
            .bind(&node.wireguard_public_key)
            .bind(&node.endpoint)
            .bind(&node.cert_sha256)
            .bind(now_ms)
            .bind(&node.agent_version)
            .bind(node.protocol)
            .bind(node.cert_not_after)
            .execute(&mut *tx)
            .await?;
            tx.commit().await?;
            self.count_commit().await;
            let row = self.node(&node.id).await?.expect("node inserted in this transaction");
            Ok(Ok(row))
        })
    }




    /// A re-join: spends the token and gives an existing node a new
    /// certificate (and the mesh key and endpoint it sent), keeping its
    /// id, name, mesh address and everything placed on it. The certificate
    /// it had is refused from now on as replaced.
    pub async fn rejoin_node(
        &self,
        token_digest: &str,
        node: &NewNode,
        answer: &JoinAnswer<'_>,
        now_ms: i64,
    ) -> Result<Result<NodeRow, JoinRefusal>, StoreError> {
        on_db!(self, pool => {
            let mut tx = pool.begin_write().await?;
            if let Some(rejection) = tx.token_rejection(token_digest, now_ms).await? {
                return Ok(Err(JoinRefusal::Token(rejection)));
            }
            if tx.key_taken(node.wireguard_public_key.as_deref(), &node.id).await? {
                return Ok(Err(JoinRefusal::KeyTaken));
            }
            let updated = sqlx::query(
                "UPDATE nodes SET replaced_cert_sha256 = cert_sha256, cert_sha256 = $1, cert_not_after = $2, \
             next_cert_sha256 = NULL, next_cert_not_after = NULL, hostname = $3, wireguard_public_key = $4, \
             endpoint = $5, agent_version = $6, protocol = $7 WHERE id = $8",
            )
            .bind(&node.cert_sha256)
            .bind(node.cert_not_after)
            .bind(&node.hostname)
            .bind(&node.wireguard_public_key)
            .bind(&node.endpoint)
            .bind(&node.agent_version)
            .bind(node.protocol)
            .bind(&node.id)
            .execute(&mut *tx)
            .await?;
            if updated.rows_affected() != 1 {
                return Ok(Err(JoinRefusal::NoSuchNode));
            }
            if !tx.spend_token(token_digest, &node.id, answer, now_ms).await? {
                return Ok(Err(JoinRefusal::Token(TokenRejection::AlreadyUsed)));
            }
            tx.commit().await?;
            self.count_commit().await;
            let row = self.node(&node.id).await?.expect("node updated in this transaction");
            Ok(Ok(row))
        })
    }

    /// Records a renewal's certificate for a node that still presents
    /// `current_sha256`; it becomes current when the node first uses it
    /// ([`Store::promote_next_cert`]). An earlier renewal not used yet is
    /// forgotten. False when the node or its current certificate changed.
    pub async fn set_next_cert(&self, id: &str, current_sha256: &str, next_sha256: &str, next_not_after: i64) -> Result<bool, StoreError> {
        on_db!(self, pool => {
            let updated = sqlx::query(
                "UPDATE nodes SET next_cert_sha256 = $1, next_cert_not_after = $2 WHERE id = $3 AND cert_sha256 = $4",
            )
            .bind(next_sha256)
            .bind(next_not_after)
            .bind(id)
            .bind(current_sha256)
            .execute(pool)
            .await?;
            self.count_commit().await;
            Ok(updated.rows_affected() == 1)
        })
    }

    /// The node presented its renewed certificate: it becomes the current
    /// one and the old one is replaced (refused from now on). Returns the
    /// updated node, or None when `next_sha256` is not its pending
    /// certificate (another request promoted it first).
    pub async fn promote_next_cert(&self, id: &str, next_sha256: &str, now_ms: i64) -> Result<Option<NodeRow>, StoreError> {
        on_db!(self, pool => {
            let updated = sqlx::query(
                "UPDATE nodes SET replaced_cert_sha256 = cert_sha256, cert_sha256 = next_cert_sha256, \
             cert_not_after = next_cert_not_after, next_cert_sha256 = NULL, next_cert_not_after = NULL, \
             cert_renewed_at = $1 WHERE id = $2 AND next_cert_sha256 = $3",
            )
            .bind(now_ms)
            .bind(id)
            .bind(next_sha256)
            .execute(pool)
            .await?;
            self.count_commit().await;
            if updated.rows_affected() != 1 {
                return Ok(None);
            }
            self.node(id).await
        })
    }

    /// The answer of an earlier join with this token and this CSR, while
    /// the token is within its life and its node is still registered: the
    /// node and the certificate it was issued. A join whose answer was
    /// lost on the way gets it again.
    pub async fn join_retry(&self, token_digest: &str, csr_sha256: &str, now_ms: i64) -> Result<Option<(NodeRow, String)>, StoreError> {
        on_db!(self, pool => {
            let row = sqlx::query(
                "SELECT used_by_node, certificate FROM join_tokens WHERE token_sha256 = $1 AND used_at IS NOT NULL \
             AND expires_at > $2 AND csr_sha256 = $3 AND certificate IS NOT NULL",
            )
            .bind(token_digest)
            .bind(now_ms)
            .bind(csr_sha256)
            .fetch_optional(pool)
            .await?;
            let Some(row) = row else { return Ok(None) };
            let node_id: Option<String> = row.get("used_by_node");
            let certificate: String = row.get("certificate");
            let Some(node_id) = node_id else { return Ok(None) };
            Ok(self.node(&node_id).await?.map(|node| (node, certificate)))
        })
    }


    pub async fn node(&self, id: &str) -> Result<Option<NodeRow>, StoreError> {
        on_db!(self, pool => {
            let row = sqlx::query(&format!("SELECT {NODE_COLUMNS} FROM nodes WHERE id = $1"))
                .bind(id)
                .fetch_optional(pool)
                .await?;
            Ok(row.as_ref().map(node_from_row))
        })
    }

    pub async fn nodes(&self) -> Result<Vec<NodeRow>, StoreError> {
        on_db!(self, pool => {
            let rows = sqlx::query(&format!("SELECT {NODE_COLUMNS} FROM nodes ORDER BY joined_at, id"))
                .fetch_all(pool)
                .await?;
            Ok(rows.iter().map(node_from_row).collect())
        })
    }

    pub async fn set_draining(&self, id: &str, draining: bool) -> Result<bool, StoreError> {
        on_db!(self, pool => {
            let result = sqlx::query("UPDATE nodes SET draining = $1 WHERE id = $2").bind(draining).bind(id).execute(pool).await?;
            self.count_commit().await;
            Ok(result.rows_affected() == 1)
        })
    }

    /// Records the WireGuard endpoint a node reported (its public address
    /// changed). Returns whether the node exists.
    pub async fn set_endpoint(&self, id: &str, endpoint: &str) -> Result<bool, StoreError> {
        on_db!(self, pool => {
            let result = sqlx::query("UPDATE nodes SET endpoint = $1 WHERE id = $2").bind(endpoint).bind(id).execute(pool).await?;
            self.count_commit().await;
            Ok(result.rows_affected() == 1)
        })
    }

    /// Removes a node and its queued commands. Returns whether it existed.
    pub async fn delete_node(&self, id: &str) -> Result<bool, StoreError> {
        on_db!(self, pool => {
            let mut tx = pool.begin_write().await?;
            sqlx::query("DELETE FROM commands WHERE node_id = $1").bind(id).execute(&mut *tx).await?;
            let deleted = sqlx::query("DELETE FROM nodes WHERE id = $1").bind(id).execute(&mut *tx).await?;
            tx.commit().await?;
            self.count_commit().await;
            Ok(deleted.rows_affected() == 1)
        })
    }

    /// Persists the latest heartbeat of many nodes, and the traffic samples
    /// received since the last call, in one transaction.
    pub async fn save_heartbeats(
        &self,
        batch: &[HeartbeatRow],
        traffic: &[TrafficRow],
        usage: &[super::NodeUsageRow],
    ) -> Result<(), StoreError> {
        on_db!(self, pool => {
            if batch.is_empty() && traffic.is_empty() && usage.is_empty() {
                return Ok(());
            }
            let mut tx = pool.begin_write().await?;
            tx.insert_usage(usage).await?;
            for row in traffic {
                let t = &row.sample;
                sqlx::query(
                    "INSERT INTO traffic_samples (node_id, host, at, requests, r2xx, r3xx, r4xx, r5xx, dur_sum_ms, slow) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
                )
                .bind(&row.node_id)
                .bind(&t.host)
                .bind(row.at_ms)
                .bind(t.requests.min(i64::MAX as u64) as i64)
                .bind(t.r2xx.min(i64::MAX as u64) as i64)
                .bind(t.r3xx.min(i64::MAX as u64) as i64)
                .bind(t.r4xx.min(i64::MAX as u64) as i64)
                .bind(t.r5xx.min(i64::MAX as u64) as i64)
                .bind(t.dur_sum_ms)
                .bind(t.slow.min(i64::MAX as u64) as i64)
                .execute(&mut *tx)
                .await?;
            }
            for hb in batch {
                sqlx::query(
                    "UPDATE nodes SET last_heartbeat_at = $1, agent_version = COALESCE($2, agent_version), protocol = $3, \
                 cpu_cores = $4, mem_bytes = $5, disk_bytes = $6, \
                 health_json = COALESCE($7, health_json), health_at = COALESCE($8, health_at), \
                 metrics_json = COALESCE($9, metrics_json), metrics_at = COALESCE($10, metrics_at) \
                 WHERE id = $11",
                )
                .bind(hb.at_ms)
                .bind(&hb.agent_version)
                .bind(hb.protocol)
                .bind(hb.cpu_cores)
                .bind(hb.mem_bytes)
                .bind(hb.disk_bytes)
                .bind(&hb.health_json)
                .bind(hb.health_at)
                .bind(&hb.metrics_json)
                .bind(hb.metrics_at)
                .bind(&hb.node_id)
                .execute(&mut *tx)
                .await?;
            }
            tx.commit().await?;
            self.count_commit().await;
            Ok(())
        })
    }
}

impl Store {
    /// Traffic samples of a host since `since_ms`, oldest first:
    /// `(at_ms, requests, r2xx, r3xx, r4xx, r5xx, dur_sum_ms, slow)` summed
    /// over nodes per sample time.
    pub async fn traffic(&self, host: &str, since_ms: i64) -> Result<Vec<TrafficSample>, StoreError> {
        on_db!(self, pool => {
            let rows = sqlx::query(
                "SELECT at, CAST(SUM(requests) AS BIGINT) AS requests, CAST(SUM(r2xx) AS BIGINT) AS r2xx, CAST(SUM(r3xx) AS BIGINT) AS r3xx, CAST(SUM(r4xx) AS BIGINT) AS r4xx, CAST(SUM(r5xx) AS BIGINT) AS r5xx, \
             SUM(dur_sum_ms) AS dur_sum_ms, CAST(SUM(slow) AS BIGINT) AS slow FROM traffic_samples WHERE host = $1 AND at >= $2 \
             GROUP BY at ORDER BY at",
            )
            .bind(host)
            .bind(since_ms)
            .fetch_all(pool)
            .await?;
            Ok(rows
                .iter()
                .map(|r| (r.get("at"), r.get("requests"), r.get("r2xx"), r.get("r3xx"), r.get("r4xx"), r.get("r5xx"), r.get("dur_sum_ms"), r.get("slow")))
                .collect())
        })
    }
}

/// One host's traffic from one node's sample, waiting for the batch write.
#[derive(Debug, Clone)]
pub struct TrafficRow {
    pub node_id: String,
    pub at_ms: i64,
    pub sample: cloudweb_protocol::HostTraffic,
}

/// What this module writes inside a caller's write transaction, once per
/// engine (see [`crate::backend::for_both_engines`]).
pub(crate) trait NodesTx {
    /// Why a join token cannot be spent now, if it cannot.
    async fn token_rejection(&mut self, token_digest: &str, now_ms: i64) -> Result<Option<TokenRejection>, StoreError>;
    /// Whether a node other than `node_id` has WireGuard public key `key`.
    async fn key_taken(&mut self, key: Option<&str>, node_id: &str) -> Result<bool, StoreError>;
    /// Marks the token used by `node_id` with the answer it got; false when
    /// another request spent it first.
    async fn spend_token(&mut self, token_digest: &str, node_id: &str, answer: &JoinAnswer<'_>, now_ms: i64) -> Result<bool, StoreError>;
    async fn mesh_index_free(&mut self, index: i64) -> Result<bool, StoreError>;
}

crate::backend::for_both_engines! {
    impl NodesTx for sqlx::Transaction<'_, DB> {
        async fn token_rejection(&mut self, token_digest: &str, now_ms: i64) -> Result<Option<TokenRejection>, StoreError> {
            let tx = self;
            let token = sqlx::query("SELECT expires_at, used_at FROM join_tokens WHERE token_sha256 = $1")
                .bind(token_digest)
                .fetch_optional(&mut **tx)
                .await?;
            Ok(match token {
                None => Some(TokenRejection::Unknown),
                Some(row) if row.get::<Option<i64>, _>("used_at").is_some() => Some(TokenRejection::AlreadyUsed),
                Some(row) if row.get::<i64, _>("expires_at") <= now_ms => Some(TokenRejection::Expired),
                Some(_) => None,
            })
        }

        async fn key_taken(&mut self, key: Option<&str>, node_id: &str) -> Result<bool, StoreError> {
            let tx = self;
            let Some(key) = key else { return Ok(false) };
            let n: i64 = sqlx::query("SELECT COUNT(*) AS n FROM nodes WHERE wireguard_public_key = $1 AND id <> $2")
                .bind(key)
                .bind(node_id)
                .fetch_one(&mut **tx)
                .await?
                .get("n");
            Ok(n > 0)
        }

        async fn spend_token(&mut self, token_digest: &str, node_id: &str, answer: &JoinAnswer<'_>, now_ms: i64) -> Result<bool, StoreError> {
            let tx = self;
            let used = sqlx::query(
                "UPDATE join_tokens SET used_at = $1, used_by_node = $2, csr_sha256 = $3, certificate = $4 \
                 WHERE token_sha256 = $5 AND used_at IS NULL",
            )
            .bind(now_ms)
            .bind(node_id)
            .bind(answer.csr_sha256)
            .bind(answer.certificate)
            .bind(token_digest)
            .execute(&mut **tx)
            .await?;
            Ok(used.rows_affected() == 1)
        }

        async fn mesh_index_free(&mut self, index: i64) -> Result<bool, StoreError> {
            let tx = self;
            let n: i64 = sqlx::query("SELECT COUNT(*) AS n FROM nodes WHERE mesh_index = $1").bind(index).fetch_one(&mut **tx).await?.get("n");
            Ok(n == 0)
        }
    }
}
