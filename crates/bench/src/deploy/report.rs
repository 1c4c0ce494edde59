//! Printing the deploy benchmark's figures: the stages of each kind of
//! deploy, the bare baseline, the overhead of control plane and agent, and
//! where that overhead goes.

use super::baseline::{BuildTimes, RunTimes};
use super::timeline::{span, Timeline};
use crate::stats::{spread, Spread};
use crate::target::Target;

/// Issue 3's target for the overhead of control plane and agent over a
/// bare `docker run` of the same image with the same health wait.
pub const TARGET_OVERHEAD_MS: f64 = 1000.0;
/// Issue 9 (item 20)'s target for a cached build's overhead over `docker
/// build` + `docker run` of the same context (the per-app git mirror and
/// what follows).
pub const TARGET_CACHED_BUILD_OVERHEAD_MS: f64 = 80.0;

/// Every repetition's measurements; index i of each list is run i.
#[derive(Default)]
pub struct Results {
    pub rollback: Vec<Timeline>,
    pub cached_build: Vec<Timeline>,
    pub docker_run: Vec<RunTimes>,
    pub docker_build: Vec<BuildTimes>,
}

const COLUMNS: [&str; 6] = ["schedule", "pull/build", "start", "healthy", "report", "total"];

/// Prints the figures; the targets, judged on the medians of the paired
/// overheads, are returned for the caller to print.
pub fn print(results: &Results) -> Vec<Target> {
    println!();
    println!("stages in ms (median, then min and max of each column over the runs):");
    print!("{:<34}", "");
    for column in COLUMNS {
        print!("{column:>11}");
    }
    println!();
    stage_rows("(a) rollback, prebuilt image", &results.rollback);
    stage_rows("(b) cached Dockerfile build", &results.cached_build);
    let run_columns: [Vec<Option<f64>>; 6] = [
        vec![None; results.docker_run.len()],
        vec![None; results.docker_run.len()],
        results.docker_run.iter().map(|run| Some(run.start_ms)).collect(),
        results.docker_run.iter().map(|run| Some(run.healthy_ms)).collect(),
        vec![None; results.docker_run.len()],
        results.docker_run.iter().map(|run| Some(run.total())).collect(),
    ];
    rows("baseline: docker run -d + health wait", &run_columns);
    let build_columns: [Vec<Option<f64>>; 6] = [
        vec![None; results.docker_build.len()],
        results.docker_build.iter().map(|build| Some(build.total_ms)).collect(),
        vec![None; results.docker_build.len()],
        vec![None; results.docker_build.len()],
        vec![None; results.docker_build.len()],
        results.docker_build.iter().map(|build| Some(build.total_ms)).collect(),
    ];
    rows("baseline: cached docker build", &build_columns);
    println!("  schedule: request -> the agent's first log line; pull/build: -> the Engine created the container;");
    println!("  start: -> the agent saw it started; healthy: -> health check passed; report: -> the API shows running.");
    println!("  Baseline start: docker run -d returned; healthy: docker port + the same 200 ms health polling.");

    println!();
    println!("overhead of control plane + agent over the bare baseline, per run (deploy total - baseline total of the same run), target < {TARGET_OVERHEAD_MS:.0} ms:");
    let run_totals: Vec<f64> = results.docker_run.iter().map(RunTimes::total).collect();
    let build_and_run: Vec<f64> = results.docker_build.iter().zip(&run_totals).map(|(build, run)| build.total_ms + run).collect();
    let rollback_over_run = paired(&results.rollback, &run_totals);
    let build_over_run = paired(&results.cached_build, &run_totals);
    let build_over_build_and_run = paired(&results.cached_build, &build_and_run);
    overhead_line("(a) rollback over docker run", &rollback_over_run, TARGET_OVERHEAD_MS);
    overhead_line("(b) cached build over docker run", &build_over_run, TARGET_OVERHEAD_MS);
    overhead_line("(b) cached build over docker build + run", &build_over_build_and_run, TARGET_CACHED_BUILD_OVERHEAD_MS);
    let median = |values: &[f64]| spread(values).map(|s| s.median);
    let targets = vec![
        Target::below("deploy overhead, (a) rollback over docker run, median", TARGET_OVERHEAD_MS, "ms", median(&rollback_over_run)),
        Target::below("deploy overhead, (b) cached build over docker run, median", TARGET_OVERHEAD_MS, "ms", median(&build_over_run)),
        Target::below("deploy overhead, (b) cached build over docker build + run, median", TARGET_CACHED_BUILD_OVERHEAD_MS, "ms", median(&build_over_build_and_run)),
    ];
    println!("counted stage by stage instead (schedule + pull/build + report: all but the container's start and health wait,");
    println!("which the baseline has too; for (b) also without the docker build itself), free of their run-to-run noise:");
    let outside = |timeline: &Timeline, without_build: bool| -> Option<f64> {
        let build = if without_build { timeline.docker_build()? } else { 0.0 };
        Some(timeline.schedule()? + timeline.pull_or_build()? + timeline.report()? - build)
    };
    overhead_line("(a) rollback", &results.rollback.iter().filter_map(|t| outside(t, false)).collect::<Vec<_>>(), TARGET_OVERHEAD_MS);
    overhead_line("(b) cached build, docker build excluded", &results.cached_build.iter().filter_map(|t| outside(t, true)).collect::<Vec<_>>(), TARGET_CACHED_BUILD_OVERHEAD_MS);

    println!();
    println!("where the time goes, in ms (median, min..max):");
    let rollback = &results.rollback;
    let build = &results.cached_build;
    detail("(a) request -> API recorded the deployment", rollback, |t| span(Some(t.requested), t.accepted));
    detail("(a) recorded -> agent picked the command up", rollback, |t| span(t.accepted, t.picked_up));
    detail("(a) picked up -> 'using image' (registry settings, report)", rollback, |t| span(t.picked_up, t.first_line));
    detail("(a) 'using image' -> container created", rollback, |t| span(t.first_line, t.created));
    detail("(a) healthy -> control plane recorded running", rollback, |t| span(t.healthy, t.recorded));
    detail("(a) recorded -> seen by the 20 ms poll", rollback, |t| span(t.recorded, Some(t.seen)));
    detail("(b) request -> API recorded the deployment", build, |t| span(Some(t.requested), t.accepted));
    detail("(b) recorded -> agent picked the command up", build, |t| span(t.accepted, t.picked_up));
    detail("(b) picked up -> 'cloning' (registry settings, report)", build, |t| span(t.picked_up, t.first_line));
    detail("(b) 'cloning' -> checked out (mirror: fetch or archive)", build, |t| span(t.first_line, t.checked_out));
    detail("(b) checked out -> docker build begins", build, |t| span(t.checked_out, t.build_started));
    detail("(b) docker build, all layers cached", build, Timeline::docker_build);
    detail("(b) checked out -> fetch confirmed it (beside the build)", build, |t| span(t.checked_out, t.fetched));
    detail("(b) build ended -> 'pushing' (waits for that fetch)", build, |t| span(t.built, t.pushing));
    detail("(b) 'pushing' -> container created", build, |t| span(t.pushing, t.created));
    detail("(b) push to the cluster registry (beside the start)", build, |t| span(t.pushing, t.pushed));
    detail("(b) 'pushing' -> deploying recorded", build, |t| span(t.pushing, t.image_ready));
    detail("(b) healthy -> push finished (the push's wait, if any)", build, |t| span(t.healthy, t.pushed).map(|ms| ms.max(0.0)));
    detail("(b) healthy -> control plane recorded running", build, |t| span(t.healthy, t.recorded));
    detail("(b) recorded -> seen by the 20 ms poll", build, |t| span(t.recorded, Some(t.seen)));

    let uncached = build.iter().filter(|t| !t.fully_cached()).count();
    let uncached_baseline = results.docker_build.iter().filter(|b| !b.fully_cached).count();
    if uncached > 0 || uncached_baseline > 0 {
        println!();
        println!("warning: not every layer came from the cache in {uncached} agent build(s) and {uncached_baseline} baseline build(s)");
    }
    targets
}

fn stage_rows(label: &str, timelines: &[Timeline]) {
    let columns: [Vec<Option<f64>>; 6] = [
        timelines.iter().map(Timeline::schedule).collect(),
        timelines.iter().map(Timeline::pull_or_build).collect(),
        timelines.iter().map(Timeline::start).collect(),
        timelines.iter().map(Timeline::healthy_after).collect(),
        timelines.iter().map(Timeline::report).collect(),
        timelines.iter().map(|t| Some(t.total())).collect(),
    ];
    rows(label, &columns);
}

/// A label line, then median, min and max of each column. A column with a
/// value missing in some run is summarized over the runs that have it.
fn rows(label: &str, columns: &[Vec<Option<f64>>; 6]) {
    println!("{label}");
    let spreads: Vec<Option<Spread>> = columns.iter().map(|values| spread(&values.iter().flatten().copied().collect::<Vec<_>>())).collect();
    for (name, pick) in [("median", 0), ("min", 1), ("max", 2)] {
        print!("{:<34}", format!("    {name}"));
        for summary in &spreads {
            let value = summary.map(|s| [s.median, s.min, s.max][pick]);
            print!("{:>11}", value.map_or("-".to_string(), format_ms));
        }
        println!();
    }
}

/// Each run's deploy total minus the same run's baseline.
fn paired(timelines: &[Timeline], baselines: &[f64]) -> Vec<f64> {
    timelines.iter().zip(baselines).map(|(timeline, baseline)| timeline.total() - baseline).collect()
}

fn overhead_line(label: &str, overheads: &[f64], target_ms: f64) {
    match spread(overheads) {
        Some(s) => {
            println!(
                "  {label:<44} median {:>7} ms   min {:>7}   max {:>7}   (target < {target_ms:.0} ms)",
                format_ms(s.median),
                format_ms(s.min),
                format_ms(s.max)
            );
        }
        None => println!("  {label:<44} -"),
    }
}

fn detail(label: &str, timelines: &[Timeline], stage: impl Fn(&Timeline) -> Option<f64>) {
    let values: Vec<f64> = timelines.iter().filter_map(&stage).collect();
    match spread(&values) {
        Some(s) => println!("  {label:<58} {:>7}  ({}..{})", format_ms(s.median), format_ms(s.min), format_ms(s.max)),
        None => println!("  {label:<58} {:>7}", "n/a"),
    }
}

/// Whole milliseconds, or tenths below 10 ms.
pub fn format_ms(ms: f64) -> String {
    if ms.abs() < 10.0 {
        format!("{ms:.1}")
    } else {
        format!("{ms:.0}")
    }
}
