//! Network namespaces for mesh tests: a "switch" namespace holding a
//! bridge, and member namespaces each joined to it by a veth pair, with
//! addresses from 192.0.2.0/24 (TEST-NET-1, documentation only). Every
//! address lives in a namespace the test created; the host's own network
//! is never touched. Namespaces are deleted on drop, also when a test
//! fails.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, Context, Result};

/// Runs `ip` with `args`; fails with its output.
pub fn ip(args: &[&str]) -> Result<String> {
    run("ip", args)
}

fn run(program: &str, args: &[&str]) -> Result<String> {
    let output = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {program}"))?;
    let text = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    if !output.status.success() {
        bail!("`{program} {}` failed: {}", args.join(" "), text.trim());
    }
    Ok(text)
}

/// One network namespace, deleted on drop.
pub struct Netns {
    pub name: String,
}

impl Netns {
    pub fn create(name: &str) -> Result<Netns> {
        ip(&["netns", "add", name])?;
        let ns = Netns { name: name.to_string() };
        ns.ip(&["link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// `ip -n <ns> args…`.
    pub fn ip(&self, args: &[&str]) -> Result<String> {
        let mut all = vec!["-n", self.name.as_str()];
        all.extend_from_slice(args);
        ip(&all)
    }

    /// `ip netns exec <ns> program args…`, run to completion.
    pub fn exec(&self, program: &str, args: &[&str]) -> Result<String> {
        let mut all = vec!["netns", "exec", self.name.as_str(), program];
        all.extend_from_slice(args);
        ip(&all)
    }

    /// The argument vector that runs `program` inside this namespace.
    pub fn wrap(&self, program: &str, args: &[String]) -> Vec<String> {
        let mut all = vec!["netns".to_string(), "exec".into(), self.name.clone(), program.to_string()];
        all.extend(args.iter().cloned());
        all
    }

    /// One ping, waiting at most `wait_seconds`.
    pub fn ping(&self, address: &str, wait_seconds: u32) -> bool {
        self.exec("ping", &["-c", "1", "-W", &wait_seconds.to_string(), address]).is_ok()
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = ip(&["netns", "delete", &self.name]);
    }
}

/// A bridge in its own namespace, and `count` member namespaces on it.
pub struct Lan {
    /// Members first, so they go before the switch on drop.
    pub members: Vec<Netns>,
    pub switch: Netns,
}

impl Lan {
    /// Member `i` is `<prefix>-<i>` with address 192.0.2.(10 + i) on its
    /// `eth0`; its port on the bridge is `p<i>` in the switch namespace.
    /// `prefix` must make the names unique on this machine.
    pub fn new(prefix: &str, count: usize) -> Result<Lan> {
        assert!(count < 200);
        let switch = Netns::create(&format!("{prefix}-sw"))?;
        switch.ip(&["link", "add", "br0", "type", "bridge"])?;
        switch.ip(&["link", "set", "br0", "up"])?;
        let mut lan = Lan { members: Vec::new(), switch };
        for i in 0..count {
            let ns = Netns::create(&format!("{prefix}-{i}"))?;
            let port = format!("p{i}");
            lan.switch.ip(&["link", "add", &port, "type", "veth", "peer", "name", "eth0", "netns", &ns.name])?;
            lan.switch.ip(&["link", "set", &port, "master", "br0"])?;
            lan.switch.ip(&["link", "set", &port, "up"])?;
            ns.ip(&["address", "add", &format!("{}/24", Lan::address(i)), "dev", "eth0"])?;
            ns.ip(&["link", "set", "eth0", "up"])?;
            lan.members.push(ns);
        }
        Ok(lan)
    }

    pub fn address(i: usize) -> Ipv4Addr {
        Ipv4Addr::new(192, 0, 2, 10 + i as u8)
    }

    /// Takes member `i`'s port on the bridge down: nothing reaches it.
    pub fn cut(&self, i: usize) -> Result<()> {
        self.switch.ip(&["link", "set", &format!("p{i}"), "down"]).map(|_| ())
    }

    pub fn restore(&self, i: usize) -> Result<()> {
        self.switch.ip(&["link", "set", &format!("p{i}"), "up"]).map(|_| ())
    }
}

impl Lan {
    /// Puts a new namespace behind member `i`, which becomes its router:
    /// the new one has 198.51.100.2/24 and a default route through
    /// 198.51.100.1, and the router masquerades what it forwards out of its
    /// `eth0`. Nothing on the bridge can open a connection to the new
    /// namespace (no port forward). Returns its index in `members`.
    pub fn put_behind_nat(&mut self, i: usize) -> Result<usize> {
        let router = &self.members[i];
        let inside = Netns::create(&format!("{}n", router.name))?;
        router.ip(&["link", "add", "lan0", "type", "veth", "peer", "name", "eth0", "netns", &inside.name])?;
        router.ip(&["address", "add", "198.51.100.1/24", "dev", "lan0"])?;
        router.ip(&["link", "set", "lan0", "up"])?;
        inside.ip(&["address", "add", "198.51.100.2/24", "dev", "eth0"])?;
        inside.ip(&["link", "set", "eth0", "up"])?;
        inside.ip(&["route", "add", "default", "via", "198.51.100.1"])?;
        router.exec("sysctl", &["-q", "-w", "net.ipv4.ip_forward=1"])?;
        router.exec("iptables", &["-t", "nat", "-A", "POSTROUTING", "-o", "eth0", "-j", "MASQUERADE"])?;
        self.members.push(inside);
        Ok(self.members.len() - 1)
    }
}

/// A prefix for namespace and interface names that no other test process
/// uses at the same time (interface names are at most 15 characters, and
/// wireguard-go's sockets share one directory across namespaces).
pub fn unique_prefix() -> String {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(0);
    format!("cw{:04x}{:02x}", std::process::id() & 0xffff, (nanos >> 12) & 0xff)
}

/// A Docker Engine of a namespace's own: `dockerd` entered into the
/// namespace's network only (`nsenter --net`; `ip netns exec` would mount
/// a fresh /sys and hide the cgroup hierarchy dockerd needs), with its
/// own data root, exec root (so its own containerd), pid file, socket and
/// `docker0` inside the namespace, and the vfs storage driver (no
/// overlay mounts to clean up). Images come from the host's engine
/// (`docker save | docker load`). On drop its containers are removed and
/// it is stopped; what is left of its process group is killed.
pub struct NsDocker {
    pub socket: PathBuf,
    process: Option<crate::Process>,
}

impl NsDocker {
    /// Starts it for namespace `ns`, keeping everything under `dir`, and
    /// waits (up to 60 s) until it answers.
    pub fn start(ns: &Netns, dir: &Path) -> Result<NsDocker> {
        std::fs::create_dir_all(dir)?;
        // An empty configuration: the host's /etc/docker/daemon.json sets
        // the data root and storage driver, which the flags set here.
        let config = dir.join("daemon.json");
        std::fs::write(&config, "{}")?;
        let socket = dir.join("docker.sock");
        let path = |p: &str| dir.join(p).display().to_string();
        let args: Vec<String> = vec![
            format!("--net=/run/netns/{}", ns.name),
            "dockerd".into(),
            "--config-file".into(),
            config.display().to_string(),
            "--data-root".into(),
            path("root"),
            "--exec-root".into(),
            path("exec"),
            "--pidfile".into(),
            path("dockerd.pid"),
            "-H".into(),
            format!("unix://{}", socket.display()),
            "--storage-driver".into(),
            "vfs".into(),
        ];
        let process = crate::Process::spawn(Path::new("nsenter"), &args, dir.join("dockerd.log"))?;
        let docker = NsDocker { socket, process: Some(process) };
        let started = std::time::Instant::now();
        while docker.docker(&["info", "--format", "{{.Driver}}"]).is_err() {
            if started.elapsed() > std::time::Duration::from_secs(60) {
                bail!("dockerd in {} did not answer within 60 s:\n{}", ns.name, docker.log_text());
            }
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
        Ok(docker)
    }

    /// `unix://…`, for `--docker-host`.
    pub fn host(&self) -> String {
        format!("unix://{}", self.socket.display())
    }

    /// The docker CLI against this engine.
    pub fn docker(&self, args: &[&str]) -> Result<String> {
        let host = self.host();
        let mut all = vec!["-H", host.as_str()];
        all.extend_from_slice(args);
        run("docker", &all)
    }

    /// Copies `image` from the host's engine.
    pub fn load_from_host(&self, image: &str) -> Result<()> {
        let save = Command::new("docker").args(["save", image]).stdout(Stdio::piped()).spawn().context("docker save")?;
        let output = Command::new("docker")
            .args(["-H", &self.host(), "load", "--quiet"])
            .stdin(save.stdout.context("docker save output")?)
            .output()
            .context("docker load")?;
        if !output.status.success() {
            bail!("loading {image}: {}", String::from_utf8_lossy(&output.stderr));
        }
        Ok(())
    }

    pub fn log_text(&self) -> String {
        self.process.as_ref().map(|p| p.log_text()).unwrap_or_default()
    }
}

impl Drop for NsDocker {
    fn drop(&mut self) {
        if let Ok(ids) = self.docker(&["ps", "-aq"]) {
            let ids: Vec<&str> = ids.split_whitespace().collect();
            if !ids.is_empty() {
                let mut args = vec!["rm", "-f"];
                args.extend(ids);
                let _ = self.docker(&args);
            }
        }
        if let Some(mut process) = self.process.take() {
            // SIGTERM: dockerd stops its containerd; then the group goes.
            process.signal("TERM");
            let started = std::time::Instant::now();
            while process.is_running() && started.elapsed() < std::time::Duration::from_secs(20) {
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            process.kill();
        }
    }
}
