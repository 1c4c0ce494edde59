//! Issue 25, readiness probes, end to end with the real binaries, Docker
//! and Caddy: an app with two instances behind the ingress, requests
//! flowing through it; one instance starts failing its readiness probe and
//! leaves the upstreams with no request failing, every answer then comes
//! from the other one; once it passes again it is back. Bad settings are
//! refused.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cloudweb_e2e::{caddy_bin, docker, free_port, start_platform, unique_name, wait_for, AgentNode, Platform, ServerProcess};
use reqwest::Method;
use serde_json::{json, Value};

/// Each instance answers `/` with its own host name; `/ready` is the
/// health path, and removing the file makes the readiness probe fail
/// (404) while `/` still answers.
const DOCKERFILE: &str = "FROM cloudweb-test/busybox:latest\n\
CMD [\"sh\", \"-c\", \"mkdir -p /www && hostname > /www/index.html && echo ok > /www/ready && exec httpd -f -p 8080 -h /www\"]\n";

async fn call(server: &ServerProcess, method: Method, path: &str, body: Option<Value>) -> (u16, Value) {
    server.call(method, path, body).await.unwrap()
}

async fn upstreams(server: &ServerProcess, host: &str, count: usize) {
    server.served_upstreams(host, count).await.unwrap();
}

#[tokio::test]
async fn a_failing_readiness_probe_takes_the_instance_out_with_no_failed_request() {
    let Platform { tmp, git, server } = start_platform(&["--base-domain", "test", "--heartbeat-flush-seconds", "1"]).await.unwrap();
    let (token, ca) = server.join_token().await.unwrap();
    let caddy = caddy_bin().display().to_string();
    let (http, https) = (free_port().to_string(), free_port().to_string());
    let mut edge = AgentNode::join(&server, &tmp.path().join("edge"), "edge", &token, &ca, &["--ingress"]).unwrap().unwrap();
    edge.start(&[
        "--heartbeat-interval-seconds", "1", "--publish-ip", "127.0.0.1", "--advertise-host", "127.0.0.1",
        "--http-port", &http, "--https-port", &https, "--caddy-bin", &caddy,
    ])
    .unwrap();
    let node_id = edge.node_id.clone();
    wait_for(Duration::from_secs(60), "the node ready with its ingress", || async {
        let n = server.node(&node_id).await.ok()?;
        (n["state"] == "ready" && n["features"].as_array()?.contains(&json!("traffic-metrics"))).then_some(())
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", edge.log_text()));

    let name = unique_name("ready");
    let host = format!("{name}.test");
    git.commit(&name, &[("Dockerfile", DOCKERFILE)], "first").unwrap();
    // Bad settings are refused and create nothing.
    for bad in [
        json!({"interval_seconds": 0, "timeout_seconds": 1, "failure_threshold": 1, "success_threshold": 1}),
        json!({"interval_seconds": 1, "timeout_seconds": 2, "failure_threshold": 1, "success_threshold": 1}),
        json!({"interval_seconds": 1, "timeout_seconds": 1, "failure_threshold": 1, "success_threshold": 0}),
        json!({"interval_seconds": 1, "timeout_seconds": 1, "failure_threshold": 1}),
    ] {
        let body = json!({"name": name, "repo_url": git.url(&name), "port": 8080, "readiness": bad});
        let (status, answer) = call(&server, Method::POST, "/api/apps", Some(body)).await;
        assert_eq!(status, 400, "{bad} -> {answer}");
    }
    let readiness = json!({"interval_seconds": 1, "timeout_seconds": 1, "failure_threshold": 2, "success_threshold": 1});
    let body = json!({"name": name, "repo_url": git.url(&name), "port": 8080, "instances": 2, "health_path": "/ready", "readiness": readiness});
    let (status, created) = call(&server, Method::POST, "/api/apps", Some(body)).await;
    assert_eq!(status, 201, "{created}");
    assert_eq!(created["readiness"], readiness, "{created}");
    let settled = server.deploy_and_settle(&name, None).await.unwrap_or_else(|e| panic!("{e}\n{}", edge.log_text()));
    upstreams(&server, &host, 2).await;
    let containers: Vec<String> = settled["instances"].as_array().unwrap().iter().map(|i| i["container"].as_str().unwrap().to_string()).collect();
    assert_eq!(containers.len(), 2, "{settled}");
    let hostname = |container: &str| docker::docker(&["exec", container, "hostname"]).join("");
    let (failing, serving) = (containers[0].clone(), hostname(&containers[1]));

    // Load through Caddy for the whole test, each answer's body kept.
    let root = std::fs::read(edge.dir.join("caddy/data/caddy/pki/authorities/local/root.crt")).unwrap();
    let client = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(&root).unwrap())
        .resolve(&host, "127.0.0.1:0".parse().unwrap())
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let url = format!("https://{host}:{https}/");
    let stop = Arc::new(AtomicBool::new(false));
    let answers = Arc::new(Mutex::new(Vec::<(std::time::Instant, Result<String, String>)>::new()));
    let mut workers = Vec::new();
    for _ in 0..3 {
        let (client, url, stop, answers) = (client.clone(), url.clone(), stop.clone(), answers.clone());
        workers.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let outcome = match client.get(&url).send().await {
                    Ok(response) if response.status() == 200 => response.text().await.map(|b| b.trim().to_string()).map_err(|e| format!("{e:?}")),
                    Ok(response) => Err(format!("status {}", response.status())),
                    Err(err) => Err(format!("{err:?}")),
                };
                answers.lock().unwrap().push((std::time::Instant::now(), outcome));
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }));
    }
    tokio::time::sleep(Duration::from_secs(2)).await;

    // The probe fails (its path answers 404, `/` still serves): the
    // instance leaves the upstreams, and every answer is the other's.
    docker::docker(&["exec", &failing, "rm", "/www/ready"]);
    upstreams(&server, &host, 1).await;
    let (_, top) = call(&server, Method::GET, &format!("/api/apps/{name}/top"), None).await;
    let unready: Vec<&Value> = top["instances"].as_array().unwrap().iter().filter(|i| i["ready"] == false).collect();
    assert_eq!(unready.len(), 1, "{top}");
    assert!(unready[0]["unready_reason"].as_str().unwrap_or_default().contains("404"), "{top}");
    let out_at = std::time::Instant::now();
    tokio::time::sleep(Duration::from_secs(3)).await;
    {
        let answers = answers.lock().unwrap();
        let after: Vec<&Result<String, String>> = answers.iter().filter(|(at, _)| *at > out_at).map(|(_, a)| a).collect();
        assert!(after.len() >= 10, "the load ran: {}", after.len());
        assert!(after.iter().all(|a| a.as_deref() == Ok(serving.as_str())), "only the ready instance answers: {after:?}");
    }

    // It passes again: back in the upstreams.
    docker::docker(&["exec", &failing, "sh", "-c", "echo ok > /www/ready"]);
    upstreams(&server, &host, 2).await;
    let back_at = std::time::Instant::now();
    let both = wait_for(Duration::from_secs(20), "answers from both instances again", || async {
        let answers = answers.lock().unwrap();
        let names: std::collections::HashSet<String> = answers.iter().filter(|(at, _)| *at > back_at).filter_map(|(_, a)| a.clone().ok()).collect();
        (names.len() == 2).then_some(names)
    })
    .await;
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.await.unwrap();
    }
    both.unwrap();
    let answers = answers.lock().unwrap();
    let failures: Vec<&String> = answers.iter().filter_map(|(_, a)| a.as_ref().err()).collect();
    assert!(failures.is_empty(), "{} failed of {}: {failures:?}", failures.len(), answers.len());
    eprintln!("readiness out and back: {} requests, none failed", answers.len());
}
