//! `/backups`: the destinations (a form that adds one; its answer shows the
//! recovery kit, this once), every service's and volume's last backup with
//! what needs attention and a button that backs it up now, and the recent
//! jobs, where a restore that keeps the data it replaced has a button that
//! deletes it. The banner on every page (layout) comes from the same
//! alerts. Each form acts through the user API's handlers.

use std::collections::HashMap;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::Form;
use cloudweb_api_types::backups::{BackupJobView, BackupOverview, DestinationView, NewDestination, RecoveryKit};
use maud::{html, Markup};

use super::layout::{self, Nav};
use super::{csrf_field, format, Ctx};
use crate::api;
use crate::error::ApiError;

fn bytes(value: Option<i64>) -> String {
    value.map(|b| format::bytes(b.max(0) as u64)).unwrap_or_else(|| "–".into())
}

fn destinations_table(ctx: &Ctx, destinations: &[DestinationView]) -> Markup {
    html! {
        h2 { (ctx.t("backups.destinations")) }
        @if destinations.is_empty() {
            p.warning id="no-destination" { (ctx.t("backups.no_destination")) }
        } @else {
            table id="destinations" {
                thead { tr { th { (ctx.t("volumes.name")) } th { (ctx.t("backups.kind")) } th { (ctx.t("backups.repository")) } th { (ctx.t("backups.keep")) } th { (ctx.t("backups.default")) } } }
                tbody {
                    @for d in destinations {
                        tr {
                            td { (d.name) } td { (d.kind) } td { code { (d.repository) } }
                            td { (d.keep_daily) " / " (d.keep_weekly) " / " (d.keep_monthly) }
                            td { @if d.default { (ctx.t("common.yes")) } }
                        }
                    }
                }
            }
        }
        details {
            summary { (ctx.t("backups.add")) }
            form method="post" action="/backups/destinations" id="destination-form" {
                (csrf_field(ctx))
                label { (ctx.t("volumes.name")) " " input type="text" name="name" required pattern="[a-z0-9]([a-z0-9-]*[a-z0-9])?" maxlength="63"; }
                " "
                label { (ctx.t("backups.kind")) " " select name="kind" { option value="s3" { "S3" } option value="path" { (ctx.t("backups.path")) } } }
                br;
                label { (ctx.t("backups.endpoint")) " " input type="url" name="endpoint" placeholder="https://s3.example.com" maxlength="512"; }
                " "
                label { (ctx.t("backups.bucket")) " " input type="text" name="bucket" maxlength="63"; }
                " "
                label { (ctx.t("backups.prefix")) " " input type="text" name="prefix" maxlength="512"; }
                " "
                label { (ctx.t("backups.region")) " " input type="text" name="region" placeholder="us-east-1" maxlength="64"; }
                br;
                label { (ctx.t("backups.access_key")) " " input type="text" name="access_key_id" maxlength="256" autocomplete="off"; }
                " "
                label { (ctx.t("backups.secret_key")) " " input type="password" name="secret_access_key" maxlength="256" autocomplete="off"; }
                br;
                label { (ctx.t("backups.path")) " " input type="text" name="path" placeholder="/srv/backups" maxlength="512"; }
                " "
                button type="submit" { (ctx.t("backups.add")) }
            }
        }
    }
}

fn targets_table(ctx: &Ctx, overview: &BackupOverview) -> Markup {
    html! {
        h2 { (ctx.t("backups.targets")) }
        table id="backup-targets" {
            thead { tr { th { (ctx.t("backups.target")) } th { (ctx.t("backups.last")) } th { (ctx.t("backups.last_success")) } th { (ctx.t("backups.size")) } th { (ctx.t("backups.attention")) } th {} } }
            tbody {
                @for t in &overview.targets {
                    tr {
                        td { (t.target) }
                        td { (t.last_state.clone().unwrap_or_else(|| "–".into())) }
                        td { (t.last_success_at.clone().unwrap_or_else(|| "–".into())) }
                        td { (bytes(t.last_bytes)) }
                        td { @if let Some(alert) = &t.alert { span.warning { (alert) } } }
                        td {
                            @if overview.destinations > 0 && t.target != cloudweb_core::backups::CONTROL_PLANE_TARGET {
                                form.inline method="post" action=(format!("/backups/run/{}", t.target)) {
                                    (csrf_field(ctx))
                                    button type="submit" { (ctx.t("backups.run")) }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

fn jobs_table(ctx: &Ctx, jobs: &[BackupJobView]) -> Markup {
    html! {
        h2 { (ctx.t("backups.jobs")) }
        table id="backup-jobs" {
            thead { tr {
                th { (ctx.t("backups.job")) } th { (ctx.t("backups.kind")) } th { (ctx.t("backups.target")) } th { (ctx.t("backups.state")) }
                th { (ctx.t("backups.snapshot")) } th { (ctx.t("backups.size")) } th { (ctx.t("backups.verified")) } th { (ctx.t("backups.created")) } th { (ctx.t("backups.note")) } th {}
            } }
            tbody {
                @for j in jobs {
                    tr {
                        td { code { (j.id) } } td { (j.kind) } td { (j.target) } td { (j.state) }
                        td { (j.snapshot.clone().unwrap_or_default()) } td { (bytes(j.bytes)) }
                        td { (j.verification.as_ref().map(|v| v.state.clone()).unwrap_or_default()) }
                        td { (j.created_at) }
                        td { (j.message.clone().or(j.detail.clone()).unwrap_or_default()) }
                        td {
                            @if j.kept_state.as_deref() == Some("kept") {
                                form.inline method="post" action=(format!("/backups/jobs/{}/confirm", j.id)) title=(j.kept_volume.clone().unwrap_or_default()) {
                                    (csrf_field(ctx))
                                    button type="submit" { (ctx.t("backups.confirm_restore")) }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

fn kit_section(ctx: &Ctx, kit: &RecoveryKit) -> Markup {
    let href = format!("data:text/plain;charset=utf-8,{}", url::form_urlencoded::byte_serialize(kit.text.as_bytes()).collect::<String>().replace('+', "%20"));
    html! {
        section id="recovery-kit" {
            h2 { (ctx.t("backups.kit_title")) }
            p.warning { (ctx.t("backups.kit_help")) }
            pre { (kit.text) }
            a download=(format!("cloudweb-recovery-kit-{}.txt", kit.destination)) href=(href) { (ctx.t("backups.download")) }
        }
    }
}

async fn body(ctx: &Ctx, kit: Option<&RecoveryKit>) -> Result<Markup, ApiError> {
    // What the user's teams own only: the API's own lists.
    let axum::Json(overview) = api::backups::overview(State(ctx.state.clone()), axum::Extension(ctx.access.clone())).await?;
    let axum::Json(cloudweb_api_types::backups::DestinationList { destinations }) =
        api::backups::list_destinations(State(ctx.state.clone()), axum::Extension(ctx.access.clone())).await?;
    let mut jobs: Vec<BackupJobView> = Vec::new();
    for job in ctx.state.store.recent_backup_jobs(30).await? {
        if cloudweb_core::access::sees_owned(&ctx.state, &ctx.access, cloudweb_core::store::Owned::BackupJob, &job.id).await? {
            jobs.push(cloudweb_core::backups::job_view(&job));
        }
    }
    Ok(html! {
        p.help { (ctx.t("backups.help")) }
        @if let Some(kit) = kit { (kit_section(ctx, kit)) }
        (destinations_table(ctx, &destinations))
        (targets_table(ctx, &overview))
        (jobs_table(ctx, &jobs))
    })
}

pub async fn page(ctx: Ctx) -> Response {
    match body(&ctx, None).await {
        Ok(markup) => layout::page(&ctx, ctx.t("backups.title"), Nav::Data, "/backups", markup).into_response(),
        Err(err) => err.into_response(),
    }
}

/// Adds a destination and answers with the page and the recovery kit (it
/// is never stored where it could be shown again).
pub async fn add_destination(ctx: Ctx, Form(form): Form<HashMap<String, String>>) -> Response {
    if let Some(refused) = ctx.refusal(&form) {
        return refused;
    }
    let field = |key: &str| form.get(key).map(|v| v.trim().to_string()).filter(|v| !v.is_empty());
    let kind = field("kind").unwrap_or_default();
    let s3 = kind == "s3";
    let body_json = NewDestination {
        name: field("name").unwrap_or_default(),
        kind: kind.clone(),
        endpoint: field("endpoint").filter(|_| s3),
        bucket: field("bucket").filter(|_| s3),
        prefix: field("prefix").filter(|_| s3),
        region: field("region").filter(|_| s3),
        access_key_id: field("access_key_id").filter(|_| s3),
        secret_access_key: field("secret_access_key").filter(|_| s3),
        path: field("path").filter(|_| !s3),
        ..NewDestination::default()
    };
    let bytes = serde_json::to_vec(&body_json).expect("strings serialize");
    match api::backups::create_destination(State(ctx.state.clone()), axum::Extension(ctx.team.clone()), Ok(Bytes::from(bytes))).await {
        Ok((_, created)) => match body(&ctx, Some(&created.0.recovery_kit)).await {
            Ok(markup) => layout::page(&ctx, ctx.t("backups.title"), Nav::Data, "/backups", markup).into_response(),
            Err(err) => err.into_response(),
        },
        Err(err) => ctx.outcome::<()>(Err(err), "/backups").await,
    }
}

pub async fn run(ctx: Ctx, Path((kind, name)): Path<(String, String)>, Form(form): Form<HashMap<String, String>>) -> Response {
    if let Some(refused) = ctx.refusal(&form) {
        return refused;
    }
    let owned = match kind.as_str() {
        "service" => cloudweb_core::store::Owned::Service,
        _ => cloudweb_core::store::Owned::Volume,
    };
    let need = cloudweb_core::access::Need::Team(cloudweb_core::access::TeamRole::Admin, owned, "name");
    if let Err(err) = cloudweb_core::access::check(&ctx.state, &ctx.access, need, &[("name".to_string(), name.clone())], None).await {
        return ctx.outcome::<()>(Err(err), "/backups").await;
    }
    let result = match kind.as_str() {
        "service" => api::backups::run_service(State(ctx.state.clone()), Path(name)).await.map(|_| ()),
        "volume" => api::backups::run_volume(State(ctx.state.clone()), Path(name)).await.map(|_| ()),
        _ => Err(ApiError::NotFound(format!("no backup target {kind}/{name}"))),
    };
    ctx.outcome(result, "/backups").await
}

pub async fn confirm_restore(ctx: Ctx, Path(id): Path<String>, Form(form): Form<HashMap<String, String>>) -> Response {
    if let Some(refused) = ctx.refusal(&form) {
        return refused;
    }
    let result = api::backups::confirm(State(ctx.state.clone()), Path(id)).await.map(|_| ());
    ctx.outcome(result, "/backups").await
}

/// The banner's alerts: empty unless a destination exists.
pub async fn alerts(state: &cloudweb_core::AppState) -> Vec<String> {
    match state.store.destinations().await {
        Ok(destinations) if !destinations.is_empty() => cloudweb_core::backups::overview(state).await.map(|o| o.alerts).unwrap_or_default(),
        _ => Vec::new(),
    }
}
