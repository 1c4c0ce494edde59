//! `cloudweb scale APP N`: the app's running deployment to N instances
//! now; `cloudweb top APP`: its instances' latest usage.

use cloudweb_api_types::scale::{AppTop, ScaleRequest, ScaleView};
use reqwest::Method;

use crate::client::{segment, Api};
use crate::render::{self, bytes, cell, clean, table};
use crate::Failure;

pub async fn scale(api: &Api, app: &str, instances: u32, json: bool) -> Result<(), Failure> {
    let view: ScaleView = api.call(Method::POST, &format!("/api/apps/{}/scale", segment(app)), Some(&ScaleRequest { instances })).await?;
    if json {
        render::json(&view);
        return Ok(());
    }
    let name = clean(app);
    match &view.deployment {
        None => println!("{name}: {} instance(s) from its next deployment on (no deployment runs)", view.instances),
        Some(deployment) => println!("{name}: {} -> {} instance(s) of {}", view.before, view.instances, clean(deployment)),
    }
    for started in &view.started {
        println!("  instance {} starting on {}: {}", started.instance, clean(&started.node_id), clean(&started.why));
    }
    if !view.draining.is_empty() {
        let list: Vec<String> = view.draining.iter().map(i64::to_string).collect();
        println!("  instance(s) {} leave the routes and stop after the drain period", list.join(", "));
    }
    for in_flight in &view.in_flight {
        println!("  deployment {} on its way keeps its {} instance(s); the next one has {}", clean(&in_flight.deployment), in_flight.instances, view.instances);
    }
    if let Some(reason) = &view.waiting {
        return Err(Failure::Action(format!("only {} of {} instance(s) could start: {}", view.before + view.started.len(), view.instances, clean(reason))));
    }
    Ok(())
}

pub async fn top(api: &Api, app: &str, json: bool) -> Result<(), Failure> {
    let view: AppTop = api.get(&format!("/api/apps/{}/top", segment(app))).await?;
    if json {
        render::json(&view);
        return Ok(());
    }
    if view.instances.is_empty() {
        println!("{} runs no instance", clean(app));
        return Ok(());
    }
    let rows: Vec<Vec<String>> = view
        .instances
        .iter()
        .map(|i| {
            vec![
                i.instance.to_string(),
                cell(&i.node_id),
                if i.ready { i.state.clone() } else { format!("{} (unready: {})", i.state, clean(i.unready_reason.as_deref().unwrap_or(""))) },
                i.cpu_cores.map(|c| format!("{c:.3}")).unwrap_or_else(|| "-".into()),
                i.cpu_pct_of_request.map(|p| format!("{p:.0}%")).unwrap_or_else(|| "-".into()),
                bytes(i.mem_bytes),
                bytes(i.mem_limit),
                i.restarts.map(|r| r.to_string()).unwrap_or_else(|| "-".into()),
                cell(&i.deployment),
            ]
        })
        .collect();
    table(&["INSTANCE", "NODE", "STATE", "CPU", "OF REQUEST", "MEMORY", "LIMIT", "RESTARTS", "DEPLOYMENT"], &rows);
    println!("(CPU in cores, of the {} core(s) each instance requests; from each node's latest sample)", view.cpu_request);
    Ok(())
}
