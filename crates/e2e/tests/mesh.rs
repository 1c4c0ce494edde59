//! The WireGuard mesh between real agents, each in its own network
//! namespace (the control plane in a fourth), joined by a bridge: userspace
//! WireGuard (wireguard-go), addresses from 192.0.2.0/24 inside the
//! namespaces and 10.77.0.0/16 on the mesh. Needs root, `ip`, `ping`,
//! `curl`, `wg` and `wireguard-go` (scripts/deps.sh installs them).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use cloudweb_e2e::netns::{unique_prefix, Lan};
use cloudweb_e2e::{bin, wait_for, Process};
use serde_json::Value;

const AGENT_PORT: u16 = 8443;
const API_PORT: u16 = 8080;

/// One agent in namespace `lan.members[ns]`, on bridge port `index`.
struct MeshAgent {
    index: usize,
    ns: usize,
    name: String,
    dir: PathBuf,
    node_id: String,
    interface: String,
    process: Option<Process>,
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
struct MeshCluster {
    agents: Vec<MeshAgent>,
    server: Process,
    lan: Lan,
    admin_token: String,
    tmp: tempfile::TempDir,
}

impl MeshCluster {
    /// `nodes` agents (on bridge ports 1 to `nodes`); those listed in
    /// `natted` sit behind a masquerading router and join without an
    /// endpoint.
    async fn start(nodes: usize, natted: &[usize]) -> Result<MeshCluster> {
        let prefix = unique_prefix();
        let mut lan = Lan::new(&prefix, nodes + 1)?;
        let mut ns_of: Vec<usize> = (0..=nodes).collect();
        for &i in natted {
            ns_of[i] = lan.put_behind_nat(i)?;
        }
        let tmp = tempfile::tempdir()?;
        let data = tmp.path().join("server");
        let server_address = Lan::address(0);
        let args: Vec<String> = [
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
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let server_bin = bin("cloudweb-server").display().to_string();
        let server = Process::spawn("ip".as_ref(), &lan.members[0].wrap(&server_bin, &args), tmp.path().join("server.log"))?;
        let mut cluster = MeshCluster { agents: Vec::new(), server, lan, admin_token: String::new(), tmp };
        wait_for(Duration::from_secs(20), "the control plane", || async {
            cluster.lan.members[0].exec("curl", &["-sf", &format!("http://127.0.0.1:{API_PORT}/healthz")]).ok()
        })
        .await
        .with_context(|| cluster.server.log_text())?;
        cluster.admin_token = std::fs::read_to_string(data.join("admin-token"))?.trim().to_string();
        for (index, &ns) in ns_of.iter().enumerate().skip(1) {
            let (status, body) = cluster.api("POST", "/api/join-tokens").await?;
            assert_eq!(status, 201, "{body}");
            let name = format!("node-{index}");
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
            if !natted.contains(&index) {
                agent_args.extend(["--endpoint".to_string(), format!("{}:51820", Lan::address(index))]);
            }
            let argv = cluster.lan.members[ns].wrap(&bin("cloudweb-agent").display().to_string(), &agent_args);
            let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
            cloudweb_e2e::netns::ip(&argv).context("join")?;
            let info: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("node.json"))?)?;
            let mut agent = MeshAgent {
                index,
                ns,
                name,
                dir,
                node_id: info["node_id"].as_str().unwrap().to_string(),
                interface: format!("{prefix}w{index}"),
                process: None,
            };
            cluster.start_agent(&mut agent)?;
            cluster.agents.push(agent);
        }
        Ok(cluster)
    }

    fn start_agent(&self, agent: &mut MeshAgent) -> Result<()> {
        let args: Vec<String> = [
            "--data-dir",
            &agent.dir.display().to_string(),
            "run",
            "--heartbeat-interval-seconds",
            "1",
            "--publish-ip",
            "127.0.0.1",
            "--mesh-mode",
            "userspace",
            "--mesh-interface",
            &agent.interface,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let log = self.tmp.path().join(format!("{}-{}.log", agent.name, std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_nanos()));
        let argv = self.lan.members[agent.ns].wrap(&bin("cloudweb-agent").display().to_string(), &args);
        agent.process = Some(Process::spawn("ip".as_ref(), &argv, log)?);
        Ok(())
    }

    /// A user API call from inside the control plane's namespace.
    async fn api(&self, method: &str, path: &str) -> Result<(u16, Value)> {
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

    fn mesh_address(&self, agent: &MeshAgent) -> String {
        let info: Value = serde_json::from_str(&std::fs::read_to_string(agent.dir.join("node.json")).unwrap()).unwrap();
        info["mesh_address"].as_str().unwrap().to_string()
    }

    /// `cloudweb-agent mesh status --json` in the agent's namespace.
    fn status(&self, agent: &MeshAgent) -> Result<Value> {
        let out = self.lan.members[agent.ns].exec(
            &bin("cloudweb-agent").display().to_string(),
            &["--data-dir", &agent.dir.display().to_string(), "mesh", "status", "--json"],
        )?;
        Ok(serde_json::from_str(&out)?)
    }

    /// Public keys (base64) on the agent's interface, as `wg` sees them.
    fn device_peers(&self, agent: &MeshAgent) -> Result<Vec<String>> {
        let out = self.lan.members[agent.ns].exec("wg", &["show", &agent.interface, "peers"])?;
        Ok(out.split_whitespace().map(str::to_string).collect())
    }

    /// `connected` of the peer named `name` in `agent`'s status.
    fn connected(&self, agent: &MeshAgent, name: &str) -> Option<bool> {
        let status = self.status(agent).ok()?;
        status["peers"].as_array()?.iter().find(|p| p["name"] == name).map(|p| p["connected"] == true)
    }

    fn logs(&self) -> String {
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
    /// the mesh runs on userspace WireGuard.
    async fn health_mesh(&self, agent: &MeshAgent) -> Option<Value> {
        let (status, node) = self.api("GET", &format!("/api/nodes/{}", agent.node_id)).await.ok()?;
        let userspace = node["features"].as_array()?.iter().any(|f| f == "mesh-userspace");
        (status == 200 && userspace).then(|| node["health_report"]["mesh"].clone())
    }
}

fn public_key(agent: &MeshAgent) -> String {
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

async fn all_pairs_ping(cluster: &MeshCluster, agents: &[usize]) -> Result<()> {
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

/// Three nodes: every pair talks over 10.77.x.y, `mesh status` and
/// `health.mesh` agree; a restarted agent keeps its key and address (and
/// its wireguard-go dies with it); a cut link shows disconnected within
/// the 3-minute threshold and reconnects when restored; a removed node
/// disappears from the other interfaces and its key opens nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_form_a_mesh_and_follow_cuts_restarts_and_removal() {
    let mut cluster = MeshCluster::start(3, &[]).await.unwrap();
    let result = scenario(&mut cluster).await;
    if let Err(err) = result {
        panic!("{err:#}\n{}", cluster.logs());
    }
}

async fn scenario(cluster: &mut MeshCluster) -> Result<()> {
    // Keys: the public key each node registered is the one of its key file.
    let (status, nodes) = cluster.api("GET", "/api/nodes").await?;
    assert_eq!(status, 200, "{nodes}");
    for agent in &cluster.agents {
        let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(agent.dir.join("wireguard.key"))?.permissions());
        assert_eq!(mode & 0o777, 0o600);
    }

    // Every interface holds the two other nodes, and every pair pings.
    for agent in &cluster.agents {
        wait_for(Duration::from_secs(30), &format!("{}'s interface to list two peers", agent.name), || async {
            (cluster.device_peers(agent).ok()?.len() == 2).then_some(())
        })
        .await?;
        let others: Vec<String> = cluster.agents.iter().filter(|o| o.index != agent.index).map(public_key).collect();
        let mut have = cluster.device_peers(agent)?;
        have.sort();
        let mut want = others.clone();
        want.sort();
        assert_eq!(have, want, "{}'s peers", agent.name);
    }
    all_pairs_ping(cluster, &[0, 1, 2]).await?;
    for agent in &cluster.agents {
        let status = cluster.status(agent)?;
        assert_eq!(status["total"], 2, "{status}");
        assert_eq!(status["connected"], 2, "{status}");
        for peer in status["peers"].as_array().unwrap() {
            assert!(peer["rx_bytes"].as_u64().unwrap() > 0 && peer["tx_bytes"].as_u64().unwrap() > 0, "{peer}");
            assert!(peer["handshake_age_seconds"].as_u64().unwrap() < 60, "{peer}");
            assert!(peer["endpoint"].as_str().unwrap().starts_with("192.0.2."), "{peer}");
        }
        wait_for(Duration::from_secs(20), &format!("{}'s health.mesh 2/2", agent.name), || async {
            let mesh = cluster.health_mesh(agent).await?;
            (mesh["peers"] == 2 && mesh["connected"] == 2).then_some(())
        })
        .await?;
    }
    // The human table: a summary, a header and one line per peer.
    let table = cluster.lan.members[cluster.agents[0].ns].exec(
        &bin("cloudweb-agent").display().to_string(),
        &["--data-dir", &cluster.agents[0].dir.display().to_string(), "mesh", "status"],
    )?;
    assert_eq!(table.lines().count(), 4, "{table}");
    assert!(table.lines().next().unwrap().contains("mesh 2/2 connected"), "{table}");
    assert!(table.contains("node-2") && table.contains("node-3"), "{table}");

    // Restart: SIGKILL to the agent alone; its wireguard-go follows it
    // (PR_SET_PDEATHSIG) and the interface goes. The next agent brings it
    // back with the same key and address.
    let key_before = std::fs::read_to_string(cluster.agents[0].dir.join("wireguard.key"))?;
    let address_before = cluster.mesh_address(&cluster.agents[0]);
    let pid = cluster.agents[0].process.as_ref().unwrap().pid();
    std::process::Command::new("kill").args(["-KILL", &pid.to_string()]).status()?;
    let ns = &cluster.lan.members[cluster.agents[0].ns];
    let interface = cluster.agents[0].interface.clone();
    wait_for(Duration::from_secs(10), "wireguard-go to exit with its agent", || async {
        ns.ip(&["link", "show", "dev", &interface]).is_err().then_some(())
    })
    .await?;
    let mut agent = cluster.agents.remove(0);
    agent.process = None;
    cluster.start_agent(&mut agent)?;
    cluster.agents.insert(0, agent);
    assert_eq!(std::fs::read_to_string(cluster.agents[0].dir.join("wireguard.key"))?, key_before);
    assert_eq!(cluster.mesh_address(&cluster.agents[0]), address_before);
    all_pairs_ping(cluster, &[0, 1, 2]).await?;

    // Cut node-3's link: the others see it disconnected once its latest
    // handshake is older than 3 minutes, while they stay connected to each
    // other (keepalives renew their sessions); health follows.
    cluster.lan.cut(3)?;
    let (one, two) = (&cluster.agents[0], &cluster.agents[1]);
    wait_for(Duration::from_secs(240), "node-3 to show disconnected on node-1 and node-2", || async {
        (cluster.connected(one, "node-3") == Some(false) && cluster.connected(two, "node-3") == Some(false)).then_some(())
    })
    .await?;
    assert_eq!(cluster.connected(one, "node-2"), Some(true), "{}", cluster.status(one)?);
    assert_eq!(cluster.connected(two, "node-1"), Some(true), "{}", cluster.status(two)?);
    wait_for(Duration::from_secs(20), "node-1's health.mesh 1/2", || async {
        let mesh = cluster.health_mesh(one).await?;
        (mesh["peers"] == 2 && mesh["connected"] == 1).then_some(())
    })
    .await?;
    cluster.lan.restore(3)?;
    wait_for(Duration::from_secs(60), "node-3 to reconnect", || async {
        (cluster.connected(one, "node-3") == Some(true) && cluster.connected(two, "node-3") == Some(true)).then_some(())
    })
    .await?;
    all_pairs_ping(cluster, &[0, 1, 2]).await?;

    // Remove node-3: within one event round trip it is gone from both other
    // interfaces, and its key no longer opens a tunnel to them.
    let removed_key = public_key(&cluster.agents[2]);
    let (status, body) = cluster.api("DELETE", &format!("/api/nodes/{}", cluster.agents[2].node_id)).await?;
    if status != 200 && status != 204 {
        bail!("removing node-3 answered {status}: {body}");
    }
    for agent in &cluster.agents[..2] {
        wait_for(Duration::from_secs(5), &format!("node-3 to leave {}'s interface", agent.name), || async {
            let peers = cluster.device_peers(agent).ok()?;
            (peers.len() == 1 && !peers.contains(&removed_key)).then_some(())
        })
        .await?;
    }
    let three = &cluster.agents[2];
    for other in &cluster.agents[..2] {
        let target = cluster.mesh_address(other);
        assert!(!cluster.lan.members[three.ns].ping(&target, 2), "node-3 still reaches {target}");
    }
    all_pairs_ping(cluster, &[0, 1]).await?;
    Ok(())
}

/// A node behind a masquerading router, which joined without an endpoint
/// and has no inbound path, still reaches the others and is reached by
/// them: its keepalives open the way and the others learn its address
/// (the router's) from its packets.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_behind_nat_reaches_and_is_reached_by_the_others() {
    let cluster = MeshCluster::start(3, &[3]).await.unwrap();
    if let Err(err) = nat_scenario(&cluster).await {
        panic!("{err:#}\n{}", cluster.logs());
    }
}

async fn nat_scenario(cluster: &MeshCluster) -> Result<()> {
    let hidden = &cluster.agents[2];
    // No inbound path: the bridge side cannot even route to it.
    assert!(!cluster.lan.members[cluster.agents[0].ns].ping("198.51.100.2", 1));
    for agent in &cluster.agents {
        wait_for(Duration::from_secs(30), &format!("{}'s interface to list two peers", agent.name), || async {
            (cluster.device_peers(agent).ok()?.len() == 2).then_some(())
        })
        .await?;
    }
    all_pairs_ping(cluster, &[0, 1, 2]).await?;
    for agent in &cluster.agents[..2] {
        let status = cluster.status(agent)?;
        let peer = status["peers"].as_array().unwrap().iter().find(|p| p["name"] == hidden.name.as_str()).cloned().unwrap();
        // The address the router gave its packets.
        let router = format!("{}:", Lan::address(hidden.index));
        assert!(peer["endpoint"].as_str().unwrap_or_default().starts_with(&router), "{peer}");
        assert_eq!(peer["connected"], true, "{peer}");
    }
    wait_for(Duration::from_secs(20), "the hidden node's health.mesh 2/2", || async {
        let mesh = cluster.health_mesh(hidden).await?;
        (mesh["peers"] == 2 && mesh["connected"] == 2).then_some(())
    })
    .await?;
    Ok(())
}
