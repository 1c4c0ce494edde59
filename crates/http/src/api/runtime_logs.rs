//! `GET /api/apps/{name}/logs`: the app's runtime lines (stdout and
//! stderr of its instances, as the agents upload them). Without a search
//! parameter, the tail (the newest `lines`, oldest first); with one
//! (`since`, `until`, `q`, `grep`, `instance`, `stream`, `cursor`), a page
//! of the stored lines that match, newest first, with `next` for the page
//! after. With `?follow=1`, server-sent events: the tail (or the search's
//! first page, oldest first) and then every new line that matches.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::stream::{self, StreamExt};
use serde::Deserialize;
use cloudweb_api_types::traffic::{RuntimeLogEnd, RuntimeLogs, StoredLogs};
use cloudweb_api_types::ErrorBody;
use cloudweb_core::log_archive::search::{self, RawSearch, Search};

use crate::error::ApiError;
use crate::runtime_logs::{RuntimeLine, MAX_APP_LINES};
use crate::AppState;

/// Lines a request gets when it does not say.
const DEFAULT_LINES: usize = 100;

#[derive(Debug, Default, Deserialize)]
pub struct LogsQuery {
    pub lines: Option<String>,
    pub follow: Option<String>,
    pub deployment: Option<String>,
    pub since: Option<String>,
    pub until: Option<String>,
    pub q: Option<String>,
    pub grep: Option<String>,
    pub instance: Option<String>,
    pub stream: Option<String>,
    pub cursor: Option<String>,
    pub limit: Option<String>,
}

impl LogsQuery {
    pub fn raw(&self) -> RawSearch<'_> {
        RawSearch {
            since: self.since.as_deref(),
            until: self.until.as_deref(),
            q: self.q.as_deref(),
            grep: self.grep.as_deref(),
            instance: self.instance.as_deref(),
            stream: self.stream.as_deref(),
            deployment: self.deployment.as_deref(),
            cursor: self.cursor.as_deref(),
            limit: self.limit.as_deref(),
        }
    }
}

fn parse_lines(value: Option<&str>) -> Result<usize, ApiError> {
    match value {
        None => Ok(DEFAULT_LINES),
        Some(text) => match text.parse::<usize>() {
            Ok(n) if n <= MAX_APP_LINES => Ok(n),
            _ => Err(ApiError::BadRequest(format!("lines must be 0 to {MAX_APP_LINES}"))),
        },
    }
}

fn parse_flag(name: &str, value: Option<&str>) -> Result<bool, ApiError> {
    match value {
        None | Some("0" | "false") => Ok(false),
        Some("1" | "true" | "") => Ok(true),
        Some(_) => Err(ApiError::BadRequest(format!("{name} must be 1, true, 0 or false"))),
    }
}

/// A page of a search of `app`'s stored lines, newest first.
pub async fn search_page(state: &AppState, app: &str, search: &Search) -> Result<RuntimeLogs, ApiError> {
    let Some(archive) = state.runtime_logs.archive() else {
        return Err(ApiError::Unavailable("the log store is not open".into()));
    };
    let page = search::run(archive.store(), app, search).await?;
    let usage = archive.store().app_usage(app).await?;
    let count = |n: i64| u64::try_from(n).unwrap_or(0);
    Ok(RuntimeLogs {
        app: app.to_string(),
        lines: page.lines.into_iter().map(|row| line_view(&crate::runtime_logs::from_stored(row))).collect(),
        next: page.next,
        stored: Some(StoredLogs { lines: count(usage.lines), bytes: count(usage.bytes), pruned: count(usage.pruned), dropped: count(usage.dropped) }),
    })
}

/// A stored line as the API shows it.
pub fn line_view(line: &RuntimeLine) -> cloudweb_api_types::traffic::RuntimeLine {
    cloudweb_api_types::traffic::RuntimeLine {
        seq: line.seq,
        ts: line.ts.clone(),
        stream: line.stream.clone(),
        line: line.line.clone(),
        deployment_id: line.deployment_id.clone(),
        instance: line.instance,
        node_id: line.node_id.clone(),
        container: line.container.clone(),
    }
}

fn event(line: &RuntimeLine) -> Event {
    Event::default().event("log").id(line.seq.to_string()).data(serde_json::to_string(&line_view(line)).unwrap_or_default())
}

#[utoipa::path(get, path = "/api/apps/{name}/logs", operation_id = "apps_logs", tag = "apps",
    params(("name" = String, Path, description = "The app's name"),
        ("lines" = Option<u32>, Query, description = "The tail: how many recent lines (default 100)"),
        ("deployment" = Option<String>, Query, description = "Only this deployment's lines"),
        ("since" = Option<String>, Query, description = "Search: lines at or after this RFC 3339 time, or this long ago (30s, 15m, 2h, 7d)"),
        ("until" = Option<String>, Query, description = "Search: lines before this time (the same forms)"),
        ("q" = Option<String>, Query, description = "Search: lines holding every one of these words (whole words, case-insensitive)"),
        ("grep" = Option<String>, Query, description = "Search: lines matching this regular expression (Rust regex syntax; (?i) for any case)"),
        ("instance" = Option<u32>, Query, description = "Search: only this instance's lines (1-based)"),
        ("stream" = Option<String>, Query, description = "Search: stdout, stderr or agent (the platform's notes)"),
        ("cursor" = Option<String>, Query, description = "Search: the `next` of the page before"),
        ("limit" = Option<u32>, Query, description = "Search: lines per page (1 to 1000, default 100)"),
        ("follow" = Option<bool>, Query, description = "1: stream as server-sent events (a search's filters apply to the new lines; not with until or cursor)"),
        ("Last-Event-ID" = Option<String>, Header, description = "With follow: go on after this line")),
    responses(
        (status = 200, description = "The tail, oldest first; or a search's page, newest first, with `next` while there may be more and `stored` (what the store holds and lost). With follow=1, server-sent `log` events (data: a RuntimeLine, id: its seq) and an `end` (data: a RuntimeLogEnd) once the app is deleted",
            content((RuntimeLogs = "application/json"), (String = "text/event-stream"))),
        (status = 400, description = "Invalid query", body = ErrorBody),
        (status = 404, description = "No such app", body = ErrorBody),
    ))]
pub async fn logs(
    State(state): State<Arc<AppState>>,
    Path(name): Path<String>,
    Query(query): Query<LogsQuery>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let limit = parse_lines(query.lines.as_deref())?;
    let follow = parse_flag("follow", query.follow.as_deref())?;
    let raw = query.raw();
    let searching = raw.is_search();
    let search = raw.check(state.clock.now_ms().saturating_mul(1_000_000), limit.clamp(1, search::MAX_PAGE))?;
    if state.store.app(&name).await?.is_none() {
        return Err(ApiError::NotFound(format!("no app {name:?}")));
    }
    if !follow {
        if searching {
            return Ok(Json(search_page(&state, &name, &search).await?).into_response());
        }
        let lines = state.runtime_logs.tail(&name, 0, limit, query.deployment.as_deref()).await;
        return Ok(Json(RuntimeLogs { app: name, lines: lines.iter().map(line_view).collect(), next: None, stored: None }).into_response());
    }
    if query.until.is_some() || query.cursor.is_some() {
        return Err(ApiError::BadRequest("follow goes on from now: it takes neither until nor cursor".into()));
    }
    Ok(follow_stream(state, name, search, searching, limit, &headers).await)
}

/// A follower: the backlog, then every new line that passes the search.
pub async fn follow_stream(state: Arc<AppState>, app: String, search: Search, searching: bool, limit: usize, headers: &HeaderMap) -> Response {
    // A reconnecting EventSource sends the last id it saw: carry on after
    // it rather than repeat the tail.
    let resume = headers.get("last-event-id").and_then(|v| v.to_str().ok()).and_then(|v| v.trim().parse::<u64>().ok());
    let wake = state.runtime_logs.subscribe(&app);
    let admits = |search: &Search, line: &RuntimeLine| {
        search.admits(cloudweb_core::log_archive::parse_ts_ns(&line.ts), line.instance, &line.stream, &line.deployment_id, &line.line)
    };
    let (after, backlog) = match resume {
        Some(seq) => {
            let lines = state.runtime_logs.tail(&app, seq, usize::MAX, search.deployment.as_deref()).await;
            (lines.last().map_or(seq, |l| l.seq), lines.into_iter().filter(|l| admits(&search, l)).collect::<Vec<_>>())
        }
        None if searching => {
            let now = state.runtime_logs.last_seq();
            let mut lines: Vec<RuntimeLine> = match search_page(&state, &app, &search).await {
                Ok(page) => page.lines.into_iter().map(runtime_line).collect(),
                Err(err) => {
                    tracing::warn!(app = %app, error = ?err, "runtime logs: a follower's search failed; following new lines only");
                    Vec::new()
                }
            };
            lines.retain(|l| l.seq <= now);
            lines.reverse();
            (now, lines)
        }
        None => {
            let lines = state.runtime_logs.tail(&app, 0, limit, search.deployment.as_deref()).await;
            (lines.last().map_or(state.runtime_logs.last_seq(), |l| l.seq), lines)
        }
    };
    struct Follow {
        state: Arc<AppState>,
        app: String,
        search: Search,
        after: u64,
        backlog: Option<Vec<RuntimeLine>>,
        wake: tokio::sync::broadcast::Receiver<&'static str>,
        done: bool,
    }
    let cursor = Follow { state, app, search, after, backlog: Some(backlog), wake, done: false };
    let events = stream::unfold(cursor, move |mut cursor| async move {
        if cursor.done {
            return None;
        }
        if let Some(backlog) = cursor.backlog.take().filter(|b| !b.is_empty()) {
            return Some((backlog.iter().map(event).collect::<Vec<_>>(), cursor));
        }
        loop {
            let lines = cursor.state.runtime_logs.recent(&cursor.app, cursor.after, usize::MAX, cursor.search.deployment.as_deref());
            if let Some(last) = lines.last() {
                cursor.after = last.seq;
                let events: Vec<Event> = lines.iter().filter(|l| admits(&cursor.search, l)).map(event).collect();
                if !events.is_empty() {
                    return Some((events, cursor));
                }
                continue;
            }
            let woke = tokio::select! {
                woke = cursor.wake.recv() => woke,
                // A safety net: the app may go without a message reaching
                // this stream (a lagging receiver).
                _ = tokio::time::sleep(Duration::from_secs(5)) => Ok("tick"),
            };
            let deleted = matches!(woke, Ok("deleted") | Err(tokio::sync::broadcast::error::RecvError::Closed));
            if deleted || cursor.state.store.app(&cursor.app).await.ok().flatten().is_none() {
                cursor.done = true;
                let end = Event::default().event("end").data(serde_json::to_string(&RuntimeLogEnd { reason: "app deleted".to_string() }).unwrap_or_default());
                return Some((vec![end], cursor));
            }
        }
    })
    .flat_map(|events| stream::iter(events.into_iter().map(Ok::<_, Infallible>)));
    Sse::new(events).keep_alive(KeepAlive::new().interval(Duration::from_secs(15))).into_response()
}

/// An API line back in the rings' shape.
fn runtime_line(line: cloudweb_api_types::traffic::RuntimeLine) -> RuntimeLine {
    RuntimeLine {
        seq: line.seq,
        ts: line.ts,
        stream: line.stream,
        line: line.line,
        deployment_id: line.deployment_id,
        instance: line.instance,
        node_id: line.node_id,
        container: line.container,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_values_are_checked() {
        assert_eq!(parse_lines(None).unwrap(), DEFAULT_LINES);
        assert_eq!(parse_lines(Some("5")).unwrap(), 5);
        assert!(parse_lines(Some("-1")).is_err());
        assert!(parse_lines(Some("100000")).is_err());
        assert!(parse_flag("follow", Some("1")).unwrap());
        assert!(!parse_flag("follow", None).unwrap());
        assert!(parse_flag("follow", Some("yes")).is_err());
    }
}
