//! `leader_lease`: which control-plane replica leads, for how long, and
//! the fencing token of its term.
//!
//! A replica holds the lease while it renews it before `expires_at`, a
//! time in the database's own clock. Another replica takes it over only
//! once it expired, and the token then grows by one. The leader's loops
//! run inside [`fence::scope`] with the token of their term, and every
//! write transaction they open ([`crate::backend::WritePool::begin_write`])
//! first checks, holding the write lock, that this term still holds the
//! lease: a leader that was frozen past its lease (or cut off from the
//! database) and resumes finds its writes refused with
//! [`StoreError::Fenced`] instead of racing the new leader.

use crate::backend::{Cols, Engine};
use super::{Store, StoreError};

/// The lease as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    pub holder: String,
    pub token: i64,
    pub expires_at_ms: i64,
    pub renewed_at_ms: i64,
    /// The database's clock when this was read.
    pub now_ms: i64,
}

/// One replica in [`Store::replicas`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaRow {
    pub url: String,
    /// When it last renewed or tried for the lease, in the database's
    /// clock.
    pub seen_at_ms: i64,
    /// Whether it holds an unexpired lease.
    pub leads: bool,
}

/// The replicas, with the database's clock and the latest term.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replicas {
    pub now_ms: i64,
    pub term: Option<i64>,
    pub replicas: Vec<ReplicaRow>,
}

/// A replica unseen for this long is forgotten.
const FORGET_REPLICAS_MS: i64 = 3_600_000;

/// The lease row, locked with `lock` on PostgreSQL (SQLite's write lock
/// covers it there).
fn lease_row_sql(engine: Engine, lock: &str) -> &'static str {
    match (engine, lock) {
        (Engine::Postgres, " FOR SHARE") => "SELECT holder, token, expires_at FROM leader_lease WHERE id = 1 FOR SHARE",
        (Engine::Postgres, _) => "SELECT holder, token, expires_at FROM leader_lease WHERE id = 1 FOR UPDATE",
        (Engine::Sqlite, _) => "SELECT holder, token, expires_at FROM leader_lease WHERE id = 1",
    }
}

/// The database's clock, in milliseconds since the epoch.
pub(crate) fn now_sql(engine: Engine) -> &'static str {
    match engine {
        Engine::Sqlite => "SELECT CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER) AS now",
        Engine::Postgres => "SELECT CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT) AS now",
    }
}

pub use crate::fence;

crate::backend::for_both_engines! {
    impl crate::backend::FenceCheck for sqlx::Transaction<'static, DB> {
        async fn check_fence(&mut self, engine: Engine, term: &fence::Term) -> Result<(), StoreError> {
            let now: i64 = sqlx::query(now_sql(engine)).fetch_one(&mut **self).await?.col("now");
            // On PostgreSQL the row stays share-locked until this write
            // commits: a takeover (which updates it) waits for the old
            // term's writes that passed this check.
            let row = sqlx::query(lease_row_sql(engine, " FOR SHARE")).fetch_optional(&mut **self).await?;
            let holds = row.is_some_and(|row| {
                row.col::<String>("holder") == term.holder && row.col::<i64>("token") == term.token && row.col::<i64>("expires_at") > now
            });
            if holds {
                Ok(())
            } else {
                Err(StoreError::Fenced(term.token))
            }
        }
    }
}

impl Store {
    /// Takes or renews the lease for `holder` for `ttl_ms` of the
    /// database's clock: the term's token when `holder` holds it now,
    /// `None` while another replica's lease runs.
    ///
    /// Also records that the replica `holder`, reachable at `url`, is
    /// alive (see [`Store::control_planes`]).
    ///
    /// On PostgreSQL the claim does not take the store's write lock (a
    /// leader's renewal must not queue behind a long write, such as the
    /// heartbeat flush of 10,000 nodes): it locks the lease row itself,
    /// which the fenced writes share-lock (see `check_fence`).
    pub async fn claim_lease(&self, holder: &str, url: &str, ttl_ms: i64) -> Result<Option<i64>, StoreError> {
        let engine = self.engine();
        on_db!(self, pool => {
            let mut tx = match engine {
                Engine::Postgres => pool.begin().await?,
                Engine::Sqlite => pool.begin_write().await?,
            };
            if engine == Engine::Postgres {
                sqlx::query("SET LOCAL lock_timeout = '5s'").execute(&mut *tx).await?;
                // The row to lock, made expired if no replica ever led;
                // seen by others only with this claim's own update.
                sqlx::query("INSERT INTO leader_lease (id, holder, token, expires_at, renewed_at) VALUES (1, '', 0, 0, 0) ON CONFLICT (id) DO NOTHING")
                    .execute(&mut *tx)
                    .await?;
            }
            let now: i64 = sqlx::query(now_sql(engine)).fetch_one(&mut *tx).await?.col("now");
            sqlx::query("INSERT INTO control_planes (holder, url, seen_at) VALUES ($1, $2, $3) ON CONFLICT (holder) DO UPDATE SET url = excluded.url, seen_at = excluded.seen_at")
                .bind(holder).bind(url).bind(now).execute(&mut *tx).await?;
            sqlx::query("DELETE FROM control_planes WHERE seen_at < $1").bind(now - FORGET_REPLICAS_MS).execute(&mut *tx).await?;
            let current = sqlx::query(lease_row_sql(engine, " FOR UPDATE")).fetch_optional(&mut *tx).await?;
            let token = match current {
                None => {
                    sqlx::query("INSERT INTO leader_lease (id, holder, token, expires_at, renewed_at) VALUES (1, $1, 1, $2, $3)")
                        .bind(holder).bind(now + ttl_ms).bind(now).execute(&mut *tx).await?;
                    Some(1)
                }
                Some(row) => {
                    let (held_by, token, expires_at) = (row.col::<String>("holder"), row.col::<i64>("token"), row.col::<i64>("expires_at"));
                    if held_by == holder && expires_at > now {
                        sqlx::query("UPDATE leader_lease SET expires_at = $1, renewed_at = $2 WHERE id = 1")
                            .bind(now + ttl_ms).bind(now).execute(&mut *tx).await?;
                        Some(token)
                    } else if expires_at <= now {
                        // Expired (also our own: a new term, so that a
                        // task of the old one is fenced too).
                        sqlx::query("UPDATE leader_lease SET holder = $1, token = $2, expires_at = $3, renewed_at = $4 WHERE id = 1")
                            .bind(holder).bind(token + 1).bind(now + ttl_ms).bind(now).execute(&mut *tx).await?;
                        Some(token + 1)
                    } else {
                        None
                    }
                }
            };
            // Every replica's try commits (its `control_planes` row).
            tx.commit().await?;
            self.count_commit().await;
            Ok(token)
        })
    }

    /// The URLs of the replicas seen within `within_ms` of the database's
    /// clock, the current lease holder's first, each once.
    pub async fn control_planes(&self, within_ms: i64) -> Result<Vec<String>, StoreError> {
        let engine = self.engine();
        on_db!(self, pool => {
            let now: i64 = sqlx::query(now_sql(engine)).fetch_one(pool).await?.col("now");
            let rows = sqlx::query(
                "SELECT c.url AS url, MAX(CASE WHEN l.holder = c.holder AND l.expires_at > $2 THEN 1 ELSE 0 END) AS leads \
                 FROM control_planes c LEFT JOIN leader_lease l ON l.id = 1 \
                 WHERE c.seen_at >= $1 GROUP BY c.url ORDER BY leads DESC, c.url",
            )
            .bind(now - within_ms)
            .bind(now)
            .fetch_all(pool)
            .await?;
            Ok(rows.iter().map(|row| row.col::<String>("url")).collect())
        })
    }

    /// Every replica seen within the last hour, for the replicas view:
    /// one entry per URL (a restarted replica's earlier process is the
    /// same replica), the one that leads first, then by URL.
    pub async fn replicas(&self) -> Result<Replicas, StoreError> {
        let engine = self.engine();
        on_db!(self, pool => {
            let now: i64 = sqlx::query(now_sql(engine)).fetch_one(pool).await?.col("now");
            let lease = sqlx::query("SELECT holder, token, expires_at FROM leader_lease WHERE id = 1").fetch_optional(pool).await?;
            let lease = lease.map(|row| (row.col::<String>("holder"), row.col::<i64>("token"), row.col::<i64>("expires_at")));
            let leader = lease.as_ref().filter(|(_, _, expires_at)| *expires_at > now).map(|(holder, _, _)| holder.clone());
            let rows = sqlx::query("SELECT holder, url, seen_at FROM control_planes WHERE seen_at >= $1").bind(now - FORGET_REPLICAS_MS).fetch_all(pool).await?;
            let mut replicas: Vec<ReplicaRow> = Vec::new();
            for row in rows {
                let (holder, url, seen_at_ms) = (row.col::<String>("holder"), row.col::<String>("url"), row.col::<i64>("seen_at"));
                let leads = leader.as_deref() == Some(holder.as_str());
                match replicas.iter_mut().find(|r| r.url == url) {
                    Some(known) => {
                        known.leads |= leads;
                        known.seen_at_ms = known.seen_at_ms.max(seen_at_ms);
                    }
                    None => replicas.push(ReplicaRow { url, seen_at_ms, leads }),
                }
            }
            replicas.sort_by(|a, b| b.leads.cmp(&a.leads).then_with(|| a.url.cmp(&b.url)));
            Ok(Replicas { now_ms: now, term: lease.map(|(_, token, _)| token), replicas })
        })
    }

    /// Gives the lease up at once (a replica that stops), if `holder`
    /// holds it with `token`: the next replica need not wait it out.
    pub async fn release_lease(&self, holder: &str, token: i64) -> Result<bool, StoreError> {
        on_db!(self, pool => {
            let result = sqlx::query("UPDATE leader_lease SET expires_at = 0 WHERE id = 1 AND holder = $1 AND token = $2")
                .bind(holder).bind(token).execute(pool).await?;
            self.count_commit().await;
            Ok(result.rows_affected() == 1)
        })
    }

    /// The lease, with the database's clock, if any replica ever led.
    pub async fn lease(&self) -> Result<Option<Lease>, StoreError> {
        let engine = self.engine();
        on_db!(self, pool => {
            let now: i64 = sqlx::query(now_sql(engine)).fetch_one(pool).await?.col("now");
            let row = sqlx::query("SELECT holder, token, expires_at, renewed_at FROM leader_lease WHERE id = 1").fetch_optional(pool).await?;
            Ok(row.map(|row| Lease {
                holder: row.col("holder"),
                token: row.col("token"),
                expires_at_ms: row.col("expires_at"),
                renewed_at_ms: row.col("renewed_at"),
                now_ms: now,
            }))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::fence;

    crate::test_engines::both_engines! {
        async fn the_replicas_view_names_the_leader_once_per_url(store) {
            assert_eq!(store.claim_lease("https://a#1", "https://a", 60_000).await.unwrap(), Some(1));
            assert_eq!(store.claim_lease("https://b#1", "https://b", 60_000).await.unwrap(), None);
            // b restarted: a new process, the same replica.
            assert_eq!(store.claim_lease("https://b#2", "https://b", 60_000).await.unwrap(), None);
            let view = store.replicas().await.unwrap();
            assert_eq!(view.term, Some(1));
            let urls: Vec<(&str, bool)> = view.replicas.iter().map(|r| (r.url.as_str(), r.leads)).collect();
            assert_eq!(urls, [("https://a", true), ("https://b", false)]);
            assert!(view.replicas.iter().all(|r| r.seen_at_ms <= view.now_ms && view.now_ms - r.seen_at_ms < 60_000));
        }
    }

    crate::test_engines::both_engines! {
        async fn one_holder_at_a_time_and_a_stale_term_cannot_write(store) {
            assert_eq!(store.claim_lease("a", "https://a", 300).await.unwrap(), Some(1));
            assert_eq!(store.claim_lease("b", "https://b", 300).await.unwrap(), None, "a's lease runs");
            assert_eq!(store.claim_lease("a", "https://a", 300).await.unwrap(), Some(1), "a renews its term");
            let term_a = fence::Term { holder: "a".into(), token: 1 };
            // a's term writes while it holds the lease.
            let secret = |name: &str| vec![(name.to_string(), "sealed".to_string())];
            fence::scope(term_a.clone(), async { store.claim_cluster_secrets(&secret("s1"), 1).await.unwrap() }).await;
            // a stalls past its lease; b takes over with a new token.
            tokio::time::sleep(std::time::Duration::from_millis(400)).await;
            assert_eq!(store.claim_lease("b", "https://b", 300).await.unwrap(), Some(2));
            let lease = store.lease().await.unwrap().unwrap();
            assert_eq!((lease.holder.as_str(), lease.token), ("b", 2));
            // a resumes: its term's writes are refused, nothing is written.
            let stale = fence::scope(term_a, async { store.claim_cluster_secrets(&secret("s2"), 2).await }).await;
            assert!(matches!(stale, Err(crate::StoreError::Fenced(1))), "{stale:?}");
            assert_eq!(store.cluster_secrets().await.unwrap(), secret("s1"));
            // b's term writes; writes outside any term (the API's) are not
            // fenced.
            fence::scope(fence::Term { holder: "b".into(), token: 2 }, async { store.claim_cluster_secrets(&secret("s3"), 3).await.unwrap() }).await;
            store.claim_cluster_secrets(&secret("s4"), 4).await.unwrap();
            assert_eq!(store.cluster_secrets().await.unwrap().len(), 3);
            // b gives the lease up; a takes a new term at once.
            assert!(store.release_lease("b", 2).await.unwrap());
            assert_eq!(store.claim_lease("a", "https://a", 300).await.unwrap(), Some(3));
            // Both were seen; the holder's URL comes first.
            assert_eq!(store.control_planes(60_000).await.unwrap(), vec!["https://a".to_string(), "https://b".to_string()]);
            assert_eq!(store.claim_lease("b", "https://b", 300).await.unwrap(), None);
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            assert_eq!(store.control_planes(10).await.unwrap().len(), 0, "none seen in the last 10 ms");
        }
    }
}
