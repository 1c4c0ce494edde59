//! `/services`: the managed databases, each with its state, address and
//! linked apps; a form that creates one, forms that link and unlink apps,
//! a button that rotates its password, a form that changes its version,
//! and a delete button (after a confirmation page). Each form acts through
//! the user API's handlers; no password is ever on these pages.

use std::collections::HashMap;

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Response};
use axum::Form;
use cloudweb_api_types::services::{CreateLink, CreateService, DataOnDelete, DeleteServiceQuery, ServiceKind, ServiceList, UpgradeService};
use maud::{html, Markup};

use super::layout::{self, Nav};
use super::{csrf_field, Ctx};
use crate::api;
use crate::error::ApiError;

fn list_body(ctx: &Ctx, list: &ServiceList) -> Markup {
    html! {
        p.help { (ctx.t("services.help")) " " a href="/volumes" { (ctx.t("volumes.title")) } " · " a href="/backups" { (ctx.t("backups.title")) } }
        @if list.services.is_empty() {
            p.empty { (ctx.t("services.none")) }
        } @else {
            table id="services" {
                thead { tr {
                    th { (ctx.t("volumes.name")) } th { (ctx.t("services.type")) } th { (ctx.t("volumes.node")) }
                    th { (ctx.t("services.state")) } th { (ctx.t("services.address")) } th { (ctx.t("services.links")) } th {}
                } }
                tbody {
                    @for service in &list.services {
                        tr {
                            td { (service.name) }
                            td { (service.kind) }
                            td { (service.node_name.clone().unwrap_or_else(|| service.node_id.clone())) }
                            td title=(service.detail.clone().unwrap_or_default()) {
                                (service.state)
                                @if let Some(rotation) = &service.rotation {
                                    br; small.rotation { (ctx.t("services.rotating")) " " (rotation.detail) }
                                }
                            }
                            td { code { (service.address.clone().unwrap_or_default()) } }
                            td {
                                @for link in &service.links {
                                    form.inline method="post" action=(format!("/services/{}/links/{}/delete", service.name, link.app)) {
                                        (csrf_field(ctx))
                                        a href=(format!("/apps/{}", link.app)) { (link.app) } " (" code { (link.variable) } ") "
                                        button type="submit" { (ctx.t("services.unlink")) }
                                    }
                                }
                                form.inline method="post" action=(format!("/services/{}/links", service.name)) {
                                    (csrf_field(ctx))
                                    input type="text" name="app" required placeholder=(ctx.t("volumes.app")) maxlength="63";
                                    " "
                                    button type="submit" { (ctx.t("services.link")) }
                                }
                            }
                            td {
                                form.inline method="post" action=(format!("/services/{}/rotate-password", service.name)) {
                                    (csrf_field(ctx))
                                    button type="submit" { (ctx.t("services.rotate")) }
                                }
                                " "
                                form.inline method="post" action=(format!("/services/{}/upgrade", service.name)) {
                                    (csrf_field(ctx))
                                    input type="text" name="version" required maxlength="16" size="6" pattern="[0-9][0-9.]*"
                                        placeholder=(service.version.clone().unwrap_or_default()) aria-label=(ctx.t("services.version"));
                                    " "
                                    @if service.kind == "postgres" {
                                        label title=(ctx.t("services.writes_stopped_hint")) {
                                            input type="checkbox" name="writes_stopped" value="yes"; " " (ctx.t("services.writes_stopped"))
                                        }
                                        " "
                                    }
                                    button type="submit" { (ctx.t("services.upgrade")) }
                                }
                                " "
                                a.danger href=(format!("/services/{}/delete", service.name)) { (ctx.t("services.delete")) }
                            }
                        }
                    }
                }
            }
        }
        h2 { (ctx.t("services.create")) }
        form method="post" action="/services" id="service-form" {
            (csrf_field(ctx))
            label { (ctx.t("volumes.name")) " " input type="text" name="name" required pattern="[a-z0-9]([a-z0-9-]*[a-z0-9])?" maxlength="63"; }
            " "
            label { (ctx.t("services.type")) " "
                select name="type" {
                    @for kind in ServiceKind::ALL { option value=(kind.as_str()) { (kind.as_str()) } }
                }
            }
            " "
            label { (ctx.t("services.version")) " " input type="text" name="version" maxlength="16" placeholder="16"; }
            " "
            button type="submit" { (ctx.t("services.create")) }
        }
    }
}

pub async fn page(ctx: Ctx) -> Response {
    match api::services::list(State(ctx.state.clone()), axum::Extension(ctx.access.clone())).await {
        Ok(list) => layout::page(&ctx, ctx.t("services.title"), Nav::Data, "/services", list_body(&ctx, &list.0)).into_response(),
        Err(err) => err.into_response(),
    }
}

pub async fn create(ctx: Ctx, Form(form): Form<HashMap<String, String>>) -> Response {
    if let Some(refused) = ctx.refusal(&form) {
        return refused;
    }
    let field = |key: &str| form.get(key).map(|v| v.trim().to_string()).filter(|v| !v.is_empty());
    let result = match field("type").as_deref().and_then(ServiceKind::parse) {
        None => Err(ApiError::BadRequest("type must be postgres, redis or mariadb".into())),
        Some(kind) => {
            let body = CreateService { name: field("name").unwrap_or_default(), kind, version: field("version"), node: None, memory: None };
            let bytes = serde_json::to_vec(&body).expect("strings serialize");
            api::services::create(State(ctx.state.clone()), axum::Extension(ctx.team.clone()), Ok(Bytes::from(bytes))).await.map(|_| ())
        }
    };
    ctx.outcome(result, "/services").await
}

pub async fn link(ctx: Ctx, Path(name): Path<String>, Form(form): Form<HashMap<String, String>>) -> Response {
    if let Some(refused) = ctx.refusal(&form) {
        return refused;
    }
    let body = CreateLink { app: form.get("app").map(|v| v.trim().to_string()).unwrap_or_default(), variable: None };
    let bytes = serde_json::to_vec(&body).expect("strings serialize");
    let result = api::services::link(State(ctx.state.clone()), Path(name), Ok(Bytes::from(bytes))).await.map(|_| ());
    ctx.outcome(result, "/services").await
}

pub async fn unlink(ctx: Ctx, Path((name, app)): Path<(String, String)>, Form(form): Form<HashMap<String, String>>) -> Response {
    if let Some(refused) = ctx.refusal(&form) {
        return refused;
    }
    let result = api::services::unlink(State(ctx.state.clone()), Path((name, app))).await.map(|_| ());
    ctx.outcome(result, "/services").await
}

pub async fn rotate_password(ctx: Ctx, Path(name): Path<String>, Form(form): Form<HashMap<String, String>>) -> Response {
    if let Some(refused) = ctx.refusal(&form) {
        return refused;
    }
    let result = api::services::rotate_password(State(ctx.state.clone()), Path(name)).await.map(|_| ());
    ctx.outcome(result, "/services").await
}

pub async fn upgrade(ctx: Ctx, Path(name): Path<String>, Form(form): Form<HashMap<String, String>>) -> Response {
    if let Some(refused) = ctx.refusal(&form) {
        return refused;
    }
    let body = UpgradeService {
        version: form.get("version").map(|v| v.trim().to_string()).unwrap_or_default(),
        writes_stopped: form.get("writes_stopped").is_some_and(|v| v == "yes"),
    };
    let bytes = serde_json::to_vec(&body).expect("strings serialize");
    let result = api::services::upgrade(State(ctx.state.clone()), Path(name), Ok(Bytes::from(bytes))).await.map(|_| ());
    ctx.outcome(result, "/services").await
}

pub async fn confirm_delete(ctx: Ctx, Path(name): Path<String>) -> Response {
    if !matches!(ctx.state.store.service(&name).await, Ok(Some(_))) {
        return super::not_found(&ctx);
    }
    let here = format!("/services/{name}/delete");
    let title = format!("{}: {name}", ctx.t("services.delete"));
    let extra = html! {
        label { input type="checkbox" name="data" value="delete"; " " (ctx.t("services.delete_data")) }
    };
    layout::confirm(&ctx, &title, Nav::Data, &here, ctx.t("services.confirm_delete"), extra, "/services").into_response()
}

pub async fn delete(ctx: Ctx, Path(name): Path<String>, Form(form): Form<HashMap<String, String>>) -> Response {
    if let Some(refused) = ctx.refusal(&form) {
        return refused;
    }
    let data = if form.get("data").map(String::as_str) == Some("delete") { DataOnDelete::Delete } else { DataOnDelete::Keep };
    let result = api::services::remove(State(ctx.state.clone()), Path(name), Ok(Query(DeleteServiceQuery { data }))).await.map(|_| ());
    ctx.outcome(result, "/services").await
}
