//! The leader killed at random points of deploys (issue 24): two
//! control-plane replicas on one real PostgreSQL server, a real agent with
//! Docker, real builds from a git daemon. Each round asks for a deploy of a
//! new commit, waits a random time (the deploy is then being built,
//! started, health-checked or already running), kills the leader with
//! SIGKILL and starts it again as a follower. Afterwards: a new leader came
//! within 15 s of every kill; every deployment reached a terminal state;
//! none went through a state twice (placed, started or built again by a
//! new leader); every command the node was sent is acknowledged once; the
//! app runs one container, the newest deployment's, serving its commit.

use std::time::{Duration, Instant};

use cloudweb_e2e::{docker, free_port, unique_name, wait_for, AgentNode, GitServer, ServerProcess};
use cloudweb_test_support::postgres::TestPostgres;
use reqwest::Method;
use serde_json::{json, Value};

const PAGE: &str = "FROM cloudweb-test/busybox:latest\nCOPY index.html /www/index.html\nRUN sleep 1\nCMD [\"sh\", \"-c\", \"echo serving $(cat /www/index.html); exec httpd -f -p 8080 -h /www\"]\n";
const AGENT_FLAGS: [&str; 6] = ["--heartbeat-interval-seconds", "1", "--publish-ip", "127.0.0.1", "--advertise-host", "127.0.0.1"];
const KILLS: usize = 20;
const TERMINAL: [&str; 4] = ["running", "superseded", "failed", "stopped"];

async fn leads(server: &ServerProcess) -> Option<i64> {
    let on = server.metric("cloudweb_leader").await.ok()?;
    let term = server.metric("cloudweb_leader_term").await.ok()?;
    (on == 1.0).then_some(term as i64)
}

/// xorshift64*, seeded from the clock and printed, so a failing run's
/// points can be replayed by hand.
struct Points(u64);

impl Points {
    fn next_ms(&mut self, below: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % below
    }
}

#[tokio::test]
async fn kills_of_the_leader_during_deploys_lose_nothing_and_repeat_nothing() {
    cloudweb_e2e::ensure_images().unwrap();
    let postgres = tokio::task::spawn_blocking(TestPostgres::start).await.unwrap();
    postgres.create_database("cloudweb");
    let url = postgres.url("cloudweb");
    let tmp = tempfile::tempdir().unwrap();
    let git = GitServer::start(&tmp.path().join("git")).unwrap();
    let flags = ["--database-url", url.as_str(), "--leader-lease-seconds", "2", "--drain-seconds", "1", "--allow-private-git-hosts"];
    let dirs = [tmp.path().join("cp1"), tmp.path().join("cp2")];
    std::fs::create_dir_all(&dirs[0]).unwrap();
    let first = ServerProcess::start_on(&dirs[0], free_port(), free_port(), &flags).await.unwrap();
    wait_for(Duration::from_secs(10), "the first replica to lead", || leads(&first)).await.unwrap();
    std::fs::create_dir_all(dirs[1].join("server")).unwrap();
    for file in ["master.key", "admin-token"] {
        std::fs::copy(dirs[0].join("server").join(file), dirs[1].join("server").join(file)).unwrap();
    }
    let second = ServerProcess::start_on(&dirs[1], free_port(), free_port(), &flags).await.unwrap();
    let mut replicas = [first, second];
    let (token, ca) = replicas[0].join_token().await.unwrap();
    let mut agent = AgentNode::join(&replicas[0], &tmp.path().join("node"), "node", &token, &ca, &[]).unwrap().unwrap();
    agent.start(&AGENT_FLAGS).unwrap();
    let node = agent.node_id.clone();
    wait_for(Duration::from_secs(20), "the node to be ready", || async { (replicas[0].node(&node).await.ok()?["state"] == "ready").then_some(()) }).await.unwrap();

    let app = unique_name("kills");
    git.commit(&app, &[("Dockerfile", PAGE), ("index.html", "round 0\n")], "0").unwrap();
    let (status, body) = replicas[1]
        .call(Method::POST, "/api/apps", Some(json!({"name": app, "repo_url": git.url(&app), "port": 8080, "health_timeout_seconds": 20})))
        .await
        .unwrap();
    assert_eq!(status, 201, "{body}");

    let seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64 | 1;
    eprintln!("kill points seeded with {seed}");
    let mut points = Points(seed);
    let mut deployments: Vec<(String, String)> = Vec::new();
    let mut takeovers = Vec::new();
    let mut term = 0;
    for round in 1..=KILLS {
        let leader = {
            let mut found = None;
            for (i, r) in replicas.iter().enumerate() {
                if let Some(t) = leads(r).await {
                    found = Some((i, t));
                }
            }
            found
        };
        let (leader, now_term) = leader.unwrap_or_else(|| panic!("round {round}: no replica leads"));
        term = term.max(now_term);
        let commit = git.commit(&app, &[("index.html", &format!("round {round}\n"))], &round.to_string()).unwrap();
        // Through either replica: every one serves the API.
        let via = &replicas[round % 2];
        let (status, answer) = via.call(Method::POST, &format!("/api/apps/{app}/deploy"), Some(json!({"commit": commit}))).await.unwrap();
        assert_eq!(status, 201, "round {round}: {answer}");
        deployments.push((answer["id"].as_str().unwrap().to_string(), commit));
        tokio::time::sleep(Duration::from_millis(points.next_ms(4_000))).await;
        replicas[leader].process.kill();
        let killed = Instant::now();
        let other = 1 - leader;
        let new_term = wait_for(Duration::from_secs(15), &format!("round {round}: a new leader within 15 s"), || async {
            leads(&replicas[other]).await.filter(|t| *t > term)
        })
        .await
        .unwrap_or_else(|err| panic!("{err}\n{}", replicas[other].process.log_text()));
        takeovers.push(killed.elapsed());
        term = new_term;
        replicas[leader].restart().await.unwrap();
    }
    takeovers.sort();
    eprintln!(
        "{KILLS} kills: a new leader after median {:.1} s, slowest {:.1} s",
        takeovers[takeovers.len() / 2].as_secs_f64(),
        takeovers[takeovers.len() - 1].as_secs_f64()
    );

    // Every deployment ends; the newest runs. The states are read in one
    // call, the app's list (one query, so one moment of the database):
    // read one by one, an older deployment seen running and then, a few
    // reads later, the newest seen running too would be two moments (the
    // newest's switch superseded the older one in between), not two
    // running deployments.
    let api = &replicas[0];
    let (last, last_commit) = deployments.last().cloned().unwrap();
    let settled = wait_for(Duration::from_secs(120), "every deployment to reach a terminal state", || async {
        let (status, list) = api.call(Method::GET, &format!("/api/apps/{app}/deployments"), None).await.ok()?;
        let listed = list["deployments"].as_array().filter(|_| status == 200)?;
        let mut views = Vec::new();
        for (id, _) in &deployments {
            let view = listed.iter().find(|d| d["id"] == id.as_str())?;
            TERMINAL.contains(&view["state"].as_str()?).then_some(())?;
            views.push(view.clone());
        }
        let running: Vec<Value> = listed.iter().filter(|d| d["state"] == "running").map(|d| d["id"].clone()).collect();
        Some((views, running))
    })
    .await
    .unwrap_or_else(|err| panic!("{err}\nagent log:\n{}\nserver logs:\n{}\n{}", agent.log_text(), replicas[0].process.log_text(), replicas[1].process.log_text()));
    let (settled, running) = settled;
    assert_eq!(running, [json!(last.as_str())], "one running deployment, the newest, at one moment");
    let newest = settled.last().unwrap();
    assert_eq!(newest["state"], "running", "the newest deployment runs: {newest}");
    assert_eq!(newest["commit"], last_commit.as_str());
    let address = newest["instances"][0]["address"].as_str().unwrap_or_else(|| panic!("{newest}"));
    let page = reqwest::get(format!("http://{address}/")).await.unwrap().text().await.unwrap();
    assert_eq!(page, format!("round {KILLS}\n"));
    for view in &settled {
        let states: Vec<&str> = view["timeline"].as_array().unwrap().iter().filter_map(|e| e["state"].as_str()).collect();
        let mut seen = std::collections::HashSet::new();
        assert!(states.iter().all(|s| seen.insert(*s)), "a state went twice (placed or built again): {states:?} in {view}");
        if view["id"] != last.as_str() {
            assert_ne!(view["state"], "running", "only the newest runs: {view}");
        }
    }
    // One container, the newest deployment's, once the old ones drained.
    let containers = wait_for(Duration::from_secs(30), "one container for the app", || async {
        let found = docker::ps(&["--filter", &format!("label=cloudweb.app={app}"), "--format", "{{.Label \"cloudweb.deployment\"}}"]);
        (found.len() == 1).then_some(found)
    })
    .await
    .unwrap_or_else(|err| panic!("{err}: {:?}", docker::ps(&["-a", "--filter", &format!("label=cloudweb.app={app}")])));
    assert_eq!(containers, [last.clone()]);
    // With both replicas up, one more deploy: its instance's output
    // reaches the user API of either replica (the follower's through the
    // leader's NOTIFY relay).
    let commit = git.commit(&app, &[("index.html", "final\n")], "final").unwrap();
    let (status, answer) = replicas[1].call(Method::POST, &format!("/api/apps/{app}/deploy"), Some(json!({"commit": commit}))).await.unwrap();
    assert_eq!(status, 201, "{answer}");
    let last = answer["id"].as_str().unwrap().to_string();
    for replica in &replicas {
        let leading = leads(replica).await;
        wait_for(Duration::from_secs(60), "the final instance's output in the replica's runtime logs", || async {
            let (_, logs) = replica.call(Method::GET, &format!("/api/apps/{app}/logs"), None).await.ok()?;
            logs["lines"].as_array()?.iter().any(|l| l["line"] == "serving final" && l["deployment_id"] == last.as_str()).then_some(())
        })
        .await
        .unwrap_or_else(|err| panic!("{err} (leading: {leading:?})\n{}", replica.process.log_text()));
    }
    // Every command reached the node and was acknowledged once.
    let commands = wait_for(Duration::from_secs(30), "every command to be acknowledged", || async {
        let (_, list) = api.call(Method::GET, &format!("/api/nodes/{node}/commands"), None).await.ok()?;
        let commands = list["commands"].as_array()?.clone();
        commands.iter().all(|c| !c["acked_at"].is_null()).then_some(commands)
    })
    .await
    .unwrap();
    let twice: Vec<&Value> = commands.iter().filter(|c| c["ack_count"] != 1).collect();
    eprintln!("{} commands, {} acknowledged more than once", commands.len(), twice.len());
    assert!(twice.is_empty(), "acknowledged more than once: {twice:?}");
    drop(agent);
    drop(postgres);
}
