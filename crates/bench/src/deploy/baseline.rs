//! What a person would do by hand on the node, with nothing of cloud-web:
//! `docker run -d -p 127.0.0.1::8080 IMAGE` and the same health wait as the
//! agent's; and, for builds, a `docker build` of the same files with every
//! layer cached.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use cloudweb_protocol::deploy::healthy_status;

use super::cluster::{baseline_repository, BASELINE_LABEL};
use crate::docker::{docker, docker_with_env};

/// Between two health probes, as the agent waits.
pub const HEALTH_PROBE_INTERVAL: Duration = Duration::from_millis(200);

pub struct RunTimes {
    /// `docker run -d` returned: the container is started.
    pub start_ms: f64,
    /// From there until the health check passed (port lookup included).
    pub healthy_ms: f64,
}

impl RunTimes {
    pub fn total(&self) -> f64 {
        self.start_ms + self.healthy_ms
    }
}

/// Runs `image` like the agent would, without the agent: a published port
/// on 127.0.0.1, then GET / every 200 ms until it answers. The container is
/// removed afterwards.
pub async fn docker_run(image: &str, app: &str, health_timeout: Duration) -> Result<RunTimes> {
    let label = format!("{BASELINE_LABEL}={app}");
    let started = Instant::now();
    let id = docker(&["run", "-d", "--label", &label, "-p", "127.0.0.1::8080", "--", image])?;
    let start_ms = started.elapsed().as_secs_f64() * 1000.0;
    let result = async {
        let published = docker(&["port", &id, "8080/tcp"])?;
        let port: u16 = published
            .lines()
            .find_map(|line| line.strip_prefix("127.0.0.1:")?.trim().parse().ok())
            .with_context(|| format!("docker port printed no 127.0.0.1 binding: {published:?}"))?;
        wait_healthy(&format!("http://127.0.0.1:{port}/"), health_timeout).await
    }
    .await;
    let healthy_ms = started.elapsed().as_secs_f64() * 1000.0 - start_ms;
    docker(&["rm", "-f", "--", &id])?;
    result?;
    Ok(RunTimes { start_ms, healthy_ms })
}

/// Probes `url` as the agent does (a fresh client, 2 s per request, no
/// redirects, any status below 500 counts) until it answers or `timeout`
/// passes. The agent also asks the Engine whether the container still runs
/// between probes; this does not, which if anything flatters the baseline.
async fn wait_healthy(url: &str, timeout: Duration) -> Result<()> {
    let http = reqwest::Client::builder().timeout(Duration::from_secs(2)).redirect(reqwest::redirect::Policy::none()).build()?;
    let started = Instant::now();
    loop {
        if let Ok(response) = http.get(url).send().await {
            if healthy_status(response.status().as_u16()) {
                return Ok(());
            }
        }
        if started.elapsed() > timeout {
            bail!("no answer on {url} within {} s", timeout.as_secs());
        }
        tokio::time::sleep(HEALTH_PROBE_INTERVAL).await;
    }
}

pub struct BuildTimes {
    pub total_ms: f64,
    pub fully_cached: bool,
}

/// `docker build` of `context` (the app's Dockerfile and files) with the
/// classic builder, which is what the agent's build API call uses.
pub fn docker_build(context: &Path, app: &str) -> Result<BuildTimes> {
    let tag = format!("{}:baseline", baseline_repository(app));
    let context = context.to_str().context("the build context path is not UTF-8")?;
    let started = Instant::now();
    let output = docker_with_env(&["build", "--tag", &tag, "--", context], &[("DOCKER_BUILDKIT", "0")])?;
    let total_ms = started.elapsed().as_secs_f64() * 1000.0;
    let steps = output.lines().filter(|line| line.starts_with("Step ") && !line.contains(" : FROM ")).count();
    let cached = output.lines().filter(|line| line.contains("Using cache")).count();
    Ok(BuildTimes { total_ms, fully_cached: steps > 0 && steps == cached })
}
