//! An app's runtime logs in the dashboard: on the app page, the live tail
//! and a search form; at `/apps/{name}/logs?…`, the search's results (the
//! same parameters and checks as `GET /api/apps/{name}/logs`), a link to
//! the older lines, and a live tail of the new lines that match, which the
//! page's script follows through the API's stream with the same filters.

use axum::extract::{Path, Query};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use cloudweb_api_types::traffic::{RuntimeLine, RuntimeLogs};
use maud::{html, Markup};

use super::{layout, Ctx};
use crate::api::runtime_logs::{line_view, search_page, LogsQuery};

/// Lines of the tail rendered with the app page.
const PAGE_RUNTIME_LINES: usize = 200;
/// Lines of a search page.
const SEARCH_PAGE: usize = 200;

/// The app page's section: the search form and the live tail.
pub async fn app_section(ctx: &Ctx, app: &str) -> Markup {
    let lines: Vec<RuntimeLine> = ctx.state.runtime_logs.tail(app, 0, PAGE_RUNTIME_LINES, None).await.iter().map(line_view).collect();
    let after = lines.last().map_or(ctx.state.runtime_logs.last_seq(), |l| l.seq);
    html! {
        section {
            h2 id="logs" { (ctx.t("apps.runtime_logs")) }
            (form(ctx, app, &LogsQuery::default()))
            p.help { (ctx.t("apps.runtime_logs_help")) }
            (log_view(ctx, &lines, Some(format!("/api/apps/{app}/logs?follow=1")), after))
        }
    }
}

fn form(ctx: &Ctx, app: &str, query: &LogsQuery) -> Markup {
    let stream = query.stream.as_deref().unwrap_or("");
    html! {
        form.inline id="log-search" method="get" action=(format!("/apps/{app}/logs")) role="search" {
            label for="log-q" { (ctx.t("logs.words")) }
            input id="log-q" name="q" size="16" maxlength="1000" value=[query.q.as_deref()];
            label for="log-grep" { (ctx.t("logs.grep")) }
            input id="log-grep" name="grep" size="16" maxlength="500" placeholder="ERROR|panic" value=[query.grep.as_deref()];
            label for="log-since" { (ctx.t("logs.since")) }
            input id="log-since" name="since" size="8" maxlength="40" placeholder="2h" value=[query.since.as_deref()];
            label for="log-until" { (ctx.t("logs.until")) }
            input id="log-until" name="until" size="8" maxlength="40" placeholder="30m" value=[query.until.as_deref()];
            label for="log-instance" { (ctx.t("logs.instance")) }
            input id="log-instance" name="instance" type="number" min="1" max="100" size="3" value=[query.instance.as_deref()];
            label for="log-stream" { (ctx.t("logs.stream")) }
            select id="log-stream" name="stream" {
                option value="" selected[stream.is_empty()] { (ctx.t("logs.any_stream")) }
                @for s in ["stdout", "stderr", "agent"] { option value=(s) selected[stream == s] { (s) } }
            }
            button type="submit" { (ctx.t("logs.search")) }
        }
    }
}

/// Lines (oldest first) in the log view; with `follow`, the script
/// appends the lines after `after` that the stream sends.
fn log_view(ctx: &Ctx, lines: &[RuntimeLine], follow: Option<String>, after: u64) -> Markup {
    html! {
        @if lines.is_empty() { p.empty id="runtime-log-empty" { (ctx.t("apps.runtime_logs_empty")) } }
        pre.log id="runtime-log" tabindex="0" data-follow=[follow] data-after=(after) {
            @for line in lines {
                span class=(format!("line {}", if line.stream == "stderr" { "stderr" } else { "stdout" })) title=(format!("{} · {} #{}", line.ts, line.node_id, line.instance)) { (line.line) "\n" }
            }
        }
    }
}

/// The query string of a search, without `cursor` and `follow`.
fn filters(query: &LogsQuery) -> Vec<(&'static str, String)> {
    let fields = [
        ("q", &query.q),
        ("grep", &query.grep),
        ("since", &query.since),
        ("until", &query.until),
        ("instance", &query.instance),
        ("stream", &query.stream),
        ("deployment", &query.deployment),
    ];
    fields.into_iter().filter_map(|(k, v)| v.as_ref().filter(|v| !v.is_empty()).map(|v| (k, v.clone()))).collect()
}

/// `GET /apps/{name}/logs?q=&grep=&since=&until=&instance=&stream=&cursor=`.
pub async fn page(ctx: Ctx, Path(name): Path<String>, Query(mut query): Query<LogsQuery>) -> Response {
    match ctx.state.store.app(&name).await {
        Ok(Some(_)) => {}
        Ok(None) => return super::not_found(&ctx),
        Err(err) => return crate::error::ApiError::from(err).into_response(),
    }
    // An empty field of the form is no filter.
    for field in [&mut query.q, &mut query.grep, &mut query.since, &mut query.until, &mut query.instance, &mut query.stream, &mut query.cursor] {
        if field.as_deref().is_some_and(|v| v.trim().is_empty()) {
            *field = None;
        }
    }
    let now_seq = ctx.state.runtime_logs.last_seq();
    let limit = SEARCH_PAGE.to_string();
    query.limit = Some(limit);
    let checked = query.raw().check(ctx.state.clock.now_ms().saturating_mul(1_000_000), SEARCH_PAGE);
    let result: Result<RuntimeLogs, crate::error::ApiError> = match checked {
        Ok(search) => search_page(&ctx.state, &name, &search).await,
        Err(err) => Err(err),
    };
    let pairs = filters(&query);
    let encode = |extra: Option<(&str, &str)>| {
        let mut serializer = url::form_urlencoded::Serializer::new(String::new());
        serializer.extend_pairs(pairs.iter().map(|(k, v)| (*k, v.as_str())));
        if let Some((k, v)) = extra {
            serializer.append_pair(k, v);
        }
        serializer.finish()
    };
    // New matching lines go on appearing unless the search ends in the
    // past or looks at older pages.
    let follow = (query.until.is_none() && query.cursor.is_none()).then(|| format!("/api/apps/{name}/logs?{}", encode(Some(("follow", "1")))));
    let status = if result.is_ok() { StatusCode::OK } else { StatusCode::BAD_REQUEST };
    let body = html! {
        p { a href=(format!("/apps/{name}#logs")) { "← " (name) } }
        (form(&ctx, &name, &query))
        @match &result {
            Err(err) => { p.error role="alert" id="log-search-error" { (super::error_text(err)) } }
            Ok(found) => {
                @if let Some(stored) = &found.stored {
                    p.help id="log-stored" {
                        (ctx.t("logs.stored")) " " (stored.lines) " (" (crate::format::bytes(stored.bytes)) ") · "
                        (ctx.t("logs.pruned")) " " (stored.pruned) " · " (ctx.t("logs.dropped")) " " (stored.dropped)
                    }
                }
                @if let Some(next) = &found.next {
                    p { a id="log-older" href=(format!("/apps/{name}/logs?{}", encode(Some(("cursor", next))))) { (ctx.t("logs.older")) } }
                }
                @let lines: Vec<RuntimeLine> = found.lines.iter().rev().cloned().collect();
                p.help { (ctx.t("logs.results_help")) @if follow.is_some() { " " (ctx.t("logs.live_help")) } }
                (log_view(&ctx, &lines, follow.clone(), now_seq))
            }
        }
    };
    (status, layout::page(&ctx, &format!("{name} · {}", ctx.t("apps.runtime_logs")), layout::Nav::Apps, &format!("/apps/{name}/logs"), body)).into_response()
}
