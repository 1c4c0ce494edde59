//! What is done to a managed service that runs: its password rotated, its
//! version changed. Both are a new generation of its `service_run`: the
//! node replaces the container on the same data and (PostgreSQL, MariaDB)
//! makes the database take the payload's password with `set_password`.
//!
//! A rotation keeps the old credentials (sealed) until the node reports
//! the new generation healthy, which it does only once the database took
//! the new password: until then linked apps keep getting the old one, the
//! one that works, and the API shows the rotation as unfinished. Then the
//! watcher redeploys the linked apps (their running image again, with the
//! new URL) and forgets the old password.

use cloudweb_protocol::services::ServiceKind;
use cloudweb_protocol::CommandKind;

use crate::deploy::Origin;
use crate::error::ApiError;
use crate::service_links::{kind_of, runs_current, secret, secret_context, ServiceSecret};
use crate::services::{check_version, payload, tag};
use crate::store::{NewCommand, ServiceChange, ServiceRow};
use crate::AppState;

async fn load(state: &AppState, name: &str) -> Result<ServiceRow, ApiError> {
    state.store.service(name).await?.ok_or_else(|| ApiError::NotFound(format!("no service named {name}")))
}

fn unfinished(service: &ServiceRow) -> Result<(), ApiError> {
    if service.previous_secret_sealed.is_some() {
        return Err(ApiError::Conflict(format!(
            "the password rotation of service {} is unfinished (its node has not run the new password yet); wait for it, or see its detail",
            service.name
        )));
    }
    Ok(())
}

/// Stores the change and queues the node's `service_run` of the next
/// generation in one transaction.
async fn change(state: &AppState, service: &ServiceRow, change: ServiceChange) -> Result<ServiceRow, ApiError> {
    let mut failure = None;
    let changed = state
        .store
        .change_service(
            &service.name,
            service.generation,
            &change,
            |row| {
                let value = match payload(state, row) {
                    Ok(p) => serde_json::to_value(p).expect("payload serializes"),
                    Err(err) => {
                        failure = Some(err);
                        serde_json::Value::Null
                    }
                };
                NewCommand {
                    node_id: row.node_id.clone(),
                    kind: CommandKind::ServiceRun.as_str().to_string(),
                    payload: state.sealer.seal_json(&crate::command_context(&row.node_id), &value),
                }
            },
            state.clock.now_ms(),
        )
        .await?;
    if let Some(err) = failure {
        return Err(err);
    }
    let changed = changed.ok_or_else(|| ApiError::Conflict(format!("service {} changed meanwhile; try again", service.name)))?;
    state.hub.notify(&changed.node_id, cloudweb_protocol::events::COMMANDS);
    Ok(changed)
}

/// Starts a password rotation. Refused while its node is unreachable (the
/// password stays as it was) and while another one is unfinished.
pub async fn rotate_password(state: &AppState, name: &str) -> Result<ServiceRow, ApiError> {
    let service = load(state, name).await?;
    unfinished(&service)?;
    let now = tokio::time::Instant::now();
    let node = state.nodes.get(&service.node_id).filter(|n| n.state(now, state.config.unreachable_after) != crate::live::NodeState::Unreachable);
    let Some(node) = node else {
        return Err(ApiError::Unavailable(format!(
            "service {name}'s node {} is not reachable: the password was not changed; try again once the node is back",
            service.node_id
        )));
    };
    // An older agent would replace the container without telling the
    // database: the new password would be handed out and refused.
    if !node.has_feature(now, cloudweb_protocol::features::SERVICE_OPS) {
        return Err(ApiError::Conflict(format!(
            "service {name}'s node {} has not said it can change a database's password (an older agent, or no heartbeat yet): \
             the password was not changed",
            node.name
        )));
    }
    let old = secret(state, &service)?;
    let new = ServiceSecret { password: crate::services::password(), root_password: old.root_password };
    let rotated = change(
        state,
        &service,
        ServiceChange {
            version: service.version.clone(),
            image: service.image.clone(),
            secret_sealed: state.sealer.seal_json(&secret_context(name), &new),
            previous_secret_sealed: Some(service.secret_sealed.clone()),
            rotation_started_at: Some(state.clock.now_ms()),
        },
    )
    .await?;
    tracing::info!(service = name, generation = rotated.generation, "password rotation started; linked apps keep the old password until the node runs the new one");
    Ok(rotated)
}

/// A version's numbers (`15.4` → [15, 4]).
fn numbers(version: &str) -> Option<Vec<u64>> {
    version.split('.').map(|n| n.parse().ok()).collect()
}

/// The version a service runs: the one recorded, else its image's tag.
pub fn current_version(service: &ServiceRow) -> Option<String> {
    service.version.clone().or_else(|| tag(&service.image).filter(|t| numbers(t).is_some()).map(str::to_string))
}

/// Whether `from` may become `to` on the same data:
/// - PostgreSQL: only within a major version (its data files are per
///   major; another one needs a dump and a restore);
/// - Redis/Valkey: any newer version, and within a major version either
///   way (a newer one reads older files; an older one may not read newer);
/// - MariaDB: any newer version (it upgrades its system tables at start),
///   and within a release series (`10.11`) either way; not to an older
///   series, which MariaDB does not support.
pub fn upgrade_rule(kind: ServiceKind, from: &str, to: &str) -> Result<(), String> {
    let (Some(a), Some(b)) = (numbers(from), numbers(to)) else {
        return Err(format!("cannot compare versions {from} and {to}"));
    };
    let part = |v: &[u64], i: usize| v.get(i).copied().unwrap_or(0);
    match kind {
        ServiceKind::Postgres if part(&a, 0) != part(&b, 0) => Err(format!(
            "PostgreSQL {from} to {to} is a major version change, which its data files do not survive in place: \
             dump the data (pg_dump), create a service of version {to} and restore it there; upgrade changes minor versions only ({}.x)",
            part(&a, 0)
        )),
        ServiceKind::Redis if part(&b, 0) < part(&a, 0) => {
            Err(format!("Redis {to} may not read the data files of Redis {from}: only newer versions, or another one of the same major version"))
        }
        ServiceKind::Mariadb if (part(&b, 0), part(&b, 1)) < (part(&a, 0), part(&a, 1)) => {
            Err(format!("MariaDB does not support going back from {from} to the older release series {to}"))
        }
        _ => Ok(()),
    }
}

/// Moves a service to another version on the same data (a new container
/// of the new image). See [`upgrade_rule`]; with an image the operator
/// pinned (`--service-image kind=repo:tag`) the version is the operator's:
/// refused, unless the service still runs an older image of the operator,
/// which it then moves to (recording `version`).
pub async fn upgrade(state: &AppState, name: &str, version: &str) -> Result<ServiceRow, ApiError> {
    check_version(version)?;
    let service = load(state, name).await?;
    let kind = kind_of(&service)?;
    unfinished(&service)?;
    let images = &state.config.service_images;
    let image = images.image(kind, Some(version));
    if images.pinned(kind).is_some() && image == service.image {
        return Err(ApiError::Conflict(format!(
            "this cluster runs every {} service from the operator's image {image} (--service-image), which service {name} runs already: \
             the operator chooses the version by naming another image, or a repository without a tag",
            kind.as_str()
        )));
    }
    if image == service.image {
        return Err(ApiError::Conflict(format!("service {name} runs {image} already")));
    }
    let from = current_version(&service)
        .ok_or_else(|| ApiError::Conflict(format!("cannot tell which version service {name} runs (image {}); create a new service instead", service.image)))?;
    upgrade_rule(kind, &from, version).map_err(ApiError::Conflict)?;
    let upgraded = change(
        state,
        &service,
        ServiceChange {
            version: Some(version.to_string()),
            image: image.clone(),
            secret_sealed: service.secret_sealed.clone(),
            previous_secret_sealed: None,
            rotation_started_at: None,
        },
    )
    .await?;
    tracing::info!(service = name, from = %from, to = version, %image, generation = upgraded.generation, "service version change queued; its node replaces the container on the same data");
    Ok(upgraded)
}

/// What an unfinished rotation waits for, for the API.
pub fn rotation_detail(state: &AppState, service: &ServiceRow) -> String {
    match crate::service_links::status(state, service) {
        Some(s) if s.generation >= service.generation.max(0) as u64 => match &s.detail {
            Some(detail) => format!("the node runs the new generation ({}): {detail}", s.state),
            None => format!("the node runs the new generation ({}); linked apps are redeployed once it is healthy", s.state),
        },
        _ => format!("its node has not run generation {} (the new password) yet; linked apps keep the old one until then", service.generation),
    }
}

/// Redeploys an app linked to a rotated service: its newest running
/// deployment's image again, with the new URL. None when it runs nothing.
pub(crate) async fn redeploy(state: &AppState, app: &str) -> Result<Option<String>, ApiError> {
    let Some(app) = state.store.app(app).await? else { return Ok(None) };
    let running = state.store.app_deployments(&app.name).await?.into_iter().filter(|d| d.state == "running").max_by_key(|d| d.seq);
    let Some((of, image)) = running.and_then(|d| d.image.clone().map(|image| (d.id, image))) else { return Ok(None) };
    let deployment = crate::deploy::create(state, &app, Origin::Rollback { of, image }).await?;
    Ok(Some(deployment.id))
}

/// One pass: every rotation whose node runs the new password is finished,
/// its linked apps redeployed (first, so a crash in between redeploys them
/// again rather than never).
pub async fn finish_rotations(state: &AppState) -> Result<(), ApiError> {
    for service in state.store.rotating_services().await? {
        if !runs_current(state, &service) {
            continue;
        }
        let mut redeployed = Vec::new();
        for link in state.store.service_links(&service.name).await? {
            if let Some(id) = redeploy(state, &link.app).await? {
                redeployed.push(format!("{} ({id})", link.app));
            }
        }
        if state.store.finish_rotation(&service.name, service.generation).await? {
            tracing::info!(service = %service.name, generation = service.generation, redeployed = ?redeployed, "password rotated; the old one no longer works");
        }
    }
    Ok(())
}

/// Runs [`finish_rotations`] every second until the task is aborted.
pub async fn watcher(state: std::sync::Arc<AppState>) {
    let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if let Err(err) = finish_rotations(&state).await {
            tracing::error!(error = %err, "finishing service password rotations failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minor_versions_change_in_place_and_a_major_postgresql_one_does_not() {
        upgrade_rule(ServiceKind::Postgres, "15", "15.99").unwrap();
        upgrade_rule(ServiceKind::Postgres, "15.4", "15.3").unwrap();
        let refused = upgrade_rule(ServiceKind::Postgres, "15.4", "16").unwrap_err();
        assert!(refused.contains("major") && refused.contains("pg_dump"), "{refused}");
        upgrade_rule(ServiceKind::Redis, "7.0", "7.2").unwrap();
        upgrade_rule(ServiceKind::Redis, "7.2", "8").unwrap();
        upgrade_rule(ServiceKind::Redis, "7.2", "7.0").unwrap();
        assert!(upgrade_rule(ServiceKind::Redis, "8", "7.2").is_err());
        upgrade_rule(ServiceKind::Mariadb, "10.11", "11.4").unwrap();
        upgrade_rule(ServiceKind::Mariadb, "10.11.6", "10.11.2").unwrap();
        assert!(upgrade_rule(ServiceKind::Mariadb, "11.4", "10.11").is_err());
        assert!(upgrade_rule(ServiceKind::Mariadb, "10.11", "10.6").is_err());
        assert!(upgrade_rule(ServiceKind::Postgres, "latest", "16").is_err());
    }

    #[test]
    fn the_current_version_is_the_recorded_one_or_the_images_tag() {
        let mut row = ServiceRow {
            name: "db".into(),
            kind: "postgres".into(),
            version: None,
            image: "postgres:16".into(),
            node_id: "n".into(),
            host_port: 20000,
            team_id: "team_default".into(),
            memory_bytes: None,
            volume: "svc-db".into(),
            secret_sealed: String::new(),
            generation: 1,
            created_at: 0,
            previous_secret_sealed: None,
            rotation_started_at: None,
        };
        assert_eq!(current_version(&row).as_deref(), Some("16"));
        row.image = "mirror:5000/pg".into();
        assert_eq!(current_version(&row), None);
        row.image = "pg:latest".into();
        assert_eq!(current_version(&row), None);
        row.version = Some("15.4".into());
        assert_eq!(current_version(&row).as_deref(), Some("15.4"));
    }
}
