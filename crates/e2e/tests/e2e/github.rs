//! GitHub as a GitHub App against a GitHub stand-in
//! (`cloudweb_e2e::github`) with real git underneath: the App's settings
//! (key and secret sealed, never shown), the repository picker, an app
//! made from a repository, a push event that deploys exactly its `after`
//! commit through the real agent, Docker and registry with a token made
//! for that one repository and revoked after the build, commit statuses,
//! and every refused or ignored event; then GitHub's API down when a push
//! arrives (the deploy waits and runs, statuses follow), a clone token
//! that expires before the clone and a repository the App lost access to
//! (the deploy fails once, with the reason).

use std::time::Duration;

use cloudweb_e2e::github::{FakeGithub, APP_ID, WEBHOOK_SECRET};
use cloudweb_e2e::{security_summary, start_platform, unique_name, wait_for, AgentNode, Platform, ServerProcess};
use reqwest::Method;
use serde_json::json;

use crate::gitlab::{cookie_pair, deployments, grep_dir, no_redirects, page, page_csrf, post_webhook, set_cookie, settle, AGENT_FLAGS, DOCKERFILE};

const ZERO: &str = "0000000000000000000000000000000000000000";

pub(crate) async fn configure(server: &ServerProcess, github: &FakeGithub) {
    let settings = json!({"api_url": github.url(), "app_id": APP_ID, "private_key": github.private_key_pem, "webhook_secret": WEBHOOK_SECRET});
    let (status, body) = server.call(Method::PUT, "/api/github/settings", Some(settings)).await.unwrap();
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["webhook_url"], server.api("/api/webhooks/github"));
    assert!(!body.to_string().contains(WEBHOOK_SECRET) && !body.to_string().contains("PRIVATE KEY"), "{body}");
}

pub(crate) async fn ready_agent(server: &ServerProcess, dir: &std::path::Path) -> AgentNode {
    let (token, ca) = server.join_token().await.unwrap();
    let mut agent = AgentNode::join(server, dir, "builder", &token, &ca, &[]).unwrap().unwrap();
    agent.start(&AGENT_FLAGS).unwrap();
    let node_id = agent.node_id.clone();
    wait_for(Duration::from_secs(20), "node ready", || async { (server.node(&node_id).await.ok()?["state"] == "ready").then_some(()) }).await.unwrap();
    agent
}

#[tokio::test]
async fn a_push_deploys_through_the_github_app_with_statuses_and_a_one_repository_token() {
    let Platform { tmp, server, .. } = start_platform(&[]).await.unwrap();
    let github = FakeGithub::start(&tmp.path().join("github")).await.unwrap();
    let installation = github.install("acme");
    let repo_id = github.add_repository("acme/site", installation).unwrap();
    github.add_repository("acme/other", installation).unwrap();
    let first = github.commit("acme/site", "main", &[("Dockerfile", DOCKERFILE), ("index.html", "first\n")], "first").unwrap();

    // Settings: a key that is not an RSA key, or a short secret, is refused.
    let (status, body) = server.call(Method::PUT, "/api/github/settings", Some(json!({"app_id": APP_ID, "private_key": "not a key", "webhook_secret": WEBHOOK_SECRET}))).await.unwrap();
    assert_eq!(status, 400, "{body}");
    let (status, body) = server
        .call(Method::PUT, "/api/github/settings", Some(json!({"api_url": github.url(), "app_id": APP_ID, "private_key": github.private_key_pem, "webhook_secret": "short"})))
        .await
        .unwrap();
    assert_eq!(status, 400, "{body}");
    configure(&server, &github).await;
    assert!(grep_dir(&tmp.path().join("server"), WEBHOOK_SECRET).is_empty(), "the webhook secret is stored in clear");

    // The picker: the installation's repositories.
    let (status, listed) = server.call(Method::GET, "/api/github/repositories?search=site", None).await.unwrap();
    assert_eq!(status, 200, "{listed}");
    let repositories = listed["repositories"].as_array().unwrap();
    assert_eq!(repositories.len(), 1, "{listed}");
    assert_eq!((repositories[0]["full_name"].as_str(), repositories[0]["installation"].as_i64()), (Some("acme/site"), Some(installation)));
    // Every App call was signed with a JWT the stand-in accepted.
    assert!(github.refused_jwts().is_empty(), "{:?}", github.refused_jwts());

    // The dashboard's create form offers the repository, and makes the app from it.
    let (_, user) = server.call(Method::POST, "/api/users", Some(json!({"name": "lee", "password": "lee's own password", "cluster_role": "cluster-admin"}))).await.unwrap();
    assert!(user["id"].is_string(), "{user}");
    let response = no_redirects().post(server.api("/login")).form(&[("name", "lee"), ("password", "lee's own password")]).send().await.unwrap();
    let session = cookie_pair(&set_cookie(response.headers(), "cloudweb_session").unwrap());
    let (status, form) = page(&server, "/apps", &[&session]).await;
    assert_eq!(status, 200, "{form}");
    assert!(form.contains("<option value=\"acme/site\">acme/site</option>") && !form.contains("name=\"repo_url\" required"), "{form}");
    let from_form = unique_name("ghdash");
    let fields = [("name", from_form.as_str()), ("github_repository", "acme/site"), ("repo_url", ""), ("branch", ""), ("port", "8080"), ("csrf_token", &page_csrf(&form))];
    let response = no_redirects().post(server.api("/apps")).header("cookie", &session).form(&fields).send().await.unwrap();
    assert_eq!(response.status().as_u16(), 303);
    let (_, made) = server.call(Method::GET, &format!("/api/apps/{from_form}"), None).await.unwrap();
    assert_eq!((made["git"]["provider"].as_str(), made["branch"].as_str()), (Some("github"), Some("main")), "{made}");
    let (_, app_page) = page(&server, &format!("/apps/{from_form}"), &[&session]).await;
    assert!(app_page.contains("data-provider=\"github\"") && app_page.contains("GitHub: acme/site"), "the page says where pushes come from: {app_page}");
    let (status, _) = server.call(Method::DELETE, &format!("/api/apps/{from_form}"), None).await.unwrap();
    assert_eq!(status, 204);

    let agent = ready_agent(&server, &tmp.path().join("node")).await;
    let app = unique_name("gh");
    let (status, body) = server.call(Method::POST, "/api/apps", Some(json!({"name": "nope", "github_repository": "acme/missing", "port": 8080}))).await.unwrap();
    assert_eq!(status, 404, "the App is not installed there: {body}");
    let (status, created) = server.call(Method::POST, "/api/apps", Some(json!({"name": app, "github_repository": "acme/site", "port": 8080}))).await.unwrap();
    assert_eq!(status, 201, "{created}");
    assert_eq!(created["repo_url"], format!("{}/acme/site.git", github.url()));
    assert_eq!((created["branch"].as_str(), created["git"]["provider"].as_str()), (Some("main"), Some("github")));

    // A push deploys its `after` commit.
    let second = github.commit("acme/site", "main", &[("index.html", "second\n")], "second").unwrap();
    let push = github.push_body("acme/site", "refs/heads/main", &first, &second);
    let hook = server.api("/api/webhooks/github");
    let (status, answer) = github.deliver(&hook, "push", &push, "11111111-2222-4333-8444-555555555555", WEBHOOK_SECRET).await.unwrap();
    assert_eq!(status, 202, "{answer}");
    let id = answer["deployment"].as_str().unwrap().to_string();
    let deployment = settle(&server, &agent, &id).await;
    assert_eq!((deployment["state"].as_str(), deployment["commit"].as_str()), (Some("running"), Some(second.as_str())), "{deployment}");
    let address = deployment["instances"][0]["address"].as_str().unwrap().to_string();
    assert_eq!(reqwest::get(format!("http://{address}/index.html")).await.unwrap().text().await.unwrap(), "second\n");

    // Statuses: pending (queued), pending (building), success, under one
    // context, linking to the dashboard's page of the deployment.
    let statuses = wait_for(Duration::from_secs(20), "the success status", || async {
        let statuses = github.statuses(&second);
        statuses.iter().any(|s| s.state == "success").then_some(statuses)
    })
    .await
    .unwrap();
    let states: Vec<&str> = statuses.iter().map(|s| s.state.as_str()).collect();
    assert_eq!(states, ["pending", "pending", "success"], "{statuses:?}");
    assert!(statuses.iter().all(|s| s.context == "cloud-web" && s.repository == "acme/site" && s.target_url.ends_with(&format!("/deployments/{id}"))), "{statuses:?}");

    // The clone used a token for this one repository, contents read only,
    // revoked once the build was over.
    let clone_token = wait_for(Duration::from_secs(20), "the clone token revoked", || async {
        github.tokens().into_iter().find(|t| t.repository_ids.as_deref() == Some(&[repo_id][..]) && t.revoked)
    })
    .await
    .unwrap();
    assert_eq!(clone_token.permissions, Some(json!({"contents": "read"})));
    assert_eq!(github.tokens().iter().filter(|t| t.repository_ids.is_some()).count(), 1, "one clone token for one deploy");
    let clones = github.git_clones();
    assert!(!clones.is_empty() && clones.iter().all(|t| *t == clone_token.token), "every clone used the deploy's token");
    for token in github.tokens() {
        assert!(grep_dir(&agent.dir, &token.token).is_empty(), "a GitHub token stayed on the node's disk");
        assert!(grep_dir(&tmp.path().join("server"), &token.token).is_empty(), "a GitHub token is stored in clear");
        assert!(!agent.log_text().contains(&token.token) && !server.process.log_text().contains(&token.token), "a GitHub token is in a log");
    }

    // The same delivery again, and the same signed body under another id
    // (a replay): nothing more.
    let (status, answer) = github.deliver(&hook, "push", &push, "11111111-2222-4333-8444-555555555555", WEBHOOK_SECRET).await.unwrap();
    assert_eq!((status, answer["ignored"].as_str(), answer["deployment"].as_str()), (200, Some("redelivery"), Some(id.as_str())), "{answer}");
    let (status, answer) = github.deliver(&hook, "push", &push, "99999999-2222-4333-8444-555555555555", WEBHOOK_SECRET).await.unwrap();
    assert_eq!((status, answer["ignored"].as_str()), (200, Some("redelivery")), "{answer}");
    // A wrong or missing signature.
    let (status, _) = github.deliver(&hook, "push", &push, "aaaaaaaa-2222-4333-8444-555555555555", "not-the-app-webhook-secret").await.unwrap();
    assert_eq!(status, 401);
    let body = serde_json::to_vec(&push).unwrap();
    let (status, _) = post_webhook(&server, "/api/webhooks/github", &[("x-github-event", "push"), ("x-github-delivery", "bbbbbbbb-0000-4000-8000-000000000000")], body).await;
    assert_eq!(status, 401);
    // A repository no app deploys, and the right repository from another
    // installation: refused.
    let other = github.commit("acme/other", "main", &[("a", "b")], "other").unwrap();
    let (status, answer) = github.deliver(&hook, "push", &github.push_body("acme/other", "refs/heads/main", ZERO, &other), "cccccccc-0000-4000-8000-000000000000", WEBHOOK_SECRET).await.unwrap();
    assert_eq!(status, 403, "{answer}");
    let third = github.commit("acme/site", "main", &[("index.html", "third\n")], "third").unwrap();
    let mut foreign = github.push_body("acme/site", "refs/heads/main", &second, &third);
    foreign["installation"]["id"] = json!(installation + 1);
    let (status, answer) = github.deliver(&hook, "push", &foreign, "dddddddd-0000-4000-8000-000000000000", WEBHOOK_SECRET).await.unwrap();
    assert_eq!(status, 403, "{answer}");
    // Other events, another branch, a tag, a deleted branch: acknowledged, ignored.
    let (status, answer) = github.deliver(&hook, "ping", &json!({"zen": "Keep it logically awesome.", "hook_id": 1}), "eeeeeeee-0000-4000-8000-000000000001", WEBHOOK_SECRET).await.unwrap();
    assert_eq!((status, answer["ignored"].as_str()), (200, Some("ping")));
    // The owner changes the installation's repositories: the API token the
    // control plane holds for it is dropped, and the next call makes a new one.
    let change = json!({"action": "added", "installation": {"id": installation}, "repositories_added": [], "repositories_removed": []});
    let (status, answer) = github.deliver(&hook, "installation_repositories", &change, "eeeeeeee-0000-4000-8000-000000000002", WEBHOOK_SECRET).await.unwrap();
    assert_eq!((status, answer["ignored"].as_str()), (200, Some("installation_repositories added")), "{answer}");
    let unscoped = || github.tokens().iter().filter(|t| t.repository_ids.is_none()).count();
    let before = unscoped();
    let (status, _) = server.call(Method::GET, "/api/github/repositories", None).await.unwrap();
    assert_eq!((status, unscoped()), (200, before + 1), "a new installation token after the change");
    let feature = github.commit("acme/site", "feature", &[("index.html", "feature\n")], "feature").unwrap();
    for (reference, before, after, why) in [("refs/heads/feature", third.as_str(), feature.as_str(), "push to another branch"), ("refs/tags/v1", ZERO, third.as_str(), "tag push"), ("refs/heads/main", third.as_str(), ZERO, "branch deleted")] {
        let delivery = format!("eeeeeeee-0000-4000-8000-{:012}", why.len());
        let (status, answer) = github.deliver(&hook, "push", &github.push_body("acme/site", reference, before, after), &delivery, WEBHOOK_SECRET).await.unwrap();
        assert_eq!((status, answer["ignored"].as_str()), (200, Some(why)), "{reference}: {answer}");
    }
    assert_eq!(deployments(&server, &app).await.len(), 1, "exactly one deployment");
    security_summary("27 github webhook", "wrong or missing X-Hub-Signature-256: 401; redelivery and a replay under a new delivery id: ignored; another repository or installation: 403");
    agent.remove_containers();
}

#[tokio::test]
async fn github_down_at_a_push_delays_the_deploy_and_an_expired_clone_token_fails_it_once() {
    let Platform { tmp, server, .. } = start_platform(&[]).await.unwrap();
    let github = FakeGithub::start(&tmp.path().join("github")).await.unwrap();
    let installation = github.install("acme");
    github.add_repository("acme/site", installation).unwrap();
    let first = github.commit("acme/site", "main", &[("Dockerfile", DOCKERFILE), ("index.html", "first\n")], "first").unwrap();
    configure(&server, &github).await;
    let agent = ready_agent(&server, &tmp.path().join("node")).await;
    let app = unique_name("ghd");
    let (status, created) = server.call(Method::POST, "/api/apps", Some(json!({"name": app, "github_repository": "acme/site", "port": 8080}))).await.unwrap();
    assert_eq!(status, 201, "{created}");

    // GitHub's API is down when the push arrives: the deployment is
    // queued at once and waits; when GitHub is back it clones and runs,
    // and the statuses catch up.
    let second = github.commit("acme/site", "main", &[("index.html", "second\n")], "second").unwrap();
    github.set_api_down(true);
    let push = github.push_body("acme/site", "refs/heads/main", &first, &second);
    let hook = server.api("/api/webhooks/github");
    let started = std::time::Instant::now();
    let (status, answer) = github.deliver(&hook, "push", &push, "12121212-0000-4000-8000-000000000000", WEBHOOK_SECRET).await.unwrap();
    assert_eq!((status, answer["state"].as_str()), (202, Some("queued")), "{answer}");
    assert!(started.elapsed() < Duration::from_secs(5), "the webhook waited on GitHub: {:?}", started.elapsed());
    let id = answer["deployment"].as_str().unwrap().to_string();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (_, waiting) = server.call(Method::GET, &format!("/api/deployments/{id}"), None).await.unwrap();
    assert_eq!(waiting["state"], "queued", "{waiting}");
    github.set_api_down(false);
    let deployment = settle(&server, &agent, &id).await;
    assert_eq!((deployment["state"].as_str(), deployment["commit"].as_str()), (Some("running"), Some(second.as_str())), "{deployment}");
    wait_for(Duration::from_secs(30), "the success status after GitHub came back", || async { github.statuses(&second).iter().any(|s| s.state == "success").then_some(()) }).await.unwrap();

    // A clone token that is dead before the clone: the deployment fails
    // once, saying why; no second token is asked for.
    github.set_scoped_token_ttl(0);
    let third = github.commit("acme/site", "main", &[("index.html", "third\n")], "third").unwrap();
    let before = github.tokens().len();
    let (status, answer) = github.deliver(&hook, "push", &github.push_body("acme/site", "refs/heads/main", &second, &third), "34343434-0000-4000-8000-000000000000", WEBHOOK_SECRET).await.unwrap();
    assert_eq!(status, 202, "{answer}");
    let failed = settle(&server, &agent, answer["deployment"].as_str().unwrap()).await;
    assert_eq!(failed["state"], "failed", "{failed}");
    let error = failed["error"].as_str().unwrap_or_default().to_ascii_lowercase();
    assert!(error.contains("refused this deploy's credentials"), "{failed}");
    let minted: Vec<_> = github.tokens()[before..].iter().filter(|t| t.repository_ids.is_some()).cloned().collect();
    assert_eq!(minted.len(), 1, "one clone token, no retry storm: {minted:?}");
    wait_for(Duration::from_secs(20), "the failure status", || async { github.statuses(&third).iter().any(|s| s.state == "failure").then_some(()) }).await.unwrap();

    // The owner takes the repository away from the App: the next push's
    // deployment fails at once with GitHub's reason, and is not retried.
    let fourth = github.commit("acme/site", "main", &[("index.html", "fourth\n")], "fourth").unwrap();
    let push = github.push_body("acme/site", "refs/heads/main", &third, &fourth);
    github.revoke_access("acme/site");
    let before = github.tokens().len();
    let (status, answer) = github.deliver(&hook, "push", &push, "56565656-0000-4000-8000-000000000000", WEBHOOK_SECRET).await.unwrap();
    assert_eq!(status, 202, "{answer}");
    let refused = settle(&server, &agent, answer["deployment"].as_str().unwrap()).await;
    assert_eq!(refused["state"], "failed", "{refused}");
    assert!(refused["error"].as_str().unwrap_or_default().contains("not accessible"), "GitHub's reason: {refused}");
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(github.tokens().len(), before, "no token was made, and nothing asked again");
    // The app still runs the deployment before.
    let (_, view) = server.call(Method::GET, &format!("/api/deployments/{id}"), None).await.unwrap();
    assert_eq!(view["state"], "running", "{view}");
    agent.remove_containers();
}
