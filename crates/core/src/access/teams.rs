//! Teams and their members: creating and deleting teams, adding,
//! changing and removing members (a team always keeps an owner), the team
//! a request makes things in, and what a new token may be held to.

use super::{Access, ClusterRole, Role, TeamRole};
use crate::auth::tokens::NewScope;
use crate::error::ApiError;
use crate::store::{MemberRefusal, MemberRow, TeamRow, UserRow};
use crate::AppState;

/// The team everything made before teams belongs to.
pub const DEFAULT_TEAM_ID: &str = "team_default";
pub const MAX_NAME_CHARS: usize = 40;

/// A team name: 1 to 40 lowercase letters, digits and inner hyphens.
pub fn validate_name(name: &str) -> Result<(), ApiError> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME_CHARS
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-');
    if ok {
        Ok(())
    } else {
        Err(ApiError::BadRequest(format!("invalid team name {name:?}: use 1 to {MAX_NAME_CHARS} lowercase letters, digits and inner hyphens")))
    }
}

/// The team a request makes a new thing in: the one it names (header
/// `X-Cloudweb-Team`, by name or id), else the caller's only team where it
/// holds `role`, else (a cluster admin) the default team.
pub async fn request_team(state: &AppState, access: &Access, named: Option<&str>, role: TeamRole) -> Result<String, ApiError> {
    if let Some(named) = named {
        let Some(team) = state.store.team(named).await? else {
            return Err(ApiError::NotFound(format!("no team named {named}")));
        };
        return match access.role_in(&team.id) {
            None => Err(ApiError::NotFound(format!("no team named {named} among yours"))),
            Some(held) if held < role => Err(ApiError::Forbidden(format!("this needs the {} role in team {}; you are {}", role.as_str(), team.name, held.as_str()))),
            Some(_) => Ok(team.id),
        };
    }
    let able: Vec<&super::Grant> = access.grants.iter().filter(|g| g.role >= role).collect();
    match (able.as_slice(), access.every_team) {
        ([only], None) => Ok(only.team_id.clone()),
        ([], Some(every)) if every >= role => Ok(DEFAULT_TEAM_ID.to_string()),
        ([], _) => Err(ApiError::Forbidden(format!("this needs the {} role in a team, and you have it in none", role.as_str()))),
        _ => Err(ApiError::BadRequest(format!(
            "you are in several teams: say which with the header X-Cloudweb-Team (one of {})",
            able.iter().map(|g| g.team_name.as_str()).collect::<Vec<_>>().join(", ")
        ))),
    }
}

/// Refuses a token scope above its user's roles, naming apps the user
/// does not reach, or ending in the past.
pub async fn check_token_scope(state: &AppState, user: &UserRow, scope: &NewScope) -> Result<(), ApiError> {
    let cluster = user.cluster_role.as_deref().and_then(ClusterRole::parse);
    let memberships = state.store.memberships(&user.id).await?;
    let best_team = memberships.iter().filter_map(|m| TeamRole::parse(&m.role)).max().max(cluster.map(ClusterRole::team_role));
    match scope.role {
        None => {}
        Some(Role::Cluster(role)) if cluster.is_some_and(|held| held >= role) => {}
        Some(Role::Team(role)) if best_team.is_some_and(|held| held >= role) => {}
        Some(role) => return Err(ApiError::Forbidden(format!("a token cannot have more than its user: you do not hold {}", role.as_str()))),
    }
    if let Some(apps) = &scope.apps {
        if apps.is_empty() || apps.len() > 100 {
            return Err(ApiError::BadRequest("apps: name 1 to 100 apps, or leave it out for all".to_string()));
        }
        for app in apps {
            let team = state.store.team_of(crate::store::Owned::App, app).await?;
            let reaches = team.as_ref().is_some_and(|team| cluster.is_some() || memberships.iter().any(|m| &m.team_id == team));
            if !reaches {
                return Err(ApiError::BadRequest(format!("apps: no app named {app} in your teams")));
            }
        }
    }
    if scope.expires_at.is_some_and(|end| end <= state.clock.now_ms()) {
        return Err(ApiError::BadRequest("expires_at must be in the future".to_string()));
    }
    Ok(())
}

/// Creates a team; `owner` is its first owner.
pub async fn create(state: &AppState, name: &str, owner: &UserRow) -> Result<TeamRow, ApiError> {
    validate_name(name)?;
    let team = TeamRow { id: format!("team_{}", crate::auth::random_hex(8)), name: name.to_string(), created_at: state.clock.now_ms() };
    state.access_cache.forget_user(&owner.id);
    if !state.store.insert_team(&team, &owner.id).await? {
        return Err(ApiError::Conflict(format!("a team named {name} already exists")));
    }
    tracing::info!(team = %team.name, owner = %owner.name, "team created");
    Ok(team)
}

/// Deletes a team that owns nothing; 409 naming what it still owns.
pub async fn delete(state: &AppState, team: &TeamRow) -> Result<(), ApiError> {
    if team.id == DEFAULT_TEAM_ID {
        return Err(ApiError::Conflict("the default team cannot be deleted".to_string()));
    }
    match state.store.delete_team(&team.id).await? {
        Ok(true) => {
            state.access_cache.forget_all();
            tracing::info!(team = %team.name, "team deleted");
            Ok(())
        }
        Ok(false) => Err(ApiError::NotFound(format!("no team named {}", team.name))),
        Err(held) => Err(ApiError::Conflict(format!(
            "team {} still owns {} apps, {} services, {} volumes and {} backup destinations; delete or move them first (nothing is deleted with a team)",
            team.name, held.apps, held.services, held.volumes, held.destinations
        ))),
    }
}

fn refusal(team: &TeamRow, refused: MemberRefusal) -> ApiError {
    match refused {
        MemberRefusal::LastOwner => ApiError::Conflict(format!("team {} must keep an owner: make someone else owner first", team.name)),
        MemberRefusal::NoSuchMember => ApiError::NotFound(format!("no such member of team {}", team.name)),
    }
}

/// Adds a member or changes their role.
pub async fn set_member(state: &AppState, team: &TeamRow, user: &UserRow, role: TeamRole, source: &str) -> Result<MemberRow, ApiError> {
    if user.disabled_at.is_some() {
        return Err(ApiError::Conflict(format!("user {} is disabled", user.name)));
    }
    state.store.set_member(&team.id, &user.id, role.as_str(), source, state.clock.now_ms()).await?.map_err(|r| refusal(team, r))?;
    state.access_cache.forget_user(&user.id);
    tracing::info!(team = %team.name, user = %user.name, role = role.as_str(), "team member set");
    let members = state.store.team_members(&team.id).await?;
    members.into_iter().find(|m| m.user_id == user.id).ok_or_else(|| ApiError::Internal("the member just written is gone".to_string()))
}

/// Removes a member.
pub async fn remove_member(state: &AppState, team: &TeamRow, user: &UserRow) -> Result<(), ApiError> {
    state.store.remove_member(&team.id, &user.id).await?.map_err(|r| refusal(team, r))?;
    state.access_cache.forget_user(&user.id);
    tracing::info!(team = %team.name, user = %user.name, "team member removed");
    Ok(())
}

/// A user by id or name.
pub async fn user(state: &AppState, id_or_name: &str) -> Result<UserRow, ApiError> {
    if let Some(user) = state.store.user_by_id(id_or_name).await? {
        return Ok(user);
    }
    state.store.user_by_name(id_or_name).await?.ok_or_else(|| ApiError::NotFound(format!("no user named {id_or_name}")))
}
