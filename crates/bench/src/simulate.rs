//! `cloudweb-bench simulate`: many seeds of the deterministic simulation
//! (`crates/sim`: the real store and deployment code, simulated agents,
//! control-plane kills at any commit), counted by the invariant each
//! failing seed broke first. `--seed N` replays one seed and prints its
//! report. CI runs seeds 1–1,000 (`crates/sim/tests/seeds.rs`); this runs
//! a hundred thousand by default.

use std::time::Instant;

use anyhow::{bail, Result};
use cloudweb_sim::{run as run_seed, survey, Options, Survey};

use crate::target::{Cmp, Target};

#[derive(clap::Args)]
pub struct Args {
    /// Seeds to run.
    #[arg(long, default_value_t = 100_000)]
    seeds: u64,
    /// The first seed.
    #[arg(long, default_value_t = 1)]
    first: u64,
    /// Replay this one seed and print its report.
    #[arg(long)]
    seed: Option<u64>,
    /// Threads, each with its own share of the seeds (default: the cores).
    #[arg(long)]
    jobs: Option<usize>,
    /// Agents that do not pin the commit of a deployment's first build
    /// (the agent before 0.2.0's fix): the control plane must still keep
    /// every deployment's commit true.
    #[arg(long)]
    no_pin: bool,
    /// Check the invariants only once the cluster settled, not at every
    /// commit (faster; finds only end states).
    #[arg(long)]
    settled_only: bool,
}

fn options(args: &Args, seed: u64) -> Options {
    let mut options = Options::new(seed);
    options.pin_commits = !args.no_pin;
    options.check_every_step = !args.settled_only;
    options
}

pub async fn run(args: Args) -> Result<Vec<Target>> {
    if let Some(seed) = args.seed {
        let options = options(&args, seed);
        let started = Instant::now();
        let outcome = tokio::task::spawn_blocking(move || run_seed(&options)).await?;
        return match outcome {
            Ok(outcome) => {
                println!(
                    "seed {seed}: no invariant broken ({} steps, {} kills, {} crashes, {} deployments, {} commits) in {:.2} s",
                    outcome.steps,
                    outcome.kills,
                    outcome.crashes,
                    outcome.deployments,
                    outcome.commits,
                    started.elapsed().as_secs_f64()
                );
                Ok(vec![Target::new(format!("seed {seed} broke an invariant"), Cmp::AtMost, 0.0, "", Some(0.0))])
            }
            Err(failure) => bail!("{failure}"),
        };
    }
    let jobs = args.jobs.unwrap_or_else(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)).clamp(1, 64) as u64;
    let started = Instant::now();
    let share = args.seeds.div_ceil(jobs);
    let mut handles = Vec::new();
    for job in 0..jobs {
        let first = args.first + job * share;
        let count = share.min((args.first + args.seeds).saturating_sub(first));
        let (pin, every) = (!args.no_pin, !args.settled_only);
        handles.push(tokio::task::spawn_blocking(move || {
            survey(first, count, |seed| {
                let mut options = Options::new(seed);
                options.pin_commits = pin;
                options.check_every_step = every;
                options
            })
        }));
    }
    let mut total = Survey::default();
    for handle in handles {
        let part = handle.await?;
        total.runs += part.runs;
        total.kills += part.kills;
        total.crashes += part.crashes;
        total.deployments += part.deployments;
        for (invariant, seeds) in part.failures {
            total.failures.entry(invariant).or_default().extend(seeds);
        }
        if total.first.is_none() {
            total.first = part.first;
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    println!(
        "simulate: {} seeds from {} on {jobs} thread(s) in {elapsed:.1} s ({:.0} seeds/s): {} deployments, {} control-plane kills, {} crashes of every instance",
        total.runs,
        args.first,
        total.runs as f64 / elapsed.max(0.001),
        total.deployments,
        total.kills,
        total.crashes
    );
    let failing: usize = total.failures.values().map(Vec::len).sum();
    for (invariant, seeds) in &total.failures {
        let mut seeds = seeds.clone();
        seeds.sort_unstable();
        println!("  \"{invariant}\": {} seed(s), first {:?}", seeds.len(), &seeds[..seeds.len().min(10)]);
    }
    if let Some(first) = &total.first {
        println!("{first}");
    }
    // Issue 32: every seed keeps every invariant.
    Ok(vec![Target::new("seeds that broke an invariant", Cmp::AtMost, 0.0, "", Some(failing as f64))])
}
