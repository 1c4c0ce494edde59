//! The provider an app is linked to, whichever it is: what the deploy
//! pipeline, the status poster and app removal call, so none of them
//! knows which provider an app uses. Each provider's connection (its
//! settings, identities, tokens) stays in its own module.

use cloudweb_git::gitea::Gitea;
use cloudweb_git::github::GitHub;
use cloudweb_git::gitlab::GitLab;

use super::provider::{Branch, CloneCredentials, CommitStatus, GitProvider, Project, ProviderError, Repo};
use crate::error::ApiError;
use crate::store::AppGitLinkRow;
use crate::AppState;

/// A connected provider.
pub enum Linked {
    Gitlab(GitLab),
    Github(GitHub),
    Gitea(Gitea),
}

/// An app's repository at its provider, connected and ready to call.
pub struct LinkedRepo {
    pub provider: Linked,
    pub id: i64,
    pub path: String,
}

impl LinkedRepo {
    pub fn repo(&self) -> Repo<'_> {
        Repo { id: self.id, path: &self.path }
    }
}

/// Connects to the provider of `link`; `None` for a link with no API
/// behind it (the generic webhook).
pub async fn connect(state: &AppState, link: &AppGitLinkRow) -> Result<Option<LinkedRepo>, ApiError> {
    let (Some(id), Some(account)) = (link.project_id, link.account) else { return Ok(None) };
    let path = link.project_path.clone().unwrap_or_default();
    let provider = match link.provider.as_str() {
        "gitlab" => Linked::Gitlab(super::gitlab_as(state, account).await?),
        "github" => Linked::Github(super::github::installation(state, account).await?),
        "gitea" => Linked::Gitea(super::gitea::gitea_as(state, account).await?),
        _ => return Ok(None),
    };
    Ok(Some(LinkedRepo { provider, id, path }))
}

macro_rules! each {
    ($self:ident, $p:ident => $call:expr) => {
        match $self {
            Linked::Gitlab($p) => $call,
            Linked::Github($p) => $call,
            Linked::Gitea($p) => $call,
        }
    };
}

impl GitProvider for Linked {
    fn name(&self) -> &'static str {
        each!(self, p => p.name())
    }

    async fn projects(&self, search: Option<&str>) -> Result<Vec<Project>, ProviderError> {
        each!(self, p => p.projects(search).await)
    }

    async fn project(&self, id_or_path: &str) -> Result<Project, ProviderError> {
        each!(self, p => p.project(id_or_path).await)
    }

    async fn branches(&self, repo: Repo<'_>) -> Result<Vec<Branch>, ProviderError> {
        each!(self, p => p.branches(repo).await)
    }

    async fn register_webhook(&self, repo: Repo<'_>, url: &str, secret: &str, branch: &str) -> Result<Option<i64>, ProviderError> {
        each!(self, p => p.register_webhook(repo, url, secret, branch).await)
    }

    async fn remove_webhook(&self, repo: Repo<'_>, hook_id: i64) -> Result<(), ProviderError> {
        each!(self, p => p.remove_webhook(repo, hook_id).await)
    }

    async fn clone_credentials(&self, repo: Repo<'_>, deployment_id: &str) -> Result<Option<CloneCredentials>, ProviderError> {
        each!(self, p => p.clone_credentials(repo, deployment_id).await)
    }

    async fn revoke_clone_credentials(&self, repo: Repo<'_>, credentials: &CloneCredentials) -> Result<(), ProviderError> {
        each!(self, p => p.revoke_clone_credentials(repo, credentials).await)
    }

    async fn post_status(&self, repo: Repo<'_>, status: &CommitStatus<'_>) -> Result<(), ProviderError> {
        each!(self, p => p.post_status(repo, status).await)
    }

    async fn upsert_comment(&self, repo: Repo<'_>, number: i64, comment_id: Option<i64>, body: &str) -> Result<i64, ProviderError> {
        each!(self, p => p.upsert_comment(repo, number, comment_id, body).await)
    }
}
