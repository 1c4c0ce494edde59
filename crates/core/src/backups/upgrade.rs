//! Major version upgrades of PostgreSQL services, on the backup path: its
//! data files do not survive a major version in place, a dump does. A
//! fresh backup of the service (`pg_dump -Fc` into restic), restored into
//! a new service `<name>-<major>` of the new version, then the old
//! service's links moved to it and their apps redeployed (their URL now
//! names the new service). The old service keeps running, untouched, until
//! it is deleted by name: going back is linking the apps to it again.
//!
//! The new service holds the data as of the backup: what is written to the
//! old one after the backup starts stays there. So the request says that
//! writes are stopped (`writes_stopped`: the apps are in maintenance, or
//! the team accepts that cut-off); without it the upgrade is refused,
//! saying why. Refused too when the service's newest backup failed its
//! verification: that dump path is not to be trusted with the data until a
//! backup verifies. Each step is one store write, moved along by the
//! backups watcher, so a control plane restarted half way goes on where it
//! was; an unfinished upgrade can be cancelled until its links move, and
//! neither of its services can be deleted meanwhile.

use std::time::Duration;

use cloudweb_api_types::services::MajorUpgradeView;
use cloudweb_protocol::ServiceKind;

use super::jobs::{cancel_job, queue_backup};
use super::restore::{restore_into, NewVersion, SETTLING};
use super::Target;
use crate::clock::rfc3339_ms;
use crate::error::ApiError;
use crate::store::{ServiceRow, Switch, UpgradeRow};

/// How long after its backup an upgrade keeps trying to start its restore
/// when the control plane itself fails (a store error); then it fails.
const RESTORE_START_LIMIT_MS: i64 = 10 * 60 * 1000;
/// How often one pass asks for an app's redeploy when the control plane
/// itself failed it, a second apart.
const REDEPLOY_TRIES: u32 = 3;
use crate::AppState;

/// A version's major number (`15.4` → 15).
fn major(version: &str) -> Option<u64> {
    version.split('.').next()?.parse().ok()
}

/// Whether `from` → `to` is a PostgreSQL major version change, which goes
/// through a dump (an older major is refused: an older `pg_restore` may
/// not read a newer dump).
pub fn is_major_change(kind: ServiceKind, from: &str, to: &str) -> Result<bool, String> {
    if kind != ServiceKind::Postgres {
        return Ok(false);
    }
    match (major(from), major(to)) {
        (Some(a), Some(b)) if b > a => Ok(true),
        (Some(a), Some(b)) if b < a => Err(format!(
            "PostgreSQL {to} is an older major version than {from}: going back is not supported (link the apps to the service this one was upgraded from, if it is still there)"
        )),
        _ => Ok(false),
    }
}

/// The new service's name: `<name>-<major>`, cut to 63 characters.
fn new_name(name: &str, version: &str) -> String {
    let suffix = format!("-{}", major(version).unwrap_or(0));
    let mut base = name.to_string();
    base.truncate(63 - suffix.len());
    format!("{}{suffix}", base.trim_end_matches('-'))
}

/// `POST /api/services/{name}/upgrade`: a change of major PostgreSQL
/// version starts an upgrade through a backup (202, `upgrade` in the
/// view); any other change is [`crate::service_ops::upgrade`]'s.
pub async fn upgrade(state: &AppState, name: &str, version: &str, writes_stopped: bool) -> Result<ServiceRow, ApiError> {
    crate::services::check_version(version)?;
    let service = state.store.service(name).await?.ok_or_else(|| ApiError::NotFound(format!("no service named {name}")))?;
    let kind = crate::service_links::kind_of(&service)?;
    let from = crate::service_ops::current_version(&service);
    let major_change = match &from {
        Some(from) => is_major_change(kind, from, version).map_err(ApiError::Conflict)?,
        None => false,
    };
    if !major_change {
        return crate::service_ops::upgrade(state, name, version).await;
    }
    let from = from.expect("a major change has a version to change from");
    if !writes_stopped {
        return Err(ApiError::Conflict(format!(
            "PostgreSQL {from} to {version} is a major version change, which goes through a dump: {name} is backed up (pg_dump) and restored into a new service, which holds the data as of that dump, so writes made to {name} after it starts would stay in {name}. Stop the writes first (put the apps linked to it in maintenance), then ask again saying so (writes_stopped: true; cloudweb services upgrade --writes-stopped)"
        )));
    }
    let images = &state.config.service_images;
    if images.image(kind, Some(version)) == service.image {
        return Err(ApiError::Conflict(format!(
            "this cluster runs every {} service from the operator's image {} (--service-image): the operator chooses the version by naming another image, or a repository without a tag",
            kind.as_str(),
            service.image
        )));
    }
    if service.previous_secret_sealed.is_some() {
        return Err(ApiError::Conflict(format!("the password rotation of service {name} is unfinished; upgrade it when it is done")));
    }
    let target = Target::Service(name.to_string());
    if state.store.destinations().await?.is_empty() {
        return Err(ApiError::Conflict(format!(
            "PostgreSQL {from} to {version} is a major version change, which goes through a dump (pg_dump, into a backup) restored into a new service, and this cluster has no backup destination (cloudweb backups destinations add)"
        )));
    }
    let newest = state.store.latest_good_backups().await?.into_iter().find(|b| b.target == target.key());
    if let Some(backup) = newest.filter(|b| b.verify_state.as_deref() == Some("failed")) {
        return Err(ApiError::Conflict(format!(
            "the newest backup of {name} ({}) failed its verification ({}): a major upgrade restores from a fresh backup, and needs one that verifies first (cloudweb backups run, then backups verify)",
            backup.id,
            backup.verify_detail.as_deref().unwrap_or("no detail")
        )));
    }
    let to_service = new_name(name, version);
    cloudweb_protocol::validate::node_name("service", &to_service).map_err(|e| ApiError::BadRequest(e.to_string()))?;
    if state.store.service(&to_service).await?.is_some() {
        return Err(ApiError::Conflict(format!(
            "the upgrade restores into a new service {to_service}, and one of that name exists already (an earlier upgrade's?): delete it first, or upgrade that one"
        )));
    }
    if let Some(unfinished) = state.store.unfinished_upgrade_of(name).await? {
        return Err(ApiError::Conflict(if unfinished.service == name {
            format!("an upgrade of {name} is unfinished already: {} ({})", unfinished.id, unfinished.state)
        } else {
            format!("{name} is the new service of the unfinished upgrade {} of {} ({}); upgrade it once that is done", unfinished.id, unfinished.service, unfinished.state)
        }));
    }
    let restoring = state.store.backup_jobs_of(&target.key(), Some("restore"), 20).await?.into_iter().find(|j| matches!(j.state.as_str(), "queued" | "running"));
    if let Some(restore) = restoring {
        return Err(ApiError::Conflict(format!("a restore into {name} is unfinished ({}); upgrade it once that is done", restore.id)));
    }
    let backup = queue_backup(state, &target, "upgrade", 1).await?;
    let row = UpgradeRow {
        id: format!("up_{}", &super::new_job_id()[3..]),
        service: name.to_string(),
        to_service: to_service.clone(),
        from_version: from.clone(),
        version: version.to_string(),
        state: "backing_up".into(),
        backup_job: Some(backup.id.clone()),
        created_at: state.clock.now_ms(),
        ..UpgradeRow::default()
    };
    if let Err(busy) = state.store.insert_upgrade(&row).await? {
        // Its backup was queued for it: it goes too.
        cancel_job(state, &backup, "the upgrade it was for was refused").await?;
        return Err(ApiError::Conflict(format!("{busy}; {name} was not upgraded")));
    }
    tracing::info!(upgrade = %row.id, service = name, from = %from, to = version, new_service = %to_service, backup = %backup.id, "major version upgrade started: backing up first");
    Ok(service)
}

/// Moves every unfinished upgrade on by what its jobs did. One upgrade's
/// failure is logged and holds up no other.
pub async fn drive(state: &AppState) -> Result<(), ApiError> {
    for upgrade in state.store.unfinished_upgrades().await? {
        if let Err(err) = step(state, &upgrade).await {
            tracing::warn!(upgrade = %upgrade.id, service = %upgrade.service, error = %err, "upgrade not moved on; trying again next pass");
        }
    }
    Ok(())
}

async fn fail(state: &AppState, upgrade: &UpgradeRow, reason: &str) -> Result<(), ApiError> {
    if state.store.advance_upgrade(&upgrade.id, &upgrade.state, "failed", None, Some(reason), state.clock.now_ms()).await? {
        tracing::warn!(upgrade = %upgrade.id, service = %upgrade.service, reason, "major version upgrade failed; the service runs on as it was");
    }
    Ok(())
}

async fn job(state: &AppState, id: Option<&str>) -> Result<Option<crate::store::BackupJobRow>, ApiError> {
    match id {
        Some(id) => Ok(state.store.backup_job(id).await?),
        None => Ok(None),
    }
}

async fn step(state: &AppState, upgrade: &UpgradeRow) -> Result<(), ApiError> {
    let now = state.clock.now_ms();
    match upgrade.state.as_str() {
        "backing_up" => {
            let Some(backup) = job(state, upgrade.backup_job.as_deref()).await? else {
                return fail(state, upgrade, "its backup job is gone").await;
            };
            match backup.state.as_str() {
                "queued" | "running" => Ok(()),
                "succeeded" => start_restore(state, upgrade, &backup, now).await,
                other => fail(state, upgrade, &format!("the backup before the upgrade ended {other}: {}", backup.message.as_deref().unwrap_or("no reason given"))).await,
            }
        }
        "restoring" => {
            let Some(restore) = job(state, upgrade.restore_job.as_deref()).await? else {
                return fail(state, upgrade, "its restore job is gone").await;
            };
            match restore.state.as_str() {
                "queued" | "running" => Ok(()),
                // Its last step (the new service's empty first data
                // purged) is the watcher's; the switch waits for it.
                "succeeded" if restore.kept_state.as_deref() == Some(SETTLING) => Ok(()),
                "succeeded" => match state.store.switch_upgrade_links(upgrade).await? {
                    Switch::Moved => {
                        tracing::info!(upgrade = %upgrade.id, from = %upgrade.service, to = %upgrade.to_service, "upgrade: restored; links moved to the new service");
                        let switching = UpgradeRow { state: "switching".into(), ..upgrade.clone() };
                        switch(state, &switching).await
                    }
                    // Cancelled, or moved by another pass: the next pass
                    // sees which.
                    Switch::NotRestoring => Ok(()),
                    Switch::NewServiceGone => {
                        fail(state, upgrade, &format!("the new service {} is gone; {} runs on as it was, with its links", upgrade.to_service, upgrade.service)).await
                    }
                    Switch::LinkedToBoth(apps) => {
                        let reason = format!(
                            "{} linked to both {} and {}, so the links were not moved; {} runs on as it was, and {} holds the restored data (unlink one, then link the apps by hand, or delete {} and try again)",
                            if apps.len() == 1 { format!("app {} is", apps[0]) } else { format!("apps {} are", apps.join(", ")) },
                            upgrade.service,
                            upgrade.to_service,
                            upgrade.service,
                            upgrade.to_service,
                            upgrade.to_service
                        );
                        fail(state, upgrade, &reason).await
                    }
                },
                other => {
                    let reason = format!(
                        "the restore into {} ended {other}: {}; {} runs on as it was, and {} holds what was restored (delete it before trying again)",
                        upgrade.to_service,
                        restore.message.as_deref().unwrap_or("no reason given"),
                        upgrade.service,
                        upgrade.to_service
                    );
                    fail(state, upgrade, &reason).await
                }
            }
        }
        "switching" => switch(state, upgrade).await,
        _ => Ok(()),
    }
}

/// The backup is done: the restore into the new service starts, or, when
/// an earlier pass started it and could not record it (a crash between
/// the two writes), is found and recorded. A refusal fails the upgrade; a
/// failure of the control plane itself is tried again, for a while.
async fn start_restore(state: &AppState, upgrade: &UpgradeRow, backup: &crate::store::BackupJobRow, now: i64) -> Result<(), ApiError> {
    let into = Target::Service(upgrade.to_service.clone()).key();
    let earlier = state.store.backup_jobs_of(&into, Some("restore"), 20).await?.into_iter().find(|j| j.of_job.as_deref() == Some(backup.id.as_str()));
    let restore = match earlier {
        Some(restore) => restore,
        None => match restore_into(state, &backup.id, Some(&upgrade.to_service), None, Some(NewVersion { version: &upgrade.version, since_ms: upgrade.created_at })).await {
            Ok(restore) => restore,
            Err(err @ (ApiError::Internal(_) | ApiError::Unavailable(_))) if now < backup.finished_at.unwrap_or(backup.created_at) + RESTORE_START_LIMIT_MS => {
                return Err(ApiError::Unavailable(format!("the restore into {} did not start yet: {err}", upgrade.to_service)));
            }
            Err(err) => return fail(state, upgrade, &format!("the restore into {} could not start: {err}", upgrade.to_service)).await,
        },
    };
    if state.store.advance_upgrade(&upgrade.id, "backing_up", "restoring", Some(&restore.id), None, now).await? {
        tracing::info!(upgrade = %upgrade.id, restore = %restore.id, new_service = %upgrade.to_service, "upgrade: backup done, restoring into the new version");
    } else if matches!(restore.state.as_str(), "queued" | "running") {
        // Cancelled (or failed) meanwhile: a restore nobody waits for
        // stops. The new service stays, with what it holds, until deleted.
        let ended = state.store.upgrade(&upgrade.id).await?.map(|u| u.state).unwrap_or_default();
        tracing::warn!(upgrade = %upgrade.id, restore = %restore.id, state = %ended, "upgrade ended while its restore started; cancelling the restore");
        cancel_job(state, &restore, "its major version upgrade ended before the restore began").await?;
    }
    Ok(())
}

/// `POST /api/services/{name}/upgrade/cancel`: ends the unfinished upgrade
/// from or into `name` before its links move (its backup or restore is
/// cancelled too). The old service is as it was; a new service the restore
/// made is kept, with what it holds, until deleted by name.
pub async fn cancel(state: &AppState, name: &str) -> Result<UpgradeRow, ApiError> {
    let upgrade = state
        .store
        .unfinished_upgrade_of(name)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("no unfinished major version upgrade goes from or into {name}")))?;
    let (job, reason) = match upgrade.state.as_str() {
        "backing_up" => (upgrade.backup_job.as_deref(), format!("cancelled by request; {} runs on as it was", upgrade.service)),
        "restoring" => (
            upgrade.restore_job.as_deref(),
            format!(
                "cancelled by request; {} runs on as it was, and {} holds what was restored so far (delete it by name: cloudweb services rm {})",
                upgrade.service, upgrade.to_service, upgrade.to_service
            ),
        ),
        _ => {
            return Err(ApiError::Conflict(format!(
                "the links of {} have moved to {} already; its apps are being redeployed, and it ends on its own",
                upgrade.service, upgrade.to_service
            )))
        }
    };
    // The upgrade ends first, so the driver, moving it on meanwhile, finds
    // it ended and starts nothing more (a restore it had just started, it
    // cancels); then the job it waits for is cancelled.
    if !state.store.advance_upgrade(&upgrade.id, &upgrade.state, "failed", None, Some(&reason), state.clock.now_ms()).await? {
        return match state.store.upgrade(&upgrade.id).await? {
            Some(ended) if ended.state == "failed" => Ok(ended),
            _ => Err(ApiError::Conflict(format!("upgrade {} moved on meanwhile; look again", upgrade.id))),
        };
    }
    if let Some(job) = job.map(|id| state.store.backup_job(id)) {
        if let Some(job) = job.await?.filter(|j| matches!(j.state.as_str(), "queued" | "running")) {
            cancel_job(state, &job, "its major version upgrade was cancelled").await?;
        }
    }
    tracing::info!(upgrade = %upgrade.id, service = %upgrade.service, new_service = %upgrade.to_service, "major version upgrade cancelled");
    Ok(state.store.latest_upgrade(&upgrade.service).await?.unwrap_or(upgrade))
}

/// The apps now linked to the new service are redeployed (again, after a
/// crash half way: a redeploy twice is harmless, never is not).
async fn switch(state: &AppState, upgrade: &UpgradeRow) -> Result<(), ApiError> {
    let mut redeployed = Vec::new();
    let mut not_redeployed = Vec::new();
    // One app's failed redeploy holds up neither the others nor the
    // upgrade's end: it is named in the message, to be redeployed by hand.
    // A passing failure of the control plane is tried again, a few times
    // within this pass (a later pass would redeploy the others again).
    for link in state.store.service_links(&upgrade.to_service).await? {
        let mut tries = 0;
        let outcome = loop {
            tries += 1;
            match crate::service_ops::redeploy(state, &link.app).await {
                Err(ApiError::Internal(_) | ApiError::Unavailable(_)) if tries < REDEPLOY_TRIES => tokio::time::sleep(Duration::from_secs(1)).await,
                outcome => break outcome,
            }
        };
        match outcome {
            Ok(Some(id)) => redeployed.push(format!("{} ({id})", link.app)),
            Ok(None) => {}
            Err(err) => {
                tracing::warn!(upgrade = %upgrade.id, app = %link.app, error = %err, tries, "upgrade: the app could not be redeployed with the new service");
                not_redeployed.push(format!("{} ({err})", link.app));
            }
        }
    }
    let mut message = format!(
        "apps now use {}; {} is kept, running, until it is deleted (cloudweb services rm {})",
        upgrade.to_service, upgrade.service, upgrade.service
    );
    if !not_redeployed.is_empty() {
        message.push_str(&format!("; not redeployed, deploy by hand: {}", not_redeployed.join(", ")));
    }
    if state.store.advance_upgrade(&upgrade.id, "switching", "switched", None, Some(&message), state.clock.now_ms()).await? {
        tracing::info!(upgrade = %upgrade.id, from = %upgrade.service, to = %upgrade.to_service, redeployed = ?redeployed, "major version upgrade done");
    }
    Ok(())
}

/// The newest upgrade from or to `service`, for its view.
pub async fn view_of(state: &AppState, service: &str) -> Result<Option<MajorUpgradeView>, ApiError> {
    Ok(state.store.latest_upgrade(service).await?.map(|u| MajorUpgradeView {
        id: u.id,
        service: u.service,
        to_service: u.to_service,
        from_version: u.from_version,
        version: u.version,
        state: u.state,
        message: u.message,
        backup_job: u.backup_job,
        restore_job: u.restore_job,
        created_at: rfc3339_ms(u.created_at),
        finished_at: u.finished_at.map(rfc3339_ms),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_newer_postgresql_major_goes_through_a_dump() {
        assert_eq!(is_major_change(ServiceKind::Postgres, "15", "17"), Ok(true));
        assert_eq!(is_major_change(ServiceKind::Postgres, "15.4", "16.1"), Ok(true));
        assert_eq!(is_major_change(ServiceKind::Postgres, "15", "15.99"), Ok(false));
        assert!(is_major_change(ServiceKind::Postgres, "17", "15").unwrap_err().contains("older"));
        assert_eq!(is_major_change(ServiceKind::Redis, "7", "8"), Ok(false));
        assert_eq!(is_major_change(ServiceKind::Mariadb, "10.11", "11.4"), Ok(false));
    }

    #[test]
    fn new_names_are_service_names() {
        assert_eq!(new_name("db", "17"), "db-17");
        assert_eq!(new_name("db", "17.2"), "db-17");
        let long = new_name(&"a".repeat(63), "17");
        assert_eq!(long.len(), 63);
        cloudweb_protocol::validate::node_name("service", &long).unwrap();
    }
}
