//! After the guard has found who is calling: what they may do. Looks the
//! request's operation up in [`crate::api::permissions`], works out the
//! caller's [`Access`] and checks the operation's need against it, then
//! writes the audit log: a refusal as one entry; a change (and an exec or
//! port-forward session) as an entry before it runs, which must be
//! written or the change is refused with 503, and one with its outcome.
//!
//! The handler finds the caller's [`Access`] and the [`RequestTeam`] in
//! the request's extensions.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{ConnectInfo, FromRequestParts, MatchedPath, RawPathParams, Request};
use axum::http::Method;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::Principal;
use crate::access::audit::{self, Entry};
use crate::access::{self, Access};
use crate::error::ApiError;
use crate::AppState;

/// The header that names the team a request works in (by name or id).
pub const TEAM_HEADER: &str = "x-cloudweb-team";

/// The team the request's new thing goes to (operations that create).
#[derive(Debug, Clone)]
pub struct RequestTeam(pub Option<String>);

impl RequestTeam {
    /// The team's id (the default team when the route chose none).
    pub fn id(&self) -> String {
        self.0.clone().unwrap_or_else(|| crate::access::teams::DEFAULT_TEAM_ID.to_string())
    }
}

/// Operations that open an interactive session (the API's exec and
/// port-forward, the dashboard's terminal): audited like changes.
pub const SESSION_OPERATIONS: &[&str] =
    &["apps_exec", "apps_port_forward", "services_exec", "services_port_forward", "/apps/{name}/terminal/session"];

/// The caller's address, for the audit log.
pub fn source(request: &Request) -> Option<String> {
    request.extensions().get::<ConnectInfo<SocketAddr>>().map(|c| c.0.ip().to_string())
}

fn changes(method: &Method) -> bool {
    !matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS)
}

/// What a route needs, by method and route template.
pub type Lookup = fn(&str, &str) -> Option<(&'static str, access::Need)>;

/// How a refusal is answered (JSON for the API, a page for the dashboard).
pub type Refuse = fn(ApiError) -> Response;

/// Checks and audits an authenticated request (its principal is in its
/// extensions) against `lookup`'s table (the API's, the dashboard's), then
/// runs it; a refusal is answered with `refuse`.
pub async fn authorize_by(state: &Arc<AppState>, request: Request, next: Next, lookup: Lookup, refuse: Refuse) -> Response {
    let method = request.method().clone();
    let Some(template) = request.extensions().get::<MatchedPath>().map(|m| m.as_str().to_string()) else {
        return ApiError::Internal("the request matched no route".to_string()).into_response();
    };
    let Some((operation, need)) = lookup(method.as_str(), &template) else {
        tracing::error!(method = %method, route = %template, "route without a permission; refused");
        return ApiError::Internal(format!("{method} {template} declares no permission")).into_response();
    };
    let Some(principal) = request.extensions().get::<Principal>().cloned() else {
        return ApiError::Internal("no principal".to_string()).into_response();
    };
    let access = match access::access_of(state, &principal).await {
        Ok(access) => access,
        Err(err) => return err.into_response(),
    };
    let (mut parts, body) = request.into_parts();
    let params: Vec<(String, String)> = match RawPathParams::from_request_parts(&mut parts, &()).await {
        Ok(raw) => raw.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        Err(_) => Vec::new(),
    };
    let team = parts.headers.get(TEAM_HEADER).and_then(|v| v.to_str().ok()).map(str::to_string);
    let mut request = Request::from_parts(parts, body);
    let source = source(&request);
    let action = format!("{method} {template}");
    let request_id = audit::request_id();
    let entry = |phase: &'static str, team: Option<String>, target: Option<String>, result: String| Entry {
        request_id: request_id.clone(),
        phase,
        actor: access.actor.clone(),
        team,
        source: source.clone(),
        action: action.clone(),
        target,
        result,
    };
    let checked = match access::check(state, &access, need, &params, team.as_deref()).await {
        Ok(checked) => checked,
        Err(refused) => {
            if matches!(refused, ApiError::Forbidden(_) | ApiError::NotFound(_)) {
                let result = format!("refused: {refused}");
                audit::after(state, entry("event", None, params_target(&params), result)).await;
                tracing::info!(actor = %access.actor, operation, "refused for lack of permission");
            }
            return refuse(refused);
        }
    };
    let audited = changes(&method) || SESSION_OPERATIONS.contains(&operation);
    if audited {
        if let Err(err) = audit::before(state, entry("request", checked.team_id.clone(), checked.target.clone(), "started".to_string())).await {
            return err.into_response();
        }
    }
    request.extensions_mut().insert(RequestTeam(checked.team_id.clone()));
    request.extensions_mut().insert(access.clone());
    let response = next.run(request).await;
    if audited {
        let result = response.status().as_u16().to_string();
        audit::after(state, entry("response", checked.team_id, checked.target, result)).await;
    }
    response
}

/// Middleware on the routes that need no credential: a change among them
/// (a webhook; the login writes its own entries) is audited like any
/// other, its actor `anonymous` (the route authenticates the sender).
pub async fn audit_public(axum::extract::State(state): axum::extract::State<Arc<AppState>>, request: Request, next: Next) -> Response {
    let template = request.extensions().get::<MatchedPath>().map(|m| m.as_str().to_string()).unwrap_or_default();
    if !changes(request.method()) || template == "/api/session" {
        return next.run(request).await;
    }
    let request_id = audit::request_id();
    let first = Entry {
        request_id,
        phase: "request",
        actor: "anonymous".to_string(),
        source: source(&request),
        action: format!("{} {template}", request.method()),
        result: "started".to_string(),
        ..Default::default()
    };
    let last = Entry { phase: "response", ..first.clone() };
    // Unauthenticated callers cannot grow the log without bound: past the
    // minute's budget, a request is written only when it changed
    // something (a signed webhook's deployment), and refused ones are
    // summed up in one entry a minute.
    let address = first.source.clone().unwrap_or_default();
    if audit::admit_anonymous(&state, &address).await == cloudweb_core::audit_policy::Admit::OverBudget {
        let response = next.run(request).await;
        if response.status().is_success() {
            audit::after(&state, Entry { result: response.status().as_u16().to_string(), ..last }).await;
        } else {
            audit::suppressed(&state, &address);
        }
        return response;
    }
    if let Err(err) = audit::before(&state, first).await {
        return err.into_response();
    }
    let response = next.run(request).await;
    audit::after(&state, Entry { result: response.status().as_u16().to_string(), ..last }).await;
    response
}

/// What a refused request named, for its audit entry.
fn params_target(params: &[(String, String)]) -> Option<String> {
    (!params.is_empty()).then(|| params.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(" "))
}

/// The access of a request the guard let through (an admin's when the
/// router runs without the guard, as in the document-only tests).
pub fn access_from(extensions: &axum::http::Extensions) -> Access {
    extensions.get::<Access>().cloned().unwrap_or_else(Access::admin)
}
