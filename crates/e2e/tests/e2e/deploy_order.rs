//! The newest requested deployment wins, and a deployment runs the commit
//! it names: the real control plane, agent and Docker, with builds made
//! slow on purpose (a `RUN sleep` after the page is copied, so the layer
//! cache never skips it) to order the races by hand.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use cloudweb_e2e::{docker, free_port, unique_name, wait_for, AgentNode, GitServer, ServerProcess};
use reqwest::Method;
use serde_json::{json, Value};

const SLOW: &str = "FROM cloudweb-test/busybox:latest\nCOPY index.html /www/index.html\nRUN sleep 6\nCMD [\"httpd\", \"-f\", \"-p\", \"8080\", \"-h\", \"/www\"]\n";
const FAST: &str = "FROM cloudweb-test/busybox:latest\nCOPY index.html /www/index.html\nCMD [\"httpd\", \"-f\", \"-p\", \"8080\", \"-h\", \"/www\"]\n";
const AGENT_FLAGS: [&str; 6] = ["--heartbeat-interval-seconds", "1", "--publish-ip", "127.0.0.1", "--advertise-host", "127.0.0.1"];

struct Cluster {
    _tmp: tempfile::TempDir,
    dir: std::path::PathBuf,
    ports: (u16, u16),
    server: ServerProcess,
    agent: AgentNode,
    git: GitServer,
}

async fn cluster() -> Cluster {
    cloudweb_e2e::ensure_images().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().to_path_buf();
    let git = GitServer::start(&dir.join("git")).unwrap();
    let ports = (free_port(), free_port());
    let server = start_server(&dir, ports).await;
    let (token, ca) = server.join_token().await.unwrap();
    let mut agent = AgentNode::join(&server, &dir.join("node"), "node", &token, &ca, &[]).unwrap().unwrap();
    agent.start(&AGENT_FLAGS).unwrap();
    let node = agent.node_id.clone();
    wait_for(Duration::from_secs(20), "the node to be ready", || async { (server.node(&node).await.ok()?["state"] == "ready").then_some(()) })
        .await
        .unwrap();
    Cluster { _tmp: tmp, dir, ports, server, agent, git }
}

async fn start_server(dir: &Path, (agent, api): (u16, u16)) -> ServerProcess {
    ServerProcess::start_on(dir, agent, api, &["--drain-seconds", "1", "--allow-private-git-hosts"]).await.unwrap()
}

impl Cluster {
    async fn app(&self, name: &str) {
        let (status, body) = self
            .server
            .call(Method::POST, "/api/apps", Some(json!({"name": name, "repo_url": self.git.url(name), "port": 8080, "health_timeout_seconds": 20})))
            .await
            .unwrap();
        assert_eq!(status, 201, "{body}");
    }

    async fn deploy(&self, app: &str, body: Value) -> String {
        let (status, answer) = self.server.call(Method::POST, &format!("/api/apps/{app}/deploy"), Some(body)).await.unwrap();
        assert_eq!(status, 201, "{answer}");
        answer["id"].as_str().unwrap().to_string()
    }

    async fn deployment(&self, id: &str) -> Value {
        let (status, body) = self.server.call(Method::GET, &format!("/api/deployments/{id}"), None).await.unwrap();
        assert_eq!(status, 200, "{body}");
        body
    }

    /// Waits until the deployment is in `state`; panics with both logs, at
    /// once when it ends in another state.
    async fn reaches(&self, id: &str, state: &str, within: Duration) -> Value {
        let waited = wait_for(within, &format!("{id} to be {state}"), || async {
            let (_, d) = self.server.call(Method::GET, &format!("/api/deployments/{id}"), None).await.ok()?;
            let ended = matches!(d["state"].as_str(), Some("failed" | "superseded"));
            (d["state"] == state || ended).then_some(d)
        })
        .await;
        match waited {
            Ok(d) if d["state"] == state => d,
            outcome => panic!("{id} did not become {state}: {outcome:?}\nserver log:\n{}\nagent log:\n{}", self.server.process.log_text(), self.agent.log_text()),
        }
    }

    /// The page the app's running instance serves.
    async fn served(&self, deployment: &Value) -> String {
        let address = deployment["instances"][0]["address"].as_str().unwrap_or_else(|| panic!("no address: {deployment}"));
        reqwest::get(format!("http://{address}/")).await.unwrap().text().await.unwrap()
    }
}

fn running_containers(app: &str) -> Vec<String> {
    docker::ps(&["--filter", &format!("label=cloudweb.app={app}"), "--format", "{{.Names}} {{.Label \"cloudweb.deployment\"}}"])
}

/// The commit label of the image a running container of `app` runs.
fn image_commit(app: &str) -> String {
    let container = docker::ps(&["-q", "--filter", &format!("label=cloudweb.app={app}")]).remove(0);
    let image = docker::docker(&["inspect", "--format", "{{.Image}}", &container]).remove(0);
    docker::docker(&["image", "inspect", "--format", "{{index .Config.Labels \"cloudweb.commit\"}}", &image]).remove(0)
}

#[tokio::test]
async fn a_newer_request_supersedes_an_older_build_at_once() {
    let c = cluster().await;
    let app = unique_name("order-a");
    let slow = c.git.commit(&app, &[("Dockerfile", SLOW), ("index.html", "slow A\n")], "A").unwrap();
    c.app(&app).await;
    let a = c.deploy(&app, json!({"commit": slow})).await;
    c.reaches(&a, "building", Duration::from_secs(30)).await;
    let fast = c.git.commit(&app, &[("Dockerfile", FAST), ("index.html", "fast B\n")], "B").unwrap();
    let b = c.deploy(&app, json!({"commit": fast})).await;
    // A is superseded by the request itself, not when B runs.
    let a_now = c.deployment(&a).await;
    assert_eq!(a_now["state"], "superseded", "{a_now}");
    assert!(a_now["error"].as_str().unwrap_or_default().contains(&b), "the reason names the newer deployment: {a_now}");
    let b_running = c.reaches(&b, "running", Duration::from_secs(60)).await;
    assert_eq!(c.served(&b_running).await, "fast B\n");
    assert_eq!(b_running["commit"], fast.as_str());
    // A's build was abandoned: nothing of A starts later, B keeps serving.
    tokio::time::sleep(Duration::from_secs(8)).await;
    assert_eq!(c.deployment(&a).await["state"], "superseded");
    assert_eq!(c.deployment(&b).await["state"], "running");
    let containers = running_containers(&app);
    assert_eq!(containers.len(), 1, "{containers:?}");
    assert!(containers[0].ends_with(&b), "{containers:?}");
    assert_eq!(image_commit(&app), fast);
}

#[tokio::test]
async fn an_older_deployment_that_finishes_last_does_not_take_the_traffic() {
    let c = cluster().await;
    let app = unique_name("order-b");
    let slow = c.git.commit(&app, &[("Dockerfile", SLOW), ("index.html", "slow A\n")], "A").unwrap();
    c.app(&app).await;
    let a = c.deploy(&app, json!({"commit": slow})).await;
    c.reaches(&a, "building", Duration::from_secs(30)).await;
    let fast = c.git.commit(&app, &[("Dockerfile", FAST), ("index.html", "fast B\n")], "B").unwrap();
    // Both go on: B is asked for while A builds, and keeps A in flight.
    let b = c.deploy(&app, json!({"commit": fast, "keep_in_flight": true})).await;
    let b_running = c.reaches(&b, "running", Duration::from_secs(60)).await;
    assert_eq!(c.served(&b_running).await, "fast B\n");
    // A finishes its build and becomes healthy after B: it must not replace B.
    let a_end = c.reaches(&a, "superseded", Duration::from_secs(90)).await;
    assert!(a_end["error"].as_str().unwrap_or_default().contains("newer deployment"), "{a_end}");
    let timeline: Vec<&str> = a_end["timeline"].as_array().unwrap().iter().filter_map(|e| e["state"].as_str()).collect();
    assert!(timeline.contains(&"deploying") && !timeline.contains(&"running"), "A got as far as starting, never running: {timeline:?}");
    let b_now = c.deployment(&b).await;
    assert_eq!(b_now["state"], "running", "{b_now}");
    assert_eq!(c.served(&b_now).await, "fast B\n", "the served content stays B's");
    let one = wait_for(Duration::from_secs(30), "only B's container", || async {
        let containers = running_containers(&app);
        (containers.len() == 1 && containers[0].ends_with(&b)).then_some(())
    })
    .await;
    one.unwrap_or_else(|e| panic!("{e}: {:?}", running_containers(&app)));
    assert_eq!(image_commit(&app), fast);
}

#[tokio::test]
async fn a_retried_deploy_builds_the_commit_its_first_try_resolved() {
    let mut c = cluster().await;
    let app = unique_name("order-pin");
    let first = c.git.commit(&app, &[("Dockerfile", SLOW), ("index.html", "first\n")], "first").unwrap();
    c.app(&app).await;
    // From the branch head: the agent resolves it to `first`.
    let id = c.deploy(&app, json!({})).await;
    let resolved = wait_for(Duration::from_secs(30), "the commit to be recorded", || async {
        let (_, d) = c.server.call(Method::GET, &format!("/api/deployments/{id}"), None).await.ok()?;
        d["commit"].as_str().map(str::to_string)
    })
    .await
    .unwrap();
    assert_eq!(resolved, first);
    // The control plane goes away while the build runs; a push moves the
    // branch meanwhile. The agent cannot report the built image, so the
    // deploy is tried again once the control plane is back.
    let pid = c.server.process.pid();
    assert!(Command::new("kill").args(["-KILL", &pid.to_string()]).status().unwrap().success());
    let second = c.git.commit(&app, &[("Dockerfile", FAST), ("index.html", "second\n")], "second").unwrap();
    wait_for(Duration::from_secs(60), "the agent to give the deploy up for a retry", || async {
        c.agent.log_text().contains("command will be retried").then_some(())
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\nagent log:\n{}", c.agent.log_text()));
    c.server = start_server(&c.dir, c.ports).await;
    let running = c.reaches(&id, "running", Duration::from_secs(90)).await;
    assert_eq!(running["commit"], first.as_str(), "the deployment names the first commit: {running}");
    assert_eq!(c.served(&running).await, "first\n", "and serves it, not {second}");
    assert_eq!(image_commit(&app), first, "its image was built from it");
    // The deployment's own log says the retry built the pinned commit.
    let response = c
        .server
        .http
        .get(c.server.api(&format!("/api/deployments/{id}/logs")))
        .bearer_auth(&c.server.admin_token)
        .timeout(Duration::from_secs(30))
        .send()
        .await
        .unwrap();
    let log = response.text().await.unwrap();
    assert!(log.contains(&format!("building commit {first}, which an earlier try of this deployment resolved")), "{log}");
}

/// Issue 21 item 16. A stop command queued by hand for a running
/// deployment: once the agent acks it and the container is gone, the
/// deployment no longer shows as running, nor its instance.
#[tokio::test]
async fn a_stop_command_queued_by_hand_ends_the_running_deployment_it_stopped() {
    let c = cluster().await;
    let app = unique_name("stopped");
    c.app(&app).await;
    let commit = c.git.commit(&app, &[("Dockerfile", FAST), ("index.html", "stop me\n")], "A").unwrap();
    let id = c.deploy(&app, json!({"commit": commit})).await;
    c.reaches(&id, "running", Duration::from_secs(90)).await;
    let node = c.agent.node_id.clone();
    let (status, body) = c
        .server
        .call(Method::POST, &format!("/api/nodes/{node}/commands"), Some(json!({"type": "stop", "payload": {"deployment_id": id, "reason": "by hand"}})))
        .await
        .unwrap();
    assert_eq!(status, 201, "{body}");
    let ended = wait_for(Duration::from_secs(30), "the deployment to follow the stop", || async {
        let d = c.deployment(&id).await;
        (d["state"] != "running").then_some(d)
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\nserver log:\n{}", c.server.process.log_text()));
    assert_eq!(ended["state"], "failed", "{ended}");
    assert!(ended["error"].as_str().unwrap_or_default().contains("stopped by a stop command (by hand)"), "{ended}");
    assert_eq!(ended["instances"][0]["state"], "stopped", "{ended}");
    assert!(running_containers(&app).is_empty(), "{:?}", running_containers(&app));
    c.server.call(Method::DELETE, &format!("/api/apps/{app}"), None).await.unwrap();
}
