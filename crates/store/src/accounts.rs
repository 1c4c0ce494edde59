//! Users, browser sessions and personal API tokens. Passwords arrive here
//! already hashed (argon2id) and session ids and tokens as SHA-256
//! digests: the store never sees a secret in clear.

use crate::backend::Cols;
use sqlx::Row;

use super::{Store, StoreError};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserRow {
    pub id: String,
    pub name: String,
    /// argon2id PHC string; `None`: no password login.
    pub password_hash: Option<String>,
    pub created_at: i64,
    pub disabled_at: Option<i64>,
    /// `cluster-admin`, `cluster-viewer` or `None`.
    pub cluster_role: Option<String>,
}

fn user_from_row(row: &impl Cols) -> UserRow {
    UserRow {
        id: row.col("id"),
        name: row.col("name"),
        password_hash: row.col("password_hash"),
        created_at: row.col("created_at"),
        disabled_at: row.col("disabled_at"),
        cluster_role: row.col("cluster_role"),
    }
}

const USER_COLUMNS: &str = "id, name, password_hash, created_at, disabled_at, cluster_role";

/// A live session with its user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionRow {
    pub id_sha256: String,
    pub user: UserRow,
    pub csrf_token: String,
    pub created_at: i64,
    pub last_seen_at: i64,
    pub expires_at: i64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiTokenRow {
    pub id: String,
    pub user_id: String,
    pub name: String,
    pub prefix: String,
    pub created_at: i64,
    pub last_used_at: Option<i64>,
    pub revoked_at: Option<i64>,
    /// The most this token may do (a team or cluster role); `None`: all
    /// its user may.
    pub role: Option<String>,
    /// The only apps it reaches; `None`: all its user reaches.
    pub apps: Option<Vec<String>>,
    pub expires_at: Option<i64>,
}

fn token_from_row(row: &impl Cols) -> ApiTokenRow {
    ApiTokenRow {
        id: row.col("id"),
        user_id: row.col("user_id"),
        name: row.col("name"),
        prefix: row.col("prefix"),
        created_at: row.col("created_at"),
        last_used_at: row.col("last_used_at"),
        revoked_at: row.col("revoked_at"),
        role: row.col("role"),
        apps: row.col::<Option<String>>("apps").and_then(|apps| serde_json::from_str(&apps).ok()),
        expires_at: row.col("expires_at"),
    }
}

const TOKEN_COLUMNS: &str = "id, user_id, name, prefix, created_at, last_used_at, revoked_at, role, apps, expires_at";

/// Whether a unique constraint refused the write.
fn is_unique_violation(err: &sqlx::Error) -> bool {
    matches!(err, sqlx::Error::Database(db) if db.is_unique_violation())
}

impl Store {
    /// Inserts a user; `Ok(false)` when the name (ignoring ASCII case) is
    /// taken.
    pub async fn insert_user(&self, user: &UserRow) -> Result<bool, StoreError> {
        on_db!(self, pool => {
            let result = sqlx::query("INSERT INTO users (id, name, password_hash, created_at, disabled_at, cluster_role) VALUES ($1, $2, $3, $4, $5, $6)")
                .bind(&user.id)
                .bind(&user.name)
                .bind(&user.password_hash)
                .bind(user.created_at)
                .bind(user.disabled_at)
                .bind(&user.cluster_role)
                .execute(pool)
                .await;
            match result {
                Ok(_) => {
                    self.count_commit().await;
                    Ok(true)
                }
                Err(err) if is_unique_violation(&err) => Ok(false),
                Err(err) => Err(err.into()),
            }
        })
    }

    /// The user of that name, ignoring ASCII case.
    pub async fn user_by_name(&self, name: &str) -> Result<Option<UserRow>, StoreError> {
        on_db!(self, pool => {
            let row = sqlx::query(&format!("SELECT {USER_COLUMNS} FROM users WHERE lower(name) = lower($1)"))
                .bind(name)
                .fetch_optional(pool)
                .await?;
            Ok(row.as_ref().map(user_from_row))
        })
    }

    pub async fn user_by_id(&self, id: &str) -> Result<Option<UserRow>, StoreError> {
        on_db!(self, pool => {
            let row = sqlx::query(&format!("SELECT {USER_COLUMNS} FROM users WHERE id = $1")).bind(id).fetch_optional(pool).await?;
            Ok(row.as_ref().map(user_from_row))
        })
    }

    pub async fn users(&self) -> Result<Vec<UserRow>, StoreError> {
        on_db!(self, pool => {
            let rows = sqlx::query(&format!("SELECT {USER_COLUMNS} FROM users ORDER BY lower(name)")).fetch_all(pool).await?;
            Ok(rows.iter().map(user_from_row).collect())
        })
    }

    /// Replaces a user's password hash (`None`: no password login) and ends
    /// their sessions. Returns whether the user exists.
    pub async fn set_password_hash(&self, user_id: &str, hash: Option<&str>) -> Result<bool, StoreError> {
        on_db!(self, pool => {
            let mut tx = pool.begin_write().await?;
            let changed = sqlx::query("UPDATE users SET password_hash = $1 WHERE id = $2").bind(hash).bind(user_id).execute(&mut *tx).await?.rows_affected();
            sqlx::query("DELETE FROM sessions WHERE user_id = $1").bind(user_id).execute(&mut *tx).await?;
            tx.commit().await?;
            self.count_commit().await;
            Ok(changed > 0)
        })
    }

    /// Disables a user: their sessions are deleted and their tokens stop
    /// working (they are checked against `disabled_at`). Returns the user
    /// as it was, `None` when there is no such user.
    pub async fn disable_user(&self, user_id: &str, now_ms: i64) -> Result<Option<UserRow>, StoreError> {
        on_db!(self, pool => {
            let mut tx = pool.begin_write().await?;
            let row = sqlx::query(&format!("SELECT {USER_COLUMNS} FROM users WHERE id = $1")).bind(user_id).fetch_optional(&mut *tx).await?;
            sqlx::query("UPDATE users SET disabled_at = $1 WHERE id = $2 AND disabled_at IS NULL").bind(now_ms).bind(user_id).execute(&mut *tx).await?;
            sqlx::query("DELETE FROM sessions WHERE user_id = $1").bind(user_id).execute(&mut *tx).await?;
            sqlx::query("UPDATE api_tokens SET revoked_at = $1 WHERE user_id = $2 AND revoked_at IS NULL").bind(now_ms).bind(user_id).execute(&mut *tx).await?;
            tx.commit().await?;
            self.count_commit().await;
            Ok(row.as_ref().map(user_from_row))
        })
    }

    pub async fn insert_session(&self, session: &SessionRow) -> Result<(), StoreError> {
        on_db!(self, pool => {
            sqlx::query(
                "INSERT INTO sessions (id_sha256, user_id, csrf_token, created_at, last_seen_at, expires_at) VALUES ($1, $2, $3, $4, $5, $6)",
            )
            .bind(&session.id_sha256)
            .bind(&session.user.id)
            .bind(&session.csrf_token)
            .bind(session.created_at)
            .bind(session.last_seen_at)
            .bind(session.expires_at)
            .execute(pool)
            .await?;
            self.count_commit().await;
            Ok(())
        })
    }

    /// The session with that digest, whatever its expiry, with its user.
    pub async fn session(&self, id_sha256: &str) -> Result<Option<SessionRow>, StoreError> {
        on_db!(self, pool => {
            let row = sqlx::query(
                "SELECT s.id_sha256, s.csrf_token, s.created_at AS s_created_at, s.last_seen_at, s.expires_at, \
             u.id, u.name, u.password_hash, u.created_at, u.disabled_at, u.cluster_role \
             FROM sessions s JOIN users u ON u.id = s.user_id WHERE s.id_sha256 = $1",
            )
            .bind(id_sha256)
            .fetch_optional(pool)
            .await?;
            Ok(row.map(|row| SessionRow {
                id_sha256: row.get("id_sha256"),
                csrf_token: row.get("csrf_token"),
                created_at: row.get("s_created_at"),
                last_seen_at: row.get("last_seen_at"),
                expires_at: row.get("expires_at"),
                user: user_from_row(&row),
            }))
        })
    }

    /// Moves a session's idle clock to `now_ms`.
    pub async fn touch_session(&self, id_sha256: &str, now_ms: i64) -> Result<(), StoreError> {
        on_db!(self, pool => {
            sqlx::query("UPDATE sessions SET last_seen_at = $1 WHERE id_sha256 = $2 AND last_seen_at < $1")
                .bind(now_ms)
                .bind(id_sha256)
                .execute(pool)
                .await?;
            self.count_commit().await;
            Ok(())
        })
    }

    /// Ends a session; returns whether it existed.
    pub async fn delete_session(&self, id_sha256: &str) -> Result<bool, StoreError> {
        on_db!(self, pool => {
            let gone = sqlx::query("DELETE FROM sessions WHERE id_sha256 = $1").bind(id_sha256).execute(pool).await?.rows_affected();
            self.count_commit().await;
            Ok(gone > 0)
        })
    }

    /// Deletes sessions past their absolute end or idle since before
    /// `idle_cutoff_ms`; returns how many.
    pub async fn delete_expired_sessions(&self, now_ms: i64, idle_cutoff_ms: i64) -> Result<u64, StoreError> {
        on_db!(self, pool => {
            let gone = sqlx::query("DELETE FROM sessions WHERE expires_at <= $1 OR last_seen_at <= $2")
                .bind(now_ms)
                .bind(idle_cutoff_ms)
                .execute(pool)
                .await?
                .rows_affected();
            self.count_commit().await;
            Ok(gone)
        })
    }

    pub async fn insert_api_token(&self, token: &ApiTokenRow, token_sha256: &str) -> Result<(), StoreError> {
        on_db!(self, pool => {
            sqlx::query(
                "INSERT INTO api_tokens (id, user_id, name, token_sha256, prefix, created_at, last_used_at, revoked_at, role, apps, expires_at) \
             VALUES ($1, $2, $3, $4, $5, $6, NULL, NULL, $7, $8, $9)",
            )
            .bind(&token.id)
            .bind(&token.user_id)
            .bind(&token.name)
            .bind(token_sha256)
            .bind(&token.prefix)
            .bind(token.created_at)
            .bind(&token.role)
            .bind(token.apps.as_ref().map(|apps| serde_json::to_string(apps).expect("a list of names")))
            .bind(token.expires_at)
            .execute(pool)
            .await?;
            self.count_commit().await;
            Ok(())
        })
    }

    /// The unrevoked token with that digest and its user.
    pub async fn api_token_by_digest(&self, token_sha256: &str) -> Result<Option<(ApiTokenRow, UserRow)>, StoreError> {
        on_db!(self, pool => {
            let row = sqlx::query(
                "SELECT t.id AS t_id, t.user_id, t.name AS t_name, t.prefix, t.created_at AS t_created_at, t.last_used_at, t.revoked_at, t.role AS t_role, t.apps AS t_apps, t.expires_at AS t_expires_at, \
             u.id, u.name, u.password_hash, u.created_at, u.disabled_at, u.cluster_role \
             FROM api_tokens t JOIN users u ON u.id = t.user_id WHERE t.token_sha256 = $1 AND t.revoked_at IS NULL",
            )
            .bind(token_sha256)
            .fetch_optional(pool)
            .await?;
            Ok(row.map(|row| {
                let token = ApiTokenRow {
                    id: row.get("t_id"),
                    user_id: row.get("user_id"),
                    name: row.get("t_name"),
                    prefix: row.get("prefix"),
                    created_at: row.get("t_created_at"),
                    last_used_at: row.get("last_used_at"),
                    revoked_at: row.get("revoked_at"),
                    role: row.get("t_role"),
                    apps: row.get::<Option<String>, _>("t_apps").and_then(|apps| serde_json::from_str(&apps).ok()),
                    expires_at: row.get("t_expires_at"),
                };
                (token, user_from_row(&row))
            }))
        })
    }

    /// Records a use of the token, at most once per `granularity_ms`.
    pub async fn touch_api_token(&self, id: &str, now_ms: i64, granularity_ms: i64) -> Result<(), StoreError> {
        on_db!(self, pool => {
            let changed = sqlx::query("UPDATE api_tokens SET last_used_at = $1 WHERE id = $2 AND (last_used_at IS NULL OR last_used_at <= $3)")
                .bind(now_ms)
                .bind(id)
                .bind(now_ms - granularity_ms)
                .execute(pool)
                .await?
                .rows_affected();
            if changed > 0 {
                self.count_commit().await;
            }
            Ok(())
        })
    }

    /// A user's tokens, newest first, revoked ones included.
    pub async fn api_tokens_of(&self, user_id: &str) -> Result<Vec<ApiTokenRow>, StoreError> {
        on_db!(self, pool => {
            let rows = sqlx::query(&format!("SELECT {TOKEN_COLUMNS} FROM api_tokens WHERE user_id = $1 ORDER BY created_at DESC, id"))
                .bind(user_id)
                .fetch_all(pool)
                .await?;
            Ok(rows.iter().map(token_from_row).collect())
        })
    }

    /// Revokes one of a user's tokens; `None` when the user has no token
    /// with that id. Revoking twice keeps the first time.
    pub async fn revoke_api_token(&self, user_id: &str, id: &str, now_ms: i64) -> Result<Option<ApiTokenRow>, StoreError> {
        on_db!(self, pool => {
            let mut tx = pool.begin_write().await?;
            sqlx::query("UPDATE api_tokens SET revoked_at = $1 WHERE id = $2 AND user_id = $3 AND revoked_at IS NULL")
                .bind(now_ms)
                .bind(id)
                .bind(user_id)
                .execute(&mut *tx)
                .await?;
            let row = sqlx::query(&format!("SELECT {TOKEN_COLUMNS} FROM api_tokens WHERE id = $1 AND user_id = $2"))
                .bind(id)
                .bind(user_id)
                .fetch_optional(&mut *tx)
                .await?;
            tx.commit().await?;
            self.count_commit().await;
            Ok(row.as_ref().map(token_from_row))
        })
    }

    /// Stores the login limiter's changes (a key's window, or its removal)
    /// in one transaction, and deletes the windows that started at or
    /// before `over_at_or_before_ms` (they are over).
    pub async fn save_login_attempts(&self, changes: &[crate::login_attempts::Change], over_at_or_before_ms: i64) -> Result<(), StoreError> {
        on_db!(self, pool => {
            let mut tx = pool.begin_write().await?;
            for change in changes {
                match change.window {
                    Some(window) => {
                        sqlx::query(
                            "INSERT INTO login_attempts (kind, key, window_start, attempts) VALUES ($1, $2, $3, $4) \
                         ON CONFLICT (kind, key) DO UPDATE SET window_start = excluded.window_start, attempts = excluded.attempts",
                        )
                        .bind(change.kind.as_str())
                        .bind(&change.key)
                        .bind(window.start_ms)
                        .bind(i64::from(window.attempts))
                        .execute(&mut *tx)
                        .await?;
                    }
                    None => {
                        sqlx::query("DELETE FROM login_attempts WHERE kind = $1 AND key = $2")
                            .bind(change.kind.as_str())
                            .bind(&change.key)
                            .execute(&mut *tx)
                            .await?;
                    }
                }
            }
            sqlx::query("DELETE FROM login_attempts WHERE window_start <= $1").bind(over_at_or_before_ms).execute(&mut *tx).await?;
            tx.commit().await?;
            self.count_commit().await;
            Ok(())
        })
    }

    /// The stored windows of these keys (those the store has).
    pub async fn login_windows(&self, keys: &[(crate::login_attempts::Kind, String)]) -> Result<Vec<crate::login_attempts::Change>, StoreError> {
        on_db!(self, pool => {
            use crate::login_attempts::{Change, Window};
            let mut found = Vec::new();
            for (kind, key) in keys {
                let row = sqlx::query("SELECT window_start, attempts FROM login_attempts WHERE kind = $1 AND key = $2")
                    .bind(kind.as_str())
                    .bind(key)
                    .fetch_optional(pool)
                    .await?;
                if let Some(r) = row {
                    let Ok(attempts) = u32::try_from(r.get::<i64, _>("attempts")) else { continue };
                    found.push(Change { kind: *kind, key: key.clone(), window: Some(Window { start_ms: r.get("window_start"), attempts }) });
                }
            }
            Ok(found)
        })
    }

    /// The stored login windows that started after `since_ms`.
    pub async fn login_attempts(&self, since_ms: i64) -> Result<Vec<crate::login_attempts::Change>, StoreError> {
        on_db!(self, pool => {
            use crate::login_attempts::{Change, Kind, Window};
            let rows = sqlx::query("SELECT kind, key, window_start, attempts FROM login_attempts WHERE window_start > $1")
                .bind(since_ms)
                .fetch_all(pool)
                .await?;
            Ok(rows
                .iter()
                .filter_map(|r| {
                    let kind = Kind::parse(r.get::<String, _>("kind").as_str())?;
                    let attempts = u32::try_from(r.get::<i64, _>("attempts")).ok()?;
                    Some(Change { kind, key: r.get("key"), window: Some(Window { start_ms: r.get("window_start"), attempts }) })
                })
                .collect())
        })
    }
}
