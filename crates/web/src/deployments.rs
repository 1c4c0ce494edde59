//! Deployment pages: an app's deployments newest first (with rollback to
//! any that ran), and one deployment's timeline, commit, image, nodes and
//! build log (followed live by the page's script).

use std::collections::HashMap;
use std::convert::Infallible;
use std::time::Duration;

use axum::extract::{Path, Query};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::Stream;
use maud::{html, Markup};

use super::format;
use super::i18n::Lang;
use super::layout::{self, Nav};
use super::{csrf_field, Ctx};
use crate::store::{DeploymentRow, InstanceRow};

/// Most stored log lines a page shows; the rest stay in the API.
const PAGE_LOG_LINES: i64 = 5000;

pub fn state_key(state: &str) -> &'static str {
    match state {
        "queued" => "dstate.queued",
        "building" => "dstate.building",
        "deploying" => "dstate.deploying",
        "running" => "dstate.running",
        "failed" => "dstate.failed",
        _ => "dstate.superseded",
    }
}

pub fn state_badge(lang: Lang, state: &str) -> Markup {
    html! { span class=(format!("badge {state}")) data-state=(state) { (lang.t(state_key(state))) } }
}

fn short(commit: &str) -> &str {
    commit.get(..12).unwrap_or(commit)
}

/// An app's deployments, newest first, with a rollback button on each
/// earlier one that ran.
pub fn list(ctx: &Ctx, app: &str, deployments: &[DeploymentRow]) -> Markup {
    html! {
        @if deployments.is_empty() { p { (ctx.t("apps.no_deployments")) } }
        @else {
            div.scroll { table.deployments {
                thead { tr {
                    th scope="col" { (ctx.t("deploy.created")) }
                    th scope="col" { (ctx.t("deploy.state")) }
                    th scope="col" { (ctx.t("deploy.kind")) }
                    th scope="col" { (ctx.t("deploy.commit")) }
                    th scope="col" { (ctx.t("deploy.image")) }
                    th scope="col" { (ctx.t("nodes.actions")) }
                } }
                tbody {
                    @for (index, deployment) in deployments.iter().enumerate() {
                        tr data-deployment=(deployment.id) {
                            td { a href=(format!("/deployments/{}", deployment.id)) { (format::datetime(deployment.created_at)) } }
                            td { (state_badge(ctx.lang, &deployment.state)) }
                            td { (deployment.kind) }
                            td { code { (deployment.commit_sha.as_deref().map(short).unwrap_or("–")) } }
                            td { code.image { (deployment.image.as_deref().unwrap_or("–")) } }
                            td {
                                a href=(format!("/deployments/{}", deployment.id)) { (ctx.t("deploy.view")) }
                                @if index > 0 && deployment.image.is_some() && matches!(deployment.state.as_str(), "running" | "superseded") {
                                    form.inline method="post" action=(format!("/apps/{app}/rollback")) {
                                        (csrf_field(ctx))
                                        input type="hidden" name="deployment_id" value=(deployment.id);
                                        button type="submit" { (ctx.t("deploy.rollback")) }
                                    }
                                }
                            }
                        }
                    }
                }
            } }
        }
    }
}

/// One deployment's page body. `node_names` maps node ids to names.
pub fn page_body(
    ctx: &Ctx,
    deployment: &DeploymentRow,
    events: &[(String, i64)],
    instances: &[InstanceRow],
    node_names: &HashMap<String, String>,
    lines: &[(i64, String, String, String)],
) -> Markup {
    let last_seq = lines.last().map(|l| l.0).unwrap_or(0);
    let settled = matches!(deployment.state.as_str(), "running" | "failed" | "superseded");
    html! {
        p { a href=(format!("/apps/{}", deployment.app)) { "← " (deployment.app) } }
        dl.settings {
            dt { (ctx.t("deploy.state")) } dd id="deployment-state" { (state_badge(ctx.lang, &deployment.state)) }
            dt { (ctx.t("deploy.kind")) } dd { (deployment.kind) }
            dt { (ctx.t("deploy.commit")) } dd { code { (deployment.commit_sha.as_deref().unwrap_or("–")) } }
            dt { (ctx.t("deploy.image")) } dd { code.image { (deployment.image.as_deref().unwrap_or("–")) } }
            dt { (ctx.t("deploy.nodes")) } dd {
                @for instance in instances {
                    @if let Some(node) = &instance.node_id {
                        span.instance { (node_names.get(node).map(String::as_str).unwrap_or(node)) " #" (instance.instance) " (" (instance.state) ")" } " "
                    }
                }
            }
            @if let Some(error) = &deployment.error { dt { (ctx.t("deploy.error")) } dd.error { (error) } }
        }
        h2 { (ctx.t("deploy.timeline")) }
        ol.timeline {
            @for (state, at) in events {
                li { (state_badge(ctx.lang, state)) " " time { (format::datetime(*at)) } }
            }
        }
        h2 { (ctx.t("deploy.logs")) @if !settled { " " span.live { "● " (ctx.t("deploy.live")) } } }
        @if lines.is_empty() { p.empty id="log-empty" { (ctx.t("deploy.logs_empty")) } }
        pre.log id="log" tabindex="0" data-stream=[(!settled).then(|| format!("/deployments/{}/logs?after={last_seq}", deployment.id))] {
            @for (_, ts, stream, line) in lines {
                span class=(format!("line {stream}")) title=(ts) { (line) "\n" }
            }
        }
    }
}

pub async fn page(ctx: Ctx, Path(id): Path<String>) -> Response {
    let store = &ctx.state.store;
    let loaded = async {
        let Some(deployment) = store.deployment(&id).await? else { return Ok(None) };
        let events = store.deployment_events(&id).await?;
        let instances = store.instances(&id).await?;
        let node_names: HashMap<String, String> = store.nodes().await?.into_iter().map(|n| (n.id, n.name)).collect();
        let lines = store.deployment_logs(&id, 0, PAGE_LOG_LINES).await?;
        Ok::<_, crate::store::StoreError>(Some((deployment, events, instances, node_names, lines)))
    }
    .await;
    match loaded {
        Ok(Some((deployment, events, instances, node_names, lines))) => {
            let title = format!("{} · {}", ctx.t("deploy.title"), deployment.app);
            let body = page_body(&ctx, &deployment, &events, &instances, &node_names, &lines);
            layout::page(&ctx, &title, Nav::Apps, &format!("/deployments/{id}"), body).into_response()
        }
        Ok(None) => super::not_found(&ctx),
        Err(err) => crate::error::ApiError::from(err).into_response(),
    }
}

#[derive(serde::Deserialize)]
pub struct After {
    after: Option<i64>,
}

/// The deployment's log stream for the page's script (the session, not a
/// bearer token, authorizes it): the API's stream from line `after` on.
pub async fn log_stream(ctx: Ctx, Path(id): Path<String>, Query(after): Query<After>) -> Response {
    if !matches!(ctx.state.store.deployment(&id).await, Ok(Some(_))) {
        return super::not_found(&ctx);
    }
    let events: std::pin::Pin<Box<dyn Stream<Item = Result<Event, Infallible>> + Send>> =
        Box::pin(crate::api::deployments::log_events(ctx.state.clone(), id, after.after.unwrap_or(0).max(0)));
    Sse::new(events).keep_alive(KeepAlive::new().interval(Duration::from_secs(15))).into_response()
}
