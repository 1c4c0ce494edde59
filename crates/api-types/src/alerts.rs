//! `GET /api/alerts`: what the control plane alerts on (issue 26).

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// One alert: a condition, open while it holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct AlertView {
    pub id: String,
    /// One of `ALERT_KINDS` (or `test`).
    pub kind: String,
    /// What it is about: an app, `<app>#<instance>`, or a node id.
    pub subject: String,
    /// `critical` or `warning`.
    pub severity: String,
    pub summary: String,
    /// More text when there is some (a crash loop's last output lines).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    pub opened_at: String,
    /// The last time the condition was seen to hold.
    pub last_seen_at: String,
    /// Absent while the alert is open.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resolved_at: Option<String>,
    /// How many times the condition was seen while this alert was open.
    pub occurrences: u64,
}

/// `GET /api/alerts`: newest first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct AlertList {
    pub alerts: Vec<AlertView>,
    /// How many are open.
    pub open: u64,
}

/// The alert kinds a channel may want.
pub const ALERT_KINDS: &[&str] = &["deploy_failed", "deploy_succeeded", "crash_loop", "node_unreachable", "node_degraded", "disk_full", "certificate", "backup_failed", "job_failed"];

/// What a new channel wants when it does not say: every kind but
/// `deploy_succeeded` (a notice, not a problem).
pub const DEFAULT_ALERT_KINDS: &[&str] = &["deploy_failed", "crash_loop", "node_unreachable", "node_degraded", "disk_full", "certificate", "backup_failed", "job_failed"];

/// What a channel sends: one alert opening or resolving, or a test.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct AlertMessage {
    /// `opened`, `resolved` or `test`.
    pub event: String,
    pub alert: AlertView,
}

/// How an email channel reaches its SMTP server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum SmtpTls {
    /// Plain SMTP, then STARTTLS, which must succeed (port 587).
    #[default]
    Starttls,
    /// TLS from the first byte (port 465).
    Tls,
    /// No TLS at all (a relay on the same host or network only).
    None,
}

/// An SMTP server.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SmtpServer {
    pub host: String,
    /// 587 for STARTTLS, 465 for TLS, 25 for none, unless given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    #[serde(default)]
    pub tls: SmtpTls,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
    /// Sealed when stored; never shown again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password: Option<String>,
}

/// Where a channel sends.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)]
pub enum ChannelTarget {
    /// A JSON [`AlertMessage`] POSTed to `url`, signed: `X-Cloudweb-Timestamp`
    /// (unix seconds) and `X-Cloudweb-Signature: sha256=<hex HMAC-SHA256
    /// of "<timestamp>.<body>" with secret>`.
    Webhook { url: String, secret: String },
    /// A Slack-compatible incoming webhook (Slack, Mattermost, Rocket.Chat,
    /// Discord's `/slack` endpoint): `{"text": …}` POSTed to `url`.
    Slack { url: String },
    /// An email to each of `to`, from `from`.
    Email { smtp: SmtpServer, from: String, to: Vec<String> },
}

/// `POST /api/alerts/channels`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewAlertChannel {
    /// 1 to 63 of `a-z 0-9 -`, unique per owner.
    pub name: String,
    /// `true`: the caller's own channel, which only they see; otherwise
    /// the cluster's.
    #[serde(default)]
    pub personal: bool,
    /// Alert kinds to send (see `ALERT_KINDS`); every kind but
    /// `deploy_succeeded` when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub events: Option<Vec<String>>,
    pub target: ChannelTarget,
}

/// One try of a delivery.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct DeliveryAttemptView {
    pub attempt: u32,
    pub at: String,
    pub duration_ms: u64,
    pub ok: bool,
    /// The answer (`HTTP 204`, the SMTP reply) or the error.
    pub outcome: String,
}

/// One message to one channel.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct DeliveryView {
    pub id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alert_id: Option<String>,
    /// `opened`, `resolved` or `test`.
    pub event: String,
    pub summary: String,
    /// `pending` (queued or retrying), `delivered`, or `failed` (given up
    /// after 24 hours).
    pub state: String,
    pub attempts: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_attempt_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    pub created_at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attempt_log: Vec<DeliveryAttemptView>,
}

/// A channel as shown: never its URL's path, secret or password.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ChannelView {
    pub id: String,
    pub name: String,
    /// `cluster` or `personal`.
    pub scope: String,
    /// The owner's user name, for a personal channel.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// `webhook`, `slack` or `email`.
    pub kind: String,
    /// Where it sends, without secrets: a URL's scheme and host, or the
    /// addresses and SMTP server.
    pub target: String,
    pub events: Vec<String>,
    pub created_at: String,
    /// The newest delivery's state, if any: `pending`, `delivered` or
    /// `failed`; with `failing`, whether the newest attempt failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_state: Option<String>,
    pub failing: bool,
}

/// `GET /api/alerts/channels`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ChannelList {
    pub channels: Vec<ChannelView>,
}

/// `GET /api/alerts/channels/{id}`: the channel and its newest deliveries
/// with every attempt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ChannelDetail {
    pub channel: ChannelView,
    pub deliveries: Vec<DeliveryView>,
}
