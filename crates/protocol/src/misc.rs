//! The smaller bodies: errors, leave, deployment reports, the ingress route
//! table and the registry settings.

use serde::{Deserialize, Serialize};

use crate::validate::{self, ValidationError};

/// Every non-2xx answer of the agent listener except 426 carries this body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub error: String,
    /// A machine-readable reason, for the answers an agent acts on (see
    /// [`error_codes`]); absent on the others.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    /// With `code` `not_leader`: the public URL of the control-plane
    /// replica that leads, when the answering one knows it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leader: Option<String>,
}

/// Values of [`ErrorBody::code`].
pub mod error_codes {
    /// 403: the client certificate is the cluster CA's, but its node is not
    /// registered (an administrator removed it, or it left). An agent that
    /// gets this stops for good instead of retrying.
    pub const NODE_NOT_REGISTERED: &str = "node_not_registered";
    /// 401: the client certificate was replaced by a renewal and the node
    /// has since used the new one. Not a removal: the agent goes on with
    /// its new certificate.
    pub const CERTIFICATE_REPLACED: &str = "certificate_replaced";
    /// 503: this control-plane replica does not lead and does not serve
    /// agents; `leader` names the one that does. The agent moves there.
    pub const NOT_LEADER: &str = "not_leader";
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaveResponse {
    pub node_id: String,
    /// Deployments marked failed because the node left with `force=1`.
    pub failed_deployments: Vec<String>,
    /// Deployments whose image starts again on other nodes: a new
    /// deployment for a failed one that ran only here, or one that still
    /// runs elsewhere and replaces its instance. Absent from older servers.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rescheduled: Vec<String>,
}

/// Body of a 409 from `POST /agent/v1/leave` without `force=1`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaveConflict {
    pub error: String,
    pub apps: Vec<String>,
}

/// Most log lines in one report.
pub const MAX_REPORT_LINES: usize = 1000;

/// Longest report message, in bytes.
pub const MAX_REPORT_MESSAGE: usize = 4096;

/// Longest log line, in bytes.
pub const MAX_LOG_LINE: usize = 16 * 1024;

/// Turns any text into a valid one-line report message: each run of
/// control characters (line breaks, tabs, escapes) becomes one space, the
/// ends are trimmed, and the result is cut to `max` bytes on a character
/// boundary with a trailing "…". Failure messages often quote a program's
/// stderr (git prints several lines), and a message that cannot be stored
/// would leave a deployment without its final state.
pub fn one_line(text: &str, max: usize) -> String {
    let mut out = String::with_capacity(text.len().min(max));
    let mut pending_space = false;
    for c in text.chars() {
        if c.is_control() || c.is_whitespace() {
            pending_space = !out.is_empty();
            continue;
        }
        if pending_space {
            out.push(' ');
            pending_space = false;
        }
        out.push(c);
    }
    if out.len() > max {
        let ellipsis = "…";
        truncate_on_char(&mut out, max.saturating_sub(ellipsis.len()));
        out.push_str(ellipsis);
    }
    out
}

/// Cuts `text` to at most `max` bytes, backing off to the previous
/// character boundary. `String::truncate` panics inside a multi-byte
/// character, and most texts we cap quote someone else's input (a JSON
/// body, git's stderr from a remote, Caddy's answer), so a plain
/// `truncate` would let an outsider crash a request or a task.
pub fn truncate_on_char(text: &mut String, max: usize) {
    if text.len() > max {
        let mut cut = max;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text.truncate(cut);
    }
}

/// Cuts a log line to [`MAX_LOG_LINE`] bytes on a character boundary,
/// ending it with a marker that says how long it was (`…[cut: 1048576
/// bytes]`), so a cut line is never taken for a whole one.
pub fn cap_log_line(line: &mut String) {
    if line.len() <= MAX_LOG_LINE {
        return;
    }
    let marker = format!("…[cut: {} bytes]", line.len());
    truncate_on_char(line, MAX_LOG_LINE - marker.len());
    line.push_str(&marker);
}

/// `POST /agent/v1/report`: a deployment's progress and log lines.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Report {
    pub deployment_id: String,
    /// New state reached by the deployment on this node, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Which instance the state is about (1-based).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance: Option<u32>,
    /// `host:port` where the instance answers, once it runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    /// The full commit id the agent checked out (40 or 64 hex digits).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commit: Option<String>,
    /// A running instance's readiness probe changed its verdict: `false`
    /// takes it out of the ingress's upstreams (with `message`, why),
    /// `true` brings it back. Sent with no `state`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready: Option<bool>,
    /// A running instance's container started or stopped crash-looping
    /// (agents with [`crate::features::PROBE_CHECKS`]). Sent with no
    /// `state`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub crash_loop: Option<crate::probes::CrashLoop>,
    /// A running instance's liveness probe cannot run as set (its command
    /// is not in the container, say): why; an empty text once it runs
    /// again. Such a probe restarts nothing. Sent with no `state`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe_problem: Option<String>,
    #[serde(default)]
    pub logs: Vec<LogLine>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogLine {
    /// RFC 3339, UTC.
    pub ts: String,
    /// `build`, `stdout`, `stderr` or `agent`.
    pub stream: String,
    pub line: String,
}

impl Report {
    /// A report about `deployment_id` with nothing in it yet.
    pub fn new(deployment_id: impl Into<String>) -> Report {
        Report {
            deployment_id: deployment_id.into(),
            state: None,
            message: None,
            image: None,
            instance: None,
            address: None,
            commit: None,
            ready: None,
            crash_loop: None,
            probe_problem: None,
            logs: Vec::new(),
        }
    }

    /// Makes the free-text parts valid: the message one line of at most
    /// [`MAX_REPORT_MESSAGE`] bytes, each log line at most [`MAX_LOG_LINE`]
    /// bytes. Both sides run it, so a state change is never refused for
    /// the wording of its message.
    pub fn sanitize(&mut self) {
        if let Some(message) = &mut self.message {
            *message = one_line(message, MAX_REPORT_MESSAGE);
        }
        if let Some(problem) = &mut self.probe_problem {
            *problem = one_line(problem, MAX_REPORT_MESSAGE);
        }
        if let Some(crash_loop) = &mut self.crash_loop {
            if let Some(reason) = &mut crash_loop.reason {
                *reason = one_line(reason, 512);
            }
            let skip = crash_loop
                .last_lines
                .len()
                .saturating_sub(crate::probes::CRASH_LOOP_LINES);
            crash_loop.last_lines.drain(..skip);
            for line in &mut crash_loop.last_lines {
                truncate_on_char(line, crate::probes::CRASH_LOOP_LINE);
            }
        }
        for line in &mut self.logs {
            cap_log_line(&mut line.line);
        }
    }

    pub fn validate(&self) -> Result<(), ValidationError> {
        validate::token("deployment_id", &self.deployment_id, 64)?;
        if let Some(state) = &self.state {
            validate::token("state", state, 32)?;
        }
        if let Some(message) = &self.message {
            validate::bounded_text("message", message, MAX_REPORT_MESSAGE)?;
        }
        if let Some(image) = &self.image {
            validate::bounded_text("image", image, 512)?;
        }
        if let Some(instance) = self.instance {
            if instance == 0 || instance > 100 {
                return Err(ValidationError::new("instance", "must be 1 to 100"));
            }
        }
        if let Some(address) = &self.address {
            validate::endpoint("address", address)?;
        }
        if let Some(commit) = &self.commit {
            crate::deploy::full_commit(commit)?;
        }
        if let Some(problem) = &self.probe_problem {
            validate::bounded_text("probe_problem", problem, MAX_REPORT_MESSAGE)?;
        }
        if let Some(crash_loop) = &self.crash_loop {
            crash_loop.validate()?;
        }
        if self.logs.len() > MAX_REPORT_LINES {
            return Err(ValidationError::new("logs", "more than 1000 lines"));
        }
        for line in &self.logs {
            validate::bounded_text("logs.ts", &line.ts, 64)?;
            validate::token("logs.stream", &line.stream, 16)?;
            if line.line.len() > MAX_LOG_LINE {
                return Err(ValidationError::new("logs.line", "longer than 16 KiB"));
            }
        }
        Ok(())
    }
}

/// `GET /agent/v1/routes`: what every ingress node should serve.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema))]
pub struct RouteTable {
    /// Grows on every change; an agent reloads its proxy only when it moves.
    pub version: u64,
    pub routes: Vec<Route>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema))]
pub struct Route {
    pub host: String,
    /// `address:port` of healthy instances.
    pub upstreams: Vec<String>,
}

/// `GET /agent/v1/registry`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegistryConfig {
    pub configured: bool,
    /// `host:port` to push to and pull from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    /// CA certificate (PEM) the registry's TLS certificate chains to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password: Option<String>,
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_long_log_line_is_cut_with_a_marker() {
        let mut line = "é".repeat(MAX_LOG_LINE);
        super::cap_log_line(&mut line);
        assert!(line.len() <= MAX_LOG_LINE);
        assert!(line.ends_with(&format!("…[cut: {} bytes]", 2 * MAX_LOG_LINE)), "{}", &line[line.len() - 40..]);
        let mut short = "short".to_string();
        super::cap_log_line(&mut short);
        assert_eq!(short, "short");
    }

    use super::*;

    #[test]
    fn multi_line_messages_become_one_valid_line() {
        let git = "git clone failed: warning: Could not find remote branch mian to clone.\nfatal: Remote branch mian not found in upstream origin\n";
        let mut report = Report::new("dep_1");
        report.state = Some("failed".into());
        report.message = Some(git.into());
        assert!(report.validate().is_err(), "a raw multi-line message is invalid");
        report.sanitize();
        report.validate().unwrap();
        assert_eq!(
            report.message.as_deref(),
            Some("git clone failed: warning: Could not find remote branch mian to clone. fatal: Remote branch mian not found in upstream origin")
        );
        assert_eq!(one_line("a\r\n\t\u{1b}[31mb", 100), "a [31mb");
    }

    #[test]
    fn truncate_on_char_never_splits_a_character() {
        // "aé": 'a' is one byte, 'é' two, so a cut at 2 falls inside 'é'.
        let mut text = String::from("aé");
        truncate_on_char(&mut text, 2);
        assert_eq!(text, "a");
        let mut text = "é".repeat(300);
        truncate_on_char(&mut text, 200);
        assert_eq!(text, "é".repeat(100));
        let mut text = "x".to_string() + &"é".repeat(300);
        truncate_on_char(&mut text, 200);
        assert_eq!(text.len(), 199, "backs off one byte to the boundary");
        // Four-byte characters and a limit inside the first one.
        let mut text = "🦀🦀".to_string();
        truncate_on_char(&mut text, 3);
        assert_eq!(text, "");
        let mut short = String::from("ok");
        truncate_on_char(&mut short, 200);
        assert_eq!(short, "ok", "shorter texts are left alone");
    }

    #[test]
    fn long_messages_are_cut_on_a_character_boundary() {
        let long = "é".repeat(5000);
        let cut = one_line(&long, MAX_REPORT_MESSAGE);
        assert!(cut.len() <= MAX_REPORT_MESSAGE && cut.ends_with('…'));
        let mut line = "ü".repeat(MAX_LOG_LINE);
        cap_log_line(&mut line);
        assert!(line.len() <= MAX_LOG_LINE);
    }

    #[test]
    fn commits_are_full_ids() {
        let mut report = Report::new("dep_1");
        report.commit = Some("9fceb02".into());
        assert!(report.validate().is_err(), "an abbreviation is not what was built");
        report.commit = Some("9fceb02d0ae598e95dc970b74767f19372d61af8".into());
        report.validate().unwrap();
    }
}
