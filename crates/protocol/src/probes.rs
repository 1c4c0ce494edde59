//! The probes an agent runs on an app's running instances after their
//! deploy health check: liveness (restart one that stops answering) and
//! readiness (keep one out of the upstreams while it fails). Both ask the
//! app's health path over HTTP; they travel in the deploy payload.

use serde::{Deserialize, Serialize};

use crate::validate::ValidationError;

/// A liveness probe the agent runs on an instance once it passed its
/// health check: the health path over HTTP every `interval_seconds`;
/// `failure_threshold` failures in a row (no answer below 500 within
/// `timeout_seconds`) restart the container, with a back-off between
/// restarts that doubles from [`LIVENESS_BACKOFF_MIN_SECONDS`] up to
/// [`LIVENESS_BACKOFF_MAX_SECONDS`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct Liveness {
    /// 1 to 3600.
    pub interval_seconds: u32,
    /// 1 to 60, at most the interval.
    pub timeout_seconds: u32,
    /// 1 to 100.
    pub failure_threshold: u32,
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
        Ok(())
    }

    /// The pause before the restart after `restarts` earlier ones.
    pub fn backoff(restarts: u32) -> std::time::Duration {
        let seconds = LIVENESS_BACKOFF_MIN_SECONDS.saturating_mul(1u64 << restarts.min(16));
        std::time::Duration::from_secs(seconds.min(LIVENESS_BACKOFF_MAX_SECONDS))
    }
}

/// A readiness probe the agent runs on an instance once it passed its
/// health check: the health path over HTTP every `interval_seconds`. An
/// answer of 200 to 399 within `timeout_seconds` passes; anything else
/// (a 503 "not ready", a 404, no answer) fails. `failure_threshold`
/// failures in a row take the instance out of the ingress's upstreams;
/// `success_threshold` passes in a row bring it back. The agent reports
/// the changes only ([`crate::Report::ready`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
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
        Ok(())
    }

    /// Whether a readiness probe's status passes.
    pub fn passes(status: u16) -> bool {
        (200..400).contains(&status)
    }
}

/// Whether a health probe's status means "up": any answer below 500 shows
/// the app is serving (a 404 on `/` is still a live server).
pub fn healthy_status(status: u16) -> bool {
    (200..500).contains(&status)
}
