//! Alert channels: where alerts go (issue 26). A channel is the cluster's
//! (seen by everyone, sent every alert it wants) or one person's own (seen
//! only by them and the admin token). Its whole configuration (a URL with
//! its token, the signing secret, the SMTP password) is sealed with the
//! cluster's key; what is shown of it (`target`) holds no secret.

use cloudweb_api_types::alerts::{
    AlertMessage, AlertView, ChannelDetail, ChannelTarget, ChannelView, DeliveryAttemptView, DeliveryView, NewAlertChannel, SmtpTls, ALERT_KINDS,
    DEFAULT_ALERT_KINDS,
};
use cloudweb_store::alert_delivery::{ChannelRow, DeliveryRow};

use crate::auth::Principal;
use crate::clock::rfc3339_ms;
use crate::error::ApiError;
use crate::AppState;

/// Deliveries a channel page shows.
const DELIVERIES_SHOWN: i64 = 50;
/// Channels one owner may have.
const MAX_CHANNELS_PER_OWNER: usize = 20;
/// Recipients one email channel may have.
const MAX_RECIPIENTS: usize = 20;

fn new_id(prefix: &str) -> String {
    let bytes: [u8; 8] = rand::random();
    format!("{prefix}_{}", hex::encode(bytes))
}

/// Checks a webhook URL: `https` (plain `http` only with
/// `--allow-private-alert-targets`), a host, no credentials; returns what
/// may be shown of it (scheme, host, port).
fn check_url(url: &str, allow_private: bool) -> Result<String, String> {
    if url.len() > 2048 {
        return Err("url: at most 2048 characters".into());
    }
    let parsed = url::Url::parse(url.trim()).map_err(|e| format!("url: not a URL ({e})"))?;
    match parsed.scheme() {
        "https" => {}
        "http" if allow_private => {}
        "http" => return Err("url: must be https (plain http only with --allow-private-alert-targets)".into()),
        other => return Err(format!("url: must be https, not {other}")),
    }
    let Some(host) = parsed.host_str() else {
        return Err("url: has no host".into());
    };
    if !parsed.username().is_empty() || parsed.password().is_some() {
        return Err("url: must not hold a user name or password".into());
    }
    if let Ok(ip) = host.trim_matches(['[', ']']).parse::<std::net::IpAddr>() {
        if let Some(why) = cloudweb_protocol::deploy::refused_git_address(ip, allow_private) {
            return Err(format!("url: {host} is {why}"));
        }
    } else if host.eq_ignore_ascii_case("localhost") && !allow_private {
        return Err("url: localhost is a loopback address (allowed only with --allow-private-alert-targets)".into());
    }
    Ok(match parsed.port() {
        Some(port) => format!("{}://{host}:{port}", parsed.scheme()),
        None => format!("{}://{host}", parsed.scheme()),
    })
}

fn check_address(field: &str, address: &str) -> Result<(), String> {
    address.parse::<lettre::message::Mailbox>().map(|_| ()).map_err(|e| format!("{field}: {address:?} is not an email address ({e})"))
}

/// Checks a channel's target; returns what may be shown of it.
pub fn check_target(target: &ChannelTarget, allow_private: bool) -> Result<String, String> {
    match target {
        ChannelTarget::Webhook { url, secret } => {
            let shown = check_url(url, allow_private)?;
            if secret.len() < 16 || secret.len() > 256 {
                return Err("secret: 16 to 256 characters (the HMAC-SHA256 key receivers check signatures with)".into());
            }
            Ok(shown)
        }
        ChannelTarget::Slack { url } => check_url(url, allow_private),
        ChannelTarget::Email { smtp, from, to } => {
            let host = smtp.host.trim();
            if host.is_empty() || host.len() > 253 || !host.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | ':' | '[' | ']')) {
                return Err(format!("smtp.host: {host:?} is not a host name or address"));
            }
            if let Ok(ip) = host.trim_matches(['[', ']']).parse::<std::net::IpAddr>() {
                if let Some(why) = cloudweb_protocol::deploy::refused_git_address(ip, allow_private) {
                    return Err(format!("smtp.host: {host} is {why}"));
                }
            }
            if smtp.port == Some(0) {
                return Err("smtp.port: 1 to 65535".into());
            }
            if smtp.password.is_some() != smtp.username.is_some() {
                return Err("smtp: username and password go together".into());
            }
            if smtp.tls == SmtpTls::None && smtp.password.is_some() {
                return Err("smtp: a password is not sent without TLS (tls: starttls or tls)".into());
            }
            if smtp.username.as_deref().is_some_and(|u| u.is_empty() || u.len() > 256) || smtp.password.as_deref().is_some_and(|p| p.len() > 256) {
                return Err("smtp: username and password are 1 to 256 characters".into());
            }
            check_address("from", from)?;
            if to.is_empty() || to.len() > MAX_RECIPIENTS {
                return Err(format!("to: 1 to {MAX_RECIPIENTS} addresses"));
            }
            for address in to {
                check_address("to", address)?;
            }
            let port = smtp.port.unwrap_or(super::send::default_smtp_port(smtp.tls));
            Ok(format!("{} via {host}:{port} ({})", to.join(", "), tls_name(smtp.tls)))
        }
    }
}

fn tls_name(tls: SmtpTls) -> &'static str {
    match tls {
        SmtpTls::Starttls => "STARTTLS",
        SmtpTls::Tls => "TLS",
        SmtpTls::None => "no TLS",
    }
}

fn kind_name(target: &ChannelTarget) -> &'static str {
    match target {
        ChannelTarget::Webhook { .. } => "webhook",
        ChannelTarget::Slack { .. } => "slack",
        ChannelTarget::Email { .. } => "email",
    }
}

/// Checks a channel name: 1 to 63 of `a-z 0-9 -`, starting with a letter.
fn check_name(name: &str) -> Result<(), String> {
    let ok = (1..=63).contains(&name.len())
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    if ok {
        Ok(())
    } else {
        Err(format!("name: {name:?} must be 1 to 63 of a-z, 0-9 and -, starting with a letter"))
    }
}

fn check_events(events: Option<&[String]>) -> Result<Vec<String>, String> {
    let Some(events) = events else {
        return Ok(DEFAULT_ALERT_KINDS.iter().map(|k| k.to_string()).collect());
    };
    if events.is_empty() {
        return Err("events: at least one (or leave it out for every kind but deploy_succeeded)".into());
    }
    let mut wanted: Vec<String> = Vec::new();
    for event in events {
        if !ALERT_KINDS.contains(&event.as_str()) {
            return Err(format!("events: unknown kind {event:?} (one of {})", ALERT_KINDS.join(", ")));
        }
        if !wanted.contains(event) {
            wanted.push(event.clone());
        }
    }
    Ok(wanted)
}

/// Whether `principal` sees (and may change) `channel`.
pub fn visible_to(channel: &ChannelRow, principal: &Principal) -> bool {
    match principal {
        Principal::Admin => true,
        Principal::Deploy { .. } => false,
        Principal::User { user, .. } => channel.owner.is_empty() || channel.owner == user.id,
    }
}

/// Adds a channel.
pub async fn create(state: &AppState, principal: &Principal, request: NewAlertChannel) -> Result<ChannelView, ApiError> {
    check_name(&request.name).map_err(ApiError::BadRequest)?;
    let events = check_events(request.events.as_deref()).map_err(ApiError::BadRequest)?;
    let target = check_target(&request.target, state.config.allow_private_alert_targets).map_err(ApiError::BadRequest)?;
    let owner = match (request.personal, principal.user()) {
        (false, _) => String::new(),
        (true, Some(user)) => user.id.clone(),
        (true, None) => return Err(ApiError::BadRequest("personal: the admin token has no user to own a channel; log in as a user".into())),
    };
    let existing = state.store.alert_channels().await?;
    if existing.iter().filter(|c| c.owner == owner).count() >= MAX_CHANNELS_PER_OWNER {
        return Err(ApiError::Conflict(format!("at most {MAX_CHANNELS_PER_OWNER} channels per owner; delete one first")));
    }
    let id = new_id("ach");
    let row = ChannelRow {
        config_sealed: state.sealer.seal_json(&super::delivery::seal_context(&id), &request.target),
        id,
        owner,
        name: request.name.clone(),
        kind: kind_name(&request.target).to_string(),
        target,
        events: serde_json::to_string(&events).expect("a list of strings"),
        created_at: state.clock.now_ms(),
    };
    if !state.store.insert_alert_channel(&row).await? {
        return Err(ApiError::Conflict(format!("a channel named {} already exists", request.name)));
    }
    tracing::info!(channel = %row.id, name = %row.name, kind = %row.kind, "alert channel added");
    view(state, &row).await
}

/// The channel `id` if `principal` sees it, else 404.
pub async fn find(state: &AppState, principal: &Principal, id: &str) -> Result<ChannelRow, ApiError> {
    match state.store.alert_channel(id).await? {
        Some(row) if visible_to(&row, principal) => Ok(row),
        _ => Err(ApiError::NotFound(format!("no alert channel {id}"))),
    }
}

/// The channels `principal` sees.
pub async fn list(state: &AppState, principal: &Principal) -> Result<Vec<ChannelView>, ApiError> {
    let mut views = Vec::new();
    for row in state.store.alert_channels().await? {
        if visible_to(&row, principal) {
            views.push(view(state, &row).await?);
        }
    }
    Ok(views)
}

/// A channel with its newest deliveries and their attempts.
pub async fn detail(state: &AppState, principal: &Principal, id: &str) -> Result<ChannelDetail, ApiError> {
    let row = find(state, principal, id).await?;
    let mut deliveries = Vec::new();
    for delivery in state.store.alert_deliveries_of(&row.id, DELIVERIES_SHOWN).await? {
        let attempts = state.store.alert_attempts(&delivery.id).await?;
        deliveries.push(delivery_view(&delivery, attempts));
    }
    Ok(ChannelDetail { channel: view(state, &row).await?, deliveries })
}

/// Deletes a channel, its queue and its history.
pub async fn delete(state: &AppState, principal: &Principal, id: &str) -> Result<(), ApiError> {
    let row = find(state, principal, id).await?;
    state.store.delete_alert_channel(&row.id).await?;
    tracing::info!(channel = %row.id, name = %row.name, "alert channel deleted");
    Ok(())
}

/// Queues a test message to a channel; the deliverer sends it within a
/// second or two, and its attempts show like any other delivery's.
pub async fn send_test(state: &AppState, principal: &Principal, id: &str) -> Result<DeliveryView, ApiError> {
    let row = find(state, principal, id).await?;
    let now = state.clock.now_ms();
    let alert = AlertView {
        id: "test".into(),
        kind: "test".into(),
        subject: row.name.clone(),
        severity: "info".into(),
        summary: format!("a test message to the alert channel {}: if you read this, it works", row.name),
        detail: None,
        opened_at: rfc3339_ms(now),
        last_seen_at: rfc3339_ms(now),
        resolved_at: None,
        occurrences: 1,
    };
    let delivery = super::delivery::queued(&row.id, None, &AlertMessage { event: "test".into(), alert }, now);
    state.store.queue_alert_delivery(&delivery).await?;
    Ok(delivery_view(&delivery, Vec::new()))
}

/// A channel as shown.
pub async fn view(state: &AppState, row: &ChannelRow) -> Result<ChannelView, ApiError> {
    let owner = if row.owner.is_empty() { None } else { Some(state.store.user_by_id(&row.owner).await?.map(|u| u.name).unwrap_or_else(|| row.owner.clone())) };
    let newest = state.store.alert_deliveries_of(&row.id, 1).await?.into_iter().next();
    Ok(ChannelView {
        id: row.id.clone(),
        name: row.name.clone(),
        scope: if row.owner.is_empty() { "cluster" } else { "personal" }.into(),
        owner,
        kind: row.kind.clone(),
        target: row.target.clone(),
        events: serde_json::from_str(&row.events).unwrap_or_default(),
        created_at: rfc3339_ms(row.created_at),
        failing: newest.as_ref().is_some_and(|d| d.state == "failed" || d.last_error.is_some()),
        last_state: newest.map(|d| d.state),
    })
}

/// A delivery as shown.
pub fn delivery_view(row: &DeliveryRow, attempts: Vec<cloudweb_store::alert_delivery::AttemptRow>) -> DeliveryView {
    let summary = serde_json::from_str::<AlertMessage>(&row.payload).map(|m| m.alert.summary).unwrap_or_default();
    DeliveryView {
        id: row.id.clone(),
        alert_id: row.alert_id.clone(),
        event: row.event.clone(),
        summary,
        state: row.state.clone(),
        attempts: u32::try_from(row.attempts).unwrap_or(u32::MAX),
        next_attempt_at: (row.state == "pending").then(|| rfc3339_ms(row.next_attempt_at)),
        last_error: row.last_error.clone(),
        created_at: rfc3339_ms(row.created_at),
        finished_at: row.finished_at.map(rfc3339_ms),
        attempt_log: attempts
            .into_iter()
            .map(|a| DeliveryAttemptView {
                attempt: u32::try_from(a.attempt).unwrap_or(u32::MAX),
                at: rfc3339_ms(a.at),
                duration_ms: u64::try_from(a.duration_ms).unwrap_or(0),
                ok: a.ok,
                outcome: a.outcome,
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cloudweb_api_types::alerts::SmtpServer;

    #[test]
    fn targets_are_checked_and_shown_without_secrets() {
        let hook = |url: &str| ChannelTarget::Webhook { url: url.into(), secret: "0123456789abcdef".into() };
        assert_eq!(check_target(&hook("https://hooks.example.com/services/T0/B0/SECRET"), false).unwrap(), "https://hooks.example.com");
        assert!(check_target(&hook("http://hooks.example.com/x"), false).unwrap_err().contains("https"));
        assert!(check_target(&hook("https://127.0.0.1/x"), false).unwrap_err().contains("loopback"));
        assert!(check_target(&hook("https://localhost/x"), false).is_err());
        assert_eq!(check_target(&hook("http://127.0.0.1:9000/x"), true).unwrap(), "http://127.0.0.1:9000");
        assert!(check_target(&hook("https://169.254.169.254/latest"), true).unwrap_err().contains("link-local"), "never metadata services");
        assert!(check_target(&hook("https://user:pw@example.com/"), false).is_err());
        assert!(check_target(&hook("ftp://example.com/"), false).is_err());
        let short = ChannelTarget::Webhook { url: "https://example.com".into(), secret: "short".into() };
        assert!(check_target(&short, false).unwrap_err().contains("secret"));
        let smtp = |tls, password: Option<&str>| SmtpServer { host: "smtp.example.com".into(), port: None, tls, username: password.map(|_| "ops".into()), password: password.map(Into::into) };
        let mail = |server, to: Vec<&str>| ChannelTarget::Email { smtp: server, from: "cloud-web <alerts@example.com>".into(), to: to.into_iter().map(Into::into).collect() };
        assert_eq!(
            check_target(&mail(smtp(SmtpTls::Starttls, Some("pw")), vec!["ops@example.com"]), false).unwrap(),
            "ops@example.com via smtp.example.com:587 (STARTTLS)"
        );
        assert!(check_target(&mail(smtp(SmtpTls::None, Some("pw")), vec!["ops@example.com"]), false).unwrap_err().contains("without TLS"));
        assert!(check_target(&mail(smtp(SmtpTls::Tls, None), vec!["not an address"]), false).unwrap_err().contains("to:"));
        assert!(check_target(&mail(smtp(SmtpTls::Tls, None), vec![]), false).is_err());
    }

    #[test]
    fn names_and_events_are_checked() {
        assert!(check_name("ops-pager").is_ok());
        assert!(check_name("Ops").is_err());
        assert!(check_name("").is_err());
        assert_eq!(check_events(None).unwrap().len(), DEFAULT_ALERT_KINDS.len());
        assert!(!check_events(None).unwrap().contains(&"deploy_succeeded".to_string()));
        assert_eq!(check_events(Some(&["deploy_failed".into(), "deploy_failed".into()])).unwrap(), ["deploy_failed"]);
        assert!(check_events(Some(&["disk".into()])).unwrap_err().contains("unknown kind"));
        assert!(check_events(Some(&[])).is_err());
    }
}
