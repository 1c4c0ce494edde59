//! Issue 23, a PostgreSQL major version upgrade through the backup path,
//! end to end with the real binaries, restic and the local PostgreSQL 15
//! and 17 images (Debian bookworm's and trixie's, from
//! `scripts/service-images.sh`): refused without a backup destination;
//! `cloudweb services upgrade db --version 17` backs db up, restores the
//! dump into a new service db-17 running PostgreSQL 17, moves db's link to
//! it and redeploys the app with the new URL; the rows are identical on
//! both; db runs on untouched; an older major version, a second upgrade
//! into a taken name and an upgrade after a backup failed its verification
//! are refused. A backup held up inside pg_dump (its table locked) ends
//! `cancelled` when its service is deleted and `failed` when its node goes
//! away (the agent killed), leaving no restic behind, and no pg_dump once
//! the agent is back.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use cloudweb_e2e::services::{call, cli, ensure_service_images, psql_in as psql, running_url, service_ports, services_node, until, AGENT_FLAGS};
use cloudweb_e2e::{start_platform, unique_name, wait_for, AgentNode, Platform, ServerProcess};
use reqwest::Method;
use serde_json::{json, Value};

/// Writes the URL it got into a file it serves.
const DOCKERFILE: &str = "FROM cloudweb-test/busybox:latest\n\
CMD [\"sh\", \"-c\", \"mkdir -p /www && echo \\\"$DATABASE_URL\\\" > /www/url && exec httpd -f -p 8080 -h /www\"]\n";

const CHECKSUM: &str = "SELECT count(*) || ':' || md5(string_agg(id || ':' || body, ',' ORDER BY id)) FROM items";

/// SQL over the URL an app got, from a client container like an app.
fn psql_url(url: &str, sql: &str) -> Result<String, String> {
    let name = unique_name("cw-client");
    let out = Command::new("docker").args(["run", "--rm", "--name", &name, "cloudweb-test/postgres:17", "psql", url, "-tAc", sql]).output().unwrap();
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).to_string())
    }
}

/// Holds an exclusive lock on `items` in service `service` (a pg_dump
/// waits for it) until dropped: its session is then ended from the
/// database (killing the `docker exec` client would leave its psql).
struct Lock {
    service: String,
    child: std::process::Child,
}

impl Lock {
    fn take(service: &str) -> Lock {
        let child = Command::new("docker")
            .args(["exec", &format!("cw-svc.{service}"), "psql", "dbname=app user=app application_name=cw-lock", "-c"])
            .arg("BEGIN; LOCK TABLE items IN ACCESS EXCLUSIVE MODE; SELECT pg_sleep(600);")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        Lock { service: service.to_string(), child }
    }
}

impl Drop for Lock {
    fn drop(&mut self) {
        let _ = psql(&self.service, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'cw-lock'");
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// How many sessions of `service` run `application_name`.
fn sessions(service: &str, application: &str) -> Option<u32> {
    psql(service, &format!("SELECT count(*) FROM pg_stat_activity WHERE application_name = '{application}' AND pid <> pg_backend_pid()")).ok()?.parse().ok()
}

/// Whether a pg_dump process runs in service `service`'s container.
fn dump_process(service: &str) -> bool {
    let out = Command::new("docker").args(["top", &format!("cw-svc.{service}"), "-o", "pid,comm"]).output().unwrap();
    String::from_utf8_lossy(&out.stdout).lines().any(|l| l.split_whitespace().nth(1) == Some("pg_dump"))
}

/// restic processes whose environment names `repository`.
fn restic_processes(repository: &Path) -> Vec<u32> {
    let needle = repository.to_string_lossy().into_owned();
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else { continue };
        let comm = std::fs::read_to_string(entry.path().join("comm")).unwrap_or_default();
        let environ = std::fs::read(entry.path().join("environ")).unwrap_or_default();
        if comm.trim() == "restic" && String::from_utf8_lossy(&environ).contains(&needle) {
            found.push(pid);
        }
    }
    found
}

/// Starts a backup of `service` with its table locked, and waits until its
/// pg_dump waits for the lock: the job id and the lock.
async fn held_backup(server: &ServerProcess, agent: &AgentNode, service: &str) -> (String, Lock) {
    let lock = Lock::take(service);
    wait_for(Duration::from_secs(20), "the lock", || async {
        (psql(service, "SELECT count(*) FROM pg_locks WHERE mode = 'AccessExclusiveLock' AND relation = 'items'::regclass").ok()? == "1").then_some(())
    })
    .await
    .unwrap();
    let (status, job) = call(server, Method::POST, &format!("/api/services/{service}/backups"), None).await;
    assert_eq!(status, 202, "{job}");
    let id = job["id"].as_str().unwrap().to_string();
    wait_for(Duration::from_secs(30), "pg_dump to wait for the lock", || async { (sessions(service, "pg_dump")? == 1).then_some(()) })
        .await
        .unwrap_or_else(|e| panic!("{e}\nagent log:\n{}", agent.log_text()));
    let (_, running) = call(server, Method::GET, &format!("/api/backups/{id}"), None).await;
    assert_eq!(running["state"], "running", "{running}");
    (id, lock)
}

async fn job_ended(server: &ServerProcess, agent: &AgentNode, id: &str) -> Value {
    wait_for(Duration::from_secs(30), &format!("job {id} to end"), || async {
        let (_, job) = server.call(Method::GET, &format!("/api/backups/{id}"), None).await.ok()?;
        (!matches!(job["state"].as_str(), Some("queued" | "running"))).then_some(job)
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\nagent log:\n{}", agent.log_text()))
}

/// Flips bytes in every pack file of the restic repository under `dir`.
fn damage_packs(dir: &Path) -> usize {
    let mut damaged = 0;
    for prefix in std::fs::read_dir(dir.join("data")).unwrap() {
        for pack in std::fs::read_dir(prefix.unwrap().path()).unwrap() {
            let path = pack.unwrap().path();
            let mut bytes = std::fs::read(&path).unwrap();
            let (middle, end) = (bytes.len() / 2, (bytes.len() / 2 + 64).min(bytes.len()));
            for b in &mut bytes[middle..end] {
                *b ^= 0xff;
            }
            std::fs::write(&path, bytes).unwrap();
            damaged += 1;
        }
    }
    damaged
}

#[tokio::test]
async fn a_postgres_15_service_upgrades_to_17_through_a_backup_and_its_app_follows() {
    ensure_service_images();
    let ports = service_ports();
    // A repository without a tag: versions are its tags.
    let flags = ["--service-image", "postgres=cloudweb-test/postgres", "--service-ports", &ports, "--unreachable-after-seconds", "5"];
    let Platform { tmp, git, server } = start_platform(&flags).await.unwrap();
    let mut agent = services_node(&server, tmp.path(), "upgrade-node").await;
    let name = unique_name("pg");
    let (status, created) = call(&server, Method::POST, "/api/services", Some(json!({"name": name, "type": "postgres", "version": "15"}))).await;
    assert_eq!(status, 201, "{created}");
    until(&server, &agent, &name, "healthy", Duration::from_secs(90), |v| v["state"] == "healthy").await;
    let rows = "CREATE TABLE items (id int PRIMARY KEY, body text); INSERT INTO items SELECT g, md5(g::text) FROM generate_series(1, 5000) g";
    wait_for(Duration::from_secs(60), "the database to answer", || async { psql(&name, rows).ok() }).await.unwrap();
    let before = psql(&name, CHECKSUM).unwrap();
    assert!(before.starts_with("5000:"), "{before}");

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

    // Without saying the writes are stopped: refused, saying why (the new
    // service holds the data as of the dump).
    let (status, answer) = call(&server, Method::POST, &format!("/api/services/{name}/upgrade"), Some(json!({"version": "17"}))).await;
    assert_eq!(status, 409, "{answer}");
    assert!(answer["error"].as_str().unwrap().contains("writes_stopped"), "{answer}");
    // No destination: refused, saying why; nothing changes.
    let (status, answer) = call(&server, Method::POST, &format!("/api/services/{name}/upgrade"), Some(json!({"version": "17", "writes_stopped": true}))).await;
    assert_eq!(status, 409, "{answer}");
    assert!(answer["error"].as_str().unwrap().contains("no backup destination"), "{answer}");
    let target = tmp.path().join("backups");
    std::fs::create_dir_all(&target).unwrap();
    let (status, created) = call(&server, Method::POST, "/api/backup-destinations", Some(json!({"name": "local", "kind": "path", "path": target.to_string_lossy()}))).await;
    assert_eq!(status, 201, "{created}");

    // The upgrade, with the command line, which waits until it is done.
    let started = Instant::now();
    let (code, stdout, stderr) = cli(&server, &["services", "upgrade", &name, "--version", "17", "--writes-stopped"]);
    let new_name = format!("{name}-17");
    assert_eq!(code, 0, "{stdout}{stderr}\nagent log:\n{}", agent.log_text());
    assert!(stdout.contains(&format!("now runs as service {new_name}")), "{stdout}");
    eprintln!("major upgrade 15 -> 17 of 5000 rows: {:.1} s", started.elapsed().as_secs_f64());
    let (_, old) = call(&server, Method::GET, &format!("/api/services/{name}"), None).await;
    let upgrade = &old["upgrade"];
    assert_eq!((upgrade["state"].as_str(), upgrade["to_service"].as_str()), (Some("switched"), Some(new_name.as_str())), "{old}");
    let (_, backup) = call(&server, Method::GET, &format!("/api/backups/{}", upgrade["backup_job"].as_str().unwrap()), None).await;
    assert_eq!((backup["state"].as_str(), backup["trigger"].as_str()), (Some("succeeded"), Some("upgrade")), "{backup}");
    let new = until(&server, &agent, &new_name, "healthy", Duration::from_secs(60), |v| v["state"] == "healthy").await;
    assert_eq!((new["version"].as_str(), new["image"].as_str()), (Some("17"), Some("cloudweb-test/postgres:17")), "{new}");
    assert!(psql(&new_name, "SHOW server_version").unwrap().starts_with("17."), "PostgreSQL 17 runs it");
    assert_eq!(psql(&new_name, CHECKSUM).unwrap(), before, "the rows are identical on 17");
    // The link moved; the app runs again with the new service's URL.
    assert_eq!(new["links"][0]["app"], app.as_str(), "{new}");
    assert!(old["links"].as_array().unwrap().is_empty(), "{old}");
    let (_, new_url) = running_url(&server, &app, Some(&first)).await;
    assert_ne!(new_url, old_url);
    assert_eq!(psql_url(&new_url, CHECKSUM).unwrap(), before, "the app's new URL reaches the upgraded rows");
    // The old service runs on, untouched, until deleted by name.
    assert_eq!(old["state"], "healthy", "{old}");
    assert!(psql(&name, "SHOW server_version").unwrap().starts_with("15."));
    assert_eq!(psql(&name, CHECKSUM).unwrap(), before);

    // Refusals, each with its reason.
    let (status, answer) = call(&server, Method::POST, &format!("/api/services/{new_name}/upgrade"), Some(json!({"version": "15"}))).await;
    assert_eq!(status, 409, "{answer}");
    assert!(answer["error"].as_str().unwrap().contains("older major"), "{answer}");
    let (status, answer) = call(&server, Method::POST, &format!("/api/services/{name}/upgrade"), Some(json!({"version": "17", "writes_stopped": true}))).await;
    assert_eq!(status, 409, "{answer}");
    assert!(answer["error"].as_str().unwrap().contains("exists already"), "{answer}");

    // An upgrade held up in its backup: its services cannot be deleted
    // under it, and `cancel-upgrade` stops it, cancelling the backup.
    let repository = target.join("data");
    let lock = Lock::take(&new_name);
    wait_for(Duration::from_secs(20), "the lock", || async {
        (psql(&new_name, "SELECT count(*) FROM pg_locks WHERE mode = 'AccessExclusiveLock' AND relation = 'items'::regclass").ok()? == "1").then_some(())
    })
    .await
    .unwrap();
    let (status, answer) = call(&server, Method::POST, &format!("/api/services/{new_name}/upgrade"), Some(json!({"version": "18", "writes_stopped": true}))).await;
    assert_eq!(status, 202, "{answer}");
    wait_for(Duration::from_secs(30), "the upgrade's pg_dump to wait for the lock", || async { (sessions(&new_name, "pg_dump")? == 1).then_some(()) })
        .await
        .unwrap_or_else(|e| panic!("{e}\nagent log:\n{}", agent.log_text()));
    let (_, upgrading) = call(&server, Method::GET, &format!("/api/services/{new_name}"), None).await;
    assert_eq!(upgrading["upgrade"]["state"], "backing_up", "{upgrading}");
    let upgrade_backup = upgrading["upgrade"]["backup_job"].as_str().unwrap().to_string();
    let (status, answer) = call(&server, Method::DELETE, &format!("/api/services/{new_name}"), None).await;
    assert_eq!(status, 409, "{answer}");
    assert!(answer["error"].as_str().unwrap().contains("cancel-upgrade"), "{answer}");
    let (code, stdout, stderr) = cli(&server, &["services", "cancel-upgrade", &new_name]);
    assert_eq!(code, 0, "{stdout}{stderr}");
    let ended = job_ended(&server, &agent, &upgrade_backup).await;
    assert_eq!(ended["state"], "cancelled", "{ended}");
    let (_, after) = call(&server, Method::GET, &format!("/api/services/{new_name}"), None).await;
    assert_eq!(after["upgrade"]["state"], "failed", "{after}");
    assert_eq!(after["state"], "healthy", "{after}");
    // Its dump stopped while the lock is still held (a dump left running
    // would wait for it); its session ends once the lock goes.
    wait_for(Duration::from_secs(30), "the cancelled upgrade's pg_dump to stop", || async { (!dump_process(&new_name)).then_some(()) })
        .await
        .unwrap_or_else(|e| panic!("{e}\nagent log:\n{}", agent.log_text()));
    drop(lock);
    wait_for(Duration::from_secs(30), "pg_dump's session to end", || async { (sessions(&new_name, "pg_dump")? == 0).then_some(()) }).await.unwrap();
    wait_for(Duration::from_secs(20), "no restic left", || async { restic_processes(&repository).is_empty().then_some(()) }).await.unwrap();
    let (status, answer) = call(&server, Method::GET, &format!("/api/services/{new_name}-18"), None).await;
    assert_eq!(status, 404, "nothing made: {answer}");
    // A backup held up in pg_dump while its service is deleted: cancelled,
    // and neither pg_dump nor restic goes on.
    let (held, lock) = held_backup(&server, &agent, &name).await;
    let deleting = Instant::now();
    let (status, answer) = call(&server, Method::DELETE, &format!("/api/services/{name}"), None).await;
    assert!(status == 200 || status == 204, "{status} {answer}");
    let ended = job_ended(&server, &agent, &held).await;
    eprintln!("backup of a deleted service ended {} in {:.1} s", ended["state"], deleting.elapsed().as_secs_f64());
    assert_eq!(ended["state"], "cancelled", "{ended}");
    drop(lock);
    wait_for(Duration::from_secs(20), "no restic left", || async { restic_processes(&repository).is_empty().then_some(()) }).await.unwrap();

    // The same while its node goes away (the agent killed): failed, saying
    // why; once the agent is back and the lock gone, nothing is left.
    let (held, lock) = held_backup(&server, &agent, &new_name).await;
    let killed = Instant::now();
    agent.kill();
    let ended = job_ended(&server, &agent, &held).await;
    eprintln!("backup on a node that went away ended {} in {:.1} s", ended["state"], killed.elapsed().as_secs_f64());
    assert_eq!(ended["state"], "failed", "{ended}");
    assert!(ended["message"].as_str().unwrap().contains("went away"), "{ended}");
    assert!(restic_processes(&repository).is_empty(), "restic died with its agent");
    assert!(dump_process(&new_name), "the dead agent's pg_dump waits on in the service's container");
    agent.start(&AGENT_FLAGS).unwrap();
    until(&server, &agent, &new_name, "healthy after the agent came back", Duration::from_secs(60), |v| v["state"] == "healthy").await;
    // The lock still held: the dump the dead agent left would wait for it
    // forever; the new agent kills it. (Its database session waits on
    // until the lock goes: a backend waiting for a lock does not look at
    // its client.)
    wait_for(Duration::from_secs(30), "no pg_dump process and no restic left", || async {
        (!dump_process(&new_name) && restic_processes(&repository).is_empty()).then_some(())
    })
    .await
    .unwrap_or_else(|e| panic!("{e}: restic {:?}\nagent log:\n{}", restic_processes(&repository), agent.log_text()));
    drop(lock);
    wait_for(Duration::from_secs(30), "pg_dump's session to end", || async { (sessions(&new_name, "pg_dump")? == 0).then_some(()) }).await.unwrap();
    assert_eq!(psql(&new_name, CHECKSUM).unwrap(), before);

    // A damaged repository: the newest backup fails its verification, and
    // an upgrade from it is refused before anything is made.
    let (status, job) = call(&server, Method::POST, &format!("/api/services/{new_name}/backups"), None).await;
    assert_eq!(status, 202, "{job}");
    let newest = job_ended(&server, &agent, job["id"].as_str().unwrap()).await;
    assert_eq!(newest["state"], "succeeded", "{newest}");
    let newest_id = newest["id"].as_str().unwrap().to_string();
    assert!(damage_packs(&repository) > 0);
    let (status, job) = call(&server, Method::POST, &format!("/api/backups/{newest_id}/verify"), None).await;
    assert_eq!(status, 202, "{job}");
    wait_for(Duration::from_secs(120), "the verification to fail", || async {
        let (_, b) = server.call(Method::GET, &format!("/api/backups/{newest_id}"), None).await.ok()?;
        (b["verification"]["state"] == "failed").then_some(())
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\nagent log:\n{}", agent.log_text()));
    let (status, answer) = call(&server, Method::POST, &format!("/api/services/{new_name}/upgrade"), Some(json!({"version": "18", "writes_stopped": true}))).await;
    assert_eq!(status, 409, "{answer}");
    assert!(answer["error"].as_str().unwrap().contains("failed its verification"), "{answer}");
    let (_, services) = call(&server, Method::GET, "/api/services", None).await;
    assert_eq!(services["services"].as_array().unwrap().len(), 1, "nothing made: {services}");
}
