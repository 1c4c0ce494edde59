//! `cloudweb-bench deploy`: the time from a deploy request to `running`,
//! stage by stage, for (a) a prebuilt image (a rollback) and (b) a
//! Dockerfile build whose layers are all cached (a redeploy of the same
//! commit), against a bare `docker run` of the same image with the same
//! health wait. Everything is real: the release `cloudweb-server` with its
//! registry, one `cloudweb-agent` joined to it, `git daemon`, and the
//! machine's Docker Engine.
//!
//! Runs are interleaved (rollback, cached build, baselines) and each starts
//! with the node idle, so that a stop of the superseded deployment never
//! delays the next measurement.

mod baseline;
pub mod cluster;
mod report;
pub mod timeline;

use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use rand::Rng;
use reqwest::Method;
use serde_json::json;

use self::cluster::{BinaryArgs, Binaries, Cluster};
use self::report::{format_ms, Results};
use self::timeline::{Kind, Target};
use crate::docker;

/// The app's Dockerfile: the same as the deploy end-to-end test's.
const DOCKERFILE: &str = "FROM {base}\nCOPY index.html /www/index.html\n\
CMD [\"sh\", \"-c\", \"echo \\\"$GREETING\\\" > /www/env.txt && exec httpd -f -p 8080 -h /www\"]\n";
const INDEX_HTML: &str = "cloudweb-bench deploy\n";
/// The app's health check timeout.
const HEALTH_TIMEOUT_SECONDS: u32 = 30;
/// How long the node may take to become idle between two measurements:
/// the drain period, the reconciler's tick and the stop's 10 s grace period.
const QUIET_TIMEOUT: Duration = Duration::from_secs(60);

/// What the benchmarks on a [`Cluster`] take (`deploy` and `webhook`).
#[derive(clap::Args)]
pub struct Args {
    /// Repetitions of each measurement (1 to 50).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=50))]
    pub runs: u32,
    /// Seconds one deployment may take to reach running before the benchmark gives up (10 to 3600).
    #[arg(long, default_value_t = 120, value_parser = clap::value_parser!(u64).range(10..=3600))]
    pub settle_timeout_seconds: u64,
    /// Base image of the app's Dockerfile; it must have busybox's sh and httpd
    /// (scripts/images.sh builds the default).
    #[arg(long, default_value = "cloudweb-test/busybox:latest")]
    pub base_image: String,
    #[command(flatten)]
    pub binaries: BinaryArgs,
}

pub async fn run(args: Args) -> Result<Vec<crate::target::Target>> {
    let results = with_cluster("deploy", &args, |app, binaries, engine| {
        println!(
            "deploy: {} run(s) of each; app {app}: busybox httpd (FROM {}, COPY index.html); health check GET / every 200 ms",
            args.runs, args.base_image
        );
        println!("control plane {}, agent {}, Docker Engine {engine}", binaries.server.display(), binaries.agent.display());
    }, async |cluster| measure_all(cluster, &args).await)
    .await?;
    Ok(report::print(&results))
}

/// The frame of a benchmark on a [`Cluster`]: checks the base image and the
/// Docker Engine, picks a fresh app name, says what runs (`announce` gets the
/// app, the binaries and the Engine's version), starts the cluster in a fresh
/// temporary directory named after `bench`, runs `measure` on it until it ends
/// or Ctrl-C, and always deletes the app (Ctrl-C stops the measurement but not
/// the clean-up).
pub async fn with_cluster<T>(
    bench: &str,
    args: &Args,
    announce: impl FnOnce(&str, &Binaries, &str),
    measure: impl AsyncFnOnce(&mut Cluster) -> Result<T>,
) -> Result<T> {
    check_image_reference(&args.base_image)?;
    let binaries = args.binaries.resolve()?;
    let engine = docker::docker(&["version", "--format", "{{.Server.Version}}"]).context("the Docker Engine is not reachable")?;
    if !docker::image_exists(&args.base_image) {
        bail!("image {} is missing; build it with scripts/images.sh", args.base_image);
    }
    let app = format!("bench-{:06x}", rand::rng().random_range(0..0x100_0000u32));
    let dir = tempfile::Builder::new().prefix(&format!("cloudweb-bench-{bench}-")).tempdir()?;
    announce(&app, &binaries, engine.trim());

    let mut cluster = None;
    let outcome = tokio::select! {
        outcome = async {
            let cluster = cluster.insert(Cluster::start(dir.path(), &binaries, &app).await?);
            measure(cluster).await
        } => outcome,
        _ = tokio::signal::ctrl_c() => Err(anyhow!("interrupted")),
    };
    if let Some(mut cluster) = cluster {
        if let Err(err) = cluster.delete_app().await {
            eprintln!("warning: clean-up: {err:#}");
        }
    }
    outcome
}

/// Image references go into a Dockerfile and onto command lines: keep them
/// to the characters a reference can have.
pub fn check_image_reference(image: &str) -> Result<()> {
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '/' | ':' | '@');
    if image.is_empty() || image.len() > 255 || image.starts_with(['-', '.', '/', ':']) || !image.chars().all(allowed) {
        bail!("--base-image {image:?} is not an image reference (letters, digits, '.', '_', '-', '/', ':', '@'; at most 255)");
    }
    Ok(())
}

async fn measure_all(cluster: &mut Cluster, args: &Args) -> Result<Results> {
    let settle_timeout = Duration::from_secs(args.settle_timeout_seconds);
    let dockerfile = DOCKERFILE.replace("{base}", &args.base_image);
    let commit = cluster.git().commit("app", &[("Dockerfile", &dockerfile), ("index.html", INDEX_HTML)], "bench app")?;
    cluster.create_app("app", HEALTH_TIMEOUT_SECONDS).await?;
    // The same files, as a context for the `docker build` baseline.
    let context = cluster.dir.join("baseline-context");
    std::fs::create_dir_all(&context)?;
    std::fs::write(context.join("Dockerfile"), &dockerfile)?;
    std::fs::write(context.join("index.html"), INDEX_HTML)?;

    // Warm-up, not measured: the first build fills the layer cache and the
    // registry, and is what the rollbacks return to.
    let started = std::time::Instant::now();
    let (status, answer) = cluster.server.call(Method::POST, &format!("/api/apps/{}/deploy", cluster.app), Some(&json!({"commit": commit}))).await?;
    if status != 201 {
        bail!("the first deploy answered {status}: {answer}");
    }
    let first = answer["id"].as_str().context("the deploy answer has no id")?.to_string();
    let settled = timeline::settle(cluster, &first, settle_timeout).await?;
    let image = settled.view["image"].as_str().context("the first deployment has no image")?.to_string();
    println!("warm-up: commit {} built, pushed and running in {:.1} s as {image}", &commit[..12], started.elapsed().as_secs_f64());
    // The agent's build context differs from the CLI's in ways the layer
    // cache notices (file metadata in the archive), so the baseline fills
    // its own cache first.
    let warm = baseline::docker_build(&context, &cluster.app)?;
    println!("warm-up: baseline docker build in {} ms", format_ms(warm.total_ms));

    let target = Target { rollback_to: first.clone(), commit };
    let mut results = Results::default();
    let mut current = first;
    for run in 1..=args.runs {
        cluster.wait_quiet(&current, QUIET_TIMEOUT).await?;
        let rollback = timeline::measure(cluster, Kind::Rollback, &target, settle_timeout).await?;
        current = rollback.deployment.clone();
        cluster.wait_quiet(&current, QUIET_TIMEOUT).await?;
        let build = timeline::measure(cluster, Kind::CachedBuild, &target, settle_timeout).await?;
        current = build.deployment.clone();
        cluster.wait_quiet(&current, QUIET_TIMEOUT).await?;
        let docker_build = baseline::docker_build(&context, &cluster.app)?;
        let docker_run = baseline::docker_run(&image, &cluster.app, Duration::from_secs(u64::from(HEALTH_TIMEOUT_SECONDS))).await?;
        println!(
            "run {run}/{}: (a) rollback {} ms, (b) cached build {} ms{}, baseline docker run {} ms, docker build {} ms",
            args.runs,
            format_ms(rollback.total()),
            format_ms(build.total()),
            if build.fully_cached() { "" } else { " (NOT fully cached)" },
            format_ms(docker_run.total()),
            format_ms(docker_build.total_ms),
        );
        results.rollback.push(rollback);
        results.cached_build.push(build);
        results.docker_run.push(docker_run);
        results.docker_build.push(docker_build);
    }
    Ok(results)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_references() {
        for good in ["cloudweb-test/busybox:latest", "busybox", "127.0.0.1:5000/app:dep_1", "busybox@sha256:abc"] {
            assert!(check_image_reference(good).is_ok(), "{good}");
        }
        for bad in ["", "-q", "busy box", "busybox\nRUN rm -rf /", "a;b", "/abs"] {
            assert!(check_image_reference(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn runs_must_be_between_1_and_50() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            args: Args,
        }
        assert_eq!(Cli::try_parse_from(["x"]).unwrap().args.runs, 5);
        assert_eq!(Cli::try_parse_from(["x", "--runs", "50"]).unwrap().args.runs, 50);
        for bad in ["0", "51", "-1", "five"] {
            assert!(Cli::try_parse_from(["x", "--runs", bad]).is_err(), "--runs {bad}");
        }
        assert!(Cli::try_parse_from(["x", "--settle-timeout-seconds", "5"]).is_err());
    }
}
