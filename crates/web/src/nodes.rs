//! The Nodes page: the node table (live over server-sent events), the
//! join token, and drain / reactivate / remove with confirmation.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, Query, State};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Redirect, Response};
use axum::{Form, Json};
use futures_util::stream::{self, Stream};
use maud::{html, Markup};
use cloudweb_api_types::nodes::{JoinToken, NodeList, NodeView};

use super::format;
use super::i18n::Lang;
use super::layout::{self, Nav};
use super::flash::Flash;
use super::paging::{self, ListQuery};
use super::{csrf_field, error_text, Ctx};
use crate::api;
use crate::error::ApiError;
use crate::AppState;

/// The nodes as the API shows them, with their active instance counts.
pub async fn load(state: &Arc<AppState>) -> Result<(Vec<NodeView>, HashMap<String, usize>), ApiError> {
    let Json(NodeList { nodes }) = api::nodes::list(State(state.clone())).await?;
    let mut instances: HashMap<String, usize> = HashMap::new();
    for instance in state.store.active_instances().await? {
        if let Some(node) = instance.node_id {
            *instances.entry(node).or_default() += 1;
        }
    }
    Ok((nodes, instances))
}

fn state_key(state: &str) -> &'static str {
    match state {
        "ready" => "state.ready",
        "draining" => "state.draining",
        _ => "state.unreachable",
    }
}

fn health_key(health: &str) -> &'static str {
    match health {
        "healthy" => "health.healthy",
        "degraded" => "health.degraded",
        _ => "health.unknown",
    }
}

fn used_of(used: Option<u64>, total: Option<u64>) -> String {
    match (used, total) {
        (Some(used), Some(total)) => format!("{} / {}", format::bytes(used), format::bytes(total)),
        (Some(used), None) => format::bytes(used),
        (None, Some(total)) => format!("? / {}", format::bytes(total)),
        (None, None) => "–".to_string(),
    }
}

/// Whether a node runs without the WireGuard mesh: its heartbeat's health
/// names no mesh and no mesh backend (`run --mesh-mode off`, or a mesh
/// that could not start). Its cluster address is then only a reservation
/// nothing answers on. Before the first health report it is not known.
fn mesh_off(node: &NodeView) -> bool {
    use cloudweb_protocol::features::{MESH_KERNEL, MESH_USERSPACE};
    node.health_report.as_ref().is_some_and(|health| health.mesh.is_none())
        && !node.features.iter().any(|f| f == MESH_KERNEL || f == MESH_USERSPACE)
}

/// The table body: one row per node (and a row of apps a drain could not
/// move, under its node).
pub fn rows(lang: Lang, nodes: &[NodeView], instances: &HashMap<String, usize>, now_ms: i64) -> Markup {
    html! {
        @for node in nodes {
            @let id = &node.id;
            @let state = &node.state;
            @let health = &node.health;
            @let sample = node.metrics.as_ref().and_then(|m| m.sample.node.as_ref());
            @let cpu = sample.and_then(|s| s.cpu_pct);
            @let cores = node.capacity.map(|c| c.cpu_cores);
            @let mem = sample.and_then(|s| s.mem_used);
            @let mem_total = node.capacity.map(|c| c.mem_bytes);
            @let disk = sample.and_then(|s| s.disk_used);
            @let disk_total = node.capacity.map(|c| c.disk_bytes);
            @let mesh = node.health_report.as_ref().and_then(|h| h.mesh.as_ref());
            @let heartbeat = node.last_heartbeat.as_deref().and_then(crate::clock::parse_rfc3339_ms);
            tr data-node=(id) data-state=(state) data-health=(health) {
                th scope="row" { a href=(format!("/nodes/{id}")) { (node.name) } @if node.ingress { " " small.tag { (lang.t("nodes.ingress")) } } }
                td data-label=(lang.t("nodes.address")) {
                    @if mesh_off(node) { span.mesh-off title=(lang.t("nodes.mesh_off_help")) { "– " small.tag { (lang.t("nodes.mesh_off")) } } }
                    @else { code { (node.mesh_address) } }
                    br; small { (node.hostname) }
                }
                td data-label=(lang.t("nodes.state")) { span class=(format!("badge {state}")) { (lang.t(state_key(state))) } }
                td.num data-label=(lang.t("nodes.cpu")) { @match cpu { Some(cpu) => { (format!("{cpu:.0}%")) }, None => { "–" } } @if let Some(cores) = cores { br; small { (cores) " " (lang.t("nodes.cores")) } } }
                td.num data-label=(lang.t("nodes.memory")) { (used_of(mem, mem_total)) }
                td.num data-label=(lang.t("nodes.disk")) { (used_of(disk, disk_total)) }
                td.num data-label=(lang.t("nodes.instances")) { (instances.get(id).copied().unwrap_or(0)) }
                td.health data-label=(lang.t("nodes.health")) {
                    span class=(format!("badge {health}")) { (lang.t(health_key(health))) }
                    @if let Some(reason) = &node.health_reason { " (" (reason) ")" }
                    @if let Some(mesh) = mesh {
                        " · " (lang.t("health.mesh")) " "
                        (mesh.connected) "/" (mesh.peers)
                    }
                }
                td data-label=(lang.t("nodes.version")) { (node.version.as_deref().unwrap_or("–")) }
                td data-label=(lang.t("nodes.heartbeat")) {
                    @match heartbeat {
                        Some(at) => { time datetime=(node.last_heartbeat.as_deref().unwrap_or("")) title=(format::datetime(at)) { (lang.t("nodes.ago").replace("{age}", &format::age(now_ms - at))) } },
                        None => { (lang.t("nodes.never")) },
                    }
                }
                td.actions data-label=(lang.t("nodes.actions")) {
                    @if state == "draining" {
                        a.button href=(format!("/nodes/{id}/undrain")) { (lang.t("nodes.reactivate")) }
                    } @else {
                        a.button href=(format!("/nodes/{id}/drain")) { (lang.t("nodes.drain")) }
                    }
                    " "
                    a.button.danger href=(format!("/nodes/{id}/remove")) { (lang.t("nodes.remove")) }
                }
            }
            @if !node.waiting.is_empty() {
                tr.waiting {
                    td colspan="11" {
                        (lang.t("nodes.waiting")) " "
                        @for (i, entry) in node.waiting.iter().enumerate() {
                            @if i > 0 { "; " }
                            strong { (entry.app) } ": " (entry.reason)
                        }
                    }
                }
            }
        }
    }
}

pub fn table(ctx: &Ctx, live: &str, body: Markup) -> Markup {
    html! {
        div.scroll {
            table.nodes {
                thead { tr {
                    th scope="col" { (ctx.t("nodes.name")) }
                    th scope="col" { (ctx.t("nodes.address")) }
                    th scope="col" { (ctx.t("nodes.state")) }
                    th scope="col" { (ctx.t("nodes.cpu")) }
                    th scope="col" { (ctx.t("nodes.memory")) }
                    th scope="col" { (ctx.t("nodes.disk")) }
                    th scope="col" { (ctx.t("nodes.instances")) }
                    th scope="col" { (ctx.t("nodes.health")) }
                    th scope="col" { (ctx.t("nodes.version")) }
                    th scope="col" { (ctx.t("nodes.heartbeat")) }
                    th scope="col" { (ctx.t("nodes.actions")) }
                } }
                tbody id="node-rows" data-live=(live) { (body) }
            }
        }
    }
}

/// Why a node needs someone's attention, if it does: not ready, not
/// healthy, or CPU, memory or disk at 90 % or more.
pub fn attention(lang: Lang, node: &NodeView) -> Option<String> {
    if node.state != "ready" {
        return Some(lang.t(state_key(&node.state)).to_string());
    }
    if node.health != "healthy" {
        return Some(match &node.health_reason {
            Some(reason) => format!("{} ({reason})", lang.t(health_key(&node.health))),
            None => lang.t(health_key(&node.health)).to_string(),
        });
    }
    let sample = node.metrics.as_ref().and_then(|m| m.sample.node.as_ref())?;
    let share = |used: Option<u64>, total: Option<u64>| match (used, total) {
        (Some(used), Some(total)) if total > 0 => Some(used as f64 * 100.0 / total as f64),
        _ => None,
    };
    let high = [
        ("nodes.cpu", sample.cpu_pct),
        ("nodes.memory", share(sample.mem_used, node.capacity.map(|c| c.mem_bytes))),
        ("nodes.disk", share(sample.disk_used, node.capacity.map(|c| c.disk_bytes))),
    ];
    let found: Vec<String> = high.iter().filter_map(|(key, pct)| pct.filter(|p| *p >= 90.0).map(|p| format!("{} {p:.0}%", lang.t(key)))).collect();
    (!found.is_empty()).then(|| found.join(", "))
}

/// The filters of the node list.
const FILTERS: [&str; 4] = ["ready", "draining", "unreachable", "attention"];

/// The nodes the list's query selects.
fn select(lang: Lang, nodes: Vec<NodeView>, query: &ListQuery) -> Vec<NodeView> {
    let search = query.search();
    let filter = query.filter(&FILTERS);
    nodes
        .into_iter()
        .filter(|n| paging::matches(search.as_deref(), &[&n.name, &n.hostname, &n.id]))
        .filter(|n| match filter {
            None => true,
            Some("attention") => attention(lang, n).is_some(),
            Some(state) => n.state == state,
        })
        .collect()
}

pub async fn page(ctx: Ctx, Query(query): Query<ListQuery>) -> Response {
    let (nodes, instances) = match load(&ctx.state).await {
        Ok(loaded) => loaded,
        Err(err) => return err.into_response(),
    };
    let now_ms = ctx.state.clock.now_ms();
    let cluster_empty = nodes.is_empty();
    // Replicas only when there are several (PostgreSQL); unreadable, the
    // node list still shows.
    let planes = api::control_planes::list(State(ctx.state.clone())).await.map(|Json(list)| list).ok().filter(|list| list.replicas.len() > 1);
    let selected = select(ctx.lang, nodes, &query);
    let paged = paging::page_of(&selected, query.page());
    let filters: Vec<(&str, &str)> = FILTERS.iter().map(|f| (*f, ctx.t(filter_key(f)))).collect();
    let qs = query.at_page(paged.info.page);
    let live = if qs.is_empty() { "/nodes/table".to_string() } else { format!("/nodes/table?{qs}") };
    let here = if qs.is_empty() { "/nodes".to_string() } else { format!("/nodes?{qs}") };
    let body = html! {
        form.inline method="post" action="/nodes/join-token" {
            (csrf_field(&ctx))
            button type="submit" { (ctx.t("nodes.join_token")) }
        }
        @if cluster_empty { p.empty id="nodes-empty" { (ctx.t("nodes.empty")) } }
        @else { (paging::search_form(&ctx, "/nodes", &query, &filters)) }
        (table(&ctx, &live, rows(ctx.lang, paged.rows, &instances, now_ms)))
        @if !cluster_empty { (paging::pager(&ctx, "/nodes", &query, &paged.info)) }
        @if let Some(planes) = &planes { (control_planes(&ctx, planes)) }
    };
    layout::page(&ctx, ctx.t("nodes.title"), Nav::Nodes, &here, body).into_response()
}

/// The control plane's replicas: which leads, and whether each is live.
fn control_planes(ctx: &Ctx, list: &cloudweb_api_types::control_planes::ControlPlaneList) -> Markup {
    html! {
        section id="control-planes" {
            h2 { (ctx.t("planes.title")) }
            div.scroll { table.planes {
                thead { tr {
                    th scope="col" { (ctx.t("planes.url")) }
                    th scope="col" { (ctx.t("planes.role")) }
                    th scope="col" { (ctx.t("nodes.state")) }
                    th scope="col" { (ctx.t("planes.last_seen")) }
                } }
                tbody { @for r in &list.replicas {
                    tr data-url=(r.url) {
                        td { (r.url) @if r.this_replica { " " small { (ctx.t("planes.this")) } } }
                        td { @if r.leader { (ctx.t("planes.leader")) @if let Some(term) = list.term { " (" (ctx.t("planes.term")) " " (term) ")" } } @else { (ctx.t("planes.follower")) } }
                        td { span class={ "badge " (r.state) } { (ctx.t(if r.state == "live" { "planes.live" } else { "state.unreachable" })) } }
                        td { (r.last_seen) }
                    }
                } }
            } }
        }
    }
}

fn filter_key(filter: &str) -> &'static str {
    match filter {
        "ready" => "state.ready",
        "draining" => "state.draining",
        "unreachable" => "state.unreachable",
        _ => "nodes.attention",
    }
}

/// `event: rows` with the table body of the page's query (search, filter,
/// page), whenever it changes (checked every two seconds); the page's
/// script swaps it in. The rows are rendered here like on the page, so
/// the script never builds HTML.
pub async fn table_stream(ctx: Ctx, Query(query): Query<ListQuery>) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let lang = query.lang.as_deref().and_then(Lang::parse).unwrap_or(ctx.lang);
    let state = ctx.state.clone();
    let events = stream::unfold((state, String::new(), false), move |(state, last, wait)| {
        let query = query.clone();
        async move {
        let mut wait = wait;
        loop {
            if wait {
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
            wait = true;
            let Ok((nodes, instances)) = load(&state).await else { continue };
            let selected = select(lang, nodes, &query);
            let html = rows(lang, paging::page_of(&selected, query.page()).rows, &instances, state.clock.now_ms()).into_string();
            if html != last {
                let event = Event::default().event("rows").data(html.clone());
                return Some((Ok(event), (state, html, true)));
            }
        }
        }
    });
    Sse::new(events).keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
}

pub async fn join_token(ctx: Ctx, Form(form): Form<HashMap<String, String>>) -> Response {
    if let Some(refused) = ctx.refusal(&form) {
        return refused;
    }
    match api::join_tokens::create(State(ctx.state.clone())).await {
        Ok((_, Json(JoinToken { command, expires_at, .. }))) => ctx.flash(Flash::JoinCommand { command, expires_at }).await,
        Err(err) => ctx.flash(Flash::Error(error_text(&err))).await,
    }
    Redirect::to("/nodes#join").into_response()
}

fn action_words(action: &str) -> Option<(&'static str, &'static str)> {
    match action {
        "drain" => Some(("nodes.drain", "nodes.confirm_drain")),
        "undrain" => Some(("nodes.reactivate", "nodes.confirm_reactivate")),
        "remove" => Some(("nodes.remove", "nodes.confirm_remove")),
        _ => None,
    }
}

pub async fn confirm(ctx: Ctx, Path((id, action)): Path<(String, String)>) -> Response {
    let Some((title, question)) = action_words(&action) else { return super::not_found(&ctx) };
    let Ok(Some(node)) = ctx.state.store.node(&id).await else { return super::not_found(&ctx) };
    let extra = if action == "remove" {
        html! {
            p {
                input id="force" type="checkbox" name="force" value="1";
                " " label for="force" { (ctx.t("nodes.force")) }
            }
            p.warning { (ctx.t("nodes.force_warning")) }
        }
    } else {
        html! {}
    };
    let title = format!("{}: {}", ctx.t(title), node.name);
    let here = format!("/nodes/{id}/{action}");
    layout::confirm(&ctx, &title, Nav::Nodes, &here, ctx.t(question), extra, "/nodes").into_response()
}

pub async fn act(ctx: Ctx, Path((id, action)): Path<(String, String)>, Form(form): Form<HashMap<String, String>>) -> Response {
    if let Some(refused) = ctx.refusal(&form) {
        return refused;
    }
    let state = State(ctx.state.clone());
    let result = match action.as_str() {
        "drain" => api::nodes::drain(state, Path(id.clone())).await.map(|Json(view)| view.waiting),
        "undrain" => api::nodes::undrain(state, Path(id.clone())).await.map(|_| Vec::new()),
        "remove" => {
            let force = form.get("force").map(|f| f == "1").unwrap_or(false);
            api::nodes::remove(state, Path(id.clone()), Query(api::nodes::RemoveQuery::new(force))).await.map(|_| Vec::new())
        }
        _ => return super::not_found(&ctx),
    };
    let waiting: Vec<(String, String)> = result.as_ref().map(|waiting| waiting.iter().map(|w| (w.app.clone(), w.reason.clone())).collect()).unwrap_or_default();
    if !waiting.is_empty() {
        ctx.flash(Flash::Waiting(waiting)).await;
        return Redirect::to("/nodes").into_response();
    }
    ctx.outcome(result, "/nodes").await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(health: serde_json::Value, features: &[&str]) -> NodeView {
        serde_json::from_value(serde_json::json!({
            "id": "n-1", "name": "edge", "hostname": "edge-host", "state": "ready", "eligible": true, "ingress": false,
            "mesh_address": "10.77.0.2", "joined_at": "2026-01-01T00:00:00Z", "health": "healthy",
            "health_report": health, "features": features, "waiting": [],
            "certificate": {"sha256": "ab"},
        }))
        .unwrap()
    }

    #[test]
    fn a_node_without_the_mesh_shows_no_cluster_address() {
        let render = |node: NodeView| rows(Lang::En, &[node], &HashMap::new(), 0).into_string();
        let off = render(node(serde_json::json!({"features": ["static-sites"]}), &["static-sites"]));
        assert!(!off.contains("10.77.0.2") && off.contains("mesh off") && off.contains("edge-host"), "{off}");
        let on = render(node(serde_json::json!({"mesh": {"peers": 1, "connected": 1}}), &["mesh-kernel"]));
        assert!(on.contains("<code>10.77.0.2</code>") && !on.contains("mesh off"), "{on}");
        // Before the first health report the address is shown as assigned.
        let unknown = render(node(serde_json::Value::Null, &[]));
        assert!(unknown.contains("<code>10.77.0.2</code>"), "{unknown}");
        assert!(rows(Lang::Es, &[node(serde_json::json!({}), &[])], &HashMap::new(), 0).into_string().contains("malla desactivada"));
    }

    #[test]
    fn a_node_needs_attention_when_not_ready_not_healthy_or_nearly_full() {
        let with = |change: serde_json::Value| {
            let mut value = serde_json::to_value(node(serde_json::json!({}), &[])).unwrap();
            value["capacity"] = serde_json::json!({"cpu_cores": 2, "mem_bytes": 1000, "disk_bytes": 1000});
            value["metrics"] = serde_json::json!({"at": "2026-01-01T00:00:00Z", "sample": {"node": {"cpu_pct": 20.0, "mem_used": 100, "disk_used": 100}, "containers": []}});
            for (key, v) in change.as_object().unwrap() {
                value[key] = v.clone();
            }
            serde_json::from_value::<NodeView>(value).unwrap()
        };
        assert_eq!(attention(Lang::En, &with(serde_json::json!({}))), None);
        assert_eq!(attention(Lang::En, &with(serde_json::json!({"state": "draining"}))).as_deref(), Some("draining"));
        let degraded = attention(Lang::En, &with(serde_json::json!({"health": "degraded", "health_reason": "registry unreachable"}))).unwrap();
        assert!(degraded.contains("degraded") && degraded.contains("registry unreachable"), "{degraded}");
        let full = with(serde_json::json!({"metrics": {"at": "2026-01-01T00:00:00Z", "sample": {"node": {"cpu_pct": 95.0, "mem_used": 950, "disk_used": 100}, "containers": []}}}));
        assert_eq!(attention(Lang::En, &full).as_deref(), Some("CPU 95%, Memory 95%"));
    }
}
