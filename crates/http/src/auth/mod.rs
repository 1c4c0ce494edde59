//! Accounts over HTTP: the login, logout, token and user routes
//! (`routes`) and the guard in front of every authenticated route
//! (`guard`). Users, sessions, tokens and login limits themselves are
//! `cloudweb_core::auth`, re-exported here.

pub mod authorize;
pub mod guard;
pub mod routes;

pub use cloudweb_core::auth::*;
