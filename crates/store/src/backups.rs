//! Backups: destinations (where restic repositories live; secrets arrive
//! sealed), per-target plans, and one row per backup, verification or
//! restore job, queued with its command in one transaction.

use crate::backend::Cols;
use sqlx::Row;

use super::commands::CommandsTx;
use super::{NewCommand, Store, StoreError};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DestinationRow {
    pub name: String,
    /// `s3` or `path`.
    pub kind: String,
    /// The repositories are `<base_url>/data` and `<base_url>/control-plane`.
    pub base_url: String,
    pub region: Option<String>,
    pub access_key_id: Option<String>,
    pub secret_sealed: Option<String>,
    pub password_sealed: String,
    pub keep_daily: i64,
    pub keep_weekly: i64,
    pub keep_monthly: i64,
    pub created_at: i64,
    /// The team that owns it.
    pub team_id: String,
}

const DESTINATION_COLUMNS: &str =
    "name, kind, base_url, region, access_key_id, secret_sealed, password_sealed, keep_daily, keep_weekly, keep_monthly, created_at, team_id";

fn destination_from_row(row: &impl Cols) -> DestinationRow {
    DestinationRow {
        name: row.col("name"),
        kind: row.col("kind"),
        base_url: row.col("base_url"),
        region: row.col("region"),
        access_key_id: row.col("access_key_id"),
        secret_sealed: row.col("secret_sealed"),
        password_sealed: row.col("password_sealed"),
        keep_daily: row.col("keep_daily"),
        keep_weekly: row.col("keep_weekly"),
        keep_monthly: row.col("keep_monthly"),
        created_at: row.col("created_at"),
        team_id: row.col("team_id"),
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanRow {
    /// `service/<name>` or `volume/<name>`.
    pub target: String,
    pub destination: Option<String>,
    pub schedule: Option<String>,
    pub verify_schedule: Option<String>,
    pub pause: bool,
    pub enabled: bool,
    pub updated_at: i64,
}

fn plan_from_row(row: &impl Cols) -> PlanRow {
    PlanRow {
        target: row.col("target"),
        destination: row.col("destination"),
        schedule: row.col("schedule"),
        verify_schedule: row.col("verify_schedule"),
        pause: row.col::<i64>("pause") != 0,
        enabled: row.col::<i64>("enabled") != 0,
        updated_at: row.col("updated_at"),
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct BackupJobRow {
    pub id: String,
    /// `backup`, `verify` or `restore`.
    pub kind: String,
    pub target: String,
    pub destination: String,
    pub node_id: String,
    /// `queued`, `running`, `succeeded`, `failed` or `cancelled`.
    pub state: String,
    /// `schedule`, `manual` or `retry`.
    pub trigger: String,
    pub attempt: i64,
    /// A verification's or restore's backup job.
    pub of_job: Option<String>,
    pub snapshot: Option<String>,
    pub files: Option<i64>,
    pub bytes: Option<i64>,
    pub added_bytes: Option<i64>,
    pub duration_ms: Option<i64>,
    /// JSON object: rows per table, or keys.
    pub counts: Option<String>,
    pub detail: Option<String>,
    pub message: Option<String>,
    pub pruned: Option<bool>,
    pub verify_state: Option<String>,
    pub verify_job: Option<String>,
    pub verified_at: Option<i64>,
    pub verify_detail: Option<String>,
    /// A restore into a new service: its name.
    pub restore_to: Option<String>,
    pub kept_volume: Option<String>,
    pub kept_state: Option<String>,
    pub keep_until: Option<i64>,
    pub created_at: i64,
    pub started_at: Option<i64>,
    pub finished_at: Option<i64>,
    pub deadline: i64,
}

const JOB_COLUMNS: &str = "id, kind, target, destination, node_id, state, trigger, attempt, of_job, snapshot, files, bytes, added_bytes, duration_ms, \
    counts, detail, message, pruned, verify_state, verify_job, verified_at, verify_detail, restore_to, kept_volume, kept_state, keep_until, \
    created_at, started_at, finished_at, deadline";

fn job_from_row(row: &impl Cols) -> BackupJobRow {
    BackupJobRow {
        id: row.col("id"),
        kind: row.col("kind"),
        target: row.col("target"),
        destination: row.col("destination"),
        node_id: row.col("node_id"),
        state: row.col("state"),
        trigger: row.col("trigger"),
        attempt: row.col("attempt"),
        of_job: row.col("of_job"),
        snapshot: row.col("snapshot"),
        files: row.col("files"),
        bytes: row.col("bytes"),
        added_bytes: row.col("added_bytes"),
        duration_ms: row.col("duration_ms"),
        counts: row.col("counts"),
        detail: row.col("detail"),
        message: row.col("message"),
        pruned: row.col::<Option<i64>>("pruned").map(|p| p != 0),
        verify_state: row.col("verify_state"),
        verify_job: row.col("verify_job"),
        verified_at: row.col("verified_at"),
        verify_detail: row.col("verify_detail"),
        restore_to: row.col("restore_to"),
        kept_volume: row.col("kept_volume"),
        kept_state: row.col("kept_state"),
        keep_until: row.col("keep_until"),
        created_at: row.col("created_at"),
        started_at: row.col("started_at"),
        finished_at: row.col("finished_at"),
        deadline: row.col("deadline"),
    }
}

/// What a node reported of a job.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct JobOutcome {
    pub state: String,
    pub snapshot: Option<String>,
    pub files: Option<i64>,
    pub bytes: Option<i64>,
    pub added_bytes: Option<i64>,
    pub duration_ms: Option<i64>,
    pub counts: Option<String>,
    pub detail: Option<String>,
    pub message: Option<String>,
    pub pruned: Option<bool>,
    /// A successful restore's replaced data, set in the same write:
    /// `settling` until the control plane has recorded what became of it.
    pub kept_state: Option<String>,
    /// A verification's outcome, recorded on the backup it checked in the
    /// same write, so nobody sees the job ended and the backup unchanged.
    pub verified: Option<Verified>,
}

/// What a verification found of one backup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    pub backup_id: String,
    /// `passed` or `failed`.
    pub state: String,
    pub detail: Option<String>,
}

/// Why a job was not queued.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobRefusal {
    /// A job of that kind for that target is unfinished: its id.
    Busy(String),
}

/// Why a destination was not removed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DestinationRemoval {
    Removed,
    NotFound,
    /// Plans that name it.
    InUse(Vec<String>),
}

impl Store {
    /// False when a destination of that name exists.
    pub async fn insert_destination(&self, row: &DestinationRow) -> Result<bool, StoreError> {
        on_db!(self, pool => {
            let result = sqlx::query(&format!(
                "INSERT INTO backup_destinations ({DESTINATION_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12) ON CONFLICT (name) DO NOTHING"
            ))
            .bind(&row.name)
            .bind(&row.kind)
            .bind(&row.base_url)
            .bind(&row.region)
            .bind(&row.access_key_id)
            .bind(&row.secret_sealed)
            .bind(&row.password_sealed)
            .bind(row.keep_daily)
            .bind(row.keep_weekly)
            .bind(row.keep_monthly)
            .bind(row.created_at)
            .bind(&row.team_id)
            .execute(pool)
            .await?;
            self.count_commit().await;
            Ok(result.rows_affected() == 1)
        })
    }

    /// Oldest first: the first is the default destination.
    pub async fn destinations(&self) -> Result<Vec<DestinationRow>, StoreError> {
        on_db!(self, pool => {
            let rows = sqlx::query(&format!("SELECT {DESTINATION_COLUMNS} FROM backup_destinations ORDER BY created_at, name")).fetch_all(pool).await?;
            Ok(rows.iter().map(destination_from_row).collect())
        })
    }

    pub async fn destination(&self, name: &str) -> Result<Option<DestinationRow>, StoreError> {
        on_db!(self, pool => {
            let row = sqlx::query(&format!("SELECT {DESTINATION_COLUMNS} FROM backup_destinations WHERE name = $1")).bind(name).fetch_optional(pool).await?;
            Ok(row.as_ref().map(destination_from_row))
        })
    }

    /// Forgets a destination's settings (never its data), unless a plan
    /// names it.
    pub async fn delete_destination(&self, name: &str) -> Result<DestinationRemoval, StoreError> {
        on_db!(self, pool => {
            let mut tx = pool.begin_write().await?;
            let users: Vec<String> =
                sqlx::query("SELECT target FROM backup_plans WHERE destination = $1 ORDER BY target").bind(name).fetch_all(&mut *tx).await?.iter().map(|r| r.get("target")).collect();
            if !users.is_empty() {
                tx.rollback().await?;
                return Ok(DestinationRemoval::InUse(users));
            }
            let result = sqlx::query("DELETE FROM backup_destinations WHERE name = $1").bind(name).execute(&mut *tx).await?;
            tx.commit().await?;
            self.count_commit().await;
            Ok(if result.rows_affected() == 1 { DestinationRemoval::Removed } else { DestinationRemoval::NotFound })
        })
    }

    pub async fn set_backup_plan(&self, plan: &PlanRow) -> Result<(), StoreError> {
        on_db!(self, pool => {
            sqlx::query(
                "INSERT INTO backup_plans (target, destination, schedule, verify_schedule, pause, enabled, updated_at) VALUES ($1, $2, $3, $4, $5, $6, $7) \
             ON CONFLICT (target) DO UPDATE SET destination = excluded.destination, schedule = excluded.schedule, \
             verify_schedule = excluded.verify_schedule, pause = excluded.pause, enabled = excluded.enabled, updated_at = excluded.updated_at",
            )
            .bind(&plan.target)
            .bind(&plan.destination)
            .bind(&plan.schedule)
            .bind(&plan.verify_schedule)
            .bind(i64::from(plan.pause))
            .bind(i64::from(plan.enabled))
            .bind(plan.updated_at)
            .execute(pool)
            .await?;
            self.count_commit().await;
            Ok(())
        })
    }

    pub async fn backup_plan(&self, target: &str) -> Result<Option<PlanRow>, StoreError> {
        on_db!(self, pool => {
            let row = sqlx::query("SELECT * FROM backup_plans WHERE target = $1").bind(target).fetch_optional(pool).await?;
            Ok(row.as_ref().map(plan_from_row))
        })
    }

    pub async fn backup_plans(&self) -> Result<Vec<PlanRow>, StoreError> {
        on_db!(self, pool => {
            let rows = sqlx::query("SELECT * FROM backup_plans ORDER BY target").fetch_all(pool).await?;
            Ok(rows.iter().map(plan_from_row).collect())
        })
    }

    /// Records a job and queues its command (none for a job the control
    /// plane runs itself), unless a job of its kind for its target is
    /// unfinished.
    pub async fn insert_backup_job(&self, job: &BackupJobRow, command: Option<&NewCommand>, now_ms: i64) -> Result<Result<(), JobRefusal>, StoreError> {
        on_db!(self, pool => {
            let mut tx = pool.begin_write().await?;
            let busy: Option<String> = sqlx::query("SELECT id FROM backup_jobs WHERE target = $1 AND kind = $2 AND state IN ('queued', 'running')")
                .bind(&job.target)
                .bind(&job.kind)
                .fetch_optional(&mut *tx)
                .await?
                .map(|r| r.get("id"));
            if let Some(id) = busy {
                tx.rollback().await?;
                return Ok(Err(JobRefusal::Busy(id)));
            }
            sqlx::query(
                "INSERT INTO backup_jobs (id, kind, target, destination, node_id, state, trigger, attempt, of_job, snapshot, restore_to, kept_volume, created_at, deadline) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)",
            )
            .bind(&job.id)
            .bind(&job.kind)
            .bind(&job.target)
            .bind(&job.destination)
            .bind(&job.node_id)
            .bind(&job.state)
            .bind(&job.trigger)
            .bind(job.attempt)
            .bind(&job.of_job)
            .bind(&job.snapshot)
            .bind(&job.restore_to)
            .bind(&job.kept_volume)
            .bind(job.created_at)
            .bind(job.deadline)
            .execute(&mut *tx)
            .await?;
            if let Some(command) = command {
                tx.insert_command(command, now_ms).await?;
            }
            tx.commit().await?;
            self.count_commit().await;
            Ok(Ok(()))
        })
    }

    pub async fn backup_job(&self, id: &str) -> Result<Option<BackupJobRow>, StoreError> {
        on_db!(self, pool => {
            let row = sqlx::query(&format!("SELECT {JOB_COLUMNS} FROM backup_jobs WHERE id = $1")).bind(id).fetch_optional(pool).await?;
            Ok(row.as_ref().map(job_from_row))
        })
    }

    /// A target's jobs of `kind` (every kind when `None`), newest first.
    pub async fn backup_jobs_of(&self, target: &str, kind: Option<&str>, limit: i64) -> Result<Vec<BackupJobRow>, StoreError> {
        on_db!(self, pool => {
            let rows = sqlx::query(&format!(
                "SELECT {JOB_COLUMNS} FROM backup_jobs WHERE target = $1 AND ($2 IS NULL OR kind = $2) ORDER BY created_at DESC, id DESC LIMIT $3"
            ))
            .bind(target)
            .bind(kind)
            .bind(limit)
            .fetch_all(pool)
            .await?;
            Ok(rows.iter().map(job_from_row).collect())
        })
    }

    /// The newest jobs of every target (for the overview), newest first.
    pub async fn recent_backup_jobs(&self, limit: i64) -> Result<Vec<BackupJobRow>, StoreError> {
        on_db!(self, pool => {
            let rows = sqlx::query(&format!("SELECT {JOB_COLUMNS} FROM backup_jobs ORDER BY created_at DESC, id DESC LIMIT $1")).bind(limit).fetch_all(pool).await?;
            Ok(rows.iter().map(job_from_row).collect())
        })
    }

    /// Jobs the watcher looks after: unfinished ones, and restores whose
    /// replaced data is kept.
    pub async fn backup_jobs_to_watch(&self) -> Result<Vec<BackupJobRow>, StoreError> {
        on_db!(self, pool => {
            let rows = sqlx::query(&format!(
                "SELECT {JOB_COLUMNS} FROM backup_jobs WHERE state IN ('queued', 'running') OR kept_state IN ('settling', 'kept', 'purging') ORDER BY created_at"
            ))
            .fetch_all(pool)
            .await?;
            Ok(rows.iter().map(job_from_row).collect())
        })
    }

    /// Per target and kind, its newest job (for schedules, retries and
    /// the overview).
    pub async fn latest_backup_jobs(&self) -> Result<Vec<BackupJobRow>, StoreError> {
        on_db!(self, pool => {
            let rows = sqlx::query(&format!(
                "SELECT {JOB_COLUMNS} FROM backup_jobs j WHERE created_at = (SELECT MAX(created_at) FROM backup_jobs k WHERE k.target = j.target AND k.kind = j.kind) \
             ORDER BY target, kind"
            ))
            .fetch_all(pool)
            .await?;
            Ok(rows.iter().map(job_from_row).collect())
        })
    }

    /// Per target, its newest successful backup.
    pub async fn latest_good_backups(&self) -> Result<Vec<BackupJobRow>, StoreError> {
        on_db!(self, pool => {
            let rows = sqlx::query(&format!(
                "SELECT {JOB_COLUMNS} FROM backup_jobs j WHERE kind = 'backup' AND state = 'succeeded' AND finished_at = \
             (SELECT MAX(finished_at) FROM backup_jobs k WHERE k.target = j.target AND k.kind = 'backup' AND k.state = 'succeeded') ORDER BY target"
            ))
            .fetch_all(pool)
            .await?;
            Ok(rows.iter().map(job_from_row).collect())
        })
    }

    /// A node started the job.
    pub async fn start_backup_job(&self, id: &str, now_ms: i64) -> Result<bool, StoreError> {
        on_db!(self, pool => {
            let result = sqlx::query("UPDATE backup_jobs SET state = 'running', started_at = COALESCE(started_at, $1) WHERE id = $2 AND state = 'queued'")
                .bind(now_ms)
                .bind(id)
                .execute(pool)
                .await?;
            self.count_commit().await;
            Ok(result.rows_affected() == 1)
        })
    }

    /// Ends an unfinished job with what was reported (queuing `then` in the
    /// same transaction); false when it had ended already.
    pub async fn finish_backup_job(&self, id: &str, outcome: &JobOutcome, then: &[NewCommand], now_ms: i64) -> Result<bool, StoreError> {
        on_db!(self, pool => {
            let mut tx = pool.begin_write().await?;
            let result = sqlx::query(
                "UPDATE backup_jobs SET state = $1, snapshot = COALESCE($2, snapshot), files = $3, bytes = $4, added_bytes = $5, duration_ms = $6, \
             counts = $7, detail = $8, message = $9, pruned = $10, finished_at = $11, started_at = COALESCE(started_at, $11), \
             kept_state = COALESCE($13, kept_state) WHERE id = $12 AND state IN ('queued', 'running')",
            )
            .bind(&outcome.state)
            .bind(&outcome.snapshot)
            .bind(outcome.files)
            .bind(outcome.bytes)
            .bind(outcome.added_bytes)
            .bind(outcome.duration_ms)
            .bind(&outcome.counts)
            .bind(&outcome.detail)
            .bind(&outcome.message)
            .bind(outcome.pruned.map(i64::from))
            .bind(now_ms)
            .bind(id)
            .bind(&outcome.kept_state)
            .execute(&mut *tx)
            .await?;
            if result.rows_affected() == 0 {
                tx.rollback().await?;
                return Ok(false);
            }
            if let Some(verified) = &outcome.verified {
                sqlx::query("UPDATE backup_jobs SET verify_state = $1, verify_job = $2, verified_at = $3, verify_detail = $4 WHERE id = $5 AND kind = 'backup'")
                    .bind(&verified.state)
                    .bind(id)
                    .bind(now_ms)
                    .bind(&verified.detail)
                    .bind(&verified.backup_id)
                    .execute(&mut *tx)
                    .await?;
            }
            for command in then {
                tx.insert_command(command, now_ms).await?;
            }
            tx.commit().await?;
            self.count_commit().await;
            Ok(true)
        })
    }

    /// What became of a restore's replaced data (`settling` → `kept` →
    /// `purged`, or `settling` → `purged` or none at all), queuing `command`
    /// in the same transaction. False when it was not `from` any more.
    pub async fn set_kept_state(&self, id: &str, from: Option<&str>, to: Option<&str>, keep_until: Option<i64>, command: Option<&NewCommand>, now_ms: i64) -> Result<bool, StoreError> {
        on_db!(self, pool => {
            let mut tx = pool.begin_write().await?;
            let result = sqlx::query(
                "UPDATE backup_jobs SET kept_state = $1, keep_until = COALESCE($2, keep_until) WHERE id = $3 AND kept_state IS NOT DISTINCT FROM $4",
            )
            .bind(to)
            .bind(keep_until)
            .bind(id)
            .bind(from)
            .execute(&mut *tx)
            .await?;
            if result.rows_affected() == 0 {
                tx.rollback().await?;
                return Ok(false);
            }
            if let Some(command) = command {
                tx.insert_command(command, now_ms).await?;
            }
            tx.commit().await?;
            self.count_commit().await;
            Ok(true)
        })
    }

    /// A settling restore's last step, in one write: the volume it set
    /// aside on `node_id` is recorded (detached; it goes only when deleted
    /// by name, confirmed, or due) and the job moves from `settling` to
    /// `kept` until `keep_until`. False, and nothing recorded, when the job
    /// was not settling any more: a late second run cannot bring back the
    /// row of a kept volume deleted since.
    pub async fn settle_kept_volume(&self, job_id: &str, name: &str, node_id: &str, keep_until: i64, now_ms: i64) -> Result<bool, StoreError> {
        self.settle_with_volume(job_id, Some(keep_until), name, node_id, now_ms).await
    }

    /// A restore into a new volume, settled in one write: the volume is
    /// recorded and the job is no longer settling. False when it was not.
    pub async fn settle_new_volume(&self, job_id: &str, name: &str, node_id: &str, now_ms: i64) -> Result<bool, StoreError> {
        self.settle_with_volume(job_id, None, name, node_id, now_ms).await
    }

    /// The job leaves `settling` (for `kept` until `keep_until`, or for
    /// nothing kept) and volume `name` is recorded on `node_id`, in one
    /// write, or neither.
    async fn settle_with_volume(&self, job_id: &str, keep_until: Option<i64>, name: &str, node_id: &str, now_ms: i64) -> Result<bool, StoreError> {
        on_db!(self, pool => {
            let mut tx = pool.begin_write().await?;
            let result = sqlx::query("UPDATE backup_jobs SET kept_state = $1, keep_until = COALESCE($2, keep_until) WHERE id = $3 AND kept_state = 'settling'")
                .bind(keep_until.map(|_| "kept"))
                .bind(keep_until)
                .bind(job_id)
                .execute(&mut *tx)
                .await?;
            if result.rows_affected() == 0 {
                tx.rollback().await?;
                return Ok(false);
            }
            // A restored volume belongs to the team of the destination its
            // backup came from.
            sqlx::query(
                "INSERT INTO volumes (name, node_id, created_at, team_id) VALUES ($1, $2, $3, \
                 COALESCE((SELECT d.team_id FROM backup_jobs j JOIN backup_destinations d ON d.name = j.destination WHERE j.id = $4), 'team_default')) \
                 ON CONFLICT (name) DO NOTHING",
            )
                .bind(name)
                .bind(node_id)
                .bind(now_ms)
                .bind(job_id)
                .execute(&mut *tx)
                .await?;
            tx.commit().await?;
            self.count_commit().await;
            Ok(true)
        })
    }

    /// Forgets a volume row the control plane made itself (a restore's
    /// kept data, after its purge).
    pub async fn forget_volume_row(&self, name: &str) -> Result<(), StoreError> {
        on_db!(self, pool => {
            sqlx::query("DELETE FROM volumes WHERE name = $1 AND app IS NULL AND service IS NULL").bind(name).execute(pool).await?;
            self.count_commit().await;
            Ok(())
        })
    }

    /// In-flight jobs of every kind are failed with `reason` (a restored
    /// control plane does not resume them blind). The number failed.
    pub async fn fail_unfinished_backup_jobs(&self, reason: &str, now_ms: i64) -> Result<u64, StoreError> {
        on_db!(self, pool => {
            let result = sqlx::query("UPDATE backup_jobs SET state = 'failed', message = $1, finished_at = $2 WHERE state IN ('queued', 'running')")
                .bind(reason)
                .bind(now_ms)
                .execute(pool)
                .await?;
            self.count_commit().await;
            Ok(result.rows_affected())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(id: &str, target: &str, now: i64) -> BackupJobRow {
        BackupJobRow {
            id: id.into(),
            kind: "backup".into(),
            target: target.into(),
            destination: "offsite".into(),
            node_id: "n_a".into(),
            state: "queued".into(),
            trigger: "manual".into(),
            attempt: 1,
            created_at: now,
            deadline: now + 1000,
            ..BackupJobRow::default()
        }
    }

    crate::test_engines::both_engines! {
        async fn one_unfinished_job_per_target_and_kind(store) {
            let destination = DestinationRow {
                name: "offsite".into(),
                kind: "path".into(),
                base_url: "/srv/backups".into(),
                region: None,
                access_key_id: None,
                secret_sealed: None,
                password_sealed: "sealed".into(),
                keep_daily: 7,
                keep_weekly: 4,
                keep_monthly: 6,
                created_at: 1,
                team_id: "team_default".into(),
            };
            assert!(store.insert_destination(&destination).await.unwrap());
            assert!(!store.insert_destination(&destination).await.unwrap());
            store.insert_backup_job(&job("bj_1", "service/db", 10), None, 10).await.unwrap().unwrap();
            assert_eq!(store.insert_backup_job(&job("bj_2", "service/db", 11), None, 11).await.unwrap(), Err(JobRefusal::Busy("bj_1".into())));
            assert!(store.start_backup_job("bj_1", 12).await.unwrap());
            let outcome = JobOutcome { state: "succeeded".into(), snapshot: Some("0123abcd".into()), bytes: Some(42), ..JobOutcome::default() };
            assert!(store.finish_backup_job("bj_1", &outcome, &[], 13).await.unwrap());
            assert!(!store.finish_backup_job("bj_1", &outcome, &[], 14).await.unwrap(), "a job ends once");
            store.insert_backup_job(&job("bj_2", "service/db", 15), None, 15).await.unwrap().unwrap();
            let good = store.latest_good_backups().await.unwrap();
            assert_eq!(good.len(), 1);
            assert_eq!(good[0].snapshot.as_deref(), Some("0123abcd"));
            let latest = store.latest_backup_jobs().await.unwrap();
            assert_eq!(latest.len(), 1);
            assert_eq!(latest[0].id, "bj_2");
            assert_eq!(store.fail_unfinished_backup_jobs("restored", 16).await.unwrap(), 1);
            store.set_backup_plan(&PlanRow {
                target: "service/db".into(),
                destination: Some("offsite".into()),
                schedule: Some("5 3 * * *".into()),
                verify_schedule: None,
                pause: false,
                enabled: true,
                updated_at: 17,
            })
            .await
            .unwrap();
            assert_eq!(store.delete_destination("offsite").await.unwrap(), DestinationRemoval::InUse(vec!["service/db".into()]));
        }
    }

    crate::test_engines::both_engines! {
        async fn a_restores_last_step_stays_watched_until_it_is_done(store) {
            let mut restore = job("bj_r", "service/db", 10);
            restore.kind = "restore".into();
            restore.kept_volume = Some("svc-db-before-restore-1".into());
            store.insert_backup_job(&restore, None, 10).await.unwrap().unwrap();
            let outcome = JobOutcome { state: "succeeded".into(), kept_state: Some("settling".into()), ..JobOutcome::default() };
            assert!(store.finish_backup_job("bj_r", &outcome, &[], 11).await.unwrap());
            let row = store.backup_job("bj_r").await.unwrap().unwrap();
            assert_eq!((row.state.as_str(), row.kept_state.as_deref()), ("succeeded", Some("settling")), "ended and settling in one write");
            let watched: Vec<String> = store.backup_jobs_to_watch().await.unwrap().into_iter().map(|j| j.id).collect();
            assert_eq!(watched, vec!["bj_r".to_string()], "an ended restore that has not settled is still watched");
            assert!(!store.set_kept_state("bj_r", Some("kept"), Some("purged"), None, None, 12).await.unwrap(), "only from the state it is in");
            assert!(store.set_kept_state("bj_r", Some("settling"), Some("kept"), Some(99), None, 12).await.unwrap());
            assert!(!store.set_kept_state("bj_r", Some("settling"), Some("kept"), Some(99), None, 13).await.unwrap(), "a second run is a no-op");
            let row = store.backup_job("bj_r").await.unwrap().unwrap();
            assert_eq!((row.kept_state.as_deref(), row.keep_until), (Some("kept"), Some(99)));
            let mut plain = job("bj_v", "volume/files", 20);
            plain.kind = "restore".into();
            store.insert_backup_job(&plain, None, 20).await.unwrap().unwrap();
            assert!(store.finish_backup_job("bj_v", &outcome, &[], 21).await.unwrap());
            assert!(store.set_kept_state("bj_v", Some("settling"), None, None, None, 22).await.unwrap());
            assert_eq!(store.backup_job("bj_v").await.unwrap().unwrap().kept_state, None, "settled with nothing kept");
        }
    }

    crate::test_engines::both_engines! {
        async fn a_restore_settles_with_its_volume_row_in_one_write_and_only_once(store) {
            let outcome = JobOutcome { state: "succeeded".into(), kept_state: Some("settling".into()), ..JobOutcome::default() };
            let mut kept = job("bj_k", "service/db", 10);
            kept.kind = "restore".into();
            store.insert_backup_job(&kept, None, 10).await.unwrap().unwrap();
            assert!(!store.settle_kept_volume("bj_k", "svc-db-before-restore-1", "n_a", 99, 11).await.unwrap(), "not settling yet: nothing recorded");
            assert!(store.volume("svc-db-before-restore-1").await.unwrap().is_none());
            assert!(store.finish_backup_job("bj_k", &outcome, &[], 11).await.unwrap());
            assert!(store.settle_kept_volume("bj_k", "svc-db-before-restore-1", "n_a", 99, 12).await.unwrap());
            let row = store.backup_job("bj_k").await.unwrap().unwrap();
            assert_eq!((row.kept_state.as_deref(), row.keep_until), (Some("kept"), Some(99)));
            assert_eq!(store.volume("svc-db-before-restore-1").await.unwrap().and_then(|v| v.node_id).as_deref(), Some("n_a"));
            // Deleted by name since: a late second run does not bring it back.
            store.forget_volume_row("svc-db-before-restore-1").await.unwrap();
            assert!(!store.settle_kept_volume("bj_k", "svc-db-before-restore-1", "n_a", 99, 13).await.unwrap());
            assert!(store.volume("svc-db-before-restore-1").await.unwrap().is_none());

            let mut new = job("bj_n", "volume/copy", 20);
            new.kind = "restore".into();
            store.insert_backup_job(&new, None, 20).await.unwrap().unwrap();
            assert!(store.finish_backup_job("bj_n", &outcome, &[], 21).await.unwrap());
            assert!(store.settle_new_volume("bj_n", "copy", "n_b", 22).await.unwrap());
            let row = store.backup_job("bj_n").await.unwrap().unwrap();
            assert_eq!((row.kept_state, row.keep_until), (None, None), "nothing kept");
            assert_eq!(store.volume("copy").await.unwrap().and_then(|v| v.node_id).as_deref(), Some("n_b"));
            assert!(!store.settle_new_volume("bj_n", "copy", "n_b", 23).await.unwrap(), "once");
        }
    }
}
