//! Runtime logs: what app instances print on stdout and stderr, uploaded by
//! the agent in batches (`POST /agent/v1/logs`). Build and deploy progress
//! lines go with reports instead (see [`crate::Report`]).

use serde::{Deserialize, Serialize};

use crate::misc::{LogLine, MAX_LOG_LINE};
use crate::validate::{self, ValidationError};

/// Most lines in one upload, over all its containers.
pub const MAX_UPLOAD_LINES: usize = 1000;

/// Most containers in one upload.
pub const MAX_UPLOAD_CONTAINERS: usize = 100;

/// The agent keeps a batch under this many bytes of line text, well inside
/// the listener's 1 MiB body limit once JSON escaping is added.
pub const MAX_UPLOAD_TEXT_BYTES: usize = 256 * 1024;

/// `POST /agent/v1/logs`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogUpload {
    pub containers: Vec<ContainerLogs>,
}

/// New lines of one app container, oldest first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerLogs {
    pub deployment_id: String,
    /// 1-based instance number, from the container's labels.
    pub instance: u32,
    /// The container's name (`cw-<app>-<n>`).
    pub container: String,
    /// Lines the agent lost before this batch (its buffer was full), so the
    /// control plane can say so where they were.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub dropped: u64,
    /// `stream` is `stdout` or `stderr`; `ts` is the Docker Engine's
    /// RFC 3339 timestamp with nanoseconds.
    #[serde(default)]
    pub lines: Vec<LogLine>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Answer to `POST /agent/v1/logs`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogUploadResponse {
    /// Lines stored (repeats of lines already stored are not counted).
    pub accepted: u64,
    /// Containers whose lines were not taken, and why. The agent stops
    /// following them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub refused: Vec<RefusedContainer>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RefusedContainer {
    pub container: String,
    pub reason: String,
}

impl LogUpload {
    /// Caps every line at [`MAX_LOG_LINE`] bytes (both sides run it).
    pub fn sanitize(&mut self) {
        for container in &mut self.containers {
            for line in &mut container.lines {
                crate::misc::cap_log_line(&mut line.line);
            }
        }
    }

    pub fn validate(&self) -> Result<(), ValidationError> {
        if self.containers.len() > MAX_UPLOAD_CONTAINERS {
            return Err(ValidationError::new("containers", format!("more than {MAX_UPLOAD_CONTAINERS} containers")));
        }
        let total: usize = self.containers.iter().map(|c| c.lines.len()).sum();
        if total > MAX_UPLOAD_LINES {
            return Err(ValidationError::new("lines", format!("more than {MAX_UPLOAD_LINES} lines")));
        }
        for container in &self.containers {
            validate::token("deployment_id", &container.deployment_id, 64)?;
            validate::token("container", &container.container, 128)?;
            if container.instance == 0 || container.instance > 100 {
                return Err(ValidationError::new("instance", "must be 1 to 100"));
            }
            for line in &container.lines {
                validate::bounded_text("lines.ts", &line.ts, 64)?;
                if !matches!(line.stream.as_str(), "stdout" | "stderr") {
                    return Err(ValidationError::new("lines.stream", "must be stdout or stderr"));
                }
                if line.line.len() > MAX_LOG_LINE {
                    return Err(ValidationError::new("lines.line", "longer than 16 KiB"));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(stream: &str) -> LogLine {
        LogLine { ts: "2026-11-30T10:00:00.000000001Z".into(), stream: stream.into(), line: "hello".into() }
    }

    #[test]
    fn uploads_are_bounded_and_checked() {
        let container = |lines: Vec<LogLine>| ContainerLogs {
            deployment_id: "dep_1".into(),
            instance: 1,
            container: "cw-web-1".into(),
            dropped: 0,
            lines,
        };
        let ok = LogUpload { containers: vec![container(vec![line("stdout"), line("stderr")])] };
        ok.validate().unwrap();
        let bad_stream = LogUpload { containers: vec![container(vec![line("build")])] };
        assert_eq!(bad_stream.validate().unwrap_err().field, "lines.stream");
        let too_many = LogUpload { containers: vec![container(vec![line("stdout"); MAX_UPLOAD_LINES + 1])] };
        assert_eq!(too_many.validate().unwrap_err().field, "lines");
        let mut zero = container(vec![]);
        zero.instance = 0;
        assert!(LogUpload { containers: vec![zero] }.validate().is_err());
        let mut long = LogUpload { containers: vec![container(vec![LogLine { line: "é".repeat(MAX_LOG_LINE), ..line("stdout") }])] };
        assert!(long.validate().is_err());
        long.sanitize();
        long.validate().unwrap();
        // `dropped` is left out when zero, and defaults when absent.
        let text = serde_json::to_string(&ok).unwrap();
        assert!(!text.contains("dropped"));
        let back: LogUpload = serde_json::from_str(&text).unwrap();
        assert_eq!(back, ok);
    }
}
