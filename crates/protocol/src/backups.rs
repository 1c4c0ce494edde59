//! Backups on the wire: the jobs the control plane gives the node that
//! holds a volume's or a service's data, and what the node reports back.
//!
//! The engine is restic; a job names a restic repository ([`Repository`])
//! and the agent runs restic itself, on the node, against it.
//!
//! - `backup_run` ([`BackupJobPayload`]): snapshot a volume's directory
//!   (optionally with its containers paused) or a service's logical dump
//!   (PostgreSQL `pg_dump -Fc`, MariaDB `mariadb-dump --single-transaction`,
//!   Redis `BGSAVE` then its RDB file) into the repository, then apply the
//!   destination's retention (`forget --prune`), only after a success.
//! - `backup_verify` ([`VerifyPayload`]): restore a snapshot into a
//!   throwaway place (a temporary directory, for a service a throwaway
//!   container of its image) and check it: row counts per table, key count,
//!   or file count and size, plus `restic check --read-data-subset`.
//! - `backup_restore` ([`RestorePayload`]): restore a snapshot into a new
//!   volume directory on this node; with `replace`, swap it in for an
//!   existing volume (its containers stopped for the swap), keeping the old
//!   data under another volume name.
//! - `backup_cancel` ([`BackupCancelPayload`]): stop a job this node runs.
//!
//! Every outcome goes to `POST /agent/v1/backup-jobs/{job_id}`
//! ([`BackupJobReport`]); the commands are acked once handled.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::services::{ServiceKind, ServicePayload};
use crate::validate::{self, ValidationError};

/// A job's id as the control plane makes them: `bj_` and 16 hex digits.
pub fn job_id(value: &str) -> Result<(), ValidationError> {
    let ok = value.strip_prefix("bj_").is_some_and(|hex| hex.len() == 16 && hex.bytes().all(|b| b.is_ascii_hexdigit()));
    if ok {
        Ok(())
    } else {
        Err(ValidationError::new("job_id", "must be bj_ and 16 hex digits"))
    }
}

/// A restic snapshot id: 8 to 64 hex digits (restic takes any unique
/// prefix; it prints 8).
pub fn snapshot_id(value: &str) -> Result<(), ValidationError> {
    if (8..=64).contains(&value.len()) && value.bytes().all(|b| b.is_ascii_hexdigit()) {
        Ok(())
    } else {
        Err(ValidationError::new("snapshot", "must be a restic snapshot id (8 to 64 hex digits)"))
    }
}

/// The environment variables a repository may set for restic: the S3
/// credentials and region, nothing that changes what restic runs.
pub const REPOSITORY_ENV: [&str; 3] = ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION"];

/// A restic repository and how to open it. `Debug` never shows the
/// password or the credentials.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Repository {
    /// `s3:http(s)://host[:port]/bucket[/prefix]` or an absolute path.
    pub url: String,
    pub password: String,
    /// Only names of [`REPOSITORY_ENV`].
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
}

impl std::fmt::Debug for Repository {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Repository")
            .field("url", &self.url)
            .field("password", &"[redacted]")
            .field("env", &self.env.keys().collect::<Vec<_>>())
            .finish()
    }
}

/// Whether `value` is a repository URL cloud-web accepts: an S3 one or an
/// absolute path of plain components.
pub fn repository_url(value: &str) -> Result<(), ValidationError> {
    const FIELD: &str = "repository";
    validate::bounded_text(FIELD, value, 1024)?;
    if value.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return Err(ValidationError::new(FIELD, "must not contain spaces or control characters"));
    }
    if let Some(rest) = value.strip_prefix("s3:") {
        let Some(after) = rest.strip_prefix("https://").or_else(|| rest.strip_prefix("http://")) else {
            return Err(ValidationError::new(FIELD, "an S3 repository is s3:http(s)://host/bucket[/prefix]"));
        };
        let mut parts = after.splitn(2, '/');
        let host = parts.next().unwrap_or_default();
        let path = parts.next().unwrap_or_default();
        if host.is_empty() || path.is_empty() || path.split('/').next().is_none_or(str::is_empty) {
            return Err(ValidationError::new(FIELD, "an S3 repository names a host and a bucket"));
        }
        if path.split('/').any(|p| p == ".." || p == ".") {
            return Err(ValidationError::new(FIELD, "must not contain '.' or '..' components"));
        }
        return Ok(());
    }
    let Some(rest) = value.strip_prefix('/') else {
        return Err(ValidationError::new(FIELD, "must be s3:http(s)://host/bucket[/prefix] or an absolute path"));
    };
    if rest.is_empty() || rest.split('/').any(|p| p.is_empty() || p == "." || p == "..") {
        return Err(ValidationError::new(FIELD, "a path repository must be an absolute path of plain components, not /"));
    }
    Ok(())
}

impl Repository {
    pub fn validate(&self) -> Result<(), ValidationError> {
        repository_url(&self.url)?;
        if !(16..=256).contains(&self.password.len()) || self.password.chars().any(char::is_control) {
            return Err(ValidationError::new("repository.password", "must be 16 to 256 characters, no control characters"));
        }
        for (key, value) in &self.env {
            if !REPOSITORY_ENV.contains(&key.as_str()) {
                return Err(ValidationError::new("repository.env", format!("{key} is not a repository setting")));
            }
            if value.is_empty() || value.len() > 1024 || value.chars().any(char::is_control) {
                return Err(ValidationError::new("repository.env", format!("{key} must be 1 to 1024 characters, no control characters")));
            }
        }
        Ok(())
    }
}

/// What a job backs up or restores.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum BackupSource {
    /// A volume's directory, file by file.
    Volume {
        volume: String,
        /// Pause the containers that mount it for the snapshot (else the
        /// copy is crash-consistent).
        #[serde(default)]
        pause: bool,
    },
    /// A managed service's logical dump, made inside its container.
    Service {
        service: String,
        service_kind: ServiceKind,
        /// The volume that holds its data.
        volume: String,
        /// The database user and database the dump is made as and of
        /// (PostgreSQL and MariaDB).
        user: String,
        database: String,
    },
}

impl BackupSource {
    pub fn validate(&self) -> Result<(), ValidationError> {
        match self {
            BackupSource::Volume { volume, .. } => crate::volumes::name(volume),
            BackupSource::Service { service, volume, user, database, .. } => {
                validate::node_name("service", service)?;
                crate::volumes::name(volume)?;
                identifier("user", user)?;
                identifier("database", database)
            }
        }
    }

    /// The volume whose data this is.
    pub fn volume(&self) -> &str {
        match self {
            BackupSource::Volume { volume, .. } | BackupSource::Service { volume, .. } => volume,
        }
    }

    /// The tag every snapshot of this source carries: `target=volume/NAME`
    /// or `target=service/NAME`, what retention groups by.
    pub fn target_tag(&self) -> String {
        match self {
            BackupSource::Volume { volume, .. } => format!("target=volume/{volume}"),
            BackupSource::Service { service, .. } => format!("target=service/{service}"),
        }
    }

    /// The file name a service's dump has inside its snapshot.
    pub fn dump_file(&self) -> Option<&'static str> {
        match self {
            BackupSource::Volume { .. } => None,
            BackupSource::Service { service_kind: ServiceKind::Postgres, .. } => Some("dump.pgdump"),
            BackupSource::Service { service_kind: ServiceKind::Mariadb, .. } => Some("dump.sql"),
            BackupSource::Service { service_kind: ServiceKind::Redis, .. } => Some("dump.rdb"),
        }
    }
}

/// A database user or database name: 1 to 63 of `[a-z0-9_]`, starting with
/// a letter (what cloud-web creates; safe unquoted in SQL).
fn identifier(field: &str, value: &str) -> Result<(), ValidationError> {
    let ok = (1..=63).contains(&value.len())
        && value.bytes().next().is_some_and(|b| b.is_ascii_lowercase())
        && value.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
    if ok {
        Ok(())
    } else {
        Err(ValidationError::new(field, "must be 1 to 63 of a-z, 0-9 or _, starting with a letter"))
    }
}

/// `forget --prune` after a successful backup, within the source's tag.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema))]
pub struct Retention {
    pub keep_daily: u32,
    pub keep_weekly: u32,
    pub keep_monthly: u32,
}

impl Retention {
    pub const DEFAULT: Retention = Retention { keep_daily: 7, keep_weekly: 4, keep_monthly: 6 };

    pub fn validate(&self) -> Result<(), ValidationError> {
        if self.keep_daily + self.keep_weekly + self.keep_monthly == 0 {
            return Err(ValidationError::new("retention", "must keep at least one snapshot"));
        }
        if self.keep_daily > 3650 || self.keep_weekly > 520 || self.keep_monthly > 1200 {
            return Err(ValidationError::new("retention", "keep at most 3650 daily, 520 weekly and 1200 monthly snapshots"));
        }
        Ok(())
    }
}

/// Secrets a service job runs its tools with (`PGPASSWORD`, `MYSQL_PWD`,
/// `REDISCLI_AUTH`): given to `docker exec` as environment, never on a
/// command line.
pub const EXEC_ENV: [&str; 3] = ["PGPASSWORD", "MYSQL_PWD", "REDISCLI_AUTH"];

fn exec_env(env: &BTreeMap<String, String>) -> Result<(), ValidationError> {
    for (key, value) in env {
        if !EXEC_ENV.contains(&key.as_str()) {
            return Err(ValidationError::new("exec_env", format!("{key} is not a database password variable")));
        }
        if value.len() > 256 || value.chars().any(char::is_control) {
            return Err(ValidationError::new("exec_env", format!("{key} must be at most 256 characters, no control characters")));
        }
    }
    Ok(())
}

fn timeout(seconds: u32) -> Result<(), ValidationError> {
    if (10..=86_400).contains(&seconds) {
        Ok(())
    } else {
        Err(ValidationError::new("timeout_seconds", "must be 10 to 86400"))
    }
}

/// Tags every snapshot carries besides the target's: `cloudweb`, and
/// `job=<id>` so a report lost in transit can be found again.
fn tags(tags: &[String]) -> Result<(), ValidationError> {
    if tags.len() > 8 {
        return Err(ValidationError::new("tags", "at most 8"));
    }
    for tag in tags {
        let ok = (1..=128).contains(&tag.len()) && tag.bytes().all(|b| b.is_ascii_alphanumeric() || b"=/_.-:".contains(&b));
        if !ok {
            return Err(ValidationError::new("tags", "each tag is 1 to 128 of A-Z, a-z, 0-9 or =/_.-:"));
        }
    }
    Ok(())
}

/// Payload of `backup_run`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackupJobPayload {
    pub job_id: String,
    pub source: BackupSource,
    pub repository: Repository,
    /// Extra tags; the agent adds the target's and the job's.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tags: Vec<String>,
    /// Applied after a success only; a failed backup never prunes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retention: Option<Retention>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub exec_env: BTreeMap<String, String>,
    pub timeout_seconds: u32,
}

impl BackupJobPayload {
    pub fn validate(&self) -> Result<(), ValidationError> {
        job_id(&self.job_id)?;
        self.source.validate()?;
        self.repository.validate()?;
        tags(&self.tags)?;
        if let Some(retention) = &self.retention {
            retention.validate()?;
        }
        exec_env(&self.exec_env)?;
        timeout(self.timeout_seconds)
    }
}

/// What the backup held, to check a restored copy against.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Expected {
    pub files: u64,
    pub bytes: u64,
}

/// Payload of `backup_verify`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VerifyPayload {
    pub job_id: String,
    pub snapshot: String,
    pub source: BackupSource,
    pub repository: Repository,
    /// The service's image, run as the throwaway container that loads the
    /// dump (services only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// What the backup reported when it was made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected: Option<Expected>,
    /// The share of the repository's pack files `restic check` reads
    /// (1 to 100).
    pub read_data_percent: u8,
    pub timeout_seconds: u32,
}

impl VerifyPayload {
    pub fn validate(&self) -> Result<(), ValidationError> {
        job_id(&self.job_id)?;
        snapshot_id(&self.snapshot)?;
        self.source.validate()?;
        self.repository.validate()?;
        if let Some(image) = &self.image {
            validate::bounded_text("image", image, 512)?;
        }
        if !(1..=100).contains(&self.read_data_percent) {
            return Err(ValidationError::new("read_data_percent", "must be 1 to 100"));
        }
        timeout(self.timeout_seconds)
    }
}

/// How a restore replaces an existing volume on this node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Replace {
    /// The volume whose data is replaced.
    pub volume: String,
    /// The name its previous data is kept under
    /// (`<volume>-before-restore-<time>`): a volume of its own on this
    /// node, deleted only on request.
    pub keep_as: String,
}

/// Payload of `backup_restore`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RestorePayload {
    pub job_id: String,
    pub snapshot: String,
    /// What the snapshot is of.
    pub source: BackupSource,
    pub repository: Repository,
    /// The volume the data is restored into: a new directory on this node
    /// (with `replace`, it ends up under `replace.volume`'s name).
    pub into_volume: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replace: Option<Replace>,
    /// For a service: the spec of the service that will run on the
    /// restored data. Its image, environment and command initialize the
    /// data in a throwaway container before the dump is loaded (so the
    /// restored database takes this spec's credentials).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<ServicePayload>,
    pub timeout_seconds: u32,
}

impl RestorePayload {
    pub fn validate(&self) -> Result<(), ValidationError> {
        job_id(&self.job_id)?;
        snapshot_id(&self.snapshot)?;
        self.source.validate()?;
        self.repository.validate()?;
        crate::volumes::name(&self.into_volume)?;
        if let Some(replace) = &self.replace {
            crate::volumes::name(&replace.volume)?;
            crate::volumes::name(&replace.keep_as)?;
            if replace.volume == replace.keep_as || replace.keep_as == self.into_volume {
                return Err(ValidationError::new("replace.keep_as", "must differ from the volume and from into_volume"));
            }
        }
        match (&self.source, &self.service) {
            (BackupSource::Service { service_kind, .. }, Some(spec)) => {
                spec.validate()?;
                if spec.kind != *service_kind {
                    return Err(ValidationError::new("service.kind", "must be the kind the snapshot was made of"));
                }
            }
            (BackupSource::Service { .. }, None) => return Err(ValidationError::new("service", "a service restore names the service's spec")),
            (BackupSource::Volume { .. }, Some(_)) => return Err(ValidationError::new("service", "a volume restore names no service")),
            (BackupSource::Volume { .. }, None) => {}
        }
        timeout(self.timeout_seconds)
    }
}

/// Payload of `backup_cancel`: stop this job if this node runs it; a
/// cancelled restore leaves the data it would have replaced in place.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackupCancelPayload {
    pub job_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl BackupCancelPayload {
    pub fn validate(&self) -> Result<(), ValidationError> {
        job_id(&self.job_id)?;
        if let Some(reason) = &self.reason {
            validate::bounded_text("reason", reason, 512)?;
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobState {
    /// The node started the job.
    Running,
    Succeeded,
    Failed,
    /// Stopped by `backup_cancel` (or the agent shutting down).
    Cancelled,
}

impl JobState {
    pub fn is_final(self) -> bool {
        !matches!(self, JobState::Running)
    }
}

/// Body of `POST /agent/v1/backup-jobs/{job_id}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct BackupJobReport {
    pub state: Option<JobState>,
    /// The snapshot a backup made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<String>,
    /// Files in the snapshot (1 for a dump) and their bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub files: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes: Option<u64>,
    /// Bytes the backup added to the repository (after deduplication and
    /// compression).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub added_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<u64>,
    /// Verify: rows per table (PostgreSQL, MariaDB) or `keys` (Redis).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub counts: Option<BTreeMap<String, u64>>,
    /// Verify: what was checked and found, in words.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// A backup's retention ran (`forget --prune`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pruned: Option<bool>,
    /// Why it failed, or a retention failure after a good backup.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// Most entries in a report's `counts`.
pub const MAX_COUNTS: usize = 10_000;

impl BackupJobReport {
    pub fn new(state: JobState) -> BackupJobReport {
        BackupJobReport { state: Some(state), ..BackupJobReport::default() }
    }

    pub fn validate(&self) -> Result<(), ValidationError> {
        if self.state.is_none() {
            return Err(ValidationError::new("state", "is required"));
        }
        if let Some(snapshot) = &self.snapshot {
            snapshot_id(snapshot)?;
        }
        if let Some(counts) = &self.counts {
            if counts.len() > MAX_COUNTS {
                return Err(ValidationError::new("counts", "too many entries"));
            }
            for key in counts.keys() {
                validate::bounded_text("counts", key, 256)?;
            }
        }
        if let Some(detail) = &self.detail {
            validate::bounded_text("detail", detail, crate::misc::MAX_REPORT_MESSAGE)?;
        }
        if let Some(message) = &self.message {
            validate::bounded_text("message", message, crate::misc::MAX_REPORT_MESSAGE)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn repository() -> Repository {
        Repository { url: "s3:http://127.0.0.1:9000/backups/cluster/data".into(), password: "p".repeat(32), env: BTreeMap::new() }
    }

    #[test]
    fn repository_urls_are_s3_or_absolute_paths() {
        for good in ["s3:https://s3.eu-west-1.amazonaws.com/bucket", "s3:http://10.0.0.1:9000/b/prefix/data", "/srv/backups/data"] {
            repository_url(good).unwrap();
        }
        for bad in ["", "/", "relative/path", "/a/../b", "s3:ftp://x/b", "s3:http://host", "s3:http:///bucket", "/a b", "sftp:host:/x", "s3:http://h/b/../c"] {
            assert!(repository_url(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_password_never_shows_in_debug() {
        let mut repo = repository();
        repo.env.insert("AWS_SECRET_ACCESS_KEY".into(), "very-secret-key".into());
        let text = format!("{repo:?}");
        assert!(!text.contains(&repo.password) && !text.contains("very-secret-key"), "{text}");
    }

    #[test]
    fn payloads_are_checked() {
        let source = BackupSource::Service {
            service: "db".into(),
            service_kind: ServiceKind::Postgres,
            volume: "db-data".into(),
            user: "app".into(),
            database: "app".into(),
        };
        let job = BackupJobPayload {
            job_id: "bj_0123456789abcdef".into(),
            source: source.clone(),
            repository: repository(),
            tags: vec!["cloudweb".into()],
            retention: Some(Retention::DEFAULT),
            exec_env: BTreeMap::from([("PGPASSWORD".into(), "x".into())]),
            timeout_seconds: 3600,
        };
        job.validate().unwrap();
        let mut bad = job.clone();
        bad.exec_env.insert("LD_PRELOAD".into(), "/x.so".into());
        assert!(bad.validate().is_err());
        let mut bad = job.clone();
        bad.repository.env.insert("PATH".into(), "/tmp".into());
        assert!(bad.validate().is_err());
        let mut bad = job.clone();
        bad.repository.password = "short".into();
        assert!(bad.validate().is_err());
        assert!(BackupJobPayload { tags: vec!["a,b".into()], ..job.clone() }.validate().is_err());
        assert!(BackupJobPayload { retention: Some(Retention { keep_daily: 0, keep_weekly: 0, keep_monthly: 0 }), ..job.clone() }.validate().is_err());
        let sql = BackupSource::Service {
            service: "db".into(),
            service_kind: ServiceKind::Postgres,
            volume: "db-data".into(),
            user: "app; drop".into(),
            database: "app".into(),
        };
        assert!(sql.validate().is_err());
        assert_eq!(source.target_tag(), "target=service/db");
        let restore = RestorePayload {
            job_id: job.job_id.clone(),
            snapshot: "0123abcd".into(),
            source: BackupSource::Volume { volume: "uploads".into(), pause: false },
            repository: repository(),
            into_volume: "uploads-restore-1".into(),
            replace: Some(Replace { volume: "uploads".into(), keep_as: "uploads-before-restore-20261202".into() }),
            service: None,
            timeout_seconds: 600,
        };
        restore.validate().unwrap();
        assert!(RestorePayload { snapshot: "xyz".into(), ..restore.clone() }.validate().is_err());
        let same = RestorePayload { replace: Some(Replace { volume: "uploads".into(), keep_as: "uploads".into() }), ..restore.clone() };
        assert!(same.validate().is_err());
    }

    #[test]
    fn sources_are_tagged() {
        let text = serde_json::to_string(&BackupSource::Volume { volume: "v".into(), pause: true }).unwrap();
        assert_eq!(text, r#"{"kind":"volume","volume":"v","pause":true}"#);
    }
}
