//! A one-node cloud-web on loopback for the deploy and ingress benchmarks:
//! the real control plane with its image registry, one real agent joined to
//! it, a git daemon serving the app's repository, and the app itself.
//! Everything it started is stopped, and everything the run left in Docker
//! removed, when it is dropped.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{bail, Result};
use reqwest::Method;
use serde_json::json;

use crate::docker::{self, Events};
use crate::git_daemon::GitDaemon;
use crate::process::Guarded;
use crate::server::{free_port, Server};

/// Where the Docker Engine looks for a registry's CA; the agent writes the
/// cluster CA there for the registry's address.
const DOCKER_CERTS_DIR: &str = "/etc/docker/certs.d";
/// Label on the baseline containers, with the app name as value.
pub const BASELINE_LABEL: &str = "cloudweb-bench.baseline";

pub struct Binaries {
    pub server: PathBuf,
    pub agent: PathBuf,
    pub registry: PathBuf,
}

/// The flags that name a benchmark cluster's binaries.
#[derive(clap::Args)]
pub struct BinaryArgs {
    /// The control plane binary (default: next to this one).
    #[arg(long)]
    pub server_bin: Option<PathBuf>,
    /// The agent binary (default: next to this one).
    #[arg(long)]
    agent_bin: Option<PathBuf>,
    /// The Docker distribution registry binary the control plane runs.
    #[arg(long, default_value = "/usr/bin/docker-registry")]
    registry_bin: PathBuf,
}

impl BinaryArgs {
    /// The binaries, each checked to exist.
    pub fn resolve(&self) -> Result<Binaries> {
        let binaries = Binaries {
            server: crate::server::sibling_binary("cloudweb-server", self.server_bin.clone())?,
            agent: crate::server::sibling_binary("cloudweb-agent", self.agent_bin.clone())?,
            registry: self.registry_bin.clone(),
        };
        if !binaries.registry.is_file() {
            bail!("--registry-bin {} is not a file; install the Docker distribution registry (Debian: docker-registry)", binaries.registry.display());
        }
        Ok(binaries)
    }
}

/// Flags beyond the ones every benchmark cluster gets, for the control
/// plane's `serve`, the agent's `join` and the agent's `run`.
#[derive(Default)]
pub struct ExtraFlags<'a> {
    pub server: &'a [&'a str],
    pub join: &'a [&'a str],
    pub run: &'a [&'a str],
}

pub struct Cluster {
    pub dir: PathBuf,
    pub server: Server,
    agent: Option<Guarded>,
    pub agent_log: PathBuf,
    pub node_id: String,
    git: Option<GitDaemon>,
    pub events: Option<Events>,
    pub registry: String,
    /// Whether the agent's certificate directory for the registry existed
    /// before this run (if not, the run removes it again).
    registry_certs_existed: bool,
    pub app: String,
    /// Set once the app exists, so that clean-up deletes it.
    app_created: bool,
}

impl Cluster {
    /// Starts the control plane (with the registry) and the git daemon, and
    /// joins and starts an agent; returns once the node is ready.
    pub async fn start(dir: &Path, binaries: &Binaries, app: &str) -> Result<Cluster> {
        Cluster::start_with(dir, binaries, app, &ExtraFlags::default()).await
    }

    /// [`Cluster::start`], with `extra` flags for the two binaries.
    pub async fn start_with(dir: &Path, binaries: &Binaries, app: &str, extra: &ExtraFlags<'_>) -> Result<Cluster> {
        let registry = format!("127.0.0.1:{}", free_port()?);
        let registry_certs_existed = Path::new(DOCKER_CERTS_DIR).join(&registry).exists();
        let git = GitDaemon::start(&dir.join("git"))?;
        let registry_bin = binaries.registry.display().to_string();
        let mut server_flags = vec!["--registry-bin", registry_bin.as_str(), "--registry-listen", registry.as_str(), "--drain-seconds", "1"];
        server_flags.extend_from_slice(extra.server);
        let server = Server::start(&binaries.server, dir, &server_flags).await?;
        let mut cluster = Cluster {
            dir: dir.to_path_buf(),
            server,
            agent: None,
            agent_log: dir.join("agent.log"),
            node_id: String::new(),
            git: Some(git),
            events: None,
            registry,
            registry_certs_existed,
            app: app.to_string(),
            app_created: false,
        };
        cluster.node_id = cluster.join_agent(&binaries.agent, extra.join).await?;
        // Watch before the agent can start anything, so no event is missed.
        cluster.events = Some(Events::watch(&format!("cloudweb.node={}", cluster.node_id))?);
        cluster.start_agent(&binaries.agent, extra.run).await?;
        Ok(cluster)
    }

    /// The agent's data dir (its identity, and Caddy's state on an ingress node).
    pub fn agent_dir(&self) -> PathBuf {
        self.dir.join("agent")
    }

    /// The agent's process id, while it runs.
    pub fn agent_pid(&self) -> Option<u32> {
        self.agent.as_ref().map(Guarded::id)
    }

    async fn join_agent(&self, agent_bin: &Path, extra: &[&str]) -> Result<String> {
        self.server.join_agent(agent_bin, &self.agent_dir(), "bench", extra).await
    }

    async fn start_agent(&mut self, agent_bin: &Path, extra: &[&str]) -> Result<()> {
        let mut command = Command::new(agent_bin);
        command
            .arg("--data-dir")
            .arg(self.agent_dir())
            .args(["run", "--heartbeat-interval-seconds", "1", "--publish-ip", "127.0.0.1", "--advertise-host", "127.0.0.1"])
            .args(extra)
            // Info level: the agent's "deploying" line says when it picked a command up.
            .env("CLOUDWEB_LOG", "info")
            .env("NO_COLOR", "1");
        self.agent = Some(Guarded::spawn(command, &self.agent_log, Duration::from_secs(5))?);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let (status, node) = self.server.call(Method::GET, &format!("/api/nodes/{}", self.node_id), None).await?;
            if status == 200 && node["state"] == "ready" {
                return Ok(());
            }
            self.check_processes()?;
            if tokio::time::Instant::now() > deadline {
                bail!("node {} was not ready within 30 s (last answer {status}: {node}); agent log:\n{}", self.node_id, self.agent_log_tail(20));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Fails when the control plane or the agent has exited.
    pub fn check_processes(&mut self) -> Result<()> {
        if let Some(status) = self.agent.as_mut().and_then(Guarded::exited) {
            bail!("cloudweb-agent exited with {status}; its log:\n{}", self.agent_log_tail(20));
        }
        if let Some(status) = self.server.exited() {
            bail!("cloudweb-server exited with {status}; see {}", self.dir.join("server.log").display());
        }
        Ok(())
    }

    pub fn agent_log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.agent_log).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    pub fn git(&self) -> &GitDaemon {
        self.git.as_ref().expect("the git daemon runs until the cluster is dropped")
    }

    /// Creates the app, its repository served by the git daemon.
    pub async fn create_app(&mut self, repo: &str, health_timeout_seconds: u32) -> Result<()> {
        let body = json!({
            "name": self.app, "repo_url": self.git().url(repo), "branch": "main", "port": 8080,
            "health_timeout_seconds": health_timeout_seconds,
        });
        let (status, answer) = self.server.call(Method::POST, "/api/apps", Some(&body)).await?;
        if status != 201 {
            bail!("creating app {} answered {status}: {answer}", self.app);
        }
        self.app_created = true;
        Ok(())
    }

    /// Creates the app from a full `POST /api/apps` body (its name must be
    /// this cluster's app).
    pub async fn create_app_from(&mut self, body: &serde_json::Value) -> Result<()> {
        let (status, answer) = self.server.call(Method::POST, "/api/apps", Some(body)).await?;
        if status != 201 {
            bail!("creating app {} answered {status}: {answer}", self.app);
        }
        self.app_created = true;
        Ok(())
    }

    /// Waits until the node runs nothing but `current` and has acked every
    /// command, so that the next deploy finds the agent idle: a superseded
    /// deployment is stopped after the drain period, and the agent's stop
    /// (SIGTERM, then a grace period) would otherwise delay it.
    pub async fn wait_quiet(&mut self, current: &str, timeout: Duration) -> Result<()> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let deployments = docker::label_values(&format!("cloudweb.node={}", self.node_id), "cloudweb.deployment")?;
            let only_current = deployments.iter().all(|deployment| deployment == current);
            let (status, body) = self.server.call(Method::GET, &format!("/api/nodes/{}/commands", self.node_id), None).await?;
            let all_acked = status == 200
                && body["commands"].as_array().is_some_and(|commands| commands.iter().all(|command| !command["acked_at"].is_null()));
            if only_current && all_acked {
                return Ok(());
            }
            self.check_processes()?;
            if tokio::time::Instant::now() > deadline {
                bail!(
                    "the node did not settle within {} s: containers of {deployments:?} (want only {current}), commands acked: {all_acked}",
                    timeout.as_secs()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Deletes the app (the control plane queues the stops). The rest of
    /// the clean-up happens on drop.
    pub async fn delete_app(&mut self) -> Result<()> {
        if !self.app_created {
            return Ok(());
        }
        // A benchmark's app takes its volumes (if any) with it.
        let (status, body) = self.server.call(Method::DELETE, &format!("/api/apps/{}?volumes=delete", self.app), None).await?;
        if status != 204 {
            bail!("deleting app {} answered {status}: {body}", self.app);
        }
        self.app_created = false;
        Ok(())
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // The agent first, so it starts nothing while its containers go.
        drop(self.agent.take());
        drop(self.events.take());
        drop(self.git.take());
        let mut problems = Vec::new();
        if !self.node_id.is_empty() {
            if let Err(err) = docker::remove_labelled(&format!("cloudweb.node={}", self.node_id)) {
                problems.push(format!("{err:#}"));
            }
        }
        if let Err(err) = docker::remove_labelled(&format!("{BASELINE_LABEL}={}", self.app)) {
            problems.push(format!("{err:#}"));
        }
        for repository in [format!("{}/{}", self.registry, self.app), baseline_repository(&self.app)] {
            if let Err(err) = docker::remove_repository_tags(&repository) {
                problems.push(format!("{err:#}"));
            }
        }
        if !self.registry_certs_existed {
            let certs = Path::new(DOCKER_CERTS_DIR).join(&self.registry);
            if certs.exists() {
                if let Err(err) = std::fs::remove_dir_all(&certs) {
                    problems.push(format!("removing {}: {err}", certs.display()));
                }
            }
        }
        for problem in problems {
            eprintln!("warning: clean-up: {problem}");
        }
        // The control plane (and the registry it supervises) stops when
        // `server` is dropped, after this.
    }
}

/// The repository the cached `docker build` baseline tags its image in.
pub fn baseline_repository(app: &str) -> String {
    format!("cloudweb-bench/{app}")
}
