//! The audit log: append-only, hash-chained. Each entry's hash is
//! SHA-256 over the previous entry's hash and the entry's own fields, so
//! that an entry changed or deleted in the database breaks the chain at
//! that point ([`Store::verify_audit`]). Appends run in one write
//! transaction each: they are serialized, and the chain has no fork.

use sha2::{Digest, Sha256};
use sqlx::Row;

use crate::backend::Cols;

use super::{Store, StoreError};

/// The hash before the first entry.
pub const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// An entry to append.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NewAuditEntry {
    pub at: i64,
    /// Ties a request's entry (`phase` `request`) to its outcome's
    /// (`response`); a single entry (a login, a refusal) is `event`.
    pub request_id: String,
    pub phase: String,
    /// `user:<id>`, `token:<id>`, `deploy-token:<id>`, `admin-token`,
    /// `anonymous`, or a name tried at login (`login:<name>`).
    pub actor: String,
    pub team: Option<String>,
    pub source: Option<String>,
    pub action: String,
    pub target: Option<String>,
    pub result: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditRow {
    pub seq: i64,
    pub entry: NewAuditEntry,
    pub prev_hash: String,
    pub hash: String,
}

/// Which entries to read.
#[derive(Debug, Clone, Default)]
pub struct AuditQuery {
    pub since_ms: Option<i64>,
    pub until_ms: Option<i64>,
    pub actor: Option<String>,
    /// Entries whose action contains this.
    pub action: Option<String>,
    /// Only these teams' entries (`None`: all).
    pub teams: Option<Vec<String>>,
    /// Entries after this sequence number.
    pub after_seq: Option<i64>,
    pub limit: i64,
}

/// What a walk of the chain found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainCheck {
    pub entries: i64,
    /// The first entry whose hash or link does not match, with why.
    pub broken_at: Option<(i64, String)>,
}

/// The hash of an entry that follows `prev_hash`. Fields are joined with
/// their lengths, so that no two different entries hash alike.
pub fn entry_hash(prev_hash: &str, seq: i64, entry: &NewAuditEntry) -> String {
    let mut hasher = Sha256::new();
    let fields: [&str; 10] = [
        prev_hash,
        &entry.request_id,
        &entry.phase,
        &entry.actor,
        entry.team.as_deref().unwrap_or("\u{0}"),
        entry.source.as_deref().unwrap_or("\u{0}"),
        &entry.action,
        entry.target.as_deref().unwrap_or("\u{0}"),
        &entry.result,
        "",
    ];
    hasher.update(seq.to_be_bytes());
    hasher.update(entry.at.to_be_bytes());
    for field in fields {
        hasher.update((field.len() as u64).to_be_bytes());
        hasher.update(field.as_bytes());
    }
    hasher.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

const COLUMNS: &str = "seq, at, request_id, phase, actor, team, source, action, target, result, prev_hash, hash";

fn row_from(row: &impl Cols) -> AuditRow {
    AuditRow {
        seq: row.col("seq"),
        entry: NewAuditEntry {
            at: row.col("at"),
            request_id: row.col("request_id"),
            phase: row.col("phase"),
            actor: row.col("actor"),
            team: row.col("team"),
            source: row.col("source"),
            action: row.col("action"),
            target: row.col("target"),
            result: row.col("result"),
        },
        prev_hash: row.col("prev_hash"),
        hash: row.col("hash"),
    }
}

impl Store {
    /// Appends one entry to the chain.
    pub async fn append_audit(&self, entry: &NewAuditEntry) -> Result<AuditRow, StoreError> {
        on_db!(self, pool => {
            let mut tx = pool.begin_write().await?;
            let last = sqlx::query("SELECT seq, hash FROM audit_log ORDER BY seq DESC LIMIT 1").fetch_optional(&mut *tx).await?;
            let (prev_seq, prev_hash): (i64, String) = match last {
                Some(row) => (row.get("seq"), row.get("hash")),
                None => match sqlx::query("SELECT seq, hash FROM audit_anchor WHERE id = 1").fetch_optional(&mut *tx).await? {
                    Some(row) => (row.get("seq"), row.get("hash")),
                    None => (0, GENESIS.to_string()),
                },
            };
            let seq = prev_seq + 1;
            let hash = entry_hash(&prev_hash, seq, entry);
            sqlx::query(&format!("INSERT INTO audit_log ({COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)"))
                .bind(seq)
                .bind(entry.at)
                .bind(&entry.request_id)
                .bind(&entry.phase)
                .bind(&entry.actor)
                .bind(&entry.team)
                .bind(&entry.source)
                .bind(&entry.action)
                .bind(&entry.target)
                .bind(&entry.result)
                .bind(&prev_hash)
                .bind(&hash)
                .execute(&mut *tx)
                .await?;
            tx.commit().await?;
            self.count_commit().await;
            Ok(AuditRow { seq, entry: entry.clone(), prev_hash, hash })
        })
    }

    /// Entries matching `query`, oldest first.
    pub async fn audit_entries(&self, query: &AuditQuery) -> Result<Vec<AuditRow>, StoreError> {
        let mut sql = format!("SELECT {COLUMNS} FROM audit_log WHERE seq > $1 AND at >= $2 AND at <= $3");
        if query.actor.is_some() {
            // A user's own entries and their tokens' (`user:<id>/token:<id>`).
            sql.push_str(" AND (actor = $4 OR substr(actor, 1, length($4) + 1) = $4 || '/')");
        } else {
            sql.push_str(" AND $4 = $4");
        }
        if query.action.is_some() {
            sql.push_str(" AND instr(action, $5) > 0");
        } else {
            sql.push_str(" AND $5 = $5");
        }
        sql.push_str(" ORDER BY seq LIMIT $6");
        let teams = query.teams.clone();
        on_db!(self, pool => {
            let sql = if matches!(self.engine(), crate::Engine::Postgres) { sql.replace("instr(action, $5) > 0", "strpos(action, $5) > 0") } else { sql.clone() };
            let mut out = Vec::new();
            let mut after = query.after_seq.unwrap_or(0);
            // Team filtering is done here, in pages, so that a page of
            // other teams' entries does not end the read early.
            loop {
                let rows = sqlx::query(&sql)
                    .bind(after)
                    .bind(query.since_ms.unwrap_or(i64::MIN))
                    .bind(query.until_ms.unwrap_or(i64::MAX))
                    .bind(query.actor.clone().unwrap_or_default())
                    .bind(query.action.clone().unwrap_or_default())
                    .bind(query.limit.max(1))
                    .fetch_all(pool)
                    .await?;
                let done = (rows.len() as i64) < query.limit.max(1);
                for row in &rows {
                    let row = row_from(row);
                    after = row.seq;
                    let visible = match &teams {
                        None => true,
                        Some(teams) => row.entry.team.as_ref().is_some_and(|team| teams.contains(team)),
                    };
                    if visible && (out.len() as i64) < query.limit.max(1) {
                        out.push(row);
                    }
                }
                if done || (out.len() as i64) >= query.limit.max(1) {
                    return Ok(out);
                }
            }
        })
    }

    /// Walks the chain from its start (the anchor after pruning) and
    /// reports the first entry that does not follow from the one before.
    pub async fn verify_audit(&self) -> Result<ChainCheck, StoreError> {
        on_db!(self, pool => {
            let (mut prev_seq, mut prev_hash): (i64, String) = match sqlx::query("SELECT seq, hash FROM audit_anchor WHERE id = 1").fetch_optional(pool).await? {
                Some(row) => (row.get("seq"), row.get("hash")),
                None => (0, GENESIS.to_string()),
            };
            let mut entries = 0;
            loop {
                let rows = sqlx::query(&format!("SELECT {COLUMNS} FROM audit_log WHERE seq > $1 ORDER BY seq LIMIT 1000"))
                    .bind(prev_seq)
                    .fetch_all(pool)
                    .await?;
                if rows.is_empty() {
                    return Ok(ChainCheck { entries, broken_at: None });
                }
                for row in &rows {
                    let row = row_from(row);
                    let broken = if row.seq != prev_seq + 1 {
                        Some(format!("entries {} to {} are missing", prev_seq + 1, row.seq - 1))
                    } else if row.prev_hash != prev_hash {
                        Some("its link to the entry before does not match".to_string())
                    } else if entry_hash(&prev_hash, row.seq, &row.entry) != row.hash {
                        Some("its content does not match its hash: it was changed".to_string())
                    } else {
                        None
                    };
                    if let Some(why) = broken {
                        return Ok(ChainCheck { entries, broken_at: Some((row.seq, why)) });
                    }
                    entries += 1;
                    prev_seq = row.seq;
                    prev_hash = row.hash;
                }
            }
        })
    }

    /// Deletes entries older than `before_ms` (retention), moving the
    /// chain's anchor to the last one deleted. Returns how many went.
    pub async fn prune_audit(&self, before_ms: i64) -> Result<u64, StoreError> {
        on_db!(self, pool => {
            let mut tx = pool.begin_write().await?;
            let last = sqlx::query("SELECT seq, hash FROM audit_log WHERE at < $1 ORDER BY seq DESC LIMIT 1").bind(before_ms).fetch_optional(&mut *tx).await?;
            let Some(last) = last else {
                tx.rollback().await?;
                return Ok(0);
            };
            let (seq, hash): (i64, String) = (last.get("seq"), last.get("hash"));
            let gone = sqlx::query("DELETE FROM audit_log WHERE seq <= $1").bind(seq).execute(&mut *tx).await?.rows_affected();
            sqlx::query("INSERT INTO audit_anchor (id, seq, hash) VALUES (1, $1, $2) ON CONFLICT (id) DO UPDATE SET seq = excluded.seq, hash = excluded.hash")
                .bind(seq)
                .bind(&hash)
                .execute(&mut *tx)
                .await?;
            tx.commit().await?;
            self.count_commit().await;
            Ok(gone)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(n: i64) -> NewAuditEntry {
        NewAuditEntry {
            at: 1_000 + n,
            request_id: format!("req-{n}"),
            phase: "event".into(),
            actor: "user:usr_a".into(),
            team: Some("team_default".into()),
            source: Some("127.0.0.1".into()),
            action: "POST /api/apps".into(),
            target: Some("app:web".into()),
            result: "201".into(),
        }
    }

    crate::test_engines::both_engines! {
        async fn the_chain_detects_a_changed_or_deleted_entry_and_survives_pruning(store) {
            for n in 1..=5 {
                store.append_audit(&entry(n)).await.unwrap();
            }
            assert_eq!(store.verify_audit().await.unwrap(), ChainCheck { entries: 5, broken_at: None });
            let only = AuditQuery { actor: Some("user:usr_a".into()), action: Some("apps".into()), limit: 2, ..AuditQuery::default() };
            let page = store.audit_entries(&only).await.unwrap();
            assert_eq!(page.iter().map(|r| r.seq).collect::<Vec<_>>(), vec![1, 2]);
            let none = AuditQuery { teams: Some(vec!["team_other".into()]), limit: 10, ..AuditQuery::default() };
            assert!(store.audit_entries(&none).await.unwrap().is_empty());

            // Retention keeps the rest verifiable.
            assert_eq!(store.prune_audit(1_003).await.unwrap(), 2);
            assert_eq!(store.verify_audit().await.unwrap(), ChainCheck { entries: 3, broken_at: None });
            store.append_audit(&entry(6)).await.unwrap();
            assert_eq!(store.verify_audit().await.unwrap().entries, 4);

            // An edited result is found where it was edited.
            store.test_execute("UPDATE audit_log SET result = '200' WHERE seq = 4", &[]).await;
            let check = store.verify_audit().await.unwrap();
            assert_eq!(check.broken_at.as_ref().map(|b| b.0), Some(4), "{check:?}");
            store.test_execute("UPDATE audit_log SET result = '201' WHERE seq = 4", &[]).await;
            assert_eq!(store.verify_audit().await.unwrap().broken_at, None);

            // So is a deleted one.
            store.test_execute("DELETE FROM audit_log WHERE seq = 5", &[]).await;
            let check = store.verify_audit().await.unwrap();
            assert_eq!(check.broken_at.map(|b| b.0), Some(6));
        }
    }
}
