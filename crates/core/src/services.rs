//! Managed services in the domain: create one (a node, a host port, a data
//! volume, generated credentials sealed at rest, the node's `service_run`
//! command), delete one (its container goes, its data stays unless the
//! volume is deleted by name), link apps to it (their next deploy gets its
//! connection URL), and read how it is doing from its node's heartbeats.

use std::collections::BTreeMap;

use cloudweb_protocol::services::{self, ServiceExec, ServiceKind, ServicePayload, ServiceRemovePayload};
use cloudweb_protocol::CommandKind;
use rand::Rng;

use crate::deploy::scheduler::{self, Placement, Request};
use crate::error::ApiError;
use crate::service_links::{kind_of, secret, secret_context, ServiceSecret, DATABASE, USER};
use crate::store::{LinkRefusal, NewCommand, ServiceLinkRow, ServiceRefusal, ServiceRow};

pub use crate::service_links::{link_env, status, url};
use crate::AppState;

/// The images services run unless the operator names others
/// (`--service-image kind=image`, for mirrors and air-gapped sites).
pub fn default_image(kind: ServiceKind) -> &'static str {
    match kind {
        ServiceKind::Postgres => "postgres:16",
        ServiceKind::Redis => "valkey/valkey:8",
        ServiceKind::Mariadb => "mariadb:11",
    }
}

/// The operator's service images, by kind.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServiceImages(pub BTreeMap<String, String>);

impl ServiceImages {
    /// Parses `kind=image` (from `--service-image`).
    pub fn add(&mut self, text: &str) -> Result<(), String> {
        let (kind, image) = text.split_once('=').ok_or_else(|| format!("--service-image {text:?}: expected KIND=IMAGE"))?;
        let kind = ServiceKind::parse(kind).ok_or_else(|| format!("--service-image: unknown kind {kind:?} (postgres, redis, mariadb)"))?;
        if image.is_empty() || image.starts_with('-') || image.contains(char::is_whitespace) || image.len() > 512 {
            return Err(format!("--service-image {text:?}: not an image reference"));
        }
        self.0.insert(kind.as_str().to_string(), image.to_string());
        Ok(())
    }

    /// The image for a kind and (optional) version: the official one with
    /// the version as its tag; the operator's repository with the version
    /// as its tag when it names one without a tag; the operator's image as
    /// given when it names a tag (or a digest): see [`Self::pinned`].
    pub fn image(&self, kind: ServiceKind, version: Option<&str>) -> String {
        let base = self.0.get(kind.as_str()).map(String::as_str).unwrap_or(default_image(kind));
        if self.pinned(kind).is_some() {
            return base.to_string();
        }
        match version {
            Some(version) => format!("{}:{version}", repository(base)),
            None => base.to_string(),
        }
    }

    /// The operator's image for a kind when it fixes the version (a tag or
    /// a digest): every service of the kind runs exactly that image.
    pub fn pinned(&self, kind: ServiceKind) -> Option<&str> {
        self.0.get(kind.as_str()).map(String::as_str).filter(|image| tag(image).is_some() || image.contains('@'))
    }
}

/// An image reference's tag (`postgres:16` → `16`; a registry's port is no tag).
pub fn tag(image: &str) -> Option<&str> {
    let name = image.split('@').next().unwrap_or(image);
    let last = name.rsplit('/').next().unwrap_or(name);
    last.split_once(':').map(|(_, tag)| tag)
}

/// An image reference without its tag.
fn repository(image: &str) -> &str {
    match tag(image) {
        Some(tag) => &image[..image.len() - tag.len() - 1],
        None => image,
    }
}

pub(crate) fn password() -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    let mut rng = rand::rng();
    (0..32).map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())] as char).collect()
}

/// The variable a linked app gets unless the link names another.
pub fn default_variable(kind: ServiceKind) -> &'static str {
    match kind {
        ServiceKind::Postgres | ServiceKind::Mariadb => "DATABASE_URL",
        ServiceKind::Redis => "REDIS_URL",
    }
}

/// Which versions a kind takes: digits and dots (`16`, `7.2`), at most 16.
pub fn check_version(version: &str) -> Result<(), ApiError> {
    if version.is_empty() || version.len() > 16 || !version.bytes().all(|b| b.is_ascii_digit() || b == b'.') || version.starts_with('.') {
        return Err(ApiError::BadRequest("version must be digits and dots, like 16 or 7.2".into()));
    }
    Ok(())
}

/// The `service_run` payload of a service.
pub fn payload(state: &AppState, service: &ServiceRow) -> Result<ServicePayload, ApiError> {
    let kind = kind_of(service)?;
    let secret = secret(state, service)?;
    let mut env = BTreeMap::new();
    let mut command = Vec::new();
    let mut set_password = None;
    let health: Vec<String> = match kind {
        ServiceKind::Postgres => {
            env.insert("POSTGRES_PASSWORD".to_string(), secret.password.clone());
            env.insert("POSTGRES_USER".to_string(), USER.to_string());
            env.insert("POSTGRES_DB".to_string(), DATABASE.to_string());
            env.insert("PGDATA".to_string(), kind.data_path().to_string());
            // Over the container's unix socket, which trusts local users
            // (the official image's `--auth-local=trust`).
            set_password = Some(ServiceExec {
                cmd: ["psql", "-v", "ON_ERROR_STOP=1", "--no-psqlrc", "--quiet", "-U", USER, "-d", DATABASE].map(String::from).to_vec(),
                env: BTreeMap::new(),
                stdin: format!("ALTER USER {USER} PASSWORD '{}';\n", sql_string(&secret.password)),
            });
            ["pg_isready", "-h", "127.0.0.1", "-p", "5432", "-U", USER, "-d", DATABASE].map(String::from).to_vec()
        }
        ServiceKind::Redis => {
            // redis-cli reads its password from REDISCLI_AUTH (the probe
            // inherits the container's environment).
            env.insert("REDISCLI_AUTH".to_string(), secret.password.clone());
            command = ["redis-server", "--requirepass", &secret.password, "--appendonly", "yes", "--dir", "/data", "--bind", "0.0.0.0", "--protected-mode", "no"]
                .map(String::from)
                .to_vec();
            // redis-cli exits 0 on an error reply too (NOAUTH): the probe
            // holds only when the answer is PONG.
            ["sh", "-c", "[ \"$(redis-cli -h 127.0.0.1 ping)\" = PONG ]"].map(String::from).to_vec()
        }
        ServiceKind::Mariadb => {
            env.insert("MARIADB_ROOT_PASSWORD".to_string(), secret.root_password.clone().unwrap_or_else(|| secret.password.clone()));
            env.insert("MARIADB_USER".to_string(), USER.to_string());
            env.insert("MARIADB_PASSWORD".to_string(), secret.password.clone());
            env.insert("MARIADB_DATABASE".to_string(), DATABASE.to_string());
            // A newer MariaDB on older data upgrades its system tables
            // (`mariadb-upgrade`) when it starts: `services upgrade`.
            env.insert("MARIADB_AUTO_UPGRADE".to_string(), "1".to_string());
            // As root over the socket, root's password in the exec's
            // environment (MYSQL_PWD), the new one on standard input.
            let root = secret.root_password.clone().unwrap_or_else(|| secret.password.clone());
            set_password = Some(ServiceExec {
                cmd: ["mariadb", "--protocol=socket", "-uroot", "--batch"].map(String::from).to_vec(),
                env: BTreeMap::from([("MYSQL_PWD".to_string(), root)]),
                stdin: format!("ALTER USER '{USER}'@'%' IDENTIFIED BY '{}';\n", mariadb_string(&secret.password)),
            });
            ["mariadb-admin", "ping", "-h", "127.0.0.1", "--silent"].map(String::from).to_vec()
        }
    };
    Ok(ServicePayload {
        service: service.name.clone(),
        kind,
        image: service.image.clone(),
        env,
        command,
        volume: service.volume.clone(),
        host_port: u16::try_from(service.host_port).map_err(|_| ApiError::Internal("service port out of range".into()))?,
        memory_bytes: service.memory_bytes.map(|m| m.max(0) as u64),
        health,
        generation: service.generation.max(0) as u64,
        set_password,
    })
}

/// A string for inside single quotes in PostgreSQL's SQL (standard
/// strings: a backslash is itself). Generated passwords are letters and
/// digits; the escaping is for safety.
fn sql_string(text: &str) -> String {
    text.replace('\'', "''")
}

/// The same for MariaDB, where a backslash escapes.
fn mariadb_string(text: &str) -> String {
    text.replace('\\', "\\\\").replace('\'', "''")
}

/// What a user asks for.
#[derive(Debug, Clone)]
pub struct NewService {
    pub name: String,
    pub kind: ServiceKind,
    pub version: Option<String>,
    pub node: Option<String>,
    pub memory_bytes: Option<u64>,
    /// The team that owns it.
    pub team_id: String,
}

/// The volume that holds a service's data.
pub fn volume_name(service: &str) -> String {
    // Names are at most 63 characters; a service's volume is `svc-<name>`
    // cut to fit (the volume table refuses a clash).
    let mut name = format!("svc-{service}");
    name.truncate(63);
    name.trim_end_matches('-').to_string()
}

/// Creates a service and sends it to its node.
pub async fn create(state: &AppState, new: NewService) -> Result<ServiceRow, ApiError> {
    services::name(&new.name)?;
    // The name an unfinished major upgrade restores into is its own: a
    // service made under it would be taken for the upgrade's, and its data
    // replaced by the restore.
    if let Some(upgrade) = state.store.unfinished_upgrade_of(&new.name).await?.filter(|u| u.to_service == new.name) {
        return Err(ApiError::Conflict(format!(
            "{} is the name of the new service the unfinished upgrade {} of {} restores into; choose another, or cancel that upgrade first (cloudweb services cancel-upgrade {})",
            new.name, upgrade.id, upgrade.service, upgrade.service
        )));
    }
    create_unreserved(state, new).await
}

/// [`create`] without the check that the name is not an unfinished
/// upgrade's new service: for that upgrade's own restore.
pub(crate) async fn create_unreserved(state: &AppState, new: NewService) -> Result<ServiceRow, ApiError> {
    services::name(&new.name)?;
    if let Some(version) = &new.version {
        check_version(version)?;
    }
    if let Some(memory) = new.memory_bytes {
        if !(64 << 20..=1 << 40).contains(&memory) {
            return Err(ApiError::BadRequest("memory must be 64 MiB to 1 TiB".into()));
        }
    }
    // Placement: the node named, or the scheduler's choice among nodes
    // that run services.
    let nodes = crate::deploy::snapshot(state).await?;
    let request = Request {
        cpu: 0.25,
        mem_bytes: new.memory_bytes.unwrap_or(256 << 20),
        features: vec![cloudweb_protocol::features::SERVICES.to_string(), cloudweb_protocol::features::VOLUMES.to_string()],
        avoid: Vec::new(),
        pin: None,
        spread: Vec::new(),
    };
    let node_id = match &new.node {
        Some(wanted) => {
            let node = nodes
                .iter()
                .find(|n| n.id == *wanted || n.name == *wanted)
                .ok_or_else(|| ApiError::NotFound(format!("no node named {wanted}")))?;
            let only = Request { pin: Some(crate::volumes::Pin { node: node.id.clone(), volume: volume_name(&new.name) }), ..request };
            match scheduler::place(std::slice::from_ref(node), &only) {
                Placement::Node(id) => id,
                Placement::Nowhere(reason) => return Err(ApiError::Conflict(format!("node {wanted} cannot take the service: {reason}"))),
            }
        }
        None => match scheduler::place(&nodes, &request) {
            Placement::Node(id) => id,
            Placement::Nowhere(reason) => return Err(ApiError::Conflict(reason)),
        },
    };
    let secret = ServiceSecret { password: password(), root_password: (new.kind == ServiceKind::Mariadb).then(password) };
    let now = state.clock.now_ms();
    let row = ServiceRow {
        name: new.name.clone(),
        kind: new.kind.as_str().to_string(),
        version: new.version.clone(),
        image: state.config.service_images.image(new.kind, new.version.as_deref()),
        node_id: node_id.clone(),
        host_port: 0,
        memory_bytes: new.memory_bytes.map(|m| m as i64),
        volume: volume_name(&new.name),
        secret_sealed: state.sealer.seal_json(&secret_context(&new.name), &secret),
        generation: 1,
        created_at: now,
        previous_secret_sealed: None,
        rotation_started_at: None,
        team_id: new.team_id.clone(),
    };
    // The payload needs the port the store picks, inside its transaction.
    let mut failure = None;
    let inserted = state
        .store
        .insert_service(
            &row,
            state.config.service_ports.clone(),
            |port| {
                let with_port = ServiceRow { host_port: port, ..row.clone() };
                let value = match payload(state, &with_port) {
                    Ok(p) => serde_json::to_value(p).expect("payload serializes"),
                    Err(err) => {
                        failure = Some(err);
                        serde_json::Value::Null
                    }
                };
                NewCommand {
                    node_id: node_id.clone(),
                    kind: CommandKind::ServiceRun.as_str().to_string(),
                    payload: state.sealer.seal_json(&crate::command_context(&node_id), &value),
                }
            },
            now,
        )
        .await?;
    if let Some(err) = failure {
        return Err(err);
    }
    match inserted {
        Ok(service) => {
            state.hub.notify(&node_id, cloudweb_protocol::events::COMMANDS);
            tracing::info!(service = %service.name, kind = %service.kind, node_id = %node_id, port = service.host_port, image = %service.image, "service created");
            Ok(service)
        }
        Err(ServiceRefusal::NameTaken) => Err(ApiError::Conflict(format!("a service named {} exists already", new.name))),
        Err(ServiceRefusal::NoPort) => Err(ApiError::Conflict(format!(
            "every port of the service range ({}-{}) is taken on that node",
            state.config.service_ports.start(),
            state.config.service_ports.end()
        ))),
        Err(ServiceRefusal::VolumeTaken) => Err(ApiError::Conflict(format!("a volume named {} exists already", volume_name(&new.name)))),
    }
}

/// Where a service's output lines are kept in [`crate::runtime_logs`]
/// (beside the apps' rings: no app name holds a colon).
pub fn logs_key(service: &str) -> String {
    format!("service:{service}")
}

/// Deletes a service: its node removes the container; its volume stays,
/// detached, with the data (returned so the caller can delete it when the
/// user asked for that).
pub async fn delete(state: &AppState, name: &str) -> Result<ServiceRow, ApiError> {
    let upgrading = |upgrade: &str| {
        ApiError::Conflict(format!(
            "the major version upgrade {upgrade} goes from or into service {name} and is unfinished: cancel it first (cloudweb services cancel-upgrade), or let it end"
        ))
    };
    // The more telling refusal first: an upgrade keeps its links until it
    // moves them.
    if let Some(upgrade) = state.store.unfinished_upgrade_of(name).await? {
        return Err(upgrading(&upgrade.id));
    }
    let links = state.store.service_links(name).await?;
    if !links.is_empty() {
        let apps: Vec<&str> = links.iter().map(|l| l.app.as_str()).collect();
        return Err(ApiError::Conflict(format!("apps are linked to service {name} ({}); unlink them first", apps.join(", "))));
    }
    let now = state.clock.now_ms();
    let deleted = state
        .store
        .delete_service(
            name,
            |service| {
                let value = serde_json::to_value(ServiceRemovePayload { service: service.name.clone() }).expect("payload serializes");
                NewCommand {
                    node_id: service.node_id.clone(),
                    kind: CommandKind::ServiceRemove.as_str().to_string(),
                    payload: state.sealer.seal_json(&crate::command_context(&service.node_id), &value),
                }
            },
            now,
        )
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("no service named {name}")))?
        .map_err(|upgrade| upgrading(&upgrade))?;
    state.hub.notify(&deleted.node_id, cloudweb_protocol::events::COMMANDS);
    state.runtime_logs.forget(&logs_key(&deleted.name));
    tracing::info!(service = %deleted.name, volume = %deleted.volume, "service deleted; its volume stays unless deleted by name");
    Ok(deleted)
}

/// Links an app to a service under `variable` (the kind's default when
/// `None`), from the app's next deploy on.
pub async fn link(state: &AppState, service: &str, app: &str, variable: Option<&str>) -> Result<ServiceLinkRow, ApiError> {
    let row = state.store.service(service).await?.ok_or_else(|| ApiError::NotFound(format!("no service named {service}")))?;
    let variable = variable.unwrap_or(default_variable(kind_of(&row)?)).to_string();
    cloudweb_protocol::deploy::env_name(&variable)?;
    // A link writes the service's credentials into the app: both must be
    // one team's.
    if state.store.team_of(crate::store::Owned::App, app).await?.is_some_and(|team| team != row.team_id) {
        return Err(ApiError::NotFound(format!("no app named {app} in the team of service {service}")));
    }
    match state.store.link_service(service, app, &variable, state.clock.now_ms()).await? {
        Ok(link) => {
            tracing::info!(service, app, variable = %link.variable, "service linked; the app's next deploy gets it");
            Ok(link)
        }
        Err(LinkRefusal::NoSuchService) => Err(ApiError::NotFound(format!("no service named {service}"))),
        Err(LinkRefusal::NoSuchApp) => Err(ApiError::NotFound(format!("no app named {app}"))),
        Err(LinkRefusal::VariableTaken(other)) => Err(ApiError::Conflict(format!("app {app} gets {variable} from service {other} already"))),
    }
}

pub async fn unlink(state: &AppState, service: &str, app: &str) -> Result<(), ApiError> {
    if !state.store.unlink_service(service, app).await? {
        return Err(ApiError::NotFound(format!("app {app} is not linked to service {service}")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn images_default_to_the_official_ones_and_the_operator_can_name_others() {
        let mut images = ServiceImages::default();
        assert_eq!(images.image(ServiceKind::Postgres, None), "postgres:16");
        assert_eq!(images.image(ServiceKind::Postgres, Some("15")), "postgres:15");
        assert_eq!(images.image(ServiceKind::Redis, None), "valkey/valkey:8");
        images.add("postgres=mirror.example.com/postgres:16").unwrap();
        assert_eq!(images.image(ServiceKind::Postgres, Some("15")), "mirror.example.com/postgres:16");
        assert_eq!(images.pinned(ServiceKind::Postgres), Some("mirror.example.com/postgres:16"));
        // A repository without a tag: the version is its tag.
        images.add("redis=mirror.example.com:5000/valkey").unwrap();
        assert_eq!(images.pinned(ServiceKind::Redis), None);
        assert_eq!(images.image(ServiceKind::Redis, Some("8.1")), "mirror.example.com:5000/valkey:8.1");
        assert_eq!(images.image(ServiceKind::Redis, None), "mirror.example.com:5000/valkey");
        images.add("mariadb=mirror.example.com/mariadb@sha256:abc").unwrap();
        assert!(images.pinned(ServiceKind::Mariadb).is_some());
        assert_eq!(tag("localhost:5000/pg"), None);
        assert_eq!(tag("localhost:5000/pg:15.4"), Some("15.4"));
        assert!(images.add("mysql=x").is_err());
        assert!(images.add("postgres").is_err());
        assert!(images.add("postgres=--privileged").is_err());
    }

    #[test]
    fn versions_and_volume_names() {
        check_version("16").unwrap();
        check_version("7.2").unwrap();
        for bad in ["", "latest", "16;", ".1", "12345678901234567"] {
            assert!(check_version(bad).is_err(), "{bad}");
        }
        assert_eq!(volume_name("db"), "svc-db");
        assert_eq!(volume_name(&"a".repeat(63)).len(), 63);
    }
}
