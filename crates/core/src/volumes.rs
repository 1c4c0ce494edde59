//! Persistent volumes in the domain: where an app with volumes may run
//! (only on the node holding their data), what its deploy commands mount,
//! and the explicit operations on volumes (attach, detach, delete).
//!
//! Invariant: a volume's data is removed only by [`delete`], on a user's
//! request naming the volume; deleting an app detaches its volumes, and a
//! node that holds a volume and goes away leaves the app waiting for it
//! instead of starting it with an empty volume elsewhere.

use cloudweb_protocol::{CommandKind, VolumeDeletePayload, VolumeMount};

use crate::error::ApiError;
use crate::store::{AttachRefusal, Attached, NewCommand, VolumeDeletion, VolumeRow};
use crate::AppState;

/// An app's instances go where its volume's data is: the scheduler's
/// `Request::pin`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pin {
    pub node: String,
    pub volume: String,
}

/// Where an app's instances must go: `Ok(None)` when the app has no
/// volume with data on a node yet (any node will do, and its volumes are
/// pinned there at placement), `Ok(Some(pin))` for the node holding them,
/// `Err(reason)` when its volumes are on different nodes.
pub fn pin_of(volumes: &[VolumeRow]) -> Result<Option<Pin>, String> {
    let mut pin: Option<Pin> = None;
    for volume in volumes {
        let Some(node) = &volume.node_id else { continue };
        match &pin {
            None => pin = Some(Pin { node: node.clone(), volume: volume.name.clone() }),
            Some(first) if first.node != *node => {
                return Err(format!(
                    "volumes {} (on node {}) and {} (on node {}) are on different nodes; an app's volumes must be on one node: detach or move one",
                    first.volume, first.node, volume.name, node
                ));
            }
            Some(_) => {}
        }
    }
    Ok(pin)
}

/// What a deploy command mounts.
pub fn mounts(volumes: &[VolumeRow]) -> Vec<VolumeMount> {
    volumes
        .iter()
        .filter_map(|v| Some(VolumeMount { name: v.name.clone(), path: v.mount_path.clone()? }))
        .collect()
}

/// Attaches (creating it when the name is new) volume `name` at `path` to
/// `app`. The change applies from the app's next deployment.
pub async fn attach(state: &AppState, app: &str, name: &str, path: &str) -> Result<Attached, ApiError> {
    cloudweb_protocol::volumes::name(name).map_err(|e| ApiError::BadRequest(e.to_string()))?;
    cloudweb_protocol::volumes::mount_path(path).map_err(|e| ApiError::BadRequest(e.to_string()))?;
    // A detached volume is mounted again only in an app of its own team.
    let volume_team = state.store.team_of(crate::store::Owned::Volume, name).await?;
    let app_team = state.store.team_of(crate::store::Owned::App, app).await?;
    if let (Some(volume_team), Some(app_team)) = (&volume_team, &app_team) {
        if volume_team != app_team {
            return Err(ApiError::Conflict(format!("the volume name {name} is taken by another team; pick another")));
        }
    }
    match state.store.attach_volume(name, app, path, state.clock.now_ms()).await? {
        Ok(attached) => {
            let (what, volume) = match &attached {
                Attached::Created(v) => ("created", v),
                Attached::Reattached(v) => ("reattached", v),
            };
            tracing::info!(app, volume = %volume.name, path, node = ?volume.node_id, "volume {what}");
            Ok(attached)
        }
        Err(AttachRefusal::NoSuchApp) => Err(ApiError::NotFound(format!("no app named {app}"))),
        Err(AttachRefusal::AttachedTo(owner)) if owner == app => {
            Err(ApiError::Conflict(format!("app {app} mounts volume {name} already")))
        }
        Err(AttachRefusal::AttachedTo(owner)) => Err(ApiError::Conflict(format!(
            "volume {name} is attached to app {owner}; detach it there first (its data stays)"
        ))),
        Err(AttachRefusal::PathTaken(other)) => Err(ApiError::Conflict(format!("app {app} mounts volume {other} at {path} already"))),
        Err(AttachRefusal::OtherNode(node, other, other_node)) => Err(ApiError::Conflict(format!(
            "volume {name} is on node {node} and app {app}'s volume {other} on node {other_node}; an app's volumes must be on one node"
        ))),
        Err(AttachRefusal::Service(service)) => Err(ApiError::Conflict(format!("volume {name} holds the data of service {service}"))),
        Err(AttachRefusal::TooMany) => Err(ApiError::Conflict(format!(
            "app {app} mounts {} volumes, the most an app may",
            crate::store::MAX_VOLUMES_PER_APP
        ))),
    }
}

/// Detaches a volume from its app (from the next deployment on); its data
/// stays on its node.
pub async fn detach(state: &AppState, app: &str, name: &str) -> Result<(), ApiError> {
    if !state.store.detach_volume(app, name).await? {
        return Err(ApiError::NotFound(format!("app {app} has no volume named {name}")));
    }
    tracing::info!(app, volume = name, "volume detached; its data stays");
    Ok(())
}

/// Deletes a detached volume and its data: the store forgets it and the
/// node that holds it gets a `volume_delete` command (durable, so a node
/// that is away deletes it when it comes back).
pub async fn delete(state: &AppState, name: &str) -> Result<VolumeRow, ApiError> {
    let now = state.clock.now_ms();
    let outcome = state
        .store
        .delete_volume(
            name,
            |volume| {
                let node = volume.node_id.clone()?;
                let payload = serde_json::to_value(VolumeDeletePayload { volume: volume.name.clone() }).expect("payload serializes");
                Some(NewCommand {
                    node_id: node.clone(),
                    kind: CommandKind::VolumeDelete.as_str().to_string(),
                    payload: state.sealer.seal_json(&crate::command_context(&node), &payload),
                })
            },
            now,
        )
        .await?;
    match outcome {
        VolumeDeletion::Deleted(volume) => {
            if let Some(node) = &volume.node_id {
                state.hub.notify(node, cloudweb_protocol::events::COMMANDS);
            }
            tracing::info!(volume = %volume.name, node = ?volume.node_id, "volume deleted on request");
            Ok(volume)
        }
        VolumeDeletion::NotFound => Err(ApiError::NotFound(format!("no volume named {name}"))),
        VolumeDeletion::Service(service) => Err(ApiError::Conflict(format!(
            "volume {name} holds the data of service {service}; delete the service with its data instead"
        ))),
        VolumeDeletion::Attached(app) => Err(ApiError::Conflict(format!(
            "volume {name} is attached to app {app}; detach it first, or delete the app with its volumes"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn volume(name: &str, node: Option<&str>) -> VolumeRow {
        VolumeRow {
            name: name.into(),
            app: Some("web".into()),
            mount_path: Some(format!("/{name}")),
            node_id: node.map(str::to_string),
            size_bytes: None,
            size_at: None,
            created_at: 0,
            service: None,
        }
    }

    #[test]
    fn the_pin_is_the_node_of_the_volumes_that_have_one() {
        assert_eq!(pin_of(&[]), Ok(None));
        assert_eq!(pin_of(&[volume("a", None)]), Ok(None));
        assert_eq!(pin_of(&[volume("a", None), volume("b", Some("n-1"))]), Ok(Some(Pin { node: "n-1".into(), volume: "b".into() })));
        assert_eq!(pin_of(&[volume("a", Some("n-1")), volume("b", Some("n-1"))]).unwrap().unwrap().node, "n-1");
        let split = pin_of(&[volume("a", Some("n-1")), volume("b", Some("n-2"))]).unwrap_err();
        assert!(split.contains("a (on node n-1) and b (on node n-2)"), "{split}");
    }

    #[test]
    fn detached_volumes_are_not_mounted() {
        let mut detached = volume("b", Some("n-1"));
        detached.app = None;
        detached.mount_path = None;
        assert_eq!(mounts(&[volume("a", None), detached]), vec![VolumeMount { name: "a".into(), path: "/a".into() }]);
    }
}
