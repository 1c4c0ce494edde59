//! Who may do what: teams, roles and scoped tokens (issue 28).
//!
//! A team owns apps, services, volumes and backup destinations. Each of
//! its members has one role in it, from least to most: `viewer` (reads
//! apps, deployments, logs, metrics), `deployer` (deploys, rolls back,
//! scales, reads variable names), `admin` (everything in the team's
//! resources: variables, exec, deletion) and `owner` (members and roles,
//! deleting the team). Apart from teams a user may hold a cluster role:
//! `cluster-viewer` (reads everything) or `cluster-admin` (nodes, join
//! tokens, users, cluster settings, and every team as an owner).
//!
//! A request's [`Access`] is worked out once, from its principal (and, for
//! a personal token, that token's scope: a role cap and an app list), and
//! every route's [`Need`] is checked against it in one place: the table
//! beside the router (`cloudweb_http::api::permissions`).

pub mod audit;
pub mod cache;
pub mod mapping;
pub mod teams;

pub use crate::roles::{ClusterRole, Role, TeamRole};

use crate::auth::{Principal, Via};
use crate::error::ApiError;
use crate::store::Owned;
use crate::AppState;

/// What a route needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// Nothing: the route authenticates itself or is open.
    Public,
    /// Any caller; the route acts on the caller's own things.
    Signed,
    /// Any caller; the route lists only what the caller may see.
    Listed,
    /// A cluster role.
    Cluster(ClusterRole),
    /// A role in the team that owns the path parameter `param`.
    Team(TeamRole, Owned, &'static str),
    /// A role in the team a new thing is made in: the request's team
    /// (header `X-Cloudweb-Team`, else the caller's only team).
    Create(TeamRole),
}

impl Need {
    /// How the OpenAPI document and the docs say it.
    pub fn describe(&self) -> String {
        match self {
            Need::Public => "none".to_string(),
            Need::Signed => "any signed-in caller (their own things)".to_string(),
            Need::Listed => "any signed-in caller (sees what their teams own)".to_string(),
            Need::Cluster(role) => role.as_str().to_string(),
            Need::Team(role, owned, _) => format!("{} of the {}'s team", role.as_str(), owned_word(*owned)),
            Need::Create(role) => format!("{} of the request's team", role.as_str()),
        }
    }
}

pub fn owned_word(owned: Owned) -> &'static str {
    match owned {
        Owned::App => "app",
        Owned::Service => "service",
        Owned::Volume => "volume",
        Owned::Destination => "backup destination",
        Owned::Deployment => "deployment",
        Owned::BackupJob => "backup",
        Owned::VolumeMove => "volume move",
        Owned::TaskRun => "task run",
        Owned::Team => "team",
    }
}

/// One team the caller reaches, and with which role.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    pub team_id: String,
    pub team_name: String,
    pub role: TeamRole,
}

/// What a request's caller may do, worked out once per request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Access {
    /// Who, as the audit log names them: `user:<id>`,
    /// `user:<id>/token:<id>`, `deploy-token:<id>` or `admin-token`.
    pub actor: String,
    /// The user's id, when a user is calling.
    pub user_id: Option<String>,
    pub cluster: Option<ClusterRole>,
    /// The role it has in every team through its cluster role.
    pub every_team: Option<TeamRole>,
    /// Its own memberships (after the token's cap).
    pub grants: Vec<Grant>,
    /// The only apps it reaches (a scoped or deploy token).
    pub apps: Option<Vec<String>>,
}

impl Access {
    /// The admin token: everything.
    pub fn admin() -> Access {
        Access { actor: "admin-token".into(), user_id: None, cluster: Some(ClusterRole::Admin), every_team: Some(TeamRole::Owner), grants: Vec::new(), apps: None }
    }

    /// Its role in a team, if any.
    pub fn role_in(&self, team_id: &str) -> Option<TeamRole> {
        let own = self.grants.iter().find(|g| g.team_id == team_id).map(|g| g.role);
        own.max(self.every_team)
    }

    /// Whether it sees what `team_id` owns (and, when it is held to some
    /// apps, whether `app` is one of them).
    pub fn sees(&self, team_id: &str, app: Option<&str>) -> bool {
        if self.role_in(team_id).is_none() {
            return false;
        }
        match (&self.apps, app) {
            (None, _) => true,
            (Some(apps), Some(app)) => apps.iter().any(|a| a == app),
            (Some(_), None) => false,
        }
    }

    /// Whether it sees every team (a cluster role, unrestricted).
    pub fn sees_all(&self) -> bool {
        self.every_team.is_some() && self.apps.is_none()
    }

    /// The teams whose things it may list.
    pub fn visible_teams(&self) -> Vec<String> {
        self.grants.iter().map(|g| g.team_id.clone()).collect()
    }
}

/// Works out what `principal` may do.
pub async fn access_of(state: &AppState, principal: &Principal) -> Result<Access, ApiError> {
    match principal {
        Principal::Admin => Ok(Access::admin()),
        Principal::Deploy { token_id, app, team_id } => {
            let team_name = state.store.team(team_id).await?.map(|t| t.name).unwrap_or_else(|| team_id.clone());
            Ok(Access {
                actor: format!("deploy-token:{token_id}"),
                user_id: None,
                cluster: None,
                every_team: None,
                grants: vec![Grant { team_id: team_id.clone(), team_name, role: TeamRole::Deployer }],
                apps: Some(vec![app.clone()]),
            })
        }
        Principal::User { user, via } => {
            let memberships = match state.access_cache.memberships(&user.id) {
                Some(rows) => rows,
                None => {
                    let rows = state.store.memberships(&user.id).await?;
                    state.access_cache.keep_memberships(&user.id, rows.clone());
                    rows
                }
            };
            let mut cluster = user.cluster_role.as_deref().and_then(ClusterRole::parse);
            let mut grants: Vec<Grant> = memberships
                .into_iter()
                .filter_map(|m| TeamRole::parse(&m.role).map(|role| Grant { team_id: m.team_id, team_name: m.team_name, role }))
                .collect();
            let mut apps = None;
            let mut actor = format!("user:{}", user.id);
            if let Via::Token { id, scope } = via {
                actor = format!("user:{}/token:{id}", user.id);
                match scope.role {
                    None | Some(Role::Cluster(ClusterRole::Admin)) => {}
                    Some(Role::Cluster(ClusterRole::Viewer)) => {
                        cluster = cluster.map(|c| c.min(ClusterRole::Viewer));
                        for grant in &mut grants {
                            grant.role = grant.role.min(TeamRole::Viewer);
                        }
                    }
                    Some(Role::Team(cap)) => {
                        cluster = None;
                        // A cluster role's reach into every team stays,
                        // held to the cap, as memberships would be.
                        let through_cluster = user.cluster_role.as_deref().and_then(ClusterRole::parse).map(ClusterRole::team_role);
                        for grant in &mut grants {
                            grant.role = grant.role.max(through_cluster.unwrap_or(TeamRole::Viewer)).min(cap);
                        }
                        if let Some(through) = through_cluster {
                            let every = through.min(cap);
                            return Ok(Access { actor, user_id: Some(user.id.clone()), cluster, every_team: Some(every), grants, apps: scope.apps.clone() });
                        }
                    }
                }
                apps = scope.apps.clone();
            }
            let every_team = cluster.map(ClusterRole::team_role);
            Ok(Access { actor, user_id: Some(user.id.clone()), cluster, every_team, grants, apps })
        }
    }
}

/// The team a check found, for the audit log and the handler.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Checked {
    pub team_id: Option<String>,
    /// `app:web`, `service:db`, … when the route names one.
    pub target: Option<String>,
}

/// Checks `need` for a request whose path parameters are `params` and
/// whose chosen team (header) is `team`. 403 says what was missing; a
/// thing the caller may not see at all is 404, as if it did not exist.
pub async fn check(state: &AppState, access: &Access, need: Need, params: &[(String, String)], team: Option<&str>) -> Result<Checked, ApiError> {
    match need {
        Need::Public | Need::Signed | Need::Listed => Ok(Checked::default()),
        Need::Cluster(role) => {
            if access.cluster.is_some_and(|held| held >= role) && access.apps.is_none() {
                Ok(Checked::default())
            } else {
                Err(ApiError::Forbidden(format!("this needs the {} cluster role", role.as_str())))
            }
        }
        Need::Team(role, owned, param) => {
            let Some((_, name)) = params.iter().find(|(k, _)| k == param) else {
                return Err(ApiError::Internal(format!("the route has no path parameter {param}")));
            };
            let target = Some(format!("{}:{name}", owned_word(owned).replace(' ', "-")));
            let Some(team_id) = team_of(state, owned, name).await? else {
                // Nothing there: a caller who sees every team gets the
                // handler's own answer (which may say what is wrong with
                // the name); anyone else learns no more than that.
                if access.sees_all() {
                    return Ok(Checked { team_id: None, target });
                }
                return Err(ApiError::NotFound(format!("no {} named {name} in your teams", owned_word(owned))));
            };
            let app = app_of(state, owned, name).await?;
            if !access.sees(&team_id, app.as_deref()) {
                return Err(ApiError::NotFound(format!("no {} named {name} in your teams", owned_word(owned))));
            }
            let held = access.role_in(&team_id).expect("seen");
            if held < role {
                return Err(ApiError::Forbidden(format!(
                    "this needs the {} role in the team that owns {} {name}; you are {}",
                    role.as_str(),
                    owned_word(owned),
                    held.as_str()
                )));
            }
            Ok(Checked { team_id: Some(team_id), target })
        }
        Need::Create(role) => {
            if access.apps.is_some() {
                return Err(ApiError::Forbidden("a token held to some apps cannot create anything".to_string()));
            }
            let team_id = teams::request_team(state, access, team, role).await?;
            Ok(Checked { team_id: Some(team_id), target: None })
        }
    }
}

/// Whether `access` sees the thing `name` (of kind `owned`): it is in one
/// of its teams (and, for a token held to some apps, one of those).
pub async fn sees_owned(state: &AppState, access: &Access, owned: Owned, name: &str) -> Result<bool, ApiError> {
    if access.sees_all() {
        return Ok(true);
    }
    let Some(team_id) = team_of(state, owned, name).await? else { return Ok(false) };
    let app = app_of(state, owned, name).await?;
    Ok(access.sees(&team_id, app.as_deref()))
}

/// The team that owns a thing (an app's from the cache when fresh).
async fn team_of(state: &AppState, owned: Owned, name: &str) -> Result<Option<String>, ApiError> {
    if owned != Owned::App {
        return Ok(state.store.team_of(owned, name).await?);
    }
    if let Some(team) = state.access_cache.app_team(name) {
        return Ok(Some(team));
    }
    let team = state.store.team_of(owned, name).await?;
    if let Some(team) = &team {
        state.access_cache.keep_app_team(name, team.clone());
    }
    Ok(team)
}

/// The app a checked thing belongs to, for tokens held to some apps.
async fn app_of(state: &AppState, owned: Owned, name: &str) -> Result<Option<String>, ApiError> {
    Ok(match owned {
        Owned::App => Some(name.to_string()),
        Owned::Deployment => state.store.deployment(name).await?.map(|d| d.app),
        Owned::TaskRun => state.store.task_run(name).await?.map(|r| r.app),
        _ => None,
    })
}

#[cfg(test)]
mod tests;
