//! Forwarding on the relay node: two nodes behind NAT reach each other
//! through it (their packets come in on the mesh interface and go out on
//! it again). Only the mesh interface forwards
//! (`/proc/sys/net/ipv4/conf/<interface>/forwarding`, not the global
//! switch), and one firewall rule accepts mesh-to-mesh forwarding where
//! Docker set the FORWARD policy to DROP: `-i IF -o IF -j ACCEPT`, first
//! in `DOCKER-USER` when that chain exists, otherwise in `FORWARD`;
//! checked with `-C` before it is inserted, so it is there once.

use std::process::Stdio;
use std::time::Duration;

use tokio::process::Command;

/// How long one `iptables` call may take (it waits for the xtables lock).
const IPTABLES_TIMEOUT: Duration = Duration::from_secs(10);

/// The chains the rule may be in, the preferred one first.
const CHAINS: [&str; 2] = ["DOCKER-USER", "FORWARD"];

/// Turns forwarding on the mesh interface on and makes sure the rule is
/// there. True when forwarding was off before (so [`disable`] turns it off
/// again); when it was on already (Docker's `ip_forward=1` turns it on for
/// every interface, and published instances need it) it is left on later.
/// Errors are text for a warning: the mesh goes on either way.
pub async fn enable(interface: &str) -> Result<bool, String> {
    let path = forwarding_path(interface)?;
    let before = std::fs::read_to_string(&path).map_err(|e| format!("reading {path}: {e}"))?;
    let turned_on = before.trim() == "0";
    if turned_on {
        std::fs::write(&path, "1\n").map_err(|e| format!("writing {path}: {e}"))?;
        tracing::info!(interface, "mesh relay: forwarding on the mesh interface");
    }
    ensure_rule(interface).await?;
    Ok(turned_on)
}

/// Removes the rule, and turns forwarding off when [`enable`] turned it on.
pub async fn disable(interface: &str, forwarding_off: bool) -> Result<(), String> {
    if forwarding_off {
        let path = forwarding_path(interface)?;
        // The interface may be gone with its setting: nothing to undo.
        if std::path::Path::new(&path).exists() {
            std::fs::write(&path, "0\n").map_err(|e| format!("writing {path}: {e}"))?;
        }
    }
    remove_rules(interface).await
}

fn forwarding_path(interface: &str) -> Result<String, String> {
    if !super::device::valid_interface_name(interface) {
        return Err(format!("bad interface name {interface:?}"));
    }
    Ok(format!("/proc/sys/net/ipv4/conf/{interface}/forwarding"))
}

fn rule<'a>(op: &'a str, chain: &'a str, interface: &'a str) -> Vec<&'a str> {
    vec!["-w", "5", op, chain, "-i", interface, "-o", interface, "-j", "ACCEPT"]
}

async fn ensure_rule(interface: &str) -> Result<(), String> {
    let chain = if iptables(&["-w", "5", "-S", CHAINS[0]]).await?.0 { CHAINS[0] } else { CHAINS[1] };
    if iptables(&rule("-C", chain, interface)).await?.0 {
        return Ok(());
    }
    match iptables(&rule("-I", chain, interface)).await? {
        (true, _) => {
            tracing::info!(interface, chain, "mesh relay: accepting forwarding between mesh peers");
            Ok(())
        }
        (false, output) => Err(format!("iptables -I {chain}: {output}")),
    }
}

/// Deletes the rule from both chains, as often as it is there (bounded).
pub async fn remove_rules(interface: &str) -> Result<(), String> {
    for chain in CHAINS {
        for _ in 0..8 {
            if !iptables(&rule("-C", chain, interface)).await?.0 {
                break;
            }
            if let (false, output) = iptables(&rule("-D", chain, interface)).await? {
                return Err(format!("iptables -D {chain}: {output}"));
            }
            tracing::info!(interface, chain, "mesh relay: removed the forwarding rule");
        }
    }
    Ok(())
}

/// Runs `iptables args`: whether it succeeded, and its output. Without
/// iptables on the host every call just fails (no rule to check or remove;
/// adding one says so).
async fn iptables(args: &[&str]) -> Result<(bool, String), String> {
    let run = Command::new("iptables").args(args).stdin(Stdio::null()).kill_on_drop(true).output();
    let output = match tokio::time::timeout(IPTABLES_TIMEOUT, run).await {
        Err(_) => return Err(format!("`iptables {}` did not finish within 10 s", args.join(" "))),
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::NotFound => return Ok((false, "iptables is not installed".into())),
        Ok(Err(e)) => return Err(format!("cannot run iptables: {e}")),
        Ok(Ok(output)) => output,
    };
    let text = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    Ok((output.status.success(), text.trim().to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rule_is_one_argument_vector() {
        assert_eq!(rule("-C", "DOCKER-USER", "cw0"), ["-w", "5", "-C", "DOCKER-USER", "-i", "cw0", "-o", "cw0", "-j", "ACCEPT"]);
        assert_eq!(forwarding_path("cw0").unwrap(), "/proc/sys/net/ipv4/conf/cw0/forwarding");
        assert!(forwarding_path("../all").is_err());
    }
}
