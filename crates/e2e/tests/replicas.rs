//! Several control-plane replicas on one PostgreSQL database (issue 24
//! item 3), with a real PostgreSQL server the test starts and the real
//! binaries: every replica presents the same cluster CA and listener key,
//! so a node joined through one is served by another; a replica given
//! another master key refuses to start and says why; the database holds
//! the secrets sealed, never in the clear.

use cloudweb_e2e::{AgentNode, ServerProcess};
use cloudweb_test_support::postgres::TestPostgres;
use reqwest::Method;

#[tokio::test]
async fn replicas_share_the_cluster_identity_through_the_database() {
    let postgres = tokio::task::spawn_blocking(TestPostgres::start).await.unwrap();
    postgres.create_database("cloudweb");
    let url = postgres.url("cloudweb");
    let flags = ["--database-url", url.as_str()];
    let first_dir = tempfile::tempdir().unwrap();
    let first = ServerProcess::start_with(first_dir.path(), &flags).await.unwrap();

    // A node joins through the first replica.
    let (token, ca_sha256) = first.join_token().await.unwrap();
    let node_dir = first_dir.path().join("node");
    let node = AgentNode::join(&first, &node_dir, "n1", &token, &ca_sha256, &[]).unwrap().unwrap();

    // The second replica starts on an empty data dir holding only the
    // master key it was given (and, for this test's calls, the admin
    // token the cluster made once, at its first start).
    let second_dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(second_dir.path().join("server")).unwrap();
    for file in ["master.key", "admin-token"] {
        std::fs::copy(first_dir.path().join("server").join(file), second_dir.path().join("server").join(file)).unwrap();
    }
    let second = ServerProcess::start_with(second_dir.path(), &flags).await.unwrap();
    assert_eq!(second.ca_pem(), first.ca_pem(), "the same cluster CA");
    for file in ["ca.key", "listener.key"] {
        assert_eq!(
            std::fs::read(second_dir.path().join("server").join(file)).unwrap(),
            std::fs::read(first_dir.path().join("server").join(file)).unwrap(),
            "the same {file}"
        );
    }
    let (_, second_ca) = second.join_token().await.unwrap();
    assert_eq!(second_ca, ca_sha256, "join tokens of either replica pin the same CA");
    // The install command pins the listener's public key (curl
    // --pinnedpubkey): the same pin from either replica.
    let pin_of = |command: &str| command.split_whitespace().find(|w| w.contains("sha256//")).map(str::to_string);
    let command_of = |body: serde_json::Value| body["command"].as_str().unwrap().to_string();
    let first_pin = pin_of(&command_of(first.call(Method::POST, "/api/join-tokens", None).await.unwrap().1));
    let second_pin = pin_of(&command_of(second.call(Method::POST, "/api/join-tokens", None).await.unwrap().1));
    assert!(first_pin.is_some(), "the install command pins the listener key");
    assert_eq!(first_pin, second_pin);

    // The node, which knows only the CA it pinned at join, is served by
    // the second replica with the certificate it got from the first.
    let body = r#"{"cpu_cores": 2, "mem_bytes": 1073741824, "disk_bytes": 10737418240}"#;
    for server in [&first, &second] {
        let (status, text) = node.raw_client().send(Method::POST, &format!("{}/agent/v1/heartbeat", server.url()), &[], Some(body)).await.unwrap();
        assert_eq!(status, 200, "heartbeat to {}: {text}", server.url());
    }
    // A replica started with a master key of its own stops before it
    // seals anything the others could not open.
    let stranger_dir = tempfile::tempdir().unwrap();
    let refused = ServerProcess::start_with(stranger_dir.path(), &flags).await.err().expect("a replica with another master key must not start");
    let text = format!("{refused:#}");
    assert!(text.contains("is not the one this database's secrets are sealed with"), "{text}");
    assert!(!stranger_dir.path().join("server/ca.key").exists(), "no CA of its own was made");

    // Sealed in the database, never in the clear.
    let names = postgres.psql_in("cloudweb", "SELECT string_agg(name, ',' ORDER BY name) FROM cluster_secrets");
    assert_eq!(names, "ca.crt,ca.key,listener.key,master-key-check");
    let all = postgres.psql_in("cloudweb", "SELECT string_agg(sealed, ' ') FROM cluster_secrets");
    assert!(!all.contains("PRIVATE KEY") && !all.contains("CERTIFICATE"), "sealed values only");
    drop(node);
}
