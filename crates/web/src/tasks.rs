//! Tasks in the dashboard: the app page's sections (its scheduled jobs with
//! a "Run now" button each, and its recent runs), and a run's page
//! (`/apps/{app}/runs/{id}`: the run and its output, followed by the
//! script while it runs, with a cancel button until it ends). Jobs are
//! added and changed with the command line (`cloudweb cron`); the buttons
//! act through the user API's handlers.

use std::collections::HashMap;

use axum::extract::{Path, State};
use axum::response::{IntoResponse, Redirect, Response};
use axum::{Form, Json};
use cloudweb_api_types::tasks::{CronJobView, TaskLine, TaskRunLogs, TaskRunView};
use maud::{html, Markup};

use super::i18n::Lang;
use super::layout::{self, Nav};
use super::{csrf_field, format, Ctx};
use crate::api;
use crate::error::ApiError;

/// Runs the app page lists.
const RECENT_RUNS: u32 = 20;
/// Answers of the logs reader a run page reads at most (each holds up to
/// 1,000 lines; a run keeps 2,000).
const PAGE_LOG_READS: usize = 3;

fn state_key(state: &str) -> &'static str {
    match state {
        "queued" => "rstate.queued",
        "running" => "rstate.running",
        "succeeded" => "rstate.succeeded",
        "failed" => "rstate.failed",
        "timed_out" => "rstate.timed_out",
        "cancelled" => "rstate.cancelled",
        "lost" => "rstate.lost",
        _ => "rstate.skipped",
    }
}

fn trigger_key(trigger: &str) -> &'static str {
    match trigger {
        "schedule" => "trigger.schedule",
        "manual" => "trigger.manual",
        "retry" => "trigger.retry",
        _ => "trigger.one_off",
    }
}

/// A run's state as a badge (the stylesheet colours it by state), with
/// the exit code of a run that did not succeed.
fn state_badge(lang: Lang, run: &TaskRunView) -> Markup {
    html! {
        span class=(format!("badge {}", run.state)) data-state=(run.state) { (lang.t(state_key(&run.state))) }
        @if let Some(code) = run.exit_code.filter(|_| run.state != "succeeded") { " " code.exit { (code) } }
    }
}

/// A command as a shell would need it typed, for reading only (runs get
/// the arguments as they are).
pub fn command_line(command: &[String]) -> String {
    let plain = |arg: &str| !arg.is_empty() && arg.bytes().all(|b| b.is_ascii_alphanumeric() || b"_@%+=:,./-".contains(&b));
    command.iter().map(|arg| if plain(arg) { arg.clone() } else { format!("'{}'", arg.replace('\'', r"'\''")) }).collect::<Vec<_>>().join(" ")
}

/// An RFC 3339 time of the API as the pages write times (UTC); the text
/// as it is if it does not read as one.
pub fn when(text: &str) -> String {
    match time::OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339) {
        Ok(at) => format::datetime((at.unix_timestamp_nanos() / 1_000_000) as i64),
        Err(_) => text.to_string(),
    }
}

fn when_or_dash(text: Option<&str>) -> String {
    text.map(when).unwrap_or_else(|| "–".into())
}

fn run_href(run: &TaskRunView) -> String {
    format!("/apps/{}/runs/{}", run.app, run.id)
}

fn jobs_table(ctx: &Ctx, app: &str, jobs: &[CronJobView]) -> Markup {
    html! {
        @if jobs.is_empty() { p.empty id="cron-jobs-empty" { (ctx.t("tasks.no_jobs")) } }
        @else {
            div.scroll { table id="cron-jobs" {
                thead { tr {
                    th scope="col" { (ctx.t("tasks.name")) }
                    th scope="col" { (ctx.t("tasks.schedule")) }
                    th scope="col" { (ctx.t("tasks.command")) }
                    th scope="col" { (ctx.t("tasks.next_run")) }
                    th scope="col" { (ctx.t("tasks.last_run")) }
                    th scope="col" { (ctx.t("nodes.actions")) }
                } }
                tbody {
                    @for job in jobs {
                        tr data-job=(job.name) {
                            th scope="row" { (job.name) }
                            td data-label=(ctx.t("tasks.schedule")) { code { (job.schedule) } " " small { (job.timezone) } }
                            td data-label=(ctx.t("tasks.command")) { code { (command_line(&job.command)) } }
                            td data-label=(ctx.t("tasks.next_run")) {
                                @if job.suspended { em { (ctx.t("tasks.suspended")) } } @else { (when_or_dash(job.next_run_at.as_deref())) }
                            }
                            td data-label=(ctx.t("tasks.last_run")) {
                                @match &job.last_run {
                                    Some(run) => { a href=(run_href(run)) { (state_badge(ctx.lang, run)) } }
                                    None => { "–" }
                                }
                                @if let Some(alert) = &job.alert { br; span.warning { (alert) } }
                            }
                            td data-label=(ctx.t("nodes.actions")) {
                                form.inline method="post" action=(format!("/apps/{app}/cron/{}/run", job.name)) {
                                    (csrf_field(ctx))
                                    button type="submit" aria-label=(format!("{} {}", ctx.t("tasks.run_now"), job.name)) { (ctx.t("tasks.run_now")) }
                                }
                            }
                        }
                    }
                }
            } }
        }
    }
}

fn runs_table(ctx: &Ctx, runs: &[TaskRunView]) -> Markup {
    html! {
        @if runs.is_empty() { p.empty id="task-runs-empty" { (ctx.t("tasks.no_runs")) } }
        @else {
            div.scroll { table id="task-runs" {
                thead { tr {
                    th scope="col" { (ctx.t("tasks.state")) }
                    th scope="col" { (ctx.t("tasks.trigger")) }
                    th scope="col" { (ctx.t("tasks.job")) }
                    th scope="col" { (ctx.t("tasks.exit_code")) }
                    th scope="col" { (ctx.t("tasks.started")) }
                    th scope="col" { (ctx.t("tasks.duration")) }
                    th scope="col" { (ctx.t("tasks.run")) }
                } }
                tbody {
                    @for run in runs {
                        tr data-run=(run.id) {
                            td data-label=(ctx.t("tasks.state")) { span class=(format!("badge {}", run.state)) data-state=(run.state) { (ctx.t(state_key(&run.state))) } }
                            td data-label=(ctx.t("tasks.trigger")) { (ctx.t(trigger_key(&run.trigger))) }
                            td data-label=(ctx.t("tasks.job")) { (run.job.as_deref().unwrap_or("–")) }
                            td.num data-label=(ctx.t("tasks.exit_code")) { (run.exit_code.map(|c| c.to_string()).unwrap_or_else(|| "–".into())) }
                            td data-label=(ctx.t("tasks.started")) { (when_or_dash(run.started_at.as_deref())) }
                            td.num data-label=(ctx.t("tasks.duration")) { (run.duration_ms.map(format::duration_ms).unwrap_or_else(|| "–".into())) }
                            td data-label=(ctx.t("tasks.run")) { a href=(run_href(run)) title=(command_line(&run.command)) { code { (run.id) } } }
                        }
                    }
                }
            } }
        }
    }
}

/// The app page's sections: its scheduled jobs and its recent runs. A part
/// that cannot be read says why in its place; the rest of the page stands.
pub async fn app_section(ctx: &Ctx, app: &str) -> Markup {
    let jobs = api::tasks::list_jobs(State(ctx.state.clone()), Path(app.to_string())).await.map(|Json(list)| list.jobs);
    let runs = cloudweb_core::tasks::runs_of(&ctx.state, app, None, RECENT_RUNS).await;
    html! {
        h2 id="jobs" { (ctx.t("tasks.jobs")) }
        p.help { (ctx.t("tasks.jobs_help")) }
        @match &jobs {
            Ok(jobs) => { (jobs_table(ctx, app, jobs)) }
            Err(err) => { p.error role="alert" { (super::error_text(err)) } }
        }
        h2 id="runs" { (ctx.t("tasks.runs")) }
        @match &runs {
            Ok(runs) => { (runs_table(ctx, runs)) }
            Err(err) => { p.error role="alert" { (super::error_text(err)) } }
        }
    }
}

/// "Run now": the job runs at once (the API's `POST …/cron/{name}/run`),
/// and the browser goes to the new run's page; a refusal (no running
/// deployment, no node with room) comes back to the app page as the flash.
pub async fn run_now(ctx: Ctx, Path((app, job)): Path<(String, String)>, Form(form): Form<HashMap<String, String>>) -> Response {
    if let Some(refused) = ctx.refusal(&form) {
        return refused;
    }
    match api::tasks::run_job(State(ctx.state.clone()), Path((app.clone(), job))).await {
        Ok((_, Json(run))) => Redirect::to(&run_href(&run)).into_response(),
        Err(err) => ctx.outcome(Err::<(), _>(err), &format!("/apps/{app}#jobs")).await,
    }
}

/// Cancels a run from its page, and shows the page again.
pub async fn cancel(ctx: Ctx, Path((app, id)): Path<(String, String)>, Form(form): Form<HashMap<String, String>>) -> Response {
    if let Some(refused) = ctx.refusal(&form) {
        return refused;
    }
    let result = api::tasks::cancel_run(State(ctx.state.clone()), Path((app.clone(), id.clone()))).await;
    ctx.outcome(result, &format!("/apps/{app}/runs/{id}")).await
}

/// The run and its output lines: the logs reader's answers until one
/// brings nothing new (each holds part of a long output).
async fn load_run(ctx: &Ctx, app: &str, id: &str) -> Result<(TaskRunView, Vec<TaskLine>, bool), ApiError> {
    let TaskRunLogs { mut run, mut lines, truncated } = cloudweb_core::tasks::lines(&ctx.state, app, id, 0).await?;
    for _ in 1..PAGE_LOG_READS {
        let after = lines.last().map_or(0, |l| l.seq);
        let more = cloudweb_core::tasks::lines(&ctx.state, app, id, after).await?;
        run = more.run;
        if more.lines.is_empty() {
            break;
        }
        lines.extend(more.lines);
    }
    Ok((run, lines, truncated))
}

fn run_body(ctx: &Ctx, run: &TaskRunView, lines: &[TaskLine], truncated: bool) -> Markup {
    let after = lines.last().map_or(0, |l| l.seq);
    let live = !run.is_final();
    let poll = format!("/api/apps/{}/runs/{}/logs", run.app, run.id);
    html! {
        p { a href=(format!("/apps/{}#runs", run.app)) { "← " (run.app) } }
        dl.settings {
            dt { (ctx.t("tasks.state")) } dd id="run-state" { (state_badge(ctx.lang, run)) }
            @if let Some(message) = &run.message { dt { (ctx.t("tasks.message")) } dd { (message) } }
            dt { (ctx.t("tasks.trigger")) } dd { (ctx.t(trigger_key(&run.trigger))) }
            @if let Some(job) = &run.job { dt { (ctx.t("tasks.job")) } dd { a href=(format!("/apps/{}#jobs", run.app)) { (job) } } }
            dt { (ctx.t("tasks.command")) } dd { code { (command_line(&run.command)) } }
            dt { (ctx.t("tasks.image")) } dd { code.image { (run.image.as_deref().unwrap_or("–")) } }
            dt { (ctx.t("tasks.deployment")) } dd {
                @match &run.deployment_id { Some(d) => { a href=(format!("/deployments/{d}")) { (d) } }, None => { "–" } }
            }
            dt { (ctx.t("tasks.node")) } dd {
                @match &run.node_id { Some(n) => { a href=(format!("/nodes/{n}")) { (ctx.state.nodes.get(n).map(|node| node.name.clone()).unwrap_or_else(|| n.clone())) } }, None => { "–" } }
            }
            dt { (ctx.t("tasks.attempt")) } dd { (run.attempt) }
            @if let Some(tick) = &run.scheduled_for { dt { (ctx.t("tasks.scheduled_for")) } dd { (when(tick)) } }
            dt { (ctx.t("tasks.created")) } dd { (when(&run.created_at)) }
            dt { (ctx.t("tasks.started")) } dd { (when_or_dash(run.started_at.as_deref())) }
            dt { (ctx.t("tasks.finished")) } dd { (when_or_dash(run.finished_at.as_deref())) }
            dt { (ctx.t("tasks.duration")) } dd { (run.duration_ms.map(format::duration_ms).unwrap_or_else(|| "–".into())) }
        }
        @if live {
            form.inline method="post" action=(format!("/apps/{}/runs/{}/cancel", run.app, run.id)) {
                (csrf_field(ctx))
                button.danger type="submit" { (ctx.t("tasks.cancel")) }
            }
        }
        h2 { (ctx.t("tasks.output")) @if live { " " span.live { "● " (ctx.t("deploy.live")) } } }
        @if truncated { p.help { (ctx.t("tasks.truncated")) } }
        @if lines.is_empty() { p.empty id="run-log-empty" { (ctx.t("tasks.output_empty")) } }
        // The script asks the logs route for lines after `data-after` while
        // the run is unfinished, and reloads the page once it ends.
        pre.log id="run-log" tabindex="0" data-poll=[live.then_some(poll)] data-after=(after) {
            @for line in lines {
                span class=(format!("line {}", if line.stderr { "stderr" } else { "stdout" })) title=(when(&line.at)) { (line.line) "\n" }
            }
        }
    }
}

/// `/apps/{app}/runs/{id}`.
pub async fn run_page(ctx: Ctx, Path((app, id)): Path<(String, String)>) -> Response {
    match load_run(&ctx, &app, &id).await {
        Ok((run, lines, truncated)) => {
            let title = format!("{} {} · {}", ctx.t("tasks.run"), run.id, run.app);
            layout::page(&ctx, &title, Nav::Apps, &format!("/apps/{app}/runs/{id}"), run_body(&ctx, &run, &lines, truncated)).into_response()
        }
        // An unknown app or run, or a malformed id.
        Err(ApiError::NotFound(_) | ApiError::BadRequest(_)) => super::not_found(&ctx),
        Err(err) => err.into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_and_times_read_plainly() {
        let words = |w: &[&str]| w.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(command_line(&words(&["./manage.py", "migrate"])), "./manage.py migrate");
        assert_eq!(command_line(&words(&["sh", "-c", "echo 'hi' && ls"])), r"sh -c 'echo '\''hi'\'' && ls'");
        assert_eq!(when("2026-03-29T01:00:00.000Z"), "2026-03-29 01:00:00 UTC");
        assert_eq!(when("not a time"), "not a time");
        for state in ["queued", "running", "succeeded", "failed", "timed_out", "cancelled", "lost", "skipped"] {
            assert!(state_key(state).ends_with(state), "{state}");
        }
    }
}
