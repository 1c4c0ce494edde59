//! Login mappings: a git host's groups grant teams and roles. At each
//! login through the host (and at least hourly after, from the stored
//! token, see `git::refresher`) the user's mapped memberships are made to
//! match the groups they are in now: a user removed from a group loses the
//! team. Memberships granted by hand are not touched.

use std::collections::HashMap;

use super::TeamRole;
use crate::error::ApiError;
use crate::store::MappingRow;
use crate::AppState;

/// The hosts a mapping may name.
pub const PROVIDERS: &[&str] = &["gitlab"];

/// Whether any mapping names `provider` (no need to ask for groups else).
pub async fn wanted(state: &AppState, provider: &str) -> Result<bool, ApiError> {
    Ok(state.store.team_mappings().await?.iter().any(|m| m.provider == provider))
}

/// What `groups` grant through `mappings`: team id → (role, source); the
/// highest role when several groups map to one team.
pub fn grants(mappings: &[MappingRow], provider: &str, groups: &[String]) -> HashMap<String, (TeamRole, String)> {
    let mut out: HashMap<String, (TeamRole, String)> = HashMap::new();
    for mapping in mappings.iter().filter(|m| m.provider == provider) {
        let Some(role) = TeamRole::parse(&mapping.role) else { continue };
        if !groups.iter().any(|g| g.eq_ignore_ascii_case(&mapping.external_group)) {
            continue;
        }
        let source = format!("{provider}:{}", mapping.external_group);
        match out.get(&mapping.team_id) {
            Some((held, _)) if *held >= role => {}
            _ => {
                out.insert(mapping.team_id.clone(), (role, source));
            }
        }
    }
    out
}

/// Makes `user_id`'s memberships from `provider`'s mappings match
/// `groups`.
pub async fn apply(state: &AppState, user_id: &str, provider: &str, groups: &[String]) -> Result<(), ApiError> {
    let mappings = state.store.team_mappings().await?;
    if !mappings.iter().any(|m| m.provider == provider) {
        return Ok(());
    }
    let grants: Vec<(String, String, String)> =
        grants(&mappings, provider, groups).into_iter().map(|(team, (role, source))| (team, role.as_str().to_string(), source)).collect();
    let removed = state.store.sync_mapped_memberships(user_id, provider, &grants, state.clock.now_ms()).await?;
    state.access_cache.forget_user(user_id);
    tracing::info!(user = user_id, provider, granted = grants.len(), removed = removed.len(), "team memberships follow the login's groups");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mapping(group: &str, team: &str, role: &str) -> MappingRow {
        MappingRow { provider: "gitlab".into(), external_group: group.into(), team_id: team.into(), role: role.into() }
    }

    #[test]
    fn groups_grant_the_highest_mapped_role_per_team() {
        let mappings = [mapping("acme/devs", "t1", "deployer"), mapping("acme/leads", "t1", "admin"), mapping("acme/ops", "t2", "viewer")];
        let got = grants(&mappings, "gitlab", &["ACME/devs".into(), "acme/leads".into()]);
        assert_eq!(got.len(), 1);
        assert_eq!(got["t1"], (TeamRole::Admin, "gitlab:acme/leads".to_string()));
        assert!(grants(&mappings, "gitlab", &["acme".into(), "acme/devs-2".into()]).is_empty(), "exact group paths only");
        assert!(grants(&mappings, "gitea", &["acme/devs".into()]).is_empty(), "another host's groups are not these");
    }
}
