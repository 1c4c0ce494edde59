//! The simulation in CI: a thousand seeds in four parts (so that the test
//! runner spreads them over the cores), each seed checked at every commit
//! point and once settled. A failure prints its seed and how to replay it.
//! `CLOUDWEB_SIM_SEEDS` changes the count per part; `cloudweb-bench
//! simulate` runs a hundred thousand.

use cloudweb_sim::{run, Options};

fn seeds(part: u64) {
    let per_part: u64 = std::env::var("CLOUDWEB_SIM_SEEDS").ok().and_then(|v| v.parse().ok()).unwrap_or(250);
    let first = 1 + part * per_part;
    let started = std::time::Instant::now();
    let (mut kills, mut crashes, mut deployments) = (0, 0, 0);
    for seed in first..first + per_part {
        match run(&Options::new(seed)) {
            Ok(outcome) => {
                kills += outcome.kills;
                crashes += outcome.crashes;
                deployments += outcome.deployments;
            }
            Err(failure) => panic!("{failure}"),
        }
    }
    println!(
        "seeds {first}..{}: {deployments} deployments, {kills} control-plane kills, {crashes} crashes, {:.1} s",
        first + per_part - 1,
        started.elapsed().as_secs_f64()
    );
    assert!(kills as u64 > per_part / 2, "the runs must kill the control plane ({kills} kills in {per_part} seeds)");
    assert!(crashes as u64 > per_part / 4, "the runs must crash running deployments ({crashes} crashes in {per_part} seeds)");
}

#[test]
fn seeds_part_1_break_no_invariant() {
    seeds(0);
}

#[test]
fn seeds_part_2_break_no_invariant() {
    seeds(1);
}

#[test]
fn seeds_part_3_break_no_invariant() {
    seeds(2);
}

#[test]
fn seeds_part_4_break_no_invariant() {
    seeds(3);
}

#[test]
fn a_seed_replays_the_same_run() {
    for seed in [3, 17] {
        let a = run(&Options::new(seed)).expect("the seed passes");
        let b = run(&Options::new(seed)).expect("the seed passes");
        assert_eq!((a.steps, a.kills, a.crashes, a.deployments, a.commits), (b.steps, b.kills, b.crashes, b.deployments, b.commits), "seed {seed}");
    }
}
