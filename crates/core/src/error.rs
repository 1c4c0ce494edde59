//! The one mapping from control-plane errors to HTTP answers. Messages are
//! meant for the caller; internal details are logged, not returned.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use cloudweb_protocol::{ErrorBody, ValidationError};

use crate::ca::CaError;
use crate::store::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    Unauthorized(String),
    #[error("{0}")]
    Forbidden(String),
    /// 403 for a certificate whose node is no longer registered; the body
    /// carries `code: node_not_registered` so the agent can stop.
    #[error("{0}")]
    NodeNotRegistered(String),
    /// 401 for a node certificate a renewal or re-join replaced; the body
    /// carries `code: certificate_replaced`.
    #[error("{0}")]
    CertificateReplaced(String),
    /// 503 from a control-plane replica that does not lead, to an agent:
    /// `code: not_leader` and the leader's URL when known.
    #[error("{message}")]
    NotLeader { message: String, leader: Option<String> },
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    TooLarge(String),
    #[error("{0}")]
    Unprocessable(String),
    /// 429 with `Retry-After: <seconds>`.
    #[error("{message}")]
    TooManyRequests { message: String, retry_after_s: u64 },
    /// The control plane cannot take writes now (its disk is full): retry
    /// later; nothing about the request was wrong.
    #[error("{0}")]
    Unavailable(String),
    /// An upstream service (GitLab) failed or answered nonsense.
    #[error("{0}")]
    BadGateway(String),
    #[error("internal error")]
    Internal(String),
}

impl ApiError {
    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ApiError::Unauthorized(_) | ApiError::CertificateReplaced(_) => StatusCode::UNAUTHORIZED,
            ApiError::Forbidden(_) | ApiError::NodeNotRegistered(_) => StatusCode::FORBIDDEN,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::Conflict(_) => StatusCode::CONFLICT,
            ApiError::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::Unprocessable(_) => StatusCode::UNPROCESSABLE_ENTITY,
            ApiError::TooManyRequests { .. } => StatusCode::TOO_MANY_REQUESTS,
            ApiError::Unavailable(_) | ApiError::NotLeader { .. } => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::BadGateway(_) => StatusCode::BAD_GATEWAY,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        if let ApiError::Internal(detail) = &self {
            tracing::error!(error = %detail, "request failed");
        }
        let code = match &self {
            ApiError::NodeNotRegistered(_) => Some(cloudweb_protocol::error_codes::NODE_NOT_REGISTERED.to_string()),
            ApiError::CertificateReplaced(_) => Some(cloudweb_protocol::error_codes::CERTIFICATE_REPLACED.to_string()),
            ApiError::NotLeader { .. } => Some(cloudweb_protocol::error_codes::NOT_LEADER.to_string()),
            _ => None,
        };
        let leader = match &self {
            ApiError::NotLeader { leader, .. } => leader.clone(),
            _ => None,
        };
        let retry_after = match &self {
            ApiError::TooManyRequests { retry_after_s, .. } => Some(*retry_after_s),
            _ => None,
        };
        let mut response = (self.status(), Json(ErrorBody { error: self.to_string(), code, leader })).into_response();
        if let Some(seconds) = retry_after {
            response.headers_mut().insert(axum::http::header::RETRY_AFTER, axum::http::HeaderValue::from(seconds));
        }
        response
    }
}

impl From<ValidationError> for ApiError {
    fn from(err: ValidationError) -> Self {
        ApiError::BadRequest(err.to_string())
    }
}

impl From<StoreError> for ApiError {
    fn from(err: StoreError) -> Self {
        if err.is_disk_full() {
            tracing::error!(error = %err, "a write failed: the control plane's disk is full");
            return ApiError::Unavailable("the control plane's disk is full; nothing was changed, try again once space is freed".to_string());
        }
        if err.is_unreachable() {
            tracing::error!(error = %err, "the database cannot be reached");
            return ApiError::Unavailable("the control plane cannot reach its database; nothing was changed, try again shortly".to_string());
        }
        if let StoreError::Fenced(_) = err {
            return ApiError::Unavailable(err.to_string());
        }
        ApiError::Internal(err.to_string())
    }
}

impl From<CaError> for ApiError {
    fn from(err: CaError) -> Self {
        match err {
            CaError::BadCsr(msg) => ApiError::BadRequest(format!("invalid csr: {msg}")),
            other => ApiError::Internal(other.to_string()),
        }
    }
}

/// Parses a JSON body into `T`, answering 400 with serde's reason (which
/// names the field and position) when it does not fit.
pub fn parse_json<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(|e| {
        let mut reason = e.to_string();
        cloudweb_protocol::misc::truncate_on_char(&mut reason, 200);
        ApiError::BadRequest(format!("invalid JSON body: {reason}"))
    })
}
