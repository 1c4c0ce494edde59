//! What every push webhook reads and answers alike: a header's text, the
//! "ignored" answer, a full commit id, and the delivery id of a body that
//! signs no time. A leaf: the webhook modules (`webhooks.rs`, `github.rs`,
//! `gitea.rs`) and `change_requests.rs` use it, it uses none of them.

use axum::http::{HeaderMap, StatusCode};
use axum::Json;
use cloudweb_api_types::git::{WebhookAnswer, WebhookIgnored};
use sha2::{Digest, Sha256};

pub(super) fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok()).map(str::trim).filter(|v| !v.is_empty())
}

pub(super) fn ignored(reason: &str) -> (StatusCode, Json<WebhookAnswer>) {
    (StatusCode::OK, Json(WebhookAnswer::Ignored(WebhookIgnored { ignored: reason.to_string(), deployment: None })))
}

/// A full commit id: 40 (SHA-1) or 64 (SHA-256) lowercase hex digits.
pub(super) fn commit_id(text: &str) -> bool {
    (text.len() == 40 || text.len() == 64) && text.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// The delivery id of a body that signs no time: its digest.
pub(super) fn body_delivery(body: &[u8]) -> String {
    format!("body-sha256:{}", hex::encode(Sha256::digest(body)))
}

