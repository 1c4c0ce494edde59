//! What an agent's report does to a deployment: checked first (the
//! sending node must hold the instance), then applied: the commit is fixed
//! once, steps move the deployment along (late reports of passed steps
//! change nothing), and an instance reporting running may settle the
//! deployment as the app's running one, or supersede it when a newer one
//! was requested.

use cloudweb_protocol::Report;

use super::state::DeploymentState;
use super::{fail, place_instances, retire_replaced, transition};
use crate::error::ApiError;
use crate::store::{DeploymentRow, InstanceRow, InstanceUpdate};
use crate::AppState;

/// Refuses a report that the sending node has no business making: an
/// unknown deployment (404; also one deleted with its app), an unknown
/// instance (400), or an instance that is not placed on this node (403).
/// A report that names no instance and carries no state (log lines of a
/// whole-deployment stop) needs some instance of the deployment on the node.
pub async fn check_report(state: &AppState, node_id: &str, report: &Report) -> Result<(), ApiError> {
    if state.store.deployment(&report.deployment_id).await?.is_none() {
        return Err(ApiError::NotFound(format!("no deployment {}", report.deployment_id)));
    }
    let instances = state.store.instances(&report.deployment_id).await?;
    let placed = |i: &InstanceRow| i.node_id.as_deref() == Some(node_id);
    match (report.instance, &report.state) {
        (None, None) => {
            if !instances.iter().any(placed) {
                return Err(ApiError::Forbidden(format!("no instance of {} is placed on this node", report.deployment_id)));
            }
        }
        (instance, _) => {
            let number = i64::from(instance.unwrap_or(1));
            let Some(instance) = instances.iter().find(|i| i.instance == number) else {
                return Err(ApiError::BadRequest(format!("deployment {} has no instance {number}", report.deployment_id)));
            };
            if !placed(instance) {
                return Err(ApiError::Forbidden(format!("instance {number} of {} is not placed on this node", report.deployment_id)));
            }
        }
    }
    Ok(())
}

/// Records the full commit an agent checked out for a deploy from code.
/// The commit is fixed once: by the user (a typed commit, possibly
/// abbreviated, which the reported one must extend), or by the first build
/// that resolved the branch head. A report of any other commit means the
/// image would not be what the deployment names: the report is refused
/// (409) and the deployment fails with the reason.
async fn record_commit(state: &AppState, deployment: &DeploymentRow, commit: &str) -> Result<(), ApiError> {
    if deployment.kind != "source" || deployment.commit_sha.as_deref() == Some(commit) {
        return Ok(());
    }
    if let Some(fixed) = &deployment.commit_sha {
        let full = fixed.len() >= 40;
        if full || !commit.starts_with(&fixed.to_ascii_lowercase()) {
            let reason = format!("the agent built commit {commit}, but this deployment is of commit {fixed}");
            tracing::warn!(deployment = %deployment.id, fixed = %fixed, reported = %commit, "an agent reported another commit; failing the deployment");
            fail(state, deployment, &reason).await?;
            return Err(ApiError::Conflict(reason));
        }
    }
    state.store.set_deployment_commit(&deployment.id, commit, state.clock.now_ms()).await?;
    Ok(())
}

/// A running instance's readiness probe changed its verdict: the instance
/// leaves the app's upstreams (or comes back), and the ingress follows. A
/// report that changes nothing (sent again, or about an instance that no
/// longer runs here) is accepted and does nothing.
async fn readiness(state: &AppState, node_id: &str, deployment: &DeploymentRow, report: &Report, ready: bool) -> Result<(), ApiError> {
    let instance = i64::from(report.instance.unwrap_or(1));
    let reason = report.message.as_deref();
    let now = state.clock.now_ms();
    if let Some(app) = state.store.set_instance_readiness(&deployment.id, instance, node_id, ready, reason, now).await? {
        if ready {
            tracing::info!(deployment = %deployment.id, instance, "the instance's readiness probe passes again; back in the upstreams");
        } else {
            tracing::info!(deployment = %deployment.id, instance, reason = reason.unwrap_or(""), "the instance's readiness probe fails; out of the upstreams");
        }
        crate::routes::app_changed(state, &app).await?;
    }
    Ok(())
}

/// A running instance's container started or stopped crash-looping, or
/// its liveness probe cannot run (or runs again): kept on the instance for
/// the app page, `cloudweb apps` and `cloudweb top`. A report that changes
/// nothing is accepted and does nothing.
async fn troubles(
    state: &AppState,
    node_id: &str,
    deployment: &DeploymentRow,
    report: &Report,
) -> Result<(), ApiError> {
    let instance = i64::from(report.instance.unwrap_or(1));
    if let Some(crash_loop) = &report.crash_loop {
        let stored = crash_loop.looping.then(|| {
            let view = cloudweb_api_types::scale::CrashLoopView {
                since: crate::clock::rfc3339_ms(state.clock.now_ms()),
                restarts: crash_loop.restarts,
                exit_code: crash_loop.exit_code,
                reason: crash_loop.reason.clone(),
                last_lines: crash_loop.last_lines.clone(),
            };
            serde_json::to_string(&view).expect("a crash loop serializes")
        });
        if state
            .store
            .set_instance_crash_loop(&deployment.id, instance, node_id, stored.as_deref())
            .await?
            .is_some()
        {
            if crash_loop.looping {
                tracing::warn!(deployment = %deployment.id, app = %deployment.app, instance, restarts = crash_loop.restarts, reason = crash_loop.reason.as_deref().unwrap_or(""), "the instance is crash-looping");
            } else {
                tracing::info!(deployment = %deployment.id, app = %deployment.app, instance, "the instance no longer crash-loops");
            }
        }
    }
    if let Some(problem) = &report.probe_problem {
        let problem = (!problem.is_empty()).then_some(problem.as_str());
        if state
            .store
            .set_instance_probe_problem(&deployment.id, instance, node_id, problem)
            .await?
            .is_some()
        {
            tracing::info!(deployment = %deployment.id, app = %deployment.app, instance, problem = problem.unwrap_or(""), "the instance's liveness probe problem changed");
        }
    }
    Ok(())
}

/// Applies an agent's report about one of its instances.
pub async fn on_report(state: &AppState, node_id: &str, report: &Report) -> Result<(), ApiError> {
    let Some(deployment) = state.store.deployment(&report.deployment_id).await? else {
        return Err(ApiError::NotFound(format!("no deployment {}", report.deployment_id)));
    };
    if let Some(commit) = &report.commit {
        record_commit(state, &deployment, commit).await?;
    }
    if report.state.is_none() && (report.crash_loop.is_some() || report.probe_problem.is_some()) {
        troubles(state, node_id, &deployment, report).await?;
    }
    if let (Some(ready), None) = (report.ready, report.state.as_deref()) {
        return readiness(state, node_id, &deployment, report, ready).await;
    }
    let Some(reported) = report.state.as_deref() else { return Ok(()) };
    let app = deployment.app.clone();
    let instance_no = i64::from(report.instance.unwrap_or(1));
    let instances = state.store.instances(&deployment.id).await?;
    let Some(instance) = instances.iter().find(|i| i.instance == instance_no) else {
        return Err(ApiError::BadRequest(format!("deployment {} has no instance {instance_no}", deployment.id)));
    };
    if instance.node_id.as_deref() != Some(node_id) {
        return Err(ApiError::Forbidden(format!("instance {instance_no} of {} is not placed on this node", deployment.id)));
    }
    let now = state.clock.now_ms();
    match reported {
        // A replacement instance of a deployment that already runs moves
        // only its own state.
        "building" | "deploying" if DeploymentState::parse(&deployment.state) == Some(DeploymentState::Running) => {}
        "building" => {
            transition(state, &deployment, DeploymentState::Building, None, None).await?;
        }
        "deploying" => {
            let image = report.image.as_deref();
            let had_image = deployment.image.is_some();
            transition(state, &deployment, DeploymentState::Deploying, None, image).await?;
            // The image exists now: start the other instances with it.
            if let (false, Some(image)) = (had_image, image) {
                state.store.set_deployment_image(&deployment.id, image, now).await?;
                let waiting: Vec<i64> = instances.iter().filter(|i| i.node_id.is_none() && i.state == "pending").map(|i| i.instance).collect();
                if !waiting.is_empty() {
                    if let Some(app) = state.store.app(&deployment.app).await? {
                        let deployment = state.store.deployment(&deployment.id).await?.unwrap_or(deployment.clone());
                        place_instances(state, &app, &deployment, &waiting).await?;
                    }
                }
            }
        }
        // A late `running` (a report replayed after a control-plane
        // restart, or one that raced the deployment's end) for a deployment
        // that already failed or was superseded: writing `running` would
        // clear a pending stop and leave the container running for good.
        // An instance on its way out keeps its stop time; any other is
        // stopped at the next reconciler pass.
        "running" if matches!(DeploymentState::parse(&deployment.state), Some(DeploymentState::Failed | DeploymentState::Superseded)) => {
            if instance.state != "stopping" {
                tracing::info!(deployment = %deployment.id, instance = instance_no, state = %deployment.state, "an instance of an ended deployment reports running; stopping it");
                let update = InstanceUpdate::to("stopping").on(node_id).address(report.address.as_deref()).stop_after(now);
                state.store.update_instance(&deployment.id, instance_no, update, now).await?;
            }
        }
        // An instance a scale-down took out while it was starting: it
        // stays on its way out (its stop is queued or due), never back in
        // the routes.
        "running" if instance.state == "stopping" => {
            tracing::info!(deployment = %deployment.id, instance = instance_no, "an instance being stopped reports running; it stays stopping");
        }
        "running" => {
            state.store.update_instance(&deployment.id, instance_no, InstanceUpdate::to("running").on(node_id).address(report.address.as_deref()), now).await?;
            if let Some(replaced) = instance.replaces {
                retire_replaced(state, &deployment.id, replaced).await?;
            }
            let instances = state.store.instances(&deployment.id).await?;
            let live: Vec<_> = instances.iter().filter(|i| matches!(i.state.as_str(), "pending" | "running")).collect();
            let all_running = !live.is_empty() && live.iter().all(|i| i.state == "running");
            if all_running {
                let deployment = state.store.deployment(&deployment.id).await?.unwrap_or(deployment);
                settle_running(state, &deployment).await?;
            }
        }
        "failed" => {
            state.store.update_instance(&deployment.id, instance_no, InstanceUpdate::to("failed").on(node_id), now).await?;
            let reason = report.message.clone().unwrap_or_else(|| format!("instance {instance_no} failed"));
            if DeploymentState::parse(&deployment.state) == Some(DeploymentState::Running) {
                tracing::warn!(deployment = %deployment.id, %reason, "an instance of a running deployment failed");
            } else {
                fail(state, &deployment, &reason).await?;
            }
        }
        "stopped" => {
            if !matches!(instance.state.as_str(), "failed") {
                state.store.update_instance(&deployment.id, instance_no, InstanceUpdate::to("stopped").on(node_id), now).await?;
            }
        }
        other => return Err(ApiError::BadRequest(format!("unknown instance state {other:?}"))),
    }
    crate::routes::app_changed(state, &app).await?;
    Ok(())
}

/// A node acked a stop command: the instances it named on that node are
/// stopped (an agent reports the state of a single stopped instance, not
/// of a whole deployment's, and older agents never did), and a running
/// deployment left with no instance that runs or is starting has failed:
/// its state follows what runs. Acking again changes nothing more.
pub async fn stop_acked(state: &AppState, node_id: &str, payload: &cloudweb_protocol::StopPayload) -> Result<(), ApiError> {
    let Some(deployment) = state.store.deployment(&payload.deployment_id).await? else { return Ok(()) };
    let now = state.clock.now_ms();
    let instances = state.store.instances(&deployment.id).await?;
    let mut stopped = 0;
    for instance in &instances {
        let named = payload.instance.is_none_or(|n| i64::from(n) == instance.instance);
        if named && instance.node_id.as_deref() == Some(node_id) && !matches!(instance.state.as_str(), "failed" | "stopped") {
            state.store.update_instance(&deployment.id, instance.instance, InstanceUpdate::to("stopped").on(node_id), now).await?;
            stopped += 1;
        }
    }
    if stopped == 0 {
        return Ok(());
    }
    let instances = state.store.instances(&deployment.id).await?;
    let live = instances.iter().any(|i| matches!(i.state.as_str(), "pending" | "running"));
    if DeploymentState::parse(&deployment.state) == Some(DeploymentState::Running) && !live {
        let reason = match &payload.reason {
            Some(reason) => format!("every instance was stopped by a stop command ({reason})"),
            None => "every instance was stopped by a stop command".to_string(),
        };
        fail(state, &deployment, &reason).await?;
    }
    crate::routes::app_changed(state, &deployment.app).await?;
    Ok(())
}

/// Every instance of a deployment runs: it becomes the app's running
/// deployment and the older running ones are superseded, their instances
/// stopping once the drain period has passed and every ingress serves the
/// table without them; or, when a newer deployment of the app runs or is
/// on its way, it is superseded itself and never takes traffic. The store
/// does either in one transaction.
async fn settle_running(state: &AppState, deployment: &DeploymentRow) -> Result<(), ApiError> {
    let Some(from) = DeploymentState::parse(&deployment.state) else { return Ok(()) };
    if !from.can_transition(DeploymentState::Running) {
        return Ok(());
    }
    let now = state.clock.now_ms();
    let stop_after = now + state.config.drain_period.as_millis() as i64;
    match state.store.settle_running(&deployment.id, from.as_str(), now, stop_after).await? {
        crate::store::Settled::Running { superseded } => {
            tracing::info!(deployment = %deployment.id, app = %deployment.app, from = %from, to = "running", "deployment state");
            crate::git::deployment_moved(state, deployment, DeploymentState::Running);
            // The table without the old instances; they stop only once
            // every ingress serves it.
            let version = crate::routes::app_changed(state, &deployment.app).await?;
            for old in superseded {
                tracing::info!(deployment = %old, by = %deployment.id, app = %deployment.app, "deployment superseded");
                state.store.set_stop_after_routes(&old, version as i64).await?;
                if let Some(old) = state.store.deployment(&old).await? {
                    crate::git::deployment_moved(state, &old, DeploymentState::Superseded);
                }
            }
        }
        crate::store::Settled::Newer(newer) => {
            tracing::info!(deployment = %deployment.id, %newer, app = %deployment.app, "deployment is healthy, but a newer one was requested: superseded without taking traffic");
            crate::git::deployment_moved(state, deployment, DeploymentState::Superseded);
        }
        crate::store::Settled::Moved => {}
    }
    Ok(())
}

