//! `cloudweb-bench agent`: the agent's resident memory idle and with 50 app
//! containers, and how long one usage sample takes (and how many Docker
//! calls it makes) with 0, 1, 20, 50 and 100 containers (`--containers`),
//! with the verdicts of issues 5 and 9's targets. The containers are
//! started directly with the agent's labels (the agent only samples them;
//! no deploy is measured here).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};

use crate::deploy::cluster::{Binaries, Cluster, ExtraFlags};
use crate::docker::docker;
use crate::procstat::{mib, sample};
use crate::server::sibling_binary;
use crate::target::{Cmp, Target};

#[derive(clap::Args)]
pub struct Args {
    /// The Docker distribution registry binary.
    #[arg(long, default_value = "/usr/bin/docker-registry")]
    registry_bin: PathBuf,
    /// Image the simulated app containers run (it must have `sleep`).
    #[arg(long, default_value = "cloudweb-test/busybox:latest")]
    image: String,
    /// Container counts at which a usage sample is timed, ascending (1 to 200).
    #[arg(long, value_delimiter = ',', default_values_t = vec![1, 20, 50, 100], value_parser = clap::value_parser!(u32).range(1..=200))]
    containers: Vec<u32>,
}

/// A usage sample's `took_ms` and `docker_calls` (`None` for an agent that
/// does not log them).
type Taken = (u64, Option<u64>);

/// The `took_ms` and `docker_calls` of the last "usage sample taken" line
/// that counted `containers` containers (calls are `None` for an agent that
/// does not log them).
fn last_sample(log: &str, containers: usize) -> Option<Taken> {
    let field = |line: &str, name: &str| -> Option<u64> { line.split(&format!("{name}=")).nth(1)?.split_whitespace().next()?.parse().ok() };
    log.lines()
        .rev()
        .filter(|l| l.contains("usage sample taken") && l.contains(&format!("containers={containers}")))
        .find_map(|l| Some((field(l, "took_ms")?, field(l, "docker_calls"))))
}

fn describe(sample: Option<Taken>) -> String {
    match sample {
        Some((ms, Some(calls))) => format!("{ms} ms, {calls} Docker calls"),
        Some((ms, None)) => format!("{ms} ms"),
        None => "not seen".into(),
    }
}

pub async fn run(args: Args) -> Result<Vec<Target>> {
    if args.image.starts_with('-') || args.image.contains(char::is_whitespace) {
        bail!("--image must be an image reference");
    }
    if args.containers.is_empty() || args.containers.windows(2).any(|pair| pair[0] >= pair[1]) {
        bail!("--containers must be strictly ascending counts");
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

async fn measure(cluster: &mut Cluster, args: &Args) -> Result<Vec<Target>> {
    let pid = cluster.agent_pid().context("the agent is not running")?;
    tokio::time::sleep(Duration::from_secs(6)).await;
    let idle = sample(pid).context("agent /proc")?;
    println!("agent: idle RSS {} (peak {})", mib(idle.rss_bytes), mib(idle.peak_rss_bytes));
    let log = std::fs::read_to_string(&cluster.agent_log).unwrap_or_default();
    let none = last_sample(&log, 0);
    println!("   0 containers: one usage sample took {}", describe(none));
    let mut samples = vec![(0usize, none)];
    let mut started = 0;
    for target in args.containers.iter().map(|&n| n as usize) {
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
        let taken = last_sample(&log, target);
        let rss = sample(pid).context("agent /proc")?;
        println!("{target:>4} containers: one usage sample took {}; agent RSS {} (peak {})", describe(taken), mib(rss.rss_bytes), mib(rss.peak_rss_bytes));
        samples.push((target, taken));
    }
    Ok(targets(idle.rss_bytes, &samples))
}

/// Issue 5: idle RSS under 15 MiB. Issue 9, item 18: a usage sample of
/// 100 containers under 100 ms, no Docker call with no container, at most
/// two Docker calls per sample. The sample time is judged at the largest
/// count measured (100 unless `--containers` says otherwise) against 1 ms
/// per container, issue 9's limit pro rata (the sample reads one cgroup
/// per container). `samples` holds (containers, (took_ms, docker_calls)).
fn targets(idle_rss: u64, samples: &[(usize, Option<Taken>)]) -> Vec<Target> {
    let (largest, at_largest) = samples.last().copied().unwrap_or((0, None));
    let calls_at = |taken: Option<Taken>| taken.and_then(|(_, calls)| calls).map(|c| c as f64);
    let most_calls = samples.iter().map(|&(_, taken)| calls_at(taken)).try_fold(0.0f64, |most, calls| calls.map(|c| most.max(c)));
    vec![
        Target::below("agent idle RSS", 15.0, "MiB", Some(idle_rss as f64 / (1024.0 * 1024.0))),
        Target::below(format!("one usage sample with {largest} containers"), largest as f64, "ms", at_largest.map(|(ms, _)| ms as f64)),
        Target::new("Docker calls in a usage sample with no container", Cmp::AtMost, 0.0, "", calls_at(samples[0].1)),
        Target::new("Docker calls in any one usage sample", Cmp::AtMost, 2.0, "", most_calls),
    ]
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

    #[test]
    fn a_count_never_seen_is_not_met() {
        let judged = targets(10 << 20, &[(0, Some((1, Some(0)))), (20, Some((40, Some(0)))), (100, None)]);
        assert!(judged[0].met() && judged[2].met());
        assert!(!judged[1].met(), "{}", judged[1].verdict());
        assert!(!judged[3].met(), "a sample without a call count is not judged met");
    }
}
