//! Node certificate renewal and the way back for a node whose certificate
//! expired while it was offline.
//!
//! In-process, with a clock the test moves: the renewal endpoint's rules
//! (only the node's own identity, only a new key), the switch (old and new
//! both work until the new one is used, then the old one is refused as
//! replaced), and a re-join that keeps the node's id, name, mesh address
//! and instances once its certificate has expired by the control plane's
//! clock.
//!
//! With the real binaries and a short certificate lifetime
//! (`--node-cert-seconds`): the agent renews on its own at two thirds of the
//! lifetime and stays connected past the first certificate's end; an agent
//! whose certificate expired while it was stopped refuses to run (exit 77)
//! and `cloudweb-agent join` with a new token brings the same node back
//! with its running app.
//!
//! The control plane's own listener certificate (`--listener-cert-seconds`)
//! is renewed while it runs, with the same key, and a connected agent keeps
//! heartbeating across two renewals and moves to each new certificate.

use std::time::{Duration, SystemTime};

use cloudweb_e2e::control::{Control, HandNode};
use cloudweb_e2e::{key_and_csr, pem_sha256, run_agent_command, start_platform, unique_name, wait_for, AgentNode, RawClient};
use reqwest::Method;
use serde_json::{json, Value};
use sha2::Digest;
use x509_parser::prelude::{FromDer, X509Certificate};

const DAY: Duration = Duration::from_secs(24 * 3600);

fn not_after(pem: &str) -> SystemTime {
    use rustls::pki_types::pem::PemObject;
    let der = rustls::pki_types::CertificateDer::from_pem_slice(pem.as_bytes()).unwrap();
    let (_, cert) = X509Certificate::from_der(der.as_ref()).unwrap();
    SystemTime::UNIX_EPOCH + Duration::from_secs(cert.validity().not_after.timestamp() as u64)
}

async fn renew(cp: &Control, client: &RawClient, csr: &str) -> (u16, Value) {
    let body = json!({"csr": csr}).to_string();
    let (status, text) = client.send(Method::POST, &cp.agent_url("/agent/v1/renew"), &[], Some(&body)).await.unwrap();
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

async fn commands_status(cp: &Control, client: &RawClient) -> (u16, String) {
    client.send(Method::GET, &cp.agent_url("/agent/v1/commands"), &[], None).await.unwrap()
}

#[tokio::test]
async fn renewal_and_rejoin_with_a_moving_clock() {
    let dir = tempfile::tempdir().unwrap();
    let cp = Control::start(dir.path(), |c| c.node_cert_lifetime = DAY).await;
    let a = cp.join("alpha").await;
    let b = cp.join("beta").await;
    cp.alive(&a).await;
    let before: Value = cp.call(Method::GET, &format!("/api/nodes/{}", a.id), None).await.1;
    let first_sha = before["certificate"]["sha256"].as_str().unwrap().to_string();

    // A CSR naming another node is refused, though the certificate
    // presented is valid; so is one for the key already certified, and a
    // CSR that is not one.
    let (_, other) = key_and_csr(|p| p.distinguished_name.push(rcgen::DnType::CommonName, b.id.as_str()));
    let (status, body) = renew(&cp, &a.client, &other).await;
    assert_eq!(status, 403, "{body}");
    assert!(body["error"].as_str().unwrap().contains(&b.id), "{body}");
    let (status, body) = renew(&cp, &a.client, "-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----\n").await;
    assert_eq!(status, 400, "{body}");
    // Without a client certificate there is nothing to renew.
    let (_, csr) = key_and_csr(|_| {});
    let (status, _) = renew(&cp, &cp.anonymous(), &csr).await;
    assert_eq!(status, 401);

    // A renewal with a new key naming the node itself. (The clock is not
    // moved before it: the new certificate must be valid for the TLS
    // handshakes below, which use the real time.)
    let (key, csr) = key_and_csr(|p| p.distinguished_name.push(rcgen::DnType::CommonName, a.id.as_str()));
    let (status, body) = renew(&cp, &a.client, &csr).await;
    assert_eq!(status, 200, "{body}");
    let certificate = body["certificate"].as_str().unwrap().to_string();
    let issued_end = not_after(&certificate);
    let expected_end = SystemTime::now() + DAY;
    let off = issued_end.duration_since(expected_end).unwrap_or_else(|e| e.duration());
    assert!(off < Duration::from_secs(60), "the renewed certificate ends {issued_end:?}, expected about {expected_end:?}");
    assert!(body["not_after"].is_string(), "{body}");
    // Until the new certificate is used, the old one still works.
    assert_eq!(commands_status(&cp, &a.client).await.0, 200);
    let renewed = HandNode { id: a.id.clone(), client: RawClient::new(cp.server.state.ca.cert_pem(), Some((&certificate, &key))) };
    assert_eq!(commands_status(&cp, &renewed.client).await.0, 200);
    // From then on the old one is refused as replaced (not "removed").
    let (status, text) = commands_status(&cp, &a.client).await;
    assert_eq!(status, 401, "{text}");
    assert!(text.contains("certificate_replaced"), "{text}");
    let view: Value = cp.call(Method::GET, &format!("/api/nodes/{}", a.id), None).await.1;
    assert_eq!(view["certificate"]["sha256"], pem_sha256(&certificate), "{view}");
    assert_ne!(view["certificate"]["sha256"], first_sha.as_str());
    assert!(view["certificate"]["renewed_at"].is_string(), "{view}");
    // Another node is untouched.
    assert_eq!(commands_status(&cp, &b.client).await.0, 200);
    // A CSR for the key already certified is not a renewal.
    let (status, body) = renew(&cp, &renewed.client, &csr).await;
    assert_eq!(status, 400, "{body}");
    assert!(body["error"].as_str().unwrap().contains("new key"), "{body}");

    // An instance on the node.
    let (status, _) = cp.create_app("web", json!({})).await;
    assert_eq!(status, 201);
    cp.alive(&renewed).await;
    let (_, deployment) = cp.call(Method::POST, "/api/apps/web/deploy", None).await;
    let deployment = deployment["id"].as_str().unwrap().to_string();
    let placed = cp.deployment_until(&deployment, 20, "a placement", |d| d["instances"].as_array().is_some_and(|i| !i.is_empty())).await;
    let on_a: Vec<u32> = placed["instances"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["node_id"] == a.id.as_str())
        .map(|i| i["instance"].as_u64().unwrap() as u32)
        .collect();
    for instance in &on_a {
        cp.run_on(&renewed, &deployment, *instance).await;
    }

    // While the node is online with a valid certificate, a re-join is
    // refused (and the token is not spent).
    let token = cp.token().await;
    let rejoin = |token: &str, name: &str, id: &str| {
        let (key, csr) = key_and_csr(|_| {});
        (key, json!({"token": token, "csr": csr, "hostname": "h2", "name": name, "rejoin": id}).to_string())
    };
    let (_, body) = rejoin(&token, "alpha", &a.id);
    let (status, text) = cp.anonymous().send(Method::POST, &cp.agent_url("/agent/v1/join"), &[], Some(&body)).await.unwrap();
    assert_eq!(status, 409, "{text}");

    // The clock moves past the renewed certificate's end (the node was
    // offline all that time): now a new token re-joins it.
    cp.clock.advance(DAY * 2);
    let token = cp.token().await;
    let (_, body) = rejoin(&token, "other-name", &a.id);
    let (status, text) = cp.anonymous().send(Method::POST, &cp.agent_url("/agent/v1/join"), &[], Some(&body)).await.unwrap();
    assert_eq!(status, 409, "a re-join keeps the name: {text}");
    let (_, body) = rejoin(&token, "alpha", "n-00000000000000ff");
    let (status, text) = cp.anonymous().send(Method::POST, &cp.agent_url("/agent/v1/join"), &[], Some(&body)).await.unwrap();
    assert_eq!(status, 404, "{text}");
    let (_, body) = rejoin(&token, "alpha", &a.id);
    let (status, text) = cp.anonymous().send(Method::POST, &cp.agent_url("/agent/v1/join"), &[], Some(&body)).await.unwrap();
    assert_eq!(status, 200, "{text}");
    let joined: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(joined["node_id"], a.id.as_str());
    assert_eq!(joined["name"], "alpha");
    assert_eq!(joined["mesh_address"], before["mesh_address"], "{joined}");
    // The certificate it had is refused as replaced; the node keeps its
    // instances, and there is still one node called alpha.
    let (status, text) = commands_status(&cp, &renewed.client).await;
    assert_eq!(status, 401, "{text}");
    let view: Value = cp.call(Method::GET, &format!("/api/nodes/{}", a.id), None).await.1;
    assert_eq!(view["certificate"]["sha256"], pem_sha256(joined["certificate"].as_str().unwrap()), "{view}");
    let d = cp.deployment(&deployment).await;
    for instance in &on_a {
        let kept = d["instances"].as_array().unwrap().iter().any(|i| i["node_id"] == a.id.as_str() && i["instance"] == *instance);
        assert!(kept, "instance {instance} is no longer on {}: {d}", a.id);
    }
    let (_, nodes) = cp.call(Method::GET, "/api/nodes", None).await;
    assert_eq!(nodes["nodes"].as_array().unwrap().iter().filter(|n| n["name"] == "alpha").count(), 1, "{nodes}");
    // The token is spent now.
    let (_, body) = rejoin(&token, "alpha", &a.id);
    let (status, _) = cp.anonymous().send(Method::POST, &cp.agent_url("/agent/v1/join"), &[], Some(&body)).await.unwrap();
    assert_eq!(status, 401);
    cp.server.shutdown().await;
}

const AGENT_FLAGS: [&str; 6] = ["--heartbeat-interval-seconds", "1", "--publish-ip", "127.0.0.1", "--advertise-host", "127.0.0.1"];

#[tokio::test]
async fn the_agent_renews_its_certificate_and_outlives_the_first_one() {
    let tmp = tempfile::tempdir().unwrap();
    let server = cloudweb_e2e::ServerProcess::start_with(tmp.path(), &["--node-cert-seconds", "36"]).await.unwrap();
    let (token, ca) = server.join_token().await.unwrap();
    let mut agent = AgentNode::join(&server, &tmp.path().join("node"), "node-0", &token, &ca, &[]).unwrap().unwrap();
    let first_cert = agent.read("node.crt");
    let first_key = agent.read("node.key");
    let first_end = not_after(&first_cert);
    agent.start(&AGENT_FLAGS).unwrap();
    let node = agent.node_id.clone();

    let renewed = wait_for(Duration::from_secs(60), "the agent to switch to a renewed certificate", || async {
        let view = server.node(&node).await.ok()?;
        (view["certificate"]["sha256"] != pem_sha256(&first_cert).as_str() && view["certificate"]["renewed_at"].is_string()).then_some(view)
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\nagent:\n{}\nserver:\n{}", agent.log_text(), server.process.log_text()));
    // A new key, and the files on disk are the pair in use (or a later one).
    assert_ne!(agent.read("node.key"), first_key);
    assert!(not_after(&agent.read("node.crt")) > first_end);
    assert!(renewed["certificate"]["not_after"].is_string(), "{renewed}");

    // The first certificate is refused as replaced.
    let old = RawClient::new(&agent.read("ca.crt"), Some((&first_cert, &first_key)));
    let (status, text) = old.send(Method::GET, &format!("{}/agent/v1/commands", server.url()), &[], None).await.unwrap();
    assert_eq!(status, 401, "{text}");
    assert!(text.contains("certificate_replaced"), "{text}");

    // Past the first certificate's end the node is still connected.
    let wait = first_end.duration_since(SystemTime::now()).unwrap_or_default() + Duration::from_secs(3);
    tokio::time::sleep(wait).await;
    let heartbeat_before = server.node(&node).await.unwrap()["last_heartbeat"].clone();
    let view = wait_for(Duration::from_secs(15), "a heartbeat after the first certificate ended", || async {
        let view = server.node(&node).await.ok()?;
        (view["state"] == "ready" && view["last_heartbeat"] != heartbeat_before).then_some(view)
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\nagent:\n{}", agent.log_text()));
    assert!(agent.process.as_mut().unwrap().is_running(), "{}", agent.log_text());
    assert!(agent.log_text().contains("renewed this node's certificate"), "{}", agent.log_text());
    assert!(!agent.log_text().contains("no longer registered"), "{}", agent.log_text());
    drop(view);
}

const DOCKERFILE: &str = "FROM cloudweb-test/busybox:latest\nCOPY index.html /www/index.html\nCMD [\"httpd\", \"-f\", \"-p\", \"8080\", \"-h\", \"/www\"]\n";

#[tokio::test]
async fn a_node_whose_certificate_expired_offline_rejoins_with_its_name_and_instances() {
    let platform = start_platform(&["--node-cert-seconds", "30"]).await.unwrap();
    let server = &platform.server;
    let (token, ca) = server.join_token().await.unwrap();
    let data = platform.tmp.path().join("node");
    let mut agent = AgentNode::join(server, &data, "node-0", &token, &ca, &[]).unwrap().unwrap();
    agent.start(&AGENT_FLAGS).unwrap();
    let node = agent.node_id.clone();
    wait_for(Duration::from_secs(20), "node ready", || async { (server.node(&node).await.ok()?["capacity"].is_object()).then_some(()) })
        .await
        .unwrap();

    let app = unique_name("rejoin");
    platform.git.commit(&app, &[("Dockerfile", DOCKERFILE), ("index.html", "still here\n")], "first").unwrap();
    let (status, body) = server
        .call(Method::POST, "/api/apps", Some(json!({"name": app, "repo_url": platform.git.url(&app), "port": 8080, "health_timeout_seconds": 20})))
        .await
        .unwrap();
    assert_eq!(status, 201, "{body}");
    let (_, body) = server.call(Method::POST, &format!("/api/apps/{app}/deploy"), None).await.unwrap();
    let deployment = body["id"].as_str().unwrap().to_string();
    let running = wait_for(Duration::from_secs(180), "the deployment to run", || async {
        let (_, d) = server.call(Method::GET, &format!("/api/deployments/{deployment}"), None).await.ok()?;
        (d["state"] == "running" || d["state"] == "failed").then_some(d)
    })
    .await
    .unwrap();
    assert_eq!(running["state"], "running", "{running}\nagent:\n{}", agent.log_text());

    // The agent stops and stays stopped past its certificate's end.
    agent.kill();
    let end = not_after(&agent.read("node.crt"));
    tokio::time::sleep(end.duration_since(SystemTime::now()).unwrap_or_default() + Duration::from_secs(2)).await;

    // `run` refuses with the way back, and exits 77 (not restarted).
    let args: Vec<String> = ["--data-dir", &data.display().to_string(), "run"].iter().map(|s| s.to_string()).collect();
    let refused = std::process::Command::new(cloudweb_e2e::bin("cloudweb-agent")).args(&args).output().unwrap();
    let text = String::from_utf8_lossy(&refused.stderr).to_string();
    assert_eq!(refused.status.code(), Some(77), "{text}");
    assert!(text.contains("certificate expired") && text.contains("cloudweb-agent join"), "{text}");

    // `join` with a new token re-joins as the same node.
    let (token, ca) = server.join_token().await.unwrap();
    let args: Vec<String> = [
        "--data-dir", &data.display().to_string(), "join", "--server", &server.url(), "--token", &token, "--ca-sha256", &ca,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let joined = run_agent_command(&args).unwrap();
    assert!(joined.success, "{}", joined.output);
    assert!(joined.output.contains(&node) && joined.output.contains("node-0"), "{}", joined.output);
    let info: Value = serde_json::from_str(&agent.read("node.json")).unwrap();
    assert_eq!(info["node_id"], node.as_str());
    agent.start(&AGENT_FLAGS).unwrap();
    let view = wait_for(Duration::from_secs(30), "the node back, ready", || async {
        let view = server.node(&node).await.ok()?;
        (view["state"] == "ready" && view["certificate"]["sha256"] == pem_sha256(&agent.read("node.crt")).as_str()).then_some(view)
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\nagent:\n{}", agent.log_text()));
    assert_eq!(view["name"], "node-0");
    // Its app still runs there, and still answers.
    let (_, d) = server.call(Method::GET, &format!("/api/deployments/{deployment}"), None).await.unwrap();
    assert_eq!(d["state"], "running", "{d}");
    assert!(d["instances"].as_array().unwrap().iter().all(|i| i["node_id"] == node.as_str()), "{d}");
    let (_, nodes) = server.call(Method::GET, "/api/nodes", None).await.unwrap();
    assert_eq!(nodes["nodes"].as_array().unwrap().len(), 1, "{nodes}");
    let listed = std::process::Command::new("docker")
        .args(["ps", "-q", "--filter", &format!("label=cloudweb.deployment={deployment}"), "--filter", &format!("label=cloudweb.node={node}")])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&listed.stdout).split_whitespace().count(), 1);
}

/// Serial (hex) and SubjectPublicKeyInfo (DER) of the certificate the agent
/// listener presents now, verified against the cluster CA.
async fn listener_leaf(port: u16, ca_pem: &str) -> (String, Vec<u8>, Vec<u8>) {
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    roots.add(rustls::pki_types::CertificateDer::from_pem_slice(ca_pem.as_bytes()).unwrap()).unwrap();
    let config = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(rustls::crypto::ring::default_provider()))
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let tls = tokio::time::timeout(Duration::from_secs(5), connector.connect(name, tcp)).await.unwrap().unwrap();
    let der = tls.get_ref().1.peer_certificates().unwrap()[0].to_vec();
    let (_, cert) = X509Certificate::from_der(&der).unwrap();
    (hex::encode(cert.raw_serial()), cert.tbs_certificate.subject_pki.raw.to_vec(), der)
}

#[tokio::test]
async fn the_listener_certificate_is_renewed_under_a_connected_agent() {
    let tmp = tempfile::tempdir().unwrap();
    // Renewed about every 8 s.
    let server = cloudweb_e2e::ServerProcess::start_with(tmp.path(), &["--listener-cert-seconds", "12"]).await.unwrap();
    let (token, ca) = server.join_token().await.unwrap();
    let mut agent = AgentNode::join(&server, &tmp.path().join("node"), "node-0", &token, &ca, &[]).unwrap().unwrap();
    agent.start(&AGENT_FLAGS).unwrap();
    let node = agent.node_id.clone();
    let ca_pem = agent.read("ca.crt");
    wait_for(Duration::from_secs(20), "node ready", || async { (server.node(&node).await.ok()?["state"] == "ready").then_some(()) })
        .await
        .unwrap_or_else(|e| panic!("{e}\nagent:\n{}", agent.log_text()));
    let (mut serial, spki, _) = listener_leaf(server.agent_port, &ca_pem).await;
    let started = std::time::Instant::now();
    for renewal in 1..=2 {
        let previous = serial.clone();
        let (next, next_spki, der) = wait_for(Duration::from_secs(20), "the listener to serve a renewed certificate", || async {
            let leaf = listener_leaf(server.agent_port, &ca_pem).await;
            (leaf.0 != previous).then_some(leaf)
        })
        .await
        .unwrap_or_else(|e| panic!("{e}\nserver:\n{}", server.process.log_text()));
        println!("figure: listener renewal {renewal} after {:.1} s", started.elapsed().as_secs_f64());
        assert_eq!(next_spki, spki, "renewal keeps the key, so the installer's pin still holds");
        // The new certificate is kept for the next start.
        assert_eq!(pem_sha256(&std::fs::read_to_string(server.dir.join("server/listener.crt")).unwrap()), hex::encode(sha2::Sha256::digest(&der)));
        // The connected agent moves to it (its connections on the old one
        // are closed after their request) and keeps heartbeating.
        let heartbeat_before = server.node(&node).await.unwrap()["last_heartbeat"].clone();
        wait_for(Duration::from_secs(15), "the agent to see the new certificate", || async {
            agent.log_text().lines().any(|l| l.contains("the control plane presents a new certificate") && l.contains(&next)).then_some(())
        })
        .await
        .unwrap_or_else(|e| panic!("{e}\nagent:\n{}\nserver:\n{}", agent.log_text(), server.process.log_text()));
        wait_for(Duration::from_secs(10), "a heartbeat after the renewal", || async {
            let view = server.node(&node).await.ok()?;
            (view["state"] == "ready" && view["last_heartbeat"] != heartbeat_before).then_some(())
        })
        .await
        .unwrap_or_else(|e| panic!("{e}\nagent:\n{}", agent.log_text()));
        serial = next;
    }
    assert!(agent.process.as_mut().unwrap().is_running(), "{}", agent.log_text());
    assert!(server.process.log_text().matches("renewed the agent listener's certificate").count() >= 2, "{}", server.process.log_text());
}
