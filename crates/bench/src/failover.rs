//! `cloudweb-bench failover` (issue 24): two control-plane replicas on one
//! PostgreSQL database (a real server the bench starts: Debian's `initdb`
//! and `postgres` on a Unix socket), the second given the first's master
//! key. Each round kills the leader with SIGKILL, as the loss of its host
//! would, and measures the time until the other replica leads with a new
//! term (`cloudweb_leader` and `cloudweb_leader_term` on `/metrics`); the
//! killed one then starts again, as a follower. One real agent
//! (`cloudweb-agent run`, heartbeats every second) joined
//! through the first replica fails over with the leader: the bench also
//! measures the time until the new leader takes its heartbeats
//! (`cloudweb_heartbeats_total`), and, for a deploy asked for through the
//! surviving replica right after the kill (placed there at once), the
//! time until the agent acknowledged its deploy command (delivered by the
//! new leader). Prints the median and the p99 over the rounds against the
//! issue's 15 s and 10 s.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::server::{sibling_binary, Server};
use crate::target::{Cmp, Target};

#[derive(clap::Args)]
pub struct Args {
    /// Kills of the leader.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..=1000))]
    kills: u32,
    /// The replicas' `--leader-lease-seconds` (the default is the server's).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(2..=300))]
    lease_seconds: u64,
    /// The `cloudweb-server` binary (default: next to this one).
    #[arg(long)]
    server_bin: Option<std::path::PathBuf>,
    /// The `cloudweb-agent` binary (default: next to this one).
    #[arg(long)]
    agent_bin: Option<std::path::PathBuf>,
}

/// Joins one agent through `server` and starts it; it heartbeats every
/// second, with the host's Docker (its builds fail before they start a
/// container: their repository does not resolve).
async fn start_agent(server: &Server, agent_bin: &Path, dir: &Path) -> Result<(crate::process::Guarded, String)> {
    let data_dir = dir.join("agent");
    let node_id = server.join_agent(agent_bin, &data_dir, "failover-agent", &[]).await?;
    let mut command = std::process::Command::new(agent_bin);
    command
        .arg("--data-dir")
        .arg(&data_dir)
        .args(["run", "--heartbeat-interval-seconds", "1", "--publish-ip", "127.0.0.1", "--advertise-host", "127.0.0.1"])
        .env("CLOUDWEB_LOG", "info")
        .env("NO_COLOR", "1");
    Ok((crate::process::Guarded::spawn(command, &dir.join("agent.log"), Duration::from_secs(5))?, node_id))
}

/// Asks `server` (a follower: the leader was just killed) for a deploy of
/// `app`; the scheduler places it at once, on the replica asked. Returns
/// the number of deploy commands queued for the node before.
async fn deploy_through(server: &Server, app: &str, node: &str) -> Result<usize> {
    let before = deploy_commands(server, node).await?.len();
    let (status, body) = server.call(reqwest::Method::POST, &format!("/api/apps/{app}/deploy"), Some(&serde_json::json!({}))).await?;
    if status != 201 {
        bail!("the deploy through the follower answered {status}: {body}");
    }
    Ok(before)
}

/// The node's deploy commands, newest first, as (acknowledged).
async fn deploy_commands(server: &Server, node: &str) -> Result<Vec<bool>> {
    let (status, body) = server.call(reqwest::Method::GET, &format!("/api/nodes/{node}/commands"), None).await?;
    if status != 200 {
        bail!("the node's commands answered {status}: {body}");
    }
    let list = body["commands"].as_array().context("no commands list")?;
    Ok(list.iter().filter(|c| c["type"] == "deploy").map(|c| !c["acked_at"].is_null()).collect())
}

/// Waits until the node acknowledged a deploy command newer than the
/// `before` it had: the placement reached the agent through the new
/// leader.
async fn wait_placed(server: &Server, node: &str, before: usize, within: Duration) -> Result<()> {
    let start = Instant::now();
    loop {
        let commands = deploy_commands(server, node).await.unwrap_or_default();
        if commands.len() > before && commands[0] {
            return Ok(());
        }
        if start.elapsed() > within {
            let (_, list) = server.call(reqwest::Method::GET, &format!("/api/nodes/{node}/commands"), None).await?;
            let (_, deployments) = server.call(reqwest::Method::GET, "/api/apps/failover/deployments", None).await?;
            bail!("the deploy placed after the kill did not reach the agent within {} s: commands {list}, deployments {deployments}", within.as_secs());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until `server` has taken more than `before` heartbeats.
async fn wait_heartbeats(server: &Server, before: f64, within: Duration) -> Result<()> {
    let start = Instant::now();
    while server.metric("cloudweb_heartbeats_total").await.unwrap_or(0.0) <= before {
        if start.elapsed() > within {
            bail!("the agent did not heartbeat the new leader within {} s", within.as_secs());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

async fn leads(server: &Server) -> Option<i64> {
    let on = server.metric("cloudweb_leader").await.ok()?;
    let term = server.metric("cloudweb_leader_term").await.ok()?;
    (on == 1.0).then_some(term as i64)
}

async fn wait_leading(server: &Server, after_term: i64, within: Duration) -> Result<(i64, Duration)> {
    let start = Instant::now();
    loop {
        if let Some(term) = leads(server).await.filter(|term| *term > after_term) {
            return Ok((term, start.elapsed()));
        }
        if start.elapsed() > within {
            bail!("no replica led within {} s", within.as_secs());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn prepare_replica(first: &Path, dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir.join("server"))?;
    for file in ["master.key", "admin-token"] {
        std::fs::copy(first.join("server").join(file), dir.join("server").join(file)).with_context(|| format!("copying {file}"))?;
    }
    Ok(())
}

pub async fn run(args: Args) -> Result<Vec<Target>> {
    let binary = sibling_binary("cloudweb-server", args.server_bin.clone())?;
    let agent_bin = sibling_binary("cloudweb-agent", args.agent_bin.clone())?;
    let postgres = tokio::task::spawn_blocking(cloudweb_test_support::postgres::TestPostgres::start).await?;
    postgres.create_database("cloudweb");
    let url = postgres.url("cloudweb");
    let lease = args.lease_seconds.to_string();
    let flags = ["--database-url", url.as_str(), "--leader-lease-seconds", lease.as_str()];
    let dirs = [tempfile::tempdir()?, tempfile::tempdir()?];
    let bound = Duration::from_secs(args.lease_seconds * 3 + 10);
    let first = Server::start(&binary, dirs[0].path(), &flags).await?;
    let (mut term, _) = wait_leading(&first, 0, bound).await.context("the first replica")?;
    prepare_replica(dirs[0].path(), dirs[1].path())?;
    let second = Server::start(&binary, dirs[1].path(), &flags).await?;
    let mut servers = [first, second];
    let agent_dir = tempfile::tempdir()?;
    let (_agent, node) = start_agent(&servers[0], &agent_bin, agent_dir.path()).await?;
    // An app to place after each kill. Its repository's host does not
    // resolve, so each build fails at once and the agent acknowledges the
    // deploy command: what is measured is the placement reaching it.
    let app = serde_json::json!({"name": "failover", "repo_url": "https://git.example.com/failover.git", "port": 8080});
    let (status, body) = servers[0].call(reqwest::Method::POST, "/api/apps", Some(&app)).await?;
    if status != 201 {
        bail!("creating the app answered {status}: {body}");
    }
    // Once the answers list both replicas (three renewals at most), the
    // agent knows where to go.
    let kept = agent_dir.path().join("agent").join("control-planes.json");
    let learning = Instant::now();
    while !std::fs::read_to_string(&kept).is_ok_and(|text| text.contains(&servers[1].agent_url)) {
        if learning.elapsed() > bound {
            bail!("the agent did not learn the second replica; see {}", agent_dir.path().join("agent.log").display());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!("failover: 2 replicas on PostgreSQL, lease {} s, {} kills of the leader", args.lease_seconds, args.kills);
    let mut took = Vec::new();
    let mut moved = Vec::new();
    let mut placed = Vec::new();
    for round in 1..=args.kills {
        let leader = if leads(&servers[0]).await.is_some() { 0 } else { 1 };
        let other = 1 - leader;
        let beats_before = servers[other].metric("cloudweb_heartbeats_total").await.unwrap_or(0.0);
        servers[leader].kill();
        let killed = Instant::now();
        let before = deploy_through(&servers[other], "failover", &node).await.with_context(|| format!("round {round}"))?;
        let (new_term, _) = wait_leading(&servers[other], term, bound).await.with_context(|| format!("round {round}"))?;
        let elapsed = killed.elapsed();
        wait_heartbeats(&servers[other], beats_before, bound).await.with_context(|| format!("round {round}"))?;
        let agent_moved = killed.elapsed();
        wait_placed(&servers[other], &node, before, bound).await.with_context(|| format!("round {round}"))?;
        let placement = killed.elapsed();
        println!(
            "  kill {round}: term {term} -> {new_term}, a new leader after {:.2} s, the agent heartbeating it after {:.2} s, a deploy asked for after the kill reached it after {:.2} s",
            elapsed.as_secs_f64(),
            agent_moved.as_secs_f64(),
            placement.as_secs_f64()
        );
        placed.push(placement.as_secs_f64());
        took.push(elapsed.as_secs_f64());
        moved.push(agent_moved.as_secs_f64());
        term = new_term;
        servers[leader].start_again().await?;
    }
    let (median, p99, max) = median_p99_max(&mut took);
    println!("time from kill -9 of the leader to a new leader: median {median:.2} s, p99 {p99:.2} s, max {max:.2} s");
    let (agent_median, agent_p99, agent_max) = median_p99_max(&mut moved);
    println!("time from kill -9 of the leader to the agent heartbeating the new one: median {agent_median:.2} s, p99 {agent_p99:.2} s, max {agent_max:.2} s");
    drop(servers);
    drop(postgres);
    // The agent heartbeats the new leader once it leads; what it adds to
    // the new leader's time is what the 10 s bound is about.
    let agent_after_leader: Vec<f64> = moved.iter().zip(&took).map(|(m, t)| m - t).collect();
    let mut agent_after_leader = agent_after_leader;
    let (extra_median, extra_p99, _) = median_p99_max(&mut agent_after_leader);
    println!("the agent's part (after the new leader leads): median {extra_median:.2} s, p99 {extra_p99:.2} s");
    let (placed_median, placed_p99, _) = median_p99_max(&mut placed);
    println!("time from kill -9 of the leader to the next placement reaching the agent: median {placed_median:.2} s, p99 {placed_p99:.2} s");
    Ok(vec![
        Target::new("new leader after a kill -9 of the leader, median", Cmp::AtMost, 15.0, "s", Some(median)),
        Target::new("new leader after a kill -9 of the leader, p99", Cmp::AtMost, 15.0, "s", Some(p99)),
        Target::new("agent heartbeating the new leader once it leads, p99", Cmp::AtMost, 10.0, "s", Some(extra_p99)),
        // No issue set a bound of its own: the new leader's 15 s.
        Target::new("next placement reaching the agent after a kill -9 of the leader, p99", Cmp::AtMost, 15.0, "s", Some(placed_p99)),
    ])
}

fn median_p99_max(values: &mut [f64]) -> (f64, f64, f64) {
    values.sort_by(f64::total_cmp);
    let median = values[values.len() / 2];
    let p99 = values[((values.len() as f64 * 0.99).ceil() as usize).clamp(1, values.len()) - 1];
    (median, p99, values[values.len() - 1])
}
