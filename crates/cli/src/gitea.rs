//! `cloudweb gitea`: the Gitea or Forgejo instance this control plane
//! works with (`setup`, `show`), the identities that logged in
//! (`accounts`) and the repositories yours reaches (`repos`), to make
//! apps from with `cloudweb apps create NAME --gitea OWNER/NAME`.

use clap::Subcommand;
use cloudweb_api_types::git::ProjectList;
use cloudweb_api_types::gitea::{GiteaAccountList, GiteaSettingsInput, GiteaSettingsView};
use reqwest::Method;

use crate::client::Api;
use crate::render::{self, cell, table};
use crate::Failure;

#[derive(Subcommand)]
pub enum GiteaCommand {
    /// Connect a Gitea or Forgejo instance through an OAuth 2 application
    /// made on it (Settings → Applications; its redirect URI is the one
    /// this prints). Nobody may log in until an --allow-* option names them.
    Setup {
        /// The instance's URL (https://git.example.com).
        #[arg(long, value_name = "URL")]
        url: String,
        /// The OAuth 2 application's "Client ID".
        #[arg(long)]
        client_id: String,
        /// A file holding the client secret ("-": stdin); required the
        /// first time, kept when left out later.
        #[arg(long, value_name = "FILE")]
        client_secret_file: Option<String>,
        /// A Gitea user name allowed to log in, or id:NUMBER; repeatable.
        #[arg(long = "allow-user", value_name = "NAME")]
        allowed_users: Vec<String>,
        /// An organization whose members may log in; repeatable.
        #[arg(long = "allow-org", value_name = "ORG")]
        allowed_orgs: Vec<String>,
    },
    /// The connection (never the secret), with its redirect URI.
    Show,
    /// The Gitea identities that logged in (never a token).
    Accounts,
    /// The repositories your Gitea identity reaches.
    Repos {
        /// Only those whose owner/name contains this.
        #[arg(long)]
        search: Option<String>,
        /// Which identity (its Gitea user id) when several could act.
        #[arg(long, value_name = "ID")]
        account: Option<i64>,
    },
}

fn print_settings(view: &GiteaSettingsView) {
    let list = |l: &[String]| if l.is_empty() { "-".to_string() } else { cell(&l.join(", ")) };
    table(
        &["URL", "CLIENT ID", "USERS", "ORGS", "REDIRECT URI"],
        &[vec![cell(&view.base_url), cell(&view.client_id), list(&view.allowed_users), list(&view.allowed_orgs), cell(&view.redirect_uri)]],
    );
}

pub async fn run(api: &Api, command: GiteaCommand, json: bool) -> Result<(), Failure> {
    match command {
        GiteaCommand::Setup { url, client_id, client_secret_file, allowed_users, allowed_orgs } => {
            let client_secret = client_secret_file.as_deref().map(|arg| crate::github::read_secret(arg, "client secret file")).transpose()?;
            let body = GiteaSettingsInput { base_url: url, client_id, client_secret, allowed_users, allowed_orgs };
            let view: GiteaSettingsView = api.call(Method::PUT, "/api/gitea/settings", Some(&body)).await?;
            if json {
                render::json(&view);
            } else {
                print_settings(&view);
                println!("Gitea saved; give the OAuth 2 application the redirect URI {}", cell(&view.redirect_uri));
            }
        }
        GiteaCommand::Show => {
            let view: GiteaSettingsView = api.get("/api/gitea/settings").await?;
            if json {
                render::json(&view);
            } else {
                print_settings(&view);
            }
        }
        GiteaCommand::Accounts => {
            let list: GiteaAccountList = api.get("/api/gitea/accounts").await?;
            if json {
                render::json(&list.accounts);
            } else if list.accounts.is_empty() {
                println!("nobody has logged in with Gitea yet");
            } else {
                let rows: Vec<Vec<String>> = list
                    .accounts
                    .iter()
                    .map(|a| vec![a.gitea_user_id.to_string(), cell(&a.username), cell(a.linked_user.as_deref().unwrap_or("-")), cell(a.token_expires_at.as_deref().unwrap_or("-"))])
                    .collect();
                table(&["ID", "NAME", "LOCAL USER", "TOKEN EXPIRES"], &rows);
            }
        }
        GiteaCommand::Repos { search, account } => {
            let mut query = url::form_urlencoded::Serializer::new(String::new());
            if let Some(search) = &search {
                query.append_pair("search", search);
            }
            if let Some(account) = account {
                query.append_pair("account", &account.to_string());
            }
            let query = query.finish();
            let path = if query.is_empty() { "/api/gitea/repositories".to_string() } else { format!("/api/gitea/repositories?{query}") };
            let list: ProjectList = api.get(&path).await?;
            if json {
                render::json(&list.projects);
            } else if list.projects.is_empty() {
                println!("no repositories");
            } else {
                let rows: Vec<Vec<String>> = list.projects.iter().map(|p| vec![cell(&p.path), cell(p.default_branch.as_deref().unwrap_or("-"))]).collect();
                table(&["REPOSITORY", "DEFAULT BRANCH"], &rows);
            }
        }
    }
    Ok(())
}
