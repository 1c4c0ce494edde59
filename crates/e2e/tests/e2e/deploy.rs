//! The deploy pipeline end to end with the real binaries, the real Docker
//! Engine, the Docker distribution registry and a git daemon: build from a
//! commit, replace it blue/green, survive a broken commit, roll back without
//! building, build a static site, and refuse bad input.

use std::time::Duration;

use cloudweb_e2e::{docker, start_platform, Platform, unique_name, wait_for, AgentNode, GitServer, ServerProcess};
use reqwest::Method;
use serde_json::{json, Value};

const DOCKERFILE: &str = "FROM cloudweb-test/busybox:latest\nCOPY index.html /www/index.html\n\
CMD [\"sh\", \"-c\", \"echo \\\"$GREETING\\\" > /www/env.txt && exec httpd -f -p 8080 -h /www\"]\n";
const BROKEN_DOCKERFILE: &str = "FROM cloudweb-test/busybox:latest\nCMD [\"sleep\", \"3600\"]\n";

struct Cluster {
    _tmp: tempfile::TempDir,
    server: ServerProcess,
    agent: AgentNode,
    git: GitServer,
}

const AGENT_FLAGS: [&str; 8] = [
    "--heartbeat-interval-seconds", "1",
    "--publish-ip", "127.0.0.1",
    "--advertise-host", "127.0.0.1",
    "--static-builder-image", "cloudweb-test/busybox:latest",
];

async fn cluster() -> Cluster {
    let Platform { tmp, git, server } = start_platform(&[]).await.unwrap();
    let (token, ca) = server.join_token().await.unwrap();
    let mut agent = AgentNode::join(&server, &tmp.path().join("node"), "builder", &token, &ca, &[]).unwrap().unwrap();
    agent.start(&AGENT_FLAGS).unwrap();
    let node_id = agent.node_id.clone();
    wait_for(
        Duration::from_secs(10),
        "node ready with static-sites",
        || async {
            let node = server.node(&node_id).await.ok()?;
            (node["state"] == "ready"
                && node["features"]
                    == json!([
                        "static-sites",
                        "volumes",
                        "services",
                        "volume-moves",
                        "service-ops",
                        "backups",
                        "tasks",
                        "sessions",
                        "probe-checks"
                    ]))
            .then_some(())
        },
    )
    .await
    .unwrap();
    Cluster { _tmp: tmp, server, agent, git }
}

async fn create_app(server: &ServerProcess, body: Value) -> Value {
    let (status, app) = server.call(Method::POST, "/api/apps", Some(body)).await.unwrap();
    assert_eq!(status, 201, "{app}");
    app
}

async fn deploy(server: &ServerProcess, app: &str, commit: &str) -> String {
    let (status, body) = server.call(Method::POST, &format!("/api/apps/{app}/deploy"), Some(json!({"commit": commit}))).await.unwrap();
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["state"], "queued", "{body}");
    body["id"].as_str().unwrap().to_string()
}

/// Waits until the deployment is running or failed; returns it.
async fn settle(cluster: &Cluster, id: &str) -> Value {
    let result = wait_for(Duration::from_secs(120), "the deployment to settle", || async {
        let (_, body) = cluster.server.call(Method::GET, &format!("/api/deployments/{id}"), None).await.ok()?;
        matches!(body["state"].as_str(), Some("running" | "failed")).then_some(body)
    })
    .await;
    match result {
        Ok(body) => body,
        Err(err) => panic!("{err}\nagent log:\n{}\nserver log:\n{}", cluster.agent.log_text(), cluster.server.process.log_text()),
    }
}

async fn get(url: &str) -> (u16, String) {
    let response = reqwest::get(url).await.unwrap();
    (response.status().as_u16(), response.text().await.unwrap())
}

fn address(deployment: &Value) -> String {
    deployment["instances"][0]["address"].as_str().unwrap().to_string()
}

/// Every log line of a deployment, read from the live log stream until it
/// ends: (stream, line).
async fn log_lines(server: &ServerProcess, id: &str) -> Vec<(String, String)> {
    let response = server
        .http
        .get(server.api(&format!("/api/deployments/{id}/logs")))
        .bearer_auth(&server.admin_token)
        .timeout(Duration::from_secs(30))
        .send()
        .await
        .unwrap();
    let text = response.text().await.unwrap();
    assert!(text.contains("event: end"), "the stream ends when the deployment settled: {text}");
    text.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter(|v| v.get("line").is_some())
        .map(|v| (v["stream"].as_str().unwrap().to_string(), v["line"].as_str().unwrap().to_string()))
        .collect()
}

fn containers_of(deployment: &str) -> Vec<String> {
    docker_ps(&["-a", "--filter", &format!("label=cloudweb.deployment={deployment}")])
}

fn running_containers_of(deployment: &str) -> Vec<String> {
    docker_ps(&["--filter", "status=running", "--filter", &format!("label=cloudweb.deployment={deployment}")])
}

fn docker_ps(filters: &[&str]) -> Vec<String> {
    docker::ps(&[&["--format", "{{.Names}}"], filters].concat())
}

#[tokio::test]
async fn build_replace_fail_roll_back_and_serve_a_static_site() {
    let cluster = cluster().await;
    let server = &cluster.server;
    let web = unique_name("web");
    let site_name = unique_name("site");
    let escape_name = unique_name("escape");
    let repo = cluster.git.url("web");
    let commit_a = cluster.git.commit("web", &[("Dockerfile", DOCKERFILE), ("index.html", "version A\n")], "A").unwrap();
    create_app(server, json!({"name": web, "repo_url": repo, "branch": "main", "port": 8080, "health_timeout_seconds": 5})).await;
    let (status, env) = server
        .call(Method::PUT, &format!("/api/apps/{web}/env"), Some(json!({"GREETING": "hello from env", "DATABASE_PASSWORD": "p4ss"})))
        .await
        .unwrap();
    assert_eq!(status, 200, "{env}");
    let (_, app) = server.call(Method::GET, &format!("/api/apps/{web}"), None).await.unwrap();
    assert_eq!(app["env"], json!(["DATABASE_PASSWORD", "GREETING"]));
    assert!(!app.to_string().contains("p4ss"), "values never come back");

    // Commit A: built from the Dockerfile, pushed, running, answering.
    let dep_a = deploy(server, &web, &commit_a).await;
    let a = settle(&cluster, &dep_a).await;
    assert_eq!(a["state"], "running", "{a}");
    assert!(a["image"].as_str().unwrap().contains(&format!("/{web}:")), "pushed to the registry: {a}");
    let url_a = format!("http://{}", address(&a));
    assert_eq!(get(&format!("{url_a}/")).await, (200, "version A\n".into()));
    assert_eq!(get(&format!("{url_a}/env.txt")).await.1, "hello from env\n", "the app's env reaches the container");
    let container_a = a["instances"][0]["container"].as_str().unwrap().to_string();
    assert!(container_a.starts_with(&format!("cw-{web}-")), "{container_a}");
    let lines_a = log_lines(server, &dep_a).await;
    assert!(lines_a.iter().any(|(s, l)| s == "build" && l.contains("cloning")), "{lines_a:?}");
    assert!(!format!("{lines_a:?}").contains("p4ss"), "no secret in the logs");

    // Commit B replaces A blue/green.
    let commit_b = cluster.git.commit("web", &[("index.html", "version B\n")], "B").unwrap();
    let dep_b = deploy(server, &web, &commit_b).await;
    let b = settle(&cluster, &dep_b).await;
    assert_eq!(b["state"], "running", "{b}");
    let url_b = format!("http://{}", address(&b));
    assert_eq!(get(&format!("{url_b}/")).await.1, "version B\n");
    let (_, a_now) = server.call(Method::GET, &format!("/api/deployments/{dep_a}"), None).await.unwrap();
    assert_eq!(a_now["state"], "superseded");
    wait_for(Duration::from_secs(20), "A's container gone after the drain", || async { containers_of(&dep_a).is_empty().then_some(()) })
        .await
        .unwrap();

    // Commit C never becomes healthy. The agent is killed while it waits
    // for C's health check; the restarted agent gets the command again and
    // adopts the container it started instead of starting a second one.
    let commit_c = cluster.git.commit("web", &[("Dockerfile", BROKEN_DOCKERFILE)], "C").unwrap();
    let dep_c = deploy(server, &web, &commit_c).await;
    wait_for(Duration::from_secs(60), "C's container to run", || async { (running_containers_of(&dep_c).len() == 1).then_some(()) })
        .await
        .unwrap();
    let mut cluster = cluster;
    cluster.agent.kill();
    cluster.agent.start(&AGENT_FLAGS).unwrap();
    wait_for(Duration::from_secs(20), "the restarted agent to adopt C's container", || async {
        cluster.agent.log_text().contains("adopting a container started before a restart").then_some(())
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\nagent log:\n{}", cluster.agent.log_text()));
    assert_eq!(containers_of(&dep_c).len(), 1, "no second copy");
    let server = &cluster.server;
    let c = settle(&cluster, &dep_c).await;
    assert_eq!(c["state"], "failed", "{c}");
    assert!(c["error"].as_str().unwrap().contains("health check"), "{c}");
    assert_eq!(get(&format!("{url_b}/")).await.1, "version B\n", "B still answers");
    assert!(containers_of(&dep_c).is_empty(), "the failed instance was removed");
    let (_, b_now) = server.call(Method::GET, &format!("/api/deployments/{dep_b}"), None).await.unwrap();
    assert_eq!(b_now["state"], "running");

    // Roll back to A: A's image, no build.
    let (status, rollback) = server.call(Method::POST, &format!("/api/apps/{web}/rollback"), Some(json!({"deployment_id": dep_a}))).await.unwrap();
    assert_eq!(status, 201, "{rollback}");
    let dep_r = rollback["id"].as_str().unwrap().to_string();
    let r = settle(&cluster, &dep_r).await;
    assert_eq!(r["state"], "running", "{r}");
    assert_eq!(r["kind"], "rollback");
    assert_eq!(r["image"], a["image"], "the same image as A");
    assert_eq!(get(&format!("http://{}/", address(&r))).await.1, "version A\n");
    let lines_r = log_lines(server, &dep_r).await;
    assert!(lines_r.iter().all(|(stream, _)| stream != "build"), "no build ran: {lines_r:?}");
    assert!(lines_r.iter().any(|(_, l)| l.contains("using image")), "{lines_r:?}");
    let (_, b_after) = server.call(Method::GET, &format!("/api/deployments/{dep_b}"), None).await.unwrap();
    assert_eq!(b_after["state"], "superseded");

    // A static site with explicit build settings: only public variables
    // reach the build; SPA fallback on.
    let build = "mkdir -p dist && cp index.html dist/ && echo \"$VITE_TOKEN\" > dist/public.txt && echo \"$SECRET_KEY\" > dist/secret.txt";
    cluster.git.commit("site", &[("index.html", "<h1>static</h1>\n")], "site").unwrap();
    create_app(
        server,
        json!({"name": site_name, "repo_url": cluster.git.url("site"), "port": 8080, "health_timeout_seconds": 10,
               "build": {"install_cmd": "true", "build_cmd": build, "output_dir": "dist", "spa": "yes"}}),
    )
    .await;
    server.call(Method::PUT, &format!("/api/apps/{site_name}/env"), Some(json!({"VITE_TOKEN": "public-value", "SECRET_KEY": "private-value"}))).await.unwrap();
    let (status, body) = server.call(Method::POST, &format!("/api/apps/{site_name}/deploy"), None).await.unwrap();
    assert_eq!(status, 201, "{body}");
    let site = settle(&cluster, body["id"].as_str().unwrap()).await;
    assert_eq!(site["state"], "running", "{site}");
    let url_site = format!("http://{}", address(&site));
    assert_eq!(get(&format!("{url_site}/")).await, (200, "<h1>static</h1>\n".into()));
    assert_eq!(get(&format!("{url_site}/public.txt")).await.1, "public-value\n");
    assert_eq!(get(&format!("{url_site}/secret.txt")).await.1, "\n", "a non-public variable never enters the build");
    assert_eq!(get(&format!("{url_site}/some/client/route")).await, (200, "<h1>static</h1>\n".into()), "SPA fallback");

    // An output dir that is a symlink out of the checkout fails the build.
    cluster.git.commit("escape", &[("index.html", "x\n")], "escape").unwrap();
    create_app(
        server,
        json!({"name": escape_name, "repo_url": cluster.git.url("escape"), "port": 8080,
               "build": {"build_cmd": "ln -s /etc out", "output_dir": "out"}}),
    )
    .await;
    let (_, body) = server.call(Method::POST, &format!("/api/apps/{escape_name}/deploy"), None).await.unwrap();
    let escape = settle(&cluster, body["id"].as_str().unwrap()).await;
    assert_eq!(escape["state"], "failed");
    assert!(escape["error"].as_str().unwrap().contains("outside the project"), "{escape}");
    // Build settings changed after creation: the next deploy uses them.
    let (status, changed) = server
        .call(Method::PATCH, &format!("/api/apps/{escape_name}"), Some(json!({"build": {"build_cmd": "mkdir -p out && cp index.html out/", "output_dir": "out"}, "health_timeout_seconds": 10})))
        .await
        .unwrap();
    assert_eq!(status, 200, "{changed}");
    let (_, body) = server.call(Method::POST, &format!("/api/apps/{escape_name}/deploy"), None).await.unwrap();
    let fixed = settle(&cluster, body["id"].as_str().unwrap()).await;
    assert_eq!(fixed["state"], "running", "{fixed}");
    assert_eq!(get(&format!("http://{}/", address(&fixed))).await, (200, "x\n".into()));

    // Deleting an app stops what it runs.
    let (status, _) = server.call(Method::DELETE, &format!("/api/apps/{web}"), None).await.unwrap();
    assert_eq!(status, 204);
    wait_for(Duration::from_secs(20), "web's containers gone", || async { containers_of(&dep_r).is_empty().then_some(()) })
        .await
        .unwrap();
    server.call(Method::DELETE, &format!("/api/apps/{site_name}"), None).await.unwrap();
    server.call(Method::DELETE, &format!("/api/apps/{escape_name}"), None).await.unwrap();
}

#[tokio::test]
async fn bad_app_input_is_refused_and_creates_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let server = ServerProcess::start(tmp.path()).await.unwrap();
    let base = json!({"name": "ok", "repo_url": "https://git.example.com/a/b.git", "branch": "main", "port": 8080});
    let with = |field: &str, value: Value| {
        let mut body = base.clone();
        body[field] = value;
        body
    };
    let cases = [
        with("name", json!("web;rm -rf /")),
        with("name", json!("$(reboot)")),
        with("build", json!({"output_dir": "../../etc"})),
        with("build", json!({"output_dir": "/etc"})),
        with("build", json!({"build_cmd": "make\nrm -rf /"})),
        with("build", json!({"builder": "magic"})),
        with("branch", json!("-upload-pack=evil")),
        with("strategy", json!("magic")),
        with("repo_url", json!("ext::sh -c id")),
        with("repo_url", json!("file:///etc")),
        with("repo_url", json!("https://user:token@git.example.com/a.git")),
        // Option injection through the ssh host or user.
        with("repo_url", json!("ssh://-oProxyCommand=id/a.git")),
        with("repo_url", json!("git@-oProxyCommand=id:x.git")),
        // An ssh repository without the app's own key and known hosts.
        with("repo_url", json!("ssh://git@git.example.com/a.git")),
        // Places the node must not be sent to (no --allow-private-git-hosts).
        with("repo_url", json!("https://169.254.169.254/latest/meta-data")),
        with("repo_url", json!("git://127.0.0.1:9418/a.git")),
        with("repo_url", json!("https://[::ffff:7f00:1]/a.git")),
        with("repo_url", json!("https://[::]/a.git")),
        with("repo_url", json!("https://10.0.0.5/a.git")),
        with("repo_url", json!("https://localhost:8443/a.git")),
        with("port", json!(0)),
        with("instances", json!(0)),
        with("domains", json!(["not a host"])),
        // A valid host name, too long for the ingress's upstream directory.
        with("domains", json!([format!("{}.example.com", vec!["x".repeat(59); 4].join("."))])), // 251 characters
        with("surprise", json!(true)),
    ];
    for body in cases {
        let (status, answer) = server.call(Method::POST, "/api/apps", Some(body.clone())).await.unwrap();
        assert_eq!(status, 400, "{body} -> {answer}");
        assert!(answer["error"].as_str().is_some_and(|e| !e.is_empty()), "{answer}");
    }
    let (_, apps) = server.call(Method::GET, "/api/apps", None).await.unwrap();
    assert_eq!(apps["apps"], json!([]), "nothing was created");

    let (status, _) = server.call(Method::POST, "/api/apps", Some(base.clone())).await.unwrap();
    assert_eq!(status, 201);
    // A 10 MB value. Sent with curl, which asks `Expect: 100-continue` for a
    // large body as real clients do, so the early 413 is read instead of the
    // connection being cut mid-upload.
    let big = tmp.path().join("big.json");
    std::fs::write(&big, json!({"BIG": "x".repeat(10 * 1024 * 1024)}).to_string()).unwrap();
    let output = std::process::Command::new("curl")
        .args(["-sS", "-X", "PUT", "-H", "content-type: application/json", "-H", &format!("authorization: Bearer {}", server.admin_token)])
        .args(["--data-binary", &format!("@{}", big.display()), "-w", "\n%{http_code}", &server.api("/api/apps/ok/env")])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    let (answer, status) = text.rsplit_once('\n').unwrap();
    assert_eq!(status, "413", "{text} {}", String::from_utf8_lossy(&output.stderr));
    assert!(answer.contains("larger than 1 MiB"), "{answer}");
    let (status, answer) = server.call(Method::PUT, "/api/apps/ok/env", Some(json!({"BIG": "x".repeat(40 * 1024)}))).await.unwrap();
    assert_eq!(status, 400, "{answer}");
    let (status, _) = server.call(Method::PUT, "/api/apps/ok/env", Some(json!({"1BAD": "x"}))).await.unwrap();
    assert_eq!(status, 400);
    let (_, app) = server.call(Method::GET, "/api/apps/ok", None).await.unwrap();
    assert_eq!(app["env"], json!([]), "no variable was stored");
    let (status, _) = server.call(Method::POST, "/api/apps/ok/deploy", Some(json!({"commit": "not-hex"}))).await.unwrap();
    assert_eq!(status, 400);
    let (status, _) = server.call(Method::POST, "/api/apps/ok/rollback", Some(json!({"deployment_id": "dep_nope"}))).await.unwrap();
    assert_eq!(status, 404);
    let (_, deployments) = server.call(Method::GET, "/api/apps/ok/deployments", None).await.unwrap();
    assert_eq!(deployments["deployments"], json!([]));

    // Settings changed after creation are checked as at creation; a
    // refused change changes nothing.
    let (_, before) = server.call(Method::GET, "/api/apps/ok", None).await.unwrap();
    let refused = [
        json!({"branch": "-upload-pack=evil"}),
        json!({"port": 0}),
        json!({"port": 70000}),
        json!({"instances": 21}),
        json!({"cpu": 0.001}),
        json!({"memory": 1024}),
        json!({"health_path": "no-slash"}),
        json!({"health_timeout_seconds": 0}),
        json!({"build_timeout_seconds": 7201}),
        json!({"build": {"output_dir": "../../etc"}}),
        json!({"build": {"build_cmd": "make"}, "strategy": "dockerfile"}),
        json!({"strategy": "magic"}),
        json!({"name": "renamed"}),
        json!({"repo_url": "https://elsewhere.example.com/x.git"}),
        json!({"port": 8081, "surprise": true}),
    ];
    for body in refused {
        let (status, answer) = server.call(Method::PATCH, "/api/apps/ok", Some(body.clone())).await.unwrap();
        assert_eq!(status, 400, "{body} -> {answer}");
    }
    let (_, after) = server.call(Method::GET, "/api/apps/ok", None).await.unwrap();
    assert_eq!(after, before, "nothing changed");
    assert_eq!(server.call(Method::PATCH, "/api/apps/nope", Some(json!({"port": 80}))).await.unwrap().0, 404);
    let change = json!({"branch": "release/2", "port": 3000, "instances": 2, "cpu": 0.5, "memory": 268435456, "health_path": "/up",
                        "health_timeout_seconds": 12, "build_timeout_seconds": 600, "build": {"build_cmd": "make site", "output_dir": "site"}});
    let (status, changed) = server.call(Method::PATCH, "/api/apps/ok", Some(change)).await.unwrap();
    assert_eq!(status, 200, "{changed}");
    let (_, shown) = server.call(Method::GET, "/api/apps/ok", None).await.unwrap();
    assert_eq!(shown, changed);
    for (field, value) in [("branch", json!("release/2")), ("port", json!(3000)), ("instances", json!(2)), ("cpu", json!(0.5)), ("memory", json!(268435456)),
                           ("health_path", json!("/up")), ("health_timeout_seconds", json!(12)), ("build_timeout_seconds", json!(600)),
                           ("strategy", json!("static")), ("build", json!({"build_cmd": "make site", "output_dir": "site"})), ("repo_url", before["repo_url"].clone())] {
        assert_eq!(shown[field], value, "{field}: {shown}");
    }
    // `null` puts a setting back to its default; what is left out stays.
    let (status, reset) = server.call(Method::PATCH, "/api/apps/ok", Some(json!({"cpu": null, "memory": null, "build": null, "build_timeout_seconds": null}))).await.unwrap();
    assert_eq!(status, 200, "{reset}");
    assert_eq!((reset["cpu"].clone(), reset["memory"].clone(), reset["build"].clone()), (Value::Null, Value::Null, Value::Null), "{reset}");
    assert_eq!(reset["build_timeout_seconds"], before["build_timeout_seconds"], "the default again");
    assert_eq!((reset["port"].clone(), reset["branch"].clone()), (json!(3000), json!("release/2")));
}

#[tokio::test]
async fn a_deploy_with_no_node_waits_then_fails_with_the_reason() {
    let tmp = tempfile::tempdir().unwrap();
    let server = ServerProcess::start_with(tmp.path(), &["--placement-wait-seconds", "1"]).await.unwrap();
    let (status, _) = server
        .call(Method::POST, "/api/apps", Some(json!({"name": "lonely", "repo_url": "https://git.example.com/a.git", "port": 80})))
        .await
        .unwrap();
    assert_eq!(status, 201);
    let (status, body) = server.call(Method::POST, "/api/apps/lonely/deploy", None).await.unwrap();
    assert_eq!(status, 201);
    assert_eq!(body["state"], "queued", "{body}");
    let id = body["id"].as_str().unwrap().to_string();
    let failed = wait_for(Duration::from_secs(10), "the deployment to fail", || async {
        let (_, d) = server.call(Method::GET, &format!("/api/deployments/{id}"), None).await.ok()?;
        (d["state"] == "failed").then_some(d)
    })
    .await
    .unwrap();
    assert!(failed["error"].as_str().unwrap().contains("no node has joined"), "{failed}");
}

/// Waits for the deployment to settle, at most `limit`.
async fn settle_within(cluster: &Cluster, id: &str, limit: Duration) -> Value {
    let result = wait_for(limit, "the deployment to settle", || async {
        let (_, body) = cluster.server.call(Method::GET, &format!("/api/deployments/{id}"), None).await.ok()?;
        matches!(body["state"].as_str(), Some("running" | "failed")).then_some(body)
    })
    .await;
    match result {
        Ok(body) => body,
        Err(err) => {
            let (_, body) = cluster.server.call(Method::GET, &format!("/api/deployments/{id}"), None).await.unwrap();
            panic!("{err}: {body}\nagent log:\n{}\nserver log:\n{}", cluster.agent.log_text(), cluster.server.process.log_text())
        }
    }
}

/// Rows a table of the control plane's database holds for a deployment,
/// read with the sqlite3 CLI (psql when the run keeps the state in
/// PostgreSQL).
fn rows_for(server: &ServerProcess, table: &str, deployment: &str) -> usize {
    let data = server.dir.join("server");
    let sql = format!("SELECT COUNT(*) FROM {table} WHERE deployment_id = '{deployment}'");
    let output = match cloudweb_e2e::state_db::url_for(&data) {
        Some(url) => std::process::Command::new("psql").arg(url).args(["-tAc", &sql]).output().unwrap(),
        None => std::process::Command::new("sqlite3").arg(data.join("state.db")).arg(&sql).output().unwrap(),
    };
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8_lossy(&output.stdout).trim().parse().unwrap()
}

/// Issue 10 item 1 and issue 9 item 7. A mistyped branch makes git print
/// several lines; that failure must reach the control plane (not be refused
/// for its line breaks and retried forever), and the node must take the
/// next deploy. Deploys record the full commit they built.
#[tokio::test]
async fn a_multi_line_failure_does_not_jam_the_node_and_the_built_commit_is_recorded() {
    let cluster = cluster().await;
    let server = &cluster.server;
    let typo = unique_name("typo");
    let good = unique_name("good");
    let head = cluster.git.commit("jam", &[("Dockerfile", DOCKERFILE), ("index.html", "ok\n")], "ok").unwrap();
    create_app(server, json!({"name": typo, "repo_url": cluster.git.url("jam"), "branch": "mian", "port": 8080})).await;
    create_app(server, json!({"name": good, "repo_url": cluster.git.url("jam"), "port": 8080, "health_timeout_seconds": 10})).await;

    let (status, body) = server.call(Method::POST, &format!("/api/apps/{typo}/deploy"), None).await.unwrap();
    assert_eq!(status, 201, "{body}");
    let failed = settle_within(&cluster, body["id"].as_str().unwrap(), Duration::from_secs(30)).await;
    assert_eq!(failed["state"], "failed", "{failed}");
    let error = failed["error"].as_str().unwrap();
    assert!(error.contains("mian") && !error.contains('\n'), "a readable one-line reason: {error}");

    // The branch head: the deployment shows the full commit that was built.
    let (_, body) = server.call(Method::POST, &format!("/api/apps/{good}/deploy"), None).await.unwrap();
    let running = settle_within(&cluster, body["id"].as_str().unwrap(), Duration::from_secs(60)).await;
    assert_eq!(running["state"], "running", "the node took the next deploy: {running}");
    assert_eq!(running["commit"], json!(head), "{running}");

    // An abbreviated commit is stored in full.
    let dep = deploy(server, &good, &head[..7]).await;
    let running = settle_within(&cluster, &dep, Duration::from_secs(60)).await;
    assert_eq!(running["state"], "running", "{running}");
    assert_eq!(running["commit"], json!(head), "{running}");
    for app in [&typo, &good] {
        server.call(Method::DELETE, &format!("/api/apps/{app}"), None).await.unwrap();
    }
}

/// Issue 9 item 20. A redeploy of a commit the node built before takes its
/// files from the node's git mirror and builds them while the fetch
/// confirms the commit is still on the branch, pushes while the instance
/// starts, and runs only once pushed. A commit force-pushed off the branch
/// is refused although the mirror still has it, and nothing of it runs.
#[tokio::test]
async fn a_redeploy_builds_from_the_mirror_and_a_commit_off_the_branch_is_refused() {
    let cluster = cluster().await;
    let server = &cluster.server;
    let app = unique_name("mirror");
    let first = cluster.git.commit(&app, &[("Dockerfile", DOCKERFILE), ("index.html", "one\n")], "one").unwrap();
    create_app(server, json!({"name": app, "repo_url": cluster.git.url(&app), "port": 8080, "health_timeout_seconds": 30})).await;
    let a = settle(&cluster, &deploy(server, &app, &first).await).await;
    assert_eq!(a["state"], "running", "{a}");
    let second = cluster.git.commit(&app, &[("index.html", "two\n")], "two").unwrap();
    let b = settle(&cluster, &deploy(server, &app, &second).await).await;
    assert_eq!(b["state"], "running", "{b}");

    // The first commit again: from the mirror, confirmed by the fetch.
    let id = deploy(server, &app, &first).await;
    let c = settle(&cluster, &id).await;
    assert_eq!(c["state"], "running", "{c}");
    assert_eq!(c["commit"], json!(first), "{c}");
    let image = c["image"].as_str().unwrap();
    assert!(image.ends_with(&format!("/{app}:{id}")), "its own tag in the cluster registry: {c}");
    let lines = log_lines(server, &id).await;
    let has = |text: &str| lines.iter().any(|(_, line)| line.contains(text));
    assert!(has(&format!("checked out {first} (from this node's mirror")), "{lines:?}");
    assert!(has(&format!("fetched branch main: {first} is on it")), "{lines:?}");
    assert!(has(&format!("pushed {image}")), "{lines:?}");
    let (status, body) = get(&format!("http://{}/", address(&c))).await;
    assert_eq!((status, body.as_str()), (200, "one\n"));

    // A force-push takes the second commit off the branch; the mirror
    // still has it, so its build starts, but the deploy is refused.
    cluster.git.reset_branch(&app, &first).unwrap();
    cluster.git.commit(&app, &[("index.html", "three\n")], "three").unwrap();
    let id = deploy(server, &app, &second).await;
    let d = settle(&cluster, &id).await;
    assert_eq!(d["state"], "failed", "{d}");
    assert!(d["error"].as_str().unwrap().contains(&format!("commit {second} is not on branch main")), "{d}");
    assert!(d["image"].is_null(), "no image was named: {d}");
    let lines = log_lines(server, &id).await;
    assert!(lines.iter().any(|(_, line)| line.contains(&format!("checked out {second} (from this node's mirror"))), "{lines:?}");
    assert!(containers_of(&id).is_empty(), "nothing of it runs");
    let (_, current) = server.call(Method::GET, &format!("/api/deployments/{}", c["id"].as_str().unwrap()), None).await.unwrap();
    assert_eq!(current["state"], "running", "{current}");
    server.call(Method::DELETE, &format!("/api/apps/{app}"), None).await.unwrap();
}

/// Issue 9 item 9 and issue 10 item 9. An app that prints its secret and
/// exits 3 fails quickly with its exit code and last line; the stored lines
/// and the reason hold no secret, and deleting the app deletes its lines.
#[tokio::test]
async fn a_crashing_app_fails_fast_with_its_exit_code_and_leaves_no_secret() {
    let cluster = cluster().await;
    let server = &cluster.server;
    let name = unique_name("crash");
    let dockerfile = "FROM cloudweb-test/busybox:latest\nCMD [\"sh\", \"-c\", \"echo \\\"connecting with $API_SECRET\\\"; exit 3\"]\n";
    cluster.git.commit("crash", &[("Dockerfile", dockerfile)], "crash").unwrap();
    // The default health timeout (60 s): the exit must not wait for it.
    create_app(server, json!({"name": name, "repo_url": cluster.git.url("crash"), "port": 8080})).await;
    let secret = "s3cr3t-Value-9f2c";
    let (status, _) = server.call(Method::PUT, &format!("/api/apps/{name}/env"), Some(json!({"API_SECRET": secret, "DEBUG": "1"}))).await.unwrap();
    assert_eq!(status, 200);
    let (_, body) = server.call(Method::POST, &format!("/api/apps/{name}/deploy"), None).await.unwrap();
    let id = body["id"].as_str().unwrap().to_string();
    wait_for(Duration::from_secs(60), "the image to be built", || async {
        let (_, d) = server.call(Method::GET, &format!("/api/deployments/{id}"), None).await.ok()?;
        (d["state"] != "queued" && d["state"] != "building").then_some(())
    })
    .await
    .unwrap();
    let started = std::time::Instant::now();
    let failed = settle_within(&cluster, &id, Duration::from_secs(30)).await;
    let elapsed = started.elapsed();
    assert_eq!(failed["state"], "failed", "{failed}");
    let error = failed["error"].as_str().unwrap();
    assert!(error.contains("exit code 3"), "{error}");
    assert!(error.contains("connecting with [redacted API_SECRET]"), "the last line, redacted: {error}");
    assert!(!error.contains(secret), "{error}");
    assert!(elapsed < Duration::from_secs(15), "failed {elapsed:?} after the build, not after the health timeout");
    eprintln!("crash: failed {:.1} s after the build ended", elapsed.as_secs_f64());
    let lines = log_lines(server, &id).await;
    assert!(lines.iter().any(|(_, l)| l.contains("connecting with [redacted API_SECRET]")), "{lines:?}");
    assert!(!format!("{lines:?}").contains(secret), "{lines:?}");
    assert!(rows_for(server, "deployment_logs", &id) > 0);

    let (status, _) = server.call(Method::DELETE, &format!("/api/apps/{name}"), None).await.unwrap();
    assert_eq!(status, 204);
    // Late reports (the stop's) are refused for a deleted deployment.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(rows_for(server, "deployment_logs", &id), 0, "log lines go with the app");
    assert_eq!(rows_for(server, "deployment_reports", &id), 0, "reports go with the app");
}

/// Issue 9 item 10. Stopping a replaced busybox httpd (PID 1 ignores
/// SIGTERM, so the stop waits out its 10 s grace) holds up nothing: a
/// rollback issued meanwhile runs while the old container is still being
/// stopped.
#[tokio::test]
async fn a_slow_stop_does_not_hold_up_a_rollback() {
    let cluster = cluster().await;
    let server = &cluster.server;
    let web = unique_name("slow");
    let commit_a = cluster.git.commit("slow", &[("Dockerfile", DOCKERFILE), ("index.html", "A\n")], "A").unwrap();
    create_app(server, json!({"name": web, "repo_url": cluster.git.url("slow"), "port": 8080, "health_timeout_seconds": 10})).await;
    let dep_a = deploy(server, &web, &commit_a).await;
    assert_eq!(settle(&cluster, &dep_a).await["state"], "running");
    let commit_b = cluster.git.commit("slow", &[("index.html", "B\n")], "B").unwrap();
    let dep_b = deploy(server, &web, &commit_b).await;
    assert_eq!(settle(&cluster, &dep_b).await["state"], "running");
    // B superseded A; after the 1 s drain A's stop is queued (the control
    // plane marks the instance stopped), and it takes the agent ~10 s.
    wait_for(Duration::from_secs(20), "A's stop to be queued", || async {
        let (_, a) = server.call(Method::GET, &format!("/api/deployments/{dep_a}"), None).await.ok()?;
        (a["instances"][0]["state"] == "stopped").then_some(())
    })
    .await
    .unwrap();
    // The agent has started the stop (its log says so), and A still runs.
    let stopping = format!("stopping deployment={dep_a}");
    wait_for(Duration::from_secs(30), "the agent to start A's stop", || async { cluster.agent.log_text().contains(&stopping).then_some(()) })
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", cluster.agent.log_text()));
    assert!(!running_containers_of(&dep_a).is_empty(), "A's container is still being stopped");
    let started = std::time::Instant::now();
    let (status, rollback) = server.call(Method::POST, &format!("/api/apps/{web}/rollback"), Some(json!({"deployment_id": dep_a}))).await.unwrap();
    assert_eq!(status, 201, "{rollback}");
    let r = settle(&cluster, rollback["id"].as_str().unwrap()).await;
    let elapsed = started.elapsed();
    assert_eq!(r["state"], "running", "{r}");
    // The order of events is the check: the rollback runs before A's stop
    // has ended (a stop that held it up would have removed A first). How
    // fast it runs is cloudweb-bench's figure.
    let stopped = format!("stopped 1 container(s) of {dep_a}");
    assert!(!cluster.agent.log_text().contains(&stopped), "the rollback waited for A's stop ({elapsed:?})\n{}", cluster.agent.log_text());
    assert!(!running_containers_of(&dep_a).is_empty(), "the rollback ran while A's container was still being stopped ({elapsed:?})");
    eprintln!("slow stop: the rollback ran after {:.1} s", elapsed.as_secs_f64());
    server.call(Method::DELETE, &format!("/api/apps/{web}"), None).await.unwrap();
    // Commands run concurrently, and each is still acked exactly once.
    let path = format!("/api/nodes/{}/commands", cluster.agent.node_id);
    let commands = wait_for(Duration::from_secs(30), "every command to be acked", || async {
        let (_, body) = server.call(Method::GET, &path, None).await.ok()?;
        let commands = body["commands"].as_array()?.clone();
        commands.iter().all(|c| !c["acked_at"].is_null()).then_some(commands)
    })
    .await
    .unwrap();
    assert!(commands.len() >= 5, "{commands:?}");
    assert!(commands.iter().all(|c| c["ack_count"] == 1), "{commands:?}");
}

fn containers_running(marker: &str) -> bool {
    docker::ps(&["--no-trunc", "--format", "{{.Command}}"]).iter().any(|command| command.contains(marker))
}

/// Issue 10 item 2. A build that never ends stops at the app's build
/// timeout; another is cancelled through the API, ends failed within
/// seconds, and its build container is gone.
#[tokio::test]
async fn a_hung_build_times_out_and_a_build_can_be_cancelled() {
    let cluster = cluster().await;
    let server = &cluster.server;
    let slow = unique_name("hung");
    // A marker unique to this run, to find the build's container.
    let seconds = 100_000 + std::process::id() % 50_000;
    let dockerfile = format!("FROM cloudweb-test/busybox:latest\nRUN sleep {seconds}\n");
    cluster.git.commit("hung", &[("Dockerfile", dockerfile.as_str())], "hung").unwrap();
    let (status, answer) = server
        .call(Method::POST, "/api/apps", Some(json!({"name": slow, "repo_url": cluster.git.url("hung"), "port": 8080, "build_timeout_seconds": 7201})))
        .await
        .unwrap();
    assert_eq!(status, 400, "the timeout is capped: {answer}");
    create_app(server, json!({"name": slow, "repo_url": cluster.git.url("hung"), "port": 8080, "build_timeout_seconds": 4})).await;
    let (_, body) = server.call(Method::POST, &format!("/api/apps/{slow}/deploy"), None).await.unwrap();
    let timed_out = settle_within(&cluster, body["id"].as_str().unwrap(), Duration::from_secs(40)).await;
    assert_eq!(timed_out["state"], "failed", "{timed_out}");
    assert!(timed_out["error"].as_str().unwrap().contains("build timeout"), "{timed_out}");
    let marker = format!("sleep {seconds}");
    wait_for(Duration::from_secs(15), "the timed-out build's container to go", || async { (!containers_running(&marker)).then_some(()) })
        .await
        .unwrap();

    // The same app with the default timeout, cancelled while it builds.
    let patient = unique_name("cancel");
    create_app(server, json!({"name": patient, "repo_url": cluster.git.url("hung"), "port": 8080})).await;
    let (_, body) = server.call(Method::POST, &format!("/api/apps/{patient}/deploy"), None).await.unwrap();
    let id = body["id"].as_str().unwrap().to_string();
    wait_for(Duration::from_secs(30), "the build step to run", || async { containers_running(&marker).then_some(()) }).await.unwrap();
    // The hung build holds up no other app's deploy on the node.
    let other = unique_name("beside");
    cluster.git.commit("beside", &[("Dockerfile", DOCKERFILE), ("index.html", "beside\n")], "beside").unwrap();
    create_app(server, json!({"name": other, "repo_url": cluster.git.url("beside"), "port": 8080, "health_timeout_seconds": 10})).await;
    let (_, body) = server.call(Method::POST, &format!("/api/apps/{other}/deploy"), None).await.unwrap();
    let beside = settle_within(&cluster, body["id"].as_str().unwrap(), Duration::from_secs(60)).await;
    assert_eq!(beside["state"], "running", "{beside}");
    let (_, still) = server.call(Method::GET, &format!("/api/deployments/{id}"), None).await.unwrap();
    assert_eq!(still["state"], "building", "{still}");
    let started = std::time::Instant::now();
    let (status, cancelled) = server.call(Method::POST, &format!("/api/deployments/{id}/cancel"), None).await.unwrap();
    assert_eq!(status, 200, "{cancelled}");
    assert_eq!(cancelled["state"], "failed", "{cancelled}");
    assert!(cancelled["error"].as_str().unwrap().contains("cancelled"), "{cancelled}");
    wait_for(Duration::from_secs(10), "the cancelled build's container to go", || async { (!containers_running(&marker)).then_some(()) })
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", cluster.agent.log_text()));
    assert!(started.elapsed() < Duration::from_secs(10));
    eprintln!("cancel: the build container was gone {:.1} s after the cancel", started.elapsed().as_secs_f64());
    let (status, again) = server.call(Method::POST, &format!("/api/deployments/{id}/cancel"), None).await.unwrap();
    assert_eq!(status, 409, "a finished deployment is not cancelled again: {again}");
    let (status, _) = server.call(Method::POST, "/api/deployments/dep_nope/cancel", None).await.unwrap();
    assert_eq!(status, 404);
    for app in [&slow, &patient, &other] {
        server.call(Method::DELETE, &format!("/api/apps/{app}"), None).await.unwrap();
    }
}

#[tokio::test]
async fn a_build_cannot_reach_the_nodes_own_services() {
    // A service of the node, listening on every address (as a database or
    // an admin panel might): a build step must not read it.
    let listener = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let mut stream = stream;
            let _ = std::io::Write::write_all(&mut stream, b"HTTP/1.0 200 OK\r\ncontent-length: 7\r\n\r\nsecret\n");
        }
    });
    let cluster = cluster().await;
    let name = unique_name("probe");
    // The build step tries the host through its network's gateway and
    // writes what it got into the image.
    let dockerfile = format!(
        "FROM cloudweb-test/busybox:latest\nRUN mkdir -p /www && gw=$(ip route | awk '/default/ {{print $3}}') && \
         ((echo | nc -w 3 $gw {port} > /tmp/answer && grep -q secret /tmp/answer && echo reached > /www/probe.txt) || echo blocked > /www/probe.txt)\n\
         CMD [\"httpd\", \"-f\", \"-p\", \"8080\", \"-h\", \"/www\"]\n"
    );
    let commit = cluster.git.commit(&name, &[("Dockerfile", &dockerfile)], "probe").unwrap();
    create_app(&cluster.server, json!({"name": name, "repo_url": cluster.git.url(&name), "port": 8080, "health_timeout_seconds": 10})).await;
    let id = deploy(&cluster.server, &name, &commit).await;
    let deployment = settle(&cluster, &id).await;
    assert_eq!(deployment["state"], "running", "{deployment}\n{}", cluster.agent.log_text());
    let (status, body) = get(&format!("http://{}/probe.txt", address(&deployment))).await;
    assert_eq!((status, body.as_str()), (200, "blocked\n"), "the build reached the node's service");
}

/// Ids of this node's build step containers, running or not.
fn builders(node_id: &str) -> Vec<String> {
    docker::ps(&["-aq", "--no-trunc", "--filter", &format!("label=cloudweb.node={node_id}"), "--filter", "label=cloudweb.role=builder"])
}

#[tokio::test]
async fn a_build_cut_off_by_kill_9_leaves_no_second_builder() {
    let mut cluster = cluster().await;
    let name = unique_name("slow");
    cluster.git.commit(&name, &[("index.html", "<h1>slow</h1>\n")], "slow").unwrap();
    let build = "sleep 8 && mkdir -p dist && cp index.html dist/";
    create_app(
        &cluster.server,
        json!({"name": name, "repo_url": cluster.git.url(&name), "port": 8080, "health_timeout_seconds": 10,
               "build": {"build_cmd": build, "output_dir": "dist"}}),
    )
    .await;
    let (status, body) = cluster.server.call(Method::POST, &format!("/api/apps/{name}/deploy"), None).await.unwrap();
    assert_eq!(status, 201, "{body}");
    let id = body["id"].as_str().unwrap().to_string();
    let node_id = cluster.agent.node_id.clone();
    let first = wait_for(Duration::from_secs(60), "the builder to run", || async {
        let found = builders(&node_id);
        (found.len() == 1).then(|| found[0].clone())
    })
    .await
    .unwrap();

    // kill -9 of the agent alone, mid-build; the builder container is the
    // Docker daemon's and would run on.
    let agent = cluster.agent.process.as_mut().unwrap();
    agent.signal("KILL");
    assert!(agent.wait_exit(Duration::from_secs(5)).await.is_some());
    cluster.agent.start(&AGENT_FLAGS).unwrap();
    // The restarted agent removes the leftover before the redelivered
    // deploy starts its own builder: never two at once.
    let deployment = wait_for(Duration::from_secs(90), "the redelivered deploy to settle", || async {
        let found = builders(&node_id);
        assert!(found.len() <= 1, "two builders at once: {found:?}");
        let (_, d) = cluster.server.call(Method::GET, &format!("/api/deployments/{id}"), None).await.ok()?;
        matches!(d["state"].as_str(), Some("running" | "failed")).then_some(d)
    })
    .await
    .unwrap();
    assert_eq!(deployment["state"], "running", "{deployment}\n{}", cluster.agent.log_text());
    assert!(!builders(&node_id).contains(&first), "the cut-off builder was removed");
    assert!(cluster.agent.log_text().contains("removed builder containers left by an earlier agent"), "{}", cluster.agent.log_text());
}
