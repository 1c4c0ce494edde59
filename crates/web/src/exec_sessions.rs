//! The app page's record of exec and port-forward sessions: who opened
//! which into which instance, when, for how long, how it ended. Sessions
//! themselves are opened from the command line (`cloudweb exec`,
//! `cloudweb port-forward`).

use axum::extract::{Path, State};
use axum::Json;
use maud::{html, Markup};

use super::{format, Ctx};
use crate::api;

/// Sessions the app page shows (the newest).
const SHOWN: usize = 20;

pub async fn app_section(ctx: &Ctx, app: &str) -> Markup {
    let sessions = api::sessions::list(State(ctx.state.clone()), Path(app.to_string())).await.map(|Json(list)| list.sessions);
    html! {
        h2 id="sessions" { (ctx.t("sessions.title")) }
        p.help { (ctx.t("sessions.help")) }
        @match &sessions {
            Err(err) => { p.error role="alert" { (super::error_text(err)) } }
            Ok(sessions) if sessions.is_empty() => { p.empty id="sessions-empty" { (ctx.t("sessions.none")) } }
            Ok(sessions) => {
                div.scroll { table id="sessions-table" {
                    thead { tr {
                        th scope="col" { (ctx.t("sessions.kind")) }
                        th scope="col" { (ctx.t("sessions.user")) }
                        th scope="col" { (ctx.t("sessions.instance")) }
                        th scope="col" { (ctx.t("sessions.what")) }
                        th scope="col" { (ctx.t("sessions.started")) }
                        th scope="col" { (ctx.t("sessions.duration")) }
                        th scope="col" { (ctx.t("sessions.end")) }
                    } }
                    tbody {
                        @for s in sessions.iter().take(SHOWN) {
                            tr data-session=(s.id) {
                                td data-label=(ctx.t("sessions.kind")) { (s.kind) }
                                td data-label=(ctx.t("sessions.user")) { (s.user) }
                                td.num data-label=(ctx.t("sessions.instance")) { (s.instance.map(|i| i.to_string()).unwrap_or_else(|| "–".into())) " " small { (s.node_id) } }
                                td data-label=(ctx.t("sessions.what")) {
                                    @match (&s.program, s.port) {
                                        (Some(program), _) => { code { (program) } @if s.tty { " " small { "tty" } } }
                                        (None, Some(port)) => { (ctx.t("sessions.port")) " " (port) }
                                        _ => { "–" }
                                    }
                                }
                                td data-label=(ctx.t("sessions.started")) { (super::tasks::when(&s.created_at)) }
                                td.num data-label=(ctx.t("sessions.duration")) { (s.duration_ms.map(|ms| format::duration_ms(ms.max(0) as u64)).unwrap_or_else(|| "–".into())) }
                                td data-label=(ctx.t("sessions.end")) {
                                    span class=(format!("badge {}", s.state)) data-state=(s.state) {
                                        @match s.exit_code { Some(code) => { "exit " (code) } None => { (s.state) } }
                                    }
                                    @if let Some(message) = &s.message { br; small { (message) } }
                                }
                            }
                        }
                    }
                } }
            }
        }
    }
}
