//! `cloudweb-bench mesh`: TCP throughput and round-trip latency between two
//! network namespaces joined by a veth pair, over the plain link and over
//! userspace WireGuard (wireguard-go, the agent's `--mesh-mode userspace`)
//! on the same link, in one run, with the ratios. Kernel WireGuard is
//! measured too when this machine has the `wireguard` link type.
//!
//! Addresses (192.0.2.0/24 on the link, 10.77.0.0/16 on the tunnel) exist
//! only inside the two namespaces, which are deleted at the end. The
//! measuring threads enter the namespaces with setns(2).
//!
//! Both ends run on this one machine: by default the two wireguard-go
//! daemons, the sender and the receiver share every core. With
//! `--one-core-per-side` each side (its wireguard-go and its end of every
//! path, plain included) is pinned to a core of its own, which is closer
//! to two hosts talking; the plain path gets the same pinning, so neither
//! ratio is bought by slowing the plain path down.

use std::fs::File;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::process::Guarded;
use crate::target::{Cmp, Target};

#[derive(clap::Args)]
pub struct Args {
    /// Seconds of bulk transfer per throughput sample.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=60))]
    seconds: u64,
    /// Rounds over every path; the median round is reported.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=20))]
    rounds: u64,
    /// Round trips per latency sample.
    #[arg(long, default_value_t = 2000, value_parser = clap::value_parser!(u64).range(10..=1_000_000))]
    pings: u64,
    /// Pin side A (sender, its wireguard-go) to CPU 0 and side B
    /// (receiver, its wireguard-go) to CPU 1, for every path.
    #[arg(long)]
    one_core_per_side: bool,
}

/// Pins the calling thread to `cpu`.
fn pin(cpu: usize) -> Result<()> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET and
    // sched_setaffinity only touch it and this thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            bail!("pinning to CPU {cpu}: {}", std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// `wireguard-go --version`'s first line, for the record.
fn wireguard_go_version() -> String {
    Command::new("wireguard-go")
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|text| text.lines().next().map(str::to_string))
        .unwrap_or_else(|| "wireguard-go (version unknown)".into())
}

const SINK_PORT: u16 = 5201;
const MESSAGE: usize = 64;

fn ip(args: &[&str]) -> Result<()> {
    let output = Command::new("ip").args(args).stdin(Stdio::null()).output().context("running ip")?;
    if !output.status.success() {
        bail!("`ip {}` failed: {}", args.join(" "), String::from_utf8_lossy(&output.stderr).trim());
    }
    Ok(())
}

/// A network namespace deleted on drop.
struct Netns(String);

impl Netns {
    fn create(name: &str) -> Result<Netns> {
        ip(&["netns", "add", name])?;
        let ns = Netns(name.to_string());
        ip(&["-n", name, "link", "set", "lo", "up"])?;
        Ok(ns)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = ip(&["netns", "delete", &self.0]);
    }
}

/// Moves the calling thread into namespace `name`.
fn enter(name: &str) -> Result<()> {
    let file = File::open(Path::new("/var/run/netns").join(name)).with_context(|| format!("opening namespace {name}"))?;
    // SAFETY: setns only reads the descriptor; it changes this thread alone.
    if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        bail!("setns {name}: {}", std::io::Error::last_os_error());
    }
    Ok(())
}

/// The MTU of `interface` in namespace `ns`, or "?".
fn mtu(ns: &str, interface: &str) -> String {
    let read = || {
        let out = Command::new("ip").args(["-n", ns, "-o", "link", "show", "dev", interface]).output().ok()?;
        let text = String::from_utf8(out.stdout).ok()?;
        let mut words = text.split_whitespace();
        words.find(|w| *w == "mtu")?;
        words.next().map(str::to_string)
    };
    read().unwrap_or_else(|| "?".into())
}

/// `Udp: RcvbufErrors` of namespace `ns` (/proc/net/snmp): datagrams the
/// kernel dropped because a socket's receive buffer was full.
fn udp_rcvbuf_errors(ns: &str) -> Option<u64> {
    let out = Command::new("ip").args(["netns", "exec", ns, "cat", "/proc/net/snmp"]).output().ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    let mut udp = text.lines().filter(|l| l.starts_with("Udp:"));
    let (names, values) = (udp.next()?, udp.next()?);
    let at = names.split_whitespace().position(|n| n == "RcvbufErrors")?;
    values.split_whitespace().nth(at)?.parse().ok()
}

fn wg_key() -> Result<(String, String)> {
    let private = Command::new("wg").arg("genkey").output().context("running wg genkey (wireguard-tools)")?;
    let private = String::from_utf8(private.stdout)?.trim().to_string();
    let mut child = Command::new("wg").arg("pubkey").stdin(Stdio::piped()).stdout(Stdio::piped()).spawn()?;
    child.stdin.take().expect("stdin").write_all(private.as_bytes())?;
    let public = String::from_utf8(child.wait_with_output()?.stdout)?.trim().to_string();
    Ok((private, public))
}

/// One side of a tunnel: `ns` gets `interface` with `address/16`, its
/// peer at `peer_endpoint` owns `peer_address/32`.
struct Side<'a> {
    ns: &'a str,
    interface: String,
    address: &'a str,
    key_file: std::path::PathBuf,
    public: String,
    endpoint: &'a str,
}

fn configure(side: &Side, peer: &Side) -> Result<()> {
    let key = side.key_file.display().to_string();
    let peer_ip = format!("{}/32", peer.address);
    ip(&[
        "netns", "exec", side.ns, "wg", "set", &side.interface, "listen-port", "51820", "private-key", &key, "peer", &peer.public,
        "endpoint", peer.endpoint, "allowed-ips", &peer_ip, "persistent-keepalive", "25",
    ])?;
    ip(&["-n", side.ns, "address", "add", &format!("{}/16", side.address), "dev", &side.interface])?;
    ip(&["-n", side.ns, "link", "set", &side.interface, "up"])
}

/// Accepts connections in `ns` until told to quit: `T` streams are read
/// to the end and answered with the byte count, `L` streams are echoed.
fn sink(ns: String, cpu: Option<usize>, ready: std::sync::mpsc::Sender<Result<()>>) {
    let entered = enter(&ns).and_then(|_| cpu.map_or(Ok(()), pin));
    let listener = match entered.and_then(|_| TcpListener::bind(("0.0.0.0", SINK_PORT)).context("binding the sink")) {
        Ok(listener) => {
            let _ = ready.send(Ok(()));
            listener
        }
        Err(err) => {
            let _ = ready.send(Err(err));
            return;
        }
    };
    for stream in listener.incoming() {
        let Ok(mut stream) = stream else { continue };
        let _ = stream.set_nodelay(true);
        let mut mode = [0u8];
        if stream.read_exact(&mut mode).is_err() {
            continue;
        }
        match mode[0] {
            b'T' => {
                let mut buffer = vec![0u8; 256 * 1024];
                let mut total: u64 = 0;
                while let Ok(n) = stream.read(&mut buffer) {
                    if n == 0 {
                        break;
                    }
                    total += n as u64;
                }
                let _ = stream.write_all(&total.to_be_bytes());
            }
            b'L' => {
                let mut message = [0u8; MESSAGE];
                while stream.read_exact(&mut message).is_ok() {
                    if stream.write_all(&message).is_err() {
                        break;
                    }
                }
            }
            _ => return,
        }
    }
}

fn connect(to: SocketAddr) -> Result<TcpStream> {
    let stream = TcpStream::connect_timeout(&to, Duration::from_secs(5)).with_context(|| format!("connecting to {to}"))?;
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    Ok(stream)
}

/// Bytes per second from the first byte sent to the receiver's count.
fn throughput(to: SocketAddr, seconds: u64) -> Result<f64> {
    let mut stream = connect(to)?;
    stream.write_all(b"T")?;
    let buffer = vec![0x5au8; 128 * 1024];
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(seconds) {
        stream.write_all(&buffer)?;
    }
    stream.shutdown(std::net::Shutdown::Write)?;
    let mut count = [0u8; 8];
    stream.read_exact(&mut count).context("reading the receiver's count")?;
    Ok(u64::from_be_bytes(count) as f64 / start.elapsed().as_secs_f64())
}

/// Round-trip times of `pings` 64-byte messages, sorted.
fn latency(to: SocketAddr, pings: u64) -> Result<Vec<Duration>> {
    let mut stream = connect(to)?;
    stream.write_all(b"L")?;
    let mut message = [0x5au8; MESSAGE];
    let mut times = Vec::with_capacity(pings as usize);
    for _ in 0..pings {
        let start = Instant::now();
        stream.write_all(&message)?;
        stream.read_exact(&mut message)?;
        times.push(start.elapsed());
    }
    times.sort();
    Ok(times)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

struct Sample {
    bytes_per_second: f64,
    p50: Duration,
    p99: Duration,
}

pub async fn run(args: Args) -> Result<Vec<Target>> {
    tokio::task::spawn_blocking(move || measure(args)).await?
}

fn measure(args: Args) -> Result<Vec<Target>> {
    let prefix = format!("cwb{:04x}", std::process::id() & 0xffff);
    let tmp = tempfile::tempdir()?;
    let (a, b) = (format!("{prefix}-a"), format!("{prefix}-b"));
    let ns_a = Netns::create(&a)?;
    let ns_b = Netns::create(&b)?;
    ip(&["-n", &a, "link", "add", "eth0", "type", "veth", "peer", "name", "eth0", "netns", &b])?;
    for (ns, address) in [(&a, "192.0.2.1/24"), (&b, "192.0.2.2/24")] {
        ip(&["-n", ns, "address", "add", address, "dev", "eth0"])?;
        ip(&["-n", ns, "link", "set", "eth0", "up"])?;
    }

    // Userspace WireGuard, as the agent runs it.
    let mut daemons = Vec::new();
    let mut sides = Vec::new();
    for (cpu, (ns, letter, address, endpoint)) in
        [(&a, "a", "10.77.0.1", "192.0.2.1:51820"), (&b, "b", "10.77.0.2", "192.0.2.2:51820")].into_iter().enumerate()
    {
        let interface = format!("{prefix}{letter}");
        let mut command = Command::new("ip");
        command.args(["netns", "exec", ns.as_str()]);
        if args.one_core_per_side {
            command.args(["taskset", "-c", &cpu.to_string()]);
        }
        command.args(["wireguard-go", "-f", &interface]);
        daemons.push(Guarded::spawn(command, &tmp.path().join(format!("wg-{letter}.log")), Duration::from_secs(2))?);
        let (private, public) = wg_key()?;
        let key_file = tmp.path().join(format!("{letter}.key"));
        std::fs::write(&key_file, private)?;
        sides.push(Side { ns, interface, address, key_file, public, endpoint });
    }
    for side in &sides {
        let socket = format!("/var/run/wireguard/{}.sock", side.interface);
        let deadline = Instant::now() + Duration::from_secs(10);
        while !Path::new(&socket).exists() {
            if Instant::now() > deadline {
                bail!("wireguard-go did not create {socket}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    configure(&sides[0], &sides[1])?;
    configure(&sides[1], &sides[0])?;

    // Kernel WireGuard, where the module exists.
    let kernel = ip(&["-n", &a, "link", "add", "wgk", "type", "wireguard"]).is_ok();
    let mut paths: Vec<(&str, SocketAddr)> = vec![
        ("plain", SocketAddr::from(([192, 0, 2, 2], SINK_PORT))),
        ("userspace", SocketAddr::from(([10, 77, 0, 2], SINK_PORT))),
    ];
    if kernel {
        ip(&["-n", &b, "link", "add", "wgk", "type", "wireguard"])?;
        let (ka, kb) = (wg_key()?, wg_key()?);
        let (fa, fb) = (tmp.path().join("ka.key"), tmp.path().join("kb.key"));
        std::fs::write(&fa, &ka.0)?;
        std::fs::write(&fb, &kb.0)?;
        let side_a = Side { ns: &a, interface: "wgk".into(), address: "10.78.0.1", key_file: fa, public: ka.1, endpoint: "192.0.2.1:51821" };
        let side_b = Side { ns: &b, interface: "wgk".into(), address: "10.78.0.2", key_file: fb, public: kb.1, endpoint: "192.0.2.2:51821" };
        for (side, peer) in [(&side_a, &side_b), (&side_b, &side_a)] {
            let key = side.key_file.display().to_string();
            ip(&["netns", "exec", side.ns, "wg", "set", "wgk", "listen-port", "51821", "private-key", &key, "peer", &peer.public,
                "endpoint", peer.endpoint, "allowed-ips", &format!("{}/32", peer.address)])?;
            ip(&["-n", side.ns, "address", "add", &format!("{}/16", side.address), "dev", "wgk"])?;
            ip(&["-n", side.ns, "link", "set", "wgk", "up"])?;
        }
        paths.push(("kernel", SocketAddr::from(([10, 78, 0, 2], SINK_PORT))));
    }

    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let sink_ns = b.clone();
    let sink_cpu = args.one_core_per_side.then_some(1);
    std::thread::spawn(move || sink(sink_ns, sink_cpu, ready_tx));
    ready_rx.recv().context("the sink thread")??;

    let client_ns = a.clone();
    let paths_for_client = paths.clone();
    let results = std::thread::spawn(move || -> Result<Vec<Vec<Sample>>> {
        enter(&client_ns)?;
        if args.one_core_per_side {
            pin(0)?;
        }
        // The first packets over a tunnel start its handshake: warm up.
        for (_, to) in &paths_for_client {
            let deadline = Instant::now() + Duration::from_secs(20);
            loop {
                match latency(*to, 50) {
                    Ok(_) => break,
                    Err(err) if Instant::now() > deadline => return Err(err),
                    Err(_) => std::thread::sleep(Duration::from_millis(200)),
                }
            }
        }
        let mut per_path: Vec<Vec<Sample>> = paths_for_client.iter().map(|_| Vec::new()).collect();
        for _ in 0..args.rounds {
            for (i, (_, to)) in paths_for_client.iter().enumerate() {
                let bytes_per_second = throughput(*to, args.seconds)?;
                let times = latency(*to, args.pings)?;
                per_path[i].push(Sample { bytes_per_second, p50: percentile(&times, 0.5), p99: percentile(&times, 0.99) });
            }
        }
        // Stop the sink.
        let _ = connect(paths_for_client[0].1).and_then(|mut s| Ok(s.write_all(b"Q")?));
        Ok(per_path)
    })
    .join()
    .map_err(|_| anyhow::anyhow!("the measuring thread panicked"))??;

    let median = |samples: &[Sample], f: &dyn Fn(&Sample) -> f64| {
        let mut values: Vec<f64> = samples.iter().map(f).collect();
        values.sort_by(|x, y| x.partial_cmp(y).expect("no NaN"));
        values[values.len() / 2]
    };
    println!(
        "mesh: {} rounds, {} s of bulk TCP (one stream) and {} round trips of {MESSAGE} B per path and round (medians); {}",
        args.rounds,
        args.seconds,
        args.pings,
        if args.one_core_per_side { "each side pinned to a core of its own" } else { "both sides share every core" }
    );
    println!(
        "{}, {} CPUs; MTU: link {}, userspace tunnel {}",
        wireguard_go_version(),
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        mtu(&a, "eth0"),
        mtu(&a, &sides[0].interface)
    );
    println!("{:<10} {:>14} {:>12} {:>12}", "path", "throughput", "rtt p50", "rtt p99");
    let mut figures = Vec::new();
    for ((name, _), samples) in paths.iter().zip(&results) {
        let rate = median(samples, &|s| s.bytes_per_second);
        let p50 = median(samples, &|s| s.p50.as_secs_f64());
        let p99 = median(samples, &|s| s.p99.as_secs_f64());
        println!("{name:<10} {:>9.0} Mbit/s {:>9.0} µs {:>9.0} µs", rate * 8.0 / 1e6, p50 * 1e6, p99 * 1e6);
        figures.push((name.to_string(), rate, p50));
    }
    let (_, plain_rate, plain_p50) = figures[0].clone();
    for (name, rate, p50) in &figures[1..] {
        println!("{name}/plain: throughput {:.2}, rtt p50 {:.2}x", rate / plain_rate, p50 / plain_p50);
    }
    // Issue 13: userspace WireGuard at least 0.5 of the plain path's
    // throughput on this machine (not met with Debian 12's wireguard-go;
    // docs/src/operations/benchmarks.md says why).
    let userspace = figures.iter().find(|(name, ..)| name == "userspace").map(|(_, rate, _)| rate / plain_rate);
    let targets = vec![Target::new("userspace WireGuard throughput / plain", Cmp::AtLeast, 0.5, "", userspace)];
    // Only the tunnels use UDP here. wireguard-go 0.0.20220316 leaves its
    // socket at the host's default receive buffer (net.core.rmem_default),
    // and drops there cost the tunnel throughput.
    let drops = |ns: &str| udp_rcvbuf_errors(ns).map_or_else(|| "?".to_string(), |n| n.to_string());
    println!("UDP datagrams dropped for a full socket receive buffer (tunnels): side a {}, side b {}", drops(&a), drops(&b));
    if !kernel {
        println!("kernel: not measured, this machine has no wireguard link type (`ip link add … type wireguard` fails)");
    }
    drop(daemons);
    drop((ns_a, ns_b));
    Ok(targets)
}
