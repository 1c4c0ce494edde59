//! `cloudweb`: the command line for the cloud-web user API.
//!
//! Exit statuses a script can trust: 0 when the action was done, 1 when it
//! failed (the server refused it, could not be reached, or a followed
//! deployment failed), 2 for a usage error (unknown command or flag, a bad
//! value). Listings take `--json` and then print the API's JSON.

mod client;
mod config;
mod follow;
mod render;

use std::io::{BufRead, IsTerminal, Read};
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use reqwest::Method;
use serde_json::{json, Value};

use client::{segment, Api};
use render::{cell, clean, table};

/// Why a command did not succeed, and so its exit status.
#[derive(Debug)]
pub enum Failure {
    /// Exit 2: the command line is wrong.
    Usage(String),
    /// Exit 1: the action failed.
    Action(String),
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Usage(message) | Failure::Action(message) => f.write_str(message),
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
    /// An app's deployments, newest first.
    Deployments { app: String },
    /// What an app's instances print (stdout and stderr).
    Logs {
        app: String,
        /// Keep printing new lines as they come.
        #[arg(long, short = 'f')]
        follow: bool,
        /// How many recent lines (0 to 2000).
        #[arg(long, short = 'n', default_value_t = 100, value_parser = clap::value_parser!(u16).range(0..=2000))]
        lines: u16,
        /// Only this deployment's lines.
        #[arg(long)]
        deployment: Option<String>,
    },
}

#[derive(Args)]
struct LoginArgs {
    /// PEM file of the CA of an https server's certificate (default: the
    /// system's bundle).
    #[arg(long, value_name = "FILE")]
    ca_file: Option<std::path::PathBuf>,
}

#[derive(Subcommand)]
enum NodesCommand {
    /// Every node with its state and health (the default).
    List,
    /// Make a single-use join token and print the command to run on the
    /// new node.
    Token,
    /// Stop placing instances on a node and move its instances away.
    Drain { node: String },
    /// Let a drained node take instances again.
    Undrain { node: String },
    /// Remove a node that runs nothing (`--force` for an unreachable node
    /// whose instances then fail and start elsewhere).
    Rm {
        node: String,
        #[arg(long)]
        force: bool,
    },
}

#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum AppsCommand {
    /// Every app (the default).
    List,
    /// Create an app from a git repository.
    Create(CreateArgs),
    /// Change an app's branch, port, build or run settings (what is not
    /// given stays); the next deployment uses them.
    Set(SetArgs),
    /// Stop an app's instances and delete it with its deployments.
    Rm {
        app: String,
        /// Do not ask (needed when stdin is not a terminal).
        #[arg(long, short = 'y')]
        yes: bool,
    },
}

#[derive(Args)]
struct CreateArgs {
    name: String,
    /// The git repository (https://, ssh:// or git@host:path).
    #[arg(long)]
    repo: String,
    #[arg(long, default_value = "main")]
    branch: String,
    /// The port the app listens on (it also gets PORT).
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..))]
    port: u16,
    /// A custom domain (repeat for more).
    #[arg(long = "domain", value_name = "HOST")]
    domains: Vec<String>,
    #[command(flatten)]
    run: RunArgs,
    /// User name for an https repository; the password is read from
    /// CLOUDWEB_GIT_PASSWORD or stdin.
    #[arg(long)]
    git_username: Option<String>,
    /// The app's own ssh private key, for an ssh repository.
    #[arg(long, value_name = "FILE", requires = "git_known_hosts")]
    git_ssh_key: Option<std::path::PathBuf>,
    /// known_hosts lines of the git host (`ssh-keyscan` output).
    #[arg(long, value_name = "FILE", requires = "git_ssh_key")]
    git_known_hosts: Option<std::path::PathBuf>,
}

/// How an app is built and run, for `apps create` and `apps set`.
#[derive(Args)]
struct RunArgs {
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=20))]
    instances: Option<u32>,
    /// CPU cores per instance, e.g. 0.5.
    #[arg(long)]
    cpu: Option<f64>,
    /// Memory per instance: bytes, or with K, M or G (binary units).
    #[arg(long, value_parser = parse_size)]
    memory: Option<u64>,
    #[arg(long, value_parser = ["auto", "dockerfile", "static", "buildpacks"])]
    strategy: Option<String>,
    #[arg(long)]
    health_path: Option<String>,
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=3600))]
    health_timeout: Option<u32>,
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=7200))]
    build_timeout: Option<u32>,
    /// Static site: install command (with `apps set`, the build flags
    /// given replace the earlier build settings as a whole).
    #[arg(long)]
    install_cmd: Option<String>,
    /// Static site: build command.
    #[arg(long)]
    build_cmd: Option<String>,
    /// Static site: the directory the build writes.
    #[arg(long)]
    output_dir: Option<String>,
    /// Static site: serve index.html for unknown paths.
    #[arg(long, value_parser = ["auto", "yes", "no"])]
    spa: Option<String>,
}

impl RunArgs {
    /// Adds the settings given to a request body.
    fn add_to(self, body: &mut serde_json::Map<String, Value>) {
        let mut set = |key: &str, value: Value| {
            if !value.is_null() {
                body.insert(key.to_string(), value);
            }
        };
        set("instances", json!(self.instances));
        set("cpu", json!(self.cpu));
        set("memory", json!(self.memory));
        set("strategy", json!(self.strategy));
        set("health_path", json!(self.health_path));
        set("health_timeout_seconds", json!(self.health_timeout));
        set("build_timeout_seconds", json!(self.build_timeout));
        let build: serde_json::Map<String, Value> = [("install_cmd", self.install_cmd), ("build_cmd", self.build_cmd), ("output_dir", self.output_dir), ("spa", self.spa)]
            .into_iter()
            .filter_map(|(key, value)| Some((key.to_string(), json!(value?))))
            .collect();
        if !build.is_empty() {
            body.insert("build".into(), Value::Object(build));
        }
    }
}

#[derive(Args)]
struct SetArgs {
    app: String,
    #[arg(long)]
    branch: Option<String>,
    /// The port the app listens on (it also gets PORT).
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..))]
    port: Option<u16>,
    #[command(flatten)]
    run: RunArgs,
    /// Put a setting back to its default (repeat for more).
    #[arg(long, value_name = "SETTING", value_parser = ["cpu", "memory", "build", "build-timeout"])]
    reset: Vec<String>,
}

#[derive(Subcommand)]
enum EnvCommand {
    /// The variables' names.
    List { app: String },
    /// Set variables: NAME=VALUE, or NAME alone to read its value from
    /// stdin (keeps it out of the process list). Used by the next deploy.
    Set {
        app: String,
        #[arg(required = true, value_name = "NAME[=VALUE]")]
        vars: Vec<String>,
    },
    /// Remove variables.
    Unset {
        app: String,
        #[arg(required = true, value_name = "NAME")]
        names: Vec<String>,
    },
}

#[derive(Subcommand)]
enum DomainsCommand {
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

fn parse_size(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let (digits, multiplier) = match text.char_indices().last() {
        Some((i, 'k' | 'K')) => (&text[..i], 1u64 << 10),
        Some((i, 'm' | 'M')) => (&text[..i], 1 << 20),
        Some((i, 'g' | 'G')) => (&text[..i], 1 << 30),
        _ => (text, 1),
    };
    let value: u64 = digits.parse().map_err(|_| "expected a whole number, optionally followed by K, M or G".to_string())?;
    value.checked_mul(multiplier).ok_or_else(|| "too large".to_string())
}

/// An environment variable name: a letter or `_`, then letters, digits
/// and `_`.
fn env_name(name: &str) -> Result<(), Failure> {
    let mut bytes = name.bytes();
    let valid = bytes.next().is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
        && name.len() <= 256;
    if valid {
        Ok(())
    } else {
        Err(Failure::Usage(format!("invalid variable name {:?}: use letters, digits and '_', not starting with a digit", clean(name))))
    }
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
    }
}

async fn run(cli: Cli) -> Result<(), Failure> {
    let json = cli.json;
    if let Command::Login(args) = &cli.command {
        return login(cli.server.as_deref(), args).await;
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
    let api = Api::new(&config::effective(cli.server.as_deref())?)?;
    match cli.command {
        Command::Login(_) | Command::Logout => unreachable!("handled above"),
        Command::Nodes { command } => nodes(&api, command.unwrap_or(NodesCommand::List), json).await,
        Command::Apps { command } => apps(&api, command.unwrap_or(AppsCommand::List), json).await,
        Command::Env { command } => env(&api, command, json).await,
        Command::Domains { command } => domains(&api, command, json).await,
        Command::Deploy { app, commit, keep_in_flight, follow } => deploy(&api, &app, commit, keep_in_flight, follow, json).await,
        Command::Rollback { app, to, follow } => rollback(&api, &app, to, follow, json).await,
        Command::Deployments { app } => deployments(&api, &app, json).await,
        Command::Logs { app, follow, lines, deployment } => logs(&api, &app, follow, lines, deployment, json).await,
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
        Command::Nodes { command: Some(NodesCommand::Drain { node } | NodesCommand::Undrain { node } | NodesCommand::Rm { node, .. }) }
            if node.trim().is_empty() =>
        {
            return Err(Failure::Usage("a node id or name is needed".into()));
        }
        _ => {}
    }
    Ok(())
}

/// Reads one secret line: from a terminal without echo, else from stdin.
fn read_secret(prompt: &str) -> Result<String, Failure> {
    let stdin = std::io::stdin();
    if stdin.is_terminal() {
        eprint!("{prompt}");
        let _echo = NoEcho::new();
        let mut line = String::new();
        let read = stdin.lock().read_line(&mut line);
        eprintln!();
        read.map_err(|e| Failure::Action(format!("cannot read stdin: {e}")))?;
        Ok(line)
    } else {
        let mut text = String::new();
        stdin.lock().take(64 * 1024).read_to_string(&mut text).map_err(|e| Failure::Action(format!("cannot read stdin: {e}")))?;
        Ok(text.lines().next().unwrap_or_default().to_string())
    }
}

/// Turns the terminal's echo off while it lives.
struct NoEcho(Option<libc::termios>);

impl NoEcho {
    fn new() -> NoEcho {
        // SAFETY: tcgetattr/tcsetattr on stdin with a zeroed termios that
        // tcgetattr fills in; the old settings are restored on drop.
        unsafe {
            let mut old: libc::termios = std::mem::zeroed();
            if libc::tcgetattr(libc::STDIN_FILENO, &mut old) != 0 {
                return NoEcho(None);
            }
            let mut quiet = old;
            quiet.c_lflag &= !libc::ECHO;
            quiet.c_lflag |= libc::ECHONL;
            if libc::tcsetattr(libc::STDIN_FILENO, libc::TCSANOW, &quiet) != 0 {
                return NoEcho(None);
            }
            NoEcho(Some(old))
        }
    }
}

impl Drop for NoEcho {
    fn drop(&mut self) {
        if let Some(old) = self.0 {
            // SAFETY: restores the settings read in `new`.
            unsafe {
                libc::tcsetattr(libc::STDIN_FILENO, libc::TCSANOW, &old);
            }
        }
    }
}

async fn login(server_flag: Option<&str>, args: &LoginArgs) -> Result<(), Failure> {
    let stored = config::load().ok().flatten();
    let server = match (server_flag, std::env::var("CLOUDWEB_SERVER").ok().filter(|s| !s.is_empty()), &stored) {
        (Some(server), _, _) => config::server_url(server)?,
        (None, Some(server), _) => config::server_url(&server)?,
        (None, None, Some(stored)) => stored.server.clone(),
        (None, None, None) => config::DEFAULT_SERVER.to_string(),
    };
    if let Some(file) = &args.ca_file {
        if !file.is_file() {
            return Err(Failure::Usage(format!("--ca-file {}: no such file", file.display())));
        }
    }
    let token = match std::env::var("CLOUDWEB_TOKEN").ok().filter(|t| !t.is_empty()) {
        Some(token) => token,
        None => read_secret("API token: ")?,
    };
    let token = config::token(&token)?;
    let ca_file = args.ca_file.clone().map(|f| std::path::absolute(&f).unwrap_or(f)).or(stored.and_then(|s| s.ca_file));
    let config = config::Config { server: server.clone(), token, ca_file };
    // Check the token before storing it.
    Api::new(&config)?.get("/api/apps").await?;
    let path = config::save(&config)?;
    println!("logged in to {server} (token stored in {})", path.display());
    Ok(())
}

/// A node given by id or name.
async fn node_id(api: &Api, node: &str) -> Result<String, Failure> {
    let list = api.get("/api/nodes").await?;
    let nodes = list["nodes"].as_array().cloned().unwrap_or_default();
    if let Some(found) = nodes.iter().find(|n| n["id"] == node) {
        return Ok(found["id"].as_str().unwrap_or(node).to_string());
    }
    let named: Vec<&Value> = nodes.iter().filter(|n| n["name"] == node).collect();
    match named.as_slice() {
        [one] => Ok(one["id"].as_str().unwrap_or(node).to_string()),
        [] => Err(Failure::Action(format!("no node with the id or name {:?}", clean(node)))),
        _ => Err(Failure::Action(format!("several nodes are named {:?}; give the id", clean(node)))),
    }
}

fn node_rows(nodes: &[Value]) -> Vec<Vec<String>> {
    nodes
        .iter()
        .map(|n| {
            let sample = &n["metrics"]["sample"]["node"];
            let health = match n["health_reason"].as_str() {
                Some(reason) => format!("{} ({})", cell(&n["health"]), clean(reason)),
                None => cell(&n["health"]),
            };
            vec![
                cell(&n["name"]),
                cell(&n["id"]),
                cell(&n["state"]),
                health,
                cell(&n["mesh_address"]),
                match sample["cpu_pct"].as_f64() {
                    Some(cpu) => format!("{cpu:.0}%"),
                    None => "-".into(),
                },
                render::bytes(&sample["mem_used"]),
                cell(&n["version"]),
                cell(&n["last_heartbeat"]),
            ]
        })
        .collect()
}

const NODE_HEADER: [&str; 9] = ["NAME", "ID", "STATE", "HEALTH", "ADDRESS", "CPU", "MEMORY", "VERSION", "LAST HEARTBEAT"];

async fn nodes(api: &Api, command: NodesCommand, json: bool) -> Result<(), Failure> {
    match command {
        NodesCommand::List => {
            let list = api.get("/api/nodes").await?;
            let nodes = list["nodes"].as_array().cloned().unwrap_or_default();
            if json {
                render::json(&Value::Array(nodes));
            } else {
                table(&NODE_HEADER, &node_rows(&nodes));
            }
        }
        NodesCommand::Token => {
            let token = api.call(Method::POST, "/api/join-tokens", None).await?;
            if json {
                render::json(&token);
            } else {
                println!("Run this on the new node (the token works once, until {}):", cell(&token["expires_at"]));
                println!();
                println!("  {}", cell(&token["command"]));
            }
        }
        NodesCommand::Drain { node } => {
            let id = node_id(api, &node).await?;
            let view = api.call(Method::POST, &format!("/api/nodes/{}/drain", segment(&id)), None).await?;
            if json {
                render::json(&view);
            } else {
                println!("node {} ({id}) is draining: its instances move to other nodes", cell(&view["name"]));
                let waiting = view["waiting"].as_array().cloned().unwrap_or_default();
                if !waiting.is_empty() {
                    println!("these apps have nowhere to go yet:");
                    for app in waiting {
                        println!("  {}: {}", cell(&app["app"]), cell(&app["reason"]));
                    }
                }
            }
        }
        NodesCommand::Undrain { node } => {
            let id = node_id(api, &node).await?;
            let view = api.call(Method::POST, &format!("/api/nodes/{}/undrain", segment(&id)), None).await?;
            if json {
                render::json(&view);
            } else {
                println!("node {} ({id}) takes new instances again", cell(&view["name"]));
            }
        }
        NodesCommand::Rm { node, force } => {
            let id = node_id(api, &node).await?;
            let query = if force { "?force=1" } else { "" };
            api.call(Method::DELETE, &format!("/api/nodes/{}{query}", segment(&id)), None).await?;
            if json {
                render::json(&json!({"removed": id}));
            } else {
                println!("node {id} removed");
            }
        }
    }
    Ok(())
}

async fn apps(api: &Api, command: AppsCommand, json: bool) -> Result<(), Failure> {
    match command {
        AppsCommand::List => {
            let list = api.get("/api/apps").await?;
            let apps = list["apps"].as_array().cloned().unwrap_or_default();
            if json {
                render::json(&Value::Array(apps));
            } else {
                let rows: Vec<Vec<String>> = apps
                    .iter()
                    .map(|a| {
                        vec![
                            cell(&a["name"]),
                            cell(&a["repo_url"]),
                            cell(&a["branch"]),
                            cell(&a["strategy"]),
                            cell(&a["instances"]),
                            cell(&a["port"]),
                            cell(&a["domains"]),
                        ]
                    })
                    .collect();
                table(&["NAME", "REPOSITORY", "BRANCH", "STRATEGY", "INSTANCES", "PORT", "DOMAINS"], &rows);
            }
        }
        AppsCommand::Create(args) => {
            let body = create_body(args)?;
            let app = api.call(Method::POST, "/api/apps", Some(&body)).await?;
            if json {
                render::json(&app);
            } else {
                println!("app {} created; deploy it with `cloudweb deploy {} --follow`", cell(&app["name"]), cell(&app["name"]));
            }
        }
        AppsCommand::Set(args) => {
            let app = args.app.clone();
            let body = set_body(args)?;
            let view = api.call(Method::PATCH, &format!("/api/apps/{}", segment(&app)), Some(&body)).await?;
            if json {
                render::json(&view);
            } else {
                println!("app {} changed; the next deployment uses the new settings", cell(&view["name"]));
            }
        }
        AppsCommand::Rm { app, yes } => {
            if !yes {
                if !std::io::stdin().is_terminal() {
                    return Err(Failure::Usage(format!("deleting {} needs --yes when stdin is not a terminal", clean(&app))));
                }
                eprint!("Delete app {} with its deployments and logs? Type its name to confirm: ", clean(&app));
                let mut answer = String::new();
                std::io::stdin().lock().read_line(&mut answer).map_err(|e| Failure::Action(format!("cannot read stdin: {e}")))?;
                if answer.trim() != app {
                    return Err(Failure::Action("not confirmed; nothing deleted".into()));
                }
            }
            api.call(Method::DELETE, &format!("/api/apps/{}", segment(&app)), None).await?;
            if json {
                render::json(&json!({"deleted": app}));
            } else {
                println!("app {} deleted", clean(&app));
            }
        }
    }
    Ok(())
}

fn create_body(args: CreateArgs) -> Result<Value, Failure> {
    let mut body = json!({"name": args.name, "repo_url": args.repo, "branch": args.branch, "port": args.port, "domains": args.domains});
    args.run.add_to(body.as_object_mut().expect("an object"));
    if let Some(user) = args.git_username {
        let password = match std::env::var("CLOUDWEB_GIT_PASSWORD").ok().filter(|p| !p.is_empty()) {
            Some(password) => password,
            None => read_secret("git password or access token: ")?,
        };
        if password.trim().is_empty() {
            return Err(Failure::Usage("--git-username needs a password (CLOUDWEB_GIT_PASSWORD or stdin)".into()));
        }
        body["git_username"] = json!(user);
        body["git_password"] = json!(password.trim());
    }
    if let (Some(key), Some(hosts)) = (args.git_ssh_key, args.git_known_hosts) {
        let read = |path: &std::path::Path| {
            std::fs::read_to_string(path).map_err(|e| Failure::Usage(format!("cannot read {}: {e}", path.display())))
        };
        body["git_ssh_key"] = json!(read(&key)?);
        body["git_known_hosts"] = json!(read(&hosts)?);
    }
    Ok(body)
}

/// The `PATCH /api/apps/{name}` body of `apps set`: the settings given;
/// none is a usage error.
fn set_body(args: SetArgs) -> Result<Value, Failure> {
    let mut body = serde_json::Map::new();
    if let Some(branch) = args.branch {
        body.insert("branch".into(), json!(branch));
    }
    if let Some(port) = args.port {
        body.insert("port".into(), json!(port));
    }
    args.run.add_to(&mut body);
    for setting in &args.reset {
        let key = match setting.as_str() {
            "build-timeout" => "build_timeout_seconds",
            other => other,
        };
        if body.insert(key.to_string(), Value::Null).is_some() {
            return Err(Failure::Usage(format!("--reset {setting} goes against a value given for it")));
        }
    }
    if body.is_empty() {
        return Err(Failure::Usage("nothing to change: give at least one setting (see `cloudweb apps set --help`)".into()));
    }
    Ok(Value::Object(body))
}

async fn env(api: &Api, command: EnvCommand, json: bool) -> Result<(), Failure> {
    let (app, body) = match command {
        EnvCommand::List { app } => {
            let view = api.get(&format!("/api/apps/{}", segment(&app))).await?;
            if json {
                render::json(&view["env"]);
            } else {
                for name in view["env"].as_array().cloned().unwrap_or_default() {
                    println!("{}", cell(&name));
                }
            }
            return Ok(());
        }
        EnvCommand::Set { app, vars } => {
            let mut set = serde_json::Map::new();
            let mut from_stdin = None;
            for var in vars {
                match var.split_once('=') {
                    Some((name, value)) => {
                        env_name(name)?;
                        set.insert(name.to_string(), json!(value));
                    }
                    None => {
                        env_name(&var)?;
                        if from_stdin.replace(var.clone()).is_some() {
                            return Err(Failure::Usage("only one variable can take its value from stdin".into()));
                        }
                    }
                }
            }
            if let Some(name) = from_stdin {
                let value = read_secret(&format!("value of {name}: "))?;
                set.insert(name, json!(value.trim_end_matches(['\r', '\n'])));
            }
            (app, json!({"set": set}))
        }
        EnvCommand::Unset { app, names } => {
            for name in &names {
                env_name(name)?;
            }
            (app, json!({"unset": names}))
        }
    };
    let answer = api.call(Method::PATCH, &format!("/api/apps/{}/env", segment(&app)), Some(&body)).await?;
    if json {
        render::json(&answer["env"]);
    } else {
        println!("{} now has: {} (used by the next deploy)", clean(&app), cell(&answer["env"]));
    }
    Ok(())
}

/// How a domains command turns the current list into the new one.
type DomainChange = Box<dyn FnOnce(Vec<String>) -> Vec<String>>;

async fn domains(api: &Api, command: DomainsCommand, json: bool) -> Result<(), Failure> {
    let (app, change): (String, DomainChange) = match command {
        DomainsCommand::List { app } => {
            let view = api.get(&format!("/api/apps/{}", segment(&app))).await?;
            if json {
                render::json(&view["domains"]);
            } else {
                for domain in view["domains"].as_array().cloned().unwrap_or_default() {
                    println!("{}", cell(&domain));
                }
            }
            return Ok(());
        }
        DomainsCommand::Certificates { app } => {
            let answer = api.get(&format!("/api/apps/{}/certificates", segment(&app))).await?;
            let certificates = answer["certificates"].as_array().cloned().unwrap_or_default();
            if json {
                render::json(&Value::Array(certificates));
            } else {
                let rows: Vec<Vec<String>> = certificates
                    .iter()
                    .map(|c| {
                        vec![cell(&c["host"]), cell(&c["state"]), cell(&c["not_after"]), cell(&c["issuer"]), cell(&c["orders"]), cell(&c["last_error"])]
                    })
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
    let view = api.get(&path).await?;
    let current: Vec<String> = view["domains"].as_array().into_iter().flatten().filter_map(|d| d.as_str().map(str::to_string)).collect();
    let wanted = change(current);
    let answer = api.call(Method::PUT, &format!("{path}/domains"), Some(&json!(wanted))).await?;
    if json {
        render::json(&answer["domains"]);
    } else {
        println!("{} serves: {}", clean(&app), cell(&answer["domains"]));
    }
    Ok(())
}

/// Prints a new deployment, or follows it; the exit status follows it.
async fn started(api: &Api, deployment: Value, follow: bool, json: bool) -> Result<(), Failure> {
    let id = deployment["id"].as_str().unwrap_or_default().to_string();
    if !follow {
        if json {
            render::json(&deployment);
        } else {
            println!("deployment {id} {}", cell(&deployment["state"]));
        }
        return Ok(());
    }
    if !json {
        println!("deployment {id} queued");
    }
    let (deployment, ok) = follow::deployment(api, &id, json).await?;
    if json {
        render::json(&deployment);
    }
    if ok {
        if !json {
            println!("deployment {id} is {}", cell(&deployment["state"]));
        }
        Ok(())
    } else {
        let error = deployment["error"].as_str().map(clean).unwrap_or_else(|| "no reason given".into());
        Err(Failure::Action(format!("deployment {id} is {}: {error}", cell(&deployment["state"]))))
    }
}

async fn deploy(api: &Api, app: &str, commit: Option<String>, keep_in_flight: bool, follow: bool, json: bool) -> Result<(), Failure> {
    let mut body = json!({});
    if let Some(commit) = commit {
        body["commit"] = json!(commit);
    }
    if keep_in_flight {
        body["keep_in_flight"] = json!(true);
    }
    let deployment = api.call(Method::POST, &format!("/api/apps/{}/deploy", segment(app)), Some(&body)).await?;
    started(api, deployment, follow, json).await
}

async fn rollback(api: &Api, app: &str, to: Option<String>, follow: bool, json: bool) -> Result<(), Failure> {
    let target = match to {
        Some(id) => id,
        None => {
            let list = api.get(&format!("/api/apps/{}/deployments", segment(app))).await?;
            let earlier = list["deployments"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|d| d["state"] == "superseded" && d["image"].is_string())
                .and_then(|d| d["id"].as_str().map(str::to_string));
            earlier.ok_or_else(|| Failure::Action(format!("{} has no earlier deployment that ran; give one with --to", clean(app))))?
        }
    };
    if !json {
        println!("rolling {} back to {}", clean(app), clean(&target));
    }
    let deployment = api
        .call(Method::POST, &format!("/api/apps/{}/rollback", segment(app)), Some(&json!({"deployment_id": target})))
        .await?;
    started(api, deployment, follow, json).await
}

async fn deployments(api: &Api, app: &str, json: bool) -> Result<(), Failure> {
    let list = api.get(&format!("/api/apps/{}/deployments", segment(app))).await?;
    let deployments = list["deployments"].as_array().cloned().unwrap_or_default();
    if json {
        render::json(&Value::Array(deployments));
        return Ok(());
    }
    let rows: Vec<Vec<String>> = deployments
        .iter()
        .map(|d| {
            let commit: String = d["commit"].as_str().map(|c| c.chars().take(12).collect()).unwrap_or_else(|| "-".to_string());
            let nodes: Vec<String> = d["instances"].as_array().into_iter().flatten().map(|i| cell(&i["node_id"])).collect();
            vec![
                cell(&d["id"]),
                cell(&d["state"]),
                cell(&d["kind"]),
                clean(&commit),
                cell(&d["created_at"]),
                if nodes.is_empty() { "-".into() } else { nodes.join(",") },
                cell(&d["error"]),
            ]
        })
        .collect();
    table(&["ID", "STATE", "KIND", "COMMIT", "CREATED", "NODES", "ERROR"], &rows);
    Ok(())
}

async fn logs(api: &Api, app: &str, follow: bool, lines: u16, deployment: Option<String>, json: bool) -> Result<(), Failure> {
    let mut path = format!("/api/apps/{}/logs?lines={lines}", segment(app));
    if let Some(deployment) = &deployment {
        path.push_str(&format!("&deployment={}", segment(deployment)));
    }
    if follow {
        path.push_str("&follow=1");
        return follow::app_logs(api, &path, json).await;
    }
    let answer = api.get(&path).await?;
    let lines = answer["lines"].as_array().cloned().unwrap_or_default();
    if json {
        render::json(&Value::Array(lines));
    } else {
        for line in &lines {
            println!("{}", follow::runtime_line(line));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_names() {
        assert_eq!(parse_size("512M").unwrap(), 512 << 20);
        assert_eq!(parse_size("1g").unwrap(), 1 << 30);
        assert_eq!(parse_size("1000").unwrap(), 1000);
        assert!(parse_size("1.5G").is_err());
        assert!(env_name("DATABASE_URL").is_ok());
        assert!(env_name("_X1").is_ok());
        assert!(matches!(env_name("1X"), Err(Failure::Usage(_))));
        assert!(matches!(env_name("A-B"), Err(Failure::Usage(_))));
    }

    #[test]
    fn apps_set_sends_only_what_is_given() {
        let parse = |args: &[&str]| match Cli::try_parse_from(["cloudweb", "apps", "set", "web"].iter().chain(args)).unwrap().command {
            Command::Apps { command: Some(AppsCommand::Set(args)) } => set_body(args),
            _ => unreachable!(),
        };
        let body = parse(&["--branch", "release", "--port", "3000", "--health-path", "/up"]).unwrap();
        assert_eq!(body, json!({"branch": "release", "port": 3000, "health_path": "/up"}));
        let body = parse(&["--build-cmd", "npm run build", "--reset", "cpu", "--reset", "build-timeout"]).unwrap();
        assert_eq!(body, json!({"build": {"build_cmd": "npm run build"}, "cpu": null, "build_timeout_seconds": null}));
        assert!(matches!(parse(&[]), Err(Failure::Usage(_))), "nothing to change");
        assert!(matches!(parse(&["--cpu", "1", "--reset", "cpu"]), Err(Failure::Usage(_))));
        assert!(Cli::try_parse_from(["cloudweb", "apps", "set", "web", "--reset", "port"]).is_err());
        assert!(Cli::try_parse_from(["cloudweb", "apps", "set", "web", "--port", "0"]).is_err());
    }

    #[test]
    fn the_command_line_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
