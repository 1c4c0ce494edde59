//! Starting the real `cloudweb-server` binary for a benchmark.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

pub struct Server {
    child: Child,
    pub agent_url: String,
    pub api_url: String,
    pub admin_token: String,
    pub ca_pem: String,
    pub http: reqwest::Client,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
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

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

impl Server {
    pub async fn start(binary: &Path, data_dir: &Path, extra: &[&str]) -> Result<Server> {
        let agent_port = free_port()?;
        let api_port = free_port()?;
        let log = std::fs::File::create(data_dir.join("server.log"))?;
        let child = Command::new(binary)
            .arg("serve")
            .arg("--data-dir")
            .arg(data_dir.join("server"))
            .arg("--agent-listen")
            .arg(format!("127.0.0.1:{agent_port}"))
            .arg("--api-listen")
            .arg(format!("127.0.0.1:{api_port}"))
            .arg("--public-url")
            .arg(format!("https://127.0.0.1:{agent_port}"))
            .args(extra)
            .env("CLOUDWEB_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {}", binary.display()))?;
        let http = reqwest::Client::builder().timeout(Duration::from_secs(30)).build()?;
        let api_url = format!("http://127.0.0.1:{api_port}");
        let start = Instant::now();
        loop {
            if http.get(format!("{api_url}/healthz")).send().await.is_ok_and(|r| r.status().is_success()) {
                break;
            }
            if start.elapsed() > Duration::from_secs(30) {
                bail!("the control plane did not start; see {}", data_dir.join("server.log").display());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let admin_token = std::fs::read_to_string(data_dir.join("server/admin-token"))?.trim().to_string();
        let ca_pem = std::fs::read_to_string(data_dir.join("server/ca.crt"))?;
        Ok(Server { child, agent_url: format!("https://127.0.0.1:{agent_port}"), api_url, admin_token, ca_pem, http })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub async fn join_token(&self) -> Result<String> {
        let response = self.http.post(format!("{}/api/join-tokens", self.api_url)).bearer_auth(&self.admin_token).send().await?;
        if response.status() != 201 {
            bail!("join-tokens answered {}", response.status());
        }
        let body: serde_json::Value = response.json().await?;
        Ok(body["token"].as_str().context("token")?.to_string())
    }

    /// A counter from `/metrics`.
    pub async fn metric(&self, name: &str) -> Result<f64> {
        let text = self.http.get(format!("{}/metrics", self.api_url)).bearer_auth(&self.admin_token).send().await?.text().await?;
        text.lines()
            .find_map(|line| line.strip_prefix(name).and_then(|rest| rest.trim().parse().ok()))
            .with_context(|| format!("metric {name} missing"))
    }
}
