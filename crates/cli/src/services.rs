//! `cloudweb services`: managed databases (PostgreSQL, Redis/Valkey,
//! MariaDB) and the apps linked to them.

use clap::{Subcommand, ValueEnum};
use cloudweb_api_types::services::{CreateLink, CreateService, LinkView, ServiceKind, ServiceList, ServiceView};
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
