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
                state_cell(i),
                i.cpu_cores
                    .map(|c| format!("{c:.3}"))
                    .unwrap_or_else(|| "-".into()),
                i.cpu_pct_of_request
                    .map(|p| format!("{p:.0}%"))
                    .unwrap_or_else(|| "-".into()),
                bytes(i.mem_bytes),
                bytes(i.mem_limit),
                i.restarts.map(|r| r.to_string()).unwrap_or_else(|| "-".into()),
                cell(&i.deployment),
            ]
        })
        .collect();
    table(
        &[
            "INSTANCE",
            "NODE",
            "STATE",
            "CPU",
            "OF REQUEST",
            "MEMORY",
            "LIMIT",
            "RESTARTS",
            "DEPLOYMENT",
        ],
        &rows,
    );
    println!(
        "(CPU in cores, of the {} core(s) each instance requests; from each node's latest sample)",
        view.cpu_request
    );
    // A crash loop's last output lines, under the table.
    for i in &view.instances {
        if let Some(crash) = i.crash_loop.as_ref().filter(|c| !c.last_lines.is_empty()) {
            println!("instance {} last output before its restart:", i.instance);
            for line in &crash.last_lines {
                println!("  {}", clean(line));
            }
        }
    }
    Ok(())
}

/// The state, and what is wrong: crash-looping (stops, exit code, why),
/// unready (why), a liveness probe that cannot run.
fn state_cell(i: &cloudweb_api_types::scale::InstanceUsage) -> String {
    let mut state = match &i.crash_loop {
        Some(crash) => {
            let exit = crash
                .exit_code
                .map(|c| format!(", exit {c}"))
                .unwrap_or_default();
            format!(
                "crash-looping ({} stops in 10 min{exit}: {})",
                crash.restarts,
                clean(crash.reason.as_deref().unwrap_or(""))
            )
        }
        None => i.state.clone(),
    };
    if !i.ready {
        state.push_str(&format!(
            " (unready: {})",
            clean(i.unready_reason.as_deref().unwrap_or(""))
        ));
    }
    if let Some(problem) = &i.probe_problem {
        state.push_str(&format!(" (liveness probe cannot run: {})", clean(problem)));
    }
    state
}
