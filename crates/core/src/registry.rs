//! The cluster's image registry: the Docker distribution registry, run and
//! supervised by the control plane as a child process (`docker-registry
//! serve`), with TLS from the cluster CA and one htpasswd user per node
//! (see `registry_credentials`). Agents learn the address, the CA and their
//! own credentials from `GET /agent/v1/registry`.
//!
//! Its certificate (`registry/tls.crt`, for the key `registry/listener.key`)
//! is issued at every start and renewed by [`supervise`] at two thirds of its
//! life (`--registry-cert-seconds`, default 365 days). The registry reads its
//! TLS files only at start, so a renewal restarts it: it is away for tens of
//! milliseconds (at most 15 s before it is reported as not back), connections in
//! flight are cut, and agents retry pushes and pulls over about 10 s.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use cloudweb_protocol::RegistryConfig;
use std::collections::HashSet;
use std::sync::Arc;

use tokio::process::{Child, Command};

use crate::ca::{self, write_private, ClusterCa};
use crate::listener_cert::{self, CertInfo};
use crate::registry_credentials::Credentials;
pub use crate::registry_storage::{RegistryS3, RegistryStorage};
use crate::AppState;

#[derive(Debug, Clone)]
pub struct RegistrySettings {
    /// The `docker-registry` (distribution) binary.
    pub binary: PathBuf,
    /// Where it listens.
    pub listen: SocketAddr,
    /// `host:port` nodes use to reach it (mesh address in production).
    pub advertise: String,
    /// How long its certificate is valid; renewed at two thirds of that.
    pub cert_lifetime: Duration,
    /// Where it keeps images.
    pub storage: RegistryStorage,
}

#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("registry setup in {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("registry certificate: {0}")]
    Cert(String),
    #[error("registry credentials: {0}")]
    Credentials(String),
    #[error("cannot start {binary}: {source}")]
    Spawn { binary: PathBuf, source: std::io::Error },
    #[error("the registry did not start listening on {0} within 15 s")]
    NotListening(SocketAddr),
}

pub struct RunningRegistry {
    pub agent_config: RegistryConfig,
    command: Vec<std::ffi::OsString>,
    /// Its whole environment (the storage's keys, if any).
    env: Vec<(String, String)>,
    child: Child,
    listen: SocketAddr,
    pid_file: cloudweb_child::PidFile,
    cert: IssuedCert,
}

/// The registry's certificate in force and what a renewal needs.
struct IssuedCert {
    dir: PathBuf,
    hosts: Vec<String>,
    lifetime: time::Duration,
    info: CertInfo,
}

impl IssuedCert {
    /// Issues a certificate for the key in `dir` and writes `tls.crt` and
    /// `tls.key` there, for the registry's next start.
    fn issue(ca: &ClusterCa, dir: &Path, hosts: &[String], lifetime: time::Duration, now: time::OffsetDateTime) -> Result<IssuedCert, RegistryError> {
        let issued = ca.issue_server_cert_for(dir, hosts, now, lifetime).map_err(|e| RegistryError::Cert(e.to_string()))?;
        let info = ca::first_cert_der(&issued.cert_pem)
            .and_then(|leaf| listener_cert::info_of(&leaf))
            .ok_or_else(|| RegistryError::Cert("the issued certificate does not parse".into()))?;
        replace_private(&dir.join("tls.crt"), issued.cert_pem.as_bytes())?;
        replace_private(&dir.join("tls.key"), issued.key_pem.as_bytes())?;
        Ok(IssuedCert { dir: dir.to_path_buf(), hosts: hosts.to_vec(), lifetime, info })
    }
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> RegistryError + '_ {
    move |source| RegistryError::Io { path: path.to_path_buf(), source }
}

/// Writes the registry's files (htpasswd for the `registered` nodes) and
/// starts it.
pub async fn start(
    settings: &RegistrySettings,
    data_dir: &Path,
    ca: &ClusterCa,
    credentials: &Credentials,
    registered: &HashSet<String>,
    now: time::OffsetDateTime,
) -> Result<RunningRegistry, RegistryError> {
    let dir = data_dir.join("registry");
    std::fs::create_dir_all(dir.join("storage")).map_err(io(&dir))?;
    let host = settings.advertise.rsplit_once(':').map(|(h, _)| h.trim_matches(['[', ']'])).unwrap_or(&settings.advertise);
    let lifetime = time::Duration::try_from(settings.cert_lifetime).unwrap_or(ca::LISTENER_CERT_VALIDITY);
    let cert = IssuedCert::issue(ca, &dir, &[host.to_string()], lifetime, now)?;
    let cert_path = dir.join("tls.crt");
    let key_path = dir.join("tls.key");

    // The one password all nodes shared before each got its own.
    let _ = std::fs::remove_file(dir.join("password.sealed"));
    credentials.prepare(registered).await.map_err(|e| RegistryError::Credentials(e.to_string()))?;
    let htpasswd = credentials.htpasswd_path().to_path_buf();

    let quote = |p: &Path| serde_json::to_string(&p.display().to_string()).expect("string serializes");
    let root = dir.join("storage");
    if let Some(endpoint) = settings.storage.endpoint() {
        if let Err(err) = crate::s3::reachable(endpoint).await {
            tracing::error!(endpoint, error = %err, "the image registry's S3 storage does not answer: pushes and pulls fail until it does");
        }
    }
    let config = format!(
        "version: 0.1\nlog:\n  level: warn\n{storage}\
         http:\n  addr: {addr}\n  tls:\n    certificate: {cert}\n    key: {key}\n\
         auth:\n  htpasswd:\n    realm: cloudweb\n    path: {htpasswd}\n",
        storage = settings.storage.config(&root),
        addr = serde_json::to_string(&settings.listen.to_string()).expect("string serializes"),
        cert = quote(&cert_path),
        key = quote(&key_path),
        htpasswd = quote(&htpasswd),
    );
    let config_path = dir.join("config.yml");
    replace_private(&config_path, config.as_bytes())?;

    let command = vec![settings.binary.clone().into_os_string(), "serve".into(), config_path.clone().into_os_string()];
    // A registry left by a control plane that was killed (one started
    // before children were tied to their parent) still holds the port.
    let pid_file = cloudweb_child::PidFile::new(dir.join("registry.pid"));
    let leftover = {
        let (pid_file, marker) = (pid_file.clone(), config_path.clone().into_os_string());
        // It may wait a moment for the old process to go.
        tokio::task::spawn_blocking(move || pid_file.kill_leftover(&marker)).await
    };
    match leftover {
        Ok(Ok(Some(pid))) => tracing::warn!(pid, "stopped an image registry left running by an earlier control plane"),
        Ok(Ok(None)) => {}
        Ok(Err(err)) => tracing::warn!(error = %err, "could not stop a leftover image registry"),
        Err(err) => tracing::warn!(error = %err, "could not look for a leftover image registry"),
    }
    let version = credentials.written_version();
    let env = settings.storage.env();
    let child = spawn(&command, &env, &pid_file)?;
    wait_listening(settings.listen).await?;
    credentials.loaded(version);
    tracing::info!(
        listen = %settings.listen,
        advertise = %settings.advertise,
        storage = %settings.storage.describe(&root),
        cert_serial = %cert.info.serial,
        cert_not_after = %crate::clock::rfc3339_ms(cert.info.not_after_ms),
        "image registry running"
    );
    Ok(RunningRegistry {
        agent_config: agent_config(settings, ca),
        command,
        env,
        child,
        listen: settings.listen,
        pid_file,
        cert,
    })
}

/// What agents are told about the registry (credentials are added per node
/// by the handler).
pub fn agent_config(settings: &RegistrySettings, ca: &ClusterCa) -> RegistryConfig {
    RegistryConfig {
        configured: true,
        address: Some(settings.advertise.clone()),
        ca: Some(ca.cert_pem().to_string()),
        username: None,
        password: None,
    }
}

/// Whether the registry's listen address is one of this host's addresses
/// now (an unspecified address always is). The mesh address 10.77.0.1
/// appears only once this host's own agent has brought the mesh interface
/// up, which needs the control plane running first.
pub fn listen_address_present(listen: SocketAddr) -> bool {
    listen.ip().is_unspecified() || std::net::TcpListener::bind(SocketAddr::new(listen.ip(), 0)).is_ok()
}

/// Waits until the listen address exists on this host, saying every minute
/// what it waits for. Ends when the address appears (or with the task).
pub async fn wait_for_listen_address(listen: SocketAddr) {
    let mut waited = Duration::ZERO;
    while !listen_address_present(listen) {
        if waited.as_secs().is_multiple_of(60) {
            tracing::warn!(
                address = %listen.ip(),
                "the image registry waits for its listen address (the mesh address of this host, up once its agent runs the mesh)"
            );
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        waited += Duration::from_secs(1);
    }
}

fn replace_private(path: &Path, contents: &[u8]) -> Result<(), RegistryError> {
    let _ = std::fs::remove_file(path);
    write_private(path, contents).map_err(|e| RegistryError::Cert(e.to_string()))
}

/// What the registry takes from the control plane's environment: how this
/// host reaches the network (a proxy to the S3 endpoint) and which CAs it
/// trusts. Nothing else.
const PASSED_THROUGH: [&str; 9] = ["PATH", "TZ", "HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "NO_PROXY", "SSL_CERT_FILE", "SSL_CERT_DIR"];

/// Starts the registry tied to this process: the kernel kills it when the
/// control plane dies, even by `kill -9`, and its pid is recorded for the
/// next start. Its environment is `env` and [`PASSED_THROUGH`]: nothing
/// else of the control plane's (its secrets, or AWS_* settings the
/// registry's S3 client would take up) reaches it.
fn spawn(command: &[std::ffi::OsString], env: &[(String, String)], pid_file: &cloudweb_child::PidFile) -> Result<Child, RegistryError> {
    let mut process = Command::new(&command[0]);
    process.args(&command[1..]).env_clear();
    for name in PASSED_THROUGH {
        if let Some(value) = std::env::var_os(name) {
            process.env(name, value);
        }
    }
    process.envs(env.iter().cloned()).stdin(std::process::Stdio::null()).kill_on_drop(true);
    cloudweb_child::die_with_parent(&mut process);
    let child = process.spawn().map_err(|source| RegistryError::Spawn { binary: PathBuf::from(&command[0]), source })?;
    if let Some(pid) = child.id() {
        if let Err(err) = pid_file.record(pid) {
            tracing::warn!(error = %err, "could not record the registry's pid");
        }
    }
    Ok(child)
}

async fn wait_listening(addr: SocketAddr) -> Result<(), RegistryError> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    while tokio::time::Instant::now() < deadline {
        if tokio::net::TcpStream::connect(addr).await.is_ok() {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Err(RegistryError::NotListening(addr))
}

/// Restarts the registry whenever it exits, when `credentials` changed
/// htpasswd, and with a renewed certificate at two thirds of the old one's
/// life (the registry reads both only at start), until the task is aborted
/// (which kills the child). A failed renewal is tried again after 5 s,
/// doubling up to 10 minutes, while the registry keeps serving the old one.
pub async fn supervise(mut running: RunningRegistry, credentials: Arc<Credentials>, state: Arc<AppState>) {
    let changed = credentials.restart_signal();
    // A registry that keeps exiting at once (its port taken, a broken
    // config) is restarted ever more slowly, up to once a minute, and the
    // pace resets once one has run for a minute.
    let mut delay = Duration::from_secs(1);
    let mut started = tokio::time::Instant::now();
    let mut renewal_retry: Option<Duration> = None;
    loop {
        let cert_wait = match renewal_retry {
            Some(retry) => retry,
            None => listener_cert::renewal_wait(&running.cert.info, state.clock.now_ms()).unwrap_or(Duration::ZERO),
        };
        tokio::select! {
            () = tokio::time::sleep(cert_wait) => {
                if renewal_retry.is_none() && listener_cert::renewal_wait(&running.cert.info, state.clock.now_ms()).is_some() {
                    continue;
                }
                let old = &running.cert;
                match IssuedCert::issue(&state.ca, &old.dir, &old.hosts, old.lifetime, state.clock.now()) {
                    Ok(new) => {
                        tracing::info!(
                            old_serial = %old.info.serial,
                            serial = %new.info.serial,
                            sha256 = %new.info.sha256,
                            not_after = %crate::clock::rfc3339_ms(new.info.not_after_ms),
                            "renewed the image registry's certificate; restarting the registry with it"
                        );
                        running.cert = new;
                        renewal_retry = None;
                        let _ = running.child.kill().await;
                        running.pid_file.clear();
                    }
                    Err(err) => {
                        let retry = renewal_retry.map_or(listener_cert::FIRST_RETRY, |r| (r * 2).min(listener_cert::LONGEST_RETRY));
                        tracing::error!(error = %err, retry_in_s = retry.as_secs(), "cannot renew the image registry's certificate");
                        renewal_retry = Some(retry);
                        continue;
                    }
                }
            }
            status = running.child.wait() => {
                running.pid_file.clear();
                if started.elapsed() >= Duration::from_secs(60) {
                    delay = Duration::from_secs(1);
                }
                tracing::error!(?status, retry_in_seconds = delay.as_secs(), "the image registry exited; restarting it");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(60));
            }
            () = changed.notified() => {
                tracing::info!("restarting the image registry with the changed node credentials");
                let _ = running.child.kill().await;
                running.pid_file.clear();
            }
        }
        let version = credentials.written_version();
        match spawn(&running.command, &running.env, &running.pid_file) {
            Ok(child) => {
                running.child = child;
                started = tokio::time::Instant::now();
                match wait_listening(running.listen).await {
                    Ok(()) => credentials.loaded(version),
                    Err(err) => tracing::error!(error = %err, "the image registry did not come back"),
                }
            }
            Err(err) => {
                tracing::error!(error = %err, "cannot restart the image registry");
                tokio::time::sleep(Duration::from_secs(5)).await;
            }
        }
    }
}
