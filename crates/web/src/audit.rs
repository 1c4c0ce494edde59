//! `/audit`: the audit log, newest first, for cluster roles (every entry)
//! and teams' owners (their teams' entries), filtered by age, actor,
//! action and team; read through the API's own handler.

use std::collections::HashMap;

use axum::extract::{Query, State};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use maud::html;

use super::layout::{self, Nav};
use super::{api, Ctx};

/// Entries a page shows.
const SHOWN: i64 = 200;

pub async fn page(ctx: Ctx, Query(query): Query<HashMap<String, String>>) -> Response {
    let field = |key: &str| query.get(key).map(|v| v.trim().to_string()).filter(|v| !v.is_empty());
    let since = field("since").unwrap_or_else(|| "24h".to_string());
    let params = api::audit::AuditParams {
        since: Some(since.clone()),
        until: None,
        actor: field("actor"),
        action: field("action"),
        team: field("team"),
        after: None,
        limit: Some(api::audit::MAX_LIMIT),
    };
    let answer = api::audit::list(State(ctx.state.clone()), Extension(ctx.access.clone()), Query(params)).await;
    let entries = match answer {
        Ok(Json(list)) => list.entries,
        Err(err @ (crate::error::ApiError::Forbidden(_) | crate::error::ApiError::BadRequest(_))) => {
            let status = if matches!(err, crate::error::ApiError::Forbidden(_)) { axum::http::StatusCode::FORBIDDEN } else { axum::http::StatusCode::BAD_REQUEST };
            return (status, layout::message(&ctx, &crate::error_text(&err))).into_response();
        }
        Err(err) => return err.into_response(),
    };
    let shown: Vec<_> = entries.iter().rev().take(SHOWN as usize).collect();
    let value = |key: &str| field(key).unwrap_or_default();
    let body = html! {
        p.help { (ctx.t("audit.help")) }
        form.filters method="get" action="/audit" {
            label { (ctx.t("audit.since")) " " input type="text" name="since" value=(since) size="6"; }
            " " label { (ctx.t("audit.actor")) " " input type="text" name="actor" value=(value("actor")) size="12"; }
            " " label { (ctx.t("audit.action")) " " input type="text" name="action" value=(value("action")) size="12"; }
            " " label { (ctx.t("audit.team")) " " input type="text" name="team" value=(value("team")) size="10"; }
            " " button type="submit" { (ctx.t("audit.filter")) }
        }
        table id="audit" {
            thead { tr { th { (ctx.t("audit.at")) } th { (ctx.t("audit.actor")) } th { (ctx.t("audit.team")) } th { (ctx.t("audit.action")) } th { (ctx.t("audit.target")) } th { (ctx.t("audit.result")) } th { (ctx.t("audit.source")) } } }
            tbody {
                @for e in &shown {
                    tr {
                        td { time { (e.at) } }
                        td { (e.actor_name.clone().unwrap_or_else(|| e.actor.clone())) }
                        td { (e.team.as_deref().unwrap_or("–")) }
                        td { code { (e.action) } }
                        td { (e.target.as_deref().unwrap_or("–")) }
                        td { (e.result) }
                        td { (e.source.as_deref().unwrap_or("–")) }
                    }
                }
            }
        }
        @if entries.len() > shown.len() { p.help { (ctx.t("audit.more")) } }
    };
    layout::page(&ctx, ctx.t("audit.title"), Nav::Audit, "/audit", body).into_response()
}
