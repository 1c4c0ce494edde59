//! Volumes in the dashboard: the app page's section (its volumes, the form
//! that mounts one, detach buttons), the choice on the app's delete page,
//! and `/volumes`, every volume with a delete button for detached ones.
//! Each form acts through the user API's handlers.

use std::collections::HashMap;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::Form;
use cloudweb_api_types::volumes::AttachVolume;
use maud::{html, Markup};

use super::layout::{self, Nav};
use super::{csrf_field, format, Ctx};
use crate::api;
use crate::error::ApiError;
use crate::store::VolumeRow;

fn node_label(ctx: &Ctx, volume: &VolumeRow) -> String {
    match &volume.node_id {
        None => ctx.t("volumes.no_node_yet").to_string(),
        Some(id) => match ctx.state.nodes.get(id) {
            Some(node) => node.name.clone(),
            None => id.clone(),
        },
    }
}

fn size_label(volume: &VolumeRow) -> String {
    volume.size_bytes.map(|b| format::bytes(b.max(0) as u64)).unwrap_or_else(|| "–".into())
}

/// The app page's section.
pub fn app_section(ctx: &Ctx, app: &str, volumes: &[VolumeRow], waiting: Option<&str>) -> Markup {
    html! {
        h2 id="volumes" { (ctx.t("volumes.title")) }
        @if let Some(reason) = waiting {
            p.warning id="app-waiting" { (reason) }
        }
        p.help { (ctx.t("volumes.help")) }
        @if volumes.is_empty() {
            p.empty { (ctx.t("volumes.none")) }
        } @else {
            table id="app-volumes" {
                thead { tr { th { (ctx.t("volumes.name")) } th { (ctx.t("volumes.path")) } th { (ctx.t("volumes.node")) } th { (ctx.t("volumes.size")) } th {} } }
                tbody {
                    @for volume in volumes {
                        tr {
                            td { (volume.name) }
                            td { code { (volume.mount_path.as_deref().unwrap_or("")) } }
                            td {
                                (node_label(ctx, volume))
                                @if let Some(warning) = api::volumes::view(&ctx.state, volume).warning { br; span.warning { (warning) } }
                            }
                            td { (size_label(volume)) }
                            td {
                                form.inline method="post" action=(format!("/apps/{app}/volumes/{}/detach", volume.name)) {
                                    (csrf_field(ctx))
                                    button type="submit" { (ctx.t("volumes.detach")) }
                                }
                            }
                        }
                    }
                }
            }
        }
        form method="post" action=(format!("/apps/{app}/volumes")) id="volume-form" {
            (csrf_field(ctx))
            label { (ctx.t("volumes.name")) " " input type="text" name="name" required pattern="[a-z0-9]([a-z0-9-]*[a-z0-9])?" maxlength="63"; }
            " "
            label { (ctx.t("volumes.path")) " " input type="text" name="path" required placeholder="/app/uploads" maxlength="256"; }
            " "
            button type="submit" { (ctx.t("volumes.attach")) }
        }
    }
}

/// On the app's delete page: what becomes of its volumes (kept by
/// default; deleting them is a choice the user makes here).
pub fn delete_choice(ctx: &Ctx, volumes: &[VolumeRow]) -> Markup {
    if volumes.is_empty() {
        return html! {};
    }
    let names: Vec<&str> = volumes.iter().map(|v| v.name.as_str()).collect();
    html! {
        fieldset {
            legend { (ctx.t("volumes.on_delete")) " " (names.join(", ")) }
            label { input type="radio" name="volumes" value="keep" checked; " " (ctx.t("volumes.keep")) }
            br;
            label { input type="radio" name="volumes" value="delete"; " " (ctx.t("volumes.delete_too")) }
        }
    }
}

pub async fn attach(ctx: Ctx, Path(name): Path<String>, Form(form): Form<HashMap<String, String>>) -> Response {
    if let Some(refused) = ctx.refusal(&form) {
        return refused;
    }
    let request = AttachVolume {
        name: form.get("name").map(|v| v.trim().to_string()).unwrap_or_default(),
        path: form.get("path").map(|v| v.trim().to_string()).unwrap_or_default(),
    };
    let body = serde_json::to_vec(&request).expect("strings serialize");
    let result = api::volumes::attach(State(ctx.state.clone()), Path(name.clone()), Ok(Bytes::from(body))).await;
    ctx.outcome(result.map(|_| ()), &format!("/apps/{name}#volumes")).await
}

pub async fn detach(ctx: Ctx, Path((name, volume)): Path<(String, String)>, Form(form): Form<HashMap<String, String>>) -> Response {
    if let Some(refused) = ctx.refusal(&form) {
        return refused;
    }
    let result = api::volumes::detach(State(ctx.state.clone()), Path((name.clone(), volume))).await;
    ctx.outcome(result.map(|_| ()), &format!("/apps/{name}#volumes")).await
}

/// `/volumes`: every volume; detached ones can be deleted (after a
/// confirmation page).
pub async fn page(ctx: Ctx) -> Response {
    let volumes = match ctx.state.store.volumes().await {
        Ok(volumes) => volumes,
        Err(err) => return ApiError::from(err).into_response(),
    };
    let mut visible = Vec::new();
    for volume in volumes {
        match cloudweb_core::access::sees_owned(&ctx.state, &ctx.access, cloudweb_core::store::Owned::Volume, &volume.name).await {
            Ok(true) => visible.push(volume),
            Ok(false) => {}
            Err(err) => return err.into_response(),
        }
    }
    let volumes = visible;
    let mut last_moves = HashMap::new();
    for volume in &volumes {
        if let Ok(moves) = ctx.state.store.volume_moves_of(&volume.name).await {
            if let Some(last) = moves.into_iter().next() {
                last_moves.insert(volume.name.clone(), last);
            }
        }
    }
    let nodes = ctx.state.nodes.all();
    let body = html! {
        p.help { (ctx.t("volumes.page_help")) }
        @if volumes.is_empty() {
            p.empty { (ctx.t("volumes.none")) }
        } @else {
            table id="volumes" {
                thead { tr { th { (ctx.t("volumes.name")) } th { (ctx.t("volumes.app")) } th { (ctx.t("volumes.path")) } th { (ctx.t("volumes.node")) } th { (ctx.t("volumes.size")) } th {} } }
                tbody {
                    @for volume in &volumes {
                        tr {
                            td { (volume.name) }
                            td {
                                @match &volume.app {
                                    Some(app) => a href=(format!("/apps/{app}")) { (app) },
                                    None => em { (ctx.t("volumes.detached")) },
                                }
                            }
                            td { code { (volume.mount_path.as_deref().unwrap_or("")) } }
                            td {
                                (node_label(&ctx, volume))
                                @if let Some(warning) = api::volumes::view(&ctx.state, volume).warning { br; span.warning { (warning) } }
                            }
                            td { (size_label(volume)) }
                            td {
                                @if let (Some(from), None) = (&volume.node_id, &volume.service) {
                                    form.inline method="post" action=(format!("/volumes/{}/move", volume.name)) {
                                        (csrf_field(&ctx))
                                        select name="to" aria-label=(ctx.t("volumes.move")) {
                                            @for node in nodes.iter().filter(|n| n.id != *from) {
                                                option value=(node.id) { (node.name) }
                                            }
                                        }
                                        button type="submit" { (ctx.t("volumes.move")) }
                                    }
                                }
                                @if let Some(last) = last_moves.get(&volume.name) {
                                    br;
                                    span.help {
                                        (ctx.t("volumes.last_move")) ": " (last.state)
                                        @if let Some(downtime) = last.downtime_ms { " (" (format!("{:.1} s", downtime as f64 / 1000.0)) ")" }
                                        @if let Some(reason) = &last.reason { " – " (reason) }
                                    }
                                }
                                @if volume.app.is_none() && volume.service.is_none() {
                                    " "
                                    a.danger href=(format!("/volumes/{}/delete", volume.name)) { (ctx.t("volumes.delete")) }
                                }
                            }
                        }
                    }
                }
            }
        }
    };
    layout::page(&ctx, ctx.t("volumes.title"), Nav::Data, "/volumes", body).into_response()
}

/// The move form: starts a move and comes back to the list, where the
/// volume's last move shows how it goes.
pub async fn start_move(ctx: Ctx, Path(name): Path<String>, Form(form): Form<HashMap<String, String>>) -> Response {
    if let Some(refused) = ctx.refusal(&form) {
        return refused;
    }
    let to = form.get("to").map(|v| v.trim().to_string()).filter(|v| !v.is_empty());
    let body = serde_json::to_vec(&cloudweb_api_types::volumes::MoveVolume { to }).expect("strings serialize");
    let result = api::volume_moves::start(State(ctx.state.clone()), Path(name), Ok(Bytes::from(body))).await;
    ctx.outcome(result.map(|_| ()), "/volumes").await
}

pub async fn confirm_delete(ctx: Ctx, Path(name): Path<String>) -> Response {
    if !matches!(ctx.state.store.volume(&name).await, Ok(Some(_))) {
        return super::not_found(&ctx);
    }
    let here = format!("/volumes/{name}/delete");
    let title = format!("{}: {name}", ctx.t("volumes.delete"));
    layout::confirm(&ctx, &title, Nav::Data, &here, ctx.t("volumes.confirm_delete"), html! {}, "/volumes").into_response()
}

pub async fn delete(ctx: Ctx, Path(name): Path<String>, Form(form): Form<HashMap<String, String>>) -> Response {
    if let Some(refused) = ctx.refusal(&form) {
        return refused;
    }
    let result = api::volumes::remove(State(ctx.state.clone()), Path(name)).await;
    ctx.outcome(result.map(|_| ()), "/volumes").await
}
