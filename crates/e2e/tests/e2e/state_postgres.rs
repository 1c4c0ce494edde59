//! The control plane's state in PostgreSQL (issue 24 item 1), with a real
//! PostgreSQL server the test starts (Debian's `initdb` and `postgres` on a
//! Unix socket) and the real `cloudweb-server` binary:
//! - `migrate-state` copies a SQLite cluster into an empty database,
//!   checked table by table, and refuses a database that holds rows;
//! - the control plane then serves the same apps and admin token from
//!   PostgreSQL, and keeps what it writes across a kill -9.

use std::process::Command;

use cloudweb_e2e::{bin, free_port, ServerProcess};
use cloudweb_test_support::postgres::TestPostgres;
use reqwest::Method;
use serde_json::{json, Value};

fn app(name: &str) -> Value {
    json!({"name": name, "repo_url": "https://git.example.com/app.git", "port": 8080})
}

async fn app_names(server: &ServerProcess) -> Vec<String> {
    let (status, body) = server.call(Method::GET, "/api/apps", None).await.unwrap();
    assert_eq!(status, 200, "{body}");
    let list = body.as_array().or_else(|| body["apps"].as_array()).cloned().unwrap_or_default();
    let mut names: Vec<String> = list.iter().filter_map(|a| a["name"].as_str().map(String::from)).collect();
    names.sort();
    names
}

fn migrate(from: &str, to: &str) -> (bool, String, String) {
    let out = Command::new(bin("cloudweb-server")).args(["migrate-state", "--from", from, "--to", to]).output().unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[tokio::test]
async fn a_sqlite_cluster_moves_to_postgresql_and_keeps_its_apps_and_token() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("server");
    let sqlite = format!("sqlite://{}", data.join("state.db").display());
    let mut server = ServerProcess::start_with(tmp.path(), &["--database-url", &sqlite]).await.unwrap();
    for name in ["alpha", "beta", "gamma"] {
        assert_eq!(server.call(Method::POST, "/api/apps", Some(app(name))).await.unwrap().0, 201);
    }
    assert_eq!(server.call(Method::POST, "/api/join-tokens", None).await.unwrap().0, 201);
    server.process.kill();

    let postgres = tokio::task::spawn_blocking(TestPostgres::start).await.unwrap();
    postgres.create_database("cloudweb");
    let url = postgres.url("cloudweb");
    let (ok, out, err) = migrate(&sqlite, &url);
    assert!(ok, "{out}{err}");
    let apps_line = out.lines().find(|l| l.starts_with("apps ")).unwrap_or_else(|| panic!("{out}"));
    assert!(apps_line.contains(" 3 rows"), "{out}");
    assert!(out.contains("every table has the same rows and checksum"), "{out}");
    eprintln!("{out}");

    // Twice: the target holds rows now, so nothing is written.
    let (ok, _, err) = migrate(&sqlite, &url);
    assert!(!ok && err.contains("not empty"), "{err}");
    // Bad URLs are refused before anything opens.
    let (ok, _, err) = migrate("mysql://x/y", &url);
    assert!(!ok && err.contains("not a database URL"), "{err}");
    let (ok, _, err) = migrate(&url, &sqlite);
    assert!(!ok && err.contains("--from must be a sqlite://"), "{err}");

    let mut server = ServerProcess::start_on(tmp.path(), free_port(), free_port(), &["--database-url", &url]).await.unwrap();
    assert_eq!(app_names(&server).await, vec!["alpha", "beta", "gamma"], "the same apps, with the same admin token");
    assert_eq!(server.call(Method::POST, "/api/apps", Some(app("delta"))).await.unwrap().0, 201);
    assert_eq!(server.call(Method::POST, "/api/apps", Some(app("delta"))).await.unwrap().0, 409, "a name is still taken once");
    // The rows are in PostgreSQL, not in the SQLite file it came from.
    assert_eq!(
        Command::new("psql").arg("-h").arg(postgres.socket_dir()).args(["-U", "postgres", "-d", "cloudweb", "-tAc", "SELECT count(*) FROM apps"]).output().map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string()).unwrap(),
        "4"
    );

    // A kill -9 loses nothing that was answered.
    server.restart().await.unwrap();
    assert_eq!(app_names(&server).await, vec!["alpha", "beta", "delta", "gamma"]);
}
