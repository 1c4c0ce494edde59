//! `cloudweb run` (a command once, in a one-off container of an app's
//! running image with the app's environment, followed to its end) and
//! `cloudweb runs` (an app's runs, scheduled and one-off: the list, one
//! run, its output, cancel). The following itself is `follow::task_run`.

use clap::{Args, Subcommand};
use cloudweb_api_types::tasks::{NewTaskRun, TaskRunList, TaskRunLogs, TaskRunView};
use reqwest::Method;

use crate::client::{segment, Api};
use crate::render::{self, cell, clean, table};
use crate::{duration, follow, Failure};

/// `cloudweb run`'s arguments.
#[derive(Args)]
pub struct OneOffArgs {
    /// The app whose running image and environment the command gets.
    pub app: String,
    /// Kill the command after this long and end the run `timed_out`: a
    /// number with a unit, largest first (90s, 30m, 1h, 2h30m), at most 1d
    /// [default: 1h].
    #[arg(long, value_name = "DURATION", value_parser = duration::timeout)]
    pub timeout: Option<u32>,
    /// Print the run and return at once instead of following it (then
    /// `cloudweb runs logs APP ID --follow`).
    #[arg(long, short = 'd')]
    pub detach: bool,
    /// The program and its arguments, after `--`, passed as they are: no
    /// shell runs them unless you name one (`-- sh -c 'a && b'`).
    #[arg(last = true, required = true, value_name = "COMMAND")]
    pub command: Vec<String>,
}

/// `cloudweb runs`: `cloudweb runs APP` lists, or one of the subcommands.
#[derive(Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct RunsArgs {
    #[command(subcommand)]
    pub command: Option<RunsCommand>,
    #[command(flatten)]
    pub list: ListArgs,
}

/// Which runs to list.
#[derive(Args)]
pub struct ListArgs {
    /// The app.
    #[arg(required = true)]
    pub app: Option<String>,
    /// Only this scheduled job's runs.
    #[arg(long, value_name = "NAME")]
    pub job: Option<String>,
    /// How many, newest first (1 to 200).
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..=200))]
    pub limit: u32,
}

#[derive(Subcommand)]
pub enum RunsCommand {
    /// An app's runs, newest first (`cloudweb runs APP` is the same).
    #[command(visible_alias = "ls")]
    List(ListArgs),
    /// One run: state, exit code, trigger, command, image, node, times.
    Show {
        app: String,
        /// The run's id (tr_…).
        id: String,
    },
    /// A run's output (a run keeps its last 2,000 lines): stdout's lines on
    /// stdout, stderr's on stderr.
    Logs {
        app: String,
        /// The run's id (tr_…).
        id: String,
        /// Print lines as they come until the run ends, then exit as
        /// `cloudweb run` does; Ctrl-C stops following (the run goes on).
        #[arg(long, short = 'f')]
        follow: bool,
    },
    /// Stop a queued or running run: its container is killed and the run
    /// ends `cancelled`.
    Cancel {
        app: String,
        /// The run's id (tr_…).
        id: String,
    },
}

/// The command after `--` as the API takes it (exit 2 before any request
/// when it cannot be one).
pub fn check_command(command: &[String]) -> Result<(), Failure> {
    cloudweb_protocol::tasks::command("command", command).map_err(|err| Failure::Usage(format!("the command after `--`: {}", err.problem)))
}

/// The one-off run's body.
pub fn run_body(args: &OneOffArgs) -> NewTaskRun {
    NewTaskRun { command: args.command.clone(), timeout_seconds: args.timeout }
}

/// A command as a shell would need it typed, for reading only (the API
/// gets the arguments as they are): arguments with anything but plain
/// characters in single quotes.
pub fn command_line(command: &[String]) -> String {
    let plain = |arg: &str| !arg.is_empty() && arg.bytes().all(|b| b.is_ascii_alphanumeric() || b"_@%+=:,./-".contains(&b));
    let words: Vec<String> = command.iter().map(|arg| if plain(arg) { arg.clone() } else { format!("'{}'", arg.replace('\'', r"'\''")) }).collect();
    clean(&words.join(" "))
}

/// A run's state with its exit code when it has one: `failed (3)`.
pub fn state_cell(run: &TaskRunView) -> String {
    match run.exit_code {
        Some(code) if run.state != "succeeded" => format!("{} ({code})", clean(&run.state)),
        _ => clean(&run.state),
    }
}

/// `WHEN` is when the run started, or was recorded when it never did.
pub const RUNS_HEADER: [&str; 8] = ["RUN", "STATE", "TRIGGER", "JOB", "WHEN", "TOOK", "COMMAND", "NOTE"];

pub fn run_rows(runs: &[TaskRunView]) -> Vec<Vec<String>> {
    runs.iter()
        .map(|r| {
            vec![
                cell(&r.id),
                state_cell(r),
                cell(&r.trigger),
                cell(&r.job),
                cell(r.started_at.as_ref().unwrap_or(&r.created_at)),
                r.duration_ms.map(duration::millis).unwrap_or_else(|| "-".into()),
                command_line(&r.command),
                cell(&r.message),
            ]
        })
        .collect()
}

/// Prints a run's fields, one a line.
pub fn describe(run: &TaskRunView) {
    let rows = [
        ("run", cell(&run.id)),
        ("app", cell(&run.app)),
        ("job", cell(&run.job)),
        ("trigger", cell(&run.trigger)),
        ("state", clean(&run.state)),
        ("exit code", cell(&run.exit_code)),
        ("message", cell(&run.message)),
        ("command", command_line(&run.command)),
        ("image", cell(&run.image)),
        ("deployment", cell(&run.deployment_id)),
        ("node", cell(&run.node_id)),
        ("attempt", run.attempt.to_string()),
        ("scheduled for", cell(&run.scheduled_for)),
        ("created", cell(&run.created_at)),
        ("started", cell(&run.started_at)),
        ("finished", cell(&run.finished_at)),
        ("took", run.duration_ms.map(duration::millis).unwrap_or_else(|| "-".into())),
    ];
    for (name, value) in rows {
        println!("{:<14} {value}", format!("{name}:"));
    }
}

/// `GET /api/apps/{app}/runs`, newest first.
pub async fn list(api: &Api, app: &str, job: Option<&str>, limit: u32) -> Result<TaskRunList, Failure> {
    let mut path = format!("/api/apps/{}/runs?limit={limit}", segment(app));
    if let Some(job) = job {
        path.push_str(&format!("&job={}", segment(job)));
    }
    api.get(&path).await
}

/// After a run was started: print it (`--detach`) or follow it to its end.
pub async fn started(api: &Api, app: &str, run: TaskRunView, detach: bool, json: bool) -> Result<(), Failure> {
    if !detach {
        return follow::task_run(api, app, &run, true, json).await;
    }
    if json {
        render::json(&run);
    } else {
        println!("run {} {}; `cloudweb runs logs {} {} --follow` follows it", cell(&run.id), cell(&run.state), clean(app), cell(&run.id));
    }
    Ok(())
}

/// `cloudweb run`.
pub async fn one_off(api: &Api, args: OneOffArgs, json: bool) -> Result<(), Failure> {
    let body = run_body(&args);
    let run: TaskRunView = api.call(Method::POST, &format!("/api/apps/{}/runs", segment(&args.app)), Some(&body)).await?;
    started(api, &args.app, run, args.detach, json).await
}

/// `cloudweb runs`.
pub async fn runs(api: &Api, args: RunsArgs, json: bool) -> Result<(), Failure> {
    let path = |app: &str, id: &str| format!("/api/apps/{}/runs/{}", segment(app), segment(id));
    match args.command.unwrap_or(RunsCommand::List(args.list)) {
        RunsCommand::List(ListArgs { app, job, limit }) => {
            let app = app.ok_or_else(|| Failure::Usage("give an app: cloudweb runs APP".into()))?;
            let list = list(api, &app, job.as_deref(), limit).await?;
            if json {
                render::json(&list.runs);
            } else if list.runs.is_empty() {
                println!("no runs of {}{} yet", clean(&app), job.map(|j| format!("'s job {}", clean(&j))).unwrap_or_default());
            } else {
                table(&RUNS_HEADER, &run_rows(&list.runs));
            }
        }
        RunsCommand::Show { app, id } => {
            let run: TaskRunView = api.get(&path(&app, &id)).await?;
            if json {
                render::json(&run);
            } else {
                describe(&run);
            }
        }
        RunsCommand::Logs { app, id, follow: true } => {
            let run: TaskRunView = api.get(&path(&app, &id)).await?;
            follow::task_run(api, &app, &run, false, json).await?;
        }
        RunsCommand::Logs { app, id, follow: false } => {
            let logs: TaskRunLogs = api.get(&format!("{}/logs", path(&app, &id))).await?;
            if json {
                render::json(&logs);
            } else {
                follow::task_output(api, &app, &id, logs).await?;
            }
        }
        RunsCommand::Cancel { app, id } => {
            let run: TaskRunView = api.post(&format!("{}/cancel", path(&app, &id))).await?;
            if json {
                render::json(&run);
            } else if run.is_final() {
                println!("run {} is {}", cell(&run.id), state_cell(&run));
            } else {
                println!("run {} is being cancelled", cell(&run.id));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Cli, Command};
    use clap::Parser;
    use serde_json::json;

    fn parse(args: &[&str]) -> Result<Command, clap::Error> {
        Cli::try_parse_from(["cloudweb"].iter().chain(args)).map(|cli| cli.command)
    }

    #[test]
    fn run_sends_the_arguments_after_the_double_dash_as_they_are() {
        let Command::Run(args) = parse(&["run", "web", "--timeout", "10m", "--", "sh", "-c", "echo 'a b' && exit 3", "--json"]).unwrap() else { unreachable!() };
        assert!(!args.detach);
        let body = render::to_json(&run_body(&args));
        assert_eq!(body, json!({"command": ["sh", "-c", "echo 'a b' && exit 3", "--json"], "timeout_seconds": 600}));
        let Command::Run(args) = parse(&["--json", "run", "-d", "web", "--", "./manage.py", "migrate"]).unwrap() else { unreachable!() };
        assert!(args.detach);
        assert_eq!(render::to_json(&run_body(&args)), json!({"command": ["./manage.py", "migrate"], "timeout_seconds": null}));
    }

    #[test]
    fn run_refuses_a_missing_command_and_bad_flags() {
        assert!(parse(&["run", "web"]).is_err(), "no command");
        assert!(parse(&["run", "web", "--"]).is_err(), "an empty command");
        assert!(parse(&["run", "web", "ls"]).is_err(), "the command needs --");
        for timeout in ["10", "0s", "2d", "1x", "1.5h"] {
            let err = parse(&["run", "web", "--timeout", timeout, "--", "ls"]).err().unwrap_or_else(|| panic!("{timeout} taken"));
            assert_eq!(err.exit_code(), 2);
        }
        assert!(parse(&["run", "web", "--memory", "1G", "--", "ls"]).is_err());
        assert!(matches!(check_command(&["".to_string()]), Err(Failure::Usage(_))));
        assert!(matches!(check_command(&vec!["x".to_string(); 65]), Err(Failure::Usage(_))));
        assert!(check_command(&["ls".to_string()]).is_ok());
    }

    #[test]
    fn runs_lists_by_app_or_takes_a_subcommand() {
        let Command::Runs(args) = parse(&["runs", "web", "--job", "nightly", "--limit", "5"]).unwrap() else { unreachable!() };
        assert!(args.command.is_none());
        assert_eq!((args.list.app.as_deref(), args.list.job.as_deref(), args.list.limit), (Some("web"), Some("nightly"), 5));
        let Command::Runs(args) = parse(&["runs", "ls", "web"]).unwrap() else { unreachable!() };
        assert!(matches!(args.command, Some(RunsCommand::List(ListArgs { app: Some(_), limit: 50, .. }))));
        let Command::Runs(args) = parse(&["runs", "logs", "web", "tr_0123456789abcdef", "-f"]).unwrap() else { unreachable!() };
        assert!(matches!(args.command, Some(RunsCommand::Logs { follow: true, .. })));
        let Command::Runs(args) = parse(&["runs", "cancel", "web", "tr_0123456789abcdef"]).unwrap() else { unreachable!() };
        assert!(matches!(args.command, Some(RunsCommand::Cancel { .. })));
        assert!(parse(&["runs"]).is_err(), "an app is needed");
        assert!(parse(&["runs", "web", "--limit", "201"]).is_err());
        assert!(parse(&["runs", "web", "--limit", "0"]).is_err());
    }

    #[test]
    fn commands_read_as_typed() {
        let words = |w: &[&str]| w.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(command_line(&words(&["./manage.py", "migrate", "--noinput"])), "./manage.py migrate --noinput");
        assert_eq!(command_line(&words(&["sh", "-c", "echo 'hi' && ls"])), r"sh -c 'echo '\''hi'\'' && ls'");
        assert_eq!(command_line(&words(&["printf", ""])), "printf ''");
        assert_eq!(command_line(&words(&["echo", "\u{1b}[2J"])), "echo '\\u{1b}[2J'");
    }
}
