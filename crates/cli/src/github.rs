//! `cloudweb github`: the GitHub App this control plane is (`setup`,
//! `show`), and the repositories its installations reach (`repos`), to
//! make apps from with `cloudweb apps create NAME --github OWNER/NAME`.

use clap::Subcommand;
use cloudweb_api_types::github::{GithubSettingsInput, GithubSettingsView, RepositoryList};
use reqwest::Method;

use crate::client::Api;
use crate::render::{self, cell, table};
use crate::Failure;

#[derive(Subcommand)]
pub enum GithubCommand {
    /// Configure the GitHub App (made on GitHub under Settings → Developer
    /// settings → GitHub Apps; the book lists its permissions).
    Setup {
        /// The App's id ("App ID" on its settings page).
        #[arg(long)]
        app_id: i64,
        /// The App's private key file (PEM), as GitHub gave it.
        #[arg(long, value_name = "FILE")]
        private_key_file: Option<std::path::PathBuf>,
        /// A file holding the App's webhook secret (at least 16
        /// characters; "-": stdin).
        #[arg(long, value_name = "FILE")]
        webhook_secret_file: Option<String>,
        /// A GitHub Enterprise Server's API (https://HOST/api/v3); by
        /// default github.com's.
        #[arg(long, value_name = "URL")]
        api_url: Option<String>,
    },
    /// The App's settings (never its key or secret) and the webhook URL
    /// to set on it.
    Show,
    /// The repositories the App's installations reach.
    Repos {
        /// Only those whose owner/name contains this.
        #[arg(long)]
        search: Option<String>,
    },
}

fn read_file(path: &std::path::Path, what: &str) -> Result<String, Failure> {
    std::fs::read_to_string(path).map_err(|e| Failure::Usage(format!("cannot read the {what} {}: {e}", path.display())))
}

pub async fn run(api: &Api, command: GithubCommand, json: bool) -> Result<(), Failure> {
    match command {
        GithubCommand::Setup { app_id, private_key_file, webhook_secret_file, api_url } => {
            let private_key = private_key_file.as_deref().map(|p| read_file(p, "private key file")).transpose()?;
            let webhook_secret = match webhook_secret_file.as_deref() {
                None => None,
                Some("-") => {
                    let mut text = String::new();
                    std::io::Read::read_to_string(&mut std::io::stdin(), &mut text).map_err(|e| Failure::Action(format!("cannot read stdin: {e}")))?;
                    Some(text.trim().to_string())
                }
                Some(path) => Some(read_file(std::path::Path::new(path), "webhook secret file")?.trim().to_string()),
            };
            let body = GithubSettingsInput { api_url, app_id, private_key, webhook_secret };
            let view: GithubSettingsView = api.call(Method::PUT, "/api/github/settings", Some(&body)).await?;
            if json {
                render::json(&view);
            } else {
                println!("GitHub App {} saved; set its webhook URL to {}", view.app_id, cell(&view.webhook_url));
            }
        }
        GithubCommand::Show => {
            let view: GithubSettingsView = api.get("/api/github/settings").await?;
            if json {
                render::json(&view);
            } else {
                table(&["APP ID", "API", "WEBHOOK URL"], &[vec![view.app_id.to_string(), cell(&view.api_url), cell(&view.webhook_url)]]);
            }
        }
        GithubCommand::Repos { search } => {
            let path = match &search {
                Some(search) => format!("/api/github/repositories?search={}", url::form_urlencoded::byte_serialize(search.as_bytes()).collect::<String>()),
                None => "/api/github/repositories".to_string(),
            };
            let list: RepositoryList = api.get(&path).await?;
            if json {
                render::json(&list.repositories);
            } else if list.repositories.is_empty() {
                println!("no repositories (install the GitHub App on some)");
            } else {
                let rows: Vec<Vec<String>> = list
                    .repositories
                    .iter()
                    .map(|r| vec![cell(&r.full_name), cell(r.default_branch.as_deref().unwrap_or("-")), r.installation.to_string()])
                    .collect();
                table(&["REPOSITORY", "DEFAULT BRANCH", "INSTALLATION"], &rows);
            }
        }
    }
    Ok(())
}
