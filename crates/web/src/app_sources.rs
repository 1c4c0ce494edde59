//! Where a new app's code can come from, on the dashboard's create form:
//! the logged-in user's own GitLab projects (through their linked GitLab
//! identity), the GitHub App's repositories and the user's Gitea
//! repositories (through their linked Gitea identity), each offered when
//! that provider is configured, besides a git URL. The form posts the
//! choice as `gitlab_project` (a project id), `github_repository` or
//! `gitea_repository` (`owner/name`); [`add_source`] turns it into the
//! API's create body.

use std::collections::HashMap;

use cloudweb_api_types::github::Repository;
use maud::{html, Markup};
use serde_json::{json, Map, Value};

use super::Ctx;
use crate::error::ApiError;

/// What one provider offers the logged-in user.
pub enum Offer<T> {
    /// Not configured (or, for GitLab, no identity linked to the user).
    Off,
    /// What it reaches.
    Listed(Vec<T>),
    /// Listing failed: why (the git URL still works).
    Failed(String),
}

/// Every provider's offer.
pub struct Sources {
    pub gitlab: Offer<crate::git::Project>,
    pub github: Offer<Repository>,
    pub gitea: Offer<crate::git::Project>,
}

impl Sources {
    /// Some provider lists something to pick (the git URL is then optional).
    pub fn offers_any(&self) -> bool {
        matches!(&self.gitlab, Offer::Listed(l) if !l.is_empty())
            || matches!(&self.github, Offer::Listed(l) if !l.is_empty())
            || matches!(&self.gitea, Offer::Listed(l) if !l.is_empty())
    }

    /// The pickers, with what the user chose before a refusal kept.
    pub fn fields(&self, ctx: &Ctx, chosen: &dyn Fn(&str) -> Option<String>) -> Markup {
        let chosen = |key: &str, value: &str| chosen(key).as_deref() == Some(value);
        html! {
            @match &self.gitlab {
                Offer::Off => {}
                Offer::Listed(projects) if projects.is_empty() => { p.help id="gitlab-projects-none" { (ctx.t("apps.gitlab_none")) } }
                Offer::Listed(projects) => {
                    p.field { label for="gitlab_project" { (ctx.t("apps.gitlab_project")) }
                        select id="gitlab_project" name="gitlab_project" {
                            option value="" { (ctx.t("apps.gitlab_use_url")) }
                            @for project in projects { option value=(project.id) selected[chosen("gitlab_project", &project.id.to_string())] { (project.path) } }
                        }
                    }
                    p.help { (ctx.t("apps.gitlab_help")) }
                }
                Offer::Failed(reason) => { p.error id="gitlab-projects-error" role="alert" { (ctx.t("apps.gitlab_failed")) ": " (reason) } }
            }
            @match &self.github {
                Offer::Off => {}
                Offer::Listed(repositories) if repositories.is_empty() => { p.help id="github-repositories-none" { (ctx.t("apps.github_none")) } }
                Offer::Listed(repositories) => {
                    p.field { label for="github_repository" { (ctx.t("apps.github_repository")) }
                        select id="github_repository" name="github_repository" {
                            option value="" { (ctx.t("apps.gitlab_use_url")) }
                            @for repository in repositories { option value=(repository.full_name) selected[chosen("github_repository", &repository.full_name)] { (repository.full_name) } }
                        }
                    }
                    p.help { (ctx.t("apps.github_help")) }
                }
                Offer::Failed(reason) => { p.error id="github-repositories-error" role="alert" { (ctx.t("apps.github_failed")) ": " (reason) } }
            }
            @match &self.gitea {
                Offer::Off => {}
                Offer::Listed(repositories) if repositories.is_empty() => { p.help id="gitea-repositories-none" { (ctx.t("apps.gitea_none")) } }
                Offer::Listed(repositories) => {
                    p.field { label for="gitea_repository" { (ctx.t("apps.gitea_repository")) }
                        select id="gitea_repository" name="gitea_repository" {
                            option value="" { (ctx.t("apps.gitlab_use_url")) }
                            @for repository in repositories { option value=(repository.path) selected[chosen("gitea_repository", &repository.path)] { (repository.path) } }
                        }
                    }
                    p.help { (ctx.t("apps.gitea_help")) }
                }
                Offer::Failed(reason) => { p.error id="gitea-repositories-error" role="alert" { (ctx.t("apps.gitea_failed")) ": " (reason) } }
            }
        }
    }
}

/// What each configured provider offers the session's principal.
pub async fn sources(ctx: &Ctx) -> Sources {
    Sources { gitlab: gitlab(ctx).await, github: github(ctx).await, gitea: gitea(ctx).await }
}

/// The user's GitLab projects, listed as `GET /api/gitlab/projects` does
/// for the session's principal.
async fn gitlab(ctx: &Ctx) -> Offer<crate::git::Project> {
    let Some(user) = ctx.principal.user() else { return Offer::Off };
    let linked = async {
        let configured = ctx.state.store.gitlab_settings().await?.is_some();
        Ok::<bool, crate::store::StoreError>(configured && !ctx.state.store.gitlab_accounts_of_user(&user.id).await?.is_empty())
    };
    match linked.await {
        Ok(false) => return Offer::Off,
        Ok(true) => {}
        Err(err) => return Offer::Failed(super::error_text(&err.into())),
    }
    match crate::git::api::list_projects(&ctx.state, &ctx.principal, None, None).await {
        Ok(projects) => Offer::Listed(projects),
        Err(err) => Offer::Failed(super::error_text(&err)),
    }
}

/// The GitHub App's repositories, as `GET /api/github/repositories`.
async fn github(ctx: &Ctx) -> Offer<Repository> {
    match ctx.state.store.github_settings().await {
        Ok(None) => return Offer::Off,
        Ok(Some(_)) => {}
        Err(err) => return Offer::Failed(super::error_text(&err.into())),
    }
    match crate::git::github::list_repositories(&ctx.state, None).await {
        Ok(repositories) => Offer::Listed(repositories),
        Err(err) => Offer::Failed(super::error_text(&err)),
    }
}

/// The user's Gitea repositories, as `GET /api/gitea/repositories` lists
/// them for the session's principal (through its linked identity).
async fn gitea(ctx: &Ctx) -> Offer<crate::git::Project> {
    let Some(user) = ctx.principal.user() else { return Offer::Off };
    let linked = async {
        let configured = ctx.state.store.gitea_settings().await?.is_some();
        Ok::<bool, crate::store::StoreError>(configured && !ctx.state.store.git_identities_of_user("gitea", &user.id).await?.is_empty())
    };
    match linked.await {
        Ok(false) => return Offer::Off,
        Ok(true) => {}
        Err(err) => return Offer::Failed(super::error_text(&err.into())),
    }
    match crate::git::gitea::list_repositories(&ctx.state, &ctx.principal, None, None).await {
        Ok(repositories) => Offer::Listed(repositories),
        Err(err) => Offer::Failed(super::error_text(&err)),
    }
}

/// Where an app's pushes come from, for its page: the provider and the
/// repository it was made from, or the generic webhook; nothing for an app
/// deployed only on request.
pub async fn source_note(ctx: &Ctx, app: &str) -> Markup {
    let Ok(Some(link)) = ctx.state.store.app_git_link(app).await else { return html! {} };
    let repository = link.project_path.clone().unwrap_or_default();
    let text = match link.provider.as_str() {
        "github" => format!("{} GitHub: {repository}", ctx.t("apps.source")),
        "gitlab" => format!("{} GitLab: {repository}", ctx.t("apps.source")),
        "gitea" => format!("{} Gitea: {repository}", ctx.t("apps.source")),
        "generic" => ctx.t("apps.source_webhook").to_string(),
        _ => return html! {},
    };
    html! { p.help id="app-source" data-provider=(link.provider) { (text) } }
}

fn non_empty<'a>(form: &'a HashMap<String, String>, key: &str) -> Option<&'a str> {
    form.get(key).map(|v| v.trim()).filter(|v| !v.is_empty())
}

/// The code's source in the create body: a GitLab project (its id), a
/// GitHub or a Gitea repository, else the git URL. A URL typed beside a picked
/// project goes along, so the API refuses the mix with its own words.
pub fn add_source(form: &HashMap<String, String>, request: &mut Map<String, Value>) -> Result<(), ApiError> {
    let mut picked = false;
    if let Some(project) = non_empty(form, "gitlab_project") {
        let id = project.parse::<i64>().map_err(|_| ApiError::BadRequest("invalid gitlab_project: not a project id".into()))?;
        request.insert("gitlab_project".into(), json!(id));
        picked = true;
    }
    if let Some(repository) = non_empty(form, "github_repository") {
        request.insert("github_repository".into(), json!(repository));
        picked = true;
    }
    if let Some(repository) = non_empty(form, "gitea_repository") {
        request.insert("gitea_repository".into(), json!(repository));
        picked = true;
    }
    match non_empty(form, "repo_url") {
        Some(url) => {
            request.insert("repo_url".into(), json!(url));
        }
        None if !picked => {
            request.insert("repo_url".into(), json!(""));
        }
        None => {}
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn form(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn the_picked_source_goes_into_the_body() {
        let mut body = Map::new();
        add_source(&form(&[("github_repository", "acme/site"), ("repo_url", "")]), &mut body).unwrap();
        assert_eq!(Value::Object(body), json!({"github_repository": "acme/site"}));
        let mut body = Map::new();
        add_source(&form(&[("gitlab_project", "42")]), &mut body).unwrap();
        assert_eq!(Value::Object(body), json!({"gitlab_project": 42}));
        let mut body = Map::new();
        add_source(&form(&[("gitlab_project", ""), ("repo_url", "https://g/x.git")]), &mut body).unwrap();
        assert_eq!(Value::Object(body), json!({"repo_url": "https://g/x.git"}));
        let mut body = Map::new();
        add_source(&form(&[]), &mut body).unwrap();
        assert_eq!(Value::Object(body), json!({"repo_url": ""}));
        assert!(add_source(&form(&[("gitlab_project", "x")]), &mut Map::new()).is_err());
    }
}
