//! Backups and restores: the control plane's half of
//! `cloudweb_protocol::backups`.
//!
//! - A **destination** holds two restic repositories, `<base>/data` (every
//!   volume's and service's snapshots, tagged `target=<kind>/<name>`) and
//!   `<base>/control-plane` (the control plane's own state), both opened
//!   with the destination's password, which is the **recovery key** shown
//!   once when the destination is added (with the repositories' URLs: the
//!   recovery kit). The control plane runs `restic init` on both when the
//!   destination is added, so a wrong endpoint, bucket or key is refused
//!   then rather than at the first night's backup.
//! - A **target** is `service/<name>` (a logical dump) or `volume/<name>`
//!   (the files; volumes that hold a service's data are backed up as the
//!   service). Every target is backed up by default once a destination
//!   exists, daily at a night minute derived from its name, and its newest
//!   backup is verified weekly; `backup_plans` holds what a user changed.
//! - A **job** (backup, verify, restore) is a row and a command to the
//!   node that holds the data, queued in one transaction; the node reports
//!   to `POST /agent/v1/backup-jobs/{id}`. The [`watcher`] starts what is
//!   due, retries a failed backup with back-off (3 retries, then the next
//!   schedule), fails jobs whose node went away or that ran over their
//!   deadline, and deletes a restore's replaced data once its keep period
//!   ends.
//!
//! Invariants: a failed backup never prunes (retention runs on the node
//! only after a success); nothing at a destination is deleted by removing
//! it from cloud-web; a restore never deletes the data it replaces, which
//! stays as a volume of its own until confirmed or kept for
//! `--backup-keep-days`.

pub mod control_plane;
pub use crate::cron;
mod destinations;
mod jobs;
mod restore;
pub mod status;
pub mod upgrade;
mod watcher;

use cloudweb_protocol::{BackupSource, Repository, Retention, ServiceKind};
use rand::Rng;

use crate::error::ApiError;
use crate::store::{DestinationRow, PlanRow};
use crate::AppState;

pub use destinations::{add_destination, destination_view, destinations, remove_destination};
pub use jobs::{job_view, jobs_of, run_now, verify_now};
pub use restore::{confirm_restore, restore};
pub use status::{metrics_lines, overview};
pub use watcher::{cancel_jobs_of, on_report, tick, watcher};

/// How long a backup or restore may run on its node.
pub const JOB_TIMEOUT_SECONDS: u32 = 6 * 3600;
/// How long a verification may run.
pub const VERIFY_TIMEOUT_SECONDS: u32 = 2 * 3600;
/// The share of pack files a verification reads back.
pub const VERIFY_READ_PERCENT: u8 = 10;
/// Retries of a failed scheduled backup before waiting for the next run.
pub const MAX_RETRIES: i64 = 3;

/// What is backed up: a service (its dump) or a volume (its files).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Target {
    Service(String),
    Volume(String),
}

impl Target {
    pub fn parse(text: &str) -> Option<Target> {
        match text.split_once('/') {
            Some(("service", name)) if cloudweb_protocol::validate::node_name("service", name).is_ok() => Some(Target::Service(name.to_string())),
            Some(("volume", name)) if cloudweb_protocol::volumes::name(name).is_ok() => Some(Target::Volume(name.to_string())),
            _ => None,
        }
    }

    pub fn key(&self) -> String {
        match self {
            Target::Service(name) => format!("service/{name}"),
            Target::Volume(name) => format!("volume/{name}"),
        }
    }

    pub fn name(&self) -> &str {
        match self {
            Target::Service(name) | Target::Volume(name) => name,
        }
    }
}

/// The control plane's own backups, in the overview and the metrics.
pub const CONTROL_PLANE_TARGET: &str = "control-plane";

pub(crate) fn new_job_id() -> String {
    let bytes: [u8; 8] = rand::rng().random();
    format!("bj_{}", hex::encode(bytes))
}

pub(crate) fn secret_context(destination: &str, what: &str) -> String {
    format!("backup-destination:{destination}:{what}")
}

/// A destination's repository (`data` or `control-plane`), with its
/// password and credentials opened.
pub fn repository(state: &AppState, destination: &DestinationRow, which: &str) -> Result<Repository, ApiError> {
    let password = state
        .sealer
        .open(&secret_context(&destination.name, "password"), &destination.password_sealed)
        .map_err(|e| ApiError::Internal(format!("cannot open the destination's password: {e}")))?;
    let password = String::from_utf8(password).map_err(|_| ApiError::Internal("the destination's password is not text".into()))?;
    let mut env = std::collections::BTreeMap::new();
    if destination.kind == "s3" {
        if let Some(id) = &destination.access_key_id {
            env.insert("AWS_ACCESS_KEY_ID".to_string(), id.clone());
        }
        if let Some(sealed) = &destination.secret_sealed {
            let secret = state
                .sealer
                .open(&secret_context(&destination.name, "secret"), sealed)
                .map_err(|e| ApiError::Internal(format!("cannot open the destination's secret: {e}")))?;
            env.insert("AWS_SECRET_ACCESS_KEY".to_string(), String::from_utf8_lossy(&secret).into_owned());
        }
        env.insert("AWS_DEFAULT_REGION".to_string(), destination.region.clone().unwrap_or_else(|| "us-east-1".into()));
    }
    Ok(Repository { url: format!("{}/{which}", destination.base_url), password, env })
}

pub fn retention(destination: &DestinationRow) -> Retention {
    let keep = |v: i64| u32::try_from(v.max(0)).unwrap_or(u32::MAX);
    Retention { keep_daily: keep(destination.keep_daily), keep_weekly: keep(destination.keep_weekly), keep_monthly: keep(destination.keep_monthly) }
}

/// Where restic keeps its cache on the control plane.
pub fn cache_dir(state: &AppState) -> std::path::PathBuf {
    state.config.data_dir.join("restic-cache")
}

/// A target's settings with the defaults filled in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub target: Target,
    pub destination: Option<String>,
    pub schedule: String,
    pub verify_schedule: String,
    pub pause: bool,
    pub enabled: bool,
    pub default: bool,
}

/// The destinations a target may use: its team's (all of them for a
/// target that is gone). Its default is the oldest of these, so one
/// team's data never goes to another team's destination by default.
pub async fn team_destinations(state: &AppState, target: &Target, all: &[DestinationRow]) -> Result<Vec<DestinationRow>, ApiError> {
    let (owned, name) = match target {
        Target::Service(name) => (crate::store::Owned::Service, name),
        Target::Volume(name) => (crate::store::Owned::Volume, name),
    };
    Ok(match state.store.team_of(owned, name).await? {
        Some(team) => all.iter().filter(|d| d.team_id == team).cloned().collect(),
        None => all.to_vec(),
    })
}

pub fn effective_plan(target: &Target, row: Option<&PlanRow>, destinations: &[DestinationRow]) -> Plan {
    let key = target.key();
    let default_destination = destinations.first().map(|d| d.name.clone());
    Plan {
        target: target.clone(),
        destination: row.and_then(|r| r.destination.clone()).or(default_destination),
        schedule: row.and_then(|r| r.schedule.clone()).unwrap_or_else(|| cron::default_schedule(&key)),
        verify_schedule: row.and_then(|r| r.verify_schedule.clone()).unwrap_or_else(|| cron::default_verify_schedule(&key)),
        pause: row.is_some_and(|r| r.pause),
        enabled: row.is_none_or(|r| r.enabled),
        default: row.is_none(),
    }
}

/// The data a target's jobs work on: its node, its volume, and for a
/// service its kind, row and dump credentials.
pub(crate) struct Located {
    pub node_id: String,
    pub source: BackupSource,
    pub service: Option<crate::store::ServiceRow>,
}

pub(crate) async fn locate(state: &AppState, target: &Target, pause: bool) -> Result<Located, ApiError> {
    match target {
        Target::Service(name) => {
            let service = state.store.service(name).await?.ok_or_else(|| ApiError::NotFound(format!("no service named {name}")))?;
            let kind = ServiceKind::parse(&service.kind).ok_or_else(|| ApiError::Internal(format!("service {name} has an unknown kind")))?;
            Ok(Located {
                node_id: service.node_id.clone(),
                source: BackupSource::Service {
                    service: service.name.clone(),
                    service_kind: kind,
                    volume: service.volume.clone(),
                    user: crate::service_links::USER.to_string(),
                    database: crate::service_links::DATABASE.to_string(),
                },
                service: Some(service),
            })
        }
        Target::Volume(name) => {
            let volume = state.store.volume(name).await?.ok_or_else(|| ApiError::NotFound(format!("no volume named {name}")))?;
            if let Some(service) = &volume.service {
                return Err(ApiError::Conflict(format!("volume {name} holds the data of service {service}: back up the service instead (a consistent dump)")));
            }
            let Some(node_id) = volume.node_id.clone() else {
                return Err(ApiError::Conflict(format!("volume {name} has no data on any node yet")));
            };
            Ok(Located { node_id, source: BackupSource::Volume { volume: name.clone(), pause }, service: None })
        }
    }
}

/// Finds what a user means by `name`: the service of that name, else the
/// volume (`kind` says which when both exist).
pub async fn resolve(state: &AppState, kind: Option<&str>, name: &str) -> Result<Target, ApiError> {
    match kind {
        Some("service") => return Ok(Target::Service(name.to_string())),
        Some("volume") => return Ok(Target::Volume(name.to_string())),
        Some(other) => return Err(ApiError::BadRequest(format!("kind must be service or volume, not {other:?}"))),
        None => {}
    }
    if state.store.service(name).await?.is_some() {
        return Ok(Target::Service(name.to_string()));
    }
    if state.store.volume(name).await?.is_some() {
        return Ok(Target::Volume(name.to_string()));
    }
    Err(ApiError::NotFound(format!("no service or volume named {name}")))
}

/// Every target that exists now, with when it was made.
pub(crate) async fn all_targets(state: &AppState) -> Result<Vec<(Target, i64)>, ApiError> {
    let mut targets: Vec<(Target, i64)> = state.store.services().await?.into_iter().map(|s| (Target::Service(s.name), s.created_at)).collect();
    for volume in state.store.volumes().await? {
        if volume.service.is_none() && volume.node_id.is_some() {
            targets.push((Target::Volume(volume.name), volume.created_at));
        }
    }
    Ok(targets)
}

/// Sets a target's plan (`reset` goes back to the defaults).
pub async fn set_plan(state: &AppState, target: &Target, change: &cloudweb_api_types::backups::SetBackupPlan) -> Result<Plan, ApiError> {
    locate(state, target, false).await?;
    let all = state.store.destinations().await?;
    let destinations = team_destinations(state, target, &all).await?;
    let old = if change.reset { None } else { state.store.backup_plan(&target.key()).await? };
    let mut row = old.unwrap_or(PlanRow {
        target: target.key(),
        destination: None,
        schedule: None,
        verify_schedule: None,
        pause: false,
        enabled: true,
        updated_at: 0,
    });
    if let Some(destination) = &change.destination {
        if !destinations.iter().any(|d| &d.name == destination) {
            return Err(ApiError::NotFound(format!("no backup destination named {destination} in the team of {}", target.key())));
        }
        row.destination = Some(destination.clone());
    }
    for (value, slot, what) in [(&change.schedule, &mut row.schedule, "schedule"), (&change.verify_schedule, &mut row.verify_schedule, "verify_schedule")] {
        if let Some(text) = value {
            cron::Schedule::parse(text).map_err(|e| ApiError::BadRequest(format!("{what}: {e}")))?;
            *slot = Some(text.trim().to_string());
        }
    }
    if let Some(pause) = change.pause {
        if pause && matches!(target, Target::Service(_)) {
            return Err(ApiError::BadRequest("pause is for volumes; a service's dump is consistent without it".into()));
        }
        row.pause = pause;
    }
    if let Some(enabled) = change.enabled {
        row.enabled = enabled;
    }
    row.updated_at = state.clock.now_ms();
    state.store.set_backup_plan(&row).await?;
    Ok(effective_plan(target, Some(&row), &destinations))
}

pub async fn plan(state: &AppState, target: &Target) -> Result<Plan, ApiError> {
    let all = state.store.destinations().await?;
    let destinations = team_destinations(state, target, &all).await?;
    let row = state.store.backup_plan(&target.key()).await?;
    Ok(effective_plan(target, row.as_ref(), &destinations))
}

pub fn plan_view(state: &AppState, plan: &Plan) -> cloudweb_api_types::backups::BackupPlanView {
    let now = state.clock.now_ms();
    let next = |text: &str| cron::Schedule::parse(text).ok().and_then(|s| s.next_after(now)).map(crate::clock::rfc3339_ms);
    cloudweb_api_types::backups::BackupPlanView {
        target: plan.target.key(),
        destination: plan.destination.clone(),
        schedule: plan.schedule.clone(),
        verify_schedule: plan.verify_schedule.clone(),
        pause: plan.pause,
        enabled: plan.enabled,
        default: plan.default,
        next_run_at: (plan.enabled && plan.destination.is_some()).then(|| next(&plan.schedule)).flatten(),
        next_verify_at: (plan.enabled && plan.destination.is_some()).then(|| next(&plan.verify_schedule)).flatten(),
    }
}
