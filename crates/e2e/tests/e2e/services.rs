//! Issue 22, managed services, end to end with the real binaries, Docker
//! and a real PostgreSQL (the local image `scripts/service-images.sh`
//! builds from Debian's packages with the official image's environment
//! contract): created and healthy, linked to an app that gets its URL,
//! reachable from a container but not on the host's LAN address, back with
//! its data after its process is killed and after the agent restarts, and
//! deleted without its data unless asked.

use std::process::Command;
use std::time::{Duration, Instant};

use cloudweb_e2e::services::{call, ensure_service_images, service_ports, services_node, AGENT_FLAGS};
use cloudweb_e2e::{start_platform, unique_name, wait_for, AgentNode, Platform, ServerProcess};
use reqwest::Method;
use serde_json::{json, Value};

const IMAGE: &str = "cloudweb-test/postgres:15";
/// Writes the URL it got into a file it serves.
const DOCKERFILE: &str = "FROM cloudweb-test/busybox:latest\n\
CMD [\"sh\", \"-c\", \"mkdir -p /www && echo \\\"$DATABASE_URL\\\" > /www/url && exec httpd -f -p 8080 -h /www\"]\n";


async fn until_state(server: &ServerProcess, agent: &AgentNode, name: &str, want: &str, limit: Duration) -> Value {
    wait_for(limit, &format!("service {name} to be {want}"), || async {
        let (_, view) = server.call(Method::GET, &format!("/api/services/{name}"), None).await.ok()?;
        (view["state"] == want).then_some(view)
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\nagent log:\n{}", agent.log_text()))
}


/// Waits until the service is healthy again with at least `restarts`
/// restarts counted.
async fn until_restarts(server: &ServerProcess, agent: &AgentNode, name: &str, restarts: u64) -> Value {
    wait_for(Duration::from_secs(20), &format!("service {name} healthy with {restarts} restart(s) counted"), || async {
        let (_, view) = server.call(Method::GET, &format!("/api/services/{name}"), None).await.ok()?;
        (view["state"] == "healthy" && view["restarts"].as_u64()? >= restarts).then_some(view)
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\nagent log:\n{}", agent.log_text()))
}

/// `psql` in a throwaway container of the same image, on Docker's default
/// bridge like an app: its output, or why it failed.
fn psql(url: &str, sql: &str) -> Result<String, String> {
    let name = unique_name("cw-psql");
    let out = Command::new("docker")
        .args(["run", "--rm", "--name", &name, IMAGE, "psql", url, "-tAc", sql])
        .output()
        .map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).to_string())
    }
}

fn docker(args: &[&str]) -> String {
    let out = Command::new("docker").args(args).output().unwrap();
    assert!(out.status.success(), "docker {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// The host's own address on its LAN (the source of its default route).
fn lan_address() -> Option<String> {
    let out = Command::new("ip").args(["-4", "route", "get", "1.1.1.1"]).output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let mut words = text.split_whitespace();
    while let Some(word) = words.next() {
        if word == "src" {
            return words.next().map(str::to_string);
        }
    }
    None
}

#[tokio::test]
async fn a_postgres_service_serves_a_linked_app_keeps_its_data_and_is_reachable_only_where_it_must() {
    ensure_service_images();
    let ports = service_ports();
    let Platform { tmp, git, server } = start_platform(&["--service-image", &format!("postgres={IMAGE}"), "--service-ports", &ports]).await.unwrap();
    let mut agent = services_node(&server, tmp.path(), "db-node").await;
    let node_id = agent.node_id.clone();

    // Bad requests create nothing.
    for (body, fragment) in [
        (json!({"name": "db", "type": "mysql"}), "expected one of `postgres`"),
        (json!({"name": "Db", "type": "postgres"}), "service"),
        (json!({"name": "db", "type": "postgres", "version": "latest"}), "version"),
        (json!({"name": "db", "type": "postgres", "memory": 1}), "memory"),
        (json!({"name": "db", "type": "postgres", "node": "nowhere"}), "nowhere"),
    ] {
        let (status, answer) = call(&server, Method::POST, "/api/services", Some(body.clone())).await;
        assert!(matches!(status, 400 | 404), "{body} -> {status} {answer}");
        assert!(answer["error"].as_str().unwrap_or("").contains(fragment), "{body} -> {answer}");
    }
    let name = unique_name("pg");
    let started = Instant::now();
    let (status, created) = call(&server, Method::POST, "/api/services", Some(json!({"name": name, "type": "postgres"}))).await;
    assert_eq!(status, 201, "{created}");
    assert_eq!(created["image"], IMAGE);
    let (status, _) = call(&server, Method::POST, "/api/services", Some(json!({"name": name, "type": "redis"}))).await;
    assert_eq!(status, 409, "the name is taken");
    let healthy = until_state(&server, &agent, &name, "healthy", Duration::from_secs(90)).await;
    eprintln!("service create -> healthy: {:.1} s", started.elapsed().as_secs_f64());
    let address = healthy["address"].as_str().unwrap().to_string();
    let metrics = server.http.get(server.api("/metrics")).bearer_auth(&server.admin_token).send().await.unwrap().text().await.unwrap();
    assert!(metrics.contains(&format!("cloudweb_service_healthy{{service=\"{name}\",node=\"{node_id}\"}} 1")), "{metrics}");
    let (ip, port) = address.rsplit_once(':').unwrap();
    assert!(!ip.starts_with("127.") && ip != "0.0.0.0", "a service listens on the node's service address: {address}");
    // Published on that address only, as Docker reports it.
    let published = docker(&["port", &format!("cw-svc.{name}"), "5432/tcp"]);
    assert_eq!(published, address, "published only at the service address");
    if let Some(lan) = lan_address().filter(|lan| lan != ip) {
        let refused = tokio::net::TcpStream::connect(format!("{lan}:{port}")).await;
        assert!(refused.is_err(), "the service answered on the host's LAN address {lan}:{port}");
    }

    // An app linked to it gets its URL at its next deploy.
    git.commit("linked", &[("Dockerfile", DOCKERFILE)], "reads DATABASE_URL").unwrap();
    let app = unique_name("uses-db");
    let (status, body) = call(&server, Method::POST, "/api/apps", Some(json!({"name": app, "repo_url": git.url("linked"), "port": 8080}))).await;
    assert_eq!(status, 201, "{body}");
    let (status, link) = call(&server, Method::POST, &format!("/api/services/{name}/links"), Some(json!({"app": app}))).await;
    assert_eq!(status, 200, "{link}");
    assert_eq!(link["variable"], "DATABASE_URL");
    let (status, body) = call(&server, Method::POST, &format!("/api/apps/{app}/deploy"), None).await;
    assert_eq!(status, 201, "{body}");
    let id = body["id"].as_str().unwrap().to_string();
    let deployment = wait_for(Duration::from_secs(120), "the app to run", || async {
        let (_, d) = server.call(Method::GET, &format!("/api/deployments/{id}"), None).await.ok()?;
        matches!(d["state"].as_str(), Some("running" | "failed")).then_some(d)
    })
    .await
    .unwrap();
    assert_eq!(deployment["state"], "running", "{deployment}");
    let app_address = deployment["instances"][0]["address"].as_str().unwrap();
    let url = reqwest::get(format!("http://{app_address}/url")).await.unwrap().text().await.unwrap().trim().to_string();
    assert!(url.starts_with(&format!("postgres://app:")) && url.ends_with(&format!("@{address}/app")), "{url}");
    let password = url.trim_start_matches("postgres://app:").split('@').next().unwrap().to_string();
    assert!(password.len() >= 24, "a generated password");
    // The password never shows in the API.
    for path in ["/api/services".to_string(), format!("/api/services/{name}"), format!("/api/apps/{app}")] {
        let (_, body) = call(&server, Method::GET, &path, None).await;
        assert!(!body.to_string().contains(&password), "{path} shows the password");
    }

    // A container on the bridge, as the app, uses it.
    let written = psql(&url, "CREATE TABLE kept (x int); INSERT INTO kept VALUES (42); SELECT x FROM kept").unwrap();
    assert_eq!(written.lines().last(), Some("42"), "{written}");
    let wrong = url.replace(&password, "wrong-password");
    assert!(psql(&wrong, "SELECT 1").unwrap_err().contains("password authentication failed"));

    // Its process is killed: back, with the data, within 10 s.
    let pid = docker(&["inspect", "-f", "{{.State.Pid}}", &format!("cw-svc.{name}")]);
    let killed = Instant::now();
    assert!(Command::new("kill").args(["-9", &pid]).status().unwrap().success());
    let back = wait_for(Duration::from_secs(10), "the data to answer again", || async { psql(&url, "SELECT x FROM kept").ok() }).await;
    let back = back.unwrap_or_else(|e| panic!("{e}\nagent log:\n{}", agent.log_text()));
    assert_eq!(back, "42");
    eprintln!("service back after kill -9: {:.1} s", killed.elapsed().as_secs_f64());
    // The node's report follows within its check interval and a heartbeat.
    let view = until_restarts(&server, &agent, &name, 1).await;
    let restarts = view["restarts"].as_u64().unwrap();
    // Stopped by hand, Docker's policy leaves it stopped: the agent starts
    // it again (after giving the policy its chance).
    docker(&["stop", &format!("cw-svc.{name}")]);
    let stopped = Instant::now();
    let back = wait_for(Duration::from_secs(15), "the stopped service to answer again", || async { psql(&url, "SELECT x FROM kept").ok() }).await;
    assert_eq!(back.unwrap_or_else(|e| panic!("{e}\nagent log:\n{}", agent.log_text())), "42");
    eprintln!("service back after docker stop: {:.1} s", stopped.elapsed().as_secs_f64());
    // The agent's own restart counts too.
    until_restarts(&server, &agent, &name, restarts + 1).await;

    // The agent restarts: the service stays, and is reported again.
    agent.kill();
    agent.start(&AGENT_FLAGS).unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    until_state(&server, &agent, &name, "healthy", Duration::from_secs(30)).await;
    assert_eq!(psql(&url, "SELECT x FROM kept").unwrap(), "42");

    // Deleting it: refused while linked; then its container goes and its
    // data stays, detached, until the volume is deleted by name.
    let (status, answer) = call(&server, Method::DELETE, &format!("/api/services/{name}"), None).await;
    assert_eq!(status, 409, "{answer}");
    assert!(answer["error"].as_str().unwrap().contains(&app), "{answer}");
    let (status, _) = call(&server, Method::DELETE, &format!("/api/services/{name}/links/{app}"), None).await;
    assert_eq!(status, 204);
    let (status, answer) = call(&server, Method::DELETE, &format!("/api/services/{name}"), None).await;
    assert_eq!(status, 204, "{answer}");
    let container = format!("cw-svc.{name}");
    wait_for(Duration::from_secs(30), "the container to go", || async {
        let out = Command::new("docker").args(["ps", "-aq", "--filter", &format!("name=^{container}$")]).output().ok()?;
        (out.status.success() && out.stdout.is_empty()).then_some(())
    })
    .await
    .unwrap();
    let volume = format!("svc-{name}");
    let data = agent.dir.join("volumes").join(&volume);
    assert!(data.join("PG_VERSION").is_file(), "the data stays: {}", data.display());
    let (_, volumes) = call(&server, Method::GET, "/api/volumes", None).await;
    let row = volumes["volumes"].as_array().unwrap().iter().find(|v| v["name"] == volume.as_str()).cloned().expect("listed");
    assert_eq!(row["state"], "detached", "{row}");
    let (status, _) = call(&server, Method::DELETE, &format!("/api/volumes/{volume}"), None).await;
    assert_eq!(status, 204);
    wait_for(Duration::from_secs(30), "the data to go", || async { (!data.exists()).then_some(()) }).await.unwrap();
}

/// Redis and MariaDB through the same path: created, healthy, their URL
/// works from a container with the password and not without it.
#[tokio::test]
async fn redis_and_mariadb_services_answer_with_their_credentials_only() {
    ensure_service_images();
    let ports = service_ports();
    let flags = ["--service-image", "redis=cloudweb-test/redis:7", "--service-image", "mariadb=cloudweb-test/mariadb:10", "--service-ports", &ports];
    let Platform { tmp, server, .. } = start_platform(&flags).await.unwrap();
    let agent = services_node(&server, tmp.path(), "kv-node").await;
    let (redis, maria) = (unique_name("kv"), unique_name("sql"));
    let started = Instant::now();
    for (name, kind) in [(&redis, "redis"), (&maria, "mariadb")] {
        let (status, body) = call(&server, Method::POST, "/api/services", Some(json!({"name": name, "type": kind, "node": "kv-node"}))).await;
        assert_eq!(status, 201, "{body}");
    }
    let kv = until_state(&server, &agent, &redis, "healthy", Duration::from_secs(60)).await;
    eprintln!("redis create -> healthy: {:.1} s", started.elapsed().as_secs_f64());
    let sql = until_state(&server, &agent, &maria, "healthy", Duration::from_secs(120)).await;
    eprintln!("mariadb create -> healthy: {:.1} s", started.elapsed().as_secs_f64());

    // The URLs a linked app would get.
    let app = unique_name("both");
    let (status, _) = call(&server, Method::POST, "/api/apps", Some(json!({"name": app, "repo_url": "https://git.example.com/a.git", "port": 80}))).await;
    assert_eq!(status, 201);
    for (name, variable) in [(&redis, "REDIS_URL"), (&maria, "DATABASE_URL")] {
        let (status, link) = call(&server, Method::POST, &format!("/api/services/{name}/links"), Some(json!({"app": app}))).await;
        assert_eq!(status, 200, "{link}");
        assert_eq!(link["variable"], variable);
    }
    let (status, answer) = call(&server, Method::POST, &format!("/api/services/{redis}/links"), Some(json!({"app": app, "variable": "DATABASE_URL"}))).await;
    assert_eq!(status, 409, "one variable, one service: {answer}");

    let kv_address = kv["address"].as_str().unwrap();
    let (host, port) = kv_address.rsplit_once(':').unwrap();
    let run = |image: &str, args: &[&str]| {
        let name = unique_name("cw-client");
        let mut command = Command::new("docker");
        command.args(["run", "--rm", "--name", &name, image]).args(args);
        let out = command.output().unwrap();
        (out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
    };
    let (_, without) = run("cloudweb-test/redis:7", &["redis-cli", "-h", host, "-p", port, "ping"]);
    assert!(without.contains("NOAUTH"), "{without}");
    // The password, as a linked app gets it, from the secret the server
    // keeps: read through the one place that hands it out, a deploy's
    // environment, is covered by the PostgreSQL test; here the service's
    // own container holds it in REDISCLI_AUTH.
    let secret = docker(&["exec", &format!("cw-svc.{redis}"), "sh", "-c", "printf %s \"$REDISCLI_AUTH\""]);
    let (ok, pong) = run("cloudweb-test/redis:7", &["redis-cli", "-u", &format!("redis://default:{secret}@{kv_address}/0"), "ping"]);
    assert!(ok && pong.contains("PONG") && !pong.contains("WRONGPASS"), "{pong}");

    let sql_address = sql["address"].as_str().unwrap();
    let (host, port) = sql_address.rsplit_once(':').unwrap();
    let password = docker(&["exec", &format!("cw-svc.{maria}"), "sh", "-c", "printf %s \"$MARIADB_PASSWORD\""]);
    let (ok, out) = run("cloudweb-test/mariadb:10", &["mariadb", "-h", host, "-P", port, "-u", "app", &format!("-p{password}"), "app", "-e", "SELECT 6*7"]);
    assert!(ok && out.contains("42"), "{out}");
    let (ok, out) = run("cloudweb-test/mariadb:10", &["mariadb", "-h", host, "-P", port, "-u", "app", "-pwrong", "app", "-e", "SELECT 1"]);
    assert!(!ok && out.contains("Access denied"), "{out}");
    for name in [&redis, &maria] {
        let (status, _) = call(&server, Method::DELETE, &format!("/api/services/{name}/links/{app}"), None).await;
        assert_eq!(status, 204);
        let (status, _) = call(&server, Method::DELETE, &format!("/api/services/{name}?data=delete"), None).await;
        assert_eq!(status, 204);
    }
    let (_, volumes) = call(&server, Method::GET, "/api/volumes", None).await;
    assert_eq!(volumes["volumes"], json!([]), "deleted with their data: {volumes}");
}

/// A service whose disk fills up is marked degraded with the reason (and
/// the node goes on); once space is freed it is healthy again.
#[tokio::test]
async fn a_service_whose_disk_fills_is_degraded_with_the_reason_and_recovers() {
    ensure_service_images();
    let ports = service_ports();
    let Platform { tmp, server, .. } = start_platform(&["--service-image", "redis=cloudweb-test/redis:7", "--service-ports", &ports]).await.unwrap();
    let agent = services_node(&server, tmp.path(), "small-disk").await;
    let node_id = agent.node_id.clone();
    let name = unique_name("full");
    // The service's volume directory on a small file system of its own.
    let disk = cloudweb_e2e::tmpfs::Tmpfs::mount(&agent.dir.join("volumes").join(format!("svc-{name}")), "8m");
    let (status, body) = call(&server, Method::POST, "/api/services", Some(json!({"name": name, "type": "redis"}))).await;
    assert_eq!(status, 201, "{body}");
    until_state(&server, &agent, &name, "healthy", Duration::from_secs(60)).await;
    let filler = disk.fill();
    let degraded = until_state(&server, &agent, &name, "degraded", Duration::from_secs(20)).await;
    let detail = degraded["detail"].as_str().unwrap();
    assert!(detail.contains("is full"), "{detail}");
    let node = server.node(&node_id).await.unwrap();
    assert_eq!(node["state"], "ready", "the node goes on: {node}");
    std::fs::remove_file(filler).unwrap();
    until_state(&server, &agent, &name, "healthy", Duration::from_secs(20)).await;
    // Its data stays (the volume is this test's file system).
    let (status, _) = call(&server, Method::DELETE, &format!("/api/services/{name}"), None).await;
    assert_eq!(status, 204);
    // The container goes before the file system does.
    let container = format!("cw-svc.{name}");
    wait_for(Duration::from_secs(30), "the container to go", || async {
        let out = Command::new("docker").args(["ps", "-aq", "--filter", &format!("name=^{container}$")]).output().ok()?;
        (out.status.success() && out.stdout.is_empty()).then_some(())
    })
    .await
    .unwrap();
    drop(disk);
}
