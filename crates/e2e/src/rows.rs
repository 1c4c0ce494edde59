//! Rows written straight into a state database, for tests and benchmarks
//! that need many things without going through the API.

use cloudweb_server::store::{AppRow, DeploymentRow};

/// An app of `team_id` that was never deployed.
pub fn app(name: &str, team_id: &str) -> AppRow {
    AppRow {
        name: name.into(),
        repo_url: "https://git.example.com/team/site.git".into(),
        branch: "main".into(),
        port: 8080,
        domains: "[]".into(),
        build: None,
        strategy: "auto".into(),
        instances: 1,
        cpu: None,
        memory_bytes: None,
        health_path: "/".into(),
        health_timeout_s: 30,
        build_timeout_s: None,
        env_sealed: None,
        git_credentials_sealed: None,
        created_at: 1,
        rollout: "blue-green".into(),
        liveness: None,
        readiness: None,
        team_id: team_id.into(),
    }
}

/// A queued source deployment of `app`.
pub fn queued_deployment(id: &str, app: &str, now_ms: i64) -> DeploymentRow {
    DeploymentRow {
        id: id.into(),
        seq: 0,
        app: app.into(),
        kind: "source".into(),
        commit_sha: None,
        rollback_of: None,
        state: "queued".into(),
        image: None,
        error: None,
        created_at: now_ms,
        updated_at: now_ms,
    }
}
