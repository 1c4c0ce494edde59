//! A simulated fleet of agents for the heartbeat bench and the reconnect
//! test: each joins through the real `/agent/v1/join` with its own key,
//! then holds one mTLS connection from its own loopback address
//! (127.0.x.y, as a real fleet comes from many addresses, so the agent
//! listener's per-address cap sees what it sees in production) and sends a
//! heartbeat every interval.
//!
//! Each agent does what the real one does (crates/agent/src/run.rs), never
//! giving up:
//! - heartbeats on its request connection every interval; a failed one is
//!   retried after the normal interval (`next_delay`), on a new connection
//!   (10 s connect timeout, 30 s request timeout, as the agent's client);
//! - with `event_stream`, holds `GET /agent/v1/stream` open on a second
//!   connection; when it ends the agent waits 1 s and opens it again,
//!   doubling the wait after each failure up to 30 s (no jitter: the real
//!   agent has none), and reads its commands (`GET /agent/v1/commands`) on
//!   the request connection after each try, as `command_loop` does. After a
//!   control-plane restart this is the thundering herd: every agent comes
//!   back about 1 s after it lost its stream.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use bytes::Bytes;
use futures_util::stream::{self, StreamExt};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use serde_json::json;
use tokio::net::TcpSocket;
use tokio_rustls::TlsConnector;

const PROTOCOL: (&str, &str) = ("x-cloudweb-protocol", "1");
const AGENT_VERSION: (&str, &str) = ("x-cloudweb-agent-version", "0.1.0");
/// The real agent's timeouts (crates/agent/src/client.rs).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Where the fleet's control plane is.
#[derive(Clone)]
pub struct ControlPlane {
    pub agent_port: u16,
    pub api_url: String,
    pub admin_token: String,
    pub ca_pem: String,
}

/// One joined agent's identity.
pub struct Enrolled {
    pub cert_pem: String,
    pub key_pem: String,
    /// The node's name (`sim-<index>`, in the order of the joins asked for,
    /// which is not the order of the list).
    pub name: String,
}

/// The loopback address agent `index` dials from: 127.0.1.1, 127.0.1.2, …,
/// 250 to a third octet, never 127.0.0.1 (the test's own address).
pub fn source_address(index: usize) -> IpAddr {
    let (third, fourth) = (1 + index / 250, 1 + index % 250);
    assert!(third <= 255, "at most 63,750 simulated agents");
    IpAddr::V4(Ipv4Addr::new(127, 0, third as u8, fourth as u8))
}

/// Creates a join token and joins, `count` times, with real keys and CSRs,
/// `concurrency` at a time.
pub async fn enroll(control: &ControlPlane, count: usize, concurrency: usize) -> Result<Vec<Enrolled>> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(CertificateDer::from_pem_slice(control.ca_pem.as_bytes())?)?;
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let anonymous = reqwest::Client::builder().use_preconfigured_tls(config).timeout(Duration::from_secs(60)).build()?;
    let api = reqwest::Client::builder().timeout(Duration::from_secs(60)).build()?;
    let results: Vec<Result<Enrolled>> = stream::iter(0..count)
        .map(|index| {
            let (anonymous, api) = (anonymous.clone(), api.clone());
            async move {
                let response = api.post(format!("{}/api/join-tokens", control.api_url)).bearer_auth(&control.admin_token).send().await?;
                if response.status() != 201 {
                    bail!("join-tokens answered {}", response.status());
                }
                let token: serde_json::Value = response.json().await?;
                let token = token["token"].as_str().context("join-tokens answered without a token")?.to_string();
                let key = rcgen::KeyPair::generate()?;
                let csr = rcgen::CertificateParams::default().serialize_request(&key)?.pem()?;
                let body = json!({"token": token, "csr": csr, "hostname": format!("sim-{index}"), "name": format!("sim-{index}")});
                let response = anonymous
                    .post(format!("https://127.0.0.1:{}/agent/v1/join", control.agent_port))
                    .header(PROTOCOL.0, PROTOCOL.1)
                    .header(AGENT_VERSION.0, AGENT_VERSION.1)
                    .json(&body)
                    .send()
                    .await?;
                if !response.status().is_success() {
                    bail!("join {index} answered {}: {}", response.status(), response.text().await.unwrap_or_default());
                }
                let joined: serde_json::Value = response.json().await?;
                Ok(Enrolled { cert_pem: joined["certificate"].as_str().context("certificate")?.to_string(), key_pem: key.serialize_pem(), name: format!("sim-{index}") })
            }
        })
        .buffer_unordered(concurrency)
        .collect()
        .await;
    results.into_iter().collect()
}

pub type Sender = hyper::client::conn::http1::SendRequest<Full<Bytes>>;

/// One agent's TLS settings (its certificate, the cluster CA).
pub fn tls(roots: &Arc<rustls::RootCertStore>, agent: &Enrolled) -> Result<TlsConnector> {
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_root_certificates(roots.clone())
        .with_client_auth_cert(
            vec![CertificateDer::from_pem_slice(agent.cert_pem.as_bytes())?],
            PrivateKeyDer::from_pem_slice(agent.key_pem.as_bytes())?,
        )?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(TlsConnector::from(Arc::new(config)))
}

/// An HTTP/1.1 connection to the agent listener on `port`, from `source`,
/// with the agent's certificate.
pub async fn connect(tls: &TlsConnector, source: IpAddr, port: u16) -> Result<Sender> {
    let socket = TcpSocket::new_v4()?;
    socket.bind(SocketAddr::new(source, 0)).with_context(|| format!("binding {source}"))?;
    let tcp = socket.connect(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port)).await?;
    tcp.set_nodelay(true)?;
    let tls = tls.connect(ServerName::try_from("127.0.0.1")?.to_owned(), tcp).await?;
    let (sender, connection) = hyper::client::conn::http1::handshake::<_, Full<Bytes>>(TokioIo::new(tls)).await?;
    tokio::spawn(connection);
    Ok(sender)
}

/// Sends one heartbeat on `sender`: whether the control plane took it.
pub async fn heartbeat(sender: &mut Sender, body: Bytes) -> Result<()> {
    sender.ready().await?;
    let response = sender.send_request(request("/agent/v1/heartbeat", Some(body))?).await?;
    let status = response.status();
    response.into_body().collect().await?;
    if !status.is_success() {
        bail!("heartbeat answered {status}");
    }
    Ok(())
}

/// A heartbeat as a current agent sends it: capacity and health every
/// time, a usage sample with five containers every sixth time (every 30 s
/// at a 5 s interval).
pub fn heartbeat_body(round: u64) -> Bytes {
    let mut body = json!({
        "cpu_cores": 8, "mem_bytes": 34359738368u64, "disk_bytes": 536870912000u64,
        "health": {"registry": {"configured": true, "reachable": true}, "mesh": {"peers": 3, "connected": 3},
                   "features": ["static-sites"]}
    });
    if round.is_multiple_of(6) {
        let containers: Vec<_> = (0..5)
            .map(|i| json!({"container": format!("cw-app{i}-1"), "cpu_cores": 0.25, "mem_bytes": 104857600, "mem_limit": 536870912, "restarts": 0, "started_at": "2026-11-29T10:00:00Z"}))
            .collect();
        body["metrics"] = json!({"node": {"cpu_pct": 12.5, "mem_used": 8589934592u64, "disk_used": 128849018880u64}, "containers": containers, "omitted": 0});
    }
    Bytes::from(body.to_string())
}

/// What the fleet did, shared by its agents.
pub struct Stats {
    epoch: Instant,
    pub sent: AtomicU64,
    pub failed: AtomicU64,
    /// Connections opened, the first ones included.
    pub connects: AtomicU64,
    /// Event streams that could not be opened.
    pub stream_failures: AtomicU64,
    /// Heartbeat latencies (µs) while `recording` is set.
    pub latencies: Mutex<Vec<u32>>,
    pub recording: AtomicBool,
    /// Per agent: when its last heartbeat was taken, in ms since `epoch`
    /// plus one (zero: never).
    last_ok: Vec<AtomicU64>,
    /// Per agent: when its event stream last opened (the same way).
    stream_up: Vec<AtomicU64>,
    event_stream: bool,
}

impl Stats {
    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64 + 1
    }

    /// Agents with a heartbeat taken at or after `since` (and, with event
    /// streams, their stream opened again since then).
    pub fn back_since(&self, since: Instant) -> usize {
        let since = since.saturating_duration_since(self.epoch).as_millis() as u64 + 1;
        (0..self.last_ok.len())
            .filter(|&i| self.last_ok[i].load(Ordering::Relaxed) >= since && (!self.event_stream || self.stream_up[i].load(Ordering::Relaxed) >= since))
            .count()
    }
}

/// The running fleet; its agents stop on drop.
pub struct Fleet {
    pub stats: Arc<Stats>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for Fleet {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

type Shared = Arc<tokio::sync::Mutex<Option<Sender>>>;

impl Fleet {
    /// Connects every agent (`handshakes` at a time, as enrolment would
    /// spread them; with `event_stream` its stream too), then starts them
    /// heartbeating every `interval`, spread evenly over it. Returns once
    /// every agent is connected.
    pub async fn start(control: &ControlPlane, agents: Vec<Enrolled>, interval: Duration, handshakes: usize, event_stream: bool) -> Result<Fleet> {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(CertificateDer::from_pem_slice(control.ca_pem.as_bytes())?)?;
        let roots = Arc::new(roots);
        let count = agents.len();
        let stats = Arc::new(Stats {
            epoch: Instant::now(),
            sent: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            connects: AtomicU64::new(0),
            stream_failures: AtomicU64::new(0),
            latencies: Mutex::new(Vec::with_capacity(count * 16)),
            recording: AtomicBool::new(false),
            last_ok: (0..count).map(|_| AtomicU64::new(0)).collect(),
            stream_up: (0..count).map(|_| AtomicU64::new(0)).collect(),
            event_stream,
        });
        let port = control.agent_port;
        let connected: Vec<Result<(Agent, Option<Response>)>> = stream::iter(agents.into_iter().enumerate())
            .map(|(index, agent)| {
                let (roots, stats) = (roots.clone(), stats.clone());
                async move {
                    let tls = tls(&roots, &agent)?;
                    let agent = Agent { index, tls, port, interval, stats, first: Instant::now(), connection: Arc::new(tokio::sync::Mutex::new(None)) };
                    let sender = agent.connect().await.with_context(|| format!("agent {index} connecting"))?;
                    *agent.connection.lock().await = Some(sender);
                    let stream = if event_stream { Some(agent.open_stream().await.with_context(|| format!("agent {index} opening its event stream"))?) } else { None };
                    Ok((agent, stream))
                }
            })
            .buffer_unordered(handshakes.max(1))
            .collect()
            .await;
        let epoch = Instant::now() + Duration::from_millis(500);
        let mut tasks = Vec::with_capacity(2 * count);
        for result in connected {
            let (mut agent, stream) = result?;
            agent.first = epoch + interval.mul_f64(agent.index as f64 / count as f64);
            let agent = Arc::new(agent);
            if let Some(stream) = stream {
                tasks.push(tokio::spawn(agent.clone().stream_loop(stream)));
            }
            tasks.push(tokio::spawn(agent.heartbeat_loop()));
        }
        Ok(Fleet { stats, tasks })
    }

    /// Simulated agents.
    pub fn len(&self) -> usize {
        self.stats.last_ok.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Agent tasks that stopped (none should: an agent retries for ever).
    pub fn gave_up(&self) -> usize {
        self.tasks.iter().filter(|task| task.is_finished()).count()
    }

    /// Waits until every agent is back since `since` (see
    /// [`Stats::back_since`]); the time that took from `since`, or `None`
    /// past `limit` (with how many made it).
    pub async fn all_back_since(&self, since: Instant, limit: Duration) -> std::result::Result<Duration, usize> {
        loop {
            let done = self.stats.back_since(since);
            if done == self.len() {
                return Ok(since.elapsed());
            }
            if since.elapsed() > limit {
                return Err(done);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

type Response = hyper::Response<hyper::body::Incoming>;

struct Agent {
    index: usize,
    tls: TlsConnector,
    port: u16,
    interval: Duration,
    stats: Arc<Stats>,
    first: Instant,
    /// The request connection (the agent's client pool of one).
    connection: Shared,
}

impl Agent {
    async fn connect(&self) -> Result<Sender> {
        let sender = tokio::time::timeout(CONNECT_TIMEOUT, connect(&self.tls, source_address(self.index), self.port)).await.context("connect timed out")??;
        self.stats.connects.fetch_add(1, Ordering::Relaxed);
        Ok(sender)
    }

    /// A request on the request connection, opening a new one when it is
    /// closed (as a pool does); the connection is dropped after a failure.
    async fn request(&self, request: hyper::Request<Full<Bytes>>) -> Result<()> {
        let mut connection = self.connection.lock().await;
        let outcome = tokio::time::timeout(REQUEST_TIMEOUT, async {
            if connection.as_ref().is_none_or(|s| s.is_closed()) {
                *connection = None;
                *connection = Some(self.connect().await?);
            }
            let sender = connection.as_mut().expect("connected");
            sender.ready().await?;
            let response = sender.send_request(request).await?;
            let status = response.status();
            response.into_body().collect().await?;
            if !status.is_success() {
                bail!("answered {status}");
            }
            Ok(())
        })
        .await
        .unwrap_or_else(|_| Err(anyhow::anyhow!("timed out")));
        if outcome.is_err() {
            *connection = None;
        }
        outcome
    }

    async fn heartbeat_loop(self: Arc<Self>) {
        let mut next = self.first;
        let mut round: u64 = 0;
        loop {
            tokio::time::sleep_until(next.into()).await;
            round += 1;
            let started = Instant::now();
            let outcome = match request("/agent/v1/heartbeat", Some(heartbeat_body(round))) {
                Ok(request) => self.request(request).await,
                Err(err) => Err(err),
            };
            let took = started.elapsed();
            self.stats.sent.fetch_add(1, Ordering::Relaxed);
            if outcome.is_ok() {
                self.stats.last_ok[self.index].store(self.stats.now_ms(), Ordering::Relaxed);
                if self.stats.recording.load(Ordering::Relaxed) {
                    let micros = took.as_micros().min(u128::from(u32::MAX)) as u32;
                    self.stats.latencies.lock().expect("latency lock").push(micros);
                }
                // On the agent's schedule; a slow answer does not bunch
                // the next ones up.
                next += self.interval;
                if next < Instant::now() {
                    next = Instant::now() + self.interval;
                }
            } else {
                // `next_delay`: the normal interval.
                self.stats.failed.fetch_add(1, Ordering::Relaxed);
                next = Instant::now() + self.interval;
            }
        }
    }

    /// `GET /agent/v1/stream` on a new connection: the response, once its
    /// head says 200.
    async fn open_stream(&self) -> Result<Response> {
        let opened = tokio::time::timeout(REQUEST_TIMEOUT, async {
            let mut sender = self.connect().await?;
            sender.ready().await?;
            let response = sender.send_request(request("/agent/v1/stream", None)?).await?;
            if !response.status().is_success() {
                bail!("stream answered {}", response.status());
            }
            Ok(response)
        })
        .await
        .unwrap_or_else(|_| Err(anyhow::anyhow!("timed out")));
        match &opened {
            Ok(_) => self.stats.stream_up[self.index].store(self.stats.now_ms(), Ordering::Relaxed),
            Err(_) => {
                self.stats.stream_failures.fetch_add(1, Ordering::Relaxed);
            }
        }
        opened
    }

    /// `command_loop`: read the stream until it ends, then 1 s later open
    /// it again, doubling the wait after each failure up to 30 s; read the
    /// commands after each try.
    async fn stream_loop(self: Arc<Self>, first: Response) {
        let mut stream = Some(first);
        let mut backoff = Duration::from_secs(1);
        loop {
            match stream.take() {
                Some(response) => {
                    backoff = Duration::from_secs(1);
                    self.commands().await;
                    let mut body = response.into_body();
                    while let Some(Ok(_)) = body.frame().await {}
                }
                None => self.commands().await,
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(30));
            stream = self.open_stream().await.ok();
        }
    }

    async fn commands(&self) {
        if let Ok(request) = request("/agent/v1/commands", None) {
            let _ = self.request(request).await;
        }
    }
}

/// A request to the agent listener: a POST with a JSON body, or a GET.
pub fn request(path: &str, body: Option<Bytes>) -> Result<hyper::Request<Full<Bytes>>> {
    let builder = match body {
        Some(_) => hyper::Request::post(path).header("content-type", "application/json"),
        None => hyper::Request::get(path),
    };
    Ok(builder
        .header("host", "127.0.0.1")
        .header(PROTOCOL.0, PROTOCOL.1)
        .header(AGENT_VERSION.0, AGENT_VERSION.1)
        .body(Full::new(body.unwrap_or_default()))?)
}
