//! `cloudweb-server node-status` and `app-status`: what a node or an app
//! is, as one line per field asked for.

use std::time::Duration;

use anyhow::bail;
use serde_json::Value;

use super::{line, unexpected, Api, ApiArgs};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum NodeField {
    /// `ready`, `draining`, `unreachable`, …
    State,
    /// `true` when the node serves public HTTP(S) traffic.
    Ingress,
    /// `true` when the node can take work: ready, with its capacity reported.
    Ready,
    /// Its address on the WireGuard mesh (`10.77.x.y`), as the control
    /// plane allocated it at the join.
    MeshAddress,
}

#[derive(clap::Parser)]
pub struct NodeStatusArgs {
    #[command(flatten)]
    api: ApiArgs,
    /// The node's id (`cloudweb-agent node-id`).
    node: String,
    /// Wait up to this many seconds for the node to be ready (0: ask once).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=3600))]
    wait_ready_seconds: u64,
    /// Field to print (repeatable; one line each, in the order given).
    #[arg(long = "print", value_enum, default_values_t = [NodeField::State])]
    print: Vec<NodeField>,
}

/// Whether a node's view says it can take work.
fn node_ready(view: &Value) -> bool {
    view["state"] == "ready" && !view["capacity"].is_null()
}

fn node_field(view: &Value, field: NodeField) -> String {
    match field {
        NodeField::State => line(&view["state"]),
        NodeField::Ingress => (view["ingress"] == true).to_string(),
        NodeField::Ready => node_ready(view).to_string(),
        NodeField::MeshAddress => line(&view["mesh_address"]),
    }
}

pub async fn node(args: NodeStatusArgs) -> anyhow::Result<()> {
    cloudweb_protocol::validate::token("node id", &args.node, 128).map_err(anyhow::Error::msg)?;
    let api = Api::open(&args.api)?;
    let path = format!("/api/nodes/{}", args.node);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(args.wait_ready_seconds);
    let view = loop {
        let (status, view) = api.call(hyper::Method::GET, &path, None).await?;
        // A node that just joined may not be listed for a moment.
        let waiting = args.wait_ready_seconds > 0 && tokio::time::Instant::now() < deadline;
        if status == hyper::StatusCode::OK && (args.wait_ready_seconds == 0 || node_ready(&view)) {
            break view;
        }
        if !waiting {
            if status != hyper::StatusCode::OK {
                return Err(unexpected(&format!("GET {path}"), status, &view));
            }
            bail!("node {} is not ready after {} s (state {}, capacity {})", args.node, args.wait_ready_seconds, line(&view["state"]), if view["capacity"].is_null() { "not reported" } else { "reported" });
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    for field in &args.print {
        println!("{}", node_field(&view, *field));
    }
    Ok(())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum AppField {
    /// `true` when the app exists.
    Exists,
    /// `true` when one of the app's deployments is running (`false` also
    /// when there is no such app).
    Running,
}

#[derive(clap::Parser)]
pub struct AppStatusArgs {
    #[command(flatten)]
    api: ApiArgs,
    /// The app's name.
    app: String,
    /// Field to print (repeatable; one line each, in the order given).
    #[arg(long = "print", value_enum, default_values_t = [AppField::Running])]
    print: Vec<AppField>,
}

pub async fn app(args: AppStatusArgs) -> anyhow::Result<()> {
    cloudweb_protocol::validate::node_name("app name", &args.app).map_err(anyhow::Error::msg)?;
    let api = Api::open(&args.api)?;
    let path = format!("/api/apps/{}/deployments", args.app);
    let (status, answer) = api.call(hyper::Method::GET, &path, None).await?;
    let exists = match status {
        hyper::StatusCode::OK => true,
        hyper::StatusCode::NOT_FOUND => false,
        _ => return Err(unexpected(&format!("GET {path}"), status, &answer)),
    };
    let running = exists && answer["deployments"].as_array().is_some_and(|list| list.iter().any(|d| d["state"] == "running"));
    for field in &args.print {
        println!("{}", match field { AppField::Exists => exists, AppField::Running => running });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_node_is_ready_once_it_reported_its_capacity() {
        let joined = json!({"state": "ready", "ingress": true, "capacity": null});
        assert!(!node_ready(&joined));
        assert_eq!(node_field(&joined, NodeField::Ready), "false");
        let reported = json!({"state": "ready", "ingress": false, "capacity": {"cpu_cores": 2}});
        assert!(node_ready(&reported));
        assert_eq!(node_field(&reported, NodeField::Ingress), "false");
        assert_eq!(node_field(&joined, NodeField::Ingress), "true");
        assert!(!node_ready(&json!({"state": "draining", "capacity": {"cpu_cores": 2}})));
        assert_eq!(node_field(&json!({"state": "unreachable"}), NodeField::State), "unreachable");
        assert_eq!(node_field(&json!({"mesh_address": "10.77.0.1"}), NodeField::MeshAddress), "10.77.0.1");
    }
}
