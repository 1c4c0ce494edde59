//! `cloudweb-bench scheduler`: placements per second of the real scheduler
//! (`cloudweb_server::deploy::scheduler::place`) against simulated nodes
//! with mixed load, features and degraded flags, on one core.

use std::time::Instant;

use anyhow::{bail, Result};
use cloudweb_server::deploy::scheduler::{place, NodeSnapshot, Placement, Request};

use crate::stats::{ms, summarize};
use crate::target::{Cmp, Target};

#[derive(clap::Args)]
pub struct Args {
    /// Simulated nodes.
    #[arg(long, default_value_t = 10_000)]
    nodes: usize,
    /// Placements measured.
    #[arg(long, default_value_t = 20_000)]
    placements: usize,
}

/// A small deterministic generator, so every run sees the same cluster.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        self.0 >> 33
    }
}

fn cluster(n: usize) -> Vec<NodeSnapshot> {
    let mut rng = Lcg(42);
    (0..n)
        .map(|i| {
            let cores = [2.0, 4.0, 8.0, 16.0][(rng.next() % 4) as usize];
            let mem: u64 = [4u64, 8, 16, 32][(rng.next() % 4) as usize] << 30;
            let load = (rng.next() % 90) as f64 / 100.0;
            let roll = rng.next() % 100;
            NodeSnapshot {
                id: format!("n-{i:016x}"),
                name: format!("node-{i}"),
                // 2 % unreachable, 2 % draining, 3 % degraded.
                state: match roll {
                    0..=1 => "unreachable",
                    2..=3 => "draining",
                    _ => "ready",
                },
                degraded: (4..=6).contains(&roll).then(|| "i/o timeout".to_string()),
                // Three in four nodes report static-sites.
                features: if rng.next().is_multiple_of(4) { Vec::new() } else { vec!["static-sites".to_string()] },
                version: Some("0.1.0".into()),
                cpu_cores: cores,
                mem_bytes: mem,
                cpu_reserved: cores * load,
                mem_reserved: (mem as f64 * load) as u64,
                instances: (load * 20.0) as u32,
            }
        })
        .collect()
}

pub fn run(args: Args) -> Result<Vec<Target>> {
    if args.nodes == 0 || args.placements == 0 || args.nodes > 1_000_000 || args.placements > 10_000_000 {
        bail!("--nodes must be 1 to 1000000 and --placements 1 to 10000000");
    }
    let mut nodes = cluster(args.nodes);
    let plain = Request { cpu: 0.25, mem_bytes: 256 << 20, features: vec![], avoid: vec![], pin: None, spread: vec![] };
    let static_site = Request { features: vec!["static-sites".into()], ..plain.clone() };
    let index: std::collections::HashMap<String, usize> = nodes.iter().enumerate().map(|(i, n)| (n.id.clone(), i)).collect();
    let mut latencies = Vec::with_capacity(args.placements);
    let (mut placed, mut nowhere) = (0usize, 0usize);
    let mut in_scheduler = std::time::Duration::ZERO;
    for i in 0..args.placements {
        let request = if i % 3 == 0 { &static_site } else { &plain };
        let t = Instant::now();
        let outcome = place(&nodes, request);
        let took = t.elapsed();
        in_scheduler += took;
        latencies.push(took.as_micros().min(u128::from(u32::MAX)) as u32);
        match outcome {
            // Reserve what was placed, as the control plane does, so the
            // cluster fills up and the choice keeps changing.
            Placement::Node(id) => {
                placed += 1;
                if let Some(node) = index.get(&id).map(|&i| &mut nodes[i]) {
                    node.cpu_reserved += request.cpu;
                    node.mem_reserved += request.mem_bytes;
                    node.instances += 1;
                }
            }
            Placement::Nowhere(_) => nowhere += 1,
        }
    }
    let elapsed = in_scheduler;
    let summary = summarize(latencies);
    let rate = args.placements as f64 / elapsed.as_secs_f64();
    println!("scheduler: {} nodes (2% unreachable, 2% draining, 3% degraded, 25% without static-sites), one thread", args.nodes);
    println!("{} placements ({placed} placed, {nowhere} nowhere) in {:.2} s of scheduling: {rate:.0} placements/s", args.placements, elapsed.as_secs_f64());
    println!("per placement: p50 {}  p99 {}  max {}", ms(summary.p50), ms(summary.p99), ms(summary.max));
    // Issue 5: above 10,000 placements/s against 10,000 nodes, on one core.
    Ok(vec![Target::new(format!("placements per second against {} nodes", args.nodes), Cmp::Above, 10_000.0, "/s", Some(rate))])
}
