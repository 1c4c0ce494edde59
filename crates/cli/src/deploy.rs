//! `cloudweb deploy`, `rollback` and `deployments`: start a deployment
//! (and follow it), and list an app's deployments.

use cloudweb_api_types::apps::{DeployRequest, DeploymentQueued, RollbackRequest};
use cloudweb_api_types::deployments::DeploymentList;
use reqwest::Method;

use crate::client::{segment, Api};
use crate::render::{self, cell, clean, table};
use crate::{follow, Failure};

/// Prints a new deployment, or follows it; the exit status follows it.
async fn started(api: &Api, deployment: DeploymentQueued, follow: bool, json: bool) -> Result<(), Failure> {
    let id = deployment.id.clone();
    if !follow {
        if json {
            render::json(&deployment);
        } else {
            println!("deployment {id} {}", cell(&deployment.state));
        }
        return Ok(());
    }
    if !json {
        println!("deployment {id} queued");
    }
    let (deployment, ok) = follow::deployment(api, &id, json).await?;
    if json {
        render::json(&deployment);
    }
    if ok {
        if !json {
            println!("deployment {id} is {}", cell(&deployment.state));
        }
        Ok(())
    } else {
        let error = deployment.error.as_deref().map(clean).unwrap_or_else(|| "no reason given".into());
        Err(Failure::Action(format!("deployment {id} is {}: {error}", cell(&deployment.state))))
    }
}

pub async fn deploy(api: &Api, app: &str, commit: Option<String>, keep_in_flight: bool, follow: bool, json: bool) -> Result<(), Failure> {
    let body = DeployRequest { commit, keep_in_flight };
    let deployment = api.call(Method::POST, &format!("/api/apps/{}/deploy", segment(app)), Some(&body)).await?;
    started(api, deployment, follow, json).await
}

pub async fn rollback(api: &Api, app: &str, to: Option<String>, follow: bool, json: bool) -> Result<(), Failure> {
    let target = match to {
        Some(id) => id,
        None => {
            let list: DeploymentList = api.get(&format!("/api/apps/{}/deployments", segment(app))).await?;
            let earlier = list.deployments.into_iter().find(|d| d.state == "superseded" && d.image.is_some()).map(|d| d.id);
            earlier.ok_or_else(|| Failure::Action(format!("{} has no earlier deployment that ran; give one with --to", clean(app))))?
        }
    };
    if !json {
        println!("rolling {} back to {}", clean(app), clean(&target));
    }
    let deployment = api
        .call(Method::POST, &format!("/api/apps/{}/rollback", segment(app)), Some(&RollbackRequest { deployment_id: target }))
        .await?;
    started(api, deployment, follow, json).await
}

pub async fn deployments(api: &Api, app: &str, json: bool) -> Result<(), Failure> {
    let list: DeploymentList = api.get(&format!("/api/apps/{}/deployments", segment(app))).await?;
    if json {
        render::json(&list.deployments);
        return Ok(());
    }
    let rows: Vec<Vec<String>> = list
        .deployments
        .iter()
        .map(|d| {
            let commit: String = d.commit.as_deref().map(|c| c.chars().take(12).collect()).unwrap_or_else(|| "-".to_string());
            let nodes: Vec<String> = d.instances.iter().map(|i| cell(&i.node_id)).collect();
            vec![
                cell(&d.id),
                cell(&d.state),
                cell(&d.kind),
                clean(&commit),
                cell(&d.created_at),
                if nodes.is_empty() { "-".into() } else { nodes.join(",") },
                cell(&d.error),
            ]
        })
        .collect();
    table(&["ID", "STATE", "KIND", "COMMIT", "CREATED", "NODES", "ERROR"], &rows);
    Ok(())
}

