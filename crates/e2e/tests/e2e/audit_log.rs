//! The audit log's reach and bounds (issue 28): every entry is also
//! shipped to a syslog receiver (`--audit-forward`), carrying the hash
//! the chain holds; a flood of refused anonymous webhooks writes a
//! bounded number of entries plus one summary a minute, while a request
//! over the budget that did something is still written.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use cloudweb_e2e::{wait_for, ServerProcess};
use reqwest::Method;
use serde_json::{json, Value};
use tokio::io::AsyncReadExt;

use crate::gitlab::{hmac_sha256, post_webhook};

async fn entries(server: &ServerProcess, action: &str) -> Vec<Value> {
    let (status, body) = server.call(Method::GET, &format!("/api/audit?since=1h&action={action}&limit=1000"), None).await.unwrap();
    assert_eq!(status, 200, "{body}");
    body["entries"].as_array().unwrap().clone()
}

/// The messages of an octet-counted stream ("LEN MSG" after "LEN MSG").
fn frames(stream: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = stream.as_bytes();
    while let Some(space) = rest.iter().position(|b| *b == b' ') {
        let Some(len) = std::str::from_utf8(&rest[..space]).ok().and_then(|l| l.parse::<usize>().ok()) else { break };
        let Some(message) = rest.get(space + 1..space + 1 + len) else { break };
        out.push(String::from_utf8_lossy(message).into_owned());
        rest = &rest[space + 1 + len..];
    }
    out
}

#[tokio::test]
async fn entries_reach_syslog_and_anonymous_floods_stay_bounded() {
    // A syslog receiver (RFC 6587 octet counting over TCP).
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let received = Arc::new(Mutex::new(String::new()));
    let sink = received.clone();
    tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.unwrap();
        let mut buf = [0u8; 8192];
        loop {
            match socket.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => sink.lock().unwrap().push_str(&String::from_utf8_lossy(&buf[..n])),
            }
        }
    });
    let target = format!("syslog+tcp://127.0.0.1:{port}");
    let tmp = tempfile::tempdir().unwrap();
    let flags = ["--allow-private-git-hosts", "--audit-forward", &target, "--audit-anonymous-per-minute", "6", "--audit-anonymous-per-address", "4"];
    let server = ServerProcess::start_with(tmp.path(), &flags).await.unwrap();

    // A change is shipped as it is written, with the chain's hash.
    let (status, body) = server.call(Method::POST, "/api/users", Some(json!({"name": "root", "password": "root's long password"}))).await.unwrap();
    assert_eq!(status, 201, "{body}");
    let (status, body) = server.call(Method::POST, "/api/teams", Some(json!({"name": "forwarded", "owner": "root"}))).await.unwrap();
    assert_eq!(status, 201, "{body}");
    let written = entries(&server, "POST%20/api/teams").await;
    let response = written.iter().find(|e| e["phase"] == "response" && e["result"] == "201").cloned().unwrap_or_else(|| panic!("{written:?}"));
    let hash = response["hash"].as_str().unwrap().to_string();
    let shipped = wait_for(Duration::from_secs(15), "the entry at the syslog receiver", || async {
        let text = received.lock().unwrap().clone();
        text.contains(&hash).then_some(text)
    })
    .await
    .unwrap();
    let message = frames(&shipped).into_iter().find(|m| m.contains(&hash)).unwrap();
    assert!(message.contains("cloudweb-audit - response [cloudweb-audit@32473") && message.ends_with("POST /api/teams"), "{message}");
    assert!(message.contains("actor=\"admin-token\"") && message.contains("result=\"201\""), "{message}");

    // An app with a signed webhook.
    let (status, created) = server
        .call(Method::POST, "/api/apps", Some(json!({"name": "hooked", "repo_url": "http://127.0.0.1:9/site.git", "port": 8080, "webhook": true})))
        .await
        .unwrap();
    assert_eq!(status, 201, "{created}");
    let secret = created["git"]["webhook"]["secret"].as_str().unwrap().to_string();
    let path = "/api/webhooks/generic/hooked";
    let body = serde_json::to_vec(&json!({"ref": "refs/heads/elsewhere", "after": "0123456789abcdef0123456789abcdef01234567"})).unwrap();

    // 40 forged deliveries: each refused, few written one by one.
    for n in 0..40 {
        let at = (std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs()).to_string();
        let forged = hmac_sha256(format!("guess-{n}").as_bytes(), &[at.as_bytes(), b".", &body].concat());
        let (status, answer) = post_webhook(&server, path, &[("x-cloudweb-timestamp", at.as_str()), ("x-cloudweb-signature", forged.as_str())], body.clone()).await;
        assert_eq!(status, 401, "{answer}");
    }
    // A genuine delivery over the budget did something (it was looked at
    // and ignored: another branch): written all the same.
    let at = (std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs()).to_string();
    let signature = hmac_sha256(secret.as_bytes(), &[at.as_bytes(), b".", &body].concat());
    let (status, answer) = post_webhook(&server, path, &[("x-cloudweb-timestamp", at.as_str()), ("x-cloudweb-signature", signature.as_str())], body.clone()).await;
    assert_eq!(status, 200, "{answer}");
    let hooks = entries(&server, "webhooks/generic").await;
    let refused = hooks.iter().filter(|e| e["phase"] == "response" && e["result"] == "401").count();
    // 4 an address a minute; the flood may straddle two minutes.
    assert!((4..=8).contains(&refused), "refused deliveries written one by one: {refused} of 40");
    assert!(hooks.len() <= 2 * 8 + 2, "{} entries for 41 deliveries", hooks.len());
    assert!(hooks.iter().any(|e| e["phase"] == "response" && e["result"] == "200"), "the genuine delivery: {hooks:?}");

    // Within the next minute, one entry sums up the rest.
    let summary = wait_for(Duration::from_secs(75), "the minute's summary", || async {
        entries(&server, "audit.suppressed").await.into_iter().next()
    })
    .await
    .unwrap();
    let result = summary["result"].as_str().unwrap();
    assert!(result.contains("refused anonymous requests from 1 addresses"), "{result}");
    let (status, verified) = server.call(Method::POST, "/api/audit/verify", None).await.unwrap();
    assert_eq!((status, verified["intact"].as_bool()), (200, Some(true)), "{verified}");
}
