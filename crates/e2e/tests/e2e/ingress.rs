//! The ingress end to end: the real agent runs real Caddy from the control
//! plane's route table, in front of apps deployed through Docker and the
//! registry.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cloudweb_e2e::{docker, start_platform, Platform, caddy_bin, free_port, process_alive, unique_name, wait_for, AgentNode, GitServer, ServerProcess};
use reqwest::Method;
use serde_json::{json, Value};

const DOCKERFILE: &str = "FROM cloudweb-test/busybox:latest\nCOPY index.html /www/index.html\nCOPY stream /www/cgi-bin/stream\n\
RUN chmod 755 /www/cgi-bin/stream\nCMD [\"httpd\", \"-f\", \"-p\", \"8080\", \"-h\", \"/www\"]\n";
/// A server-sent event every 200 ms for a minute, from a CGI script.
const STREAM: &str = "#!/bin/sh\necho 'Content-Type: text/event-stream'\necho ''\ni=0\nwhile [ $i -lt 300 ]; do echo \"data: tick $i\"; echo ''; i=$((i+1)); sleep 0.2; done\n";

struct Cluster {
    _tmp: tempfile::TempDir,
    server: ServerProcess,
    agent: AgentNode,
    git: GitServer,
    https_port: u16,
    http_port: u16,
    agent_args: Vec<String>,
}

async fn cluster() -> Cluster {
    let caddy = caddy_bin().display().to_string();
    cluster_with(&["--caddy-bin", &caddy]).await
}

/// A cluster whose ingress runs Caddy as `launch` says.
async fn cluster_with(launch: &[&str]) -> Cluster {
    let Platform { tmp, git, server } = start_platform(&["--base-domain", "test", "--heartbeat-flush-seconds", "1"]).await.unwrap();
    let (token, ca) = server.join_token().await.unwrap();
    let mut agent = AgentNode::join(&server, &tmp.path().join("edge"), "edge", &token, &ca, &["--ingress"]).unwrap().unwrap();
    let (http_port, https_port) = (free_port(), free_port());
    let (http, https) = (http_port.to_string(), https_port.to_string());
    let mut args = vec![
        "--heartbeat-interval-seconds", "1", "--metrics-interval-seconds", "2",
        "--publish-ip", "127.0.0.1", "--advertise-host", "127.0.0.1",
        "--http-port", &http, "--https-port", &https,
    ];
    args.extend_from_slice(launch);
    agent.start(&args).unwrap();
    let node_id = agent.node_id.clone();
    // Caddy's first start (a container's, on a loaded machine, can take
    // past the agent's own 10 s wait and its retry): generous.
    wait_for(Duration::from_secs(60), "the ingress to run", || async {
        let node = server.node(&node_id).await.ok()?;
        node["features"].as_array()?.contains(&json!("traffic-metrics")).then_some(())
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.log_text()));
    Cluster { _tmp: tmp, server, agent, git, https_port, http_port, agent_args: args.iter().map(|a| a.to_string()).collect() }
}

impl Cluster {
    /// Creates an app from a fresh repository and deploys its first commit.
    async fn app(&self, name: &str, body: &str, domains: &[&str]) -> Value {
        self.git.commit(name, &[("Dockerfile", DOCKERFILE), ("index.html", body), ("stream", STREAM)], "first").unwrap();
        let (status, app) = self
            .server
            .call(Method::POST, "/api/apps", Some(json!({"name": name, "repo_url": self.git.url(name), "port": 8080, "domains": domains, "health_timeout_seconds": 10})))
            .await
            .unwrap();
        assert_eq!(status, 201, "{app}");
        self.deploy(name).await
    }

    async fn deploy(&self, name: &str) -> Value {
        let (status, body) = self.server.call(Method::POST, &format!("/api/apps/{name}/deploy"), None).await.unwrap();
        assert_eq!(status, 201, "{body}");
        let id = body["id"].as_str().unwrap().to_string();
        let deployment = wait_for(Duration::from_secs(120), "the deployment to settle", || async {
            let (_, d) = self.server.call(Method::GET, &format!("/api/deployments/{id}"), None).await.ok()?;
            matches!(d["state"].as_str(), Some("running" | "failed")).then_some(d)
        })
        .await
        .unwrap();
        assert_eq!(deployment["state"], "running", "{deployment}\n{}", self.agent.log_text());
        self.routes_applied().await;
        deployment
    }

    /// Waits until the ingress serves the control plane's current table.
    async fn routes_applied(&self) {
        wait_for(Duration::from_secs(20), "the ingress to apply the route table", || async {
            let (_, routes) = self.server.call(Method::GET, "/api/routes", None).await.ok()?;
            let version = routes["version"].as_u64()?;
            let applied = routes["ingress"][0]["status"]["routes_version"].as_u64()?;
            (applied >= version).then_some(())
        })
        .await
        .unwrap();
    }

    /// A client that trusts Caddy's internal CA and resolves every test host
    /// to loopback.
    fn client(&self, hosts: &[&str]) -> reqwest::Client {
        self.client_builder(hosts).build().unwrap()
    }

    fn client_builder(&self, hosts: &[&str]) -> reqwest::ClientBuilder {
        let root = std::fs::read(self.agent.dir.join("caddy/data/caddy/pki/authorities/local/root.crt")).unwrap();
        let mut builder = reqwest::Client::builder()
            .add_root_certificate(reqwest::Certificate::from_pem(&root).unwrap())
            .redirect(reqwest::redirect::Policy::none())
            .timeout(Duration::from_secs(10));
        for host in hosts {
            builder = builder.resolve(host, "127.0.0.1:0".parse().unwrap());
        }
        builder
    }

    fn https(&self, host: &str, path: &str) -> String {
        format!("https://{host}:{}{path}", self.https_port)
    }
}

#[tokio::test]
async fn apps_answer_through_caddy_and_their_traffic_is_counted() {
    let cluster = cluster().await;
    let name = unique_name("shop");
    let other = unique_name("blog");
    let host = format!("{name}.test");
    let custom = format!("{name}-custom.test");
    let other_host = format!("{other}.test");
    cluster.app(&name, "shop home\n", &[&custom]).await;
    let blog = cluster.app(&other, "blog home\n", &[]).await;
    let client = cluster.client(&[&host, &custom, &other_host, "nobody.test"]);

    // Default and custom host over HTTPS (internal issuer), and redirects.
    for url in [cluster.https(&host, "/"), cluster.https(&custom, "/")] {
        let response = client.get(&url).send().await.unwrap_or_else(|e| panic!("{url}: {e:?}\n{}", cluster.agent.log_text()));
        assert_eq!(response.status(), 200, "{url}");
        assert_eq!(response.text().await.unwrap(), "shop home\n");
    }
    let redirect = client.get(format!("http://{host}:{}/a/b?c=1", cluster.http_port)).send().await.unwrap();
    assert_eq!(redirect.status(), 308);
    assert_eq!(redirect.headers()["location"], cluster.https(&host, "/a/b?c=1").as_str());
    // An unknown host: 404 from the ingress, and never counted.
    let unknown = client.get(format!("http://nobody.test:{}/", cluster.http_port)).send().await.unwrap();
    assert_eq!(unknown.status(), 404);

    // On the default host, exactly: 1 + 5 answers of 2xx, 1 redirect
    // (above) and 3 404s from the app.
    for _ in 0..5 {
        assert_eq!(client.get(cluster.https(&host, "/")).send().await.unwrap().status(), 200);
    }
    for _ in 0..3 {
        assert_eq!(client.get(cluster.https(&host, "/secret-path?token=abc")).send().await.unwrap().status(), 404);
    }

    // Collect what the agent sends until the counts are in.
    let node_id = cluster.agent.node_id.clone();
    let bodies = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let totals = wait_for(Duration::from_secs(20), "the traffic to be reported", || {
        let server = &cluster.server;
        let node_id = node_id.clone();
        let bodies = bodies.clone();
        let host = host.clone();
        async move {
            let response = server.http.get(server.api(&format!("/api/nodes/{node_id}/last-heartbeat"))).bearer_auth(&server.admin_token).send().await.ok()?;
            let raw = response.text().await.ok()?;
            {
                let mut seen = bodies.lock().unwrap();
                if raw.contains("\"traffic\"") && !seen.contains(&raw) {
                    seen.push(raw);
                }
            }
            let (_, series) = server.call(Method::GET, &format!("/api/traffic/{host}"), None).await.ok()?;
            let samples = series["samples"].as_array()?;
            let sum = |key: &str| samples.iter().map(|s| s[key].as_i64().unwrap_or(0)).sum::<i64>();
            (sum("requests") >= 10).then(|| (sum("requests"), sum("r2xx"), sum("r3xx"), sum("r4xx"), sum("r5xx")))
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\nagent log:\n{}", cluster.agent.log_text()));
    assert_eq!(totals, (10, 6, 1, 3, 0), "requests, 2xx, 3xx, 4xx, 5xx for the default host");
    let (_, custom_series) = cluster.server.call(Method::GET, &format!("/api/traffic/{custom}"), None).await.unwrap();
    let custom_requests: i64 = custom_series["samples"].as_array().unwrap().iter().map(|s| s["requests"].as_i64().unwrap()).sum();
    assert_eq!(custom_requests, 1);
    let (_, nobody) = cluster.server.call(Method::GET, "/api/traffic/nobody.test", None).await.unwrap();
    assert_eq!(nobody["samples"], json!([]), "an unknown host is never a series");
    let bodies = bodies.lock().unwrap().clone();
    assert!(!bodies.is_empty());
    for raw in &bodies {
        let parsed: Value = serde_json::from_str(raw).unwrap();
        for entry in parsed["metrics"]["traffic"].as_array().unwrap() {
            let keys: Vec<&String> = entry.as_object().unwrap().keys().collect();
            assert_eq!(keys, ["dur_sum_ms", "host", "r2xx", "r3xx", "r4xx", "r5xx", "requests", "slow"]);
        }
        for forbidden in ["secret-path", "token=abc", "127.0.0.1", "nobody.test", "remote", "uri", "headers"] {
            assert!(!raw.contains(forbidden), "the raw heartbeat contains {forbidden:?}: {raw}");
        }
    }

    // A broken upstream list for one app does not take down another.
    let blog_container = blog["instances"][0]["container"].as_str().unwrap();
    let removed = std::process::Command::new("docker").args(["rm", "-f", blog_container]).output().unwrap();
    assert!(removed.status.success());
    let broken = client.get(cluster.https(&other_host, "/")).send().await.unwrap();
    assert_eq!(broken.status(), 502);
    assert_eq!(client.get(cluster.https(&host, "/")).send().await.unwrap().status(), 200);

    // A domain added later is served as soon as the ingress applies it.
    let added = format!("{name}-added.test");
    let (status, body) = cluster.server.call(Method::PUT, &format!("/api/apps/{name}/domains"), Some(json!([custom, added]))).await.unwrap();
    assert_eq!(status, 200, "{body}");
    let (status, _) = cluster.server.call(Method::PUT, &format!("/api/apps/{name}/domains"), Some(json!(["not a host"]))).await.unwrap();
    assert_eq!(status, 400);
    cluster.routes_applied().await;
    let client = cluster.client(&[&added]);
    assert_eq!(client.get(cluster.https(&added, "/")).send().await.unwrap().text().await.unwrap(), "shop home\n");
}

#[tokio::test]
async fn three_blue_green_switches_under_load_fail_no_request() {
    let cluster = cluster().await;
    let name = unique_name("steady");
    let host = format!("{name}.test");
    let first = cluster.app(&name, "v0\n", &[]).await;
    let client = cluster.client(&[&host]);
    let url = cluster.https(&host, "/");
    // Half the load over HTTP/2, half over HTTP/1.1 keep-alive connections:
    // the latter lose a request whenever Caddy closes an idle connection
    // under them, so a switch must not reload Caddy.
    let http1 = cluster.client_builder(&[&host]).http1_only().pool_idle_timeout(Duration::from_secs(60)).build().unwrap();
    assert_eq!(client.get(&url).send().await.unwrap().version(), reqwest::Version::HTTP_2);
    assert_eq!(http1.get(&url).send().await.unwrap().version(), reqwest::Version::HTTP_11);
    let reloads_before = cluster.agent.log_text().matches("reloaded=true").count();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let ok = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let failures = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let mut workers = Vec::new();
    for worker in 0..4 {
        let client = if worker % 2 == 0 { client.clone() } else { http1.clone() };
        let (url, stop, ok, failed, failures) = (url.clone(), stop.clone(), ok.clone(), failed.clone(), failures.clone());
        workers.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                match client.get(&url).send().await {
                    // A 200 counts only with its whole body, one of the versions.
                    Ok(response) if response.status() == 200 => match response.text().await {
                        Ok(body) if ["v0\n", "v1\n", "v2\n", "v3\n"].contains(&body.as_str()) => {
                            ok.fetch_add(1, Ordering::Relaxed);
                        }
                        Ok(body) => {
                            failed.fetch_add(1, Ordering::Relaxed);
                            failures.lock().unwrap().push(format!("200 with body {body:?}"));
                        }
                        Err(err) => {
                            failed.fetch_add(1, Ordering::Relaxed);
                            failures.lock().unwrap().push(format!("200 whose body failed: {err:?}"));
                        }
                    },
                    Ok(response) => {
                        failed.fetch_add(1, Ordering::Relaxed);
                        failures.lock().unwrap().push(format!("status {}", response.status()));
                    }
                    Err(err) => {
                        failed.fetch_add(1, Ordering::Relaxed);
                        failures.lock().unwrap().push(format!("{err:?}"));
                    }
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }));
    }
    let started = Instant::now();
    let mut previous = first["id"].as_str().unwrap().to_string();
    for version in 1..=3 {
        let before = ok.load(Ordering::Relaxed);
        cluster.git.commit(&name, &[("index.html", &format!("v{version}\n"))], "next").unwrap();
        let deployment = cluster.deploy(&name).await;
        // The old instance really stops under load: wait until its
        // container no longer runs (after the drain and the stop's grace).
        wait_for(Duration::from_secs(60), "the replaced instance's container to stop", || async {
            docker::ps(&["-q", "--filter", &format!("label=cloudweb.deployment={previous}")]).is_empty().then_some(())
        })
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", cluster.agent.log_text()));
        // Requests kept flowing through the whole switch.
        let during = ok.load(Ordering::Relaxed) - before;
        assert!(during >= 20, "only {during} requests succeeded during switch {version}: the load stalled");
        previous = deployment["id"].as_str().unwrap().to_string();
    }
    stop.store(true, Ordering::Relaxed);
    for worker in workers {
        worker.await.unwrap();
    }
    let elapsed = started.elapsed().as_secs_f64();
    let (ok, failed) = (ok.load(Ordering::Relaxed), failed.load(Ordering::Relaxed));
    let rate = (ok + failed) as f64 / elapsed;
    assert_eq!(failed, 0, "{failed} failed of {}: {:?}", ok + failed, failures.lock().unwrap());
    // Only a floor that shows the load ran (each switch's own count is
    // checked above); the request rate itself is cloudweb-bench's figure.
    assert!(rate >= 5.0, "{rate:.0} req/s: the load barely ran");
    assert_eq!(client.get(&url).send().await.unwrap().text().await.unwrap(), "v3\n");
    let log = cluster.agent.log_text();
    assert_eq!(log.matches("reloaded=true").count(), reloads_before, "a switch changes upstreams only, never Caddy's configuration");
    assert!(log.matches("reloaded=false").count() >= 3, "every switch went through the directory");
    eprintln!("{ok} requests at {rate:.0} req/s over three switches, none failed");
}

#[tokio::test]
async fn an_open_stream_survives_an_unrelated_route_change() {
    let cluster = cluster().await;
    let name = unique_name("live");
    let host = format!("{name}.test");
    cluster.app(&name, "live\n", &[]).await;
    let client = cluster.client(&[&host]);
    let mut stream = client
        .get(cluster.https(&host, "/cgi-bin/stream"))
        .timeout(Duration::from_secs(120))
        .send()
        .await
        .unwrap();
    assert_eq!(stream.status(), 200);
    let first = tokio::time::timeout(Duration::from_secs(5), stream.chunk()).await.unwrap().unwrap().unwrap();
    assert!(String::from_utf8_lossy(&first).contains("tick"));

    // Another app appears: the route table changes and Caddy reloads.
    let (_, before) = cluster.server.call(Method::GET, "/api/routes", None).await.unwrap();
    cluster.app(&unique_name("other"), "other\n", &[]).await;
    let (_, after) = cluster.server.call(Method::GET, "/api/routes", None).await.unwrap();
    assert!(after["version"].as_u64() > before["version"].as_u64(), "the table changed");
    assert!(cluster.agent.log_text().matches("reloaded=true").count() >= 2, "caddy reloaded");

    // The stream still delivers new events after the reload.
    let mut seen = String::new();
    let deadline = Instant::now() + Duration::from_secs(3);
    while Instant::now() < deadline {
        let chunk = tokio::time::timeout(Duration::from_secs(3), stream.chunk()).await.expect("the stream goes on").unwrap().expect("still open");
        seen.push_str(&String::from_utf8_lossy(&chunk));
    }
    assert!(seen.matches("tick").count() >= 5, "{seen}");
}

/// `docker inspect` of one field of a container.
fn inspect(container: &str, format: &str) -> String {
    let output = std::process::Command::new("docker").args(["inspect", "--format", format, container]).output().unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8_lossy(&output.stdout).trim().to_string()
}

#[tokio::test]
async fn caddy_in_a_container_serves_and_is_adopted_after_an_agent_restart() {
    let mut cluster = cluster_with(&["--caddy-image", "cloudweb/caddy:latest"]).await;
    let name = unique_name("boxed");
    let host = format!("{name}.test");
    cluster.app(&name, "boxed\n", &[]).await;
    let client = cluster.client(&[&host]);
    let response = client.get(cluster.https(&host, "/")).send().await.unwrap();
    assert_eq!(response.text().await.unwrap(), "boxed\n");
    let redirect = client.get(format!("http://{host}:{}/x", cluster.http_port)).send().await.unwrap();
    assert_eq!(redirect.status(), 308);

    // Caddy runs in its own container on the host network, labelled as this
    // node's ingress, and no Caddy process is the agent's child.
    let short: String = cluster.agent.node_id.chars().filter(char::is_ascii_alphanumeric).take(24).collect();
    let container = format!("cloudweb-caddy-{short}");
    assert_eq!(inspect(&container, "{{.HostConfig.NetworkMode}}"), "host");
    assert_eq!(inspect(&container, "{{index .Config.Labels \"cloudweb.role\"}}"), "ingress");
    let started = inspect(&container, "{{.State.StartedAt}}");

    // The agent restarts: the container keeps running, is adopted, and its
    // configuration is still right, so nothing is reloaded.
    cluster.agent.kill();
    assert_eq!(inspect(&container, "{{.State.Running}}"), "true", "caddy outlives the agent");
    let args: Vec<&str> = cluster.agent_args.iter().map(String::as_str).collect();
    cluster.agent.start(&args).unwrap();
    wait_for(Duration::from_secs(20), "the restarted agent to adopt caddy", || async {
        cluster.agent.log_text().contains("route table applied").then_some(())
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", cluster.agent.log_text()));
    let log = cluster.agent.log_text();
    assert!(log.contains("adopted=true"), "{log}");
    assert!(!log.contains("reloaded=true"), "an adopted caddy with the same routes is not reloaded: {log}");
    assert_eq!(inspect(&container, "{{.State.StartedAt}}"), started, "the same container, never restarted");
    assert_eq!(client.get(cluster.https(&host, "/")).send().await.unwrap().text().await.unwrap(), "boxed\n");

    // And a blue/green switch after the restart goes through the directory.
    cluster.git.commit(&name, &[("index.html", "boxed 2\n")], "next").unwrap();
    cluster.deploy(&name).await;
    assert_eq!(client.get(cluster.https(&host, "/")).send().await.unwrap().text().await.unwrap(), "boxed 2\n");

    // The node leaves: its ingress container goes with it.
    cluster.agent.kill();
    let args = vec!["--data-dir".to_string(), cluster.agent.dir.display().to_string(), "leave".into(), "--force".into()];
    let left = cloudweb_e2e::run_agent_command(&args).unwrap();
    assert!(left.success, "{}", left.output);
    let gone = std::process::Command::new("docker").args(["inspect", &container]).output().unwrap();
    assert!(!gone.status.success(), "the ingress container was removed");
}

impl Cluster {
    /// The pid of the Caddy the agent runs as a child, from its pid file.
    fn caddy_pid(&self) -> u32 {
        std::fs::read_to_string(self.agent.dir.join("caddy/caddy.pid")).unwrap().trim().parse().unwrap()
    }

    /// Polls `host` over HTTPS through Caddy until it answers `body`;
    /// returns how long that took.
    async fn serves_again(&self, host: &str, body: &str, limit: Duration) -> Duration {
        let start = Instant::now();
        let client = self.client(&[host]);
        loop {
            let answer = client.get(self.https(host, "/")).timeout(Duration::from_millis(500)).send().await;
            if let Ok(response) = answer {
                if response.text().await.is_ok_and(|text| text == body) {
                    return start.elapsed();
                }
            }
            assert!(start.elapsed() < limit, "not served again within {limit:?}\n{}", self.agent.log_text());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

#[tokio::test]
async fn a_caddy_killed_with_kill_9_is_restarted_with_the_route_table() {
    let cluster = cluster().await;
    let name = unique_name("phoenix");
    let host = format!("{name}.test");
    cluster.app(&name, "phoenix\n", &[]).await;
    cluster.serves_again(&host, "phoenix\n", Duration::from_secs(5)).await;
    for round in 0..2 {
        let old = cluster.caddy_pid();
        std::process::Command::new("kill").args(["-KILL", &old.to_string()]).output().unwrap();
        // Noticed when the child exits, not at the next 10 s route poll
        // (the figure is printed; the bound has a loaded machine's slack).
        let took = cluster.serves_again(&host, "phoenix\n", Duration::from_secs(15)).await;
        let new = cluster.caddy_pid();
        assert_ne!(old, new, "round {round}: a new caddy serves");
        assert!(process_alive(new));
        println!("round {round}: served again {took:?} after kill -9 of caddy");
    }
}

#[tokio::test]
async fn a_caddy_container_that_dies_is_started_again_with_the_route_table() {
    let cluster = cluster_with(&["--caddy-image", "cloudweb/caddy:latest"]).await;
    let name = unique_name("boxdie");
    let host = format!("{name}.test");
    cluster.app(&name, "boxdie\n", &[]).await;
    cluster.serves_again(&host, "boxdie\n", Duration::from_secs(5)).await;
    let short: String = cluster.agent.node_id.chars().filter(char::is_ascii_alphanumeric).take(24).collect();
    let container = format!("cloudweb-caddy-{short}");
    let killed = std::process::Command::new("docker").args(["kill", "--signal", "KILL", &container]).output().unwrap();
    assert!(killed.status.success(), "{}", String::from_utf8_lossy(&killed.stderr));
    // A new container and its admin socket: slack for a loaded machine.
    let took = cluster.serves_again(&host, "boxdie\n", Duration::from_secs(30)).await;
    println!("served again {took:?} after the caddy container was killed");
}

#[tokio::test]
async fn no_caddy_outlives_its_agent() {
    let mut cluster = cluster().await;
    let name = unique_name("orphan");
    let host = format!("{name}.test");
    cluster.app(&name, "orphan\n", &[]).await;
    cluster.serves_again(&host, "orphan\n", Duration::from_secs(5)).await;

    // kill -9 of the agent alone (not its process group): its Caddy goes too.
    let first = cluster.caddy_pid();
    let agent = cluster.agent.process.as_mut().unwrap();
    agent.signal("KILL");
    assert!(agent.wait_exit(Duration::from_secs(5)).await.is_some());
    wait_for(Duration::from_secs(5), "the old caddy to die with its agent", || async { (!process_alive(first)).then_some(()) })
        .await
        .unwrap();
    let args: Vec<&str> = cluster.agent_args.iter().map(String::as_str).collect();
    cluster.agent.start(&args).unwrap();
    cluster.serves_again(&host, "orphan\n", Duration::from_secs(40)).await;
    let second = cluster.caddy_pid();
    assert_ne!(first, second);

    // A deploy after the restart is served by the one Caddy there is.
    cluster.git.commit(&name, &[("index.html", "orphan 2\n")], "next").unwrap();
    cluster.deploy(&name).await;
    let client = cluster.client(&[&host]);
    for _ in 0..20 {
        let answer = client.get(cluster.https(&host, "/")).send().await.unwrap();
        assert_eq!(answer.text().await.unwrap(), "orphan 2\n");
    }

    // SIGTERM: a clean, prompt exit with status 0, and Caddy is gone.
    let agent = cluster.agent.process.as_mut().unwrap();
    agent.signal("TERM");
    let status = agent.wait_exit(Duration::from_secs(10)).await.expect("the agent exits after SIGTERM");
    assert!(status.success(), "{status:?}\n{}", agent.log_text());
    assert!(!process_alive(second), "caddy stopped with the agent");
    assert!(agent.log_text().contains("agent stopped"));
}
