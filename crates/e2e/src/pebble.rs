//! Debian's `pebble` (Let's Encrypt's RFC 8555 test CA) and
//! `pebble-challtestsrv` (its mock DNS), for tests of real ACME issuance.
//!
//! The CA validates HTTP-01 challenges on `http_port` of the address the
//! mock DNS gives for a host, so a test points a public-looking name at
//! one ingress node's loopback address (127.0.0.2, 127.0.0.3, …), and can
//! move it to another. Pebble's own listener gets a certificate from a
//! throw-away CA written to `ca_root` (what `--acme-ca-root` trusts).

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use serde_json::json;

use crate::{free_port, wait_for, Process};

pub struct Pebble {
    pub process: Process,
    pub dns: Process,
    /// The ACME directory URL.
    pub directory: String,
    /// PEM of the root pebble's listener chains to.
    pub ca_root: PathBuf,
    management: String,
    dns_management: String,
    http: reqwest::Client,
}

/// Where the CA checks challenges.
#[derive(Debug, Clone, Copy)]
pub struct PebblePorts {
    pub http: u16,
    pub tls: u16,
}

impl Pebble {
    /// Starts the mock DNS and pebble, issuing certificates valid for
    /// `validity` seconds, and waits until the directory answers.
    pub async fn start(dir: &Path, ports: PebblePorts, validity: u64) -> Result<Pebble> {
        std::fs::create_dir_all(dir)?;
        let (dns_port, dns_management_port, listen_port, management_port) = (free_udp_port(), free_port(), free_port(), free_port());
        // The listener's certificate, from a CA of its own.
        let ca_key = rcgen::KeyPair::generate()?;
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new())?;
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca_params.distinguished_name.push(rcgen::DnType::CommonName, "pebble listener test CA");
        let ca_cert = ca_params.self_signed(&ca_key)?;
        let issuer = rcgen::Issuer::new(ca_params, ca_key);
        let key = rcgen::KeyPair::generate()?;
        let params = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()])?;
        let cert = params.signed_by(&key, &issuer)?;
        let ca_root = dir.join("listener-ca.pem");
        std::fs::write(&ca_root, ca_cert.pem())?;
        std::fs::write(dir.join("listener.pem"), cert.pem())?;
        std::fs::write(dir.join("listener.key"), key.serialize_pem())?;
        let config = json!({"pebble": {
            "listenAddress": format!("127.0.0.1:{listen_port}"),
            "managementListenAddress": format!("127.0.0.1:{management_port}"),
            "certificate": dir.join("listener.pem"),
            "privateKey": dir.join("listener.key"),
            "httpPort": ports.http,
            "tlsPort": ports.tls,
            "ocspResponderURL": "",
            "externalAccountBindingRequired": false,
            "certificateValidityPeriod": validity,
        }});
        let config_path = dir.join("pebble-config.json");
        std::fs::write(&config_path, serde_json::to_vec_pretty(&config)?)?;
        // Only the DNS of the test server: challenges go to the ingress.
        let dns_args: Vec<String> = [
            "-dns01", &format!("127.0.0.1:{dns_port}"), "-management", &format!("127.0.0.1:{dns_management_port}"),
            "-http01", "", "-https01", "", "-tlsalpn01", "", "-defaultIPv4", "127.0.0.1", "-defaultIPv6", "",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let dns = Process::spawn(Path::new("/usr/bin/pebble-challtestsrv"), &dns_args, dir.join("challtestsrv.log"))?;
        // No random validation sleeps; no reuse of an earlier valid
        // authorization, so every order is validated again; no refused
        // nonces (5% by default): the control plane tries an order again
        // after three in a row (a unit test covers that), which would make
        // the tests' exact order counts depend on chance.
        let pebble_args: Vec<String> = [
            "PEBBLE_VA_NOSLEEP=1", "PEBBLE_AUTHZREUSE=0", "PEBBLE_WFE_NONCEREJECT=0", "/usr/bin/pebble", "-config", &config_path.display().to_string(),
            "-dnsserver", &format!("127.0.0.1:{dns_port}"),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let process = Process::spawn(Path::new("/usr/bin/env"), &pebble_args, dir.join("pebble.log"))?;
        let root = reqwest::Certificate::from_pem(ca_cert.pem().as_bytes())?;
        let http = reqwest::Client::builder().add_root_certificate(root).timeout(Duration::from_secs(10)).build()?;
        let pebble = Pebble {
            process,
            dns,
            directory: format!("https://127.0.0.1:{listen_port}/dir"),
            ca_root,
            management: format!("https://127.0.0.1:{management_port}"),
            dns_management: format!("http://127.0.0.1:{dns_management_port}"),
            http,
        };
        let ready = wait_for(Duration::from_secs(20), "pebble's directory", || async {
            pebble.http.get(&pebble.directory).send().await.ok().filter(|r| r.status().is_success())
        })
        .await;
        if let Err(err) = ready {
            bail!("{err}\npebble log:\n{}\nchalltestsrv log:\n{}", pebble.process.log_text(), pebble.dns.log_text());
        }
        wait_for(Duration::from_secs(20), "challtestsrv's management API", || async {
            pebble.http.post(format!("{}/clear-a", pebble.dns_management)).json(&json!({"host": "ready.invalid"})).send().await.ok()
        })
        .await?;
        Ok(pebble)
    }

    /// Makes `host` resolve, for the CA, to `address` only.
    pub async fn point(&self, host: &str, address: &str) -> Result<()> {
        let clear = self.http.post(format!("{}/clear-a", self.dns_management)).json(&json!({"host": host})).send().await?;
        if !clear.status().is_success() {
            bail!("clear-a answered {}", clear.status());
        }
        let add = self.http.post(format!("{}/add-a", self.dns_management)).json(&json!({"host": host, "addresses": [address]})).send().await?;
        if !add.status().is_success() {
            bail!("add-a answered {}", add.status());
        }
        Ok(())
    }

    /// PEM of the root that pebble's issued chains end at.
    pub async fn issuing_root(&self) -> Result<String> {
        let response = self.http.get(format!("{}/roots/0", self.management)).send().await.context("pebble /roots/0")?;
        if !response.status().is_success() {
            bail!("pebble /roots/0 answered {}", response.status());
        }
        Ok(response.text().await?)
    }

    /// Orders pebble has accepted so far (its log's "Added order" lines).
    pub fn orders(&self) -> usize {
        self.process.log_text().lines().filter(|l| l.contains("Added order")).count()
    }
}

fn free_udp_port() -> u16 {
    std::net::UdpSocket::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}
