//! Logging in with GitHub against the GitHub stand-in
//! (`cloudweb_e2e::github`): the App's OAuth web flow with `state` and
//! PKCE, bound to the browser (missing, forged or replayed: refused);
//! GitHub's refusals; settings GitHub refuses; the allow-list by login,
//! by `id:<number>`, by active organization membership (pending and
//! hidden ones do not count) and by team; the identity linked by GitHub's
//! user id only (a new user, or the logged-in one); a disabled user; the
//! client secret sealed and the user tokens kept nowhere and revoked.

use cloudweb_e2e::github::{FakeGithub, User};
use std::time::Duration;

use cloudweb_e2e::{start_platform, wait_for, Platform, ServerProcess};
use reqwest::Method;
use serde_json::{json, Value};

use crate::gitlab::{authorize, callback, cookie_pair, get_json, grep_dir, host_login, no_redirects, page, param, set_cookie, start_login_with, with_other_challenge};

const CLIENT_ID: &str = "Iv23li.standin";
const CLIENT_SECRET: &str = "github-login-client-secret-51f0";

fn user(id: i64, login: &str, orgs: &[(&str, &str)], teams: &[(&str, &str)]) -> User {
    let pairs = |list: &[(&str, &str)]| list.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect();
    User { id, login: login.into(), orgs: pairs(orgs), teams: pairs(teams) }
}

async fn start_login(server: &ServerProcess) -> (url::Url, String) {
    start_login_with(server, "github").await
}

async fn login_with(server: &ServerProcess, accept: &str, cookies: &[&str]) -> (u16, String, reqwest::header::HeaderMap) {
    host_login(server, "github", accept, cookies).await
}

async fn login(server: &ServerProcess) -> (u16, Value) {
    let (status, body, _) = login_with(server, "application/json", &[]).await;
    (status, serde_json::from_str(&body).unwrap_or(Value::String(body)))
}

#[tokio::test]
async fn logging_in_with_github_checks_state_pkce_and_the_allow_list_by_user_org_and_team() {
    let Platform { tmp, server, .. } = start_platform(&[]).await.unwrap();
    let github = FakeGithub::start(&tmp.path().join("github")).await.unwrap();
    github.set_oauth_client(CLIENT_ID, CLIENT_SECRET, &server.api("/api/auth/github/callback"));
    github.add_user(user(21, "octo-alice", &[], &[]));
    github.add_user(user(22, "bob", &[("elsewhere", "active")], &[("elsewhere/web", "active")]));
    github.add_user(user(23, "carol", &[("acme", "active")], &[]));
    github.add_user(user(24, "dave", &[("acme", "pending"), ("other", "active")], &[("other/web", "pending")]));
    github.add_user(user(25, "erin", &[("other", "active")], &[("other/web", "active")]));
    github.add_user(user(26, "frank", &[("acme", "active")], &[]));
    // Gail's first listed organization enforces SAML SSO (GitHub: 403):
    // that entry cannot let her in, but the ones after it still can.
    github.add_user(user(27, "gail", &[("sso-corp", "sso"), ("other", "active")], &[("other/web", "active")]));
    // A login made of digits is a login: "id:29" names user 29 only.
    github.add_user(user(28, "29", &[], &[]));
    github.add_user(user(29, "zed", &[], &[]));

    // Not set up: the login says so.
    let (status, body) = get_json(&server.api("/api/auth/github/login"), "application/json").await;
    assert_eq!(status, 404, "{body}");
    // Bad settings are refused and nothing is kept.
    let base = json!({"web_url": github.url(), "api_url": github.url(), "client_id": CLIENT_ID, "client_secret": CLIENT_SECRET});
    for (field, value) in [("allowed_teams", json!(["acme"])), ("allowed_orgs", json!(["ac/me"])), ("allowed_users", json!(["a b"])), ("web_url", json!("ftp://github.test"))] {
        let mut bad = base.clone();
        bad[field] = value;
        let (status, body) = server.call(Method::PUT, "/api/github/login", Some(bad)).await.unwrap();
        assert_eq!(status, 400, "{field}: {body}");
    }
    let mut no_secret = base.clone();
    no_secret.as_object_mut().unwrap().remove("client_secret");
    let (status, body) = server.call(Method::PUT, "/api/github/login", Some(no_secret)).await.unwrap();
    assert_eq!(status, 400, "the secret is required the first time: {body}");
    assert_eq!(server.call(Method::GET, "/api/github/login", None).await.unwrap().0, 404);

    let mut settings = base.clone();
    settings["allowed_users"] = json!(["Octo-Alice", "id:29"]);
    settings["allowed_orgs"] = json!(["sso-corp", "acme"]);
    settings["allowed_teams"] = json!(["other/web"]);
    let (status, body) = server.call(Method::PUT, "/api/github/login", Some(settings)).await.unwrap();
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["callback_url"], server.api("/api/auth/github/callback"));
    assert_eq!(body["client_secret_set"], true);
    assert!(!body.to_string().contains(CLIENT_SECRET), "{body}");
    assert!(grep_dir(&tmp.path().join("server"), CLIENT_SECRET).is_empty(), "the client secret is stored in clear");

    // The dashboard's login page offers it.
    let (status, login_page) = page(&server, "/login", &[]).await;
    assert_eq!(status, 200);
    assert!(login_page.contains("href=\"/api/auth/github/login\"") && login_page.contains("Log in with GitHub"), "{login_page}");

    // The redirect: GitHub's authorize page, with a state and a PKCE S256
    // challenge, and a login cookie (HttpOnly, SameSite=Lax, its own path).
    let (authorize_url, login_cookie) = start_login(&server).await;
    assert!(authorize_url.as_str().starts_with(&format!("{}/login/oauth/authorize?", github.url())), "{authorize_url}");
    assert_eq!(param(&authorize_url, "client_id").as_deref(), Some(CLIENT_ID));
    assert_eq!(param(&authorize_url, "code_challenge_method").as_deref(), Some("S256"));
    assert_eq!(param(&authorize_url, "redirect_uri").unwrap(), server.api("/api/auth/github/callback"));
    assert_eq!(param(&authorize_url, "code_challenge").unwrap().len(), 43);

    // Alice, allowed by login (in any case): a new user named after her.
    github.login_as(21);
    let callback_url = authorize(&authorize_url).await;
    // Another browser (no login cookie, or another one) cannot use the callback.
    let (status, body, _) = callback(&callback_url, "application/json", &[]).await;
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("cloudweb_github_login"), "{body}");
    // The state went with that try: start again.
    let (status, body, _) = callback(&callback_url, "application/json", &[&login_cookie]).await;
    assert_eq!(status, 400, "a state is used once: {body}");
    let (authorize_url, _) = start_login(&server).await;
    let (status, body, _) = callback(&authorize(&authorize_url).await, "application/json", &["cloudweb_github_login=forged-nonce"]).await;
    assert_eq!(status, 400, "a forged login cookie: {body}");
    // A successful callback cannot be replayed.
    let (authorize_url, cookie) = start_login(&server).await;
    let callback_url = authorize(&authorize_url).await;
    let (status, body, _) = callback(&callback_url, "application/json", &[&cookie]).await;
    assert_eq!(status, 200, "{body}");
    let (status, body, _) = callback(&callback_url, "application/json", &[&cookie]).await;
    assert_eq!(status, 400, "a replayed callback: {body}");
    // GitHub's refusal, and a callback without a code.
    let (authorize_url, cookie) = start_login(&server).await;
    let state = param(&authorize_url, "state").unwrap();
    let (status, body, _) = callback(&server.api(&format!("/api/auth/github/callback?error=access_denied&state={state}")), "application/json", &[&cookie]).await;
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("access_denied"), "{body}");
    let (authorize_url, cookie) = start_login(&server).await;
    let state = param(&authorize_url, "state").unwrap();
    let (status, body, _) = callback(&server.api(&format!("/api/auth/github/callback?state={state}")), "application/json", &[&cookie]).await;
    assert_eq!(status, 400, "{body}");
    let (status, alice) = login(&server).await;
    assert_eq!(status, 200, "{alice}");
    assert_eq!((alice["github_user"]["id"].as_i64(), alice["github_user"]["login"].as_str()), (Some(21), Some("octo-alice")));
    assert_eq!(alice["user"]["name"], "octo-alice", "{alice}");
    assert_eq!(github.token_requests().last().map(String::as_str), Some("ok"));
    // Her next login is the same user.
    let (status, again) = login(&server).await;
    assert_eq!(status, 200, "{again}");
    assert_eq!(again["linked_user"], alice["linked_user"]);

    // A wrong PKCE verifier: the code was bound to another challenge.
    let (authorize_url, cookie) = start_login(&server).await;
    let (status, body, _) = callback(&authorize(&with_other_challenge(&authorize_url)).await, "application/json", &[&cookie]).await;
    assert_eq!(status, 401, "{body}");
    assert_eq!(github.token_requests().last().map(String::as_str), Some("bad_verification_code"));

    // Settings GitHub refuses (a wrong client secret) fail the login as
    // the settings' fault: 502, said so, and no session.
    let mut wrong = base.clone();
    wrong["client_secret"] = json!("not-the-client-secret");
    wrong["allowed_users"] = json!(["octo-alice"]);
    assert_eq!(server.call(Method::PUT, "/api/github/login", Some(wrong)).await.unwrap().0, 200);
    let (status, body, headers) = login_with(&server, "application/json", &[]).await;
    assert_eq!(status, 502, "{body}");
    assert!(body.contains("login settings"), "{body}");
    assert!(set_cookie(&headers, "cloudweb_session").is_none());
    assert_eq!(github.token_requests().last().map(String::as_str), Some("incorrect_client_credentials"));
    let mut settings = base.clone();
    settings["allowed_users"] = json!(["Octo-Alice", "id:29"]);
    settings["allowed_orgs"] = json!(["sso-corp", "acme"]);
    settings["allowed_teams"] = json!(["other/web"]);
    assert_eq!(server.call(Method::PUT, "/api/github/login", Some(settings)).await.unwrap().0, 200);

    // GitHub down at the callback: a 502 that says so, no session, and
    // the next login works once it is back.
    github.set_api_down(true);
    github.login_as(21);
    let (authorize_url, cookie) = start_login(&server).await;
    github.set_api_down(false);
    let callback_url = authorize(&authorize_url).await;
    github.set_api_down(true);
    let (status, body, headers) = callback(&callback_url, "application/json", &[&cookie]).await;
    github.set_api_down(false);
    assert_eq!(status, 502, "{body}");
    assert!(body.contains("GitHub"), "{body}");
    assert!(set_cookie(&headers, "cloudweb_session").is_none());
    assert_eq!(login(&server).await.0, 200);

    // Bob is in another organization and team: refused, with a page for a browser and no session.
    github.login_as(22);
    let (status, body, headers) = login_with(&server, "text/html", &[]).await;
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("<html") && body.contains("bob") && body.contains("allow-list"), "{body}");
    assert!(set_cookie(&headers, "cloudweb_session").is_none(), "a refused user gets no session");
    // Carol, an active member of acme: in. Dave's acme membership and his
    // other/web team membership are only pending: refused. Erin, in team
    // other/web: in. Gail, past the organization GitHub hides: in, and
    // the server says which entry it could not read.
    github.login_as(23);
    assert_eq!(login(&server).await.0, 200);
    github.login_as(24);
    let (status, body) = login(&server).await;
    assert_eq!(status, 403, "{body}");
    github.login_as(25);
    let (status, erin) = login(&server).await;
    assert_eq!(status, 200, "{erin}");
    assert_eq!(erin["user"]["name"], "erin");
    github.login_as(27);
    let (status, body) = login(&server).await;
    assert_eq!(status, 200, "{body}");
    assert!(server.process.log_text().lines().any(|l| l.contains("would not show this membership") && l.contains("sso-corp")), "the hidden membership is logged");
    // "id:29" lets user 29 in, not the user whose login is "29".
    github.login_as(29);
    let (status, body) = login(&server).await;
    assert_eq!(status, 200, "{body}");
    github.login_as(28);
    let (status, body) = login(&server).await;
    assert_eq!(status, 403, "{body}");
    // A disabled local user cannot log in with GitHub either.
    let (status, body) = server.call(Method::DELETE, &format!("/api/users/{}", erin["user"]["id"].as_str().unwrap()), None).await.unwrap();
    assert!(status == 204 || status == 200, "{status} {body}");
    github.login_as(25);
    let (status, body) = login(&server).await;
    assert_eq!(status, 403, "{body}");
    assert!(body.to_string().contains("disabled"), "{body}");

    // A browser, not a script: 303 to the dashboard with a session that opens it.
    github.login_as(23);
    let (status, _, headers) = login_with(&server, "text/html", &[]).await;
    assert_eq!(status, 303);
    assert_eq!(headers["location"], "/");
    let session = cookie_pair(&set_cookie(&headers, "cloudweb_session").expect("a session"));
    assert_eq!(page(&server, "/apps", &[&session]).await.0, 200);

    // Lee, logged in with a password, connects his GitHub identity (frank):
    // linked by GitHub's user id, and frank's later logins are lee.
    let (_, lee) = server.call(Method::POST, "/api/users", Some(json!({"name": "lee", "password": "lee's own password", "cluster_role": "cluster-admin"}))).await.unwrap();
    let response = no_redirects().post(server.api("/login")).form(&[("name", "lee"), ("password", "lee's own password")]).send().await.unwrap();
    let lee_session = cookie_pair(&set_cookie(response.headers(), "cloudweb_session").unwrap());
    github.login_as(26);
    let (status, body, headers) = login_with(&server, "application/json", &[&lee_session]).await;
    assert_eq!(status, 200, "{body}");
    // That login replaced the browser's session with a new one, still lee's.
    let lee_session = cookie_pair(&set_cookie(&headers, "cloudweb_session").expect("a new session"));
    let linked: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(linked["linked_user"], lee["id"], "{body}");
    let (status, later) = login(&server).await;
    assert_eq!(status, 200, "{later}");
    assert_eq!(later["user"]["name"], "lee");
    // Alice's identity is hers: from lee's browser it is refused.
    github.login_as(21);
    let (status, body, _) = login_with(&server, "application/json", &[&lee_session]).await;
    assert_eq!(status, 409, "{body}");

    assert!(!server.process.log_text().contains(CLIENT_SECRET), "the client secret is in the log");
    // The user tokens served the logins, were kept nowhere, and were
    // revoked once each login was decided (in the background).
    wait_for(Duration::from_secs(20), "every user token revoked", || async { github.user_tokens().is_empty().then_some(()) }).await.unwrap();
    let tokens = github.revoked_user_tokens();
    assert!(tokens.len() >= 8, "{tokens:?}");
    for token in &tokens {
        assert!(grep_dir(&tmp.path().join("server"), token).is_empty(), "a user token is stored");
        assert!(!server.process.log_text().contains(token.as_str()), "a user token is in the log");
    }
}
