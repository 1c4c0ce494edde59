//! Team mappings from GitHub organizations and teams and from Gitea
//! organizations (issue 28), against the GitHub and Gitea stand-ins: a
//! login grants the mapped teams; between logins, the periodic check
//! (`--team-mapping-check-seconds`) takes a team from a user no longer in
//! the group, through GitHub's App installation or Gitea's stored token;
//! a group that cannot be checked keeps its memberships; and a mapping
//! never leaves a team without an owner.

use std::time::Duration;

use cloudweb_e2e::gitea::FakeGitea;
use cloudweb_e2e::github::{FakeGithub, User};
use cloudweb_e2e::{wait_for, ServerProcess};
use reqwest::Method;
use serde_json::{json, Value};

use crate::gitlab::{cookie_pair, host_login, set_cookie};

const GITHUB_CLIENT_ID: &str = "Iv23li.mappings";
const GITHUB_CLIENT_SECRET: &str = "github-mapping-client-secret-90ab";

async fn members(server: &ServerProcess, team: &str) -> Vec<(String, String, String)> {
    let (status, body) = server.call(Method::GET, &format!("/api/teams/{team}/members"), None).await.unwrap();
    assert_eq!(status, 200, "{body}");
    body["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| (m["user"].as_str().unwrap().to_string(), m["role"].as_str().unwrap().to_string(), m["source"].as_str().unwrap().to_string()))
        .collect()
}

fn role_of(list: &[(String, String, String)], user: &str) -> Option<String> {
    list.iter().find(|(u, _, _)| u == user).map(|(_, role, _)| role.clone())
}

/// A local user to own the teams the admin token makes.
async fn owner(server: &ServerProcess) {
    let (status, body) = server.call(Method::POST, "/api/users", Some(json!({"name": "root", "password": "root's long password"}))).await.unwrap();
    assert_eq!(status, 201, "{body}");
}

/// Logs in through `host` as whoever the stand-in approves; `/api/me`.
async fn log_in(server: &ServerProcess, host: &str) -> Value {
    let (status, body, headers) = host_login(server, host, "application/json", &[]).await;
    assert_eq!(status, 200, "{body}");
    let session = cookie_pair(&set_cookie(&headers, "cloudweb_session").unwrap());
    let me = reqwest::Client::new().get(server.api("/api/me")).header("cookie", session).send().await.unwrap();
    me.json().await.unwrap()
}

#[tokio::test]
async fn github_orgs_and_teams_grant_teams_and_the_app_takes_them_back_within_the_check() {
    let tmp = tempfile::tempdir().unwrap();
    let server = ServerProcess::start_with(tmp.path(), &["--allow-private-git-hosts", "--team-mapping-check-seconds", "5"]).await.unwrap();
    let github = FakeGithub::start(&tmp.path().join("github")).await.unwrap();
    github.set_oauth_client(GITHUB_CLIENT_ID, GITHUB_CLIENT_SECRET, &server.api("/api/auth/github/callback"));
    let pairs = |list: &[(&str, &str)]| list.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect();
    github.add_user(User { id: 41, login: "ivy".into(), orgs: pairs(&[("acme", "active")]), teams: pairs(&[("acme/web", "active")]) });
    github.add_user(User { id: 42, login: "jon".into(), orgs: pairs(&[("acme", "active")]), teams: pairs(&[("acme/web", "pending")]) });
    crate::github::configure(&server, &github).await;
    let installation = github.install("acme");
    let login = json!({"web_url": github.url(), "api_url": github.url(), "client_id": GITHUB_CLIENT_ID, "client_secret": GITHUB_CLIENT_SECRET, "allowed_orgs": ["acme"]});
    let (status, body) = server.call(Method::PUT, "/api/github/login", Some(login)).await.unwrap();
    assert_eq!(status, 200, "{body}");
    owner(&server).await;
    let (status, body) = server.call(Method::POST, "/api/teams", Some(json!({"name": "web", "owner": "root"}))).await.unwrap();
    assert_eq!(status, 201, "{body}");

    // Groups in another host's form are refused, and nothing is kept.
    for (group, why) in [("acme/web/x", "three parts"), ("ac me", "a space")] {
        let bad = json!({"mappings": [{"provider": "github", "group": group, "team": "web", "role": "deployer"}]});
        let (status, body) = server.call(Method::PUT, "/api/team-mappings", Some(bad)).await.unwrap();
        assert_eq!(status, 400, "{why}: {body}");
    }
    let mappings = json!({"mappings": [
        {"provider": "github", "group": "acme/web", "team": "web", "role": "deployer"},
        {"provider": "github", "group": "acme", "team": "default", "role": "viewer"},
    ]});
    let (status, body) = server.call(Method::PUT, "/api/team-mappings", Some(mappings)).await.unwrap();
    assert_eq!(status, 200, "{body}");

    // Ivy is in the organization and the team; Jon's team membership is
    // still pending, so he gets the organization's team only.
    github.login_as(41);
    let me = log_in(&server, "github").await;
    let mut teams: Vec<Value> = me["teams"].as_array().unwrap().clone();
    teams.sort_by_key(|t| t["team"].as_str().unwrap().to_string());
    assert_eq!(teams, vec![json!({"team": "default", "role": "viewer"}), json!({"team": "web", "role": "deployer"})], "{me}");
    github.login_as(42);
    let me = log_in(&server, "github").await;
    assert_eq!(me["teams"], json!([{"team": "default", "role": "viewer"}]), "{me}");
    assert_eq!(members(&server, "web").await.iter().find(|m| m.0 == "ivy").map(|m| m.2.clone()).as_deref(), Some("github:acme/web"));

    // Ivy leaves the GitHub team: without a new login, the check through
    // the App's installation takes the team from her within its period.
    github.set_memberships(41, &[("acme", "active")], &[]);
    wait_for(Duration::from_secs(30), "ivy out of the team web", || async { role_of(&members(&server, "web").await, "ivy").is_none().then_some(()) }).await.unwrap();
    assert_eq!(role_of(&members(&server, "default").await, "ivy").as_deref(), Some("viewer"), "still in the organization");

    // Jon renames his GitHub account and his team invitation turns
    // active: the check finds him by his account's id, under the new
    // login (the old one no longer answers), and gives him the team.
    github.rename_user(42, "jon-renamed");
    github.set_memberships(42, &[("acme", "active")], &[("acme/web", "active")]);
    wait_for(Duration::from_secs(30), "jon in the team web", || async { (role_of(&members(&server, "web").await, "jon").as_deref() == Some("deployer")).then_some(()) })
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", server.process.log_text()));
    assert_eq!(role_of(&members(&server, "default").await, "jon").as_deref(), Some("viewer"), "still in the organization under the new login");
    assert!(server.process.log_text().contains("a linked GitHub account was renamed"));
    // His account is deleted: GitHub has no user with his id, so he is in
    // no group, and the check takes both teams.
    github.remove_user(42);
    wait_for(Duration::from_secs(30), "jon out of both teams", || async {
        let (web, default) = (members(&server, "web").await, members(&server, "default").await);
        (role_of(&web, "jon").is_none() && role_of(&default, "jon").is_none()).then_some(())
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", server.process.log_text()));
    assert!(server.process.log_text().contains("a linked GitHub account no longer exists"));

    // The App loses "Members: read": memberships cannot be checked, so they
    // stay as they are until the next login, and the log says why.
    github.deny_members_read(installation);
    github.set_memberships(41, &[], &[]);
    wait_for(Duration::from_secs(30), "the check to say it cannot see", || async {
        server.process.log_text().contains("cannot check a GitHub identity's groups").then_some(())
    })
    .await
    .unwrap();
    assert_eq!(role_of(&members(&server, "default").await, "ivy").as_deref(), Some("viewer"), "kept while unknown");
    // Her next login sees with her own token that she has left.
    github.login_as(41);
    let (status, body, _) = host_login(&server, "github", "application/json", &[]).await;
    assert_eq!(status, 403, "no longer on the allow-list: {body}");
}

#[tokio::test]
async fn gitea_orgs_grant_teams_and_the_stored_token_takes_them_back_but_never_the_last_owner() {
    let tmp = tempfile::tempdir().unwrap();
    let server = ServerProcess::start_with(tmp.path(), &["--allow-private-git-hosts", "--team-mapping-check-seconds", "5"]).await.unwrap();
    let gitea = FakeGitea::start(&tmp.path().join("gitea")).await.unwrap();
    gitea.add_user(7, "ann", &["acme", "ops"]);
    gitea.add_user(8, "ben", &["acme"]);
    let settings = json!({"base_url": gitea.url(), "client_id": cloudweb_e2e::gitea::CLIENT_ID, "client_secret": cloudweb_e2e::gitea::CLIENT_SECRET, "allowed_orgs": ["acme"]});
    let (status, body) = server.call(Method::PUT, "/api/gitea/settings", Some(settings)).await.unwrap();
    assert_eq!(status, 200, "{body}");
    owner(&server).await;
    let (status, body) = server.call(Method::POST, "/api/teams", Some(json!({"name": "ops", "owner": "root"}))).await.unwrap();
    assert_eq!(status, 201, "{body}");
    let bad = json!({"mappings": [{"provider": "gitea", "group": "acme/devs", "team": "ops", "role": "owner"}]});
    assert_eq!(server.call(Method::PUT, "/api/team-mappings", Some(bad)).await.unwrap().0, 400, "Gitea groups are organizations");
    let mappings = json!({"mappings": [
        {"provider": "gitea", "group": "ops", "team": "ops", "role": "owner"},
        {"provider": "gitea", "group": "acme", "team": "default", "role": "deployer"},
    ]});
    let (status, body) = server.call(Method::PUT, "/api/team-mappings", Some(mappings)).await.unwrap();
    assert_eq!(status, 200, "{body}");

    gitea.login_as(7);
    let me = log_in(&server, "gitea").await;
    let mut teams: Vec<Value> = me["teams"].as_array().unwrap().clone();
    teams.sort_by_key(|t| t["team"].as_str().unwrap().to_string());
    assert_eq!(teams, vec![json!({"team": "default", "role": "deployer"}), json!({"team": "ops", "role": "owner"})], "{me}");
    gitea.login_as(8);
    log_in(&server, "gitea").await;
    assert_eq!(role_of(&members(&server, "default").await, "ben").as_deref(), Some("deployer"));

    // Ben leaves acme: the check with his stored token takes the team.
    gitea.set_orgs(8, &[]);
    wait_for(Duration::from_secs(30), "ben out of the default team", || async { role_of(&members(&server, "default").await, "ben").is_none().then_some(()) }).await.unwrap();

    // Ann becomes ops' only owner; then she leaves the organization ops:
    // she stays its owner (a team always keeps one), while her other
    // mapped team follows the host.
    let (status, body) = server.call(Method::DELETE, "/api/teams/ops/members/root", None).await.unwrap();
    assert_eq!(status, 204, "{body}");
    gitea.set_orgs(7, &["acme"]);
    // Two rounds of the check after the change (each applies both
    // identities' organizations and says so).
    let rounds = || server.process.log_text().matches("team memberships follow the login's groups").count();
    let before = rounds();
    wait_for(Duration::from_secs(60), "two rounds of the check", || async { (rounds() >= before + 4).then_some(()) }).await.unwrap();
    assert_eq!(role_of(&members(&server, "ops").await, "ann").as_deref(), Some("owner"), "the last owner stays");
    assert_eq!(role_of(&members(&server, "default").await, "ann").as_deref(), Some("deployer"));
}
