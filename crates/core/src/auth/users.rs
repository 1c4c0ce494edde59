//! Users and their passwords (argon2id, OWASP's parameters: 19 MiB, two
//! passes, one lane). Verification runs off the async threads, a few at a
//! time, and takes as long for an unknown name as for a wrong password.

use std::sync::OnceLock;

use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use argon2::Argon2;

use crate::error::ApiError;
use crate::store::{Store, UserRow};
use crate::AppState;

pub const MIN_PASSWORD_CHARS: usize = 10;
pub const MAX_PASSWORD_BYTES: usize = 1024;
pub const MAX_NAME_CHARS: usize = 64;

/// A login name: 1 to 64 ASCII letters, digits, `.`, `_` or `-`, starting
/// with a letter or digit. Unique without regard to case.
pub fn validate_name(name: &str) -> Result<(), ApiError> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME_CHARS
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if ok {
        Ok(())
    } else {
        Err(ApiError::BadRequest(format!(
            "invalid user name: use 1 to {MAX_NAME_CHARS} letters, digits, '.', '_' or '-', starting with a letter or digit"
        )))
    }
}

pub fn validate_password(password: &str) -> Result<(), ApiError> {
    if password.chars().count() < MIN_PASSWORD_CHARS {
        return Err(ApiError::BadRequest(format!("the password must have at least {MIN_PASSWORD_CHARS} characters")));
    }
    if password.len() > MAX_PASSWORD_BYTES {
        return Err(ApiError::BadRequest(format!("the password must be at most {MAX_PASSWORD_BYTES} bytes")));
    }
    if password.chars().any(char::is_control) {
        return Err(ApiError::BadRequest("the password must not contain control characters".to_string()));
    }
    Ok(())
}

/// The argon2id PHC string of `password` with a fresh salt (blocking).
pub fn hash_password(password: &str) -> Result<String, ApiError> {
    let salt = SaltString::encode_b64(&rand::random::<[u8; 16]>()).map_err(|e| ApiError::Internal(format!("salt: {e}")))?;
    Argon2::default()
        .hash_password(password.as_bytes(), &salt)
        .map(|hash| hash.to_string())
        .map_err(|e| ApiError::Internal(format!("cannot hash the password: {e}")))
}

/// Whether `password` matches the PHC string `hash` (blocking).
pub fn verify_password(password: &str, hash: &str) -> bool {
    match PasswordHash::new(hash) {
        Ok(parsed) => Argon2::default().verify_password(password.as_bytes(), &parsed).is_ok(),
        Err(_) => false,
    }
}

/// A hash of a password nobody knows, verified against when the name is
/// unknown so that answer takes as long as a wrong password.
fn decoy_hash() -> &'static str {
    static DECOY: OnceLock<String> = OnceLock::new();
    DECOY.get_or_init(|| hash_password(&super::random_hex(16)).unwrap_or_default())
}

/// Computes the decoy hash ahead of the first login (blocking), so even
/// the first unknown name takes no longer than a wrong password.
pub fn warm_up() {
    let _ = decoy_hash();
}

/// Creates a user; `password` `None` makes a user who cannot log in with
/// a password (one who logs in through GitLab). `cluster_role`: what the
/// user may do across the cluster (`None`: only what their teams give).
/// 409 when the name is taken.
pub async fn create(store: &Store, now_ms: i64, name: &str, password: Option<&str>, cluster_role: Option<crate::roles::ClusterRole>) -> Result<UserRow, ApiError> {
    validate_name(name)?;
    let password_hash = match password {
        Some(password) => {
            validate_password(password)?;
            let password = password.to_string();
            Some(tokio::task::spawn_blocking(move || hash_password(&password)).await.map_err(|e| ApiError::Internal(e.to_string()))??)
        }
        None => None,
    };
    let user = UserRow { id: format!("usr_{}", super::random_hex(12)), name: name.to_string(), password_hash, created_at: now_ms, disabled_at: None, cluster_role: cluster_role.map(|r| r.as_str().to_string()) };
    if !store.insert_user(&user).await? {
        return Err(ApiError::Conflict(format!("a user named {name} already exists")));
    }
    Ok(user)
}

/// Replaces a user's password and ends all their sessions.
pub async fn set_password(store: &Store, user_id: &str, password: &str) -> Result<(), ApiError> {
    validate_password(password)?;
    let password = password.to_string();
    let hash = tokio::task::spawn_blocking(move || hash_password(&password)).await.map_err(|e| ApiError::Internal(e.to_string()))??;
    if !store.set_password_hash(user_id, Some(&hash)).await? {
        return Err(ApiError::NotFound("no such user".to_string()));
    }
    Ok(())
}

/// The enabled user with that name and password, or `None`. Takes about
/// as long whether the name exists or not.
pub async fn check_password(state: &AppState, name: &str, password: &str) -> Result<Option<UserRow>, ApiError> {
    let user = state.store.user_by_name(name).await?;
    let hash = user.as_ref().and_then(|u| u.password_hash.clone()).unwrap_or_else(|| decoy_hash().to_string());
    let password = password.to_string();
    let permit = state.auth.hashing.acquire().await.map_err(|e| ApiError::Internal(e.to_string()))?;
    let matches = tokio::task::spawn_blocking(move || verify_password(&password, &hash)).await.map_err(|e| ApiError::Internal(e.to_string()))?;
    drop(permit);
    Ok(user.filter(|u| matches && u.password_hash.is_some() && u.disabled_at.is_none()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_are_argon2id_salted_and_verify() {
        let a = hash_password("correct horse battery").unwrap();
        let b = hash_password("correct horse battery").unwrap();
        assert!(a.starts_with("$argon2id$v=19$m=19456,t=2,p=1$"), "{a}");
        assert_ne!(a, b, "each hash has its own salt");
        assert!(verify_password("correct horse battery", &a));
        assert!(!verify_password("correct horse batterY", &a));
        assert!(!verify_password("x", "not a hash"));
    }

    #[test]
    fn names_and_passwords_are_checked() {
        for good in ["alice", "A.b_c-9", &"x".repeat(64)] {
            assert!(validate_name(good).is_ok(), "{good}");
        }
        for bad in ["", "-a", ".a", "a b", "ä", "a/b", &"x".repeat(65)] {
            assert!(validate_name(bad).is_err(), "{bad}");
        }
        assert!(validate_password("short").is_err());
        assert!(validate_password("long enough!").is_ok());
        assert!(validate_password("long enough\n!").is_err());
        assert!(validate_password(&"p".repeat(1025)).is_err());
    }
}
