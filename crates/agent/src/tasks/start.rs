//! Getting a run going: its image made sure of, its container created and
//! started, or the container found under its name taken up where it is
//! (started when an agent stopped between create and start, waited for
//! while it runs, settled once it exited); then its waiting handed to
//! [`super::drive`].

use std::time::Duration;

use cloudweb_protocol::tasks::{container_name, MAX_TIMEOUT_SECONDS};
use cloudweb_protocol::{TaskRunPayload, TaskState};
use tokio::sync::watch;

use super::drive::{self, Watch};
use super::{final_report, is_transient, plan, remaining, Claim, Plan, Taken, Tasks};
use crate::deploy::registry_retry::{with_registry_retry, REGISTRY_RETRY_DELAYS};
use crate::deploy::RegistryError;
use crate::redact::Redactor;
use crate::runtime::{engine_message, RuntimeError, TaskContainer, TaskSpec};

/// Work handed on, or the slot given back with why it must be tried again.
pub(super) type Outcome = Result<Taken, (Claim, String)>;

/// The cancel's reason, once one came.
fn cancelled(cancel: &watch::Receiver<Option<String>>) -> Option<String> {
    cancel.borrow().clone()
}

/// A `task_run` of a run nothing works on and that did not end before;
/// called holding its slot.
pub(super) async fn start(tasks: &Tasks, claim: Claim, cancel: watch::Receiver<Option<String>>, payload: &TaskRunPayload) -> Taken {
    let run_id = payload.run_id.clone();
    let cancel_seen = cancel.clone();
    match begin(tasks, claim, cancel, payload).await {
        Ok(taken) => taken,
        // Still holding the slot, so a give-up's record is made before
        // anything else may look.
        Err((claim, reason)) => {
            // A cancel came while the start was under way (its command is
            // acked): the run ends here, or the command delivered again
            // would start it after its cancel.
            if let Some(why) = cancelled(&cancel_seen) {
                tasks.inner.retrying.lock().expect("retry lock").remove(&run_id);
                tasks.conclude(&run_id, final_report(TaskState::Cancelled, None, Some(why)), &Redactor::default()).await;
                drop(claim);
                return Taken::Cancelled;
            }
            let taken = tasks.retry(&run_id, reason).await;
            drop(claim);
            taken
        }
    }
}

async fn begin(tasks: &Tasks, claim: Claim, cancel: watch::Receiver<Option<String>>, payload: &TaskRunPayload) -> Outcome {
    let runtime = &tasks.inner.runtime;
    let run_id = payload.run_id.as_str();
    let redactor = Redactor::new(&payload.env);
    let found = match runtime.task_container(run_id).await {
        Ok(found) => found,
        Err(err) => return Err((claim, format!("cannot look for the task's container: {err}"))),
    };
    match (plan(found.as_ref()), found) {
        (Plan::Create, _) => {}
        (Plan::Foreign, _) => return Ok(foreign(tasks, run_id).await),
        (_, Some(container)) => {
            tracing::info!(run_id, status = %container.status, "the task run's container exists (a command delivered again, or an agent restarted); taking it up");
            return adopt(tasks, claim, cancel, container, Some(payload)).await;
        }
        (_, None) => unreachable!("only Create has no container"),
    }
    match ensure_image(tasks, &payload.image).await {
        Ok(()) => {}
        Err(RegistryError::Retry(reason)) => return Err((claim, reason)),
        Err(RegistryError::Failed(reason)) => {
            tasks.conclude(run_id, final_report(TaskState::Failed, None, Some(format!("could not get the image: {reason}"))), &redactor).await;
            return Ok(Taken::Failed);
        }
    }
    if let Some(reason) = cancelled(&cancel) {
        tasks.conclude(run_id, final_report(TaskState::Cancelled, None, Some(reason)), &redactor).await;
        return Ok(Taken::Cancelled);
    }
    let spec = TaskSpec {
        run_id: run_id.to_string(),
        app: payload.app.clone(),
        image: payload.image.clone(),
        env: payload.env.iter().map(|(name, value)| format!("{name}={value}")).collect(),
        command: payload.command.clone(),
        timeout_seconds: payload.timeout_seconds,
        nano_cpus: payload.cpu.map(|cpu| (cpu * 1e9) as i64),
        memory_bytes: payload.memory_bytes.and_then(|m| i64::try_from(m).ok()),
    };
    let id = match runtime.create_task(&spec).await {
        Ok(id) => id,
        Err(err) if is_transient(&err) => return Err((claim, format!("cannot create the task's container: {err}"))),
        Err(err) if err.is_conflict() => {
            // A create of a killed agent that the Engine finished after
            // the look above: that container is the run's.
            return match runtime.task_container(run_id).await {
                Ok(Some(container)) if container.ours => adopt(tasks, claim, cancel, container, Some(payload)).await,
                Ok(Some(_)) => Ok(foreign(tasks, run_id).await),
                Ok(None) => Err((claim, "the task's container name was taken, then freed; trying again".to_string())),
                Err(err) => Err((claim, format!("cannot look for the task's container: {err}"))),
            };
        }
        Err(err) => {
            let message = format!("could not create the task's container: {}", engine_message(&err));
            tasks.conclude(run_id, final_report(TaskState::Failed, None, Some(message)), &redactor).await;
            return Ok(Taken::Failed);
        }
    };
    let container = TaskContainer { id, ours: true, status: "created".into(), ..Default::default() };
    Ok(match start_created(tasks, claim, cancel, container, payload.timeout_seconds, payload.memory_bytes, redactor).await? {
        Taken::Adopted => {
            tracing::info!(run_id, app = %payload.app, image = %payload.image, timeout_seconds = payload.timeout_seconds, "task run started");
            Taken::Started
        }
        other => other,
    })
}

/// A container named after the run that is not this node's container of
/// it: left alone, and the run reported `failed`.
async fn foreign(tasks: &Tasks, run_id: &str) -> Taken {
    let message = format!(
        "a container named {} exists on this node's Docker Engine and is not this node's container of the run; it was left alone",
        container_name(run_id)
    );
    tasks.conclude(run_id, final_report(TaskState::Failed, None, Some(message)), &Redactor::default()).await;
    Taken::Failed
}

/// Takes up the run's existing container (this node's): `payload` is the
/// run's `task_run` when at hand; without it (a sweep, a cancel) its
/// variables are read from the container (to redact them) and its limit
/// from its label.
pub(super) async fn adopt(
    tasks: &Tasks,
    claim: Claim,
    cancel: watch::Receiver<Option<String>>,
    container: TaskContainer,
    payload: Option<&TaskRunPayload>,
) -> Outcome {
    let runtime = &tasks.inner.runtime;
    let run_id = claim.run_id.clone();
    let env = match payload {
        Some(payload) => payload.env.clone(),
        None => match runtime.app_env(&container.id).await {
            Ok(env) => env,
            Err(err) => return Err((claim, format!("cannot read the task container's variables: {err}"))),
        },
    };
    let redactor = Redactor::new(&env);
    let timeout_seconds = payload.map(|p| p.timeout_seconds).or(container.timeout_seconds).unwrap_or(MAX_TIMEOUT_SECONDS);
    let memory_bytes = payload.and_then(|p| p.memory_bytes);
    match plan(Some(&container)) {
        Plan::Create => unreachable!("a container is there"),
        Plan::Foreign => Ok(foreign(tasks, &run_id).await),
        Plan::NeverStarted(error) => {
            let message = format!("the task's command could not be started: {error}");
            tasks.conclude(&run_id, final_report(TaskState::Failed, None, Some(message)), &redactor).await;
            drive::remove_container(runtime, &container.id, &run_id).await;
            Ok(Taken::Failed)
        }
        Plan::Start => start_created(tasks, claim, cancel, container, timeout_seconds, memory_bytes, redactor).await,
        Plan::Wait => {
            let left = remaining(timeout_seconds, container.started_at.as_deref(), time::OffsetDateTime::now_utc());
            tracing::info!(run_id, seconds_left = left.as_secs(), "waiting for a running task container");
            let watch = Watch {
                container_id: container.id,
                redactor,
                deadline: Some(tokio::time::Instant::now() + left),
                timeout_seconds,
                memory_bytes,
                report_running: true,
            };
            tokio::spawn(drive::drive(tasks.clone(), claim, cancel, watch));
            Ok(Taken::Adopted)
        }
        Plan::Settle => {
            let watch = Watch { container_id: container.id, redactor, deadline: None, timeout_seconds, memory_bytes, report_running: false };
            tokio::spawn(drive::drive(tasks.clone(), claim, cancel, watch));
            Ok(Taken::Adopted)
        }
    }
}

/// Starts a created container of the run and hands its waiting on
/// (`Adopted`); a start Docker refuses (the program is not in the image)
/// is reported `failed`, and the container removed.
async fn start_created(
    tasks: &Tasks,
    claim: Claim,
    cancel: watch::Receiver<Option<String>>,
    container: TaskContainer,
    timeout_seconds: u32,
    memory_bytes: Option<u64>,
    redactor: Redactor,
) -> Outcome {
    let runtime = &tasks.inner.runtime;
    let run_id = claim.run_id.clone();
    if let Some(reason) = cancelled(&cancel) {
        tasks.conclude(&run_id, final_report(TaskState::Cancelled, None, Some(reason)), &redactor).await;
        drive::remove_container(runtime, &container.id, &run_id).await;
        return Ok(Taken::Cancelled);
    }
    match runtime.start_task(&container.id).await {
        Ok(()) => {}
        // Created, not started: the next try starts it.
        Err(err) if is_transient(&err) => return Err((claim, format!("cannot start the task's container: {err}"))),
        Err(err) => {
            let message = format!("the task's command could not be started: {}", engine_message(&err));
            tasks.conclude(&run_id, final_report(TaskState::Failed, None, Some(message)), &redactor).await;
            drive::remove_container(runtime, &container.id, &run_id).await;
            return Ok(Taken::Failed);
        }
    }
    let watch = Watch {
        container_id: container.id,
        redactor,
        deadline: Some(tokio::time::Instant::now() + Duration::from_secs(u64::from(timeout_seconds))),
        timeout_seconds,
        memory_bytes,
        report_running: true,
    };
    tokio::spawn(drive::drive(tasks.clone(), claim, cancel, watch));
    Ok(Taken::Adopted)
}

/// Pulls the image when the node lacks it, with the cluster registry's
/// credentials, tried again while the registry restarts (as a deploy's
/// pull). An Engine that does not answer, or a control plane that does
/// not give the registry's settings, is worth another try later.
async fn ensure_image(tasks: &Tasks, image: &str) -> Result<(), RegistryError> {
    let runtime = &tasks.inner.runtime;
    let classify = |err: RuntimeError| if is_transient(&err) { RegistryError::Retry(err.to_string()) } else { RegistryError::Failed(err.to_string()) };
    if runtime.image_exists(image).await.map_err(classify)? {
        return Ok(());
    }
    let registry = tasks.inner.reporter.registry().await?;
    let what = format!("pull of {image}");
    with_registry_retry(&REGISTRY_RETRY_DELAYS, |_| {}, &what, || runtime.ensure_image(image, registry.as_ref())).await.map_err(classify)?;
    tracing::info!(image, "pulled the task's image");
    Ok(())
}
