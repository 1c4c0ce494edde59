//! Alerts reach people (issue 26): a real SMTP server (aiosmtpd, started
//! here) and local webhook receivers get exactly one message per alert
//! change, the webhook's signature checks out, a channel whose server is
//! down or answers 500 or never answers is retried and shown failing while
//! the others deliver, and a node outage is one "opened" and one
//! "resolved".

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode};
use cloudweb_e2e::*;
use reqwest::Method;
use serde_json::{json, Value};

/// What a webhook receiver got: headers and body of each request.
type Received = Arc<Mutex<Vec<(HeaderMap, Bytes)>>>;

/// A webhook receiver on a loopback port answering `status`, or never
/// answering when `hang`.
async fn receiver(status: StatusCode, hang: bool) -> (u16, Received) {
    let received: Received = Arc::default();
    let kept = received.clone();
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(move |headers: HeaderMap, body: Bytes| {
            let kept = kept.clone();
            async move {
                kept.lock().unwrap().push((headers, body));
                if hang {
                    tokio::time::sleep(Duration::from_secs(3600)).await;
                }
                status
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (port, received)
}

/// aiosmtpd on a loopback port, writing each message it accepts to
/// `<dir>/<n>.eml`.
fn smtp_server(dir: &std::path::Path) -> (Process, u16) {
    let port = free_port();
    let mail = dir.join("mail");
    std::fs::create_dir_all(&mail).unwrap();
    let script = format!(
        r#"
import asyncio, itertools, pathlib
from aiosmtpd.controller import Controller
counter = itertools.count(1)
class Keep:
    async def handle_DATA(self, server, session, envelope):
        name = pathlib.Path({mail:?}) / f"{{next(counter)}}.eml"
        name.write_bytes(b"X-Rcpt: " + ",".join(envelope.rcpt_tos).encode() + b"\r\n" + envelope.content)
        return "250 Message accepted for delivery"
controller = Controller(Keep(), hostname="127.0.0.1", port={port})
controller.start()
print("listening", flush=True)
asyncio.get_event_loop().run_forever()
"#,
        mail = mail.display().to_string()
    );
    let process = Process::spawn(std::path::Path::new("python3"), &["-c".to_string(), script], dir.join("smtp.log")).unwrap();
    (process, port)
}

fn mails(dir: &std::path::Path) -> Vec<String> {
    let mut names: Vec<_> = std::fs::read_dir(dir.join("mail")).unwrap().map(|e| e.unwrap().path()).collect();
    names.sort();
    // Unfolded (a long header goes on over lines) and without
    // quoted-printable soft breaks, as a mail reader shows it.
    names.iter().map(|p| std::fs::read_to_string(p).unwrap().replace("=\r\n", "").replace("\r\n ", " ").replace("\r\n\t", " ")).collect()
}

fn events(received: &Received) -> Vec<(String, Value)> {
    received
        .lock()
        .unwrap()
        .iter()
        .map(|(headers, body)| (headers["x-cloudweb-event"].to_str().unwrap().to_string(), serde_json::from_slice(body).unwrap()))
        .collect()
}

/// The signature a receiver checks: HMAC-SHA256 of "<timestamp>.<body>".
fn signature_valid(secret: &str, headers: &HeaderMap, body: &[u8]) -> bool {
    let stamp = headers["x-cloudweb-timestamp"].to_str().unwrap();
    let signed = [stamp.as_bytes(), b".", body].concat();
    let expected = format!("sha256={}", hex::encode(hmac_sha256(secret.as_bytes(), &signed)));
    let skew = (stamp.parse::<i64>().unwrap() - time::OffsetDateTime::now_utc().unix_timestamp()).abs();
    headers["x-cloudweb-signature"].to_str().unwrap() == expected && skew < 300
}

/// HMAC-SHA256 (RFC 2104), written out here so the check does not use
/// the code it checks.
fn hmac_sha256(key: &[u8], message: &[u8]) -> Vec<u8> {
    use sha2::{Digest, Sha256};
    let mut block = [0u8; 64];
    if key.len() > 64 {
        block[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        block[..key.len()].copy_from_slice(key);
    }
    let pad = |byte: u8| block.iter().map(|b| b ^ byte).collect::<Vec<u8>>();
    let inner = Sha256::digest([pad(0x36), message.to_vec()].concat());
    Sha256::digest([pad(0x5c), inner.to_vec()].concat()).to_vec()
}

async fn add_channel(server: &ServerProcess, body: Value) -> String {
    let (status, channel) = server.call(Method::POST, "/api/alerts/channels", Some(body)).await.unwrap();
    assert_eq!(status, 201, "{channel}");
    channel["id"].as_str().unwrap().to_string()
}

async fn channel(server: &ServerProcess, id: &str) -> Value {
    server.call(Method::GET, &format!("/api/alerts/channels/{id}"), None).await.unwrap().1
}

#[tokio::test]
async fn a_failed_deploy_and_a_node_outage_reach_email_and_signed_webhooks_once() {
    let tmp = tempfile::tempdir().unwrap();
    let (_smtp, smtp_port) = smtp_server(tmp.path());
    let (hook_port, hook) = receiver(StatusCode::NO_CONTENT, false).await;
    let (broken_port, broken) = receiver(StatusCode::INTERNAL_SERVER_ERROR, false).await;
    let (silent_port, silent) = receiver(StatusCode::OK, true).await;
    let server = ServerProcess::start_with(
        tmp.path(),
        &["--allow-private-alert-targets", "--alert-interval-seconds", "1", "--placement-wait-seconds", "1", "--unreachable-after-seconds", "5"],
    )
    .await
    .unwrap();
    wait_for(Duration::from_secs(10), "aiosmtpd to listen", || async { tokio::net::TcpStream::connect(("127.0.0.1", smtp_port)).await.ok() }).await.unwrap();

    // Refused before anything is stored: a secret too short, plain http
    // to a public host, an unknown kind of alert.
    let secret = "a-signing-secret-for-tests";
    for (bad, why) in [
        (json!({"name": "x", "target": {"kind": "webhook", "url": format!("http://127.0.0.1:{hook_port}/hook"), "secret": "short"}}), "secret"),
        (json!({"name": "x", "target": {"kind": "slack", "url": "ftp://example.com/"}}), "https"),
        (json!({"name": "x", "events": ["disk"], "target": {"kind": "slack", "url": "https://example.com/"}}), "unknown kind"),
    ] {
        let (status, body) = server.call(Method::POST, "/api/alerts/channels", Some(bad)).await.unwrap();
        assert_eq!(status, 400, "{body}");
        assert!(body["error"].as_str().unwrap().contains(why), "{body}");
    }
    let webhook = add_channel(&server, json!({"name": "ops-hook", "target": {"kind": "webhook", "url": format!("http://127.0.0.1:{hook_port}/hook"), "secret": secret}})).await;
    let email = add_channel(
        &server,
        json!({"name": "ops-mail", "target": {"kind": "email", "smtp": {"host": "127.0.0.1", "port": smtp_port, "tls": "none"}, "from": "cloud-web <alerts@example.com>", "to": ["ops@example.com"]}}),
    )
    .await;
    let failing = add_channel(&server, json!({"name": "broken", "events": ["deploy_failed"], "target": {"kind": "slack", "url": format!("http://127.0.0.1:{broken_port}/hook")}})).await;
    let hanging = add_channel(&server, json!({"name": "silent", "events": ["deploy_failed"], "target": {"kind": "slack", "url": format!("http://127.0.0.1:{silent_port}/hook")}})).await;
    let smtp_down = add_channel(
        &server,
        json!({"name": "mail-down", "events": ["deploy_failed"], "target": {"kind": "email", "smtp": {"host": "127.0.0.1", "port": free_port(), "tls": "none"}, "from": "alerts@example.com", "to": ["ops@example.com"]}}),
    )
    .await;
    let (_, list) = server.call(Method::GET, "/api/alerts/channels", None).await.unwrap();
    assert_eq!(list["channels"].as_array().unwrap().len(), 5);
    assert!(!list.to_string().contains(secret), "a channel's secret is never shown: {list}");

    // A deployment that fails (no node to run it).
    server.call(Method::POST, "/api/apps", Some(json!({"name": "lonely", "repo_url": "https://git.example.com/a.git", "port": 80}))).await.unwrap();
    let (status, queued) = server.call(Method::POST, "/api/apps/lonely/deploy", None).await.unwrap();
    assert_eq!(status, 201, "{queued}");
    let started = std::time::Instant::now();
    wait_for(Duration::from_secs(30), "one email and one webhook", || async { (mails(tmp.path()).len() == 1 && hook.lock().unwrap().len() == 1).then_some(()) }).await.unwrap();
    eprintln!("alerts: a failed deployment reached email and webhook {:.1} s after it was queued", started.elapsed().as_secs_f64());
    assert!(started.elapsed() < Duration::from_secs(10), "not held up by the channel that never answers (10 s timeout)");

    let mail = &mails(tmp.path())[0];
    assert!(mail.contains("X-Rcpt: ops@example.com"), "{mail}");
    assert!(mail.contains("Subject: [cloud-web] CRITICAL: deployment"), "{mail}");
    assert!(mail.contains("lonely failed: no node has joined"), "{mail}");
    {
        let got = hook.lock().unwrap();
        let (headers, body) = &got[0];
        assert!(signature_valid(secret, headers, body), "a valid signature");
        assert!(!signature_valid("another-secret-entirely", headers, body));
        let message: Value = serde_json::from_slice(body).unwrap();
        assert_eq!((message["event"].as_str(), message["alert"]["kind"].as_str(), message["alert"]["subject"].as_str()), (Some("opened"), Some("deploy_failed"), Some("lonely")));
    }
    let (_, open) = server.call(Method::GET, "/api/alerts", None).await.unwrap();
    assert_eq!(open["open"], 1, "{open}");
    assert_eq!(open["alerts"][0]["kind"], "deploy_failed");

    // The broken channels are tried, shown failing, and retried; the good
    // ones are not sent anything twice.
    wait_for(Duration::from_secs(30), "the failing channels' first attempts", || async {
        let mut all = Vec::new();
        for id in [&failing, &hanging, &smtp_down] {
            let detail = channel(&server, id).await;
            let delivery = detail["deliveries"][0].clone();
            all.push((delivery["attempts"].as_u64()? >= 1 && delivery["state"] == "pending" && detail["channel"]["failing"] == true).then_some(delivery)?);
        }
        Some(all)
    })
    .await
    .map(|deliveries| {
        assert!(deliveries[0]["last_error"].as_str().unwrap().starts_with("HTTP 500"), "{}", deliveries[0]);
        assert!(deliveries[1]["last_error"].as_str().unwrap().contains("timed out"), "{}", deliveries[1]);
        assert!(deliveries[2]["last_error"].as_str().unwrap().contains("SMTP"), "{}", deliveries[2]);
        assert!(deliveries[0]["next_attempt_at"].is_string(), "a retry is due");
    })
    .unwrap();
    // Retried (10 s later), and still shown failing.
    let retried = wait_for(Duration::from_secs(30), "the 500 channel's retry", || async {
        let detail = channel(&server, &failing).await;
        (detail["deliveries"][0]["attempts"].as_u64()? >= 2).then_some(detail)
    })
    .await
    .unwrap();
    let log = retried["deliveries"][0]["attempt_log"].as_array().unwrap().clone();
    assert!(log.iter().all(|a| a["ok"] == false && a["outcome"].as_str().unwrap().starts_with("HTTP 500")), "{retried}");
    assert!(broken.lock().unwrap().len() >= 2);
    assert!(silent.lock().unwrap().len() >= 1);
    let good = channel(&server, &webhook).await;
    assert_eq!(good["deliveries"][0]["state"], "delivered", "{good}");
    assert_eq!(good["deliveries"][0]["attempt_log"][0]["outcome"], "HTTP 204");
    assert_eq!(channel(&server, &email).await["deliveries"][0]["state"], "delivered");

    // "Send test" through the API: delivered, and shown.
    let (status, test) = server.call(Method::POST, &format!("/api/alerts/channels/{webhook}/test"), None).await.unwrap();
    assert_eq!(status, 202, "{test}");
    wait_for(Duration::from_secs(10), "the test message", || async { (hook.lock().unwrap().len() == 2).then_some(()) }).await.unwrap();
    assert_eq!(events(&hook)[1].0, "test");

    // A node outage: one "unreachable" and one "resolved" per channel.
    let (token, ca) = server.join_token().await.unwrap();
    let mut agent = AgentNode::join(&server, &tmp.path().join("node"), "alerting", &token, &ca, &[]).unwrap().unwrap();
    agent.start(&["--heartbeat-interval-seconds", "1", "--publish-ip", "127.0.0.1", "--advertise-host", "127.0.0.1"]).unwrap();
    let node_id = agent.node_id.clone();
    wait_for(Duration::from_secs(20), "the node ready", || async { (server.node(&node_id).await.ok()?["state"] == "ready").then_some(()) }).await.unwrap();
    agent.kill();
    let down = |event: &'static str| {
        let hook = hook.clone();
        let node_id = node_id.clone();
        move || {
            let found = events(&hook).iter().filter(|(e, m)| e == event && m["alert"]["kind"] == "node_unreachable" && m["alert"]["subject"] == node_id.as_str()).count();
            async move { (found == 1).then_some(()) }
        }
    };
    wait_for(Duration::from_secs(30), "the node_unreachable webhook", down("opened")).await.unwrap();
    agent.start(&["--heartbeat-interval-seconds", "1", "--publish-ip", "127.0.0.1", "--advertise-host", "127.0.0.1"]).unwrap();
    wait_for(Duration::from_secs(30), "the resolved webhook", down("resolved")).await.unwrap();
    // Some more looks: still one of each, and one email for each.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let outage: Vec<String> = events(&hook).iter().filter(|(_, m)| m["alert"]["kind"] == "node_unreachable").map(|(e, _)| e.clone()).collect();
    assert_eq!(outage, ["opened", "resolved"]);
    let outage_mails: Vec<String> = mails(tmp.path()).into_iter().filter(|m| m.contains("is unreachable")).collect();
    assert_eq!(outage_mails.len(), 2, "one opened, one resolved: {outage_mails:?}");
    assert!(outage_mails.iter().any(|m| m.contains("Subject: [cloud-web] Resolved: node")));
    let (_, all) = server.call(Method::GET, "/api/alerts?all=1", None).await.unwrap();
    let outages: Vec<&Value> = all["alerts"].as_array().unwrap().iter().filter(|a| a["kind"] == "node_unreachable").collect();
    assert_eq!(outages.len(), 1, "one alert for one outage: {all}");
    assert!(outages[0]["resolved_at"].is_string());

    // A deleted channel goes with its queue; the others' history stays.
    let (status, _) = server.call(Method::DELETE, &format!("/api/alerts/channels/{failing}"), None).await.unwrap();
    assert_eq!(status, 204);
    let (status, _) = server.call(Method::GET, &format!("/api/alerts/channels/{failing}"), None).await.unwrap();
    assert_eq!(status, 404);
    assert!(!server.process.log_text().contains(secret), "the secret is never logged");
}
