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
    // Exactly one registry, and it is the process holding the port: a
    // leftover holding it would leave the new one exiting at once and
    // restarted in a loop.
    let port: u16 = registry.rsplit_once(':').unwrap().1.parse().unwrap();
    let second = wait_for(Duration::from_secs(30), "one registry, listening on its port", || async {
        let running = processes_with(&marker);
        (running.len() == 1 && listening_pids(port).contains(&running[0])).then(|| running[0])
    })
    .await
    .unwrap_or_else(|e| panic!("{e}: {:?} run, {:?} listen\n{}", processes_with(&marker), listening_pids(port), server.process.log_text()));
    assert_ne!(second, first);
    let log = server.process.log_text();
    assert!(!log.contains("image registry exited"), "{log}");

    // SIGTERM: exit status 0, promptly, and the registry is gone.
    server.process.signal("TERM");
    let status = server.process.wait_exit(Duration::from_secs(10)).await.expect("the server exits after SIGTERM");
    assert!(status.success(), "{status:?}\n{}", server.process.log_text());
    wait_for(Duration::from_secs(2), "the registry to stop with its server", || async { (!process_alive(second)).then_some(()) })
        .await
        .unwrap();
}

/// The pids of the processes listening on TCP `port` (from `ss`).
fn listening_pids(port: u16) -> Vec<u32> {
    let output = std::process::Command::new("ss").args(["-H", "-t", "-l", "-n", "-p", "sport", "=", &format!(":{port}")]).output().unwrap();
    assert!(output.status.success(), "ss: {}", String::from_utf8_lossy(&output.stderr));
    let text = String::from_utf8_lossy(&output.stdout).to_string();
    text.split("pid=").skip(1).filter_map(|rest| rest.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()).collect()
}
