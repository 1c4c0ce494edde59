//! The Monitoring page: an overview of the cluster that stays small at
//! any size (issue 21 item 5). The whole cluster's CPU, memory and disk
//! over 1 h, 24 h or 7 d in one query, the nodes that need attention, and
//! the top nodes, apps and hosts by usage and traffic, each linking to
//! the node's or app's own page, where its charts are.

use std::collections::HashMap;

use axum::extract::Query;
use axum::response::{IntoResponse, Response};
use maud::{html, Markup};

use super::chart::{self, Series, Unit};
use super::layout::{self, Nav};
use super::usage_charts::{self, RangeQuery};
use super::{format, nodes, Ctx};
use crate::error::ApiError;
use crate::store::ClusterUsageBucket;

/// Rows in each top-N table.
const TOP: usize = 10;
/// Nodes needing attention listed here; the Nodes page lists them all.
const ATTENTION: usize = 20;
/// Points in a cluster chart, about.
const BUCKETS: i64 = 120;
/// How recent the app usage behind the top apps is.
const RECENT_MS: i64 = 120_000;

pub async fn page(ctx: Ctx, Query(query): Query<RangeQuery>) -> Response {
    let range = query.range();
    match body(&ctx, range).await {
        Ok(body) => layout::page(&ctx, ctx.t("mon.title"), Nav::Monitoring, &format!("/monitoring?range={}", range.0), body).into_response(),
        Err(err) => err.into_response(),
    }
}

/// The bucket width of a range: about [`BUCKETS`] points, whole multiples
/// of the 30 s sample period.
fn bucket_ms(seconds: i64) -> i64 {
    let period = crate::store::USAGE_FINE_SECONDS * 1000;
    ((seconds * 1000 / BUCKETS) / period).max(1) * period
}

fn cluster_series(name: &str, buckets: &[ClusterUsageBucket], bucket: i64, pick: &dyn Fn(&ClusterUsageBucket) -> Option<f64>) -> Series {
    Series { name: name.to_string(), points: buckets.iter().map(|b| (b.at_ms, pick(b))).collect(), max_step_ms: bucket * 5 / 2 }
}

/// A node's share of a capacity in percent.
fn share(used: Option<u64>, total: Option<u64>) -> Option<f64> {
    match (used, total) {
        (Some(used), Some(total)) if total > 0 => Some(used as f64 * 100.0 / total as f64),
        _ => None,
    }
}

/// The `TOP` largest of `rows` by `key` (rows without one left out).
fn top<T>(rows: &[T], key: impl Fn(&T) -> Option<f64>) -> Vec<(&T, f64)> {
    let mut ranked: Vec<(&T, f64)> = rows.iter().filter_map(|r| key(r).filter(|v| v.is_finite()).map(|v| (r, v))).collect();
    ranked.sort_by(|a, b| b.1.total_cmp(&a.1));
    ranked.truncate(TOP);
    ranked
}

async fn body(ctx: &Ctx, (range_name, seconds): (&str, i64)) -> Result<Markup, ApiError> {
    let state = &ctx.state;
    let to = state.clock.now_ms();
    let from = to - seconds * 1000;
    let words = usage_charts::words(ctx);
    let (node_views, instances) = nodes::load(state).await?;
    let apps = state.store.apps().await?;

    let bucket = bucket_ms(seconds);
    let buckets = state.store.cluster_usage(from, bucket).await?;
    let cpu = cluster_series(ctx.t("mon.cluster"), &buckets, bucket, &|b| b.cpu_pct);
    let memory = cluster_series(ctx.t("mon.cluster"), &buckets, bucket, &|b| b.mem_used.map(|v| v as f64));
    let disk = cluster_series(ctx.t("mon.cluster"), &buckets, bucket, &|b| b.disk_used.map(|v| v as f64));

    let mut by_state: HashMap<&str, usize> = HashMap::new();
    for node in &node_views {
        *by_state.entry(node.state.as_str()).or_default() += 1;
    }
    let attention: Vec<(&cloudweb_api_types::nodes::NodeView, String)> =
        node_views.iter().filter_map(|n| nodes::attention(ctx.lang, n).map(|reason| (n, reason))).collect();
    let sample = |n: &cloudweb_api_types::nodes::NodeView| n.metrics.as_ref().and_then(|m| m.sample.node.clone());
    let top_cpu = top(&node_views, |n| sample(n).and_then(|s| s.cpu_pct));
    let top_memory = top(&node_views, |n| share(sample(n).and_then(|s| s.mem_used), n.capacity.map(|c| c.mem_bytes)));

    let app_usage = state.store.apps_recent_usage(to - RECENT_MS).await?;
    let top_app_cpu = top(&app_usage, |a| a.cpu_cores);
    let top_app_memory = top(&app_usage, |a| a.mem_bytes.map(|m| m as f64));
    let mut host_app: HashMap<String, String> = HashMap::new();
    for app in &apps {
        host_app.insert(format!("{}.{}", app.name, state.config.base_domain), app.name.clone());
        for domain in serde_json::from_str::<Vec<String>>(&app.domains).unwrap_or_default() {
            host_app.insert(domain, app.name.clone());
        }
    }
    let hosts = state.store.busiest_hosts(from, TOP as i64).await?;
    let node_link = |n: &cloudweb_api_types::nodes::NodeView| html! { a href=(format!("/nodes/{}", n.id)) { (n.name) } };
    let app_link = |name: &str| html! { a href=(format!("/apps/{name}#charts")) { (name) } };

    Ok(html! {
        (usage_charts::range_nav(ctx, "/monitoring", "", range_name))
        section.summary {
            dl.facts {
                dt { (ctx.t("mon.nodes")) }
                dd data-nodes=(node_views.len()) {
                    (node_views.len())
                    @for (key, label) in [("ready", "state.ready"), ("draining", "state.draining"), ("unreachable", "state.unreachable")] {
                        @if let Some(count) = by_state.get(key) { " · " a href=(format!("/nodes?filter={key}")) { (count) " " (ctx.t(label)) } }
                    }
                }
                dt { (ctx.t("mon.apps")) } dd data-apps=(apps.len()) { a href="/apps" { (apps.len()) } }
                dt { (ctx.t("nodes.instances")) } dd { (instances.values().sum::<usize>()) }
            }
        }
        h2 { (ctx.t("mon.cluster_usage")) }
        p.help { (ctx.t("mon.cluster_note")) " " (ctx.t("mon.gap_note")) }
        div.grid {
            (chart::render(ctx.t("mon.cpu_mean"), &words, &[cpu], from, to, Unit::Percent))
            (chart::render(ctx.t("mon.memory"), &words, &[memory], from, to, Unit::Bytes))
            (chart::render(ctx.t("mon.disk"), &words, &[disk], from, to, Unit::Bytes))
        }
        h2 id="attention" { (ctx.t("mon.attention")) }
        @if attention.is_empty() {
            p.empty data-attention="0" { (ctx.t("mon.attention_none")) }
        } @else {
            ul.attention data-attention=(attention.len()) {
                @for (node, reason) in attention.iter().take(ATTENTION) {
                    li { (node_link(node)) ": " (reason) }
                }
            }
            @if attention.len() > ATTENTION {
                p { a href="/nodes?filter=attention" { (ctx.t("mon.attention_all").replace("{count}", &attention.len().to_string())) } }
            }
        }
        div.grid {
            (top_table(ctx.t("mon.top_node_cpu"), ctx.t("nodes.name"), ctx.t("nodes.cpu"), top_cpu.iter().map(|(n, v)| (node_link(n), format!("{v:.0}%")))))
            (top_table(ctx.t("mon.top_node_memory"), ctx.t("nodes.name"), ctx.t("nodes.memory"), top_memory.iter().map(|(n, v)| (node_link(n), format!("{v:.0}%")))))
        }
        div.grid {
            (top_table(ctx.t("mon.top_app_cpu"), ctx.t("apps.name"), ctx.t("mon.app_cpu"), top_app_cpu.iter().map(|(a, v)| (app_link(&a.app), format!("{v:.2}")))))
            (top_table(ctx.t("mon.top_app_memory"), ctx.t("apps.name"), ctx.t("mon.memory"), top_app_memory.iter().map(|(a, v)| (app_link(&a.app), format::bytes(*v as u64)))))
            (top_table(ctx.t("mon.top_hosts"), ctx.t("mon.host"), ctx.t("mon.requests_5xx"), hosts.iter().map(|(host, requests, r5xx)| {
                let name = match host_app.get(host) { Some(app) => html! { a href=(format!("/apps/{app}#charts")) { code { (host) } } }, None => html! { code { (host) } } };
                (name, format!("{requests} / {r5xx}"))
            })))
        }
    })
}

/// A small ranked table; "none" when it has no rows.
fn top_table(title: &str, name: &str, value: &str, rows: impl Iterator<Item = (Markup, String)>) -> Markup {
    let rows: Vec<(Markup, String)> = rows.collect();
    html! {
        figure.top {
            figcaption { (title) }
            @if rows.is_empty() {
                p.empty { "–" }
            } @else {
                table {
                    thead { tr { th scope="col" { (name) } th.num scope="col" { (value) } } }
                    tbody { @for (who, figure) in rows { tr { th scope="row" { (who) } td.num { (figure) } } } }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn buckets_are_whole_sample_periods_of_about_a_120th_of_the_range() {
        assert_eq!(super::bucket_ms(3600), 30_000);
        assert_eq!(super::bucket_ms(86_400), 720_000);
        assert_eq!(super::bucket_ms(7 * 86_400), 5_040_000);
    }

    #[test]
    fn the_top_rows_are_the_largest_known_values() {
        let rows = [Some(5.0), None, Some(f64::NAN), Some(9.0), Some(1.0)];
        let ranked = super::top(&rows, |r| *r);
        assert_eq!(ranked.iter().map(|(_, v)| *v).collect::<Vec<_>>(), vec![9.0, 5.0, 1.0]);
    }
}
