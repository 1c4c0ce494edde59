//! Logging in with GitHub: the OAuth web flow of the GitHub App (its
//! client id and secret), with `state` and PKCE (S256), and the checks of
//! the allow-list made with the user's token.
//!
//! - `{web}/login/oauth/authorize` is where the browser goes, and
//!   `{web}/login/oauth/access_token` trades the code and the verifier for
//!   a user token. GitHub answers a refused code with `200` and an
//!   `error` field (`bad_verification_code`, …), taken here as a refusal.
//! - `GET /user` names the user (its numeric id is the identity).
//! - An allowed organization is checked with
//!   `GET /user/memberships/orgs/{org}` (`state: active`), an allowed team
//!   with `GET /orgs/{org}/teams/{team}/memberships/{login}` (`state:
//!   active`); `404` means "not a member", and so does `403` (GitHub's
//!   answer when the token may not see that organization: SAML SSO not
//!   authorized, or the App not installed there), reported as
//!   [`Membership::Hidden`] so the caller can say so. Each is one call per
//!   listed org or team, never a listing of everything the user belongs
//!   to.
//!
//! The user token serves the login only: it is never stored, and is
//! revoked ([`revoke_token`]) once the login is decided.

use reqwest::Method;
use serde::Deserialize;
use serde_json::Value;

use crate::provider::{parse_answer as parse, read_answer, transport, ProviderError};

const NAME: &str = "GitHub";

/// github.com's web address (authorize and token endpoints).
pub const DEFAULT_WEB_URL: &str = "https://github.com";

/// The GitHub web URL, normalised (see [`crate::provider::service_url`]).
pub fn web_url(text: &str, allow_http: bool) -> Result<String, String> {
    crate::provider::service_url("GitHub web URL", text, allow_http)
}

/// An organization login or a team slug: what GitHub allows in them (so
/// it is safe in an API path).
pub fn valid_name(text: &str) -> bool {
    !text.is_empty() && text.len() <= 100 && text.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b)) && text != "." && text != ".."
}

/// A user's token from the code. GitHub answers a refusal with `200` and
/// an `error` field: a code that is wrong, expired or does not match the
/// PKCE verifier (`bad_verification_code`) is reported as a `400`;
/// `incorrect_client_credentials` and `redirect_uri_mismatch` are this
/// control plane's settings, not the user's doing, and are reported as
/// [`ProviderError::NotConfigured`].
#[allow(clippy::too_many_arguments)]
pub async fn exchange_code(
    http: &reqwest::Client,
    web: &str,
    client_id: &str,
    client_secret: &str,
    code: &str,
    verifier: &str,
    redirect_uri: &str,
) -> Result<String, ProviderError> {
    let what = "trading the login code for a token";
    let form = [("client_id", client_id), ("client_secret", client_secret), ("code", code), ("code_verifier", verifier), ("redirect_uri", redirect_uri)];
    let response = http
        .post(format!("{web}/login/oauth/access_token"))
        .header("accept", "application/json")
        .form(&form)
        .send()
        .await
        .map_err(|e| transport(NAME, what, e))?;
    let (_, body) = read_answer(NAME, what, response).await?;
    let value: Value = parse(what, &body)?;
    if let Some(error) = value.get("error").and_then(Value::as_str) {
        let mut message = value.get("error_description").and_then(Value::as_str).map(|d| format!("{error}: {d}")).unwrap_or_else(|| error.to_string());
        cloudweb_protocol::misc::truncate_on_char(&mut message, 300);
        if matches!(error, "incorrect_client_credentials" | "redirect_uri_mismatch") {
            return Err(ProviderError::NotConfigured(format!("GitHub refused this control plane's login settings (client id and secret, or the App's callback URL): {message}")));
        }
        return Err(ProviderError::Status { provider: NAME, what: what.into(), status: 400, message });
    }
    match value.get("access_token").and_then(Value::as_str) {
        Some(token) if !token.is_empty() => Ok(token.to_string()),
        _ => Err(transport(NAME, what, "the answer has no access_token")),
    }
}

/// Revokes a user token (`DELETE /applications/{client_id}/token`,
/// authenticated as the App's OAuth client): the login is over, and the
/// token must not outlive it on GitHub either.
pub async fn revoke_token(http: &reqwest::Client, api: &str, client_id: &str, client_secret: &str, token: &str) -> Result<(), ProviderError> {
    let what = "revoking the login's user token";
    if !client_id.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b)) {
        return Err(ProviderError::Unsupported(format!("a client id GitHub would not have made: {client_id:?}")));
    }
    let response = http
        .delete(format!("{api}/applications/{client_id}/token"))
        .header("accept", "application/vnd.github+json")
        .header("x-github-api-version", "2022-11-28")
        .basic_auth(client_id, Some(client_secret))
        .json(&serde_json::json!({ "access_token": token }))
        .send()
        .await
        .map_err(|e| transport(NAME, what, e))?;
    read_answer(NAME, what, response).await.map(|_| ())
}

/// The user a token belongs to.
#[derive(Debug, Clone, Deserialize)]
pub struct GithubUser {
    pub id: i64,
    pub login: String,
    #[serde(default)]
    pub name: Option<String>,
}

/// Calls as a user, with the user's token.
pub struct UserClient {
    pub http: reqwest::Client,
    /// `https://api.github.com`, or `https://<host>/api/v3`.
    pub api: String,
    pub token: String,
}

/// What a membership check found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Membership {
    Active,
    /// Not a member, or not yet (an invitation still pending).
    No,
    /// GitHub would not show it to this token (403): counted as no.
    Hidden,
}

impl UserClient {
    /// A membership answer: `404` no, `403` hidden, else `state`.
    async fn membership(&self, path: &str, what: &str) -> Result<Membership, ProviderError> {
        let response = self.request(path, what).await?;
        match response.status() {
            reqwest::StatusCode::NOT_FOUND => return Ok(Membership::No),
            reqwest::StatusCode::FORBIDDEN => return Ok(Membership::Hidden),
            _ => {}
        }
        let body = read_answer(NAME, what, response).await?.1;
        Ok(if active(&parse::<Value>(what, &body)?) { Membership::Active } else { Membership::No })
    }

    async fn request(&self, path: &str, what: &str) -> Result<reqwest::Response, ProviderError> {
        self.http
            .request(Method::GET, format!("{}{path}", self.api))
            .header("accept", "application/vnd.github+json")
            .header("x-github-api-version", "2022-11-28")
            .bearer_auth(&self.token)
            .send()
            .await
            .map_err(|e| transport(NAME, what, e))
    }

    async fn get(&self, path: &str, what: &str) -> Result<Option<bytes::Bytes>, ProviderError> {
        let response = self.request(path, what).await?;
        if response.status() == reqwest::StatusCode::NOT_FOUND {
            return Ok(None);
        }
        Ok(Some(read_answer(NAME, what, response).await?.1))
    }

    pub async fn user(&self) -> Result<GithubUser, ProviderError> {
        let what = "reading the logged-in user";
        let body = self.get("/user", what).await?.ok_or_else(|| transport(NAME, what, "no such user"))?;
        parse(what, &body)
    }

    /// The user's membership of `org`.
    pub async fn in_org(&self, org: &str) -> Result<Membership, ProviderError> {
        if !valid_name(org) {
            return Ok(Membership::No);
        }
        self.membership(&format!("/user/memberships/orgs/{org}"), "reading the user's organization membership").await
    }

    /// `login`'s membership of the team `org/team`.
    pub async fn in_team(&self, org: &str, team: &str, login: &str) -> Result<Membership, ProviderError> {
        if !valid_name(org) || !valid_name(team) || !valid_name(login) {
            return Ok(Membership::No);
        }
        self.membership(&format!("/orgs/{org}/teams/{team}/memberships/{login}"), "reading the user's team membership").await
    }
}

fn active(membership: &Value) -> bool {
    membership.get("state").and_then(Value::as_str) == Some("active")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_that_go_into_paths_are_checked() {
        assert!(valid_name("acme"));
        assert!(valid_name("web-team_2.x"));
        assert!(!valid_name(""));
        assert!(!valid_name(".."));
        assert!(!valid_name("a/b"));
        assert!(!valid_name("a?b"));
        assert!(!valid_name(&"a".repeat(101)));
    }

    #[test]
    fn only_an_active_membership_counts() {
        assert!(active(&serde_json::json!({"state": "active", "role": "member"})));
        assert!(!active(&serde_json::json!({"state": "pending"})));
        assert!(!active(&serde_json::json!({})));
    }
}
