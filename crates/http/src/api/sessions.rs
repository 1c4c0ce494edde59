//! Exec and port-forward sessions into an app's running instance or a
//! managed service's container: two WebSocket routes for each, and the
//! record of past sessions.
//!
//! The session opens (its node dials back, see `cloudweb_core::sessions`)
//! before the WebSocket is accepted, so every refusal is an ordinary HTTP
//! answer: no such app or instance (404), nothing running (409), too many
//! sessions (429), the node unreachable or silent (503). Once accepted,
//! each binary message either way is one session frame
//! (`cloudweb_protocol::sessions::SessionFrame`).

use std::sync::Arc;

use axum::extract::ws::WebSocketUpgrade;
use axum::extract::{Path, RawQuery, State};
use axum::response::Response;
use axum::{Extension, Json};
use cloudweb_api_types::sessions::{SessionList, SessionView};
use cloudweb_api_types::ErrorBody;
use cloudweb_core::auth::Principal;
use cloudweb_core::sessions::{self, OpenRequest, Subject};
use cloudweb_protocol::sessions::{terminal_size, SessionTarget};

use crate::error::ApiError;
use crate::AppState;

/// Sessions `GET /api/apps/{name}/sessions` lists at most.
const LIST_LIMIT: i64 = 100;

/// The query of a session route, read by hand: `command` repeats (one
/// argument each, in order).
#[derive(Debug, Default)]
struct Query {
    instance: Option<u32>,
    command: Vec<String>,
    tty: bool,
    cols: Option<u16>,
    rows: Option<u16>,
    port: Option<u16>,
}

fn parse_query(raw: Option<&str>) -> Result<Query, ApiError> {
    let mut query = Query::default();
    let bad = |field: &str, why: &str| ApiError::BadRequest(format!("{field}: {why}"));
    for (key, value) in url::form_urlencoded::parse(raw.unwrap_or("").as_bytes()) {
        match key.as_ref() {
            "instance" => query.instance = Some(value.parse().map_err(|_| bad("instance", "must be an instance number"))?),
            "command" => {
                if query.command.len() >= cloudweb_protocol::tasks::MAX_ARGS {
                    return Err(bad("command", &format!("at most {} arguments", cloudweb_protocol::tasks::MAX_ARGS)));
                }
                query.command.push(value.into_owned());
            }
            "tty" => query.tty = matches!(value.as_ref(), "1" | "true"),
            "cols" => query.cols = Some(value.parse().map_err(|_| bad("cols", "must be a number of columns"))?),
            "rows" => query.rows = Some(value.parse().map_err(|_| bad("rows", "must be a number of rows"))?),
            "port" => query.port = Some(value.parse().ok().filter(|p| *p > 0).ok_or_else(|| bad("port", "must be 1 to 65535"))?),
            other => return Err(bad(other, "unknown parameter")),
        }
    }
    Ok(query)
}

fn who(principal: &Principal) -> String {
    principal.user().map(|u| u.name.clone()).unwrap_or_else(|| "admin".to_string())
}

/// Opens the session, then accepts the WebSocket and bridges the two.
async fn open_and_bridge(state: Arc<AppState>, request: OpenRequest, upgrade: WebSocketUpgrade) -> Result<Response, ApiError> {
    let opened = sessions::open(&state, request).await?;
    let id = opened.row.id.clone();
    let failed_state = state.clone();
    let upgrade = upgrade.on_failed_upgrade(move |err| {
        let message = format!("the client's WebSocket failed before the session started: {err}");
        tokio::spawn(async move {
            let ended = sessions::Ended { failure: Some(message), ..Default::default() };
            sessions::record_end(&failed_state, &id, &ended).await;
        });
    });
    Ok(upgrade.on_upgrade(move |socket| super::session_bridge::bridge(state, opened, socket)))
}

/// Runs a command in a running instance of the app, as a WebSocket of
/// session frames: `Data` both ways (stdin; stdout, or the terminal's
/// output), `Stderr` without a terminal, `Resize`, `Eof` from the user,
/// and last `Exit` (the status) or `Error` (why the session ended).
/// Closing the WebSocket ends the process.
#[utoipa::path(get, path = "/api/apps/{name}/exec", operation_id = "apps_exec", tag = "apps",
    params(
        ("name" = String, Path, description = "The app's name"),
        ("command" = Vec<String>, Query, description = "The command, one argument per `command` parameter, in order"),
        ("instance" = Option<u32>, Query, description = "The instance number; the lowest running one by default"),
        ("tty" = Option<bool>, Query, description = "Run in a terminal (raw bytes, window size, no separate stderr)"),
        ("cols" = Option<u16>, Query, description = "The terminal's columns (80 by default)"),
        ("rows" = Option<u16>, Query, description = "The terminal's rows (24 by default)"),
    ),
    responses(
        (status = 101, description = "The session is open: a WebSocket of session frames"),
        (status = 400, description = "Invalid command or parameters, or not a WebSocket request", body = ErrorBody),
        (status = 404, description = "No such app or instance", body = ErrorBody),
        (status = 409, description = "Nothing running", body = ErrorBody),
        (status = 429, description = "Too many sessions", body = ErrorBody),
        (status = 503, description = "The instance's node is unreachable or did not answer", body = ErrorBody),
    ))]
pub async fn exec(
    State(state): State<Arc<AppState>>,
    Extension(principal): Extension<Principal>,
    Path(name): Path<String>,
    RawQuery(raw): RawQuery,
    upgrade: WebSocketUpgrade,
) -> Result<Response, ApiError> {
    let query = parse_query(raw.as_deref())?;
    let subject = Subject::App { name, instance: query.instance };
    open_and_bridge(state, OpenRequest { subject, target: exec_target(query)?, user: who(&principal) }, upgrade).await
}

fn exec_target(query: Query) -> Result<SessionTarget, ApiError> {
    if query.port.is_some() {
        return Err(ApiError::BadRequest("port: not a parameter of exec".to_string()));
    }
    cloudweb_protocol::tasks::command("command", &query.command).map_err(|e| ApiError::BadRequest(e.to_string()))?;
    let (cols, rows) = (query.cols.unwrap_or(80), query.rows.unwrap_or(24));
    terminal_size(cols, rows).map_err(|e| ApiError::BadRequest(e.to_string()))?;
    Ok(SessionTarget::Exec { command: query.command, tty: query.tty, cols, rows })
}

fn forward_target(query: &Query) -> Result<SessionTarget, ApiError> {
    if !query.command.is_empty() || query.tty || query.cols.is_some() || query.rows.is_some() {
        return Err(ApiError::BadRequest("a port-forward takes port and instance only".to_string()));
    }
    let Some(port) = query.port else { return Err(ApiError::BadRequest("port: required".to_string())) };
    Ok(SessionTarget::Forward { port })
}

fn no_instance(query: &Query) -> Result<(), ApiError> {
    match query.instance {
        Some(_) => Err(ApiError::BadRequest("instance: a service has one container".to_string())),
        None => Ok(()),
    }
}

/// Runs a command in a managed service's container (`psql`, `redis-cli`),
/// as [`exec`] does in an app's instance.
#[utoipa::path(get, path = "/api/services/{name}/exec", operation_id = "services_exec", tag = "services",
    params(
        ("name" = String, Path, description = "The service's name"),
        ("command" = Vec<String>, Query, description = "The command, one argument per `command` parameter, in order"),
        ("tty" = Option<bool>, Query, description = "Run in a terminal"),
        ("cols" = Option<u16>, Query, description = "The terminal's columns (80 by default)"),
        ("rows" = Option<u16>, Query, description = "The terminal's rows (24 by default)"),
    ),
    responses(
        (status = 101, description = "The session is open: a WebSocket of session frames"),
        (status = 400, description = "Invalid command or parameters, or not a WebSocket request", body = ErrorBody),
        (status = 404, description = "No such service", body = ErrorBody),
        (status = 429, description = "Too many sessions", body = ErrorBody),
        (status = 503, description = "The service's node is unreachable or did not answer", body = ErrorBody),
    ))]
pub async fn service_exec(
    State(state): State<Arc<AppState>>,
    Extension(principal): Extension<Principal>,
    Path(name): Path<String>,
    RawQuery(raw): RawQuery,
    upgrade: WebSocketUpgrade,
) -> Result<Response, ApiError> {
    let query = parse_query(raw.as_deref())?;
    no_instance(&query)?;
    open_and_bridge(state, OpenRequest { subject: Subject::Service { name }, target: exec_target(query)?, user: who(&principal) }, upgrade).await
}

/// Forwards one TCP connection to a port of a managed service's container
/// (5432 for PostgreSQL), for a local client against a database only
/// reachable inside the cluster.
#[utoipa::path(get, path = "/api/services/{name}/port-forward", operation_id = "services_port_forward", tag = "services",
    params(
        ("name" = String, Path, description = "The service's name"),
        ("port" = u16, Query, description = "The port in the container"),
    ),
    responses(
        (status = 101, description = "Connected: a WebSocket of session frames"),
        (status = 400, description = "Invalid parameters, or not a WebSocket request", body = ErrorBody),
        (status = 404, description = "No such service", body = ErrorBody),
        (status = 429, description = "Too many sessions", body = ErrorBody),
        (status = 503, description = "The service's node is unreachable or did not answer", body = ErrorBody),
    ))]
pub async fn service_port_forward(
    State(state): State<Arc<AppState>>,
    Extension(principal): Extension<Principal>,
    Path(name): Path<String>,
    RawQuery(raw): RawQuery,
    upgrade: WebSocketUpgrade,
) -> Result<Response, ApiError> {
    let query = parse_query(raw.as_deref())?;
    no_instance(&query)?;
    open_and_bridge(state, OpenRequest { subject: Subject::Service { name }, target: forward_target(&query)?, user: who(&principal) }, upgrade).await
}

/// A managed service's exec and port-forward sessions, newest first (the
/// last 100).
#[utoipa::path(get, path = "/api/services/{name}/sessions", operation_id = "services_sessions", tag = "services",
    params(("name" = String, Path, description = "The service's name")),
    responses((status = 200, description = "The sessions", body = SessionList), (status = 404, description = "No such service", body = ErrorBody)))]
pub async fn service_sessions(State(state): State<Arc<AppState>>, Path(name): Path<String>) -> Result<Json<SessionList>, ApiError> {
    if state.store.service(&name).await?.is_none() {
        return Err(ApiError::NotFound(format!("no service {name:?}")));
    }
    record(&state, "service", &name).await
}

/// Forwards one TCP connection to a port of a running instance, as a
/// WebSocket of session frames (`Data` both ways; `Eof` half-closes).
/// `cloudweb port-forward` opens one per local connection.
#[utoipa::path(get, path = "/api/apps/{name}/port-forward", operation_id = "apps_port_forward", tag = "apps",
    params(
        ("name" = String, Path, description = "The app's name"),
        ("port" = u16, Query, description = "The port in the container"),
        ("instance" = Option<u32>, Query, description = "The instance number; the lowest running one by default"),
    ),
    responses(
        (status = 101, description = "Connected: a WebSocket of session frames"),
        (status = 400, description = "Invalid parameters, or not a WebSocket request", body = ErrorBody),
        (status = 404, description = "No such app or instance", body = ErrorBody),
        (status = 409, description = "Nothing running", body = ErrorBody),
        (status = 429, description = "Too many sessions", body = ErrorBody),
        (status = 503, description = "The instance's node is unreachable or did not answer", body = ErrorBody),
    ))]
pub async fn port_forward(
    State(state): State<Arc<AppState>>,
    Extension(principal): Extension<Principal>,
    Path(name): Path<String>,
    RawQuery(raw): RawQuery,
    upgrade: WebSocketUpgrade,
) -> Result<Response, ApiError> {
    let query = parse_query(raw.as_deref())?;
    let target = forward_target(&query)?;
    let subject = Subject::App { name, instance: query.instance };
    open_and_bridge(state, OpenRequest { subject, target, user: who(&principal) }, upgrade).await
}

/// The app's exec and port-forward sessions, newest first (the last 100).
#[utoipa::path(get, path = "/api/apps/{name}/sessions", operation_id = "apps_sessions", tag = "apps",
    params(("name" = String, Path, description = "The app's name")),
    responses((status = 200, description = "The sessions", body = SessionList), (status = 404, description = "No such app", body = ErrorBody)))]
pub async fn list(State(state): State<Arc<AppState>>, Path(name): Path<String>) -> Result<Json<SessionList>, ApiError> {
    if state.store.app(&name).await?.is_none() {
        return Err(ApiError::NotFound(format!("no app {name:?}")));
    }
    record(&state, "app", &name).await
}

async fn record(state: &AppState, subject: &str, name: &str) -> Result<Json<SessionList>, ApiError> {
    let now = state.clock.now_ms();
    let rows = state.store.exec_sessions_of(subject, name, LIST_LIMIT).await?;
    Ok(Json(SessionList { sessions: rows.into_iter().map(|row| view(row, now)).collect() }))
}

pub fn view(row: cloudweb_core::store::exec_sessions::ExecSessionRow, now_ms: i64) -> SessionView {
    let rfc = cloudweb_core::clock::rfc3339_ms;
    let duration_ms = row.attached_at.map(|at| row.ended_at.unwrap_or(now_ms).saturating_sub(at).max(0));
    let is_app = row.subject == "app";
    SessionView {
        id: row.id,
        app: is_app.then(|| row.name.clone()),
        service: (!is_app).then_some(row.name),
        kind: row.kind,
        user: row.user_name,
        node_id: row.node_id,
        deployment: is_app.then_some(row.deployment_id),
        instance: is_app.then_some(row.instance),
        program: row.program,
        port: row.port,
        tty: row.tty,
        state: row.state,
        exit_code: row.exit_code,
        message: row.message,
        bytes_in: row.bytes_in,
        bytes_out: row.bytes_out,
        created_at: rfc(row.created_at),
        ended_at: row.ended_at.map(rfc),
        duration_ms,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_are_read_in_order_and_checked() {
        let q = parse_query(Some("command=sh&command=-c&command=echo%20a%26b&tty=1&cols=100&rows=30&instance=2")).unwrap();
        assert_eq!(q.command, ["sh", "-c", "echo a&b"]);
        assert!(q.tty);
        assert_eq!((q.cols, q.rows, q.instance), (Some(100), Some(30), Some(2)));
        assert!(parse_query(Some("port=0")).is_err());
        assert!(parse_query(Some("port=70000")).is_err());
        assert!(parse_query(Some("instance=x")).is_err());
        assert!(parse_query(Some("shell=1")).is_err());
        let many = vec!["command=a"; 65].join("&");
        assert!(parse_query(Some(&many)).is_err());
    }
}
