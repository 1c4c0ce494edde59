//! `cloudweb-bench webhook`: the time from a GitLab push webhook received
//! to the deployment `running`, for a build whose layers are all cached,
//! next to `POST /api/apps/{app}/deploy` of the same commit. Real control
//! plane (with its registry), agent, Docker Engine and git; GitLab is the
//! test stand-in (`cloudweb_e2e::gitlab`) on loopback, serving the
//! repository over smart HTTP with per-deploy deploy tokens, so the
//! webhook path includes everything a real push does: the token check,
//! the delivery record, a deploy token made at GitLab, commit statuses.

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use cloudweb_e2e::gitlab::{FakeGitlab, CLIENT_ID, CLIENT_SECRET};
use rand::Rng;
use reqwest::Method;
use serde_json::{json, Value};

use crate::deploy::cluster::Cluster;
pub use crate::deploy::Args;
use crate::stats::spread;
use crate::target::Target;

const DOCKERFILE: &str = "FROM {base}\nCOPY index.html /www/index.html\nCMD [\"httpd\", \"-f\", \"-p\", \"8080\", \"-h\", \"/www\"]\n";
const QUIET_TIMEOUT: Duration = Duration::from_secs(60);

pub async fn run(args: Args) -> Result<Vec<Target>> {
    let announce = |app: &str, _: &_, _: &str| {
        println!("webhook: {} run(s) of each; app {app} from a GitLab project (stand-in on loopback), FROM {}", args.runs, args.base_image);
    };
    // The benchmark's control plane already allows private git hosts, which
    // the stand-in on loopback needs.
    let outcome = crate::deploy::with_cluster("webhook", &args, announce, async |cluster| {
        let dir = cluster.dir.clone();
        measure(cluster, &args, &dir).await
    })
    .await;
    let (webhook, deploy) = outcome?;
    println!();
    println!("time to running, cached build of the same commit ({} runs):", webhook.len());
    for (name, values) in [("push webhook received → running", &webhook), ("POST /deploy → running", &deploy)] {
        if let Some(s) = spread(values) {
            println!("  {name:<34} median {:>8.1} ms   min {:>8.1} ms   max {:>8.1} ms", s.median, s.min, s.max);
        }
    }
    let (w, d) = (spread(&webhook).map(|s| s.median), spread(&deploy).map(|s| s.median));
    if let (Some(w), Some(d)) = (w, d) {
        println!("  webhook − deploy (medians): {:+.1} ms", w - d);
    }
    // No issue set a target here (issue 11 asked for the two figures). Its
    // closing note measured medians of 852 ms by webhook and 846 ms by POST
    // /deploy (debug build, loaded machine): 2x that is 1,700 ms. What the
    // webhook adds (token check, delivery record, a deploy token made at
    // GitLab) was +6 ms; 250 ms, a quarter of issue 3's 1 s deploy overhead,
    // leaves room for the noise of a single run on a loaded 2-core machine.
    Ok(vec![
        Target::below("push webhook received → running, median", 1700.0, "ms", w),
        Target::below("webhook → running minus POST /deploy → running, medians", 250.0, "ms", w.zip(d).map(|(w, d)| w - d)),
    ])
}

fn no_redirects() -> Result<reqwest::Client> {
    Ok(reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).timeout(Duration::from_secs(20)).build()?)
}

/// Where `url` redirects to, and the `name=value` of the cookie named
/// `cookie` it set, if asked for one.
async fn location(http: &reqwest::Client, url: &str, cookie: Option<&str>) -> Result<(String, Option<String>)> {
    let response = http.get(url).send().await?;
    if response.status().as_u16() != 302 {
        bail!("{url} answered {} instead of a redirect", response.status());
    }
    let set = cookie.map(|name| {
        response
            .headers()
            .get_all("set-cookie")
            .iter()
            .filter_map(|v| v.to_str().ok())
            .find(|v| v.starts_with(&format!("{name}=")))
            .and_then(|line| line.split(';').next())
            .map(str::to_string)
            .with_context(|| format!("{url} set no {name} cookie"))
    });
    Ok((response.headers().get("location").context("no Location")?.to_str()?.to_string(), set.transpose()?))
}

/// Configures GitLab and logs in through the stand-in's OAuth flow.
async fn login(cluster: &Cluster, gitlab: &FakeGitlab) -> Result<()> {
    let settings = json!({"base_url": gitlab.url(), "client_id": CLIENT_ID, "client_secret": CLIENT_SECRET, "allowed_users": ["bench"]});
    let (status, body) = cluster.server.call(Method::PUT, "/api/gitlab/settings", Some(&settings)).await?;
    if status != 200 {
        bail!("PUT /api/gitlab/settings answered {status}: {body}");
    }
    let http = no_redirects()?;
    // The login state is bound to the browser that started it by a cookie.
    let (authorize, login_cookie) = location(&http, &format!("{}/api/auth/gitlab/login", cluster.server.api_url), Some("cloudweb_gitlab_login")).await?;
    let (callback, _) = location(&http, &authorize, None).await?;
    // As an API client: JSON instead of the browser's redirect.
    let response = http.get(&callback).header("cookie", login_cookie.unwrap_or_default()).header("accept", "application/json").send().await?;
    if !response.status().is_success() {
        bail!("the GitLab login answered {}: {}", response.status(), response.text().await?);
    }
    Ok(())
}

/// Polls the deployment until it runs; the time since `started`.
async fn until_running(cluster: &Cluster, id: &str, started: Instant, timeout: Duration) -> Result<f64> {
    loop {
        let (_, body) = cluster.server.call(Method::GET, &format!("/api/deployments/{id}"), None).await?;
        match body["state"].as_str() {
            Some("running") => return Ok(started.elapsed().as_secs_f64() * 1000.0),
            Some("failed") => bail!("deployment {id} failed: {}", body["error"]),
            _ => {}
        }
        if started.elapsed() > timeout {
            bail!("deployment {id} did not run within {} s", timeout.as_secs());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn push(cluster: &Cluster, gitlab: &FakeGitlab, project: i64, commit: &str, run: &str, timeout: Duration) -> Result<(String, f64)> {
    let body = gitlab.push_body(project, "refs/heads/main", "0000000000000000000000000000000000000000", &[commit]);
    let started = Instant::now();
    let answers = gitlab.deliver(project, &body, &format!("bench-{run}-{:08x}", rand::rng().random::<u32>())).await?;
    let (status, answer): &(u16, Value) = answers.first().context("no hook answered")?;
    if *status != 202 {
        bail!("the webhook answered {status}: {answer}");
    }
    let id = answer["deployment"].as_str().context("no deployment in the webhook's answer")?.to_string();
    let ms = until_running(cluster, &id, started, timeout).await?;
    Ok((id, ms))
}

async fn measure(cluster: &mut Cluster, args: &Args, dir: &std::path::Path) -> Result<(Vec<f64>, Vec<f64>)> {
    let timeout = Duration::from_secs(args.settle_timeout_seconds);
    let gitlab = FakeGitlab::start(&dir.join("gitlab")).await?;
    gitlab.add_user(1, "bench", "bench@example.com", true, &[]);
    gitlab.login_as(1);
    let project = gitlab.add_project("bench/app")?;
    let dockerfile = DOCKERFILE.replace("{base}", &args.base_image);
    let commit = gitlab.commit("bench/app", "main", &[("Dockerfile", &dockerfile), ("index.html", "cloudweb-bench webhook\n")], "bench app")?;
    login(cluster, &gitlab).await?;
    let body = json!({"name": cluster.app, "gitlab_project": "bench/app", "port": 8080, "health_timeout_seconds": 30});
    cluster.create_app_from(&body).await?;

    // Warm-up, not measured: fills the layer cache.
    let (mut current, ms) = push(cluster, &gitlab, project, &commit, "warm-up", timeout).await?;
    println!("warm-up: commit {} built and running in {:.0} ms", &commit[..12], ms);
    let (mut webhook, mut deploy) = (Vec::new(), Vec::new());
    for run in 1..=args.runs {
        cluster.wait_quiet(&current, QUIET_TIMEOUT).await?;
        let (id, by_webhook) = push(cluster, &gitlab, project, &commit, &run.to_string(), timeout).await?;
        current = id;
        cluster.wait_quiet(&current, QUIET_TIMEOUT).await?;
        let started = Instant::now();
        let (status, answer) = cluster.server.call(Method::POST, &format!("/api/apps/{}/deploy", cluster.app), Some(&json!({"commit": commit}))).await?;
        if status != 201 {
            bail!("POST /deploy answered {status}: {answer}");
        }
        let id = answer["id"].as_str().context("no id")?.to_string();
        let by_deploy = until_running(cluster, &id, started, timeout).await?;
        current = id;
        println!("run {run}/{}: webhook → running {by_webhook:.0} ms, POST /deploy → running {by_deploy:.0} ms", args.runs);
        webhook.push(by_webhook);
        deploy.push(by_deploy);
    }
    let statuses = gitlab.statuses(&commit);
    println!("commit statuses posted for {}: {}", &commit[..12], statuses.len());
    Ok((webhook, deploy))
}
