//! `cloudweb domains`: an app's custom domains and their certificates.

use clap::Subcommand;
use cloudweb_api_types::apps::{AppView, CertificateList, DomainList, DomainsView};
use reqwest::Method;

use crate::client::{segment, Api};
use crate::render::{self, cell, clean, table};
use crate::Failure;

#[derive(Subcommand)]
pub enum DomainsCommand {
    /// The app's custom domains.
    List { app: String },
    /// Add domains.
    Add {
        app: String,
        #[arg(required = true)]
        hosts: Vec<String>,
    },
    /// Remove domains.
    Rm {
        app: String,
        #[arg(required = true)]
        hosts: Vec<String>,
    },
    /// Replace every custom domain (none given: remove them all).
    Set { app: String, hosts: Vec<String> },
    /// The certificate of each host the app is served under: state
    /// (internal, issuing, valid, renewing, failed), expiry, issuer, ACME
    /// orders placed and the last failure's reason.
    #[command(visible_alias = "certs")]
    Certificates { app: String },
}

/// How a domains command turns the current list into the new one.
type DomainChange = Box<dyn FnOnce(Vec<String>) -> Vec<String>>;

pub async fn run(api: &Api, command: DomainsCommand, json: bool) -> Result<(), Failure> {
    let (app, change): (String, DomainChange) = match command {
        DomainsCommand::List { app } => {
            let view: AppView = api.get(&format!("/api/apps/{}", segment(&app))).await?;
            if json {
                render::json(&view.domains);
            } else {
                for domain in &view.domains {
                    println!("{}", cell(domain));
                }
            }
            return Ok(());
        }
        DomainsCommand::Certificates { app } => {
            let answer: CertificateList = api.get(&format!("/api/apps/{}/certificates", segment(&app))).await?;
            if json {
                render::json(&answer.certificates);
            } else {
                let rows: Vec<Vec<String>> = answer
                    .certificates
                    .iter()
                    .map(|c| vec![cell(&c.host), cell(&c.state), cell(&c.not_after), cell(&c.issuer), cell(&c.orders), cell(&c.last_error)])
                    .collect();
                table(&["HOST", "CERTIFICATE", "NOT AFTER", "ISSUER", "ORDERS", "LAST ERROR"], &rows);
            }
            return Ok(());
        }
        DomainsCommand::Add { app, hosts } => (
            app,
            Box::new(move |mut current| {
                for host in hosts {
                    let host = host.to_ascii_lowercase();
                    if !current.contains(&host) {
                        current.push(host);
                    }
                }
                current
            }),
        ),
        DomainsCommand::Rm { app, hosts } => {
            let hosts: Vec<String> = hosts.iter().map(|h| h.to_ascii_lowercase()).collect();
            (app, Box::new(move |current: Vec<String>| current.into_iter().filter(|d| !hosts.contains(d)).collect()))
        }
        DomainsCommand::Set { app, hosts } => (app, Box::new(move |_| hosts)),
    };
    let path = format!("/api/apps/{}", segment(&app));
    let view: AppView = api.get(&path).await?;
    let wanted = DomainList(change(view.domains));
    let answer: DomainsView = api.call(Method::PUT, &format!("{path}/domains"), Some(&wanted)).await?;
    if json {
        render::json(&answer.domains);
    } else {
        println!("{} serves: {}", clean(&app), cell(&answer.domains));
    }
    Ok(())
}

