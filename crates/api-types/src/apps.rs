//! Apps: `/api/apps`, `/api/apps/{name}` and what hangs off it (env,
//! domains, certificates, deploy, rollback).

use std::collections::BTreeMap;

pub use cloudweb_protocol::{Liveness, Readiness};
use cloudweb_protocol::{BuildSettings, Spa, Strategy};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

fn is_false(value: &bool) -> bool {
    !*value
}

/// Build settings as a user sends them: unknown fields are an error here
/// (a typo should not be silently ignored), unlike on the agent protocol.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"build_cmd": "npm run build", "output_dir": "dist"}))]
pub struct BuildInput {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub install_cmd: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub build_cmd: Option<String>,
    /// Relative to the checkout; cannot climb out of it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_dir: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spa: Option<Spa>,
}

impl From<BuildInput> for BuildSettings {
    fn from(input: BuildInput) -> Self {
        BuildSettings { install_cmd: input.install_cmd, build_cmd: input.build_cmd, output_dir: input.output_dir, spa: input.spa }
    }
}

/// A GitLab project named when creating an app: its id, or its path.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum ProjectRef {
    Id(i64),
    /// `group/name`.
    Path(String),
}

/// `POST /api/apps`: an app from a git URL (`repo_url`), a GitLab project
/// (`gitlab_project`), a GitHub repository (`github_repository`) or a
/// Gitea/Forgejo repository (`gitea_repository`).
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"name": "web", "repo_url": "https://git.example.com/acme/web.git", "port": 8080}))]
pub struct CreateApp {
    /// 1 to 63 lowercase letters, digits and `-`; also the first label of
    /// the app's default host.
    pub name: String,
    /// Any git URL; absent for an app made from a GitLab project.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub repo_url: String,
    /// The branch to deploy: `main`, or the GitLab project's default branch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub branch: Option<String>,
    /// Make the app from this GitLab project (id or `group/name`): its
    /// clone URL, a push webhook, clone credentials per deploy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gitlab_project: Option<ProjectRef>,
    /// Which logged-in GitLab identity acts for the app (when several).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gitlab_account: Option<i64>,
    /// Make the app from this GitHub repository (`owner/name`), which the
    /// GitHub App must be installed on: its clone URL, the App's webhook,
    /// a repository-scoped token per deploy, commit statuses.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub github_repository: Option<String>,
    /// Make the app from this Gitea or Forgejo repository (`owner/name`),
    /// through a logged-in Gitea identity: its clone URL, a push webhook
    /// of its own, the identity's hour-long token per deploy, commit
    /// statuses.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gitea_repository: Option<String>,
    /// Which logged-in Gitea identity acts for the app (when several).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gitea_account: Option<i64>,
    /// For an app from any other git URL: make a webhook URL and secret
    /// for the generic, HMAC-signed push webhook.
    #[serde(default, skip_serializing_if = "is_false")]
    pub webhook: bool,
    /// The port the app listens on (it also gets `PORT`).
    pub port: u16,
    /// Custom domains, besides `<name>.<base domain>`.
    #[serde(default)]
    pub domains: Vec<String>,
    /// Static-site build settings (they make an `auto` app `static`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub build: Option<BuildInput>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strategy: Option<Strategy>,
    /// 1 to 20 (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instances: Option<u32>,
    /// CPU cores reserved and allowed per instance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<f64>,
    /// Memory in bytes reserved and allowed per instance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<u64>,
    /// The path the health check asks (default `/`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health_path: Option<String>,
    /// How long a new instance may take to answer it (default 60).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health_timeout_seconds: Option<u32>,
    /// How long a build may take (default 30 min, at most 2 h).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub build_timeout_seconds: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub git_username: Option<String>,
    /// Goes with `git_username`; stored sealed, never returned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub git_password: Option<String>,
    /// `blue-green` (default) or `recreate`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<Rollout>,
    /// The app's own ssh private key, for ssh:// and scp-like URLs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub git_ssh_key: Option<String>,
    /// `known_hosts` lines of the git host (as `ssh-keyscan` prints them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub git_known_hosts: Option<String>,
    /// Probe the health path of every running instance and restart one
    /// that stops answering (default: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub liveness: Option<Liveness>,
    /// Probe the health path of every running instance and keep one out of
    /// the ingress's upstreams while it fails (default: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub readiness: Option<Readiness>,
}

/// How a deploy replaces the app's instances.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Rollout {
    /// The new instance starts beside the old one, which stops once the
    /// new one is healthy (no downtime): the default.
    #[default]
    BlueGreen,
    /// The old instances stop first, then the new one starts (downtime,
    /// measured in the deployment's log): for apps that cannot share their
    /// files with a second copy of themselves.
    Recreate,
}

impl Rollout {
    pub fn as_str(self) -> &'static str {
        match self {
            Rollout::BlueGreen => "blue-green",
            Rollout::Recreate => "recreate",
        }
    }
}

/// `PATCH /api/apps/{name}`: the settings a user may change after
/// creation. A field left out stays as it is; `null` puts `build`, `cpu`,
/// `memory` and `build_timeout_seconds` back to their defaults.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"instances": 2, "cpu": null}))]
pub struct AppPatch {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub branch: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    #[serde(default, deserialize_with = "crate::present", skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<BuildInput>)]
    pub build: Option<Option<BuildInput>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strategy: Option<Strategy>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instances: Option<u32>,
    #[serde(default, deserialize_with = "crate::present", skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<f64>)]
    pub cpu: Option<Option<f64>>,
    #[serde(default, deserialize_with = "crate::present", skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<u64>)]
    pub memory: Option<Option<u64>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health_path: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health_timeout_seconds: Option<u32>,
    #[serde(default, deserialize_with = "crate::present", skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<u32>)]
    pub build_timeout_seconds: Option<Option<u32>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<Rollout>,
    /// `null` removes the probe.
    #[serde(default, deserialize_with = "crate::present", skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Liveness>)]
    pub liveness: Option<Option<Liveness>>,
    /// `null` removes the probe.
    #[serde(default, deserialize_with = "crate::present", skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Readiness>)]
    pub readiness: Option<Option<Readiness>>,
}

/// The link between an app and its git provider (absent for an app with
/// no push webhook).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct GitLink {
    /// `gitlab` or `generic`.
    pub provider: String,
    /// The GitLab project's id.
    pub project_id: Option<i64>,
    /// The GitLab project's path.
    pub project: Option<String>,
    /// The GitLab user id that acts for the app.
    pub account: Option<i64>,
    pub webhook_registered: bool,
    /// Only in the answer that created an app with a generic webhook: how
    /// to call it, and its secret (shown this once).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub webhook: Option<WebhookSetup>,
}

/// How to call an app's generic push webhook.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct WebhookSetup {
    pub url: String,
    /// Shown this once; stored sealed.
    pub secret: String,
    pub signature_header: String,
    /// The header with the unix time the signature covers.
    pub timestamp_header: String,
    pub signature: String,
    pub body: String,
    /// A delivery id the sender may add; it is not signed, so redeliveries
    /// are told by the signed timestamp and body instead.
    pub delivery_header: String,
}

/// An app as the API shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct AppView {
    pub name: String,
    pub repo_url: String,
    pub branch: String,
    pub port: i64,
    pub domains: Vec<String>,
    /// Static-site build settings, `null` when none are set.
    pub build: Option<BuildSettings>,
    /// `auto`, `dockerfile`, `static` or `buildpacks`.
    pub strategy: String,
    pub instances: i64,
    pub cpu: Option<f64>,
    /// Bytes per instance.
    pub memory: Option<i64>,
    pub health_path: String,
    pub health_timeout_seconds: i64,
    pub build_timeout_seconds: i64,
    /// `blue-green` or `recreate`.
    pub rollout: String,
    /// The liveness probe agents run on its instances, if any.
    pub liveness: Option<Liveness>,
    /// The readiness probe agents run on its instances, if any.
    pub readiness: Option<Readiness>,
    /// Names only: values never leave the control plane through the API.
    pub env: Vec<String>,
    /// Whether a git user name and password are stored.
    pub git_credentials: bool,
    /// Whether an ssh key is stored.
    pub git_ssh_key: bool,
    pub created_at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub git: Option<GitLink>,
    /// Why the app's instances cannot be moved off a node that is leaving
    /// or unreachable (e.g. waiting for the node that holds its volume).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting: Option<String>,
    /// How many of its running instances crash-loop now (`cloudweb top`
    /// and the app page say which, and why).
    #[serde(default)]
    pub crash_looping: i64,
}

/// `GET /api/apps`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct AppList {
    pub apps: Vec<AppView>,
}

/// `PUT /api/apps/{name}/env`: the whole environment, replacing the old.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(transparent)]
#[schema(example = json!({"DATABASE_URL": "postgres://db/web", "LOG_LEVEL": "info"}))]
pub struct EnvVars(pub BTreeMap<String, String>);

/// `PATCH /api/apps/{name}/env`: sets some variables and removes others,
/// keeping the rest. A name both set and unset is a 400.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"set": {"LOG_LEVEL": "debug"}, "unset": ["OLD_FLAG"]}))]
pub struct EnvPatch {
    #[serde(default)]
    pub set: BTreeMap<String, String>,
    #[serde(default)]
    pub unset: Vec<String>,
}

/// The names of an app's variables after a change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct EnvView {
    pub app: String,
    pub env: Vec<String>,
}

/// `PUT /api/apps/{name}/domains`: the custom domains, replacing the old.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(transparent)]
#[schema(example = json!(["www.example.com", "example.com"]))]
pub struct DomainList(pub Vec<String>);

/// The custom domains after a change (lowercased).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct DomainsView {
    pub app: String,
    pub domains: Vec<String>,
}

/// `POST /api/apps/{name}/deploy` (the body is optional).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"commit": "0123456789abcdef0123456789abcdef01234567"}))]
pub struct DeployRequest {
    /// A full commit id; the branch's head when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commit: Option<String>,
    /// Let the app's older deployments that are still queued, building or
    /// starting finish instead of superseding them now. Whichever way,
    /// the newest requested deployment is the one that ends up running.
    #[serde(default, skip_serializing_if = "is_false")]
    pub keep_in_flight: bool,
}

/// `POST /api/apps/{name}/rollback`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RollbackRequest {
    /// A deployment of this app that ran.
    pub deployment_id: String,
}

/// A deployment just queued by a deploy or a rollback.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[schema(example = json!({"id": "d-01hx", "state": "queued", "error": null}))]
pub struct DeploymentQueued {
    pub id: String,
    pub state: String,
    pub error: Option<String>,
}

/// What users see of one host's certificate.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct CertificateStatus {
    pub host: String,
    /// `internal` (no ACME: a name that cannot be public), `issuing` (no
    /// certificate yet), `valid`, `renewing` (past two thirds of its
    /// life, or expired while a new order is under way), `failed` (no
    /// usable certificate and the last order failed).
    pub state: String,
    pub not_before: Option<String>,
    pub not_after: Option<String>,
    /// The issuing CA's name, as the certificate gives it.
    pub issuer: Option<String>,
    /// ACME orders placed for the host.
    pub orders: i64,
    /// Why the last order failed, unless one succeeded since.
    pub last_error: Option<String>,
    pub last_error_at: Option<String>,
    /// When the next order will be placed, after a failure.
    pub next_attempt_at: Option<String>,
}

/// `GET /api/apps/{name}/certificates`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct CertificateList {
    pub certificates: Vec<CertificateStatus>,
}
