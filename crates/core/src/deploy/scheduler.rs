//! Placement. [`place`] is a pure function: given a snapshot of the nodes
//! and what an instance needs, it returns a node or an explanation that
//! names every node and why it was passed over. It does no I/O.
//!
//! Among the eligible nodes where the instance fits, it picks the one with
//! the fewest instances of the same deployment (spread: no two on one node
//! while another eligible node has room), then the one whose load after
//! placement is lowest, load being the larger of the CPU and memory
//! fractions reserved; ties go to the node with fewer instances, then to
//! the node id, so placement is deterministic. [`explain_choice`] says why
//! the chosen node won.

use std::fmt::Write;

#[derive(Debug, Clone, PartialEq)]
pub struct NodeSnapshot {
    pub id: String,
    pub name: String,
    /// `ready`, `unreachable` or `draining`.
    pub state: &'static str,
    /// `Some(reason)` when degraded.
    pub degraded: Option<String>,
    pub features: Vec<String>,
    /// Agent version, for messages about missing features.
    pub version: Option<String>,
    pub cpu_cores: f64,
    pub mem_bytes: u64,
    /// Reserved by instances already placed here.
    pub cpu_reserved: f64,
    pub mem_reserved: u64,
    pub instances: u32,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    pub cpu: f64,
    pub mem_bytes: u64,
    /// Features the node must report (e.g. `static-sites`).
    pub features: Vec<String>,
    /// Nodes that must not get it (e.g. the node being drained).
    pub avoid: Vec<String>,
    /// The only node that may get it: the one holding the app's volumes.
    pub pin: Option<Pin>,
    /// The nodes of the deployment's other instances, once per instance:
    /// a node with fewer of them wins over a less loaded one.
    pub spread: Vec<String>,
}

pub use crate::volumes::Pin;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Placement {
    Node(String),
    /// Nothing fits; the text says why, node by node.
    Nowhere(String),
}

pub fn place(nodes: &[NodeSnapshot], request: &Request) -> Placement {
    // The common case finds a node; the reasons are only worth building
    // (allocating) when none fits.
    let mut best: Option<(usize, f64, u32, &str)> = None;
    for node in nodes {
        let Some(load) = fit(node, request) else { continue };
        // Most requests have no siblings yet: skip the count then.
        let siblings = if request.spread.is_empty() { 0 } else { siblings_on(request, &node.id) };
        let better = match best {
            None => true,
            Some((best_siblings, best_load, best_instances, best_id)) => {
                siblings < best_siblings
                    || (siblings == best_siblings
                        && (load < best_load - 1e-12
                            || ((load - best_load).abs() <= 1e-12 && (node.instances, node.id.as_str()) < (best_instances, best_id))))
            }
        };
        if better {
            best = Some((siblings, load, node.instances, node.id.as_str()));
        }
    }
    match best {
        Some((_, _, _, id)) => Placement::Node(id.to_string()),
        None => Placement::Nowhere(explain(nodes, request)),
    }
}

fn siblings_on(request: &Request, node: &str) -> usize {
    request.spread.iter().filter(|n| *n == node).count()
}

/// Why `chosen` (a node [`place`] returned) won: its count of the
/// deployment's instances and its load after placement, beside the
/// runner-up's when there was one.
pub fn explain_choice(nodes: &[NodeSnapshot], request: &Request, chosen: &str) -> String {
    let describe = |node: &NodeSnapshot| {
        let load = fit(node, request).unwrap_or(0.0);
        format!("{} ({} of its instances there, {:.0}% reserved after)", node.name, siblings_on(request, &node.id), load * 100.0)
    };
    let Some(winner) = nodes.iter().find(|n| n.id == chosen) else { return format!("placed on {chosen}") };
    let others: Vec<String> = nodes.iter().filter(|n| n.id != chosen && fit(n, request).is_some()).map(describe).collect();
    let ineligible = nodes.iter().filter(|n| n.id != chosen && fit(n, request).is_none()).count();
    let mut text = format!("placed on {}", describe(winner));
    if !others.is_empty() {
        let _ = write!(text, " over {}", others.join(", "));
    }
    if ineligible > 0 {
        let _ = write!(text, "; {ineligible} other node(s) could not take it");
    }
    text
}

/// The node's load after placing the request there, or `None` when it is
/// not eligible or the request does not fit.
fn fit(node: &NodeSnapshot, request: &Request) -> Option<f64> {
    if node.state != "ready" || node.degraded.is_some() || request.avoid.contains(&node.id) {
        return None;
    }
    if request.pin.as_ref().is_some_and(|pin| pin.node != node.id) {
        return None;
    }
    if !request.features.iter().all(|f| node.features.contains(f)) {
        return None;
    }
    if node.cpu_cores <= 0.0 || node.mem_bytes == 0 {
        return None;
    }
    let cpu_after = node.cpu_reserved + request.cpu;
    let mem_after = node.mem_reserved.saturating_add(request.mem_bytes);
    if cpu_after > node.cpu_cores + 1e-9 || mem_after > node.mem_bytes {
        return None;
    }
    Some((cpu_after / node.cpu_cores).max(mem_after as f64 / node.mem_bytes as f64))
}

/// Why no node can take the request, node by node.
fn explain(nodes: &[NodeSnapshot], request: &Request) -> String {
    if let Some(pin) = &request.pin {
        // Only that node counts: starting the app anywhere else would
        // start it with an empty volume.
        return match nodes.iter().find(|n| n.id == pin.node) {
            None => format!("volume {} is on node {}, which is no longer registered; restore it from a backup on another node", pin.volume, pin.node),
            Some(node) if node.state != "ready" => {
                format!("waiting for node {} ({}), which holds volume {}: {}", node.name, node.id, pin.volume, node.state)
            }
            Some(node) => format!("waiting for node {} ({}), which holds volume {}: {}", node.name, node.id, pin.volume, reason(node, request)),
        };
    }
    if nodes.is_empty() {
        return "no node has joined the cluster".to_string();
    }
    let mut text = String::from("no node can take this instance: ");
    for (i, node) in nodes.iter().enumerate() {
        if i > 0 {
            text.push_str("; ");
        }
        let _ = write!(text, "{} ({}): {}", node.name, node.id, reason(node, request));
    }
    text
}

fn reason(node: &NodeSnapshot, request: &Request) -> String {
    if request.avoid.contains(&node.id) {
        return "excluded".into();
    }
    if node.state != "ready" {
        return node.state.to_string();
    }
    if let Some(reason) = &node.degraded {
        return format!("degraded: {reason}");
    }
    if let Some(missing) = request.features.iter().find(|f| !node.features.contains(f)) {
        let version = node.version.as_deref().unwrap_or("unknown");
        return format!("runs agent {version}, which does not report {missing}; upgrade it");
    }
    if node.cpu_cores <= 0.0 || node.mem_bytes == 0 {
        return "has not reported its capacity yet".into();
    }
    if node.cpu_reserved + request.cpu > node.cpu_cores + 1e-9 {
        return format!("not enough CPU ({:.2} of {:.2} cores reserved)", node.cpu_reserved, node.cpu_cores);
    }
    format!("not enough memory ({} of {} MiB reserved)", node.mem_reserved >> 20, node.mem_bytes >> 20)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(id: &str, cpu_reserved: f64, mem_reserved_gib: u64) -> NodeSnapshot {
        NodeSnapshot {
            id: id.into(),
            name: format!("name-{id}"),
            state: "ready",
            degraded: None,
            features: vec!["static-sites".into()],
            version: Some("0.1.0".into()),
            cpu_cores: 4.0,
            mem_bytes: 8 << 30,
            cpu_reserved,
            mem_reserved: mem_reserved_gib << 30,
            instances: 0,
        }
    }

    fn request() -> Request {
        Request { cpu: 0.5, mem_bytes: 512 << 20, features: vec![], avoid: vec![], pin: None, spread: vec![] }
    }

    fn check(nodes: &[NodeSnapshot], request: &Request, expected: Result<&str, &[&str]>) {
        match (place(nodes, request), expected) {
            (Placement::Node(id), Ok(want)) => assert_eq!(id, want),
            (Placement::Nowhere(text), Err(fragments)) => {
                for fragment in fragments {
                    assert!(text.contains(fragment), "{text:?} lacks {fragment:?}");
                }
            }
            (got, want) => panic!("got {got:?}, wanted {want:?}"),
        }
    }

    #[test]
    fn least_loaded_node_wins() {
        check(&[node("a", 2.0, 1), node("b", 0.5, 1), node("c", 1.0, 6)], &request(), Ok("b"));
    }

    #[test]
    fn instances_of_one_deployment_spread_before_load_counts() {
        // b is the least loaded, but already has one of the instances.
        let nodes = [node("a", 3.0, 1), node("b", 0.0, 0), node("c", 2.0, 1)];
        let spread = Request { spread: vec!["b".into()], ..request() };
        check(&nodes, &spread, Ok("c"));
        let why = explain_choice(&nodes, &spread, "c");
        assert!(why.starts_with("placed on name-c (0 of its instances there, 62% reserved after) over name-a (0 of"), "{why}");
        assert!(why.contains("name-b (1 of its instances there"), "{why}");
        // Every node has one: load decides again.
        let full = Request { spread: vec!["a".into(), "b".into(), "c".into()], ..request() };
        check(&nodes, &full, Ok("b"));
        // Only one node has room: it takes a second instance.
        let room = [node("a", 4.0, 1), node("b", 0.0, 0)];
        check(&room, &Request { spread: vec!["b".into()], ..request() }, Ok("b"));
    }

    #[test]
    fn ties_are_deterministic() {
        check(&[node("b", 0.0, 0), node("a", 0.0, 0)], &request(), Ok("a"));
    }

    #[test]
    fn ineligible_nodes_are_named_with_reasons() {
        let mut unreachable = node("u", 0.0, 0);
        unreachable.state = "unreachable";
        let mut draining = node("d", 0.0, 0);
        draining.state = "draining";
        let mut degraded = node("g", 0.0, 0);
        degraded.degraded = Some("i/o timeout".into());
        let full = node("f", 3.9, 0);
        check(
            &[unreachable, draining, degraded, full],
            &request(),
            Err(&["name-u (u): unreachable", "name-d (d): draining", "name-g (g): degraded: i/o timeout", "name-f (f): not enough CPU"]),
        );
    }

    #[test]
    fn features_are_required_and_named() {
        let mut old = node("o", 0.0, 0);
        old.features.clear();
        let mut wants = request();
        wants.features = vec!["static-sites".into()];
        check(&[old.clone()], &wants, Err(&["runs agent 0.1.0, which does not report static-sites; upgrade it"]));
        check(&[old, node("n", 3.0, 0)], &wants, Ok("n"));
        // Without a feature requirement the old node is fine.
        let mut old = node("o", 0.0, 0);
        old.features.clear();
        check(&[old], &request(), Ok("o"));
    }

    #[test]
    fn memory_and_avoid_lists() {
        check(&[node("a", 0.0, 8)], &request(), Err(&["not enough memory"]));
        let mut avoid = request();
        avoid.avoid = vec!["a".into()];
        check(&[node("a", 0.0, 0), node("b", 3.0, 7)], &avoid, Ok("b"));
        check(&[], &request(), Err(&["no node has joined"]));
    }

    #[test]
    fn a_pinned_request_goes_only_to_its_node_and_waits_for_it() {
        let mut pinned = request();
        pinned.pin = Some(Pin { node: "b".into(), volume: "uploads".into() });
        check(&[node("a", 0.0, 0), node("b", 3.0, 0)], &pinned, Ok("b"));
        let mut gone = node("b", 0.0, 0);
        gone.state = "unreachable";
        check(&[node("a", 0.0, 0), gone.clone()], &pinned, Err(&["waiting for node name-b (b), which holds volume uploads: unreachable"]));
        // Excluded because it is the node being left: still its state.
        pinned.avoid = vec!["b".into()];
        check(&[node("a", 0.0, 0), gone], &pinned, Err(&["which holds volume uploads: unreachable"]));
        pinned.avoid.clear();
        check(&[node("b", 0.0, 8)], &pinned, Err(&["holds volume uploads: not enough memory"]));
        check(&[node("a", 0.0, 0)], &pinned, Err(&["volume uploads is on node b, which is no longer registered"]));
    }
}
