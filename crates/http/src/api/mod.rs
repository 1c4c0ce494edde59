//! The user API on `--api-listen`: JSON authenticated by the admin token,
//! a personal API token or a browser session (see [`crate::auth`]), plus
//! `/healthz` (open), Prometheus `/metrics` and the OpenAPI document at
//! `/api/openapi.json` (open).
//!
//! Every route is registered through [`routes`] with `utoipa_axum`'s
//! `routes!`, which takes each handler's `#[utoipa::path]` annotation: the
//! router and the OpenAPI document come from the same list, and the
//! `openapi` tests check that nothing is registered around it.

pub mod apps;
pub mod audit;
pub mod control_planes;
pub mod deployments;
pub mod join_tokens;
pub mod listener;
mod metrics;
pub mod nodes;
pub mod openapi;
pub mod permissions;
pub mod previews;
pub mod runtime_logs;
pub mod alerts;
pub mod autoscale;
pub mod scale;
mod session_bridge;
pub mod sessions;
pub mod services;
pub mod tasks;
pub mod teams;
pub mod traffic;
pub mod backups;
pub mod control_plane_backups;
pub mod volume_moves;
pub mod volumes;

use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, Request};
use axum::middleware;
use axum::response::{IntoResponse, Response};
use axum::Router;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::auth;
use crate::error::ApiError;
use crate::AppState;

/// Every route, with its documentation. Routes that need no credential
/// are in [`public_routes`]; everything here goes through the
/// [`auth::guard`].
fn authenticated_routes() -> OpenApiRouter<Arc<AppState>> {
    OpenApiRouter::new()
        .routes(routes!(auth::routes::logout))
        .routes(routes!(auth::routes::me))
        .routes(routes!(auth::routes::list_tokens, auth::routes::create_token))
        .routes(routes!(auth::routes::revoke_token))
        .routes(routes!(auth::routes::list_users, auth::routes::create_user))
        .routes(routes!(auth::routes::disable_user))
        .routes(routes!(teams::set_cluster_role))
        .routes(routes!(teams::list, teams::create))
        .routes(routes!(teams::show, teams::delete))
        .routes(routes!(teams::members))
        .routes(routes!(teams::mappings, teams::replace_mappings))
        .routes(routes!(teams::set_member, teams::remove_member))
        .routes(routes!(teams::deploy_tokens, teams::create_deploy_token))
        .routes(routes!(teams::revoke_deploy_token))
        .routes(routes!(audit::list))
        .routes(routes!(audit::verify))
        .routes(routes!(join_tokens::create))
        .routes(routes!(nodes::list))
        .routes(routes!(control_planes::list))
        .routes(routes!(nodes::show, nodes::remove))
        .routes(routes!(nodes::commands, nodes::enqueue))
        .routes(routes!(nodes::drain))
        .routes(routes!(nodes::undrain))
        .routes(routes!(apps::list, apps::create_as_caller))
        .routes(routes!(apps::show, apps::update, apps::remove))
        .routes(routes!(apps::set_env, apps::patch_env))
        .routes(routes!(previews::put_production_only))
        .routes(routes!(previews::list))
        .routes(routes!(previews::put_settings))
        .routes(routes!(previews::put_env))
        .routes(routes!(previews::approve))
        .routes(routes!(previews::remove))
        .routes(routes!(apps::set_domains))
        .routes(routes!(apps::certificates))
        .routes(routes!(volumes::list))
        .routes(routes!(volumes::remove))
        .routes(routes!(volumes::of_app, volumes::attach))
        .routes(routes!(volumes::detach))
        .routes(routes!(volume_moves::start))
        .routes(routes!(volume_moves::of_volume))
        .routes(routes!(volume_moves::show))
        .routes(routes!(volume_moves::confirm))
        .routes(routes!(services::list, services::create))
        .routes(routes!(services::show, services::remove))
        .routes(routes!(services::link))
        .routes(routes!(services::unlink))
        .routes(routes!(services::rotate_password))
        .routes(routes!(services::upgrade))
        .routes(routes!(services::cancel_upgrade))
        .routes(routes!(services::logs))
        .routes(routes!(backups::list_destinations, backups::create_destination))
        .routes(routes!(backups::remove_destination))
        .routes(routes!(backups::overview))
        .routes(routes!(backups::service_backups, backups::run_service))
        .routes(routes!(backups::volume_backups, backups::run_volume))
        .routes(routes!(backups::plan_service))
        .routes(routes!(backups::plan_volume))
        .routes(routes!(backups::show))
        .routes(routes!(backups::verify))
        .routes(routes!(backups::restore))
        .routes(routes!(backups::confirm))
        .routes(routes!(control_plane_backups::run))
        .routes(routes!(tasks::list_jobs, tasks::create_job))
        .routes(routes!(tasks::get_job, tasks::change_job, tasks::remove_job))
        .routes(routes!(tasks::run_job))
        .routes(routes!(tasks::list_runs, tasks::create_run))
        .routes(routes!(tasks::get_run))
        .routes(routes!(tasks::run_logs))
        .routes(routes!(tasks::cancel_run))
        .routes(routes!(scale::scale))
        .routes(routes!(scale::top))
        .routes(routes!(autoscale::show, autoscale::set, autoscale::off))
        .routes(routes!(alerts::list))
        .routes(routes!(alerts::channels, alerts::create_channel))
        .routes(routes!(alerts::channel, alerts::delete_channel))
        .routes(routes!(alerts::test_channel))
        .routes(routes!(sessions::exec))
        .routes(routes!(sessions::port_forward))
        .routes(routes!(sessions::list))
        .routes(routes!(sessions::service_exec))
        .routes(routes!(sessions::service_port_forward))
        .routes(routes!(sessions::service_sessions))
        .routes(routes!(apps::deploy))
        .routes(routes!(apps::rollback))
        .routes(routes!(deployments::of_app))
        .routes(routes!(runtime_logs::logs))
        .routes(routes!(deployments::show))
        .routes(routes!(deployments::logs))
        .routes(routes!(deployments::cancel))
        .routes(routes!(traffic::routes))
        .routes(routes!(traffic::traffic))
        .routes(routes!(traffic::last_heartbeat))
        .routes(routes!(traffic::node_usage))
        .routes(routes!(metrics::prometheus))
        .routes(routes!(crate::git::api::get_settings, crate::git::api::put_settings))
        .routes(routes!(crate::git::api::accounts))
        .routes(routes!(crate::git::api::projects))
        .routes(routes!(crate::git::api::branches))
        .routes(routes!(crate::git::github::get_settings, crate::git::github::put_settings))
        .routes(routes!(crate::git::github::installations))
        .routes(routes!(crate::git::github::repositories))
        .routes(routes!(crate::git::github_login::get_settings, crate::git::github_login::put_settings))
        .routes(routes!(crate::git::gitea::get_settings, crate::git::gitea::put_settings))
        .routes(routes!(crate::git::gitea::accounts))
        .routes(routes!(crate::git::gitea::repositories))
}

/// Routes anyone may call. Each must say `security(())` in its annotation
/// (the document then shows it needs no credential) and be listed in
/// [`openapi::PUBLIC_OPERATIONS`].
fn public_routes() -> OpenApiRouter<Arc<AppState>> {
    OpenApiRouter::new()
        .routes(routes!(healthz))
        .routes(routes!(auth::routes::login))
        .routes(routes!(openapi::document))
        // GitLab, GitHub and Gitea logins, and webhooks that authenticate
        // themselves (X-Gitlab-Token, an HMAC signature, GitHub's
        // X-Hub-Signature-256, Gitea's X-Gitea-Signature).
        .routes(routes!(crate::git::oauth::login))
        .routes(routes!(crate::git::oauth::callback))
        .routes(routes!(crate::git::github_login::login))
        .routes(routes!(crate::git::github_login::callback))
        .routes(routes!(crate::git::webhooks::gitlab))
        .routes(routes!(crate::git::webhooks::generic))
        .routes(routes!(crate::git::github::webhook))
        .routes(routes!(crate::git::gitea_login::login))
        .routes(routes!(crate::git::gitea_login::callback))
        .routes(routes!(crate::git::gitea::webhook))
}

/// The router and the document, from one list.
pub fn parts(state: Option<Arc<AppState>>) -> (Router<Arc<AppState>>, utoipa::openapi::OpenApi) {
    let mut authenticated = authenticated_routes();
    let mut public = public_routes();
    if let Some(state) = state {
        // The guard (outer) finds who calls; the permissions (inner) check
        // what they may do and write the audit log.
        authenticated = authenticated
            .route_layer(middleware::from_fn_with_state(state.clone(), permissions::authorize))
            .route_layer(middleware::from_fn_with_state(state.clone(), auth::guard::require_principal));
        public = public.route_layer(middleware::from_fn_with_state(state, auth::authorize::audit_public));
    }
    let (router, document) = OpenApiRouter::with_openapi(openapi::base()).merge(public).merge(authenticated).split_for_parts();
    let mut document = openapi::finish(document);
    permissions::annotate(&mut document);
    (router, document)
}

/// The page that answers an unknown path outside `/api/` (the dashboard's
/// HTML 404 page, from the layer above).
pub type NotFoundPage =
    fn(Arc<AppState>, Request) -> futures_util::future::BoxFuture<'static, Response>;

/// The user API alone: every unknown path answers JSON.
pub fn router(state: Arc<AppState>) -> Router {
    router_with_pages(state, None)
}

/// The user API, with `pages` answering unknown paths outside `/api/`.
pub fn router_with_pages(state: Arc<AppState>, pages: Option<NotFoundPage>) -> Router {
    let (router, document) = parts(Some(state.clone()));
    let document = Arc::new(openapi::Served::new(&document));
    router
        .fallback(
            move |state: axum::extract::State<Arc<AppState>>, request: Request| {
                unknown_path(state, request, pages)
            },
        )
        .layer(axum::Extension(document))
        .layer(middleware::from_fn(run_to_completion))
        .layer(DefaultBodyLimit::max(crate::error::MAX_BODY_BYTES))
        .layer(middleware::from_fn(crate::error::refuse_declared_oversize))
        .with_state(state)
}

/// An unknown path: JSON under `/api/` (a program asked), the dashboard's
/// HTML 404 page everywhere else (a browser asked; `cloudweb_web`'s
/// `not_found_page`, given as `pages`).
async fn unknown_path(
    state: axum::extract::State<Arc<AppState>>,
    request: Request,
    pages: Option<NotFoundPage>,
) -> Response {
    let path = request.uri().path();
    match pages {
        Some(page) if path != "/api" && !path.starts_with("/api/") => page(state.0, request).await,
        _ => ApiError::NotFound("no such endpoint".to_string()).into_response(),
    }
}

/// Liveness: answers `ok` while the control plane serves.
#[utoipa::path(get, path = "/healthz", operation_id = "healthz", tag = "meta", security(()), responses((status = 200, description = "ok", content_type = "text/plain", body = String)))]
async fn healthz() -> &'static str {
    "ok"
}

pub use crate::whole_requests::run_to_completion;
