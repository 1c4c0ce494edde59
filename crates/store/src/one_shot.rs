//! `one_shot_values`: what a browser carries from one request to its next
//! (the dashboard's message after a form, a GitLab login under way), kept
//! in the database so that any control-plane replica can answer the next
//! request. Each value is taken out once.

use sqlx::Row;

use super::{Store, StoreError};

/// When a kind already holds its most values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WhenFull {
    /// The oldest goes (a message nobody came back for).
    DropOldest,
    /// The new value is refused (logins: a flood must not push out the
    /// logins of people mid-way).
    Refuse,
}

/// A kind's bounds.
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    /// A value older than this is gone.
    pub lifetime_ms: i64,
    pub max: i64,
    pub when_full: WhenFull,
}

impl Store {
    /// Puts `value` under (`kind`, `key`), replacing one there; false when
    /// the kind is full and refuses.
    pub async fn put_one_shot(&self, kind: &str, key: &str, value: &str, now_ms: i64, bounds: Bounds) -> Result<bool, StoreError> {
        on_db!(self, pool => {
            let mut tx = pool.begin_write().await?;
            sqlx::query("DELETE FROM one_shot_values WHERE kind = $1 AND created_at <= $2")
                .bind(kind).bind(now_ms - bounds.lifetime_ms).execute(&mut *tx).await?;
            let held: i64 = sqlx::query("SELECT COUNT(*) AS n FROM one_shot_values WHERE kind = $1 AND key <> $2")
                .bind(kind).bind(key).fetch_one(&mut *tx).await?.get("n");
            if held >= bounds.max {
                if bounds.when_full == WhenFull::Refuse {
                    tx.rollback().await?;
                    return Ok(false);
                }
                sqlx::query(
                    "DELETE FROM one_shot_values WHERE kind = $1 AND key IN \
                     (SELECT key FROM one_shot_values WHERE kind = $1 AND key <> $2 ORDER BY created_at LIMIT $3)",
                )
                .bind(kind).bind(key).bind(held - bounds.max + 1).execute(&mut *tx).await?;
            }
            sqlx::query(
                "INSERT INTO one_shot_values (kind, key, value, created_at) VALUES ($1, $2, $3, $4) \
                 ON CONFLICT (kind, key) DO UPDATE SET value = excluded.value, created_at = excluded.created_at",
            )
            .bind(kind).bind(key).bind(value).bind(now_ms).execute(&mut *tx).await?;
            tx.commit().await?;
            self.count_commit().await;
            Ok(true)
        })
    }

    /// Takes the value under (`kind`, `key`) out, if one younger than
    /// `lifetime_ms` is there; a second take finds nothing.
    pub async fn take_one_shot(&self, kind: &str, key: &str, now_ms: i64, lifetime_ms: i64) -> Result<Option<String>, StoreError> {
        on_db!(self, pool => {
            let mut tx = pool.begin_write().await?;
            let row = sqlx::query("SELECT value, created_at FROM one_shot_values WHERE kind = $1 AND key = $2")
                .bind(kind).bind(key).fetch_optional(&mut *tx).await?;
            let Some(row) = row else {
                tx.rollback().await?;
                return Ok(None);
            };
            sqlx::query("DELETE FROM one_shot_values WHERE kind = $1 AND key = $2").bind(kind).bind(key).execute(&mut *tx).await?;
            tx.commit().await?;
            self.count_commit().await;
            let created_at: i64 = row.get("created_at");
            Ok((created_at > now_ms - lifetime_ms).then(|| row.get("value")))
        })
    }

    /// Whether anything waits under (`kind`, `key`), without taking it (a
    /// read, no write: most pages have no message waiting).
    pub async fn has_one_shot(&self, kind: &str, key: &str) -> Result<bool, StoreError> {
        on_db!(self, pool => {
            let row = sqlx::query("SELECT 1 AS one FROM one_shot_values WHERE kind = $1 AND key = $2")
                .bind(kind).bind(key).fetch_optional(pool).await?;
            Ok(row.is_some())
        })
    }

    /// Drops the value under (`kind`, `key`), if any.
    pub async fn forget_one_shot(&self, kind: &str, key: &str) -> Result<(), StoreError> {
        on_db!(self, pool => {
            let mut tx = pool.begin_write().await?;
            sqlx::query("DELETE FROM one_shot_values WHERE kind = $1 AND key = $2").bind(kind).bind(key).execute(&mut *tx).await?;
            tx.commit().await?;
            self.count_commit().await;
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::{Bounds, WhenFull};

    const FLASH: Bounds = Bounds { lifetime_ms: 1_000, max: 2, when_full: WhenFull::DropOldest };
    const LOGIN: Bounds = Bounds { lifetime_ms: 1_000, max: 2, when_full: WhenFull::Refuse };

    crate::test_engines::both_engines! {
        async fn a_value_is_taken_once_and_not_too_late_and_each_kind_is_bounded(store) {
            assert!(store.put_one_shot("flash", "s1", "done", 0, FLASH).await.unwrap());
            assert!(store.has_one_shot("flash", "s1").await.unwrap());
            assert_eq!(store.take_one_shot("flash", "other", 1, 1_000).await.unwrap(), None);
            assert_eq!(store.take_one_shot("login", "s1", 1, 1_000).await.unwrap(), None, "kinds are apart");
            assert_eq!(store.take_one_shot("flash", "s1", 1, 1_000).await.unwrap().as_deref(), Some("done"));
            assert_eq!(store.take_one_shot("flash", "s1", 2, 1_000).await.unwrap(), None, "once");
            store.put_one_shot("flash", "s1", "late", 0, FLASH).await.unwrap();
            assert_eq!(store.take_one_shot("flash", "s1", 1_000, 1_000).await.unwrap(), None, "too late");
            // Full: a flash pushes the oldest out; a login is refused.
            for (key, at) in [("a", 10), ("b", 11), ("c", 12)] {
                assert!(store.put_one_shot("flash", key, key, at, FLASH).await.unwrap());
            }
            assert!(!store.has_one_shot("flash", "a").await.unwrap() && store.has_one_shot("flash", "c").await.unwrap());
            assert!(store.put_one_shot("login", "x", "1", 10, LOGIN).await.unwrap());
            assert!(store.put_one_shot("login", "y", "2", 11, LOGIN).await.unwrap());
            assert!(!store.put_one_shot("login", "z", "3", 12, LOGIN).await.unwrap());
            assert!(store.put_one_shot("login", "y", "again", 12, LOGIN).await.unwrap(), "replacing is no new value");
            // Expired ones make room.
            assert!(store.put_one_shot("login", "z", "3", 2_000, LOGIN).await.unwrap());
            store.forget_one_shot("login", "z").await.unwrap();
            assert_eq!(store.take_one_shot("login", "z", 2_001, 1_000).await.unwrap(), None);
        }
    }
}
