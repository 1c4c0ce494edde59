//! The PostgreSQL figures: a backup through cloud-web against the same dump
//! piped into restic by hand, and a restore in place to accepting
//! connections.

use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use reqwest::Method;
use serde_json::{json, Value};

use super::{after_snapshot, expect, median, phases, sync, until_done, Bench, Sizes};
use crate::server::Server;

const SERVICE: &str = "bench-pg";
/// MiB of database one pgbench scale unit makes (100,000 accounts, their
/// index and the small tables), as measured with PostgreSQL 15.
const MIB_PER_SCALE: f64 = 15.0;

pub struct Figures {
    pub scale: u64,
    pub size_mib: u64,
    /// Medians, seconds.
    pub ours: f64,
    pub hand: f64,
    pub ratio: f64,
    /// Median seconds of the cloud-web jobs past their snapshot.
    pub after: f64,
    pub restore: Restore,
}

/// Seconds from the restore's POST.
pub struct Restore {
    pub job: f64,
    pub healthy: f64,
    pub answered: f64,
}

fn container() -> String {
    format!("cw-svc.{SERVICE}")
}

/// SQL in the service's own container (its socket trusts local users).
fn psql(sql: &str) -> Result<String> {
    let out = Command::new("docker")
        .args(["exec", &container(), "psql", "-U", "app", "-d", "app", "-v", "ON_ERROR_STOP=1", "-tAc", sql])
        .output()
        .context("running docker exec psql")?;
    if !out.status.success() {
        bail!("psql {sql:?}: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

async fn service_state(server: &Server) -> Result<String> {
    let (_, view) = server.call(Method::GET, &format!("/api/services/{SERVICE}"), None).await?;
    Ok(view["state"].as_str().unwrap_or_default().to_string())
}

async fn until_healthy(server: &Server, limit: Duration) -> Result<()> {
    let started = Instant::now();
    while service_state(server).await? != "healthy" {
        if started.elapsed() > limit {
            bail!("service {SERVICE} was not healthy within {} s", limit.as_secs());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

/// One backup through cloud-web: its view and the time from the POST.
async fn through_cloudweb(server: &Server) -> Result<(Value, Duration)> {
    let posted = Instant::now();
    let job = expect(server.call(Method::POST, &format!("/api/services/{SERVICE}/backups"), None).await?, 202, "POST /api/services/{name}/backups")?;
    let id = job["id"].as_str().context("the job's id")?.to_string();
    until_done(server, &id, posted).await
}

/// The same dump by hand into the same repository.
fn by_hand(bench: &Bench) -> Result<Duration> {
    let script = "docker exec \"$1\" pg_dump -Fc -U app -d app | restic -r \"$2\" backup --stdin --stdin-filename app.dump --host bench-by-hand -q";
    let started = Instant::now();
    let out = Command::new("bash")
        .args(["-o", "pipefail", "-c", script, "bash", &container(), &bench.repository])
        .env("RESTIC_PASSWORD", &bench.password)
        .env("RESTIC_CACHE_DIR", bench.dir.join("restic-cache-by-hand"))
        .output()
        .context("running pg_dump | restic backup --stdin")?;
    let took = started.elapsed();
    if !out.status.success() {
        bail!("pg_dump | restic backup --stdin failed with {}: {}", out.status, String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(took)
}

pub async fn bench(bench: &Bench, sizes: &Sizes) -> Result<Figures> {
    let server = &bench.cluster.server;
    expect(server.call(Method::POST, "/api/services", Some(&json!({"name": SERVICE, "type": "postgres"}))).await?, 201, "POST /api/services")?;
    until_healthy(server, Duration::from_secs(120)).await?;
    let scale = ((sizes.mib as f64 / MIB_PER_SCALE).round() as u64).max(1);
    let filled = Instant::now();
    let out = tokio::task::block_in_place(|| {
        Command::new("docker").args(["exec", &container(), "pgbench", "-i", "-q", "-s", &scale.to_string(), "-U", "app", "app"]).output()
    })
    .context("running pgbench -i")?;
    if !out.status.success() {
        bail!("pgbench -i -s {scale} failed: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    let size: u64 = tokio::task::block_in_place(|| psql("SELECT pg_database_size('app')"))?.parse().context("the database's size")?;
    let accounts = scale * 100_000;
    println!(
        "PostgreSQL service {SERVICE}: pgbench -i -s {scale} ({accounts} accounts) in {:.1} s, database {} MiB",
        filled.elapsed().as_secs_f64(),
        size >> 20
    );

    // The repository's first write, untimed in the ratio.
    sync();
    let (first, took) = through_cloudweb(server).await?;
    println!(
        "first backup through cloud-web (the repository empty of it): {:.2} s POST -> succeeded ({}), dump {} bytes, {} added",
        took.as_secs_f64(),
        phases(&first),
        first["bytes"],
        first["added_bytes"]
    );
    let mut last = first["id"].as_str().context("the job's id")?.to_string();
    let (mut ours, mut hand, mut after) = (Vec::new(), Vec::new(), Vec::new());
    for run in 1..=sizes.runs {
        // Alternating which goes first, so that neither always follows the other.
        let mut a = None;
        let mut b = None;
        for side in if run % 2 == 1 { [0, 1] } else { [1, 0] } {
            sync();
            if side == 0 {
                let (job, took) = through_cloudweb(server).await?;
                last = job["id"].as_str().context("the job's id")?.to_string();
                a = Some((job, took));
            } else {
                b = Some(tokio::task::block_in_place(|| by_hand(bench))?);
            }
        }
        let ((job, a), b) = (a.expect("measured"), b.expect("measured"));
        println!(
            "PostgreSQL backup run {run}: cloud-web {:.2} s ({}; {} added), by hand {:.2} s",
            a.as_secs_f64(),
            phases(&job),
            job["added_bytes"],
            b.as_secs_f64()
        );
        after.push(after_snapshot(&job).unwrap_or(f64::NAN));
        ours.push(a.as_secs_f64());
        hand.push(b.as_secs_f64());
    }
    let (ours, hand) = (median(&ours), median(&hand));

    // The restore: the accounts table dropped first, so an answer with
    // every account in it is the backup's data.
    tokio::task::block_in_place(|| psql("DROP TABLE pgbench_accounts"))?;
    sync();
    let restore = restore(server, &last, accounts).await?;
    let (status, body) = server.call(Method::DELETE, &format!("/api/services/{SERVICE}?data=delete"), None).await?;
    if status != 204 {
        eprintln!("warning: DELETE /api/services/{SERVICE} answered {status}: {body}");
    }
    Ok(Figures { scale, size_mib: size >> 20, ours, hand, ratio: hand / ours, after: median(&after), restore })
}

/// `POST /api/backups/{backup}/restore` in place, then the job's end, the
/// service healthy, and a query counting `accounts` accounts, each timed
/// from the POST.
async fn restore(server: &Server, backup: &str, accounts: u64) -> Result<Restore> {
    let posted = Instant::now();
    let job = expect(server.call(Method::POST, &format!("/api/backups/{backup}/restore"), Some(&json!({}))).await?, 202, "POST /api/backups/{id}/restore")?;
    let id = job["id"].as_str().context("the restore's id")?.to_string();
    let (done, took) = until_done(server, &id, posted).await?;
    let job = took.as_secs_f64();
    until_healthy(server, Duration::from_secs(300)).await?;
    let healthy = posted.elapsed().as_secs_f64();
    let want = accounts.to_string();
    loop {
        let answer = tokio::task::block_in_place(|| psql("SELECT count(*) FROM pgbench_accounts"));
        match answer {
            Ok(count) if count == want => break,
            Ok(count) => bail!("the restored database holds {count} accounts, not {want}"),
            Err(_) if posted.elapsed() < Duration::from_secs(300) => tokio::time::sleep(Duration::from_millis(20)).await,
            Err(err) => return Err(err.context("the restored service did not answer within 300 s")),
        }
    }
    let answered = posted.elapsed().as_secs_f64();
    println!(
        "restore in place: job succeeded {job:.2} s after the POST ({}), service healthy at {healthy:.2} s, {want} accounts counted at {answered:.2} s; the replaced data kept as {}",
        phases(&done),
        done["kept_volume"]
    );
    Ok(Restore { job, healthy, answered })
}
