//! Which local user a GitLab login is: the link between a GitLab identity
//! and a user of this control plane.
//!
//! The link is made only by the GitLab user id (the `local_user` column of
//! `gitlab_accounts`), never by a username or an email address:
//! - an identity already linked logs in as its user;
//! - an unlinked identity, when the browser already has a session, is
//!   linked to that session's user (connecting GitLab to an existing
//!   account);
//! - otherwise a new user is made for it, with no password, named after
//!   the GitLab username (made valid and unique: `alice`, `alice-2`, …).
//!   A local user who happens to have the same name stays untouched.

use crate::auth::users;
use crate::error::ApiError;
use crate::store::UserRow;
use crate::AppState;

/// Why a GitLab login gets no local user.
#[derive(Debug)]
pub enum Refusal {
    /// The identity is linked to a user other than the one logged in.
    LinkedElsewhere,
}

/// The local user a GitLab identity (already saved in `gitlab_accounts`)
/// logs in as, linking or creating it as the module documentation says.
/// `current` is the user of the browser's live session, if any.
pub async fn local_user(state: &AppState, gitlab_user_id: i64, username: &str, current: Option<&UserRow>) -> Result<Result<UserRow, Refusal>, ApiError> {
    let account = state.store.gitlab_account(gitlab_user_id).await?.ok_or_else(|| ApiError::Internal("the GitLab account was not saved".into()))?;
    if let Some(linked) = account.local_user {
        if current.is_some_and(|c| c.id != linked) {
            return Ok(Err(Refusal::LinkedElsewhere));
        }
        return linked_user(state, &linked).await.map(Ok);
    }
    if let Some(current) = current {
        if state.store.link_gitlab_account(gitlab_user_id, &current.id).await? {
            tracing::info!(gitlab_user = gitlab_user_id, user = %current.name, "linked a GitLab identity to the logged-in user");
            return Ok(Ok(current.clone()));
        }
        // Linked meanwhile by another login: decide again.
        return Box::pin(local_user(state, gitlab_user_id, username, Some(current))).await;
    }
    let user = create_user(state, gitlab_user_id, username).await?;
    if state.store.link_gitlab_account(gitlab_user_id, &user.id).await? {
        tracing::info!(gitlab_user = gitlab_user_id, user = %user.name, "created a user for a GitLab identity");
        return Ok(Ok(user));
    }
    // Another login of the same identity linked first: ours is never used.
    state.store.disable_user(&user.id, state.clock.now_ms()).await?;
    let account = state.store.gitlab_account(gitlab_user_id).await?;
    let linked = account.and_then(|a| a.local_user).ok_or_else(|| ApiError::Internal("the GitLab identity lost its link".into()))?;
    linked_user(state, &linked).await.map(Ok)
}

async fn linked_user(state: &AppState, id: &str) -> Result<UserRow, ApiError> {
    state.store.user_by_id(id).await?.ok_or_else(|| ApiError::Internal(format!("the GitLab identity is linked to a missing user {id}")))
}

/// A user with no password named after the GitLab username.
async fn create_user(state: &AppState, gitlab_user_id: i64, username: &str) -> Result<UserRow, ApiError> {
    let base = base_name(username, gitlab_user_id);
    for candidate in candidates(&base, gitlab_user_id) {
        match users::create(&state.store, state.clock.now_ms(), &candidate, None).await {
            Ok(user) => return Ok(user),
            Err(ApiError::Conflict(_)) => continue,
            Err(err) => return Err(err),
        }
    }
    Err(ApiError::Conflict(format!("no free user name for the GitLab user {username}; ask an administrator")))
}

/// A valid user name from a GitLab username: letters, digits, `.`, `_`,
/// `-` kept, anything else made `-`, starting with a letter or digit, at
/// most [`users::MAX_NAME_CHARS`]; `gitlab-<id>` when nothing is left.
pub fn base_name(username: &str, gitlab_user_id: i64) -> String {
    let mapped: String = username.chars().map(|c| if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') { c } else { '-' }).collect();
    let trimmed = mapped.trim_start_matches(|c: char| !c.is_ascii_alphanumeric());
    let mut name: String = trimmed.chars().take(users::MAX_NAME_CHARS).collect();
    if name.is_empty() {
        name = format!("gitlab-{gitlab_user_id}");
    }
    name
}

/// The names tried in turn: the base, `base-2` … `base-9`, `base-gl<id>`,
/// each cut to fit.
fn candidates(base: &str, gitlab_user_id: i64) -> Vec<String> {
    let with_suffix = |suffix: String| {
        let keep = users::MAX_NAME_CHARS - suffix.len();
        format!("{}{suffix}", &base[..base.len().min(keep)])
    };
    let mut names = vec![base.to_string()];
    names.extend((2..=9).map(|n| with_suffix(format!("-{n}"))));
    names.push(with_suffix(format!("-gl{gitlab_user_id}")));
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_valid_and_bounded() {
        assert_eq!(base_name("alice", 1), "alice");
        assert_eq!(base_name("_ali ce+x", 1), "ali-ce-x");
        assert_eq!(base_name("__", 7), "gitlab-7");
        assert_eq!(base_name("élan", 7), "lan");
        let long = "a".repeat(100);
        assert_eq!(base_name(&long, 1).len(), users::MAX_NAME_CHARS);
        for name in candidates(&base_name(&long, 1), 123456789) {
            assert!(users::validate_name(&name).is_ok(), "{name}");
        }
        let tried = candidates("bob", 42);
        assert_eq!(tried[0], "bob");
        assert_eq!(tried[1], "bob-2");
        assert_eq!(tried.last().unwrap(), "bob-gl42");
    }
}
