//! The app page's instance list: each running (or starting, or stopping)
//! instance with its node, state, readiness, restarts, CPU and memory
//! (from `cloudweb top`'s data), and, when its node reports one, its crash
//! loop (restarts, last exit code, why, its last output lines) or a
//! liveness probe that cannot run.

use axum::extract::{Path, State};
use axum::Json;
use maud::{html, Markup};

use super::{format, Ctx};
use crate::api;

pub async fn app_section(ctx: &Ctx, app: &str) -> Markup {
    let top = api::scale::top(State(ctx.state.clone()), Path(app.to_string()))
        .await
        .map(|Json(top)| top);
    html! {
        h2 id="instances" { (ctx.t("inst.title")) }
        p { a id="open-terminal" href=(format!("/apps/{app}/terminal")) { (ctx.t("term.open_link")) } }
        @match &top {
            Err(err) => { p.error role="alert" { (super::error_text(err)) } }
            Ok(top) if top.instances.is_empty() => { p.empty id="instances-empty" { (ctx.t("inst.none")) } }
            Ok(top) => {
                div.scroll { table id="instances-table" {
                    thead { tr {
                        th scope="col" { "#" }
                        th scope="col" { (ctx.t("inst.node")) }
                        th scope="col" { (ctx.t("inst.state")) }
                        th scope="col" { (ctx.t("inst.restarts")) }
                        th scope="col" { (ctx.t("inst.cpu")) }
                        th scope="col" { (ctx.t("inst.memory")) }
                    } }
                    tbody {
                        @for i in &top.instances {
                            tr data-instance=(i.instance) data-deployment=(i.deployment) {
                                td.num { (i.instance) }
                                td data-label=(ctx.t("inst.node")) { (i.node_id.as_deref().unwrap_or("–")) }
                                td data-label=(ctx.t("inst.state")) {
                                    @if let Some(crash) = &i.crash_loop {
                                        span.badge.failed data-state="crash-looping" { (ctx.t("inst.crash_looping")) }
                                        br;
                                        small {
                                            (crash.restarts) " " (ctx.t("inst.restarts_window"))
                                            @if let Some(code) = crash.exit_code { " · exit " (code) }
                                            @if let Some(reason) = &crash.reason { " · " (reason) }
                                        }
                                        @if !crash.last_lines.is_empty() {
                                            details { summary { (ctx.t("inst.last_lines")) } pre.log { @for line in &crash.last_lines { (line) "\n" } } }
                                        }
                                    } @else {
                                        span class=(format!("badge {}", i.state)) data-state=(i.state) { (i.state) }
                                    }
                                    @if !i.ready { " " span.badge.degraded data-ready="false" { (ctx.t("inst.unready")) } br; small { (i.unready_reason.as_deref().unwrap_or("")) } }
                                    @if let Some(problem) = &i.probe_problem { br; small.error data-probe-problem="" { (ctx.t("inst.probe_problem")) ": " (problem) } }
                                }
                                td.num data-label=(ctx.t("inst.restarts")) { (i.restarts.map(|r| r.to_string()).unwrap_or_else(|| "–".into())) }
                                td.num data-label=(ctx.t("inst.cpu")) { (i.cpu_pct_of_request.map(|p| format!("{p:.0} %")).unwrap_or_else(|| "–".into())) }
                                td.num data-label=(ctx.t("inst.memory")) { (i.mem_bytes.map(format::bytes).unwrap_or_else(|| "–".into())) }
                            }
                        }
                    }
                } }
            }
        }
    }
}
