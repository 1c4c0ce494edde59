//! `cloudweb apps`: list, create, change and delete apps.

use std::io::{BufRead, IsTerminal};

use clap::{Args, Subcommand};
use cloudweb_api_types::apps::{AppList, AppPatch, AppView, BuildInput, CreateApp, Rollout};
use cloudweb_protocol::{Spa, Strategy};
use reqwest::Method;
use serde_json::json;

use crate::client::{segment, Api};
use crate::login::read_secret;
use crate::render::{self, cell, clean, table};
use crate::Failure;

#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
pub enum AppsCommand {
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
        /// The app's volumes stay, detached, with their data (an app with
        /// volumes needs this or --delete-volumes).
        #[arg(long, conflicts_with = "delete_volumes")]
        keep_volumes: bool,
        /// Delete the app's volumes and their data too.
        #[arg(long)]
        delete_volumes: bool,
    },
}

#[derive(Args)]
pub struct CreateArgs {
    name: String,
    /// The git repository (https://, ssh:// or git@host:path).
    #[arg(long, required_unless_present_any = ["github", "gitea"])]
    repo: Option<String>,
    /// Make the app from this GitHub repository (OWNER/NAME) through the
    /// GitHub App (`cloudweb github setup`): it deploys on push, with a
    /// token for that one repository per deploy and commit statuses.
    #[arg(long, value_name = "OWNER/NAME", conflicts_with_all = ["repo", "git_username", "git_ssh_key"])]
    github: Option<String>,
    /// Make the app from this Gitea or Forgejo repository (OWNER/NAME)
    /// through your Gitea identity (log in with Gitea first): it deploys
    /// on push through a webhook of its own, with commit statuses.
    #[arg(long, value_name = "OWNER/NAME", conflicts_with_all = ["repo", "github", "git_username", "git_ssh_key"])]
    gitea: Option<String>,
    /// With --gitea, which Gitea identity acts (its user id) when several could.
    #[arg(long, value_name = "ID")]
    gitea_account: Option<i64>,
    /// The branch to deploy (main; with --github or --gitea, the repository's default).
    #[arg(long)]
    branch: Option<String>,
    /// The port the app listens on (it also gets PORT).
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..))]
    port: u16,
    /// A custom domain (repeat for more).
    #[arg(long = "domain", value_name = "HOST")]
    domains: Vec<String>,
    #[command(flatten)]
    pub run: RunArgs,
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
pub struct RunArgs {
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=20))]
    instances: Option<u32>,
    /// CPU cores per instance, e.g. 0.5.
    #[arg(long)]
    pub cpu: Option<f64>,
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
    /// How a deploy replaces the instances: blue-green (the new one starts
    /// beside the old one) or recreate (the old ones stop first).
    #[arg(long, value_parser = ["blue-green", "recreate"])]
    rollout: Option<String>,
    #[command(flatten)]
    probes: crate::probes::ProbeArgs,
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

/// The strategy `--strategy` names (clap has checked it is one).
fn strategy(name: &str) -> Strategy {
    match name {
        "dockerfile" => Strategy::Dockerfile,
        "static" => Strategy::Static,
        "buildpacks" => Strategy::Buildpacks,
        _ => Strategy::Auto,
    }
}

/// The rollout `--rollout` names (clap has checked it is one).
fn rollout(name: &str) -> Rollout {
    if name == "recreate" {
        Rollout::Recreate
    } else {
        Rollout::BlueGreen
    }
}

fn spa(name: &str) -> Spa {
    match name {
        "yes" => Spa::Yes,
        "no" => Spa::No,
        _ => Spa::Auto,
    }
}

impl RunArgs {
    /// The build settings given, if any.
    fn build(&self) -> Option<BuildInput> {
        let build = BuildInput {
            install_cmd: self.install_cmd.clone(),
            build_cmd: self.build_cmd.clone(),
            output_dir: self.output_dir.clone(),
            spa: self.spa.as_deref().map(spa),
        };
        (build != BuildInput::default()).then_some(build)
    }

    /// Adds the settings given to a new app.
    fn add_to_create(self, body: &mut CreateApp) {
        body.build = self.build();
        body.instances = self.instances;
        body.cpu = self.cpu;
        body.memory = self.memory;
        body.strategy = self.strategy.as_deref().map(strategy);
        body.health_path = self.health_path;
        body.health_timeout_seconds = self.health_timeout;
        body.build_timeout_seconds = self.build_timeout;
        body.rollout = self.rollout.as_deref().map(rollout);
        (body.liveness, body.readiness) = self.probes.probes();
    }

    /// Adds the settings given to a change.
    fn add_to_patch(self, body: &mut AppPatch) {
        body.build = self.build().map(Some);
        body.instances = self.instances;
        body.cpu = self.cpu.map(Some);
        body.memory = self.memory.map(Some);
        body.strategy = self.strategy.as_deref().map(strategy);
        body.health_path = self.health_path;
        body.health_timeout_seconds = self.health_timeout;
        body.build_timeout_seconds = self.build_timeout.map(Some);
        body.rollout = self.rollout.as_deref().map(rollout);
        let (liveness, readiness) = self.probes.probes();
        body.liveness = liveness.map(Some);
        body.readiness = readiness.map(Some);
    }
}

#[derive(Args)]
pub struct SetArgs {
    app: String,
    #[arg(long)]
    branch: Option<String>,
    /// The port the app listens on (it also gets PORT).
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..))]
    port: Option<u16>,
    #[command(flatten)]
    pub run: RunArgs,
    /// Put a setting back to its default (repeat for more).
    #[arg(long, value_name = "SETTING", value_parser = ["cpu", "memory", "build", "build-timeout", "liveness", "readiness"])]
    reset: Vec<String>,
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

pub async fn run(api: &Api, command: AppsCommand, json: bool) -> Result<(), Failure> {
    match command {
        AppsCommand::List => {
            let list: AppList = api.get("/api/apps").await?;
            if json {
                render::json(&list.apps);
            } else {
                let rows: Vec<Vec<String>> = list
                    .apps
                    .iter()
                    .map(|a| {
                        let instances = if a.crash_looping > 0 {
                            format!("{} ({} crash-looping)", a.instances, a.crash_looping)
                        } else {
                            a.instances.to_string()
                        };
                        vec![
                            cell(&a.name),
                            cell(&a.repo_url),
                            cell(&a.branch),
                            cell(&a.strategy),
                            instances,
                            cell(&a.port),
                            cell(&a.domains),
                        ]
                    })
                    .collect();
                table(&["NAME", "REPOSITORY", "BRANCH", "STRATEGY", "INSTANCES", "PORT", "DOMAINS"], &rows);
            }
        }
        AppsCommand::Create(args) => {
            let body = create_body(args)?;
            let app: AppView = api.call(Method::POST, "/api/apps", Some(&body)).await?;
            if json {
                render::json(&app);
            } else {
                println!("app {} created; deploy it with `cloudweb deploy {} --follow`", cell(&app.name), cell(&app.name));
            }
        }
        AppsCommand::Set(args) => {
            let app = args.app.clone();
            let body = set_body(args)?;
            let view: AppView = api.call(Method::PATCH, &format!("/api/apps/{}", segment(&app)), Some(&body)).await?;
            if json {
                render::json(&view);
            } else {
                println!("app {} changed; the next deployment uses the new settings", cell(&view.name));
            }
        }
        AppsCommand::Rm { app, yes, keep_volumes, delete_volumes } => {
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
            let volumes = match (keep_volumes, delete_volumes) {
                (true, _) => "?volumes=keep",
                (_, true) => "?volumes=delete",
                _ => "",
            };
            api.delete(&format!("/api/apps/{}{volumes}", segment(&app))).await?;
            if json {
                render::json(&json!({"deleted": app}));
            } else {
                println!("app {} deleted", clean(&app));
            }
        }
    }
    Ok(())
}

fn create_body(args: CreateArgs) -> Result<CreateApp, Failure> {
    if args.gitea_account.is_some() && args.gitea.is_none() {
        return Err(Failure::Usage("--gitea-account goes with --gitea".into()));
    }
    let mut body = CreateApp {
        name: args.name,
        repo_url: args.repo.unwrap_or_default(),
        github_repository: args.github,
        gitea_repository: args.gitea,
        gitea_account: args.gitea_account,
        branch: args.branch,
        port: args.port,
        domains: args.domains,
        ..CreateApp::default()
    };
    args.run.add_to_create(&mut body);
    if let Some(user) = args.git_username {
        let password = match std::env::var("CLOUDWEB_GIT_PASSWORD").ok().filter(|p| !p.is_empty()) {
            Some(password) => password,
            None => read_secret("git password or access token: ")?,
        };
        if password.trim().is_empty() {
            return Err(Failure::Usage("--git-username needs a password (CLOUDWEB_GIT_PASSWORD or stdin)".into()));
        }
        body.git_username = Some(user);
        body.git_password = Some(password.trim().to_string());
    }
    if let (Some(key), Some(hosts)) = (args.git_ssh_key, args.git_known_hosts) {
        let read = |path: &std::path::Path| {
            std::fs::read_to_string(path).map_err(|e| Failure::Usage(format!("cannot read {}: {e}", path.display())))
        };
        body.git_ssh_key = Some(read(&key)?);
        body.git_known_hosts = Some(read(&hosts)?);
    }
    Ok(body)
}

/// The `PATCH /api/apps/{name}` body of `apps set`: the settings given;
/// none is a usage error.
fn set_body(args: SetArgs) -> Result<AppPatch, Failure> {
    let mut body = AppPatch { branch: args.branch, port: args.port, ..AppPatch::default() };
    args.run.add_to_patch(&mut body);
    for setting in &args.reset {
        let given = match setting.as_str() {
            "cpu" => body.cpu.replace(None).is_some(),
            "memory" => body.memory.replace(None).is_some(),
            "build" => body.build.replace(None).is_some(),
            "build-timeout" => body.build_timeout_seconds.replace(None).is_some(),
            "liveness" => body.liveness.replace(None).is_some(),
            "readiness" => body.readiness.replace(None).is_some(),
            other => unreachable!("clap allows no --reset {other}"),
        };
        if given {
            return Err(Failure::Usage(format!("--reset {setting} goes against a value given for it")));
        }
    }
    if render::to_json(&body) == json!({}) {
        return Err(Failure::Usage("nothing to change: give at least one setting (see `cloudweb apps set --help`)".into()));
    }
    Ok(body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Cli, Command};
    use clap::Parser;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("512M").unwrap(), 512 << 20);
        assert_eq!(parse_size("1g").unwrap(), 1 << 30);
        assert_eq!(parse_size("1000").unwrap(), 1000);
        assert!(parse_size("1.5G").is_err());
    }

    #[test]
    fn apps_set_sends_only_what_is_given() {
        let parse = |args: &[&str]| match Cli::try_parse_from(["cloudweb", "apps", "set", "web"].iter().chain(args)).unwrap().command {
            Command::Apps { command: Some(AppsCommand::Set(args)) } => set_body(args).map(|body| render::to_json(&body)),
            _ => unreachable!(),
        };
        let body = parse(&["--branch", "release", "--port", "3000", "--health-path", "/up"]).unwrap();
        assert_eq!(body, json!({"branch": "release", "port": 3000, "health_path": "/up"}));
        let body = parse(&["--build-cmd", "npm run build", "--reset", "cpu", "--reset", "build-timeout"]).unwrap();
        assert_eq!(body, json!({"build": {"build_cmd": "npm run build"}, "cpu": null, "build_timeout_seconds": null}));
        let body = parse(&["--strategy", "static", "--spa", "yes", "--memory", "64M"]).unwrap();
        assert_eq!(body, json!({"strategy": "static", "build": {"spa": "yes"}, "memory": 67108864}));
        assert!(matches!(parse(&[]), Err(Failure::Usage(_))), "nothing to change");
        assert!(matches!(parse(&["--cpu", "1", "--reset", "cpu"]), Err(Failure::Usage(_))));
        assert!(Cli::try_parse_from(["cloudweb", "apps", "set", "web", "--reset", "port"]).is_err());
        let body = parse(&["--liveness", "10"]).unwrap();
        assert_eq!(body, json!({"liveness": {"interval_seconds": 10, "timeout_seconds": 2, "failure_threshold": 3}}));
        let body = parse(&["--liveness", "1,1,5"]).unwrap();
        assert_eq!(body["liveness"]["failure_threshold"], 5);
        assert_eq!(parse(&["--reset", "liveness"]).unwrap(), json!({"liveness": null}));
        let body = parse(&["--readiness", "5"]).unwrap();
        assert_eq!(body, json!({"readiness": {"interval_seconds": 5, "timeout_seconds": 1, "failure_threshold": 3, "success_threshold": 1}}));
        assert_eq!(parse(&["--readiness", "2,2,1,4"]).unwrap()["readiness"]["success_threshold"], 4);
        assert_eq!(parse(&["--reset", "readiness"]).unwrap(), json!({"readiness": null}));
        for bad in ["0", "5,6", "5,1,0", "5,1,1,0", "1,1,1,1,1", "x"] {
            assert!(Cli::try_parse_from(["cloudweb", "apps", "set", "web", "--readiness", bad]).is_err(), "{bad}");
        }
        for bad in ["0", "5,6", "x", "1,1,1,1", "10,2,0"] {
            assert!(Cli::try_parse_from(["cloudweb", "apps", "set", "web", "--liveness", bad]).is_err(), "{bad}");
        }
        assert!(Cli::try_parse_from(["cloudweb", "apps", "set", "web", "--port", "0"]).is_err());
        let body = parse(&[
            "--liveness",
            "5",
            "--liveness-check",
            "tcp:5432",
            "--liveness-grace",
            "30",
            "--readiness",
            "2",
            "--readiness-check",
            "exec:pg_isready -q",
        ])
        .unwrap();
        assert_eq!(
            body["liveness"]["check"],
            json!({"kind": "tcp", "port": 5432})
        );
        assert_eq!(body["liveness"]["grace_seconds"], 30);
        assert_eq!(
            body["readiness"]["check"],
            json!({"kind": "exec", "command": ["pg_isready", "-q"]})
        );
        assert!(
            body["readiness"].get("grace_seconds").is_none(),
            "no grace: the field is left out"
        );
        // A check or a grace goes with its probe's timing.
        assert!(Cli::try_parse_from([
            "cloudweb",
            "apps",
            "set",
            "web",
            "--liveness-check",
            "tcp:1"
        ])
        .is_err());
        assert!(
            Cli::try_parse_from(["cloudweb", "apps", "set", "web", "--readiness-grace", "5"])
                .is_err()
        );
        assert!(Cli::try_parse_from([
            "cloudweb",
            "apps",
            "set",
            "web",
            "--liveness",
            "5",
            "--liveness-grace",
            "3601"
        ])
        .is_err());
    }

    #[test]
    fn apps_create_sends_the_flags_given() {
        let args = ["cloudweb", "apps", "create", "web", "--repo", "https://git.example/web.git", "--port", "8080", "--domain", "web.example", "--instances", "2"];
        let Command::Apps { command: Some(AppsCommand::Create(args)) } = Cli::try_parse_from(args).unwrap().command else { unreachable!() };
        let body = render::to_json(&create_body(args).unwrap());
        assert_eq!(
            body,
            json!({"name": "web", "repo_url": "https://git.example/web.git", "port": 8080, "domains": ["web.example"], "instances": 2})
        );
    }

    #[test]
    fn apps_create_from_github_names_the_repository_and_nothing_else() {
        let args = ["cloudweb", "apps", "create", "web", "--github", "acme/site", "--port", "8080", "--branch", "prod"];
        let Command::Apps { command: Some(AppsCommand::Create(args)) } = Cli::try_parse_from(args).unwrap().command else { unreachable!() };
        let body = render::to_json(&create_body(args).unwrap());
        assert_eq!(body, json!({"name": "web", "github_repository": "acme/site", "branch": "prod", "port": 8080, "domains": []}));
        // One source only, and one is needed.
        assert!(Cli::try_parse_from(["cloudweb", "apps", "create", "web", "--github", "a/b", "--repo", "https://g/x.git", "--port", "80"]).is_err());
        let args = ["cloudweb", "apps", "create", "web", "--gitea", "acme/site", "--gitea-account", "7", "--port", "8080"];
        let Command::Apps { command: Some(AppsCommand::Create(args)) } = Cli::try_parse_from(args).unwrap().command else { unreachable!() };
        let body = render::to_json(&create_body(args).unwrap());
        assert_eq!(body, json!({"name": "web", "gitea_repository": "acme/site", "gitea_account": 7, "port": 8080, "domains": []}));
        assert!(Cli::try_parse_from(["cloudweb", "apps", "create", "web", "--gitea", "a/b", "--github", "a/b", "--port", "80"]).is_err());
        let args = ["cloudweb", "apps", "create", "web", "--gitea-account", "7", "--repo", "https://g/x.git", "--port", "80"];
        let Command::Apps { command: Some(AppsCommand::Create(args)) } = Cli::try_parse_from(args).unwrap().command else { unreachable!() };
        assert!(create_body(args).is_err());
        assert!(Cli::try_parse_from(["cloudweb", "apps", "create", "web", "--github", "a/b", "--git-username", "u", "--port", "80"]).is_err());
        assert!(Cli::try_parse_from(["cloudweb", "apps", "create", "web", "--port", "80"]).is_err());
    }
}
