//! `cloudweb-bench volume-move`: the throughput of a volume move against a
//! plain `tar | TCP | tar` over the same mesh path.
//!
//! Two nodes and their control plane come up in network namespaces, each
//! node with its own Docker Engine, the control plane with the registry
//! (`cloudweb_e2e::mesh_cluster`, the volume-move test's harness; the
//! agents configure their WireGuard mesh themselves). An app with a volume
//! is deployed on node-1, and the volume's directory on disk is filled
//! with incompressible data: three quarters in one file, the rest in a few
//! hundred small ones (`--small-files`) in 16 directories. Then, for each
//! run, in turn over the same path (source namespace to the target's mesh
//! address), both moving the data to the other node:
//!
//! 1. the baseline (`pipe.rs`): `tar -c` of the volume, one TCP stream,
//!    `tar -x` into a scratch directory on the target, timed from before
//!    the tars start until both have exited; the scratch copy goes after;
//! 2. the move: `POST /api/volumes/{name}/move`, until the move is
//!    `switched` (both ends agree on the copy), timed by the control
//!    plane's own `created_at` and `switched_at` (the wall clock from the
//!    POST to the first poll that saw it switched is printed too); then it
//!    waits for `done` (the app runs on the new node: the downtime),
//!    confirms it and waits for the old copy to be deleted.
//!
//! Each run moves the volume back where the previous one took it, so the
//! runs alternate direction; both measurements of a run go the same way.
//! Dirty pages are written out (sync(2), untimed) before each measurement,
//! so neither pays for the other's writes; the time a `sync` takes right
//! after the baseline is printed as context (the target agent syncs before
//! it puts the copy in place). The source files are in the page cache for
//! both.
//!
//! Throughput is the volume's bytes (the files' sizes) over the seconds;
//! MB/s are 10^6 bytes a second. The target's ratio is the median over the
//! runs of each run's move / baseline throughput.
//!
//! Needs root, Docker, wireguard-go (or kernel WireGuard) and the test
//! images (`cloudweb-test/busybox:latest`, built by `ensure_images`).

mod pipe;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use cloudweb_e2e::mesh_cluster::{all_pairs_ping, MeshCluster, Setup};
use cloudweb_e2e::{ensure_images, wait_for, GitServer};
use rand::RngCore;
use serde_json::{json, Value};

use crate::target::{Cmp, Target};

#[derive(clap::Args)]
pub struct Args {
    /// MiB of incompressible data in the volume (8 to 16384): three
    /// quarters in one file, the rest spread over --small-files files.
    #[arg(long, default_value_t = 512, value_parser = clap::value_parser!(u64).range(8..=16384))]
    mib: u64,
    /// The quick size, 256 MiB (in place of --mib): below that the fixed cost
    /// of a move (commands, reports, the second connection) hides the
    /// throughput.
    #[arg(long, conflicts_with = "mib")]
    quick: bool,
    /// How many small files share a quarter of the data (0 to 100000).
    #[arg(long, default_value_t = 300, value_parser = clap::value_parser!(u32).range(0..=100_000))]
    small_files: u32,
    /// Runs of each measurement (1 to 20), interleaved; medians reported.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=20))]
    runs: u32,
}

const QUICK_MIB: u64 = 256;
const APP: &str = "mover";
const VOLUME: &str = "benchdata";
/// Serves the volume; every start appends a line to it. It ends on
/// SIGTERM: an httpd as PID 1 would ignore it, and every move would then
/// wait out the agent's 10 s stop grace before its last pass.
const DOCKERFILE: &str = "FROM cloudweb-test/busybox:latest\n\
CMD [\"sh\", \"-c\", \"echo started >> /data/starts.txt; trap 'exit 0' TERM; httpd -f -p 8080 -h /data & wait\"]\n";
/// The target the ratio is judged against.
const TARGET_RATIO: f64 = 0.8;

/// One move, as the control plane and the agents' logs tell it.
struct Moved {
    /// `created_at` to `switched_at`, from the move's view.
    copy: Duration,
    /// From the POST to the first poll that saw `switched` (or `done`).
    wall: Duration,
    downtime_ms: Option<i64>,
    files: Option<i64>,
    bytes: Option<i64>,
    /// The source agent's `seconds` of its two passes.
    first_pass: Option<f64>,
    last_pass: Option<f64>,
    /// `created_at` to `stopped_at` (the containers about to stop, after
    /// the first pass), `stopped_at` to `switched_at`, and `switched_at`
    /// to `finished_at` (the app runs on the new node).
    to_stop: Option<Duration>,
    stop_to_switch: Option<Duration>,
    switch_to_done: Option<Duration>,
}

/// One run: both measurements, the same way.
struct Run {
    bytes: u64,
    tar: Duration,
    tar_sync: Duration,
    moved: Moved,
}

impl Run {
    fn tar_rate(&self) -> f64 {
        self.bytes as f64 / self.tar.as_secs_f64()
    }

    fn move_rate(&self) -> f64 {
        self.bytes as f64 / self.moved.copy.as_secs_f64()
    }
}

pub async fn run(args: Args) -> Result<Vec<Target>> {
    let mib = if args.quick { QUICK_MIB } else { args.mib };
    tokio::task::block_in_place(ensure_images).context("building the test images")?;
    let setup = Setup { control_plane_node: true, registry: true, docker: vec![1, 2], ..Setup::default() };
    let cluster = MeshCluster::start_with(2, setup).await.context("starting a control plane with the registry and two nodes in namespaces")?;
    let result = bench(&cluster, &args, mib).await.map_err(|err| {
        let logs = cluster.logs();
        let mut start = logs.len().saturating_sub(8000);
        while !logs.is_char_boundary(start) {
            start += 1;
        }
        err.context(format!("the cluster's logs (the end):\n{}", &logs[start..]))
    });
    // The agents, Engines and namespaces go with it.
    drop(cluster);
    result
}

fn volume_dir(cluster: &MeshCluster, node: usize) -> PathBuf {
    cluster.agents[node].dir.join("volumes").join(VOLUME)
}

async fn bench(cluster: &MeshCluster, args: &Args, mib: u64) -> Result<Vec<Target>> {
    let total = mib << 20;
    let available = nix::sys::statvfs::statvfs(cluster.tmp.path()).context("statvfs")?;
    let free = available.blocks_available() as u64 * available.fragment_size() as u64;
    // The volume, its copy on the target, the old copy until it is
    // deleted, and the baseline's scratch copy, with room to spare.
    if free < 4 * total + (1 << 30) {
        bail!("{} has {} MiB free; {mib} MiB of data needs {} MiB", cluster.tmp.path().display(), free >> 20, (4 * total + (1 << 30)) >> 20);
    }
    let git = GitServer::start(cluster.tmp.path())?;
    deploy(cluster, &git).await?;
    let filled = Instant::now();
    let (files, bytes) = tokio::task::block_in_place(|| fill(&volume_dir(cluster, 1), total, args.small_files))?;
    println!(
        "volume-move: {} run(s); volume {VOLUME} of app {APP}: {files} files, {bytes} bytes ({:.0} MiB; one of {} MiB, {} small) of random data, written in {:.1} s",
        args.runs,
        bytes as f64 / f64::from(1 << 20),
        (total * 3 / 4) >> 20,
        args.small_files,
        filled.elapsed().as_secs_f64()
    );
    println!(
        "mesh on {} WireGuard; node-1 {} ({}), node-2 {} ({}); debug build: {}",
        cluster.backend,
        cluster.mesh_address(&cluster.agents[1]),
        cluster.lan.members[cluster.agents[1].ns].name,
        cluster.mesh_address(&cluster.agents[2]),
        cluster.lan.members[cluster.agents[2].ns].name,
        cfg!(debug_assertions)
    );
    // Generous: 1 MiB/s at the least, plus the restart.
    let limit = Duration::from_secs(120 + mib);
    let mut runs = Vec::new();
    let mut on = 1usize;
    for number in 1..=args.runs {
        let (from, to) = (on, 3 - on);
        let run = tokio::task::block_in_place(|| baseline(cluster, from, to))?;
        let (bytes, tar, tar_sync) = run;
        let moved = one_move(cluster, from, to, limit).await?;
        on = to;
        let run = Run { bytes, tar, tar_sync, moved };
        print_run(number, cluster, from, to, &run);
        runs.push(run);
    }
    drop(git);
    Ok(report(&runs))
}

/// The app, its volume, and its first deployment, on node-1.
async fn deploy(cluster: &MeshCluster, git: &GitServer) -> Result<()> {
    for node in [1, 2] {
        let agent = &cluster.agents[node];
        let engine = cluster.dockers.iter().find(|(n, _)| *n == agent.index).context("an Engine for the node")?;
        tokio::task::block_in_place(|| engine.1.load_from_host("cloudweb-test/busybox:latest"))?;
    }
    for agent in &cluster.agents[1..] {
        wait_for(Duration::from_secs(90), &format!("{} to be ready with the mesh and the registry", agent.name), || async {
            let (_, view) = cluster.api("GET", &format!("/api/nodes/{}", agent.node_id)).await.ok()?;
            (view["state"] == "ready" && view["health_report"]["registry"]["reachable"] == true).then_some(())
        })
        .await?;
    }
    all_pairs_ping(cluster, &[1, 2]).await?;
    // The first deployment goes to node-1: the others are drained.
    for node in [0, 2] {
        expect(cluster.api("POST", &format!("/api/nodes/{}/drain", cluster.agents[node].node_id)).await?, 200, "drain")?;
    }
    git.commit(APP, &[("Dockerfile", DOCKERFILE)], "first")?;
    let body = json!({"name": APP, "repo_url": git.file_url(APP), "port": 8080, "health_timeout_seconds": 60});
    expect(cluster.api_json("POST", "/api/apps", &body).await?, 201, "POST /api/apps")?;
    let volume = json!({"name": VOLUME, "path": "/data"});
    expect(cluster.api_json("POST", &format!("/api/apps/{APP}/volumes"), &volume).await?, 201, "attaching the volume")?;
    let deployment = expect(cluster.api_json("POST", &format!("/api/apps/{APP}/deploy"), &json!({})).await?, 201, "deploy")?;
    let id = deployment["id"].as_str().context("the deployment's id")?.to_string();
    let settled = wait_for(Duration::from_secs(300), "the first deployment to settle", || async {
        let (_, d) = cluster.api("GET", &format!("/api/deployments/{id}")).await.ok()?;
        matches!(d["state"].as_str(), Some("running" | "failed")).then_some(d)
    })
    .await?;
    if settled["state"] != "running" {
        bail!("the first deployment did not run: {settled}");
    }
    expect(cluster.api("POST", &format!("/api/nodes/{}/undrain", cluster.agents[2].node_id)).await?, 200, "undrain")?;
    if !volume_dir(cluster, 1).is_dir() {
        bail!("node-1 has no directory for the volume at {}", volume_dir(cluster, 1).display());
    }
    Ok(())
}

/// The answer's body when its status is `want`.
fn expect((status, body): (u16, Value), want: u16, what: &str) -> Result<Value> {
    if status != want {
        bail!("{what} answered {status}: {body}");
    }
    Ok(body)
}

/// Writes `size` random bytes to `path`.
fn write_random(path: &Path, size: u64, buffer: &mut [u8]) -> Result<()> {
    use std::io::Write;
    let mut file = std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let mut rng = rand::rng();
    let mut left = size;
    while left > 0 {
        let n = buffer.len().min(usize::try_from(left).unwrap_or(usize::MAX));
        rng.fill_bytes(&mut buffer[..n]);
        file.write_all(&buffer[..n])?;
        left -= n as u64;
    }
    Ok(())
}

/// Fills the volume: three quarters of `total` in `big.bin`, the rest in
/// `small` files of half to one and a half times their mean size. Returns
/// the files and bytes now in the directory (the app's own file too).
fn fill(root: &Path, total: u64, small: u32) -> Result<(u64, u64)> {
    let mut buffer = vec![0u8; 1 << 20];
    let big = if small == 0 { total } else { total * 3 / 4 };
    write_random(&root.join("big.bin"), big, &mut buffer)?;
    let (count, rest) = (u64::from(small), total - big);
    let mean = if count == 0 { 0 } else { rest / count };
    let mut written = 0u64;
    for i in 0..count {
        // Each five in a row add up to five means, so the last one is
        // left at least one mean.
        let size = if i + 1 == count { rest.saturating_sub(written) } else { mean / 2 + mean * (i % 5) / 4 };
        let dir = root.join("small").join(format!("d{:02}", i % 16));
        std::fs::create_dir_all(&dir)?;
        write_random(&dir.join(format!("f{i:05}.bin")), size, &mut buffer)?;
        written += size;
    }
    tree_size(root)
}

/// Files and bytes of content under `root`.
fn tree_size(root: &Path) -> Result<(u64, u64)> {
    let (mut files, mut bytes) = (0u64, 0u64);
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))? {
            let entry = entry?;
            let meta = entry.path().symlink_metadata()?;
            if meta.is_dir() {
                stack.push(entry.path());
            } else if meta.is_file() {
                files += 1;
                bytes += meta.len();
            }
        }
    }
    Ok((files, bytes))
}

/// sync(2): the dirty pages written out; how long it took.
fn sync() -> Duration {
    let started = Instant::now();
    // SAFETY: sync(2) takes no arguments and cannot fail.
    unsafe { libc::sync() };
    started.elapsed()
}

/// The baseline from node `from` to node `to`: the volume's bytes, the
/// transfer's time, and the time of a `sync` right after it.
fn baseline(cluster: &MeshCluster, from: usize, to: usize) -> Result<(u64, Duration, Duration)> {
    let source = volume_dir(cluster, from);
    let (_, bytes) = tree_size(&source)?;
    let scratch = cluster.agents[to].dir.join("bench-tar-copy");
    let to_address = cluster.mesh_address(&cluster.agents[to]).parse().context("the target's mesh address")?;
    let ends = pipe::Ends {
        from_ns: &cluster.lan.members[cluster.agents[from].ns].name,
        to_ns: &cluster.lan.members[cluster.agents[to].ns].name,
        to_address,
        from_dir: &source,
        to_dir: &scratch,
    };
    sync();
    let outcome = pipe::tar_over(&ends);
    let tar_sync = sync();
    let copied = tree_size(&scratch);
    let _ = std::fs::remove_dir_all(&scratch);
    let (took, _stream) = outcome.with_context(|| format!("tar over the mesh, {} to {}", cluster.agents[from].name, cluster.agents[to].name))?;
    let (_, copied) = copied?;
    if copied != bytes {
        bail!("tar over the mesh copied {copied} bytes of files, the volume holds {bytes}");
    }
    Ok((bytes, took, tar_sync))
}

/// A move's view, when the control plane answers 200.
async fn show(cluster: &MeshCluster, id: &str) -> Result<Option<Value>> {
    let (status, view) = cluster.api("GET", &format!("/api/volume-moves/{id}")).await?;
    Ok((status == 200).then_some(view))
}

/// Milliseconds between two RFC 3339 times of a view.
fn between(view: &Value, from: &str, to: &str) -> Option<Duration> {
    let at = |field: &str| {
        let text = view[field].as_str()?;
        time::OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339).ok()
    };
    let seconds = (at(to)? - at(from)?).as_seconds_f64();
    (seconds >= 0.0).then(|| Duration::from_secs_f64(seconds))
}

/// `seconds=` of the first line of `log` naming `move_id` with `message`.
fn logged_seconds(log: &str, move_id: &str, message: &str) -> Option<f64> {
    log.lines().filter(|line| line.contains(move_id) && line.contains(message)).find_map(|line| {
        let plain = strip_ansi(line);
        plain.split_whitespace().find_map(|word| word.strip_prefix("seconds=")).and_then(|value| value.parse().ok())
    })
}

/// The line without terminal colour sequences (`ESC [ … m`).
fn strip_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Moves the volume from node `from` to node `to` and follows it to
/// `done`; then confirms it and waits for the old copy to be deleted.
async fn one_move(cluster: &MeshCluster, from: usize, to: usize, limit: Duration) -> Result<Moved> {
    tokio::task::block_in_place(sync);
    let started = Instant::now();
    let body = json!({"to": cluster.agents[to].name});
    let view = expect(cluster.api_json("POST", &format!("/api/volumes/{VOLUME}/move"), &body).await?, 202, "POST /api/volumes/{name}/move")?;
    let id = view["id"].as_str().context("the move's id")?.to_string();
    let mut wall = None;
    let done = loop {
        if let Some(view) = show(cluster, &id).await? {
            match view["state"].as_str() {
                Some("switched") => {
                    wall.get_or_insert(started.elapsed());
                }
                Some("done") => {
                    wall.get_or_insert(started.elapsed());
                    break view;
                }
                Some("failed") => bail!("the move {id} failed: {}", view["reason"]),
                _ => {}
            }
        }
        if started.elapsed() > limit {
            bail!("the move {id} was not done within {} s", limit.as_secs());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let wall = wall.expect("seen switched or done");
    let copy = between(&done, "created_at", "switched_at").unwrap_or(wall);
    let log = cluster.agents[from].process.as_ref().map(|p| p.log_text()).unwrap_or_default();
    let moved = Moved {
        copy,
        wall,
        downtime_ms: done["downtime_ms"].as_i64(),
        files: done["files"].as_i64(),
        bytes: done["bytes"].as_i64(),
        first_pass: logged_seconds(&log, &id, "first pass sent"),
        last_pass: logged_seconds(&log, &id, "last pass sent"),
        to_stop: between(&done, "created_at", "stopped_at"),
        stop_to_switch: between(&done, "stopped_at", "switched_at"),
        switch_to_done: between(&done, "switched_at", "finished_at"),
    };
    expect(cluster.api("POST", &format!("/api/volume-moves/{id}/confirm")).await?, 200, "confirming the move")?;
    wait_for(Duration::from_secs(60), "the old copy to be deleted", || async {
        let view = show(cluster, &id).await.ok()??;
        (view["source_copy"] == "purged").then_some(())
    })
    .await?;
    if !volume_dir(cluster, to).is_dir() {
        bail!("after the move, {} has no directory for the volume", cluster.agents[to].name);
    }
    Ok(moved)
}

fn mb_per_s(bytes_per_second: f64) -> f64 {
    bytes_per_second / 1e6
}

fn print_run(number: u32, cluster: &MeshCluster, from: usize, to: usize, run: &Run) {
    let seconds = |s: Option<f64>| s.map_or_else(|| "?".to_string(), |s| format!("{s:.2} s"));
    let span = |d: Option<Duration>| seconds(d.map(|d| d.as_secs_f64()));
    let count = |n: Option<i64>| n.map_or_else(|| "?".to_string(), |n| n.to_string());
    let moved = &run.moved;
    println!(
        "run {number}, {} -> {}, {} bytes: tar|tar {:.2} s = {:.1} MB/s (a sync after it {:.2} s); move {:.2} s = {:.1} MB/s; ratio {:.3}",
        cluster.agents[from].name,
        cluster.agents[to].name,
        run.bytes,
        run.tar.as_secs_f64(),
        mb_per_s(run.tar_rate()),
        run.tar_sync.as_secs_f64(),
        moved.copy.as_secs_f64(),
        mb_per_s(run.move_rate()),
        run.move_rate() / run.tar_rate()
    );
    println!(
        "  move: POST to seen switched {:.2} s; created -> containers stopping {}, -> switched {}, -> done {}; \
         source's passes: first (live) {}, last {}; downtime {} ms; {} files, {} bytes",
        moved.wall.as_secs_f64(),
        span(moved.to_stop),
        span(moved.stop_to_switch),
        span(moved.switch_to_done),
        seconds(moved.first_pass),
        seconds(moved.last_pass),
        count(moved.downtime_ms),
        count(moved.files),
        count(moved.bytes)
    );
}

/// The median; of an even count, the mean of the middle two.
fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    }
}

fn report(runs: &[Run]) -> Vec<Target> {
    let pick = |f: &dyn Fn(&Run) -> f64| median(runs.iter().map(f).collect());
    let bytes = pick(&|r| r.bytes as f64);
    let (tar_s, move_s) = (pick(&|r| r.tar.as_secs_f64()), pick(&|r| r.moved.copy.as_secs_f64()));
    let (tar_rate, move_rate) = (pick(&Run::tar_rate), pick(&Run::move_rate));
    let ratio = pick(&|r| r.move_rate() / r.tar_rate());
    println!();
    println!("medians over {} run(s), {bytes:.0} bytes ({:.0} MiB) moved each time:", runs.len(), bytes / f64::from(1 << 20));
    println!("{:<22} {:>9} {:>10}", "", "seconds", "MB/s");
    println!("{:<22} {tar_s:>9.2} {:>10.1}", "tar | TCP | tar", mb_per_s(tar_rate));
    println!("{:<22} {move_s:>9.2} {:>10.1}", "volume move (copy)", mb_per_s(move_rate));
    let passes = |f: &dyn Fn(&Moved) -> Option<f64>| runs.iter().map(|r| f(&r.moved)).collect::<Option<Vec<f64>>>().map(median);
    if let (Some(first), Some(last)) = (passes(&|m| m.first_pass), passes(&|m| m.last_pass)) {
        println!(
            "volume move: first pass (live) {first:.2} s, last pass (containers stopped) {last:.2} s, the rest (commands, checks, sync, switch) {:.2} s",
            (move_s - first - last).max(0.0)
        );
    }
    let spans = |f: &dyn Fn(&Moved) -> Option<Duration>| passes(&|m| f(m).map(|d| d.as_secs_f64()));
    if let (Some(a), Some(b), Some(c)) = (spans(&|m| m.to_stop), spans(&|m| m.stop_to_switch), spans(&|m| m.switch_to_done)) {
        println!(
            "volume move, the control plane's times: created -> containers stopping {a:.2} s (commands, listen, first pass), \
             -> switched {b:.2} s (stop, last pass, target's sync and rename, reports), -> done {c:.2} s (the app on its new node)"
        );
    }
    if let Some(downtime) = runs.iter().map(|r| r.moved.downtime_ms.map(|d| d as f64)).collect::<Option<Vec<f64>>>().map(median) {
        println!("volume move: the app's downtime {downtime:.0} ms (median)");
    }
    println!("a sync right after tar|tar took {:.2} s (median; not counted)", pick(&|r| r.tar_sync.as_secs_f64()));
    println!("volume move / tar|tar: throughput {ratio:.3} (median of the runs' ratios; ratio of the medians {:.3})", move_rate / tar_rate);
    vec![Target::new("volume move throughput / tar|tar over the same mesh path (median)", Cmp::AtLeast, TARGET_RATIO, "", Some(ratio))]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians_and_log_fields() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0]), 2.5);
        let line = "2025-01-01T00:00:00Z  INFO cloudweb_agent::volume_moves: first pass sent (live) move_id=mv_0123456789abcdef files=3 bytes=9 seconds=1.25";
        assert_eq!(logged_seconds(line, "mv_0123456789abcdef", "first pass sent"), Some(1.25));
        assert_eq!(logged_seconds(line, "mv_ffffffffffffffff", "first pass sent"), None);
        let coloured = "\u{1b}[32m INFO\u{1b}[0m first pass sent mv_1 \u{1b}[3mseconds\u{1b}[0m\u{1b}[2m=\u{1b}[0m2.5";
        assert_eq!(logged_seconds(coloured, "mv_1", "first pass sent"), Some(2.5));
    }

    #[test]
    fn fill_writes_the_asked_size() {
        let dir = tempfile::tempdir().unwrap();
        let (files, bytes) = fill(dir.path(), 1 << 20, 7).unwrap();
        assert_eq!((files, bytes), (8, 1 << 20));
    }
}
