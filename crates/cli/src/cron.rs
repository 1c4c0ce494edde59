//! `cloudweb cron`: an app's scheduled jobs (a command on a cron schedule,
//! in a one-off container of the app's running image), their changes, a
//! run now (followed like `cloudweb run`), and their history.

use clap::{Args, Subcommand};
use cloudweb_api_types::tasks::{CronJobChange, CronJobList, CronJobView, NewCronJob, TaskRunView};
use reqwest::Method;
use serde_json::json;

use crate::client::{segment, Api};
use crate::render::{self, cell, clean, table};
use crate::run::{self, command_line, run_rows, state_cell, RUNS_HEADER};
use crate::{duration, Failure};

#[derive(Subcommand)]
pub enum CronCommand {
    /// An app's scheduled jobs: schedule, command, next run, last run.
    #[command(visible_alias = "ls")]
    List { app: String },
    /// Add a scheduled job: COMMAND (after `--`) runs on the schedule in a
    /// new container of the app's running image, with the app's
    /// environment, on a node with room.
    Add(AddArgs),
    /// A job's settings and its recent runs.
    Show { app: String, name: String },
    /// Change a job: only the options given change; a COMMAND after `--`
    /// replaces the job's command. Runs under way keep their settings.
    Update(UpdateArgs),
    /// Stop a job's ticks until `cron resume` (a run under way goes on).
    Suspend { app: String, name: String },
    /// Start a suspended job's ticks again, from the next one (ticks that
    /// passed meanwhile are not made up).
    Resume { app: String, name: String },
    /// Delete a job; its run history stays (`cloudweb runs APP --job NAME`).
    #[command(visible_alias = "rm")]
    Remove { app: String, name: String },
    /// Run a job now, whatever its schedule (also when suspended), and
    /// follow it like `cloudweb run`: its output, and its exit status.
    Run {
        app: String,
        name: String,
        /// Print the run and return at once instead of following it.
        #[arg(long, short = 'd')]
        detach: bool,
    },
    /// A job's runs, newest first.
    History {
        app: String,
        name: String,
        /// How many (1 to 200).
        #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..=200))]
        limit: u32,
    },
}

#[derive(Args)]
pub struct AddArgs {
    pub app: String,
    /// The job's name: 1 to 63 lowercase letters, digits or '-', unique in
    /// the app.
    pub name: String,
    /// Five cron fields, `minute hour day-of-month month day-of-week`
    /// ("0 3 * * *", "*/15 * * * *", "30 2 * * 1-5"), or @hourly, @daily,
    /// @weekly, @monthly; read in --timezone.
    #[arg(long)]
    pub schedule: String,
    #[command(flatten)]
    pub options: JobOptions,
    /// The program and its arguments, after `--`, passed as they are: no
    /// shell runs them unless you name one (`-- sh -c 'a && b'`).
    #[arg(last = true, required = true, value_name = "COMMAND")]
    pub command: Vec<String>,
}

#[derive(Args)]
pub struct UpdateArgs {
    pub app: String,
    pub name: String,
    /// A new schedule (five cron fields, or @hourly, @daily, @weekly,
    /// @monthly).
    #[arg(long)]
    pub schedule: Option<String>,
    #[command(flatten)]
    pub options: JobOptions,
    /// A new command, after `--`, passed as it is.
    #[arg(last = true, value_name = "COMMAND")]
    pub command: Vec<String>,
}

/// The settings `cron add` and `cron update` share.
#[derive(Args)]
pub struct JobOptions {
    /// The IANA time zone the schedule is read in (Europe/Madrid,
    /// America/New_York) [default: UTC].
    #[arg(long, value_name = "ZONE")]
    pub timezone: Option<String>,
    /// Kill a run after this long and end it `timed_out`: a number with a
    /// unit, largest first (90s, 30m, 1h, 2h30m), at most 1d [default: 1h].
    #[arg(long, value_name = "DURATION", value_parser = duration::timeout)]
    pub timeout: Option<u32>,
    /// What a tick does while the job's previous run is unfinished: forbid
    /// records it `skipped`, replace cancels the previous run, allow runs
    /// both [default: forbid].
    #[arg(long, value_name = "POLICY", value_parser = ["forbid", "replace", "allow"])]
    pub concurrency: Option<String>,
    /// A scheduled run whose node is lost runs again, once, on another node
    /// (the default).
    #[arg(long, conflicts_with = "no_retry_lost")]
    pub retry_lost: bool,
    /// A scheduled run whose node is lost stays `lost`, without a retry.
    #[arg(long)]
    pub no_retry_lost: bool,
    /// A tick missed while the control plane was down runs once when it is
    /// back if it is at most this late (1s to 7d), else it is recorded
    /// `skipped` [default: 1h].
    #[arg(long, value_name = "DURATION", value_parser = duration::starting_deadline)]
    pub starting_deadline: Option<u32>,
    /// No ticks until `cron resume` (`cron run` still runs it).
    #[arg(long)]
    pub suspended: bool,
}

impl JobOptions {
    fn retry_lost(&self) -> Option<bool> {
        match (self.retry_lost, self.no_retry_lost) {
            (true, _) => Some(true),
            (_, true) => Some(false),
            _ => None,
        }
    }
}

/// `POST /api/apps/{app}/cron`'s body.
pub fn add_body(args: &AddArgs) -> NewCronJob {
    let options = &args.options;
    NewCronJob {
        name: args.name.clone(),
        schedule: args.schedule.clone(),
        timezone: options.timezone.clone(),
        command: args.command.clone(),
        timeout_seconds: options.timeout,
        concurrency: options.concurrency.clone(),
        retry_lost: options.retry_lost(),
        starting_deadline_seconds: options.starting_deadline,
        suspended: options.suspended.then_some(true),
    }
}

/// `PATCH /api/apps/{app}/cron/{name}`'s body: what is given; nothing is a
/// usage error.
pub fn change_body(args: &UpdateArgs) -> Result<CronJobChange, Failure> {
    let options = &args.options;
    let body = CronJobChange {
        schedule: args.schedule.clone(),
        timezone: options.timezone.clone(),
        command: (!args.command.is_empty()).then(|| args.command.clone()),
        timeout_seconds: options.timeout,
        concurrency: options.concurrency.clone(),
        retry_lost: options.retry_lost(),
        starting_deadline_seconds: options.starting_deadline,
        suspended: options.suspended.then_some(true),
    };
    if body == CronJobChange::default() {
        return Err(Failure::Usage("nothing to change: give at least one option or a command after `--` (see `cloudweb cron update --help`)".into()));
    }
    Ok(body)
}

/// The schedule as read: `0 3 * * * (Europe/Madrid)`.
fn schedule_cell(job: &CronJobView) -> String {
    format!("{} ({})", clean(&job.schedule), clean(&job.timezone))
}

fn last_cell(job: &CronJobView) -> String {
    job.last_run.as_ref().map(state_cell).unwrap_or_else(|| "-".into())
}

fn describe(job: &CronJobView) {
    let rows = [
        ("job", format!("{} (app {})", clean(&job.name), clean(&job.app))),
        ("schedule", schedule_cell(job)),
        ("command", command_line(&job.command)),
        ("state", if job.suspended { "suspended".to_string() } else { "active".to_string() }),
        ("next run", cell(&job.next_run_at)),
        ("timeout", duration::format(job.timeout_seconds)),
        ("concurrency", clean(&job.concurrency)),
        ("retry lost", if job.retry_lost { "once".to_string() } else { "no".to_string() }),
        ("missed ticks", format!("run if at most {} late", duration::format(job.starting_deadline_seconds))),
        ("created", clean(&job.created_at)),
    ];
    for (name, value) in rows {
        println!("{:<13} {value}", format!("{name}:"));
    }
    if let Some(alert) = &job.alert {
        println!("{:<13} {}", "attention:", clean(alert));
    }
}

/// Prints a job after a change (or its JSON).
fn changed(job: &CronJobView, what: &str, json: bool) {
    if json {
        render::json(job);
    } else {
        let next = if job.suspended { "suspended".to_string() } else { format!("next run {}", cell(&job.next_run_at)) };
        println!("job {} {what}: {}, {next}", clean(&job.name), schedule_cell(job));
    }
}

pub async fn run(api: &Api, command: CronCommand, json: bool) -> Result<(), Failure> {
    let jobs = |app: &str| format!("/api/apps/{}/cron", segment(app));
    let job = |app: &str, name: &str| format!("/api/apps/{}/cron/{}", segment(app), segment(name));
    match command {
        CronCommand::List { app } => {
            let list: CronJobList = api.get(&jobs(&app)).await?;
            if json {
                render::json(&list.jobs);
            } else if list.jobs.is_empty() {
                println!("{} has no scheduled jobs: add one with `cloudweb cron add`", clean(&app));
            } else {
                let rows: Vec<Vec<String>> = list
                    .jobs
                    .iter()
                    .map(|j| {
                        let next = if j.suspended { "suspended".to_string() } else { cell(&j.next_run_at) };
                        vec![cell(&j.name), schedule_cell(j), next, last_cell(j), command_line(&j.command)]
                    })
                    .collect();
                table(&["JOB", "SCHEDULE", "NEXT", "LAST", "COMMAND"], &rows);
            }
        }
        CronCommand::Add(args) => {
            let body = add_body(&args);
            let view: CronJobView = api.call(Method::POST, &jobs(&args.app), Some(&body)).await?;
            changed(&view, "added", json);
        }
        CronCommand::Show { app, name } => {
            let view: CronJobView = api.get(&job(&app, &name)).await?;
            let runs = run::list(api, &app, Some(&name), 10).await?;
            if json {
                render::json(&json!({"job": view, "runs": runs.runs}));
            } else {
                describe(&view);
                println!();
                if runs.runs.is_empty() {
                    println!("no runs yet");
                } else {
                    table(&RUNS_HEADER, &run_rows(&runs.runs));
                }
            }
        }
        CronCommand::Update(args) => {
            let body = change_body(&args)?;
            let view: CronJobView = api.call(Method::PATCH, &job(&args.app, &args.name), Some(&body)).await?;
            changed(&view, "changed", json);
        }
        CronCommand::Suspend { app, name } => {
            let body = CronJobChange { suspended: Some(true), ..CronJobChange::default() };
            let view: CronJobView = api.call(Method::PATCH, &job(&app, &name), Some(&body)).await?;
            changed(&view, "suspended", json);
        }
        CronCommand::Resume { app, name } => {
            let body = CronJobChange { suspended: Some(false), ..CronJobChange::default() };
            let view: CronJobView = api.call(Method::PATCH, &job(&app, &name), Some(&body)).await?;
            changed(&view, "resumed", json);
        }
        CronCommand::Remove { app, name } => {
            api.delete(&job(&app, &name)).await?;
            if json {
                render::json(&json!({"removed": name}));
            } else {
                println!("job {} removed; its runs stay listed by `cloudweb runs {} --job {}`", clean(&name), clean(&app), clean(&name));
            }
        }
        CronCommand::Run { app, name, detach } => {
            let view: TaskRunView = api.post(&format!("{}/run", job(&app, &name))).await?;
            run::started(api, &app, view, detach, json).await?;
        }
        CronCommand::History { app, name, limit } => {
            let runs = run::list(api, &app, Some(&name), limit).await?;
            if json {
                render::json(&runs.runs);
            } else if runs.runs.is_empty() {
                println!("job {} has no runs yet", clean(&name));
            } else {
                table(&RUNS_HEADER, &run_rows(&runs.runs));
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

    fn parse(args: &[&str]) -> Result<CronCommand, clap::Error> {
        match Cli::try_parse_from(["cloudweb", "cron"].iter().chain(args))?.command {
            Command::Cron { command } => Ok(command),
            _ => unreachable!(),
        }
    }

    #[test]
    fn cron_add_sends_the_flags_given_and_the_command_as_it_is() {
        let CronCommand::Add(args) = parse(&["add", "web", "nightly", "--schedule", "0 3 * * *", "--", "./manage.py", "clearsessions"]).unwrap() else { unreachable!() };
        assert_eq!(
            render::to_json(&add_body(&args)),
            json!({"name": "nightly", "schedule": "0 3 * * *", "timezone": null, "command": ["./manage.py", "clearsessions"], "timeout_seconds": null,
                   "concurrency": null, "retry_lost": null, "starting_deadline_seconds": null, "suspended": null})
        );
        let CronCommand::Add(args) = parse(&[
            "add", "web", "report", "--schedule", "@daily", "--timezone", "Europe/Madrid", "--timeout", "30m", "--concurrency", "replace",
            "--no-retry-lost", "--starting-deadline", "2h30m", "--suspended", "--", "sh", "-c", "a && b", "--timeout",
        ])
        .unwrap() else {
            unreachable!()
        };
        let body = add_body(&args);
        assert_eq!(body.command, ["sh", "-c", "a && b", "--timeout"]);
        assert_eq!(
            (body.timezone.as_deref(), body.timeout_seconds, body.concurrency.as_deref(), body.retry_lost, body.starting_deadline_seconds, body.suspended),
            (Some("Europe/Madrid"), Some(1800), Some("replace"), Some(false), Some(9000), Some(true))
        );
    }

    #[test]
    fn cron_add_refuses_bad_flags() {
        let base = ["add", "web", "nightly", "--schedule", "0 3 * * *"];
        let with = |extra: &[&str]| parse(&base.iter().chain(extra).copied().collect::<Vec<_>>());
        assert!(with(&["--", "ls"]).is_ok());
        assert!(with(&[]).is_err(), "a command is needed");
        assert!(parse(&["add", "web", "nightly", "--", "ls"]).is_err(), "a schedule is needed");
        for bad in [&["--timeout", "30", "--", "ls"][..], &["--timeout", "25h", "--", "ls"], &["--concurrency", "queue", "--", "ls"], &["--starting-deadline", "soon", "--", "ls"], &["--starting-deadline", "0s", "--", "ls"], &["--retry-lost", "--no-retry-lost", "--", "ls"], &["--every", "1h", "--", "ls"]] {
            let err = with(bad).err().unwrap_or_else(|| panic!("{bad:?} taken"));
            assert_eq!(err.exit_code(), 2, "{bad:?}");
        }
    }

    #[test]
    fn cron_update_sends_only_what_is_given() {
        let body = |args: &[&str]| {
            let CronCommand::Update(args) = parse(&["update", "web", "nightly"].iter().chain(args).copied().collect::<Vec<_>>()).unwrap() else { unreachable!() };
            change_body(&args).map(|b| render::to_json(&b))
        };
        assert_eq!(body(&["--schedule", "15 4 * * *", "--retry-lost"]).unwrap(), json!({"schedule": "15 4 * * *", "retry_lost": true}));
        assert_eq!(body(&["--", "./bin/report", "--full"]).unwrap(), json!({"command": ["./bin/report", "--full"]}));
        assert_eq!(body(&["--timeout", "90s", "--concurrency", "allow"]).unwrap(), json!({"timeout_seconds": 90, "concurrency": "allow"}));
        assert_eq!(body(&["--starting-deadline", "10m"]).unwrap(), json!({"starting_deadline_seconds": 600}));
        assert!(matches!(body(&[]), Err(Failure::Usage(_))), "nothing to change");
    }

    #[test]
    fn the_other_cron_commands_parse() {
        assert!(matches!(parse(&["ls", "web"]).unwrap(), CronCommand::List { .. }));
        assert!(matches!(parse(&["rm", "web", "nightly"]).unwrap(), CronCommand::Remove { .. }));
        assert!(matches!(parse(&["run", "web", "nightly"]).unwrap(), CronCommand::Run { detach: false, .. }));
        assert!(matches!(parse(&["run", "web", "nightly", "--detach"]).unwrap(), CronCommand::Run { detach: true, .. }));
        assert!(matches!(parse(&["history", "web", "nightly", "--limit", "20"]).unwrap(), CronCommand::History { limit: 20, .. }));
        assert!(matches!(parse(&["suspend", "web", "nightly"]).unwrap(), CronCommand::Suspend { .. }));
        assert!(matches!(parse(&["resume", "web", "nightly"]).unwrap(), CronCommand::Resume { .. }));
        assert!(parse(&["show", "web"]).is_err());
    }
}
