//! The audit log over HTTP: `GET /api/audit` (cluster roles see every
//! entry, a team's owners their team's) and `POST /api/audit/verify`,
//! which walks the hash chain.

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::{Query, State};
use axum::{Extension, Json};
use cloudweb_api_types::teams::{AuditEntryView, AuditList, AuditVerification};
use cloudweb_api_types::ErrorBody;
use crate::store::audit::{AuditQuery, AuditRow};
use serde::Deserialize;

use crate::access::{Access, TeamRole};
use crate::clock::rfc3339_ms;
use crate::error::ApiError;
use crate::AppState;

/// At most this many entries per answer.
pub const MAX_LIMIT: i64 = 5_000;

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
pub struct AuditParams {
    /// From when: RFC 3339, or an age (`90s`, `30m`, `24h`, `7d`).
    pub since: Option<String>,
    /// Until when (RFC 3339 or an age).
    pub until: Option<String>,
    /// A user's name or id (their tokens' entries too), or an actor as
    /// entries name it (`deploy-token:dtk_…`, `admin-token`).
    pub actor: Option<String>,
    /// Entries whose action contains this (`deploy`, `DELETE`, `login`).
    pub action: Option<String>,
    /// Only this team's entries (name or id).
    pub team: Option<String>,
    /// Entries after this sequence number (paging).
    pub after: Option<i64>,
    /// At most this many (1 to 5000, default 500).
    pub limit: Option<i64>,
}

/// A point in time from RFC 3339 or an age before `now_ms`.
pub fn instant(text: &str, now_ms: i64) -> Result<i64, ApiError> {
    if let Some(at) = crate::clock::parse_rfc3339_ms(text) {
        return Ok(at);
    }
    let bad = || ApiError::BadRequest(format!("{text:?}: give RFC 3339 or an age like 90s, 30m, 24h or 7d"));
    let (number, unit) = text.split_at(text.len().saturating_sub(1));
    let number: i64 = number.parse().map_err(|_| bad())?;
    let seconds = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => return Err(bad()),
    };
    if !(0..=36_500 * 86_400).contains(&(number.saturating_mul(seconds))) {
        return Err(bad());
    }
    Ok(now_ms - number * seconds * 1000)
}

/// The teams whose entries `access` may read: `None` for all.
fn readable_teams(access: &Access) -> Result<Option<Vec<String>>, ApiError> {
    if access.cluster.is_some() && access.apps.is_none() {
        return Ok(None);
    }
    let owned: Vec<String> = access.grants.iter().filter(|g| g.role == TeamRole::Owner).map(|g| g.team_id.clone()).collect();
    if owned.is_empty() || access.apps.is_some() {
        return Err(ApiError::Forbidden("the audit log is for cluster roles and team owners".to_string()));
    }
    Ok(Some(owned))
}

/// Audit entries, oldest first.
#[utoipa::path(get, path = "/api/audit", operation_id = "audit_list", tag = "audit", params(AuditParams),
    responses(
        (status = 200, description = "The entries the caller may read, oldest first", body = AuditList),
        (status = 400, description = "Invalid query", body = ErrorBody),
        (status = 403, description = "Neither a cluster role nor a team's owner", body = ErrorBody),
    ))]
pub async fn list(State(state): State<Arc<AppState>>, Extension(access): Extension<Access>, Query(params): Query<AuditParams>) -> Result<Json<AuditList>, ApiError> {
    let mut teams = readable_teams(&access)?;
    let now = state.clock.now_ms();
    if let Some(team) = &params.team {
        let team = state.store.team(team).await?.ok_or_else(|| ApiError::NotFound(format!("no team named {team}")))?;
        match &teams {
            Some(mine) if !mine.contains(&team.id) => return Err(ApiError::Forbidden(format!("you are not an owner of team {}", team.name))),
            _ => teams = Some(vec![team.id]),
        }
    }
    let actor = match params.actor.as_deref() {
        None => None,
        Some(text) if text.contains(':') || text == "admin-token" || text == "anonymous" => Some(text.to_string()),
        Some(name) => match crate::access::teams::user(&state, name).await {
            Ok(user) => Some(format!("user:{}", user.id)),
            Err(_) => return Ok(Json(AuditList { entries: Vec::new() })),
        },
    };
    let limit = params.limit.unwrap_or(500);
    if !(1..=MAX_LIMIT).contains(&limit) {
        return Err(ApiError::BadRequest(format!("limit must be 1 to {MAX_LIMIT}")));
    }
    let query = AuditQuery {
        since_ms: params.since.as_deref().map(|t| instant(t, now)).transpose()?,
        until_ms: params.until.as_deref().map(|t| instant(t, now)).transpose()?,
        actor,
        action: params.action.clone().filter(|a| !a.is_empty()),
        teams,
        after_seq: params.after,
        limit,
    };
    let rows = state.store.audit_entries(&query).await?;
    let names: HashMap<String, String> = state.store.users().await?.into_iter().map(|u| (u.id, u.name)).collect();
    let team_names: HashMap<String, String> = state.store.teams().await?.into_iter().map(|t| (t.id, t.name)).collect();
    Ok(Json(AuditList { entries: rows.iter().map(|row| view(row, &names, &team_names)).collect() }))
}

fn view(row: &AuditRow, names: &HashMap<String, String>, teams: &HashMap<String, String>) -> AuditEntryView {
    let user = row.entry.actor.strip_prefix("user:").map(|rest| rest.split('/').next().unwrap_or(rest));
    AuditEntryView {
        seq: row.seq,
        at: rfc3339_ms(row.entry.at),
        request_id: row.entry.request_id.clone(),
        phase: row.entry.phase.clone(),
        actor: row.entry.actor.clone(),
        actor_name: user.and_then(|id| names.get(id).cloned()),
        team: row.entry.team.as_ref().map(|id| teams.get(id).cloned().unwrap_or_else(|| id.clone())),
        source: row.entry.source.clone(),
        action: row.entry.action.clone(),
        target: row.entry.target.clone(),
        result: row.entry.result.clone(),
        hash: row.hash.clone(),
    }
}

/// Walks the whole chain: an entry changed or deleted in the database is
/// found, with where.
#[utoipa::path(post, path = "/api/audit/verify", operation_id = "audit_verify", tag = "audit",
    responses((status = 200, description = "What the walk found", body = AuditVerification)))]
pub async fn verify(State(state): State<Arc<AppState>>) -> Result<Json<AuditVerification>, ApiError> {
    let check = state.store.verify_audit().await?;
    if let Some((seq, why)) = &check.broken_at {
        tracing::error!(entry = seq, reason = %why, "the audit log's chain is broken");
    }
    Ok(Json(AuditVerification {
        intact: check.broken_at.is_none(),
        entries: check.entries,
        broken_at: check.broken_at.as_ref().map(|b| b.0),
        reason: check.broken_at.map(|b| b.1),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instants_are_rfc3339_or_ages() {
        let now = 1_000_000_000;
        assert_eq!(instant("90s", now).unwrap(), now - 90_000);
        assert_eq!(instant("24h", now).unwrap(), now - 86_400_000);
        assert_eq!(instant("1970-01-01T00:00:01Z", now).unwrap(), 1000);
        for bad in ["", "h", "24", "-3h", "1y", "99999999999d"] {
            assert!(instant(bad, now).is_err(), "{bad}");
        }
    }
}
