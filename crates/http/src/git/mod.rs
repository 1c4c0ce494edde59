//! The git routes: `oauth.rs` (`/api/auth/gitlab/login` and `/callback`),
//! `webhooks.rs` (`POST /api/webhooks/gitlab` and
//! `/api/webhooks/generic/{app}`), `api.rs` (the GitLab settings, accounts,
//! projects and branches routes, and what app creation and deletion do
//! with a provider), `github.rs` (the GitHub App's settings, installations,
//! repositories and its webhook, `POST /api/webhooks/github`),
//! `github_login.rs` (`/api/auth/github/login` and `/callback`, and the
//! login settings), `gitea.rs` (Gitea and Forgejo: settings, accounts, the
//! repository picker and each app's webhook, `POST
//! /api/webhooks/gitea/{app}`), `gitea_login.rs` (`/api/auth/gitea/login`
//! and `/callback`), `login_flow.rs` (what the logins share). The
//! providers and their glue are `cloudweb_core::git`, re-exported here.

pub mod api;
pub mod change_requests;
mod events;
pub mod gitea;
pub mod gitea_login;
pub mod github;
pub mod github_login;
pub mod login_flow;
pub mod oauth;
pub mod webhooks;

pub use cloudweb_core::git::*;
