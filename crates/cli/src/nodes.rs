//! `cloudweb nodes`: list, drain, undrain and remove nodes, and make a
//! join token.

use clap::Subcommand;
use cloudweb_api_types::control_planes::ControlPlaneList;
use cloudweb_api_types::nodes::{JoinToken, NodeList, NodeView};
use serde_json::json;

use crate::client::{segment, Api};
use crate::render::{self, cell, clean, table};
use crate::Failure;

#[derive(Subcommand)]
pub enum NodesCommand {
    /// Every node with its state and health (the default).
    List,
    /// Make a single-use join token and print the command to run on the
    /// new node.
    Token,
    /// The control plane's replicas: which one leads and whether each is
    /// live (`cloudweb nodes` lists them too when there are several).
    #[command(name = "control-planes")]
    ControlPlanes,
    /// Stop placing instances on a node and move its instances away.
    Drain {
        node: String,
        /// Also move the volumes this node holds (their apps stay here
        /// otherwise): each is copied over the mesh and its app restarted
        /// on the target.
        #[arg(long)]
        move_volumes: bool,
        /// Where `--move-volumes` sends them (name or id); the ready node
        /// with the most free disk for each when absent.
        #[arg(long, requires = "move_volumes")]
        to: Option<String>,
    },
    /// Let a drained node take instances again.
    Undrain { node: String },
    /// Remove a node that runs nothing (`--force` for an unreachable node
    /// whose instances then fail and start elsewhere).
    Rm {
        node: String,
        #[arg(long)]
        force: bool,
    },
}

/// A node given by id or name.
async fn node_id(api: &Api, node: &str) -> Result<String, Failure> {
    let list: NodeList = api.get("/api/nodes").await?;
    if let Some(found) = list.nodes.iter().find(|n| n.id == node) {
        return Ok(found.id.clone());
    }
    let named: Vec<&NodeView> = list.nodes.iter().filter(|n| n.name == node).collect();
    match named.as_slice() {
        [one] => Ok(one.id.clone()),
        [] => Err(Failure::Action(format!("no node with the id or name {:?}", clean(node)))),
        _ => Err(Failure::Action(format!("several nodes are named {:?}; give the id", clean(node)))),
    }
}

fn node_rows(nodes: &[NodeView]) -> Vec<Vec<String>> {
    nodes
        .iter()
        .map(|n| {
            let sample = n.metrics.as_ref().and_then(|m| m.sample.node.as_ref());
            let health = match &n.health_reason {
                Some(reason) => format!("{} ({})", cell(&n.health), clean(reason)),
                None => cell(&n.health),
            };
            vec![
                cell(&n.name),
                cell(&n.id),
                cell(&n.state),
                health,
                cell(&n.mesh_address),
                match sample.and_then(|s| s.cpu_pct) {
                    Some(cpu) => format!("{cpu:.0}%"),
                    None => "-".into(),
                },
                render::bytes(sample.and_then(|s| s.mem_used)),
                cell(&n.version),
                cell(&n.last_heartbeat),
            ]
        })
        .collect()
}

fn control_plane_rows(list: &ControlPlaneList) -> Vec<Vec<String>> {
    list.replicas
        .iter()
        .map(|r| {
            let role = if r.leader { format!("leader (term {})", list.term.map_or("-".to_string(), |t| t.to_string())) } else { "follower".to_string() };
            let url = if r.this_replica { format!("{} (answered)", cell(&r.url)) } else { cell(&r.url) };
            vec![url, role, cell(&r.state), cell(&r.last_seen)]
        })
        .collect()
}

const CONTROL_PLANE_HEADER: [&str; 4] = ["CONTROL PLANE", "ROLE", "STATE", "LAST SEEN"];

const NODE_HEADER: [&str; 9] = ["NAME", "ID", "STATE", "HEALTH", "ADDRESS", "CPU", "MEMORY", "VERSION", "LAST HEARTBEAT"];

pub async fn run(api: &Api, command: NodesCommand, json: bool) -> Result<(), Failure> {
    match command {
        NodesCommand::List => {
            let list: NodeList = api.get("/api/nodes").await?;
            if json {
                render::json(&list.nodes);
            } else {
                table(&NODE_HEADER, &node_rows(&list.nodes));
                // Replicas only when there are several; a server without
                // the endpoint (an older one) has none to show.
                if let Ok(planes) = api.get::<ControlPlaneList>("/api/control-planes").await {
                    if planes.replicas.len() > 1 {
                        println!();
                        table(&CONTROL_PLANE_HEADER, &control_plane_rows(&planes));
                    }
                }
            }
        }
        NodesCommand::ControlPlanes => {
            let planes: ControlPlaneList = api.get("/api/control-planes").await?;
            if json {
                render::json(&planes);
            } else {
                println!("database: {}, lease {} s", cell(&planes.database), planes.lease_seconds);
                table(&CONTROL_PLANE_HEADER, &control_plane_rows(&planes));
            }
        }
        NodesCommand::Token => {
            let token: JoinToken = api.post("/api/join-tokens").await?;
            if json {
                render::json(&token);
            } else {
                println!("Run this on the new node (the token works once, until {}):", cell(&token.expires_at));
                println!();
                println!("  {}", cell(&token.command));
            }
        }
        NodesCommand::Drain { node, move_volumes, to } => {
            let id = node_id(api, &node).await?;
            let view: NodeView = api.post(&format!("/api/nodes/{}/drain", segment(&id))).await?;
            let volumes: cloudweb_api_types::volumes::VolumeList = api.get("/api/volumes").await?;
            let held: Vec<_> = volumes.volumes.into_iter().filter(|v| v.node_id.as_deref() == Some(id.as_str()) && v.service.is_none()).collect();
            let mut moves = Vec::new();
            if move_volumes {
                for volume in &held {
                    let body = cloudweb_api_types::volumes::MoveVolume { to: to.clone() };
                    let started: cloudweb_api_types::volumes::VolumeMoveView =
                        api.call(reqwest::Method::POST, &format!("/api/volumes/{}/move", segment(&volume.name)), Some(&body)).await?;
                    moves.push(started);
                }
            }
            if json && move_volumes {
                render::json(&json!({"node": view, "moves": moves}));
            } else if json {
                render::json(&view);
            } else {
                println!("node {} ({id}) is draining: its instances move to other nodes", cell(&view.name));
                if !view.waiting.is_empty() {
                    println!("these apps have nowhere to go yet:");
                    for app in &view.waiting {
                        println!("  {}: {}", cell(&app.app), cell(&app.reason));
                    }
                }
                for started in &moves {
                    let to = started.to_node_name.clone().unwrap_or_else(|| started.to_node_id.clone());
                    println!("moving volume {} to {} ({}); follow it with `cloudweb volumes moves {}`", cell(&started.volume), cell(&to), cell(&started.id), cell(&started.volume));
                }
                if !move_volumes && !held.is_empty() {
                    let names: Vec<String> = held.iter().map(|v| cell(&v.name)).collect();
                    println!("it holds volumes {}: their apps stay on it until they move", names.join(", "));
                    println!("  cloudweb nodes drain {} --move-volumes [--to NODE]", cell(&node));
                }
            }
        }
        NodesCommand::Undrain { node } => {
            let id = node_id(api, &node).await?;
            let view: NodeView = api.post(&format!("/api/nodes/{}/undrain", segment(&id))).await?;
            if json {
                render::json(&view);
            } else {
                println!("node {} ({id}) takes new instances again", cell(&view.name));
            }
        }
        NodesCommand::Rm { node, force } => {
            let id = node_id(api, &node).await?;
            let query = if force { "?force=1" } else { "" };
            api.delete(&format!("/api/nodes/{}{query}", segment(&id))).await?;
            if json {
                render::json(&json!({"removed": id}));
            } else {
                println!("node {id} removed");
            }
        }
    }
    Ok(())
}
