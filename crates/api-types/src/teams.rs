//! Teams, their members, cluster roles, deploy tokens and the audit log:
//! `/api/teams`, `/api/users/{id}/cluster-role`,
//! `/api/apps/{name}/deploy-tokens` and `/api/audit`.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// A team and the caller's role in it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct TeamRoleView {
    pub team: String,
    /// `viewer`, `deployer`, `admin` or `owner`.
    pub role: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct TeamView {
    pub id: String,
    pub name: String,
    pub created_at: String,
    /// The caller's role in it (through a membership or a cluster role).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct TeamList {
    pub teams: Vec<TeamView>,
}

/// `POST /api/teams`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"name": "acme", "owner": "alice"}))]
pub struct NewTeam {
    /// 1 to 40 lowercase letters, digits and inner hyphens.
    pub name: String,
    /// Its first owner (a user's name or id); absent: the caller.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct MemberView {
    pub user_id: String,
    pub user: String,
    pub role: String,
    /// `manual`, or the login mapping that granted it (`gitlab:<group>`,
    /// `github:<org or org/team>`, `gitea:<org>`).
    pub source: String,
    pub added_at: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct MemberList {
    pub members: Vec<MemberView>,
}

/// `PUT /api/teams/{team}/members/{user}`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"role": "deployer"}))]
pub struct SetMember {
    /// `viewer`, `deployer`, `admin` or `owner`.
    pub role: String,
}

/// `PUT /api/users/{id}/cluster-role`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"cluster_role": "cluster-viewer"}))]
pub struct SetClusterRole {
    /// `cluster-admin`, `cluster-viewer`, or null for none.
    pub cluster_role: Option<String>,
}

/// An app's deploy token, without the token itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct DeployTokenView {
    pub id: String,
    pub app: String,
    pub name: String,
    pub prefix: String,
    /// Who made it (`user:<id>`, `token:<id>` or `admin-token`).
    pub created_by: String,
    pub created_at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<String>,
    pub last_used_at: Option<String>,
    pub revoked_at: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct DeployTokenList {
    pub tokens: Vec<DeployTokenView>,
}

/// `POST /api/apps/{name}/deploy-tokens`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"name": "github-actions"}))]
pub struct NewDeployToken {
    pub name: String,
    /// When it stops working (RFC 3339); absent: never.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<String>,
}

/// A deploy token just made: the only time `token` is shown.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct CreatedDeployToken {
    #[serde(flatten)]
    pub view: DeployTokenView,
    /// Use as `Authorization: Bearer <token>`. Shown only now.
    pub token: String,
}

/// One audit log entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct AuditEntryView {
    pub seq: i64,
    /// RFC 3339.
    pub at: String,
    /// Ties a request's `request` entry to its `response` entry.
    pub request_id: String,
    /// `request` (about to run), `response` (its outcome) or `event` (a
    /// login, a refusal, a node joining).
    pub phase: String,
    /// `user:<id>`, `token:<id>`, `deploy-token:<id>`, `admin-token`,
    /// `anonymous` or `node:<id>`.
    pub actor: String,
    /// The actor's user name, when a user acted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub actor_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub team: Option<String>,
    /// The caller's address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// `METHOD /route/{template}`, or what happened (`login`).
    pub action: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// An HTTP status, `started`, `ok`, or `refused: <why>`.
    pub result: String,
    pub hash: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct AuditList {
    pub entries: Vec<AuditEntryView>,
}

/// What `POST /api/audit/verify` found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct AuditVerification {
    /// Whether every entry follows from the one before.
    pub intact: bool,
    /// How many entries were checked (up to the first broken one).
    pub entries: i64,
    /// The first entry that does not follow, and why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub broken_at: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// A git host's group that grants a team role at login.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"provider": "gitlab", "group": "acme/devs", "team": "acme", "role": "deployer"}))]
pub struct TeamMapping {
    /// `gitlab`, `github` or `gitea`.
    pub provider: String,
    /// GitLab: the group's full path (`acme/devs`); GitHub: an
    /// organization (`acme`) or a team (`acme/team-slug`); Gitea: an
    /// organization. Matched exactly, ignoring case.
    pub group: String,
    /// The team's name.
    pub team: String,
    /// `viewer`, `deployer`, `admin` or `owner`.
    pub role: String,
}

/// `GET`/`PUT /api/team-mappings`: every mapping.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TeamMappings {
    pub mappings: Vec<TeamMapping>,
    /// Read: the list's revision. Replace: when given, the list is
    /// replaced only while it is still at this revision (409 otherwise),
    /// so two edits made at once cannot lose one; without it, the list is
    /// replaced whatever it holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<String>,
}
