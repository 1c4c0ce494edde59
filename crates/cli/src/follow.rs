//! Following a deployment (its state and build log until it settles) and
//! an app's runtime log, over the user API's server-sent events; and a
//! task run's output until it ends, by polling its logs route.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use eventsource_stream::Eventsource;
use futures_util::StreamExt;
use cloudweb_api_types::deployments::{BuildLogLine, DeploymentView, TimelineEntry};
use cloudweb_api_types::tasks::{TaskLine, TaskRunLogs, TaskRunView};
use cloudweb_api_types::traffic::RuntimeLine;
use reqwest::Method;

use crate::client::{segment, Api};
use crate::render::clean;
use crate::Failure;

/// The deployment states after which nothing changes any more, plus
/// `running` (the goal).
fn settled(state: &str) -> bool {
    matches!(state, "running" | "failed" | "superseded")
}

const SPINNER: [char; 10] = ['⠋', '⠙', '⠹', '⠸', '⠼', '⠴', '⠦', '⠧', '⠇', '⠏'];

/// The status line of a terminal: rewritten in place below the log lines.
struct Progress {
    tty: bool,
    id: String,
    state: String,
    started: Instant,
    frame: usize,
    shown: bool,
    /// How many of the deployment's timeline entries are printed.
    printed: usize,
}

impl Progress {
    fn clear(&mut self, out: &mut impl Write) {
        if self.tty && self.shown {
            let _ = write!(out, "\r\x1b[2K");
            // Before anything goes to stderr (the failure message).
            let _ = out.flush();
            self.shown = false;
        }
    }

    fn draw(&mut self, out: &mut impl Write) {
        if !self.tty {
            return;
        }
        let seconds = self.started.elapsed().as_secs();
        self.frame = (self.frame + 1) % SPINNER.len();
        let _ = write!(out, "\r\x1b[2K{} {} {} {}:{:02}", SPINNER[self.frame], self.id, self.state, seconds / 60, seconds % 60);
        let _ = out.flush();
        self.shown = true;
    }

    /// A log line above the status line.
    fn line(&mut self, text: &str) {
        let mut out = std::io::stdout().lock();
        self.clear(&mut out);
        let _ = writeln!(out, "{text}");
        self.draw(&mut out);
    }

    /// Prints the states of the deployment's history not printed yet, in
    /// order, one line each: every state it passed through, also those
    /// that came and went between two looks at it (a cached build).
    fn timeline(&mut self, timeline: &[TimelineEntry]) {
        for entry in timeline.iter().skip(self.printed) {
            self.line(&format!("state: {}", clean(&entry.state)));
        }
        self.printed = self.printed.max(timeline.len());
        if let Some(last) = timeline.last() {
            if last.state != self.state {
                self.state = last.state.clone();
                if self.tty {
                    let mut out = std::io::stdout().lock();
                    self.draw(&mut out);
                }
            }
        }
    }
}

/// Streams a deployment's build log and shows its state until it settles;
/// gives the deployment and whether it runs (or ran: superseded). With
/// `quiet` (for `--json`) it prints nothing and only waits.
pub async fn deployment(api: &Api, id: &str, quiet: bool) -> Result<(DeploymentView, bool), Failure> {
    let tty = !quiet && std::io::stdout().is_terminal();
    let mut progress = Progress { tty, id: id.to_string(), state: String::new(), started: Instant::now(), frame: 0, shown: false, printed: 0 };
    let path = format!("/api/deployments/{}", segment(id));
    let mut events = match api.stream(&format!("{path}/logs")).await {
        Ok(response) => Some(response.bytes_stream().eventsource()),
        Err(err) => {
            // The state can still be followed by polling.
            if !quiet {
                eprintln!("warning: no log stream ({err}); following the state only");
            }
            None
        }
    };
    let mut poll = tokio::time::interval(Duration::from_secs(1));
    let mut spin = tokio::time::interval(Duration::from_millis(120));
    loop {
        tokio::select! {
            event = async { events.as_mut().expect("guarded").next().await }, if events.is_some() => match event {
                Some(Ok(event)) if event.event == "log" => {
                    if !quiet {
                        if let Ok(line) = serde_json::from_str::<BuildLogLine>(&event.data) {
                            progress.line(&format!("{:<6} {}", line.stream, clean(&line.line)));
                        }
                    }
                }
                Some(Ok(event)) if event.event == "end" => break,
                Some(Ok(_)) => {}
                Some(Err(_)) | None => {
                    // Stream lost: go on with the state alone.
                    events = None;
                }
            },
            _ = poll.tick() => {
                let deployment: DeploymentView = api.get(&path).await?;
                if !quiet {
                    progress.timeline(&deployment.timeline);
                }
                if events.is_none() && settled(&deployment.state) {
                    break;
                }
            }
            _ = spin.tick(), if tty => {
                let mut out = std::io::stdout().lock();
                progress.draw(&mut out);
            }
        }
    }
    let deployment: DeploymentView = api.get(&path).await?;
    if !quiet {
        progress.timeline(&deployment.timeline);
    }
    {
        let mut out = std::io::stdout().lock();
        progress.clear(&mut out);
    }
    let ok = matches!(deployment.state.as_str(), "running" | "superseded");
    Ok((deployment, ok))
}

/// One runtime log line for people.
pub fn runtime_line(line: &RuntimeLine) -> String {
    format!("{} {} {:<6} {}", line.ts, clean(&line.container), line.stream, clean(&line.line))
}

/// How long `logs --follow` waits before each reconnect after the stream
/// was lost; past the last, it gives up (about half a minute in all, enough
/// for a control plane to restart). A log line received starts over.
const RECONNECT_DELAYS_MS: [u64; 7] = [500, 1000, 2000, 4000, 8000, 8000, 8000];

/// Follows an app's runtime log until the app is deleted (exit 0) or the
/// stream is lost for good (exit 1). A lost stream is opened again, after
/// [`RECONNECT_DELAYS_MS`], with the id of the last line printed
/// (`Last-Event-ID`), so the server sends only what came after it. With
/// `json`, one JSON object per line.
pub async fn app_logs(api: &Api, path: &str, json: bool) -> Result<(), Failure> {
    let mut response = api.stream(path).await?;
    let mut last_id: Option<String> = None;
    let mut failures = 0;
    loop {
        let mut reason = match print_app_logs(response, json, &mut last_id, &mut failures).await {
            None => {
                eprintln!("the app was deleted");
                return Ok(());
            }
            Some(reason) => reason,
        };
        response = loop {
            let Some(delay) = RECONNECT_DELAYS_MS.get(failures) else {
                let waited: u64 = RECONNECT_DELAYS_MS.iter().sum();
                return Err(Failure::Action(format!(
                    "the log stream was lost ({reason}); {failures} reconnects over {} s failed, giving up",
                    waited / 1000
                )));
            };
            failures += 1;
            eprintln!("the log stream was lost ({reason}); reconnecting in {:.1} s ({failures}/{})", *delay as f64 / 1000.0, RECONNECT_DELAYS_MS.len());
            tokio::time::sleep(Duration::from_millis(*delay)).await;
            match api.stream_after(path, last_id.as_deref()).await {
                Ok(response) => break response,
                Err(refused) if refused.status == Some(404) => {
                    eprintln!("the app was deleted");
                    return Ok(());
                }
                // Not reached, or a server error (one that is starting, or
                // a proxy in front of one that is not there yet): again.
                Err(refused) if refused.status.is_none_or(|status| status >= 500) => reason = refused.failure.to_string(),
                Err(refused) => return Err(refused.failure),
            }
        };
    }
}

/// Prints the log lines of one stream until it ends: `None` for the app's
/// end, else why it was lost. Keeps the last line's id and resets
/// `failures` on every line.
async fn print_app_logs(response: reqwest::Response, json: bool, last_id: &mut Option<String>, failures: &mut usize) -> Option<String> {
    let mut events = response.bytes_stream().eventsource();
    while let Some(event) = events.next().await {
        match event {
            Ok(event) if event.event == "log" => {
                *failures = 0;
                if !event.id.is_empty() {
                    *last_id = Some(event.id.clone());
                }
                let Ok(line) = serde_json::from_str::<RuntimeLine>(&event.data) else { continue };
                if json {
                    println!("{}", serde_json::to_string(&crate::render::to_json(&line)).expect("JSON serializes"));
                } else {
                    println!("{}", runtime_line(&line));
                }
            }
            Ok(event) if event.event == "end" => return None,
            Ok(_) => {}
            Err(err) => return Some(format!("it broke: {err}")),
        }
    }
    Some("the server closed it".into())
}

/// How often a followed run's output is asked for.
const RUN_POLL: Duration = Duration::from_millis(500);
/// The longest wait between two tries while the control plane does not
/// answer (the waits double from [`RUN_POLL`] up to this).
const RUN_RETRY_MAX: Duration = Duration::from_secs(8);
/// How long the control plane may go without answering before following
/// gives up: enough for it to restart, or for a replica to take over.
const RUN_GIVE_UP: Duration = Duration::from_secs(120);
/// How long Ctrl-C waits for the cancel to be taken.
const CANCEL_WAIT: Duration = Duration::from_secs(10);

/// Whether a refusal may pass on its own: the server not reached, or a
/// server error (one that restarts, a proxy in front of one that is not
/// there yet), or too many requests.
fn transient(status: Option<u16>) -> bool {
    status.is_none_or(|status| status >= 500 || status == 429)
}

/// Prints a run's output lines as they come: stdout's on stdout, stderr's
/// on stderr. Text is made safe only for a terminal: a pipe or a file gets
/// the lines as the command printed them.
struct RunOutput {
    out_tty: bool,
    err_tty: bool,
    /// The highest line number printed (the logs route's `after`).
    after: u64,
}

impl RunOutput {
    /// Prints the lines numbered after the last one printed; whether there
    /// were any.
    fn print(&mut self, lines: &[TaskLine], quiet: bool) -> bool {
        let mut printed = false;
        for line in lines {
            if line.seq <= self.after {
                continue;
            }
            if !quiet && line.seq > self.after + 1 {
                // The run keeps only its last lines; say so rather than
                // let a gap pass for the whole output.
                eprintln!("cloudweb: {} earlier output lines were not kept", line.seq - self.after - 1);
            }
            self.after = line.seq;
            printed = true;
            if quiet {
                continue;
            }
            if line.stderr {
                let text = if self.err_tty { clean(&line.line) } else { line.line.clone() };
                let _ = writeln!(std::io::stderr().lock(), "{text}");
            } else {
                let text = if self.out_tty { clean(&line.line) } else { line.line.clone() };
                let _ = writeln!(std::io::stdout().lock(), "{text}");
            }
        }
        printed
    }
}

/// Follows a run of a command until it ends: its output as it comes (none
/// with `json`: the finished run is printed then), and the exit status of
/// `cloudweb run` from how it ended ([`run_outcome`]). Ctrl-C asks the
/// server to cancel the run when `cancel_on_interrupt` (the run was started
/// by this command), else only stops following; either way exit 130.
pub async fn task_run(api: &Api, app: &str, run: &TaskRunView, cancel_on_interrupt: bool, json: bool) -> Result<(), Failure> {
    let path = format!("/api/apps/{}/runs/{}", segment(app), segment(&run.id));
    let id = clean(&run.id);
    if !json && std::io::stderr().is_terminal() {
        let ctrl_c = if cancel_on_interrupt { "Ctrl-C cancels it" } else { "Ctrl-C stops following" };
        eprintln!("cloudweb: run {id} {}; {ctrl_c}", clean(&run.state));
    }
    let mut output = RunOutput { out_tty: std::io::stdout().is_terminal(), err_tty: std::io::stderr().is_terminal(), after: 0 };
    let interrupt = tokio::signal::ctrl_c();
    tokio::pin!(interrupt);
    let mut unanswered_since: Option<Instant> = None;
    let mut wait = RUN_POLL;
    loop {
        let logs_path = format!("{path}/logs?after={}", output.after);
        let answer = tokio::select! {
            _ = &mut interrupt => return interrupted(api, &path, &id, cancel_on_interrupt).await,
            answer = api.try_call::<TaskRunLogs, ()>(Method::GET, &logs_path, None) => answer,
        };
        match answer {
            Ok(logs) => {
                if unanswered_since.take().is_some() && !json {
                    eprintln!("cloudweb: the control plane answers again");
                }
                wait = RUN_POLL;
                // Lines came: ask again at once, there may be more (and
                // after the end, until none are left).
                if output.print(&logs.lines, json) {
                    continue;
                }
                if logs.run.is_final() {
                    if json {
                        crate::render::json(&logs.run);
                    }
                    return run_outcome(&logs.run);
                }
            }
            Err(refused) if transient(refused.status) => {
                let since = *unanswered_since.get_or_insert_with(|| {
                    if !json {
                        eprintln!("cloudweb: no answer from the control plane ({}); trying again", refused.failure);
                    }
                    Instant::now()
                });
                if since.elapsed() >= RUN_GIVE_UP {
                    return Err(Failure::Action(format!(
                        "the control plane has not answered for {} s ({}); run {id} goes on without this command: \
                         `cloudweb runs logs {} {id} --follow` follows it again",
                        since.elapsed().as_secs(),
                        refused.failure,
                        clean(app)
                    )));
                }
                wait = (wait * 2).min(RUN_RETRY_MAX);
            }
            Err(refused) => return Err(refused.failure),
        }
        tokio::select! {
            _ = &mut interrupt => return interrupted(api, &path, &id, cancel_on_interrupt).await,
            _ = tokio::time::sleep(wait) => {}
        }
    }
}

/// Prints a run's output as it is now, from the first answer of its logs
/// route on: asks again while lines come (an answer may hold only part).
pub async fn task_output(api: &Api, app: &str, id: &str, first: TaskRunLogs) -> Result<(), Failure> {
    let path = format!("/api/apps/{}/runs/{}/logs", segment(app), segment(id));
    let mut output = RunOutput { out_tty: std::io::stdout().is_terminal(), err_tty: std::io::stderr().is_terminal(), after: 0 };
    let mut logs = first;
    while output.print(&logs.lines, false) {
        logs = api.get(&format!("{path}?after={}", output.after)).await?;
    }
    if output.after == 0 && std::io::stderr().is_terminal() {
        eprintln!("cloudweb: run {} has no output ({})", clean(id), clean(&logs.run.state));
    }
    Ok(())
}

/// After Ctrl-C: asks the server to cancel the run (when this command
/// started it), waiting at most [`CANCEL_WAIT`] or until a second Ctrl-C;
/// exit 130 either way, with what became of the cancel.
async fn interrupted(api: &Api, path: &str, id: &str, cancel: bool) -> Result<(), Failure> {
    if !cancel {
        return Err(Failure::Exit(130, Some(format!("interrupted; run {id} goes on"))));
    }
    eprintln!("cloudweb: cancelling run {id}");
    let cancel_path = format!("{path}/cancel");
    let request = tokio::time::timeout(CANCEL_WAIT, api.try_call::<TaskRunView, ()>(Method::POST, &cancel_path, None));
    let message = tokio::select! {
        answer = request => match answer {
            Ok(Ok(run)) if run.state == "cancelled" => format!("interrupted; run {id} cancelled"),
            Ok(Ok(run)) if !run.is_final() => format!("interrupted; run {id} is being cancelled"),
            Ok(Ok(run)) => format!("interrupted; run {id} had already ended: {}", clean(&run.state)),
            Ok(Err(refused)) => format!("interrupted; run {id} could not be cancelled: {}", refused.failure),
            Err(_) => format!("interrupted; the control plane did not take the cancel of run {id} within {} s", CANCEL_WAIT.as_secs()),
        },
        _ = tokio::signal::ctrl_c() => format!("interrupted; run {id} may still be going"),
    };
    Err(Failure::Exit(130, Some(message)))
}

/// The exit status of `cloudweb run` for a finished run: 0 when it
/// succeeded, the command's own exit code when it failed, 124 when it
/// timed out (as `timeout(1)`), 125 when it failed without an exit code
/// (it could not start, as `docker run`), and 1 when it was cancelled,
/// lost with its node or skipped; every status but the command's own comes
/// with a one-line reason.
pub fn run_outcome(run: &TaskRunView) -> Result<(), Failure> {
    let id = clean(&run.id);
    let why = |default: &str| clean(run.message.as_deref().unwrap_or(default));
    match (run.state.as_str(), run.exit_code) {
        ("succeeded", _) => Ok(()),
        // An exit code outside 1..=255 cannot be passed on as it is.
        ("failed", Some(code)) => match u8::try_from(code) {
            Ok(status) if status != 0 => Err(Failure::Exit(status, None)),
            _ => Err(Failure::Exit(1, Some(format!("run {id} failed with exit code {code}: {}", why("no reason given"))))),
        },
        ("failed", None) => {
            // The control plane's own reasons may say so already.
            let reason = why("no reason given");
            let reason = reason.strip_prefix("could not start: ").unwrap_or(&reason);
            Err(Failure::Exit(125, Some(format!("run {id} could not start: {reason}"))))
        }
        ("timed_out", _) => Err(Failure::Exit(124, Some(format!("run {id} timed out: {}", why("it ran past its timeout"))))),
        ("cancelled", _) => Err(Failure::Exit(1, Some(format!("run {id} was cancelled: {}", why("no reason given"))))),
        ("lost", _) => Err(Failure::Exit(1, Some(format!("run {id} was lost with its node: {}", why("the node went away"))))),
        ("skipped", _) => Err(Failure::Exit(1, Some(format!("run {id} was skipped: {}", why("no reason given"))))),
        (state, _) => Err(Failure::Exit(1, Some(format!("run {id} ended {}: {}", clean(state), why("no reason given"))))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(state: &str, exit_code: Option<i64>) -> TaskRunView {
        TaskRunView {
            id: "tr_0123456789abcdef".into(),
            app: "web".into(),
            job: None,
            trigger: "one-off".into(),
            scheduled_for: None,
            state: state.into(),
            exit_code,
            message: None,
            command: vec!["true".into()],
            node_id: None,
            image: None,
            deployment_id: None,
            attempt: 1,
            created_at: "2026-01-01T00:00:00Z".into(),
            started_at: None,
            finished_at: None,
            duration_ms: None,
        }
    }

    fn status(state: &str, exit_code: Option<i64>) -> (u8, bool) {
        match run_outcome(&run(state, exit_code)) {
            Ok(()) => (0, false),
            Err(Failure::Exit(status, message)) => (status, message.is_some()),
            Err(other) => panic!("{state}: {other}"),
        }
    }

    #[test]
    fn a_run_ends_with_the_commands_exit_status_or_a_reason() {
        assert_eq!(status("succeeded", Some(0)), (0, false));
        assert_eq!(status("failed", Some(3)), (3, false), "the command's own status, no extra line");
        assert_eq!(status("failed", Some(255)), (255, false));
        assert_eq!(status("failed", Some(0)), (1, true), "a failure is never 0");
        assert_eq!(status("failed", Some(-1)), (1, true));
        assert_eq!(status("failed", Some(300)), (1, true));
        assert_eq!(status("failed", None), (125, true), "could not start");
        let mut unstarted = run("failed", None);
        unstarted.message = Some("could not start: no node has room".into());
        let Err(Failure::Exit(125, Some(message))) = run_outcome(&unstarted) else { panic!("125") };
        assert_eq!(message, "run tr_0123456789abcdef could not start: no node has room");
        assert_eq!(status("timed_out", Some(137)), (124, true));
        assert_eq!(status("timed_out", None), (124, true));
        assert_eq!(status("cancelled", None), (1, true));
        assert_eq!(status("lost", None), (1, true));
        assert_eq!(status("skipped", None), (1, true));
        assert!(transient(None) && transient(Some(502)) && transient(Some(503)) && transient(Some(429)));
        assert!(!transient(Some(404)) && !transient(Some(401)) && !transient(Some(409)));
    }

    #[test]
    fn run_output_prints_each_line_once_and_counts_a_gap() {
        let line = |seq| TaskLine { seq, at: "2026-01-01T00:00:00Z".into(), stderr: false, line: format!("l{seq}") };
        let mut output = RunOutput { out_tty: false, err_tty: false, after: 0 };
        assert!(output.print(&[line(1), line(2)], true));
        assert_eq!(output.after, 2);
        assert!(!output.print(&[line(1), line(2)], true), "nothing new");
        assert!(output.print(&[line(2), line(5)], true));
        assert_eq!(output.after, 5);
        assert!(!output.print(&[], true));
    }
}
