//! One node's page (`/nodes/{id}`): its row of the node table (live, with
//! its actions), why it needs attention if it does, and its CPU, memory
//! and disk charts over the chosen range.

use std::collections::HashMap;

use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use maud::html;

use super::layout::{self, Nav};
use super::usage_charts::{self, RangeQuery};
use super::{nodes, Ctx};
use crate::api;
use crate::error::ApiError;

pub async fn page(ctx: Ctx, Path(id): Path<String>, Query(query): Query<RangeQuery>) -> Response {
    let node = match api::nodes::show(State(ctx.state.clone()), Path(id)).await {
        Ok(Json(node)) => node,
        Err(ApiError::NotFound(_)) => return super::not_found(&ctx),
        Err(err) => return err.into_response(),
    };
    let instances = match ctx.state.store.active_instances().await {
        Ok(all) => all.iter().filter(|i| i.node_id.as_deref() == Some(node.id.as_str())).count(),
        Err(err) => return ApiError::from(err).into_response(),
    };
    let (range_name, seconds) = query.range();
    let charts = match usage_charts::node(&ctx, &node.id, &node.name, seconds).await {
        Ok(charts) => charts,
        Err(err) => return err.into_response(),
    };
    let count: HashMap<String, usize> = [(node.id.clone(), instances)].into_iter().collect();
    let rows = nodes::rows(ctx.lang, std::slice::from_ref(&node), &count, ctx.state.clock.now_ms());
    let live = format!("/nodes/table?q={}", node.id);
    let here = format!("/nodes/{}?range={range_name}", node.id);
    let body = html! {
        p { a href="/nodes" { (ctx.t("node.back")) } }
        @if let Some(reason) = nodes::attention(ctx.lang, &node) {
            p.warning data-attention { (ctx.t("nodes.attention")) ": " (reason) }
        }
        (nodes::table(&ctx, &live, rows))
        dl.facts {
            dt { (ctx.t("node.joined")) } dd { (node.joined_at) }
            dt { (ctx.t("node.features")) } dd { @if node.features.is_empty() { "–" } @else { (node.features.join(", ")) } }
            dt { (ctx.t("node.certificate")) } dd { code { (node.certificate.sha256) } }
        }
        h2 id="charts" { (ctx.t("mon.title")) }
        (usage_charts::range_nav(&ctx, &format!("/nodes/{}", node.id), "#charts", range_name))
        p.help { (ctx.t("mon.gap_note")) }
        (charts)
    };
    layout::page(&ctx, &node.name, Nav::Nodes, &here, body).into_response()
}
