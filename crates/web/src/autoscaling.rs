//! The app page's autoscaling section: the settings (set with `cloudweb
//! autoscale` or the API) and the autoscaler's newest decisions, each with
//! its reason.

use axum::extract::{Path, State};
use axum::Json;
use cloudweb_api_types::autoscale::AutoscaleTarget;
use maud::{html, Markup};

use super::Ctx;
use crate::api;

/// Decisions the app page shows (the newest).
const SHOWN: usize = 10;

pub async fn app_section(ctx: &Ctx, app: &str) -> Markup {
    let view = api::autoscale::show(State(ctx.state.clone()), Path(app.to_string())).await.map(|Json(view)| view);
    html! {
        h2 id="autoscaling" { (ctx.t("auto.title")) }
        @match &view {
            Err(err) => { p.error role="alert" { (super::error_text(err)) } }
            Ok(view) => {
                @match &view.autoscale {
                    None => { p.help id="autoscaling-off" { (ctx.t("auto.off")) } }
                    Some(a) => {
                        p id="autoscaling-on" {
                            (a.min) "–" (a.max) " " (ctx.t("auto.instances")) " · "
                            @match a.target {
                                AutoscaleTarget::CpuPercent(p) => { (ctx.t("auto.cpu")) " " (p) " %" }
                                AutoscaleTarget::RequestsPerSecond(r) => { (ctx.t("auto.rps")) " " (r) }
                            }
                            " · " (ctx.t("auto.windows")) " " (a.up_window_seconds) " s / " (a.down_window_seconds) " s"
                        }
                    }
                }
                @if !view.decisions.is_empty() {
                    div.scroll { table id="autoscaling-decisions" {
                        thead { tr {
                            th scope="col" { (ctx.t("auto.at")) }
                            th scope="col" { (ctx.t("auto.count")) }
                            th scope="col" { (ctx.t("auto.reason")) }
                        } }
                        tbody {
                            @for d in view.decisions.iter().take(SHOWN) {
                                tr {
                                    td { (super::tasks::when(&d.at)) }
                                    td.num { (d.from) " → " (d.to) }
                                    td { (d.reason) }
                                }
                            }
                        }
                    } }
                }
            }
        }
    }
}
