//! Issue 20, finding 3: the user API under a flood of idle connections
//! and of connections that send their headers a line a second (from
//! several loopback addresses), with short timeouts and low caps set by
//! flags. The caps hold (the oldest idle connections are shed), every
//! flood connection is closed within the header timeout, `GET /api/apps`,
//! `POST /api/apps` and a node's heartbeat are served meanwhile, a
//! connection that never sends its headers is closed after the header
//! timeout and a kept-alive one after the idle timeout (not before).

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cloudweb_e2e::{key_and_csr, security_summary, RawClient, ServerProcess};
use reqwest::Method;
use serde_json::{json, Value};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const IDLE: usize = 2000;
const SLOW: usize = 300;
/// Flood sources: 127.0.0.2 to 127.0.0.9 (loopback takes any 127/8 source).
const SOURCES: u8 = 8;
const HEADER_SECONDS: u64 = 6;
const IDLE_SECONDS: u64 = 10;
const MAX_TOTAL: usize = 1500;
const MAX_PER_ADDRESS: usize = 250;
/// Slack for a loaded machine on every "closed by" bound.
const SLACK: Duration = Duration::from_secs(4);

/// Whether the server closed the stream (end of file or an error) within `wait`.
async fn closed_within<S: AsyncRead + Unpin>(stream: &mut S, wait: Duration) -> bool {
    let mut buf = [0u8; 512];
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        match tokio::time::timeout_at(deadline, stream.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            // A response (an error page) may come before the end.
            Ok(Ok(_)) => continue,
            Err(_) => return false,
        }
    }
}

/// One flood connection: its source, when it was opened, and the half the
/// server's close is read on (a slow one's other half is dribbling).
struct Held {
    source: IpAddr,
    opened: Instant,
    read: tokio::net::tcp::OwnedReadHalf,
    _write: Option<tokio::net::tcp::OwnedWriteHalf>,
}

fn p99(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples.get((samples.len() * 99).div_ceil(100).saturating_sub(1)).copied().unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_and_half_sent_connections_are_closed_and_capped_while_the_api_answers() {
    cloudweb_e2e::flood::raise_open_file_limit((IDLE + SLOW) as u64 + 500);
    let tmp = tempfile::tempdir().unwrap();
    let (header, idle, total, per_address) = (HEADER_SECONDS.to_string(), IDLE_SECONDS.to_string(), MAX_TOTAL.to_string(), MAX_PER_ADDRESS.to_string());
    let server = ServerProcess::start_with(
        tmp.path(),
        &[
            "--api-header-timeout-seconds", &header,
            "--api-idle-timeout-seconds", &idle,
            "--max-api-connections", &total,
            "--max-api-connections-per-address", &per_address,
        ],
    )
    .await
    .unwrap();
    let api: SocketAddr = format!("127.0.0.1:{}", server.api_port).parse().unwrap();

    // A node, joined by hand, whose heartbeat must get through the flood.
    let (token, _) = server.join_token().await.unwrap();
    let (key, csr) = key_and_csr(|_| {});
    let (status, text) = RawClient::new(&server.ca_pem(), None)
        .send(Method::POST, &format!("{}/agent/v1/join", server.url()), &[], Some(&json!({"token": token, "csr": csr, "hostname": "host.example", "name": "beating"}).to_string()))
        .await
        .unwrap();
    assert_eq!(status, 200, "{text}");
    let joined: Value = serde_json::from_str(&text).unwrap();
    let node = RawClient::new(&server.ca_pem(), Some((joined["certificate"].as_str().unwrap(), &key)));

    // A user on a fresh connection per request (a kept-alive one would be
    // idle between requests, and fair game for shedding).
    let user = reqwest::Client::builder().pool_max_idle_per_host(0).timeout(Duration::from_secs(10)).build().unwrap();
    let flooding = Arc::new(AtomicBool::new(true));
    let probe = {
        let (user, url, token, flooding) = (user.clone(), server.api("/api/apps"), server.admin_token.clone(), flooding.clone());
        tokio::spawn(async move {
            let (mut took, mut failures) = (Vec::new(), Vec::new());
            while flooding.load(Ordering::SeqCst) {
                let started = Instant::now();
                match user.get(&url).bearer_auth(&token).send().await {
                    Ok(response) if response.status() == 200 => took.push(started.elapsed()),
                    Ok(response) => failures.push(format!("status {}", response.status())),
                    Err(err) => failures.push(format!("{err:?}")),
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            (took, failures)
        })
    };

    // The flood: idle connections with a slow one every eighth, spread
    // over the sources.
    let started = Instant::now();
    let mut flood: Vec<Held> = Vec::with_capacity(IDLE + SLOW);
    let mut next = 0usize;
    while next < IDLE + SLOW {
        let mut batch = tokio::task::JoinSet::new();
        for index in next..(next + 100).min(IDLE + SLOW) {
            let source = IpAddr::from([127, 0, 0, 2 + (index % SOURCES as usize) as u8]);
            let slow = index % ((IDLE + SLOW) / SLOW) == 0 && index / ((IDLE + SLOW) / SLOW) < SLOW;
            batch.spawn(async move {
                let stream = cloudweb_e2e::flood::connect_from(source, api).await.unwrap();
                let opened = Instant::now();
                let (read, write) = stream.into_split();
                let write = if slow {
                    tokio::spawn(cloudweb_e2e::flood::dribble(write));
                    None
                } else {
                    Some(write)
                };
                Held { source, opened, read, _write: write }
            });
        }
        next = (next + 100).min(IDLE + SLOW);
        while let Some(done) = batch.join_next().await {
            flood.push(done.unwrap());
        }
    }
    let opened_in = started.elapsed();

    // Under the flood: an app is created and the node's heartbeat counts.
    let started = Instant::now();
    let created = user
        .post(server.api("/api/apps"))
        .bearer_auth(&server.admin_token)
        .json(&json!({"name": "under-flood", "repo_url": "https://git.example.com/app.git", "port": 8080}))
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), 201, "POST /api/apps under the flood");
    let create_took = started.elapsed();
    let started = Instant::now();
    let body = r#"{"cpu_cores": 2, "mem_bytes": 1073741824, "disk_bytes": 10737418240}"#;
    let (status, text) = node.send(Method::POST, &format!("{}/agent/v1/heartbeat", server.url()), &[], Some(body)).await.unwrap();
    assert_eq!(status, 200, "a heartbeat under the flood: {text}");
    let heartbeat_took = started.elapsed();

    // The caps held: in total and per source address.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut open_per_source: HashMap<IpAddr, usize> = HashMap::new();
    for held in flood.iter_mut() {
        if !closed_within(&mut held.read, Duration::from_millis(1)).await {
            *open_per_source.entry(held.source).or_default() += 1;
        }
    }
    let held_now: usize = open_per_source.values().sum();
    assert!(held_now <= MAX_TOTAL, "{held_now} flood connections held, over the cap of {MAX_TOTAL}");
    assert!(held_now >= MAX_TOTAL / 2, "only {held_now} flood connections held: closed before their timeout (opening took {opened_in:?})");
    for (source, open) in &open_per_source {
        assert!(*open <= MAX_PER_ADDRESS, "{open} connections held from {source}, over the cap of {MAX_PER_ADDRESS}");
    }

    // Two probes opened now, when no more flood comes: one sends nothing,
    // one is kept alive after a request.
    let mut silent = TcpStream::connect(api).await.unwrap();
    let silent_opened = Instant::now();
    let mut kept = TcpStream::connect(api).await.unwrap();
    kept.write_all(b"GET /healthz HTTP/1.1\r\nhost: probe\r\n\r\n").await.unwrap();
    let mut answer = [0u8; 1024];
    let read = tokio::time::timeout(Duration::from_secs(5), kept.read(&mut answer)).await.unwrap().unwrap();
    assert!(answer[..read].starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&answer[..read]));
    let kept_answered = Instant::now();

    // Every flood connection is closed within the header timeout of its
    // opening (the slow ones are still sending).
    let header_limit = Duration::from_secs(HEADER_SECONDS) + SLACK;
    let mut open_after = 0;
    let mut last_close = Duration::ZERO;
    for held in flood.iter_mut() {
        let wait = (held.opened + header_limit).saturating_duration_since(Instant::now());
        if closed_within(&mut held.read, wait).await {
            last_close = last_close.max(held.opened.elapsed());
        } else {
            open_after += 1;
        }
    }
    assert_eq!(open_after, 0, "flood connections still open {header_limit:?} after they were opened");
    flooding.store(false, Ordering::SeqCst);
    let (took, failures) = probe.await.unwrap();
    assert!(failures.is_empty(), "GET /api/apps failed under the flood: {failures:?}");
    assert!(took.len() >= 10, "only {} GET /api/apps answered under the flood", took.len());
    let apps_p99 = p99(took.clone());
    assert!(apps_p99 < Duration::from_secs(1), "GET /api/apps p99 {apps_p99:?} under the flood");

    // The silent probe went at the header timeout.
    let early = Duration::from_secs(HEADER_SECONDS) - Duration::from_millis(1500);
    let wait = (silent_opened + early).saturating_duration_since(Instant::now());
    assert!(!closed_within(&mut silent, wait).await, "a silent connection closed before the header timeout");
    let wait = (silent_opened + Duration::from_secs(HEADER_SECONDS) + SLACK).saturating_duration_since(Instant::now());
    assert!(closed_within(&mut silent, wait).await, "a connection that never sent its headers is still open");
    let silent_closed = silent_opened.elapsed();
    // The kept-alive probe outlived the header timeout, and went at the idle one.
    let wait = (kept_answered + Duration::from_secs(HEADER_SECONDS + 2)).saturating_duration_since(Instant::now());
    assert!(!closed_within(&mut kept, wait).await, "a kept-alive connection was closed at the header timeout");
    let wait = (kept_answered + Duration::from_secs(IDLE_SECONDS) + SLACK).saturating_duration_since(Instant::now());
    assert!(closed_within(&mut kept, wait).await, "a kept-alive connection is still open after the idle timeout");
    let kept_closed = kept_answered.elapsed();

    let line = format!(
        "{IDLE} idle + {SLOW} slow-header connections from {SOURCES} addresses opened in {:.1} s; {held_now} held (caps {MAX_TOTAL} total, {MAX_PER_ADDRESS} per address); all closed within {:.1} s (header timeout {HEADER_SECONDS} s); GET /api/apps p99 {} ms over {} requests, POST /api/apps {} ms, heartbeat {} ms; a silent connection closed after {:.1} s, a kept-alive one after {:.1} s (idle timeout {IDLE_SECONDS} s)",
        opened_in.as_secs_f64(),
        last_close.as_secs_f64(),
        apps_p99.as_millis(),
        took.len(),
        create_took.as_millis(),
        heartbeat_took.as_millis(),
        silent_closed.as_secs_f64(),
        kept_closed.as_secs_f64(),
    );
    security_summary("3 user API connections", &line);
}
