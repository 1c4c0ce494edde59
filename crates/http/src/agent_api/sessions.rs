//! `POST /agent/v1/sessions/{session_id}/attach`: a node dials back for an
//! exec or port-forward session it was told to open. The request is an
//! HTTP/1.1 upgrade to `cloudweb-session/1`; after the `101` the
//! connection carries session frames, and it goes to the user's request
//! that waits for it (see `cloudweb_core::sessions`). Only the node the
//! session was opened on may attach it, and only once.

use std::sync::Arc;

use axum::extract::{Path, Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use cloudweb_protocol::sessions::{self, UPGRADE};
use hyper_util::rt::TokioIo;

use super::AuthedNode;
use crate::error::ApiError;
use crate::AppState;

pub async fn attach(
    State(state): State<Arc<AppState>>,
    Extension(AuthedNode(node_id)): Extension<AuthedNode>,
    Path(session_id): Path<String>,
    request: Request,
) -> Response {
    if let Err(err) = sessions::session_id(&session_id) {
        return ApiError::BadRequest(err.to_string()).into_response();
    }
    let asks_upgrade = request.headers().get(header::UPGRADE).and_then(|v| v.to_str().ok()).is_some_and(|v| v.eq_ignore_ascii_case(UPGRADE));
    if !asks_upgrade {
        return ApiError::BadRequest(format!("a session is attached with Upgrade: {UPGRADE}")).into_response();
    }
    if !state.sessions.is_waiting(&session_id) {
        let error = format!("no request waits for session {session_id} on this control plane");
        return (StatusCode::GONE, axum::Json(cloudweb_protocol::ErrorBody { error, code: None, leader: None })).into_response();
    }
    match state.store.attach_exec_session(&session_id, &node_id, state.clock.now_ms()).await {
        Ok(true) => {}
        Ok(false) => return ApiError::NotFound(format!("no session {session_id} is opening on node {node_id}")).into_response(),
        Err(err) => return ApiError::from(err).into_response(),
    }
    let upgrade = hyper::upgrade::on(request);
    tokio::spawn(async move {
        match upgrade.await {
            Ok(upgraded) => {
                if state.sessions.deliver(&session_id, Box::new(TokioIo::new(upgraded))).is_err() {
                    // The user left meanwhile: dropping the stream tells the node.
                    tracing::debug!(session = %session_id, "a session's node dialed back after its user left");
                }
            }
            Err(err) => tracing::warn!(session = %session_id, error = %err, "a session's dial-back failed to upgrade"),
        }
    });
    let mut response = StatusCode::SWITCHING_PROTOCOLS.into_response();
    response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    response.headers_mut().insert(header::UPGRADE, HeaderValue::from_static(UPGRADE));
    response
}
