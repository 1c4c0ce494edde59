//! One measured deployment: its request, then the moments it passed
//! through, gathered from four clocks-of-record on this machine (the
//! benchmark's own, the control plane's records, the agent's log lines and
//! the Docker Engine's events), and the stages between them.

use std::collections::HashMap;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use reqwest::Method;
use serde_json::{json, Value};

use super::cluster::Cluster;
use crate::timestamp::{self, millis_between, parse_rfc3339, Nanos};

/// How often the benchmark asks the control plane for the deployment.
pub const POLL_INTERVAL: Duration = Duration::from_millis(20);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A rollback: an image that exists already, no build.
    Rollback,
    /// A deploy of a commit whose image layers are all cached.
    CachedBuild,
}

/// The moments of one deployment. Those that could not be found are `None`.
#[derive(Debug, Clone, Default)]
pub struct Timeline {
    pub deployment: String,
    /// The benchmark sent the request.
    pub requested: Nanos,
    /// The control plane recorded the deployment (`created_at`).
    pub accepted: Option<Nanos>,
    /// The agent logged that it picked the deploy command up.
    pub picked_up: Option<Nanos>,
    /// The deployment's first log line ("using image" or "cloning").
    pub first_line: Option<Nanos>,
    pub checked_out: Option<Nanos>,
    /// The fetch confirmed a commit taken from the mirror before it (agents
    /// that build while they fetch).
    pub fetched: Option<Nanos>,
    pub build_started: Option<Nanos>,
    /// Docker's "Successfully tagged" line: the build itself ended.
    pub built: Option<Nanos>,
    pub pushing: Option<Nanos>,
    /// The push ended (agents that push while the instance starts).
    pub pushed: Option<Nanos>,
    /// A build's image was pushed and reported (`deploying` recorded).
    pub image_ready: Option<Nanos>,
    /// The Docker Engine created the container.
    pub created: Option<Nanos>,
    /// The agent logged that the container started.
    pub started: Option<Nanos>,
    /// The agent logged that the health check passed.
    pub healthy: Option<Nanos>,
    /// The control plane recorded `running`.
    pub recorded: Option<Nanos>,
    /// The benchmark saw `running` through the API.
    pub seen: Nanos,
    /// Build steps after FROM, and how many of them came from the cache.
    pub build_steps: usize,
    pub cached_steps: usize,
    pub build_lines: usize,
}

/// Milliseconds from one moment to another, when both are known.
pub fn span(from: Option<Nanos>, to: Option<Nanos>) -> Option<f64> {
    Some(millis_between(from?, to?))
}

impl Timeline {
    /// Request → the agent's first log line for the deployment.
    pub fn schedule(&self) -> Option<f64> {
        span(Some(self.requested), self.first_line)
    }

    /// First log line → the container is created: the image check of a
    /// rollback; clone, build, push and report of a build.
    pub fn pull_or_build(&self) -> Option<f64> {
        span(self.first_line, self.created)
    }

    /// Container created → the agent saw it started.
    pub fn start(&self) -> Option<f64> {
        span(self.created, self.started)
    }

    /// Started → the health check passed.
    pub fn healthy_after(&self) -> Option<f64> {
        span(self.started, self.healthy)
    }

    /// Health check passed → the API shows `running`.
    pub fn report(&self) -> Option<f64> {
        span(self.healthy, Some(self.seen))
    }

    pub fn total(&self) -> f64 {
        millis_between(self.requested, self.seen)
    }

    /// The docker build alone: its start to Docker's last line (to the
    /// push for output without one).
    pub fn docker_build(&self) -> Option<f64> {
        span(self.build_started, self.built.or(self.pushing))
    }

    /// Whether every build step after FROM came from the cache.
    pub fn fully_cached(&self) -> bool {
        self.build_steps > 0 && self.cached_steps == self.build_steps
    }
}

/// Requests a deployment of `kind`, waits (polling every 20 ms) until it
/// runs, and gathers its timeline.
pub async fn measure(cluster: &mut Cluster, kind: Kind, target: &Target, settle_timeout: Duration) -> Result<Timeline> {
    let (path, body) = match kind {
        Kind::Rollback => (format!("/api/apps/{}/rollback", cluster.app), json!({"deployment_id": target.rollback_to})),
        Kind::CachedBuild => (format!("/api/apps/{}/deploy", cluster.app), json!({"commit": target.commit})),
    };
    let requested = timestamp::now();
    let (status, answer) = cluster.server.call(Method::POST, &path, Some(&body)).await?;
    if status != 201 {
        bail!("POST {path} answered {status}: {answer}");
    }
    let deployment = answer["id"].as_str().context("the deploy answer has no id")?.to_string();
    let settled = settle(cluster, &deployment, settle_timeout).await?;
    let view = &settled.view;
    let mut timeline = Timeline {
        deployment: deployment.clone(),
        requested,
        accepted: view["created_at"].as_str().and_then(parse_rfc3339),
        image_ready: if kind == Kind::CachedBuild { settled.entered.get("deploying").copied() } else { None },
        recorded: settled.entered.get("running").copied(),
        seen: settled.seen,
        ..Timeline::default()
    };
    for line in log_lines(cluster, &deployment).await? {
        timeline.note(&line);
    }
    timeline.picked_up = picked_up(&std::fs::read_to_string(&cluster.agent_log).unwrap_or_default(), &deployment);
    if let Some(events) = &cluster.events {
        timeline.created = events.first(&deployment, "create", Duration::from_secs(2)).await;
    }
    Ok(timeline)
}

/// What the measured deployments point at: the deployment a rollback
/// returns to, and the commit a cached build deploys again.
pub struct Target {
    pub rollback_to: String,
    pub commit: String,
}

pub struct Settled {
    pub view: Value,
    /// When the control plane recorded each state the poll saw (`updated_at`).
    pub entered: HashMap<String, Nanos>,
    pub seen: Nanos,
}

/// Polls the deployment until it is `running`; fails when it failed.
pub async fn settle(cluster: &mut Cluster, deployment: &str, timeout: Duration) -> Result<Settled> {
    let path = format!("/api/deployments/{deployment}");
    let deadline = tokio::time::Instant::now() + timeout;
    let mut entered = HashMap::new();
    let mut tick = tokio::time::interval(POLL_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let (status, view) = cluster.server.call(Method::GET, &path, None).await?;
        let seen = timestamp::now();
        if status != 200 {
            bail!("GET {path} answered {status}: {view}");
        }
        let state = view["state"].as_str().unwrap_or_default().to_string();
        if let Some(at) = view["updated_at"].as_str().and_then(parse_rfc3339) {
            entered.entry(state.clone()).or_insert(at);
        }
        match state.as_str() {
            "running" => return Ok(Settled { view, entered, seen }),
            "failed" | "superseded" | "stopped" => {
                bail!("deployment {deployment} ended {state}: {}\nagent log:\n{}", view["error"], cluster.agent_log_tail(30))
            }
            _ => {}
        }
        cluster.check_processes()?;
        if tokio::time::Instant::now() > deadline {
            bail!("deployment {deployment} was not running within {} s (state {state}); agent log:\n{}", timeout.as_secs(), cluster.agent_log_tail(30));
        }
    }
}

/// A deployment log line: its time, stream and text.
pub struct LogLine {
    pub at: Option<Nanos>,
    pub stream: String,
    pub text: String,
}

impl Timeline {
    fn note(&mut self, line: &LogLine) {
        let Some(at) = line.at else { return };
        if self.first_line.is_none_or(|first| at < first) {
            self.first_line = Some(at);
        }
        let text = line.text.trim();
        let first = |slot: &mut Option<Nanos>| {
            if slot.is_none() {
                *slot = Some(at);
            }
        };
        match line.stream.as_str() {
            "build" => {
                self.build_lines += 1;
                if text.starts_with("checked out ") {
                    first(&mut self.checked_out);
                } else if text.starts_with("fetched branch ") {
                    first(&mut self.fetched);
                } else if text.starts_with("building the Dockerfile") {
                    first(&mut self.build_started);
                } else if text.starts_with("Successfully tagged ") {
                    first(&mut self.built);
                } else if text.starts_with("pushing ") {
                    first(&mut self.pushing);
                } else if text.starts_with("pushed ") {
                    first(&mut self.pushed);
                } else if text.starts_with("Step ") && !text.contains(" : FROM ") {
                    self.build_steps += 1;
                } else if text.contains("Using cache") {
                    self.cached_steps += 1;
                }
            }
            "agent" => {
                if text.starts_with("started ") {
                    first(&mut self.started);
                } else if text.starts_with("healthy after ") {
                    first(&mut self.healthy);
                }
            }
            _ => {}
        }
    }
}

/// The deployment's log lines, from the live log stream: read until the
/// health check's line (every line is stored before the agent reports
/// `running`), not until the stream ends a few seconds later.
async fn log_lines(cluster: &Cluster, deployment: &str) -> Result<Vec<LogLine>> {
    let path = format!("/api/deployments/{deployment}/logs");
    let mut response = cluster
        .server
        .http
        .get(format!("{}{path}", cluster.server.api_url))
        .bearer_auth(&cluster.server.admin_token)
        .timeout(Duration::from_secs(15))
        .send()
        .await
        .with_context(|| format!("GET {path}"))?;
    if !response.status().is_success() {
        bail!("GET {path} answered {}", response.status());
    }
    let mut lines = Vec::new();
    let mut pending = String::new();
    while let Some(chunk) = response.chunk().await.with_context(|| format!("reading {path}"))? {
        pending.push_str(&String::from_utf8_lossy(&chunk));
        while let Some(end) = pending.find('\n') {
            let raw: String = pending.drain(..=end).collect();
            if raw.trim_end().starts_with("event: end") {
                return Ok(lines);
            }
            let Some(data) = raw.trim_end().strip_prefix("data: ") else { continue };
            let Ok(value) = serde_json::from_str::<Value>(data) else { continue };
            let Some(text) = value["line"].as_str() else { continue };
            let line = LogLine { at: value["ts"].as_str().and_then(parse_rfc3339), stream: value["stream"].as_str().unwrap_or_default().to_string(), text: text.to_string() };
            let last = line.stream == "agent" && line.text.starts_with("healthy after ");
            lines.push(line);
            if last {
                return Ok(lines);
            }
        }
    }
    Ok(lines)
}

/// When the agent logged that it started on the deployment (its `deploying`
/// line), from its stderr. `None` when the log has no such line.
pub fn picked_up(agent_log: &str, deployment: &str) -> Option<Nanos> {
    let field = format!("deployment={deployment}");
    agent_log.lines().map(strip_ansi).find_map(|line| {
        let mut words = line.split_whitespace();
        let at = parse_rfc3339(words.next()?)?;
        let rest: Vec<&str> = words.collect();
        (rest.contains(&"deploying") && rest.contains(&field.as_str())).then_some(at)
    })
}

/// `line` without ANSI colour sequences (`ESC [ ... letter`).
fn strip_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for next in chars.by_ref() {
                if next.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_agents_deploying_line() {
        let log = "2026-11-29T10:00:00.000001Z  INFO cloudweb_agent::run: event stream connected\n\
                   2026-11-29T10:00:01.250000Z  INFO cloudweb_agent::commands: deploying command=cmd-4 deployment=dep_ab instance=1\n\
                   \u{1b}[2m2026-11-29T10:00:02.5Z\u{1b}[0m \u{1b}[32m INFO\u{1b}[0m cloudweb_agent::commands: deploying command=cmd-5 deployment=dep_cd instance=1\n";
        assert_eq!(picked_up(log, "dep_ab"), parse_rfc3339("2026-11-29T10:00:01.25Z"));
        assert_eq!(picked_up(log, "dep_cd"), parse_rfc3339("2026-11-29T10:00:02.5Z"));
        assert_eq!(picked_up(log, "dep_a"), None);
    }

    #[test]
    fn stages_follow_the_log_lines() {
        let at = |ms: i128| Some(ms * 1_000_000);
        let mut timeline = Timeline { requested: 0, seen: 900_000_000, created: at(300), ..Timeline::default() };
        let lines = [
            (120, "build", "cloning branch main of git://x/app.git"),
            (150, "build", "checked out abc"),
            (160, "build", "building the Dockerfile"),
            (161, "build", "Step 1/3 : FROM cloudweb-test/busybox:latest"),
            (162, "build", "Step 2/3 : COPY index.html /www/index.html"),
            (163, "build", " ---> Using cache"),
            (164, "build", "Step 3/3 : CMD [\"httpd\"]"),
            (165, "build", " ---> Using cache"),
            (180, "build", "fetched branch main: abc is on it"),
            (190, "build", "Successfully tagged 127.0.0.1:5000/app:dep_1"),
            (200, "build", "pushing 127.0.0.1:5000/app:dep_1"),
            (420, "build", "pushed 127.0.0.1:5000/app:dep_1"),
            (500, "agent", "started cw-app-1"),
            (800, "agent", "healthy after 0.3 s (HTTP 200 on /)"),
        ];
        for (ms, stream, text) in lines {
            timeline.note(&LogLine { at: at(ms), stream: stream.into(), text: text.into() });
        }
        assert_eq!(timeline.schedule(), Some(120.0));
        assert_eq!(timeline.pull_or_build(), Some(180.0));
        assert_eq!(timeline.start(), Some(200.0));
        assert_eq!(timeline.healthy_after(), Some(300.0));
        assert_eq!(timeline.report(), Some(100.0));
        assert_eq!(timeline.total(), 900.0);
        assert_eq!((timeline.build_steps, timeline.cached_steps), (2, 2));
        assert!(timeline.fully_cached());
        assert_eq!(span(timeline.build_started, timeline.pushing), Some(40.0));
        assert_eq!(timeline.docker_build(), Some(30.0));
        assert_eq!(span(timeline.checked_out, timeline.fetched), Some(30.0));
        assert_eq!(span(timeline.pushing, timeline.pushed), Some(220.0));
    }
}
