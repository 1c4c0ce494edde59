//! `cloudweb-bench flood` (`--target agent`, the default): N connections
//! that finish the TLS handshake on the agent listener without a client certificate and then send nothing,
//! against a real control plane on loopback (started with its default
//! connection limits). Prints how many the server still holds, the user
//! API's latency and a fresh handshake's time under the flood, and how
//! many are still open after the unauthenticated idle timeout, and the
//! verdicts of issue 10's targets. `--target api` floods the user API
//! instead ([`api`]).

mod api;

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

use crate::server::{sibling_binary, Server};
use crate::stats::{ms, summarize};
use crate::target::{Cmp, Target};

#[derive(clap::Args)]
pub struct Args {
    /// The listener flooded: `agent` (TLS without a certificate) or `api`
    /// (plain HTTP: idle and slow-header connections from several
    /// addresses while a real deploy runs and nodes heartbeat).
    #[arg(long, value_enum, default_value_t = Listener::Agent)]
    target: Listener,
    /// Idle connections to open (default: 2,000 on the agent listener,
    /// 20,000 on the user API).
    #[arg(long)]
    connections: Option<usize>,
    /// Seconds to wait before counting the connections still open (past
    /// the server's default unauthenticated idle timeout of 10 s; agent only).
    #[arg(long, default_value_t = 13)]
    settle_seconds: u64,
    #[command(flatten)]
    api: api::ApiArgs,
    #[command(flatten)]
    binaries: crate::deploy::cluster::BinaryArgs,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Listener {
    Agent,
    Api,
}

/// Lifts the soft limit on open files to the hard one, and the hard one
/// to `needed` when it is lower and this process may (root). The control
/// plane started next inherits it.
fn raise_open_file_limit(needed: u64) -> Result<()> {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE)?;
    if hard < needed && setrlimit(Resource::RLIMIT_NOFILE, needed, needed).is_ok() {
        return Ok(());
    }
    if soft < hard {
        setrlimit(Resource::RLIMIT_NOFILE, hard, hard)?;
    }
    anyhow::ensure!(hard >= needed, "the open file limit ({hard}) is below the {needed} this run needs");
    Ok(())
}

/// Whether the peer closed the stream (end of file or an error) within `wait`.
async fn closed<S: tokio::io::AsyncRead + Unpin>(stream: &mut S, wait: Duration) -> bool {
    let mut byte = [0u8; 1];
    matches!(tokio::time::timeout(wait, stream.read(&mut byte)).await, Ok(Ok(0)) | Ok(Err(_)))
}

pub async fn run(args: Args) -> Result<Vec<Target>> {
    if args.target == Listener::Api {
        return api::run(args.connections.unwrap_or(20_000), args.api, args.binaries).await;
    }
    let connections = args.connections.unwrap_or(2000);
    raise_open_file_limit(connections as u64 + 500)?;
    let binary = sibling_binary("cloudweb-server", args.binaries.server_bin.clone())?;
    let dir = tempfile::tempdir()?;
    let server = Server::start(&binary, dir.path(), &[]).await?;
    let address = server.agent_url.trim_start_matches("https://").to_string();

    let mut roots = rustls::RootCertStore::empty();
    roots.add(CertificateDer::from_pem_slice(server.ca_pem.as_bytes()).context("CA")?)?;
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let name = ServerName::try_from("127.0.0.1")?;

    let started = Instant::now();
    let mut flood = Vec::with_capacity(connections);
    let mut failed = 0usize;
    while flood.len() + failed < connections {
        let mut batch = tokio::task::JoinSet::new();
        for _ in 0..100.min(connections - flood.len() - failed) {
            let (connector, address, name) = (connector.clone(), address.clone(), name.clone());
            batch.spawn(async move {
                let tcp = TcpStream::connect(&address).await.ok()?;
                connector.connect(name, tcp).await.ok()
            });
        }
        while let Some(done) = batch.join_next().await {
            match done? {
                Some(stream) => flood.push(stream),
                None => failed += 1,
            }
        }
    }
    let opened_in = started.elapsed();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut held = 0;
    for stream in flood.iter_mut() {
        if !closed(stream, Duration::from_millis(1)).await {
            held += 1;
        }
    }

    let mut api = Vec::new();
    let mut handshakes = Vec::new();
    for _ in 0..20 {
        let t = Instant::now();
        let (status, _) = server.call(reqwest::Method::GET, "/api/nodes", None).await?;
        anyhow::ensure!(status == 200, "GET /api/nodes answered {status}");
        api.push(t.elapsed().as_micros() as u32);
        let t = Instant::now();
        let tcp = TcpStream::connect(&address).await?;
        let _fresh = connector.connect(name.clone(), tcp).await?;
        handshakes.push(t.elapsed().as_micros() as u32);
    }
    let api = summarize(api);
    let handshakes = summarize(handshakes);

    let waited = Duration::from_secs(args.settle_seconds).saturating_sub(started.elapsed());
    tokio::time::sleep(waited).await;
    let mut open_after = 0;
    for stream in flood.iter_mut() {
        if !closed(stream, Duration::from_millis(1)).await {
            open_after += 1;
        }
    }

    println!("flood: {} connections opened in {} ({failed} refused)", flood.len(), ms(opened_in));
    println!("  held by the server 0.5 s later:   {held}");
    println!("  GET /api/nodes under the flood:   p50 {}  p99 {}  max {}", ms(api.p50), ms(api.p99), ms(api.max));
    println!("  a fresh TLS handshake:            p50 {}  p99 {}", ms(handshakes.p50), ms(handshakes.p99));
    println!("  still open {} s after the start: {open_after}", args.settle_seconds);
    // Issue 10, item 3: under 2,000 such connections the user API answers
    // within 1 s; its closing note set the bounds judged next: at most 1,024
    // unauthenticated connections held in total, each closed 10 s after
    // accept. A fresh handshake (a real agent reconnecting) had no figure;
    // 1 s, as for the API, is chosen (issue 10's test saw tens of ms).
    Ok(vec![
        Target::below(format!("GET /api/nodes under {} idle connections, max", connections), 1000.0, "ms", Some(api.max.as_secs_f64() * 1000.0)),
        Target::below("fresh TLS handshake under the flood, p99", 1000.0, "ms", Some(handshakes.p99.as_secs_f64() * 1000.0)),
        Target::new("unauthenticated connections held", Cmp::AtMost, 1024.0, "", Some(held as f64)),
        Target::new(format!("connections still open {} s after the start", args.settle_seconds), Cmp::AtMost, 0.0, "", Some(open_after as f64)),
    ])
}
