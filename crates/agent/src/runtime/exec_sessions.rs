//! What an exec or port-forward session (see [`crate::sessions`]) needs of
//! the Docker Engine: a process started in an app's container with its
//! streams attached (and a terminal, when asked), its resize, its status,
//! and the container's own address for a forwarded port.

use std::net::IpAddr;
use std::pin::Pin;

use bollard::container::LogOutput;
use bollard::exec::{StartExecOptions, StartExecResults};
use bollard::models::ExecConfig;
use bollard::query_parameters::ResizeExecOptions;
use futures_util::Stream;
use tokio::io::AsyncWrite;

use super::{DockerRuntime, RuntimeError, LABEL_NODE};

/// A started exec: its id, its output, its input.
pub struct Exec {
    pub id: String,
    pub output: Pin<Box<dyn Stream<Item = Result<LogOutput, bollard::errors::Error>> + Send>>,
    pub input: Pin<Box<dyn AsyncWrite + Send>>,
}

/// An exec's state, from the Engine.
#[derive(Debug, Clone, Copy)]
pub struct ExecStatus {
    pub running: bool,
    pub exit_code: Option<i64>,
    /// Its process on this host.
    pub pid: Option<i64>,
}

impl DockerRuntime {
    /// Checks that `container` is one of this node's and runs; its
    /// addresses on its networks.
    pub async fn session_container(&self, container: &str) -> Result<Vec<IpAddr>, RuntimeError> {
        let inspect = match self.docker()?.inspect_container(container, None::<bollard::query_parameters::InspectContainerOptions>).await {
            Ok(inspect) => inspect,
            Err(bollard::errors::Error::DockerResponseServerError { status_code: 404, .. }) => {
                return Err(RuntimeError::Failed(format!("container {container} does not exist on this node")))
            }
            Err(err) => return Err(err.into()),
        };
        let ours = inspect.config.as_ref().and_then(|c| c.labels.as_ref()).and_then(|l| l.get(LABEL_NODE)).is_some_and(|n| n == self.node_id());
        if !ours {
            return Err(RuntimeError::Failed(format!("container {container} is not one of this node's")));
        }
        if !inspect.state.as_ref().and_then(|s| s.running).unwrap_or(false) {
            return Err(RuntimeError::Failed(format!("container {container} is not running")));
        }
        let addresses = inspect
            .network_settings
            .and_then(|n| n.networks)
            .map(|networks| networks.into_values().filter_map(|n| n.ip_address.filter(|ip| !ip.is_empty())?.parse().ok()).collect())
            .unwrap_or_default();
        Ok(addresses)
    }

    /// Starts `command` in `container` with its streams attached, in a
    /// terminal of `cols` × `rows` when `tty`. The container's environment
    /// is the process's (with `TERM` for a terminal).
    pub async fn exec_start(&self, container: &str, command: &[String], tty: bool, size: (u16, u16)) -> Result<Exec, RuntimeError> {
        let docker = self.docker()?;
        let config = ExecConfig {
            cmd: Some(command.to_vec()),
            attach_stdin: Some(true),
            attach_stdout: Some(true),
            attach_stderr: Some(true),
            tty: Some(tty),
            env: tty.then(|| vec!["TERM=xterm-256color".to_string()]),
            console_size: tty.then(|| vec![usize::from(size.1), usize::from(size.0)]),
            ..Default::default()
        };
        let created = docker.create_exec(container, config).await?;
        let options = StartExecOptions { detach: false, tty, output_capacity: Some(64 * 1024) };
        match docker.start_exec(&created.id, Some(options)).await? {
            StartExecResults::Attached { output, input } => Ok(Exec { id: created.id, output, input }),
            StartExecResults::Detached => Err(RuntimeError::Failed("the Engine started the exec detached".to_string())),
        }
    }

    pub async fn exec_resize(&self, id: &str, cols: u16, rows: u16) -> Result<(), RuntimeError> {
        let options = ResizeExecOptions { h: i32::from(rows), w: i32::from(cols) };
        self.docker()?.resize_exec(id, options).await?;
        Ok(())
    }

    pub async fn exec_status(&self, id: &str) -> Result<ExecStatus, RuntimeError> {
        let inspect = self.docker()?.inspect_exec(id).await?;
        Ok(ExecStatus { running: inspect.running.unwrap_or(false), exit_code: inspect.exit_code, pid: inspect.pid })
    }
}
