//! Tasks on the wire: one-off containers of an app's running image that run
//! a command to its end (a scheduled job's tick, `cloudweb run`).
//!
//! - `task_run` ([`TaskRunPayload`]): create and start the container
//!   `cloudweb-task-<run id>` from `image` with `env` and `command`, wait
//!   for it to exit, kill it when `timeout_seconds` pass, and report. A
//!   command delivered again for a run whose container exists (the agent
//!   restarted, an ack was lost) waits for that container instead of
//!   starting a second one; a run already reported final is reported again.
//! - `task_cancel` ([`TaskCancelPayload`]): kill the run's container.
//!
//! Reports go to `POST /agent/v1/task-runs/{run_id}` ([`TaskRunReport`]):
//! `running` once the container started, then the final state with the
//! exit code. Output lines travel in the reports, numbered from 1, so a
//! report sent twice adds nothing twice; a run keeps at most
//! [`MAX_RUN_LINES`] of them (the last ones once it is longer).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::validate::{self, ValidationError};

/// A run's id as the control plane makes them: `tr_` and 16 hex digits.
pub fn run_id(value: &str) -> Result<(), ValidationError> {
    let ok = value.strip_prefix("tr_").is_some_and(|hex| hex.len() == 16 && hex.bytes().all(|b| b.is_ascii_hexdigit()));
    if ok {
        Ok(())
    } else {
        Err(ValidationError::new("run_id", "must be tr_ and 16 hex digits"))
    }
}

/// The container a run gets on its node.
pub fn container_name(run_id: &str) -> String {
    format!("cloudweb-task-{run_id}")
}

/// Most arguments of a task's command, and bytes of each.
pub const MAX_ARGS: usize = 64;
pub const MAX_ARG_BYTES: usize = 4096;
/// The longest a task may run: one day.
pub const MAX_TIMEOUT_SECONDS: u32 = 24 * 3600;
/// How late a scheduled job's missed tick may still run: a minute (a tick
/// may wait that long for a node) to a week.
pub const MIN_STARTING_DEADLINE_SECONDS: u32 = 60;
pub const MAX_STARTING_DEADLINE_SECONDS: u32 = 7 * 24 * 3600;
/// Output lines a run keeps (the last ones), and bytes of one line.
pub const MAX_RUN_LINES: usize = 2000;
pub const MAX_LINE_BYTES: usize = 4096;
/// Lines in one report, and bytes of their text together: a report stays
/// well under the agent listener's 1 MiB body limit even with every byte
/// escaped in JSON.
pub const MAX_REPORT_LINES: usize = 500;
pub const MAX_REPORT_TEXT_BYTES: usize = 128 * 1024;
/// Bytes of a report's `message`.
pub const MAX_MESSAGE_BYTES: usize = 2048;

/// A task's command: 1 to [`MAX_ARGS`] arguments, run as the container's
/// command (after the image's entrypoint), never through a shell unless the
/// user names one.
pub fn command(field: &str, args: &[String]) -> Result<(), ValidationError> {
    if args.is_empty() || args.len() > MAX_ARGS {
        return Err(ValidationError::new(field, format!("must be 1 to {MAX_ARGS} arguments")));
    }
    if args[0].is_empty() {
        return Err(ValidationError::new(field, "the program must not be empty"));
    }
    for arg in args {
        if arg.len() > MAX_ARG_BYTES {
            return Err(ValidationError::new(field, format!("an argument is longer than {MAX_ARG_BYTES} bytes")));
        }
        if arg.contains('\0') {
            return Err(ValidationError::new(field, "an argument contains a NUL byte"));
        }
    }
    Ok(())
}

/// Payload of `task_run`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskRunPayload {
    pub run_id: String,
    pub app: String,
    /// The app's running image, in the cluster registry.
    pub image: String,
    /// The app's environment, its linked services' URLs included.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    pub command: Vec<String>,
    pub timeout_seconds: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<f64>,
}

impl TaskRunPayload {
    pub fn validate(&self) -> Result<(), ValidationError> {
        run_id(&self.run_id)?;
        validate::node_name("app", &self.app)?;
        validate::bounded_text("image", &self.image, 512)?;
        if self.image.starts_with('-') || self.image.contains(char::is_whitespace) {
            return Err(ValidationError::new("image", "is not an image reference"));
        }
        crate::deploy::env(&self.env)?;
        command("command", &self.command)?;
        if self.timeout_seconds == 0 || self.timeout_seconds > MAX_TIMEOUT_SECONDS {
            return Err(ValidationError::new("timeout_seconds", format!("must be 1 to {MAX_TIMEOUT_SECONDS}")));
        }
        if let Some(cpu) = self.cpu {
            if !(cpu.is_finite() && cpu > 0.0 && cpu <= 1024.0) {
                return Err(ValidationError::new("cpu", "must be more than 0 and at most 1024"));
            }
        }
        // Docker refuses less than 6 MB.
        if self.memory_bytes.is_some_and(|m| m < 6 * 1024 * 1024) {
            return Err(ValidationError::new("memory_bytes", "must be at least 6 MiB"));
        }
        Ok(())
    }
}

/// Payload of `task_cancel`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskCancelPayload {
    pub run_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl TaskCancelPayload {
    pub fn validate(&self) -> Result<(), ValidationError> {
        run_id(&self.run_id)?;
        if let Some(reason) = &self.reason {
            validate::bounded_text("reason", reason, 512)?;
        }
        Ok(())
    }
}

/// What became of a run on its node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskState {
    /// The container started.
    Running,
    /// It exited 0.
    Succeeded,
    /// It exited non-zero, or could not start (`exit_code` absent then).
    Failed,
    /// Killed at its time limit.
    TimedOut,
    /// Killed by `task_cancel`.
    Cancelled,
}

impl TaskState {
    pub fn is_final(self) -> bool {
        !matches!(self, TaskState::Running)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            TaskState::Running => "running",
            TaskState::Succeeded => "succeeded",
            TaskState::Failed => "failed",
            TaskState::TimedOut => "timed_out",
            TaskState::Cancelled => "cancelled",
        }
    }
}

/// One output line of a run, numbered from 1 in the order the container
/// printed them (stdout and stderr together).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema))]
pub struct TaskLine {
    pub seq: u64,
    /// RFC 3339, UTC.
    pub at: String,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stderr: bool,
    pub line: String,
}

/// Body of `POST /agent/v1/task-runs/{run_id}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskRunReport {
    pub state: TaskState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i64>,
    /// Why it failed to start, or what killed it, in words.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Output lines not reported before (at most [`MAX_REPORT_LINES`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub lines: Vec<TaskLine>,
}

impl TaskRunReport {
    pub fn validate(&self) -> Result<(), ValidationError> {
        if let Some(message) = &self.message {
            validate::bounded_text("message", message, MAX_MESSAGE_BYTES)?;
        }
        if self.lines.len() > MAX_REPORT_LINES {
            return Err(ValidationError::new("lines", format!("at most {MAX_REPORT_LINES} in one report")));
        }
        if self.lines.iter().map(|l| l.line.len()).sum::<usize>() > MAX_REPORT_TEXT_BYTES {
            return Err(ValidationError::new("lines", format!("at most {MAX_REPORT_TEXT_BYTES} bytes of text in one report")));
        }
        for line in &self.lines {
            if line.seq == 0 {
                return Err(ValidationError::new("lines", "seq starts at 1"));
            }
            validate::bounded_text("lines.at", &line.at, 64)?;
            if line.line.len() > MAX_LINE_BYTES {
                return Err(ValidationError::new("lines", format!("a line is longer than {MAX_LINE_BYTES} bytes")));
            }
        }
        if self.state == TaskState::Running && self.exit_code.is_some() {
            return Err(ValidationError::new("exit_code", "a running task has none"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn payload() -> TaskRunPayload {
        TaskRunPayload {
            run_id: "tr_0123456789abcdef".into(),
            app: "web".into(),
            image: "10.0.0.1:5000/web:abc".into(),
            env: BTreeMap::new(),
            command: vec!["./manage.py".into(), "migrate".into()],
            timeout_seconds: 60,
            memory_bytes: None,
            cpu: None,
        }
    }

    #[test]
    fn a_good_payload_passes_and_each_bad_field_is_named() {
        payload().validate().unwrap();
        let mut p = payload();
        p.run_id = "tr_xyz".into();
        assert_eq!(p.validate().unwrap_err().field, "run_id");
        let mut p = payload();
        p.command = vec![];
        assert_eq!(p.validate().unwrap_err().field, "command");
        let mut p = payload();
        p.command = vec![String::new()];
        assert_eq!(p.validate().unwrap_err().field, "command");
        let mut p = payload();
        p.command = vec!["a\0b".into()];
        assert_eq!(p.validate().unwrap_err().field, "command");
        let mut p = payload();
        p.timeout_seconds = 0;
        assert_eq!(p.validate().unwrap_err().field, "timeout_seconds");
        let mut p = payload();
        p.timeout_seconds = MAX_TIMEOUT_SECONDS + 1;
        assert_eq!(p.validate().unwrap_err().field, "timeout_seconds");
        let mut p = payload();
        p.image = "--privileged".into();
        assert_eq!(p.validate().unwrap_err().field, "image");
        let mut p = payload();
        p.cpu = Some(f64::NAN);
        assert_eq!(p.validate().unwrap_err().field, "cpu");
    }

    #[test]
    fn reports_are_bounded() {
        let line = |seq| TaskLine { seq, at: "2026-01-01T00:00:00Z".into(), stderr: false, line: "x".into() };
        let ok = TaskRunReport { state: TaskState::Succeeded, exit_code: Some(0), message: None, lines: vec![line(1), line(2)] };
        ok.validate().unwrap();
        let zero = TaskRunReport { lines: vec![line(0)], ..ok.clone() };
        assert!(zero.validate().is_err());
        let many = TaskRunReport { lines: (1..=(MAX_REPORT_LINES as u64 + 1)).map(line).collect(), ..ok.clone() };
        assert!(many.validate().is_err());
        let running = TaskRunReport { state: TaskState::Running, ..ok };
        assert!(running.validate().is_err());
        let json = serde_json::to_value(TaskState::TimedOut).unwrap();
        assert_eq!(json, "timed_out");
    }
}
