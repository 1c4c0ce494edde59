//! The control plane's domain, without HTTP: the shared state every loop
//! and handler gets ([`AppState`]), the deployment state machine and the
//! scheduler (`deploy`, `deployment_state`), the ingress route table
//! (`routes`), the live node registry (`live`), runtime logs, the cluster
//! CA and the listener's certificate, sealed secrets, the image registry
//! and its credentials, ACME certificates, accounts (`auth`: users,
//! sessions, tokens, login limits), the glue to git providers (`git`), and
//! the loops that keep it all true (the deploy reconciler, the heartbeat
//! writer, the ACME manager, the git status poster).
//!
//! What it must never do: route HTTP requests or parse request bodies
//! (that is `cloudweb-http`), render pages (`cloudweb-web`), hold SQL
//! (`cloudweb-store`, re-exported here as `store`) or speak a git host's
//! API (`cloudweb-git`). Its one HTTP-shaped piece is [`error::ApiError`],
//! the failure kinds every layer above answers with, which carries its own
//! status and JSON body so that each route answers a failure the same way.

pub mod access;
pub mod acme;
pub mod audit_policy;
pub mod auth;
pub mod backups;
pub mod ca;
pub mod clock;
pub mod config;
pub mod autoscale;
pub mod cron;
pub mod deploy;
pub mod deployment_state;
pub mod error;
pub mod event_relay;
pub mod flash;
pub mod forward;
pub mod follower;
pub mod git;
pub mod previews;
pub mod heartbeats;
pub mod hub;
pub mod leader;
pub mod listener_cert;
pub mod live;
pub mod mesh_endpoint;
pub mod mesh_peers;
pub mod registry;
pub mod registry_credentials;
pub mod registry_storage;
pub mod s3;
pub mod alerts;
pub mod log_archive;
pub mod log_rate;
pub mod roles;
pub mod routes;
pub mod runtime_log_relay;
pub mod runtime_logs;
pub mod secrets;
pub mod service_links;
pub mod service_ops;
pub mod services;
pub mod sessions;
pub mod shared_secrets;
pub mod signing;
pub mod tasks;
pub mod volume_moves;
pub mod volumes;

pub use cloudweb_store as store;

use std::collections::HashSet;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, RwLock};

use cloudweb_protocol::{events, RegistryConfig, RouteTable};

use crate::ca::ClusterCa;
use crate::clock::Clock;
use crate::config::Config;
use crate::error::ApiError;
use crate::hub::Hub;
use crate::live::NodeRegistry;
use crate::store::Store;

/// File holding the initial admin API token.
pub const ADMIN_TOKEN_FILE: &str = "admin-token";

/// Everything request handlers share.
pub struct AppState {
    pub config: Config,
    pub store: Store,
    pub ca: ClusterCa,
    pub clock: Arc<dyn Clock>,
    pub nodes: NodeRegistry,
    pub hub: Hub,
    /// "New log lines" per deployment, for log streams.
    pub log_hub: Hub,
    /// Recent stdout/stderr lines of every app's instances.
    pub runtime_logs: runtime_logs::RuntimeLogs,
    /// SHA-256 digests of valid admin API tokens.
    pub admin_tokens: RwLock<HashSet<String>>,
    pub routes: RwLock<RouteTable>,
    /// The per-app view the table is kept from (see `routes`).
    pub route_index: routes::Index,
    /// Apps that could not be moved off a node, and why, per node id.
    pub waiting: std::sync::Mutex<std::collections::HashMap<String, Vec<(String, String)>>>,
    /// The last heartbeat body of each node, as sent.
    pub last_bodies: std::sync::Mutex<std::collections::HashMap<String, String>>,
    pub registry: RwLock<RegistryConfig>,
    /// Each node's registry credential, when the registry runs.
    pub registry_credentials: Option<Arc<registry_credentials::Credentials>>,
    pub heartbeats_total: AtomicU64,
    /// Whether this replica leads (see [`leader`]).
    pub leader: leader::Leadership,
    pub sealer: secrets::Sealer,
    pub agent_binary: Option<AgentBinary>,
    /// curl `--pinnedpubkey` value of the agent listener's key.
    pub listener_pin: String,
    /// ACME certificates and pending challenges.
    pub acme: acme::Acme,
    /// GitLab login, push-to-deploy and commit statuses.
    pub git: git::GitState,
    /// Login limits and password hashing slots.
    pub auth: auth::AuthState,
    /// The exec and port-forward sessions this replica holds.
    pub sessions: sessions::Sessions,
    /// Memberships and apps' teams, for two seconds (see `access::cache`).
    pub access_cache: access::cache::Cache,
}

/// The agent binary the control plane offers: the file as it was at start,
/// held open (never in memory: it is tens of MB, and a download used to
/// copy all of it), so replacing the file on disk (an upgrade writes a new
/// one and renames it over) cannot change what is served under the
/// SHA-256 the node script checks.
pub struct AgentBinary {
    file: std::fs::File,
    pub len: u64,
    pub sha256: String,
}

impl AgentBinary {
    /// Opens `path` and hashes it, reading it once in chunks.
    pub fn open(path: &std::path::Path) -> std::io::Result<AgentBinary> {
        use sha2::Digest;
        use std::io::Read;
        let mut file = std::fs::File::open(path)?;
        let mut hasher = sha2::Sha256::new();
        let mut buffer = vec![0u8; 64 * 1024];
        let mut len = 0u64;
        loop {
            let read = file.read(&mut buffer)?;
            if read == 0 {
                break;
            }
            hasher.update(&buffer[..read]);
            len += read as u64;
        }
        Ok(AgentBinary { file, len, sha256: hex::encode(hasher.finalize()) })
    }

    /// A reader of the whole binary from its start, of its own (a new open
    /// file description of the same inode, so downloads do not share an
    /// offset).
    pub fn reader(&self) -> std::io::Result<std::fs::File> {
        use std::os::fd::AsRawFd;
        std::fs::File::open(format!("/proc/self/fd/{}", self.file.as_raw_fd()))
    }
}

/// Removes a node everywhere: its row and queued commands, its entry in the
/// live registry (so its certificate stops working at once) and its stream.
pub async fn remove_node(state: &AppState, node_id: &str) -> Result<(), ApiError> {
    state.store.delete_node(node_id).await?;
    state.nodes.remove(node_id);
    state.hub.remove(node_id);
    state.hub.notify_all(events::PEERS);
    state
        .last_bodies
        .lock()
        .expect("last bodies lock")
        .remove(node_id);
    if let Some(credentials) = &state.registry_credentials {
        // The node is gone either way; a credential that could not be
        // deleted now is dropped at the next start.
        if let Err(err) = credentials.revoke(node_id).await {
            tracing::error!(node_id, error = %err, "could not revoke the node's registry credential");
        }
    }
    routes::recompute(state).await?;
    Ok(())
}

/// Queues a command for a node and tells its stream. The payload is sealed
/// at rest: deploy payloads carry the app's environment and git
/// credentials.
pub async fn queue_command(
    state: &AppState,
    node_id: &str,
    kind: cloudweb_protocol::CommandKind,
    payload: &serde_json::Value,
) -> Result<store::CommandRow, ApiError> {
    let sealed = state.sealer.seal_json(&command_context(node_id), payload);
    let command = store::NewCommand {
        node_id: node_id.to_string(),
        kind: kind.as_str().to_string(),
        payload: sealed,
    };
    let row = state
        .store
        .enqueue_command(&command, state.clock.now_ms())
        .await?;
    state.hub.notify(node_id, events::COMMANDS);
    Ok(row)
}

/// The sealing context of a node's command payloads.
pub fn command_context(node_id: &str) -> String {
    format!("command:{node_id}")
}

/// The node's address on the WireGuard mesh (10.77.0.0/16).
pub fn mesh_address(index: i64) -> String {
    let index = index.clamp(1, 65534);
    format!("10.77.{}.{}", index >> 8, index & 0xff)
}

#[cfg(test)]
mod agent_binary_tests {
    use std::io::Read;

    #[test]
    fn the_binary_served_is_the_one_hashed_at_start_even_after_an_upgrade_replaced_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cloudweb-agent");
        let original: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(&path, &original).unwrap();
        let binary = super::AgentBinary::open(&path).unwrap();
        assert_eq!(binary.len, original.len() as u64);
        use sha2::Digest;
        assert_eq!(binary.sha256, hex::encode(sha2::Sha256::digest(&original)));
        // An upgrade writes a new file and renames it over the old one.
        std::fs::write(dir.path().join("new"), b"a newer agent").unwrap();
        std::fs::rename(dir.path().join("new"), &path).unwrap();
        // Two downloads at once: each reads the whole original.
        let (mut a, mut b) = (binary.reader().unwrap(), binary.reader().unwrap());
        let mut first = vec![0u8; 1000];
        a.read_exact(&mut first).unwrap();
        let mut all_b = Vec::new();
        b.read_to_end(&mut all_b).unwrap();
        let mut rest_a = Vec::new();
        a.read_to_end(&mut rest_a).unwrap();
        first.extend(rest_a);
        assert!(first == original && all_b == original);
    }
}
