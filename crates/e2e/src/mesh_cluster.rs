//! The mesh tests' cluster (`tests/e2e/mesh.rs`): real agents, each in its own
//! network namespace (the control plane in another), joined by a bridge,
//! some behind a masquerading router, with Docker Engines and a registry
//! on the mesh where a test asks for them.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use serde_json::Value;

use crate::netns::{unique_prefix, Lan, NsDocker};
use crate::{bin, caddy_bin, free_port, wait_for, Process};

pub const AGENT_PORT: u16 = 8443;
pub const API_PORT: u16 = 8080;

/// One agent in namespace `lan.members[ns]`, on bridge port `index`.
pub struct MeshAgent {
    pub index: usize,
    pub ns: usize,
    pub name: String,
    pub dir: PathBuf,
    pub node_id: String,
    pub interface: String,
    pub process: Option<Process>,
    /// Runs with `--mesh-endpoint-interface eth0`.
    pub follow_eth0: bool,
    /// Joined with `--ingress`.
    pub ingress: bool,
}

/// The harness kills agents with SIGKILL to their whole process group, so
/// wireguard-go gets no chance to remove its socket file: remove it here.
impl Drop for MeshAgent {
    fn drop(&mut self) {
        if let Some(mut process) = self.process.take() {
            process.kill();
        }
        let _ = std::fs::remove_file(format!("/var/run/wireguard/{}.sock", self.interface));
    }
}

/// Field order is drop order: processes go before their namespaces.
pub struct MeshCluster {
    pub agents: Vec<MeshAgent>,
    /// Docker Engines by bridge port; they go after the agents.
    pub dockers: Vec<(usize, NsDocker)>,
    pub server: Process,
    pub lan: Lan,
    pub admin_token: String,
    /// Where the registry listens on 10.77.0.1 (a port of this run's own:
    /// every Engine reads its CA from /etc/docker/certs.d/10.77.0.1:<port>).
    pub registry_port: u16,
    /// The backend `auto` should pick here: "kernel" or "userspace".
    pub backend: &'static str,
    pub tmp: tempfile::TempDir,
}

/// Whether this kernel can make a `wireguard` link, tried in a namespace of
/// the run's own (nothing outside it is touched).
pub fn kernel_wireguard(lan: &Lan) -> &'static str {
    let ns = &lan.members[0];
    match ns.ip(&["link", "add", "dev", "cwprobe", "type", "wireguard"]) {
        Ok(_) => {
            let _ = ns.ip(&["link", "delete", "dev", "cwprobe"]);
            "kernel"
        }
        Err(_) => "userspace",
    }
}

impl Drop for MeshCluster {
    fn drop(&mut self) {
        if !self.dockers.is_empty() {
            let _ = std::fs::remove_dir_all(format!("/etc/docker/certs.d/10.77.0.1:{}", self.registry_port));
        }
    }
}

/// What a test's cluster has besides its nodes.
#[derive(Default)]
pub struct Setup {
    /// Bridge ports (1 to `nodes`) that sit behind a masquerading router
    /// and join without an endpoint.
    pub natted: Vec<usize>,
    /// The control plane's host runs an agent too, joined first (so it is
    /// 10.77.0.1), as `agents[0]` named `control`.
    pub control_plane_node: bool,
    /// The control plane runs the image registry on 10.77.0.1:5000.
    pub registry: bool,
    /// Bridge ports whose agent reports its endpoint from its `eth0`
    /// address (`--mesh-endpoint-interface eth0`).
    pub follow_eth0: Vec<usize>,
    /// Bridge ports that get a Docker Engine of their own (the others'
    /// agents point at a socket that does not exist).
    pub docker: Vec<usize>,
    /// Bridge ports whose node joins with `--ingress` (Caddy on 80/443 in
    /// its namespace).
    pub ingress: Vec<usize>,
    /// The control plane's namespace forwards nothing and drops what it
    /// would forward (`ip_forward=0`, FORWARD policy DROP, as on a host
    /// where Docker set it), before any agent starts.
    pub control_drops_forwarding: bool,
    /// More arguments for `cloudweb-server run`.
    pub server_args: Vec<String>,
}

impl MeshCluster {
    /// `nodes` agents (on bridge ports 1 to `nodes`); those listed in
    /// `natted` sit behind a masquerading router and join without an
    /// endpoint.
    pub async fn start(nodes: usize, natted: &[usize]) -> Result<MeshCluster> {
        MeshCluster::start_with(nodes, Setup { natted: natted.to_vec(), ..Setup::default() }).await
    }

    pub async fn start_with(nodes: usize, setup: Setup) -> Result<MeshCluster> {
        let natted = setup.natted.as_slice();
        let prefix = unique_prefix();
        let mut lan = Lan::new(&prefix, nodes + 1)?;
        let mut ns_of: Vec<usize> = (0..=nodes).collect();
        for &i in natted {
            ns_of[i] = lan.put_behind_nat(i)?;
        }
        if setup.control_drops_forwarding {
            let control = &lan.members[0];
            control.exec("sysctl", &["-q", "-w", "net.ipv4.ip_forward=0", "net.ipv4.conf.default.forwarding=0"])?;
            control.exec("iptables", &["-P", "FORWARD", "DROP"])?;
        }
        let tmp = tempfile::tempdir()?;
        let data = tmp.path().join("server");
        let server_address = Lan::address(0);
        let registry_port = free_port();
        let mut dockers = Vec::new();
        for &i in &setup.docker {
            dockers.push((i, NsDocker::start(&lan.members[ns_of[i]], &tmp.path().join(format!("docker-{i}")))?));
        }
        let mut args: Vec<String> = [
            "serve",
            "--data-dir",
            &data.display().to_string(),
            "--agent-listen",
            &format!("{server_address}:{AGENT_PORT}"),
            "--api-listen",
            &format!("127.0.0.1:{API_PORT}"),
            "--public-url",
            &format!("https://{server_address}:{AGENT_PORT}"),
            "--unreachable-after-seconds",
            "5",
            "--allow-file-repos",
            "--base-domain",
            "test",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        if setup.registry {
            // On the control plane node's mesh address, which does not
            // exist yet: the registry starts once that node's agent is up.
            args.extend(["--registry-bin".into(), "/usr/bin/docker-registry".into(), "--registry-listen".into(), format!("10.77.0.1:{registry_port}")]);
        }
        args.extend(setup.server_args.iter().cloned());
        let server_bin = bin("cloudweb-server").display().to_string();
        let server = Process::spawn("ip".as_ref(), &lan.members[0].wrap(&server_bin, &args), tmp.path().join("server.log"))?;
        let backend = kernel_wireguard(&lan);
        let mut cluster = MeshCluster { agents: Vec::new(), dockers, server, lan, admin_token: String::new(), registry_port, backend, tmp };
        wait_for(Duration::from_secs(20), "the control plane", || async {
            cluster.lan.members[0].exec("curl", &["-sf", &format!("http://127.0.0.1:{API_PORT}/healthz")]).ok()
        })
        .await
        .with_context(|| cluster.server.log_text())?;
        cluster.admin_token = std::fs::read_to_string(data.join("admin-token"))?.trim().to_string();
        let first = if setup.control_plane_node { 0 } else { 1 };
        for (index, &ns) in ns_of.iter().enumerate().skip(first) {
            let (status, body) = cluster.api("POST", "/api/join-tokens").await?;
            assert_eq!(status, 201, "{body}");
            let name = if index == 0 { "control".to_string() } else { format!("node-{index}") };
            let dir = cluster.tmp.path().join(&name);
            let mut agent_args: Vec<String> = [
                "--data-dir",
                &dir.display().to_string(),
                "join",
                "--server",
                &format!("https://{server_address}:{AGENT_PORT}"),
                "--token",
                body["token"].as_str().unwrap(),
                "--ca-sha256",
                body["ca_sha256"].as_str().unwrap(),
                "--name",
                &name,
            ]
            .iter()
            .map(|s| s.to_string())
            .collect();
            if setup.ingress.contains(&index) {
                agent_args.push("--ingress".to_string());
            }
            if !natted.contains(&index) {
                agent_args.extend(["--endpoint".to_string(), format!("{}:51820", Lan::address(index))]);
            }
            let argv = cluster.lan.members[ns].wrap(&bin("cloudweb-agent").display().to_string(), &agent_args);
            let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
            crate::netns::ip(&argv).context("join")?;
            let info: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("node.json"))?)?;
            let mut agent = MeshAgent {
                index,
                ns,
                name,
                dir,
                node_id: info["node_id"].as_str().unwrap().to_string(),
                interface: format!("{prefix}w{index}"),
                process: None,
                follow_eth0: setup.follow_eth0.contains(&index),
                ingress: setup.ingress.contains(&index),
            };
            cluster.start_agent(&mut agent)?;
            cluster.agents.push(agent);
        }
        Ok(cluster)
    }

    pub fn start_agent(&self, agent: &mut MeshAgent) -> Result<()> {
        let mut args: Vec<String> = [
            "--data-dir",
            &agent.dir.display().to_string(),
            "run",
            "--heartbeat-interval-seconds",
            "1",
            "--mesh-mode",
            "auto",
            "--mesh-interface",
            &agent.interface,
            "--health-interval-seconds",
            "1",
            "--allow-file-repos",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        match self.dockers.iter().find(|(i, _)| *i == agent.index) {
            // Its Engine reads the registry CA from the host's directory.
            Some((_, docker)) => args.extend(["--docker-host".into(), docker.host()]),
            None => args.extend([
                "--docker-host".into(),
                format!("unix://{}", agent.dir.join("no-docker.sock").display()),
                "--docker-certs-dir".into(),
                agent.dir.join("certs.d").display().to_string(),
            ]),
        }
        if agent.ingress {
            args.extend(["--caddy-bin".into(), caddy_bin().display().to_string()]);
        }
        if agent.follow_eth0 {
            args.extend(["--mesh-endpoint-interface".into(), "eth0".into()]);
        }
        let log = self.tmp.path().join(format!("{}-{}.log", agent.name, std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_nanos()));
        let argv = self.lan.members[agent.ns].wrap(&bin("cloudweb-agent").display().to_string(), &args);
        agent.process = Some(Process::spawn("ip".as_ref(), &argv, log)?);
        Ok(())
    }

    /// A user API call from inside the control plane's namespace.
    pub async fn api(&self, method: &str, path: &str) -> Result<(u16, Value)> {
        let out = self.lan.members[0].exec(
            "curl",
            &[
                "-s",
                "-X",
                method,
                "-H",
                &format!("authorization: Bearer {}", self.admin_token),
                "-w",
                "\n%{http_code}",
                &format!("http://127.0.0.1:{API_PORT}{path}"),
            ],
        )?;
        let (body, status) = out.trim_end().rsplit_once('\n').unwrap_or(("", out.trim()));
        Ok((status.parse()?, serde_json::from_str(body).unwrap_or(Value::Null)))
    }

    /// A user API call with a JSON body.
    pub async fn api_json(&self, method: &str, path: &str, body: &Value) -> Result<(u16, Value)> {
        let out = self.lan.members[0].exec(
            "curl",
            &[
                "-s",
                "-X",
                method,
                "-H",
                &format!("authorization: Bearer {}", self.admin_token),
                "-H",
                "content-type: application/json",
                "--data",
                &body.to_string(),
                "-w",
                "\n%{http_code}",
                &format!("http://127.0.0.1:{API_PORT}{path}"),
            ],
        )?;
        let (body, status) = out.trim_end().rsplit_once('\n').unwrap_or(("", out.trim()));
        Ok((status.parse()?, serde_json::from_str(body).unwrap_or(Value::Null)))
    }

    pub fn mesh_address(&self, agent: &MeshAgent) -> String {
        let info: Value = serde_json::from_str(&std::fs::read_to_string(agent.dir.join("node.json")).unwrap()).unwrap();
        info["mesh_address"].as_str().unwrap().to_string()
    }

    /// `cloudweb-agent mesh status --json` in the agent's namespace.
    pub fn status(&self, agent: &MeshAgent) -> Result<Value> {
        let out = self.lan.members[agent.ns].exec(
            &bin("cloudweb-agent").display().to_string(),
            &["--data-dir", &agent.dir.display().to_string(), "mesh", "status", "--json"],
        )?;
        Ok(serde_json::from_str(&out)?)
    }

    /// Public keys (base64) on the agent's interface, as `wg` sees them.
    pub fn device_peers(&self, agent: &MeshAgent) -> Result<Vec<String>> {
        let out = self.lan.members[agent.ns].exec("wg", &["show", &agent.interface, "peers"])?;
        Ok(out.split_whitespace().map(str::to_string).collect())
    }

    /// `connected` of the peer named `name` in `agent`'s status.
    pub fn connected(&self, agent: &MeshAgent, name: &str) -> Option<bool> {
        let status = self.status(agent).ok()?;
        status["peers"].as_array()?.iter().find(|p| p["name"] == name).map(|p| p["connected"] == true)
    }

    pub fn logs(&self) -> String {
        let mut text = format!("--- server\n{}", self.server.log_text());
        for agent in &self.agents {
            if let Some(process) = &agent.process {
                text.push_str(&format!("\n--- {}\n{}", agent.name, process.log_text()));
            }
            let device = self.lan.members[agent.ns].exec("wg", &["show", &agent.interface]);
            text.push_str(&format!("\n--- wg show {}\n{}", agent.interface, device.unwrap_or_else(|e| e.to_string())));
        }
        text
    }

    /// `health.mesh` of the node's current health, once its features say
    /// the mesh runs on the backend `auto` should have picked here.
    pub async fn health_mesh(&self, agent: &MeshAgent) -> Option<Value> {
        let (status, node) = self.api("GET", &format!("/api/nodes/{}", agent.node_id)).await.ok()?;
        let feature = format!("mesh-{}", self.backend);
        let backend = node["features"].as_array()?.iter().any(|f| *f == feature.as_str());
        (status == 200 && backend).then(|| node["health_report"]["mesh"].clone())
    }
}

pub fn public_key(agent: &MeshAgent) -> String {
    // The private key file, turned into the public key by `wg pubkey`.
    let private = std::fs::read_to_string(agent.dir.join("wireguard.key")).unwrap();
    let mut child = std::process::Command::new("wg")
        .arg("pubkey")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(child.stdin.as_mut().unwrap(), private.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

pub async fn all_pairs_ping(cluster: &MeshCluster, agents: &[usize]) -> Result<()> {
    for &from in agents {
        for &to in agents {
            if from == to {
                continue;
            }
            let (a, b) = (&cluster.agents[from], &cluster.agents[to]);
            let target = cluster.mesh_address(b);
            wait_for(Duration::from_secs(30), &format!("{} to ping {} at {target}", a.name, b.name), || async {
                cluster.lan.members[a.ns].ping(&target, 1).then_some(())
            })
            .await?;
        }
    }
    Ok(())
}
