//! The error body every user-API error answer carries.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Every 4xx and 5xx answer of the user API: `{"error": "…"}`, plus a
/// `code` for the few errors a program acts on. The same shape as the agent
/// listener's `cloudweb_protocol::ErrorBody`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[schema(as = Error, example = json!({"error": "no app \"web\""}))]
pub struct ErrorBody {
    /// What went wrong, for a person.
    pub error: String,
    /// A machine-readable code, for the few errors that have one; absent
    /// on the others.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
}

impl From<cloudweb_protocol::ErrorBody> for ErrorBody {
    fn from(body: cloudweb_protocol::ErrorBody) -> Self {
        ErrorBody { error: body.error, code: body.code }
    }
}
