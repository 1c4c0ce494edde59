//! A self-hosted GitLab behind a private CA (issue 21 item 15): the GitLab
//! stand-in on https with a certificate from its own CA, which only
//! `--gitlab-ca-file` makes trusted. Login, app creation and, on the node,
//! the clone of a push all work; before, the control plane trusted the CA
//! and the node's git did not ("server certificate verification failed").

use std::time::Duration;

use cloudweb_e2e::gitlab::{FakeGitlab, CLIENT_ID, CLIENT_SECRET};
use cloudweb_e2e::{start_platform, unique_name, wait_for, AgentNode, Platform};
use reqwest::Method;
use serde_json::json;

const DOCKERFILE: &str = "FROM cloudweb-test/busybox:latest\nCOPY index.html /www/index.html\nCMD [\"httpd\", \"-f\", \"-p\", \"8080\", \"-h\", \"/www\"]\n";
const AGENT_FLAGS: [&str; 6] = ["--heartbeat-interval-seconds", "1", "--publish-ip", "127.0.0.1", "--advertise-host", "127.0.0.1"];

fn client(trust: Option<&str>) -> reqwest::Client {
    let mut builder = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).timeout(Duration::from_secs(20));
    if let Some(pem) = trust {
        builder = builder.add_root_certificate(reqwest::Certificate::from_pem(pem.as_bytes()).unwrap());
    }
    builder.build().unwrap()
}

#[tokio::test]
async fn a_push_to_a_gitlab_behind_a_private_ca_builds_on_the_node() {
    let gitlab_dir = tempfile::tempdir().unwrap();
    let gitlab = FakeGitlab::start_https(gitlab_dir.path()).await.unwrap();
    let ca = gitlab.ca_pem.clone().unwrap();
    // The CA file as an operator has it: a bundle with a comment line.
    let ca_file = gitlab_dir.path().join("gitlab-ca.pem");
    std::fs::write(&ca_file, format!("# Subject: CN=self-hosted GitLab test CA\n{ca}")).unwrap();
    // Nobody trusts the stand-in without the CA.
    let untrusted = client(None).get(format!("{}/api/v4/user", gitlab.url())).send().await;
    assert!(untrusted.is_err(), "the stand-in's certificate must not be publicly trusted");

    let ca_flag = ca_file.display().to_string();
    let Platform { tmp, git: _git, server } = start_platform(&["--gitlab-ca-file", &ca_flag]).await.unwrap();
    gitlab.add_user(31, "carol", "carol@example.com", true, &[]);
    let project = gitlab.add_project("infra/site").unwrap();
    let first = gitlab.commit("infra/site", "main", &[("Dockerfile", DOCKERFILE), ("index.html", "first\n")], "first").unwrap();
    let (status, body) = server
        .call(
            Method::PUT,
            "/api/gitlab/settings",
            Some(json!({"base_url": gitlab.url(), "client_id": CLIENT_ID, "client_secret": CLIENT_SECRET, "allowed_users": ["carol"], "allowed_groups": []})),
        )
        .await
        .unwrap();
    assert_eq!(status, 200, "{body}");

    // Login: the control plane talks to the stand-in over its private CA.
    gitlab.login_as(31);
    let browser = client(Some(&ca));
    let start = browser.get(server.api("/api/auth/gitlab/login")).send().await.unwrap();
    assert_eq!(start.status().as_u16(), 302);
    let cookie = start.headers().get_all("set-cookie").iter().filter_map(|v| v.to_str().ok()).find(|v| v.starts_with("cloudweb_gitlab_login=")).unwrap();
    let cookie = cookie.split(';').next().unwrap().to_string();
    let authorize = start.headers()["location"].to_str().unwrap().to_string();
    assert!(authorize.starts_with(&gitlab.url()), "{authorize}");
    let approved = browser.get(&authorize).send().await.unwrap();
    assert_eq!(approved.status().as_u16(), 302);
    let callback = approved.headers()["location"].to_str().unwrap().to_string();
    let done = browser.get(&callback).header("accept", "application/json").header("cookie", cookie).send().await.unwrap();
    assert_eq!(done.status().as_u16(), 200, "{}", done.text().await.unwrap());

    let (token, cluster_ca) = server.join_token().await.unwrap();
    let mut agent = AgentNode::join(&server, &tmp.path().join("node"), "builder", &token, &cluster_ca, &[]).unwrap().unwrap();
    agent.start(&AGENT_FLAGS).unwrap();
    let node_id = agent.node_id.clone();
    wait_for(Duration::from_secs(20), "node ready", || async { (server.node(&node_id).await.ok()?["state"] == "ready").then_some(()) }).await.unwrap();

    let app = unique_name("ca");
    let (status, created) = server.call(Method::POST, "/api/apps", Some(json!({"name": app, "gitlab_project": "infra/site", "port": 8080}))).await.unwrap();
    assert_eq!(status, 201, "{created}");
    assert_eq!(created["repo_url"], format!("{}/infra/site.git", gitlab.url()));

    // A push: the node's git clones over https with the CA it was handed.
    let second = gitlab.commit("infra/site", "main", &[("index.html", "behind a private CA\n")], "second").unwrap();
    let push = gitlab.push_body(project, "refs/heads/main", &first, &[&second]);
    let answers = gitlab.deliver(project, &push, "5d1c7a52-0c1e-4b9e-8f6a-private-ca-01").await.unwrap();
    assert_eq!(answers[0].0, 202, "{answers:?}");
    let id = answers[0].1["deployment"].as_str().unwrap().to_string();
    let deployment = wait_for(Duration::from_secs(180), "the deployment to settle", || async {
        let (_, body) = server.call(Method::GET, &format!("/api/deployments/{id}"), None).await.ok()?;
        matches!(body["state"].as_str(), Some("running" | "failed")).then_some(body)
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\nagent log:\n{}", agent.log_text()));
    assert_eq!(deployment["state"], "running", "{deployment}\nagent log:\n{}", agent.log_text());
    assert_eq!(deployment["commit"], second.as_str());
    let address = deployment["instances"][0]["address"].as_str().unwrap().to_string();
    let served = reqwest::get(format!("http://{address}/index.html")).await.unwrap().text().await.unwrap();
    assert_eq!(served, "behind a private CA\n");
    assert!(!gitlab.git_clones().is_empty(), "the node cloned from the stand-in");
    // The CA went to the node inside its sealed deploy command only: the
    // clone's private HOME (with the CA file) is gone after the build.
    assert!(!agent.log_text().contains("BEGIN CERTIFICATE"));

    let (status, _) = server.call(Method::DELETE, &format!("/api/apps/{app}"), None).await.unwrap();
    assert!(status < 300, "{status}");
}
