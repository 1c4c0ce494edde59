//! Teams and roles (issue 28), in-process: a matrix generated from the
//! OpenAPI document (every operation × anonymous, viewer, deployer,
//! admin, owner, cluster-admin, a token held to another app, a token of
//! another team) whose expectations come from the roles' definitions, not
//! from the permission table; a second team's user sees and reaches
//! nothing of the first's; and the audit log records refusals and finds
//! a row changed in the database.

use std::collections::HashMap;
use std::sync::Arc;

use cloudweb_server::access::{ClusterRole, Role, TeamRole};
use cloudweb_server::auth::tokens::NewScope;
use cloudweb_server::clock::ShiftedClock;
use cloudweb_server::config::Config;
use cloudweb_server::store::UserRow;
use cloudweb_server::{AppState, RunningServer};
use reqwest::Method;
use serde_json::{json, Value};

struct Cluster {
    _dir: tempfile::TempDir,
    server: RunningServer,
    admin: String,
    http: reqwest::Client,
}

impl Cluster {
    async fn start() -> Cluster {
        Cluster::start_with(cloudweb_server::access::audit::OnFailure::Refuse).await
    }

    async fn start_with(on_failure: cloudweb_server::access::audit::OnFailure) -> Cluster {
        let dir = tempfile::tempdir().unwrap();
        let mut config = Config::local(dir.path().to_path_buf());
        config.auth.audit.on_failure = on_failure;
        let server = cloudweb_server::start(config, Arc::new(ShiftedClock::default())).await.unwrap();
        let admin = std::fs::read_to_string(dir.path().join("admin-token")).unwrap().trim().to_string();
        Cluster { _dir: dir, server, admin, http: reqwest::Client::new() }
    }

    fn state(&self) -> &Arc<AppState> {
        &self.server.state
    }

    async fn call(&self, token: Option<&str>, method: Method, path: &str, body: Option<Value>) -> (u16, Value) {
        let mut request = self.http.request(method, format!("http://{}{path}", self.server.api_addr));
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.unwrap();
        let status = response.status().as_u16();
        let text = response.text().await.unwrap();
        (status, serde_json::from_str(&text).unwrap_or(Value::String(text)))
    }

    async fn user(&self, name: &str, cluster: Option<ClusterRole>) -> UserRow {
        cloudweb_server::auth::users::create(&self.state().store, self.state().clock.now_ms(), name, Some("a long enough password"), cluster).await.unwrap()
    }

    async fn token(&self, user: &UserRow, scope: NewScope) -> String {
        cloudweb_server::auth::tokens::create(self.state(), user, &format!("t{}", rand_suffix()), scope).await.unwrap().1
    }

    async fn app(&self, name: &str, team_id: &str) {
        let app = cloudweb_e2e::rows::app(name, team_id);
        self.state().store.insert_app(&app, &format!("{name}.localhost")).await.unwrap().unwrap();
    }
}

fn rand_suffix() -> String {
    cloudweb_server::auth::random_hex(4)
}

/// Who calls, in the matrix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Caller {
    Anonymous,
    Member(TeamRole),
    ClusterAdmin,
    /// An admin of the team, with a token held to another app.
    OtherApp,
    /// The owner of another team, with their token.
    OtherTeam,
}

/// What the roles' definitions say a caller may do, by the operation's
/// path and method (not by the server's table): `None` for "anything but
/// 2xx is wrong" checks we cannot make (public routes).
fn allowed(caller: Caller, method: &str, path: &str) -> bool {
    let member = |least: TeamRole| match caller {
        Caller::Member(role) => role >= least,
        Caller::ClusterAdmin => true,
        _ => false,
    };
    let reads = method == "GET";
    let own = ["/api/me", "/api/session", "/api/tokens", "/api/alerts/channels"];
    if own.iter().any(|p| path == *p || path.starts_with(&format!("{p}/"))) || path.starts_with("/api/gitlab/accounts") || path.starts_with("/api/gitlab/projects") || path.starts_with("/api/gitea/accounts") || path.starts_with("/api/gitea/repositories") || path.starts_with("/api/github/installations") || path.starts_with("/api/github/repositories") {
        return caller != Caller::Anonymous;
    }
    if reads && path == "/api/audit" {
        // Cluster roles, and a team's owners (for their team).
        return matches!(caller, Caller::ClusterAdmin | Caller::Member(TeamRole::Owner) | Caller::OtherTeam);
    }
    if reads && ["/api/apps", "/api/services", "/api/volumes", "/api/backup-destinations", "/api/backups", "/api/alerts", "/api/teams"].contains(&path) {
        return caller != Caller::Anonymous;
    }
    if ["/api/apps", "/api/services", "/api/backup-destinations"].contains(&path) && method == "POST" {
        // Made in the caller's own team: an admin's, an owner's, or
        // another team's owner in theirs.
        return member(TeamRole::Admin) || caller == Caller::OtherTeam;
    }
    let cluster_things = ["/api/team-mappings", "/api/nodes", "/api/join-tokens", "/api/users", "/api/control-planes", "/api/routes", "/api/traffic", "/metrics", "/api/control-plane", "/api/gitlab/settings", "/api/github/settings", "/api/github/login", "/api/gitea/settings", "/api/audit/verify"];
    if cluster_things.iter().any(|p| path.starts_with(p)) || (path == "/api/teams" && method == "POST") {
        return caller == Caller::ClusterAdmin;
    }
    if path.starts_with("/api/teams/{team}") {
        let least = if reads { TeamRole::Viewer } else { TeamRole::Owner };
        return member(least);
    }
    // Everything else belongs to the team's app, its volume, deployment,
    // destination or backups.
    // A service's major upgrade, and cancelling it, change its data:
    // admin, like the upgrade itself.
    let deployer_paths = ["/deploy", "/rollback", "/scale", "/autoscale", "/cancel", "/run"];
    let deployer_paths: Vec<&str> = if path.contains("/upgrade/") { Vec::new() } else { deployer_paths.to_vec() };
    let least = if reads && !path.ends_with("/exec") && !path.ends_with("/port-forward") && !path.contains("/deploy-tokens") {
        TeamRole::Viewer
    } else if !reads && deployer_paths.iter().any(|p| path.ends_with(p)) && !path.contains("/previews/") && !(path == "/api/apps/{app}/runs" && method == "POST") {
        TeamRole::Deployer
    } else {
        TeamRole::Admin
    };
    member(least)
}

/// A path with its parameters filled with the fixtures' names.
fn fill(path: &str, ids: &HashMap<&str, String>) -> String {
    let id = if path.starts_with("/api/deployments/") {
        ids["deployment"].clone()
    } else if path.starts_with("/api/users/") {
        ids["user"].clone()
    } else {
        "x0".to_string()
    };
    path.replace("{name}", "web")
        .replace("{app}", "web")
        .replace("{team}", "acme")
        .replace("{user}", &ids["user"])
        .replace("{id}", &id)
        .replace("{number}", "1")
        .replace("{host}", "web.localhost")
        .replace("{volume}", "web-data")
        .replace("{job}", "j")
        .replace(if path.starts_with("/api/volumes/") { "web" } else { "\u{0}" }, "web-data")
        .replace(if path.starts_with("/api/backup-destinations/") { "web" } else { "\u{0}" }, "acme-offsite")
}

#[tokio::test]
async fn every_operation_refuses_every_role_the_definitions_refuse() {
    let cluster = Cluster::start().await;
    let state = cluster.state().clone();
    let root = cluster.user("root", Some(ClusterRole::Admin)).await;
    let acme = cloudweb_server::access::teams::create(&state, "acme", &root).await.unwrap();
    let globex = cloudweb_server::access::teams::create(&state, "globex", &root).await.unwrap();
    cluster.app("web", &acme.id).await;
    cluster.app("api", &acme.id).await;
    cluster.app("shop", &globex.id).await;
    state.store.attach_volume("web-data", "web", "/data", 1).await.unwrap().unwrap();
    let now = state.clock.now_ms();
    let deployment = cloudweb_e2e::rows::queued_deployment("dep_web", "web", now);
    state.store.insert_deployment(&deployment, 1, false).await.unwrap();
    // A service of acme's (on a node that has gone: the matrix is about
    // who may ask, not what the node answers), so service routes meet a
    // real row and its team instead of "no such service".
    let db = sqlx::SqlitePool::connect(&format!("sqlite://{}", cluster._dir.path().join("state.db").display())).await.unwrap();
    let secret = state.sealer.seal_json("service:web", &json!({"password": "matrix-password"}));
    sqlx::query(
        "INSERT INTO services (name, kind, version, image, node_id, host_port, volume, secret_sealed, generation, created_at, team_id) \
         VALUES ('web', 'postgres', '15', 'cloudweb-test/postgres:15', 'n-gone', 15432, 'web-pg', $1, 1, $2, $3)",
    )
    .bind(&secret)
    .bind(now)
    .bind(&acme.id)
    .execute(&db)
    .await
    .unwrap();
    sqlx::query("INSERT INTO volumes (name, created_at, team_id) VALUES ('web-pg', $1, $2)").bind(now).bind(&acme.id).execute(&db).await.unwrap();
    db.close().await;

    let mut tokens: Vec<(Caller, Option<String>)> = vec![(Caller::Anonymous, None)];
    for role in TeamRole::ALL {
        let user = cluster.user(role.as_str(), None).await;
        cloudweb_server::access::teams::set_member(&state, &acme, &user, role, "manual").await.unwrap();
        tokens.push((Caller::Member(role), Some(cluster.token(&user, NewScope::default()).await)));
    }
    tokens.push((Caller::ClusterAdmin, Some(cluster.token(&root, NewScope::default()).await)));
    let scoped = cluster.user("scoped", None).await;
    cloudweb_server::access::teams::set_member(&state, &acme, &scoped, TeamRole::Admin, "manual").await.unwrap();
    let scope = NewScope { role: Some(Role::Team(TeamRole::Admin)), apps: Some(vec!["api".into()]), expires_at: None };
    tokens.push((Caller::OtherApp, Some(cluster.token(&scoped, scope).await)));
    let stranger = cluster.user("stranger", None).await;
    cloudweb_server::access::teams::set_member(&state, &globex, &stranger, TeamRole::Owner, "manual").await.unwrap();
    tokens.push((Caller::OtherTeam, Some(cluster.token(&stranger, NewScope::default()).await)));
    let ids: HashMap<&str, String> = [("deployment", "dep_web".to_string()), ("user", stranger.id.clone())].into_iter().collect();

    let (status, document) = cluster.call(None, Method::GET, "/api/openapi.json", None).await;
    assert_eq!(status, 200);
    let mut failures = Vec::new();
    let mut checked = 0;
    // Refusals first: allowed calls may change what later calls see.
    for want_allowed in [false, true] {
        for (path, item) in document["paths"].as_object().unwrap() {
            for (method, operation) in item.as_object().unwrap() {
                let method = method.to_uppercase();
                if operation["security"] == json!([{}]) {
                    continue;
                }
                assert!(operation["x-permission"].is_string(), "{method} {path} shows no x-permission");
                for (caller, token) in &tokens {
                    let allow = *caller != Caller::Anonymous && allowed(*caller, &method, path);
                    if allow != want_allowed || (allow && method == "DELETE") {
                        continue;
                    }
                    let body = matches!(method.as_str(), "POST" | "PUT" | "PATCH").then(|| json!({}));
                    let (status, answer) = cluster.call(token.as_deref(), method.parse().unwrap(), &fill(path, &ids), body).await;
                    checked += 1;
                    let ok = match (caller, allow) {
                        (Caller::Anonymous, _) => status == 401,
                        (_, false) => matches!(status, 403 | 404),
                        (_, true) => !matches!(status, 401 | 403),
                    };
                    if !ok {
                        failures.push(format!("{caller:?} {method} {path}: {status} {answer}"));
                    }
                }
            }
        }
    }
    assert!(failures.is_empty(), "{} of {checked} calls answered against the roles:\n{}", failures.len(), failures.join("\n"));
    assert!(checked > 500, "{checked}");
}

#[tokio::test]
async fn a_team_sees_only_its_own_and_the_audit_chain_finds_an_edited_row() {
    let cluster = Cluster::start().await;
    let state = cluster.state().clone();
    let root = cluster.user("root", Some(ClusterRole::Admin)).await;
    let acme = cloudweb_server::access::teams::create(&state, "acme", &root).await.unwrap();
    let globex = cloudweb_server::access::teams::create(&state, "globex", &root).await.unwrap();
    cluster.app("web", &acme.id).await;
    cluster.app("shop", &globex.id).await;
    let alice = cluster.user("alice", None).await;
    let bob = cluster.user("bob", None).await;
    let admin = cluster.admin.clone();
    // Members through the API, as an owner would add them.
    let (status, body) = cluster.call(Some(&admin), Method::PUT, &format!("/api/teams/acme/members/{}", alice.name), Some(json!({"role": "admin"}))).await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = cluster.call(Some(&admin), Method::PUT, "/api/teams/globex/members/bob", Some(json!({"role": "owner"}))).await;
    assert_eq!(status, 200, "{body}");
    let alice_token = cluster.token(&alice, NewScope::default()).await;
    let bob_token = cluster.token(&bob, NewScope::default()).await;

    let (_, apps) = cluster.call(Some(&alice_token), Method::GET, "/api/apps", None).await;
    let names: Vec<&str> = apps["apps"].as_array().unwrap().iter().map(|a| a["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["web"], "alice sees acme's apps only");
    let (status, _) = cluster.call(Some(&alice_token), Method::GET, "/api/apps/shop", None).await;
    assert_eq!(status, 404, "another team's app is as if it did not exist");
    let (status, _) = cluster.call(Some(&alice_token), Method::POST, "/api/apps/shop/deploy", Some(json!({}))).await;
    assert_eq!(status, 404);
    let (status, _) = cluster.call(Some(&bob_token), Method::GET, "/api/apps/web/exec", None).await;
    assert_eq!(status, 404, "nor can bob exec into acme's app");
    let (_, me) = cluster.call(Some(&alice_token), Method::GET, "/api/me", None).await;
    assert_eq!(me["teams"], json!([{"team": "acme", "role": "admin"}]), "{me}");

    // A detached volume of globex cannot be mounted in acme's app.
    state.store.attach_volume("shop-data", "shop", "/data", 1).await.unwrap().unwrap();
    state.store.detach_volume("shop", "shop-data").await.unwrap();
    let (status, body) = cluster.call(Some(&alice_token), Method::POST, "/api/apps/web/volumes", Some(json!({"name": "shop-data", "path": "/data"}))).await;
    assert_eq!(status, 409, "{body}");
    assert!(state.store.app_volumes("web").await.unwrap().is_empty());

    // The dashboard, as alice: her team's app only; another team's pages,
    // streams and forms are as if they did not exist.
    let now = state.clock.now_ms();
    let shop_deployment = cloudweb_e2e::rows::queued_deployment("dep_shop", "shop", now);
    state.store.insert_deployment(&shop_deployment, 1, false).await.unwrap();
    let browser = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap();
    let page = |path: &str| format!("http://{}{path}", cluster.server.api_addr);
    let login = browser.post(page("/login")).form(&[("name", "alice"), ("password", "a long enough password")]).send().await.unwrap();
    assert_eq!(login.status(), 303);
    let cookie: Vec<String> = login.headers().get_all("set-cookie").iter().map(|v| v.to_str().unwrap().split(';').next().unwrap().to_string()).collect();
    let cookie = cookie.join("; ");
    let get = |path: &'static str| {
        let request = browser.get(page(path)).header("cookie", cookie.clone());
        async move {
            let response = request.send().await.unwrap();
            let status = response.status().as_u16();
            (status, response.text().await.unwrap())
        }
    };
    let (status, apps_page) = get("/apps").await;
    assert_eq!(status, 200);
    assert!(apps_page.contains("/apps/web") && !apps_page.contains("/apps/shop"), "{apps_page}");
    for path in ["/apps/shop", "/apps/shop/logs", "/apps/shop/terminal", "/apps/shop/terminal/session", "/deployments/dep_shop", "/deployments/dep_shop/logs"] {
        assert_eq!(get(path).await.0, 404, "{path}");
    }
    assert_eq!(get("/nodes").await.0, 403, "the nodes are the cluster's");
    assert_eq!(get("/audit").await.0, 403, "the audit log is for cluster roles and owners");
    let csrf = apps_page.split("name=\"csrf_token\" value=\"").nth(1).unwrap().split('"').next().unwrap().to_string();
    let deploy = browser.post(page("/apps/shop/deploy")).header("cookie", cookie.clone()).form(&[("csrf_token", csrf.as_str())]).send().await.unwrap();
    assert_eq!(deploy.status(), 404, "a form on another team's app");
    assert_eq!(state.store.app_deployments("shop").await.unwrap().len(), 1, "nothing was queued");

    // A team always keeps an owner; removing a user revokes their tokens.
    let (status, body) = cluster.call(Some(&admin), Method::DELETE, "/api/teams/globex/members/root", None).await;
    assert_eq!(status, 204, "{body}");
    let (status, body) = cluster.call(Some(&admin), Method::PUT, "/api/teams/globex/members/bob", Some(json!({"role": "viewer"}))).await;
    assert_eq!(status, 409, "{body}");
    let (status, _) = cluster.call(Some(&admin), Method::DELETE, "/api/teams/globex/members/bob", None).await;
    assert_eq!(status, 409);
    let (status, body) = cluster.call(Some(&admin), Method::DELETE, &format!("/api/users/{}", alice.id), None).await;
    assert_eq!(status, 204, "{body}");
    let (status, _) = cluster.call(Some(&alice_token), Method::GET, "/api/me", None).await;
    assert_eq!(status, 401, "a removed user's token stops at once");

    // The refusals are in the audit log, with who and what.
    let (status, audit) = cluster.call(Some(&admin), Method::GET, "/api/audit?since=1h&action=deploy", None).await;
    assert_eq!(status, 200, "{audit}");
    let refused = audit["entries"].as_array().unwrap().iter().find(|e| e["result"].as_str().unwrap().starts_with("refused")).cloned();
    let refused = refused.unwrap_or_else(|| panic!("no refusal in {audit}"));
    assert!(refused["actor"].as_str().unwrap().starts_with(&format!("user:{}/token:", alice.id)), "{refused}");
    assert_eq!(refused["actor_name"], "alice");
    let (status, owner_view) = cluster.call(Some(&bob_token), Method::GET, "/api/audit", None).await;
    assert_eq!(status, 200, "an owner reads their team's entries");
    assert!(owner_view["entries"].as_array().unwrap().iter().all(|e| e["team"] == "globex"), "{owner_view}");

    // The dashboard's audit page, as a cluster admin.
    let login = browser.post(page("/login")).form(&[("name", "root"), ("password", "a long enough password")]).send().await.unwrap();
    assert_eq!(login.status(), 303);
    let root_cookie: Vec<String> = login.headers().get_all("set-cookie").iter().map(|v| v.to_str().unwrap().split(';').next().unwrap().to_string()).collect();
    let audit_page = browser.get(page("/audit?since=1h&action=deploy")).header("cookie", root_cookie.join("; ")).send().await.unwrap();
    assert_eq!(audit_page.status(), 200);
    let audit_page = audit_page.text().await.unwrap();
    assert!(audit_page.contains("alice") && audit_page.contains("refused"), "{audit_page}");

    let (_, verified) = cluster.call(Some(&admin), Method::POST, "/api/audit/verify", None).await;
    assert_eq!(verified["intact"], true, "{verified}");
    let entries = verified["entries"].as_i64().unwrap();
    assert!(entries >= 6, "{verified}");
    // Someone with the database edits an entry: verify finds it.
    let seq = refused["seq"].as_i64().unwrap();
    let db = sqlx::SqlitePool::connect(&format!("sqlite://{}", cluster._dir.path().join("state.db").display())).await.unwrap();
    sqlx::query("UPDATE audit_log SET result = 'ok' WHERE seq = ?").bind(seq).execute(&db).await.unwrap();
    let (_, verified) = cluster.call(Some(&admin), Method::POST, "/api/audit/verify", None).await;
    assert_eq!(verified["intact"], false, "{verified}");
    assert_eq!(verified["broken_at"], seq, "{verified}");
}

/// `cloudweb` with its own config home, against this cluster: exit code
/// and its output (stdout, then stderr). Run as a child the runtime waits
/// for, since the control plane answers on this same runtime.
async fn cloudweb(home: &std::path::Path, server: &str, token: Option<&str>, args: &[&str]) -> (i32, String) {
    let mut command = tokio::process::Command::new(cloudweb_e2e::bin("cloudweb"));
    command.args(args).env("XDG_CONFIG_HOME", home).env("HOME", home).env("CLOUDWEB_SERVER", server).env_remove("CLOUDWEB_TEAM");
    match token {
        Some(token) => command.env("CLOUDWEB_TOKEN", token),
        None => command.env_remove("CLOUDWEB_TOKEN"),
    };
    let output = command.stdin(std::process::Stdio::null()).output().await.unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    (output.status.code().unwrap_or(-1), format!("{stdout}{stderr}"))
}

#[tokio::test]
async fn the_cli_manages_teams_switches_the_current_one_and_verifies_the_audit_log() {
    let cluster = Cluster::start().await;
    let state = cluster.state().clone();
    let server = format!("http://{}", cluster.server.api_addr);
    let home = tempfile::tempdir().unwrap();
    let admin = cluster.admin.clone();
    let root = cluster.user("root", Some(ClusterRole::Admin)).await;
    let dana = cluster.user("dana", None).await;

    let (code, out) = cloudweb(home.path(), &server, Some(&admin), &["teams", "create", "acme", "--owner", "root"]).await;
    assert_eq!(code, 0, "{out}");
    assert_eq!(cloudweb(home.path(), &server, Some(&admin), &["teams", "create", "globex", "--owner", "root"]).await.0, 0);
    let (code, out) = cloudweb(home.path(), &server, Some(&admin), &["teams", "add", "acme", "dana", "--role", "admin"]).await;
    assert_eq!(code, 0, "{out}");
    let (code, out) = cloudweb(home.path(), &server, Some(&admin), &["teams", "add", "globex", "dana", "--role", "admin"]).await;
    assert_eq!(code, 0, "{out}");
    let (code, out) = cloudweb(home.path(), &server, Some(&admin), &["--json", "teams", "members", "acme"]).await;
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("\"user\": \"dana\"") && out.contains("\"role\": \"admin\""), "{out}");
    // Login mappings: added, changed, listed, removed; a group in another
    // host's form is refused with the server's reason.
    for args in [["teams", "map", "github", "acme-org/web", "acme", "--role", "viewer"], ["teams", "map", "github", "acme-org/web", "acme", "--role", "deployer"], ["teams", "map", "gitea", "ops", "globex", "--role", "admin"]] {
        let (code, out) = cloudweb(home.path(), &server, Some(&admin), &args).await;
        assert_eq!(code, 0, "{args:?}: {out}");
    }
    let (code, out) = cloudweb(home.path(), &server, Some(&admin), &["teams", "map", "gitea", "ops/devs", "globex"]).await;
    assert!(code != 0 && out.contains("not a Gitea organization"), "{out}");
    let (code, out) = cloudweb(home.path(), &server, Some(&admin), &["teams", "unmap", "gitea", "ops", "globex"]).await;
    assert_eq!(code, 0, "{out}");
    let (code, out) = cloudweb(home.path(), &server, Some(&admin), &["teams", "mappings"]).await;
    assert_eq!(code, 0, "{out}");
    let lines: Vec<&str> = out.lines().filter(|l| l.contains("acme-org") || l.contains("ops")).collect();
    assert_eq!(lines.len(), 1, "{out}");
    assert!(lines[0].contains("github") && lines[0].contains("deployer"), "{out}");
    let (code, out) = cloudweb(home.path(), &server, Some(&admin), &["teams", "unmap", "gitea", "ops", "globex"]).await;
    assert!(code != 0 && out.contains("no mapping"), "{out}");
    // Edits made at the same moment all land: each saves at the revision
    // it read, and one that lost the race reads again and redoes its edit.
    let orgs = ["org-a", "org-b", "org-c", "org-d"];
    let edits = orgs.map(|org| {
        let (home, server, admin) = (home.path().to_path_buf(), server.clone(), admin.clone());
        tokio::spawn(async move { cloudweb(&home, &server, Some(&admin), &["teams", "map", "gitea", org, "globex", "--role", "viewer"]).await })
    });
    for edit in edits {
        let (code, out) = edit.await.unwrap();
        assert_eq!(code, 0, "{out}");
    }
    let (code, out) = cloudweb(home.path(), &server, Some(&admin), &["teams", "mappings"]).await;
    assert_eq!(code, 0, "{out}");
    assert!(orgs.iter().all(|org| out.contains(org)), "no edit is lost: {out}");
    // Through the API: a write at a revision that is no longer current
    // saves nothing and says why.
    let http = reqwest::Client::new();
    let read: serde_json::Value = http.get(format!("{server}/api/team-mappings")).bearer_auth(&admin).send().await.unwrap().json().await.unwrap();
    let revision = read["revision"].as_str().expect("a revision").to_string();
    let (code, out) = cloudweb(home.path(), &server, Some(&admin), &["teams", "unmap", "gitea", "org-d", "globex"]).await;
    assert_eq!(code, 0, "{out}");
    let stale = serde_json::json!({"mappings": [], "revision": revision});
    let answer = http.put(format!("{server}/api/team-mappings")).bearer_auth(&admin).json(&stale).send().await.unwrap();
    assert_eq!(answer.status().as_u16(), 409);
    assert!(answer.text().await.unwrap().contains("changed since they were read"));
    let (_, out) = cloudweb(home.path(), &server, Some(&admin), &["teams", "mappings"]).await;
    assert!(out.contains("org-a") && out.contains("acme-org"), "the stale write emptied nothing: {out}");

    // Root is acme's only owner: the team keeps them.
    let (code, out) = cloudweb(home.path(), &server, Some(&admin), &["teams", "remove", "acme", &root.name]).await;
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("must keep an owner"), "{out}");

    // Dana, in two teams, must say where a new app goes; the current team
    // (stored by `teams switch`) says it.
    let token = cluster.token(&dana, NewScope::default()).await;
    let (code, out) = cloudweb(home.path(), &server, Some(&token), &["login"]).await;
    assert_eq!(code, 0, "{out}");
    let create = ["apps", "create", "site", "--repo", "https://git.example.com/site.git", "--port", "8080"];
    let (code, out) = cloudweb(home.path(), &server, None, &create).await;
    assert_ne!(code, 0, "two teams and none named: {out}");
    assert!(out.contains("X-Cloudweb-Team"), "{out}");
    let (code, out) = cloudweb(home.path(), &server, None, &["teams", "switch", "globex"]).await;
    assert_eq!(code, 0, "{out}");
    let (code, out) = cloudweb(home.path(), &server, None, &create).await;
    assert_eq!(code, 0, "{out}");
    let team = state.store.team("globex").await.unwrap().unwrap();
    assert_eq!(state.store.app("site").await.unwrap().unwrap().team_id, team.id, "made in the current team");
    let (code, out) = cloudweb(home.path(), &server, None, &["teams"]).await;
    assert_eq!(code, 0);
    assert!(out.lines().any(|l| l.starts_with('*') && l.contains("globex")), "{out}");

    // The audit log: dana's creation is there; an edited row is found.
    let (code, out) = cloudweb(home.path(), &server, Some(&admin), &["audit", "--actor", "dana", "--action", "POST /api/apps"]).await;
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("dana") && out.contains("201"), "{out}");
    let (code, out) = cloudweb(home.path(), &server, Some(&admin), &["audit", "verify"]).await;
    assert_eq!(code, 0, "{out}");
    let db = sqlx::SqlitePool::connect(&format!("sqlite://{}", cluster._dir.path().join("state.db").display())).await.unwrap();
    sqlx::query("UPDATE audit_log SET actor = 'user:someone-else' WHERE seq = 2").execute(&db).await.unwrap();
    let (code, out) = cloudweb(home.path(), &server, Some(&admin), &["audit", "verify"]).await;
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("broken at entry 2"), "{out}");
}

/// The audit log cannot be written (a trigger refuses its rows, as a full
/// disk would): a change is refused with 503 and not made; reads go on;
/// with `--audit-failure warn` the change is made.
#[tokio::test]
async fn a_change_that_cannot_be_audited_is_refused_unless_the_cluster_says_warn() {
    for on_failure in [cloudweb_server::access::audit::OnFailure::Refuse, cloudweb_server::access::audit::OnFailure::Warn] {
        let cluster = Cluster::start_with(on_failure).await;
        let admin = cluster.admin.clone();
        let db = sqlx::SqlitePool::connect(&format!("sqlite://{}", cluster._dir.path().join("state.db").display())).await.unwrap();
        sqlx::query("CREATE TRIGGER audit_refused BEFORE INSERT ON audit_log BEGIN SELECT RAISE(FAIL, 'no room for the audit log'); END")
            .execute(&db)
            .await
            .unwrap();
        let body = json!({"name": "web", "repo_url": "https://git.example.com/web.git", "port": 8080});
        let (status, answer) = cluster.call(Some(&admin), Method::POST, "/api/apps", Some(body)).await;
        let made = cluster.state().store.app("web").await.unwrap().is_some();
        match on_failure {
            cloudweb_server::access::audit::OnFailure::Refuse => {
                assert_eq!(status, 503, "{answer}");
                assert!(answer["error"].as_str().unwrap().contains("audit log"), "{answer}");
                assert!(!made, "nothing is done unaudited");
            }
            cloudweb_server::access::audit::OnFailure::Warn => {
                assert_eq!(status, 201, "{answer}");
                assert!(made);
            }
        }
        assert_eq!(cluster.call(Some(&admin), Method::GET, "/api/apps", None).await.0, 200, "reads are not audited");
    }
}
