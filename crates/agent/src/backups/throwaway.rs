//! A database run in a throwaway container for a job: started from the
//! service's image on a directory of the job's, waited for until it
//! answers, loaded with a dump out of the repository (`restic dump` piped
//! into `pg_restore` or `mariadb`), counted (rows per table, keys), then
//! stopped and removed. Its container is named and labelled after its job,
//! so the job's clean-up, or the next agent start, removes it whatever
//! happens.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use cloudweb_protocol::ServiceKind;
use cloudweb_restic::Restic;

use super::Job;
use crate::runtime::Throwaway;

/// Longest wait for a throwaway database to answer (a first start
/// initializes its data).
const READY_LIMIT: Duration = Duration::from_secs(300);
/// How long a throwaway database gets to shut down cleanly.
const STOP_GRACE_SECONDS: i32 = 60;
/// How long a count may take.
const COUNT_LIMIT: Duration = Duration::from_secs(600);

/// A database running in a throwaway container, and how to reach it from
/// inside: as `user` on `database`, with `env` (its passwords) for each
/// command.
pub(super) struct Database {
    pub kind: ServiceKind,
    pub id: String,
    pub user: String,
    pub database: String,
    pub env: Vec<String>,
}

/// A password of the agent's making, for a throwaway database nothing
/// else reaches.
pub(super) fn random_password() -> String {
    use rand::Rng;
    rand::rng().sample_iter(rand::distr::Alphanumeric).take(32).map(char::from).collect()
}

/// Starts a throwaway container of `image` on `data_dir` (mounted at the
/// kind's data path), recorded first.
pub(super) async fn start(job: &Job, kind: ServiceKind, image: &str, env: &BTreeMap<String, String>, command: &[String], data_dir: &Path) -> Result<String, String> {
    for value in env.values() {
        job.add_secret(value);
    }
    // Redis takes its passwords as arguments.
    for pair in command.windows(2) {
        if pair[0] == "--requirepass" || pair[0] == "--masterauth" {
            job.add_secret(&pair[1]);
        }
    }
    job.runtime().ensure_image(image, None).await.map_err(|e| format!("cannot get image {image} on this node: {e}"))?;
    job.update(|r| r.throwaway = true)?;
    let spec = Throwaway {
        job_id: job.id.clone(),
        image: image.to_string(),
        env: env.iter().map(|(k, v)| format!("{k}={v}")).collect(),
        command: command.to_vec(),
        data_dir: data_dir.to_string_lossy().into_owned(),
        data_path: kind.data_path().to_string(),
    };
    let id = job.runtime().start_throwaway(&spec).await.map_err(|e| format!("cannot start a throwaway {} container: {e}", kind.as_str()))?;
    tracing::info!(job_id = %job.id, container = %id, image, "throwaway database started");
    Ok(id)
}

/// Runs `probe` in the container until it exits 0 (and, for `redis-cli
/// ping`, says PONG), or fails when the container exits or the wait runs
/// over.
pub(super) async fn wait_ready(job: &Job, id: &str, probe: &[String], env: &[String]) -> Result<(), String> {
    let limit = READY_LIMIT.min(job.left());
    let started = Instant::now();
    let wants_pong = probe.first().map(String::as_str) == Some("redis-cli");
    loop {
        let state = job.runtime().container_state(id).await.map_err(|e| format!("cannot inspect the throwaway container: {e}"))?;
        if !state.running {
            let logs = job.runtime().logs(id, 20).await.unwrap_or_default();
            let tail: Vec<String> = logs.into_iter().map(|(_, line)| line).collect();
            return Err(format!(
                "the throwaway database exited with code {} before it answered: {}",
                state.exit_code.unwrap_or(-1),
                cloudweb_protocol::misc::one_line(&tail.join(" | "), 1500)
            ));
        }
        if let Ok((Some(0), out)) = job.runtime().exec_output(id, probe, env, Duration::from_secs(10)).await {
            if !wants_pong || out.trim() == "PONG" {
                tracing::info!(job_id = %job.id, seconds = started.elapsed().as_secs_f64(), "throwaway database answers");
                return Ok(());
            }
        }
        if started.elapsed() > limit {
            return Err(format!("the throwaway database did not answer within {} s", limit.as_secs()));
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// The probe that tells a throwaway database of `kind` accepts
/// connections (over TCP: the images' first-start servers listen on their
/// socket only).
pub(super) fn probe(kind: ServiceKind, user: &str, database: &str) -> Vec<String> {
    match kind {
        ServiceKind::Postgres => ["pg_isready", "-q", "-h", "127.0.0.1", "-p", "5432", "-U", user, "-d", database].map(String::from).to_vec(),
        ServiceKind::Mariadb => ["mariadb-admin", "ping", "--protocol=tcp", "-h", "127.0.0.1", "--silent"].map(String::from).to_vec(),
        ServiceKind::Redis => ["redis-cli", "-h", "127.0.0.1", "ping"].map(String::from).to_vec(),
    }
}

/// Streams `file` of `snapshot` into the database (PostgreSQL and
/// MariaDB); the dump's bytes.
pub(super) async fn load(job: &Job, restic: &Restic, snapshot: &str, file: &str, db: &Database) -> Result<u64, String> {
    let (program, cmd) = match db.kind {
        ServiceKind::Postgres => ("pg_restore", ["pg_restore", "--no-owner", "--no-acl", "-U", &db.user, "-d", &db.database].map(String::from).to_vec()),
        ServiceKind::Mariadb => ("mariadb", ["mariadb", "--protocol=socket", "-uroot", "--batch", &db.database].map(String::from).to_vec()),
        ServiceKind::Redis => return Err("a Redis dump is not loaded through a client".into()),
    };
    let started = Instant::now();
    let mut exec = job.runtime().exec_attached(&db.id, &cmd, &db.env, false).await.map_err(|e| format!("cannot start {program}: {e}"))?;
    let dumped = restic.dump(snapshot, file, &mut exec.input, job.left()).await;
    let (code, text) = exec.finish().await.map_err(|e| format!("{program}: {e}"))?;
    let text = cloudweb_protocol::misc::one_line(text.trim(), 1500);
    match (code, dumped) {
        (Some(0), Ok(bytes)) => {
            tracing::info!(job_id = %job.id, bytes, seconds = started.elapsed().as_secs_f64(), "dump loaded");
            Ok(bytes)
        }
        // The tool's own words first: restic's write error is only the
        // consequence of its end.
        (Some(code), _) if code != 0 => Err(format!("{program} failed (exit {code}): {text}")),
        (_, Err(err)) => Err(format!("the dump could not be read back from the repository: {err}")),
        (None, _) => Err(format!("{program} did not report how it ended")),
        (Some(_), Ok(_)) => unreachable!("exit 0 with a dump is the first arm"),
    }
}

/// Rows per table (`schema.table`, or `database.table` for MariaDB), or
/// `keys` for Redis.
pub(super) async fn counts(job: &Job, db: &Database) -> Result<BTreeMap<String, u64>, String> {
    match db.kind {
        ServiceKind::Postgres => {
            let sql = "select coalesce(json_object_agg(name, n), '{}'::json) from (\
                select format('%s.%s', schemaname, tablename) as name, \
                (xpath('/row/c/text()', query_to_xml(format('select count(*) as c from %I.%I', schemaname, tablename), false, true, '')))[1]::text::bigint as n \
                from pg_tables where schemaname not in ('pg_catalog', 'information_schema')) t";
            let cmd = ["psql", "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-U", &db.user, "-d", &db.database, "-c", sql].map(String::from).to_vec();
            let out = run(job, db, &cmd).await?;
            serde_json::from_str::<BTreeMap<String, u64>>(out.trim()).map_err(|e| format!("cannot read the row counts: {e}"))
        }
        ServiceKind::Mariadb => {
            let list = format!(
                "select table_name from information_schema.tables where table_schema = '{}' and table_type = 'BASE TABLE' order by table_name",
                db.database
            );
            let base = ["mariadb", "--protocol=socket", "-uroot", "--batch", "--skip-column-names", "-e"].map(String::from).to_vec();
            let tables: Vec<String> = run(job, db, &[base.clone(), vec![list]].concat()).await?.lines().map(str::to_string).filter(|t| !t.is_empty()).collect();
            let mut counts = BTreeMap::new();
            for chunk in tables.chunks(200) {
                let union: Vec<String> = chunk
                    .iter()
                    .map(|table| {
                        let literal = table.replace('\\', "\\\\").replace('\'', "\\'");
                        let ident = table.replace('`', "``");
                        format!("select '{literal}', count(*) from `{}`.`{ident}`", db.database)
                    })
                    .collect();
                let out = run(job, db, &[base.clone(), vec![union.join(" union all ")]].concat()).await?;
                for line in out.lines() {
                    let (name, n) = line.rsplit_once('\t').ok_or_else(|| format!("cannot read a row count: {line:?}"))?;
                    let n = n.trim().parse::<u64>().map_err(|_| format!("cannot read a row count: {line:?}"))?;
                    counts.insert(format!("{}.{name}", db.database), n);
                }
            }
            Ok(counts)
        }
        ServiceKind::Redis => {
            let cmd = ["redis-cli", "-h", "127.0.0.1", "INFO", "keyspace"].map(String::from).to_vec();
            let out = run(job, db, &cmd).await?;
            Ok(BTreeMap::from([("keys".to_string(), keyspace_keys(&out))]))
        }
    }
}

/// The keys of every database in `INFO keyspace` (`db0:keys=3,...`).
pub(super) fn keyspace_keys(info: &str) -> u64 {
    info.lines()
        .filter(|line| line.starts_with("db"))
        .filter_map(|line| line.split_once(':')?.1.split(',').find_map(|kv| kv.strip_prefix("keys="))?.trim().parse::<u64>().ok())
        .sum()
}

/// A command in the throwaway container to its end; its output when it
/// exits 0.
pub(super) async fn run(job: &Job, db: &Database, cmd: &[String]) -> Result<String, String> {
    match job.runtime().exec_output(&db.id, cmd, &db.env, COUNT_LIMIT.min(job.left())).await {
        Ok((Some(0), out)) => Ok(out),
        Ok((Some(code), out)) => Err(format!("{} failed (exit {code}): {}", cmd[0], cloudweb_protocol::misc::one_line(out.trim(), 1000))),
        Ok((None, _)) => Err(format!("{} did not finish in time", cmd[0])),
        Err(err) => Err(format!("{}: {err}", cmd[0])),
    }
}

/// Stops the database (its own clean shutdown) and removes its container.
pub(super) async fn stop_cleanly(job: &Job, id: &str) -> Result<(), String> {
    let code = job.runtime().stop_within(id, STOP_GRACE_SECONDS).await.map_err(|e| format!("cannot stop the throwaway database: {e}"))?;
    remove(job, id).await?;
    match code {
        Some(0) => Ok(()),
        other => Err(format!("the restored database did not shut down cleanly (exit {other:?}); its data is not used")),
    }
}

/// Removes the throwaway container (any state).
pub(super) async fn remove(job: &Job, id: &str) -> Result<(), String> {
    job.runtime().kill_and_remove(id).await.map_err(|e| format!("cannot remove the throwaway container: {e}"))?;
    job.update(|r| r.throwaway = false)
}

#[cfg(test)]
mod tests {
    #[test]
    fn keys_of_every_database_are_summed() {
        let info = "# Keyspace\r\ndb0:keys=3,expires=0,avg_ttl=0\r\ndb2:keys=4,expires=1,avg_ttl=5\r\n";
        assert_eq!(super::keyspace_keys(info), 7);
        assert_eq!(super::keyspace_keys("# Keyspace\r\n"), 0);
        assert_eq!(super::random_password().len(), 32);
    }
}
