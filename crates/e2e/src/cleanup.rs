//! What a test cluster leaves in the host's Docker, removed when the
//! cluster goes (issue 31 item 1): the images its agents built (labelled
//! `cloudweb.built-by=<node id>`) or that carry its registry's address, and
//! the registry's CA directory under `/etc/docker/certs.d` (the agents
//! write it there because that is the only place the Docker Engine reads
//! registry CAs from, so a per-test `--docker-certs-dir` cannot work with
//! the host's Engine).
//!
//! A cluster is known by its control plane's data dir. The control plane
//! ([`crate::ServerProcess`], also each restart of it) and every agent
//! joined through it ([`crate::AgentNode`]) hold a [`ClusterRef`]; when
//! the last one is dropped (an agent's containers are removed before its
//! reference goes), the leftovers are removed.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

/// Where the Docker Engine reads registry CAs from.
pub const DOCKER_CERTS_DIR: &str = "/etc/docker/certs.d";

#[derive(Default)]
struct Cluster {
    references: usize,
    /// `host:port` agents push to, when the control plane runs a registry.
    registry: Option<String>,
    nodes: Vec<String>,
}

static CLUSTERS: Mutex<Option<HashMap<PathBuf, Cluster>>> = Mutex::new(None);

fn with_clusters<T>(f: impl FnOnce(&mut HashMap<PathBuf, Cluster>) -> T) -> T {
    let mut guard = CLUSTERS.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    f(guard.get_or_insert_with(HashMap::new))
}

/// One holder of a cluster; see the module documentation.
#[derive(Debug)]
pub struct ClusterRef {
    key: PathBuf,
}

impl ClusterRef {
    /// A reference to the cluster whose control plane keeps its data in
    /// `server_data_dir`, started with `flags` (its registry's address is
    /// taken from `--registry-advertise`, else `--registry-listen`).
    pub fn of_server(server_data_dir: &Path, flags: &[String]) -> ClusterRef {
        let flag = |name: &str| flags.iter().position(|f| f == name).and_then(|i| flags.get(i + 1)).cloned();
        let registry = flag("--registry-advertise").or_else(|| flag("--registry-listen"));
        let key = server_data_dir.to_path_buf();
        with_clusters(|clusters| {
            let cluster = clusters.entry(key.clone()).or_default();
            cluster.references += 1;
            if registry.is_some() {
                cluster.registry = registry;
            }
        });
        ClusterRef { key }
    }

    /// Another reference, for an agent with node id `node_id` joined to
    /// this cluster.
    pub fn for_node(&self, node_id: &str) -> ClusterRef {
        with_clusters(|clusters| {
            let cluster = clusters.entry(self.key.clone()).or_default();
            cluster.references += 1;
            if !cluster.nodes.iter().any(|n| n == node_id) {
                cluster.nodes.push(node_id.to_string());
            }
        });
        ClusterRef { key: self.key.clone() }
    }
}

impl Drop for ClusterRef {
    fn drop(&mut self) {
        let gone = with_clusters(|clusters| {
            let cluster = clusters.get_mut(&self.key)?;
            cluster.references = cluster.references.saturating_sub(1);
            if cluster.references == 0 {
                clusters.remove(&self.key)
            } else {
                None
            }
        });
        if let Some(cluster) = gone {
            for problem in remove_leftovers(cluster.registry.as_deref(), &cluster.nodes) {
                eprintln!("test cleanup: {problem}");
            }
        }
    }
}

/// Removes the images built by `nodes` or named after `registry`, and
/// `registry`'s certs.d directory. Returns what could not be removed.
pub fn remove_leftovers(registry: Option<&str>, nodes: &[String]) -> Vec<String> {
    let mut problems = Vec::new();
    let mut references = Vec::new();
    for node in nodes {
        let filter = format!("label=cloudweb.built-by={node}");
        match docker(&["images", "--no-trunc", "--format", "{{.ID}} {{.Repository}}:{{.Tag}}", "--filter", &filter]) {
            Ok(lines) => references.extend(lines.iter().map(|line| reference(line))),
            Err(err) => problems.push(err),
        }
    }
    if let Some(registry) = registry {
        let prefix = format!("{registry}/");
        match docker(&["images", "--no-trunc", "--format", "{{.ID}} {{.Repository}}:{{.Tag}}"]) {
            Ok(lines) => references.extend(lines.iter().map(|line| reference(line)).filter(|r| r.starts_with(&prefix))),
            Err(err) => problems.push(err),
        }
        let certs = Path::new(DOCKER_CERTS_DIR).join(registry);
        if certs.exists() {
            if let Err(err) = std::fs::remove_dir_all(&certs) {
                problems.push(format!("removing {}: {err}", certs.display()));
            }
        }
    }
    references.sort();
    references.dedup();
    if !references.is_empty() {
        let mut args = vec!["rmi", "--force"];
        args.extend(references.iter().map(String::as_str));
        if let Err(err) = docker(&args) {
            problems.push(err);
        }
    }
    problems
}

/// `repository:tag` of a listed image, or its id when it has no name.
fn reference(line: &str) -> String {
    let (id, name) = line.split_once(' ').unwrap_or((line, ""));
    if name.is_empty() || name.starts_with("<none>") {
        id.to_string()
    } else {
        name.to_string()
    }
}

/// `docker` with `args`; its stdout lines, or what went wrong.
fn docker(args: &[&str]) -> Result<Vec<String>, String> {
    let output = Command::new("docker").args(args).output().map_err(|e| format!("docker {args:?}: {e}"))?;
    if !output.status.success() {
        return Err(format!("docker {args:?} failed ({}): {}", output.status, String::from_utf8_lossy(&output.stderr).trim()));
    }
    Ok(String::from_utf8_lossy(&output.stdout).lines().map(str::trim).filter(|l| !l.is_empty()).map(str::to_string).collect())
}
