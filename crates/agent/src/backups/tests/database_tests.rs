//! Backups of the managed databases with their real images (built by
//! `scripts/service-images.sh`, as the e2e services tests use them): a
//! dump made inside the service's container, verified in a throwaway
//! container that counts what it loaded, and restored, in place of the
//! service's data and into a new service with other credentials.

use std::collections::BTreeMap;
use std::time::Duration;

use cloudweb_protocol::{BackupSource, Expected, JobState, Replace, ServiceKind, ServicePayload, VerifyPayload};

use super::{ensure_script, job_id, ContainerGuard, Fixture};

const POSTGRES: &str = "cloudweb-test/postgres:15";
const REDIS: &str = "cloudweb-test/redis:7";
const MARIADB: &str = "cloudweb-test/mariadb:10";

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A service's spec as the control plane makes it (`cloudweb_core::services::payload`).
fn spec(kind: ServiceKind, service: &str, password: &str) -> ServicePayload {
    let strings = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let (image, env, command, health) = match kind {
        ServiceKind::Postgres => (
            POSTGRES,
            BTreeMap::from([
                ("POSTGRES_PASSWORD".to_string(), password.to_string()),
                ("POSTGRES_USER".to_string(), "app".to_string()),
                ("POSTGRES_DB".to_string(), "app".to_string()),
                ("PGDATA".to_string(), kind.data_path().to_string()),
            ]),
            Vec::new(),
            strings(&["pg_isready", "-h", "127.0.0.1", "-p", "5432", "-U", "app", "-d", "app"]),
        ),
        ServiceKind::Redis => (
            REDIS,
            BTreeMap::from([("REDISCLI_AUTH".to_string(), password.to_string())]),
            strings(&["redis-server", "--requirepass", password, "--appendonly", "yes", "--dir", "/data", "--bind", "0.0.0.0", "--protected-mode", "no"]),
            strings(&["sh", "-c", "[ \"$(redis-cli -h 127.0.0.1 ping)\" = PONG ]"]),
        ),
        ServiceKind::Mariadb => (
            MARIADB,
            BTreeMap::from([
                ("MARIADB_ROOT_PASSWORD".to_string(), format!("root-{password}")),
                ("MARIADB_USER".to_string(), "app".to_string()),
                ("MARIADB_PASSWORD".to_string(), password.to_string()),
                ("MARIADB_DATABASE".to_string(), "app".to_string()),
            ]),
            Vec::new(),
            strings(&["mariadb-admin", "ping", "-h", "127.0.0.1", "--silent"]),
        ),
    };
    ServicePayload {
        service: service.into(),
        kind,
        image: image.into(),
        env,
        command,
        volume: format!("{service}-data"),
        host_port: free_port(),
        memory_bytes: None,
        health,
        generation: 1,
        set_password: None,
    }
}

/// Starts the service's container as the supervisor does, and waits until
/// it answers.
async fn start(fx: &Fixture, spec: &ServicePayload) -> ContainerGuard {
    let guard = ContainerGuard(cloudweb_protocol::services::container_name(&spec.service));
    let dir = fx.volume(&spec.volume);
    std::fs::create_dir_all(&dir).unwrap();
    fx.runtime.start_service(spec, "127.0.0.1", &dir.to_string_lossy()).await.unwrap();
    wait_healthy(fx, spec).await;
    guard
}

async fn wait_healthy(fx: &Fixture, spec: &ServicePayload) {
    let started = std::time::Instant::now();
    while !fx.runtime.probe_service(&spec.service, &spec.health, Duration::from_secs(5)).await.unwrap_or(false) {
        assert!(started.elapsed() < Duration::from_secs(120), "{} did not answer", spec.service);
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// A command in the service's container; its output, which must be a
/// success.
async fn exec(fx: &Fixture, service: &str, cmd: &[&str], env: &[String]) -> String {
    let cmd: Vec<String> = cmd.iter().map(|s| s.to_string()).collect();
    let container = cloudweb_protocol::services::container_name(service);
    let (code, out) = fx.runtime.exec_output(&container, &cmd, env, Duration::from_secs(60)).await.unwrap();
    assert_eq!(code, Some(0), "{cmd:?}: {out}");
    out.trim().to_string()
}

fn source(spec: &ServicePayload) -> BackupSource {
    BackupSource::Service { service: spec.service.clone(), service_kind: spec.kind, volume: spec.volume.clone(), user: "app".into(), database: "app".into() }
}

fn verify(fx: &Fixture, spec: &ServicePayload, snapshot: &str, bytes: u64) -> VerifyPayload {
    VerifyPayload {
        job_id: job_id(),
        snapshot: snapshot.into(),
        source: source(spec),
        repository: fx.repository.clone(),
        image: Some(spec.image.clone()),
        expected: Some(Expected { files: 1, bytes }),
        read_data_percent: 100,
        timeout_seconds: 300,
    }
}

/// None of `secrets` is in any report.
fn no_secret_reported(fx: &Fixture, secrets: &[&str]) {
    for (job, report) in fx.recorder.reports.lock().unwrap().iter() {
        let text = serde_json::to_string(report).unwrap();
        assert!(secrets.iter().all(|s| !text.contains(s)), "{job}: {text}");
    }
}

/// No throwaway container of this node is left, nor a temporary directory.
fn nothing_left(fx: &Fixture) {
    let out = std::process::Command::new("docker")
        .args(["ps", "-aq", "--filter", &format!("label=cloudweb.node={}", fx.node), "--filter", "label=cloudweb.role=backup-throwaway"])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "", "throwaway containers left");
    for parent in [".verify", ".restoring"] {
        let dir = fx.data.join("volumes").join(parent);
        assert!(!dir.exists() || std::fs::read_dir(&dir).unwrap().count() == 0, "{parent} not empty");
    }
}

#[tokio::test]
async fn postgres_is_dumped_verified_and_restored_in_place_and_as_a_clone() {
    ensure_script("service-images.sh");
    let fx = Fixture::new().await;
    let name = format!("pg{}", &job_id()[3..11]);
    let db = spec(ServiceKind::Postgres, &name, "first-password-1234");
    let _service = start(&fx, &db).await;
    let psql = |sql: &'static str| ["psql", "-X", "-At", "-v", "ON_ERROR_STOP=1", "-U", "app", "-d", "app", "-c", sql];
    exec(&fx, &name, &psql("create table items (id int primary key, name text); insert into items select g, 'item ' || g from generate_series(1, 100) g"), &[]).await;
    exec(&fx, &name, &psql("create schema extra; create table extra.notes (body text); insert into extra.notes values ('a'), ('b'), ('c')"), &[]).await;
    let checksum = psql("select md5(string_agg(id || name, ',' order by id)) from items");
    let before = exec(&fx, &name, &checksum, &[]).await;

    let mut payload = fx.backup(source(&db));
    payload.exec_env.insert("PGPASSWORD".into(), "first-password-1234".into());
    let backup = fx.run(payload).await;
    assert_eq!(backup.state, Some(JobState::Succeeded), "{backup:?}");
    assert_eq!(backup.files, Some(1));
    let snapshot = backup.snapshot.clone().unwrap();

    let verified = fx.run_verify(verify(&fx, &db, &snapshot, backup.bytes.unwrap())).await;
    assert_eq!(verified.state, Some(JobState::Succeeded), "{verified:?}");
    assert_eq!(verified.counts, Some(BTreeMap::from([("public.items".to_string(), 100), ("extra.notes".to_string(), 3)])), "{verified:?}");
    assert!(verified.detail.as_deref().unwrap().contains("2 tables, 103 rows"), "{verified:?}");
    nothing_left(&fx);

    // The table dropped, then the service's data restored in place.
    exec(&fx, &name, &psql("drop table items"), &[]).await;
    fx.services.run(db.clone()).unwrap();
    let replace = Replace { volume: db.volume.clone(), keep_as: format!("{}-before-restore-1", db.volume) };
    let mut restore = fx.restore(&snapshot, source(&db), &format!("{name}-restore"), Some(replace.clone()));
    restore.service = Some(db.clone());
    let restored = fx.run_restore(restore).await;
    assert_eq!(restored.state, Some(JobState::Succeeded), "{restored:?}");
    assert!(!fx.services.is_held(&name));
    wait_healthy(&fx, &db).await;
    assert_eq!(exec(&fx, &name, &checksum, &[]).await, before, "the rows are back");
    assert!(fx.volume(&replace.keep_as).join("PG_VERSION").exists(), "the previous data is kept");

    // Cloned into a new service with its own password.
    let clone = spec(ServiceKind::Postgres, &format!("{name}c"), "clone-password-5678");
    let mut restore = fx.restore(&snapshot, source(&db), &clone.volume, None);
    restore.service = Some(clone.clone());
    let cloned = fx.run_restore(restore).await;
    assert_eq!(cloned.state, Some(JobState::Succeeded), "{cloned:?}");
    assert_eq!(cloned.counts.as_ref().and_then(|c| c.get("public.items")), Some(&100));
    let _clone_service = start(&fx, &clone).await;
    let over_tcp = ["psql", "-X", "-At", "postgresql://app@127.0.0.1:5432/app", "-c", "select md5(string_agg(id || name, ',' order by id)) from items"];
    assert_eq!(exec(&fx, &clone.service, &over_tcp, &["PGPASSWORD=clone-password-5678".to_string()]).await, before);
    nothing_left(&fx);
    no_secret_reported(&fx, &["first-password-1234", "clone-password-5678", &fx.repository.password]);
    let _ = fx.runtime.remove_service(&name).await;
    let _ = fx.runtime.remove_service(&clone.service).await;
}

#[tokio::test]
async fn redis_is_saved_verified_and_restored_in_place() {
    ensure_script("service-images.sh");
    let fx = Fixture::new().await;
    let name = format!("rd{}", &job_id()[3..11]);
    let db = spec(ServiceKind::Redis, &name, "redis-password-1234");
    let _service = start(&fx, &db).await;
    let mut mset = vec!["redis-cli", "-h", "127.0.0.1", "MSET"];
    let pairs: Vec<String> = (0..50).flat_map(|n| [format!("key{n}"), format!("value{n}")]).collect();
    mset.extend(pairs.iter().map(String::as_str));
    assert_eq!(exec(&fx, &name, &mset, &[]).await, "OK");

    let mut payload = fx.backup(source(&db));
    payload.exec_env.insert("REDISCLI_AUTH".into(), "redis-password-1234".into());
    let backup = fx.run(payload).await;
    assert_eq!(backup.state, Some(JobState::Succeeded), "{backup:?}");
    let snapshot = backup.snapshot.clone().unwrap();
    let verified = fx.run_verify(verify(&fx, &db, &snapshot, backup.bytes.unwrap())).await;
    assert_eq!(verified.state, Some(JobState::Succeeded), "{verified:?}");
    assert_eq!(verified.counts, Some(BTreeMap::from([("keys".to_string(), 50)])));

    exec(&fx, &name, &["redis-cli", "-h", "127.0.0.1", "FLUSHALL"], &[]).await;
    fx.services.run(db.clone()).unwrap();
    let replace = Replace { volume: db.volume.clone(), keep_as: format!("{}-before-restore-1", db.volume) };
    let mut restore = fx.restore(&snapshot, source(&db), &format!("{name}-restore"), Some(replace));
    restore.service = Some(db.clone());
    let restored = fx.run_restore(restore).await;
    assert_eq!(restored.state, Some(JobState::Succeeded), "{restored:?}");
    wait_healthy(&fx, &db).await;
    // Loaded from the append-only file the restore wrote.
    assert_eq!(exec(&fx, &name, &["redis-cli", "-h", "127.0.0.1", "DBSIZE"], &[]).await, "50");
    assert_eq!(exec(&fx, &name, &["redis-cli", "-h", "127.0.0.1", "GET", "key7"], &[]).await, "value7");
    assert!(fx.volume(&db.volume).join("appendonlydir").exists());
    nothing_left(&fx);
    no_secret_reported(&fx, &["redis-password-1234", &fx.repository.password]);
    let _ = fx.runtime.remove_service(&name).await;
}

#[tokio::test]
async fn mariadb_is_dumped_verified_and_cloned() {
    ensure_script("service-images.sh");
    let fx = Fixture::new().await;
    let name = format!("mdb{}", &job_id()[3..11]);
    let db = spec(ServiceKind::Mariadb, &name, "maria-password-1234");
    let _service = start(&fx, &db).await;
    let root = ["MYSQL_PWD=root-maria-password-1234".to_string()];
    let sql = |q: &'static str| ["mariadb", "--protocol=socket", "-uroot", "-N", "-B", "app", "-e", q];
    exec(&fx, &name, &sql("create table items (id int primary key, name text); insert into items select seq, concat('item ', seq) from seq_1_to_40"), &root).await;
    exec(&fx, &name, &sql("create table empty_one (x int)"), &root).await;

    let mut payload = fx.backup(source(&db));
    payload.exec_env.insert("MYSQL_PWD".into(), "maria-password-1234".into());
    let backup = fx.run(payload).await;
    assert_eq!(backup.state, Some(JobState::Succeeded), "{backup:?}");
    let snapshot = backup.snapshot.clone().unwrap();
    let verified = fx.run_verify(verify(&fx, &db, &snapshot, backup.bytes.unwrap())).await;
    assert_eq!(verified.state, Some(JobState::Succeeded), "{verified:?}");
    assert_eq!(verified.counts, Some(BTreeMap::from([("app.items".to_string(), 40), ("app.empty_one".to_string(), 0)])));

    let clone = spec(ServiceKind::Mariadb, &format!("{name}c"), "clone-password-5678");
    let mut restore = fx.restore(&snapshot, source(&db), &clone.volume, None);
    restore.service = Some(clone.clone());
    let cloned = fx.run_restore(restore).await;
    assert_eq!(cloned.state, Some(JobState::Succeeded), "{cloned:?}");
    let _clone_service = start(&fx, &clone).await;
    let count = ["mariadb", "--protocol=tcp", "-h", "127.0.0.1", "-uapp", "-N", "-B", "app", "-e", "select count(*) from items"];
    assert_eq!(exec(&fx, &clone.service, &count, &["MYSQL_PWD=clone-password-5678".to_string()]).await, "40");
    nothing_left(&fx);
    no_secret_reported(&fx, &["maria-password-1234", "clone-password-5678", &fx.repository.password]);
    let _ = fx.runtime.remove_service(&name).await;
    let _ = fx.runtime.remove_service(&clone.service).await;
}
