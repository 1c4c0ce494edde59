//! The generic provider: any git URL. There is no API behind it, so it
//! lists no projects, registers no hook (the app gets a webhook URL and a
//! secret that any git host can call, see `webhooks.rs`), hands out no
//! credentials of its own (the app's stored ones are used) and has nowhere
//! to post a commit status.

use crate::provider::{Branch, CloneCredentials, CommitStatus, GitProvider, Project, ProviderError, Repo};

pub struct Generic;

fn unsupported(what: &str) -> ProviderError {
    ProviderError::Unsupported(format!("a generic git URL has no API: cannot {what}"))
}

impl GitProvider for Generic {
    fn name(&self) -> &'static str {
        "generic"
    }

    async fn projects(&self, _search: Option<&str>) -> Result<Vec<Project>, ProviderError> {
        Err(unsupported("list projects"))
    }

    async fn project(&self, _id_or_path: &str) -> Result<Project, ProviderError> {
        Err(unsupported("look up a project"))
    }

    async fn branches(&self, _repo: Repo<'_>) -> Result<Vec<Branch>, ProviderError> {
        Err(unsupported("list branches"))
    }

    /// The user configures the hook at their git host.
    async fn register_webhook(&self, _repo: Repo<'_>, _url: &str, _secret: &str, _branch: &str) -> Result<Option<i64>, ProviderError> {
        Ok(None)
    }

    async fn remove_webhook(&self, _repo: Repo<'_>, _hook_id: i64) -> Result<(), ProviderError> {
        Ok(())
    }

    async fn clone_credentials(&self, _repo: Repo<'_>, _deployment_id: &str) -> Result<Option<CloneCredentials>, ProviderError> {
        Ok(None)
    }

    async fn revoke_clone_credentials(&self, _repo: Repo<'_>, _credentials: &CloneCredentials) -> Result<(), ProviderError> {
        Ok(())
    }

    async fn post_status(&self, _repo: Repo<'_>, _status: &CommitStatus<'_>) -> Result<(), ProviderError> {
        Ok(())
    }

    async fn upsert_comment(&self, _repo: Repo<'_>, _number: i64, _comment_id: Option<i64>, _body: &str) -> Result<i64, ProviderError> {
        Err(unsupported("comment on a request"))
    }
}
