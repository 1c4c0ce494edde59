//! Managed services on this node: the specs the control plane sent
//! (`service_run`), kept in `<data dir>/services.json` (mode 0600: they
//! hold credentials) so a restarted agent knows them, and a supervisor
//! that keeps each one's container at its generation, probes it with the
//! service's own tool, and publishes each one's state for the heartbeat.
//!
//! A service listens only on this node's service address: its mesh
//! address, or with the mesh off the Docker bridge's gateway (reachable by
//! this host and its containers, not by the LAN or the internet).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cloudweb_protocol::{ServicePayload, ServiceStatus, VolumeMount};
use tokio::sync::Notify;

use crate::files::write_private;
use crate::runtime::DockerRuntime;

pub const SPECS_FILE: &str = "services.json";

/// How often each service is checked.
const CHECK_EVERY: Duration = Duration::from_secs(2);
/// How long a probe may take.
const PROBE_LIMIT: Duration = Duration::from_secs(5);

struct Inner {
    runtime: DockerRuntime,
    data_dir: PathBuf,
    /// The mesh address when the mesh runs; else the bridge's gateway,
    /// looked up when needed.
    service_ip: Option<String>,
    specs: Mutex<BTreeMap<String, ServicePayload>>,
    /// Per service: its status, and whether it was ever healthy in this
    /// container.
    statuses: Mutex<BTreeMap<String, (ServiceStatus, bool)>>,
    /// Since when each service's container has been seen stopped (its
    /// restart policy gets [`POLICY_GRACE`] to bring it back first).
    stopped_since: Mutex<BTreeMap<String, std::time::Instant>>,
    /// Restarts Docker's count no longer shows: the agent's own, and the
    /// policy's before a start by hand reset that count.
    own_restarts: Mutex<BTreeMap<String, u64>>,
    /// The containers (by id) whose database took their spec's password
    /// (`set_password`); run again after an agent restart, which is
    /// harmless.
    passwords_set: Mutex<std::collections::HashSet<String>>,
    /// Services a restore holds (by service, the job): the supervisor
    /// leaves their containers stopped while their data is swapped.
    held: Mutex<BTreeMap<String, String>>,
    /// Held by the supervisor while it checks a service, so that
    /// [`Services::hold`] returns only once no check started before it
    /// can still start the container.
    checking: tokio::sync::Mutex<()>,
    wake: Notify,
}

/// How long setting a service's password may take.
const PASSWORD_LIMIT: Duration = Duration::from_secs(20);

/// `text` without the secrets of `exec`: every value of its environment
/// and every longer word of its standard input.
fn redact(text: &str, exec: &cloudweb_protocol::ServiceExec) -> String {
    let mut secrets: Vec<&str> = exec.env.values().map(String::as_str).collect();
    secrets.extend(exec.stdin.split(|c: char| !c.is_ascii_alphanumeric()).filter(|w| w.len() >= 12));
    secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
    let mut text = text.to_string();
    for secret in secrets.into_iter().filter(|s| !s.is_empty()) {
        text = text.replace(secret, "[redacted]");
    }
    text
}

/// How long a stopped container of the right generation is left to
/// Docker's restart policy before the agent starts it itself.
const POLICY_GRACE: Duration = Duration::from_secs(3);

/// Why a `service_run` was not taken.
#[derive(Debug, PartialEq, Eq)]
pub enum RunRefusal {
    /// The payload is wrong: dropped.
    Invalid(String),
    /// It could not be written to disk: retried.
    NotRecorded(String),
}

#[derive(Clone)]
pub struct Services {
    inner: Arc<Inner>,
}

fn load(path: &Path) -> BTreeMap<String, ServicePayload> {
    std::fs::read(path)
        .ok()
        .and_then(|bytes| serde_json::from_slice::<Vec<ServicePayload>>(&bytes).ok())
        .unwrap_or_default()
        .into_iter()
        .filter(|spec| spec.validate().is_ok())
        .map(|spec| (spec.service.clone(), spec))
        .collect()
}

/// Below this much free space the disk holding a service's data counts
/// as full.
const FULL_BELOW: u64 = 1 << 20;

/// The free bytes of the file system holding `dir`, when it is full.
fn full_disk(dir: &Path) -> Option<u64> {
    let stat = nix::sys::statvfs::statvfs(dir).ok()?;
    let free = stat.blocks_available() as u64 * stat.fragment_size() as u64;
    (free < FULL_BELOW).then_some(free)
}

impl Services {
    pub fn new(runtime: DockerRuntime, data_dir: &Path, service_ip: Option<String>) -> Services {
        let specs = load(&data_dir.join(SPECS_FILE));
        Services {
            inner: Arc::new(Inner {
                runtime,
                data_dir: data_dir.to_path_buf(),
                service_ip,
                specs: Mutex::new(specs),
                statuses: Mutex::new(BTreeMap::new()),
                stopped_since: Mutex::new(BTreeMap::new()),
                own_restarts: Mutex::new(BTreeMap::new()),
                passwords_set: Mutex::new(std::collections::HashSet::new()),
                held: Mutex::new(BTreeMap::new()),
                checking: tokio::sync::Mutex::new(()),
                wake: Notify::new(),
            }),
        }
    }

    fn save(&self, specs: &BTreeMap<String, ServicePayload>) -> Result<(), String> {
        let list: Vec<&ServicePayload> = specs.values().collect();
        let bytes = serde_json::to_vec(&list).expect("specs serialize");
        write_private(&self.inner.data_dir.join(SPECS_FILE), &bytes).map_err(|e| format!("cannot record the service: {e}"))
    }

    /// Takes a `service_run`: recorded, then the supervisor makes it so.
    pub fn run(&self, spec: ServicePayload) -> Result<(), RunRefusal> {
        spec.validate().map_err(|e| RunRefusal::Invalid(e.to_string()))?;
        let mut specs = self.inner.specs.lock().expect("specs lock");
        if specs.get(&spec.service).is_some_and(|known| known.generation > spec.generation) {
            tracing::info!(service = %spec.service, "an older generation of the service arrived late; kept the newer one");
            return Ok(());
        }
        let mut next = specs.clone();
        next.insert(spec.service.clone(), spec.clone());
        self.save(&next).map_err(RunRefusal::NotRecorded)?;
        *specs = next;
        drop(specs);
        tracing::info!(service = %spec.service, kind = spec.kind.as_str(), generation = spec.generation, "service to run");
        self.inner.wake.notify_one();
        Ok(())
    }

    /// Takes a `service_remove`: forgotten, its container removed (its
    /// data stays in its volume's directory).
    pub async fn remove(&self, service: &str) -> Result<(), String> {
        {
            let mut specs = self.inner.specs.lock().expect("specs lock");
            let mut next = specs.clone();
            if next.remove(service).is_some() {
                self.save(&next)?;
                *specs = next;
            }
        }
        self.inner.statuses.lock().expect("statuses lock").remove(service);
        match self.inner.runtime.remove_service(service).await {
            Ok(removed) => {
                tracing::info!(service, removed, "service removed; its data stays");
                Ok(())
            }
            Err(err) => Err(err.to_string()),
        }
    }

    /// What the heartbeat reports.
    pub fn statuses(&self) -> Vec<ServiceStatus> {
        self.inner.statuses.lock().expect("statuses lock").values().map(|(s, _)| s.clone()).collect()
    }

    /// The specs it keeps running now.
    pub fn specs(&self) -> Vec<ServicePayload> {
        self.inner.specs.lock().expect("specs lock").values().cloned().collect()
    }

    pub fn is_empty(&self) -> bool {
        self.inner.specs.lock().expect("specs lock").is_empty()
    }

    /// Makes the supervisor leave `service`'s container alone (stopped,
    /// for a restore's swap) until [`Services::release`]; returns once no
    /// check of it is under way.
    pub async fn hold(&self, service: &str, job_id: &str) {
        self.hold_now(service, job_id);
        drop(self.inner.checking.lock().await);
    }

    /// [`Services::hold`] before the supervisor runs (an agent start that
    /// finds a swap its predecessor did not finish).
    pub fn hold_now(&self, service: &str, job_id: &str) {
        tracing::info!(service, job_id, "service held for a restore");
        self.inner.held.lock().expect("held lock").insert(service.to_string(), job_id.to_string());
    }

    /// Ends a hold: the supervisor looks after the service again at once.
    pub fn release(&self, service: &str) {
        if self.inner.held.lock().expect("held lock").remove(service).is_some() {
            tracing::info!(service, "service released after a restore");
            self.inner.wake.notify_one();
        }
    }

    pub fn is_held(&self, service: &str) -> bool {
        self.inner.held.lock().expect("held lock").contains_key(service)
    }

    /// The spec of one service this node runs.
    pub fn spec(&self, service: &str) -> Option<ServicePayload> {
        self.inner.specs.lock().expect("specs lock").get(service).cloned()
    }

    /// Keeps every service running until the task is aborted.
    pub async fn supervise(self) {
        loop {
            let specs: Vec<ServicePayload> = self.inner.specs.lock().expect("specs lock").values().cloned().collect();
            for spec in specs {
                let checking = self.inner.checking.lock().await;
                let status = if self.is_held(&spec.service) {
                    let before = self.inner.statuses.lock().expect("statuses lock").get(&spec.service).map(|(s, _)| s.clone());
                    ServiceStatus {
                        service: spec.service.clone(),
                        generation: spec.generation,
                        state: "restarting".into(),
                        address: before.as_ref().and_then(|s| s.address.clone()),
                        detail: Some("stopped while its data is restored from a backup".into()),
                        restarts: before.map(|s| s.restarts).unwrap_or(0),
                    }
                } else {
                    self.check(&spec).await
                };
                drop(checking);
                let mut statuses = self.inner.statuses.lock().expect("statuses lock");
                // Removed meanwhile: not reported again.
                if !self.inner.specs.lock().expect("specs lock").contains_key(&spec.service) {
                    statuses.remove(&spec.service);
                    continue;
                }
                let was_healthy = statuses.get(&spec.service).is_some_and(|(s, healthy)| *healthy && s.generation == status.generation);
                let healthy_now = matches!(status.state.as_str(), "healthy" | "degraded");
                let status = if status.state == "unhealthy" && !was_healthy { ServiceStatus { state: "starting".into(), ..status } } else { status };
                if statuses.get(&spec.service).map(|(s, _)| s.state.as_str()) != Some(status.state.as_str()) {
                    tracing::info!(service = %spec.service, state = %status.state, detail = ?status.detail, "service state");
                }
                statuses.insert(spec.service.clone(), (status, was_healthy || healthy_now));
            }
            tokio::select! {
                () = tokio::time::sleep(CHECK_EVERY) => {}
                () = self.inner.wake.notified() => {}
            }
        }
    }

    /// Makes the database of container `id` accept the spec's password,
    /// once per container. Its error is one line without the output (which
    /// may quote the statement, so the password).
    async fn set_password(&self, spec: &ServicePayload, id: &str) -> Result<(), String> {
        let Some(exec) = &spec.set_password else { return Ok(()) };
        if self.inner.passwords_set.lock().expect("passwords lock").contains(id) {
            return Ok(());
        }
        let program = exec.cmd.first().map(String::as_str).unwrap_or("the command");
        match self.inner.runtime.exec_service(&spec.service, exec, PASSWORD_LIMIT).await {
            Ok((Some(0), _)) => {
                self.inner.passwords_set.lock().expect("passwords lock").insert(id.to_string());
                tracing::info!(service = %spec.service, generation = spec.generation, "the service's database took its password");
                Ok(())
            }
            Ok((code, output)) => {
                let output = redact(&output, exec);
                tracing::warn!(service = %spec.service, ?code, output = %cloudweb_protocol::misc::one_line(&output, 500), "setting the service's password failed");
                Err(match code {
                    Some(code) => format!("could not set the password ({program} exited with code {code}); it keeps the one it had"),
                    None => format!("could not set the password ({program} did not finish in {} s); it keeps the one it had", PASSWORD_LIMIT.as_secs()),
                })
            }
            Err(err) => Err(cloudweb_protocol::misc::one_line(&format!("could not set the password: {err}"), 500)),
        }
    }

    async fn service_ip(&self) -> Result<String, String> {
        match &self.inner.service_ip {
            Some(ip) => Ok(ip.clone()),
            None => match self.inner.runtime.bridge_gateway().await {
                Ok(Some(ip)) => Ok(ip),
                Ok(None) => Err("Docker's bridge network has no IPv4 gateway to publish services on".into()),
                Err(err) => Err(err.to_string()),
            },
        }
    }

    /// One look at a service: (re)create its container when it is missing
    /// or of another generation, else probe it.
    async fn check(&self, spec: &ServicePayload) -> ServiceStatus {
        let mut status = ServiceStatus { service: spec.service.clone(), generation: spec.generation, state: "starting".into(), address: None, detail: None, restarts: 0 };
        let ip = match self.service_ip().await {
            Ok(ip) => ip,
            Err(detail) => {
                status.state = "failed".into();
                status.detail = Some(detail);
                return status;
            }
        };
        status.address = Some(format!("{ip}:{}", spec.host_port));
        let container = match self.inner.runtime.service_container(&spec.service).await {
            Ok(container) => container,
            Err(err) => {
                status.state = "failed".into();
                status.detail = Some(cloudweb_protocol::misc::one_line(&err.to_string(), 500));
                return status;
            }
        };
        let own = self.inner.own_restarts.lock().expect("restarts lock").get(&spec.service).copied().unwrap_or(0);
        if container.as_ref().is_none_or(|c| c.running || c.restarting || c.generation != spec.generation) {
            self.inner.stopped_since.lock().expect("stopped lock").remove(&spec.service);
        }
        match container {
            Some(c) if c.generation == spec.generation && c.running => {
                status.restarts = c.restart_count + own;
                let probed = match self.inner.runtime.probe_service(&spec.service, &spec.health, PROBE_LIMIT).await {
                    Ok(true) => match self.set_password(spec, &c.id).await {
                        Ok(()) => Ok(true),
                        Err(detail) => {
                            // It answers, with the password it had: said,
                            // so the control plane keeps handing that one out.
                            status.state = "failed".into();
                            status.detail = Some(detail);
                            return status;
                        }
                    },
                    other => other,
                };
                match probed {
                    Ok(true) => match full_disk(&crate::volumes::dir(&self.inner.data_dir, &spec.volume)) {
                        // It answers, but cannot write: said, not hidden.
                        Some(free) => {
                            status.state = "degraded".into();
                            status.detail = Some(format!("the disk holding volume {} is full ({free} bytes free)", spec.volume));
                        }
                        None => status.state = "healthy".into(),
                    },
                    Ok(false) => {
                        status.state = "unhealthy".into();
                        status.detail = Some(format!("{} did not answer", spec.health.first().map(String::as_str).unwrap_or("the probe")));
                    }
                    Err(err) => {
                        status.state = "unhealthy".into();
                        status.detail = Some(cloudweb_protocol::misc::one_line(&err.to_string(), 500));
                    }
                }
            }
            Some(c) if c.generation == spec.generation && c.restarting => {
                status.restarts = c.restart_count + own;
                status.state = "restarting".into();
                status.detail = Some(format!("exited with code {}; Docker restarts it", c.exit_code.unwrap_or(0)));
            }
            Some(c) if c.generation == spec.generation => {
                // Exited and not (yet) brought back by its restart policy:
                // after a grace period the agent starts it itself, on the
                // same container and data.
                status.restarts = c.restart_count + own;
                status.state = "restarting".into();
                status.detail = Some(format!("exited with code {}", c.exit_code.unwrap_or(0)));
                let since = *self.inner.stopped_since.lock().expect("stopped lock").entry(spec.service.clone()).or_insert_with(std::time::Instant::now);
                if since.elapsed() >= POLICY_GRACE {
                    match self.inner.runtime.start_service_container(&spec.service).await {
                        Ok(()) => {
                            // A start by hand resets Docker's count: it is
                            // carried over here, with this restart.
                            *self.inner.own_restarts.lock().expect("restarts lock").entry(spec.service.clone()).or_default() += c.restart_count + 1;
                            self.inner.stopped_since.lock().expect("stopped lock").remove(&spec.service);
                            tracing::info!(service = %spec.service, "started the service's stopped container again");
                        }
                        Err(err) => status.detail = Some(cloudweb_protocol::misc::one_line(&format!("exited, and cannot be started: {err}"), 500)),
                    }
                }
            }
            other => {
                // Missing or of another generation: a new container on the
                // same data, once its image is on this node (an upgrade
                // to an image that cannot be had keeps the old container).
                if let Err(err) = self.inner.runtime.ensure_image(&spec.image, None).await {
                    status.state = "failed".into();
                    let kept = other.as_ref().map(|old| format!("; the container of generation {} is kept", old.generation)).unwrap_or_default();
                    status.detail = Some(cloudweb_protocol::misc::one_line(&format!("cannot get image {}: {err}{kept}", spec.image), 500));
                    return status;
                }
                if let Some(old) = &other {
                    tracing::info!(service = %spec.service, generation = old.generation, running = old.running, "replacing the service's container");
                    if let Err(err) = self.inner.runtime.remove_service(&spec.service).await {
                        status.state = "failed".into();
                        status.detail = Some(cloudweb_protocol::misc::one_line(&err.to_string(), 500));
                        return status;
                    }
                }
                let mount = [VolumeMount { name: spec.volume.clone(), path: spec.kind.data_path().to_string() }];
                let dir = match crate::volumes::prepare(&self.inner.data_dir, &mount) {
                    Ok(binds) => binds.into_iter().next().map(|(dir, _)| dir).unwrap_or_default(),
                    Err(detail) => {
                        status.state = "failed".into();
                        status.detail = Some(detail);
                        return status;
                    }
                };
                match self.inner.runtime.start_service(spec, &ip, &dir).await {
                    Ok(id) => tracing::info!(service = %spec.service, container = %id, address = ?status.address, "service container started"),
                    Err(err) => {
                        // Left half made (created, not started): removed
                        // so the next look starts over.
                        let _ = self.inner.runtime.remove_service(&spec.service).await;
                        status.state = "failed".into();
                        status.detail = Some(cloudweb_protocol::misc::one_line(&err.to_string(), 500));
                    }
                }
            }
        }
        status
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use cloudweb_protocol::ServiceExec;

    #[test]
    fn the_output_of_setting_a_password_is_redacted() {
        let exec = ServiceExec {
            cmd: vec!["mariadb".into()],
            env: BTreeMap::from([("MYSQL_PWD".into(), "rootsecret".into())]),
            stdin: "ALTER USER 'app'@'%' IDENTIFIED BY 'Abcdefghijkl0123';".into(),
        };
        let out = super::redact("ERROR near 'Abcdefghijkl0123' for rootsecret at IDENTIFIED", &exec);
        assert_eq!(out, "ERROR near '[redacted]' for [redacted] at IDENTIFIED");
    }
}
