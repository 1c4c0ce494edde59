//! The control plane's child, the image registry, across crashes and
//! shutdowns: `kill -9` of the server takes its registry along, so a new
//! server runs exactly one registry without fighting for its port, and a
//! SIGTERM stops both promptly with status 0. (The agent's side, Caddy,
//! is in `ingress.rs`.)

use std::time::Duration;

use cloudweb_e2e::{free_port, process_alive, processes_with, wait_for, ServerProcess};

#[tokio::test]
async fn no_registry_outlives_its_server() {
    let tmp = tempfile::tempdir().unwrap();
    let registry = format!("127.0.0.1:{}", free_port());
    let flags = ["--registry-bin", "/usr/bin/docker-registry", "--registry-listen", registry.as_str()];
    let mut server = ServerProcess::start_with(tmp.path(), &flags).await.unwrap();
    let (agent_port, api_port) = (server.agent_port, server.api_port);
    // The registry's config path is unique to this data dir.
    let marker = tmp.path().join("server/registry/config.yml").display().to_string();
    let first = wait_for(Duration::from_secs(10), "the registry to run", || async {
        let found = processes_with(&marker);
        (found.len() == 1).then(|| found[0])
    })
    .await
    .unwrap();

    // kill -9 of the server alone (not its process group).
    server.process.signal("KILL");
    assert!(server.process.wait_exit(Duration::from_secs(5)).await.is_some());
    wait_for(Duration::from_secs(5), "the registry to die with its server", || async { (!process_alive(first)).then_some(()) })
        .await
        .unwrap();

    let mut server = ServerProcess::start_on(tmp.path(), agent_port, api_port, &flags).await.unwrap();
    // Long enough for a restart loop (once a second) to show.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let running = processes_with(&marker);
    assert_eq!(running.len(), 1, "exactly one registry: {running:?}");
    let log = server.process.log_text();
    assert!(!log.contains("image registry exited"), "{log}");
    let second = running[0];

    // SIGTERM: exit status 0, promptly, and the registry is gone.
    server.process.signal("TERM");
    let status = server.process.wait_exit(Duration::from_secs(10)).await.expect("the server exits after SIGTERM");
    assert!(status.success(), "{status:?}\n{}", server.process.log_text());
    wait_for(Duration::from_secs(2), "the registry to stop with its server", || async { (!process_alive(second)).then_some(()) })
        .await
        .unwrap();
}
