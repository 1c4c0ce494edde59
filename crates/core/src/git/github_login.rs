//! Logging in with GitHub, the control plane's side: the settings (the
//! App's OAuth client id, its client secret sealed with the cluster key,
//! the allow-list) and the allow-list check. The OAuth flow itself is
//! `cloudweb_http::git::github_login`; the GitHub calls are
//! `cloudweb_git::github_login`.

use cloudweb_api_types::github::{GithubLoginInput, GithubLoginSettingsView};
use cloudweb_git::github_login::{self as api, GithubUser, Membership, UserClient};

use crate::error::ApiError;
use crate::store::GithubLoginRow;
use crate::AppState;

/// Longest allow-list, per kind.
const MAX_ALLOWED: usize = 1000;

pub fn client_secret_context() -> &'static str {
    "github-login-client-secret"
}

/// The login settings with the client secret opened.
pub struct LoginSettings {
    pub web_url: String,
    pub api_url: String,
    pub client_id: String,
    pub client_secret: String,
    pub allowed_users: Vec<String>,
    pub allowed_orgs: Vec<String>,
    /// `org/team-slug`.
    pub allowed_teams: Vec<String>,
}

fn list(json: &str) -> Vec<String> {
    serde_json::from_str(json).unwrap_or_default()
}

/// The login settings, `None` when logging in with GitHub is not set up.
pub async fn settings(state: &AppState) -> Result<Option<LoginSettings>, ApiError> {
    let Some(row) = state.store.github_login().await? else { return Ok(None) };
    let secret = state.sealer.open(client_secret_context(), &row.client_secret_sealed).map_err(|e| ApiError::Internal(format!("GitHub client secret: {e}")))?;
    Ok(Some(LoginSettings {
        client_secret: String::from_utf8(secret).map_err(|_| ApiError::Internal("the GitHub client secret is not text".into()))?,
        allowed_users: list(&row.allowed_users),
        allowed_orgs: list(&row.allowed_orgs),
        allowed_teams: list(&row.allowed_teams),
        web_url: row.web_url,
        api_url: row.api_url,
        client_id: row.client_id,
    }))
}

pub fn callback_url(state: &AppState) -> String {
    format!("{}/api/auth/github/callback", state.git.public_url())
}

pub fn login_url(state: &AppState) -> String {
    format!("{}/api/auth/github/login", state.git.public_url())
}

pub fn view(state: &AppState, row: &GithubLoginRow) -> GithubLoginSettingsView {
    GithubLoginSettingsView {
        web_url: row.web_url.clone(),
        api_url: row.api_url.clone(),
        client_id: row.client_id.clone(),
        client_secret_set: true,
        allowed_users: list(&row.allowed_users),
        allowed_orgs: list(&row.allowed_orgs),
        allowed_teams: list(&row.allowed_teams),
        callback_url: callback_url(state),
        login_url: login_url(state),
    }
}

#[derive(Clone, Copy)]
enum Kind {
    User,
    Org,
    Team,
}

/// Checks one allow-list: each entry a GitHub name (`org/team` for teams,
/// a login or `id:<number>` for users), no duplicates kept.
fn clean(field: &str, entries: Vec<String>, kind: Kind) -> Result<Vec<String>, ApiError> {
    if entries.len() > MAX_ALLOWED {
        return Err(ApiError::BadRequest(format!("at most {MAX_ALLOWED} entries in {field}")));
    }
    let mut kept: Vec<String> = Vec::with_capacity(entries.len());
    for entry in entries {
        cloudweb_protocol::validate::bounded_text(field, &entry, 201)?;
        let valid = match kind {
            Kind::Team => entry.split_once('/').is_some_and(|(org, slug)| api::valid_name(org) && api::valid_name(slug)),
            Kind::User => match entry.strip_prefix("id:") {
                Some(id) => !id.is_empty() && id.len() <= 19 && id.bytes().all(|b| b.is_ascii_digit()),
                None => api::valid_name(&entry),
            },
            Kind::Org => api::valid_name(&entry),
        };
        if !valid {
            let shape = match kind {
                Kind::Team => "org/team-slug, each letters, digits, '-', '_' or '.'",
                Kind::User => "a login (letters, digits, '-', '_' or '.') or id:<number>",
                Kind::Org => "letters, digits, '-', '_' or '.'",
            };
            return Err(ApiError::BadRequest(format!("invalid {field} entry {entry:?}: {shape}")));
        }
        if !kept.iter().any(|k| k.eq_ignore_ascii_case(&entry)) {
            kept.push(entry);
        }
    }
    Ok(kept)
}

/// Validates and stores the login settings.
pub async fn apply(state: &AppState, input: GithubLoginInput) -> Result<GithubLoginRow, ApiError> {
    let allow_http = state.config.allow_private_git_hosts;
    let web_url = api::web_url(input.web_url.as_deref().unwrap_or(api::DEFAULT_WEB_URL), allow_http).map_err(ApiError::BadRequest)?;
    let api_url =
        cloudweb_git::github::api_url(input.api_url.as_deref().unwrap_or(cloudweb_git::github::DEFAULT_API_URL), allow_http).map_err(ApiError::BadRequest)?;
    cloudweb_protocol::validate::bounded_text("client_id", &input.client_id, 256)?;
    if input.client_id.is_empty() || !input.client_id.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(ApiError::BadRequest("invalid client_id: the App's \"Client ID\" (printable, no spaces)".into()));
    }
    let allowed_users = clean("allowed_users", input.allowed_users, Kind::User)?;
    let allowed_orgs = clean("allowed_orgs", input.allowed_orgs, Kind::Org)?;
    let allowed_teams = clean("allowed_teams", input.allowed_teams, Kind::Team)?;
    let client_secret_sealed = match input.client_secret {
        Some(secret) => {
            cloudweb_protocol::validate::bounded_text("client_secret", &secret, 1024)?;
            if secret.is_empty() || !secret.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(ApiError::BadRequest("invalid client_secret: the secret GitHub showed once (printable, no spaces)".into()));
            }
            state.sealer.seal(client_secret_context(), secret.as_bytes())
        }
        None => match state.store.github_login().await? {
            Some(existing) => existing.client_secret_sealed,
            None => return Err(ApiError::BadRequest("client_secret is required the first time".into())),
        },
    };
    let json = |list: &Vec<String>| serde_json::to_string(list).expect("strings serialize");
    let row = GithubLoginRow {
        web_url,
        api_url,
        client_id: input.client_id,
        client_secret_sealed,
        allowed_users: json(&allowed_users),
        allowed_orgs: json(&allowed_orgs),
        allowed_teams: json(&allowed_teams),
        updated_at: state.clock.now_ms(),
    };
    state.store.put_github_login(&row).await?;
    tracing::info!(web_url = %row.web_url, users = allowed_users.len(), orgs = allowed_orgs.len(), teams = allowed_teams.len(), "GitHub login settings saved");
    Ok(row)
}

/// Whether an `allowed_users` entry names this user: a login (any case),
/// or `id:<number>` for the numeric id (a login may be all digits, so a
/// bare number is a login, never an id).
fn names(entry: &str, user: &GithubUser) -> bool {
    match entry.strip_prefix("id:") {
        Some(id) => id == user.id.to_string(),
        None => entry.eq_ignore_ascii_case(&user.login),
    }
}

/// Whether the allow-list lets this user in: by login or `id:<number>`,
/// else as an active member of a listed organization, else of a listed
/// team. A membership GitHub hides from the user's token (403) counts as
/// none, is logged, and the next entry is tried. An empty allow-list lets
/// nobody in.
pub async fn allowed(client: &UserClient, user: &GithubUser, settings: &LoginSettings) -> Result<bool, cloudweb_git::ProviderError> {
    if settings.allowed_users.iter().any(|entry| names(entry, user)) {
        return Ok(true);
    }
    let hidden = |what: &str, name: &str| {
        tracing::warn!(login = %user.login, what, name, "GitHub would not show this membership to the user's token (SAML SSO not authorized, or the App not installed there); counted as none");
    };
    for org in &settings.allowed_orgs {
        match client.in_org(org).await? {
            Membership::Active => return Ok(true),
            Membership::Hidden => hidden("organization", org),
            Membership::No => {}
        }
    }
    for team in &settings.allowed_teams {
        let Some((org, slug)) = team.split_once('/') else { continue };
        match client.in_team(org, slug, &user.login).await? {
            Membership::Active => return Ok(true),
            Membership::Hidden => hidden("team", team),
            Membership::No => {}
        }
    }
    Ok(false)
}

/// Which of `groups` (organizations, or teams as `org/team-slug`) the
/// user is an active member of, as the login's token sees them: for the
/// team mappings (`access::mapping`). A membership GitHub hides from the
/// token counts as none, as on the allow-list.
pub async fn member_of(client: &UserClient, user: &GithubUser, groups: &[String]) -> Result<Vec<String>, cloudweb_git::ProviderError> {
    let mut found = Vec::new();
    for group in groups {
        let membership = match group.split_once('/') {
            None => client.in_org(group).await?,
            Some((org, slug)) => client.in_team(org, slug, &user.login).await?,
        };
        if membership == Membership::Hidden {
            tracing::warn!(login = %user.login, group = %group, "GitHub would not show this membership to the user's token; a team mapping counts it as none");
        }
        if membership == Membership::Active {
            found.push(group.clone());
        }
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allow_lists_are_checked_and_deduplicated() {
        assert_eq!(clean("allowed_users", vec!["Alice".into(), "alice".into(), "id:42".into(), "42".into()], Kind::User).unwrap(), vec!["Alice", "id:42", "42"]);
        for bad in ["a/b", "", "id:", "id:x1", "id:-1"] {
            assert!(clean("allowed_users", vec![bad.into()], Kind::User).is_err(), "{bad}");
        }
        assert!(clean("allowed_orgs", vec!["id:42".into()], Kind::Org).is_err());
        assert_eq!(clean("allowed_teams", vec!["acme/web".into()], Kind::Team).unwrap(), vec!["acme/web"]);
        for bad in ["acme", "acme/", "/web", "acme/web/x", "acme/we b", "../x"] {
            assert!(clean("allowed_teams", vec![bad.into()], Kind::Team).is_err(), "{bad}");
        }
        assert!(clean("allowed_orgs", vec!["x".into(); MAX_ALLOWED + 1], Kind::Org).is_err());
    }

    #[test]
    fn a_number_is_a_login_and_ids_are_written_id_colon() {
        let user = GithubUser { id: 583231, login: "Octo".into(), name: None };
        assert!(names("octo", &user));
        assert!(names("id:583231", &user));
        assert!(!names("583231", &user), "a bare number is a login");
        let digits = GithubUser { id: 7, login: "583231".into(), name: None };
        assert!(names("583231", &digits));
        assert!(!names("id:583231", &digits), "an id entry never matches a login");
    }
}
