//! Sending one alert message to one channel: a signed JSON webhook, a
//! Slack-compatible `{"text": …}` webhook, or an email over SMTP
//! (STARTTLS, TLS or, on a private network, none). Every send is bounded
//! in time, goes only to addresses the channel may reach (checked on the
//! resolved addresses, which the HTTP client is then pinned to), and its
//! errors never quote a URL (a Slack URL's path is its secret) or a
//! password.

use std::net::SocketAddr;
use std::time::Duration;

use cloudweb_api_types::alerts::{AlertMessage, ChannelTarget, SmtpTls};

/// How long one attempt may take, connection to answer.
pub const SEND_TIMEOUT: Duration = Duration::from_secs(10);
/// Most of an answer's body quoted in an outcome.
const QUOTED_ANSWER: usize = 200;

/// How an attempt went: `Ok` with the answer, or `Err` with why.
pub type Sent = Result<String, String>;

/// An email channel's SMTP port when it names none.
pub fn default_smtp_port(tls: SmtpTls) -> u16 {
    match tls {
        SmtpTls::Starttls => 587,
        SmtpTls::Tls => 465,
        SmtpTls::None => 25,
    }
}

/// The addresses `host:port` resolves to, all of which the channel may
/// reach, or why not.
async fn resolve(host: &str, port: u16, allow_private: bool) -> Result<Vec<SocketAddr>, String> {
    let bare = host.trim_matches(['[', ']']);
    let addresses: Vec<SocketAddr> = tokio::time::timeout(SEND_TIMEOUT, tokio::net::lookup_host((bare, port)))
        .await
        .map_err(|_| format!("resolving {host} timed out"))?
        .map_err(|e| format!("cannot resolve {host}: {e}"))?
        .collect();
    if addresses.is_empty() {
        return Err(format!("{host} resolves to no address"));
    }
    for address in &addresses {
        if let Some(why) = cloudweb_protocol::deploy::refused_git_address(address.ip(), allow_private) {
            return Err(format!("{host} resolves to {}, {why} (see --allow-private-alert-targets)", address.ip()));
        }
    }
    Ok(addresses)
}

/// The system's CA bundle, for TLS to webhooks and SMTP servers.
fn system_roots() -> Vec<u8> {
    std::fs::read("/etc/ssl/certs/ca-certificates.crt").unwrap_or_default()
}

/// Sends `message` (the stored JSON `payload`) to `target`.
pub async fn send(target: &ChannelTarget, delivery_id: &str, payload: &str, message: &AlertMessage, allow_private: bool, now_s: i64) -> Sent {
    match target {
        ChannelTarget::Webhook { url, secret } => {
            let signed = crate::signing::timestamped(now_s, payload.as_bytes());
            let headers = [
                ("x-cloudweb-event", message.event.clone()),
                ("x-cloudweb-delivery", delivery_id.to_string()),
                ("x-cloudweb-timestamp", now_s.to_string()),
                ("x-cloudweb-signature", crate::signing::sign(secret.as_bytes(), &signed)),
            ];
            post(url, payload.to_string(), &headers, allow_private).await
        }
        ChannelTarget::Slack { url } => {
            let body = serde_json::json!({ "text": slack_text(message) }).to_string();
            post(url, body, &[], allow_private).await
        }
        ChannelTarget::Email { .. } => email(target, message, allow_private).await,
    }
}

async fn post(url: &str, body: String, headers: &[(&str, String)], allow_private: bool) -> Sent {
    let parsed = url::Url::parse(url).map_err(|_| "the channel's URL no longer parses".to_string())?;
    let host = parsed.host_str().ok_or("the channel's URL has no host")?.to_string();
    let port = parsed.port_or_known_default().unwrap_or(443);
    let addresses = resolve(&host, port, allow_private).await?;
    let mut builder = reqwest::Client::builder()
        .timeout(SEND_TIMEOUT)
        .connect_timeout(SEND_TIMEOUT)
        .redirect(reqwest::redirect::Policy::none())
        .user_agent(concat!("cloud-web/", env!("CARGO_PKG_VERSION")))
        .resolve_to_addrs(&host, &addresses);
    if let Ok(roots) = reqwest::Certificate::from_pem_bundle(&system_roots()) {
        for root in roots {
            builder = builder.add_root_certificate(root);
        }
    }
    let client = builder.build().map_err(|e| format!("cannot build an HTTP client: {}", e.without_url()))?;
    let mut request = client.post(parsed).header("content-type", "application/json").body(body);
    for (name, value) in headers {
        request = request.header(*name, value);
    }
    let answer = request.send().await.map_err(|e| describe(&e))?;
    let status = answer.status();
    let text = tokio::time::timeout(SEND_TIMEOUT, answer.text()).await.ok().and_then(Result::ok).unwrap_or_default();
    let quoted = cloudweb_protocol::misc::one_line(&text, QUOTED_ANSWER);
    if status.is_success() {
        Ok(format!("HTTP {}", status.as_u16()))
    } else if quoted.is_empty() {
        Err(format!("HTTP {}", status.as_u16()))
    } else {
        Err(format!("HTTP {}: {quoted}", status.as_u16()))
    }
}

/// A reqwest error without its URL (which may hold a token).
fn describe(err: &reqwest::Error) -> String {
    let kind = if err.is_timeout() {
        "timed out"
    } else if err.is_connect() {
        "cannot connect"
    } else {
        "request failed"
    };
    let mut text = kind.to_string();
    let mut source = std::error::Error::source(err);
    while let Some(inner) = source {
        text = format!("{text}: {inner}");
        source = inner.source();
    }
    cloudweb_protocol::misc::one_line(&text, 300)
}

/// The one-line text of a message, for Slack and email subjects.
pub fn headline(message: &AlertMessage) -> String {
    let alert = &message.alert;
    match message.event.as_str() {
        "resolved" => format!("Resolved: {}", alert.summary),
        "test" => format!("Test: {}", alert.summary),
        _ if alert.severity == "info" => alert.summary.clone(),
        _ => format!("{}: {}", alert.severity.to_uppercase(), alert.summary),
    }
}

fn slack_text(message: &AlertMessage) -> String {
    let mark = match (message.event.as_str(), message.alert.severity.as_str()) {
        ("resolved", _) => ":white_check_mark:",
        ("test", _) | (_, "info") => ":information_source:",
        (_, "warning") => ":warning:",
        _ => ":rotating_light:",
    };
    let mut text = format!("{mark} *cloud-web* {}", headline(message));
    if let Some(detail) = &message.alert.detail {
        let detail: String = detail.chars().take(1500).collect();
        text.push_str(&format!("\n```{}```", detail.replace("```", "'''")));
    }
    text
}

fn email_body(message: &AlertMessage) -> String {
    let alert = &message.alert;
    let mut body = format!(
        "{}\n\nkind:       {}\nsubject:    {}\nseverity:   {}\nopened:     {}\n",
        headline(message),
        alert.kind,
        alert.subject,
        alert.severity,
        alert.opened_at
    );
    if let Some(resolved) = &alert.resolved_at {
        body.push_str(&format!("resolved:   {resolved}\n"));
    }
    body.push_str(&format!("alert id:   {}\n", alert.id));
    if let Some(detail) = &alert.detail {
        body.push_str(&format!("\n{detail}\n"));
    }
    body.push_str("\n-- \ncloud-web alerts (cloudweb alerts lists the open ones)\n");
    body
}

async fn email(target: &ChannelTarget, message: &AlertMessage, allow_private: bool) -> Sent {
    use lettre::message::header::ContentType;
    use lettre::transport::smtp::authentication::Credentials;
    use lettre::transport::smtp::client::{Certificate, CertificateStore, Tls, TlsParameters};
    use lettre::{AsyncSmtpTransport, AsyncTransport, Tokio1Executor};

    let ChannelTarget::Email { smtp, from, to } = target else {
        return Err("not an email channel".into());
    };
    let host = smtp.host.trim().to_string();
    let port = smtp.port.unwrap_or(default_smtp_port(smtp.tls));
    resolve(&host, port, allow_private).await?;
    let tls = if smtp.tls == SmtpTls::None {
        Tls::None
    } else {
        let roots = Certificate::from_pem(&system_roots()).map_err(|e| format!("cannot read the system's CA roots: {e}"))?;
        let parameters = TlsParameters::builder(host.trim_matches(['[', ']']).to_string())
            .certificate_store(CertificateStore::None)
            .add_root_certificate(roots)
            .build_rustls()
            .map_err(|e| format!("cannot set up TLS: {e}"))?;
        match smtp.tls {
            SmtpTls::Tls => Tls::Wrapper(parameters),
            _ => Tls::Required(parameters),
        }
    };
    let mut builder = AsyncSmtpTransport::<Tokio1Executor>::builder_dangerous(host.trim_matches(['[', ']'])).port(port).tls(tls).timeout(Some(SEND_TIMEOUT));
    if let (Some(user), Some(password)) = (&smtp.username, &smtp.password) {
        builder = builder.credentials(Credentials::new(user.clone(), password.clone()));
    }
    let transport = builder.build();
    let mut email = lettre::Message::builder()
        .from(from.parse().map_err(|e| format!("from: {e}"))?)
        .subject(cloudweb_protocol::misc::one_line(&format!("[cloud-web] {}", headline(message)), 200))
        .header(ContentType::TEXT_PLAIN);
    for address in to {
        email = email.to(address.parse().map_err(|e| format!("to: {e}"))?);
    }
    let email = email.body(email_body(message)).map_err(|e| format!("cannot build the email: {e}"))?;
    // The whole conversation is bounded too, not only each read.
    let answer = tokio::time::timeout(SEND_TIMEOUT * 3, transport.send(email))
        .await
        .map_err(|_| format!("the SMTP server {host}:{port} did not finish within {} s", (SEND_TIMEOUT * 3).as_secs()))?
        .map_err(|e| cloudweb_protocol::misc::one_line(&format!("SMTP {host}:{port}: {e}"), 300))?;
    let reply = answer.message().collect::<Vec<_>>().join(" ");
    Ok(cloudweb_protocol::misc::one_line(&format!("SMTP {} {reply}", answer.code()), QUOTED_ANSWER))
}

#[cfg(test)]
mod tests {
    use super::*;
    use cloudweb_api_types::alerts::AlertView;

    fn message(event: &str, severity: &str) -> AlertMessage {
        AlertMessage {
            event: event.into(),
            alert: AlertView {
                id: "alt_1".into(),
                kind: "deploy_failed".into(),
                subject: "web".into(),
                severity: severity.into(),
                summary: "deployment dep_1 of web failed: health check".into(),
                detail: Some("line ```one```".into()),
                opened_at: "2026-01-01T00:00:00Z".into(),
                last_seen_at: "2026-01-01T00:00:00Z".into(),
                resolved_at: None,
                occurrences: 1,
            },
        }
    }

    #[test]
    fn messages_read_well_everywhere() {
        assert_eq!(headline(&message("opened", "critical")), "CRITICAL: deployment dep_1 of web failed: health check");
        assert!(headline(&message("resolved", "critical")).starts_with("Resolved: "));
        let slack = slack_text(&message("opened", "critical"));
        assert!(slack.starts_with(":rotating_light: *cloud-web* CRITICAL"));
        assert!(!slack.contains("```one```"), "a detail cannot close the code block");
        let body = email_body(&message("opened", "warning"));
        assert!(body.contains("subject:    web") && body.contains("line ```one```"));
    }

    #[tokio::test]
    async fn private_and_metadata_addresses_are_refused_after_resolving() {
        assert!(resolve("localhost", 80, false).await.unwrap_err().contains("loopback"));
        assert!(resolve("localhost", 80, true).await.is_ok());
        assert!(resolve("169.254.169.254", 80, true).await.unwrap_err().contains("link-local"));
    }
}
