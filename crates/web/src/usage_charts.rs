//! One node's and one app's charts over 1 h, 24 h or 7 d from the stored
//! history (usage samples and ingress traffic): on the node's page and the
//! app's page, so the Monitoring page can stay an overview of the cluster.

use std::collections::BTreeMap;

use maud::{html, Markup};

use super::chart::{self, Series, Unit};
use super::Ctx;
use crate::error::ApiError;
use crate::store::{AppRow, AppUsageRow, NodeUsageSample, TrafficSample};

#[derive(Debug, Default, serde::Deserialize)]
pub struct RangeQuery {
    range: Option<String>,
}

pub const RANGES: [(&str, i64); 3] = [("1h", 3600), ("24h", 86_400), ("7d", 7 * 86_400)];

impl RangeQuery {
    /// The range asked for (name, seconds); 1 h when absent or unknown.
    pub fn range(&self) -> (&'static str, i64) {
        self.range.as_deref().and_then(|r| RANGES.iter().find(|(name, _)| *name == r)).copied().unwrap_or(RANGES[0])
    }
}

/// The range links, to `path?range=…` (`#anchor` kept).
pub fn range_nav(ctx: &Ctx, path: &str, anchor: &str, current: &str) -> Markup {
    html! {
        nav.ranges aria-label=(ctx.t("mon.range")) {
            (ctx.t("mon.range")) ": "
            @for (name, _) in RANGES {
                a href=(format!("{path}?range={name}{anchor}")) aria-current=[(name == current).then_some("page")] { (name) } " "
            }
        }
    }
}

pub fn words(ctx: &Ctx) -> chart::Words<'_> {
    chart::Words { no_data: ctx.t("mon.no_data"), since: ctx.t("mon.since") }
}

/// How far apart two samples may be and still be joined by a line: two
/// and a half sample periods, so one late sample is not a gap but a lost
/// one is. The period is what the samples show (the median distance: an
/// agent may sample more often than every 30 s); once averaged rows (5 min)
/// are in the window, their period, as finer gaps would not show at that
/// scale anyway.
pub fn max_step_ms(times: &[i64], resolutions: impl Iterator<Item = i64>) -> i64 {
    let coarsest = resolutions.max().unwrap_or(crate::store::USAGE_FINE_SECONDS);
    if coarsest > crate::store::USAGE_FINE_SECONDS {
        return coarsest * 2500;
    }
    let mut steps: Vec<i64> = times.windows(2).map(|w| w[1] - w[0]).filter(|d| *d > 0).collect();
    steps.sort_unstable();
    let period = steps.get(steps.len() / 2).copied().unwrap_or(crate::store::USAGE_FINE_SECONDS * 1000);
    period.max(1000) * 5 / 2
}

/// A node's CPU, memory and disk charts over the last `seconds`.
pub async fn node(ctx: &Ctx, node_id: &str, node_name: &str, seconds: i64) -> Result<Markup, ApiError> {
    let to = ctx.state.clock.now_ms();
    let from = to - seconds * 1000;
    let words = words(ctx);
    let samples = ctx.state.store.node_usage(node_id, from).await?;
    let times: Vec<i64> = samples.iter().map(|s| s.0).collect();
    let step = max_step_ms(&times, samples.iter().map(|s| s.1));
    let series = |pick: &dyn Fn(&NodeUsageSample) -> Option<f64>| Series {
        name: node_name.to_string(),
        points: samples.iter().map(|s| (s.0, pick(s))).collect(),
        max_step_ms: step,
    };
    Ok(html! {
        section.charts data-node=(node_name) {
            div.grid {
                (chart::render(ctx.t("mon.cpu"), &words, &[series(&|s| s.2)], from, to, Unit::Percent))
                (chart::render(ctx.t("mon.memory"), &words, &[series(&|s| s.3.map(|v| v as f64))], from, to, Unit::Bytes))
                (chart::render(ctx.t("mon.disk"), &words, &[series(&|s| s.4.map(|v| v as f64))], from, to, Unit::Bytes))
            }
        }
    })
}

/// An app's CPU, memory and restart charts (a line per node) and, per
/// host it answers on, its traffic over the last `seconds`.
pub async fn app(ctx: &Ctx, app: &AppRow, seconds: i64) -> Result<Markup, ApiError> {
    let state = &ctx.state;
    let to = state.clock.now_ms();
    let from = to - seconds * 1000;
    let words = words(ctx);
    let node_names: BTreeMap<String, String> = state.store.nodes().await?.into_iter().map(|n| (n.id, n.name)).collect();
    let usage = state.store.app_usage(&app.name, from).await?;
    let mut per_node: BTreeMap<&str, Vec<&AppUsageRow>> = BTreeMap::new();
    for row in &usage {
        per_node.entry(row.node_id.as_str()).or_default().push(row);
    }
    let usage_series = |pick: &dyn Fn(&AppUsageRow) -> Option<f64>| -> Vec<Series> {
        per_node
            .iter()
            .map(|(node, rows)| Series {
                name: node_names.get(*node).cloned().unwrap_or_else(|| node.to_string()),
                points: rows.iter().map(|r| (r.at_ms, pick(r))).collect(),
                max_step_ms: max_step_ms(&rows.iter().map(|r| r.at_ms).collect::<Vec<_>>(), rows.iter().map(|r| r.resolution)),
            })
            .collect()
    };
    let cpu = usage_series(&|r| r.cpu_cores);
    let memory = usage_series(&|r| r.mem_bytes.map(|v| v as f64));
    let restarts = usage_series(&|r| r.restarts.map(|v| v as f64));
    let mut hosts = vec![format!("{}.{}", app.name, state.config.base_domain)];
    hosts.extend(serde_json::from_str::<Vec<String>>(&app.domains).unwrap_or_default());
    let mut traffic_charts = Vec::new();
    for host in hosts {
        let samples = state.store.traffic(&host, from).await?;
        let times: Vec<i64> = samples.iter().map(|s| s.0).collect();
        let step = max_step_ms(&times, std::iter::empty());
        let series = |name: &str, pick: &dyn Fn(&TrafficSample) -> Option<f64>| Series {
            name: name.to_string(),
            points: samples.iter().map(|s| (s.0, pick(s))).collect(),
            max_step_ms: step,
        };
        let by_class = [
            series("2xx", &|s| Some(s.2 as f64)),
            series("3xx", &|s| Some(s.3 as f64)),
            series("4xx", &|s| Some(s.4 as f64)),
            series("5xx", &|s| Some(s.5 as f64)),
        ];
        // No requests in a sample: the mean latency is unknown, not 0 ms.
        let latency = [series(&host, &|s| (s.1 > 0).then(|| s.6 / s.1 as f64))];
        let slow = [series(&host, &|s| Some(s.7 as f64))];
        traffic_charts.push(html! {
            h4 { code { (host) } }
            div.grid {
                (chart::render(ctx.t("mon.requests"), &words, &by_class, from, to, Unit::Count))
                (chart::render(ctx.t("mon.latency"), &words, &latency, from, to, Unit::Plain))
                (chart::render(ctx.t("mon.slow"), &words, &slow, from, to, Unit::Count))
            }
        });
    }
    Ok(html! {
        section.charts data-app=(app.name) {
            div.grid {
                (chart::render(ctx.t("mon.app_cpu"), &words, &cpu, from, to, Unit::Plain))
                (chart::render(ctx.t("mon.memory"), &words, &memory, from, to, Unit::Bytes))
                (chart::render(ctx.t("mon.restarts"), &words, &restarts, from, to, Unit::Count))
            }
            @for chart in traffic_charts { (chart) }
        }
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_gap_threshold_follows_the_sample_period() {
        // Samples every 2 s: a 10 s hole is a gap.
        assert_eq!(super::max_step_ms(&[0, 2000, 4000, 6000, 16_000], [30].into_iter()), 5000);
        // Nothing to measure: the agent's default 30 s period.
        assert_eq!(super::max_step_ms(&[0], [30].into_iter()), 75_000);
        // Averaged rows in the window: their 5-minute period.
        assert_eq!(super::max_step_ms(&[0, 30_000], [30, 300].into_iter()), 750_000);
    }
}
