//! Issue 25, scaling and liveness, end to end with the real binaries,
//! Docker and Caddy: an app on two nodes goes from 1 to 3 instances and
//! back to 1 while requests flow through the ingress, and none fails; new
//! instances spread over the nodes, each with the scheduler's reason; bad
//! counts are refused. An instance that hangs is restarted by its
//! liveness probe; one that Docker restarts is routed at its new port.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cloudweb_e2e::{caddy_bin, docker, free_port, start_platform, unique_name, wait_for, AgentNode, Platform, ServerProcess};
use reqwest::Method;
use serde_json::{json, Value};

const DOCKERFILE: &str = "FROM cloudweb-test/busybox:latest\nCOPY index.html /www/index.html\nCMD [\"httpd\", \"-f\", \"-p\", \"8080\", \"-h\", \"/www\"]\n";

async fn call(server: &ServerProcess, method: Method, path: &str, body: Option<Value>) -> (u16, Value) {
    server.call(method, path, body).await.unwrap()
}

/// The app's running deployment's instances that run, as (instance, node).
async fn running(server: &ServerProcess, deployment: &str) -> Vec<(i64, String)> {
    let (_, d) = call(server, Method::GET, &format!("/api/deployments/{deployment}"), None).await;
    d["instances"]
        .as_array()
        .map(|all| {
            all.iter()
                .filter(|i| i["state"] == "running")
                .map(|i| (i["instance"].as_i64().unwrap_or(0), i["node_id"].as_str().unwrap_or_default().to_string()))
                .collect()
        })
        .unwrap_or_default()
}

async fn upstreams(server: &ServerProcess, host: &str, count: usize) {
    server.served_upstreams(host, count).await.unwrap();
}

#[tokio::test]
async fn scale_one_to_three_to_one_under_load_fails_no_request() {
    let Platform { tmp, git, server } = start_platform(&["--base-domain", "test", "--heartbeat-flush-seconds", "1"]).await.unwrap();
    let (token, ca) = server.join_token().await.unwrap();
    let caddy = caddy_bin().display().to_string();
    let (http, https) = (free_port().to_string(), free_port().to_string());
    let mut edge = AgentNode::join(&server, &tmp.path().join("edge"), "edge", &token, &ca, &["--ingress"]).unwrap().unwrap();
    edge.start(&[
        "--heartbeat-interval-seconds", "1", "--publish-ip", "127.0.0.1", "--advertise-host", "127.0.0.1",
        "--http-port", &http, "--https-port", &https, "--caddy-bin", &caddy, "--metrics-interval-seconds", "1",
    ])
    .unwrap();
    let (token, ca) = server.join_token().await.unwrap();
    let mut worker = AgentNode::join(&server, &tmp.path().join("worker"), "worker", &token, &ca, &[]).unwrap().unwrap();
    worker.start(&["--heartbeat-interval-seconds", "1", "--publish-ip", "127.0.0.1", "--advertise-host", "127.0.0.1", "--metrics-interval-seconds", "1"]).unwrap();
    for node in [&edge.node_id, &worker.node_id] {
        wait_for(Duration::from_secs(60), "both nodes to be ready (the edge with its ingress)", || async {
            let n = server.node(node).await.ok()?;
            let ingress_up = *node != edge.node_id || n["features"].as_array()?.contains(&json!("traffic-metrics"));
            (n["state"] == "ready" && ingress_up).then_some(())
        })
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}\n{}", edge.log_text(), worker.log_text()));
    }

    let name = unique_name("scale");
    let host = format!("{name}.test");
    git.commit(&name, &[("Dockerfile", DOCKERFILE), ("index.html", "scaled\n")], "first").unwrap();
    let (status, body) = call(&server, Method::POST, "/api/apps", Some(json!({"name": name, "repo_url": git.url(&name), "port": 8080, "health_timeout_seconds": 10}))).await;
    assert_eq!(status, 201, "{body}");

    // Bad counts are refused and change nothing.
    for bad in [json!({"instances": 0}), json!({"instances": 21}), json!({"instances": -1}), json!({"instances": 2, "extra": 1}), json!({})] {
        let (status, body) = call(&server, Method::POST, &format!("/api/apps/{name}/scale"), Some(bad.clone())).await;
        assert_eq!(status, 400, "{bad} -> {body}");
    }
    let (status, _) = call(&server, Method::POST, "/api/apps/no-such-app/scale", Some(json!({"instances": 2}))).await;
    assert_eq!(status, 404);
    let (_, app) = call(&server, Method::GET, &format!("/api/apps/{name}"), None).await;
    assert_eq!(app["instances"], 1, "{app}");

    let settled = server.deploy_and_settle(&name, None).await.unwrap_or_else(|e| panic!("{e}\n{}\n{}", edge.log_text(), worker.log_text()));
    let deployment = settled["id"].as_str().unwrap().to_string();
    upstreams(&server, &host, 1).await;
    let first_node = running(&server, &deployment).await[0].1.clone();

    // Load through Caddy for the whole test.
    let root = std::fs::read(edge.dir.join("caddy/data/caddy/pki/authorities/local/root.crt")).unwrap();
    let client = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(&root).unwrap())
        .resolve(&host, "127.0.0.1:0".parse().unwrap())
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let url = format!("https://{host}:{https}/");
    let stop = Arc::new(AtomicBool::new(false));
    let (ok, failures) = (Arc::new(AtomicU64::new(0)), Arc::new(Mutex::new(Vec::<String>::new())));
    let mut workers = Vec::new();
    for _ in 0..3 {
        let (client, url, stop, ok, failures) = (client.clone(), url.clone(), stop.clone(), ok.clone(), failures.clone());
        workers.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let outcome = match client.get(&url).send().await {
                    Ok(response) if response.status() == 200 => match response.text().await {
                        Ok(body) if body == "scaled\n" => Ok(()),
                        Ok(body) => Err(format!("200 with body {body:?}")),
                        Err(err) => Err(format!("200 whose body failed: {err:?}")),
                    },
                    Ok(response) => Err(format!("status {}", response.status())),
                    Err(err) => Err(format!("{err:?}")),
                };
                match outcome {
                    Ok(()) => ok.fetch_add(1, Ordering::Relaxed),
                    Err(failure) => {
                        failures.lock().unwrap().push(failure);
                        0
                    }
                };
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }));
    }

    // 1 -> 3: the first new instance goes to the node without one.
    let before = ok.load(Ordering::Relaxed);
    let (status, up) = call(&server, Method::POST, &format!("/api/apps/{name}/scale"), Some(json!({"instances": 3}))).await;
    assert_eq!(status, 200, "{up}");
    assert_eq!((up["before"].as_u64(), up["deployment"].as_str()), (Some(1), Some(deployment.as_str())), "{up}");
    let started = up["started"].as_array().unwrap();
    assert_eq!(started.len(), 2, "{up}");
    assert_ne!(started[0]["node_id"], json!(first_node), "spread: the second instance avoids the first one's node: {up}");
    assert!(started[0]["why"].as_str().unwrap().contains("0 of its instances there"), "{up}");
    let three = wait_for(Duration::from_secs(90), "three running instances", || async {
        let now = running(&server, &deployment).await;
        (now.len() == 3).then_some(now)
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}\n{}", edge.log_text(), worker.log_text()));
    let on_edge = three.iter().filter(|(_, n)| *n == edge.node_id).count();
    assert!(on_edge == 1 || on_edge == 2, "three instances over two nodes: {three:?}");
    upstreams(&server, &host, 3).await;
    assert!(ok.load(Ordering::Relaxed) - before >= 10, "the load ran while scaling up");
    let (_, app) = call(&server, Method::GET, &format!("/api/apps/{name}"), None).await;
    assert_eq!(app["instances"], 3, "the count is kept: {app}");
    // `top`: each running instance with its node's sample of its container.
    let top = wait_for(Duration::from_secs(30), "a usage sample of every instance", || async {
        let (_, top) = server.call(Method::GET, &format!("/api/apps/{name}/top"), None).await.ok()?;
        let all = top["instances"].as_array()?.clone();
        (all.len() == 3 && all.iter().all(|i| i["mem_bytes"].as_u64().is_some_and(|m| m > 0) && i["sampled_at"].is_string())).then_some(all)
    })
    .await
    .unwrap();
    let mut nodes: Vec<&str> = top.iter().map(|i| i["node_id"].as_str().unwrap()).collect();
    nodes.sort_unstable();
    nodes.dedup();
    assert_eq!(nodes.len(), 2, "{top:?}");
    assert!(top.iter().all(|i| i["state"] == "running" && i["restarts"] == 0), "{top:?}");
    let (status, _) = call(&server, Method::GET, "/api/apps/no-such-app/top", None).await;
    assert_eq!(status, 404);

    // 3 -> 1: two leave the routes first, then stop.
    let before = ok.load(Ordering::Relaxed);
    let (status, down) = call(&server, Method::POST, &format!("/api/apps/{name}/scale"), Some(json!({"instances": 1}))).await;
    assert_eq!(status, 200, "{down}");
    assert_eq!(down["draining"].as_array().map(Vec::len), Some(2), "{down}");
    upstreams(&server, &host, 1).await;
    wait_for(Duration::from_secs(90), "the two drained containers to stop", || async {
        (docker::ps(&["-q", "--filter", &format!("label=cloudweb.deployment={deployment}")]).len() == 1).then_some(())
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}\n{}", edge.log_text(), worker.log_text()));
    assert_eq!(running(&server, &deployment).await.len(), 1);
    assert!(ok.load(Ordering::Relaxed) - before >= 10, "the load ran while scaling down");

    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.await.unwrap();
    }
    let failures = failures.lock().unwrap().clone();
    assert!(failures.is_empty(), "{} failed of {}: {failures:?}", failures.len(), ok.load(Ordering::Relaxed) + failures.len() as u64);
    eprintln!("scale 1 -> 3 -> 1: {} requests, none failed", ok.load(Ordering::Relaxed));
    let (status, _) = call(&server, Method::DELETE, &format!("/api/apps/{name}"), None).await;
    assert_eq!(status, 204);
}

/// Serves for 8 s after each start, then hangs: the port still accepts
/// connections (nc, again and again) but nothing answers. Each start
/// appends to `boots`.
const HANGING: &str = "date +%s >> /www/boots\nhttpd -f -p 8080 -h /www &\nsleep 8\nkill $!\nwhile true; do nc -l -p 8080 > /dev/null; done\n";
const HANGING_DOCKERFILE: &str = "FROM cloudweb-test/busybox:latest\nRUN mkdir -p /www && echo up > /www/index.html\nCOPY run.sh /run.sh\nCMD [\"sh\", \"/run.sh\"]\n";

/// Issue 25, liveness: an instance that stops answering is restarted by
/// its agent (same container, same instance, the deployment still
/// running), the restart shows in `top`, and bad probe settings are
/// refused.
#[tokio::test]
async fn a_hung_instance_is_restarted_by_its_liveness_probe() {
    let Platform { tmp, git, server } = start_platform(&[]).await.unwrap();
    let (token, ca) = server.join_token().await.unwrap();
    let mut agent = AgentNode::join(&server, &tmp.path().join("node"), "node", &token, &ca, &[]).unwrap().unwrap();
    agent.start(&["--heartbeat-interval-seconds", "1", "--publish-ip", "127.0.0.1", "--advertise-host", "127.0.0.1", "--metrics-interval-seconds", "1"]).unwrap();
    let name = unique_name("hangs");
    git.commit(&name, &[("Dockerfile", HANGING_DOCKERFILE), ("run.sh", HANGING)], "hangs after 8 s").unwrap();
    let probe = json!({"interval_seconds": 1, "timeout_seconds": 1, "failure_threshold": 3});
    for bad in [json!({"interval_seconds": 1, "timeout_seconds": 2, "failure_threshold": 3}), json!({"interval_seconds": 0, "timeout_seconds": 1, "failure_threshold": 3}), json!({"interval_seconds": 5})] {
        let (status, body) = call(&server, Method::POST, "/api/apps", Some(json!({"name": name, "repo_url": git.url(&name), "port": 8080, "liveness": bad}))).await;
        assert_eq!(status, 400, "{body}");
    }
    let (status, app) = call(&server, Method::POST, "/api/apps", Some(json!({"name": name, "repo_url": git.url(&name), "port": 8080, "liveness": probe}))).await;
    assert_eq!(status, 201, "{app}");
    assert_eq!(app["liveness"], probe, "{app}");
    let deployment = server.deploy_and_settle(&name, None).await.unwrap_or_else(|e| panic!("{e}\n{}", agent.log_text()));
    let id = deployment["id"].as_str().unwrap().to_string();
    let container = deployment["instances"][0]["container"].as_str().unwrap().to_string();
    let first_address = deployment["instances"][0]["address"].as_str().unwrap().to_string();
    // Read at the instance's current address: a restarted container is
    // published on a new port, which its agent reports.
    let boots = || async {
        let (_, d) = server.call(Method::GET, &format!("/api/deployments/{id}"), None).await.ok()?;
        let address = d["instances"][0]["address"].as_str()?.to_string();
        let text = reqwest::get(format!("http://{address}/boots")).await.ok()?.text().await.ok()?;
        Some(text.lines().count())
    };
    assert_eq!(boots().await, Some(1));
    // It hangs 8 s after its start; three failed probes later its agent
    // restarts it, and it serves again.
    wait_for(Duration::from_secs(60), "the hung instance to be restarted and serve again", || async { boots().await.filter(|n| *n >= 2) })
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", agent.log_text()));
    let log = agent.log_text();
    assert!(log.contains("liveness probe failed; restarting the container"), "{log}");
    assert!(log.contains(&container), "the restart names the container\n{log}");
    let (_, now) = call(&server, Method::GET, &format!("/api/deployments/{id}"), None).await;
    assert_eq!((now["state"].as_str(), now["instances"][0]["state"].as_str(), now["instances"][0]["container"].as_str()), (Some("running"), Some("running"), Some(container.as_str())), "{now}");
    assert_ne!(now["instances"][0]["address"].as_str(), Some(first_address.as_str()), "the new port was reported: {now}");
    assert!(log.contains("the restarted instance runs at a new address"), "{log}");
    let top = wait_for(Duration::from_secs(30), "the restart in the usage samples", || async {
        let (_, top) = server.call(Method::GET, &format!("/api/apps/{name}/top"), None).await.ok()?;
        (top["instances"][0]["restarts"].as_u64()? >= 1).then_some(top)
    })
    .await
    .unwrap();
    eprintln!("liveness: restarted; top says {}", top["instances"][0]);

    // The probe can be changed and removed; the next deployment goes by it.
    let (status, body) = call(&server, Method::PATCH, &format!("/api/apps/{name}"), Some(json!({"liveness": {"interval_seconds": 5, "timeout_seconds": 6, "failure_threshold": 1}}))).await;
    assert_eq!(status, 400, "{body}");
    let (status, body) = call(&server, Method::PATCH, &format!("/api/apps/{name}"), Some(json!({"liveness": null}))).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["liveness"], Value::Null, "{body}");
    let (status, _) = call(&server, Method::DELETE, &format!("/api/apps/{name}"), None).await;
    assert_eq!(status, 204);
}

/// Serves for 6 s after each start, then exits 1 (the first start only):
/// Docker's restart policy starts it again, on a new host port.
const CRASHING: &str = "date +%s >> /www/boots\nif [ \"$(wc -l < /www/boots)\" -eq 1 ]; then httpd -f -p 8080 -h /www & sleep 6; exit 1; fi\nexec httpd -f -p 8080 -h /www\n";

/// An instance that crashes once is started again by Docker (no probe),
/// published on a new port: its agent reports the new address, and the
/// deployment serves from it.
#[tokio::test]
async fn an_instance_docker_restarts_is_reported_at_its_new_port() {
    let Platform { tmp, git, server } = start_platform(&[]).await.unwrap();
    let (token, ca) = server.join_token().await.unwrap();
    let mut agent = AgentNode::join(&server, &tmp.path().join("node"), "node", &token, &ca, &[]).unwrap().unwrap();
    agent.start(&["--heartbeat-interval-seconds", "1", "--publish-ip", "127.0.0.1", "--advertise-host", "127.0.0.1"]).unwrap();
    let name = unique_name("crash");
    git.commit(&name, &[("Dockerfile", HANGING_DOCKERFILE), ("run.sh", CRASHING)], "crashes once after 6 s").unwrap();
    let (status, app) = call(&server, Method::POST, "/api/apps", Some(json!({"name": name, "repo_url": git.url(&name), "port": 8080}))).await;
    assert_eq!(status, 201, "{app}");
    let deployment = server.deploy_and_settle(&name, None).await.unwrap_or_else(|e| panic!("{e}\n{}", agent.log_text()));
    let id = deployment["id"].as_str().unwrap().to_string();
    let first = deployment["instances"][0]["address"].as_str().unwrap().to_string();
    let moved = wait_for(Duration::from_secs(60), "the restarted instance's new address", || async {
        let (_, d) = server.call(Method::GET, &format!("/api/deployments/{id}"), None).await.ok()?;
        let address = d["instances"][0]["address"].as_str()?.to_string();
        (address != first).then_some(address)
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", agent.log_text()));
    let text = reqwest::get(format!("http://{moved}/boots")).await.unwrap().text().await.unwrap();
    assert_eq!(text.lines().count(), 2, "served by the second start: {text:?}");
    let (_, now) = call(&server, Method::GET, &format!("/api/deployments/{id}"), None).await;
    assert_eq!((now["state"].as_str(), now["instances"][0]["state"].as_str()), (Some("running"), Some("running")), "{now}");
    let (status, _) = call(&server, Method::DELETE, &format!("/api/apps/{name}"), None).await;
    assert_eq!(status, 204);
}
