//! The durable command queue: `GET /agent/v1/commands` and
//! `POST /agent/v1/commands/{id}/ack`. A command is delivered again and again
//! until the node acks it, so handlers on the agent must be idempotent.

use serde::{Deserialize, Serialize};

use crate::validate::{self, ValidationError};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema))]
pub struct Command {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub payload: serde_json::Value,
    /// RFC 3339, UTC.
    pub created_at: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CommandList {
    pub commands: Vec<Command>,
}

/// Command types of protocol 1. An agent acks a type it does not know after
/// reporting that it could not handle it, so the queue never jams.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommandKind {
    Deploy,
    Stop,
    /// Remove a volume's data ([`crate::volumes::VolumeDeletePayload`]).
    VolumeDelete,
    /// Run a managed service ([`crate::services::ServicePayload`]).
    ServiceRun,
    /// Stop and remove a service's container
    /// ([`crate::services::ServiceRemovePayload`]); its data stays.
    ServiceRemove,
    /// Listen for a volume's data from another node
    /// ([`crate::volume_moves::VolumeReceivePayload`]).
    VolumeReceive,
    /// Send a volume's data to another node
    /// ([`crate::volume_moves::VolumeSendPayload`]).
    VolumeSend,
    /// End a failed move on this node ([`crate::volume_moves::VolumeMoveStep`]).
    VolumeMoveAbort,
    /// Set a moved volume's old copy aside ([`crate::volume_moves::VolumeMoveStep`]).
    VolumeRelease,
    /// Delete a moved volume's old copy ([`crate::volume_moves::VolumeMoveStep`]).
    VolumePurge,
    /// Back up a volume or a service ([`crate::backups::BackupJobPayload`]).
    BackupRun,
    /// Check a snapshot by restoring it ([`crate::backups::VerifyPayload`]).
    BackupVerify,
    /// Restore a snapshot ([`crate::backups::RestorePayload`]).
    BackupRestore,
    /// Stop a backup job ([`crate::backups::BackupCancelPayload`]).
    BackupCancel,
    /// Run a task container ([`crate::tasks::TaskRunPayload`]).
    TaskRun,
    /// Kill a task container ([`crate::tasks::TaskCancelPayload`]).
    TaskCancel,
    /// Dial back for an exec or port-forward session
    /// ([`crate::sessions::SessionOpenPayload`]).
    SessionOpen,
}

impl CommandKind {
    pub fn as_str(self) -> &'static str {
        match self {
            CommandKind::Deploy => "deploy",
            CommandKind::Stop => "stop",
            CommandKind::VolumeDelete => "volume_delete",
            CommandKind::ServiceRun => "service_run",
            CommandKind::ServiceRemove => "service_remove",
            CommandKind::VolumeReceive => "volume_receive",
            CommandKind::VolumeSend => "volume_send",
            CommandKind::VolumeMoveAbort => "volume_move_abort",
            CommandKind::VolumeRelease => "volume_release",
            CommandKind::VolumePurge => "volume_purge",
            CommandKind::BackupRun => "backup_run",
            CommandKind::BackupVerify => "backup_verify",
            CommandKind::BackupRestore => "backup_restore",
            CommandKind::BackupCancel => "backup_cancel",
            CommandKind::TaskRun => "task_run",
            CommandKind::TaskCancel => "task_cancel",
            CommandKind::SessionOpen => "session_open",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "deploy" => Some(CommandKind::Deploy),
            "stop" => Some(CommandKind::Stop),
            "volume_delete" => Some(CommandKind::VolumeDelete),
            "service_run" => Some(CommandKind::ServiceRun),
            "service_remove" => Some(CommandKind::ServiceRemove),
            "volume_receive" => Some(CommandKind::VolumeReceive),
            "volume_send" => Some(CommandKind::VolumeSend),
            "volume_move_abort" => Some(CommandKind::VolumeMoveAbort),
            "volume_release" => Some(CommandKind::VolumeRelease),
            "volume_purge" => Some(CommandKind::VolumePurge),
            "backup_run" => Some(CommandKind::BackupRun),
            "backup_verify" => Some(CommandKind::BackupVerify),
            "backup_restore" => Some(CommandKind::BackupRestore),
            "backup_cancel" => Some(CommandKind::BackupCancel),
            "task_run" => Some(CommandKind::TaskRun),
            "task_cancel" => Some(CommandKind::TaskCancel),
            "session_open" => Some(CommandKind::SessionOpen),
            _ => None,
        }
    }
}

/// Payload of `stop`: stop and remove this node's containers of a deployment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StopPayload {
    pub deployment_id: String,
    /// Only this instance; every instance of the deployment on the node
    /// when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl StopPayload {
    pub fn validate(&self) -> Result<(), ValidationError> {
        validate::token("deployment_id", &self.deployment_id, 64)?;
        if let Some(reason) = &self.reason {
            validate::bounded_text("reason", reason, 512)?;
        }
        Ok(())
    }
}
