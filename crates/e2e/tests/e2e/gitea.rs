//! Gitea and Forgejo against the Gitea stand-in (`cloudweb_e2e::gitea`)
//! with real git underneath: the settings (secret sealed, never shown),
//! the login (OAuth 2 with state and PKCE; a forged challenge and a user
//! off the allow-list refused), the picker on the API and the dashboard,
//! an app made from a repository with a webhook of its own, a push that
//! deploys exactly its `after` commit through the real agent, Docker and
//! registry, cloning with the identity's hour-long token (refreshed, the
//! refresh token rotated), commit statuses in Gitea's words, every
//! refused or ignored event (wrong signature, redelivery, another
//! repository, a tag), Forgejo's headers, Gitea's API down at a push (the
//! deploy runs, the statuses catch up), access taken away (the deploy
//! fails once with the reason), and the hook removed with the app.

use std::time::Duration;

use cloudweb_e2e::gitea::{FakeGitea, CLIENT_ID, CLIENT_SECRET};
use cloudweb_e2e::{security_summary, start_platform, unique_name, wait_for, Platform};
use reqwest::Method;
use serde_json::{json, Value};

use crate::github::ready_agent;
use crate::gitlab::{authorize, callback, cookie_pair, deployments, grep_dir, host_login, page, set_cookie, settle, start_login_with, with_other_challenge, DOCKERFILE};

const ZERO: &str = "0000000000000000000000000000000000000000";

#[tokio::test]
async fn a_gitea_login_makes_an_app_whose_pushes_deploy_with_statuses() {
    let Platform { tmp, server, .. } = start_platform(&[]).await.unwrap();
    let gitea = FakeGitea::start(&tmp.path().join("gitea")).await.unwrap();
    gitea.add_user(7, "ann", &["acme"]);
    gitea.add_user(8, "mallory", &["elsewhere"]);
    // Tokens that live a minute: every use refreshes first.
    gitea.set_expires_in(60);
    let repo_id = gitea.add_repository("acme/site", &[7]).unwrap();
    gitea.add_repository("acme/other", &[7]).unwrap();
    let first = gitea.commit("acme/site", "main", &[("Dockerfile", DOCKERFILE), ("index.html", "first\n")], "first").unwrap();

    // Settings: a bad URL or allow-list entry is refused; the secret is sealed.
    for bad in [json!({"base_url": "ftp://x", "client_id": CLIENT_ID, "client_secret": CLIENT_SECRET}), json!({"base_url": gitea.url(), "client_id": CLIENT_ID, "client_secret": CLIENT_SECRET, "allowed_orgs": ["a/b"]})] {
        let (status, body) = server.call(Method::PUT, "/api/gitea/settings", Some(bad)).await.unwrap();
        assert_eq!(status, 400, "{body}");
    }
    let settings = json!({"base_url": gitea.url(), "client_id": CLIENT_ID, "client_secret": CLIENT_SECRET, "allowed_orgs": ["acme"]});
    let (status, view) = server.call(Method::PUT, "/api/gitea/settings", Some(settings)).await.unwrap();
    assert_eq!(status, 200, "{view}");
    assert_eq!(view["redirect_uri"], server.api("/api/auth/gitea/callback"));
    assert!(!view.to_string().contains(CLIENT_SECRET), "{view}");
    assert!(grep_dir(&tmp.path().join("server"), CLIENT_SECRET).is_empty(), "the client secret is stored in clear");

    // Login: a code got with another PKCE challenge is refused; a user
    // outside the allow-list is refused; ann (in acme) gets a session.
    gitea.login_as(7);
    let (authorize_url, login_cookie) = start_login_with(&server, "gitea").await;
    let forged = authorize(&with_other_challenge(&authorize_url)).await;
    let (status, body, _) = callback(&forged, "application/json", &[&login_cookie]).await;
    assert_eq!(status, 401, "{body}");
    gitea.login_as(8);
    let (status, body, _) = host_login(&server, "gitea", "application/json", &[]).await;
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("mallory is not allowed"), "{body}");
    gitea.login_as(7);
    let (status, body, headers) = host_login(&server, "gitea", "application/json", &[]).await;
    assert_eq!(status, 200, "{body}");
    let login: Value = serde_json::from_str(&body).unwrap();
    assert_eq!((login["gitea_user"]["id"].as_i64(), login["user"]["name"].as_str()), (Some(7), Some("ann")), "{login}");
    let session = cookie_pair(&set_cookie(&headers, "cloudweb_session").unwrap());

    // The picker: on the API (admin token: the only identity), and on
    // ann's dashboard form.
    let (status, listed) = server.call(Method::GET, "/api/gitea/repositories?search=SITE", None).await.unwrap();
    assert_eq!(status, 200, "{listed}");
    let paths: Vec<&str> = listed["projects"].as_array().unwrap().iter().filter_map(|p| p["path"].as_str()).collect();
    assert_eq!(paths, ["acme/site"], "{listed}");
    let (status, form) = page(&server, "/apps", &[&session]).await;
    assert_eq!(status, 200, "{form}");
    assert!(form.contains("name=\"gitea_repository\"") && form.contains("<option value=\"acme/other\">acme/other</option>"), "{form}");
    let refreshes = gitea.token_requests().iter().filter(|(grant, outcome)| grant == "refresh_token" && outcome == "ok").count();
    assert!(refreshes >= 1, "a token a minute from expiry is refreshed before use: {:?}", gitea.token_requests());

    let agent = ready_agent(&server, &tmp.path().join("node")).await;
    let app = unique_name("gt");
    let (status, body) = server.call(Method::POST, "/api/apps", Some(json!({"name": "nope", "gitea_repository": "acme/missing", "port": 8080}))).await.unwrap();
    assert_eq!(status, 404, "{body}");
    let (status, body) = server.call(Method::POST, "/api/apps", Some(json!({"name": "nope", "gitea_repository": "acme/site", "github_repository": "acme/site", "port": 8080}))).await.unwrap();
    assert_eq!(status, 400, "{body}");
    let (status, created) = server.call(Method::POST, "/api/apps", Some(json!({"name": app, "gitea_repository": "acme/site", "port": 8080}))).await.unwrap();
    assert_eq!(status, 201, "{created}");
    assert_eq!((created["branch"].as_str(), created["git"]["provider"].as_str()), (Some("main"), Some("gitea")), "{created}");
    let hook = gitea.live_hook("acme/site").unwrap();
    assert_eq!((hook.url.as_str(), hook.branch_filter.as_str(), hook.events.as_slice()), (server.api(&format!("/api/webhooks/gitea/{app}")).as_str(), "main", &["push".to_string(), "pull_request".to_string()][..]));
    assert!(hook.secret.len() >= 32);
    // The hook filters by branch: another branch needs another app.
    let (status, body) = server.call(Method::PATCH, &format!("/api/apps/{app}"), Some(json!({"branch": "feature"}))).await.unwrap();
    assert_eq!(status, 400, "{body}");
    assert!(grep_dir(&tmp.path().join("server"), &hook.secret).is_empty(), "the hook secret is stored in clear");

    // A push deploys its `after` commit.
    let second = gitea.commit("acme/site", "main", &[("index.html", "second\n")], "second").unwrap();
    let push = gitea.push_body("acme/site", "refs/heads/main", &first, &second);
    let (status, answer) = gitea.deliver(&hook.url, "push", &push, "5f0c1d2e-0000-4000-8000-000000000001", &hook.secret, false).await.unwrap();
    assert_eq!(status, 202, "{answer}");
    let id = answer["deployment"].as_str().unwrap().to_string();
    let deployment = settle(&server, &agent, &id).await;
    assert_eq!((deployment["state"].as_str(), deployment["commit"].as_str()), (Some("running"), Some(second.as_str())), "{deployment}");
    let address = deployment["instances"][0]["address"].as_str().unwrap().to_string();
    assert_eq!(reqwest::get(format!("http://{address}/index.html")).await.unwrap().text().await.unwrap(), "second\n");
    let statuses = wait_for(Duration::from_secs(20), "the success status", || async {
        let statuses = gitea.statuses(&second);
        statuses.iter().any(|s| s.state == "success").then_some(statuses)
    })
    .await
    .unwrap();
    let states: Vec<&str> = statuses.iter().map(|s| s.state.as_str()).collect();
    assert_eq!(states, ["pending", "pending", "success"], "{statuses:?}");
    assert!(statuses.iter().all(|s| s.context == "cloud-web" && s.repository == "acme/site" && s.target_url.ends_with(&format!("/deployments/{id}"))), "{statuses:?}");
    // The clone used an access token the stand-in handed out; no token
    // is on disk in clear or in a log.
    assert!(!gitea.git_clones().is_empty(), "the clone went through the stand-in");
    for token in gitea.tokens() {
        assert!(grep_dir(&agent.dir, &token).is_empty(), "a Gitea token stayed on the node's disk");
        assert!(grep_dir(&tmp.path().join("server"), &token).is_empty(), "a Gitea token is stored in clear");
        assert!(!agent.log_text().contains(&token) && !server.process.log_text().contains(&token), "a Gitea token is in a log");
    }

    // Redelivery (Gitea resends the body under a new id), a wrong secret,
    // another repository's push signed right, a tag, another branch.
    let (status, answer) = gitea.deliver(&hook.url, "push", &push, "5f0c1d2e-0000-4000-8000-000000000002", &hook.secret, false).await.unwrap();
    assert_eq!((status, answer["ignored"].as_str(), answer["deployment"].as_str()), (200, Some("redelivery"), Some(id.as_str())), "{answer}");
    let (status, _) = gitea.deliver(&hook.url, "push", &push, "5f0c1d2e-0000-4000-8000-000000000003", "not-the-hook-secret", false).await.unwrap();
    assert_eq!(status, 401);
    let other = gitea.commit("acme/other", "main", &[("a", "b")], "other").unwrap();
    let (status, answer) = gitea.deliver(&hook.url, "push", &gitea.push_body("acme/other", "refs/heads/main", ZERO, &other), "5f0c1d2e-0000-4000-8000-000000000004", &hook.secret, false).await.unwrap();
    assert_eq!(status, 403, "{answer}");
    for (reference, why) in [("refs/tags/v1", "tag push"), ("refs/heads/feature", "push to another branch")] {
        let (status, answer) = gitea.deliver(&hook.url, "push", &gitea.push_body("acme/site", reference, &first, &second), &format!("5f0c1d2e-0000-4000-8000-{:012}", why.len()), &hook.secret, false).await.unwrap();
        assert_eq!((status, answer["ignored"].as_str()), (200, Some(why)), "{answer}");
    }
    assert_eq!(deployments(&server, &app).await.len(), 1, "exactly one deployment");
    security_summary("27 gitea webhook", "wrong X-Gitea-Signature: 401; redelivery: ignored; another repository: 403");

    // Forgejo's headers, with Gitea's API down: the deployment still runs
    // (cloning needs no API call), and the statuses catch up once it is back.
    gitea.set_api_down(true);
    let third = gitea.commit("acme/site", "main", &[("index.html", "third\n")], "third").unwrap();
    let (status, answer) = gitea.deliver(&hook.url, "push", &gitea.push_body("acme/site", "refs/heads/main", &second, &third), "5f0c1d2e-0000-4000-8000-000000000005", &hook.secret, true).await.unwrap();
    assert_eq!(status, 202, "{answer}");
    let running = settle(&server, &agent, answer["deployment"].as_str().unwrap()).await;
    assert_eq!((running["state"].as_str(), running["commit"].as_str()), (Some("running"), Some(third.as_str())), "{running}");
    assert!(gitea.statuses(&third).is_empty());
    gitea.set_api_down(false);
    wait_for(Duration::from_secs(40), "the statuses after Gitea came back", || async { gitea.statuses(&third).iter().any(|s| s.state == "success").then_some(()) }).await.unwrap();

    // Previews: a pull request from a branch runs as <app>-pr-3 until closed.
    let (status, body) = server.call(Method::PUT, &format!("/api/apps/{app}/previews/settings"), Some(json!({"enabled": true}))).await.unwrap();
    assert_eq!(status, 200, "{body}");
    let proposal = gitea.commit("acme/site", "proposal", &[("index.html", "proposal\n")], "proposal").unwrap();
    let (status, answer) = gitea.deliver(&hook.url, "pull_request", &gitea.pull_request_body("acme/site", 3, "opened", "proposal", &proposal), "5f0c1d2e-0000-4000-8000-000000000007", &hook.secret, false).await.unwrap();
    assert_eq!(status, 202, "{answer}");
    let preview = settle(&server, &agent, answer["deployment"].as_str().unwrap()).await;
    assert_eq!((preview["state"].as_str(), preview["commit"].as_str()), (Some("running"), Some(proposal.as_str())), "{preview}");
    let (status, answer) = gitea.deliver(&hook.url, "pull_request", &gitea.pull_request_body("acme/site", 3, "closed", "proposal", &proposal), "5f0c1d2e-0000-4000-8000-000000000008", &hook.secret, false).await.unwrap();
    assert_eq!((status, answer["ignored"].as_str()), (200, Some("preview removed")), "{answer}");
    let (status, _) = server.call(Method::GET, &format!("/api/apps/{app}-pr-3"), None).await.unwrap();
    assert_eq!(status, 404);

    // ann loses access to the repository: the next deployment fails once,
    // saying why, and the one before keeps running.
    gitea.remove_reader("acme/site", 7);
    let refusals = gitea.git_refusals().len();
    let fourth = gitea.commit("acme/site", "main", &[("index.html", "fourth\n")], "fourth").unwrap();
    let (status, answer) = gitea.deliver(&hook.url, "push", &gitea.push_body("acme/site", "refs/heads/main", &third, &fourth), "5f0c1d2e-0000-4000-8000-000000000006", &hook.secret, false).await.unwrap();
    assert_eq!(status, 202, "{answer}");
    let failed = settle(&server, &agent, answer["deployment"].as_str().unwrap()).await;
    assert_eq!(failed["state"], "failed", "{failed}");
    assert!(failed["error"].as_str().unwrap_or_default().contains("credentials"), "{failed}");
    tokio::time::sleep(Duration::from_secs(3)).await;
    let refused: Vec<String> = gitea.git_refusals()[refusals..].to_vec();
    assert!(!refused.is_empty() && refused.len() <= 2 && refused.iter().all(|r| r == "no access to the repository"), "one clone attempt (git may ask twice), refused: {refused:?}");
    assert_eq!(running["state"], "running");

    // The app goes: its hook goes from the repository.
    let (status, _) = server.call(Method::DELETE, &format!("/api/apps/{app}"), None).await.unwrap();
    assert_eq!(status, 204);
    assert!(gitea.hooks().iter().all(|h| h.removed), "{:?}", gitea.hooks());
    assert_eq!(repo_id, gitea.push_body("acme/site", "refs/heads/main", ZERO, ZERO)["repository"]["id"].as_i64().unwrap());
    agent.remove_containers();
}
