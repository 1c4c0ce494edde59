//! Git hosts, as the control plane sees them: the [`GitProvider`]
//! interface (what a deploy needs from a host: projects, branches, a push
//! webhook, short-lived clone credentials, commit statuses) and its
//! providers: GitLab's REST API v4 and OAuth endpoints (`gitlab`), GitHub
//! as a GitHub App (`github`, and its user login `github_login`), Gitea and
//! Forgejo through API v1 and their OAuth 2 provider (`gitea`), and any
//! git URL with no API behind it (`generic`).
//!
//! This crate only speaks to git hosts. It must never touch the state
//! database, the control plane's shared state or HTTP routing: the glue
//! that links apps to projects, refreshes tokens and posts statuses as a
//! deployment moves is `cloudweb_core::git`, and the routes (login,
//! webhooks, settings) are `cloudweb_http::git`.

pub mod generic;
pub mod gitea;
pub mod github;
pub mod github_login;
pub mod gitlab;
pub mod provider;

pub use provider::{
    Branch, CloneCredentials, CommitState, CommitStatus, GitProvider, Project, ProviderError, Repo,
};
