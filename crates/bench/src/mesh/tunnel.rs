//! The tunnels `cloudweb-bench mesh` configures by hand next to the
//! agents' mesh, in the agents' own namespaces: wireguard-go (and kernel
//! WireGuard where the kernel has it) set up with `wg set` and `ip`, the
//! way a person would without cloud-web; and what both kinds of interface
//! look like, read back the same way for each, to say what differs.

use std::io::Write;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use cloudweb_e2e::netns::ip;

use crate::process::Guarded;

/// The keepalive the agent sets on every peer (cloudweb-agent's
/// `mesh::converge::KEEPALIVE_SECONDS`), mirrored on the hand tunnels.
pub const KEEPALIVE_SECONDS: u16 = 25;

/// `ip netns exec <ns> program args…`.
fn exec(ns: &str, program: &str, args: &[&str]) -> Result<String> {
    let mut all = vec!["netns", "exec", ns, program];
    all.extend_from_slice(args);
    ip(&all)
}

fn wg_key() -> Result<(String, String)> {
    let private = Command::new("wg").arg("genkey").output().context("running wg genkey (wireguard-tools)")?;
    let private = String::from_utf8(private.stdout)?.trim().to_string();
    let mut child = Command::new("wg").arg("pubkey").stdin(Stdio::piped()).stdout(Stdio::piped()).spawn()?;
    child.stdin.take().expect("stdin").write_all(private.as_bytes())?;
    let public = String::from_utf8(child.wait_with_output()?.stdout)?.trim().to_string();
    Ok((private, public))
}

/// Where a hand tunnel goes: the two namespaces, their LAN addresses, and
/// what the tunnel gets.
pub struct Spec<'a> {
    pub ns: [&'a str; 2],
    pub lan: [Ipv4Addr; 2],
    /// Interface names, one per side (wireguard-go's sockets share one
    /// directory across namespaces, so they differ).
    pub interfaces: [String; 2],
    pub port: u16,
    /// Tunnel addresses, `<a>/16` on each side.
    pub addresses: [Ipv4Addr; 2],
    pub mtu: u32,
    /// Side a's and side b's CPU, for wireguard-go, when pinned (by pid
    /// once it runs, like the agents' wireguard-go).
    pub cpus: Option<[usize; 2]>,
    /// Where keys and logs go.
    pub dir: &'a Path,
}

/// A tunnel configured by hand. Dropping it stops its wireguard-go pair
/// (SIGTERM: wireguard-go removes its interface and socket) and removes
/// any socket left; a kernel link goes with its namespace.
pub struct HandTunnel {
    pub interfaces: [String; 2],
    pub addresses: [Ipv4Addr; 2],
    daemons: Vec<Guarded>,
}

impl HandTunnel {
    /// Two `wireguard-go -f <interface>` (with `LOG_LEVEL=error`, as the
    /// agent starts it), configured with `wg set` and `ip`.
    pub fn userspace(spec: &Spec) -> Result<HandTunnel> {
        let mut tunnel = HandTunnel { interfaces: spec.interfaces.clone(), addresses: spec.addresses, daemons: Vec::new() };
        for side in 0..2 {
            let interface = &spec.interfaces[side];
            let _ = std::fs::remove_file(socket(interface));
            let mut command = Command::new("ip");
            command.args(["netns", "exec", spec.ns[side], "wireguard-go", "-f", interface]).env("LOG_LEVEL", "error");
            let log = spec.dir.join(format!("{interface}.log"));
            tunnel.daemons.push(Guarded::spawn(command, &log, Duration::from_secs(2))?);
        }
        for interface in &spec.interfaces {
            let socket = socket(interface);
            let deadline = Instant::now() + Duration::from_secs(10);
            while !socket.exists() {
                if Instant::now() > deadline {
                    bail!("wireguard-go did not create {}", socket.display());
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        // Pinned once started, as the agents' wireguard-go is: started
        // under `taskset -c`, Go would size its runtime (GOMAXPROCS) for
        // one CPU, the agent's child for all of them.
        if let Some(cpus) = spec.cpus {
            for (daemon, cpu) in tunnel.daemons.iter().zip(cpus) {
                pin_process(daemon.id(), cpu)?;
            }
        }
        configure(spec)?;
        Ok(tunnel)
    }

    /// Kernel WireGuard links (`ip link add … type wireguard`), configured
    /// the same way.
    pub fn kernel(spec: &Spec) -> Result<HandTunnel> {
        for side in 0..2 {
            ip(&["-n", spec.ns[side], "link", "add", "dev", &spec.interfaces[side], "type", "wireguard"])?;
        }
        configure(spec)?;
        Ok(HandTunnel { interfaces: spec.interfaces.clone(), addresses: spec.addresses, daemons: Vec::new() })
    }

    /// The wireguard-go pids (side a, side b); none for kernel links.
    pub fn pids(&self) -> Vec<u32> {
        self.daemons.iter().map(Guarded::id).collect()
    }
}

impl Drop for HandTunnel {
    fn drop(&mut self) {
        if self.daemons.is_empty() {
            return;
        }
        self.daemons.clear();
        for interface in &self.interfaces {
            let _ = std::fs::remove_file(socket(interface));
        }
    }
}

fn socket(interface: &str) -> PathBuf {
    PathBuf::from(format!("/var/run/wireguard/{interface}.sock"))
}

/// What a person would type: a key, the listen port, the peer with its
/// endpoint, /32 and the agent's keepalive; the /16 address, the MTU, up.
fn configure(spec: &Spec) -> Result<()> {
    let keys = [wg_key()?, wg_key()?];
    for side in 0..2 {
        let peer = 1 - side;
        let key_file = spec.dir.join(format!("{}.key", spec.interfaces[side]));
        std::fs::write(&key_file, &keys[side].0)?;
        let key_file = key_file.display().to_string();
        let port = spec.port.to_string();
        let endpoint = format!("{}:{}", spec.lan[peer], spec.port);
        let allowed = format!("{}/32", spec.addresses[peer]);
        let keepalive = KEEPALIVE_SECONDS.to_string();
        let interface = spec.interfaces[side].as_str();
        let own = ["set", interface, "listen-port", &port, "private-key", &key_file];
        let their = ["peer", &keys[peer].1, "endpoint", &endpoint, "allowed-ips", &allowed, "persistent-keepalive", &keepalive];
        exec(spec.ns[side], "wg", &[&own[..], &their[..]].concat())?;
        let ns = spec.ns[side];
        ip(&["-n", ns, "address", "add", &format!("{}/16", spec.addresses[side]), "dev", interface])?;
        ip(&["-n", ns, "link", "set", "dev", interface, "mtu", &spec.mtu.to_string()])?;
        ip(&["-n", ns, "link", "set", "dev", interface, "up"])?;
    }
    Ok(())
}

/// The word after `key` in `text` (`ip -o` output: without the `\` that
/// stands for a line break).
fn after<'t>(text: &'t str, key: &str) -> Option<&'t str> {
    let mut words = text.split_whitespace();
    words.find(|w| *w == key)?;
    words.next().map(|w| w.trim_end_matches('\\'))
}

/// The MTU of `interface` in namespace `ns`.
pub fn mtu(ns: &str, interface: &str) -> Result<u32> {
    let text = ip(&["-n", ns, "-o", "link", "show", "dev", interface])?;
    after(&text, "mtu").and_then(|m| m.parse().ok()).with_context(|| format!("no MTU in `ip link show` of {interface}: {text}"))
}

/// The wireguard-go the agent with pid `agent` started, if it runs one.
pub fn agent_wireguard_go(agent: u32) -> Option<u32> {
    crate::process::children_of(agent)
        .into_iter()
        .map(|(pid, _)| pid)
        .find(|pid| std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|comm| comm.trim() == "wireguard-go"))
}

/// Pins every thread of process `pid` to `cpu` (`taskset -a -p`); the
/// threads and children it starts later inherit the pinning.
pub fn pin_process(pid: u32, cpu: usize) -> Result<()> {
    let output = Command::new("taskset").args(["-a", "-p", "-c", &cpu.to_string(), &pid.to_string()]).stdin(Stdio::null()).output()?;
    if !output.status.success() {
        bail!("taskset -a -p -c {cpu} {pid}: {}", String::from_utf8_lossy(&output.stderr).trim());
    }
    Ok(())
}

/// The interface's settings and its process's, read back alike for the
/// agent's and the hand ones: (what, value), in a fixed order.
pub fn facts(ns: &str, interface: &str, daemon: Option<u32>) -> Vec<(&'static str, String)> {
    let unknown = || "?".to_string();
    let link = ip(&["-n", ns, "-o", "link", "show", "dev", interface]).unwrap_or_default();
    let word = |key| after(&link, key).map_or_else(unknown, str::to_string);
    let address = ip(&["-n", ns, "-o", "-4", "address", "show", "dev", interface]).unwrap_or_default();
    let prefix = after(&address, "inet").and_then(|a| a.split_once('/')).map_or_else(unknown, |(_, p)| format!("/{p}"));
    let mut facts = vec![("MTU", word("mtu")), ("qdisc", word("qdisc")), ("txqueuelen", word("qlen")), ("address", prefix)];
    // `wg show <if> dump`: the interface (private key, public key, listen
    // port, fwmark), then one line per peer (public key, preshared key,
    // endpoint, allowed IPs, handshake, rx, tx, keepalive).
    let dump = exec(ns, "wg", &["show", interface, "dump"]).unwrap_or_default();
    let mut lines = dump.lines().map(|l| l.split('\t').collect::<Vec<_>>());
    let own = lines.next().unwrap_or_default();
    let field = |fields: &[&str], i: usize| fields.get(i).map_or_else(unknown, |f| f.to_string());
    facts.push(("listen port", field(&own, 2)));
    facts.push(("fwmark", field(&own, 3)));
    let peers: Vec<Vec<&str>> = lines.collect();
    let each = |i: usize, f: &dyn Fn(&str) -> String| {
        let mut values: Vec<String> = peers.iter().map(|p| p.get(i).map_or_else(unknown, |v| f(v))).collect();
        values.dedup();
        values.join(", ")
    };
    facts.push(("peers", peers.len().to_string()));
    facts.push(("keepalive", each(7, &|v| v.to_string())));
    // The shape of the allowed IPs (10.77.0.2/32 -> 1 × /32), not the addresses.
    facts.push(("allowed IPs", each(3, &|v| {
        let lens: Vec<&str> = v.split(',').filter_map(|n| n.split_once('/')).map(|(_, l)| l).collect();
        format!("{} × /{}", lens.len(), lens.join(" /"))
    })));
    facts.push(("preshared key", each(1, &|v| if v == "(none)" { "none".into() } else { "set".into() })));
    if let Some(pid) = daemon {
        let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
        let level = environ.split(|b| *b == 0).find_map(|v| v.strip_prefix(b"LOG_LEVEL=")).map(|v| String::from_utf8_lossy(v).into_owned());
        facts.push(("LOG_LEVEL", level.unwrap_or_else(|| "unset".into())));
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        let cpus = status.lines().find_map(|l| l.strip_prefix("Cpus_allowed_list:")).map(|v| v.trim().to_string());
        facts.push(("wireguard-go CPUs", cpus.unwrap_or_else(unknown)));
    }
    facts
}
