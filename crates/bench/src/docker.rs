//! The Docker CLI, as a person would use it: the bare baseline the deploy
//! benchmark compares against, clean-up, and the Engine's container events
//! (which say when the agent created and started a container).

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use serde_json::Value;

use crate::process::Guarded;
use crate::timestamp::Nanos;

/// Runs `docker` with `args`; returns its trimmed stdout, or an error with
/// its stderr.
pub fn docker(args: &[&str]) -> Result<String> {
    docker_with_env(args, &[])
}

pub fn docker_with_env(args: &[&str], env: &[(&str, &str)]) -> Result<String> {
    let mut command = Command::new("docker");
    command.args(args).stdin(Stdio::null());
    for (name, value) in env {
        command.env(name, value);
    }
    let output = command.output().context("running docker (is the Docker CLI installed?)")?;
    if !output.status.success() {
        bail!("docker {} failed with {}: {}", args.join(" "), output.status, String::from_utf8_lossy(&output.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&output.stdout).trim().to_string())
}

pub fn image_exists(image: &str) -> bool {
    docker(&["image", "inspect", "--format", "{{.Id}}", "--", image]).is_ok()
}

/// Force-removes every container carrying `label` (`key=value`); returns
/// how many there were.
pub fn remove_labelled(label: &str) -> Result<usize> {
    let listed = docker(&["ps", "-aq", "--filter", &format!("label={label}")])?;
    let ids: Vec<&str> = listed.split_whitespace().collect();
    if !ids.is_empty() {
        let mut args = vec!["rm", "-f", "--"];
        args.extend(&ids);
        docker(&args)?;
    }
    Ok(ids.len())
}

/// The value of `key` on every container (running or not) that carries `label`.
pub fn label_values(label: &str, key: &str) -> Result<Vec<String>> {
    let format = format!("{{{{.Label \"{key}\"}}}}");
    Ok(docker(&["ps", "-a", "--filter", &format!("label={label}"), "--format", &format])?.lines().map(str::to_string).collect())
}

/// Removes every tag of `repository` (`host:port/name`); the layers go with
/// the last tag.
pub fn remove_repository_tags(repository: &str) -> Result<usize> {
    let listed = docker(&["image", "ls", "--format", "{{.Repository}}:{{.Tag}}", "--", repository])?;
    let tags: Vec<&str> = listed.lines().filter(|tag| !tag.ends_with(":<none>")).collect();
    if !tags.is_empty() {
        let mut args = vec!["image", "rm", "--"];
        args.extend(&tags);
        docker(&args)?;
    }
    Ok(tags.len())
}

/// A container event: what happened (`create`, `start`), to which
/// deployment (its `cloudweb.deployment` label), and when, on the Engine's
/// clock.
#[derive(Debug, Clone)]
pub struct ContainerEvent {
    pub action: String,
    pub deployment: Option<String>,
    pub at: Nanos,
}

/// `docker events` for containers carrying a label, read from a thread
/// while the benchmark runs.
pub struct Events {
    _process: Guarded,
    seen: Arc<Mutex<Vec<ContainerEvent>>>,
}

impl Events {
    pub fn watch(label: &str) -> Result<Events> {
        let mut child = Command::new("docker")
            .args(["events", "--format", "{{json .}}", "--filter", "type=container", "--filter", "event=create", "--filter", "event=start"])
            .arg("--filter")
            .arg(format!("label={label}"))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .context("starting docker events")?;
        let stdout = child.stdout.take().context("docker events has no stdout")?;
        let seen = Arc::new(Mutex::new(Vec::new()));
        let sink = seen.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if let Some(event) = parse_event(&line) {
                    sink.lock().expect("events lock").push(event);
                }
            }
        });
        Ok(Events { _process: Guarded::adopt(child, Duration::ZERO), seen })
    }

    /// When `action` first happened to a container of `deployment`. Waits
    /// up to `patience` for the event to arrive through the pipe.
    pub async fn first(&self, deployment: &str, action: &str, patience: Duration) -> Option<Nanos> {
        let deadline = tokio::time::Instant::now() + patience;
        loop {
            let found = self
                .seen
                .lock()
                .expect("events lock")
                .iter()
                .filter(|event| event.action == action && event.deployment.as_deref() == Some(deployment))
                .map(|event| event.at)
                .min();
            if found.is_some() || tokio::time::Instant::now() >= deadline {
                return found;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

fn parse_event(line: &str) -> Option<ContainerEvent> {
    let event: Value = serde_json::from_str(line).ok()?;
    Some(ContainerEvent {
        action: event["Action"].as_str()?.to_string(),
        deployment: event["Actor"]["Attributes"]["cloudweb.deployment"].as_str().map(str::to_string),
        at: Nanos::from(event["timeNano"].as_i64()?),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_an_engine_event() {
        let line = r#"{"status":"create","id":"f74b","Type":"container","Action":"create","Actor":{"ID":"f74b","Attributes":{"cloudweb.deployment":"dep_1","name":"cw-web-1"}},"scope":"local","time":1795953048,"timeNano":1795953048016930004}"#;
        let event = parse_event(line).unwrap();
        assert_eq!(event.action, "create");
        assert_eq!(event.deployment.as_deref(), Some("dep_1"));
        assert_eq!(event.at, 1_795_953_048_016_930_004);
        assert!(parse_event("not json").is_none());
    }
}
