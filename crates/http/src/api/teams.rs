//! Teams and their members (`/api/teams`), users' cluster roles
//! (`/api/users/{id}/cluster-role`) and apps' deploy tokens
//! (`/api/apps/{name}/deploy-tokens`). Who may call each is
//! [`super::permissions`]' business; these handlers only act.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::{Extension, Json};
use cloudweb_api_types::teams::{
    CreatedDeployToken, DeployTokenList, DeployTokenView, MemberList, MemberView, NewDeployToken, NewTeam, SetClusterRole, SetMember, TeamList, TeamView,
};
use cloudweb_api_types::ErrorBody;

use crate::access::{teams, Access, TeamRole};
use crate::auth::{deploy_tokens, Principal};
use crate::clock::rfc3339_ms;
use crate::error::{body_bytes, parse_json, ApiError};
use crate::store::{DeployTokenRow, MemberRow, TeamRow};
use crate::AppState;

fn team_view(team: &TeamRow, access: &Access) -> TeamView {
    TeamView { id: team.id.clone(), name: team.name.clone(), created_at: rfc3339_ms(team.created_at), role: access.role_in(&team.id).map(|r| r.as_str().to_string()) }
}

fn member_view(member: &MemberRow) -> MemberView {
    MemberView {
        user_id: member.user_id.clone(),
        user: member.user_name.clone(),
        role: member.role.clone(),
        source: member.source.clone(),
        added_at: rfc3339_ms(member.added_at),
    }
}

async fn team(state: &AppState, name: &str) -> Result<TeamRow, ApiError> {
    state.store.team(name).await?.ok_or_else(|| ApiError::NotFound(format!("no team named {name}")))
}

/// The teams the caller is in (every team, for a cluster role).
#[utoipa::path(get, path = "/api/teams", operation_id = "teams_list", tag = "teams", responses((status = 200, description = "The caller's teams", body = TeamList)))]
pub async fn list(State(state): State<Arc<AppState>>, Extension(access): Extension<Access>) -> Result<Json<TeamList>, ApiError> {
    let teams = state.store.teams().await?.iter().filter(|t| access.role_in(&t.id).is_some() && access.apps.is_none()).map(|t| team_view(t, &access)).collect();
    Ok(Json(TeamList { teams }))
}

/// Creates a team with its first owner.
#[utoipa::path(post, path = "/api/teams", operation_id = "teams_create", tag = "teams", request_body = NewTeam,
    responses(
        (status = 201, description = "Created", body = TeamView),
        (status = 400, description = "Invalid name, or no owner named and the caller is no user", body = ErrorBody),
        (status = 404, description = "No such owner", body = ErrorBody),
        (status = 409, description = "The name is taken", body = ErrorBody),
    ))]
pub async fn create(
    State(state): State<Arc<AppState>>,
    Extension(principal): Extension<Principal>,
    Extension(access): Extension<Access>,
    body: Result<Bytes, BytesRejection>,
) -> Result<(StatusCode, Json<TeamView>), ApiError> {
    let request: NewTeam = parse_json(&body_bytes(body)?)?;
    let owner = match (&request.owner, principal.user()) {
        (Some(owner), _) => teams::user(&state, owner).await?,
        (None, Some(user)) => user.clone(),
        (None, None) => return Err(ApiError::BadRequest("owner: name the team's first owner (the admin token is no user)".to_string())),
    };
    let team = teams::create(&state, &request.name, &owner).await?;
    Ok((StatusCode::CREATED, Json(team_view(&team, &access))))
}

#[utoipa::path(get, path = "/api/teams/{team}", operation_id = "teams_show", tag = "teams",
    params(("team" = String, Path, description = "The team's name or id")),
    responses((status = 200, description = "The team", body = TeamView), (status = 404, description = "No such team among the caller's", body = ErrorBody)))]
pub async fn show(State(state): State<Arc<AppState>>, Extension(access): Extension<Access>, Path(name): Path<String>) -> Result<Json<TeamView>, ApiError> {
    Ok(Json(team_view(&team(&state, &name).await?, &access)))
}

/// Deletes a team that owns nothing (nothing is deleted with a team).
#[utoipa::path(delete, path = "/api/teams/{team}", operation_id = "teams_delete", tag = "teams",
    params(("team" = String, Path, description = "The team's name or id")),
    responses(
        (status = 204, description = "Deleted"),
        (status = 404, description = "No such team", body = ErrorBody),
        (status = 409, description = "It still owns apps, services, volumes or destinations, or it is the default team", body = ErrorBody),
    ))]
pub async fn delete(State(state): State<Arc<AppState>>, Path(name): Path<String>) -> Result<StatusCode, ApiError> {
    teams::delete(&state, &team(&state, &name).await?).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(get, path = "/api/teams/{team}/members", operation_id = "team_members_list", tag = "teams",
    params(("team" = String, Path, description = "The team's name or id")),
    responses((status = 200, description = "Its members and their roles", body = MemberList), (status = 404, description = "No such team", body = ErrorBody)))]
pub async fn members(State(state): State<Arc<AppState>>, Path(name): Path<String>) -> Result<Json<MemberList>, ApiError> {
    let team = team(&state, &name).await?;
    Ok(Json(MemberList { members: state.store.team_members(&team.id).await?.iter().map(member_view).collect() }))
}

/// Adds a member, or changes their role. Taking the team's last owner's
/// role away is refused.
#[utoipa::path(put, path = "/api/teams/{team}/members/{user}", operation_id = "team_members_set", tag = "teams", request_body = SetMember,
    params(("team" = String, Path, description = "The team's name or id"), ("user" = String, Path, description = "The user's name or id")),
    responses(
        (status = 200, description = "The member", body = MemberView),
        (status = 400, description = "Unknown role", body = ErrorBody),
        (status = 404, description = "No such team or user", body = ErrorBody),
        (status = 409, description = "It would leave the team without an owner, or the user is disabled", body = ErrorBody),
    ))]
pub async fn set_member(
    State(state): State<Arc<AppState>>,
    Path((name, user)): Path<(String, String)>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<MemberView>, ApiError> {
    let request: SetMember = parse_json(&body_bytes(body)?)?;
    let role = TeamRole::parse(&request.role).ok_or_else(|| ApiError::BadRequest(format!("role: unknown role {:?} (viewer, deployer, admin or owner)", request.role)))?;
    let team = team(&state, &name).await?;
    let user = teams::user(&state, &user).await?;
    Ok(Json(member_view(&teams::set_member(&state, &team, &user, role, "manual").await?)))
}

/// Removes a member; the team's last owner cannot be removed.
#[utoipa::path(delete, path = "/api/teams/{team}/members/{user}", operation_id = "team_members_remove", tag = "teams",
    params(("team" = String, Path, description = "The team's name or id"), ("user" = String, Path, description = "The user's name or id")),
    responses(
        (status = 204, description = "Removed"),
        (status = 404, description = "No such team, user or member", body = ErrorBody),
        (status = 409, description = "The team's last owner", body = ErrorBody),
    ))]
pub async fn remove_member(State(state): State<Arc<AppState>>, Path((name, user)): Path<(String, String)>) -> Result<StatusCode, ApiError> {
    let team = team(&state, &name).await?;
    let user = teams::user(&state, &user).await?;
    teams::remove_member(&state, &team, &user).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Gives a user a cluster role, or takes it away (`null`).
#[utoipa::path(put, path = "/api/users/{id}/cluster-role", operation_id = "users_cluster_role_set", tag = "accounts", request_body = SetClusterRole,
    params(("id" = String, Path, description = "The user's name or id")),
    responses(
        (status = 204, description = "Set"),
        (status = 400, description = "Unknown role", body = ErrorBody),
        (status = 404, description = "No such user", body = ErrorBody),
        (status = 409, description = "The caller's own cluster-admin role", body = ErrorBody),
    ))]
pub async fn set_cluster_role(
    State(state): State<Arc<AppState>>,
    Extension(principal): Extension<Principal>,
    Path(id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<StatusCode, ApiError> {
    let request: SetClusterRole = parse_json(&body_bytes(body)?)?;
    let role = crate::auth::routes::parse_cluster_role(request.cluster_role.as_deref())?;
    let user = teams::user(&state, &id).await?;
    if principal.user().is_some_and(|me| me.id == user.id) && role != Some(crate::access::ClusterRole::Admin) {
        return Err(ApiError::Conflict("you cannot take your own cluster-admin role away; another cluster admin can".to_string()));
    }
    state.store.set_cluster_role(&user.id, role.map(|r| r.as_str())).await?;
    tracing::info!(user = %user.name, role = role.map_or("none", |r| r.as_str()), "cluster role set");
    Ok(StatusCode::NO_CONTENT)
}

fn deploy_token_view(row: &DeployTokenRow) -> DeployTokenView {
    DeployTokenView {
        id: row.id.clone(),
        app: row.app.clone(),
        name: row.name.clone(),
        prefix: row.prefix.clone(),
        created_by: row.created_by.clone(),
        created_at: rfc3339_ms(row.created_at),
        expires_at: row.expires_at.map(rfc3339_ms),
        last_used_at: row.last_used_at.map(rfc3339_ms),
        revoked_at: row.revoked_at.map(rfc3339_ms),
    }
}

#[utoipa::path(get, path = "/api/apps/{name}/deploy-tokens", operation_id = "deploy_tokens_list", tag = "apps",
    params(("name" = String, Path, description = "The app's name")),
    responses((status = 200, description = "The app's deploy tokens, newest first, without their secrets", body = DeployTokenList)))]
pub async fn deploy_tokens(State(state): State<Arc<AppState>>, Path(name): Path<String>) -> Result<Json<DeployTokenList>, ApiError> {
    Ok(Json(DeployTokenList { tokens: state.store.deploy_tokens_of(&name).await?.iter().map(deploy_token_view).collect() }))
}

/// Makes a deploy token for a CI system: it deploys and reads this app
/// only. The answer is the only time it is shown.
#[utoipa::path(post, path = "/api/apps/{name}/deploy-tokens", operation_id = "deploy_tokens_create", tag = "apps", request_body = NewDeployToken,
    params(("name" = String, Path, description = "The app's name")),
    responses(
        (status = 201, description = "Made; `token` is shown only now", body = CreatedDeployToken),
        (status = 400, description = "Invalid name or end", body = ErrorBody),
        (status = 404, description = "No such app", body = ErrorBody),
        (status = 409, description = "A token of that name exists, or too many", body = ErrorBody),
    ))]
pub async fn create_deploy_token(
    State(state): State<Arc<AppState>>,
    Extension(access): Extension<Access>,
    Path(name): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<(StatusCode, Json<CreatedDeployToken>), ApiError> {
    let request: NewDeployToken = parse_json(&body_bytes(body)?)?;
    let expires_at = crate::auth::routes::expiry(request.expires_at.as_deref())?;
    let (row, token) = deploy_tokens::create(&state, &name, &request.name, &access.actor, expires_at).await?;
    Ok((StatusCode::CREATED, Json(CreatedDeployToken { view: deploy_token_view(&row), token })))
}

/// Revokes a deploy token; it stops working at once.
#[utoipa::path(delete, path = "/api/apps/{name}/deploy-tokens/{id}", operation_id = "deploy_tokens_revoke", tag = "apps",
    params(("name" = String, Path, description = "The app's name"), ("id" = String, Path, description = "The token's id")),
    responses((status = 204, description = "Revoked (or already revoked)"), (status = 404, description = "The app has no such token", body = ErrorBody)))]
pub async fn revoke_deploy_token(State(state): State<Arc<AppState>>, Path((name, id)): Path<(String, String)>) -> Result<StatusCode, ApiError> {
    deploy_tokens::revoke(&state, &name, &id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// The login mappings: which git host groups grant which team roles.
#[utoipa::path(get, path = "/api/team-mappings", operation_id = "team_mappings_show", tag = "teams",
    responses((status = 200, description = "Every mapping", body = cloudweb_api_types::teams::TeamMappings)))]
pub async fn mappings(State(state): State<Arc<AppState>>) -> Result<Json<cloudweb_api_types::teams::TeamMappings>, ApiError> {
    let teams = state.store.teams().await?;
    let name = |id: &str| teams.iter().find(|t| t.id == id).map_or_else(|| id.to_string(), |t| t.name.clone());
    let rows = state.store.team_mappings().await?;
    let revision = Some(crate::store::mappings_revision(&rows));
    let mappings = rows
        .into_iter()
        .map(|m| cloudweb_api_types::teams::TeamMapping { provider: m.provider, group: m.external_group, team: name(&m.team_id), role: m.role })
        .collect();
    Ok(Json(cloudweb_api_types::teams::TeamMappings { mappings, revision }))
}

/// Replaces every login mapping. Memberships follow at each user's next
/// login through the host, and within `--team-mapping-check-seconds` (an
/// hour) for linked identities; those granted by a mapping no longer
/// listed go at once (a team's last owner stays).
#[utoipa::path(put, path = "/api/team-mappings", operation_id = "team_mappings_replace", tag = "teams", request_body = cloudweb_api_types::teams::TeamMappings,
    responses(
        (status = 200, description = "Saved", body = cloudweb_api_types::teams::TeamMappings),
        (status = 400, description = "An unknown host or role, a group not in its host's form (GitLab acme/devs, GitHub acme or acme/team-slug, Gitea acme), or more than 200 mappings", body = ErrorBody),
        (status = 404, description = "No such team", body = ErrorBody),
        (status = 409, description = "`revision` was given and the list has changed since it was read at that revision: nothing was saved", body = ErrorBody),
    ))]
pub async fn replace_mappings(State(state): State<Arc<AppState>>, body: Result<Bytes, BytesRejection>) -> Result<Json<cloudweb_api_types::teams::TeamMappings>, ApiError> {
    let request: cloudweb_api_types::teams::TeamMappings = parse_json(&body_bytes(body)?)?;
    if request.revision.as_ref().is_some_and(|r| r.len() > 64) {
        return Err(ApiError::BadRequest("revision: at most 64 characters (the one a GET answered)".to_string()));
    }
    if request.mappings.len() > 200 {
        return Err(ApiError::BadRequest("at most 200 mappings".to_string()));
    }
    let mut rows = Vec::new();
    for m in &request.mappings {
        if !crate::access::mapping::PROVIDERS.contains(&m.provider.as_str()) {
            return Err(ApiError::BadRequest(format!("provider: {:?} is not one of {}", m.provider, crate::access::mapping::PROVIDERS.join(", "))));
        }
        crate::access::mapping::check_group(&m.provider, m.group.trim()).map_err(ApiError::BadRequest)?;
        let role = TeamRole::parse(&m.role).ok_or_else(|| ApiError::BadRequest(format!("role: unknown role {:?} (viewer, deployer, admin or owner)", m.role)))?;
        let team = team(&state, &m.team).await?;
        rows.push(crate::store::MappingRow { provider: m.provider.clone(), external_group: m.group.trim().to_string(), team_id: team.id, role: role.as_str().to_string() });
    }
    if !state.store.replace_team_mappings(&rows, request.revision.as_deref()).await? {
        return Err(ApiError::Conflict(format!(
            "the mappings changed since they were read at revision {}: nothing was saved; read them again and make the change on what they are now",
            request.revision.as_deref().unwrap_or_default()
        )));
    }
    // Memberships of mappings that are gone went with them.
    state.access_cache.forget_all();
    tracing::info!(mappings = rows.len(), "team mappings replaced");
    mappings(State(state)).await
}
