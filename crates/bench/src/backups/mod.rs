//! `cloudweb-bench backups`: what issue 23's backups cost, with the real
//! control plane (and its registry), one real agent joined to it, real
//! restic and the machine's Docker Engine, to a path destination (a
//! directory of this run's temporary directory):
//!
//! 1. a PostgreSQL service filled with pgbench data (`pgbench -i -s S` in
//!    its container, S chosen for `--mib`) is backed up through cloud-web
//!    (`POST /api/services/{name}/backups`, timed by the bench from the POST
//!    to the first poll that sees `succeeded`), interleaved with the same
//!    dump run by hand on the same host into the same repository (the
//!    recovery kit's repository and password): `docker exec cw-svc.<name>
//!    pg_dump -Fc -U app -d app | restic -r <repo> backup --stdin`. One
//!    untimed backup through cloud-web comes first, so every timed run
//!    finds the repository holding the data already (restic deduplicates
//!    an unchanged dump) and none pays for the first write alone. Target
//!    (issue 23): the ratio, median hand time over median cloud-web time,
//!    at least 0.9;
//! 2. the time from `POST /api/backups/{id}/restore` (in place, of the
//!    last cloud-web backup) to the service healthy again and answering a
//!    query that counts every pgbench account: printed, no target;
//! 3. an app with a volume (a busybox image built from the bench's git
//!    daemon), its directory filled with `--volume-mib` MiB of 1 MiB random
//!    files, backed up once, then backed up again unchanged (`--runs`
//!    times): target (issue 23) under 5 s, median, POST to `succeeded`;
//! 4. the control plane's own backup (`POST /api/control-plane/backups`)
//!    with `--apps` apps created through the API (not deployed), before any
//!    service or volume exists: its bytes and time, printed, no target.
//!
//! `--quick`: 64 MiB of database, 128 MiB of volume, 100 apps, 2 runs.
//! Dirty pages are written out (sync(2), untimed) before each timed run.

mod postgres;
mod volume;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use reqwest::Method;
use serde_json::{json, Value};

use crate::deploy::cluster::{BinaryArgs, Cluster, ExtraFlags};
use crate::docker;
use crate::server::Server;
use crate::target::Target;

#[derive(clap::Args)]
pub struct Args {
    /// MiB of pgbench data in the database (16 to 16384).
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u64).range(16..=16384))]
    mib: u64,
    /// MiB of random files in the volume (8 to 16384).
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u64).range(8..=16384))]
    volume_mib: u64,
    /// Apps in the database for the control plane's backup (1 to 100000).
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    apps: u64,
    /// Timed runs of each backup (1 to 20); medians reported.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=20))]
    runs: u32,
    /// The quick sizes: 64 MiB of database, 128 MiB of volume, 100 apps,
    /// 2 runs (in place of the four flags above).
    #[arg(long, conflicts_with_all = ["mib", "volume_mib", "apps", "runs"])]
    quick: bool,
    #[arg(long, default_value = "cloudweb-test/postgres:15")]
    postgres_image: String,
    #[command(flatten)]
    binaries: BinaryArgs,
}

/// The sizes of one run.
pub struct Sizes {
    pub mib: u64,
    pub volume_mib: u64,
    pub apps: u64,
    pub runs: u32,
}

const APP: &str = "bench-backups";
/// How long any one job may take before the bench gives up.
const JOB_LIMIT: Duration = Duration::from_secs(1800);
/// The target for the PostgreSQL ratio.
const TARGET_RATIO: f64 = 0.9;
/// The target for an incremental backup of an unchanged volume.
const TARGET_INCREMENTAL_SECONDS: f64 = 5.0;

/// What one run of the bench had to hand: the cluster and the
/// destination's recovery kit.
pub struct Bench {
    pub cluster: Cluster,
    pub repository: String,
    pub password: String,
    pub dir: PathBuf,
}

pub async fn run(args: Args) -> Result<Vec<Target>> {
    let sizes = if args.quick {
        Sizes { mib: 64, volume_mib: 128, apps: 100, runs: 2 }
    } else {
        Sizes { mib: args.mib, volume_mib: args.volume_mib, apps: args.apps, runs: args.runs }
    };
    let binaries = args.binaries.resolve()?;
    crate::deploy::check_image_reference(&args.postgres_image)?;
    if !docker::image_exists(&args.postgres_image) {
        bail!("image {} is missing; build it with scripts/service-images.sh", args.postgres_image);
    }
    if which("restic").is_none() {
        bail!("restic is not on PATH (the agent and the baseline both need it)");
    }
    tokio::task::block_in_place(cloudweb_e2e::ensure_images).context("building the test images")?;
    let dir = tempfile::Builder::new().prefix("cloudweb-bench-backups-").tempdir()?;
    let free = {
        let stat = nix::sys::statvfs::statvfs(dir.path()).context("statvfs")?;
        stat.blocks_available() as u64 * stat.fragment_size() as u64
    };
    // The database (twice: a restore keeps the replaced data), its dumps in
    // the repository, the volume and its copy in the repository.
    let need = (3 * sizes.mib + 2 * sizes.volume_mib + 1024) << 20;
    if free < need {
        bail!("{} has {} MiB free; these sizes need {} MiB", dir.path().display(), free >> 20, need >> 20);
    }
    let postgres = format!("postgres={}", args.postgres_image);
    let server_flags = ["--service-image", postgres.as_str()];
    let extra = ExtraFlags { server: &server_flags, ..Default::default() };
    let cluster = Cluster::start_with(dir.path(), &binaries, APP, &extra).await?;
    let mut bench = Bench { cluster, repository: String::new(), password: String::new(), dir: dir.path().to_path_buf() };
    let result = measure(&mut bench, &sizes).await.map_err(|err| err.context(format!("the agent's log (the end):\n{}", bench.cluster.agent_log_tail(30))));
    let _ = bench.cluster.delete_app().await;
    // The cluster's containers go with it, then the directory.
    drop(bench);
    drop(dir);
    result
}

async fn measure(bench: &mut Bench, sizes: &Sizes) -> Result<Vec<Target>> {
    wait_features(&bench.cluster.server, &bench.cluster.node_id).await?;
    println!(
        "backups: database {} MiB, volume {} MiB, {} apps, {} timed run(s) of each; debug build: {}",
        sizes.mib,
        sizes.volume_mib,
        sizes.apps,
        sizes.runs,
        cfg!(debug_assertions)
    );
    // The apps first, so that the control plane's backup holds them and
    // nothing else of this bench.
    let created = Instant::now();
    create_apps(&bench.cluster.server, sizes.apps).await?;
    println!("{} apps created through POST /api/apps in {:.1} s", sizes.apps, created.elapsed().as_secs_f64());
    let destination = bench.dir.join("destination");
    std::fs::create_dir_all(&destination)?;
    let body = json!({"name": "local", "kind": "path", "path": destination.display().to_string()});
    let created = expect(bench.cluster.server.call(Method::POST, "/api/backup-destinations", Some(&body)).await?, 201, "POST /api/backup-destinations")?;
    let kit = &created["recovery_kit"];
    bench.repository = kit["repository"].as_str().context("the recovery kit's repository")?.to_string();
    bench.password = kit["password"].as_str().context("the recovery kit's password")?.to_string();

    let control_plane = control_plane(&bench.cluster.server, sizes).await?;
    let database = postgres::bench(bench, sizes).await?;
    let volume = volume::bench(bench, sizes).await?;

    println!();
    println!(
        "control-plane backup at {} apps: {} bytes ({:.2} MiB), {} added; {:.2} s POST -> succeeded (median of {}), the job's own {:.2} s",
        sizes.apps,
        control_plane.bytes,
        control_plane.bytes as f64 / f64::from(1 << 20),
        control_plane.added,
        control_plane.wall,
        sizes.runs,
        control_plane.job_seconds
    );
    println!(
        "PostgreSQL {} MiB (pgbench -s {}): cloud-web {:.2} s, by hand {:.2} s (medians), ratio hand / cloud-web {:.3}",
        database.size_mib, database.scale, database.ours, database.hand, database.ratio
    );
    println!(
        "restore in place -> accepting connections: {:.2} s (job succeeded at {:.2} s, service healthy at {:.2} s, query answered at {:.2} s)",
        database.restore.answered, database.restore.job, database.restore.healthy, database.restore.answered
    );
    println!("incremental backup of the unchanged {} MiB volume: {:.2} s (median; first backup {:.2} s)", sizes.volume_mib, volume.incremental, volume.first);
    Ok(vec![
        Target::new(
            format!("PostgreSQL {} MiB backup, pg_dump|restic by hand / cloud-web time (medians)", database.size_mib),
            crate::target::Cmp::AtLeast,
            TARGET_RATIO,
            "",
            Some(database.ratio),
        )
        .with_note(format!("cloud-web's time holds {:.2} s (median) of forget --prune after the snapshot", database.after)),
        Target::below(format!("incremental backup of an unchanged {} MiB volume (median)", sizes.volume_mib), TARGET_INCREMENTAL_SECONDS, "s", Some(volume.incremental)),
    ])
}

/// The node's features come with its heartbeats' health.
async fn wait_features(server: &Server, node_id: &str) -> Result<()> {
    let waited = Instant::now();
    loop {
        let (_, node) = server.call(Method::GET, &format!("/api/nodes/{node_id}"), None).await?;
        let features = node["features"].as_array();
        if features.is_some_and(|f| f.iter().any(|f| f == "services") && f.iter().any(|f| f == "backups")) {
            return Ok(());
        }
        if waited.elapsed() > Duration::from_secs(30) {
            bail!("the node did not report the services and backups features within 30 s: {node}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `count` apps, not deployed, eight requests at a time.
async fn create_apps(server: &Server, count: u64) -> Result<()> {
    use futures_util::stream::{self, StreamExt, TryStreamExt};
    stream::iter(0..count)
        .map(|i| async move {
            let name = format!("app-{i:05}");
            let body = json!({"name": name, "repo_url": format!("https://git.example.com/team/{name}.git"), "port": 8080});
            expect(server.call(Method::POST, "/api/apps", Some(&body)).await?, 201, &format!("creating app {name}")).map(|_| ())
        })
        .buffer_unordered(8)
        .try_collect::<()>()
        .await
}

/// The answer's body when its status is `want`.
pub fn expect((status, body): (u16, Value), want: u16, what: &str) -> Result<Value> {
    if status != want {
        bail!("{what} answered {status}: {body}");
    }
    Ok(body)
}

/// Polls job `id` every 20 ms until it ends; its view, and the time from
/// `since` to the poll that saw it end. A job that did not succeed is an
/// error.
pub async fn until_done(server: &Server, id: &str, since: Instant) -> Result<(Value, Duration)> {
    loop {
        let (status, job) = server.call(Method::GET, &format!("/api/backups/{id}"), None).await?;
        if status == 200 && !matches!(job["state"].as_str(), Some("queued" | "running")) {
            let took = since.elapsed();
            if job["state"] != "succeeded" {
                bail!("job {id} ended {}: {job}", job["state"]);
            }
            return Ok((job, took));
        }
        if since.elapsed() > JOB_LIMIT {
            bail!("job {id} did not end within {} s: {job}", JOB_LIMIT.as_secs());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// sync(2), untimed, so that no run pays for the previous one's writes.
pub fn sync() {
    // SAFETY: sync(2) takes no arguments and cannot fail.
    unsafe { libc::sync() };
}

pub fn seconds(job: &Value) -> f64 {
    job["duration_ms"].as_i64().map_or(f64::NAN, |ms| ms as f64 / 1e3)
}

/// Seconds between two RFC 3339 times of a job's view.
fn between(job: &Value, from: &str, to: &str) -> Option<f64> {
    let at = |field: &str| time::OffsetDateTime::parse(job[field].as_str()?, &time::format_description::well_known::Rfc3339).ok();
    Some((at(to)? - at(from)?).as_seconds_f64())
}

/// Where a job's time went, by the control plane's own times: created to
/// started (the command reaching the agent), and started to finished less
/// the agent's `duration_ms` (the snapshot or restore itself): what the
/// agent did after it (a backup's `forget --prune`) and its report.
pub fn phases(job: &Value) -> String {
    let fmt = |v: Option<f64>| v.map_or_else(|| "?".to_string(), |v| format!("{v:.2} s"));
    let after = after_snapshot(job);
    format!("queued {}, then {} past the agent's own {}", fmt(between(job, "created_at", "started_at")), fmt(after), fmt(job["duration_ms"].as_i64().map(|ms| ms as f64 / 1e3)))
}

/// Started to finished less the agent's own `duration_ms`, in seconds.
pub fn after_snapshot(job: &Value) -> Option<f64> {
    between(job, "started_at", "finished_at").zip(job["duration_ms"].as_i64()).map(|(r, ms)| r - ms as f64 / 1e3)
}

pub fn median(values: &[f64]) -> f64 {
    crate::stats::spread(values).map_or(f64::NAN, |s| s.median)
}

fn which(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|path| std::env::split_paths(&path).map(|dir| dir.join(program)).find(|p| p.is_file()))
}

struct ControlPlane {
    bytes: i64,
    added: i64,
    wall: f64,
    job_seconds: f64,
}

/// The control plane's backups: the one the new destination may have
/// started is waited out, then `runs` on demand, each timed from the POST.
async fn control_plane(server: &Server, sizes: &Sizes) -> Result<ControlPlane> {
    let (mut walls, mut jobs) = (Vec::new(), Vec::new());
    let mut last = Value::Null;
    let mut run = 0;
    let waited = Instant::now();
    while run < sizes.runs {
        sync();
        let posted = Instant::now();
        let (status, job) = server.call(Method::POST, "/api/control-plane/backups", None).await?;
        if status == 409 {
            // The first scheduled run, started when the destination came.
            if waited.elapsed() > JOB_LIMIT {
                bail!("a control-plane backup stayed under way for {} s: {job}", JOB_LIMIT.as_secs());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        }
        let job = expect((status, job), 202, "POST /api/control-plane/backups")?;
        let id = job["id"].as_str().context("the job's id")?.to_string();
        let (done, took) = until_done(server, &id, posted).await?;
        run += 1;
        println!(
            "control-plane backup {run} ({} apps): {:.2} s POST -> succeeded ({}), {} bytes, {} added",
            sizes.apps,
            took.as_secs_f64(),
            phases(&done),
            done["bytes"],
            done["added_bytes"]
        );
        walls.push(took.as_secs_f64());
        jobs.push(seconds(&done));
        last = done;
    }
    Ok(ControlPlane {
        bytes: last["bytes"].as_i64().unwrap_or(-1),
        added: last["added_bytes"].as_i64().unwrap_or(-1),
        wall: median(&walls),
        job_seconds: median(&jobs),
    })
}

/// The agent's directory of a volume.
pub fn volume_dir(bench: &Bench, volume: &str) -> PathBuf {
    bench.cluster.agent_dir().join("volumes").join(volume)
}

/// Files and bytes of content under `root`.
pub fn tree_size(root: &Path) -> Result<(u64, u64)> {
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
