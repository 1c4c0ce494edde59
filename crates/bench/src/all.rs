//! `cloudweb-bench all [--quick]`: every command, one after the other, each
//! as a child process of this binary with a bound on its time, then one
//! table of every target's verdict. The exit status is non-zero when a
//! target is NOT met, a command failed or overran its bound, or a command
//! printed no verdict at all.
//!
//! A command that overruns its bound gets SIGINT (each command then stops
//! and cleans up: its processes, temporary directories, containers and
//! namespaces), and SIGKILL if it is still there a minute later.
//!
//! Not part of CI: it needs Docker, root (namespaces), pebble, Caddy and
//! wireguard-go, and its figures are timings of a whole machine.

use std::io::{BufRead, BufReader};
use std::process::{Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::target::{parse, Verdict};

#[derive(clap::Args)]
pub struct Args {
    /// Each command at a small size, bounded so that the whole run takes
    /// under 5 minutes on a 2-core machine; without it, each runs at its
    /// full default size (hours in all).
    #[arg(long)]
    quick: bool,
    /// Commands to leave out, comma-separated (e.g. `mesh,acme`).
    #[arg(long, value_delimiter = ',')]
    skip: Vec<String>,
}

/// One command of the run: its arguments at the quick size and the time
/// it may take at that size.
struct Step {
    /// What `--skip` and the table call it.
    name: &'static str,
    /// The subcommand and the arguments it always gets, when not just `name`.
    command: Option<&'static [&'static str]>,
    quick: &'static [&'static str],
    quick_bound: Duration,
}

const fn step(name: &'static str, quick: &'static [&'static str], seconds: u64) -> Step {
    Step { name, command: None, quick, quick_bound: Duration::from_secs(seconds) }
}

/// A step named otherwise than its subcommand (one command, two targets).
const fn step_as(name: &'static str, command: &'static [&'static str], quick: &'static [&'static str], seconds: u64) -> Step {
    Step { name, command: Some(command), quick, quick_bound: Duration::from_secs(seconds) }
}

/// The quick sizes, cheapest first. Each bound is two to three times what
/// the command took at that size on this 2-core machine (debug build,
/// other builds running). The sizes are the issues' own where that is
/// cheap (10,000 nodes, 2,000 idle connections, 10,000 apps, 1,000 nodes
/// on the dashboard, 1,000 routes) and smaller where it is not.
const STEPS: &[Step] = &[
    step("scheduler", &["--nodes", "10000", "--placements", "2000"], 30),
    step("simulate", &["--seeds", "100"], 90),
    step("heartbeats", &["--agents", "2000", "--interval", "2", "--duration", "8"], 60),
    step_as("heartbeats-replicas", &["heartbeats", "--database", "postgres", "--replicas", "3"], &["--agents", "2000", "--interval", "2", "--duration", "8"], 90),
    step("failover", &["--kills", "3", "--lease-seconds", "2"], 60),
    step("flood", &["--connections", "2000"], 45),
    step_as("flood-api", &["flood", "--target", "api"], &["--connections", "5000", "--slow", "300", "--nodes", "20"], 60),
    step("apps", &["--sizes", "10,1000,10000", "--samples", "100"], 60),
    step("permissions", &["--teams", "50", "--apps", "2000", "--samples", "2000"], 60),
    step("dashboard", &["--nodes", "1000", "--apps", "1000", "--samples", "5"], 90),
    step("logs", &["--agents", "200", "--uploaders", "4", "--duration", "5", "--stored-lines", "300000", "--queries", "50"], 120),
    step("mesh", &["--seconds", "1", "--rounds", "1", "--pings", "500"], 45),
    step("agent", &["--containers", "1,50"], 100),
    step("acme", &["--ingress-nodes", "2", "--runs", "2", "--timeout-seconds", "30"], 60),
    step("deploy", &["--runs", "1", "--settle-timeout-seconds", "60"], 90),
    step("services", &["--runs", "2"], 90),
    step("exec", &["--keystrokes", "100", "--mib", "20"], 90),
    step("volume-move", &["--quick", "--runs", "2"], 150),
    step("backups", &["--quick"], 150),
    step_as(
        "volumes",
        &["ingress", "--volume"],
        &["--sizes", "10", "--changes", "1", "--switches", "20", "--latency-requests", "10", "--throughput-seconds", "1", "--build-budget-seconds", "30"],
        120,
    ),
    step("webhook", &["--runs", "2", "--settle-timeout-seconds", "60"], 90),
    step_as("webhook-github", &["webhook", "--provider", "github"], &["--runs", "2", "--settle-timeout-seconds", "60"], 90),
    step(
        "ingress",
        &[
            "--sizes", "10,1000", "--changes", "3", "--switches", "5", "--latency-requests", "200", "--throughput-seconds", "1",
            "--build-budget-seconds", "60", "--change-timeout-seconds", "20",
        ],
        90,
    ),
];
/// A command at its full size may take this long.
const FULL_BOUND: Duration = Duration::from_secs(4 * 3600);
/// How long an interrupted command has to clean up before SIGKILL.
const GRACE: Duration = Duration::from_secs(60);

/// Set by Ctrl-C: the terminal sends SIGINT to the running command too,
/// which then cleans up; `all` waits for it (its output still needs a
/// reader) and starts no further command.
static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_sigint(_: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

/// How one command ended.
struct Outcome {
    name: &'static str,
    seconds: f64,
    /// `None` when it ran to its end with status 0.
    failure: Option<String>,
    verdicts: Vec<Verdict>,
}

pub fn run(args: Args) -> ExitCode {
    let unknown: Vec<&String> = args.skip.iter().filter(|name| !STEPS.iter().any(|s| s.name == name.as_str())).collect();
    if !unknown.is_empty() {
        eprintln!("error: --skip names no command: {unknown:?}");
        return ExitCode::from(2);
    }
    let me = match std::env::current_exe() {
        Ok(me) => me,
        Err(err) => {
            eprintln!("error: finding this binary: {err}");
            return ExitCode::FAILURE;
        }
    };
    let steps: Vec<&Step> = STEPS.iter().filter(|s| !args.skip.iter().any(|name| name == s.name)).collect();
    // SAFETY: the handler only stores to an atomic, which is
    // async-signal-safe; commands started later get the default action back
    // at exec.
    unsafe { libc::signal(libc::SIGINT, on_sigint as extern "C" fn(libc::c_int) as libc::sighandler_t) };
    let started = Instant::now();
    let mut outcomes = Vec::new();
    for (index, step) in steps.iter().enumerate() {
        if STOP.load(Ordering::SeqCst) {
            println!("interrupted: {} command(s) not run", steps.len() - index);
            break;
        }
        let (extra, bound) = if args.quick { (step.quick, step.quick_bound) } else { (&[][..], FULL_BOUND) };
        println!();
        let subcommand = step.command.map_or_else(|| step.name.to_string(), |c| c.join(" "));
        println!("== [{}/{}] cloudweb-bench {subcommand} {} (bound {} s)", index + 1, steps.len(), extra.join(" "), bound.as_secs());
        let mut command = Command::new(&me);
        match step.command {
            Some(args) => command.args(args),
            None => command.arg(step.name),
        };
        command.args(extra);
        outcomes.push(run_one(step.name, command, bound));
    }
    let total = started.elapsed().as_secs_f64();
    let failed = summarize(&outcomes, &args, total);
    if failed || STOP.load(Ordering::SeqCst) {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// Runs one command, its output passed through line by line (and its
/// verdict lines kept), until it ends or overruns `bound`.
fn run_one(name: &'static str, mut command: Command, bound: Duration) -> Outcome {
    let started = Instant::now();
    let outcome = |failure: Option<String>, verdicts| Outcome { name, seconds: started.elapsed().as_secs_f64(), failure, verdicts };
    let mut child = match command.stdin(Stdio::null()).stdout(Stdio::piped()).spawn() {
        Ok(child) => child,
        Err(err) => return outcome(Some(format!("did not start: {err}")), Vec::new()),
    };
    let stdout = child.stdout.take().expect("piped stdout");
    let (lines_tx, lines) = mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if lines_tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut verdicts = Vec::new();
    let mut keep = |line: String| {
        println!("{line}");
        if let Some(verdict) = parse(&line) {
            verdicts.push(verdict);
        }
    };
    let mut interrupted_at: Option<Instant> = None;
    let status = loop {
        match lines.recv_timeout(Duration::from_millis(100)) {
            Ok(line) => keep(line),
            Err(mpsc::RecvTimeoutError::Timeout) | Err(mpsc::RecvTimeoutError::Disconnected) => {}
        }
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) => {}
            Err(err) => {
                eprintln!("warning: waiting for {name}: {err}");
                break None;
            }
        }
        match interrupted_at {
            None if started.elapsed() > bound => {
                eprintln!("{name}: over its bound of {} s; interrupting it (SIGINT)", bound.as_secs());
                // SAFETY: kill(2) on our own child's pid, which it still is
                // (not yet waited for).
                unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGINT) };
                interrupted_at = Some(Instant::now());
            }
            Some(at) if at.elapsed() > GRACE => {
                eprintln!("{name}: still running {} s after SIGINT; killing it", GRACE.as_secs());
                let _ = child.kill();
            }
            _ => {}
        }
    };
    // What the command printed last (a grandchild holding the pipe open
    // must not hold this up for long).
    while let Ok(line) = lines.recv_timeout(Duration::from_millis(500)) {
        keep(line);
    }
    let failure = match (interrupted_at, status) {
        (Some(_), _) => Some(format!("over its bound of {} s, interrupted", bound.as_secs())),
        (None, Some(status)) if status.success() && verdicts.is_empty() => Some("printed no target verdict".to_string()),
        (None, Some(status)) if status.success() => None,
        (None, Some(status)) => Some(format!("failed ({status})")),
        (None, None) => Some("lost track of it".to_string()),
    };
    outcome(failure, verdicts)
}

/// Prints the table of verdicts; whether anything failed or was NOT met.
fn summarize(outcomes: &[Outcome], args: &Args, total: f64) -> bool {
    println!();
    println!(
        "== summary: cloudweb-bench all{}, {} command(s){}, {:.0} s in all",
        if args.quick { " --quick" } else { "" },
        outcomes.len(),
        if args.skip.is_empty() { String::new() } else { format!(" (skipped: {})", args.skip.join(", ")) },
        total
    );
    if cfg!(debug_assertions) {
        println!("(a debug build: the scheduler's rate and the agent's memory were set for release builds, cargo build --release --bins)");
    }
    println!("{:<11} {:>6}  {:<8} target (measured)", "command", "time", "verdict");
    let (mut met, mut not_met, mut failed) = (0, 0, 0);
    for outcome in outcomes {
        let time = format!("{:.0} s", outcome.seconds);
        if let Some(failure) = &outcome.failure {
            failed += 1;
            println!("{:<11} {time:>6}  {:<8} {failure}", outcome.name, "FAILED");
        }
        for verdict in &outcome.verdicts {
            let word = if verdict.met { "met" } else { "NOT met" };
            if verdict.met {
                met += 1;
            } else {
                not_met += 1;
            }
            println!("{:<11} {time:>6}  {word:<8} {} ({})", outcome.name, verdict.target, verdict.measured);
        }
    }
    println!("{met} met, {not_met} NOT met, {failed} command(s) failed");
    not_met > 0 || failed > 0
}
