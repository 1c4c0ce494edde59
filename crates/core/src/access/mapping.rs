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
pub const PROVIDERS: &[&str] = &["gitlab", "github", "gitea"];

/// Checks a mapping's group for its host: on GitLab a group's full path
/// (`acme/devs`), on GitHub an organization (`acme`) or one of its teams
/// by slug (`acme/devs`), on Gitea an organization (`acme`).
pub fn check_group(provider: &str, group: &str) -> Result<(), String> {
    if group.is_empty() || group.len() > 255 || group.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return Err("group: give the group's full path (1 to 255 characters, no spaces)".to_string());
    }
    let name = cloudweb_git::github_login::valid_name;
    match provider {
        "github" => match group.split_once('/') {
            None if name(group) => Ok(()),
            Some((org, team)) if name(org) && name(team) => Ok(()),
            _ => Err(format!("group: {group:?} is not a GitHub organization (acme) or team (acme/team-slug)")),
        },
        "gitea" if name(group) => Ok(()),
        "gitea" => Err(format!("group: {group:?} is not a Gitea organization name (letters, digits, '-', '_' or '.')")),
        _ if group.split('/').any(str::is_empty) => Err(format!("group: {group:?} is not a GitLab group path (acme/devs)")),
        _ => Ok(()),
    }
}

/// The groups `provider`'s mappings name (each once, any case).
pub fn mapped_groups(mappings: &[MappingRow], provider: &str) -> Vec<String> {
    let mut groups: Vec<String> = Vec::new();
    for mapping in mappings.iter().filter(|m| m.provider == provider) {
        if !groups.iter().any(|g| g.eq_ignore_ascii_case(&mapping.external_group)) {
            groups.push(mapping.external_group.clone());
        }
    }
    groups
}

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

    #[test]
    fn each_host_names_its_groups_its_own_way() {
        for (provider, group) in [("gitlab", "acme/devs/web"), ("github", "acme"), ("github", "acme/web-team"), ("gitea", "acme.org")] {
            assert_eq!(check_group(provider, group), Ok(()), "{provider} {group}");
        }
        for (provider, group) in [("gitlab", "acme//devs"), ("gitlab", ""), ("github", "acme/web/x"), ("github", "ac me"), ("gitea", "acme/devs"), ("gitea", "../x")] {
            assert!(check_group(provider, group).is_err(), "{provider} {group:?}");
        }
        let mappings = [mapping("Acme", "t1", "viewer"), mapping("acme", "t2", "admin"), mapping("ops", "t2", "viewer")];
        assert_eq!(mapped_groups(&mappings, "gitlab"), vec!["Acme".to_string(), "ops".to_string()]);
        assert!(mapped_groups(&mappings, "github").is_empty());
    }
}
