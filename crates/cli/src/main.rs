//! `cloudweb`: the command line for the cloud-web user API.
//!
//! Exit statuses a script can trust: 0 when the action was done, 1 when it
//! failed (the server refused it, could not be reached, or a followed
//! deployment failed), 2 for a usage error (unknown command or flag, a bad
//! value). `run`, `cron run` and `runs logs --follow` exit with the
//! command's own status instead (see [`follow::run_outcome`]). Listings
//! take `--json` and then print the API's JSON.

mod alerts;
mod apps;
mod autoscale;
mod backups;
mod client;
mod config;
mod cron;
mod deploy;
mod domains;
mod duration;
mod env;
mod exec;
mod follow;
mod gitea;
mod github;
mod login;
mod logs;
mod nodes;
mod previews;
mod probes;
mod render;
mod run;
mod scale;
mod services;
mod teams;
mod volumes;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use apps::{AppsCommand, CreateArgs, RunArgs, SetArgs};
use cron::{AddArgs, CronCommand};
use domains::DomainsCommand;
use env::{env_name, EnvCommand};
use login::LoginArgs;
use nodes::NodesCommand;
use services::ServicesCommand;
use backups::BackupsCommand;
use run::{OneOffArgs, RunsArgs, RunsCommand};
use volumes::VolumesCommand;

/// Why a command did not succeed, and so its exit status.
#[derive(Debug)]
pub enum Failure {
    /// Exit 2: the command line is wrong.
    Usage(String),
    /// Exit 1: the action failed.
    Action(String),
    /// This exit status (a followed run's), with a line on stderr if any.
    Exit(u8, Option<String>),
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Usage(message) | Failure::Action(message) | Failure::Exit(_, Some(message)) => f.write_str(message),
            Failure::Exit(status, None) => write!(f, "exit status {status}"),
        }
    }
}

#[derive(Parser)]
#[command(name = "cloudweb", version, about = "Manage a cloud-web cluster through its user API")]
struct Cli {
    /// Print listings and results as JSON.
    #[arg(long, global = true)]
    json: bool,
    /// The control plane's API URL (default: the one stored by `login`,
    /// or CLOUDWEB_SERVER).
    #[arg(long, global = true, value_name = "URL")]
    server: Option<String>,
    #[command(subcommand)]
    command: Command,
}

// Parsed once per run: the size of the largest variant does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Command {
    /// Store the server URL and an API token (read from CLOUDWEB_TOKEN, or
    /// from stdin; asked for without echo on a terminal).
    Login(LoginArgs),
    /// Forget the stored token.
    Logout,
    /// List, drain, reactivate or remove nodes, or make a join token.
    Nodes {
        #[command(subcommand)]
        command: Option<NodesCommand>,
    },
    /// List, create or delete apps.
    Apps {
        #[command(subcommand)]
        command: Option<AppsCommand>,
    },
    /// An app's environment variables (values are write-only).
    Env {
        #[command(subcommand)]
        command: EnvCommand,
    },
    /// An app's custom domains.
    Domains {
        #[command(subcommand)]
        command: DomainsCommand,
    },
    /// Persistent volumes: their data outlives deploys and is deleted only
    /// by name.
    Volumes {
        #[command(subcommand)]
        command: Option<VolumesCommand>,
    },
    /// Managed databases (PostgreSQL, Redis/Valkey, MariaDB), reachable
    /// only over the mesh, and the apps linked to them.
    Services {
        #[command(subcommand)]
        command: Option<ServicesCommand>,
    },
    /// Backups of services and volumes (restic, to S3 or a path), their
    /// verification by restoring, and restores.
    Backups {
        #[command(subcommand)]
        command: Option<BackupsCommand>,
    },
    /// Scheduled jobs: an app's commands run on a cron schedule, each run in
    /// a new container of the app's running image with its environment.
    Cron {
        #[command(subcommand)]
        command: CronCommand,
    },
    /// Run a command once in a new container of an app's running image,
    /// with the app's environment, and follow it to its end.
    ///
    /// The output is printed as it comes (the command's stderr on stderr),
    /// and the exit status is the command's: 0 when it succeeded, its own
    /// exit code when it failed, 124 when it ran past --timeout, 125 when
    /// it could not start, 1 when it was cancelled, lost with its node or
    /// could not be started or followed (with the reason on stderr), 130
    /// after Ctrl-C, which cancels the run. The run is kept in the app's
    /// history (`cloudweb runs APP`).
    ///
    /// Example: cloudweb run web --timeout 10m -- ./manage.py migrate
    Run(OneOffArgs),
    /// An app's runs (scheduled and one-off), newest first; one run's
    /// output; cancel one.
    Runs(RunsArgs),
    /// Deploy an app from its branch head or a given commit.
    Deploy {
        app: String,
        /// A commit id (or an abbreviation of 4 or more hex digits).
        #[arg(long)]
        commit: Option<String>,
        /// Let the app's older deployments that are still building finish
        /// (by default this deploy supersedes them at once); whichever
        /// finishes first, this one ends up running.
        #[arg(long)]
        keep_in_flight: bool,
        /// Show the state and the build log until the deployment runs
        /// (exit 0) or fails (exit 1).
        #[arg(long, short = 'f')]
        follow: bool,
    },
    /// Start an earlier deployment's image again.
    Rollback {
        app: String,
        /// The deployment to go back to (default: the newest one that ran
        /// and was replaced).
        #[arg(long, value_name = "DEPLOYMENT")]
        to: Option<String>,
        /// Follow the new deployment until it runs or fails.
        #[arg(long, short = 'f')]
        follow: bool,
    },
    /// Run an app's running deployment with N instances, now: new ones
    /// start spread over the nodes (no two on one node while another has
    /// room), surplus ones leave the routes before they stop. The count is
    /// kept for later deployments. Exits 1 when fewer could start.
    ///
    /// Example: cloudweb scale web 3
    Scale {
        app: String,
        /// 1 to 20.
        #[arg(value_parser = clap::value_parser!(u32).range(1..=20))]
        instances: u32,
    },
    /// An app's instances with their CPU, memory and restarts, from each
    /// node's latest usage sample.
    Top { app: String },
    /// Autoscale an app: keep its instances between --min and --max so
    /// that their CPU (--cpu PERCENT of the requested cores) or their
    /// requests per second (--rps N per instance) stay near the target;
    /// --off turns it off; alone, shows the settings and the decisions.
    ///
    /// Example: cloudweb autoscale web --min 2 --max 6 --cpu 70
    Autoscale(autoscale::AutoscaleArgs),
    /// Run a command in a running instance of an app (its container, its
    /// environment), through the control plane: no SSH to the node.
    ///
    /// `-i` passes this terminal's input, `-t` runs the command in a
    /// terminal (raw keys, Ctrl-C to the command, the window size follows).
    /// The exit status is the command's; 255 when the session ended
    /// without one (the node went away, idle too long), with the reason on
    /// stderr; 1 when it could not open (no such instance, too many
    /// sessions). Closing the session ends the command. Every session is
    /// recorded (`cloudweb sessions APP`).
    ///
    /// Examples: cloudweb exec web -it -- sh
    ///           cloudweb exec web --instance 2 -- ./manage.py migrate
    ///           cloudweb exec --service db -it -- psql -U app app
    Exec(exec::ExecArgs),
    /// Forward local TCP connections to a port of a running instance of an
    /// app, through the control plane (for a database only reachable on
    /// the mesh, a debug port). Runs until Ctrl-C; each connection is a
    /// recorded session.
    ///
    /// Examples: cloudweb port-forward web 8080:80
    ///           cloudweb port-forward --service db 15432:5432
    PortForward(exec::PortForwardArgs),
    /// An app's (or with --service a managed service's) exec and
    /// port-forward sessions, newest first: who, which instance, when, how
    /// long, how it ended.
    Sessions {
        app: String,
        #[arg(long)]
        service: bool,
    },
    /// An app's deployments, newest first.
    Deployments { app: String },
    /// What an app's instances print (stdout and stderr): the tail, a
    /// search of the stored lines, or followed.
    Logs(logs::LogsArgs),
    /// What the control plane alerts on (failed deployments, crash loops,
    /// unreachable or degraded nodes, full disks, certificates, backups):
    /// the open alerts (`--all`: resolved ones too), and with `channels` /
    /// `channel add|show|rm|test` where they are sent.
    Alerts {
        /// Resolved alerts too (kept 30 days).
        #[arg(long)]
        all: bool,
        #[command(subcommand)]
        command: Option<alerts::AlertsCommand>,
    },
    /// The GitHub App (setup, show) and the repositories it reaches, to
    /// make apps from (`apps create NAME --github OWNER/NAME`).
    Github {
        #[command(subcommand)]
        command: github::GithubCommand,
    },
    /// A Gitea or Forgejo instance (setup, show), who logged in with it,
    /// and the repositories yours reaches, to make apps from (`apps
    /// create NAME --gitea OWNER/NAME`).
    Gitea {
        #[command(subcommand)]
        command: gitea::GiteaCommand,
    },
    /// Teams: list yours, switch the current one, make one, manage members
    /// and roles (viewer, deployer, admin, owner) and users' cluster roles.
    Teams {
        #[command(subcommand)]
        command: Option<teams::TeamsCommand>,
    },
    /// The audit log: who did what, when, from where, with what result
    /// (`--since 24h --actor alice --action deploy`; `--json` prints JSON
    /// lines); `cloudweb audit verify` checks its hash chain.
    Audit(teams::AuditArgs),
    /// An app's deploy tokens, for CI systems: they deploy and read that
    /// app only.
    DeployTokens {
        #[command(subcommand)]
        command: teams::DeployTokensCommand,
    },
    /// An app's preview environments, one per pull or merge request: list,
    /// set on/off with limits, approve a fork's, rm; and the variables
    /// previews never get (`production-only`).
    Previews {
        #[command(subcommand)]
        command: previews::PreviewsCommand,
    },
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        // Help and version exit 0, usage errors 2.
        Err(err) => err.exit(),
    };
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("error: cannot start: {err}");
            return ExitCode::from(1);
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::Usage(message)) => {
            eprintln!("error: {message}");
            ExitCode::from(2)
        }
        Err(Failure::Action(message)) => {
            eprintln!("error: {message}");
            ExitCode::from(1)
        }
        Err(Failure::Exit(status, message)) => {
            if let Some(message) = message {
                eprintln!("error: {message}");
            }
            ExitCode::from(status)
        }
    }
}

async fn run(cli: Cli) -> Result<(), Failure> {
    let json = cli.json;
    if let Command::Login(args) = &cli.command {
        return login::login(cli.server.as_deref(), args).await;
    }
    if let Command::Logout = &cli.command {
        if config::remove()? {
            println!("logged out");
        } else {
            println!("not logged in");
        }
        return Ok(());
    }
    // Usage errors come before anything else (even "not logged in").
    check(&cli.command)?;
    let api = client::Api::new(&config::effective(cli.server.as_deref())?)?;
    match cli.command {
        Command::Login(_) | Command::Logout => unreachable!("handled above"),
        Command::Nodes { command } => nodes::run(&api, command.unwrap_or(NodesCommand::List), json).await,
        Command::Apps { command } => apps::run(&api, command.unwrap_or(AppsCommand::List), json).await,
        Command::Env { command } => env::run(&api, command, json).await,
        Command::Domains { command } => domains::run(&api, command, json).await,
        Command::Services { command } => services::run(&api, command.unwrap_or(ServicesCommand::List), json).await,
        Command::Backups { command } => backups::run(&api, command.unwrap_or(BackupsCommand::Status), json).await,
        Command::Volumes { command } => volumes::run(&api, command.unwrap_or(VolumesCommand::List { app: None }), json).await,
        Command::Deploy { app, commit, keep_in_flight, follow } => deploy::deploy(&api, &app, commit, keep_in_flight, follow, json).await,
        Command::Rollback { app, to, follow } => deploy::rollback(&api, &app, to, follow, json).await,
        Command::Scale { app, instances } => scale::scale(&api, &app, instances, json).await,
        Command::Top { app } => scale::top(&api, &app, json).await,
        Command::Autoscale(args) => autoscale::run(&api, args, json).await,
        Command::Exec(args) => exec::exec(&api, args).await,
        Command::PortForward(args) => exec::port_forward(&api, args).await,
        Command::Sessions { app, service } => exec::list(&api, &app, service, json).await,
        Command::Deployments { app } => deploy::deployments(&api, &app, json).await,
        Command::Logs(args) => logs::run(&api, args, json).await,
        Command::Alerts { all, command } => alerts::run(&api, command, all, json).await,
        Command::Github { command } => github::run(&api, command, json).await,
        Command::Gitea { command } => gitea::run(&api, command, json).await,
        Command::Teams { command } => teams::run(&api, command.unwrap_or(teams::TeamsCommand::List), json).await,
        Command::Audit(args) => teams::audit(&api, args, json).await,
        Command::DeployTokens { command } => teams::deploy_tokens(&api, command, json).await,
        Command::Previews { command } => previews::run(&api, command, json).await,
        Command::Cron { command } => cron::run(&api, command, json).await,
        Command::Run(args) => run::one_off(&api, args, json).await,
        Command::Runs(args) => run::runs(&api, args, json).await,
    }
}

/// Checks the values clap cannot: exit 2 before any request.
fn check(command: &Command) -> Result<(), Failure> {
    match command {
        Command::Deploy { commit: Some(commit), .. }
            if !(4..=64).contains(&commit.len()) || !commit.bytes().all(|b| b.is_ascii_hexdigit()) =>
        {
            return Err(Failure::Usage("--commit must be 4 to 64 hex digits".into()));
        }
        Command::Env { command: EnvCommand::Set { vars, .. } } => {
            let mut from_stdin = 0;
            for var in vars {
                let name = match var.split_once('=') {
                    Some((name, _)) => name,
                    None => {
                        from_stdin += 1;
                        var.as_str()
                    }
                };
                env_name(name)?;
            }
            if from_stdin > 1 {
                return Err(Failure::Usage("only one variable can take its value from stdin".into()));
            }
        }
        Command::Env { command: EnvCommand::Unset { names, .. } } => {
            for name in names {
                env_name(name)?;
            }
        }
        Command::Apps { command: Some(AppsCommand::Create(CreateArgs { run: RunArgs { cpu: Some(cpu), .. }, .. }) | AppsCommand::Set(SetArgs { run: RunArgs { cpu: Some(cpu), .. }, .. })) }
            if !cpu.is_finite() || !(0.01..=64.0).contains(cpu) =>
        {
            return Err(Failure::Usage("--cpu must be 0.01 to 64 cores".into()));
        }
        Command::Nodes { command: Some(NodesCommand::Drain { node, .. } | NodesCommand::Undrain { node } | NodesCommand::Rm { node, .. }) }
            if node.trim().is_empty() =>
        {
            return Err(Failure::Usage("a node id or name is needed".into()));
        }
        Command::PortForward(args) => {
            exec::ports(&args.ports)?;
        }
        Command::Exec(exec::ExecArgs { command, .. }) | Command::Run(OneOffArgs { command, .. }) | Command::Cron { command: CronCommand::Add(AddArgs { command, .. }) } => run::check_command(command)?,
        Command::Cron { command: CronCommand::Update(args) } => {
            if !args.command.is_empty() {
                run::check_command(&args.command)?;
            }
            cron::change_body(args)?;
        }
        Command::Runs(RunsArgs { command: Some(RunsCommand::Logs { id, .. } | RunsCommand::Show { id, .. } | RunsCommand::Cancel { id, .. }), .. })
            if id.trim().is_empty() =>
        {
            return Err(Failure::Usage("a run id (tr_…) is needed".into()));
        }
        _ => {}
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
