//! What a preview tells its pull or merge request: one comment, written
//! when the preview first runs or fails and updated from then on (never
//! a new comment per push), saying where it stands and its URL; and the
//! commit status of a running preview links to the preview itself. The
//! previews themselves are `crate::previews`.

use super::linked;
use super::{provider_error, GitProvider, Moved};
use crate::deployment_state::DeploymentState;
use crate::error::ApiError;
use crate::store::PreviewRow;
use crate::AppState;

/// A preview's host, `pr-<number>.<app>.<base domain>`.
pub fn preview_host(state: &AppState, app: &str, number: i64) -> String {
    format!("pr-{number}.{app}.{}", state.config.base_domain)
}

pub fn preview_url(state: &AppState, preview: &PreviewRow) -> String {
    format!("https://{}", preview_host(state, &preview.app, preview.number))
}

/// Writes (or updates) the preview's comment on its request, through the
/// provider of the app it previews.
pub async fn note(state: &AppState, preview: &PreviewRow, text: &str) -> Result<(), ApiError> {
    let Some(link) = state.store.app_git_link(&preview.app).await? else { return Ok(()) };
    let Some(linked) = linked::connect(state, &link).await? else { return Ok(()) };
    let id = linked.provider.upsert_comment(linked.repo(), preview.number, preview.comment_id, text).await.map_err(provider_error)?;
    if preview.comment_id != Some(id) {
        state.store.set_preview_comment(&preview.app, preview.number, id).await?;
    }
    Ok(())
}

fn short(sha: &str) -> &str {
    sha.get(..12).unwrap_or(sha)
}

/// A preview's deployment moved: running or failed is told on the request.
pub async fn moved(state: &AppState, event: &Moved) -> Result<(), ApiError> {
    if !matches!(event.to, DeploymentState::Running | DeploymentState::Failed) {
        return Ok(());
    }
    let Some(preview) = state.store.preview_by_app(&event.app).await? else { return Ok(()) };
    let commit = event.commit.as_deref().unwrap_or("?");
    if preview.head_sha != commit {
        // An older head; the newer one tells its own story.
        return Ok(());
    }
    let deployment = state.store.deployment(&event.deployment_id).await?;
    let page = format!("{}/deployments/{}", state.git.public_url(), event.deployment_id);
    let text = match (event.to, deployment.and_then(|d| d.error)) {
        (DeploymentState::Running, _) => format!("**cloud-web preview** of `{}` is running at {}\n\n[Deployment {}]({page})", short(commit), preview_url(state, &preview), event.deployment_id),
        (_, Some(error)) if error == crate::deployment_state::CANCELLED => return Ok(()),
        (_, error) => format!(
            "**cloud-web preview** of `{}` failed: {}\n\n[Deployment {}]({page})",
            short(commit),
            error.unwrap_or_else(|| "no reason given".into()),
            event.deployment_id
        ),
    };
    note(state, &preview, &text).await
}

/// The target URL of a deployment's commit status: the preview itself
/// once a preview runs, else the deployment's page.
pub async fn target_url(state: &AppState, event: &Moved) -> Result<String, ApiError> {
    if event.to == DeploymentState::Running {
        if let Some(preview) = state.store.preview_by_app(&event.app).await? {
            return Ok(preview_url(state, &preview));
        }
    }
    Ok(format!("{}/deployments/{}", state.git.public_url(), event.deployment_id))
}
