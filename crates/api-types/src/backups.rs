//! Backups: destinations (with the recovery kit shown once), per-target
//! plans, and the jobs (backups, verifications, restores) of a service or
//! volume.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// `POST /api/backup-destinations`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewDestination {
    /// 1 to 63 lowercase letters, digits or '-'.
    pub name: String,
    /// `s3` (AWS S3, Cloudflare R2, Backblaze B2, MinIO, Garage…) or
    /// `path` (a directory every node and the control plane see at the
    /// same path, such as an NFS mount).
    pub kind: String,
    /// S3: `https://host[:port]` (or `http://` on a private network).
    #[serde(default)]
    pub endpoint: Option<String>,
    #[serde(default)]
    pub bucket: Option<String>,
    /// S3: where in the bucket, e.g. `cloudweb/prod`.
    #[serde(default)]
    pub prefix: Option<String>,
    /// S3: default `us-east-1`.
    #[serde(default)]
    pub region: Option<String>,
    #[serde(default)]
    pub access_key_id: Option<String>,
    /// Sealed at rest; never shown again.
    #[serde(default)]
    pub secret_access_key: Option<String>,
    /// `path`: an absolute directory.
    #[serde(default)]
    pub path: Option<String>,
    /// Retention; defaults 7, 4, 6.
    #[serde(default)]
    pub keep_daily: Option<u32>,
    #[serde(default)]
    pub keep_weekly: Option<u32>,
    #[serde(default)]
    pub keep_monthly: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct DestinationView {
    pub name: String,
    pub kind: String,
    /// The restic repository of volumes and services.
    pub repository: String,
    /// The restic repository of the control plane's own backups.
    pub control_plane_repository: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access_key_id: Option<String>,
    pub keep_daily: u32,
    pub keep_weekly: u32,
    pub keep_monthly: u32,
    /// Whether targets without a destination of their own use this one.
    pub default: bool,
    pub created_at: String,
}

/// Everything needed to restore without cloud-web, given once.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct RecoveryKit {
    pub destination: String,
    pub repository: String,
    pub control_plane_repository: String,
    /// Both repositories' password: the recovery key
    /// (`cloudweb-server restore --recovery-key-file`).
    pub password: String,
    /// Variables restic needs besides the password (their values are the
    /// credentials you gave).
    pub environment: Vec<String>,
    /// The kit as a printable text.
    pub text: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct DestinationCreated {
    pub destination: DestinationView,
    pub recovery_kit: RecoveryKit,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct DestinationList {
    pub destinations: Vec<DestinationView>,
}

/// `PUT /api/{services|volumes}/{name}/backup-plan`: fields left out keep
/// their value; `null` strings go back to the default.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SetBackupPlan {
    #[serde(default)]
    pub destination: Option<String>,
    /// Cron, five fields, UTC (`17 3 * * *`), or `@daily` and the like.
    #[serde(default)]
    pub schedule: Option<String>,
    #[serde(default)]
    pub verify_schedule: Option<String>,
    /// Volumes: pause the containers that mount it for the snapshot.
    #[serde(default)]
    pub pause: Option<bool>,
    #[serde(default)]
    pub enabled: Option<bool>,
    /// Go back to every default.
    #[serde(default)]
    pub reset: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct BackupPlanView {
    /// `service/<name>` or `volume/<name>`.
    pub target: String,
    /// `None` when no destination exists.
    pub destination: Option<String>,
    pub schedule: String,
    pub verify_schedule: String,
    pub pause: bool,
    pub enabled: bool,
    /// No setting of the target's own.
    pub default: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_run_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_verify_at: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct VerificationView {
    /// `passed` or `failed`.
    pub state: String,
    pub job: String,
    pub at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct BackupJobView {
    pub id: String,
    /// `backup`, `verify` or `restore`.
    pub kind: String,
    pub target: String,
    pub destination: String,
    pub node_id: String,
    /// `queued`, `running`, `succeeded`, `failed` or `cancelled`.
    pub state: String,
    /// `schedule`, `manual`, `retry`, or `upgrade` (before a major version
    /// upgrade).
    pub trigger: String,
    pub attempt: i64,
    /// The restic snapshot id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub of_backup: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub files: Option<i64>,
    /// Bytes backed up (a dump's size, or the volume's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes: Option<i64>,
    /// Bytes the backup added to the repository.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub added_bytes: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<i64>,
    /// A verification's rows per table, or keys.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub counts: Option<BTreeMap<String, u64>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pruned: Option<bool>,
    /// A backup's newest verification.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verification: Option<VerificationView>,
    /// A restore into another service: its name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore_to: Option<String>,
    /// A restore in place: the volume the replaced data is kept as.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kept_volume: Option<String>,
    /// What became of it: `settling` (the restore is done; the control
    /// plane is recording the kept volume), `kept` (until `keep_until` or
    /// a confirmation), `purged`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kept_state: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep_until: Option<String>,
    pub created_at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct BackupList {
    pub plan: BackupPlanView,
    /// Newest first.
    pub jobs: Vec<BackupJobView>,
}

/// `POST /api/backups/{id}/restore`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RestoreBackup {
    /// Restore into a new service (or volume) of this name instead of the
    /// one backed up.
    #[serde(default)]
    pub to: Option<String>,
    /// With `to`: the node (id or name) it goes on.
    #[serde(default)]
    pub node: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct TargetStatus {
    pub target: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_success_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_bytes: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_state: Option<String>,
    /// Why this target needs attention.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alert: Option<String>,
}

/// `GET /api/backups`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct BackupOverview {
    pub destinations: usize,
    /// Every target (and `control-plane`).
    pub targets: Vec<TargetStatus>,
    /// The targets' alerts, one line each.
    pub alerts: Vec<String>,
}
