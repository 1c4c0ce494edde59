//! What each operation of the user API needs, in one table beside the
//! router ([`TABLE`], by operation id). The guard looks every request's
//! operation up here ([`lookup`]); an operation missing from the table
//! answers 500 and fails the tests, which walk the router's document and
//! this table both ways. The OpenAPI document shows each operation's need
//! as `x-permission`.
//!
//! Team needs name the path parameter whose owner's team decides
//! (`Team(role, Owned::App, "name")`: the role in the team that owns the
//! app `{name}`). `Create` is for a new thing: the request's team.

use std::collections::HashMap;
use std::sync::OnceLock;

use cloudweb_core::access::ClusterRole::{Admin as ClusterAdmin, Viewer as ClusterViewer};
use cloudweb_core::access::Need::{self, Cluster, Create, Listed, Public, Signed, Team};
use cloudweb_core::access::TeamRole::{Admin, Deployer, Owner, Viewer};
use cloudweb_core::store::Owned::{App, BackupJob, Deployment, Destination, Service, Volume, VolumeMove};

use super::openapi;

const APP: cloudweb_core::store::Owned = App;
const TEAM: cloudweb_core::store::Owned = cloudweb_core::store::Owned::Team;

/// Every operation and what it needs.
pub const TABLE: &[(&str, Need)] = &[
    // Open, or authenticated by the request itself (webhook signatures).
    ("healthz", Public),
    ("openapi_document", Public),
    ("auth_login", Public),
    ("auth_gitlab_login", Public),
    ("auth_gitlab_callback", Public),
    ("auth_github_login", Public),
    ("auth_github_callback", Public),
    ("auth_gitea_login", Public),
    ("auth_gitea_callback", Public),
    ("webhooks_gitlab", Public),
    ("webhooks_generic", Public),
    ("webhooks_github", Public),
    ("webhooks_gitea", Public),
    // The caller's own session, tokens and linked git accounts.
    ("auth_logout", Signed),
    ("auth_me", Signed),
    ("tokens_list", Signed),
    ("tokens_create", Signed),
    ("tokens_revoke", Signed),
    ("gitlab_accounts_list", Signed),
    ("gitlab_projects_list", Signed),
    ("gitlab_branches_list", Signed),
    ("gitea_accounts_list", Signed),
    ("gitea_repositories_list", Signed),
    ("github_installations_list", Signed),
    ("github_repositories_list", Signed),
    // Alert channels: a user's own, and the cluster's (changing those
    // needs cluster-admin, checked by the handler).
    ("alert_channels_list", Signed),
    ("alert_channels_get", Signed),
    ("alert_channels_create", Signed),
    ("alert_channels_delete", Signed),
    ("alert_channels_test", Signed),
    // Lists: each shows what the caller's teams own.
    ("apps_list", Listed),
    ("services_list", Listed),
    ("volumes_list", Listed),
    ("backup_destinations_list", Listed),
    ("backups_overview", Listed),
    ("alerts_list", Listed),
    ("teams_list", Listed),
    ("audit_list", Listed),
    // The cluster.
    ("nodes_list", Cluster(ClusterViewer)),
    ("nodes_show", Cluster(ClusterViewer)),
    ("nodes_commands_list", Cluster(ClusterViewer)),
    ("nodes_last_heartbeat", Cluster(ClusterViewer)),
    ("nodes_usage", Cluster(ClusterViewer)),
    ("control_planes_list", Cluster(ClusterViewer)),
    ("routes_show", Cluster(ClusterViewer)),
    ("traffic_show", Cluster(ClusterViewer)),
    ("metrics_prometheus", Cluster(ClusterViewer)),
    ("users_list", Cluster(ClusterViewer)),
    ("gitlab_settings_show", Cluster(ClusterViewer)),
    ("github_settings_show", Cluster(ClusterViewer)),
    ("github_login_show", Cluster(ClusterViewer)),
    ("gitea_settings_show", Cluster(ClusterViewer)),
    ("nodes_commands_create", Cluster(ClusterAdmin)),
    ("nodes_drain", Cluster(ClusterAdmin)),
    ("nodes_undrain", Cluster(ClusterAdmin)),
    ("nodes_delete", Cluster(ClusterAdmin)),
    ("join_tokens_create", Cluster(ClusterAdmin)),
    ("users_create", Cluster(ClusterAdmin)),
    ("users_disable", Cluster(ClusterAdmin)),
    ("users_cluster_role_set", Cluster(ClusterAdmin)),
    ("control_plane_backups_run", Cluster(ClusterAdmin)),
    ("gitlab_settings_replace", Cluster(ClusterAdmin)),
    ("github_settings_replace", Cluster(ClusterAdmin)),
    ("github_login_replace", Cluster(ClusterAdmin)),
    ("gitea_settings_replace", Cluster(ClusterAdmin)),
    ("teams_create", Cluster(ClusterAdmin)),
    ("team_mappings_show", Cluster(ClusterViewer)),
    ("team_mappings_replace", Cluster(ClusterAdmin)),
    ("audit_verify", Cluster(ClusterAdmin)),
    // Teams.
    ("teams_show", Team(Viewer, TEAM, "team")),
    ("team_members_list", Team(Viewer, TEAM, "team")),
    ("team_members_set", Team(Owner, TEAM, "team")),
    ("team_members_remove", Team(Owner, TEAM, "team")),
    ("teams_delete", Team(Owner, TEAM, "team")),
    // Apps: reading.
    ("apps_show", Team(Viewer, APP, "name")),
    ("apps_autoscale_show", Team(Viewer, APP, "name")),
    ("apps_certificates", Team(Viewer, APP, "name")),
    ("apps_deployments_list", Team(Viewer, APP, "name")),
    ("apps_logs", Team(Viewer, APP, "name")),
    ("apps_sessions", Team(Viewer, APP, "name")),
    ("apps_top", Team(Viewer, APP, "name")),
    ("apps_volumes_list", Team(Viewer, APP, "name")),
    ("previews_list", Team(Viewer, APP, "name")),
    ("cron_jobs_list", Team(Viewer, APP, "app")),
    ("cron_jobs_show", Team(Viewer, APP, "app")),
    ("task_runs_list", Team(Viewer, APP, "app")),
    ("task_runs_show", Team(Viewer, APP, "app")),
    ("task_runs_logs", Team(Viewer, APP, "app")),
    ("deployments_show", Team(Viewer, Deployment, "id")),
    ("deployments_logs", Team(Viewer, Deployment, "id")),
    // Apps: deploying.
    ("apps_deploy", Team(Deployer, APP, "name")),
    ("apps_rollback", Team(Deployer, APP, "name")),
    ("apps_scale", Team(Deployer, APP, "name")),
    ("apps_autoscale_set", Team(Deployer, APP, "name")),
    ("apps_autoscale_off", Team(Deployer, APP, "name")),
    ("cron_jobs_run", Team(Deployer, APP, "app")),
    ("task_runs_cancel", Team(Deployer, APP, "app")),
    ("deployments_cancel", Team(Deployer, Deployment, "id")),
    // Apps: everything else (variables, exec, settings, deletion).
    ("apps_create", Create(Admin)),
    ("apps_update", Team(Admin, APP, "name")),
    ("apps_delete", Team(Admin, APP, "name")),
    ("apps_domains_replace", Team(Admin, APP, "name")),
    ("apps_env_replace", Team(Admin, APP, "name")),
    ("apps_env_update", Team(Admin, APP, "name")),
    ("apps_env_production_only_replace", Team(Admin, APP, "name")),
    ("apps_exec", Team(Admin, APP, "name")),
    ("apps_port_forward", Team(Admin, APP, "name")),
    ("apps_volumes_attach", Team(Admin, APP, "name")),
    ("apps_volumes_detach", Team(Admin, APP, "name")),
    ("previews_settings_replace", Team(Admin, APP, "name")),
    ("previews_env_replace", Team(Admin, APP, "name")),
    ("previews_approve", Team(Admin, APP, "name")),
    ("previews_delete", Team(Admin, APP, "name")),
    ("cron_jobs_create", Team(Admin, APP, "app")),
    ("cron_jobs_change", Team(Admin, APP, "app")),
    ("cron_jobs_remove", Team(Admin, APP, "app")),
    ("task_runs_create", Team(Admin, APP, "app")),
    ("deploy_tokens_list", Team(Admin, APP, "name")),
    ("deploy_tokens_create", Team(Admin, APP, "name")),
    ("deploy_tokens_revoke", Team(Admin, APP, "name")),
    // Services.
    ("services_show", Team(Viewer, Service, "name")),
    ("services_logs", Team(Viewer, Service, "name")),
    ("services_sessions", Team(Viewer, Service, "name")),
    ("services_backups_list", Team(Viewer, Service, "name")),
    ("services_create", Create(Admin)),
    ("services_delete", Team(Admin, Service, "name")),
    ("services_exec", Team(Admin, Service, "name")),
    ("services_port_forward", Team(Admin, Service, "name")),
    ("services_link", Team(Admin, Service, "name")),
    ("services_unlink", Team(Admin, Service, "name")),
    ("services_rotate_password", Team(Admin, Service, "name")),
    ("services_upgrade", Team(Admin, Service, "name")),
    ("services_upgrade_cancel", Team(Admin, Service, "name")),
    ("services_backup_plan_set", Team(Admin, Service, "name")),
    ("services_backups_run", Team(Admin, Service, "name")),
    // Volumes and their moves.
    ("volumes_backups_list", Team(Viewer, Volume, "name")),
    ("volumes_moves_list", Team(Viewer, Volume, "name")),
    ("volume_moves_show", Team(Viewer, VolumeMove, "id")),
    ("volumes_delete", Team(Admin, Volume, "name")),
    ("volumes_backup_plan_set", Team(Admin, Volume, "name")),
    ("volumes_backups_run", Team(Admin, Volume, "name")),
    ("volumes_move", Team(Admin, Volume, "name")),
    ("volume_moves_confirm", Team(Admin, VolumeMove, "id")),
    // Backups.
    ("backup_destinations_create", Create(Admin)),
    ("backup_destinations_remove", Team(Admin, Destination, "name")),
    ("backups_show", Team(Viewer, BackupJob, "id")),
    ("backups_verify", Team(Admin, BackupJob, "id")),
    ("backups_restore", Team(Admin, BackupJob, "id")),
    ("backups_confirm_restore", Team(Admin, BackupJob, "id")),
];

/// What an operation needs.
pub fn need_of(operation_id: &str) -> Option<Need> {
    TABLE.iter().find(|(id, _)| *id == operation_id).map(|(_, need)| *need)
}

/// `(METHOD, path template)` → operation id, from the router's document.
fn index() -> &'static HashMap<(String, String), String> {
    static INDEX: OnceLock<HashMap<(String, String), String>> = OnceLock::new();
    INDEX.get_or_init(|| {
        let (_, document) = super::parts(None);
        let mut index = HashMap::new();
        for (path, item) in &document.paths.paths {
            for (method, operation) in openapi::operations(item) {
                if let Some(id) = &operation.operation_id {
                    index.insert((method.to_string(), path.clone()), id.clone());
                }
            }
        }
        index
    })
}

/// The operation a request matched (its method and route template), and
/// what it needs; `None` for a route missing from the table.
pub fn lookup(method: &str, template: &str) -> Option<(&'static str, Need)> {
    // The router answers HEAD with the GET handler.
    let method = if method == "HEAD" { "GET" } else { method };
    let id = index().get(&(method.to_string(), template.to_string()))?;
    TABLE.iter().find(|(known, _)| known == id).map(|(id, need)| (*id, *need))
}

/// Whether any operation has this route template (a request with another
/// method is answered 405 by the router).
pub fn is_route(template: &str) -> bool {
    index().keys().any(|(_, path)| path == template)
}

/// Middleware on the API's authenticated routes, inside the guard:
/// checks and audits each request against [`TABLE`].
pub async fn authorize(
    axum::extract::State(state): axum::extract::State<std::sync::Arc<crate::AppState>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let template = request.extensions().get::<axum::extract::MatchedPath>().map(|m| m.as_str().to_string()).unwrap_or_default();
    if lookup(request.method().as_str(), &template).is_none() && is_route(&template) {
        // Another method of a known route: the router's 405, nothing run.
        return axum::http::StatusCode::METHOD_NOT_ALLOWED.into_response();
    }
    crate::auth::authorize::authorize_by(&state, request, next, lookup, IntoResponse::into_response).await
}

/// `x-permission` on every operation of the document.
pub fn annotate(document: &mut utoipa::openapi::OpenApi) {
    for item in document.paths.paths.values_mut() {
        for operation in [&mut item.get, &mut item.put, &mut item.post, &mut item.delete, &mut item.patch].into_iter().flatten() {
            let Some(need) = operation.operation_id.as_deref().and_then(need_of) else { continue };
            let extensions = operation.extensions.get_or_insert_with(Default::default);
            extensions.insert("x-permission".to_string(), serde_json::Value::String(need.describe()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A route added without a line here fails this test, and so does a
    /// line left behind by a removed route.
    #[test]
    fn every_operation_of_the_router_has_exactly_one_permission() {
        let (_, document) = super::super::parts(None);
        let mut seen = Vec::new();
        for (path, item) in &document.paths.paths {
            for (method, operation) in openapi::operations(item) {
                let id = operation.operation_id.clone().expect("every operation has an id");
                let need = need_of(&id).unwrap_or_else(|| panic!("{method} {path} ({id}) has no permission in api::permissions::TABLE"));
                assert_eq!(TABLE.iter().filter(|(known, _)| *known == id).count(), 1, "{id} is in the table twice");
                assert_eq!(
                    need == Public,
                    openapi::is_public(operation),
                    "{method} {path}: a public route needs Public, and only a public route has it"
                );
                if let Need::Team(_, _, param) = need {
                    assert!(path.contains(&format!("{{{param}}}")), "{method} {path}: {id} is checked on {{{param}}}, which the path lacks");
                }
                assert_eq!(lookup(method, path).map(|(id, _)| id), Some(id.as_str()));
                seen.push(id);
            }
        }
        for (id, _) in TABLE {
            assert!(seen.iter().any(|s| s == id), "{id} is in the table but no route has it");
        }
    }

    #[test]
    fn the_document_shows_each_permission() {
        let (_, document) = super::super::parts(None);
        let deploy = document.paths.paths["/api/apps/{name}/deploy"].post.as_ref().unwrap();
        let shown = deploy.extensions.as_ref().and_then(|e| e.get("x-permission")).cloned();
        assert_eq!(shown, Some(serde_json::json!("deployer of the app's team")));
    }
}
