//! `cloudweb-server deploy`: deploys an app's branch head (or a commit)
//! and, when asked, waits until the deployment runs or fails.

use std::time::Duration;

use anyhow::bail;
use serde_json::{json, Value};

use super::{line, unexpected, Api, ApiArgs};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Field {
    /// The deployment's id.
    Id,
    /// Its state when the command ended (`running` after a successful wait).
    State,
}

#[derive(clap::Parser)]
pub struct DeployArgs {
    #[command(flatten)]
    api: ApiArgs,
    /// The app's name.
    app: String,
    /// The commit to deploy (default: the branch head).
    #[arg(long)]
    commit: Option<String>,
    /// Wait up to this many seconds for the deployment to run; fail when it
    /// fails or is not running by then (0: do not wait).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=86_400))]
    wait_seconds: u64,
    /// Field to print (repeatable; one line each, in the order given).
    #[arg(long = "print", value_enum, default_values_t = [Field::Id])]
    print: Vec<Field>,
}

/// States a deployment does not leave.
fn settled(state: &str) -> bool {
    matches!(state, "running" | "failed" | "superseded" | "stopped")
}

pub async fn run(args: DeployArgs) -> anyhow::Result<()> {
    cloudweb_protocol::validate::node_name("app name", &args.app).map_err(anyhow::Error::msg)?;
    if let Some(commit) = &args.commit {
        cloudweb_protocol::validate::token("--commit", commit, 64).map_err(anyhow::Error::msg)?;
    }
    let api = Api::open(&args.api)?;
    let path = format!("/api/apps/{}/deploy", args.app);
    let body = match &args.commit {
        Some(commit) => json!({"commit": commit}),
        None => json!({}),
    };
    let (status, created) = api.call(hyper::Method::POST, &path, Some(&body)).await?;
    if status != hyper::StatusCode::CREATED {
        return Err(unexpected(&format!("POST {path}"), status, &created));
    }
    let Some(id) = created["id"].as_str().map(str::to_string) else { bail!("POST {path} answered without a deployment id") };
    let mut view: Value = created;
    if args.wait_seconds > 0 {
        let path = format!("/api/deployments/{id}");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(args.wait_seconds);
        loop {
            let (status, answer) = api.call(hyper::Method::GET, &path, None).await?;
            if status != hyper::StatusCode::OK {
                return Err(unexpected(&format!("GET {path}"), status, &answer));
            }
            view = answer;
            let state = view["state"].as_str().unwrap_or_default();
            if state == "running" {
                break;
            }
            if settled(state) {
                bail!("deployment {id} is {state}: {}", line(&view["error"]));
            }
            if tokio::time::Instant::now() >= deadline {
                bail!("deployment {id} is not running after {} s (state {state})", args.wait_seconds);
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }
    for field in &args.print {
        println!("{}", match field { Field::Id => id.clone(), Field::State => line(&view["state"]) });
    }
    Ok(())
}
