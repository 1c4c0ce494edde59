//! What the audit log keeps and what a failed write does: settings, a
//! leaf (the log itself is `access::audit`).

use std::time::Duration;

/// What a change does when its audit log entry cannot be written (see
/// `access::audit`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnFailure {
    /// The request is refused with 503.
    Refuse,
    /// The request goes ahead; the failure is logged.
    Warn,
}

impl OnFailure {
    pub fn parse(text: &str) -> Option<OnFailure> {
        match text {
            "refuse" => Some(OnFailure::Refuse),
            "warn" => Some(OnFailure::Warn),
            _ => None,
        }
    }
}

#[derive(Debug, Clone)]
pub struct AuditSettings {
    /// Entries older than this are deleted (the chain's anchor moves).
    pub retention: Duration,
    pub on_failure: OnFailure,
}

impl Default for AuditSettings {
    fn default() -> Self {
        AuditSettings { retention: Duration::from_secs(365 * 24 * 3600), on_failure: OnFailure::Refuse }
    }
}

