//! Preview environments of GitHub pull requests, against the GitHub
//! stand-in with real git, agent, Docker and registry: a request opened
//! from a branch deploys its head as `<app>-pr-<n>` on
//! `pr-<n>.<app>.<base domain>` (reached there through Caddy) with the
//! app's variables except the
//! production-only ones; a push to it deploys the new head; a request
//! from a fork waits for approval, then runs with no variable of the app;
//! a new one past the app's maximum removes the one pushed to longest
//! ago; closing one (even while it builds) removes its app, containers
//! and route, and the app itself is untouched.

use std::time::Duration;

use cloudweb_e2e::github::{FakeGithub, WEBHOOK_SECRET};
use cloudweb_e2e::gitlab::FakeGitlab;
use cloudweb_e2e::{caddy_bin, free_port, start_platform, unique_name, wait_for, AgentNode, Platform, ServerProcess};
use reqwest::Method;
use serde_json::{json, Value};

use crate::github::{configure, ready_agent};
use crate::gitlab::{cookie_pair, no_redirects, page, page_csrf, set_cookie, settle, AGENT_FLAGS, DOCKERFILE};

fn containers_of(app: &str) -> Vec<String> {
    let out = std::process::Command::new("docker").args(["ps", "-aq", "--filter", &format!("label=cloudweb.app={app}")]).output().unwrap();
    String::from_utf8_lossy(&out.stdout).split_whitespace().map(str::to_string).collect()
}

async fn route_hosts(server: &ServerProcess) -> Vec<String> {
    let (_, routes) = server.call(Method::GET, "/api/routes", None).await.unwrap();
    routes["routes"].as_array().unwrap().iter().filter_map(|r| r["host"].as_str().map(str::to_string)).collect()
}

async fn previews(server: &ServerProcess, app: &str) -> Value {
    let (status, body) = server.call(Method::GET, &format!("/api/apps/{app}/previews"), None).await.unwrap();
    assert_eq!(status, 200, "{body}");
    body
}

#[tokio::test]
async fn pull_requests_get_previews_that_follow_pushes_wait_for_forks_and_go_when_closed() {
    let Platform { tmp, server, .. } = start_platform(&["--base-domain", "test"]).await.unwrap();
    let github = FakeGithub::start(&tmp.path().join("github")).await.unwrap();
    let installation = github.install("acme");
    github.add_repository("acme/site", installation).unwrap();
    github.add_repository("someone/site", installation + 100).unwrap();
    github.make_public("someone/site");
    let files = |text: &'static str| [("Dockerfile", DOCKERFILE), ("index.html", text)];
    github.commit("acme/site", "main", &files("main\n"), "main").unwrap();
    configure(&server, &github).await;
    // One node that builds, runs and is the ingress (Caddy), to reach the
    // preview on its host.
    let (token, ca) = server.join_token().await.unwrap();
    let mut agent = AgentNode::join(&server, &tmp.path().join("node"), "edge", &token, &ca, &["--ingress"]).unwrap().unwrap();
    let (http_port, https_port) = (free_port().to_string(), free_port().to_string());
    let caddy = caddy_bin().display().to_string();
    agent.start(&[&AGENT_FLAGS[..], &["--http-port", &http_port, "--https-port", &https_port, "--caddy-bin", &caddy]].concat()).unwrap();
    let node_id = agent.node_id.clone();
    wait_for(Duration::from_secs(60), "the node and its ingress ready", || async {
        let node = server.node(&node_id).await.ok()?;
        (node["state"] == "ready" && node["features"].as_array()?.contains(&json!("traffic-metrics"))).then_some(())
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.log_text()));
    let app = unique_name("pv");
    let (status, created) = server.call(Method::POST, "/api/apps", Some(json!({"name": app, "github_repository": "acme/site", "port": 8080}))).await.unwrap();
    assert_eq!(status, 201, "{created}");
    let (status, _) = server.call(Method::PUT, &format!("/api/apps/{app}/env"), Some(json!({"GREETING": "hello", "DATABASE_URL": "postgres://production"}))).await.unwrap();
    assert_eq!(status, 200);
    let (status, body) = server.call(Method::PUT, &format!("/api/apps/{app}/env/production-only"), Some(json!({"names": ["DATABASE_URL"]}))).await.unwrap();
    assert_eq!(status, 200, "{body}");
    let (status, body) = server.call(Method::PUT, &format!("/api/apps/{app}/previews/env"), Some(json!({"API_URL": "https://staging.example"}))).await.unwrap();
    assert_eq!(status, 200, "{body}");
    let hook = server.api("/api/webhooks/github");
    let deliver = |body: Value, n: u32| {
        let (github, hook) = (&github, hook.clone());
        async move { github.deliver(&hook, "pull_request", &body, &format!("0000{n:04}-0000-4000-8000-000000000000"), WEBHOOK_SECRET).await.unwrap() }
    };

    // Off by default: a request does nothing.
    let one = github.commit("acme/site", "feature", &files("feature one\n"), "one").unwrap();
    let (status, answer) = deliver(github.pull_request_body("acme/site", 7, "opened", "acme/site", "feature", &one), 1).await;
    assert_eq!((status, answer["ignored"].as_str()), (200, Some("previews are off for this app")), "{answer}");
    for bad in [json!({"enabled": true, "max": 0}), json!({"enabled": true, "ttl_seconds": 60}), json!({"enabled": true, "instances": 0}), json!({"enabled": true, "memory": 1})] {
        let (status, body) = server.call(Method::PUT, &format!("/api/apps/{app}/previews/settings"), Some(bad)).await.unwrap();
        assert_eq!(status, 400, "{body}");
    }
    let (status, body) = server.call(Method::PUT, &format!("/api/apps/{app}/previews/settings"), Some(json!({"enabled": true, "max": 2, "memory": 134_217_728}))).await.unwrap();
    assert_eq!((status, body["max"].as_i64(), body["ttl_seconds"].as_i64(), body["memory"].as_i64()), (200, Some(2), Some(7 * 86_400), Some(134_217_728)), "{body}");

    // Opened: the head runs as <app>-pr-7 on pr-7.<app>.<base>, without
    // the production-only variable.
    let (status, answer) = deliver(github.pull_request_body("acme/site", 7, "reopened", "acme/site", "feature", &one), 2).await;
    assert_eq!(status, 202, "{answer}");
    let preview = format!("{app}-pr-7");
    let running = settle(&server, &agent, answer["deployment"].as_str().unwrap()).await;
    assert_eq!((running["state"].as_str(), running["commit"].as_str()), (Some("running"), Some(one.as_str())), "{running}");
    let address = running["instances"][0]["address"].as_str().unwrap().to_string();
    assert_eq!(reqwest::get(format!("http://{address}/index.html")).await.unwrap().text().await.unwrap(), "feature one\n");
    let (_, view) = server.call(Method::GET, &format!("/api/apps/{preview}"), None).await.unwrap();
    assert_eq!(view["env"], json!(["API_URL", "GREETING"]), "the app's minus production-only, plus the preview's own: {view}");
    assert_eq!((view["memory"].as_i64(), view["instances"].as_i64()), (Some(134_217_728), Some(1)), "the preview's smaller resources: {view}");
    let host = view["domains"][0].as_str().unwrap().to_string();
    assert!(host.starts_with(&format!("pr-7.{app}.")), "{view}");
    wait_for(Duration::from_secs(20), "the preview's route", || async { route_hosts(&server).await.contains(&host).then_some(()) }).await.unwrap();
    // Reachable on its host, through the ingress, over HTTPS.
    let root = wait_for(Duration::from_secs(30), "Caddy's local CA", || async { std::fs::read(agent.dir.join("caddy/data/caddy/pki/authorities/local/root.crt")).ok() }).await.unwrap();
    let client = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(&root).unwrap())
        .resolve(&host, "127.0.0.1:0".parse().unwrap())
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let preview_page = format!("https://{host}:{https_port}/index.html");
    wait_for(Duration::from_secs(30), "the preview on its host", || async {
        let response = client.get(&preview_page).send().await.ok()?;
        (response.status() == 200).then_some(response.text().await.ok()?).filter(|t| t == "feature one\n")
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.log_text()));
    let listed = previews(&server, &app).await;
    assert_eq!((listed["previews"][0]["state"].as_str(), listed["previews"][0]["url"].as_str()), (Some("active"), Some(format!("https://{host}").as_str())), "{listed}");
    assert_eq!(listed["production_only"], json!(["DATABASE_URL"]));
    assert_eq!(listed["preview_env"], json!(["API_URL"]));

    // The request is told: one comment with the URL, and the running
    // status links to the preview.
    let url = format!("https://{host}");
    wait_for(Duration::from_secs(30), "the preview's comment", || async {
        github.comments().iter().any(|c| c.number == 7 && c.bodies.last().is_some_and(|b| b.contains(&url) && b.contains(&one[..12]))).then_some(())
    })
    .await
    .unwrap();
    wait_for(Duration::from_secs(30), "the preview's success status", || async { github.statuses(&one).iter().any(|s| s.state == "success" && s.target_url == url).then_some(()) }).await.unwrap();

    // A push to the request: its new head.
    let two = github.commit("acme/site", "feature", &[("index.html", "feature two\n")], "two").unwrap();
    let (status, answer) = deliver(github.pull_request_body("acme/site", 7, "synchronize", "acme/site", "feature", &two), 3).await;
    assert_eq!(status, 202, "{answer}");
    let running = settle(&server, &agent, answer["deployment"].as_str().unwrap()).await;
    assert_eq!((running["state"].as_str(), running["commit"].as_str()), (Some("running"), Some(two.as_str())), "{running}");
    wait_for(Duration::from_secs(30), "the comment updated", || async {
        let comments: Vec<_> = github.comments().into_iter().filter(|c| c.number == 7).collect();
        (comments.len() == 1 && comments[0].bodies.last().is_some_and(|b| b.contains(&two[..12]))).then_some(())
    })
    .await
    .expect("one comment, updated for the new head");

    // From a fork: nothing is built until approved; then no variable.
    let fork = github.commit("someone/site", "patch", &files("from a fork\n"), "fork").unwrap();
    let (status, answer) = deliver(github.pull_request_body("acme/site", 8, "opened", "someone/site", "patch", &fork), 4).await;
    assert_eq!((status, answer["ignored"].as_str()), (200, Some("from a fork: waiting for approval")), "{answer}");
    let (status, _) = server.call(Method::GET, &format!("/api/apps/{app}-pr-8"), None).await.unwrap();
    assert_eq!(status, 404, "nothing made before the approval");
    assert_eq!(previews(&server, &app).await["previews"][1]["state"], "awaiting-approval");
    // Approved from the dashboard's button.
    let (_, user) = server.call(Method::POST, "/api/users", Some(json!({"name": "rev", "password": "rev's own password", "cluster_role": "cluster-admin"}))).await.unwrap();
    assert!(user["id"].is_string(), "{user}");
    let response = no_redirects().post(server.api("/login")).form(&[("name", "rev"), ("password", "rev's own password")]).send().await.unwrap();
    let session = cookie_pair(&set_cookie(response.headers(), "cloudweb_session").unwrap());
    let (status, page_html) = page(&server, &format!("/apps/{app}"), &[&session]).await;
    assert_eq!(status, 200);
    assert!(page_html.contains("data-preview=\"8\"") && page_html.contains(&format!("/apps/{app}/previews/8/approve")), "{page_html}");
    let response = no_redirects()
        .post(server.api(&format!("/apps/{app}/previews/8/approve")))
        .header("cookie", &session)
        .form(&[("csrf_token", page_csrf(&page_html))])
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 303);
    let approved = &previews(&server, &app).await["previews"][1];
    assert_eq!((approved["state"].as_str(), approved["approved_by"].as_str()), (Some("active"), Some("rev")), "{approved}");
    let (status, again) = server.call(Method::POST, &format!("/api/apps/{app}/previews/8/approve"), None).await.unwrap();
    assert_eq!(status, 409, "{again}");
    let (_, deployments) = server.call(Method::GET, &format!("/api/apps/{app}-pr-8/deployments"), None).await.unwrap();
    let running = settle(&server, &agent, deployments["deployments"][0]["id"].as_str().unwrap()).await;
    assert_eq!((running["state"].as_str(), running["commit"].as_str()), (Some("running"), Some(fork.as_str())), "{running}");
    let (_, view) = server.call(Method::GET, &format!("/api/apps/{app}-pr-8"), None).await.unwrap();
    assert_eq!(view["env"], json!([]), "a fork's preview gets no variable: {view}");

    // A third past the maximum of two: #7, pushed to longest ago, goes.
    let three = github.commit("acme/site", "other", &files("other\n"), "other").unwrap();
    let (status, answer) = deliver(github.pull_request_body("acme/site", 9, "opened", "acme/site", "other", &three), 5).await;
    assert_eq!(status, 202, "{answer}");
    let (status, _) = server.call(Method::GET, &format!("/api/apps/{preview}"), None).await.unwrap();
    assert_eq!(status, 404, "the oldest preview was removed");
    wait_for(Duration::from_secs(30), "the removal told", || async {
        github.comments().iter().any(|c| c.number == 7 && c.bodies.last().is_some_and(|b| b.contains("removed: the app keeps at most 2 previews"))).then_some(())
    })
    .await
    .unwrap();
    // Closed while it builds: cancelled, nothing left behind.
    let (status, answer) = deliver(github.pull_request_body("acme/site", 9, "closed", "acme/site", "other", &three), 6).await;
    assert_eq!((status, answer["ignored"].as_str()), (200, Some("preview removed")), "{answer}");
    let (status, answer) = deliver(github.pull_request_body("acme/site", 8, "closed", "someone/site", "patch", &fork), 7).await;
    assert_eq!(status, 200, "{answer}");
    wait_for(Duration::from_secs(60), "no preview container left", || async {
        ["7", "8", "9"].iter().all(|n| containers_of(&format!("{app}-pr-{n}")).is_empty()).then_some(())
    })
    .await
    .unwrap();
    let hosts = route_hosts(&server).await;
    assert!(!hosts.iter().any(|h| h.starts_with("pr-")), "{hosts:?}");
    assert_eq!(previews(&server, &app).await["previews"], json!([]));
    let (_, parent) = server.call(Method::GET, &format!("/api/apps/{app}"), None).await.unwrap();
    assert_eq!(parent["env"], json!(["DATABASE_URL", "GREETING"]), "the app is untouched: {parent}");
    agent.remove_containers();
}

/// A GitLab merge request gets a preview the same way, told by one note
/// kept up to date; a title edit (an update with no new commit) does
/// nothing; merging removes it.
#[tokio::test]
async fn a_gitlab_merge_request_gets_a_preview_and_a_note() {
    let Platform { tmp, server, .. } = start_platform(&[]).await.unwrap();
    let gitlab = FakeGitlab::start(&tmp.path().join("gitlab")).await.unwrap();
    gitlab.add_user(21, "alice", "alice@example.com", true, &[]);
    let project = gitlab.add_project("acme/site").unwrap();
    gitlab.commit("acme/site", "main", &[("Dockerfile", DOCKERFILE), ("index.html", "main\n")], "main").unwrap();
    crate::gitlab::configure(&server, &gitlab, &["alice"], &[]).await;
    gitlab.login_as(21);
    assert_eq!(crate::gitlab::login(&server).await.0, 200);
    let agent = ready_agent(&server, &tmp.path().join("node")).await;
    let app = unique_name("glpv");
    let (status, created) = server.call(Method::POST, "/api/apps", Some(json!({"name": app, "gitlab_project": "acme/site", "port": 8080}))).await.unwrap();
    assert_eq!(status, 201, "{created}");
    let (status, _) = server.call(Method::PUT, &format!("/api/apps/{app}/previews/settings"), Some(json!({"enabled": true}))).await.unwrap();
    assert_eq!(status, 200);

    let one = gitlab.commit("acme/site", "topic", &[("index.html", "topic one\n")], "one").unwrap();
    let answers = gitlab.deliver(project, &gitlab.merge_request_body(project, 3, "open", "topic", &one, None), "aa000000-0000-4000-8000-000000000001").await.unwrap();
    assert_eq!(answers[0].0, 202, "{answers:?}");
    let running = settle(&server, &agent, answers[0].1["deployment"].as_str().unwrap()).await;
    assert_eq!((running["state"].as_str(), running["commit"].as_str()), (Some("running"), Some(one.as_str())), "{running}");
    let url = format!("https://pr-3.{app}.");
    wait_for(Duration::from_secs(30), "the merge request's note", || async {
        gitlab.notes().iter().any(|(iid, bodies)| *iid == 3 && bodies.last().is_some_and(|b| b.contains(&url))).then_some(())
    })
    .await
    .unwrap();
    let answers = gitlab.deliver(project, &gitlab.merge_request_body(project, 3, "update", "topic", &one, None), "aa000000-0000-4000-8000-000000000002").await.unwrap();
    assert_eq!((answers[0].0, answers[0].1["ignored"].as_str()), (200, Some("a merge request change with no new code")), "{answers:?}");
    let two = gitlab.commit("acme/site", "topic", &[("index.html", "topic two\n")], "two").unwrap();
    let answers = gitlab.deliver(project, &gitlab.merge_request_body(project, 3, "update", "topic", &two, Some(&one)), "aa000000-0000-4000-8000-000000000003").await.unwrap();
    assert_eq!(answers[0].0, 202, "{answers:?}");
    settle(&server, &agent, answers[0].1["deployment"].as_str().unwrap()).await;
    wait_for(Duration::from_secs(30), "the note updated", || async {
        let notes: Vec<_> = gitlab.notes().into_iter().filter(|(iid, _)| *iid == 3).collect();
        (notes.len() == 1 && notes[0].1.last().is_some_and(|b| b.contains(&two[..12]))).then_some(())
    })
    .await
    .expect("one note, updated");
    let answers = gitlab.deliver(project, &gitlab.merge_request_body(project, 3, "merge", "topic", &two, None), "aa000000-0000-4000-8000-000000000004").await.unwrap();
    assert_eq!((answers[0].0, answers[0].1["ignored"].as_str()), (200, Some("preview removed")), "{answers:?}");
    let (status, _) = server.call(Method::GET, &format!("/api/apps/{app}-pr-3"), None).await.unwrap();
    assert_eq!(status, 404);
    wait_for(Duration::from_secs(60), "no preview container left", || async { containers_of(&format!("{app}-pr-3")).is_empty().then_some(()) }).await.unwrap();
    agent.remove_containers();
}

/// With `database: empty`, a preview of an app linked to a PostgreSQL
/// service gets one of its own, linked under the same variable (not the
/// app's); when the preview goes, that service goes and its volume stays,
/// detached. With `latest-backup`, the preview's database holds the rows
/// of the app's database's newest backup.
#[tokio::test]
async fn a_preview_gets_a_database_of_its_own() {
    use cloudweb_e2e::services::{ensure_service_images, psql_in, service_ports, services_node};
    const PG: &str = "cloudweb-test/postgres:15";
    const SHOW_URL: &str = "FROM cloudweb-test/busybox:latest\n\
CMD [\"sh\", \"-c\", \"mkdir -p /www && echo \\\"$DATABASE_URL\\\" > /www/url && exec httpd -f -p 8080 -h /www\"]\n";
    ensure_service_images();
    let ports = service_ports();
    let Platform { tmp, server, .. } = start_platform(&["--service-image", &format!("postgres={PG}"), "--service-ports", &ports]).await.unwrap();
    let github = FakeGithub::start(&tmp.path().join("github")).await.unwrap();
    let installation = github.install("acme");
    github.add_repository("acme/site", installation).unwrap();
    github.commit("acme/site", "main", &[("Dockerfile", SHOW_URL)], "main").unwrap();
    configure(&server, &github).await;
    let agent = services_node(&server, tmp.path(), "db-node").await;
    let app = unique_name("pvdb");
    let (status, created) = server.call(Method::POST, "/api/apps", Some(json!({"name": app, "github_repository": "acme/site", "port": 8080}))).await.unwrap();
    assert_eq!(status, 201, "{created}");
    let db = unique_name("db");
    let (status, body) = server.call(Method::POST, "/api/services", Some(json!({"name": db, "type": "postgres"}))).await.unwrap();
    assert_eq!(status, 201, "{body}");
    let (status, body) = server.call(Method::POST, &format!("/api/services/{db}/links"), Some(json!({"app": app}))).await.unwrap();
    assert_eq!(status, 200, "{body}");
    let (status, body) = server.call(Method::PUT, &format!("/api/apps/{app}/previews/settings"), Some(json!({"enabled": true, "database": "copy"}))).await.unwrap();
    assert_eq!(status, 400, "{body}");
    let (status, body) = server.call(Method::PUT, &format!("/api/apps/{app}/previews/settings"), Some(json!({"enabled": true, "database": "empty"}))).await.unwrap();
    assert_eq!((status, body["database"].as_str()), (200, Some("empty")), "{body}");

    let head = github.commit("acme/site", "topic", &[("README", "topic\n")], "topic").unwrap();
    let hook = server.api("/api/webhooks/github");
    let (status, answer) = github.deliver(&hook, "pull_request", &github.pull_request_body("acme/site", 4, "opened", "acme/site", "topic", &head), "44444444-0000-4000-8000-000000000001", WEBHOOK_SECRET).await.unwrap();
    assert_eq!((status, answer["ignored"].as_str()), (200, Some("deploying once the preview's databases answer")), "{answer}");
    let own = format!("pr4-{db}");
    let listed = previews(&server, &app).await;
    assert_eq!(listed["previews"][0]["services"], json!([own]), "{listed}");
    let service = wait_for(Duration::from_secs(120), "the preview's database healthy", || async {
        let (_, view) = server.call(Method::GET, &format!("/api/services/{own}"), None).await.ok()?;
        (view["state"] == "healthy").then_some(view)
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.log_text()));
    let deployment = wait_for(Duration::from_secs(30), "the preview's deployment", || async {
        let (_, list) = server.call(Method::GET, &format!("/api/apps/{app}-pr-4/deployments"), None).await.ok()?;
        list["deployments"][0]["id"].as_str().map(str::to_string)
    })
    .await
    .unwrap();
    let running = settle(&server, &agent, &deployment).await;
    assert_eq!((running["state"].as_str(), running["commit"].as_str()), (Some("running"), Some(head.as_str())), "{running}");
    let address = running["instances"][0]["address"].as_str().unwrap().to_string();
    let url = reqwest::get(format!("http://{address}/url")).await.unwrap().text().await.unwrap();
    let own_address = service["address"].as_str().unwrap();
    assert!(url.contains(own_address), "the preview's DATABASE_URL is its own database's ({own_address}): {url}");
    let (_, parent_db) = server.call(Method::GET, &format!("/api/services/{db}"), None).await.unwrap();
    assert!(!url.contains(parent_db["address"].as_str().unwrap()), "never the app's database");

    let (status, answer) = github.deliver(&hook, "pull_request", &github.pull_request_body("acme/site", 4, "closed", "acme/site", "topic", &head), "44444444-0000-4000-8000-000000000002", WEBHOOK_SECRET).await.unwrap();
    assert_eq!((status, answer["ignored"].as_str()), (200, Some("preview removed")), "{answer}");
    let (status, _) = server.call(Method::GET, &format!("/api/services/{own}"), None).await.unwrap();
    assert_eq!(status, 404, "the preview's database went with it");
    let (_, volumes) = server.call(Method::GET, "/api/volumes", None).await.unwrap();
    assert!(volumes["volumes"].as_array().unwrap().iter().any(|v| v["name"] == format!("svc-{own}")), "its volume stays until deleted by name: {volumes}");
    let (status, _) = server.call(Method::GET, &format!("/api/services/{db}"), None).await.unwrap();
    assert_eq!(status, 200, "the app's database is untouched");

    // `latest-backup`: the preview's database is restored from the app's
    // database's newest backup.
    let rows = wait_for(Duration::from_secs(60), "the app's database to answer", || async {
        psql_in(&db, "CREATE TABLE items (id int PRIMARY KEY); INSERT INTO items SELECT generate_series(1, 3); SELECT count(*) FROM items").ok()
    })
    .await
    .unwrap();
    assert!(rows.ends_with("\n3"), "{rows}");
    let target = tmp.path().join("backups");
    std::fs::create_dir_all(&target).unwrap();
    let (status, body) = server.call(Method::POST, "/api/backup-destinations", Some(json!({"name": "local", "kind": "path", "path": target.to_string_lossy()}))).await.unwrap();
    assert_eq!(status, 201, "{body}");
    let (status, job) = server.call(Method::POST, &format!("/api/services/{db}/backups"), None).await.unwrap();
    assert!(status == 201 || status == 202, "{status} {job}");
    let id = job["id"].as_str().unwrap().to_string();
    wait_for(Duration::from_secs(120), "the backup", || async {
        let (_, job) = server.call(Method::GET, &format!("/api/backups/{id}"), None).await.ok()?;
        (job["state"] == "succeeded").then_some(())
    })
    .await
    .unwrap_or_else(|e| panic!("{e}
{}", agent.log_text()));
    let (status, body) = server.call(Method::PUT, &format!("/api/apps/{app}/previews/settings"), Some(json!({"enabled": true, "database": "latest-backup"}))).await.unwrap();
    assert_eq!(status, 200, "{body}");
    let (status, answer) = github.deliver(&hook, "pull_request", &github.pull_request_body("acme/site", 5, "opened", "acme/site", "topic", &head), "44444444-0000-4000-8000-000000000003", WEBHOOK_SECRET).await.unwrap();
    assert_eq!(status, 200, "{answer}");
    let restored = format!("pr5-{db}");
    let count = wait_for(Duration::from_secs(120), "the preview's database restored", || async { psql_in(&restored, "SELECT count(*) FROM items").ok() }).await.unwrap_or_else(|e| panic!("{e}
{}", agent.log_text()));
    assert_eq!(count, "3", "the app's rows, restored into the preview's own database");
    let (status, _) = github.deliver(&hook, "pull_request", &github.pull_request_body("acme/site", 5, "closed", "acme/site", "topic", &head), "44444444-0000-4000-8000-000000000004", WEBHOOK_SECRET).await.unwrap();
    assert_eq!(status, 200);
    agent.remove_containers();
}
