//! Tasks: apps' scheduled jobs (`cron_jobs`), every run of a command in a
//! one-off container (`task_runs`, queued with its command in one
//! transaction) and the runs' output lines (`task_run_lines`).

use crate::backend::Cols;
use sqlx::Row;

use super::commands::CommandsTx;
use super::{NewCommand, Store, StoreError};

/// Output lines a run keeps: the last ones.
pub const MAX_RUN_LINES: i64 = 2000;

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CronJobRow {
    pub app: String,
    pub name: String,
    pub schedule: String,
    pub timezone: String,
    /// A JSON array of arguments.
    pub command: String,
    pub timeout_s: i64,
    /// `forbid`, `replace` or `allow`.
    pub concurrency: String,
    pub retry_lost: bool,
    pub starting_deadline_s: i64,
    pub suspended: bool,
    /// The next tick (ms); `None` while suspended.
    pub next_run_at: Option<i64>,
    pub created_at: i64,
    pub updated_at: i64,
}

const JOB_COLUMNS: &str =
    "app, name, schedule, timezone, command, timeout_s, concurrency, retry_lost, starting_deadline_s, suspended, next_run_at, created_at, updated_at";

fn job_from_row(row: &impl Cols) -> CronJobRow {
    CronJobRow {
        app: row.col("app"),
        name: row.col("name"),
        schedule: row.col("schedule"),
        timezone: row.col("timezone"),
        command: row.col("command"),
        timeout_s: row.col("timeout_s"),
        concurrency: row.col("concurrency"),
        retry_lost: row.col::<i64>("retry_lost") != 0,
        starting_deadline_s: row.col("starting_deadline_s"),
        suspended: row.col::<i64>("suspended") != 0,
        next_run_at: row.col("next_run_at"),
        created_at: row.col("created_at"),
        updated_at: row.col("updated_at"),
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TaskRunRow {
    pub id: String,
    pub app: String,
    /// The scheduled job; `None` for a one-off run.
    pub job: Option<String>,
    /// `schedule`, `manual`, `one-off` or `retry`.
    pub trigger: String,
    /// The tick it runs for (ms).
    pub scheduled_for: Option<i64>,
    pub state: String,
    pub exit_code: Option<i64>,
    pub message: Option<String>,
    /// A JSON array of arguments.
    pub command: String,
    pub node_id: Option<String>,
    pub image: Option<String>,
    pub deployment_id: Option<String>,
    pub attempt: i64,
    pub timeout_s: i64,
    pub created_at: i64,
    pub started_at: Option<i64>,
    pub finished_at: Option<i64>,
    /// When the control plane stops waiting for its node (ms).
    pub deadline: i64,
}

impl TaskRunRow {
    pub fn is_unfinished(&self) -> bool {
        matches!(self.state.as_str(), "queued" | "running")
    }
}

const RUN_COLUMNS: &str = "id, app, job, trigger, scheduled_for, state, exit_code, message, command, node_id, image, deployment_id, attempt, \
     timeout_s, created_at, started_at, finished_at, deadline";

fn run_from_row(row: &impl Cols) -> TaskRunRow {
    TaskRunRow {
        id: row.col("id"),
        app: row.col("app"),
        job: row.col("job"),
        trigger: row.col("trigger"),
        scheduled_for: row.col("scheduled_for"),
        state: row.col("state"),
        exit_code: row.col("exit_code"),
        message: row.col("message"),
        command: row.col("command"),
        node_id: row.col("node_id"),
        image: row.col("image"),
        deployment_id: row.col("deployment_id"),
        attempt: row.col("attempt"),
        timeout_s: row.col("timeout_s"),
        created_at: row.col("created_at"),
        started_at: row.col("started_at"),
        finished_at: row.col("finished_at"),
        deadline: row.col("deadline"),
    }
}

/// One stored output line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskLineRow {
    pub seq: i64,
    pub at: String,
    pub stderr: bool,
    pub line: String,
}

/// Why a job was not created.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CronRefusal {
    /// The app has a job of that name.
    Exists,
    /// The app is gone.
    NoApp,
}

/// A scheduled job's tick as the leader records it: the job moves on to
/// `next` only if it still waits for `tick` (else another pass recorded
/// it), with the tick's run (absent when it is neither run nor recorded)
/// and what the run needs queued.
pub struct Tick<'a> {
    pub app: &'a str,
    pub job: &'a str,
    pub tick: i64,
    pub next: Option<i64>,
    pub run: Option<&'a TaskRunRow>,
    pub commands: &'a [NewCommand],
    /// Runs the tick ends (`cancelled`, with the message): a `replace`
    /// job's previous ones.
    pub ends: &'a [(String, String)],
}

impl Store {
    pub async fn insert_cron_job(&self, job: &CronJobRow) -> Result<Result<(), CronRefusal>, StoreError> {
        on_db!(self, pool => {
            let mut tx = pool.begin_write().await?;
            let app: Option<String> = sqlx::query("SELECT name FROM apps WHERE name = $1").bind(&job.app).fetch_optional(&mut *tx).await?.map(|r| r.get("name"));
            if app.is_none() {
                tx.rollback().await?;
                return Ok(Err(CronRefusal::NoApp));
            }
            let exists = sqlx::query("SELECT name FROM cron_jobs WHERE app = $1 AND name = $2")
                .bind(&job.app).bind(&job.name).fetch_optional(&mut *tx).await?.is_some();
            if exists {
                tx.rollback().await?;
                return Ok(Err(CronRefusal::Exists));
            }
            sqlx::query(&format!("INSERT INTO cron_jobs ({JOB_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)"))
                .bind(&job.app)
                .bind(&job.name)
                .bind(&job.schedule)
                .bind(&job.timezone)
                .bind(&job.command)
                .bind(job.timeout_s)
                .bind(&job.concurrency)
                .bind(i64::from(job.retry_lost))
                .bind(job.starting_deadline_s)
                .bind(i64::from(job.suspended))
                .bind(job.next_run_at)
                .bind(job.created_at)
                .bind(job.updated_at)
                .execute(&mut *tx)
                .await?;
            tx.commit().await?;
            self.count_commit().await;
            Ok(Ok(()))
        })
    }

    /// Writes a job's settings and next tick, only if its next tick is still
    /// `read_next` (what the caller read: the leader may have recorded a
    /// tick meanwhile); false when it is gone or its tick moved.
    pub async fn update_cron_job(&self, job: &CronJobRow, read_next: Option<i64>) -> Result<bool, StoreError> {
        on_db!(self, pool => {
            let mut tx = pool.begin_write().await?;
            let result = sqlx::query(
                "UPDATE cron_jobs SET schedule = $3, timezone = $4, command = $5, timeout_s = $6, concurrency = $7, retry_lost = $8, \
                 starting_deadline_s = $9, suspended = $10, next_run_at = $11, updated_at = $12 \
                 WHERE app = $1 AND name = $2 AND next_run_at IS NOT DISTINCT FROM $13",
            )
            .bind(&job.app)
            .bind(&job.name)
            .bind(&job.schedule)
            .bind(&job.timezone)
            .bind(&job.command)
            .bind(job.timeout_s)
            .bind(&job.concurrency)
            .bind(i64::from(job.retry_lost))
            .bind(job.starting_deadline_s)
            .bind(i64::from(job.suspended))
            .bind(job.next_run_at)
            .bind(job.updated_at)
            .bind(read_next)
            .execute(&mut *tx)
            .await?;
            tx.commit().await?;
            self.count_commit().await;
            Ok(result.rows_affected() == 1)
        })
    }

    /// Deletes a job; its runs stay in the history.
    pub async fn delete_cron_job(&self, app: &str, name: &str) -> Result<bool, StoreError> {
        on_db!(self, pool => {
            let mut tx = pool.begin_write().await?;
            let result = sqlx::query("DELETE FROM cron_jobs WHERE app = $1 AND name = $2").bind(app).bind(name).execute(&mut *tx).await?;
            tx.commit().await?;
            self.count_commit().await;
            Ok(result.rows_affected() == 1)
        })
    }

    pub async fn cron_job(&self, app: &str, name: &str) -> Result<Option<CronJobRow>, StoreError> {
        on_db!(self, pool => {
            let row = sqlx::query(&format!("SELECT {JOB_COLUMNS} FROM cron_jobs WHERE app = $1 AND name = $2"))
                .bind(app).bind(name).fetch_optional(pool).await?;
            Ok(row.as_ref().map(job_from_row))
        })
    }

    pub async fn cron_jobs_of(&self, app: &str) -> Result<Vec<CronJobRow>, StoreError> {
        on_db!(self, pool => {
            let rows = sqlx::query(&format!("SELECT {JOB_COLUMNS} FROM cron_jobs WHERE app = $1 ORDER BY name")).bind(app).fetch_all(pool).await?;
            Ok(rows.iter().map(job_from_row).collect())
        })
    }

    /// Every job (app, name) with the state of its newest run, if any.
    pub async fn cron_jobs_last_state(&self) -> Result<Vec<(String, String, Option<String>)>, StoreError> {
        on_db!(self, pool => {
            let rows = sqlx::query(
                "SELECT j.app AS app, j.name AS name, r.state AS state FROM cron_jobs j LEFT JOIN task_runs r ON r.id = \
                 (SELECT id FROM task_runs WHERE app = j.app AND job = j.name ORDER BY created_at DESC, id DESC LIMIT 1) ORDER BY j.app, j.name",
            )
            .fetch_all(pool)
            .await?;
            Ok(rows.iter().map(|r| (r.col("app"), r.col("name"), r.col("state"))).collect())
        })
    }

    /// Jobs whose next tick is at or before `now_ms`, the most overdue
    /// first, at most `limit`.
    pub async fn due_cron_jobs(&self, now_ms: i64, limit: i64) -> Result<Vec<CronJobRow>, StoreError> {
        on_db!(self, pool => {
            let rows = sqlx::query(&format!(
                "SELECT {JOB_COLUMNS} FROM cron_jobs WHERE suspended = 0 AND next_run_at IS NOT NULL AND next_run_at <= $1 \
                 ORDER BY next_run_at, app, name LIMIT $2"
            ))
            .bind(now_ms)
            .bind(limit)
            .fetch_all(pool)
            .await?;
            Ok(rows.iter().map(job_from_row).collect())
        })
    }

    /// Records a tick (see [`Tick`]); false when the job no longer waits
    /// for it (recorded by another pass, changed, or deleted): nothing is
    /// written then.
    pub async fn record_tick(&self, tick: &Tick<'_>, now_ms: i64) -> Result<bool, StoreError> {
        on_db!(self, pool => {
            let mut tx = pool.begin_write().await?;
            let moved = sqlx::query("UPDATE cron_jobs SET next_run_at = $1 WHERE app = $2 AND name = $3 AND next_run_at = $4 AND suspended = 0")
                .bind(tick.next)
                .bind(tick.app)
                .bind(tick.job)
                .bind(tick.tick)
                .execute(&mut *tx)
                .await?;
            if moved.rows_affected() != 1 {
                tx.rollback().await?;
                return Ok(false);
            }
            for (id, message) in tick.ends {
                sqlx::query("UPDATE task_runs SET state = 'cancelled', message = $1, finished_at = $2 WHERE id = $3 AND state IN ('queued', 'running')")
                    .bind(message).bind(now_ms).bind(id).execute(&mut *tx).await?;
            }
            if let Some(run) = tick.run {
                tx.insert_task_run(run).await?;
            }
            for command in tick.commands {
                tx.insert_command(command, now_ms).await?;
            }
            tx.commit().await?;
            self.count_commit().await;
            Ok(true)
        })
    }

    /// Records a run (with the command that starts it, and any that end
    /// others: a `replace` job's previous runs, ended `cancelled` here
    /// with `message`).
    pub async fn insert_task_run(&self, run: &TaskRunRow, commands: &[NewCommand], ends: &[(String, String)], now_ms: i64) -> Result<(), StoreError> {
        on_db!(self, pool => {
            let mut tx = pool.begin_write().await?;
            for (id, message) in ends {
                sqlx::query("UPDATE task_runs SET state = 'cancelled', message = $1, finished_at = $2 WHERE id = $3 AND state IN ('queued', 'running')")
                    .bind(message).bind(now_ms).bind(id).execute(&mut *tx).await?;
            }
            tx.insert_task_run(run).await?;
            for command in commands {
                tx.insert_command(command, now_ms).await?;
            }
            tx.commit().await?;
            self.count_commit().await;
            Ok(())
        })
    }

    pub async fn task_run(&self, id: &str) -> Result<Option<TaskRunRow>, StoreError> {
        on_db!(self, pool => {
            let row = sqlx::query(&format!("SELECT {RUN_COLUMNS} FROM task_runs WHERE id = $1")).bind(id).fetch_optional(pool).await?;
            Ok(row.as_ref().map(run_from_row))
        })
    }

    /// An app's runs (of one job, or of every kind when `job` is `None`),
    /// newest first.
    pub async fn task_runs_of(&self, app: &str, job: Option<&str>, limit: i64) -> Result<Vec<TaskRunRow>, StoreError> {
        on_db!(self, pool => {
            let rows = sqlx::query(&format!(
                "SELECT {RUN_COLUMNS} FROM task_runs WHERE app = $1 AND ($2 IS NULL OR job = $2) ORDER BY created_at DESC, id DESC LIMIT $3"
            ))
            .bind(app)
            .bind(job)
            .bind(limit)
            .fetch_all(pool)
            .await?;
            Ok(rows.iter().map(run_from_row).collect())
        })
    }

    /// Every queued or running run.
    pub async fn unfinished_task_runs(&self) -> Result<Vec<TaskRunRow>, StoreError> {
        on_db!(self, pool => {
            let rows = sqlx::query(&format!("SELECT {RUN_COLUMNS} FROM task_runs WHERE state IN ('queued', 'running') ORDER BY created_at, id"))
                .fetch_all(pool)
                .await?;
            Ok(rows.iter().map(run_from_row).collect())
        })
    }

    /// A queued run started on its node, with its new deadline (counted
    /// from its start); false when it was not queued (a report sent again,
    /// or one that raced its end).
    pub async fn start_task_run(&self, id: &str, now_ms: i64, deadline: i64) -> Result<bool, StoreError> {
        on_db!(self, pool => {
            let mut tx = pool.begin_write().await?;
            let result = sqlx::query("UPDATE task_runs SET state = 'running', started_at = COALESCE(started_at, $1), deadline = $3 WHERE id = $2 AND state = 'queued'")
                .bind(now_ms).bind(id).bind(deadline).execute(&mut *tx).await?;
            tx.commit().await?;
            self.count_commit().await;
            Ok(result.rows_affected() == 1)
        })
    }

    /// Ends an unfinished run in `state`, with what follows in the same
    /// transaction (a retry's run and its command); false when it had
    /// ended already (nothing is written then).
    pub async fn finish_task_run(
        &self,
        id: &str,
        state: &str,
        exit_code: Option<i64>,
        message: Option<&str>,
        then: Option<(&TaskRunRow, &NewCommand)>,
        commands: &[NewCommand],
        now_ms: i64,
    ) -> Result<bool, StoreError> {
        on_db!(self, pool => {
            let mut tx = pool.begin_write().await?;
            let result = sqlx::query(
                "UPDATE task_runs SET state = $1, exit_code = $2, message = $3, finished_at = $4, started_at = CASE WHEN $1 = 'lost' OR $1 = 'skipped' \
                 THEN started_at ELSE COALESCE(started_at, $4) END WHERE id = $5 AND state IN ('queued', 'running')",
            )
            .bind(state)
            .bind(exit_code)
            .bind(message)
            .bind(now_ms)
            .bind(id)
            .execute(&mut *tx)
            .await?;
            if result.rows_affected() == 0 {
                tx.rollback().await?;
                return Ok(false);
            }
            if let Some((run, command)) = then {
                tx.insert_task_run(run).await?;
                tx.insert_command(command, now_ms).await?;
            }
            for command in commands {
                tx.insert_command(command, now_ms).await?;
            }
            tx.commit().await?;
            self.count_commit().await;
            Ok(true)
        })
    }

    /// Stores a run's output lines (a line it has already is kept as it
    /// is; none for a run that is gone) and drops all but its last
    /// [`MAX_RUN_LINES`].
    pub async fn append_task_lines(&self, run_id: &str, lines: &[TaskLineRow]) -> Result<(), StoreError> {
        if lines.is_empty() {
            return Ok(());
        }
        on_db!(self, pool => {
            let mut tx = pool.begin_write().await?;
            for line in lines {
                sqlx::query(
                    "INSERT INTO task_run_lines (run_id, seq, at, stderr, line) SELECT $1, $2, $3, $4, $5 \
                     WHERE EXISTS (SELECT 1 FROM task_runs WHERE id = $1) ON CONFLICT (run_id, seq) DO NOTHING",
                )
                    .bind(run_id)
                    .bind(line.seq)
                    .bind(&line.at)
                    .bind(i64::from(line.stderr))
                    .bind(&line.line)
                    .execute(&mut *tx)
                    .await?;
            }
            let newest: Option<i64> = sqlx::query("SELECT MAX(seq) AS newest FROM task_run_lines WHERE run_id = $1").bind(run_id).fetch_one(&mut *tx).await?.get("newest");
            if let Some(newest) = newest {
                sqlx::query("DELETE FROM task_run_lines WHERE run_id = $1 AND seq <= $2").bind(run_id).bind(newest - MAX_RUN_LINES).execute(&mut *tx).await?;
            }
            tx.commit().await?;
            self.count_commit().await;
            Ok(())
        })
    }

    /// A run's lines numbered after `after`, at most `limit`, and the
    /// first number kept (`None` when it has none).
    pub async fn task_lines(&self, run_id: &str, after: i64, limit: i64) -> Result<(Vec<TaskLineRow>, Option<i64>), StoreError> {
        on_db!(self, pool => {
            let rows = sqlx::query("SELECT seq, at, stderr, line FROM task_run_lines WHERE run_id = $1 AND seq > $2 ORDER BY seq LIMIT $3")
                .bind(run_id).bind(after).bind(limit).fetch_all(pool).await?;
            let first: Option<i64> = sqlx::query("SELECT MIN(seq) AS first FROM task_run_lines WHERE run_id = $1").bind(run_id).fetch_one(pool).await?.get("first");
            let lines = rows
                .iter()
                .map(|r| TaskLineRow { seq: r.col("seq"), at: r.col("at"), stderr: r.col::<i64>("stderr") != 0, line: r.col("line") })
                .collect();
            Ok((lines, first))
        })
    }

    /// Deletes an app's finished runs (of `job`, or its one-off runs when
    /// `None`) beyond the newest `keep` finished ones, with their lines.
    pub async fn prune_task_runs(&self, app: &str, job: Option<&str>, keep: i64) -> Result<u64, StoreError> {
        on_db!(self, pool => {
            let mut tx = pool.begin_write().await?;
            let old: Vec<String> = sqlx::query(
                "SELECT id FROM task_runs WHERE app = $1 AND (($2 IS NULL AND job IS NULL) OR job = $2) AND state NOT IN ('queued', 'running') \
                 AND id NOT IN (SELECT id FROM task_runs WHERE app = $1 AND (($2 IS NULL AND job IS NULL) OR job = $2) \
                 AND state NOT IN ('queued', 'running') ORDER BY created_at DESC, id DESC LIMIT $3)",
            )
            .bind(app)
            .bind(job)
            .bind(keep)
            .fetch_all(&mut *tx)
            .await?
            .iter()
            .map(|r| r.get("id"))
            .collect();
            for id in &old {
                sqlx::query("DELETE FROM task_run_lines WHERE run_id = $1").bind(id).execute(&mut *tx).await?;
                sqlx::query("DELETE FROM task_runs WHERE id = $1").bind(id).execute(&mut *tx).await?;
            }
            tx.commit().await?;
            if !old.is_empty() {
                self.count_commit().await;
            }
            Ok(old.len() as u64)
        })
    }
}

/// What this module writes inside a caller's write transaction.
pub(crate) trait TasksTx {
    async fn insert_task_run(&mut self, run: &TaskRunRow) -> Result<(), StoreError>;
}

crate::backend::for_both_engines! {
    impl TasksTx for sqlx::Transaction<'_, DB> {
        async fn insert_task_run(&mut self, run: &TaskRunRow) -> Result<(), StoreError> {
            sqlx::query(&format!(
                "INSERT INTO task_runs ({RUN_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18)"
            ))
            .bind(&run.id)
            .bind(&run.app)
            .bind(&run.job)
            .bind(&run.trigger)
            .bind(run.scheduled_for)
            .bind(&run.state)
            .bind(run.exit_code)
            .bind(&run.message)
            .bind(&run.command)
            .bind(&run.node_id)
            .bind(&run.image)
            .bind(&run.deployment_id)
            .bind(run.attempt)
            .bind(run.timeout_s)
            .bind(run.created_at)
            .bind(run.started_at)
            .bind(run.finished_at)
            .bind(run.deadline)
            .execute(&mut **self)
            .await?;
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::AppRow;

    fn app(name: &str) -> AppRow {
        AppRow {
            name: name.into(),
            repo_url: "https://git.example/web.git".into(),
            branch: "main".into(),
            port: 8080,
            domains: "[]".into(),
            build: None,
            strategy: "auto".into(),
            instances: 1,
            cpu: None,
            memory_bytes: None,
            health_path: "/".into(),
            health_timeout_s: 30,
            build_timeout_s: None,
            env_sealed: None,
            git_credentials_sealed: None,
            created_at: 1,
            rollout: "blue-green".into(),
            liveness: None,
            readiness: None,
            team_id: "team_default".into(),
        }
    }

    fn job(next: i64) -> CronJobRow {
        CronJobRow {
            app: "web".into(),
            name: "nightly".into(),
            schedule: "* * * * *".into(),
            timezone: "UTC".into(),
            command: r#"["true"]"#.into(),
            timeout_s: 60,
            concurrency: "forbid".into(),
            retry_lost: true,
            starting_deadline_s: 3600,
            suspended: false,
            next_run_at: Some(next),
            created_at: 1,
            updated_at: 1,
        }
    }

    fn run_row(id: &str, job: Option<&str>, tick: Option<i64>, at: i64) -> TaskRunRow {
        TaskRunRow {
            id: id.into(),
            app: "web".into(),
            job: job.map(str::to_string),
            trigger: if tick.is_some() { "schedule" } else { "one-off" }.into(),
            scheduled_for: tick,
            state: "queued".into(),
            command: r#"["true"]"#.into(),
            node_id: Some("n_a".into()),
            attempt: 1,
            timeout_s: 60,
            created_at: at,
            deadline: at + 1000,
            ..TaskRunRow::default()
        }
    }

    crate::test_engines::both_engines! {
        async fn a_tick_is_recorded_once_and_moves_the_job_on(store) {
            assert_eq!(store.insert_cron_job(&job(60_000)).await.unwrap(), Err(CronRefusal::NoApp));
            store.insert_app(&app("web"), "web.example").await.unwrap().unwrap();
            store.insert_cron_job(&job(60_000)).await.unwrap().unwrap();
            assert_eq!(store.insert_cron_job(&job(60_000)).await.unwrap(), Err(CronRefusal::Exists));
            assert!(store.due_cron_jobs(59_999, 10).await.unwrap().is_empty());
            assert_eq!(store.due_cron_jobs(60_000, 10).await.unwrap().len(), 1);
            let first = run_row("tr_1", Some("nightly"), Some(60_000), 60_001);
            let tick = Tick { app: "web", job: "nightly", tick: 60_000, next: Some(120_000), run: Some(&first), commands: &[], ends: &[] };
            assert!(store.record_tick(&tick, 60_001).await.unwrap());
            // A second pass (another replica, a restart) that read the same
            // tick records nothing.
            let again = run_row("tr_2", Some("nightly"), Some(60_000), 60_002);
            let tick = Tick { app: "web", job: "nightly", tick: 60_000, next: Some(120_000), run: Some(&again), commands: &[], ends: &[] };
            assert!(!store.record_tick(&tick, 60_002).await.unwrap());
            assert!(store.task_run("tr_2").await.unwrap().is_none());
            assert_eq!(store.cron_job("web", "nightly").await.unwrap().unwrap().next_run_at, Some(120_000));
            assert_eq!(store.cron_jobs_last_state().await.unwrap(), vec![("web".to_string(), "nightly".to_string(), Some("queued".to_string()))]);
            // The run goes through its states once.
            assert!(store.start_task_run("tr_1", 60_010, 70_000).await.unwrap());
            assert!(!store.start_task_run("tr_1", 60_011, 80_000).await.unwrap());
            assert_eq!(store.task_run("tr_1").await.unwrap().unwrap().deadline, 70_000, "counted from the start");
            assert!(store.finish_task_run("tr_1", "succeeded", Some(0), None, None, &[], 60_020).await.unwrap());
            assert!(!store.finish_task_run("tr_1", "failed", Some(1), None, None, &[], 60_021).await.unwrap(), "a run ends once");
            let done = store.task_run("tr_1").await.unwrap().unwrap();
            assert_eq!((done.state.as_str(), done.exit_code, done.started_at, done.finished_at), ("succeeded", Some(0), Some(60_010), Some(60_020)));
            // A lost run was never seen starting.
            store.insert_task_run(&run_row("tr_3", None, None, 60_030), &[], &[], 60_030).await.unwrap();
            assert!(store.finish_task_run("tr_3", "lost", None, Some("node gone"), None, &[], 60_040).await.unwrap());
            assert_eq!(store.task_run("tr_3").await.unwrap().unwrap().started_at, None);
            // A suspended job is never due.
            let mut suspended = store.cron_job("web", "nightly").await.unwrap().unwrap();
            suspended.suspended = true;
            suspended.next_run_at = None;
            assert!(!store.update_cron_job(&suspended, Some(60_000)).await.unwrap(), "the tick moved since it was read");
            assert!(store.update_cron_job(&suspended, Some(120_000)).await.unwrap());
            assert!(store.update_cron_job(&suspended, None).await.unwrap(), "None matches None");
            assert!(store.due_cron_jobs(i64::MAX, 10).await.unwrap().is_empty());
            // Deleting the app takes its jobs and runs.
            assert!(store.delete_app("web").await.unwrap());
            assert!(store.cron_jobs_of("web").await.unwrap().is_empty());
            assert!(store.task_runs_of("web", None, 10).await.unwrap().is_empty());
        }
    }

    crate::test_engines::both_engines! {
        async fn lines_are_kept_once_and_bounded_and_old_runs_are_pruned(store) {
            store.insert_app(&app("web"), "web.example").await.unwrap().unwrap();
            store.insert_task_run(&run_row("tr_a", None, None, 1), &[], &[], 1).await.unwrap();
            let line = |seq: i64| TaskLineRow { seq, at: "2026-01-01T00:00:00Z".into(), stderr: seq % 2 == 0, line: format!("line {seq}") };
            store.append_task_lines("tr_a", &[line(1), line(2)]).await.unwrap();
            // Sent again with a newer one: stored once each.
            store.append_task_lines("tr_a", &[line(2), line(3)]).await.unwrap();
            let (lines, first) = store.task_lines("tr_a", 0, 100).await.unwrap();
            assert_eq!(lines.iter().map(|l| l.seq).collect::<Vec<_>>(), vec![1, 2, 3]);
            assert_eq!(first, Some(1));
            assert!(lines[1].stderr && !lines[0].stderr);
            store.append_task_lines("tr_gone", &[line(1)]).await.unwrap();
            assert!(store.task_lines("tr_gone", 0, 10).await.unwrap().0.is_empty(), "no lines for a run that is gone");
            let (after, _) = store.task_lines("tr_a", 2, 100).await.unwrap();
            assert_eq!(after.len(), 1);
            let many: Vec<TaskLineRow> = (4..=MAX_RUN_LINES + 10).map(line).collect();
            for chunk in many.chunks(500) {
                store.append_task_lines("tr_a", chunk).await.unwrap();
            }
            let (kept, first) = store.task_lines("tr_a", 0, 10_000).await.unwrap();
            assert_eq!(kept.len() as i64, MAX_RUN_LINES);
            assert_eq!(first, Some(11));
            // Pruning keeps the newest finished runs and every unfinished one.
            for (i, id) in ["tr_b", "tr_c", "tr_d"].iter().enumerate() {
                store.insert_task_run(&run_row(id, None, None, 10 + i as i64), &[], &[], 10).await.unwrap();
            }
            for id in ["tr_a", "tr_b", "tr_c"] {
                store.finish_task_run(id, "succeeded", Some(0), None, None, &[], 20).await.unwrap();
            }
            assert_eq!(store.prune_task_runs("web", None, 2).await.unwrap(), 1);
            let left: Vec<String> = store.task_runs_of("web", None, 10).await.unwrap().into_iter().map(|r| r.id).collect();
            assert_eq!(left, vec!["tr_d", "tr_c", "tr_b"]);
            assert!(store.task_lines("tr_a", 0, 10).await.unwrap().0.is_empty(), "a pruned run's lines go with it");
            // A replace cancels the previous run in the same write.
            store.insert_task_run(&run_row("tr_e", None, None, 30), &[], &[("tr_d".into(), "replaced by tr_e".into())], 30).await.unwrap();
            assert_eq!(store.task_run("tr_d").await.unwrap().unwrap().state, "cancelled");
        }
    }
}
