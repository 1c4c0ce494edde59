//! A managed PostgreSQL on one node answers over the mesh on that node's
//! mesh address, from another node's namespace, and nowhere else: not on
//! the node's LAN address, not from the control plane's LAN. Each node has
//! its own Docker Engine in its own network namespace, so the published
//! port exists only where the agent put it. Its backup (issue 23) is then
//! cloned into a new service on the other node, with identical rows.

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
    let setup = Setup { docker: vec![1, 2], server_args: vec!["--service-image".into(), format!("postgres={IMAGE}")], ..Setup::default() };
    let cluster = MeshCluster::start_with(2, setup).await.unwrap();
    if let Err(err) = scenario(&cluster).await {
        panic!("{err:#}\n{}", cluster.logs());
    }
}

async fn scenario(cluster: &MeshCluster) -> Result<()> {
    let (client, server) = (&cluster.agents[0], &cluster.agents[1]);
    for agent in [client, server] {
        cluster.dockers.iter().find(|(i, _)| *i == agent.index).context("an engine")?.1.load_from_host(IMAGE)?;
        wait_for(Duration::from_secs(90), &format!("{} to run services and backups and the mesh", agent.name), || async {
            let (_, view) = cluster.api("GET", &format!("/api/nodes/{}", agent.node_id)).await.ok()?;
            let features = view["features"].as_array()?;
            let has = |f: &str| features.iter().any(|x| x == f);
            (view["state"] == "ready" && has("services") && has("backups") && !view["health_report"]["mesh"].is_null()).then_some(())
        })
        .await?;
    }
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
    clone_to_the_other_node(cluster).await
}

const CHECKSUM: &str = "SELECT count(*) || ':' || md5(string_agg(id || ':' || body, ',' ORDER BY id)) FROM items";

fn psql(cluster: &MeshCluster, node: usize, service: &str, sql: &str) -> Result<String> {
    let engine = &cluster.dockers.iter().find(|(i, _)| *i == node).context("an engine")?.1;
    Ok(engine.docker(&["exec", &format!("cw-svc.{service}"), "psql", "-U", "app", "-d", "app", "-v", "ON_ERROR_STOP=1", "-tAc", sql])?.trim().to_string())
}

async fn job_done(cluster: &MeshCluster, id: &str) -> Result<serde_json::Value> {
    wait_for(Duration::from_secs(180), &format!("job {id} to end"), || async {
        let (_, job) = cluster.api("GET", &format!("/api/backups/{id}")).await.ok()?;
        (!matches!(job["state"].as_str(), Some("queued" | "running")) && job["kept_state"] != "settling").then_some(job)
    })
    .await
}

/// Node-2's service backed up to a path destination (the same path on
/// both nodes) and restored `--to` a new service on node-1.
async fn clone_to_the_other_node(cluster: &MeshCluster) -> Result<()> {
    let (client, server) = (&cluster.agents[0], &cluster.agents[1]);
    let rows = "CREATE TABLE items (id int PRIMARY KEY, body text); INSERT INTO items SELECT g, md5(g::text) FROM generate_series(1, 2000) g";
    wait_for(Duration::from_secs(60), "the database to take rows", || async { psql(cluster, server.index, "db", rows).ok() }).await?;
    let before = psql(cluster, server.index, "db", CHECKSUM)?;
    assert!(before.starts_with("2000:"), "{before}");
    let target = cluster.tmp.path().join("backups");
    std::fs::create_dir_all(&target)?;
    let body = serde_json::json!({"name": "local", "kind": "path", "path": target.to_string_lossy()});
    let (status, created) = cluster.api_json("POST", "/api/backup-destinations", &body).await?;
    assert_eq!(status, 201, "{created}");
    let (status, job) = cluster.api("POST", "/api/services/db/backups").await?;
    assert_eq!(status, 202, "{job}");
    let backup = job_done(cluster, job["id"].as_str().context("job id")?).await?;
    assert_eq!(backup["state"], "succeeded", "{backup}");
    let restore = serde_json::json!({"to": "db-copy", "node": client.name});
    let (status, job) = cluster.api_json("POST", &format!("/api/backups/{}/restore", backup["id"].as_str().context("id")?), &restore).await?;
    assert_eq!(status, 202, "{job}");
    let cloned = job_done(cluster, job["id"].as_str().context("job id")?).await?;
    assert_eq!(cloned["state"], "succeeded", "{cloned}");
    let (_, copy) = cluster.api("GET", "/api/services/db-copy").await?;
    assert_eq!(copy["node_id"], client.node_id.as_str(), "on node-1: {copy}");
    let after = wait_for(Duration::from_secs(60), "the clone to answer", || async { psql(cluster, client.index, "db-copy", CHECKSUM).ok() }).await?;
    assert_eq!(after, before, "the clone on node-1 holds node-2's rows");
    Ok(())
}
