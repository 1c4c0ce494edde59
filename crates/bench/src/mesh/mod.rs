//! `cloudweb-bench mesh`: what cloud-web's own configuration of the mesh
//! costs. Two real agents (and their control plane) come up in network
//! namespaces on a bridge (`cloudweb_e2e::mesh_cluster`, the mesh tests'
//! harness) and configure their WireGuard mesh themselves, with
//! `--mesh-mode auto`: kernel WireGuard where the kernel has it, otherwise
//! wireguard-go. In the same two namespaces the bench configures by hand,
//! with `wg set` and `ip`, a second wireguard-go tunnel (its own
//! interfaces, UDP port 51830 and 10.79.0.0/16) with the agent's MTU and
//! keepalive, and a kernel one (51831, 10.78.0.0/16) where the kernel has
//! WireGuard. Then TCP throughput (one stream) and 64-byte round trips
//! from one namespace to the other over the plain LAN, the agents' mesh
//! (10.77.x.y) and each hand tunnel, in rounds, with the ratios.
//!
//! The target is the agent's mesh against the hand tunnel on the same
//! backend (the same wireguard-go binary here): at least 0.95 of its
//! throughput, the median of the per-round ratios (each round takes both
//! in turn, in short slices; see `measure.rs`). That is the part the
//! project controls; what wireguard-go itself costs against the plain
//! link is printed for context, not judged (issue 21 item 6). The
//! settings of both interfaces are read back the same way and printed
//! side by side with what differs, and the wireguard-go processes' CPU
//! time per GB moved, steadier than throughput on a loaded machine, is
//! compared too. `--noise-check` measures the hand tunnel twice, as two
//! paths: its ratio to itself is what noise alone does.
//!
//! Addresses and interfaces exist only inside the run's namespaces, which
//! go at the end with the agents, their control plane and the hand
//! wireguard-go processes (and their sockets in /var/run/wireguard); the
//! bench then says what is left (nothing). The measuring threads enter
//! the namespaces with setns(2).
//!
//! Both ends run on this one machine: by default every process shares
//! every core. With `--one-core-per-side` side a (its agent, that agent's
//! wireguard-go and its hand wireguard-go, each pinned by pid with
//! `taskset -a -p` once it runs, and the sender of every path) gets CPU 0
//! and side b (the same, with the receiver) CPU 1; the plain path gets the
//! same pinning. The control plane is not pinned. Both wireguard-go are
//! pinned the same way on purpose: Go sizes its runtime (GOMAXPROCS) by
//! the CPUs it may use at start, so one started under `taskset -c` would
//! run differently from the agent's child.

mod measure;
mod tunnel;

use std::net::{Ipv4Addr, SocketAddr};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use cloudweb_e2e::mesh_cluster::{all_pairs_ping, MeshCluster};
use cloudweb_e2e::netns::Lan;

use crate::target::{Cmp, Target};
use measure::{median, Path, Plan, Sample, MESSAGE, SINK_PORT};
use tunnel::{HandTunnel, Spec};

#[derive(clap::Args)]
pub struct Args {
    /// Seconds of bulk transfer per path and round (in 500 ms slices
    /// taken in turn over the paths).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=60))]
    seconds: u64,
    /// Rounds over every path; the median round is reported, and the
    /// target's ratio is the median of the rounds' ratios.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=20))]
    rounds: u64,
    /// Round trips per latency sample.
    #[arg(long, default_value_t = 2000, value_parser = clap::value_parser!(u64).range(10..=1_000_000))]
    pings: u64,
    /// Pin side A (sender, its agent, their wireguard-go) to CPU 0 and
    /// side B (receiver, its agent, their wireguard-go) to CPU 1, for
    /// every path.
    #[arg(long)]
    one_core_per_side: bool,
    /// Also measure the hand wireguard-go tunnel a second time as a path
    /// of its own and print its ratio to itself: what the noise alone
    /// does to the target's ratio on this machine.
    #[arg(long)]
    noise_check: bool,
}

/// UDP port and second octet of the hand-configured wireguard-go tunnel.
const HAND_PORT: u16 = 51830;
const HAND_NET: u8 = 79;
/// The same for the hand-configured kernel tunnel.
const KERNEL_PORT: u16 = 51831;
const KERNEL_NET: u8 = 78;

const PLAIN: &str = "plain";
const AGENT: &str = "agent mesh";
const HAND: &str = "hand wireguard-go";
const KERNEL: &str = "hand kernel";
const AGAIN: &str = "hand wg-go again";

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

pub async fn run(args: Args) -> Result<Vec<Target>> {
    let cluster = MeshCluster::start(2, &[]).await.context("starting a control plane and two agents in namespaces")?;
    let prefix = cluster.lan.switch.name.trim_end_matches("-sw").to_string();
    let result = bench(&cluster, &args).await.map_err(|err| {
        let logs = cluster.logs();
        let mut start = logs.len().saturating_sub(8000);
        while !logs.is_char_boundary(start) {
            start += 1;
        }
        err.context(format!("the cluster's logs (the end):\n{}", &logs[start..]))
    });
    // Agents (and their wireguard-go) first, then the namespaces.
    drop(cluster);
    cleanup(&prefix);
    result
}

/// Says what is left of the run (nothing, normally) and removes leftover
/// sockets of its interfaces.
fn cleanup(prefix: &str) {
    let namespaces = cloudweb_e2e::netns::ip(&["netns", "list"]).unwrap_or_default();
    let namespaces: Vec<&str> = namespaces.lines().filter_map(|l| l.split_whitespace().next()).filter(|n| n.starts_with(prefix)).collect();
    let mut sockets = Vec::new();
    if let Ok(entries) = std::fs::read_dir("/var/run/wireguard") {
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with(prefix) {
                let _ = std::fs::remove_file(entry.path());
                sockets.push(name);
            }
        }
    }
    if namespaces.is_empty() && sockets.is_empty() {
        println!("cleanup: agents stopped, namespaces {prefix}-* deleted, no {prefix}* socket left in /var/run/wireguard");
    } else {
        println!("cleanup: WARNING namespaces left: {namespaces:?}; sockets left (removed now): {sockets:?}");
    }
}

async fn bench(cluster: &MeshCluster, args: &Args) -> Result<Vec<Target>> {
    // The mesh is up when each agent reaches the other over 10.77.x.y.
    all_pairs_ping(cluster, &[0, 1]).await?;
    let (a, b) = (&cluster.agents[0], &cluster.agents[1]);
    let ns = [cluster.lan.members[a.ns].name.clone(), cluster.lan.members[b.ns].name.clone()];
    let lan = [Lan::address(a.index), Lan::address(b.index)];
    let mesh: [Ipv4Addr; 2] = [cluster.mesh_address(a).parse()?, cluster.mesh_address(b).parse()?];
    let agent_interfaces = [a.interface.clone(), b.interface.clone()];
    let agent_mtu = [tunnel::mtu(&ns[0], &agent_interfaces[0])?, tunnel::mtu(&ns[1], &agent_interfaces[1])?];
    let agent_pids = [a.process.as_ref().context("agent a runs")?.pid(), b.process.as_ref().context("agent b runs")?.pid()];
    let agent_wireguard_go = agent_pids.map(tunnel::agent_wireguard_go);
    let userspace = cluster.backend == "userspace";
    if userspace && agent_wireguard_go.iter().any(Option::is_none) {
        anyhow::bail!("the agents run on userspace WireGuard, but no wireguard-go child was found: {agent_wireguard_go:?}");
    }
    let cpus = args.one_core_per_side.then_some([0, 1]);
    if let Some(cpus) = cpus {
        for side in 0..2 {
            tunnel::pin_process(agent_pids[side], cpus[side])?;
            if let Some(pid) = agent_wireguard_go[side] {
                tunnel::pin_process(pid, cpus[side])?;
            }
        }
    }

    let tmp = tempfile::tempdir()?;
    let prefix = cluster.lan.switch.name.trim_end_matches("-sw");
    let spec = |letter: char, net: u8, port: u16| Spec {
        ns: [&ns[0], &ns[1]],
        lan,
        interfaces: [format!("{prefix}{letter}{}", a.index), format!("{prefix}{letter}{}", b.index)],
        port,
        addresses: [Ipv4Addr::new(10, net, 0, 1), Ipv4Addr::new(10, net, 0, 2)],
        // Side a's; side b's is the same (printed below).
        mtu: agent_mtu[0],
        cpus,
        dir: tmp.path(),
    };
    let hand = HandTunnel::userspace(&spec('h', HAND_NET, HAND_PORT)).context("the hand-configured wireguard-go tunnel")?;
    let kernel = match userspace {
        true => None,
        false => Some(HandTunnel::kernel(&spec('k', KERNEL_NET, KERNEL_PORT)).context("the hand-configured kernel tunnel")?),
    };
    // The hand tunnel the agents' mesh is held against: the same backend.
    let (same, same_name, same_what) = match &kernel {
        None => (&hand, HAND, "hand-configured wireguard-go"),
        Some(kernel) => (kernel, KERNEL, "hand-configured kernel WireGuard"),
    };

    let to = |address: Ipv4Addr| SocketAddr::from((address, SINK_PORT));
    let hand_pids = hand.pids();
    // In the order they are measured (see measure::rounds): the agents'
    // mesh right after the hand wireguard-go tunnel and before the others,
    // so that the noise check's second path over that tunnel never comes
    // right after its first.
    let mut paths = vec![
        Path { name: PLAIN, to: to(lan[1]), daemons: Vec::new() },
        Path { name: HAND, to: to(hand.addresses[1]), daemons: hand_pids.clone() },
        Path { name: AGENT, to: to(mesh[1]), daemons: agent_wireguard_go.iter().flatten().copied().collect() },
    ];
    if let Some(kernel) = &kernel {
        paths.push(Path { name: KERNEL, to: to(kernel.addresses[1]), daemons: Vec::new() });
    }
    if args.noise_check {
        paths.push(Path { name: AGAIN, to: to(hand.addresses[1]), daemons: hand_pids.clone() });
    }

    println!(
        "mesh: {} rounds; per path and round {} s of bulk TCP (one stream, in {} ms slices taken in turn over the paths) \
         and {} round trips of {MESSAGE} B (medians of the rounds); {}",
        args.rounds,
        args.seconds,
        measure::SLICE.as_millis(),
        args.pings,
        match args.one_core_per_side {
            true => "each side (its agent, wireguard-go and end of every path) pinned to a core of its own",
            false => "both sides share every core",
        }
    );
    println!(
        "{}, {} CPUs; the agents' `--mesh-mode auto` runs on {} WireGuard",
        wireguard_go_version(),
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        cluster.backend
    );
    println!(
        "MTU: LAN {}; agent mesh {} (side a) / {} (side b), read from the agents' interfaces; {} set to {} on both sides",
        tunnel::mtu(&ns[0], "eth0").map_or_else(|_| "?".into(), |m| m.to_string()),
        agent_mtu[0],
        agent_mtu[1],
        same_name,
        agent_mtu[0]
    );
    let agent_facts = tunnel::facts(&ns[0], &agent_interfaces[0], agent_wireguard_go[0]);
    compare(&agent_facts, &tunnel::facts(&ns[0], &same.interfaces[0], same.pids().first().copied()), same_name);

    let agent_cpu_before: Vec<Option<f64>> = agent_pids.iter().map(|&p| measure::cpu_seconds(p)).collect();
    let stop = Arc::new(AtomicBool::new(false));
    let (seconds, rounds, pings) = (args.seconds, args.rounds, args.pings);
    let plan = Plan { ns: ns.clone(), ns_pids: agent_pids, cpus, seconds, rounds, pings, stop: stop.clone() };
    let measured_paths = paths.clone();
    let (done, finished) = std::sync::mpsc::channel::<()>();
    // Declared after the tunnels and dropped before them.
    let _interrupt = Interrupt { stop, finished };
    let samples = tokio::task::spawn_blocking(move || {
        let _done = done;
        measure::rounds(plan, measured_paths)
    })
    .await??;
    let agent_cpu: Option<f64> =
        agent_pids.iter().zip(&agent_cpu_before).map(|(&p, before)| Some(measure::cpu_seconds(p)? - (*before)?)).sum();

    let targets = report(&paths, &samples, same_name, same_what);
    if let Some(cpu) = agent_cpu {
        println!("the two agent processes (without their wireguard-go) used {cpu:.2} CPU s in all while the paths were measured");
    }
    if kernel.is_none() {
        println!("hand kernel: not measured, this machine has no wireguard link type (`ip link add … type wireguard` fails)");
    }
    drop((hand, kernel));
    Ok(targets)
}

/// On Ctrl-C (the bench's future dropped while it measures) this stops the
/// measuring thread and waits for it before the tunnels and the cluster
/// go: an open stream over a tunnel that is gone would wait for its
/// timeouts.
struct Interrupt {
    stop: Arc<AtomicBool>,
    /// Disconnected once the measuring thread is done.
    finished: std::sync::mpsc::Receiver<()>,
}

impl Drop for Interrupt {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = self.finished.recv_timeout(Duration::from_secs(10));
    }
}

/// Prints the agent's interface and the hand one side by side (side a),
/// then what differs.
fn compare(agent: &[(&'static str, String)], hand: &[(&'static str, String)], hand_name: &str) {
    println!("{:<18} {:<20} {hand_name} (side a)", "setting", "agent mesh");
    let mut differs = Vec::new();
    for (what, value) in agent {
        let theirs = hand.iter().find(|(w, _)| w == what).map_or("-", |(_, v)| v.as_str());
        println!("{what:<18} {value:<20} {theirs}");
        if value != theirs {
            differs.push(format!("{what} ({value} vs {theirs})"));
        }
    }
    let differs = if differs.is_empty() { "nothing".to_string() } else { differs.join(", ") };
    println!("differs: {differs} (the listen ports by construction: both tunnels are in the same namespaces)");
}

/// The table, the ratios, and the target.
fn report(paths: &[Path], samples: &[Vec<Sample>], same_name: &str, same_what: &str) -> Vec<Target> {
    println!("{:<18} {:>14} {:>10} {:>10} {:>10} {:>12}", "path", "throughput", "rtt p50", "rtt p99", "udp drops", "wg CPU s/GB");
    let index = |name: &str| paths.iter().position(|p| p.name == name);
    let rate = |i: usize| median(samples[i].iter().map(|s| s.bytes_per_second).collect());
    let p50 = |i: usize| median(samples[i].iter().map(|s| s.p50.as_secs_f64()).collect());
    // The median CPU per GB, when every round has one (tunnels of wireguard-go).
    let cpu = |i: usize| samples[i].iter().map(|s| s.cpu_per_gb).collect::<Option<Vec<f64>>>().filter(|c| !c.is_empty()).map(median);
    for (i, path) in paths.iter().enumerate() {
        let p99 = median(samples[i].iter().map(|s| s.p99.as_secs_f64()).collect());
        let drops: Option<u64> = samples[i].iter().map(|s| s.udp_drops).sum();
        println!(
            "{:<18} {:>9.0} Mbit/s {:>7.0} µs {:>7.0} µs {:>10} {:>12}",
            path.name,
            rate(i) * 8.0 / 1e6,
            p50(i) * 1e6,
            p99 * 1e6,
            drops.map_or_else(|| "?".into(), |d| d.to_string()),
            cpu(i).map_or_else(|| "-".into(), |c| format!("{c:.1}"))
        );
    }
    println!(
        "(udp drops: datagrams either namespace dropped for a full UDP receive buffer during the bulk transfers, all rounds; \
         wg CPU: both wireguard-go processes' CPU time per GB moved)"
    );
    let (plain, agent, same) = (index(PLAIN).expect("plain"), index(AGENT).expect("agent"), index(same_name).expect("same backend"));
    // Each round measured both tunnels in turn: their ratio per round,
    // then the median, so that load moving between rounds cancels out.
    let ratio_of = |x: usize, y: usize| {
        let per_round: Vec<f64> = samples[x].iter().zip(&samples[y]).map(|(x, y)| x.bytes_per_second / y.bytes_per_second).collect();
        let rounds: Vec<String> = per_round.iter().map(|r| format!("{r:.3}")).collect();
        (median(per_round), rounds.join(" "))
    };
    let (ratio, rounds) = ratio_of(agent, same);
    println!("{AGENT} / {same_name}: throughput {ratio:.3} (median of the rounds' ratios: {rounds}), rtt p50 {:.2}x", p50(agent) / p50(same));
    if let (Some(x), Some(y)) = (cpu(agent), cpu(same)) {
        println!("{AGENT} / {same_name}: wireguard-go CPU per GB {:.3} (steadier than the throughput on a loaded machine)", x / y);
    }
    if let Some(again) = index(AGAIN) {
        let (noise, rounds) = ratio_of(again, same);
        println!(
            "noise check, {AGAIN} / {same_name} (one tunnel measured as two paths): throughput {noise:.3} (rounds: {rounds}), rtt p50 {:.2}x",
            p50(again) / p50(same)
        );
    }
    for (i, path) in paths.iter().enumerate().skip(1) {
        println!("{} / plain (context, no target): throughput {:.3}, rtt p50 {:.2}x", path.name, rate(i) / rate(plain), p50(i) / p50(plain));
    }
    // Issue 21 item 6: what the project controls is its own overhead, the
    // agent's configuration against the same WireGuard configured by hand.
    vec![Target::new(format!("agent-configured mesh throughput / {same_what}"), Cmp::AtLeast, 0.95, "", Some(ratio))]
}
