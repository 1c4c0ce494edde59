//! Runtime log lines as forwarded records (`--log-forward`, see
//! `crate::forward`).

use cloudweb_store::NewLogLine;
use serde_json::json;

use crate::forward::{otlp_attr, syslog_field, syslog_param, syslog_time, Record};

pub use crate::forward::ForwardTarget;

/// The runtime logs' forwarder.
pub type Forwarder = crate::forward::Forwarder<NewLogLine>;

impl Record for NewLogLine {
    /// Facility user, severity error for stderr and info otherwise;
    /// APP-NAME the app, PROCID the instance, MSGID the stream.
    fn syslog(&self) -> String {
        rfc5424(self)
    }

    fn otlp(&self) -> (String, serde_json::Value) {
        let (text, number) = if self.stream == "stderr" { ("ERROR", 17) } else { ("INFO", 9) };
        let record = json!({
            "timeUnixNano": self.ts_ns.to_string(),
            "severityText": text,
            "severityNumber": number,
            "body": {"stringValue": self.line},
            "attributes": [
                otlp_attr("log.iostream", &self.stream),
                otlp_attr("cloudweb.deployment", &self.source.deployment_id),
                otlp_attr("cloudweb.instance", &self.source.instance.to_string()),
                otlp_attr("cloudweb.node", &self.source.node_id),
                otlp_attr("container.name", &self.source.container),
            ],
        });
        (self.source.app.clone(), record)
    }

    fn loki(&self) -> (std::collections::BTreeMap<String, String>, serde_json::Value) {
        let labels = [("app", self.source.app.clone()), ("stream", self.stream.clone()), ("instance", self.source.instance.to_string()), ("source", "cloud-web".to_string())];
        (labels.into_iter().map(|(k, v)| (k.to_string(), v)).collect(), json!([self.ts_ns.to_string(), self.line]))
    }

    fn kind() -> &'static str {
        "runtime logs"
    }
}

/// A line's syslog message.
pub fn rfc5424(line: &NewLogLine) -> String {
    let severity = if line.stream == "stderr" { 3 } else { 6 };
    let ts = syslog_time(&super::format_ts_ns(line.ts_ns));
    format!(
        "<{}>1 {ts} {} {} {} {} [cloudweb@32473 deployment=\"{}\" container=\"{}\"] {}",
        8 + severity,
        syslog_field(&line.source.node_id, 255),
        syslog_field(&line.source.app, 48),
        line.source.instance,
        syslog_field(&line.stream, 32),
        syslog_param(&line.source.deployment_id),
        syslog_param(&line.source.container),
        line.line
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::forward::{loki_body, otlp_body, ForwardTarget, Forwarder};
    use std::sync::atomic::Ordering;
    use std::time::Duration;
    use cloudweb_store::LogSource;

    fn line(stream: &str, text: &str) -> NewLogLine {
        NewLogLine {
            source: LogSource { app: "web".into(), container: "cw-web-1".into(), deployment_id: "dep_1".into(), node_id: "nd_1".into(), instance: 2 },
            ts_ns: 1_764_000_000_123_456_789,
            seq: 1,
            stream: stream.into(),
            line: text.into(),
        }
    }

    #[test]
    fn targets_parse_and_never_show_credentials() {
        assert_eq!(ForwardTarget::parse("syslog+tls://logs.example.com:6514").unwrap(), ForwardTarget::Syslog { host: "logs.example.com".into(), port: 6514, tls: true });
        assert!(ForwardTarget::parse("syslog+tcp://logs.example.com").unwrap_err().contains("port"));
        let loki = ForwardTarget::parse("loki+https://user:s3cret@logs.example.com").unwrap();
        assert_eq!(loki.describe(), "loki+https://logs.example.com/loki/api/v1/push");
        assert!(!format!("{loki:?}").contains("s3cret"));
        assert_eq!(ForwardTarget::parse("otlp+http://127.0.0.1:4318").unwrap().describe(), "otlp+http://127.0.0.1:4318/v1/logs");
        assert!(ForwardTarget::parse("https://logs.example.com").is_err());
        assert!(ForwardTarget::parse("loki+ftp://logs.example.com").is_err());
    }

    #[test]
    fn messages_follow_each_format() {
        assert_eq!(
            rfc5424(&line("stderr", "boom")),
            "<11>1 2025-11-24T16:00:00.123456Z nd_1 web 2 stderr [cloudweb@32473 deployment=\"dep_1\" container=\"cw-web-1\"] boom"
        );
        assert!(rfc5424(&line("stdout", "ok")).starts_with("<14>1 "));
        let otlp = otlp_body(&[line("stdout", "ok")]);
        let record = &otlp["resourceLogs"][0]["scopeLogs"][0]["logRecords"][0];
        assert_eq!((record["body"]["stringValue"].as_str(), record["timeUnixNano"].as_str()), (Some("ok"), Some("1764000000123456789")));
        assert_eq!(otlp["resourceLogs"][0]["resource"]["attributes"][0]["value"]["stringValue"], "web");
        let loki = loki_body(&[line("stdout", "a"), line("stdout", "b")]);
        assert_eq!(loki["streams"][0]["values"].as_array().unwrap().len(), 2);
        assert_eq!(loki["streams"][0]["stream"]["app"], "web");
    }

    #[tokio::test]
    async fn lines_reach_a_syslog_receiver_and_a_dead_target_only_counts() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (forwarder, task) = Forwarder::<NewLogLine>::new(ForwardTarget::Syslog { host: "127.0.0.1".into(), port, tls: false });
        let shipping = tokio::spawn(task);
        forwarder.offer(&[line("stdout", "one"), line("stderr", "two")]);
        let (mut socket, _) = listener.accept().await.unwrap();
        let mut got = Vec::new();
        while !String::from_utf8_lossy(&got).contains("two") {
            let mut buf = [0u8; 1024];
            let n = tokio::io::AsyncReadExt::read(&mut socket, &mut buf).await.unwrap();
            got.extend_from_slice(&buf[..n]);
        }
        let text = String::from_utf8(got).unwrap();
        let first = rfc5424(&line("stdout", "one"));
        assert!(text.starts_with(&format!("{} {first}", first.len())), "octet-counted: {text}");
        shipping.abort();

        // Nothing listens: offering never waits, and the lines are counted.
        let dead = Forwarder::<NewLogLine>::new(ForwardTarget::Syslog { host: "127.0.0.1".into(), port: 9, tls: false });
        let (dead, task) = dead;
        let shipping = tokio::spawn(task);
        let started = std::time::Instant::now();
        for _ in 0..1000 {
            dead.offer(&[line("stdout", "x")]);
        }
        assert!(started.elapsed() < Duration::from_millis(500), "offering never waits");
        assert!(dead.stats.dropped.load(Ordering::Relaxed) > 0, "a full queue drops and counts");
        shipping.abort();
    }
}
