//! The runtime-log store end to end (issue 26): an app with two instances
//! on two nodes prints 100,000 lines through real containers and agents;
//! searches by words, pattern, instance and time range return exactly the
//! lines that match, newest first, page by page, and still do after the
//! control plane is killed and started again; `cloudweb logs --grep`
//! prints them; a 1 MiB line, binary output and invalid UTF-8 are stored
//! cut or replaced with a marker and break nothing; a burst over the app's
//! rate is cut, counted and noted (stored + noted = sent); retention
//! deletes the oldest lines past the app's size bound, then every line
//! past the age bound, counting them; a deleted app's lines go with it.
//! Every line is also forwarded to a syslog receiver (RFC 5424 frames,
//! octet-counted, RFC 6587); once it is gone, local storage goes on and
//! `/metrics` counts the lines it could not take.

use std::collections::HashSet;
use std::time::Duration;

use cloudweb_e2e::services::cli;
use cloudweb_e2e::{start_platform, unique_name, wait_for, AgentNode, Platform, ServerProcess};
use reqwest::Method;
use serde_json::{json, Value};

const AGENT_FLAGS: [&str; 6] = ["--heartbeat-interval-seconds", "1", "--publish-ip", "127.0.0.1", "--advertise-host", "127.0.0.1"];

/// 50 blocks of 1,000 numbered lines (every tenth an ERROR), half a second
/// apart; then a 1 MiB line, binary bytes and invalid UTF-8; then serves.
const RUN_SH: &str = r#"mkdir -p /www && echo ok > /www/index.html
(
b=0
while [ $b -lt 50 ]; do
  awk -v b=$b 'BEGIN { for (i = 0; i < 1000; i++) { n = b * 1000 + i; if (n % 10 == 0) printf "n=%d ERROR db timeout\n", n; else printf "n=%d ok request\n", n } }'
  b=$((b + 1))
  sleep 0.5
done
head -c 1048576 /dev/zero | tr '\0' 'x'; echo
head -c 3000 /dev/urandom; echo
printf 'bad \377\376 utf8 here\n'
echo "done printing"
) &
exec httpd -f -p 8080 -h /www
"#;

/// A syslog receiver over TCP: the messages of octet-counted frames
/// (RFC 6587 `LEN SP MSG`), kept in order; abort the task to stop it.
async fn syslog_receiver() -> (u16, std::sync::Arc<std::sync::Mutex<Vec<String>>>, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let kept: std::sync::Arc<std::sync::Mutex<Vec<String>>> = Default::default();
    let messages = kept.clone();
    let task = tokio::spawn(async move {
        let mut connections = tokio::task::JoinSet::new();
        loop {
            let Ok((mut socket, _)) = listener.accept().await else { return };
            let messages = messages.clone();
            connections.spawn(async move {
                let mut buffer: Vec<u8> = Vec::new();
                let mut chunk = vec![0u8; 65536];
                loop {
                    let n = tokio::io::AsyncReadExt::read(&mut socket, &mut chunk).await.unwrap_or(0);
                    if n == 0 {
                        return;
                    }
                    buffer.extend_from_slice(&chunk[..n]);
                    while let Some(space) = buffer.iter().position(|b| *b == b' ') {
                        let length: usize = std::str::from_utf8(&buffer[..space]).unwrap().parse().expect("an octet count");
                        if buffer.len() < space + 1 + length {
                            break;
                        }
                        let message = String::from_utf8_lossy(&buffer[space + 1..space + 1 + length]).into_owned();
                        messages.lock().unwrap().push(message);
                        buffer.drain(..space + 1 + length);
                    }
                }
            });
        }
    });
    (port, kept, task)
}

const DOCKERFILE: &str = "FROM cloudweb-test/busybox:latest\nCOPY run.sh /run.sh\nCMD [\"sh\", \"/run.sh\"]\n";

fn lines(body: &Value) -> Vec<Value> {
    body["lines"].as_array().cloned().unwrap_or_default()
}

/// Every line of a search, page after page (newest first).
async fn all_pages(server: &ServerProcess, app: &str, query: &str) -> Vec<Value> {
    let mut found = Vec::new();
    let mut cursor: Option<String> = None;
    for _ in 0..500 {
        let mut path = format!("/api/apps/{app}/logs?limit=1000&{query}");
        if let Some(cursor) = &cursor {
            path.push_str(&format!("&cursor={cursor}"));
        }
        let (status, body) = server.call(Method::GET, &path, None).await.unwrap();
        assert_eq!(status, 200, "{path}: {body}");
        found.extend(lines(&body));
        match body["next"].as_str() {
            Some(next) => cursor = Some(next.to_string()),
            None => return found,
        }
    }
    panic!("more than 500 pages for {query}");
}

async fn stored(server: &ServerProcess, app: &str) -> Value {
    let (status, body) = server.call(Method::GET, &format!("/api/apps/{app}/logs?limit=1"), None).await.unwrap();
    assert_eq!(status, 200, "{body}");
    body["stored"].clone()
}

fn numbers(found: &[Value]) -> Vec<(u64, u64)> {
    found
        .iter()
        .filter_map(|l| {
            let n = l["line"].as_str()?.strip_prefix("n=")?.split(' ').next()?.parse().ok()?;
            Some((l["instance"].as_u64()?, n))
        })
        .collect()
}

fn encode(text: &str) -> String {
    url::form_urlencoded::byte_serialize(text.as_bytes()).collect()
}

#[tokio::test]
async fn a_hundred_thousand_lines_are_searched_exactly_survive_a_restart_and_are_pruned() {
    let (syslog_port, forwarded, syslog) = syslog_receiver().await;
    let forward = format!("syslog+tcp://127.0.0.1:{syslog_port}");
    let Platform { tmp, git, mut server } = start_platform(&["--log-forward", &forward]).await.unwrap();
    let mut agents = Vec::new();
    for name in ["logs-a", "logs-b"] {
        let (token, ca) = server.join_token().await.unwrap();
        let mut agent = AgentNode::join(&server, &tmp.path().join(name), name, &token, &ca, &[]).unwrap().unwrap();
        agent.start(&AGENT_FLAGS).unwrap();
        agents.push(agent);
    }
    for agent in &agents {
        wait_for(Duration::from_secs(30), "both nodes ready", || async { (server.node(&agent.node_id).await.ok()?["state"] == "ready").then_some(()) })
            .await
            .unwrap();
    }
    let logs_of = |agents: &[AgentNode]| agents.iter().map(|a| a.log_text()).collect::<Vec<_>>().join("\n----\n");
    let app = unique_name("store");
    git.commit(&app, &[("Dockerfile", DOCKERFILE), ("run.sh", RUN_SH)], "printing app").unwrap();
    let (status, body) = server
        .call(Method::POST, "/api/apps", Some(json!({"name": app, "repo_url": git.url(&app), "port": 8080, "instances": 2, "health_timeout_seconds": 30})))
        .await
        .unwrap();
    assert_eq!(status, 201, "{body}");
    let settled = server.deploy_and_settle(&app, None).await.unwrap_or_else(|e| panic!("{e}\n{}", logs_of(&agents)));
    assert_eq!(settled["state"], "running", "{settled}");
    let nodes: HashSet<&str> = settled["instances"].as_array().unwrap().iter().filter_map(|i| i["node_id"].as_str()).collect();
    assert_eq!(nodes.len(), 2, "one instance per node: {settled}");

    // Bad searches are refused with the reason.
    for (query, wanted) in [("grep=(unclosed", "grep"), ("since=yesterday", "since"), ("instance=0", "instance"), ("stream=stdin", "stream"), ("cursor=x", "cursor"), ("limit=5000", "limit")] {
        let (status, body) = server.call(Method::GET, &format!("/api/apps/{app}/logs?{query}"), None).await.unwrap();
        assert_eq!(status, 400, "{query}: {body}");
        assert!(body["error"].as_str().unwrap_or_default().contains(wanted), "{query}: {body}");
    }
    let (status, _) = server.call(Method::GET, &format!("/api/apps/{app}/logs?follow=1&until=1h"), None).await.unwrap();
    assert_eq!(status, 400, "follow goes on from now");

    // Every line is stored (both instances print "done printing" last).
    wait_for(Duration::from_secs(240), "both instances' lines to be stored", || async {
        let done = all_pages(&server, &app, "q=done+printing").await;
        (done.len() == 2).then_some(())
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", logs_of(&agents)));

    // Words: exactly the 10,000 ERROR lines, each once, newest first.
    let errors = all_pages(&server, &app, "q=ERROR").await;
    let numbered = numbers(&errors);
    if numbered.len() != 10_000 {
        let notes: Vec<String> = all_pages(&server, &app, "stream=agent").await.iter().map(|l| l["line"].to_string()).collect();
        let have: HashSet<(u64, u64)> = numbered.iter().copied().collect();
        let missing: Vec<(u64, u64)> = (1..=2).flat_map(|i| (0..50_000).step_by(10).map(move |n| (i, n))).filter(|k| !have.contains(k)).collect();
        let ranges: Vec<String> = missing.chunk_by(|a, b| a.0 == b.0 && a.1 + 10 == b.1).map(|r| format!("#{} n={}..={}", r[0].0, r[0].1, r[r.len() - 1].1)).collect();
        panic!("{} ERROR lines of 10,000, missing {ranges:?}; the platform's notes: {notes:?}; stored: {}\n{}", numbered.len(), stored(&server, &app).await, logs_of(&agents));
    }
    assert_eq!(numbered.iter().collect::<HashSet<_>>().len(), 10_000, "no line twice");
    assert!(numbered.iter().all(|(_, n)| n % 10 == 0));
    let times: Vec<&str> = errors.iter().map(|l| l["ts"].as_str().unwrap()).collect();
    assert!(times.windows(2).all(|w| w[0] >= w[1]), "newest first");
    // A pattern on one instance: the 5,000 lines ending in 5 of instance 2.
    let fives = all_pages(&server, &app, &format!("instance=2&grep={}", encode("^n=[0-9]*5 ok"))).await;
    let numbered = numbers(&fives);
    assert_eq!(numbered.len(), 5_000);
    assert!(numbered.iter().all(|(instance, n)| *instance == 2 && n % 10 == 5));
    // A time range on instance 1: the ERROR lines from n=20000 up to, not
    // including, n=30000.
    let at = |n: u32| {
        let server = &server;
        let app = &app;
        async move {
            let found = all_pages(server, app, &format!("instance=1&grep={}", encode(&format!("^n={n} ")))).await;
            assert_eq!(found.len(), 1, "n={n}: {found:?}");
            found[0]["ts"].as_str().unwrap().to_string()
        }
    };
    let (from, to) = (at(20_000).await, at(30_000).await);
    let range = format!("instance=1&q=ERROR&since={}&until={}", encode(&from), encode(&to));
    let in_range = numbers(&all_pages(&server, &app, &range).await);
    assert_eq!(in_range.len(), 1_000);
    assert!(in_range.iter().all(|(i, n)| *i == 1 && (20_000..30_000).contains(n)));

    // What cannot be shown as it came: a 1 MiB line is cut (the Engine
    // splits it, the agent caps each piece with a marker), binary and
    // invalid UTF-8 are replaced, and nothing breaks.
    let long = all_pages(&server, &app, &format!("grep={}", encode("^xxxxxxxx"))).await;
    assert!(!long.is_empty());
    assert!(long.iter().all(|l| l["line"].as_str().unwrap().len() <= 16 * 1024));
    let total: usize = long.iter().map(|l| l["line"].as_str().unwrap().matches('x').count()).sum();
    let cut = long.iter().filter(|l| l["line"].as_str().unwrap().ends_with("…[cut: 1048576 bytes]")).count();
    assert!(
        (total >= 2 * 1_048_576 - 2 * 64 * 1024 && total <= 2 * 1_048_576) || cut == 2,
        "both instances' megabyte, in the Engine's pieces or cut with a marker: {total} x in {} lines, {cut} cut: {:?}",
        long.len(),
        long.iter().map(|l| l["line"].as_str().unwrap().chars().rev().take(40).collect::<String>().chars().rev().collect::<String>()).collect::<Vec<_>>()
    );
    let bad = all_pages(&server, &app, "q=utf8").await;
    assert_eq!(bad.len(), 2, "{bad:?}");
    assert!(bad.iter().all(|l| l["line"] == "bad \u{fffd}\u{fffd} utf8 here"), "{bad:?}");

    // The CLI: the newest 50 ERROR lines of instance 2, oldest first.
    let (code, out, err) = cli(&server, &["logs", &app, "--grep", "ERROR|panic", "--instance", "2", "--since", "1h", "-n", "50", "--json"]);
    assert_eq!(code, 0, "{err}");
    let printed: Vec<Value> = serde_json::from_str(&out).unwrap();
    assert_eq!(printed.len(), 50);
    assert!(printed.iter().all(|l| l["instance"] == 2 && l["line"].as_str().unwrap().contains("ERROR")));
    let printed_n: Vec<u64> = numbers(&printed).iter().map(|(_, n)| *n).collect();
    assert_eq!(printed_n, (0..50).map(|i| 49_500 + i * 10).collect::<Vec<_>>(), "the newest, oldest first");
    let (code, out, err) = cli(&server, &["logs", &app, "--search", "utf8"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.lines().count(), 2, "{out}");
    let (code, _, err) = cli(&server, &["logs", &app, "--grep", "(", "-n", "1"]);
    assert_ne!(code, 0);
    assert!(err.contains("grep"), "{err}");

    // A crash of the control plane keeps every line.
    let before = stored(&server, &app).await;
    server.restart().await.unwrap();
    assert_eq!(numbers(&all_pages(&server, &app, "q=ERROR").await).len(), 10_000);
    assert_eq!(numbers(&all_pages(&server, &app, &range).await).len(), 1_000);
    let (_, tail) = server.call(Method::GET, &format!("/api/apps/{app}/logs?lines=2"), None).await.unwrap();
    assert_eq!(lines(&tail).len(), 2, "the tail comes from the store after a restart: {tail}");
    assert_eq!(stored(&server, &app).await["lines"], before["lines"]);
    // Both agents restart too (a host's reboot): each sends its
    // containers' last 200 lines again; none is stored twice.
    for agent in agents.iter_mut() {
        agent.kill();
        agent.start(&AGENT_FLAGS).unwrap();
    }
    for agent in &agents {
        wait_for(Duration::from_secs(30), "both nodes ready again", || async { (server.node(&agent.node_id).await.ok()?["state"] == "ready").then_some(()) })
            .await
            .unwrap();
    }
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(all_pages(&server, &app, "q=done+printing").await.len(), 2, "the tails sent again are recognised");
    assert_eq!(stored(&server, &app).await["lines"], before["lines"]);

    // Every line was forwarded too, as RFC 5424 messages of the app.
    let errors_forwarded = || {
        let header = format!(" {app} ");
        forwarded.lock().unwrap().iter().filter(|m| m.starts_with("<14>1 ") && m.contains(&header) && m.ends_with("ERROR db timeout")).count()
    };
    wait_for(Duration::from_secs(60), "the ERROR lines forwarded", || async { (errors_forwarded() >= 10_000).then_some(()) })
        .await
        .unwrap_or_else(|e| panic!("{e}: {} forwarded", errors_forwarded()));
    // The log system goes away: nothing here waits for it.
    syslog.abort();

    // A burst over the app's rate: cut, counted, and noted where it was.
    server.restart_with(&["--log-lines-per-second", "100", "--log-burst-lines", "100"]).await.unwrap();
    let container = settled["instances"].as_array().unwrap().iter().find(|i| i["instance"] == 1).unwrap()["container"].as_str().unwrap().to_string();
    let print = |script: &str| {
        let status = std::process::Command::new("docker").args(["exec", &container, "sh", "-c", script]).status().unwrap();
        assert!(status.success());
    };
    print("seq 1 1500 | sed 's/^/burst-/' > /proc/1/fd/1");
    tokio::time::sleep(Duration::from_secs(3)).await;
    print("echo after-burst > /proc/1/fd/1");
    wait_for(Duration::from_secs(60), "the line after the burst", || async { (!all_pages(&server, &app, "q=after+burst").await.is_empty()).then_some(()) })
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", logs_of(&agents)));
    let kept = all_pages(&server, &app, &format!("grep={}", encode("^burst-"))).await.len();
    // 1,500 lines fit the agent's buffer: only the rate cuts.
    let notes = all_pages(&server, &app, &format!("stream=agent&grep={}", encode("were dropped: over its rate of 100 lines per second"))).await;
    let noted: u64 = notes.iter().filter_map(|l| l["line"].as_str()?.strip_prefix('[')?.split(' ').next()?.parse::<u64>().ok()).sum();
    assert!(kept < 1500 && noted > 0, "kept {kept}, noted {noted}");
    assert_eq!(kept as u64 + noted, 1500, "nothing lost in silence: {notes:?}");
    assert!(stored(&server, &app).await["dropped"].as_u64().unwrap() >= noted);
    wait_for(Duration::from_secs(60), "the lines the gone log system missed, counted", || async {
        (server.metric("cloudweb_log_forward_lines_total{outcome=\"dropped\"}").await.ok()? > 0.0).then_some(())
    })
    .await
    .unwrap();

    // Retention by size: the oldest go first, the newest stay.
    server.restart_with(&["--log-max-mib-per-app", "1", "--log-prune-interval-seconds", "1"]).await.unwrap();
    let usage = wait_for(Duration::from_secs(60), "the app's lines to fit 1 MiB", || async {
        let usage = stored(&server, &app).await;
        (usage["bytes"].as_u64()? <= 1024 * 1024).then_some(usage)
    })
    .await
    .unwrap();
    assert!(usage["pruned"].as_u64().unwrap() > 50_000, "{usage}");
    assert!(all_pages(&server, &app, &format!("grep={}", encode("^n=0 "))).await.is_empty(), "the oldest went");
    assert_eq!(all_pages(&server, &app, "q=after+burst").await.len(), 1, "the newest stayed");

    // Retention by age: everything older than 10 s goes, counted.
    server.restart_with(&["--log-retention", "10s", "--log-prune-interval-seconds", "1"]).await.unwrap();
    let usage = wait_for(Duration::from_secs(60), "every old line to go", || async {
        let usage = stored(&server, &app).await;
        (usage["lines"] == 0).then_some(usage)
    })
    .await
    .unwrap();
    assert!(usage["pruned"].as_u64().unwrap() >= 100_000, "{usage}");

    // A deleted app's stored lines go with it.
    print("echo last-words > /proc/1/fd/1");
    wait_for(Duration::from_secs(30), "the last line", || async { (!all_pages(&server, &app, "q=last+words").await.is_empty()).then_some(()) }).await.unwrap();
    let (status, _) = server.call(Method::DELETE, &format!("/api/apps/{app}"), None).await.unwrap();
    assert_eq!(status, 204);
    let (status, body) = server.call(Method::POST, "/api/apps", Some(json!({"name": app, "repo_url": git.url(&app), "port": 8080}))).await.unwrap();
    assert_eq!(status, 201, "{body}");
    wait_for(Duration::from_secs(10), "the old lines to be gone", || async { all_pages(&server, &app, "q=last+words").await.is_empty().then_some(()) }).await.unwrap();
    for agent in &agents {
        agent.remove_containers();
    }
}
