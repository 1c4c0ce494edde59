//! The OpenAPI 3.1 document of the user API, generated from the handlers'
//! `#[utoipa::path]` annotations and served at `GET /api/openapi.json`.
//! Every body is a type of `cloudweb-api-types` (or of `cloudweb-protocol`
//! where the agent protocol already has the shape), and every operation id
//! is unique (`<resource>_<verb>`), so generated clients get one method
//! per route.
//!
//! [`finish`] adds what every operation shares, so annotations only list
//! their own answers: every operation may answer 500 and 503, every
//! authenticated one 401 and 403, and every error answer has the `Error`
//! shape (`{"error": "…", "code"?: "…"}`). It also names each guarded
//! operation's credentials: the bearer token, or the session cookie (plus
//! the CSRF header for anything but GET).

use axum::http::header::CONTENT_TYPE;
use axum::response::{IntoResponse, Response};
use axum::Extension;
use std::sync::Arc;
use utoipa::openapi::path::{Operation, PathItem};
use utoipa::openapi::security::{ApiKey, ApiKeyValue, HttpAuthScheme, HttpBuilder, SecurityRequirement, SecurityScheme};
use utoipa::openapi::{ContentBuilder, OpenApi, Ref, ResponseBuilder};
use utoipa::OpenApi as _;

/// The operations that need no credential (`METHOD path`). A route that
/// says `security(())` but is not here, or the reverse, fails the tests.
pub const PUBLIC_OPERATIONS: &[&str] = &[
    "GET /healthz",
    "POST /api/session",
    "GET /api/openapi.json",
    "GET /api/auth/gitlab/login",
    "GET /api/auth/gitlab/callback",
    "GET /api/auth/github/login",
    "GET /api/auth/github/callback",
    "POST /api/webhooks/gitlab",
    "POST /api/webhooks/generic/{app}",
    "POST /api/webhooks/github",
    "GET /api/auth/gitea/login",
    "GET /api/auth/gitea/callback",
    "POST /api/webhooks/gitea/{app}",
];

#[derive(utoipa::OpenApi)]
#[openapi(
    info(
        title = "cloud-web user API",
        description = "The control plane's user API. Authenticate with `Authorization: Bearer <token>` (the admin token \
            or a personal API token), or with the `cloudweb_session` cookie from `POST /api/session`; requests made with \
            the cookie that change anything must also send the session's CSRF token in `X-CSRF-Token`.",
    ),
    components(schemas(cloudweb_api_types::ErrorBody)),
    modifiers(&SecuritySchemes),
    security(("bearer" = []), ("session" = [])),
    tags(
        (name = "accounts", description = "Login, sessions, personal API tokens and users"),
        (name = "teams", description = "Teams, their members and roles"),
        (name = "audit", description = "The audit log: who did what, and its hash chain"),
        (name = "apps", description = "Apps and their deployments"),
        (name = "services", description = "Managed databases (PostgreSQL, Redis/Valkey, MariaDB) and the apps linked to them"),
        (name = "volumes", description = "Persistent volumes: mounted in apps, kept on one node, deleted only by name"),
        (name = "backups", description = "Backup destinations, schedules, backups, their verification and restores (restic)"),
        (name = "tasks", description = "Scheduled jobs and one-off runs of a command in an app's running image"),
        (name = "deployments", description = "Deployments and their logs"),
        (name = "nodes", description = "Nodes of the cluster"),
        (name = "alerts", description = "What the control plane alerts on (failed deployments, crash loops, unreachable nodes, disks, certificates, backups) and the channels that carry alerts to people"),
        (name = "traffic", description = "The route table and request counts"),
        (name = "metrics", description = "Prometheus metrics"),
        (name = "meta", description = "The API itself"),
        (name = "git", description = "GitLab login and settings, git providers' projects, push webhooks"),
    )
)]
struct Doc;

struct SecuritySchemes;

impl utoipa::Modify for SecuritySchemes {
    fn modify(&self, openapi: &mut OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some("The admin token (cwa_…) or a personal API token (cwp_…)"))
                    .build(),
            ),
        );
        components.add_security_scheme(
            "session",
            SecurityScheme::ApiKey(ApiKey::Cookie(ApiKeyValue::with_description(
                crate::auth::sessions::COOKIE_NAME,
                "A browser session from POST /api/session; state-changing requests also need X-CSRF-Token",
            ))),
        );
        components.add_security_scheme(
            "csrf",
            SecurityScheme::ApiKey(ApiKey::Header(ApiKeyValue::with_description(
                crate::auth::sessions::CSRF_HEADER,
                "The session's CSRF token (csrf_token of POST /api/session or GET /api/me), with the session cookie on every request but GET, HEAD and OPTIONS",
            ))),
        );
    }
}

/// The document before the routes are added.
pub fn base() -> OpenApi {
    Doc::openapi()
}

/// Each operation of a path, with its method in upper case.
pub fn operations(item: &PathItem) -> Vec<(&'static str, &Operation)> {
    [
        ("GET", &item.get),
        ("PUT", &item.put),
        ("POST", &item.post),
        ("DELETE", &item.delete),
        ("OPTIONS", &item.options),
        ("HEAD", &item.head),
        ("PATCH", &item.patch),
        ("TRACE", &item.trace),
    ]
    .into_iter()
    .filter_map(|(method, op)| op.as_ref().map(|op| (method, op)))
    .collect()
}

fn operations_mut(item: &mut PathItem) -> Vec<(&'static str, &mut Operation)> {
    [
        ("GET", &mut item.get),
        ("PUT", &mut item.put),
        ("POST", &mut item.post),
        ("DELETE", &mut item.delete),
        ("OPTIONS", &mut item.options),
        ("HEAD", &mut item.head),
        ("PATCH", &mut item.patch),
        ("TRACE", &mut item.trace),
    ]
    .into_iter()
    .filter_map(|(method, op)| op.as_mut().map(|op| (method, op)))
    .collect()
}

/// The credentials a guarded operation takes (see [`crate::auth::guard`]):
/// a bearer token, or the session cookie, which for a change also needs
/// the CSRF header.
fn guarded_security(method: &str) -> Vec<SecurityRequirement> {
    let session = if matches!(method, "GET" | "HEAD" | "OPTIONS") {
        SecurityRequirement::new("session", Vec::<String>::new())
    } else {
        SecurityRequirement::new("session", Vec::<String>::new()).add("csrf", Vec::<String>::new())
    };
    vec![SecurityRequirement::new("bearer", Vec::<String>::new()), session]
}

/// Whether an operation needs no credential (its security is `[{}]`).
pub fn is_public(operation: &Operation) -> bool {
    operation.security.as_ref().is_some_and(|s| s.iter().all(|r| *r == SecurityRequirement::default()))
}

fn error_response(description: &str) -> utoipa::openapi::Response {
    ResponseBuilder::new()
        .description(description)
        .content("application/json", ContentBuilder::new().schema(Some(Ref::from_schema_name("Error"))).build())
        .build()
}

/// Adds the answers every operation shares.
pub fn finish(mut document: OpenApi) -> OpenApi {
    for item in document.paths.paths.values_mut() {
        for (method, operation) in operations_mut(item) {
            let public = is_public(operation);
            if !public {
                operation.security = Some(guarded_security(method));
            }
            let responses = &mut operation.responses.responses;
            let mut add = |status: &str, description: &str| {
                responses.entry(status.to_string()).or_insert_with(|| error_response(description).into());
            };
            if !public {
                add("401", "No credential, or an invalid, expired or revoked one");
                add("403", "A cookie-authenticated change without the session's CSRF token, or from another origin");
            }
            add("404", "No such thing among those the caller's teams own");
            add("500", "Internal error (details are logged, not returned)");
            add("503", "The control plane cannot take writes now (its disk is full)");
        }
    }
    document
}

/// The document as served, rendered once.
pub struct Served {
    json: String,
}

impl Served {
    pub fn new(document: &OpenApi) -> Served {
        Served { json: document.to_pretty_json().unwrap_or_else(|_| "{}".to_string()) }
    }
}

/// What `GET /api/openapi.json` answers, as far as a schema can say: an
/// OpenAPI 3.1 document (<https://spec.openapis.org/oas/v3.1.0>).
#[derive(utoipa::ToSchema)]
#[allow(dead_code)]
struct OpenApiDocument {
    /// `3.1.0`.
    openapi: String,
    #[schema(value_type = Object)]
    info: serde_json::Value,
    #[schema(value_type = Object)]
    paths: serde_json::Value,
    #[schema(value_type = Option<Object>)]
    components: Option<serde_json::Value>,
}

/// This document.
#[utoipa::path(get, path = "/api/openapi.json", operation_id = "openapi_document", tag = "meta", security(()),
    responses((status = 200, description = "The OpenAPI 3.1 document of this API", content_type = "application/json", body = OpenApiDocument)))]
pub async fn document(Extension(served): Extension<Arc<Served>>) -> Response {
    ([(CONTENT_TYPE, "application/json")], served.json.clone()).into_response()
}
