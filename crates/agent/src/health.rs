//! The node's health as the control plane should see it: can this node
//! reach the cluster registry (checked from the agent's network, reported
//! unreachable only after two failed checks in a row), and is its engine
//! Docker Desktop (whose daemon cannot reach the mesh, so the node cannot
//! pull images).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use cloudweb_protocol::RegistryHealth;

use crate::client::ControlPlane;
use crate::runtime::DockerRuntime;

pub const DOCKER_DESKTOP: &str = "Docker Desktop is not supported on a node: the agent checks the registry from its own network, \
but images are pulled by the Docker daemon, which runs in another VM and cannot reach the mesh";

/// Checks in a row that must fail before the registry counts as unreachable.
const FAILURES_BEFORE_UNREACHABLE: u32 = 2;

#[derive(Default)]
pub struct Latest {
    pub registry: Mutex<Option<RegistryHealth>>,
}

/// One check of the registry at `address`: any HTTP answer from `/v2/`
/// (401 included) means reachable. It goes with this node's registry
/// credentials when it has them: an anonymous `/v2/` makes the registry
/// log an authorization error on every check, which would bury the real
/// ones.
async fn probe(address: &str, ca_pem: Option<&str>, credentials: Option<(&str, &str)>) -> Result<(), String> {
    let mut builder = reqwest::Client::builder().timeout(Duration::from_secs(5)).connect_timeout(Duration::from_secs(3));
    if let Some(ca) = ca_pem {
        let certificate = reqwest::Certificate::from_pem(ca.as_bytes()).map_err(|e| format!("registry CA: {e}"))?;
        builder = builder.add_root_certificate(certificate);
    }
    let http = builder.build().map_err(|e| e.to_string())?;
    let mut request = http.get(format!("https://{address}/v2/"));
    if let Some((username, password)) = credentials {
        request = request.basic_auth(username, Some(password));
    }
    match request.send().await {
        Ok(_) => Ok(()),
        Err(err) => {
            let mut text = err.to_string();
            let mut source = std::error::Error::source(&err);
            while let Some(inner) = source {
                text = format!("{text}: {inner}");
                source = inner.source();
            }
            Err(text)
        }
    }
}

/// Checks every `interval` until the task is aborted. `override_address`
/// replaces the registry address the control plane gives (for nodes that
/// reach it by another route).
pub async fn checker(client: Arc<ControlPlane>, runtime: DockerRuntime, interval: Duration, override_address: Option<String>, latest: Arc<Latest>) {
    let mut failures = 0;
    loop {
        let health = match runtime.is_docker_desktop().await {
            Ok(true) => RegistryHealth { configured: true, reachable: false, error: Some(DOCKER_DESKTOP.to_string()) },
            _ => match client.registry().await {
                Ok(config) if config.configured => {
                    let address = override_address.clone().or(config.address).unwrap_or_default();
                    let credentials = config.username.as_deref().zip(config.password.as_deref());
                    match probe(&address, config.ca.as_deref(), credentials).await {
                        Ok(()) => {
                            failures = 0;
                            RegistryHealth { configured: true, reachable: true, error: None }
                        }
                        Err(error) => {
                            failures += 1;
                            let mut error = error;
                            cloudweb_protocol::misc::truncate_on_char(&mut error, 500);
                            RegistryHealth { configured: true, reachable: failures < FAILURES_BEFORE_UNREACHABLE, error: Some(error) }
                        }
                    }
                }
                Ok(_) => RegistryHealth { configured: false, reachable: false, error: None },
                // Without an answer from the control plane there is nothing
                // new to say; keep the last result.
                Err(_) => {
                    tokio::time::sleep(interval).await;
                    continue;
                }
            },
        };
        *latest.registry.lock().expect("health lock") = Some(health);
        tokio::time::sleep(interval).await;
    }
}
