//! A managed PostgreSQL on one node answers over the mesh on that node's
//! mesh address, from another node's namespace, and nowhere else: not on
//! the node's LAN address, not from the control plane's LAN. Each node has
//! its own Docker Engine in its own network namespace, so the published
//! port exists only where the agent put it.

use std::time::Duration;

use anyhow::{Context, Result};
use cloudweb_e2e::mesh_cluster::{MeshCluster, Setup};
use cloudweb_e2e::netns::Lan;
use cloudweb_e2e::{ensure_images, wait_for};

const IMAGE: &str = "cloudweb-test/postgres:15";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_answers_over_the_mesh_from_another_node_and_not_on_the_lan() {
    ensure_images().unwrap();
    cloudweb_e2e::services::ensure_service_images();
    let setup = Setup { docker: vec![2], server_args: vec!["--service-image".into(), format!("postgres={IMAGE}")], ..Setup::default() };
    let cluster = MeshCluster::start_with(2, setup).await.unwrap();
    if let Err(err) = scenario(&cluster).await {
        panic!("{err:#}\n{}", cluster.logs());
    }
}

async fn scenario(cluster: &MeshCluster) -> Result<()> {
    let (client, server) = (&cluster.agents[0], &cluster.agents[1]);
    cluster.dockers.iter().find(|(i, _)| *i == server.index).context("an engine")?.1.load_from_host(IMAGE)?;
    wait_for(Duration::from_secs(90), "node-2 to run services and the mesh", || async {
        let (_, view) = cluster.api("GET", &format!("/api/nodes/{}", server.node_id)).await.ok()?;
        let features = view["features"].as_array()?;
        (view["state"] == "ready" && features.iter().any(|f| f == "services") && !view["health_report"]["mesh"].is_null()).then_some(())
    })
    .await?;
    let body = serde_json::json!({"name": "db", "type": "postgres", "node": server.name});
    let (status, created) = cluster.api_json("POST", "/api/services", &body).await?;
    assert_eq!(status, 201, "{created}");
    let view = wait_for(Duration::from_secs(120), "the service to be healthy", || async {
        let (_, view) = cluster.api("GET", "/api/services/db").await.ok()?;
        (view["state"] == "healthy").then_some(view)
    })
    .await?;
    let address = view["address"].as_str().context("address")?.to_string();
    let (host, port) = address.rsplit_once(':').context("host:port")?;
    assert_eq!(host, cluster.mesh_address(server), "published on node-2's mesh address: {view}");
    let client_ns = &cluster.lan.members[client.ns];
    let over_mesh = client_ns.exec("pg_isready", &["-h", host, "-p", port, "-t", "5"])?;
    assert!(over_mesh.contains("accepting connections"), "{over_mesh}");
    let lan = Lan::address(server.index).to_string();
    for (ns, from) in [(client_ns, "node-1"), (&cluster.lan.members[0], "the control plane")] {
        let answer = ns.exec("pg_isready", &["-h", &lan, "-p", port, "-t", "3"]);
        assert!(answer.is_err(), "PostgreSQL answered on node-2's LAN address from {from}: {answer:?}");
    }
    let published = cluster.dockers.iter().find(|(i, _)| *i == server.index).context("engine")?.1.docker(&["ps", "--filter", "name=cw-svc.db", "--format", "{{.Ports}}"])?;
    assert!(!published.contains("0.0.0.0") && !published.contains(":::"), "{published}");
    Ok(())
}
