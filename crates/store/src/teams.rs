//! Teams, their members and roles, users' cluster roles, and deploy
//! tokens. What a role allows is the core's business; here a role is a
//! word, and the one rule kept in the same transaction as the change is
//! that a team always has an owner.

use crate::backend::Cols;
use sqlx::Row;

use super::{Store, StoreError};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TeamRow {
    pub id: String,
    pub name: String,
    pub created_at: i64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberRow {
    pub team_id: String,
    pub team_name: String,
    pub user_id: String,
    pub user_name: String,
    pub role: String,
    /// `manual`, or the login mapping that granted it.
    pub source: String,
    pub added_at: i64,
}

/// Why a membership change was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MemberRefusal {
    /// It would leave the team without an owner.
    LastOwner,
    NoSuchMember,
}

/// What a team still owns (its deletion is refused while it owns any).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TeamHoldings {
    pub apps: i64,
    pub services: i64,
    pub volumes: i64,
    pub destinations: i64,
}

/// What carries a team: a permission check asks for the team of one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owned {
    App,
    Service,
    Volume,
    Destination,
    /// A deployment, by id (its app's team).
    Deployment,
    /// A backup, verification or restore job, by id (its destination's team).
    BackupJob,
    /// A volume move, by id (its volume's team).
    VolumeMove,
    /// A task run, by id (its app's team).
    TaskRun,
    /// A team itself, by id or name.
    Team,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeployTokenRow {
    pub id: String,
    pub app: String,
    pub name: String,
    pub prefix: String,
    pub created_by: String,
    pub created_at: i64,
    pub expires_at: Option<i64>,
    pub last_used_at: Option<i64>,
    pub revoked_at: Option<i64>,
}

const DEPLOY_TOKEN_COLUMNS: &str = "id, app, name, prefix, created_by, created_at, expires_at, last_used_at, revoked_at";

fn deploy_token_from(row: &impl Cols) -> DeployTokenRow {
    DeployTokenRow {
        id: row.col("id"),
        app: row.col("app"),
        name: row.col("name"),
        prefix: row.col("prefix"),
        created_by: row.col("created_by"),
        created_at: row.col("created_at"),
        expires_at: row.col("expires_at"),
        last_used_at: row.col("last_used_at"),
        revoked_at: row.col("revoked_at"),
    }
}

fn team_from(row: &impl Cols) -> TeamRow {
    TeamRow { id: row.col("id"), name: row.col("name"), created_at: row.col("created_at") }
}

const MEMBER_SELECT: &str = "SELECT m.team_id, t.name AS team_name, m.user_id, u.name AS user_name, m.role, m.source, m.added_at \
     FROM team_members m JOIN teams t ON t.id = m.team_id JOIN users u ON u.id = m.user_id";

fn member_from(row: &impl Cols) -> MemberRow {
    MemberRow {
        team_id: row.col("team_id"),
        team_name: row.col("team_name"),
        user_id: row.col("user_id"),
        user_name: row.col("user_name"),
        role: row.col("role"),
        source: row.col("source"),
        added_at: row.col("added_at"),
    }
}

impl Store {
    pub async fn teams(&self) -> Result<Vec<TeamRow>, StoreError> {
        on_db!(self, pool => {
            let rows = sqlx::query("SELECT id, name, created_at FROM teams ORDER BY lower(name)").fetch_all(pool).await?;
            Ok(rows.iter().map(team_from).collect())
        })
    }

    /// The team of that name (ignoring ASCII case) or id.
    pub async fn team(&self, name_or_id: &str) -> Result<Option<TeamRow>, StoreError> {
        on_db!(self, pool => {
            let row = sqlx::query("SELECT id, name, created_at FROM teams WHERE id = $1 OR lower(name) = lower($1)")
                .bind(name_or_id)
                .fetch_optional(pool)
                .await?;
            Ok(row.as_ref().map(team_from))
        })
    }

    /// Creates a team with its first owner; `Ok(false)` when the name is
    /// taken.
    pub async fn insert_team(&self, team: &TeamRow, owner: &str) -> Result<bool, StoreError> {
        on_db!(self, pool => {
            let mut tx = pool.begin_write().await?;
            let taken = sqlx::query("SELECT 1 FROM teams WHERE lower(name) = lower($1) OR id = $2")
                .bind(&team.name)
                .bind(&team.id)
                .fetch_optional(&mut *tx)
                .await?
                .is_some();
            if taken {
                tx.rollback().await?;
                return Ok(false);
            }
            sqlx::query("INSERT INTO teams (id, name, created_at) VALUES ($1, $2, $3)")
                .bind(&team.id)
                .bind(&team.name)
                .bind(team.created_at)
                .execute(&mut *tx)
                .await?;
            sqlx::query("INSERT INTO team_members (team_id, user_id, role, source, added_at) VALUES ($1, $2, 'owner', 'manual', $3)")
                .bind(&team.id)
                .bind(owner)
                .bind(team.created_at)
                .execute(&mut *tx)
                .await?;
            tx.commit().await?;
            self.count_commit().await;
            Ok(true)
        })
    }

    /// What the team owns.
    pub async fn team_holdings(&self, team_id: &str) -> Result<TeamHoldings, StoreError> {
        on_db!(self, pool => {
            let row = sqlx::query(
                "SELECT (SELECT count(*) FROM apps WHERE team_id = $1) AS apps, \
                 (SELECT count(*) FROM services WHERE team_id = $1) AS services, \
                 (SELECT count(*) FROM volumes WHERE team_id = $1) AS volumes, \
                 (SELECT count(*) FROM backup_destinations WHERE team_id = $1) AS destinations",
            )
            .bind(team_id)
            .fetch_one(pool)
            .await?;
            Ok(TeamHoldings { apps: row.get("apps"), services: row.get("services"), volumes: row.get("volumes"), destinations: row.get("destinations") })
        })
    }

    /// Deletes a team that owns nothing; `Err` with what it owns
    /// otherwise, `Ok(false)` when there is no such team.
    pub async fn delete_team(&self, team_id: &str) -> Result<Result<bool, TeamHoldings>, StoreError> {
        let holdings = self.team_holdings(team_id).await?;
        if holdings != TeamHoldings::default() {
            return Ok(Err(holdings));
        }
        on_db!(self, pool => {
            let gone = sqlx::query("DELETE FROM teams WHERE id = $1").bind(team_id).execute(pool).await?.rows_affected();
            self.count_commit().await;
            Ok(Ok(gone > 0))
        })
    }

    pub async fn team_members(&self, team_id: &str) -> Result<Vec<MemberRow>, StoreError> {
        on_db!(self, pool => {
            let rows = sqlx::query(&format!("{MEMBER_SELECT} WHERE m.team_id = $1 ORDER BY lower(u.name)")).bind(team_id).fetch_all(pool).await?;
            Ok(rows.iter().map(member_from).collect())
        })
    }

    /// A user's teams and roles.
    pub async fn memberships(&self, user_id: &str) -> Result<Vec<MemberRow>, StoreError> {
        on_db!(self, pool => {
            let rows = sqlx::query(&format!("{MEMBER_SELECT} WHERE m.user_id = $1 ORDER BY lower(t.name)")).bind(user_id).fetch_all(pool).await?;
            Ok(rows.iter().map(member_from).collect())
        })
    }

    /// A user's role in one team.
    pub async fn member_role(&self, team_id: &str, user_id: &str) -> Result<Option<String>, StoreError> {
        on_db!(self, pool => {
            let row = sqlx::query("SELECT role FROM team_members WHERE team_id = $1 AND user_id = $2")
                .bind(team_id)
                .bind(user_id)
                .fetch_optional(pool)
                .await?;
            Ok(row.map(|r| r.get("role")))
        })
    }

    /// Adds a member or changes their role (and source). Refused when it
    /// would take the team's last owner away.
    pub async fn set_member(&self, team_id: &str, user_id: &str, role: &str, source: &str, now_ms: i64) -> Result<Result<(), MemberRefusal>, StoreError> {
        on_db!(self, pool => {
            let mut tx = pool.begin_write().await?;
            let owners: Vec<String> = sqlx::query("SELECT user_id FROM team_members WHERE team_id = $1 AND role = 'owner'")
                .bind(team_id)
                .fetch_all(&mut *tx)
                .await?
                .iter()
                .map(|r| r.get("user_id"))
                .collect();
            if role != "owner" && owners.len() == 1 && owners[0] == user_id {
                tx.rollback().await?;
                return Ok(Err(MemberRefusal::LastOwner));
            }
            sqlx::query(
                "INSERT INTO team_members (team_id, user_id, role, source, added_at) VALUES ($1, $2, $3, $4, $5) \
                 ON CONFLICT (team_id, user_id) DO UPDATE SET role = excluded.role, source = excluded.source",
            )
            .bind(team_id)
            .bind(user_id)
            .bind(role)
            .bind(source)
            .bind(now_ms)
            .execute(&mut *tx)
            .await?;
            tx.commit().await?;
            self.count_commit().await;
            Ok(Ok(()))
        })
    }

    /// Removes a member; refused for the team's last owner.
    pub async fn remove_member(&self, team_id: &str, user_id: &str) -> Result<Result<(), MemberRefusal>, StoreError> {
        on_db!(self, pool => {
            let mut tx = pool.begin_write().await?;
            let role: Option<String> = sqlx::query("SELECT role FROM team_members WHERE team_id = $1 AND user_id = $2")
                .bind(team_id)
                .bind(user_id)
                .fetch_optional(&mut *tx)
                .await?
                .map(|r| r.get("role"));
            let Some(role) = role else {
                tx.rollback().await?;
                return Ok(Err(MemberRefusal::NoSuchMember));
            };
            if role == "owner" {
                let owners: i64 = sqlx::query("SELECT count(*) AS n FROM team_members WHERE team_id = $1 AND role = 'owner'")
                    .bind(team_id)
                    .fetch_one(&mut *tx)
                    .await?
                    .get("n");
                if owners <= 1 {
                    tx.rollback().await?;
                    return Ok(Err(MemberRefusal::LastOwner));
                }
            }
            sqlx::query("DELETE FROM team_members WHERE team_id = $1 AND user_id = $2").bind(team_id).bind(user_id).execute(&mut *tx).await?;
            tx.commit().await?;
            self.count_commit().await;
            Ok(Ok(()))
        })
    }

    /// The teams whose only owner this user is.
    pub async fn teams_owned_only_by(&self, user_id: &str) -> Result<Vec<String>, StoreError> {
        on_db!(self, pool => {
            let rows = sqlx::query(
                "SELECT t.name FROM team_members m JOIN teams t ON t.id = m.team_id WHERE m.user_id = $1 AND m.role = 'owner' \
                 AND (SELECT count(*) FROM team_members o WHERE o.team_id = m.team_id AND o.role = 'owner') = 1 ORDER BY t.name",
            )
            .bind(user_id)
            .fetch_all(pool)
            .await?;
            Ok(rows.iter().map(|r| r.get("name")).collect())
        })
    }

    /// Sets a user's cluster role; false when there is no such user.
    pub async fn set_cluster_role(&self, user_id: &str, role: Option<&str>) -> Result<bool, StoreError> {
        on_db!(self, pool => {
            let changed = sqlx::query("UPDATE users SET cluster_role = $1 WHERE id = $2").bind(role).bind(user_id).execute(pool).await?.rows_affected();
            self.count_commit().await;
            Ok(changed > 0)
        })
    }

    /// The team that owns `name` (an app, service, volume or destination
    /// name, or a deployment's, job's, move's or run's id).
    pub async fn team_of(&self, owned: Owned, name: &str) -> Result<Option<String>, StoreError> {
        let sql = match owned {
            Owned::App => "SELECT team_id FROM apps WHERE name = $1",
            Owned::Service => "SELECT team_id FROM services WHERE name = $1",
            Owned::Volume => "SELECT team_id FROM volumes WHERE name = $1",
            Owned::Destination => "SELECT team_id FROM backup_destinations WHERE name = $1",
            Owned::Deployment => "SELECT a.team_id FROM deployments d JOIN apps a ON a.name = d.app WHERE d.id = $1",
            // A job is its target's team's (not its destination's): a team
            // that owns a destination does not own what others stored
            // there. A job of a target that is gone is the destination's.
            Owned::BackupJob => {
                "SELECT COALESCE((SELECT s.team_id FROM services s WHERE 'service/' || s.name = j.target), \
                 (SELECT v.team_id FROM volumes v WHERE 'volume/' || v.name = j.target), d.team_id) AS team_id \
                 FROM backup_jobs j JOIN backup_destinations d ON d.name = j.destination WHERE j.id = $1"
            }
            Owned::VolumeMove => "SELECT v.team_id FROM volume_moves m JOIN volumes v ON v.name = m.volume WHERE m.id = $1",
            Owned::TaskRun => "SELECT a.team_id FROM task_runs r JOIN apps a ON a.name = r.app WHERE r.id = $1",
            Owned::Team => "SELECT id AS team_id FROM teams WHERE id = $1 OR lower(name) = lower($1)",
        };
        on_db!(self, pool => {
            let row = sqlx::query(sql).bind(name).fetch_optional(pool).await?;
            Ok(row.map(|r| r.get("team_id")))
        })
    }

    pub async fn insert_deploy_token(&self, token: &DeployTokenRow, token_sha256: &str) -> Result<(), StoreError> {
        on_db!(self, pool => {
            sqlx::query(&format!("INSERT INTO deploy_tokens ({DEPLOY_TOKEN_COLUMNS}, token_sha256) VALUES ($1, $2, $3, $4, $5, $6, $7, NULL, NULL, $8)"))
                .bind(&token.id)
                .bind(&token.app)
                .bind(&token.name)
                .bind(&token.prefix)
                .bind(&token.created_by)
                .bind(token.created_at)
                .bind(token.expires_at)
                .bind(token_sha256)
                .execute(pool)
                .await?;
            self.count_commit().await;
            Ok(())
        })
    }

    /// The unrevoked deploy token with that digest, with its app's team.
    pub async fn deploy_token_by_digest(&self, token_sha256: &str) -> Result<Option<(DeployTokenRow, String)>, StoreError> {
        on_db!(self, pool => {
            let row = sqlx::query(
                "SELECT t.id, t.app, t.name, t.prefix, t.created_by, t.created_at, t.expires_at, t.last_used_at, t.revoked_at, a.team_id \
                 FROM deploy_tokens t JOIN apps a ON a.name = t.app WHERE t.token_sha256 = $1 AND t.revoked_at IS NULL",
            )
            .bind(token_sha256)
            .fetch_optional(pool)
            .await?;
            Ok(row.map(|row| (deploy_token_from(&row), row.get("team_id"))))
        })
    }

    /// An app's deploy tokens, newest first, revoked ones included.
    pub async fn deploy_tokens_of(&self, app: &str) -> Result<Vec<DeployTokenRow>, StoreError> {
        on_db!(self, pool => {
            let rows = sqlx::query(&format!("SELECT {DEPLOY_TOKEN_COLUMNS} FROM deploy_tokens WHERE app = $1 ORDER BY created_at DESC, id"))
                .bind(app)
                .fetch_all(pool)
                .await?;
            Ok(rows.iter().map(deploy_token_from).collect())
        })
    }

    /// Revokes one of an app's deploy tokens; `None` when it has none of
    /// that id.
    pub async fn revoke_deploy_token(&self, app: &str, id: &str, now_ms: i64) -> Result<Option<DeployTokenRow>, StoreError> {
        on_db!(self, pool => {
            let mut tx = pool.begin_write().await?;
            sqlx::query("UPDATE deploy_tokens SET revoked_at = $1 WHERE id = $2 AND app = $3 AND revoked_at IS NULL")
                .bind(now_ms)
                .bind(id)
                .bind(app)
                .execute(&mut *tx)
                .await?;
            let row = sqlx::query(&format!("SELECT {DEPLOY_TOKEN_COLUMNS} FROM deploy_tokens WHERE id = $1 AND app = $2"))
                .bind(id)
                .bind(app)
                .fetch_optional(&mut *tx)
                .await?;
            tx.commit().await?;
            self.count_commit().await;
            Ok(row.as_ref().map(deploy_token_from))
        })
    }

    /// Records a use of a deploy token, at most once per `granularity_ms`.
    pub async fn touch_deploy_token(&self, id: &str, now_ms: i64, granularity_ms: i64) -> Result<(), StoreError> {
        on_db!(self, pool => {
            let changed = sqlx::query("UPDATE deploy_tokens SET last_used_at = $1 WHERE id = $2 AND (last_used_at IS NULL OR last_used_at <= $3)")
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
}

/// One login mapping: members of `external_group` at `provider` get
/// `role` in `team_id`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MappingRow {
    pub provider: String,
    pub external_group: String,
    pub team_id: String,
    pub role: String,
}

/// Every mapping, in the order their revision is computed over.
const MAPPINGS_IN_ORDER: &str = "SELECT provider, external_group, team_id, role FROM team_mappings ORDER BY provider, external_group, team_id";

fn mapping_from(r: &impl Cols) -> MappingRow {
    MappingRow { provider: r.col("provider"), external_group: r.col("external_group"), team_id: r.col("team_id"), role: r.col("role") }
}

/// The revision of a list of mappings as [`Store::team_mappings`] reads
/// it: a short hash of its rows, in their order. A writer that read the
/// list at one revision replaces it only while it is still at that one
/// ([`Store::replace_team_mappings`]).
pub fn mappings_revision(rows: &[MappingRow]) -> String {
    use sha2::{Digest, Sha256};
    let mut hasher = Sha256::new();
    for row in rows {
        // Each field with its length, so no two lists hash alike.
        for field in [&row.provider, &row.external_group, &row.team_id, &row.role] {
            hasher.update(field.len().to_le_bytes());
            hasher.update(field.as_bytes());
        }
    }
    hasher.finalize().iter().take(8).map(|b| format!("{b:02x}")).collect()
}

impl Store {
    pub async fn team_mappings(&self) -> Result<Vec<MappingRow>, StoreError> {
        on_db!(self, pool => {
            let rows = sqlx::query(MAPPINGS_IN_ORDER).fetch_all(pool).await?;
            Ok(rows.iter().map(mapping_from).collect())
        })
    }

    /// Replaces every mapping with `mappings`; with `expected`, only if
    /// the list is still at that revision ([`mappings_revision`]), checked
    /// under the write lock. Whether it was replaced.
    pub async fn replace_team_mappings(&self, mappings: &[MappingRow], expected: Option<&str>) -> Result<bool, StoreError> {
        on_db!(self, pool => {
            let mut tx = pool.begin_write().await?;
            if let Some(expected) = expected {
                let rows = sqlx::query(MAPPINGS_IN_ORDER).fetch_all(&mut *tx).await?;
                let current: Vec<MappingRow> = rows.iter().map(mapping_from).collect();
                if mappings_revision(&current) != expected {
                    return Ok(false);
                }
            }
            sqlx::query("DELETE FROM team_mappings").execute(&mut *tx).await?;
            for m in mappings {
                sqlx::query("INSERT INTO team_mappings (provider, external_group, team_id, role) VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING")
                    .bind(&m.provider)
                    .bind(&m.external_group)
                    .bind(&m.team_id)
                    .bind(&m.role)
                    .execute(&mut *tx)
                    .await?;
            }
            // Memberships granted by a mapping that is gone go with it
            // (a team's last owner stays): otherwise removing a host's last
            // mapping would leave them for good, since logins and the
            // periodic check only look at hosts that have mappings.
            sqlx::query(
                "DELETE FROM team_members WHERE source <> 'manual' \
                 AND NOT EXISTS (SELECT 1 FROM team_mappings m WHERE m.team_id = team_members.team_id AND m.provider || ':' || m.external_group = team_members.source) \
                 AND NOT (role = 'owner' AND (SELECT count(*) FROM team_members o WHERE o.team_id = team_members.team_id AND o.role = 'owner') <= 1)",
            )
            .execute(&mut *tx)
            .await?;
            tx.commit().await?;
            self.count_commit().await;
            Ok(true)
        })
    }

    /// Makes a user's memberships granted by `provider`'s mappings exactly
    /// `grants` (team id, role, source): new ones are added, changed ones
    /// updated, ones no longer granted removed. Memberships granted by
    /// hand are left alone, and a team's last owner is never removed.
    /// Returns the teams whose membership was removed.
    pub async fn sync_mapped_memberships(&self, user_id: &str, provider: &str, grants: &[(String, String, String)], now_ms: i64) -> Result<Vec<String>, StoreError> {
        let prefix = format!("{provider}:");
        on_db!(self, pool => {
            let mut tx = pool.begin_write().await?;
            let held: Vec<(String, String, String)> = sqlx::query("SELECT team_id, role, source FROM team_members WHERE user_id = $1")
                .bind(user_id)
                .fetch_all(&mut *tx)
                .await?
                .iter()
                .map(|r| (r.get("team_id"), r.get("role"), r.get("source")))
                .collect();
            let mut removed = Vec::new();
            for (team, role, source) in &held {
                if !source.starts_with(&prefix) || grants.iter().any(|(t, _, _)| t == team) {
                    continue;
                }
                if role == "owner" {
                    let owners: i64 = sqlx::query("SELECT count(*) AS n FROM team_members WHERE team_id = $1 AND role = 'owner'").bind(team).fetch_one(&mut *tx).await?.get("n");
                    if owners <= 1 {
                        continue;
                    }
                }
                sqlx::query("DELETE FROM team_members WHERE team_id = $1 AND user_id = $2").bind(team).bind(user_id).execute(&mut *tx).await?;
                removed.push(team.clone());
            }
            for (team, role, source) in grants {
                let manual = held.iter().any(|(t, _, s)| t == team && !s.starts_with(&prefix));
                if manual {
                    continue;
                }
                // A mapped owner moved to a lower role stays owner while
                // the team has no other: a team always keeps an owner.
                let demoted = role != "owner" && held.iter().any(|(t, r, _)| t == team && r == "owner");
                if demoted {
                    let owners: i64 = sqlx::query("SELECT count(*) AS n FROM team_members WHERE team_id = $1 AND role = 'owner'").bind(team).fetch_one(&mut *tx).await?.get("n");
                    if owners <= 1 {
                        continue;
                    }
                }
                sqlx::query(
                    "INSERT INTO team_members (team_id, user_id, role, source, added_at) VALUES ($1, $2, $3, $4, $5) \
                     ON CONFLICT (team_id, user_id) DO UPDATE SET role = excluded.role, source = excluded.source",
                )
                .bind(team)
                .bind(user_id)
                .bind(role)
                .bind(source)
                .bind(now_ms)
                .execute(&mut *tx)
                .await?;
            }
            tx.commit().await?;
            self.count_commit().await;
            Ok(removed)
        })
    }
}

#[cfg(test)]
mod tests {
    use crate::test_engines::Arg;
    use crate::{DestinationRow, Owned};

    crate::test_engines::both_engines! {
        async fn a_backup_is_its_targets_teams_not_its_destinations(store) {
            let destination = |name: &str, team: &str| DestinationRow {
                name: name.into(),
                kind: "path".into(),
                base_url: format!("/srv/{name}"),
                region: None,
                access_key_id: None,
                secret_sealed: None,
                password_sealed: "sealed".into(),
                keep_daily: 7,
                keep_weekly: 4,
                keep_monthly: 6,
                created_at: 1,
                team_id: team.into(),
            };
            assert!(store.insert_destination(&destination("theirs", "team_b")).await.unwrap());
            store.test_execute("INSERT INTO volumes (name, created_at, team_id) VALUES ('data', 1, 'team_a')", &[]).await;
            for (id, target) in [("bj_1", "volume/data"), ("bj_2", "volume/gone")] {
                store
                    .test_execute(
                        "INSERT INTO backup_jobs (id, kind, target, destination, node_id, state, trigger, created_at, deadline) VALUES ($1, 'backup', $2, 'theirs', 'n', 'succeeded', 'manual', 1, 2)",
                        &[Arg::Text(id), Arg::Text(target)],
                    )
                    .await;
            }
            assert_eq!(store.team_of(Owned::BackupJob, "bj_1").await.unwrap().as_deref(), Some("team_a"), "the data's team");
            assert_eq!(store.team_of(Owned::BackupJob, "bj_2").await.unwrap().as_deref(), Some("team_b"), "a target gone: the destination's");
        }

        async fn a_mapping_never_leaves_a_team_without_an_owner(store) {
            store.test_execute("INSERT INTO teams (id, name, created_at) VALUES ('t1', 'acme', 1)", &[]).await;
            for user in ["u1", "u2"] {
                store.test_execute("INSERT INTO users (id, name, created_at) VALUES ($1, $1, 1)", &[Arg::Text(user)]).await;
            }
            let grant = |role: &str| vec![("t1".to_string(), role.to_string(), "gitea:acme".to_string())];
            store.sync_mapped_memberships("u1", "gitea", &grant("owner"), 1).await.unwrap();
            // The only owner, moved down or out by the host's groups: kept.
            store.sync_mapped_memberships("u1", "gitea", &grant("viewer"), 2).await.unwrap();
            assert_eq!(store.team_members("t1").await.unwrap()[0].role, "owner");
            assert!(store.sync_mapped_memberships("u1", "gitea", &[], 3).await.unwrap().is_empty());
            assert_eq!(store.team_members("t1").await.unwrap().len(), 1);
            // With another owner, the mapping has its way.
            store.sync_mapped_memberships("u2", "gitea", &grant("owner"), 4).await.unwrap();
            store.sync_mapped_memberships("u1", "gitea", &grant("viewer"), 5).await.unwrap();
            let members = store.team_members("t1").await.unwrap();
            let role = |user: &str| members.iter().find(|m| m.user_id == user).map(|m| m.role.clone());
            assert_eq!((role("u1").as_deref(), role("u2").as_deref()), (Some("viewer"), Some("owner")));
            assert_eq!(store.sync_mapped_memberships("u1", "gitea", &[], 6).await.unwrap(), vec!["t1".to_string()]);

            // The host's last mapping removed: what it granted goes, but
            // not the team's only owner.
            let mapping = |group: &str, role: &str| crate::MappingRow { provider: "gitea".into(), external_group: group.into(), team_id: "t1".into(), role: role.into() };
            store.replace_team_mappings(&[mapping("acme", "owner"), mapping("ops", "viewer")], None).await.unwrap();
            store.sync_mapped_memberships("u1", "gitea", &[("t1".into(), "viewer".into(), "gitea:ops".into())], 7).await.unwrap();
            // A writer that read an older list changes nothing.
            let read = crate::mappings_revision(&store.team_mappings().await.unwrap());
            assert!(!store.replace_team_mappings(&[mapping("ops", "owner")], Some("0123456789abcdef")).await.unwrap());
            assert_eq!(crate::mappings_revision(&store.team_mappings().await.unwrap()), read, "the stale write changed nothing");
            assert!(store.replace_team_mappings(&[mapping("acme", "owner")], Some(&read)).await.unwrap());
            assert_ne!(crate::mappings_revision(&store.team_mappings().await.unwrap()), read);
            let members = store.team_members("t1").await.unwrap();
            assert_eq!(members.iter().map(|m| m.user_id.as_str()).collect::<Vec<_>>(), vec!["u2"], "u1's mapping is gone, and so is u1");
            store.replace_team_mappings(&[], None).await.unwrap();
            assert_eq!(store.team_members("t1").await.unwrap().len(), 1, "the only owner stays");
        }
    }
}
