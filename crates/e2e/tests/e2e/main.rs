//! The end-to-end suite, one test binary: every module is one area's tests
//! (its file says what it covers). One binary links the control plane and
//! its dependencies once instead of once per area, which keeps the build's
//! disk and link time small; the runner (cargo-nextest) still gives each
//! test its own process. One area alone: `cargo nextest run -p cloudweb-e2e
//! -E 'test(/^<area>::/)'`.

mod accounts;
mod acme;
mod alerts;
mod answers;
mod audit_log;
mod api_flood;
mod autoscale;
mod backups;
mod browser;
mod cli;
mod compat;
mod conformance;
mod connection_flood;
mod control_plane_restore;
mod dashboard;
mod deploy;
mod deploy_order;
mod exec;
mod faults;
mod fixtures;
mod fleet_reconnect;
mod foundation;
mod gitea;
mod github;
mod github_login;
mod gitlab;
mod gitlab_private_ca;
mod in_process;
mod ingress;
mod installer;
mod lifecycle;
mod log_store;
mod mesh;
mod nodes;
mod openapi;
mod permissions;
mod previews;
mod probe_checks;
mod readiness;
mod registry_access;
mod registry_s3;
mod renewal;
mod replica_deploys;
mod replicas;
mod runtime_logs;
mod scale;
mod security;
mod server_hardening;
mod service_major_upgrade;
mod services;
mod services_mesh;
mod services_ops;
mod state_postgres;
mod tasks;
mod team_mappings;
mod tidy;
mod volume_moves;
mod volumes;
mod volumes_placement;
