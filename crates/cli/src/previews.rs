//! `cloudweb previews`: an app's preview environments (one per pull or
//! merge request): list them, turn them on or off with their limits,
//! approve a fork's request, remove one; and name the app's variables its
//! previews never get.

use clap::Subcommand;
use cloudweb_api_types::apps::{EnvVars, EnvView};
use cloudweb_api_types::previews::{PreviewList, PreviewSettingsInput, PreviewSettingsView, PreviewView, ProductionOnly};
use reqwest::Method;

use crate::client::Api;
use crate::render::{self, cell, table};
use crate::Failure;

#[derive(Subcommand)]
pub enum PreviewsCommand {
    /// The app's previews, its preview settings and its production-only
    /// variables.
    List { app: String },
    /// Turn previews on or off for an app, with their limits.
    Set {
        app: String,
        /// `on` or `off`.
        #[arg(value_parser = ["on", "off"])]
        state: String,
        /// At most this many at once (1 to 20; 5 when never set): a new one
        /// past it removes the one pushed to longest ago.
        #[arg(long)]
        max: Option<i64>,
        /// Remove a preview with no push for this long (1h to 90d; 7d when
        /// never set).
        #[arg(long, value_parser = crate::duration::parse)]
        ttl: Option<u32>,
        /// For each database service the app is linked to: none (no link),
        /// empty (a new one) or latest-backup (restored from its newest
        /// backup; empty for a fork). Deleted with the preview; volumes kept.
        #[arg(long, value_parser = ["none", "empty", "latest-backup"])]
        database: Option<String>,
        /// Instances of each preview (1 to 20), smaller than the app's.
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..=20))]
        instances: Option<u32>,
        /// CPU cores per preview instance.
        #[arg(long)]
        cpu: Option<f64>,
        /// Memory per preview instance, in MiB.
        #[arg(long, value_name = "MIB")]
        memory_mib: Option<u64>,
        /// Previews use the app's instances, CPU and memory again.
        #[arg(long, conflicts_with_all = ["instances", "cpu", "memory_mib"])]
        app_resources: bool,
    },
    /// Build the head a fork's request waits with (it gets no variable of
    /// the app).
    Approve { app: String, number: i64 },
    /// Remove a preview now (its builds cancelled, its app and route gone).
    Rm { app: String, number: i64 },
    /// The variables previews get on top of the app's, NAME=VALUE each
    /// (replaces them all; none given: no overrides). A fork's preview
    /// never gets them.
    Env { app: String, vars: Vec<String> },
    /// The app's variables its previews never get (replaces the list; none
    /// given: previews get every variable).
    ProductionOnly { app: String, names: Vec<String> },
}

fn app_path(app: &str) -> String {
    format!("/api/apps/{}", url::form_urlencoded::byte_serialize(app.as_bytes()).collect::<String>())
}

fn print_previews(list: &[PreviewView]) {
    if list.is_empty() {
        println!("no previews");
        return;
    }
    let rows: Vec<Vec<String>> = list
        .iter()
        .map(|p| {
            vec![
                p.number.to_string(),
                cell(&p.state),
                cell(p.deployment.as_deref().unwrap_or("-")),
                cell(&p.url),
                cell(&p.branch),
                cell(p.commit.get(..12).unwrap_or(&p.commit)),
                if p.from_fork { "fork".into() } else { "-".into() },
                cell(&p.updated_at),
            ]
        })
        .collect();
    table(&["REQUEST", "STATE", "DEPLOYMENT", "URL", "BRANCH", "COMMIT", "FORK", "LAST PUSH"], &rows);
}

pub async fn run(api: &Api, command: PreviewsCommand, json: bool) -> Result<(), Failure> {
    match command {
        PreviewsCommand::List { app } => {
            let list: PreviewList = api.get(&format!("{}/previews", app_path(&app))).await?;
            if json {
                render::json(&list);
                return Ok(());
            }
            let s = &list.settings;
            let ttl = crate::duration::format(u32::try_from(s.ttl_seconds).unwrap_or(u32::MAX));
            println!("previews {}: at most {}, removed after {ttl} with no push, databases: {}", if s.enabled { "on" } else { "off" }, s.max, s.database);
            if !list.preview_env.is_empty() {
                println!("preview variables: {}", cell(&list.preview_env.join(", ")));
            }
            if !list.production_only.is_empty() {
                println!("production-only variables: {}", cell(&list.production_only.join(", ")));
            }
            print_previews(&list.previews);
        }
        PreviewsCommand::Set { app, state, max, ttl, database, instances, cpu, memory_mib, app_resources } => {
            let body = PreviewSettingsInput {
                enabled: state == "on",
                max,
                ttl_seconds: ttl.map(i64::from),
                database,
                instances: instances.map(Some).or(app_resources.then_some(None)),
                cpu: cpu.map(Some).or(app_resources.then_some(None)),
                memory: memory_mib.map(|m| Some(m << 20)).or(app_resources.then_some(None)),
            };
            let view: PreviewSettingsView = api.call(Method::PUT, &format!("{}/previews/settings", app_path(&app)), Some(&body)).await?;
            if json {
                render::json(&view);
            } else {
                println!("previews of {} {}: at most {}, removed after {} with no push", cell(&app), if view.enabled { "on" } else { "off" }, view.max, crate::duration::format(u32::try_from(view.ttl_seconds).unwrap_or(u32::MAX)));
            }
        }
        PreviewsCommand::Approve { app, number } => {
            let view: PreviewView = api.call(Method::POST, &format!("{}/previews/{number}/approve", app_path(&app)), None::<&()>).await?;
            if json {
                render::json(&view);
            } else {
                println!("approved request {number} of {}: deploying {} to {}", cell(&app), cell(view.commit.get(..12).unwrap_or(&view.commit)), cell(&view.url));
            }
        }
        PreviewsCommand::Rm { app, number } => {
            api.delete(&format!("{}/previews/{number}", app_path(&app))).await?;
            if !json {
                println!("removed the preview of request {number} of {}", cell(&app));
            }
        }
        PreviewsCommand::Env { app, vars } => {
            let mut map = std::collections::BTreeMap::new();
            for pair in vars {
                let (name, value) = pair.split_once('=').ok_or_else(|| Failure::Usage(format!("{pair:?} is not NAME=VALUE")))?;
                map.insert(name.to_string(), value.to_string());
            }
            let view: EnvView = api.call(Method::PUT, &format!("{}/previews/env", app_path(&app)), Some(&EnvVars(map))).await?;
            if json {
                render::json(&view);
            } else if view.env.is_empty() {
                println!("previews of {} get no variables on top of the app's", cell(&app));
            } else {
                println!("previews of {} get on top of the app's: {}", cell(&app), cell(&view.env.join(", ")));
            }
        }
        PreviewsCommand::ProductionOnly { app, names } => {
            let body = ProductionOnly { names };
            let view: ProductionOnly = api.call(Method::PUT, &format!("{}/env/production-only", app_path(&app)), Some(&body)).await?;
            if json {
                render::json(&view);
            } else if view.names.is_empty() {
                println!("previews of {} get every variable", cell(&app));
            } else {
                println!("previews of {} never get: {}", cell(&app), cell(&view.names.join(", ")));
            }
        }
    }
    Ok(())
}
