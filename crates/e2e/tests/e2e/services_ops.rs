//! Issue 22, what is done to managed services that run, end to end with
//! the real binaries and the local images `scripts/service-images.sh`
//! builds: a password rotated (the old one refused by the database's own
//! client, the new one taken, the linked app redeployed with the new URL,
//! refused while the node is unreachable, finished once an agent that died
//! after the request is back, reported failed while the database refuses
//! the change and finished once it can), a minor version changed on the
//! same data and a major PostgreSQL one refused, and a node restart (agent
//! killed, the service's container stopped as a host shutdown stops it)
//! reported as `restarting` then `healthy` with the service intact; the
//! container's output readable through the API and the command line,
//! without its passwords.

use std::process::Command;
use std::time::{Duration, Instant};

use cloudweb_e2e::services::{call, cli, ensure_service_images, running_url, service_ports, services_node, until, AGENT_FLAGS};
use cloudweb_e2e::{start_platform, unique_name, wait_for, AgentNode, Platform, ServerProcess};
use reqwest::Method;
use serde_json::json;

/// Writes the URL it got into a file it serves.
const DOCKERFILE: &str = "FROM cloudweb-test/busybox:latest\n\
CMD [\"sh\", \"-c\", \"mkdir -p /www && echo \\\"$DATABASE_URL\\\" > /www/url && exec httpd -f -p 8080 -h /www\"]\n";
/// The minor version the upgrade goes to: the same image under another
/// tag, made by this test.
const MINOR: &str = "15.99";


fn docker(args: &[&str]) -> String {
    let out = Command::new("docker").args(args).output().unwrap();
    assert!(out.status.success(), "docker {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// A client of the service's image in a throwaway container on the
/// default bridge, like an app: whether it succeeded, and its output.
fn client(image: &str, args: &[&str]) -> (bool, String) {
    let name = unique_name("cw-client");
    let out = Command::new("docker").args(["run", "--rm", "--name", &name, image]).args(args).output().unwrap();
    (out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}

fn psql(url: &str, sql: &str) -> Result<String, String> {
    match client("cloudweb-test/postgres:15", &["psql", url, "-tAc", sql]) {
        (true, out) => Ok(out.trim().to_string()),
        (false, out) => Err(out),
    }
}

/// Removes the tag this test made, also when it fails.
struct Tag(String);

impl Drop for Tag {
    fn drop(&mut self) {
        let _ = Command::new("docker").args(["rmi", &self.0]).output();
    }
}

fn password_of(url: &str) -> String {
    url.split("://").nth(1).unwrap().split('@').next().unwrap().split(':').nth(1).unwrap().to_string()
}

/// Waits until the service's logs hold `text` (any case); returns them.
async fn logs_with(server: &ServerProcess, agent: &AgentNode, name: &str, text: &str) -> String {
    wait_for(Duration::from_secs(30), &format!("service {name}'s logs to say {text:?}"), || async {
        let (status, logs) = server.call(Method::GET, &format!("/api/services/{name}/logs?lines=2000"), None).await.ok()?;
        (status == 200 && logs.to_string().to_lowercase().contains(text)).then(|| logs.to_string())
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\nagent log:\n{}", agent.log_text()))
}

#[tokio::test]
async fn a_postgres_password_rotates_its_version_changes_on_the_same_data_and_a_node_restart_is_reported() {
    ensure_service_images();
    let ports = service_ports();
    // A repository without a tag: versions are its tags.
    let flags = ["--service-image", "postgres=cloudweb-test/postgres", "--service-ports", &ports, "--unreachable-after-seconds", "5"];
    let Platform { tmp, git, server } = start_platform(&flags).await.unwrap();
    let mut agent = services_node(&server, tmp.path(), "ops-node").await;
    let name = unique_name("pg");
    let (status, created) = call(&server, Method::POST, "/api/services", Some(json!({"name": name, "type": "postgres", "version": "15"}))).await;
    assert_eq!(status, 201, "{created}");
    assert_eq!(created["image"], "cloudweb-test/postgres:15");
    until(&server, &agent, &name, "healthy", Duration::from_secs(90), |v| v["state"] == "healthy").await;

    // A linked app, running with the first URL.
    git.commit("linked", &[("Dockerfile", DOCKERFILE)], "reads DATABASE_URL").unwrap();
    let app = unique_name("uses-db");
    let (status, body) = call(&server, Method::POST, "/api/apps", Some(json!({"name": app, "repo_url": git.url("linked"), "port": 8080}))).await;
    assert_eq!(status, 201, "{body}");
    let (status, _) = call(&server, Method::POST, &format!("/api/services/{name}/links"), Some(json!({"app": app}))).await;
    assert_eq!(status, 200);
    let (status, body) = call(&server, Method::POST, &format!("/api/apps/{app}/deploy"), None).await;
    assert_eq!(status, 201, "{body}");
    let (first, old_url) = running_url(&server, &app, None).await;
    let old_password = password_of(&old_url);
    assert_eq!(psql(&old_url, "CREATE TABLE kept (x int); INSERT INTO kept VALUES (42); SELECT x FROM kept").unwrap().lines().last(), Some("42"));

    // Rotated with the command line, which waits until it is done.
    let started = Instant::now();
    let (code, stdout, stderr) = cli(&server, &["services", "rotate-password", &name]);
    assert_eq!(code, 0, "{stdout}{stderr}\nagent log:\n{}", agent.log_text());
    assert!(stdout.contains("rotated") && stdout.contains(&app), "{stdout}");
    eprintln!("rotate-password -> done: {:.1} s", started.elapsed().as_secs_f64());
    let (second, new_url) = running_url(&server, &app, Some(&first)).await;
    eprintln!("rotate-password -> app redeployed: {:.1} s", started.elapsed().as_secs_f64());
    let new_password = password_of(&new_url);
    assert_ne!(new_password, old_password, "the redeployed app has the new password");
    assert_eq!(new_url.replace(&new_password, &old_password), old_url, "only the password changed");
    let refused = psql(&old_url, "SELECT 1").unwrap_err();
    assert!(refused.contains("password authentication failed"), "the old password is refused: {refused}");
    assert_eq!(psql(&new_url, "SELECT x FROM kept").unwrap(), "42", "the new one works, on the same data");
    let (_, view) = call(&server, Method::GET, &format!("/api/services/{name}"), None).await;
    assert!(view.get("rotation").is_none(), "finished: {view}");
    // Neither password in the API, the server's log or the agent's log.
    for password in [&old_password, &new_password] {
        for path in ["/api/services".to_string(), format!("/api/services/{name}"), format!("/api/apps/{app}")] {
            let (_, body) = call(&server, Method::GET, &path, None).await;
            assert!(!body.to_string().contains(password.as_str()), "{path} shows a password");
        }
        assert!(!server.process.log_text().contains(password.as_str()), "the server's log shows a password");
        assert!(!agent.log_text().contains(password.as_str()), "the agent's log shows a password");
    }

    // Its container's output, without either password.
    let logs = logs_with(&server, &agent, &name, "database system is ready to accept connections").await;
    for password in [&old_password, &new_password] {
        assert!(!logs.contains(password.as_str()), "the service's logs show a password");
    }
    let (code, stdout, stderr) = cli(&server, &["services", "logs", &name, "-n", "5"]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(stdout.lines().count(), 5, "{stdout}");
    let (status, _) = call(&server, Method::GET, &format!("/api/services/{name}/logs?lines=5000"), None).await;
    assert_eq!(status, 400);

    // A minor version: a new container of the new image on the same data.
    let _tag = Tag(format!("cloudweb-test/postgres:{MINOR}"));
    docker(&["tag", "cloudweb-test/postgres:15", &format!("cloudweb-test/postgres:{MINOR}")]);
    let before = docker(&["inspect", "-f", "{{.Id}}", &format!("cw-svc.{name}")]);
    let started = Instant::now();
    let (status, queued) = call(&server, Method::POST, &format!("/api/services/{name}/upgrade"), Some(json!({"version": MINOR}))).await;
    assert_eq!(status, 202, "{queued}");
    assert_eq!(queued["image"], format!("cloudweb-test/postgres:{MINOR}"));
    let upgraded = until(&server, &agent, &name, "healthy on the new version", Duration::from_secs(60), |v| v["state"] == "healthy").await;
    eprintln!("upgrade -> healthy: {:.1} s", started.elapsed().as_secs_f64());
    assert_eq!(upgraded["version"], MINOR);
    assert_eq!(docker(&["inspect", "-f", "{{.Config.Image}}", &format!("cw-svc.{name}")]), format!("cloudweb-test/postgres:{MINOR}"));
    assert_ne!(docker(&["inspect", "-f", "{{.Id}}", &format!("cw-svc.{name}")]), before, "a new container");
    assert_eq!(psql(&new_url, "SELECT x FROM kept").unwrap(), "42", "the data and the password stay");
    // A major version, a bad one, the same one: refused, nothing changed.
    let (status, answer) = call(&server, Method::POST, &format!("/api/services/{name}/upgrade"), Some(json!({"version": "16", "writes_stopped": true}))).await;
    assert_eq!(status, 409, "{answer}");
    let message = answer["error"].as_str().unwrap();
    assert!(message.contains("major") && message.contains("pg_dump") && message.contains("no backup destination"), "{message}");
    let (status, _) = call(&server, Method::POST, &format!("/api/services/{name}/upgrade"), Some(json!({"version": "latest"}))).await;
    assert_eq!(status, 400);
    let (status, _) = call(&server, Method::POST, &format!("/api/services/{name}/upgrade"), Some(json!({"version": MINOR}))).await;
    assert_eq!(status, 409);
    let (code, _, stderr) = cli(&server, &["services", "upgrade", &name, "--version", "16"]);
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("dump"), "{stderr}");

    // The node restarts: the agent is killed, the host's shutdown stops
    // the container; the agent comes back, reports it restarting, starts
    // it, and it is healthy with its data, its row as it was.
    let (_, row_before) = call(&server, Method::GET, &format!("/api/services/{name}"), None).await;
    agent.kill();
    docker(&["stop", &format!("cw-svc.{name}")]);
    agent.start(&AGENT_FLAGS).unwrap();
    let restarted = Instant::now();
    let mut seen: Vec<String> = Vec::new();
    while restarted.elapsed() < Duration::from_secs(60) {
        let (_, view) = call(&server, Method::GET, &format!("/api/services/{name}"), None).await;
        let state = view["state"].as_str().unwrap_or("").to_string();
        if seen.last() != Some(&state) {
            seen.push(state.clone());
        }
        if state == "healthy" && seen.iter().any(|s| s == "restarting") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    eprintln!("node restart: states {seen:?}, healthy after {:.1} s", restarted.elapsed().as_secs_f64());
    let restarting = seen.iter().position(|s| s == "restarting").unwrap_or_else(|| panic!("never restarting: {seen:?}\n{}", agent.log_text()));
    assert!(seen[restarting..].iter().any(|s| s == "healthy"), "restarting, then healthy: {seen:?}");
    assert_eq!(psql(&new_url, "SELECT x FROM kept").unwrap(), "42");
    let (_, row_after) = call(&server, Method::GET, &format!("/api/services/{name}"), None).await;
    for field in ["name", "type", "version", "image", "node_id", "volume", "links", "address", "created_at"] {
        assert_eq!(row_after[field], row_before[field], "{field}");
    }

    // The agent dies just after a rotation was asked for: the rotation
    // waits in the node's queue, says so, and the database keeps taking
    // the password it had; once the agent is back it finishes and the app
    // is redeployed again.
    agent.kill();
    let (status, view) = call(&server, Method::POST, &format!("/api/services/{name}/rotate-password"), None).await;
    assert_eq!(status, 202, "the node is not yet counted unreachable: {view}");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (_, view) = call(&server, Method::GET, &format!("/api/services/{name}"), None).await;
    assert!(view["rotation"]["detail"].as_str().unwrap().contains("has not run generation"), "{view}");
    assert_eq!(psql(&new_url, "SELECT x FROM kept").unwrap(), "42", "the database still takes the password it had");
    agent.start(&AGENT_FLAGS).unwrap();
    until(&server, &agent, &name, "the queued rotation finished", Duration::from_secs(60), |v| v.get("rotation").is_none() && v["state"] == "healthy").await;
    let (_, third_url) = running_url(&server, &app, Some(&second)).await;
    assert_ne!(third_url, new_url);
    assert!(psql(&new_url, "SELECT 1").unwrap_err().contains("password authentication failed"));
    assert_eq!(psql(&third_url, "SELECT x FROM kept").unwrap(), "42");

    // Its node unreachable: a rotation is refused and changes nothing.
    agent.kill();
    until(&server, &agent, &name, "unknown", Duration::from_secs(30), |v| v["state"] == "unknown").await;
    let (status, answer) = call(&server, Method::POST, &format!("/api/services/{name}/rotate-password"), None).await;
    assert_eq!(status, 503, "{answer}");
    assert!(answer["error"].as_str().unwrap().contains("not reachable"), "{answer}");
    assert_eq!(psql(&third_url, "SELECT x FROM kept").unwrap(), "42", "the password is as it was");
    let (_, view) = call(&server, Method::GET, &format!("/api/services/{name}"), None).await;
    assert!(view.get("rotation").is_none(), "{view}");
}

/// Redis and MariaDB: the old password refused by redis-cli and the
/// mariadb client, the new one taken; an image the operator pinned keeps
/// its version.
#[tokio::test]
async fn redis_and_mariadb_passwords_rotate_and_a_pinned_image_keeps_its_version() {
    ensure_service_images();
    let ports = service_ports();
    let flags = ["--service-image", "redis=cloudweb-test/redis:7", "--service-image", "mariadb=cloudweb-test/mariadb:10", "--service-ports", &ports];
    let Platform { tmp, server, .. } = start_platform(&flags).await.unwrap();
    let agent = services_node(&server, tmp.path(), "kv-ops").await;
    let (redis, maria) = (unique_name("kv"), unique_name("sql"));
    for (name, kind) in [(&redis, "redis"), (&maria, "mariadb")] {
        let (status, body) = call(&server, Method::POST, "/api/services", Some(json!({"name": name, "type": kind}))).await;
        assert_eq!(status, 201, "{body}");
    }
    // Linked to an app that runs nothing: nothing to redeploy.
    let app = unique_name("idle");
    let (status, _) = call(&server, Method::POST, "/api/apps", Some(json!({"name": app, "repo_url": "https://git.example.com/a.git", "port": 80}))).await;
    assert_eq!(status, 201);
    let (status, _) = call(&server, Method::POST, &format!("/api/services/{maria}/links"), Some(json!({"app": app}))).await;
    assert_eq!(status, 200);
    let kv = until(&server, &agent, &redis, "healthy", Duration::from_secs(60), |v| v["state"] == "healthy").await;
    let sql = until(&server, &agent, &maria, "healthy", Duration::from_secs(120), |v| v["state"] == "healthy").await;
    let kv_address = kv["address"].as_str().unwrap().to_string();
    let (host, port) = sql["address"].as_str().unwrap().rsplit_once(':').map(|(h, p)| (h.to_string(), p.to_string())).unwrap();
    let env_of = |name: &str, variable: &str| docker(&["exec", &format!("cw-svc.{name}"), "sh", "-c", &format!("printf %s \"${variable}\"")]);
    let redis_cli = |password: &str| client("cloudweb-test/redis:7", &["redis-cli", "-u", &format!("redis://default:{password}@{kv_address}/0"), "ping"]);
    let mariadb = |password: &str| {
        client("cloudweb-test/mariadb:10", &["mariadb", "-h", &host, "-P", &port, "-u", "app", &format!("-p{password}"), "app", "-e", "SELECT 6*7"])
    };
    let (old_kv, old_sql) = (env_of(&redis, "REDISCLI_AUTH"), env_of(&maria, "MARIADB_PASSWORD"));
    let (ok, out) = client("cloudweb-test/redis:7", &["redis-cli", "-u", &format!("redis://default:{old_kv}@{kv_address}/0"), "set", "kept", "42"]);
    assert!(ok && out.contains("OK"), "{out}");
    let (ok, out) = mariadb(&old_sql);
    assert!(ok && out.contains("42"), "{out}");

    for name in [&redis, &maria] {
        let started = Instant::now();
        let (status, view) = call(&server, Method::POST, &format!("/api/services/{name}/rotate-password"), None).await;
        assert_eq!(status, 202, "{view}");
        assert!(view["rotation"]["detail"].is_string(), "{view}");
        let (status, answer) = call(&server, Method::POST, &format!("/api/services/{name}/rotate-password"), None).await;
        assert_eq!(status, 409, "one rotation at a time: {answer}");
        until(&server, &agent, name, "rotated", Duration::from_secs(90), |v| v.get("rotation").is_none() && v["state"] == "healthy").await;
        eprintln!("{name}: rotate -> done: {:.1} s", started.elapsed().as_secs_f64());
    }
    let (new_kv, new_sql) = (env_of(&redis, "REDISCLI_AUTH"), env_of(&maria, "MARIADB_PASSWORD"));
    assert_ne!(new_kv, old_kv);
    assert_ne!(new_sql, old_sql);
    let (_, out) = redis_cli(&old_kv);
    assert!(out.contains("WRONGPASS") || out.contains("NOAUTH") || out.contains("invalid"), "the old Redis password is refused: {out}");
    let (ok, out) = client("cloudweb-test/redis:7", &["redis-cli", "-u", &format!("redis://default:{new_kv}@{kv_address}/0"), "get", "kept"]);
    assert!(ok && out.contains("42"), "the new one works, with the data: {out}");
    let (ok, out) = mariadb(&old_sql);
    assert!(!ok && out.contains("Access denied"), "the old MariaDB password is refused: {out}");
    let (ok, out) = mariadb(&new_sql);
    assert!(ok && out.contains("42"), "the new one works: {out}");
    let kv_logs = logs_with(&server, &agent, &redis, "ready to accept connections").await;
    let sql_logs = logs_with(&server, &agent, &maria, "ready for connections").await;
    for password in [&old_kv, &new_kv, &old_sql, &new_sql] {
        assert!(!kv_logs.contains(password.as_str()) && !sql_logs.contains(password.as_str()), "a service's logs show a password");
        assert!(!agent.log_text().contains(password.as_str()), "the agent's log shows a password");
        assert!(!server.process.log_text().contains(password.as_str()), "the server's log shows a password");
    }

    // Setting the password fails (root's password was changed by hand,
    // so the node cannot log in to change it): the service says so, the
    // rotation stays unfinished, and the database keeps the password it
    // had, which apps keep getting. Once root is as it was, the node's
    // next try finishes it.
    let as_root = |sql: &str, pwd_var: &str| {
        docker(&["exec", &format!("cw-svc.{maria}"), "sh", "-c", &format!("MYSQL_PWD=\"${pwd_var}\" mariadb -uroot -e \"{sql}\"")])
    };
    as_root("SET PASSWORD FOR root@localhost = PASSWORD('changed-by-hand')", "MARIADB_ROOT_PASSWORD");
    let (status, _) = call(&server, Method::POST, &format!("/api/services/{maria}/rotate-password"), None).await;
    assert_eq!(status, 202);
    let failed = until(&server, &agent, &maria, "failing to set the password", Duration::from_secs(60), |v| v["state"] == "failed").await;
    assert!(failed["detail"].as_str().unwrap().contains("could not set the password (mariadb exited with code"), "{failed}");
    assert!(failed["rotation"]["detail"].as_str().unwrap().contains("could not set the password"), "{failed}");
    let newest = env_of(&maria, "MARIADB_PASSWORD");
    assert_ne!(newest, new_sql);
    let (ok, out) = mariadb(&new_sql);
    assert!(ok && out.contains("42"), "the database keeps the password it had: {out}");
    let (ok, _) = mariadb(&newest);
    assert!(!ok, "the new one is not taken yet");
    docker(&["exec", &format!("cw-svc.{maria}"), "sh", "-c", "MYSQL_PWD=changed-by-hand mariadb -uroot -e \"SET PASSWORD FOR root@localhost = PASSWORD('$MARIADB_ROOT_PASSWORD')\""]);
    until(&server, &agent, &maria, "rotated after all", Duration::from_secs(60), |v| v.get("rotation").is_none() && v["state"] == "healthy").await;
    let (ok, out) = mariadb(&new_sql);
    assert!(!ok && out.contains("Access denied"), "{out}");
    let (ok, out) = mariadb(&newest);
    assert!(ok && out.contains("42"), "{out}");
    assert!(!agent.log_text().contains(newest.as_str()) && !server.process.log_text().contains(newest.as_str()));

    // The agent route: another node cannot write into this node's
    // service, an unknown service is refused, a malformed upload is a 400.
    let (token, ca) = server.join_token().await.unwrap();
    let other = AgentNode::join(&server, &tmp.path().join("other"), "other", &token, &ca, &[]).unwrap().unwrap();
    let url = format!("{}/agent/v1/service-logs", server.url());
    let headers = [("x-cloudweb-protocol", "1"), ("x-cloudweb-agent-version", "0.1.0")];
    let forged = |service: &str| {
        json!({"services": [{"service": service, "lines": [{"ts": "2026-12-01T10:00:00.000000001Z", "stream": "stdout", "line": "forged"}]}]})
            .to_string()
    };
    let (status, answer) = other.raw_client().send(Method::POST, &url, &headers, Some(&forged(&redis))).await.unwrap();
    assert_eq!(status, 200, "{answer}");
    assert!(answer.contains("does not run on this node") && answer.contains("\"accepted\":0"), "{answer}");
    let (_, answer) = agent.raw_client().send(Method::POST, &url, &headers, Some(&forged("nope"))).await.unwrap();
    assert!(answer.contains("no service nope"), "{answer}");
    let bad = json!({"services": [{"service": redis, "lines": [{"ts": "x", "stream": "build", "line": "x"}]}]}).to_string();
    let (status, answer) = agent.raw_client().send(Method::POST, &url, &headers, Some(&bad)).await.unwrap();
    assert_eq!(status, 400, "{answer}");
    let (_, logs) = call(&server, Method::GET, &format!("/api/services/{redis}/logs?lines=2000"), None).await;
    assert!(!logs.to_string().contains("forged"), "{logs}");

    // The operator pinned the image (a tag): the version is theirs.
    let (status, answer) = call(&server, Method::POST, &format!("/api/services/{maria}/upgrade"), Some(json!({"version": "10.99"}))).await;
    assert_eq!(status, 409, "{answer}");
    assert!(answer["error"].as_str().unwrap().contains("--service-image"), "{answer}");
    for name in [&redis, &maria] {
        let _ = call(&server, Method::DELETE, &format!("/api/services/{name}/links/{app}"), None).await;
        let (status, _) = call(&server, Method::DELETE, &format!("/api/services/{name}?data=delete"), None).await;
        assert_eq!(status, 204);
    }
}
