//! Which local user a login through a git host (GitLab, GitHub, Gitea) is: the
//! link between the host's identity and a user of this control plane.
//!
//! The link is made only by the host's numeric user id (the `local_user`
//! column of `gitlab_accounts`, or of `git_identities` for other hosts),
//! never by a username or an email address:
//! - an identity already linked logs in as its user;
//! - an unlinked identity, when the browser already has a session, is
//!   linked to that session's user (connecting the host to an existing
//!   account);
//! - otherwise a new user is made for it, with no password, named after
//!   the host's username (made valid and unique: `alice`, `alice-2`, …).
//!   A local user who happens to have the same name stays untouched.

use crate::auth::users;
use crate::error::ApiError;
use crate::store::UserRow;
use crate::AppState;

/// A git host people log in with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Host {
    Gitlab,
    Github,
    Gitea,
}

impl Host {
    /// Its name in `git_identities.provider` and in fallback user names.
    pub fn key(self) -> &'static str {
        match self {
            Host::Gitlab => "gitlab",
            Host::Github => "github",
            Host::Gitea => "gitea",
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Host::Gitlab => "GitLab",
            Host::Github => "GitHub",
            Host::Gitea => "Gitea",
        }
    }

    /// The suffix of a user name made unique by the id: `-gl42`, `-gh42`.
    fn short(self) -> &'static str {
        match self {
            Host::Gitlab => "gl",
            Host::Github => "gh",
            Host::Gitea => "gt",
        }
    }
}

/// An identity on a host, already saved (`gitlab_accounts` with its
/// tokens, or `git_identities`).
#[derive(Debug, Clone, Copy)]
pub struct Identity<'a> {
    pub host: Host,
    pub id: i64,
    pub username: &'a str,
}

/// Why a login gets no local user.
#[derive(Debug)]
pub enum Refusal {
    /// The identity is linked to a user other than the one logged in.
    LinkedElsewhere,
}

/// The local user the identity's saved row is linked to.
async fn linked_to(state: &AppState, identity: Identity<'_>) -> Result<Option<String>, ApiError> {
    let missing = || ApiError::Internal(format!("the {} identity was not saved", identity.host.label()));
    Ok(match identity.host {
        Host::Gitlab => state.store.gitlab_account(identity.id).await?.ok_or_else(missing)?.local_user,
        host => state.store.git_identity(host.key(), identity.id).await?.ok_or_else(missing)?.local_user,
    })
}

/// Links the identity to `user` unless it is linked already; whether it did.
async fn link(state: &AppState, identity: Identity<'_>, user: &str) -> Result<bool, ApiError> {
    Ok(match identity.host {
        Host::Gitlab => state.store.link_gitlab_account(identity.id, user).await?,
        host => state.store.link_git_identity(host.key(), identity.id, user).await?,
    })
}

/// The local user an identity logs in as, linking or creating it as the
/// module documentation says. `current` is the user of the browser's live
/// session, if any.
pub async fn local_user(state: &AppState, identity: Identity<'_>, current: Option<&UserRow>) -> Result<Result<UserRow, Refusal>, ApiError> {
    let label = identity.host.label();
    if let Some(linked) = linked_to(state, identity).await? {
        if current.is_some_and(|c| c.id != linked) {
            return Ok(Err(Refusal::LinkedElsewhere));
        }
        return linked_user(state, identity, &linked).await.map(Ok);
    }
    if let Some(current) = current {
        if link(state, identity, &current.id).await? {
            tracing::info!(host = label, host_user = identity.id, user = %current.name, "linked a git host identity to the logged-in user");
            return Ok(Ok(current.clone()));
        }
        // Linked meanwhile by another login: decide again.
        return Box::pin(local_user(state, identity, Some(current))).await;
    }
    let user = create_user(state, identity).await?;
    if link(state, identity, &user.id).await? {
        tracing::info!(host = label, host_user = identity.id, user = %user.name, "created a user for a git host identity");
        return Ok(Ok(user));
    }
    // Another login of the same identity linked first: ours is never used.
    state.store.disable_user(&user.id, state.clock.now_ms()).await?;
    let linked = linked_to(state, identity).await?.ok_or_else(|| ApiError::Internal(format!("the {label} identity lost its link")))?;
    linked_user(state, identity, &linked).await.map(Ok)
}

async fn linked_user(state: &AppState, identity: Identity<'_>, id: &str) -> Result<UserRow, ApiError> {
    let label = identity.host.label();
    state.store.user_by_id(id).await?.ok_or_else(|| ApiError::Internal(format!("the {label} identity is linked to a missing user {id}")))
}

/// A user with no password named after the host's username.
async fn create_user(state: &AppState, identity: Identity<'_>) -> Result<UserRow, ApiError> {
    let base = base_name(identity.host, identity.username, identity.id);
    for candidate in candidates(identity.host, &base, identity.id) {
        match users::create(&state.store, state.clock.now_ms(), &candidate, None, None).await {
            Ok(user) => return Ok(user),
            Err(ApiError::Conflict(_)) => continue,
            Err(err) => return Err(err),
        }
    }
    Err(ApiError::Conflict(format!("no free user name for the {} user {}; ask an administrator", identity.host.label(), identity.username)))
}

/// A valid user name from a host's username: letters, digits, `.`, `_`,
/// `-` kept, anything else made `-`, starting with a letter or digit, at
/// most [`users::MAX_NAME_CHARS`]; `<host>-<id>` when nothing is left.
pub fn base_name(host: Host, username: &str, user_id: i64) -> String {
    let mapped: String = username.chars().map(|c| if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') { c } else { '-' }).collect();
    let trimmed = mapped.trim_start_matches(|c: char| !c.is_ascii_alphanumeric());
    let mut name: String = trimmed.chars().take(users::MAX_NAME_CHARS).collect();
    if name.is_empty() {
        name = format!("{}-{user_id}", host.key());
    }
    name
}

/// The names tried in turn: the base, `base-2` … `base-9`, `base-gl<id>`
/// (`-gh<id>` for GitHub), each cut to fit.
fn candidates(host: Host, base: &str, user_id: i64) -> Vec<String> {
    let with_suffix = |suffix: String| {
        let keep = users::MAX_NAME_CHARS - suffix.len();
        format!("{}{suffix}", &base[..base.len().min(keep)])
    };
    let mut names = vec![base.to_string()];
    names.extend((2..=9).map(|n| with_suffix(format!("-{n}"))));
    names.push(with_suffix(format!("-{}{user_id}", host.short())));
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_valid_and_bounded() {
        let gl = Host::Gitlab;
        assert_eq!(base_name(gl, "alice", 1), "alice");
        assert_eq!(base_name(gl, "_ali ce+x", 1), "ali-ce-x");
        assert_eq!(base_name(gl, "__", 7), "gitlab-7");
        assert_eq!(base_name(Host::Github, "__", 7), "github-7");
        assert_eq!(base_name(gl, "élan", 7), "lan");
        let long = "a".repeat(100);
        assert_eq!(base_name(gl, &long, 1).len(), users::MAX_NAME_CHARS);
        for host in [Host::Gitlab, Host::Github, Host::Gitea] {
            for name in candidates(host, &base_name(host, &long, 1), 123456789) {
                assert!(users::validate_name(&name).is_ok(), "{name}");
            }
        }
        let tried = candidates(gl, "bob", 42);
        assert_eq!(tried[0], "bob");
        assert_eq!(tried[1], "bob-2");
        assert_eq!(tried.last().unwrap(), "bob-gl42");
        assert_eq!(candidates(Host::Github, "bob", 42).last().unwrap(), "bob-gh42");
    }
}
