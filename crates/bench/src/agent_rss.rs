//! `cloudweb-bench agent`: the agent's resident memory idle and with 50 app
//! containers, and how long one usage sample takes (and how many Docker
//! calls it makes) with 0, 1, 20 and 100 containers. The containers are
//! started directly with the agent's labels (the agent only samples them;
//! no deploy is measured here).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};

use crate::deploy::cluster::{Binaries, Cluster, ExtraFlags};
use crate::docker::docker;
use crate::procstat::{mib, sample};
use crate::server::sibling_binary;

#[derive(clap::Args)]
pub struct Args {
    /// The Docker distribution registry binary.
    #[arg(long, default_value = "/usr/bin/docker-registry")]
    registry_bin: PathBuf,
    /// Image the simulated app containers run (it must have `sleep`).
    #[arg(long, default_value = "cloudweb-test/busybox:latest")]
    image: String,
}

/// The `took_ms` and `docker_calls` of the last "usage sample taken" line
/// that counted `containers` containers (calls are `None` for an agent that
/// does not log them).
fn last_sample(log: &str, containers: usize) -> Option<(u64, Option<u64>)> {
    let field = |line: &str, name: &str| -> Option<u64> { line.split(&format!("{name}=")).nth(1)?.split_whitespace().next()?.parse().ok() };
    log.lines()
        .rev()
        .filter(|l| l.contains("usage sample taken") && l.contains(&format!("containers={containers}")))
        .find_map(|l| Some((field(l, "took_ms")?, field(l, "docker_calls"))))
}

fn describe(sample: Option<(u64, Option<u64>)>) -> String {
    match sample {
        Some((ms, Some(calls))) => format!("{ms} ms, {calls} Docker calls"),
        Some((ms, None)) => format!("{ms} ms"),
        None => "not seen".into(),
    }
}

pub async fn run(args: Args) -> Result<()> {
    if args.image.starts_with('-') || args.image.contains(char::is_whitespace) {
        bail!("--image must be an image reference");
    }
    let binaries = Binaries {
        server: sibling_binary("cloudweb-server", None)?,
        agent: sibling_binary("cloudweb-agent", None)?,
        registry: args.registry_bin.clone(),
    };
    let dir = tempfile::tempdir()?;
    let extra = ExtraFlags { run: &["--metrics-interval-seconds", "2"], ..Default::default() };
    let mut cluster = Cluster::start_with(dir.path(), &binaries, "rssbench", &extra).await?;
    let result = measure(&mut cluster, &args).await;
    let _ = crate::docker::remove_labelled(&format!("cloudweb.node={}", cluster.node_id));
    drop(cluster);
    result
}

async fn measure(cluster: &mut Cluster, args: &Args) -> Result<()> {
    let pid = cluster.agent_pid().context("the agent is not running")?;
    tokio::time::sleep(Duration::from_secs(6)).await;
    let idle = sample(pid).context("agent /proc")?;
    println!("agent: idle RSS {} (peak {})", mib(idle.rss_bytes), mib(idle.peak_rss_bytes));
    let log = std::fs::read_to_string(&cluster.agent_log).unwrap_or_default();
    println!("   0 containers: one usage sample took {}", describe(last_sample(&log, 0)));
    let mut started = 0;
    for target in [1usize, 20, 50, 100] {
        while started < target {
            started += 1;
            docker(&[
                "run", "-d", "--name", &format!("cw-rssbench-{}-{started}", &cluster.node_id[2..8]),
                "--label", &format!("cloudweb.node={}", cluster.node_id),
                "--label", "cloudweb.app=rssbench", "--label", "cloudweb.deployment=dep_bench",
                "--label", &format!("cloudweb.instance={started}"),
                "--memory", "64m", &args.image, "sleep", "3600",
            ])?;
        }
        // Two samples after the last start, so one saw every container.
        tokio::time::sleep(Duration::from_secs(5)).await;
        let log = std::fs::read_to_string(&cluster.agent_log).unwrap_or_default();
        let took = describe(last_sample(&log, target));
        let rss = sample(pid).context("agent /proc")?;
        println!("{target:>4} containers: one usage sample took {took}; agent RSS {} (peak {})", mib(rss.rss_bytes), mib(rss.peak_rss_bytes));
    }
    println!("target: idle RSS under 15 MiB: {}", if idle.rss_bytes < 15 << 20 { "met" } else { "not met" });
    println!("target: a sample of 100 containers under 100 ms, no Docker call with none, at most two per sample");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_sample_times() {
        let log = "x INFO usage sample taken took_ms=12 containers=1\ny INFO usage sample taken took_ms=80 containers=20 docker_calls=2\n";
        assert_eq!(last_sample(log, 20), Some((80, Some(2))));
        assert_eq!(last_sample(log, 1), Some((12, None)));
        assert_eq!(last_sample(log, 100), None);
    }
}
