//! The probes an agent runs on an app's running instances after their
//! deploy health check: liveness (restart one that stops answering) and
//! readiness (keep one out of the upstreams while it fails). Each asks the
//! app's health path over HTTP unless it names another check
//! ([`ProbeCheck`]: another HTTP path or status, a TCP port, a command in
//! the container); they travel in the deploy payload.

use serde::{Deserialize, Serialize};

use crate::validate::ValidationError;

/// What a probe asks. Absent from a probe, the probe asks the app's
/// health path over HTTP.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema))]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum ProbeCheck {
    /// `GET path` on the app's port. Without `status`, a liveness probe
    /// passes on any answer below 500 and a readiness probe on 200 to 399;
    /// with it, only that status passes.
    Http {
        /// Starts with `/`, at most 256 bytes.
        path: String,
        /// 100 to 599.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        status: Option<u16>,
    },
    /// A TCP connection to this port of the container is accepted.
    Tcp {
        /// 1 to 65535.
        port: u16,
    },
    /// The command, run in the container (`docker exec`, no shell unless
    /// it names one), exits 0 within the timeout.
    Exec {
        /// 1 to 32 arguments, each 1 to 1024 bytes, no NUL.
        command: Vec<String>,
    },
}

/// Most arguments of an exec probe's command, and bytes of each.
pub const MAX_PROBE_ARGS: usize = 32;
pub const MAX_PROBE_ARG: usize = 1024;
/// The longest initial grace period.
pub const MAX_GRACE_SECONDS: u32 = 3600;

impl ProbeCheck {
    pub fn validate(&self, field: &str) -> Result<(), ValidationError> {
        match self {
            ProbeCheck::Http { path, status } => {
                if !path.starts_with('/')
                    || path.len() > 256
                    || path.chars().any(|c| c.is_control() || c.is_whitespace())
                {
                    return Err(ValidationError::new(
                        format!("{field}.path"),
                        "must start with '/', at most 256 bytes, no spaces or control characters",
                    ));
                }
                if status.is_some_and(|s| !(100..=599).contains(&s)) {
                    return Err(ValidationError::new(
                        format!("{field}.status"),
                        "must be 100 to 599",
                    ));
                }
            }
            ProbeCheck::Tcp { port } => {
                if *port == 0 {
                    return Err(ValidationError::new(
                        format!("{field}.port"),
                        "must be 1 to 65535",
                    ));
                }
            }
            ProbeCheck::Exec { command } => {
                if command.is_empty() || command.len() > MAX_PROBE_ARGS {
                    return Err(ValidationError::new(
                        format!("{field}.command"),
                        format!("must have 1 to {MAX_PROBE_ARGS} arguments"),
                    ));
                }
                if command
                    .iter()
                    .any(|a| a.is_empty() || a.len() > MAX_PROBE_ARG || a.contains('\0'))
                {
                    return Err(ValidationError::new(
                        format!("{field}.command"),
                        format!("each argument must be 1 to {MAX_PROBE_ARG} bytes, without NUL"),
                    ));
                }
            }
        }
        Ok(())
    }

    /// Whether an HTTP answer passes: `status` exactly when the check
    /// names one, else `default`'s judgement.
    pub fn http_passes(&self, answer: u16, default: fn(u16) -> bool) -> bool {
        match self {
            ProbeCheck::Http {
                status: Some(status),
                ..
            } => answer == *status,
            _ => default(answer),
        }
    }

    /// A short description for logs and the dashboard.
    pub fn describe(&self) -> String {
        match self {
            ProbeCheck::Http {
                path,
                status: Some(status),
            } => format!("GET {path} → {status}"),
            ProbeCheck::Http { path, status: None } => format!("GET {path}"),
            ProbeCheck::Tcp { port } => format!("TCP port {port}"),
            ProbeCheck::Exec { command } => {
                format!("exec {}", command.first().map(String::as_str).unwrap_or(""))
            }
        }
    }
}

fn grace(field: &str, seconds: u32) -> Result<(), ValidationError> {
    if seconds > MAX_GRACE_SECONDS {
        return Err(ValidationError::new(
            format!("{field}.grace_seconds"),
            format!("must be 0 to {MAX_GRACE_SECONDS}"),
        ));
    }
    Ok(())
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// A liveness probe the agent runs on an instance once it passed its
/// health check: its check (the health path over HTTP by default) every
/// `interval_seconds`; `failure_threshold` failures in a row (no passing
/// answer within `timeout_seconds`) restart the container, with a
/// back-off between restarts that doubles from
/// [`LIVENESS_BACKOFF_MIN_SECONDS`] up to [`LIVENESS_BACKOFF_MAX_SECONDS`].
/// For `grace_seconds` after the container (re)started no probe runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct Liveness {
    /// 1 to 3600.
    pub interval_seconds: u32,
    /// 1 to 60, at most the interval.
    pub timeout_seconds: u32,
    /// 1 to 100.
    pub failure_threshold: u32,
    /// What to ask; absent: the health path over HTTP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub check: Option<ProbeCheck>,
    /// 0 to 3600: no probe this long after the container (re)started.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub grace_seconds: u32,
}

pub const LIVENESS_BACKOFF_MIN_SECONDS: u64 = 10;
pub const LIVENESS_BACKOFF_MAX_SECONDS: u64 = 300;

impl Liveness {
    pub fn validate(&self) -> Result<(), ValidationError> {
        if !(1..=3600).contains(&self.interval_seconds) {
            return Err(ValidationError::new("liveness.interval_seconds", "must be 1 to 3600"));
        }
        if !(1..=60).contains(&self.timeout_seconds) || self.timeout_seconds > self.interval_seconds {
            return Err(ValidationError::new("liveness.timeout_seconds", "must be 1 to 60, and at most interval_seconds"));
        }
        if !(1..=100).contains(&self.failure_threshold) {
            return Err(ValidationError::new("liveness.failure_threshold", "must be 1 to 100"));
        }
        if let Some(check) = &self.check {
            check.validate("liveness.check")?;
        }
        grace("liveness", self.grace_seconds)
    }

    /// Whether it needs an agent with [`crate::features::PROBE_CHECKS`].
    pub fn needs_probe_checks(&self) -> bool {
        self.check.is_some() || self.grace_seconds > 0
    }

    /// The pause before the restart after `restarts` earlier ones.
    pub fn backoff(restarts: u32) -> std::time::Duration {
        let seconds = LIVENESS_BACKOFF_MIN_SECONDS.saturating_mul(1u64 << restarts.min(16));
        std::time::Duration::from_secs(seconds.min(LIVENESS_BACKOFF_MAX_SECONDS))
    }
}

/// A readiness probe the agent runs on an instance once it passed its
/// health check: its check (the health path over HTTP by default) every
/// `interval_seconds`. An answer of 200 to 399 within `timeout_seconds`
/// passes; anything else (a 503 "not ready", a 404, no answer) fails.
/// `failure_threshold` failures in a row take the instance out of the
/// ingress's upstreams; `success_threshold` passes in a row bring it back.
/// For `grace_seconds` after the container (re)started no probe runs (it
/// keeps its earlier verdict). The agent reports the changes only
/// ([`crate::Report::ready`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct Readiness {
    /// 1 to 3600.
    pub interval_seconds: u32,
    /// 1 to 60, at most the interval.
    pub timeout_seconds: u32,
    /// 1 to 100.
    pub failure_threshold: u32,
    /// 1 to 100.
    pub success_threshold: u32,
    /// What to ask; absent: the health path over HTTP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub check: Option<ProbeCheck>,
    /// 0 to 3600: no probe this long after the container (re)started.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub grace_seconds: u32,
}

impl Readiness {
    pub fn validate(&self) -> Result<(), ValidationError> {
        if !(1..=3600).contains(&self.interval_seconds) {
            return Err(ValidationError::new("readiness.interval_seconds", "must be 1 to 3600"));
        }
        if !(1..=60).contains(&self.timeout_seconds) || self.timeout_seconds > self.interval_seconds {
            return Err(ValidationError::new("readiness.timeout_seconds", "must be 1 to 60, and at most interval_seconds"));
        }
        if !(1..=100).contains(&self.failure_threshold) {
            return Err(ValidationError::new("readiness.failure_threshold", "must be 1 to 100"));
        }
        if !(1..=100).contains(&self.success_threshold) {
            return Err(ValidationError::new("readiness.success_threshold", "must be 1 to 100"));
        }
        if let Some(check) = &self.check {
            check.validate("readiness.check")?;
        }
        grace("readiness", self.grace_seconds)
    }

    /// Whether it needs an agent with [`crate::features::PROBE_CHECKS`].
    pub fn needs_probe_checks(&self) -> bool {
        self.check.is_some() || self.grace_seconds > 0
    }

    /// Whether a readiness probe's status passes.
    pub fn passes(status: u16) -> bool {
        (200..400).contains(&status)
    }
}

/// A container that keeps stopping: restarted (by Docker after it exited,
/// or by its liveness probe) [`CRASH_LOOP_RESTARTS`] times within
/// [`CRASH_LOOP_WINDOW_SECONDS`]. `looping: false` says it ran the
/// window through since its last restart.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct CrashLoop {
    pub looping: bool,
    /// Its restarts within the window.
    pub restarts: u32,
    /// The exit code of its last run, when it exited on its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i64>,
    /// Why it was restarted last: a failed liveness probe's reason, or
    /// "exited with code N".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Its last output lines before the restart (at most
    /// [`CRASH_LOOP_LINES`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub last_lines: Vec<String>,
}

pub const CRASH_LOOP_RESTARTS: usize = 3;
pub const CRASH_LOOP_WINDOW_SECONDS: u64 = 600;
pub const CRASH_LOOP_LINES: usize = 20;
pub const CRASH_LOOP_LINE: usize = 1024;

impl CrashLoop {
    pub fn validate(&self) -> Result<(), ValidationError> {
        if let Some(reason) = &self.reason {
            crate::validate::bounded_text("crash_loop.reason", reason, 512)?;
        }
        if self.last_lines.len() > CRASH_LOOP_LINES
            || self.last_lines.iter().any(|l| l.len() > CRASH_LOOP_LINE)
        {
            return Err(ValidationError::new(
                "crash_loop.last_lines",
                format!("at most {CRASH_LOOP_LINES} lines of at most {CRASH_LOOP_LINE} bytes"),
            ));
        }
        Ok(())
    }
}

/// Whether a health probe's status means "up": any answer below 500 shows
/// the app is serving (a 404 on `/` is still a live server).
pub fn healthy_status(status: u16) -> bool {
    (200..500).contains(&status)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn liveness() -> Liveness {
        Liveness {
            interval_seconds: 5,
            timeout_seconds: 2,
            failure_threshold: 3,
            check: None,
            grace_seconds: 0,
        }
    }

    #[test]
    fn checks_are_validated() {
        let mut probe = liveness();
        assert!(probe.validate().is_ok());
        assert!(!probe.needs_probe_checks());
        for (check, field) in [
            (
                ProbeCheck::Http {
                    path: "healthz".into(),
                    status: None,
                },
                "liveness.check.path",
            ),
            (
                ProbeCheck::Http {
                    path: "/a b".into(),
                    status: None,
                },
                "liveness.check.path",
            ),
            (
                ProbeCheck::Http {
                    path: "/".into(),
                    status: Some(99),
                },
                "liveness.check.status",
            ),
            (ProbeCheck::Tcp { port: 0 }, "liveness.check.port"),
            (
                ProbeCheck::Exec { command: vec![] },
                "liveness.check.command",
            ),
            (
                ProbeCheck::Exec {
                    command: vec!["a\0".into()],
                },
                "liveness.check.command",
            ),
            (
                ProbeCheck::Exec {
                    command: vec!["x".into(); 33],
                },
                "liveness.check.command",
            ),
        ] {
            probe.check = Some(check);
            assert_eq!(probe.validate().unwrap_err().field, field);
        }
        probe.check = Some(ProbeCheck::Exec {
            command: vec!["pg_isready".into(), "-q".into()],
        });
        assert!(probe.validate().is_ok());
        assert!(probe.needs_probe_checks());
        probe.grace_seconds = 3601;
        assert_eq!(
            probe.validate().unwrap_err().field,
            "liveness.grace_seconds"
        );
    }

    #[test]
    fn the_wire_shape_without_a_check_is_unchanged() {
        assert_eq!(
            serde_json::to_value(liveness()).unwrap(),
            serde_json::json!({"interval_seconds": 5, "timeout_seconds": 2, "failure_threshold": 3})
        );
        let tcp: Liveness = serde_json::from_str(r#"{"interval_seconds":5,"timeout_seconds":2,"failure_threshold":3,"check":{"kind":"tcp","port":5432},"grace_seconds":30}"#).unwrap();
        assert_eq!(tcp.check, Some(ProbeCheck::Tcp { port: 5432 }));
        assert!(serde_json::from_str::<Liveness>(r#"{"interval_seconds":5,"timeout_seconds":2,"failure_threshold":3,"check":{"kind":"udp","port":1}}"#).is_err());
    }

    #[test]
    fn an_http_status_named_is_the_only_one_that_passes() {
        let check = ProbeCheck::Http {
            path: "/".into(),
            status: Some(204),
        };
        assert!(check.http_passes(204, Readiness::passes));
        assert!(!check.http_passes(200, Readiness::passes));
        let plain = ProbeCheck::Http {
            path: "/".into(),
            status: None,
        };
        assert!(plain.http_passes(302, Readiness::passes));
        assert!(!plain.http_passes(404, Readiness::passes));
        assert!(plain.http_passes(404, healthy_status));
    }
}
