//! Each node pulls and pushes with its own registry credential, and a
//! removed node's credential stops working while the others keep theirs.
//! The registry's certificate is renewed while the control plane runs
//! (`--registry-cert-seconds`) and the registry serves the new one.

use std::time::Duration;

use cloudweb_e2e::{start_platform, wait_for, AgentNode, Platform, ServerProcess};
use reqwest::Method;
use serde_json::Value;

const HEADERS: [(&str, &str); 2] = [("x-cloudweb-protocol", "1"), ("x-cloudweb-agent-version", "0.1.0")];

async fn join(server: &ServerProcess, dir: &std::path::Path, name: &str) -> AgentNode {
    let (token, ca) = server.join_token().await.unwrap();
    AgentNode::join(server, &dir.join(name), name, &token, &ca, &[]).unwrap().expect("join succeeds")
}

/// `GET /agent/v1/registry` as the node: status and settings.
async fn settings(server: &ServerProcess, node: &AgentNode) -> (u16, Value) {
    let (status, body) = node
        .raw_client()
        .send(Method::GET, &format!("{}/agent/v1/registry", server.url()), &HEADERS, None)
        .await
        .unwrap();
    (status, serde_json::from_str(&body).unwrap_or(Value::Null))
}

/// The registry's answer to `GET /v2/` with these credentials, or None
/// while it does not answer (restarting).
async fn registry_status(settings: &Value, username: &str, password: &str) -> Option<u16> {
    let ca = reqwest::Certificate::from_pem(settings["ca"].as_str().unwrap().as_bytes()).unwrap();
    let http = reqwest::Client::builder()
        .add_root_certificate(ca)
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let url = format!("https://{}/v2/", settings["address"].as_str().unwrap());
    let response = http.get(url).basic_auth(username, Some(password)).send().await.ok()?;
    Some(response.status().as_u16())
}

#[tokio::test]
async fn a_removed_node_loses_registry_access_and_others_keep_theirs() {
    let Platform { tmp, git: _git, server } = start_platform(&[]).await.unwrap();
    let a = join(&server, tmp.path(), "reg-a").await;
    let b = join(&server, tmp.path(), "reg-b").await;

    let (status, settings_a) = settings(&server, &a).await;
    assert_eq!(status, 200, "{settings_a}");
    let (status, settings_b) = settings(&server, &b).await;
    assert_eq!(status, 200, "{settings_b}");
    let (user_a, pass_a) = (settings_a["username"].as_str().unwrap().to_string(), settings_a["password"].as_str().unwrap().to_string());
    let (user_b, pass_b) = (settings_b["username"].as_str().unwrap().to_string(), settings_b["password"].as_str().unwrap().to_string());
    assert_eq!(user_a, a.node_id, "each node has its own user");
    assert_eq!(user_b, b.node_id);
    assert_ne!(pass_a, pass_b, "and its own password");
    assert_eq!(settings(&server, &a).await.1["password"], settings_a["password"], "the credential is stable");

    // Both work (once the registry restarted with both entries).
    for (user, pass) in [(&user_a, &pass_a), (&user_b, &pass_b)] {
        wait_for(Duration::from_secs(20), "the registry to accept a node's credential", || async {
            (registry_status(&settings_a, user, pass).await == Some(200)).then_some(())
        })
        .await
        .unwrap();
    }
    // Another node's password under this node's name is refused.
    assert_eq!(registry_status(&settings_a, &user_a, &pass_b).await, Some(401));

    let (status, body) = server.call(Method::DELETE, &format!("/api/nodes/{}", a.node_id), None).await.unwrap();
    assert_eq!(status, 204, "{body}");
    let refused = wait_for(Duration::from_secs(20), "the removed node's credential to be refused", || async {
        (registry_status(&settings_a, &user_a, &pass_a).await == Some(401)).then_some(())
    })
    .await;
    if let Err(err) = refused {
        panic!("{err}\nserver log:\n{}", server.process.log_text());
    }
    wait_for(Duration::from_secs(20), "the remaining node's credential to work", || async {
        (registry_status(&settings_b, &user_b, &pass_b).await == Some(200)).then_some(())
    })
    .await
    .unwrap();
    assert_eq!(settings(&server, &a).await.0, 403, "the removed node gets no settings either");

    // A restart keeps b's credential and does not bring a's back.
    let (agent_port, api_port) = (server.agent_port, server.api_port);
    let registry_flags: Vec<String> = server_flags(&server);
    let mut server = server;
    server.process.kill();
    let flags: Vec<&str> = registry_flags.iter().map(String::as_str).collect();
    let server = ServerProcess::start_on(tmp.path(), agent_port, api_port, &flags).await.unwrap();
    assert_eq!(settings(&server, &b).await.1["password"], settings_b["password"]);
    wait_for(Duration::from_secs(20), "b's credential after a restart", || async {
        (registry_status(&settings_b, &user_b, &pass_b).await == Some(200)).then_some(())
    })
    .await
    .unwrap();
    assert_eq!(registry_status(&settings_a, &user_a, &pass_a).await, Some(401));
}

/// Serial (hex) and SubjectPublicKeyInfo (DER) of the certificate the
/// registry presents now, verified against the cluster CA for its address,
/// or None while it does not answer (restarting).
async fn registry_leaf(settings: &Value) -> Option<(String, Vec<u8>)> {
    use rustls::pki_types::pem::PemObject;
    use x509_parser::prelude::{FromDer, X509Certificate};
    let mut roots = rustls::RootCertStore::empty();
    roots.add(rustls::pki_types::CertificateDer::from_pem_slice(settings["ca"].as_str().unwrap().as_bytes()).unwrap()).unwrap();
    let config = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config));
    let address = settings["address"].as_str().unwrap();
    let (host, _) = address.rsplit_once(':').unwrap();
    let tcp = tokio::net::TcpStream::connect(address).await.ok()?;
    let name = rustls::pki_types::ServerName::try_from(host.to_string()).unwrap();
    let tls = tokio::time::timeout(Duration::from_secs(5), connector.connect(name, tcp)).await.ok()?.ok()?;
    let der = tls.get_ref().1.peer_certificates().unwrap()[0].to_vec();
    let (_, cert) = X509Certificate::from_der(&der).unwrap();
    Some((hex::encode(cert.raw_serial()), cert.tbs_certificate.subject_pki.raw.to_vec()))
}

#[tokio::test]
async fn the_registry_certificate_is_renewed_while_the_server_runs() {
    // Renewed about every 8 s.
    let Platform { tmp, git: _git, server } = start_platform(&["--registry-cert-seconds", "12"]).await.unwrap();
    let node = join(&server, tmp.path(), "reg-renew").await;
    let (status, settings) = settings(&server, &node).await;
    assert_eq!(status, 200, "{settings}");
    let (user, pass) = (settings["username"].as_str().unwrap().to_string(), settings["password"].as_str().unwrap().to_string());
    wait_for(Duration::from_secs(20), "the registry to accept the node's credential", || async {
        (registry_status(&settings, &user, &pass).await == Some(200)).then_some(())
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\nserver:\n{}", server.process.log_text()));
    let (mut serial, spki) = registry_leaf(&settings).await.expect("the registry answers over TLS verified with the cluster CA");
    let started = std::time::Instant::now();
    // How long the registry is away at each restart: the longest stretch
    // without a TLS answer, looked at every 10 ms (a restart can be
    // quicker than that and go unseen).
    let longest_away = std::sync::Arc::new(std::sync::Mutex::new(Duration::ZERO));
    let watcher = {
        let (settings, longest_away) = (settings.clone(), longest_away.clone());
        tokio::spawn(async move {
            let mut away_since = None::<std::time::Instant>;
            loop {
                match (registry_leaf(&settings).await, away_since) {
                    (None, None) => away_since = Some(std::time::Instant::now()),
                    (Some(_), Some(_)) => away_since = None,
                    _ => {}
                }
                if let Some(since) = away_since {
                    let mut longest = longest_away.lock().unwrap();
                    *longest = (*longest).max(since.elapsed());
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
    };
    for renewal in 1..=2 {
        let previous = serial.clone();
        // Verified against the cluster CA for the registry's address.
        let (next, next_spki) = wait_for(Duration::from_secs(20), "the registry to serve a renewed certificate", || async {
            registry_leaf(&settings).await.filter(|(s, _)| *s != previous)
        })
        .await
        .unwrap_or_else(|e| panic!("{e}\nserver:\n{}", server.process.log_text()));
        println!("figure: registry renewal {renewal} after {:.1} s", started.elapsed().as_secs_f64());
        assert_eq!(next_spki, spki, "renewal keeps the registry's key");
        // The settings agents get are unchanged (same CA, same address),
        // and the node's credential still works over the new certificate.
        assert_eq!(self::settings(&server, &node).await.1, settings);
        let back = std::time::Instant::now();
        wait_for(Duration::from_secs(10), "the registry to answer the node after the renewal", || async {
            (registry_status(&settings, &user, &pass).await == Some(200)).then_some(())
        })
        .await
        .unwrap_or_else(|e| panic!("{e}\nserver:\n{}", server.process.log_text()));
        println!("figure: registry answered 200 {:.2} s after the new certificate was seen", back.elapsed().as_secs_f64());
        assert_eq!(registry_status(&settings, &user, "wrong").await, Some(401), "and still checks credentials");
        serial = next;
    }
    watcher.abort();
    let longest_away = *longest_away.lock().unwrap();
    println!("figure: the registry was seen away at most {:.3} s at a renewal (looked at every 10 ms)", longest_away.as_secs_f64());
    assert!(longest_away < Duration::from_secs(15), "the restart is bounded: away {longest_away:?}");
    let log = server.process.log_text();
    assert!(log.matches("renewed the image registry's certificate").count() >= 2, "{log}");
    assert!(!log.contains("cannot renew the image registry's certificate"), "{log}");
}

/// The registry flags the platform started the server with.
fn server_flags(server: &ServerProcess) -> Vec<String> {
    let address = std::fs::read_to_string(server.dir.join("server/registry/config.yml"))
        .unwrap()
        .lines()
        .find_map(|l| l.trim().strip_prefix("addr: ").map(|a| a.trim_matches('"').to_string()))
        .unwrap();
    vec!["--registry-bin".into(), "/usr/bin/docker-registry".into(), "--registry-listen".into(), address]
}
