//! Several control-plane replicas on one PostgreSQL database (issue 24
//! item 3), with a real PostgreSQL server the test starts and the real
//! binaries: every replica presents the same cluster CA and listener key,
//! so a node joined through one is served by another; a replica given
//! another master key refuses to start and says why; the database holds
//! the secrets sealed, never in the clear. One replica leads (item 2): a
//! kill -9 of the leader hands the lead to another within 15 s, and a
//! leader frozen past its lease stops leading when it thaws. A command
//! queued through a follower reaches the leader's streams within 1 s
//! (item 4); a real agent fails over to the new leader; a PostgreSQL
//! restart loses nothing acknowledged, and writes while it is down answer
//! 503.

use std::path::Path;
use std::time::{Duration, Instant};

use cloudweb_e2e::{wait_for, AgentNode, ServerProcess};
use cloudweb_test_support::postgres::TestPostgres;
use reqwest::Method;

async fn database() -> (TestPostgres, String) {
    let postgres = tokio::task::spawn_blocking(TestPostgres::start).await.unwrap();
    postgres.create_database("cloudweb");
    let url = postgres.url("cloudweb");
    (postgres, url)
}

/// A data dir for another replica of `first`'s cluster: the master key it
/// is given, and the admin token for this test's calls.
fn prepare_replica(first: &Path, dir: &Path) {
    std::fs::create_dir_all(dir.join("server")).unwrap();
    for file in ["master.key", "admin-token"] {
        std::fs::copy(first.join("server").join(file), dir.join("server").join(file)).unwrap();
    }
}

async fn leading(server: &ServerProcess) -> Option<(bool, i64)> {
    let leading = server.metric("cloudweb_leader").await.ok()?;
    let term = server.metric("cloudweb_leader_term").await.ok()?;
    Some((leading == 1.0, term as i64))
}

async fn wait_leading(server: &ServerProcess, timeout: Duration, what: &str) -> i64 {
    wait_for(timeout, what, || async { leading(server).await.filter(|(on, _)| *on).map(|(_, term)| term) }).await.unwrap()
}

/// A real agent (no Docker) joined through `first`, heartbeating every
/// second, once its kept list names both replicas.
async fn agent_knowing_both(first: &ServerProcess, second: &ServerProcess, dir: &Path) -> AgentNode {
    let (token, ca_sha256) = first.join_token().await.unwrap();
    let mut node = AgentNode::join(first, dir, "n1", &token, &ca_sha256, &[])
        .unwrap()
        .unwrap_or_else(|err| panic!("{err}\n{}", first.process.log_text()));
    node.start(&["--heartbeat-interval-seconds", "1", "--docker-host", "unix:///nonexistent/docker.sock"]).unwrap();
    let kept = node.dir.join("control-planes.json");
    wait_for(Duration::from_secs(15), "the agent to learn both replicas", || async {
        let text = std::fs::read_to_string(&kept).ok()?;
        (text.contains(&first.url()) && text.contains(&second.url())).then_some(())
    })
    .await
    .unwrap_or_else(|err| panic!("{err}: {}", node.log_text()));
    node
}

#[tokio::test]
async fn replicas_share_the_cluster_identity_through_the_database() {
    let (postgres, url) = database().await;
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
    prepare_replica(first_dir.path(), second_dir.path());
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

    // The node, which knows only the CA it pinned at join, reaches the
    // second replica with the certificate it got from the first (the TLS
    // handshakes both ways succeed); the second, not leading, turns it to
    // the leader.
    let body = r#"{"cpu_cores": 2, "mem_bytes": 1073741824, "disk_bytes": 10737418240}"#;
    let (status, text) = node.raw_client().send(Method::POST, &format!("{}/agent/v1/heartbeat", first.url()), &[], Some(body)).await.unwrap();
    assert_eq!(status, 200, "heartbeat to the leader: {text}");
    let (status, text) = node.raw_client().send(Method::POST, &format!("{}/agent/v1/heartbeat", second.url()), &[], Some(body)).await.unwrap();
    assert_eq!(status, 503, "{text}");
    assert!(text.contains("does not lead"), "{text}");

    // A command queued through the follower's API reaches the node's
    // stream, held by the leader, within 1 s (LISTEN/NOTIFY), not at the
    // node's next poll.
    let mut stream = node.raw_client().http.get(format!("{}/agent/v1/stream", first.url())).send().await.unwrap();
    assert_eq!(stream.status(), 200);
    let queued = Instant::now();
    let command = serde_json::json!({"type": "stop", "payload": {"deployment_id": "d"}});
    let (status, body) = second.call(Method::POST, &format!("/api/nodes/{}/commands", node.node_id), Some(command)).await.unwrap();
    assert_eq!(status, 201, "{body}");
    let chunk = tokio::time::timeout(Duration::from_secs(1), stream.chunk()).await.expect("the event within 1 s").unwrap().expect("the stream stays open");
    eprintln!("a command queued through the follower reached the leader's stream in {} ms", queued.elapsed().as_millis());
    assert_eq!(String::from_utf8_lossy(&chunk), "event: commands\ndata: {}\n\n");

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

#[tokio::test]
async fn a_new_leader_takes_over_within_15_s_of_a_kill_9() {
    let (_postgres, url) = database().await;
    let flags = ["--database-url", url.as_str()];
    let first_dir = tempfile::tempdir().unwrap();
    let mut first = ServerProcess::start_with(first_dir.path(), &flags).await.unwrap();
    let term = wait_leading(&first, Duration::from_secs(10), "the first replica to lead").await;
    assert_eq!(term, 1);
    let (token, ca_sha256) = first.join_token().await.unwrap();
    let node = AgentNode::join(&first, &first_dir.path().join("node"), "n1", &token, &ca_sha256, &[]).unwrap().unwrap();
    let heartbeat = |server: &ServerProcess| {
        let url = format!("{}/agent/v1/heartbeat", server.url());
        let client = node.raw_client();
        async move {
            client.send(Method::POST, &url, &[], Some(r#"{"cpu_cores": 2, "mem_bytes": 1073741824, "disk_bytes": 10737418240}"#)).await.unwrap()
        }
    };
    let second_dir = tempfile::tempdir().unwrap();
    prepare_replica(first_dir.path(), second_dir.path());
    let second = ServerProcess::start_with(second_dir.path(), &flags).await.unwrap();
    // While the first one's lease runs, the second serves but does not
    // lead (three renewals' worth).
    for _ in 0..6 {
        assert_eq!(leading(&second).await, Some((false, 0)), "one leader at a time");
        assert_eq!(leading(&first).await, Some((true, 1)));
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let (status, text) = heartbeat(&second).await;
    assert_eq!(status, 503, "a follower turns agents to the leader: {text}");
    assert!(text.contains(&format!("the leader is {}", first.url())), "{text}");
    assert_eq!(heartbeat(&first).await.0, 200);
    // A node that joins through the leader after the second replica
    // started: the second learns of it from the database when it leads.
    let (token, _) = first.join_token().await.unwrap();
    let late = AgentNode::join(&first, &first_dir.path().join("late"), "n2", &token, &ca_sha256, &[]).unwrap().unwrap();
    // Every replica serves the API, leader or not.
    let app = serde_json::json!({"name": "on-second", "repo_url": "https://git.example.com/a.git", "port": 8080});
    assert_eq!(second.call(Method::POST, "/api/apps", Some(app)).await.unwrap().0, 201);

    first.process.kill();
    let killed = Instant::now();
    let term = wait_leading(&second, Duration::from_secs(15), "the second replica to lead after the kill").await;
    let took = killed.elapsed();
    eprintln!("a new leader {:.1} s after the kill -9 of the old one", took.as_secs_f64());
    assert_eq!(term, 2, "a new term, whose token fences the old one");
    assert!(took < Duration::from_secs(15), "{took:?}");
    // The node joined through the first replica is served by the new
    // leader.
    let (status, text) = heartbeat(&second).await;
    assert_eq!(status, 200, "{text}");
    let (status, text) = late
        .raw_client()
        .send(Method::POST, &format!("{}/agent/v1/heartbeat", second.url()), &[], Some(r#"{"cpu_cores": 1, "mem_bytes": 1073741824, "disk_bytes": 10737418240}"#))
        .await
        .unwrap();
    assert_eq!(status, 200, "the node joined after the second replica started: {text}");
}

#[tokio::test]
async fn a_leader_frozen_past_its_lease_stops_leading_when_it_thaws() {
    let (_postgres, url) = database().await;
    // A 4 s lease: renewed every second, taken over 4 s after the last.
    let flags = ["--database-url", url.as_str(), "--leader-lease-seconds", "4"];
    let first_dir = tempfile::tempdir().unwrap();
    let first = ServerProcess::start_with(first_dir.path(), &flags).await.unwrap();
    assert_eq!(wait_leading(&first, Duration::from_secs(10), "the first replica to lead").await, 1);
    let second_dir = tempfile::tempdir().unwrap();
    prepare_replica(first_dir.path(), second_dir.path());
    let second = ServerProcess::start_with(second_dir.path(), &flags).await.unwrap();

    first.process.signal("STOP");
    let term = wait_leading(&second, Duration::from_secs(12), "the second replica to lead while the first is frozen").await;
    assert_eq!(term, 2);
    // Frozen well past its lease, then thawed: it must find it no longer
    // leads (its own clock says its last renewal is too old, and the
    // database says another term runs), not go on as leader.
    tokio::time::sleep(Duration::from_secs(3)).await;
    first.process.signal("CONT");
    wait_for(Duration::from_secs(5), "the thawed replica to stop leading", || async {
        leading(&first).await.filter(|(on, _)| !*on)
    })
    .await
    .unwrap();
    assert!(first.process.log_text().contains("this control plane stopped leading"), "{}", first.process.log_text());
    // And it stays a follower while the second leads. (The second may
    // start a new term of its own if a renewal stalls past the lease on a
    // loaded machine; the lead does not go back to the thawed replica.)
    for _ in 0..4 {
        assert_eq!(leading(&first).await, Some((false, 0)));
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let (on, term) = leading(&second).await.unwrap();
    assert!(on && term >= 2, "the second replica leads: {}", second.process.log_text());
}

#[tokio::test]
async fn a_postgresql_restart_loses_nothing_acknowledged_and_writes_meanwhile_get_a_503() {
    let (mut postgres, url) = database().await;
    let flags = ["--database-url", url.as_str(), "--leader-lease-seconds", "4"];
    let dir = tempfile::tempdir().unwrap();
    let server = ServerProcess::start_with(dir.path(), &flags).await.unwrap();
    assert_eq!(wait_leading(&server, Duration::from_secs(10), "the replica to lead").await, 1);
    let app = |name: &str| serde_json::json!({"name": name, "repo_url": "https://git.example.com/a.git", "port": 8080});
    for name in ["before-1", "before-2"] {
        assert_eq!(server.call(Method::POST, "/api/apps", Some(app(name))).await.unwrap().0, 201);
    }
    // The database goes away: a write answers 503 with the reason, in
    // bounded time, and the replica stops leading.
    let mut postgres = tokio::task::spawn_blocking(move || {
        postgres.stop_server();
        postgres
    })
    .await
    .unwrap();
    let started = Instant::now();
    let (status, body) = server.call(Method::POST, "/api/apps", Some(app("during"))).await.unwrap();
    eprintln!("a write with the database down: {status} after {:.1} s: {body}", started.elapsed().as_secs_f64());
    assert_eq!(status, 503, "{body}");
    assert!(body.to_string().contains("cannot reach its database"), "{body}");
    assert!(started.elapsed() < Duration::from_secs(10), "answered within the pool's wait");
    wait_for(Duration::from_secs(10), "the replica to stop leading", || async { leading(&server).await.filter(|(on, _)| !*on) }).await.unwrap();
    // PostgreSQL comes back: the replica reconnects by itself.
    let postgres = tokio::task::spawn_blocking(move || {
        postgres.start_again();
        postgres
    })
    .await
    .unwrap();
    let created = wait_for(Duration::from_secs(20), "a write to succeed after the restart", || async {
        server.call(Method::POST, "/api/apps", Some(app("after"))).await.ok().filter(|(status, _)| *status == 201)
    })
    .await;
    assert!(created.is_ok(), "{}", server.process.log_text());
    let (_, apps) = server.call(Method::GET, "/api/apps", None).await.unwrap();
    let list = apps.as_array().or_else(|| apps["apps"].as_array()).cloned().unwrap_or_default();
    let names: Vec<&str> = list.iter().filter_map(|a| a["name"].as_str()).collect();
    for name in ["before-1", "before-2", "after"] {
        assert!(names.contains(&name), "{name} in {names:?}");
    }
    wait_leading(&server, Duration::from_secs(20), "the replica to lead again").await;
    drop(postgres);
}

#[tokio::test]
async fn an_agent_moves_to_the_new_leader_when_its_replica_dies() {
    let (_postgres, url) = database().await;
    let flags = ["--database-url", url.as_str(), "--leader-lease-seconds", "4"];
    let first_dir = tempfile::tempdir().unwrap();
    let mut first = ServerProcess::start_with(first_dir.path(), &flags).await.unwrap();
    wait_leading(&first, Duration::from_secs(10), "the first replica to lead").await;
    let second_dir = tempfile::tempdir().unwrap();
    prepare_replica(first_dir.path(), second_dir.path());
    let second = ServerProcess::start_with(second_dir.path(), &flags).await.unwrap();
    // The heartbeat answers list both replicas, the leader's first; the
    // agent keeps the list.
    let node = agent_knowing_both(&first, &second, &first_dir.path().join("node")).await;
    assert_eq!(second.metric("cloudweb_heartbeats_total").await.unwrap(), 0.0, "a follower takes no heartbeat");

    first.process.kill();
    let killed = Instant::now();
    wait_leading(&second, Duration::from_secs(15), "the second replica to lead").await;
    let moved = wait_for(Duration::from_secs(15), "the agent's heartbeats to reach the new leader", || async {
        (second.metric("cloudweb_heartbeats_total").await.ok()? > 0.0).then(|| killed.elapsed())
    })
    .await
    .unwrap_or_else(|err| panic!("{err}: {}", node.log_text()));
    eprintln!("the agent heartbeats the new leader {:.1} s after the kill -9 of its replica", moved.as_secs_f64());
    assert!(node.log_text().contains("moving to another control-plane replica"), "{}", node.log_text());

    // `cloudweb-agent leave` starts from the replica the agent used last
    // and, that one gone too, goes on to the next it knows.
    let mut node = node;
    node.kill();
    let mut second = second;
    first.restart().await.unwrap();
    second.process.kill();
    wait_leading(&first, Duration::from_secs(15), "the first replica to lead again").await;
    let args: Vec<String> = vec!["--data-dir".into(), node.dir.display().to_string(), "leave".into()];
    let finished = cloudweb_e2e::run_agent_command(&args).unwrap();
    assert!(finished.success, "{}", finished.output);
    let (status, _) = first.call(Method::GET, &format!("/api/nodes/{}", node.node_id), None).await.unwrap();
    assert_eq!(status, 404, "the node left through the replica that leads");
}

/// A Unix-socket proxy to PostgreSQL for one replica: cutting it drops
/// that replica's connections and refuses new ones, as a network cut
/// would, while the other replicas keep theirs. It runs on a thread and
/// runtime of its own, so the test's blocking steps never stall it.
struct DatabaseLink {
    dir: tempfile::TempDir,
    cut: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl DatabaseLink {
    fn open(postgres: &TestPostgres) -> DatabaseLink {
        let dir = tempfile::tempdir().unwrap();
        let target = postgres.socket_dir().join(".s.PGSQL.5432");
        let path = dir.path().join(".s.PGSQL.5432");
        let (cut, cut_rx) = tokio::sync::oneshot::channel::<()>();
        let (bound, bound_rx) = std::sync::mpsc::channel();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            runtime.block_on(async move {
                let listener = tokio::net::UnixListener::bind(&path).unwrap();
                bound.send(()).unwrap();
                let accept = async {
                    let mut connections = tokio::task::JoinSet::new();
                    loop {
                        let Ok((mut client, _)) = listener.accept().await else { break };
                        let target = target.clone();
                        connections.spawn(async move {
                            if let Ok(mut server) = tokio::net::UnixStream::connect(&target).await {
                                let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                            }
                        });
                    }
                };
                tokio::select! {
                    _ = accept => {}
                    _ = cut_rx => {}
                }
            });
            // Dropping the runtime closes every connection it carried.
        });
        bound_rx.recv().unwrap();
        DatabaseLink { dir, cut: Some(cut), thread: Some(thread) }
    }

    fn url(&self, database: &str) -> String {
        format!("postgres://postgres@localhost/{database}?host={}", self.dir.path().display())
    }

    /// Drops every connection through the link and the socket itself.
    fn cut(&mut self) {
        if let Some(cut) = self.cut.take() {
            let _ = cut.send(());
        }
        if let Some(thread) = self.thread.take() {
            thread.join().unwrap();
        }
        let _ = std::fs::remove_file(self.dir.path().join(".s.PGSQL.5432"));
    }
}

#[tokio::test]
async fn a_replica_cut_off_from_postgresql_stops_leading_and_its_agents_move_to_another() {
    let (postgres, url) = database().await;
    let mut link = DatabaseLink::open(&postgres);
    let cut_url = link.url("cloudweb");
    // A 4 s lease: a leader that cannot renew stops within 4 s.
    let first_dir = tempfile::tempdir().unwrap();
    let first = ServerProcess::start_with(first_dir.path(), &["--database-url", cut_url.as_str(), "--leader-lease-seconds", "4"]).await.unwrap();
    wait_leading(&first, Duration::from_secs(10), "the first replica to lead").await;
    let second_dir = tempfile::tempdir().unwrap();
    prepare_replica(first_dir.path(), second_dir.path());
    let second = ServerProcess::start_with(second_dir.path(), &["--database-url", url.as_str(), "--leader-lease-seconds", "4"]).await.unwrap();
    let node = agent_knowing_both(&first, &second, &first_dir.path().join("node")).await;
    let app = |name: &str| serde_json::json!({"name": name, "repo_url": "https://git.example.com/a.git", "port": 8080});
    assert_eq!(first.call(Method::POST, "/api/apps", Some(app("before"))).await.unwrap().0, 201);
    // A follower's node list judges the node by the heartbeats the leader
    // stored, not by when the follower loaded it.
    wait_for(Duration::from_secs(15), "the follower to show the node ready", || async {
        let (_, nodes) = second.call(Method::GET, "/api/nodes", None).await.ok()?;
        (nodes["nodes"][0]["state"] == "ready").then_some(())
    })
    .await
    .unwrap();

    link.cut();
    let cut = Instant::now();
    let stopped = wait_for(Duration::from_secs(10), "the cut-off replica to stop leading", || async {
        leading(&first).await.filter(|(on, _)| !*on).map(|_| cut.elapsed())
    })
    .await
    .unwrap_or_else(|err| panic!("{err}: {}", first.process.log_text()));
    eprintln!("the replica cut off from PostgreSQL stopped leading {:.1} s after the cut", stopped.as_secs_f64());
    assert!(stopped <= Duration::from_secs(4) + Duration::from_secs(3), "within the lease (and a loaded machine's slack): {stopped:?}");
    let (status, body) = first.call(Method::POST, "/api/apps", Some(app("during"))).await.unwrap();
    assert_eq!(status, 503, "{body}");
    assert!(body.to_string().contains("cannot reach its database"), "{body}");
    wait_leading(&second, Duration::from_secs(15), "the other replica to lead").await;
    let led = Instant::now();
    let before = second.metric("cloudweb_heartbeats_total").await.unwrap();
    let moved = wait_for(Duration::from_secs(10), "the agent to heartbeat the replica that leads now", || async {
        (second.metric("cloudweb_heartbeats_total").await.ok()? > before).then(|| led.elapsed())
    })
    .await
    .unwrap_or_else(|err| panic!("{err}: {}", node.log_text()));
    eprintln!("the agent heartbeats the new leader {:.1} s after it leads ({:.1} s after the cut)", moved.as_secs_f64(), cut.elapsed().as_secs_f64());
    // Nothing lost or changed by the cut-off replica: the app made before
    // is there, the one refused is not.
    let (_, apps) = second.call(Method::GET, "/api/apps", None).await.unwrap();
    let text = apps.to_string();
    assert!(text.contains("\"before\"") && !text.contains("\"during\""), "{text}");
    drop(node);
    drop(postgres);
}
