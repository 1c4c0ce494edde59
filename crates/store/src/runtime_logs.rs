//! The runtime-log store (issue 26): what app instances and services
//! print, kept past a restart of the control plane and searchable.
//!
//! On SQLite the lines live in their own database file ([`LOGS_FILE`]
//! beside the state's), so a chatty app's writes never queue behind a
//! state write or the other way round, and the state's backups stay small;
//! on PostgreSQL they are tables of the state database, written outside
//! the leader's write lock (a line is never state). Words are indexed with
//! FTS5 on SQLite and a GIN index over `to_tsvector('simple', …)` on
//! PostgreSQL.
//!
//! Every bound (age, bytes per app, bytes in all) is the caller's: this
//! module counts what it holds per app (`runtime_log_usage`) and deletes
//! the oldest lines it is asked to.

use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::Row;

use super::{Store, StoreError};
use crate::backend::{Cols, Db, Engine};

/// The SQLite file of the runtime-log store, in the data directory.
pub const LOGS_FILE: &str = "logs.db";

static LOG_MIGRATIONS: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/sqlite-logs");

/// What one line costs against its app's bound besides its text (its
/// row, its index entries and its words).
pub const LINE_OVERHEAD: i64 = 64;

/// Rows one `INSERT` carries.
const INSERT_ROWS: usize = 400;

/// Where a line came from.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LogSource {
    pub app: String,
    pub container: String,
    pub deployment_id: String,
    pub node_id: String,
    pub instance: u32,
}

/// A line to store.
#[derive(Debug, Clone, PartialEq)]
pub struct NewLogLine {
    pub source: LogSource,
    pub ts_ns: i64,
    pub seq: i64,
    pub stream: String,
    pub line: String,
}

impl NewLogLine {
    pub fn bytes(&self) -> i64 {
        i64::try_from(self.line.len()).unwrap_or(i64::MAX / 2) + LINE_OVERHEAD
    }
}

/// A stored line.
#[derive(Debug, Clone, PartialEq)]
pub struct LogRow {
    pub id: i64,
    pub seq: i64,
    pub ts_ns: i64,
    pub stream: String,
    pub line: String,
    pub deployment_id: String,
    pub instance: u32,
    pub node_id: String,
    pub container: String,
}

/// Which lines a search wants, newest first.
#[derive(Debug, Clone, Default)]
pub struct LogFilter<'a> {
    pub app: &'a str,
    /// Lines at or after (ns).
    pub since_ns: Option<i64>,
    /// Lines before (ns).
    pub until_ns: Option<i64>,
    /// Lines that hold every one of these words (the full-text index's
    /// tokens: letters and digits, case-insensitive).
    pub words: Vec<String>,
    pub instance: Option<u32>,
    pub stream: Option<&'a str>,
    pub deployment: Option<&'a str>,
    /// Only lines before this one in the order of a search (`ts_ns`, `id`):
    /// the cursor of the page before.
    pub before: Option<(i64, i64)>,
    pub limit: i64,
}

/// What the store holds of one app, and what it lost.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LogUsageRow {
    pub app: String,
    pub lines: i64,
    pub bytes: i64,
    /// Lines deleted by retention (age or size).
    pub pruned: i64,
    /// Lines that never reached the store (over the app's rate, or the
    /// store was behind).
    pub dropped: i64,
}

/// The runtime-log store.
#[derive(Clone)]
pub struct LogStore {
    db: Db,
    /// The SQLite file, when there is one.
    path: Option<PathBuf>,
}

fn row(r: &impl Cols) -> LogRow {
    LogRow {
        id: r.col("id"),
        seq: r.col("seq"),
        ts_ns: r.col("ts_ns"),
        stream: r.col("stream"),
        line: r.col("line"),
        deployment_id: r.col("deployment_id"),
        instance: u32::try_from(r.col::<i64>("instance")).unwrap_or(0),
        node_id: r.col("node_id"),
        container: r.col("container"),
    }
}

fn usage(r: &impl Cols) -> LogUsageRow {
    LogUsageRow { app: r.col("app"), lines: r.col("lines"), bytes: r.col("bytes"), pruned: r.col("pruned"), dropped: r.col("dropped") }
}

const COLUMNS: &str = "l.id, l.seq, l.ts_ns, l.stream, l.line, s.deployment_id, s.instance, s.node_id, s.container";

/// The full-text query of `words` for FTS5: each a quoted string, all of
/// them required.
fn fts5_query(words: &[String]) -> String {
    words.iter().map(|w| format!("\"{}\"", w.replace('"', "\"\""))).collect::<Vec<_>>().join(" ")
}

impl LogStore {
    /// The log store beside `store`: `<data_dir>/logs.db` when the state is
    /// on SQLite (created and migrated here; a file that fails its check is
    /// moved aside to `logs.db.damaged-<stamp>` and a new one started, so
    /// damaged logs never keep the control plane down), the state database
    /// itself on PostgreSQL.
    pub async fn beside(store: &Store, data_dir: &Path, stamp: &str) -> Result<LogStore, StoreError> {
        match &store.db {
            Db::Postgres(pool) => Ok(LogStore { db: Db::Postgres(pool.clone()), path: None }),
            Db::Sqlite(_) => {
                let path = data_dir.join(LOGS_FILE);
                match LogStore::open_sqlite(&path).await {
                    Ok(logs) => Ok(logs),
                    Err(err) if err.is_corrupt() => {
                        let aside = data_dir.join(format!("{LOGS_FILE}.damaged-{stamp}"));
                        tracing::warn!(error = %err, moved_to = %aside.display(), "the runtime-log store is damaged; starting a new one");
                        std::fs::rename(&path, &aside).map_err(|source| StoreError::Io { path: path.display().to_string(), source })?;
                        for suffix in ["-wal", "-shm"] {
                            let _ = std::fs::remove_file(data_dir.join(format!("{LOGS_FILE}{suffix}")));
                        }
                        LogStore::open_sqlite(&path).await
                    }
                    Err(err) => Err(err),
                }
            }
        }
    }

    async fn open_sqlite(path: &Path) -> Result<LogStore, StoreError> {
        let existed = path.exists();
        let options = SqliteConnectOptions::from_str("sqlite:")?
            .filename(path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(Duration::from_secs(5));
        let pool = SqlitePoolOptions::new()
            .max_connections(3)
            .after_release(|conn, _| {
                Box::pin(async move {
                    use sqlx::Connection;
                    Ok(conn.ping().await.is_ok() && !conn.is_in_transaction())
                })
            })
            .connect_with(options)
            .await?;
        if existed {
            let check = sqlx::query("PRAGMA quick_check").fetch_one(&pool).await.map_err(|err| match StoreError::Database(err) {
                err if err.is_corrupt() => StoreError::Damaged(cloudweb_protocol::misc::one_line(&err.to_string(), 300)),
                err => err,
            })?;
            let finding: String = check.try_get(0).unwrap_or_default();
            if finding != "ok" {
                pool.close().await;
                return Err(StoreError::Damaged(cloudweb_protocol::misc::one_line(&finding, 300)));
            }
        }
        LOG_MIGRATIONS.run(&pool).await?;
        Ok(LogStore { db: Db::Sqlite(pool), path: Some(path.to_path_buf()) })
    }

    pub fn engine(&self) -> Engine {
        self.db.engine()
    }

    /// Stores lines (in one transaction) and counts them in their apps'
    /// usage.
    pub async fn insert(&self, lines: &[NewLogLine]) -> Result<(), StoreError> {
        if lines.is_empty() {
            return Ok(());
        }
        let mut sources: Vec<&LogSource> = Vec::new();
        for line in lines {
            if !sources.contains(&&line.source) {
                sources.push(&line.source);
            }
        }
        let mut per_app: Vec<(&str, i64, i64)> = Vec::new();
        for line in lines {
            match per_app.iter_mut().find(|(app, _, _)| *app == line.source.app) {
                Some(entry) => {
                    entry.1 += 1;
                    entry.2 += line.bytes();
                }
                None => per_app.push((&line.source.app, 1, line.bytes())),
            }
        }
        on_db!(self, pool => {
            let mut tx = pool.begin().await?;
            let mut ids = Vec::with_capacity(sources.len());
            for source in &sources {
                let id: i64 = sqlx::query(
                    "INSERT INTO runtime_log_sources (app, container, deployment_id, node_id, instance) VALUES ($1, $2, $3, $4, $5) \
                     ON CONFLICT (app, container, deployment_id, node_id, instance) DO UPDATE SET app = excluded.app RETURNING id",
                )
                .bind(&source.app)
                .bind(&source.container)
                .bind(&source.deployment_id)
                .bind(&source.node_id)
                .bind(i64::from(source.instance))
                .fetch_one(&mut *tx)
                .await?
                .get("id");
                ids.push(id);
            }
            for chunk in lines.chunks(INSERT_ROWS) {
                let mut sql = String::from("INSERT INTO runtime_logs (app, source, ts_ns, seq, stream, line, bytes) VALUES ");
                for i in 0..chunk.len() {
                    let n = i * 7;
                    if i > 0 {
                        sql.push_str(", ");
                    }
                    sql.push_str(&format!("(${}, ${}, ${}, ${}, ${}, ${}, ${})", n + 1, n + 2, n + 3, n + 4, n + 5, n + 6, n + 7));
                }
                let mut query = sqlx::query(&sql);
                for line in chunk {
                    let source = sources.iter().position(|s| **s == line.source).map(|i| ids[i]).unwrap_or_default();
                    query = query
                        .bind(&line.source.app)
                        .bind(source)
                        .bind(line.ts_ns)
                        .bind(line.seq)
                        .bind(&line.stream)
                        .bind(&line.line)
                        .bind(line.bytes());
                }
                query.execute(&mut *tx).await?;
            }
            for (app, count, bytes) in &per_app {
                sqlx::query(
                    "INSERT INTO runtime_log_usage (app, lines, bytes) VALUES ($1, $2, $3) \
                     ON CONFLICT (app) DO UPDATE SET lines = runtime_log_usage.lines + excluded.lines, bytes = runtime_log_usage.bytes + excluded.bytes",
                )
                .bind(*app)
                .bind(*count)
                .bind(*bytes)
                .execute(&mut *tx)
                .await?;
            }
            tx.commit().await?;
            Ok(())
        })
    }

    /// Counts lines of `app` that never reached the store.
    pub async fn count_dropped(&self, app: &str, lines: i64) -> Result<(), StoreError> {
        on_db!(self, pool => {
            sqlx::query(
                "INSERT INTO runtime_log_usage (app, dropped) VALUES ($1, $2) \
                 ON CONFLICT (app) DO UPDATE SET dropped = runtime_log_usage.dropped + excluded.dropped",
            )
            .bind(app)
            .bind(lines)
            .execute(pool)
            .await?;
            Ok(())
        })
    }

    /// Lines of a search, newest first (`ts_ns`, then `id`).
    pub async fn search(&self, filter: &LogFilter<'_>) -> Result<Vec<LogRow>, StoreError> {
        let (before_ts, before_id) = filter.before.unwrap_or((i64::MAX, i64::MAX));
        let until = filter.until_ns.map_or(before_ts, |until| until.saturating_sub(1).min(before_ts));
        let since = filter.since_ns.unwrap_or(i64::MIN);
        let words = match self.engine() {
            // Every placeholder is named in the statement (PostgreSQL
            // wants to know each one's type).
            _ if filter.words.is_empty() => " AND $9 = ''",
            Engine::Sqlite => " AND l.id IN (SELECT rowid FROM runtime_logs_fts WHERE runtime_logs_fts MATCH $9)",
            Engine::Postgres => " AND to_tsvector('simple', l.line) @@ plainto_tsquery('simple', $9)",
        };
        let sql = format!(
            "SELECT {COLUMNS} FROM runtime_logs l JOIN runtime_log_sources s ON s.id = l.source \
             WHERE l.app = $1 AND l.ts_ns >= $2 AND l.ts_ns <= $3 AND (l.ts_ns < $4 OR l.id < $5) \
             AND ($6 = 0 OR s.instance = $6) AND ($7 = '' OR l.stream = $7) AND ($8 = '' OR s.deployment_id = $8){words} \
             ORDER BY l.ts_ns DESC, l.id DESC LIMIT $10"
        );
        let text = match self.engine() {
            Engine::Sqlite => fts5_query(&filter.words),
            Engine::Postgres => filter.words.join(" "),
        };
        on_db!(self, pool => {
            let rows = sqlx::query(&sql)
                .bind(filter.app)
                .bind(since)
                .bind(until)
                .bind(before_ts)
                .bind(before_id)
                .bind(i64::from(filter.instance.unwrap_or(0)))
                .bind(filter.stream.unwrap_or(""))
                .bind(filter.deployment.unwrap_or(""))
                .bind(&text)
                .bind(filter.limit)
                .fetch_all(pool)
                .await?;
            Ok(rows.iter().map(row).collect())
        })
    }

    /// The app's lines numbered above `seq`, oldest first (a follower that
    /// comes back with the last line it saw).
    pub async fn after_seq(&self, app: &str, seq: i64, limit: i64, deployment: Option<&str>) -> Result<Vec<LogRow>, StoreError> {
        let sql = format!(
            "SELECT {COLUMNS} FROM runtime_logs l JOIN runtime_log_sources s ON s.id = l.source \
             WHERE l.app = $1 AND l.seq > $2 AND ($3 = '' OR s.deployment_id = $3) ORDER BY l.seq LIMIT $4"
        );
        on_db!(self, pool => {
            let rows = sqlx::query(&sql).bind(app).bind(seq).bind(deployment.unwrap_or("")).bind(limit).fetch_all(pool).await?;
            Ok(rows.iter().map(row).collect())
        })
    }

    /// The app's newest `limit` lines by number, oldest first.
    pub async fn tail(&self, app: &str, limit: i64, deployment: Option<&str>) -> Result<Vec<LogRow>, StoreError> {
        let sql = format!(
            "SELECT {COLUMNS} FROM runtime_logs l JOIN runtime_log_sources s ON s.id = l.source \
             WHERE l.app = $1 AND ($2 = '' OR s.deployment_id = $2) ORDER BY l.seq DESC LIMIT $3"
        );
        on_db!(self, pool => {
            let rows = sqlx::query(&sql).bind(app).bind(deployment.unwrap_or("")).bind(limit).fetch_all(pool).await?;
            let mut lines: Vec<LogRow> = rows.iter().map(row).collect();
            lines.reverse();
            Ok(lines)
        })
    }

    /// The newest time stored for `container` among the app's newest
    /// `scan` lines, and how many of its lines have exactly that time: what
    /// a restarted control plane checks an agent's repeats against.
    pub async fn newest_of_container(&self, app: &str, container: &str, scan: i64) -> Result<Option<(i64, u32)>, StoreError> {
        on_db!(self, pool => {
            let rows = sqlx::query(
                "SELECT l.ts_ns, s.container FROM runtime_logs l JOIN runtime_log_sources s ON s.id = l.source \
                 WHERE l.app = $1 ORDER BY l.ts_ns DESC, l.id DESC LIMIT $2",
            )
            .bind(app)
            .bind(scan)
            .fetch_all(pool)
            .await?;
            let mut newest: Option<(i64, u32)> = None;
            for r in &rows {
                if r.get::<String, _>("container") != container {
                    continue;
                }
                let ts: i64 = r.get("ts_ns");
                match &mut newest {
                    None => newest = Some((ts, 1)),
                    Some((at, count)) if *at == ts => *count += 1,
                    Some(_) => break,
                }
            }
            Ok(newest)
        })
    }

    /// The highest line number stored (a restarted control plane numbers
    /// above it).
    pub async fn max_seq(&self) -> Result<i64, StoreError> {
        on_db!(self, pool => {
            let row = sqlx::query("SELECT CAST(COALESCE(MAX(seq), 0) AS BIGINT) AS seq FROM runtime_logs").fetch_one(pool).await?;
            Ok(row.get("seq"))
        })
    }

    /// What every app holds, largest first.
    pub async fn usage(&self) -> Result<Vec<LogUsageRow>, StoreError> {
        on_db!(self, pool => {
            let rows = sqlx::query("SELECT app, lines, bytes, pruned, dropped FROM runtime_log_usage ORDER BY bytes DESC, app").fetch_all(pool).await?;
            Ok(rows.iter().map(usage).collect())
        })
    }

    /// What one app holds.
    pub async fn app_usage(&self, app: &str) -> Result<LogUsageRow, StoreError> {
        on_db!(self, pool => {
            let row = sqlx::query("SELECT app, lines, bytes, pruned, dropped FROM runtime_log_usage WHERE app = $1").bind(app).fetch_optional(pool).await?;
            Ok(row.map(|r| usage(&r)).unwrap_or_else(|| LogUsageRow { app: app.to_string(), ..LogUsageRow::default() }))
        })
    }

    /// Deletes up to `max_lines` of the app's oldest lines, only those
    /// older than `older_than_ns` when given; returns (lines, bytes)
    /// deleted, counted as pruned.
    pub async fn prune_oldest(&self, app: &str, older_than_ns: Option<i64>, max_lines: i64) -> Result<(i64, i64), StoreError> {
        on_db!(self, pool => {
            let mut tx = pool.begin().await?;
            let rows = sqlx::query(
                "DELETE FROM runtime_logs WHERE id IN \
                 (SELECT id FROM runtime_logs WHERE app = $1 AND ts_ns < $2 ORDER BY ts_ns, id LIMIT $3) RETURNING bytes",
            )
            .bind(app)
            .bind(older_than_ns.unwrap_or(i64::MAX))
            .bind(max_lines)
            .fetch_all(&mut *tx)
            .await?;
            let lines = i64::try_from(rows.len()).unwrap_or(i64::MAX);
            let bytes: i64 = rows.iter().map(|r| r.get::<i64, _>("bytes")).sum();
            if lines > 0 {
                sqlx::query(
                    "UPDATE runtime_log_usage SET lines = CASE WHEN lines > $2 THEN lines - $2 ELSE 0 END, \
                     bytes = CASE WHEN bytes > $3 THEN bytes - $3 ELSE 0 END, pruned = pruned + $2 WHERE app = $1",
                )
                .bind(app)
                .bind(lines)
                .bind(bytes)
                .execute(&mut *tx)
                .await?;
            }
            tx.commit().await?;
            Ok((lines, bytes))
        })
    }

    /// Deletes every line of an app (deleted, or its name given back) and
    /// what was counted of it.
    pub async fn forget(&self, app: &str) -> Result<(), StoreError> {
        on_db!(self, pool => {
            let mut tx = pool.begin().await?;
            sqlx::query("DELETE FROM runtime_logs WHERE app = $1").bind(app).execute(&mut *tx).await?;
            sqlx::query("DELETE FROM runtime_log_sources WHERE app = $1").bind(app).execute(&mut *tx).await?;
            sqlx::query("DELETE FROM runtime_log_usage WHERE app = $1").bind(app).execute(&mut *tx).await?;
            tx.commit().await?;
            Ok(())
        })
    }

    /// The apps that have lines or counts here.
    pub async fn apps(&self) -> Result<Vec<String>, StoreError> {
        on_db!(self, pool => {
            let rows = sqlx::query("SELECT app FROM runtime_log_usage ORDER BY app").fetch_all(pool).await?;
            Ok(rows.iter().map(|r| r.get("app")).collect())
        })
    }

    /// Bytes the store takes on disk: the SQLite file (and its write-ahead
    /// log), or PostgreSQL's size of the tables and their indexes.
    pub async fn disk_bytes(&self) -> Result<i64, StoreError> {
        match &self.db {
            Db::Sqlite(pool) => {
                let pages: i64 = sqlx::query("PRAGMA page_count").fetch_one(pool).await?.get(0);
                let size: i64 = sqlx::query("PRAGMA page_size").fetch_one(pool).await?.get(0);
                let wal = self.path.as_ref().and_then(|p| std::fs::metadata(p.with_extension("db-wal")).ok()).map_or(0, |m| m.len());
                Ok(pages * size + i64::try_from(wal).unwrap_or(0))
            }
            Db::Postgres(pool) => {
                let row = sqlx::query(
                    "SELECT CAST(pg_total_relation_size('runtime_logs') + pg_total_relation_size('runtime_log_sources') AS BIGINT) AS bytes",
                )
                .fetch_one(pool)
                .await?;
                Ok(row.get("bytes"))
            }
        }
    }

    /// Removes sources no line refers to any more (after pruning).
    pub async fn drop_unused_sources(&self) -> Result<u64, StoreError> {
        on_db!(self, pool => {
            let done = sqlx::query("DELETE FROM runtime_log_sources WHERE NOT EXISTS (SELECT 1 FROM runtime_logs l WHERE l.source = runtime_log_sources.id)")
                .execute(pool)
                .await?;
            Ok(done.rows_affected())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_engines::open;

    fn line(app: &str, instance: u32, ts_ns: i64, seq: i64, text: &str) -> NewLogLine {
        NewLogLine {
            source: LogSource {
                app: app.into(),
                container: format!("cw-{app}-{instance}"),
                deployment_id: "dep_1".into(),
                node_id: "n-1".into(),
                instance,
            },
            ts_ns,
            seq,
            stream: if text.contains("ERROR") { "stderr".into() } else { "stdout".into() },
            line: text.into(),
        }
    }

    async fn logs_of(store: &Store) -> (LogStore, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let logs = LogStore::beside(store, dir.path(), "t").await.unwrap();
        (logs, dir)
    }

    crate::test_engines::both_engines! {
    async fn lines_are_searched_by_time_words_instance_and_stream(store) {
        let (logs, _dir) = logs_of(store).await;
        let mut batch = Vec::new();
        for i in 0..1000i64 {
            let text = if i % 10 == 0 { format!("ERROR request {i} failed") } else { format!("GET /item/{i} 200") };
            batch.push(line("web", 1 + u32::try_from(i % 2).unwrap(), 1_000 + i, i + 1, &text));
        }
        batch.push(line("other", 1, 1_500, 2_000, "ERROR in another app"));
        logs.insert(&batch).await.unwrap();
        let all = |limit| LogFilter { app: "web", limit, ..LogFilter::default() };
        let newest = logs.search(&all(3)).await.unwrap();
        assert_eq!(newest.iter().map(|r| r.ts_ns).collect::<Vec<_>>(), [1999, 1998, 1997], "newest first");
        // Words: every ERROR line of web, no other app's.
        let errors = logs.search(&LogFilter { words: vec!["error".into()], ..all(1000) }).await.unwrap();
        assert_eq!(errors.len(), 100);
        assert!(errors.iter().all(|r| r.line.starts_with("ERROR request")));
        let both = logs.search(&LogFilter { words: vec!["ERROR".into(), "990".into()], ..all(1000) }).await.unwrap();
        assert_eq!(both.len(), 1);
        assert_eq!(both[0].line, "ERROR request 990 failed");
        // A time range, an instance and a stream.
        let range = logs.search(&LogFilter { since_ns: Some(1_100), until_ns: Some(1_200), ..all(1000) }).await.unwrap();
        assert_eq!(range.len(), 100);
        assert_eq!((range[0].ts_ns, range[99].ts_ns), (1_199, 1_100));
        let second = logs.search(&LogFilter { instance: Some(2), ..all(1000) }).await.unwrap();
        assert_eq!(second.len(), 500);
        assert!(second.iter().all(|r| r.instance == 2 && r.container == "cw-web-2"));
        let stderr = logs.search(&LogFilter { stream: Some("stderr"), ..all(1000) }).await.unwrap();
        assert_eq!(stderr.len(), 100);
        // Pages: each goes on after the last line of the one before.
        let mut seen = Vec::new();
        let mut before = None;
        loop {
            let page = logs.search(&LogFilter { before, ..all(300) }).await.unwrap();
            let Some(last) = page.last() else { break };
            before = Some((last.ts_ns, last.id));
            seen.extend(page.iter().map(|r| r.seq));
        }
        assert_eq!(seen.len(), 1000);
        assert!(seen.windows(2).all(|w| w[0] > w[1]));
        // Words with quotes and operators are words, never syntax.
        assert!(logs.search(&LogFilter { words: vec!["\"OR".into(), "NEAR(".into()], ..all(10) }).await.unwrap().is_empty());
        // Tail and resume.
        let tail = logs.tail("web", 2, None).await.unwrap();
        assert_eq!(tail.iter().map(|r| r.seq).collect::<Vec<_>>(), [999, 1000]);
        assert_eq!(logs.after_seq("web", 998, 10, None).await.unwrap().len(), 2);
        assert_eq!(logs.max_seq().await.unwrap(), 2_000);
        assert_eq!(logs.newest_of_container("web", "cw-web-2", 100).await.unwrap(), Some((1_999, 1)));
        assert_eq!(logs.newest_of_container("web", "cw-web-9", 100).await.unwrap(), None);
        let usage = logs.app_usage("web").await.unwrap();
        assert_eq!(usage.lines, 1000);
        assert!(usage.bytes > 1000 * LINE_OVERHEAD);
    }

    async fn oldest_lines_are_pruned_and_counted(store) {
        let (logs, _dir) = logs_of(store).await;
        let batch: Vec<NewLogLine> = (0..100).map(|i| line("web", 1, i, i + 1, "hello world")).collect();
        logs.insert(&batch).await.unwrap();
        let before = logs.app_usage("web").await.unwrap();
        // By age: only those older than 30.
        let (lines, bytes) = logs.prune_oldest("web", Some(30), 1000).await.unwrap();
        assert_eq!(lines, 30);
        assert_eq!(bytes, 30 * batch[0].bytes());
        // By size: the 10 oldest left.
        assert_eq!(logs.prune_oldest("web", None, 10).await.unwrap().0, 10);
        let after = logs.app_usage("web").await.unwrap();
        assert_eq!(after.lines, 60);
        assert_eq!(after.bytes, before.bytes - 40 * batch[0].bytes());
        assert_eq!(after.pruned, 40);
        let oldest = logs.search(&LogFilter { app: "web", limit: 1000, ..LogFilter::default() }).await.unwrap();
        assert_eq!(oldest.last().unwrap().ts_ns, 40);
        // The words of pruned lines are gone with them.
        assert_eq!(logs.search(&LogFilter { app: "web", words: vec!["hello".into()], limit: 1000, ..LogFilter::default() }).await.unwrap().len(), 60);
        logs.count_dropped("web", 7).await.unwrap();
        assert_eq!(logs.app_usage("web").await.unwrap().dropped, 7);
        assert!(logs.disk_bytes().await.unwrap() > 0);
        logs.forget("web").await.unwrap();
        assert!(logs.tail("web", 10, None).await.unwrap().is_empty());
        assert_eq!(logs.app_usage("web").await.unwrap(), LogUsageRow { app: "web".into(), ..LogUsageRow::default() });
        assert_eq!(logs.drop_unused_sources().await.unwrap(), 0);
    }
    }

    #[tokio::test]
    async fn a_damaged_log_file_is_moved_aside_and_a_new_one_started() {
        let store = open(Engine::Sqlite).await;
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(LOGS_FILE), vec![7u8; 8192]).unwrap();
        let logs = LogStore::beside(&store, dir.path(), "s1").await.unwrap();
        logs.insert(&[line("web", 1, 1, 1, "fresh")]).await.unwrap();
        assert!(dir.path().join(format!("{LOGS_FILE}.damaged-s1")).exists(), "kept, not deleted");
        assert_eq!(logs.tail("web", 5, None).await.unwrap().len(), 1);
    }
}
