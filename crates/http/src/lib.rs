//! The control plane's HTTP layer: the user API (`api`: JSON routes, the
//! OpenAPI document, `/metrics`), the agent listener (`agent_api`: mutual
//! TLS, the protocol's routes, connection limits), the account routes and
//! the guard in front of every authenticated route (`auth`), and the git
//! routes (`git`: GitLab login, webhooks, settings).
//!
//! It owns turning requests into calls on `cloudweb-core` and results into
//! answers. It must never hold SQL (that is `cloudweb-store`), keep state
//! of its own beyond a request, or render the dashboard's HTML
//! (`cloudweb-web`, which sits above it and calls the same handlers).

pub mod agent_api;
pub mod api;
pub mod auth;
pub mod connections;
pub mod error;
pub mod git;
pub mod whole_requests;

// The domain under the paths these modules use (`crate::store`,
// `crate::deploy`, ...): one crate below, re-exported.
pub use cloudweb_core::{
    access, acme, ca, clock, command_context, config, deploy, deployment_state, flash, hub, listener_cert,
    live, mesh_address, queue_command, registry, registry_credentials, remove_node, routes,
    runtime_logs, secrets, service_ops, services, store, volume_moves, volumes, AgentBinary, AppState,
};
