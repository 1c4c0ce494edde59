//! `cloudweb services`: managed databases (PostgreSQL, Redis/Valkey,
//! MariaDB) and the apps linked to them.

use clap::{Subcommand, ValueEnum};
use std::time::{Duration, Instant};

use cloudweb_api_types::services::{CreateLink, CreateService, LinkView, MajorUpgradeView, ServiceKind, ServiceList, ServiceView, ServiceLogsView, UpgradeService};
use reqwest::Method;
use serde_json::json;

use crate::client::{segment, Api};
use crate::render::{self, cell, clean, table};
use crate::Failure;

#[derive(Clone, Copy, ValueEnum)]
pub enum Kind {
    Postgres,
    Redis,
    Mariadb,
}

#[derive(Subcommand)]
pub enum ServicesCommand {
    /// Every service: type, node, state, address, linked apps.
    #[command(visible_alias = "ls")]
    List,
    /// Create a service; its node starts it with generated credentials and
    /// its data on a volume (svc-NAME).
    Create {
        name: String,
        #[arg(long = "type", value_enum)]
        kind: Kind,
        /// Image tag (with the official images), e.g. 16.
        #[arg(long)]
        version: Option<String>,
        /// A node's id or name (default: the scheduler's choice).
        #[arg(long)]
        node: Option<String>,
        /// Memory limit in MiB.
        #[arg(long, value_name = "MIB", value_parser = clap::value_parser!(u64).range(64..=1_048_576))]
        memory: Option<u64>,
    },
    /// One service.
    Show { name: String },
    /// Give an app the service's connection URL (DATABASE_URL or
    /// REDIS_URL unless --as) from its next deploy on.
    Link {
        service: String,
        app: String,
        /// The variable name.
        #[arg(long = "as", value_name = "VARIABLE")]
        variable: Option<String>,
    },
    /// Take the variable away from the app's next deploy on.
    Unlink { service: String, app: String },
    /// Give the service a new password: its node makes the database take
    /// it, linked apps are redeployed with the new URL, and the old one
    /// stops working. Waits until that is done unless --no-wait.
    RotatePassword {
        name: String,
        /// Return once it has started.
        #[arg(long)]
        no_wait: bool,
    },
    /// Run another version: on the same data (a new container of the new
    /// image) for a minor version, e.g. 15.4 to 15.6; a newer major
    /// PostgreSQL version, e.g. 15 to 17, goes through a fresh backup
    /// restored into a new service NAME-17, to which the linked apps then
    /// move (NAME is kept, running, until `services rm NAME`). Needs a
    /// backup destination, and --writes-stopped: NAME-17 holds the data as
    /// of the backup. Waits until it is done unless --no-wait.
    Upgrade {
        name: String,
        /// The version (the image's tag), e.g. 16.4.
        #[arg(long)]
        version: String,
        /// For a major PostgreSQL version: writes to the service are
        /// stopped (or may be lost once its backup has started).
        #[arg(long)]
        writes_stopped: bool,
        /// Return once it is queued.
        #[arg(long)]
        no_wait: bool,
    },
    /// Cancel the unfinished major version upgrade from or into NAME before
    /// its links move. The old service runs on as it was; a new service
    /// it made is kept until `services rm`.
    CancelUpgrade { name: String },
    /// What the service's container printed recently (its secrets
    /// redacted by its node).
    Logs {
        name: String,
        /// How many recent lines (0 to 2000).
        #[arg(long, short = 'n', default_value_t = 100, value_parser = clap::value_parser!(u16).range(0..=2000))]
        lines: u16,
    },
    /// Delete a service. Its data stays in its volume (listed as detached)
    /// unless --delete-data.
    Rm {
        name: String,
        /// Delete its data too.
        #[arg(long)]
        delete_data: bool,
    },
}

fn rows(services: &[ServiceView]) -> Vec<Vec<String>> {
    services
        .iter()
        .map(|s| {
            let links: Vec<String> = s.links.iter().map(|l| format!("{}:{}", l.app, l.variable)).collect();
            vec![cell(&s.name), cell(&s.kind), cell(&s.node_name.clone().unwrap_or_else(|| s.node_id.clone())), cell(&s.state), cell(&s.address), cell(&links)]
        })
        .collect()
}

pub async fn run(api: &Api, command: ServicesCommand, json: bool) -> Result<(), Failure> {
    match command {
        ServicesCommand::List => {
            let list: ServiceList = api.get("/api/services").await?;
            if json {
                render::json(&list.services);
            } else {
                table(&["SERVICE", "TYPE", "NODE", "STATE", "ADDRESS", "LINKS"], &rows(&list.services));
            }
        }
        ServicesCommand::Create { name, kind, version, node, memory } => {
            let kind = match kind {
                Kind::Postgres => ServiceKind::Postgres,
                Kind::Redis => ServiceKind::Redis,
                Kind::Mariadb => ServiceKind::Mariadb,
            };
            let body = CreateService { name, kind, version, node, memory: memory.map(|m| m << 20) };
            let view: ServiceView = api.call(Method::POST, "/api/services", Some(&body)).await?;
            if json {
                render::json(&view);
            } else {
                println!("service {} ({}) created on {}; `cloudweb services link {} APP` gives an app its URL", cell(&view.name), cell(&view.kind), cell(&view.node_name.clone().unwrap_or(view.node_id.clone())), cell(&view.name));
            }
        }
        ServicesCommand::Show { name } => {
            let view: ServiceView = api.get(&format!("/api/services/{}", segment(&name))).await?;
            if json {
                render::json(&view);
            } else {
                table(&["SERVICE", "TYPE", "NODE", "STATE", "ADDRESS", "LINKS"], &rows(std::slice::from_ref(&view)));
                println!("image {}, data in volume {}, {} restart(s){}", cell(&view.image), cell(&view.volume), view.restarts, view.detail.map(|d| format!(": {}", clean(&d))).unwrap_or_default());
                if let Some(u) = &view.upgrade {
                    println!(
                        "upgrade {}: {} (PostgreSQL {}) to {} (PostgreSQL {}): {}{}",
                        cell(&u.id),
                        cell(&u.service),
                        cell(&u.from_version),
                        cell(&u.to_service),
                        cell(&u.version),
                        cell(&u.state),
                        u.message.as_deref().map(|m| format!(": {}", clean(m))).unwrap_or_default()
                    );
                }
            }
        }
        ServicesCommand::Link { service, app, variable } => {
            let body = CreateLink { app, variable };
            let link: LinkView = api.call(Method::POST, &format!("/api/services/{}/links", segment(&service)), Some(&body)).await?;
            if json {
                render::json(&link);
            } else {
                println!("{} gets {} from {} at its next deploy", cell(&link.app), cell(&link.variable), clean(&service));
            }
        }
        ServicesCommand::Unlink { service, app } => {
            api.delete(&format!("/api/services/{}/links/{}", segment(&service), segment(&app))).await?;
            if json {
                render::json(&json!({"unlinked": app, "service": service}));
            } else {
                println!("{} is unlinked from {} from its next deploy on", clean(&app), clean(&service));
            }
        }
        ServicesCommand::RotatePassword { name, no_wait } => {
            let path = format!("/api/services/{}", segment(&name));
            let started: ServiceView = api.post(&format!("{path}/rotate-password")).await?;
            let view = if no_wait { started } else { wait(api, &path, WAIT_LIMIT, |v| v.rotation.is_none()).await? };
            let apps: Vec<&str> = view.links.iter().map(|l| l.app.as_str()).collect();
            if json {
                render::json(&view);
            } else if let Some(rotation) = &view.rotation {
                println!("password rotation of {} started: {}", clean(&name), clean(&rotation.detail));
            } else if apps.is_empty() {
                println!("password of {} rotated; the old one no longer works", clean(&name));
            } else {
                println!("password of {} rotated; the old one no longer works; redeployed with the new URL: {}", clean(&name), clean(&apps.join(", ")));
            }
        }
        ServicesCommand::CancelUpgrade { name } => {
            let view: MajorUpgradeView = api.call(Method::POST, &format!("/api/services/{}/upgrade/cancel", segment(&name)), None::<&()>).await?;
            if json {
                render::json(&view);
            } else {
                println!("upgrade {} of {} cancelled: {}", clean(&view.id), clean(&view.service), clean(&view.message.unwrap_or_default()));
            }
        }
        ServicesCommand::Upgrade { name, version, writes_stopped, no_wait } => {
            let path = format!("/api/services/{}", segment(&name));
            let body = UpgradeService { version, writes_stopped };
            let queued: ServiceView = api.call(Method::POST, &format!("{path}/upgrade"), Some(&body)).await?;
            let major = queued.upgrade.as_ref().filter(|u| u.service == name && unfinished(&u.state)).map(|u| u.id.clone());
            if let Some(id) = major {
                return major_upgrade(api, &path, &name, &id, queued, no_wait, json).await;
            }
            let view = if no_wait { queued } else { wait(api, &path, WAIT_LIMIT, |v| matches!(v.state.as_str(), "healthy" | "degraded" | "failed")).await? };
            if json {
                render::json(&view);
            } else if view.state == "failed" {
                return Err(Failure::Action(format!("service {} did not start {}: {}", clean(&name), clean(&view.image), clean(&view.detail.unwrap_or_default()))));
            } else if no_wait {
                println!("service {} goes to {}; its node replaces the container on the same data", clean(&name), clean(&view.image));
            } else {
                println!("service {} runs {} on the same data ({})", clean(&name), clean(&view.image), clean(&view.state));
            }
        }
        ServicesCommand::Logs { name, lines } => {
            let view: ServiceLogsView = api.get(&format!("/api/services/{}/logs?lines={lines}", segment(&name))).await?;
            if json {
                render::json(&view);
            } else {
                for line in &view.lines {
                    println!("{} {:<6} {}", line.ts, line.stream, clean(&line.line));
                }
            }
        }
        ServicesCommand::Rm { name, delete_data } => {
            let query = if delete_data { "?data=delete" } else { "" };
            api.delete(&format!("/api/services/{}{query}", segment(&name))).await?;
            if json {
                render::json(&json!({"deleted": name, "data_deleted": delete_data}));
            } else if delete_data {
                println!("service {} deleted with its data", clean(&name));
            } else {
                println!("service {} deleted; its data stays in volume svc-{} (cloudweb volumes rm to delete it)", clean(&name), clean(&name));
            }
        }
    }
    Ok(())
}

/// How long rotate-password and upgrade wait for the node.
const WAIT_LIMIT: Duration = Duration::from_secs(300);

/// How long a major upgrade (a backup and a restore) is waited for.
const MAJOR_WAIT_LIMIT: Duration = Duration::from_secs(3600);

fn unfinished(state: &str) -> bool {
    matches!(state, "backing_up" | "restoring" | "switching")
}

/// Follows major upgrade `id` of service `name` until it ends.
async fn major_upgrade(api: &Api, path: &str, name: &str, id: &str, started: ServiceView, no_wait: bool, json: bool) -> Result<(), Failure> {
    let view = if no_wait { started } else { wait(api, path, MAJOR_WAIT_LIMIT, |v| v.upgrade.as_ref().is_none_or(|u| u.id != id || !unfinished(&u.state))).await? };
    let Some(upgrade) = view.upgrade.clone().filter(|u| u.id == id) else {
        return Err(Failure::Action(format!("upgrade {} of {} is no longer shown", clean(id), clean(name))));
    };
    if json {
        render::json(&view);
        return if upgrade.state == "failed" { Err(Failure::Action(clean(&upgrade.message.unwrap_or_default()))) } else { Ok(()) };
    }
    match upgrade.state.as_str() {
        "failed" => Err(Failure::Action(format!("the upgrade of {} failed: {}", clean(name), clean(&upgrade.message.unwrap_or_default())))),
        "switched" => {
            println!(
                "PostgreSQL {} of {} now runs as service {} (PostgreSQL {}); {}",
                clean(&upgrade.from_version),
                clean(name),
                clean(&upgrade.to_service),
                clean(&upgrade.version),
                clean(&upgrade.message.unwrap_or_default())
            );
            Ok(())
        }
        state => {
            println!(
                "major upgrade {} of {} started ({}): a fresh backup, restored into the new service {} of PostgreSQL {}; `cloudweb services show {}` follows it",
                clean(id),
                clean(name),
                clean(state),
                clean(&upgrade.to_service),
                clean(&upgrade.version),
                clean(name)
            );
            Ok(())
        }
    }
}

/// Polls the service until `done` holds; a timeout says what it waits for.
async fn wait(api: &Api, path: &str, limit: Duration, done: impl Fn(&ServiceView) -> bool) -> Result<ServiceView, Failure> {
    let start = Instant::now();
    loop {
        let view: ServiceView = api.get(path).await?;
        if done(&view) {
            return Ok(view);
        }
        if start.elapsed() > limit {
            let waiting = view.rotation.map(|r| r.detail).or(view.detail).unwrap_or_else(|| view.state.clone());
            return Err(Failure::Action(format!("gave up waiting after {} s (state {}): {}", limit.as_secs(), clean(&view.state), clean(&waiting))));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
