//! Shipping runtime logs to a team's own log system (`--log-forward`):
//! syslog (RFC 5424, octet-counted over TCP or TLS, RFC 6587), an
//! OTLP/HTTP logs endpoint (JSON) or a Loki push endpoint (JSON). Every
//! batch the archive writes is offered to a bounded queue that never
//! waits: a target that is slow, down or refusing costs its own lines
//! (counted, retried a few times, then dropped and counted), never the
//! local store's.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cloudweb_store::NewLogLine;
use tokio::io::AsyncWriteExt;

/// Batches waiting to be shipped; past it they are dropped and counted.
const QUEUE_BATCHES: usize = 256;
/// Lines one request or write carries at most.
const SHIP_LINES: usize = 1000;
/// How long one send may take.
const SEND_TIMEOUT: Duration = Duration::from_secs(10);
/// Tries of one batch before it is dropped.
const TRIES: u32 = 4;

/// Where logs go.
#[derive(Clone, PartialEq, Eq)]
pub enum ForwardTarget {
    Syslog { host: String, port: u16, tls: bool },
    Otlp { url: url::Url },
    Loki { url: url::Url },
}

impl std::fmt::Debug for ForwardTarget {
    /// Without a URL's user name and password.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.describe())
    }
}

impl ForwardTarget {
    /// Parses `syslog+tcp://host:port`, `syslog+tls://host:port`,
    /// `otlp+http(s)://host[:port][/path]` (path `/v1/logs` when none) or
    /// `loki+http(s)://host[:port][/path]` (`/loki/api/v1/push`).
    pub fn parse(text: &str) -> Result<ForwardTarget, String> {
        let (kind, rest) = text.split_once('+').ok_or_else(|| format!("{text:?}: give syslog+tcp://, syslog+tls://, otlp+https:// or loki+https://"))?;
        let mut url = url::Url::parse(rest).map_err(|e| format!("{text:?}: not a URL ({e})"))?;
        let host = url.host_str().filter(|h| !h.is_empty()).ok_or_else(|| format!("{text:?}: no host"))?.to_string();
        if url.query().is_some() || url.fragment().is_some() {
            return Err(format!("{text:?}: no query or fragment"));
        }
        match (kind, url.scheme()) {
            ("syslog", "tcp" | "tls") => {
                if !url.username().is_empty() || url.password().is_some() || !matches!(url.path(), "" | "/") {
                    return Err(format!("{text:?}: syslog+tcp://host:port, with no user or path"));
                }
                let port = url.port().ok_or_else(|| format!("{text:?}: the port is needed (often 601 for tcp, 6514 for tls)"))?;
                Ok(ForwardTarget::Syslog { host, port, tls: url.scheme() == "tls" })
            }
            ("otlp" | "loki", "http" | "https") => {
                if matches!(url.path(), "" | "/") {
                    url.set_path(if kind == "otlp" { "/v1/logs" } else { "/loki/api/v1/push" });
                }
                Ok(if kind == "otlp" { ForwardTarget::Otlp { url } } else { ForwardTarget::Loki { url } })
            }
            _ => Err(format!("{text:?}: give syslog+tcp://, syslog+tls://, otlp+http(s):// or loki+http(s)://")),
        }
    }

    /// The target without credentials, for logs and `/metrics`.
    pub fn describe(&self) -> String {
        match self {
            ForwardTarget::Syslog { host, port, tls } => format!("syslog+{}://{host}:{port}", if *tls { "tls" } else { "tcp" }),
            ForwardTarget::Otlp { url } | ForwardTarget::Loki { url } => {
                let kind = if matches!(self, ForwardTarget::Otlp { .. }) { "otlp" } else { "loki" };
                let port = url.port().map(|p| format!(":{p}")).unwrap_or_default();
                format!("{kind}+{}://{}{port}{}", url.scheme(), url.host_str().unwrap_or(""), url.path())
            }
        }
    }
}

/// Counts of what was shipped.
#[derive(Debug, Default)]
pub struct ForwardStats {
    pub shipped: AtomicU64,
    pub dropped: AtomicU64,
    pub last_error: Mutex<Option<String>>,
}

/// The archive's end of the queue.
pub struct Forwarder {
    queue: tokio::sync::mpsc::Sender<Vec<NewLogLine>>,
    pub stats: Arc<ForwardStats>,
    pub target: ForwardTarget,
}

impl Forwarder {
    /// A forwarder and the task that ships its queue (to spawn).
    pub fn new(target: ForwardTarget) -> (Forwarder, impl std::future::Future<Output = ()> + Send + 'static) {
        let (queue, receiver) = tokio::sync::mpsc::channel(QUEUE_BATCHES);
        let stats = Arc::new(ForwardStats::default());
        let task = ship(target.clone(), receiver, stats.clone());
        (Forwarder { queue, stats, target }, task)
    }

    /// Offers lines; never waits (a full queue drops and counts them).
    pub fn offer(&self, lines: &[NewLogLine]) {
        if lines.is_empty() {
            return;
        }
        if self.queue.try_send(lines.to_vec()).is_err() {
            self.stats.dropped.fetch_add(lines.len() as u64, Ordering::Relaxed);
        }
    }
}

/// A persistent syslog connection.
type SyslogStream = Box<dyn tokio::io::AsyncWrite + Send + Unpin>;

async fn ship(target: ForwardTarget, mut receiver: tokio::sync::mpsc::Receiver<Vec<NewLogLine>>, stats: Arc<ForwardStats>) {
    let http = reqwest::Client::builder()
        .timeout(SEND_TIMEOUT)
        .connect_timeout(SEND_TIMEOUT)
        .redirect(reqwest::redirect::Policy::none())
        .user_agent(concat!("cloud-web/", env!("CARGO_PKG_VERSION")));
    let http = system_roots().into_iter().fold(http, |b, c| b.add_root_certificate(c)).build().expect("an HTTP client");
    let mut syslog: Option<SyslogStream> = None;
    let mut warned: Option<std::time::Instant> = None;
    while let Some(mut batch) = receiver.recv().await {
        // Gather what else is waiting, up to a request's worth.
        while batch.len() < SHIP_LINES {
            match receiver.try_recv() {
                Ok(more) => batch.extend(more),
                Err(_) => break,
            }
        }
        for chunk in batch.chunks(SHIP_LINES) {
            let mut outcome = Err(String::new());
            for attempt in 0..TRIES {
                if attempt > 0 {
                    tokio::time::sleep(Duration::from_secs(1 << (attempt - 1))).await;
                }
                outcome = match tokio::time::timeout(SEND_TIMEOUT, send(&target, &http, &mut syslog, chunk)).await {
                    Ok(result) => result,
                    Err(_) => Err(format!("no answer within {} s", SEND_TIMEOUT.as_secs())),
                };
                if outcome.is_err() {
                    syslog = None;
                } else {
                    break;
                }
            }
            match outcome {
                Ok(()) => {
                    stats.shipped.fetch_add(chunk.len() as u64, Ordering::Relaxed);
                }
                Err(error) => {
                    stats.dropped.fetch_add(chunk.len() as u64, Ordering::Relaxed);
                    if warned.is_none_or(|at| at.elapsed() >= Duration::from_secs(60)) {
                        warned = Some(std::time::Instant::now());
                        tracing::warn!(target = %target.describe(), lines = chunk.len(), %error, "runtime logs: cannot forward; these lines stay stored here only");
                    }
                    *stats.last_error.lock().expect("forward stats") = Some(error);
                }
            }
        }
    }
}

fn system_roots() -> Vec<reqwest::Certificate> {
    std::fs::read("/etc/ssl/certs/ca-certificates.crt").ok().and_then(|pem| reqwest::Certificate::from_pem_bundle(&pem).ok()).unwrap_or_default()
}

async fn send(target: &ForwardTarget, http: &reqwest::Client, syslog: &mut Option<SyslogStream>, lines: &[NewLogLine]) -> Result<(), String> {
    match target {
        ForwardTarget::Syslog { host, port, tls } => {
            if syslog.is_none() {
                *syslog = Some(connect(host, *port, *tls).await?);
            }
            let stream = syslog.as_mut().expect("connected");
            let mut frames = Vec::new();
            for line in lines {
                let message = rfc5424(line);
                frames.extend_from_slice(format!("{} ", message.len()).as_bytes());
                frames.extend_from_slice(message.as_bytes());
            }
            stream.write_all(&frames).await.map_err(|e| format!("syslog write: {e}"))?;
            stream.flush().await.map_err(|e| format!("syslog write: {e}"))
        }
        ForwardTarget::Otlp { url } => post(http, url, otlp_body(lines)).await,
        ForwardTarget::Loki { url } => post(http, url, loki_body(lines)).await,
    }
}

async fn connect(host: &str, port: u16, tls: bool) -> Result<SyslogStream, String> {
    let tcp = tokio::net::TcpStream::connect((host, port)).await.map_err(|e| format!("cannot connect to {host}:{port}: {e}"))?;
    if !tls {
        return Ok(Box::new(tcp));
    }
    use rustls_pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    if let Ok(pem) = std::fs::read("/etc/ssl/certs/ca-certificates.crt") {
        for cert in rustls_pki_types::CertificateDer::pem_slice_iter(&pem).flatten() {
            let _ = roots.add(cert);
        }
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let name = rustls_pki_types::ServerName::try_from(host.to_string()).map_err(|e| format!("{host}: {e}"))?;
    let stream = tokio_rustls::TlsConnector::from(Arc::new(config)).connect(name, tcp).await.map_err(|e| format!("TLS with {host}:{port}: {e}"))?;
    Ok(Box::new(stream))
}

async fn post(http: &reqwest::Client, url: &url::Url, body: serde_json::Value) -> Result<(), String> {
    let mut plain = url.clone();
    let _ = plain.set_username("");
    let _ = plain.set_password(None);
    let mut request = http.post(plain).json(&body);
    if !url.username().is_empty() {
        let user = percent_decode(url.username());
        request = request.basic_auth(user, url.password().map(percent_decode));
    }
    let answer = request.send().await.map_err(|e| e.without_url().to_string())?;
    if answer.status().is_success() {
        Ok(())
    } else {
        Err(format!("HTTP {}", answer.status().as_u16()))
    }
}

/// A URL's percent-encoded user or password as typed.
fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes.get(i + 1..i + 3).and_then(|h| std::str::from_utf8(h).ok()).and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 3;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A syslog message: facility user, severity error for stderr and info
/// otherwise; APP-NAME the app, PROCID the instance, MSGID the stream.
pub fn rfc5424(line: &NewLogLine) -> String {
    let severity = if line.stream == "stderr" { 3 } else { 6 };
    // RFC 5424 allows at most 6 digits of a second.
    let full = super::format_ts_ns(line.ts_ns);
    let ts = match full.split_once('.') {
        Some((seconds, fraction)) => format!("{seconds}.{}Z", fraction.trim_end_matches('Z').chars().take(6).collect::<String>()),
        None => full,
    };
    let field = |text: &str, max: usize| -> String {
        let printable: String = text.chars().filter(|c| c.is_ascii_graphic()).take(max).collect();
        if printable.is_empty() { "-".into() } else { printable }
    };
    let escape = |text: &str| text.replace('\\', "\\\\").replace('"', "\\\"").replace(']', "\\]");
    format!(
        "<{}>1 {ts} {} {} {} {} [cloudweb@32473 deployment=\"{}\" container=\"{}\"] {}",
        8 + severity,
        field(&line.source.node_id, 255),
        field(&line.source.app, 48),
        line.source.instance,
        field(&line.stream, 32),
        escape(&line.source.deployment_id),
        escape(&line.source.container),
        line.line
    )
}

fn otlp_body(lines: &[NewLogLine]) -> serde_json::Value {
    use serde_json::json;
    let mut by_app: std::collections::BTreeMap<&str, Vec<serde_json::Value>> = Default::default();
    for line in lines {
        let (text, number) = if line.stream == "stderr" { ("ERROR", 17) } else { ("INFO", 9) };
        let attr = |key: &str, value: String| json!({"key": key, "value": {"stringValue": value}});
        by_app.entry(line.source.app.as_str()).or_default().push(json!({
            "timeUnixNano": line.ts_ns.to_string(),
            "severityText": text,
            "severityNumber": number,
            "body": {"stringValue": line.line},
            "attributes": [
                attr("log.iostream", line.stream.clone()),
                attr("cloudweb.deployment", line.source.deployment_id.clone()),
                attr("cloudweb.instance", line.source.instance.to_string()),
                attr("cloudweb.node", line.source.node_id.clone()),
                attr("container.name", line.source.container.clone()),
            ],
        }));
    }
    let resource_logs: Vec<serde_json::Value> = by_app
        .into_iter()
        .map(|(app, records)| {
            json!({
                "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": app}}]},
                "scopeLogs": [{"scope": {"name": "cloud-web"}, "logRecords": records}],
            })
        })
        .collect();
    json!({ "resourceLogs": resource_logs })
}

fn loki_body(lines: &[NewLogLine]) -> serde_json::Value {
    use serde_json::json;
    let mut streams: std::collections::BTreeMap<(&str, &str, u32), Vec<serde_json::Value>> = Default::default();
    for line in lines {
        streams.entry((line.source.app.as_str(), line.stream.as_str(), line.source.instance)).or_default().push(json!([line.ts_ns.to_string(), line.line]));
    }
    let streams: Vec<serde_json::Value> = streams
        .into_iter()
        .map(|((app, stream, instance), values)| json!({"stream": {"app": app, "stream": stream, "instance": instance.to_string(), "source": "cloud-web"}, "values": values}))
        .collect();
    json!({ "streams": streams })
}

#[cfg(test)]
mod tests {
    use super::*;
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
        let (forwarder, task) = Forwarder::new(ForwardTarget::Syslog { host: "127.0.0.1".into(), port, tls: false });
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
        let dead = crate::log_archive::forward::Forwarder::new(ForwardTarget::Syslog { host: "127.0.0.1".into(), port: 9, tls: false });
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
