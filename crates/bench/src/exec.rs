//! `cloudweb-bench exec`: an exec session through the control plane (the
//! user's WebSocket, the control plane's bridge, the node's dial-back,
//! `docker exec` on the node) against `docker exec` run on the node
//! itself, with the same container and the same commands.
//!
//! - Keystroke round trip: one byte written to `cat`'s input until it
//!   comes back on its output, one at a time. Target (issue 25): the
//!   median through cloud-web within 5 ms of `docker exec`'s.
//! - Throughput: `cat` of a 100 MiB file in the container, bytes counted
//!   as they arrive. Target: at least half of `docker exec`'s rate.
//!
//! Everything is real: the release `cloudweb-server`, one `cloudweb-agent`
//! joined to it, the machine's Docker Engine and an app of busybox.

use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use cloudweb_protocol::sessions::SessionFrame;
use futures_util::{SinkExt, StreamExt};
use reqwest::Method;
use serde_json::json;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;

use crate::deploy::cluster::{BinaryArgs, Cluster};
use crate::target::{Cmp, Target};

const DOCKERFILE: &str = "FROM {base}\nRUN mkdir -p /www && echo exec > /www/index.html\nCMD [\"httpd\", \"-f\", \"-p\", \"8080\", \"-h\", \"/www\"]\n";

#[derive(clap::Args)]
pub struct Args {
    /// Keystrokes timed on each side (10 to 10000).
    #[arg(long, default_value_t = 300, value_parser = clap::value_parser!(u32).range(10..=10_000))]
    pub keystrokes: u32,
    /// Size of the file `cat` sends, in MiB (1 to 1024).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub mib: u32,
    /// Base image of the app; it must have busybox's sh, cat, head and httpd.
    #[arg(long, default_value = "cloudweb-test/busybox:latest")]
    pub base_image: String,
    #[command(flatten)]
    pub binaries: BinaryArgs,
}

type Socket = tokio_tungstenite::WebSocketStream<tokio::net::TcpStream>;

async fn open(cluster: &Cluster, query: &str) -> Result<Socket> {
    let url = format!("{}/api/apps/{}/exec?{query}", cluster.server.api_url, cluster.app).replacen("http://", "ws://", 1);
    let mut request = url.as_str().into_client_request()?;
    request.headers_mut().insert("authorization", format!("Bearer {}", cluster.server.admin_token).parse()?);
    let host = request.uri().authority().context("no host")?.to_string();
    let tcp = tokio::net::TcpStream::connect(host).await?;
    tcp.set_nodelay(true)?;
    Ok(tokio_tungstenite::client_async(request, tcp).await.context("opening the exec WebSocket")?.0)
}

/// The next output frame's bytes; `None` at the exit status.
async fn next_output(socket: &mut Socket) -> Result<Option<Vec<u8>>> {
    loop {
        let Some(message) = socket.next().await else { bail!("the session closed") };
        let Message::Binary(bytes) = message? else { continue };
        match SessionFrame::decode_one(&bytes)? {
            SessionFrame::Data(data) | SessionFrame::Stderr(data) => return Ok(Some(data)),
            SessionFrame::Exit(0) => return Ok(None),
            SessionFrame::Exit(code) => bail!("the command exited {code}"),
            SessionFrame::Error(message) => bail!("the session failed: {message}"),
            _ => {}
        }
    }
}

async fn keystrokes_cloudweb(cluster: &Cluster, count: u32) -> Result<Vec<Duration>> {
    let mut socket = open(cluster, "command=cat").await?;
    let mut times = Vec::with_capacity(count as usize);
    for i in 0..count {
        let key = b'a' + (i % 26) as u8;
        let started = Instant::now();
        socket.send(Message::Binary(SessionFrame::Data(vec![key]).encode().into())).await?;
        let mut got = Vec::new();
        while got.is_empty() {
            got = next_output(&mut socket).await?.context("cat exited")?;
        }
        times.push(started.elapsed());
        if got != [key] {
            bail!("sent {key:?}, got {got:?}");
        }
    }
    socket.send(Message::Binary(SessionFrame::Eof.encode().into())).await?;
    while next_output(&mut socket).await?.is_some() {}
    Ok(times)
}

fn keystrokes_docker(container: &str, count: u32) -> Result<Vec<Duration>> {
    let mut child = Command::new("docker").args(["exec", "-i", container, "cat"]).stdin(Stdio::piped()).stdout(Stdio::piped()).spawn()?;
    let (mut stdin, mut stdout) = (child.stdin.take().context("stdin")?, child.stdout.take().context("stdout")?);
    let mut times = Vec::with_capacity(count as usize);
    for i in 0..count {
        let key = b'a' + (i % 26) as u8;
        let started = Instant::now();
        stdin.write_all(&[key])?;
        stdin.flush()?;
        let mut got = [0u8; 1];
        stdout.read_exact(&mut got)?;
        times.push(started.elapsed());
        if got[0] != key {
            bail!("docker exec: sent {key:?}, got {got:?}");
        }
    }
    drop(stdin);
    child.wait()?;
    Ok(times)
}

async fn cat_cloudweb(cluster: &Cluster, path: &str) -> Result<(u64, Duration)> {
    let started = Instant::now();
    let mut socket = open(cluster, &format!("command=cat&command={path}")).await?;
    let mut bytes = 0u64;
    while let Some(data) = next_output(&mut socket).await? {
        bytes += data.len() as u64;
    }
    Ok((bytes, started.elapsed()))
}

fn cat_docker(container: &str, path: &str) -> Result<(u64, Duration)> {
    let started = Instant::now();
    let mut child = Command::new("docker").args(["exec", container, "cat", path]).stdout(Stdio::piped()).spawn()?;
    let mut stdout = child.stdout.take().context("stdout")?;
    let mut buf = vec![0u8; 256 * 1024];
    let mut bytes = 0u64;
    loop {
        let n = stdout.read(&mut buf)?;
        if n == 0 {
            break;
        }
        bytes += n as u64;
    }
    child.wait()?;
    Ok((bytes, started.elapsed()))
}

fn percentile(times: &mut [Duration], p: f64) -> f64 {
    times.sort();
    let index = ((times.len() as f64 - 1.0) * p).round() as usize;
    times[index].as_secs_f64() * 1e3
}

pub async fn run(args: Args) -> Result<Vec<Target>> {
    crate::deploy::check_image_reference(&args.base_image)?;
    if !crate::docker::image_exists(&args.base_image) {
        bail!("image {} is missing; build it with scripts/images.sh", args.base_image);
    }
    let binaries = args.binaries.resolve()?;
    let dir = tempfile::Builder::new().prefix("cloudweb-bench-exec-").tempdir()?;
    let mut cluster = Cluster::start(dir.path(), &binaries, "bench-exec").await?;
    let outcome = measure(&mut cluster, &args).await;
    if let Err(err) = cluster.delete_app().await {
        eprintln!("warning: clean-up: {err:#}");
    }
    outcome
}

async fn measure(cluster: &mut Cluster, args: &Args) -> Result<Vec<Target>> {
    let commit = cluster.git().commit("app", &[("Dockerfile", &DOCKERFILE.replace("{base}", &args.base_image))], "bench app")?;
    cluster.create_app("app", 30).await?;
    let (status, answer) = cluster.server.call(Method::POST, &format!("/api/apps/{}/deploy", cluster.app), Some(&json!({"commit": commit}))).await?;
    if status != 201 {
        bail!("the deploy answered {status}: {answer}");
    }
    let id = answer["id"].as_str().context("the deploy answer has no id")?.to_string();
    let settled = crate::deploy::timeline::settle(cluster, &id, Duration::from_secs(120)).await?;
    let container = settled.view["instances"][0]["container"].as_str().context("the instance has no container")?.to_string();
    let waited = Instant::now();
    loop {
        let (_, node) = cluster.server.call(Method::GET, &format!("/api/nodes/{}", cluster.node_id), None).await?;
        if node["features"].as_array().is_some_and(|f| f.iter().any(|f| f == "sessions")) {
            break;
        }
        if waited.elapsed() > Duration::from_secs(30) {
            bail!("the node did not report the sessions feature within 30 s");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!("exec: {} keystrokes and cat of {} MiB, each way; app container {container}", args.keystrokes, args.mib);

    // Warm-up of both paths (connections, the Engine's exec setup).
    keystrokes_cloudweb(cluster, 10).await?;
    tokio::task::block_in_place(|| keystrokes_docker(&container, 10))?;
    let mut ours = keystrokes_cloudweb(cluster, args.keystrokes).await?;
    let mut theirs = tokio::task::block_in_place(|| keystrokes_docker(&container, args.keystrokes))?;
    let (ours_p50, ours_p95) = (percentile(&mut ours, 0.5), percentile(&mut ours, 0.95));
    let (theirs_p50, theirs_p95) = (percentile(&mut theirs, 0.5), percentile(&mut theirs, 0.95));
    println!("keystroke round trip: cloud-web p50 {ours_p50:.2} ms, p95 {ours_p95:.2} ms; docker exec p50 {theirs_p50:.2} ms, p95 {theirs_p95:.2} ms");

    let path = "/tmp/cloudweb-bench-exec";
    let size = u64::from(args.mib) * 1024 * 1024;
    let made = Command::new("docker").args(["exec", &container, "sh", "-c", &format!("head -c {size} /dev/zero > {path}")]).status()?;
    if !made.success() {
        bail!("could not write the {} MiB file in the container", args.mib);
    }
    let (ours_bytes, ours_time) = cat_cloudweb(cluster, path).await?;
    let (theirs_bytes, theirs_time) = tokio::task::block_in_place(|| cat_docker(&container, path))?;
    if ours_bytes != size || theirs_bytes != size {
        bail!("cat sent {ours_bytes} bytes through cloud-web and {theirs_bytes} through docker exec; the file has {size}");
    }
    let rate = |bytes: u64, time: Duration| bytes as f64 / 1024.0 / 1024.0 / time.as_secs_f64();
    let (ours_rate, theirs_rate) = (rate(ours_bytes, ours_time), rate(theirs_bytes, theirs_time));
    println!("cat of {} MiB: cloud-web {ours_rate:.0} MiB/s ({:.2} s), docker exec {theirs_rate:.0} MiB/s ({:.2} s)", args.mib, ours_time.as_secs_f64(), theirs_time.as_secs_f64());

    Ok(vec![
        Target::below("exec keystroke round trip, overhead over docker exec (p50)", 5.0, "ms", Some(ours_p50 - theirs_p50))
            .with_note(format!("cloud-web {ours_p50:.2} ms, docker exec {theirs_p50:.2} ms")),
        Target::new("exec cat throughput, share of docker exec's", Cmp::AtLeast, 50.0, "%", Some(ours_rate / theirs_rate * 100.0))
            .with_note(format!("cloud-web {ours_rate:.0} MiB/s, docker exec {theirs_rate:.0} MiB/s")),
    ])
}
