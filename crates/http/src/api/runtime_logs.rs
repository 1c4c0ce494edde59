//! `GET /api/apps/{name}/logs`: the app's recent runtime lines (stdout and
//! stderr of its instances, as the agents upload them), as JSON, or live as
//! server-sent events with `?follow=1`.

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
use cloudweb_api_types::traffic::{RuntimeLogEnd, RuntimeLogs};
use cloudweb_api_types::ErrorBody;

use crate::error::ApiError;
use crate::runtime_logs::{RuntimeLine, MAX_APP_LINES};
use crate::AppState;

/// Lines a request gets when it does not say.
const DEFAULT_LINES: usize = 100;

#[derive(Debug, Deserialize)]
pub struct LogsQuery {
    lines: Option<String>,
    follow: Option<String>,
    deployment: Option<String>,
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

/// A stored line as the API shows it.
fn line_view(line: &RuntimeLine) -> cloudweb_api_types::traffic::RuntimeLine {
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
    params(("name" = String, Path, description = "The app's name"), ("lines" = Option<u32>, Query, description = "How many recent lines (default 100)"), ("deployment" = Option<String>, Query, description = "Only this deployment's lines"), ("follow" = Option<bool>, Query, description = "1: stream as server-sent events"), ("Last-Event-ID" = Option<String>, Header, description = "With follow: go on after this line")),
    responses(
        (status = 200, description = "Recent runtime log lines; with follow=1, server-sent `log` events (data: a RuntimeLine, id: its seq) and an `end` (data: a RuntimeLogEnd) once the app is deleted",
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
    if let Some(deployment) = &query.deployment {
        cloudweb_protocol::validate::token("deployment", deployment, 64)?;
    }
    if state.store.app(&name).await?.is_none() {
        return Err(ApiError::NotFound(format!("no app {name:?}")));
    }
    if !follow {
        let lines = state.runtime_logs.recent(&name, 0, limit, query.deployment.as_deref());
        return Ok(Json(RuntimeLogs { app: name, lines: lines.iter().map(line_view).collect() }).into_response());
    }
    // A reconnecting EventSource sends the last id it saw: carry on after
    // it rather than repeat the tail.
    let resume = headers.get("last-event-id").and_then(|v| v.to_str().ok()).and_then(|v| v.trim().parse::<u64>().ok());
    let wake = state.runtime_logs.subscribe(&name);
    let (after, first) = match resume {
        Some(seq) => (seq, usize::MAX),
        None => (0, limit),
    };
    struct Follow {
        state: Arc<AppState>,
        app: String,
        deployment: Option<String>,
        after: u64,
        first: Option<usize>,
        wake: tokio::sync::broadcast::Receiver<&'static str>,
        done: bool,
    }
    let cursor = Follow { state, app: name, deployment: query.deployment, after, first: Some(first), wake, done: false };
    let events = stream::unfold(cursor, |mut cursor| async move {
        if cursor.done {
            return None;
        }
        loop {
            let limit = cursor.first.take().unwrap_or(usize::MAX);
            let lines = cursor.state.runtime_logs.recent(&cursor.app, cursor.after, limit, cursor.deployment.as_deref());
            if let Some(last) = lines.last() {
                cursor.after = last.seq;

                return Some((lines.iter().map(event).collect::<Vec<_>>(), cursor));
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
    Ok(Sse::new(events).keep_alive(KeepAlive::new().interval(Duration::from_secs(15))).into_response())
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
