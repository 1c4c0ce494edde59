//! The HTTP side of errors: the failure kinds and their answers are
//! `cloudweb_core::error` (re-exported here); this adds reading bodies,
//! and the body limit both listeners enforce (the error's OpenAPI shape is
//! `cloudweb_api_types::ErrorBody`).

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

pub use cloudweb_core::error::*;

/// A request body, or the reason it could not be read (too large, cut
/// off), as a JSON error.
pub fn body_bytes(
    body: Result<axum::body::Bytes, axum::extract::rejection::BytesRejection>,
) -> Result<axum::body::Bytes, ApiError> {
    body.map_err(|rejection| {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::TooLarge("request body is larger than 1 MiB".to_string())
        } else {
            ApiError::BadRequest(format!(
                "cannot read the request body: {}",
                rejection.body_text()
            ))
        }
    })
}

/// The largest request body either listener reads.
pub const MAX_BODY_BYTES: usize = 1024 * 1024;

/// Answers 413 for a body whose declared length is over [`MAX_BODY_BYTES`]
/// before anything reads it. Reading it first would make hyper send
/// `100 Continue` to a client that asked for it, and then close the
/// connection mid-upload, so such a client would see a broken pipe instead
/// of the answer.
pub async fn refuse_declared_oversize(
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let declared = request
        .headers()
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse::<u64>().ok());
    if declared.is_some_and(|length| length > MAX_BODY_BYTES as u64) {
        return ApiError::TooLarge("request body is larger than 1 MiB".to_string()).into_response();
    }
    next.run(request).await
}
