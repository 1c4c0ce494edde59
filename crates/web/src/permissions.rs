//! What each dashboard page and form needs, in one table beside the
//! router ([`TABLE`], by method and route), checked and audited by
//! [`authorize`] the way the API's table is (the same roles, the same
//! audit entries). A page missing from the table answers 500 and fails
//! the test that walks the router's routes.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use cloudweb_core::access::ClusterRole::{Admin as ClusterAdmin, Viewer as ClusterViewer};
use cloudweb_core::access::Need::{self, Cluster, Create, Listed, Public, Signed, Team};
use cloudweb_core::access::TeamRole::{Admin, Deployer, Viewer};
use cloudweb_core::store::Owned::{App, BackupJob, Deployment, Service, Volume};

use crate::{auth, sessions, ApiError, AppState};

/// Every page and form: (method, route, need).
pub const TABLE: &[(&str, &str, Need)] = &[
    ("GET", "/", Public),
    ("GET", "/login", Public),
    ("POST", "/login", Public),
    ("POST", "/lang", Public),
    ("POST", "/team", Signed),
    ("GET", "/assets/app.css", Public),
    ("GET", "/assets/app.js", Public),
    ("GET", "/assets/terminal.js", Public),
    ("GET", "/assets/xterm/xterm.min.js", Public),
    ("GET", "/assets/xterm/xterm-addon-fit.min.js", Public),
    ("GET", "/assets/xterm/xterm.min.css", Public),
    ("POST", "/logout", Signed),
    ("GET", "/nodes", Cluster(ClusterViewer)),
    ("GET", "/nodes/table", Cluster(ClusterViewer)),
    ("POST", "/nodes/join-token", Cluster(ClusterAdmin)),
    ("GET", "/nodes/{id}", Cluster(ClusterViewer)),
    ("GET", "/nodes/{id}/{action}", Cluster(ClusterAdmin)),
    ("POST", "/nodes/{id}/{action}", Cluster(ClusterAdmin)),
    ("GET", "/monitoring", Cluster(ClusterViewer)),
    ("GET", "/alerts", Cluster(ClusterViewer)),
    // Cluster roles, and teams' owners (their teams'): the handler says.
    ("GET", "/audit", Listed),
    ("POST", "/alerts/channels", Signed),
    ("POST", "/alerts/channels/{id}/test", Signed),
    ("POST", "/alerts/channels/{id}/delete", Signed),
    ("GET", "/apps", Listed),
    ("POST", "/apps", Create(Admin)),
    ("GET", "/apps/{name}", Team(Viewer, App, "name")),
    ("GET", "/apps/{name}/logs", Team(Viewer, App, "name")),
    ("GET", "/apps/{name}/runs/{id}", Team(Viewer, App, "name")),
    ("POST", "/apps/{name}/deploy", Team(Deployer, App, "name")),
    ("POST", "/apps/{name}/rollback", Team(Deployer, App, "name")),
    ("POST", "/apps/{name}/cron/{job}/run", Team(Deployer, App, "name")),
    ("POST", "/apps/{name}/runs/{id}/cancel", Team(Deployer, App, "name")),
    ("POST", "/apps/{name}/env", Team(Admin, App, "name")),
    ("POST", "/apps/{name}/domains", Team(Admin, App, "name")),
    ("POST", "/apps/{name}/settings", Team(Admin, App, "name")),
    ("GET", "/apps/{name}/terminal", Team(Admin, App, "name")),
    ("GET", "/apps/{name}/terminal/session", Team(Admin, App, "name")),
    ("GET", "/apps/{name}/delete", Team(Admin, App, "name")),
    ("POST", "/apps/{name}/delete", Team(Admin, App, "name")),
    ("POST", "/apps/{name}/previews/{number}/approve", Team(Admin, App, "name")),
    ("POST", "/apps/{name}/previews/{number}/remove", Team(Admin, App, "name")),
    ("POST", "/apps/{name}/volumes", Team(Admin, App, "name")),
    ("POST", "/apps/{name}/volumes/{volume}/detach", Team(Admin, App, "name")),
    ("GET", "/services", Listed),
    ("POST", "/services", Create(Admin)),
    ("POST", "/services/{name}/links", Team(Admin, Service, "name")),
    ("POST", "/services/{name}/links/{app}/delete", Team(Admin, Service, "name")),
    ("POST", "/services/{name}/rotate-password", Team(Admin, Service, "name")),
    ("POST", "/services/{name}/upgrade", Team(Admin, Service, "name")),
    ("GET", "/services/{name}/delete", Team(Admin, Service, "name")),
    ("POST", "/services/{name}/delete", Team(Admin, Service, "name")),
    ("GET", "/volumes", Listed),
    ("GET", "/volumes/{name}/delete", Team(Admin, Volume, "name")),
    ("POST", "/volumes/{name}/delete", Team(Admin, Volume, "name")),
    ("POST", "/volumes/{name}/move", Team(Admin, Volume, "name")),
    ("GET", "/backups", Listed),
    ("POST", "/backups/destinations", Create(Admin)),
    // The target's kind is in the path: the handler checks the team.
    ("POST", "/backups/run/{kind}/{name}", Listed),
    ("POST", "/backups/jobs/{id}/confirm", Team(Admin, BackupJob, "id")),
    ("GET", "/deployments/{id}", Team(Viewer, Deployment, "id")),
    ("GET", "/deployments/{id}/logs", Team(Viewer, Deployment, "id")),
];

/// The cookie of the team the header's form chose.
pub const TEAM_COOKIE: &str = "cloudweb_team";

/// The team the header's form chose, if any (a team name's characters
/// only).
pub fn team_cookie(headers: &axum::http::HeaderMap) -> Option<String> {
    headers
        .get_all(axum::http::header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().strip_prefix(TEAM_COOKIE).and_then(|rest| rest.strip_prefix('=')))
        .find(|name| cloudweb_core::access::teams::validate_name(name).is_ok())
        .map(str::to_string)
}

/// What a page needs.
pub fn lookup(method: &str, template: &str) -> Option<(&'static str, Need)> {
    TABLE.iter().find(|(m, path, _)| *m == method && *path == template).map(|(_, path, need)| (*path, *need))
}

/// A refusal, as a page.
fn refuse(err: ApiError) -> Response {
    let status = match err {
        ApiError::NotFound(_) => StatusCode::NOT_FOUND,
        ApiError::Forbidden(_) => StatusCode::FORBIDDEN,
        _ => return err.into_response(),
    };
    let text = crate::error_text(&err);
    (status, maud::html! { (maud::DOCTYPE) html { head { title { "cloud-web" } } body { main { h1 { (status.as_u16()) } p { (text) } p { a href="/apps" { "cloud-web" } } } } } })
        .into_response()
}

/// Middleware: finds the session's user (a request without one goes on,
/// and the page sends it to the login form), then checks and audits the
/// request against [`TABLE`].
pub async fn authorize(State(state): State<Arc<AppState>>, mut request: Request, next: Next) -> Response {
    let template = request.extensions().get::<axum::extract::MatchedPath>().map(|m| m.as_str().to_string()).unwrap_or_default();
    if matches!(lookup(request.method().as_str(), &template), Some((_, Public))) {
        return next.run(request).await;
    }
    let cookie = sessions::session_cookie(request.headers()).unwrap_or("").to_string();
    let session = match sessions::lookup(&state, &cookie).await {
        Ok(Some(session)) => session,
        Ok(None) => return next.run(request).await,
        Err(err) => return err.into_response(),
    };
    let via = auth::Via::Session { id_sha256: session.id_sha256.clone(), csrf_token: session.csrf_token.clone(), expires_at: session.expires_at };
    request.extensions_mut().insert(auth::Principal::User { user: session.user, via });
    // The team the header's form chose is where new things go.
    if let Some(team) = team_cookie(request.headers()) {
        if let Ok(value) = axum::http::HeaderValue::from_str(&team) {
            request.headers_mut().entry(cloudweb_http::auth::authorize::TEAM_HEADER).or_insert(value);
        }
    }
    cloudweb_http::auth::authorize::authorize_by(&state, request, next, lookup, refuse).await
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every route of the dashboard's router is in the table, and every
    /// line of the table is a route.
    #[test]
    fn every_page_has_a_permission() {
        let source = include_str!("lib.rs");
        let mut routes = 0;
        for line in source.lines().map(str::trim).filter(|l| l.starts_with(".route(\"")) {
            let path = line.trim_start_matches(".route(\"").split('"').next().unwrap();
            let methods: Vec<&str> = ["get(", "post("].into_iter().filter(|m| line.contains(m)).collect();
            assert!(!methods.is_empty(), "{line}");
            for method in methods {
                let method = if method == "get(" { "GET" } else { "POST" };
                assert!(lookup(method, path).is_some(), "{method} {path} has no line in web::permissions::TABLE");
                routes += 1;
            }
        }
        assert_eq!(routes, TABLE.len(), "a line of the table names no route");
    }
}
