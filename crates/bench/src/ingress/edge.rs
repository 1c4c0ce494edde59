//! The node under test: the benchmark cluster with its agent joined with
//! `--ingress` (Caddy on free loopback ports), the probe app deployed on it,
//! and what the measurements ask of them: the route table, when the agent
//! applied a version, Caddy's process.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use reqwest::Method;
use serde_json::{json, Value};

use super::client::{self, Protocol};
use crate::deploy::cluster::{Binaries, Cluster, ExtraFlags};
use crate::deploy::timeline;
use crate::server::free_port;
use crate::timestamp::{parse_rfc3339, Nanos};

/// The control plane's `--base-domain`: every app answers on `<app>.test`,
/// a name Caddy's internal CA certifies.
pub const BASE_DOMAIN: &str = "test";
/// The probe's body in its first (blue) and second (green) deployment.
pub const BLUE: &str = "blue\n";
pub const GREEN: &str = "green\n";
/// How long a deployment may take to run, and the node to settle after it.
pub const SETTLE_TIMEOUT: Duration = Duration::from_secs(120);
pub const QUIET_TIMEOUT: Duration = Duration::from_secs(60);
/// How long the ingress may take to apply a table once it exists.
pub const APPLY_TIMEOUT: Duration = Duration::from_secs(300);

/// The probe's Dockerfile: busybox httpd as in the ingress end-to-end test,
/// but under a shell that exits on SIGTERM. httpd as PID 1 ignores SIGTERM,
/// so every stop of a replaced instance would wait out the agent's 10 s
/// grace period, and with commands handled one at a time that would make a
/// hundred switches take half an hour. Stopping at once is also the harder
/// case for the ingress: the old upstream is really gone right after the
/// drain period.
const DOCKERFILE: &str = "FROM {base}\nCOPY index.html /www/index.html\n\
CMD [\"sh\", \"-c\", \"trap 'exit 0' TERM; httpd -f -p 8080 -h /www & wait\"]\n";
/// The probe with a volume at /data (`--volume`): every container appends
/// its name to a file there at start, so both generations of a blue/green
/// switch write to the same files.
const VOLUME_DOCKERFILE: &str = "FROM {base}\nCOPY index.html /www/index.html\n\
CMD [\"sh\", \"-c\", \"trap 'exit 0' TERM; hostname >> /data/boots; httpd -f -p 8080 -h /www & wait\"]\n";
/// The probe's page served by cloudweb-static, which keeps connections
/// alive (busybox httpd closes every one), for part 3's keep-alive upstream.
/// It exits on SIGTERM itself.
const KEEP_ALIVE_DOCKERFILE: &str = "FROM {image}\nCOPY index.html /www/index.html\n\
CMD [\"--root\", \"/www\", \"--listen\", \"0.0.0.0:8080\"]\n";
const HEALTH_TIMEOUT_SECONDS: u32 = 30;

pub struct Edge {
    pub cluster: Cluster,
    pub https_port: u16,
    pub http_port: u16,
    /// The probe app's default host.
    pub probe_host: String,
    /// Caddy's internal root certificate (PEM), once it exists.
    root_pem: Vec<u8>,
    /// The busybox Dockerfile of the blue deployment, which every later
    /// commit of the probe names again.
    pub dockerfile: String,
}

/// One "route table applied" line of the agent's log.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Applied {
    pub at: Nanos,
    pub version: u64,
    pub routes: usize,
    /// Caddy's configuration was replaced (false: only the upstream
    /// directory changed).
    pub reloaded: bool,
}

impl Edge {
    /// Starts the control plane (base domain `test`, with the registry) and
    /// an ingress agent running `caddy_bin`; returns once Caddy serves the
    /// first table.
    pub async fn start(dir: &Path, binaries: &Binaries, caddy_bin: &Path, probe: &str) -> Result<Edge> {
        let (http_port, https_port) = (free_port()?, free_port()?);
        let caddy = caddy_bin.display().to_string();
        let (http, https) = (http_port.to_string(), https_port.to_string());
        let run_flags = ["--caddy-bin", caddy.as_str(), "--http-port", http.as_str(), "--https-port", https.as_str()];
        let extra = ExtraFlags { server: &["--base-domain", BASE_DOMAIN, "--heartbeat-flush-seconds", "1"], join: &["--ingress"], run: &run_flags };
        let cluster = Cluster::start_with(dir, binaries, probe, &extra).await?;
        let mut edge = Edge { cluster, https_port, http_port, probe_host: format!("{probe}.{BASE_DOMAIN}"), root_pem: Vec::new(), dockerfile: String::new() };
        let (version, _) = edge.table().await?;
        edge.wait_applied(version, APPLY_TIMEOUT).await.context("the ingress did not apply the first route table")?;
        Ok(edge)
    }

    pub fn probe(&self) -> &str {
        &self.cluster.app
    }

    /// Creates the probe app and deploys its blue version; returns the
    /// deployment's view once it runs and Caddy serves it.
    pub async fn deploy_probe(&mut self, base_image: &str, volume: Option<&str>) -> Result<Value> {
        self.dockerfile = if volume.is_some() { VOLUME_DOCKERFILE } else { DOCKERFILE }.replace("{base}", base_image);
        let commit = self.cluster.git().commit("probe", &[("Dockerfile", &self.dockerfile), ("index.html", BLUE)], "blue")?;
        self.cluster.create_app("probe", HEALTH_TIMEOUT_SECONDS).await?;
        if let Some(volume) = volume {
            let path = format!("/api/apps/{}/volumes", self.probe());
            let (status, answer) = self.cluster.server.call(Method::POST, &path, Some(&json!({"name": volume, "path": "/data"}))).await?;
            if status != 201 {
                bail!("POST {path} answered {status}: {answer}");
            }
        }
        let deployment = self.deploy(&commit).await?;
        let root = self.cluster.agent_dir().join("caddy/data/caddy/pki/authorities/local/root.crt");
        self.root_pem = wait_for_file(&root, Duration::from_secs(30)).await?;
        let client = self.client(Protocol::Http1, Duration::from_secs(5))?;
        let url = self.https_url(&self.probe_host, "/");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let answer = match client.get(&url).send().await {
                Ok(response) => {
                    let status = response.status();
                    let page = response.text().await.unwrap_or_default();
                    if status == 200 && page == BLUE {
                        return Ok(deployment);
                    }
                    format!("{status}: {page:?}")
                }
                Err(err) => client::error_kind(&err),
            };
            if tokio::time::Instant::now() > deadline {
                bail!("{url} did not answer the probe's page within 30 s (last: {answer}); agent log:\n{}", self.cluster.agent_log_tail(20));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Deploys the blue page served by cloudweb-static from `image` (see
    /// [`KEEP_ALIVE_DOCKERFILE`]); returns the deployment's view once it
    /// runs alone and the ingress applied the table.
    pub async fn deploy_keep_alive(&mut self, image: &str) -> Result<Value> {
        let dockerfile = KEEP_ALIVE_DOCKERFILE.replace("{image}", image);
        let commit = self.cluster.git().commit("probe", &[("Dockerfile", &dockerfile), ("index.html", BLUE)], "blue, keep-alive")?;
        self.deploy(&commit).await
    }

    /// Deploys `commit` of the probe and waits until it runs, the node is
    /// quiet (the replaced instance gone) and the ingress applied the table.
    pub async fn deploy(&mut self, commit: &str) -> Result<Value> {
        let path = format!("/api/apps/{}/deploy", self.probe());
        let (status, answer) = self.cluster.server.call(Method::POST, &path, Some(&json!({ "commit": commit }))).await?;
        if status != 201 {
            bail!("POST {path} answered {status}: {answer}");
        }
        let id = answer["id"].as_str().context("the deploy answer has no id")?.to_string();
        self.settle(&id).await
    }

    /// Waits until deployment `id` runs, the node runs nothing else and the
    /// ingress applied the table in force.
    pub async fn settle(&mut self, id: &str) -> Result<Value> {
        let settled = timeline::settle(&mut self.cluster, id, SETTLE_TIMEOUT).await?;
        self.cluster.wait_quiet(id, QUIET_TIMEOUT).await?;
        let (version, _) = self.table().await?;
        self.wait_applied(version, APPLY_TIMEOUT).await?;
        Ok(settled.view)
    }

    /// The route table's version and number of routes.
    pub async fn table(&self) -> Result<(u64, usize)> {
        let (status, routes) = self.cluster.server.call(Method::GET, "/api/routes", None).await?;
        if status != 200 {
            bail!("GET /api/routes answered {status}");
        }
        let version = routes["version"].as_u64().context("the route table has no version")?;
        Ok((version, routes["routes"].as_array().map_or(0, Vec::len)))
    }

    /// Every "route table applied" line the agent logged so far.
    pub fn applied(&self) -> Vec<Applied> {
        applied_lines(&std::fs::read_to_string(&self.cluster.agent_log).unwrap_or_default())
    }

    /// Waits until the agent logged that Caddy loaded table `version` or a
    /// newer one (it skips versions whose content it already serves, and
    /// coalesces versions that arrive during a load); returns that line.
    /// When the table's content did not change, no line comes: the ingress
    /// status in the heartbeat says the version is served then.
    pub async fn wait_applied(&mut self, version: u64, timeout: Duration) -> Result<Option<Applied>> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Some(line) = self.applied().into_iter().find(|line| line.version >= version) {
                return Ok(Some(line));
            }
            let (status, routes) = self.cluster.server.call(Method::GET, "/api/routes", None).await?;
            if status == 200 && routes["ingress"][0]["status"]["routes_version"].as_u64().is_some_and(|served| served >= version) {
                return Ok(self.applied().into_iter().find(|line| line.version >= version));
            }
            self.cluster.check_processes()?;
            if tokio::time::Instant::now() > deadline {
                bail!("the ingress did not apply route table {version} within {} s; agent log:\n{}", timeout.as_secs(), self.cluster.agent_log_tail(10));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// A client that trusts Caddy's internal root and sends every host to
    /// 127.0.0.1.
    pub fn client(&self, protocol: Protocol, timeout: Duration) -> Result<reqwest::Client> {
        client::https(&self.root_pem, protocol, timeout)
    }

    pub fn https_url(&self, host: &str, path: &str) -> String {
        format!("https://{host}:{}{path}", self.https_port)
    }

    /// Caddy's process id: the agent's child named `caddy` (it changes
    /// when the agent restarts Caddy).
    pub fn caddy_pid(&self) -> Option<u32> {
        let agent = self.cluster.agent_pid()?;
        std::fs::read_dir("/proc").ok()?.filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok()).find(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let Some(close) = stat.rfind(')') else { return false };
            let comm = stat.get(stat.find('(').map_or(0, |open| open + 1)..close).unwrap_or_default();
            let parent = stat.get(close + 2..).and_then(|rest| rest.split_whitespace().nth(1)).and_then(|p| p.parse::<u32>().ok());
            comm == "caddy" && parent == Some(agent)
        })
    }
}

/// The "route table applied version=V routes=N" lines of an agent log.
pub fn applied_lines(log: &str) -> Vec<Applied> {
    log.lines()
        .filter(|line| line.contains("route table applied"))
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            let at = parse_rfc3339(words.next()?)?;
            let field = |name: &str| line.split_whitespace().find_map(|word| word.strip_prefix(name)).map(|v| v.trim_matches(|c: char| !c.is_ascii_digit()));
            let reloaded = !line.contains("reloaded=false");
            Some(Applied { at, version: field("version=")?.parse().ok()?, routes: field("routes=")?.parse().ok()?, reloaded })
        })
        .collect()
}

async fn wait_for_file(path: &PathBuf, timeout: Duration) -> Result<Vec<u8>> {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Ok(bytes) = std::fs::read(path) {
            if !bytes.is_empty() {
                return Ok(bytes);
            }
        }
        if tokio::time::Instant::now() > deadline {
            bail!("{} did not appear within {} s", path.display(), timeout.as_secs());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_agents_applied_lines() {
        let log = "2026-11-29T10:00:00.000001Z  INFO cloudweb_agent::ingress: caddy started admin=/x/admin.sock\n\
                   2026-11-29T10:00:01.250000Z  INFO cloudweb_agent::ingress: route table applied version=1796000000123 routes=3\n\
                   2026-11-29T10:00:02.5Z  INFO cloudweb_agent::ingress: route table applied version=1796000000200 routes=10001 reloaded=false\n\
                   garbage route table applied version=x\n";
        assert_eq!(
            applied_lines(log),
            vec![
                Applied { at: parse_rfc3339("2026-11-29T10:00:01.25Z").unwrap(), version: 1_796_000_000_123, routes: 3, reloaded: true },
                Applied { at: parse_rfc3339("2026-11-29T10:00:02.5Z").unwrap(), version: 1_796_000_000_200, routes: 10_001, reloaded: false },
            ]
        );
    }
}
