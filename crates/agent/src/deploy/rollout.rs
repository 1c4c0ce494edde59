//! A `recreate` rollout on the node: the app's older instances stop
//! before the new one starts, and the downtime is logged.

use super::{DeployPayload, DockerRuntime, Failure, LogShipper};

/// A `recreate` rollout stops the app's older instances on this node
/// before this one starts (for apps that cannot share their files with a
/// second copy); returns when they stopped, to measure the downtime.
pub(super) async fn recreate(runtime: &DockerRuntime, payload: &DeployPayload, logs: &LogShipper) -> Result<Option<std::time::Instant>, Failure> {
    if !payload.recreate {
        return Ok(None);
    }
    let number = payload.container_name().rsplit('-').next().and_then(|n| n.parse::<u64>().ok()).unwrap_or(0);
    let stopped = runtime.stop_older_instances(&payload.app, number).await?;
    logs.line("agent", format!("recreate: stopped {stopped} older instance(s) of {} on this node before starting this one", payload.app));
    Ok(Some(std::time::Instant::now()))
}

/// Says how long a `recreate` rollout left the app with nothing running.
pub(super) fn downtime(stopped_at: Option<std::time::Instant>, logs: &LogShipper) {
    if let Some(at) = stopped_at {
        logs.line("agent", format!("recreate: downtime {} ms (older instances stopped -> this one healthy)", at.elapsed().as_millis()));
    }
}

