//! Executing queued commands. A command is acked only once it was handled
//! (or found impossible to handle); a transient failure such as an
//! unreachable Docker Engine leaves it un-acked, so the control plane
//! delivers it again. Ids already handled are remembered on disk so a lost
//! ack does not run a command twice.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use cloudweb_protocol::{Command, CommandKind, DeployPayload, LogLine, Report, StopPayload};

use crate::client::ControlPlane;
use crate::deploy::{DeployOptions, DeployOutcome};
use crate::identity::write_private;
use crate::runtime::{DockerRuntime, RuntimeError};

const HANDLED_FILE: &str = "handled-commands.json";
/// How many handled ids to remember.
const HANDLED_MEMORY: usize = 1000;

/// What became of one command.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Done (or impossible); ack it.
    Handled,
    /// Could not be done now; leave it queued.
    Retry(String),
}

pub struct Executor {
    runtime: DockerRuntime,
    deploy_options: DeployOptions,
    handled_path: PathBuf,
    handled: VecDeque<String>,
}

impl Executor {
    pub fn new(runtime: DockerRuntime, data_dir: &Path, deploy_options: DeployOptions) -> Executor {
        let handled_path = data_dir.join(HANDLED_FILE);
        let handled = std::fs::read(&handled_path)
            .ok()
            .and_then(|bytes| serde_json::from_slice::<VecDeque<String>>(&bytes).ok())
            .unwrap_or_default();
        Executor { runtime, deploy_options, handled_path, handled }
    }

    /// Handles every pending command in order, acking the ones that are done.
    pub async fn run_pending(&mut self, client: &Arc<ControlPlane>) -> Result<(), crate::client::ClientError> {
        let pending = client.commands().await?;
        for command in pending.commands {
            if !self.handled.contains(&command.id) {
                match self.execute(client, &command).await {
                    Outcome::Handled => self.remember(&command.id),
                    Outcome::Retry(reason) => {
                        tracing::warn!(command = %command.id, kind = %command.kind, %reason, "command will be retried");
                        // Later commands may depend on this one: keep order.
                        break;
                    }
                }
            }
            client.ack(&command.id).await?;
            tracing::info!(command = %command.id, kind = %command.kind, "command acked");
        }
        Ok(())
    }

    async fn execute(&mut self, client: &Arc<ControlPlane>, command: &Command) -> Outcome {
        match CommandKind::parse(&command.kind) {
            Some(CommandKind::Stop) => self.stop(client, command).await,
            Some(CommandKind::Deploy) => self.deploy(client, command).await,
            None => {
                // Nothing to report to: an unknown type names no deployment.
                tracing::error!(command = %command.id, kind = %command.kind, "this agent cannot handle this command type; dropping it");
                Outcome::Handled
            }
        }
    }

    async fn deploy(&mut self, client: &Arc<ControlPlane>, command: &Command) -> Outcome {
        let payload: DeployPayload = match serde_json::from_value(command.payload.clone()) {
            Ok(payload) => payload,
            Err(err) => {
                tracing::error!(command = %command.id, error = %err, "invalid deploy payload");
                // Tell the control plane if the payload at least names its deployment.
                if let Some(id) = command.payload.get("deployment_id").and_then(|v| v.as_str()) {
                    let report = Report {
                        deployment_id: id.to_string(),
                        state: Some("failed".into()),
                        message: Some(format!("the agent could not read the deploy command: {err}")),
                        image: None,
                        instance: command.payload.get("instance").and_then(|v| v.as_u64()).map(|i| i as u32),
                        address: None,
                        logs: Vec::new(),
                    };
                    if report.validate().is_ok() {
                        let _ = client.report(&report).await;
                    }
                }
                return Outcome::Handled;
            }
        };
        tracing::info!(command = %command.id, deployment = %payload.deployment_id, instance = payload.instance, "deploying");
        match crate::deploy::deploy(&self.runtime, client, &self.deploy_options, payload).await {
            DeployOutcome::Done => Outcome::Handled,
            DeployOutcome::Retry(reason) => Outcome::Retry(reason),
        }
    }

    async fn stop(&mut self, client: &ControlPlane, command: &Command) -> Outcome {
        let payload: StopPayload = match serde_json::from_value(command.payload.clone()) {
            Ok(payload) => payload,
            Err(err) => {
                tracing::error!(command = %command.id, error = %err, "invalid stop payload; dropping the command");
                return Outcome::Handled;
            }
        };
        if let Err(err) = payload.validate() {
            tracing::error!(command = %command.id, error = %err, "invalid stop payload; dropping the command");
            return Outcome::Handled;
        }
        match self.runtime.stop_deployment(&payload.deployment_id, payload.instance).await {
            Ok(count) => {
                let line = format!("stopped {count} container(s) of {}", payload.deployment_id);
                tracing::info!(command = %command.id, "{line}");
                let report = Report {
                    deployment_id: payload.deployment_id.clone(),
                    state: payload.instance.map(|_| "stopped".to_string()),
                    message: None,
                    image: None,
                    instance: payload.instance,
                    address: None,
                    logs: vec![LogLine { ts: now_rfc3339(), stream: "agent".into(), line }],
                };
                if let Err(err) = client.report(&report).await {
                    tracing::warn!(error = %err, "could not report the stop");
                }
                Outcome::Handled
            }
            Err(RuntimeError::Unavailable(reason)) => Outcome::Retry(reason),
            Err(RuntimeError::Engine(err)) => Outcome::Retry(err.to_string()),
            Err(RuntimeError::Failed(reason)) => Outcome::Retry(reason),
        }
    }

    fn remember(&mut self, id: &str) {
        self.handled.push_back(id.to_string());
        while self.handled.len() > HANDLED_MEMORY {
            self.handled.pop_front();
        }
        let bytes = serde_json::to_vec(&self.handled).expect("ids serialize");
        if let Err(err) = write_private(&self.handled_path, &bytes) {
            tracing::warn!(error = %err, "could not record handled commands");
        }
    }
}

pub fn now_rfc3339() -> String {
    time::OffsetDateTime::now_utc().format(&time::format_description::well_known::Rfc3339).unwrap_or_default()
}
