//! `cloudweb logs`: what an app's instances print, recent or followed.

use cloudweb_api_types::traffic::RuntimeLogs;

use crate::client::{segment, Api};
use crate::render;
use crate::{follow, Failure};

pub async fn run(api: &Api, app: &str, follow: bool, lines: u16, deployment: Option<String>, json: bool) -> Result<(), Failure> {
    let mut path = format!("/api/apps/{}/logs?lines={lines}", segment(app));
    if let Some(deployment) = &deployment {
        path.push_str(&format!("&deployment={}", segment(deployment)));
    }
    if follow {
        path.push_str("&follow=1");
        return follow::app_logs(api, &path, json).await;
    }
    let answer: RuntimeLogs = api.get(&path).await?;
    if json {
        render::json(&answer.lines);
    } else {
        for line in &answer.lines {
            println!("{}", follow::runtime_line(line));
        }
    }
    Ok(())
}

