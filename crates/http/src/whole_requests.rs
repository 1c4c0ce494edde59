//! Requests run to their end whatever the client does: both listeners
//! put this in front of every handler.

use axum::extract::Request;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::error::ApiError;

/// Runs the handler in its own task, so a client that hangs up does not
/// cancel it halfway through a change (the user API's handlers write in
/// several steps: an app row and its route table, a deployment and its
/// placement). The answer is simply not delivered.
pub async fn run_to_completion(request: Request, next: Next) -> Response {
    match tokio::spawn(next.run(request)).await {
        Ok(response) => response,
        Err(err) => ApiError::Internal(format!("request handler failed: {err}")).into_response(),
    }
}
