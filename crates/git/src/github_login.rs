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
//!   active`); `404` means "not a member". Each is one call per listed
//!   org or team, never a listing of everything the user belongs to.
//!
//! The user token serves the login only: it is never stored.

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

/// A user's token from the code (`200` with an `error` field is GitHub's
/// refusal, reported as a `400`).
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
        return Err(ProviderError::Status { provider: NAME, what: what.into(), status: 400, message });
    }
    match value.get("access_token").and_then(Value::as_str) {
        Some(token) if !token.is_empty() => Ok(token.to_string()),
        _ => Err(transport(NAME, what, "the answer has no access_token")),
    }
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

impl UserClient {
    async fn get(&self, path: &str, what: &str) -> Result<Option<bytes::Bytes>, ProviderError> {
        let response = self
            .http
            .request(Method::GET, format!("{}{path}", self.api))
            .header("accept", "application/vnd.github+json")
            .header("x-github-api-version", "2022-11-28")
            .bearer_auth(&self.token)
            .send()
            .await
            .map_err(|e| transport(NAME, what, e))?;
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

    /// Whether the user is an active member of `org`.
    pub async fn in_org(&self, org: &str) -> Result<bool, ProviderError> {
        if !valid_name(org) {
            return Ok(false);
        }
        let what = "reading the user's organization membership";
        Ok(match self.get(&format!("/user/memberships/orgs/{org}"), what).await? {
            Some(body) => active(&parse::<Value>(what, &body)?),
            None => false,
        })
    }

    /// Whether `login` is an active member of the team `org/team`.
    pub async fn in_team(&self, org: &str, team: &str, login: &str) -> Result<bool, ProviderError> {
        if !valid_name(org) || !valid_name(team) || !valid_name(login) {
            return Ok(false);
        }
        let what = "reading the user's team membership";
        Ok(match self.get(&format!("/orgs/{org}/teams/{team}/memberships/{login}"), what).await? {
            Some(body) => active(&parse::<Value>(what, &body)?),
            None => false,
        })
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
