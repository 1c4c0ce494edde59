//! Starting the real `cloudweb-server` binary for a benchmark.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::Value;

use crate::process::Guarded;

pub struct Server {
    /// Stopped with SIGTERM on drop, so it stops the registry it supervises.
    process: Guarded,
    /// What it was started as, for [`Server::kill_and_restart`].
    binary: PathBuf,
    data_dir: PathBuf,
    extra: Vec<String>,
    pub agent_port: u16,
    pub api_port: u16,
    pub agent_url: String,
    pub api_url: String,
    pub admin_token: String,
    pub ca_pem: String,
    pub http: reqwest::Client,
}

/// The binary next to this one (same target profile), unless given.
pub fn sibling_binary(name: &str, given: Option<PathBuf>) -> Result<PathBuf> {
    let path = match given {
        Some(path) => path,
        None => std::env::current_exe()?.parent().context("bench binary has no directory")?.join(name),
    };
    if !path.exists() {
        bail!("{} not found; build it (cargo build --release --bins) or pass its path", path.display());
    }
    Ok(path)
}

/// A TCP port on 127.0.0.1 that no test or bench running alongside gets
/// (`cloudweb_e2e::ports`).
pub fn free_port() -> Result<u16> {
    Ok(cloudweb_e2e::free_port())
}

impl Server {
    pub async fn start(binary: &Path, data_dir: &Path, extra: &[&str]) -> Result<Server> {
        Server::start_on(binary, data_dir, free_port()?, free_port()?, extra).await
    }

    /// Kills the control plane with SIGKILL (its children too), as a crash
    /// would, and starts it again on the same data, ports and flags;
    /// returns once it answers `/healthz`.
    pub async fn kill_and_restart(&mut self) -> Result<()> {
        self.process.kill_now();
        let extra: Vec<&str> = self.extra.iter().map(String::as_str).collect();
        let restarted = Server::start_on(&self.binary, &self.data_dir, self.agent_port, self.api_port, &extra).await?;
        *self = restarted;
        Ok(())
    }

    /// Kills the control plane with SIGKILL (its children too), as the
    /// loss of its host would; [`Server::start_again`] brings it back.
    pub fn kill(&mut self) {
        self.process.kill_now();
    }

    /// Starts a killed control plane again on the same data, ports and
    /// flags; returns once it answers `/healthz`.
    pub async fn start_again(&mut self) -> Result<()> {
        let extra: Vec<&str> = self.extra.iter().map(String::as_str).collect();
        *self = Server::start_on(&self.binary, &self.data_dir, self.agent_port, self.api_port, &extra).await?;
        Ok(())
    }

    /// Runs `cloudweb-agent join` into `data_dir` under `name` with a new
    /// token (in the environment, which keeps it out of `ps`); returns the
    /// node's id.
    pub async fn join_agent(&self, agent_bin: &Path, data_dir: &Path, name: &str, extra: &[&str]) -> Result<String> {
        let (token, ca_sha256) = self.join_token_and_ca().await?;
        let output = Command::new(agent_bin)
            .arg("--data-dir")
            .arg(data_dir)
            .args(["join", "--server", &self.agent_url, "--ca-sha256", &ca_sha256, "--name", name])
            .args(extra)
            .env("CLOUDWEB_JOIN_TOKEN", token)
            .env("NO_COLOR", "1")
            .stdin(std::process::Stdio::null())
            .output()
            .with_context(|| format!("running {} join", agent_bin.display()))?;
        if !output.status.success() {
            bail!("cloudweb-agent join failed with {}: {}", output.status, String::from_utf8_lossy(&output.stderr).trim());
        }
        let info: Value = serde_json::from_str(&std::fs::read_to_string(data_dir.join("node.json")).context("reading the agent's node.json")?)?;
        Ok(info["node_id"].as_str().context("node.json has no node_id")?.to_string())
    }

    /// Where the simulated agents of [`cloudweb_e2e::fleet`] find it.
    pub fn control(&self) -> cloudweb_e2e::fleet::ControlPlane {
        cloudweb_e2e::fleet::ControlPlane {
            agent_port: self.agent_port,
            api_url: self.api_url.clone(),
            admin_token: self.admin_token.clone(),
            ca_pem: self.ca_pem.clone(),
        }
    }

    pub async fn start_on(binary: &Path, data_dir: &Path, agent_port: u16, api_port: u16, extra: &[&str]) -> Result<Server> {
        let mut command = Command::new(binary);
        command
            .arg("serve")
            .arg("--data-dir")
            .arg(data_dir.join("server"))
            .arg("--agent-listen")
            .arg(format!("127.0.0.1:{agent_port}"))
            .arg("--api-listen")
            .arg(format!("127.0.0.1:{api_port}"))
            .arg("--public-url")
            .arg(format!("https://127.0.0.1:{agent_port}"))
            // The benchmarks' git daemon listens on loopback.
            .arg("--allow-private-git-hosts")
            .args(extra)
            .env("CLOUDWEB_LOG", "warn")
            .env("NO_COLOR", "1");
        let mut process = Guarded::spawn(command, &data_dir.join("server.log"), Duration::from_secs(10))?;
        let http = reqwest::Client::builder().timeout(Duration::from_secs(30)).build()?;
        let api_url = format!("http://127.0.0.1:{api_port}");
        let start = Instant::now();
        loop {
            if http.get(format!("{api_url}/healthz")).send().await.is_ok_and(|r| r.status().is_success()) {
                break;
            }
            if let Some(status) = process.exited() {
                let log = std::fs::read_to_string(data_dir.join("server.log")).unwrap_or_default();
                bail!("the control plane exited with {status}:\n{}", log.trim_end());
            }
            if start.elapsed() > Duration::from_secs(30) {
                bail!("the control plane did not start; see {}", data_dir.join("server.log").display());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let admin_token = std::fs::read_to_string(data_dir.join("server/admin-token"))?.trim().to_string();
        let ca_pem = std::fs::read_to_string(data_dir.join("server/ca.crt"))?;
        Ok(Server {
            process,
            binary: binary.to_path_buf(),
            data_dir: data_dir.to_path_buf(),
            extra: extra.iter().map(|s| s.to_string()).collect(),
            agent_port,
            api_port,
            agent_url: format!("https://127.0.0.1:{agent_port}"),
            api_url,
            admin_token,
            ca_pem,
            http,
        })
    }

    pub fn pid(&self) -> u32 {
        self.process.id()
    }

    /// A fresh join token and the CA fingerprint a joining agent pins.
    pub async fn join_token_and_ca(&self) -> Result<(String, String)> {
        let response = self.http.post(format!("{}/api/join-tokens", self.api_url)).bearer_auth(&self.admin_token).send().await?;
        if response.status() != 201 {
            bail!("join-tokens answered {}", response.status());
        }
        let body: Value = response.json().await?;
        let token = body["token"].as_str().context("join-tokens answered without a token")?;
        let ca_sha256 = body["ca_sha256"].as_str().context("join-tokens answered without ca_sha256")?;
        Ok((token.to_string(), ca_sha256.to_string()))
    }

    /// A request on the user API with the admin token: status and JSON body
    /// (`Null` when the body is not JSON).
    pub async fn call(&self, method: reqwest::Method, path: &str, body: Option<&Value>) -> Result<(u16, Value)> {
        let mut request = self.http.request(method.clone(), format!("{}{path}", self.api_url)).bearer_auth(&self.admin_token);
        if let Some(body) = body {
            request = request.json(body);
        }
        let response = request.send().await.with_context(|| format!("{method} {path}"))?;
        let status = response.status().as_u16();
        let text = response.text().await.with_context(|| format!("{method} {path}"))?;
        Ok((status, serde_json::from_str(&text).unwrap_or(Value::Null)))
    }

    /// The exit status, when the control plane has exited.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.process.exited()
    }

    /// A counter from `/metrics`.
    pub async fn metric(&self, name: &str) -> Result<f64> {
        let text = self.http.get(format!("{}/metrics", self.api_url)).bearer_auth(&self.admin_token).send().await?.text().await?;
        text.lines()
            .find_map(|line| line.strip_prefix(name).and_then(|rest| rest.trim().parse().ok()))
            .with_context(|| format!("metric {name} missing"))
    }
}
