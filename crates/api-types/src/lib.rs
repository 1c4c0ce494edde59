//! The bodies of the cloud-web user API (`--api-listen`, `/api/...`):
//! every request and response body and the error body, typed once, with
//! `serde` for the wire and `utoipa::ToSchema` for the OpenAPI document.
//! The server deserializes requests into these types and serializes its
//! answers from them, the dashboard reads them, and the CLI (`cloudweb`)
//! sends and reads them, so a renamed field breaks the build, not a run.
//!
//! This crate must never do HTTP, I/O or server logic: it holds shapes,
//! their documentation and examples, and nothing that needs a database, a
//! clock or a socket. Checks that need only the body (a name's syntax) stay
//! in `cloudweb-protocol::validate`; checks that need the server's state
//! stay in the server. Shapes the agent protocol already defines (the route
//! table, a node's health and usage samples, build settings, a queued
//! command) are `cloudweb-protocol`'s, reused here.

pub mod accounts;
pub mod backups;
pub mod apps;
pub mod alerts;
pub mod autoscale;
pub mod control_planes;
pub mod deployments;
pub mod error;
pub mod git;
pub mod gitea;
pub mod github;
pub mod nodes;
pub mod previews;
pub mod scale;
pub mod services;
pub mod sessions;
pub mod tasks;
pub mod teams;
pub mod traffic;
pub mod volumes;

pub use error::ErrorBody;

/// A field that is present (even as `null`) is `Some`; one left out is
/// `None` (with `#[serde(default)]`). For `PATCH` bodies, where `null`
/// means "back to the default" and a missing field "leave it".
pub fn present<'de, T: serde::Deserialize<'de>, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Option<Option<T>>, D::Error> {
    <Option<T> as serde::Deserialize>::deserialize(deserializer).map(Some)
}

#[cfg(test)]
mod tests;
