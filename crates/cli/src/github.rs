//! `cloudweb github`: the GitHub App this control plane is (`setup`,
//! `show`), the repositories its installations reach (`repos`), to make
//! apps from with `cloudweb apps create NAME --github OWNER/NAME`, and
//! logging in with GitHub (`login-setup`, `login-show`).

use clap::Subcommand;
use cloudweb_api_types::github::{GithubLoginInput, GithubLoginSettingsView, GithubSettingsInput, GithubSettingsView, RepositoryList};
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
    /// Let people log in with GitHub, through the App's OAuth side (its
    /// "Client ID" and a client secret made on its settings page; set the
    /// App's callback URL to the one this prints). Nobody may log in
    /// until an --allow-* option names them.
    LoginSetup {
        /// The App's "Client ID".
        #[arg(long)]
        client_id: String,
        /// A file holding the client secret ("-": stdin); required the
        /// first time, kept when left out later.
        #[arg(long, value_name = "FILE")]
        client_secret_file: Option<String>,
        /// A GitHub login allowed to log in, or id:NUMBER for a user id;
        /// repeatable.
        #[arg(long = "allow-user", value_name = "LOGIN")]
        allowed_users: Vec<String>,
        /// An organization whose members may log in; repeatable.
        #[arg(long = "allow-org", value_name = "ORG")]
        allowed_orgs: Vec<String>,
        /// A team (ORG/TEAM-SLUG) whose members may log in; repeatable.
        #[arg(long = "allow-team", value_name = "ORG/TEAM")]
        allowed_teams: Vec<String>,
        /// A GitHub Enterprise Server (https://HOST); by default github.com.
        #[arg(long, value_name = "URL")]
        web_url: Option<String>,
        /// That server's API (https://HOST/api/v3); by default github.com's.
        #[arg(long, value_name = "URL")]
        api_url: Option<String>,
    },
    /// Logging in with GitHub: the client id, the allow-list and the
    /// callback URL (never the secret).
    LoginShow,
}

/// A secret from a file, or from stdin for "-", trimmed.
pub(crate) fn read_secret(arg: &str, what: &str) -> Result<String, Failure> {
    if arg == "-" {
        let mut text = String::new();
        std::io::Read::read_to_string(&mut std::io::stdin(), &mut text).map_err(|e| Failure::Action(format!("cannot read stdin: {e}")))?;
        return Ok(text.trim().to_string());
    }
    Ok(read_file(std::path::Path::new(arg), what)?.trim().to_string())
}

fn print_login(view: &GithubLoginSettingsView) {
    let list = |l: &[String]| if l.is_empty() { "-".to_string() } else { cell(&l.join(", ")) };
    table(
        &["CLIENT ID", "USERS", "ORGS", "TEAMS", "CALLBACK URL"],
        &[vec![cell(&view.client_id), list(&view.allowed_users), list(&view.allowed_orgs), list(&view.allowed_teams), cell(&view.callback_url)]],
    );
}

fn read_file(path: &std::path::Path, what: &str) -> Result<String, Failure> {
    std::fs::read_to_string(path).map_err(|e| Failure::Usage(format!("cannot read the {what} {}: {e}", path.display())))
}

pub async fn run(api: &Api, command: GithubCommand, json: bool) -> Result<(), Failure> {
    match command {
        GithubCommand::Setup { app_id, private_key_file, webhook_secret_file, api_url } => {
            let private_key = private_key_file.as_deref().map(|p| read_file(p, "private key file")).transpose()?;
            let webhook_secret = webhook_secret_file.as_deref().map(|arg| read_secret(arg, "webhook secret file")).transpose()?;
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
        GithubCommand::LoginSetup { client_id, client_secret_file, allowed_users, allowed_orgs, allowed_teams, web_url, api_url } => {
            let client_secret = client_secret_file.as_deref().map(|arg| read_secret(arg, "client secret file")).transpose()?;
            let body = GithubLoginInput { web_url, api_url, client_id, client_secret, allowed_users, allowed_orgs, allowed_teams };
            let view: GithubLoginSettingsView = api.call(Method::PUT, "/api/github/login", Some(&body)).await?;
            if json {
                render::json(&view);
            } else {
                print_login(&view);
                println!("logging in with GitHub saved; set the App's callback URL to {}", cell(&view.callback_url));
            }
        }
        GithubCommand::LoginShow => {
            let view: GithubLoginSettingsView = api.get("/api/github/login").await?;
            if json {
                render::json(&view);
            } else {
                print_login(&view);
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
