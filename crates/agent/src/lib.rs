//! The cloud-web node agent as a library. It only ever talks to the control
//! plane over mTLS (after a join that pins the cluster CA by fingerprint),
//! and drives this node's Docker Engine.

pub mod build;
pub mod capacity;
pub mod client;
pub mod commands;
pub mod deploy;
pub mod health;
pub mod identity;
pub mod ingress;
pub mod join;
pub mod mesh;
pub mod run;
pub mod runtime;
pub mod usage;

/// This agent's version, sent in `X-Cloudweb-Agent-Version`.
pub const AGENT_VERSION: &str = env!("CARGO_PKG_VERSION");
