//! Real ACME end to end: Debian's pebble issues certificates to the control
//! plane through HTTP-01 and TLS-ALPN-01 challenges answered by real Caddy
//! on two ingress nodes, and both nodes serve the one certificate per host.

use std::sync::Arc;
use std::time::{Duration, Instant};

use cloudweb_e2e::pebble::{Pebble, PebblePorts};
use cloudweb_e2e::{caddy_bin, free_port, start_platform, unique_name, wait_for, AgentNode, Platform, ServerProcess};
use reqwest::Method;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const HOST: &str = "shop.example.com";
/// Lifetime of pebble's certificates: renewal is due after two thirds.
const VALIDITY_S: u64 = 90;
const DOCKERFILE: &str = "FROM cloudweb-test/busybox:latest\nCOPY index.html /www/index.html\nCMD [\"httpd\", \"-f\", \"-p\", \"8080\", \"-h\", \"/www\"]\n";

/// The leaf certificate (DER) an ingress at `ip:port` presents for `HOST`,
/// verified against `root`; `None` while the handshake fails.
async fn served_leaf(ip: &str, port: u16, root: &rustls::RootCertStore) -> Option<Vec<u8>> {
    served_leaf_for(HOST, ip, port, root).await
}

async fn served_leaf_for(host: &str, ip: &str, port: u16, root: &rustls::RootCertStore) -> Option<Vec<u8>> {
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .ok()?
        .with_root_certificates(root.clone())
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let stream = tokio::time::timeout(Duration::from_secs(5), tokio::net::TcpStream::connect((ip, port))).await.ok()?.ok()?;
    let name = rustls::pki_types::ServerName::try_from(host.to_string()).ok()?;
    let mut tls = tokio::time::timeout(Duration::from_secs(5), connector.connect(name, stream)).await.ok()?.ok()?;
    let leaf = tls.get_ref().1.peer_certificates()?.first()?.to_vec();
    let _ = tls.shutdown().await;
    Some(leaf)
}

fn serial_and_issuer(der: &[u8]) -> (String, String) {
    let (_, cert) = x509_parser::parse_x509_certificate(der).unwrap();
    (cert.raw_serial_as_string(), cert.issuer().to_string())
}

/// The app's certificate status for `host`, as the user API gives it.
async fn certificate_of(server: &ServerProcess, app: &str, host: &str) -> Option<serde_json::Value> {
    let (status, body) = server.call(Method::GET, &format!("/api/apps/{app}/certificates"), None).await.ok()?;
    assert_eq!(status, 200, "{body}");
    body["certificates"].as_array()?.iter().find(|c| c["host"] == host).cloned()
}

fn not_after_ms(der: &[u8]) -> i64 {
    let (_, cert) = x509_parser::parse_x509_certificate(der).unwrap();
    cert.validity().not_after.timestamp() * 1000
}

fn logs(server: &ServerProcess, nodes: &[(AgentNode, &str)], pebble: &Pebble) -> String {
    let mut text = format!("server:\n{}\n", server.process.log_text());
    for (node, ip) in nodes {
        text.push_str(&format!("ingress {ip}:\n{}\n", node.log_text()));
    }
    text.push_str(&format!("pebble:\n{}", pebble.process.log_text()));
    text
}

/// GET over plain HTTP to `ip:port` with `Host: HOST`.
async fn plain_get(ip: &str, port: u16, path: &str) -> String {
    let mut stream = tokio::net::TcpStream::connect((ip, port)).await.unwrap();
    stream.write_all(format!("GET {path} HTTP/1.1\r\nhost: {HOST}\r\nconnection: close\r\n\r\n").as_bytes()).await.unwrap();
    let mut response = String::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), stream.read_to_string(&mut response)).await;
    response
}

#[tokio::test(flavor = "multi_thread")]
async fn one_pebble_certificate_per_host_served_and_renewed_by_two_ingress_nodes() {
    let (http_port, https_port) = (free_port(), free_port());
    let pebble_dir = tempfile::tempdir().unwrap();
    let pebble = Pebble::start(pebble_dir.path(), PebblePorts { http: http_port, tls: https_port }, VALIDITY_S).await.unwrap();
    // The CA reaches the name at ingress A first.
    pebble.point(HOST, "127.0.0.2").await.unwrap();
    let ca_root = pebble.ca_root.display().to_string();
    let Platform { tmp, git, server } = start_platform(&[
        "--base-domain", "test", "--heartbeat-flush-seconds", "1",
        "--acme-ca", &pebble.directory, "--acme-ca-root", &ca_root, "--acme-email", "ops@example.com",
    ])
    .await
    .unwrap();
    let (http, https, caddy) = (http_port.to_string(), https_port.to_string(), caddy_bin().display().to_string());
    let mut nodes = Vec::new();
    for (name, ip) in [("edge-a", "127.0.0.2"), ("edge-b", "127.0.0.3")] {
        let (token, ca) = server.join_token().await.unwrap();
        let mut agent = AgentNode::join(&server, &tmp.path().join(name), name, &token, &ca, &["--ingress"]).unwrap().unwrap();
        agent
            .start(&[
                "--heartbeat-interval-seconds", "1", "--publish-ip", "127.0.0.1", "--advertise-host", "127.0.0.1",
                "--caddy-bin", &caddy, "--http-port", &http, "--https-port", &https, "--ingress-ip", ip,
            ])
            .unwrap();
        nodes.push((agent, ip));
    }
    for (agent, _) in &nodes {
        let node_id = agent.node_id.clone();
        wait_for(Duration::from_secs(30), "the ingress to run", || async {
            let node = server.node(&node_id).await.ok()?;
            node["features"].as_array()?.contains(&json!("traffic-metrics")).then_some(())
        })
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", agent.log_text()));
    }

    // An app with a public-looking domain: the control plane orders its
    // certificate as soon as the host is in the route table.
    let app = unique_name("shop");
    git.commit(&app, &[("Dockerfile", DOCKERFILE), ("index.html", "hello from the shop\n")], "first").unwrap();
    let created = Instant::now();
    let (status, body) = server
        .call(Method::POST, "/api/apps", Some(json!({"name": app, "repo_url": git.url(&app), "port": 8080, "domains": [HOST], "health_timeout_seconds": 10})))
        .await
        .unwrap();
    assert_eq!(status, 201, "{body}");

    let mut roots = rustls::RootCertStore::empty();
    let root_pem = pebble.issuing_root().await.unwrap();
    for cert in <rustls::pki_types::CertificateDer as rustls::pki_types::pem::PemObject>::pem_slice_iter(root_pem.as_bytes()) {
        roots.add(cert.unwrap()).unwrap();
    }
    let first = wait_for(Duration::from_secs(90), "ingress A to serve a pebble certificate", || served_leaf("127.0.0.2", https_port, &roots))
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", logs(&server, &nodes, &pebble)));
    let time_to_first = created.elapsed();
    println!("figure: time to first certificate from pebble: {:.1} s", time_to_first.as_secs_f64());
    let on_b = wait_for(Duration::from_secs(30), "ingress B to serve the certificate", || served_leaf("127.0.0.3", https_port, &roots))
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", logs(&server, &nodes, &pebble)));
    assert_eq!(first, on_b, "both ingress nodes serve the same certificate");
    let (serial, issuer) = serial_and_issuer(&first);
    assert!(issuer.to_lowercase().contains("pebble"), "issued by pebble: {issuer}");
    // A few more seconds give a second order the time to show up.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let orders = pebble.orders();
    println!("figure: pebble orders for {HOST} with two ingress nodes: {orders}");
    assert_eq!(orders, 1, "one order for the host, whatever the number of ingress nodes\n{}", pebble.process.log_text());
    // Users see it: valid, until the leaf's not-after, from pebble, one order.
    let status = certificate_of(&server, &app, HOST).await.unwrap();
    assert_eq!(status["state"], "valid", "{status}");
    let api_not_after = cloudweb_server::clock::parse_rfc3339_ms(status["not_after"].as_str().unwrap()).unwrap();
    assert_eq!(api_not_after, not_after_ms(&first), "{status}");
    assert!(status["issuer"].as_str().unwrap().contains("Pebble"), "{status}");
    assert_eq!(status["orders"], 1, "{status}");
    assert!(status["last_error"].is_null(), "{status}");
    let internal = certificate_of(&server, &app, &format!("{app}.test")).await.unwrap();
    assert_eq!(internal["state"], "internal", "{internal}");
    assert_eq!(internal["orders"], 0, "{internal}");
    // The challenge route answers only tokens the control plane holds.
    let unknown = plain_get("127.0.0.3", http_port, "/.well-known/acme-challenge/unknown-token").await;
    assert!(unknown.starts_with("HTTP/1.1 404"), "{unknown}");

    // Ingress A goes away and the name now reaches B only: B keeps serving,
    // and the renewal's challenge is answered by B.
    let (mut a, _) = nodes.remove(0);
    let a_pid = a.process.as_ref().unwrap().pid();
    a.process.as_ref().unwrap().signal("TERM");
    assert!(a.process.as_mut().unwrap().wait_exit(Duration::from_secs(20)).await.is_some(), "agent A stops");
    wait_for(Duration::from_secs(10), "ingress A's Caddy to stop", || async { served_leaf("127.0.0.2", https_port, &roots).await.is_none().then_some(()) })
        .await
        .unwrap();
    pebble.point(HOST, "127.0.0.3").await.unwrap();
    assert_eq!(served_leaf("127.0.0.3", https_port, &roots).await.as_deref(), Some(&first[..]), "B serves with A gone (agent {a_pid})");

    let renewed = wait_for(Duration::from_secs(VALIDITY_S + 30), "ingress B to serve a renewed certificate", || async {
        let leaf = served_leaf("127.0.0.3", https_port, &roots).await?;
        (serial_and_issuer(&leaf).0 != serial).then_some(leaf)
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", logs(&server, &nodes, &pebble)));
    assert_ne!(renewed, first);
    assert_eq!(pebble.orders(), 2, "the renewal is one more order\n{}", pebble.process.log_text());
    let status = wait_for(Duration::from_secs(10), "the API to show the renewed certificate", || async {
        let status = certificate_of(&server, &app, HOST).await?;
        (status["orders"] == 2 && status["state"] == "valid").then_some(status)
    })
    .await
    .unwrap();
    let api_not_after = cloudweb_server::clock::parse_rfc3339_ms(status["not_after"].as_str().unwrap()).unwrap();
    assert_eq!(api_not_after, not_after_ms(&renewed), "{status}");
    assert!(nodes[0].0.log_text().contains("answered an ACME HTTP-01 challenge"), "B answered the renewal's challenge");

    // The app, deployed, is served over HTTPS with pebble's chain.
    let (status, body) = server.call(Method::POST, &format!("/api/apps/{app}/deploy"), None).await.unwrap();
    assert_eq!(status, 201, "{body}");
    let id = body["id"].as_str().unwrap().to_string();
    let deployment = wait_for(Duration::from_secs(180), "the deployment to settle", || async {
        let (_, d) = server.call(Method::GET, &format!("/api/deployments/{id}"), None).await.ok()?;
        matches!(d["state"].as_str(), Some("running" | "failed")).then_some(d)
    })
    .await
    .unwrap();
    assert_eq!(deployment["state"], "running", "{deployment}");
    let client = reqwest::Client::builder()
        .tls_built_in_root_certs(false)
        .add_root_certificate(reqwest::Certificate::from_pem(root_pem.as_bytes()).unwrap())
        .resolve(HOST, format!("127.0.0.3:{https_port}").parse().unwrap())
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let page = wait_for(Duration::from_secs(30), "the app over HTTPS", || async {
        let response = client.get(format!("https://{HOST}:{https_port}/")).send().await.ok()?;
        (response.status() == 200).then_some(response.text().await.ok()?)
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", logs(&server, &nodes, &pebble)));
    assert_eq!(page, "hello from the shop\n");

    // A name the CA cannot validate (it resolves to 127.0.0.1, where no
    // ingress listens): the order fails, and users see why, at once.
    let broken_app = unique_name("nowhere");
    let broken_host = "nowhere.example.com";
    git.commit(&broken_app, &[("Dockerfile", DOCKERFILE), ("index.html", "unreachable\n")], "first").unwrap();
    let (status, body) = server
        .call(Method::POST, "/api/apps", Some(json!({"name": broken_app, "repo_url": git.url(&broken_app), "port": 8080, "domains": [broken_host]})))
        .await
        .unwrap();
    assert_eq!(status, 201, "{body}");
    let failed = wait_for(Duration::from_secs(60), "the failed order to show", || async {
        let status = certificate_of(&server, &broken_app, broken_host).await?;
        (status["state"] == "failed").then_some(status)
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", logs(&server, &nodes, &pebble)));
    let reason = failed["last_error"].as_str().unwrap();
    println!("figure: failed order reason: {reason}");
    assert!(reason.to_lowercase().contains("connection refused") && reason.contains(broken_host), "the CA's own reason: {failed}");
    assert!(!reason.contains("PRIVATE KEY") && !reason.contains('\n'), "{failed}");
    assert_eq!(failed["orders"], 1, "{failed}");
    assert!(failed["not_after"].is_null() && !failed["next_attempt_at"].is_null(), "{failed}");
    drop(a);
}

/// TLS-ALPN-01 only: pebble's HTTP-01 port is one nobody listens on, so
/// each order passes only if the ingress the name points at shows the
/// `acme-tls/1` certificate. Two hosts point at two different ingress
/// nodes, so each node answers one validation from the challenge files its
/// agent put in Caddy's storage; a third points nowhere, and its failed
/// order logs the CA's reason.
#[tokio::test(flavor = "multi_thread")]
async fn tls_alpn_01_answered_by_each_ingress_node() {
    const HOSTS: [(&str, &str); 2] = [("alpn-a.example.com", "127.0.0.2"), ("alpn-b.example.com", "127.0.0.3")];
    let (http_port, https_port, unused_port) = (free_port(), free_port(), free_port());
    let pebble_dir = tempfile::tempdir().unwrap();
    let pebble = Pebble::start(pebble_dir.path(), PebblePorts { http: unused_port, tls: https_port }, 3600).await.unwrap();
    for (host, ip) in HOSTS {
        pebble.point(host, ip).await.unwrap();
    }
    // A third name reaches no ingress at all: its order fails, and says why.
    const UNREACHABLE: &str = "alpn-z.example.com";
    pebble.point(UNREACHABLE, "127.0.0.4").await.unwrap();
    let ca_root = pebble.ca_root.display().to_string();
    let Platform { tmp, git, server } = start_platform(&[
        "--base-domain", "test", "--heartbeat-flush-seconds", "1",
        "--acme-ca", &pebble.directory, "--acme-ca-root", &ca_root, "--acme-challenge", "tls-alpn-01",
    ])
    .await
    .unwrap();
    let (http, https, caddy) = (http_port.to_string(), https_port.to_string(), caddy_bin().display().to_string());
    let mut nodes = Vec::new();
    for (name, ip) in [("alpn-a", "127.0.0.2"), ("alpn-b", "127.0.0.3")] {
        let (token, ca) = server.join_token().await.unwrap();
        let mut agent = AgentNode::join(&server, &tmp.path().join(name), name, &token, &ca, &["--ingress"]).unwrap().unwrap();
        agent
            .start(&[
                "--heartbeat-interval-seconds", "1", "--publish-ip", "127.0.0.1", "--advertise-host", "127.0.0.1",
                "--caddy-bin", &caddy, "--http-port", &http, "--https-port", &https, "--ingress-ip", ip,
            ])
            .unwrap();
        nodes.push((agent, ip));
    }
    for (agent, _) in &nodes {
        let node_id = agent.node_id.clone();
        wait_for(Duration::from_secs(30), "the ingress to run", || async {
            let node = server.node(&node_id).await.ok()?;
            node["features"].as_array()?.contains(&json!("traffic-metrics")).then_some(())
        })
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", agent.log_text()));
    }

    let app = unique_name("alpn");
    git.commit(&app, &[("Dockerfile", DOCKERFILE), ("index.html", "hello\n")], "first").unwrap();
    let created = Instant::now();
    let mut domains: Vec<&str> = HOSTS.iter().map(|(host, _)| *host).collect();
    domains.push(UNREACHABLE);
    let (status, body) = server
        .call(Method::POST, "/api/apps", Some(json!({"name": app, "repo_url": git.url(&app), "port": 8080, "domains": domains, "health_timeout_seconds": 10})))
        .await
        .unwrap();
    assert_eq!(status, 201, "{body}");

    let mut roots = rustls::RootCertStore::empty();
    let root_pem = pebble.issuing_root().await.unwrap();
    for cert in <rustls::pki_types::CertificateDer as rustls::pki_types::pem::PemObject>::pem_slice_iter(root_pem.as_bytes()) {
        roots.add(cert.unwrap()).unwrap();
    }
    for (index, (host, ip)) in HOSTS.into_iter().enumerate() {
        let leaf = wait_for(Duration::from_secs(90), "a pebble certificate through TLS-ALPN-01", || served_leaf_for(host, ip, https_port, &roots))
            .await
            .unwrap_or_else(|e| panic!("{host}: {e}\n{}", logs(&server, &nodes, &pebble)));
        println!("figure: {host}: certificate from pebble through TLS-ALPN-01 after {:.1} s", created.elapsed().as_secs_f64());
        let (_, issuer) = serial_and_issuer(&leaf);
        assert!(issuer.to_lowercase().contains("pebble"), "issued by pebble: {issuer}");
        // The other ingress node serves the same certificate.
        let other = if ip == "127.0.0.2" { "127.0.0.3" } else { "127.0.0.2" };
        let there = wait_for(Duration::from_secs(30), "the other ingress to serve it", || served_leaf_for(host, other, https_port, &roots))
            .await
            .unwrap_or_else(|e| panic!("{host}: {e}\n{}", logs(&server, &nodes, &pebble)));
        assert_eq!(leaf, there, "{host}: one certificate for the cluster");
        // A certificate is served as soon as Caddy's new configuration
        // starts, but the old one's listener closes only when the load
        // ends, resetting a connection the kernel queued on it meanwhile
        // (Caddy binds with SO_REUSEPORT). So the request below waits for
        // each node's load to have ended.
        let received = format!("ACME certificates received certificates={}", index + 1);
        for (agent, node_ip) in &nodes {
            wait_for(Duration::from_secs(30), "the ingress to finish loading the certificate", || async {
                let log = agent.log_text();
                let after = &log[log.rfind(&received)?..];
                after.contains("reloaded=true").then_some(())
            })
            .await
            .unwrap_or_else(|e| panic!("{host} on {node_ip}: {e}\n{}", logs(&server, &nodes, &pebble)));
        }
        // Over HTTPS with pebble's chain: no instance runs, so the
        // ingress's own "no healthy instance" comes back.
        let client = reqwest::Client::builder()
            .tls_built_in_root_certs(false)
            .add_root_certificate(reqwest::Certificate::from_pem(root_pem.as_bytes()).unwrap())
            .resolve(host, format!("{ip}:{https_port}").parse().unwrap())
            .timeout(Duration::from_secs(10))
            .build()
            .unwrap();
        let response = client.get(format!("https://{host}:{https_port}/")).send().await.unwrap_or_else(|e| panic!("{host} over HTTPS: {e:?}\n{}", logs(&server, &nodes, &pebble)));
        assert_eq!(response.status(), 503, "{host}");
        assert_eq!(response.text().await.unwrap(), "no healthy instance\n", "{host}");
    }
    // The unreachable name's order ends with the CA's reason in the log
    // (and is tried again after a minute, with backoff).
    let failure = wait_for(Duration::from_secs(60), "the unreachable name's order to fail", || async {
        let log = server.process.log_text();
        log.lines().find(|l| l.contains("could not obtain a certificate") && l.contains(UNREACHABLE)).map(str::to_string)
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", logs(&server, &nodes, &pebble)));
    assert!(failure.contains("tls-alpn-01") && failure.contains("127.0.0.4"), "the CA's reason: {failure}");
    // One order per host, all through TLS-ALPN-01 (HTTP-01 could not have
    // passed), and each node put the challenges in place.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(pebble.orders(), 3, "one order per host\n{}", pebble.process.log_text());
    let server_log = server.process.log_text();
    let answered: Vec<&str> = server_log.lines().filter(|l| l.contains("answering the ACME challenge")).collect();
    assert_eq!(answered.len(), 3, "{server_log}");
    assert!(answered.iter().all(|l| l.contains("tls-alpn-01")), "{answered:?}");
    for (agent, ip) in &nodes {
        assert!(agent.log_text().contains("TLS-ALPN-01 challenges in place"), "ingress {ip}:\n{}", agent.log_text());
        assert!(!agent.log_text().contains("answered an ACME HTTP-01 challenge"), "ingress {ip}");
    }
}
