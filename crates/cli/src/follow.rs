//! Following a deployment (its state and build log until it settles) and
//! an app's runtime log, over the user API's server-sent events.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use eventsource_stream::Eventsource;
use futures_util::StreamExt;
use cloudweb_api_types::deployments::{BuildLogLine, DeploymentView, TimelineEntry};
use cloudweb_api_types::traffic::RuntimeLine;

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
