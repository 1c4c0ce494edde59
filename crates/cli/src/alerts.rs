//! `cloudweb alerts`: what the control plane alerts on (open ones; `--all`
//! resolved ones too), and the channels that carry alerts to people:
//! `alerts channels`, `alerts channel add|show|rm|test`.

use std::io::Read;

use clap::{Args, Subcommand};
use cloudweb_api_types::alerts::{AlertList, ChannelDetail, ChannelList, ChannelTarget, ChannelView, DeliveryView, NewAlertChannel, SmtpServer, SmtpTls};
use reqwest::Method;

use crate::client::{segment, Api};
use crate::render::{self, cell, table};
use crate::Failure;

#[derive(Subcommand)]
pub enum AlertsCommand {
    /// The channels alerts go to: the cluster's and your own.
    Channels,
    /// Add, show, remove or test a channel.
    Channel {
        #[command(subcommand)]
        command: ChannelCommand,
    },
}

#[derive(Subcommand)]
pub enum ChannelCommand {
    /// Add a channel: a signed JSON webhook (`--webhook`), a
    /// Slack-compatible incoming webhook (`--slack`: Slack, Mattermost,
    /// Rocket.Chat, Discord's /slack URL) or email (`--email`).
    Add(AddArgs),
    /// A channel and its newest deliveries, each with every attempt.
    Show { id: String },
    /// Delete a channel with its queue and delivery history.
    #[command(visible_alias = "rm")]
    Remove { id: String },
    /// Send a test message now and show how it went.
    Test { id: String },
}

#[derive(Args)]
pub struct AddArgs {
    /// 1 to 63 of a-z, 0-9 and -, unique per owner.
    pub name: String,
    /// POST a signed JSON message to this URL (https).
    #[arg(long, value_name = "URL", group = "kind")]
    pub webhook: Option<String>,
    /// The webhook's HMAC-SHA256 signing secret, read from this file ("-":
    /// stdin); one is made and printed once when absent.
    #[arg(long, value_name = "FILE", requires = "webhook")]
    pub secret_file: Option<String>,
    /// POST `{"text": …}` to this Slack-compatible incoming-webhook URL.
    #[arg(long, value_name = "URL", group = "kind")]
    pub slack: Option<String>,
    /// Email these addresses (repeatable).
    #[arg(long, value_name = "ADDRESS", group = "kind")]
    pub email: Vec<String>,
    /// The email's sender.
    #[arg(long, value_name = "ADDRESS", requires = "email")]
    pub from: Option<String>,
    /// The SMTP server.
    #[arg(long, value_name = "HOST", requires = "email")]
    pub smtp_host: Option<String>,
    /// Its port (587 for starttls, 465 for tls, 25 for none).
    #[arg(long, value_name = "PORT", requires = "email")]
    pub smtp_port: Option<u16>,
    /// starttls (required), tls (from the first byte) or none.
    #[arg(long, value_name = "MODE", default_value = "starttls", value_parser = ["starttls", "tls", "none"])]
    pub smtp_tls: String,
    /// The SMTP user name.
    #[arg(long, value_name = "USER", requires = "smtp_password_env")]
    pub smtp_user: Option<String>,
    /// The environment variable holding the SMTP password.
    #[arg(long, value_name = "VAR", requires = "smtp_user")]
    pub smtp_password_env: Option<String>,
    /// Alert kinds to send, comma-separated (deploy_failed,
    /// deploy_succeeded, crash_loop, node_unreachable, node_degraded,
    /// disk_full, certificate, backup_failed, job_failed); all but
    /// deploy_succeeded when absent.
    #[arg(long, value_delimiter = ',')]
    pub events: Vec<String>,
    /// Your own channel, which only you see; otherwise the cluster's.
    #[arg(long)]
    pub personal: bool,
}

pub async fn run(api: &Api, command: Option<AlertsCommand>, all: bool, json: bool) -> Result<(), Failure> {
    match command {
        None => list(api, all, json).await,
        Some(AlertsCommand::Channels) => {
            let list: ChannelList = api.get("/api/alerts/channels").await?;
            if json {
                render::json(&list.channels);
            } else if list.channels.is_empty() {
                println!("no alert channels (cloudweb alerts channel add)");
            } else {
                channel_table(&list.channels);
            }
            Ok(())
        }
        Some(AlertsCommand::Channel { command }) => channel(api, command, json).await,
    }
}

async fn list(api: &Api, all: bool, json: bool) -> Result<(), Failure> {
    let list: AlertList = api.get(if all { "/api/alerts?all=1" } else { "/api/alerts" }).await?;
    if json {
        render::json(&list.alerts);
        return Ok(());
    }
    if list.alerts.is_empty() {
        println!("{}", if all { "no alerts" } else { "no open alerts" });
        return Ok(());
    }
    let rows: Vec<Vec<String>> = list
        .alerts
        .iter()
        .map(|a| {
            let state = match &a.resolved_at {
                Some(at) => format!("resolved {at}"),
                None => "open".to_string(),
            };
            vec![cell(&a.id), state, cell(&a.severity), cell(&a.kind), cell(&a.subject), cell(&a.opened_at), a.occurrences.to_string(), cell(&a.summary)]
        })
        .collect();
    table(&["ID", "STATE", "SEVERITY", "KIND", "SUBJECT", "OPENED", "SEEN", "SUMMARY"], &rows);
    Ok(())
}

fn channel_table(channels: &[ChannelView]) {
    let rows: Vec<Vec<String>> = channels
        .iter()
        .map(|c| {
            let scope = match &c.owner {
                Some(owner) => format!("personal ({owner})"),
                None => c.scope.clone(),
            };
            let last = match (&c.last_state, c.failing) {
                (Some(state), true) => format!("{state}, failing"),
                (Some(state), false) => state.clone(),
                (None, _) => "-".into(),
            };
            vec![cell(&c.id), cell(&c.name), scope, cell(&c.kind), cell(&c.target), c.events.join(","), last]
        })
        .collect();
    table(&["ID", "NAME", "SCOPE", "KIND", "TARGET", "EVENTS", "LAST"], &rows);
}

fn delivery_table(deliveries: &[DeliveryView]) {
    let rows: Vec<Vec<String>> = deliveries
        .iter()
        .map(|d| {
            let outcome = d.attempt_log.last().map(|a| a.outcome.clone()).or_else(|| d.last_error.clone()).unwrap_or_default();
            vec![cell(&d.id), cell(&d.created_at), cell(&d.event), cell(&d.state), d.attempts.to_string(), cell(&outcome), cell(&d.summary)]
        })
        .collect();
    table(&["DELIVERY", "QUEUED", "EVENT", "STATE", "TRIES", "LAST ANSWER", "MESSAGE"], &rows);
}

async fn channel(api: &Api, command: ChannelCommand, json: bool) -> Result<(), Failure> {
    match command {
        ChannelCommand::Add(args) => {
            let (request, made_secret) = new_channel(args)?;
            let view: ChannelView = api.call(Method::POST, "/api/alerts/channels", Some(&request)).await?;
            if json {
                render::json(&view);
            } else {
                println!("added alert channel {} ({}) → {}", view.name, view.id, view.target);
                if let Some(secret) = made_secret {
                    println!("signing secret (shown once; receivers check X-Cloudweb-Signature with it): {secret}");
                }
            }
            Ok(())
        }
        ChannelCommand::Show { id } => {
            let detail: ChannelDetail = api.get(&format!("/api/alerts/channels/{}", segment(&id))).await?;
            if json {
                render::json(&detail);
            } else {
                channel_table(std::slice::from_ref(&detail.channel));
                println!();
                if detail.deliveries.is_empty() {
                    println!("no deliveries yet (cloudweb alerts channel test {})", detail.channel.id);
                } else {
                    delivery_table(&detail.deliveries);
                }
            }
            Ok(())
        }
        ChannelCommand::Remove { id } => {
            api.delete(&format!("/api/alerts/channels/{}", segment(&id))).await?;
            if !json {
                println!("deleted alert channel {id}");
            }
            Ok(())
        }
        ChannelCommand::Test { id } => test(api, &id, json).await,
    }
}

/// Queues a test message and waits (up to 30 s) for its first attempt.
async fn test(api: &Api, id: &str, json: bool) -> Result<(), Failure> {
    let queued: DeliveryView = api.post(&format!("/api/alerts/channels/{}/test", segment(id))).await?;
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let detail: ChannelDetail = api.get(&format!("/api/alerts/channels/{}", segment(id))).await?;
        let delivery = detail.deliveries.into_iter().find(|d| d.id == queued.id);
        match delivery {
            Some(d) if d.attempts > 0 || tokio::time::Instant::now() >= deadline => {
                if json {
                    render::json(&d);
                }
                return match d.attempt_log.last() {
                    Some(a) if a.ok => {
                        if !json {
                            println!("test message delivered: {}", a.outcome);
                        }
                        Ok(())
                    }
                    Some(a) => Err(Failure::Action(format!("the test message failed: {} (retried until {}; cloudweb alerts channel show {id})", a.outcome, d.next_attempt_at.as_deref().unwrap_or("given up")))),
                    None => Err(Failure::Action(format!("the test message is still queued after 30 s (cloudweb alerts channel show {id})"))),
                };
            }
            Some(_) => tokio::time::sleep(std::time::Duration::from_millis(500)).await,
            None => return Err(Failure::Action("the test message is gone (was the channel deleted?)".into())),
        }
    }
}

fn random_secret() -> Result<String, Failure> {
    let mut bytes = [0u8; 24];
    std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut bytes)).map_err(|e| Failure::Action(format!("cannot read /dev/urandom: {e}")))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

fn read_secret(path: &str) -> Result<String, Failure> {
    let mut text = String::new();
    let read = if path == "-" { std::io::stdin().read_to_string(&mut text).map(drop) } else { std::fs::read_to_string(path).map(|t| text = t) };
    read.map_err(|e| Failure::Usage(format!("--secret-file {path}: {e}")))?;
    Ok(text.trim().to_string())
}

/// The request, and a signing secret made here (to print once).
fn new_channel(args: AddArgs) -> Result<(NewAlertChannel, Option<String>), Failure> {
    let mut made = None;
    let target = if let Some(url) = args.webhook {
        let secret = match &args.secret_file {
            Some(path) => read_secret(path)?,
            None => {
                let secret = random_secret()?;
                made = Some(secret.clone());
                secret
            }
        };
        ChannelTarget::Webhook { url, secret }
    } else if let Some(url) = args.slack {
        ChannelTarget::Slack { url }
    } else if !args.email.is_empty() {
        let host = args.smtp_host.ok_or_else(|| Failure::Usage("--email needs --smtp-host".into()))?;
        let from = args.from.ok_or_else(|| Failure::Usage("--email needs --from".into()))?;
        let password = match &args.smtp_password_env {
            Some(var) => Some(std::env::var(var).map_err(|_| Failure::Usage(format!("--smtp-password-env {var}: that variable is not set")))?),
            None => None,
        };
        let tls = match args.smtp_tls.as_str() {
            "tls" => SmtpTls::Tls,
            "none" => SmtpTls::None,
            _ => SmtpTls::Starttls,
        };
        ChannelTarget::Email { smtp: SmtpServer { host, port: args.smtp_port, tls, username: args.smtp_user, password }, from, to: args.email }
    } else {
        return Err(Failure::Usage("give --webhook URL, --slack URL or --email ADDRESS".into()));
    };
    let events = (!args.events.is_empty()).then_some(args.events);
    Ok((NewAlertChannel { name: args.name, personal: args.personal, events, target }, made))
}
