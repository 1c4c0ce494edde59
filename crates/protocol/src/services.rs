//! Managed services on the wire: the `service_run` and `service_remove`
//! commands and the status an agent reports for each service it runs (in
//! `health.services`).
//!
//! A service is one container (PostgreSQL, Redis/Valkey or MariaDB) with
//! its data on a volume, started with the image's own environment
//! contract, published only on the node's service address (its mesh
//! address, or with the mesh off the Docker bridge's gateway, never a
//! public or LAN interface), restarted by Docker when it dies, and probed
//! with the service's own tool.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::validate::{self, ValidationError};
use crate::volumes;

/// The kinds of managed service.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum ServiceKind {
    Postgres,
    Redis,
    Mariadb,
}

impl ServiceKind {
    pub const ALL: [ServiceKind; 3] = [ServiceKind::Postgres, ServiceKind::Redis, ServiceKind::Mariadb];

    pub fn as_str(self) -> &'static str {
        match self {
            ServiceKind::Postgres => "postgres",
            ServiceKind::Redis => "redis",
            ServiceKind::Mariadb => "mariadb",
        }
    }

    pub fn parse(text: &str) -> Option<ServiceKind> {
        ServiceKind::ALL.into_iter().find(|k| k.as_str() == text)
    }

    /// The port the service listens on inside its container.
    pub fn port(self) -> u16 {
        match self {
            ServiceKind::Postgres => 5432,
            ServiceKind::Redis => 6379,
            ServiceKind::Mariadb => 3306,
        }
    }

    /// Where the image keeps its data (the volume's mount path).
    pub fn data_path(self) -> &'static str {
        match self {
            ServiceKind::Postgres => "/var/lib/postgresql/data",
            ServiceKind::Redis => "/data",
            ServiceKind::Mariadb => "/var/lib/mysql",
        }
    }
}

/// Payload of `service_run`: make this node run the service as described
/// (create its container, or replace it when `generation` grew).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServicePayload {
    pub service: String,
    pub kind: ServiceKind,
    pub image: String,
    /// The image's environment contract (credentials included).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Arguments after the image's entrypoint (Redis takes its password
    /// this way); empty for the image's default command.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub command: Vec<String>,
    /// The volume that holds the data, mounted at the kind's data path.
    pub volume: String,
    /// Host port on the node's service address.
    pub host_port: u16,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_bytes: Option<u64>,
    /// Run with `docker exec` to tell whether the service accepts
    /// connections (`pg_isready`, `redis-cli ping`, `mariadb-admin ping`).
    pub health: Vec<String>,
    /// Grows when the container must be replaced (new image, rotated
    /// password); the agent keeps a container of the same generation.
    pub generation: u64,
    /// Run once in each new container as soon as it answers `health`,
    /// before it is reported healthy: makes the database accept the
    /// password of this payload (PostgreSQL and MariaDB keep the one their
    /// data was made with, whatever the environment says later). Absent
    /// when the command line sets it (Redis) or for older control planes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub set_password: Option<ServiceExec>,
}

/// A command run with `docker exec` in a service's container whose
/// secret travels on its standard input and in its environment, never on a
/// command line (`ps` shows those to every user of the host).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceExec {
    pub cmd: Vec<String>,
    /// The exec's own environment, added to the container's.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Written to its standard input, which is then closed.
    #[serde(default)]
    pub stdin: String,
}

/// Most bytes a [`ServiceExec`]'s standard input holds.
pub const MAX_EXEC_STDIN: usize = 4096;

impl ServiceExec {
    pub fn validate(&self) -> Result<(), ValidationError> {
        if self.cmd.is_empty() || self.cmd.len() > 16 {
            return Err(ValidationError::new("set_password.cmd", "must be 1 to 16 arguments"));
        }
        for arg in &self.cmd {
            validate::bounded_text("set_password.cmd", arg, 1024)?;
        }
        crate::deploy::env(&self.env)?;
        if self.stdin.len() > MAX_EXEC_STDIN {
            return Err(ValidationError::new("set_password.stdin", "at most 4096 bytes"));
        }
        Ok(())
    }
}

/// Payload of `service_remove`: stop and remove the service's container.
/// Its volume stays (a `volume_delete` removes the data, on request).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceRemovePayload {
    pub service: String,
}

/// A service name: like an app name.
pub fn name(value: &str) -> Result<(), ValidationError> {
    validate::node_name("service", value)
}

/// Container name of a service.
pub fn container_name(service: &str) -> String {
    // A dot no app name has: never `cw-<app>-<n>`, an app instance's name.
    format!("cw-svc.{service}")
}

impl ServicePayload {
    pub fn validate(&self) -> Result<(), ValidationError> {
        name(&self.service)?;
        volumes::name(&self.volume)?;
        validate::bounded_text("image", &self.image, 512)?;
        if self.image.is_empty() || self.image.starts_with('-') || self.image.contains(char::is_whitespace) {
            return Err(ValidationError::new("image", "is not an image reference"));
        }
        crate::deploy::env(&self.env)?;
        if self.command.len() > 32 {
            return Err(ValidationError::new("command", "at most 32 arguments"));
        }
        for arg in &self.command {
            validate::bounded_text("command", arg, 1024)?;
        }
        if self.host_port < 1024 {
            return Err(ValidationError::new("host_port", "must be 1024 to 65535"));
        }
        if self.health.is_empty() || self.health.len() > 16 {
            return Err(ValidationError::new("health", "must be 1 to 16 arguments"));
        }
        for arg in &self.health {
            validate::bounded_text("health", arg, 1024)?;
        }
        if let Some(exec) = &self.set_password {
            exec.validate()?;
        }
        Ok(())
    }
}

impl ServiceRemovePayload {
    pub fn validate(&self) -> Result<(), ValidationError> {
        name(&self.service)
    }
}

/// What an agent says about one service it runs, in `health.services`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema))]
pub struct ServiceStatus {
    pub service: String,
    /// The generation of the container it describes.
    pub generation: u64,
    /// `starting` (created, not accepting connections yet), `healthy`,
    /// `degraded` (answers, but the disk holding its data is full),
    /// `restarting` (it died; Docker brings it back), `unhealthy` (runs
    /// but its probe fails), `failed` (cannot be started; see `detail`).
    pub state: String,
    /// Where linked apps connect: the node's service address and port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    /// Why it is not healthy, one line.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// How often Docker restarted the container.
    #[serde(default)]
    pub restarts: u64,
}

/// `POST /agent/v1/service-logs`: new output lines of this node's service
/// containers, with their secrets redacted by the agent. A control plane
/// without the route answers 404; the agent then drops the lines and asks
/// again much later.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceLogUpload {
    pub services: Vec<ServiceLogs>,
}

/// New lines of one service's container, oldest first (the answer is a
/// [`crate::LogUploadResponse`], `refused` naming services).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceLogs {
    pub service: String,
    /// Lines the agent lost before this batch (its buffer was full).
    #[serde(default)]
    pub dropped: u64,
    /// `stream` is `stdout` or `stderr`; `ts` the Engine's RFC 3339 time.
    #[serde(default)]
    pub lines: Vec<crate::LogLine>,
}

impl ServiceLogUpload {
    /// Caps every line at [`crate::misc::MAX_LOG_LINE`] bytes.
    pub fn sanitize(&mut self) {
        for service in &mut self.services {
            for line in &mut service.lines {
                crate::misc::cap_log_line(&mut line.line);
            }
        }
    }

    pub fn validate(&self) -> Result<(), ValidationError> {
        if self.services.len() > MAX_STATUSES {
            return Err(ValidationError::new("services", format!("more than {MAX_STATUSES} services")));
        }
        let total: usize = self.services.iter().map(|s| s.lines.len()).sum();
        if total > crate::logs::MAX_UPLOAD_LINES {
            return Err(ValidationError::new("lines", format!("more than {} lines", crate::logs::MAX_UPLOAD_LINES)));
        }
        for service in &self.services {
            name(&service.service)?;
            for line in &service.lines {
                validate::bounded_text("lines.ts", &line.ts, 64)?;
                if !matches!(line.stream.as_str(), "stdout" | "stderr") {
                    return Err(ValidationError::new("lines.stream", "must be stdout or stderr"));
                }
                if line.line.len() > crate::misc::MAX_LOG_LINE {
                    return Err(ValidationError::new("lines.line", "longer than 16 KiB"));
                }
            }
        }
        Ok(())
    }
}

/// Most services one node reports.
pub const MAX_STATUSES: usize = 200;

pub const STATES: [&str; 6] = ["starting", "healthy", "degraded", "restarting", "unhealthy", "failed"];

impl ServiceStatus {
    pub fn validate(&self) -> Result<(), ValidationError> {
        name(&self.service)?;
        if !STATES.contains(&self.state.as_str()) {
            return Err(ValidationError::new("health.services.state", "unknown state"));
        }
        if let Some(address) = &self.address {
            address.parse::<std::net::SocketAddr>().map_err(|_| ValidationError::new("health.services.address", "must be ip:port"))?;
        }
        if let Some(detail) = &self.detail {
            validate::bounded_text("health.services.detail", detail, 512)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn payload() -> ServicePayload {
        ServicePayload {
            service: "db".into(),
            kind: ServiceKind::Postgres,
            image: "postgres:16".into(),
            env: BTreeMap::from([("POSTGRES_PASSWORD".into(), "x".into())]),
            command: vec![],
            volume: "svc-db".into(),
            host_port: 20000,
            memory_bytes: None,
            health: vec!["pg_isready".into()],
            generation: 1,
            set_password: Some(ServiceExec { cmd: vec!["psql".into()], env: BTreeMap::new(), stdin: "ALTER USER app PASSWORD 'x';".into() }),
        }
    }

    #[test]
    fn payloads_are_checked() {
        payload().validate().unwrap();
        let mut bad = payload();
        bad.image = "--privileged".into();
        assert!(bad.validate().is_err());
        let mut bad = payload();
        bad.host_port = 22;
        assert!(bad.validate().is_err());
        let mut bad = payload();
        bad.health.clear();
        assert!(bad.validate().is_err());
        let mut bad = payload();
        bad.service = "Db".into();
        assert!(bad.validate().is_err());
        let mut bad = payload();
        bad.set_password.as_mut().unwrap().cmd.clear();
        assert!(bad.validate().is_err());
        let mut bad = payload();
        bad.set_password.as_mut().unwrap().stdin = "x".repeat(MAX_EXEC_STDIN + 1);
        assert!(bad.validate().is_err());
        // An older control plane's payload has none.
        let mut old = serde_json::to_value(payload()).unwrap();
        old.as_object_mut().unwrap().remove("set_password");
        assert_eq!(serde_json::from_value::<ServicePayload>(old).unwrap().set_password, None);
        assert_eq!(ServiceKind::parse("mariadb"), Some(ServiceKind::Mariadb));
        assert_eq!(ServiceKind::parse("mysql"), None);
        let json = serde_json::to_value(payload()).unwrap();
        assert_eq!(json["kind"], "postgres");
    }

    #[test]
    fn service_log_uploads_are_checked() {
        let line = |stream: &str| crate::LogLine { ts: "2026-12-01T10:00:00.000000001Z".into(), stream: stream.into(), line: "ready".into() };
        let ok = ServiceLogUpload { services: vec![ServiceLogs { service: "db".into(), dropped: 0, lines: vec![line("stdout"), line("stderr")] }] };
        ok.validate().unwrap();
        let mut bad = ok.clone();
        bad.services[0].service = "Db".into();
        assert!(bad.validate().is_err());
        let mut bad = ok.clone();
        bad.services[0].lines.push(line("agent"));
        assert!(bad.validate().is_err());
        let mut bad = ok;
        bad.services[0].lines = vec![line("stdout"); crate::logs::MAX_UPLOAD_LINES + 1];
        assert!(bad.validate().is_err());
    }

    #[test]
    fn statuses_are_checked() {
        let status = ServiceStatus { service: "db".into(), generation: 1, state: "healthy".into(), address: Some("10.77.0.2:20000".into()), detail: None, restarts: 0 };
        status.validate().unwrap();
        let mut bad = status.clone();
        bad.state = "great".into();
        assert!(bad.validate().is_err());
        let mut bad = status;
        bad.address = Some("db:1".into());
        assert!(bad.validate().is_err());
    }
}
