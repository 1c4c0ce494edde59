//! Preview environments: `/api/apps/{name}/previews...`.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// `PUT /api/apps/{name}/previews/settings`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"enabled": true, "max": 5, "ttl_seconds": 604800, "database": "empty"}))]
pub struct PreviewSettingsInput {
    pub enabled: bool,
    /// At most this many previews at once, 1 to 20 (default 5): a new one
    /// past it removes the one pushed to longest ago.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max: Option<i64>,
    /// A preview with no push for this long is removed: an hour to 90
    /// days (default 7 days).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_seconds: Option<i64>,
    /// For each database service the app is linked to, a preview gets:
    /// `none` (the default: no database link), `empty` (a new service of
    /// the same kind and version) or `latest-backup` (a new service
    /// restored from that service's newest backup; empty for a fork's
    /// request). Deleted with the preview; their volumes are kept until
    /// deleted by name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub database: Option<String>,
    /// Instances of each preview (1 to 20; `null`: the app's own number).
    #[serde(default, deserialize_with = "crate::present", skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<u32>)]
    pub instances: Option<Option<u32>>,
    /// CPU cores per preview instance (`null`: the app's).
    #[serde(default, deserialize_with = "crate::present", skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<f64>)]
    pub cpu: Option<Option<f64>>,
    /// Memory in bytes per preview instance (`null`: the app's).
    #[serde(default, deserialize_with = "crate::present", skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<u64>)]
    pub memory: Option<Option<u64>>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct PreviewSettingsView {
    pub enabled: bool,
    pub max: i64,
    pub ttl_seconds: i64,
    /// `none`, `empty` or `latest-backup`.
    pub database: String,
    /// `null`: the app's.
    pub instances: Option<i64>,
    pub cpu: Option<f64>,
    pub memory: Option<i64>,
}

/// One preview.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct PreviewView {
    /// The pull or merge request's number.
    pub number: i64,
    /// The app that runs it, `<app>-pr-<number>`.
    pub app: String,
    /// `awaiting-approval` (from a fork, not built until approved) or `active`.
    pub state: String,
    pub url: String,
    pub branch: String,
    pub commit: String,
    pub from_fork: bool,
    /// Who approved the head of a fork's request.
    pub approved_by: Option<String>,
    /// The state of its newest deployment, if any.
    pub deployment: Option<String>,
    /// The database services made for it.
    pub services: Vec<String>,
    pub created_at: String,
    /// The last push (or approval): the TTL counts from here.
    pub updated_at: String,
}

/// `GET /api/apps/{name}/previews`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct PreviewList {
    pub settings: PreviewSettingsView,
    /// The variables previews never get.
    pub production_only: Vec<String>,
    /// The names of the variables previews get on top of the app's.
    pub preview_env: Vec<String>,
    pub previews: Vec<PreviewView>,
}

/// `PUT /api/apps/{name}/env/production-only`: the names of the app's
/// variables its previews never get (they need not be set yet).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ProductionOnly {
    pub names: Vec<String>,
}
