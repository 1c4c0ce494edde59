//! What backup jobs ask of the Docker Engine: pausing the containers of a
//! volume for a snapshot, commands run in a container with their input and
//! output streamed (a dump out of `pg_dump`, a dump into `pg_restore`), and
//! throwaway database containers, labelled with their job so that an agent
//! restarted after a kill removes the ones its predecessor left.

use std::collections::HashMap;
use std::pin::Pin;
use std::time::Duration;

use bollard::models::{ContainerCreateBody, ExecConfig, HostConfig, Mount, MountTypeEnum};
use bollard::query_parameters::{CreateContainerOptionsBuilder, ListContainersOptionsBuilder, StopContainerOptionsBuilder};
use futures_util::StreamExt;
use tokio::io::{AsyncWrite, AsyncWriteExt, DuplexStream};

use super::{DockerRuntime, RuntimeError, LABEL_NODE};
use crate::runtime::containers::LABEL_ROLE;

/// `cloudweb.role` of the containers a verify or restore runs a database in.
pub const ROLE_BACKUP: &str = "backup-throwaway";
/// The job a throwaway container belongs to.
pub const LABEL_BACKUP_JOB: &str = "cloudweb.backup-job";

/// Most bytes of a command's error output kept.
const MAX_CAPTURED: usize = 16 * 1024;

/// A throwaway database container: no published port, no network but its
/// own loopback, no restart policy; its data in `data_dir`.
#[derive(Debug, Clone)]
pub struct Throwaway {
    pub job_id: String,
    pub image: String,
    pub env: Vec<String>,
    /// Arguments after the image's entrypoint; empty for its default.
    pub command: Vec<String>,
    /// Host directory mounted at `data_path`.
    pub data_dir: String,
    pub data_path: String,
}

/// A command running in a container, attached: its standard input to
/// write to, its standard output as a stream (when asked for), and the
/// rest of its output kept for an error message.
pub struct AttachedExec {
    pub input: Pin<Box<dyn AsyncWrite + Send>>,
    /// Standard output, when the exec was started with `stream_stdout`.
    pub stdout: Option<DuplexStream>,
    reader: Option<tokio::task::JoinHandle<Result<String, RuntimeError>>>,
    docker: bollard::Docker,
    exec_id: String,
}

impl AttachedExec {
    /// The Engine's id of the exec, recorded so that a later agent can
    /// kill it if this one dies first.
    pub fn id(&self) -> &str {
        &self.exec_id
    }

    /// Closes its input, waits for its end: its exit code and its
    /// captured output (standard error, and standard output when it was
    /// not streamed).
    pub async fn finish(mut self) -> Result<(Option<i64>, String), RuntimeError> {
        let _ = self.input.shutdown().await;
        let reader = self.reader.take().expect("finished once");
        let text = match reader.await {
            Ok(result) => result?,
            Err(err) => return Err(RuntimeError::Failed(format!("the exec's output reader stopped: {err}"))),
        };
        // The stream ends as the process does; the Engine may take a
        // moment more to record its exit code.
        for _ in 0..50 {
            let inspect = self.docker.inspect_exec(&self.exec_id).await?;
            if inspect.running != Some(true) {
                return Ok((inspect.exit_code, text));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok((None, text))
    }
}

impl Drop for AttachedExec {
    /// Given up on before its end (a job cancelled or over its time): the
    /// command is killed, so no `pg_dump` goes on inside the service's
    /// container for nobody.
    fn drop(&mut self) {
        let Some(reader) = self.reader.take() else { return };
        reader.abort();
        let (docker, exec_id) = (self.docker.clone(), self.exec_id.clone());
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(async move {
                let Ok(inspect) = docker.inspect_exec(&exec_id).await else { return };
                if let (Some(true), Some(pid)) = (inspect.running, inspect.pid.filter(|p| *p > 1)) {
                    let pid = nix::unistd::Pid::from_raw(pid as i32);
                    match nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL) {
                        Ok(()) => tracing::info!(exec = %exec_id, pid = %pid, "killed a command given up on"),
                        Err(err) => tracing::warn!(exec = %exec_id, pid = %pid, error = %err, "could not kill a command given up on"),
                    }
                }
            });
        }
    }
}

impl DockerRuntime {
    /// Pauses a running container (its processes frozen, nothing lost).
    pub async fn pause(&self, id: &str) -> Result<(), RuntimeError> {
        Ok(self.docker()?.pause_container(id).await?)
    }

    /// Unpauses a container; one that is not paused or is gone is fine.
    pub async fn unpause(&self, id: &str) -> Result<(), RuntimeError> {
        match self.docker()?.unpause_container(id).await {
            Ok(()) | Err(bollard::errors::Error::DockerResponseServerError { status_code: 404 | 409, .. }) => Ok(()),
            Err(err) => Err(err.into()),
        }
    }

    /// Starts `cmd` in `container` (a name or id) with `env` as the exec's
    /// own environment (secrets travel there, never on a command line).
    pub async fn exec_attached(&self, container: &str, cmd: &[String], env: &[String], stream_stdout: bool) -> Result<AttachedExec, RuntimeError> {
        self.exec_attached_recorded(container, cmd, env, stream_stdout, |_| Ok(())).await
    }

    /// [`DockerRuntime::exec_attached`], calling `record` with the exec's
    /// id after it is created and before it starts: a caller that records
    /// it (to kill it after a restart) never has a running exec it has not
    /// recorded. A `record` error stops it before it starts.
    pub async fn exec_attached_recorded(
        &self,
        container: &str,
        cmd: &[String],
        env: &[String],
        stream_stdout: bool,
        record: impl FnOnce(&str) -> Result<(), String>,
    ) -> Result<AttachedExec, RuntimeError> {
        let docker = self.docker()?;
        let config = ExecConfig {
            cmd: Some(cmd.to_vec()),
            env: (!env.is_empty()).then(|| env.to_vec()),
            attach_stdin: Some(true),
            attach_stdout: Some(true),
            attach_stderr: Some(true),
            ..Default::default()
        };
        let created = docker.create_exec(container, config).await?;
        record(&created.id).map_err(RuntimeError::Failed)?;
        let bollard::exec::StartExecResults::Attached { mut output, input } = docker.start_exec(&created.id, None).await? else {
            return Err(RuntimeError::Failed("the Docker Engine did not attach to the command".into()));
        };
        let (stdout, mut writer) = if stream_stdout {
            let (reader, writer) = tokio::io::duplex(256 * 1024);
            (Some(reader), Some(writer))
        } else {
            (None, None)
        };
        let reader = tokio::spawn(async move {
            let mut text = String::new();
            while let Some(item) = output.next().await {
                let (is_stdout, bytes) = match item? {
                    bollard::container::LogOutput::StdOut { message } | bollard::container::LogOutput::Console { message } => (true, message),
                    bollard::container::LogOutput::StdErr { message } => (false, message),
                    bollard::container::LogOutput::StdIn { .. } => continue,
                };
                match (&mut writer, is_stdout) {
                    (Some(writer), true) => {
                        if let Err(err) = writer.write_all(&bytes).await {
                            return Err(RuntimeError::Failed(format!("the command's output could not be passed on: {err}")));
                        }
                    }
                    _ => {
                        if text.len() < MAX_CAPTURED {
                            text.push_str(&String::from_utf8_lossy(&bytes));
                        }
                    }
                }
            }
            if let Some(mut writer) = writer {
                let _ = writer.shutdown().await;
            }
            Ok(text)
        });
        Ok(AttachedExec { input, stdout, reader: Some(reader), docker, exec_id: created.id })
    }

    /// Kills exec `exec_id` (a dump this agent, or an earlier one,
    /// started in a service's container) if it still runs: true when it
    /// did. An exec the Engine no longer knows is gone already.
    pub async fn kill_exec(&self, exec_id: &str) -> Result<bool, RuntimeError> {
        let docker = self.docker()?;
        let exec = match docker.inspect_exec(exec_id).await {
            Ok(exec) => exec,
            Err(bollard::errors::Error::DockerResponseServerError { status_code: 404, .. }) => return Ok(false),
            Err(err) => return Err(err.into()),
        };
        let Some(pid) = exec.pid.filter(|p| *p > 1 && exec.running == Some(true)) else { return Ok(false) };
        let pid = nix::unistd::Pid::from_raw(pid as i32);
        match nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL) {
            Ok(()) | Err(nix::errno::Errno::ESRCH) => Ok(true),
            Err(err) => Err(RuntimeError::Failed(format!("could not kill exec {exec_id} (pid {pid}): {err}"))),
        }
    }

    /// Runs `cmd` in `container` to its end within `limit`, its input
    /// closed at once: its exit code (None when it ran over) and output.
    pub async fn exec_output(&self, container: &str, cmd: &[String], env: &[String], limit: Duration) -> Result<(Option<i64>, String), RuntimeError> {
        let run = async {
            let exec = self.exec_attached(container, cmd, env, false).await?;
            exec.finish().await
        };
        match tokio::time::timeout(limit, run).await {
            Ok(result) => result,
            Err(_) => Ok((None, String::new())),
        }
    }

    /// Creates and starts a throwaway container (any leftover of the same
    /// job is removed first); its id.
    pub async fn start_throwaway(&self, spec: &Throwaway) -> Result<String, RuntimeError> {
        let docker = self.docker()?;
        let name = throwaway_name(&spec.job_id);
        self.kill_and_remove(&name).await?;
        let labels = HashMap::from([
            (LABEL_NODE.to_string(), self.node_id.clone()),
            (LABEL_ROLE.to_string(), ROLE_BACKUP.to_string()),
            (LABEL_BACKUP_JOB.to_string(), spec.job_id.clone()),
        ]);
        let body = ContainerCreateBody {
            image: Some(spec.image.clone()),
            env: Some(spec.env.clone()),
            cmd: (!spec.command.is_empty()).then(|| spec.command.clone()),
            labels: Some(labels),
            host_config: Some(HostConfig {
                // Its own loopback only: nothing reaches the copy, and it
                // reaches nothing.
                network_mode: Some("none".into()),
                mounts: Some(vec![Mount {
                    source: Some(spec.data_dir.clone()),
                    target: Some(spec.data_path.clone()),
                    typ: Some(MountTypeEnum::BIND),
                    read_only: Some(false),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        };
        self.changed();
        let created = docker.create_container(Some(CreateContainerOptionsBuilder::new().name(&name).build()), body).await?;
        if let Err(err) = docker.start_container(&created.id, None::<bollard::query_parameters::StartContainerOptions>).await {
            let _ = self.kill_and_remove(&created.id).await;
            return Err(err.into());
        }
        Ok(created.id)
    }

    /// Stops a container with `grace_seconds` to exit on its own; its exit
    /// code.
    pub async fn stop_within(&self, id: &str, grace_seconds: i32) -> Result<Option<i64>, RuntimeError> {
        let docker = self.docker()?;
        self.changed();
        match docker.stop_container(id, Some(StopContainerOptionsBuilder::new().t(grace_seconds).build())).await {
            Ok(()) | Err(bollard::errors::Error::DockerResponseServerError { status_code: 304, .. }) => {}
            Err(err) => return Err(err.into()),
        }
        Ok(self.container_state(id).await?.exit_code)
    }

    /// This node's throwaway containers, running or not, as (id, job).
    pub async fn throwaways(&self) -> Result<Vec<(String, String)>, RuntimeError> {
        let labels = vec![format!("{LABEL_NODE}={}", self.node_id), format!("{LABEL_ROLE}={ROLE_BACKUP}")];
        let filters = HashMap::from([("label", labels)]);
        let containers = self.docker()?.list_containers(Some(ListContainersOptionsBuilder::new().all(true).filters(&filters).build())).await?;
        Ok(containers
            .into_iter()
            .filter_map(|c| {
                let job = c.labels.as_ref().and_then(|l| l.get(LABEL_BACKUP_JOB).cloned()).unwrap_or_default();
                Some((c.id?, job))
            })
            .collect())
    }
}

/// The name of a job's throwaway container (a dot no app name has).
pub fn throwaway_name(job_id: &str) -> String {
    format!("cw-backup.{job_id}")
}
