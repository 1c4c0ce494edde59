//! Shipping records to a team's own log system: syslog (RFC 5424,
//! octet-counted over TCP or TLS, RFC 6587), an OTLP/HTTP logs endpoint
//! (JSON) or a Loki push endpoint (JSON). Runtime logs (`--log-forward`,
//! see `log_archive::forward`) and the audit log (`--audit-forward`, see
//! `access::audit`) each have a forwarder. Every record offered goes to a
//! bounded queue that never waits: a target that is slow, down or
//! refusing costs its own records (counted, retried a few times, then
//! dropped and counted), never the local store's.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::AsyncWriteExt;

/// Batches waiting to be shipped; past it they are dropped and counted.
const QUEUE_BATCHES: usize = 256;
/// Records one request or write carries at most.
const SHIP_LINES: usize = 1000;

/// What can be shipped: one record in each target's form.
pub trait Record: Clone + Send + Sync + 'static {
    /// An RFC 5424 message (without its octet count).
    fn syslog(&self) -> String;
    /// OTLP: the resource's `service.name` and the log record.
    fn otlp(&self) -> (String, serde_json::Value);
    /// Loki: the stream's labels and the `[time in ns, line]` value.
    fn loki(&self) -> (std::collections::BTreeMap<String, String>, serde_json::Value);
    /// What the records are, for the log when they cannot be shipped.
    fn kind() -> &'static str;
}
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

/// The writer's end of the queue.
pub struct Forwarder<R: Record> {
    queue: tokio::sync::mpsc::Sender<Vec<R>>,
    pub stats: Arc<ForwardStats>,
    pub target: ForwardTarget,
}

impl<R: Record> Forwarder<R> {
    /// A forwarder and the task that ships its queue (to spawn).
    pub fn new(target: ForwardTarget) -> (Forwarder<R>, impl std::future::Future<Output = ()> + Send + 'static) {
        let (queue, receiver) = tokio::sync::mpsc::channel(QUEUE_BATCHES);
        let stats = Arc::new(ForwardStats::default());
        let task = ship(target.clone(), receiver, stats.clone());
        (Forwarder { queue, stats, target }, task)
    }

    /// Offers records; never waits (a full queue drops and counts them).
    pub fn offer(&self, lines: &[R]) {
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

async fn ship<R: Record>(target: ForwardTarget, mut receiver: tokio::sync::mpsc::Receiver<Vec<R>>, stats: Arc<ForwardStats>) {
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
                        tracing::warn!(target = %target.describe(), records = chunk.len(), %error, "{}: cannot forward; these stay stored here only", R::kind());
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

async fn send<R: Record>(target: &ForwardTarget, http: &reqwest::Client, syslog: &mut Option<SyslogStream>, lines: &[R]) -> Result<(), String> {
    match target {
        ForwardTarget::Syslog { host, port, tls } => {
            if syslog.is_none() {
                *syslog = Some(connect(host, *port, *tls).await?);
            }
            let stream = syslog.as_mut().expect("connected");
            let mut frames = Vec::new();
            for line in lines {
                let message = line.syslog();
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

pub(crate) fn otlp_body<R: Record>(records: &[R]) -> serde_json::Value {
    use serde_json::json;
    let mut by_service: std::collections::BTreeMap<String, Vec<serde_json::Value>> = Default::default();
    for record in records {
        let (service, record) = record.otlp();
        by_service.entry(service).or_default().push(record);
    }
    let resource_logs: Vec<serde_json::Value> = by_service
        .into_iter()
        .map(|(service, records)| {
            json!({
                "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": service}}]},
                "scopeLogs": [{"scope": {"name": "cloud-web"}, "logRecords": records}],
            })
        })
        .collect();
    json!({ "resourceLogs": resource_logs })
}

pub(crate) fn loki_body<R: Record>(records: &[R]) -> serde_json::Value {
    use serde_json::json;
    let mut streams: std::collections::BTreeMap<std::collections::BTreeMap<String, String>, Vec<serde_json::Value>> = Default::default();
    for record in records {
        let (labels, value) = record.loki();
        streams.entry(labels).or_default().push(value);
    }
    let streams: Vec<serde_json::Value> = streams.into_iter().map(|(labels, values)| json!({"stream": labels, "values": values})).collect();
    json!({ "streams": streams })
}

/// A syslog message's timestamp: RFC 5424 allows at most 6 digits of a
/// second.
pub fn syslog_time(rfc3339: &str) -> String {
    match rfc3339.split_once('.') {
        Some((seconds, fraction)) => format!("{seconds}.{}Z", fraction.trim_end_matches('Z').chars().take(6).collect::<String>()),
        None => rfc3339.to_string(),
    }
}

/// A syslog header field: printable ASCII, at most `max`, `-` when empty.
pub fn syslog_field(text: &str, max: usize) -> String {
    let printable: String = text.chars().filter(|c| c.is_ascii_graphic()).take(max).collect();
    if printable.is_empty() { "-".into() } else { printable }
}

/// A structured-data parameter value, escaped.
pub fn syslog_param(text: &str) -> String {
    text.replace('\\', "\\\\").replace('"', "\\\"").replace(']', "\\]")
}

/// An OTLP string attribute.
pub fn otlp_attr(key: &str, value: &str) -> serde_json::Value {
    serde_json::json!({"key": key, "value": {"stringValue": value}})
}
