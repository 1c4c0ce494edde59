//! The app page's preview environments: each pull or merge request's
//! preview with its state, URL, commit and last push, an approve button
//! for one from a fork (nothing of it is built until a user approves),
//! and a remove button.

use std::collections::HashMap;

use axum::extract::{Path, State};
use axum::response::Response;
use axum::{Extension, Form, Json};
use maud::{html, Markup};

use super::{csrf_field, Ctx};
use crate::api;

pub async fn app_section(ctx: &Ctx, app: &str) -> Markup {
    let list = api::previews::list(State(ctx.state.clone()), Path(app.to_string())).await.map(|Json(list)| list);
    html! {
        h2 id="previews" { (ctx.t("previews.title")) }
        @match &list {
            Err(err) => { p.error role="alert" { (super::error_text(err)) } }
            Ok(list) if !list.settings.enabled && list.previews.is_empty() => { p.help id="previews-off" { (ctx.t("previews.off")) } }
            Ok(list) if list.previews.is_empty() => { p.empty id="previews-empty" { (ctx.t("previews.none")) } }
            Ok(list) => {
                div.scroll { table id="previews-table" {
                    thead { tr {
                        th scope="col" { (ctx.t("previews.request")) }
                        th scope="col" { (ctx.t("previews.state")) }
                        th scope="col" { (ctx.t("apps.url")) }
                        th scope="col" { (ctx.t("deploy.commit")) }
                        th scope="col" { (ctx.t("previews.last_push")) }
                        th scope="col" { (ctx.t("nodes.actions")) }
                    } }
                    tbody {
                        @for p in &list.previews {
                            tr data-preview=(p.number) {
                                td.num data-label=(ctx.t("previews.request")) { "#" (p.number) @if p.from_fork { " " small { (ctx.t("previews.fork")) } } }
                                td data-label=(ctx.t("previews.state")) {
                                    span class=(format!("badge {}", p.state)) data-state=(p.state) { (p.state) }
                                    @if let Some(deployment) = &p.deployment { " " a href=(format!("/apps/{}", p.app)) { small { (deployment) } } }
                                }
                                td data-label=(ctx.t("apps.url")) { a href=(p.url) { (p.url) } }
                                td data-label=(ctx.t("deploy.commit")) { code { (p.commit.get(..12).unwrap_or(&p.commit)) } " " small { (p.branch) } }
                                td data-label=(ctx.t("previews.last_push")) { (super::tasks::when(&p.updated_at)) }
                                td data-label=(ctx.t("nodes.actions")) {
                                    @if p.state == "awaiting-approval" {
                                        form.inline method="post" action=(format!("/apps/{app}/previews/{}/approve", p.number)) {
                                            (csrf_field(ctx))
                                            button type="submit" aria-label=(format!("{} #{}", ctx.t("previews.approve"), p.number)) { (ctx.t("previews.approve")) }
                                        }
                                    }
                                    form.inline method="post" action=(format!("/apps/{app}/previews/{}/remove", p.number)) {
                                        (csrf_field(ctx))
                                        button.danger type="submit" aria-label=(format!("{} #{}", ctx.t("previews.remove"), p.number)) { (ctx.t("previews.remove")) }
                                    }
                                }
                            }
                        }
                    }
                } }
            }
        }
    }
}

/// Approves a fork's preview (its head is built with no variable of the app).
pub async fn approve(ctx: Ctx, Path((app, number)): Path<(String, i64)>, Form(form): Form<HashMap<String, String>>) -> Response {
    if let Some(refused) = ctx.refusal(&form) {
        return refused;
    }
    let result = api::previews::approve(State(ctx.state.clone()), Extension(ctx.principal.clone()), Path((app.clone(), number))).await;
    ctx.outcome(result, &format!("/apps/{app}#previews")).await
}

pub async fn remove(ctx: Ctx, Path((app, number)): Path<(String, i64)>, Form(form): Form<HashMap<String, String>>) -> Response {
    if let Some(refused) = ctx.refusal(&form) {
        return refused;
    }
    let result = api::previews::remove(State(ctx.state.clone()), Path((app.clone(), number))).await;
    ctx.outcome(result, &format!("/apps/{app}#previews")).await
}
