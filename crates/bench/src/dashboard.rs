//! `cloudweb-bench dashboard`: every dashboard page's weight (HTML, and
//! with the shared CSS and JS) and time to first byte with many nodes and
//! apps in the database, against a real control plane on loopback. Targets
//! (issue 21 item 5): every page under 150 KB of HTML and its time to
//! first byte under 50 ms (p90) at 1,000 nodes and 1,000 apps.
//! The nodes join through the real join endpoint and each sends a heartbeat
//! with a usage sample over mTLS, so each table row is as full as in
//! production (the Nodes page is read within their 30 s of being ready).

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use reqwest::header::{COOKIE, LOCATION, SET_COOKIE};
use reqwest::Method;
use serde_json::json;

use crate::heartbeats::{enroll, one_heartbeat_each};
use crate::server::{sibling_binary, Server};
use crate::stats::{ms, summarize};
use crate::target::{Cmp, Target};

#[derive(clap::Args)]
pub struct Args {
    /// Nodes in the database.
    #[arg(long, default_value_t = 1_000)]
    nodes: usize,
    /// Apps in the database.
    #[arg(long, default_value_t = 1_000)]
    apps: usize,
    /// Timed requests of each page.
    #[arg(long, default_value_t = 20)]
    samples: usize,
    /// The control plane binary (default: next to this one).
    #[arg(long)]
    server_bin: Option<std::path::PathBuf>,
}

pub async fn run(args: Args) -> Result<Vec<Target>> {
    if args.nodes == 0 || args.apps == 0 || args.samples == 0 {
        bail!("--nodes, --apps and --samples must be positive");
    }
    let dir = tempfile::tempdir()?;
    let server = Arc::new(Server::start(&sibling_binary("cloudweb-server", args.server_bin.clone())?, dir.path(), &["--base-domain", "test"]).await?);
    let agents = enroll(&server, args.nodes, 32).await?;
    one_heartbeat_each(&server, &agents, 16).await?;

    for i in 0..args.apps {
        let name = if i == 0 { "web".to_string() } else { format!("app-{i:04}") };
        let (status, answer) = server.call(Method::POST, "/api/apps", Some(&json!({"name": name, "repo_url": format!("https://git.example.com/team/{name}.git"), "port": 8080}))).await?;
        if status != 201 {
            bail!("creating app {name} answered {status}: {answer}");
        }
    }
    let (_, deployed) = server.call(Method::POST, "/api/apps/web/deploy", None).await?;
    let deployment = deployed["id"].as_str().context("deploy answered without an id")?.to_string();
    let (_, nodes) = server.call(Method::GET, "/api/nodes", None).await?;
    let node_id = nodes["nodes"][0]["id"].as_str().context("no node")?.to_string();

    let http = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).timeout(Duration::from_secs(60)).build()?;
    // The dashboard is for users: make one (the admin token may), log in as them.
    let password = "bench-dashboard-passphrase";
    let (status, answer) = server.call(Method::POST, "/api/users", Some(&json!({"name": "bench", "password": password, "cluster_role": "cluster-admin"}))).await?;
    if status != 201 {
        bail!("creating a user answered {status}: {answer}");
    }
    let login = http.post(format!("{}/login", server.api_url)).form(&[("name", "bench"), ("password", password)]).send().await?;
    if login.headers().get(LOCATION).is_none() {
        bail!("the dashboard login answered {}", login.status());
    }
    let cookie = login.headers().get(SET_COOKIE).context("no session cookie")?.to_str()?.split(';').next().unwrap_or("").to_string();

    let get = |path: String| {
        let request = http.get(format!("{}{path}", server.api_url)).header(COOKIE, &cookie);
        async move {
            let started = Instant::now();
            let response = request.send().await?;
            let first_byte = started.elapsed();
            if !response.status().is_success() {
                bail!("GET {path} answered {}", response.status());
            }
            let body = response.bytes().await?;
            Ok::<_, anyhow::Error>((first_byte, body.len()))
        }
    };
    let (_, css) = get("/assets/app.css".into()).await?;
    let (_, js) = get("/assets/app.js".into()).await?;

    let login_page = http.get(format!("{}/login", server.api_url)).send().await?.bytes().await?.len();
    let paths = [
        "/nodes".to_string(),
        format!("/nodes?page={}", args.nodes.div_ceil(50)),
        format!("/nodes?q=sim-{}", args.nodes - 1),
        format!("/nodes/{node_id}"),
        "/apps".to_string(),
        "/apps/web".to_string(),
        format!("/deployments/{deployment}"),
        "/monitoring?range=1h".to_string(),
        "/monitoring?range=7d".to_string(),
    ];
    println!("{} nodes and {} apps in the database; each page requested {} times one after another", args.nodes, args.apps, args.samples);
    println!("(the stylesheet {css} B and the script {js} B are shared by every page and cached)");
    println!("{:<34} {:>10} {:>12} {:>10} {:>10}", "page", "HTML", "HTML+CSS+JS", "TTFB p50", "TTFB p90");
    println!("{:<34} {login_page:>10} {:>12}", "/login", login_page + css + js);
    let (mut largest, mut slowest) = (login_page, 0.0_f64);
    for path in paths {
        let mut micros = Vec::with_capacity(args.samples);
        let mut html = 0;
        for _ in 0..args.samples {
            let (first_byte, bytes) = get(path.clone()).await?;
            micros.push(first_byte.as_micros().min(u128::from(u32::MAX)) as u32);
            html = bytes;
        }
        let summary = summarize(micros);
        let shown = path.replace(&deployment, "{id}").replace(&node_id, "{id}");
        println!("{shown:<34} {html:>10} {:>12} {:>10} {:>10}", html + css + js, ms(summary.p50), ms(summary.p90));
        largest = largest.max(html);
        slowest = slowest.max(summary.p90.as_secs_f64() * 1000.0);
    }
    Ok(vec![
        Target::new(format!("largest page's HTML with {} nodes and {} apps", args.nodes, args.apps), Cmp::AtMost, 150_000.0, "B", Some(largest as f64)),
        Target::below("slowest page's time to first byte, p90", 50.0, "ms", Some(slowest)),
    ])
}
