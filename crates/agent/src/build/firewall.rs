//! Keeps builds away from the node's own services and private networks.
//!
//! Build steps run on the `cloudweb-build` bridge (see
//! [`crate::runtime::BUILD_NETWORK`]); from there, without rules, a `RUN`
//! step could still open connections to the host itself (through the
//! bridge's gateway address, or any of the host's addresses) and, routed
//! by the host, to private networks: the node's LAN, the mesh, the cloud
//! metadata address. When `iptables` is installed, the agent adds (once,
//! idempotently) rules that drop:
//! - everything from the build bridge addressed to the host (`INPUT`);
//! - everything from the build bridge forwarded to private, link-local and
//!   shared address ranges (`DOCKER-USER`, else `FORWARD`).
//!
//! Builds keep the internet (package registries). Without `iptables` the
//! rules are missing and that is logged; docs/src/guide/builds.md ("What
//! builds can reach") lists the gap.

use std::process::Stdio;

use tokio::process::Command;

/// Ranges a build may not reach through the host.
const PRIVATE_RANGES: [&str; 6] = ["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "169.254.0.0/16", "100.64.0.0/10", "127.0.0.0/8"];

/// The rules for `bridge`, as `iptables` argument vectors without the
/// action (`-C` to check, `-I` to insert): (chain, match arguments).
pub fn rules(bridge: &str, forward_chain: &str) -> Vec<Vec<String>> {
    let mut rules = vec![vec!["INPUT".to_string(), "-i".into(), bridge.into(), "-j".into(), "DROP".into()]];
    for range in PRIVATE_RANGES {
        rules.push(vec![forward_chain.to_string(), "-i".into(), bridge.into(), "-d".into(), range.into(), "-j".into(), "DROP".into()]);
    }
    rules
}

async fn iptables(args: &[String]) -> std::io::Result<bool> {
    let status = Command::new("iptables")
        .arg("-w")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .status()
        .await?;
    Ok(status.success())
}

/// Adds the rules for `bridge` that are not there yet. Returns how many it
/// added, or why it could not.
pub async fn isolate(bridge: &str) -> Result<usize, String> {
    let forward_chain = match iptables(&["-n".into(), "-L".into(), "DOCKER-USER".into()]).await {
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Err("iptables is not installed".into()),
        Err(err) => return Err(format!("cannot run iptables: {err}")),
        Ok(true) => "DOCKER-USER",
        Ok(false) => "FORWARD",
    };
    let mut added = 0;
    for rule in rules(bridge, forward_chain) {
        let check: Vec<String> = std::iter::once("-C".to_string()).chain(rule.iter().cloned()).collect();
        if iptables(&check).await.map_err(|e| e.to_string())? {
            continue;
        }
        let insert: Vec<String> = std::iter::once("-I".to_string()).chain(rule.iter().cloned()).collect();
        if !iptables(&insert).await.map_err(|e| e.to_string())? {
            return Err(format!("iptables refused: {}", insert.join(" ")));
        }
        added += 1;
    }
    Ok(added)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_and_private_ranges_are_dropped_for_the_bridge_only() {
        let rules = rules("cw-build0", "DOCKER-USER");
        assert_eq!(rules[0], ["INPUT", "-i", "cw-build0", "-j", "DROP"]);
        for range in ["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "169.254.0.0/16"] {
            assert!(rules.iter().any(|r| r == &["DOCKER-USER", "-i", "cw-build0", "-d", range, "-j", "DROP"]), "{range}");
        }
        assert!(rules.iter().all(|r| r[1] == "-i" && r[2] == "cw-build0"), "every rule matches the build bridge only");
    }
}
