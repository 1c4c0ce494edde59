//! The agent's only way out: HTTPS to the control plane's agent listener.
//! Joining pins the cluster CA by the SHA-256 of its certificate before any
//! request byte (and so the join token) is sent; afterwards every request
//! presents the node's client certificate and trusts only the cluster CA.
//! Every request carries the two version headers.
//!
//! Two answers change how the whole agent talks to the control plane, so
//! they are handled here, once, for every request:
//! - a 426 closes a gate shared by every caller (heartbeats, commands,
//!   routes, registry checks, reports): until the retry pace has passed no
//!   request goes out at all, then one request probes, and only an answer
//!   other than 426 opens the gate again;
//! - a 403 whose body says `node_not_registered` means an administrator
//!   removed this node: [`ControlPlane::removed`] fires so `run` can stop.
//!
//! The node's certificate can change while the agent runs (a renewal, see
//! [`crate::renew`]): [`ControlPlane::set_identity`] swaps the TLS identity
//! of every later request; requests already sent finish on the old one.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use cloudweb_protocol::version::{HEADER_AGENT_VERSION, HEADER_PROTOCOL};
use cloudweb_protocol::{
    paths, CommandList, ErrorBody, Heartbeat, JoinRequest, JoinResponse, LeaveResponse, PeerList, RegistryConfig,
    RenewRequest, RenewResponse, Report, RouteTable, UpgradeRequired,
};
use reqwest::{RequestBuilder, StatusCode};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use sha2::{Digest, Sha256};

use crate::identity::Identity;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("the control plane's CA does not match --ca-sha256: expected {expected}, the server presented {presented}; nothing was sent")]
    CaMismatch { expected: String, presented: String },
    #[error("the control plane does not speak this agent's protocol: {}", .0.error)]
    UpgradeRequired(UpgradeRequired),
    #[error("control plane answered {status}: {message}")]
    Status { status: u16, message: String },
    #[error("cannot reach the control plane: {0}")]
    Transport(String),
    #[error("unexpected answer from the control plane: {0}")]
    Decode(String),
    #[error("tls setup: {0}")]
    Tls(String),
    /// Not sent: the control plane answered 426 and the shared gate holds
    /// every request until the retry pace has passed.
    #[error("held for {retry_in_seconds} s more: the control plane asked for an upgrade ({})", .body.error)]
    Held { retry_in_seconds: u64, body: UpgradeRequired },
    /// 403 with `node_not_registered`: this node was removed.
    #[error("this node is no longer registered with the control plane: {0}")]
    Removed(String),
    /// 401 with `certificate_replaced`: sent with a certificate a renewal
    /// replaced (a request that raced the switch). Sending it again uses
    /// the new one.
    #[error("sent with a replaced certificate: {0}")]
    CertificateReplaced(String),
}

impl ClientError {
    pub fn status(&self) -> Option<u16> {
        match self {
            ClientError::Status { status, .. } => Some(*status),
            ClientError::UpgradeRequired(_) => Some(426),
            ClientError::Removed(_) => Some(403),
            ClientError::CertificateReplaced(_) => Some(401),
            _ => None,
        }
    }

    /// Whether sending the same request again can never succeed: a 4xx
    /// answer other than 408 (timeout), 426 (upgrade: retried slowly) and
    /// 429 (too many requests).
    pub fn is_permanent(&self) -> bool {
        matches!(self, ClientError::Status { status: 400..=499, .. }) && !matches!(self.status(), Some(408 | 426 | 429))
    }
}

/// Parses `--ca-sha256`: 64 hex digits.
pub fn parse_fingerprint(text: &str) -> Result<[u8; 32], String> {
    let bytes = hex::decode(text.trim()).map_err(|_| "--ca-sha256 must be 64 hexadecimal digits".to_string())?;
    bytes.try_into().map_err(|_| "--ca-sha256 must be 64 hexadecimal digits".to_string())
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn base_builder() -> rustls::ConfigBuilder<ClientConfig, rustls::WantsVerifier> {
    ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .expect("ring supports TLS 1.3")
}

/// Verifies the control plane against the cluster CA (rustls's own
/// verifier does all the checking) and notes the certificate it presents,
/// so a renewed listener certificate shows in the log with its serial.
#[derive(Debug)]
struct NotingCa {
    inner: Arc<WebPkiServerVerifier>,
    seen: Arc<Mutex<Option<String>>>,
}

impl ServerCertVerifier for NotingCa {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let verified = self.inner.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)?;
        let sha256 = hex::encode(Sha256::digest(end_entity.as_ref()));
        let mut seen = self.seen.lock().expect("server cert lock");
        if seen.as_deref() != Some(sha256.as_str()) {
            let (serial, not_after) = x509_parser::parse_x509_certificate(end_entity.as_ref())
                .map(|(_, c)| (hex::encode(c.raw_serial()), c.validity().not_after.to_string()))
                .unwrap_or_default();
            if seen.replace(sha256.clone()).is_some() {
                tracing::info!(%serial, %sha256, %not_after, "the control plane presents a new certificate");
            } else {
                tracing::debug!(%serial, %sha256, %not_after, "the control plane's certificate");
            }
        }
        Ok(verified)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// Trusts a server only if its chain contains a CA certificate with the
/// pinned fingerprint and the leaf verifies against that CA.
#[derive(Debug)]
struct PinnedCa {
    pin: [u8; 32],
    provider: Arc<CryptoProvider>,
    mismatch: Arc<Mutex<Option<String>>>,
}

impl ServerCertVerifier for PinnedCa {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let Some(ca) = intermediates.iter().find(|c| Sha256::digest(c.as_ref()).as_slice() == self.pin) else {
            let presented = intermediates
                .iter()
                .chain(std::iter::once(end_entity))
                .map(|c| hex::encode(Sha256::digest(c.as_ref())))
                .collect::<Vec<_>>()
                .join(",");
            *self.mismatch.lock().expect("pin lock") = Some(presented);
            return Err(rustls::Error::General("cluster CA fingerprint mismatch".into()));
        };
        let mut roots = RootCertStore::empty();
        roots.add(ca.clone().into_owned())?;
        let verifier = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), self.provider.clone())
            .build()
            .map_err(|e| rustls::Error::General(e.to_string()))?;
        verifier.verify_server_cert(end_entity, &[], server_name, ocsp_response, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider.signature_verification_algorithms.supported_schemes()
    }
}

/// HTTP client for the agent listener.
pub struct ControlPlane {
    /// The replicas it knows and the one requests go to.
    replicas: crate::control_planes::Replicas,
    protocol: u32,
    clients: std::sync::RwLock<Clients>,
    pin_mismatch: Option<(String, Arc<Mutex<Option<String>>>)>,
    gate: Mutex<Gate>,
    /// Pace of requests after a 426.
    upgrade_retry: Duration,
    removed: tokio::sync::watch::Sender<bool>,
    /// SHA-256 (hex) of the last certificate the control plane presented.
    server_cert: Arc<Mutex<Option<String>>>,
}

/// The HTTP clients of one TLS identity.
#[derive(Clone)]
struct Clients {
    http: reqwest::Client,
    /// Same TLS identity, but no overall timeout: for the event stream.
    stream_http: reqwest::Client,
    /// What both were built from, for [`ControlPlane::reset_connections`].
    config: ClientConfig,
}

/// Tells the gate about a request dropped before its answer.
struct Unanswered<'a> {
    client: &'a ControlPlane,
    pass: Pass,
    armed: bool,
}

impl Drop for Unanswered<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.client.abandoned(self.pass);
        }
    }
}

/// The shared 426 gate.
#[derive(Debug)]
enum Gate {
    Open,
    Held {
        until: tokio::time::Instant,
        body: UpgradeRequired,
        /// One request is out to see whether the control plane accepts us
        /// again; the others stay held until it answers.
        probing: bool,
    },
}

/// How a request passed the gate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pass {
    Normal,
    Probe,
}

/// Default pace after a 426: one request every 5 minutes.
pub const DEFAULT_UPGRADE_RETRY: Duration = Duration::from_secs(300);

/// How long one ordinary request may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// The server sends a keep-alive every 15 s; three missed ones mean the
/// stream is dead.
const STREAM_READ_TIMEOUT: Duration = Duration::from_secs(45);

impl ControlPlane {
    /// Returns once another control-plane replica than the one before
    /// answers a request with success (the agent found the new leader).
    pub async fn found_another_replica(&self) {
        self.replicas.found_another().await;
    }

    /// A client for joining: no client certificate, CA pinned by hash.
    pub fn for_join(server: &str, pin: [u8; 32], protocol: u32) -> Result<ControlPlane, ClientError> {
        let mismatch = Arc::new(Mutex::new(None));
        let verifier = PinnedCa { pin, provider: provider(), mismatch: mismatch.clone() };
        let mut config = base_builder().dangerous().with_custom_certificate_verifier(Arc::new(verifier)).with_no_client_auth();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let mut client = Self::build(server, protocol, config)?;
        client.pin_mismatch = Some((hex::encode(pin), mismatch));
        Ok(client)
    }

    /// A client for a joined node: client certificate, cluster CA as root.
    pub fn for_node(identity: &Identity, protocol: u32) -> Result<ControlPlane, ClientError> {
        let seen = Arc::new(Mutex::new(None));
        let mut client = Self::build(&identity.info.server, protocol, Self::node_tls(identity, seen.clone())?)?;
        client.server_cert = seen;
        Ok(client)
    }

    /// Keeps the list of control-plane replicas it learns in `file`, and
    /// starts from the one kept there.
    pub fn keeping_replicas_in(mut self, file: std::path::PathBuf) -> ControlPlane {
        let joined = self.replicas.all().remove(0);
        self.replicas = crate::control_planes::Replicas::new(&joined, Some(file));
        self
    }

    /// The replicas this client knows (see [`crate::control_planes`]).
    pub fn replicas(&self) -> &crate::control_planes::Replicas {
        &self.replicas
    }

    /// From now on, requests present `identity`'s certificate (after a
    /// renewal). Connections of the old identity are not reused.
    pub fn set_identity(&self, identity: &Identity) -> Result<(), ClientError> {
        let clients = Self::clients(Self::node_tls(identity, self.server_cert.clone())?)?;
        *self.clients.write().expect("clients lock") = clients;
        Ok(())
    }

    /// Drops the pooled connections: later requests open new ones, with
    /// the same TLS identity. For a node whose own address changed, whose
    /// pooled connections are bound to the lost address and would only
    /// time out. Requests already sent finish (or time out) on the old ones.
    pub fn reset_connections(&self) -> Result<(), ClientError> {
        let config = self.clients.read().expect("clients lock").config.clone();
        let clients = Self::clients(config)?;
        *self.clients.write().expect("clients lock") = clients;
        Ok(())
    }

    fn node_tls(identity: &Identity, seen: Arc<Mutex<Option<String>>>) -> Result<ClientConfig, ClientError> {
        let ca = CertificateDer::from_pem_slice(identity.ca_pem.as_bytes()).map_err(|e| ClientError::Tls(format!("ca.crt: {e}")))?;
        let cert = CertificateDer::from_pem_slice(identity.cert_pem.as_bytes()).map_err(|e| ClientError::Tls(format!("node.crt: {e}")))?;
        let key = PrivateKeyDer::from_pem_slice(identity.key_pem.as_bytes()).map_err(|e| ClientError::Tls(format!("node.key: {e}")))?;
        let mut roots = RootCertStore::empty();
        roots.add(ca).map_err(|e| ClientError::Tls(e.to_string()))?;
        let inner = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider()).build().map_err(|e| ClientError::Tls(e.to_string()))?;
        let mut config = base_builder()
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(NotingCa { inner, seen }))
            .with_client_auth_cert(vec![cert], key)
            .map_err(|e| ClientError::Tls(e.to_string()))?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(config)
    }

    fn clients(config: ClientConfig) -> Result<Clients, ClientError> {
        let http = reqwest::Client::builder()
            .use_preconfigured_tls(config.clone())
            .timeout(REQUEST_TIMEOUT)
            .connect_timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| ClientError::Tls(e.to_string()))?;
        let stream_http = reqwest::Client::builder()
            .use_preconfigured_tls(config.clone())
            .connect_timeout(Duration::from_secs(10))
            .read_timeout(STREAM_READ_TIMEOUT)
            .build()
            .map_err(|e| ClientError::Tls(e.to_string()))?;
        Ok(Clients { http, stream_http, config })
    }

    fn build(server: &str, protocol: u32, config: ClientConfig) -> Result<ControlPlane, ClientError> {
        Ok(ControlPlane {
            replicas: crate::control_planes::Replicas::new(server, None),
            protocol,
            clients: std::sync::RwLock::new(Self::clients(config)?),
            pin_mismatch: None,
            gate: Mutex::new(Gate::Open),
            upgrade_retry: DEFAULT_UPGRADE_RETRY,
            removed: tokio::sync::watch::Sender::new(false),
            server_cert: Arc::new(Mutex::new(None)),
        })
    }

    /// Sets the pace of requests after a 426.
    pub fn with_upgrade_retry(mut self, pace: Duration) -> ControlPlane {
        self.upgrade_retry = pace;
        self
    }

    /// Resolves once the control plane said this node is not registered.
    pub async fn removed(&self) {
        let mut receiver = self.removed.subscribe();
        let _ = receiver.wait_for(|removed| *removed).await;
    }

    /// Lets a request out, or says how long the 426 gate still holds it.
    fn pass(&self) -> Result<Pass, ClientError> {
        let mut gate = self.gate.lock().expect("gate lock");
        match &mut *gate {
            Gate::Open => Ok(Pass::Normal),
            Gate::Held { until, probing, .. } if !*probing && tokio::time::Instant::now() >= *until => {
                *probing = true;
                Ok(Pass::Probe)
            }
            Gate::Held { until, body, .. } => Err(ClientError::Held {
                retry_in_seconds: until.saturating_duration_since(tokio::time::Instant::now()).as_secs(),
                body: body.clone(),
            }),
        }
    }

    /// Updates the gate with a request's outcome.
    fn passed(&self, pass: Pass, result: &Result<reqwest::Response, ClientError>) {
        let mut gate = self.gate.lock().expect("gate lock");
        match result {
            Err(ClientError::UpgradeRequired(body)) => {
                *gate = Gate::Held { until: tokio::time::Instant::now() + self.upgrade_retry, body: body.clone(), probing: false };
            }
            // No answer at all says nothing about the version: the next
            // request probes again.
            Err(ClientError::Transport(_)) if pass == Pass::Probe => {
                if let Gate::Held { probing, .. } = &mut *gate {
                    *probing = false;
                }
            }
            Err(ClientError::Transport(_)) => {}
            _ => {
                if matches!(*gate, Gate::Held { .. }) {
                    tracing::info!("the control plane accepts this agent again; back to the normal pace");
                }
                *gate = Gate::Open;
            }
        }
    }

    /// The gate's view of a request its caller dropped before the answer
    /// (a heartbeat abandoned after an address change): no answer, so a
    /// probe ends as one that got none.
    fn abandoned(&self, pass: Pass) {
        if pass == Pass::Probe {
            if let Gate::Held { probing, .. } = &mut *self.gate.lock().expect("gate lock") {
                *probing = false;
            }
        }
    }

    fn http(&self) -> reqwest::Client {
        self.clients.read().expect("clients lock").http.clone()
    }

    fn stream_http(&self) -> reqwest::Client {
        self.clients.read().expect("clients lock").stream_http.clone()
    }

    fn url(&self, path: &str) -> String {
        format!("{}{}", self.replicas.current(), path)
    }

    fn headers(&self, request: RequestBuilder) -> RequestBuilder {
        request.header(HEADER_AGENT_VERSION, crate::AGENT_VERSION).header(HEADER_PROTOCOL, self.protocol.to_string())
    }

    async fn send(&self, request: RequestBuilder) -> Result<reqwest::Response, ClientError> {
        let pass = self.pass()?;
        let mut unanswered = Unanswered { client: self, pass, armed: true };
        let result = self.send_now(request).await;
        unanswered.armed = false;
        self.passed(pass, &result);
        result
    }

    async fn send_now(&self, request: RequestBuilder) -> Result<reqwest::Response, ClientError> {
        // The replica the request was built for (it moves only when a
        // request fails, so this is the one in all but a race).
        let replica = self.replicas.current();
        let response = match self.headers(request).send().await {
            Ok(response) => response,
            Err(err) => {
                let err = self.transport_error(err);
                if matches!(err, ClientError::Transport(_)) {
                    self.replicas.fail_over(&replica, None);
                }
                return Err(err);
            }
        };
        let status = response.status();
        if status.is_success() {
            self.replicas.answered(&replica);
            return Ok(response);
        }
        let body = response.bytes().await.unwrap_or_default();
        if status == StatusCode::UPGRADE_REQUIRED {
            if let Ok(upgrade) = serde_json::from_slice::<UpgradeRequired>(&body) {
                return Err(ClientError::UpgradeRequired(upgrade));
            }
        }
        let (message, code, leader) = match serde_json::from_slice::<ErrorBody>(&body) {
            Ok(body) => (body.error, body.code, body.leader),
            Err(_) => (String::from_utf8_lossy(&body[..body.len().min(300)]).into_owned(), None, None),
        };
        if status == StatusCode::SERVICE_UNAVAILABLE && code.as_deref() == Some(cloudweb_protocol::error_codes::NOT_LEADER) {
            self.replicas.fail_over(&replica, leader.as_deref());
        }
        if status == StatusCode::FORBIDDEN && code.as_deref() == Some(cloudweb_protocol::error_codes::NODE_NOT_REGISTERED) {
            self.removed.send_replace(true);
            return Err(ClientError::Removed(message));
        }
        if status == StatusCode::UNAUTHORIZED && code.as_deref() == Some(cloudweb_protocol::error_codes::CERTIFICATE_REPLACED) {
            return Err(ClientError::CertificateReplaced(message));
        }
        Err(ClientError::Status { status: status.as_u16(), message })
    }

    fn transport_error(&self, err: reqwest::Error) -> ClientError {
        if let Some((expected, slot)) = &self.pin_mismatch {
            if let Some(presented) = slot.lock().expect("pin lock").take() {
                return ClientError::CaMismatch { expected: expected.clone(), presented };
            }
        }
        let mut text = err.to_string();
        let mut source = std::error::Error::source(&err);
        while let Some(inner) = source {
            text.push_str(": ");
            text.push_str(&inner.to_string());
            source = inner.source();
        }
        ClientError::Transport(text)
    }

    async fn json<T: serde::de::DeserializeOwned>(response: reqwest::Response) -> Result<T, ClientError> {
        let bytes = response.bytes().await.map_err(|e| ClientError::Transport(e.to_string()))?;
        serde_json::from_slice(&bytes).map_err(|e| ClientError::Decode(e.to_string()))
    }

    pub async fn join(&self, request: &JoinRequest) -> Result<JoinResponse, ClientError> {
        let response = self.send(self.http().post(self.url(paths::JOIN)).json(request)).await?;
        Self::json(response).await
    }

    /// Sends a heartbeat; the replicas its answer lists become the ones
    /// this client knows.
    pub async fn heartbeat(&self, heartbeat: &Heartbeat) -> Result<(), ClientError> {
        let response = self.send(self.http().post(self.url(paths::HEARTBEAT)).json(heartbeat)).await?;
        // An answer that does not parse (an older server's) is still a
        // heartbeat taken.
        if let Ok(answer) = Self::json::<cloudweb_protocol::heartbeat::HeartbeatAnswer>(response).await {
            self.replicas.learn(&answer.control_planes);
        }
        Ok(())
    }

    pub async fn commands(&self) -> Result<CommandList, ClientError> {
        let response = self.send(self.http().get(self.url(paths::COMMANDS))).await?;
        Self::json(response).await
    }

    pub async fn ack(&self, command_id: &str) -> Result<(), ClientError> {
        self.send(self.http().post(self.url(&paths::ack(command_id)))).await.map(drop)
    }

    /// Sends a report with its free text made valid first (one-line,
    /// length-capped message), so a multi-line error never gets it refused.
    pub async fn report(&self, report: &Report) -> Result<(), ClientError> {
        let mut report = report.clone();
        report.sanitize();
        self.send(self.http().post(self.url(paths::REPORT)).json(&report)).await.map(drop)
    }

    /// Reports on a volume move (see [`crate::volume_moves`]).
    pub async fn volume_move(&self, move_id: &str, report: &cloudweb_protocol::MoveReport) -> Result<(), ClientError> {
        self.send(self.http().post(self.url(&paths::volume_move(move_id))).json(report)).await.map(drop)
    }

    /// Reports on a backup job (see [`crate::backups`]), its free text made
    /// valid first.
    pub async fn backup_job(&self, job_id: &str, report: &cloudweb_protocol::BackupJobReport) -> Result<(), ClientError> {
        let mut report = report.clone();
        for text in [&mut report.message, &mut report.detail].into_iter().flatten() {
            *text = cloudweb_protocol::misc::one_line(text, cloudweb_protocol::misc::MAX_REPORT_MESSAGE);
        }
        self.send(self.http().post(self.url(&paths::backup_job(job_id))).json(&report)).await.map(drop)
    }

    /// Reports on a task run (see [`crate::tasks`]), its message made one
    /// valid line first.
    pub async fn task_run(&self, run_id: &str, report: &cloudweb_protocol::TaskRunReport) -> Result<(), ClientError> {
        let mut report = report.clone();
        if let Some(message) = &mut report.message {
            *message = cloudweb_protocol::misc::one_line(message, cloudweb_protocol::tasks::MAX_MESSAGE_BYTES);
        }
        self.send(self.http().post(self.url(&paths::task_run(run_id))).json(&report)).await.map(drop)
    }

    /// Dials back to `dial_url` (the control-plane replica that holds a
    /// session's user side) for session `session_id`: an HTTP/1.1 upgrade
    /// to session frames, with this node's certificate. Ten seconds for the
    /// answer; the upgraded stream has no timeout of its own (the session
    /// pings and the control plane times it out).
    pub async fn dial_session(&self, dial_url: &str, session_id: &str) -> Result<reqwest::Upgraded, ClientError> {
        let url = format!("{}{}", dial_url.trim_end_matches('/'), paths::session_attach(session_id));
        let request = self
            .headers(self.stream_http().post(url))
            .header(reqwest::header::CONNECTION, "upgrade")
            .header(reqwest::header::UPGRADE, cloudweb_protocol::sessions::UPGRADE);
        let response = match tokio::time::timeout(Duration::from_secs(10), request.send()).await {
            Ok(Ok(response)) => response,
            Ok(Err(err)) => return Err(ClientError::Transport(err.to_string())),
            Err(_) => return Err(ClientError::Transport("no answer to the session dial-back within 10 s".to_string())),
        };
        if response.status() != StatusCode::SWITCHING_PROTOCOLS {
            let status = response.status().as_u16();
            let text = response.text().await.unwrap_or_default();
            let message = serde_json::from_str::<cloudweb_protocol::ErrorBody>(&text).map(|b| b.error).unwrap_or(text);
            return Err(ClientError::Status { status, message: cloudweb_protocol::misc::one_line(&message, 300) });
        }
        response.upgrade().await.map_err(|e| ClientError::Transport(format!("the session dial-back did not upgrade: {e}")))
    }

    /// Uploads runtime log lines (see [`crate::logs`]).
    pub async fn upload_logs(&self, upload: &cloudweb_protocol::LogUpload) -> Result<cloudweb_protocol::LogUploadResponse, ClientError> {
        let mut upload = upload.clone();
        upload.sanitize();
        let response = self.send(self.http().post(self.url(paths::LOGS)).json(&upload)).await?;
        Self::json(response).await
    }

    pub async fn upload_service_logs(&self, upload: &cloudweb_protocol::ServiceLogUpload) -> Result<cloudweb_protocol::LogUploadResponse, ClientError> {
        let mut upload = upload.clone();
        upload.sanitize();
        let response = self.send(self.http().post(self.url(paths::SERVICE_LOGS)).json(&upload)).await?;
        Self::json(response).await
    }

    pub async fn leave(&self, force: bool) -> Result<LeaveResponse, ClientError> {
        let path = if force { format!("{}?force=1", paths::LEAVE) } else { paths::LEAVE.to_string() };
        let response = self.send(self.http().post(self.url(&path))).await?;
        Self::json(response).await
    }

    pub async fn peers(&self) -> Result<PeerList, ClientError> {
        Self::json(self.send(self.http().get(self.url(paths::PEERS))).await?).await
    }

    pub async fn routes(&self) -> Result<RouteTable, ClientError> {
        Self::json(self.send(self.http().get(self.url(paths::ROUTES))).await?).await
    }

    /// The ACME certificates, or only their version when `known` is it.
    pub async fn certificates(&self, known: Option<&str>) -> Result<cloudweb_protocol::CertificateSet, ClientError> {
        let mut request = self.http().get(self.url(paths::CERTIFICATES));
        if let Some(known) = known {
            request = request.query(&[("known", known)]);
        }
        Self::json(self.send(request).await?).await
    }

    /// The pending TLS-ALPN-01 challenges; `applied` is the version this
    /// ingress has put in place.
    pub async fn tls_alpn(&self, applied: Option<&str>) -> Result<cloudweb_protocol::TlsAlpnChallenges, ClientError> {
        let mut request = self.http().get(self.url(paths::ACME_TLS_ALPN));
        if let Some(applied) = applied {
            request = request.query(&[("applied", applied)]);
        }
        Self::json(self.send(request).await?).await
    }

    /// The key authorization of a pending HTTP-01 challenge; `None` when
    /// the control plane has no challenge with this token.
    pub async fn acme_challenge(&self, token: &str) -> Result<Option<String>, ClientError> {
        match self.send(self.http().get(self.url(&paths::acme_challenge(token)))).await {
            Ok(response) => {
                let bytes = response.bytes().await.map_err(|e| ClientError::Transport(e.to_string()))?;
                String::from_utf8(bytes.to_vec()).map(Some).map_err(|_| ClientError::Decode("a key authorization that is not UTF-8".to_string()))
            }
            Err(ClientError::Status { status: 404, .. }) => Ok(None),
            Err(err) => Err(err),
        }
    }

    pub async fn registry(&self) -> Result<RegistryConfig, ClientError> {
        Self::json(self.send(self.http().get(self.url(paths::REGISTRY))).await?).await
    }

    /// Asks for a new certificate for the key of `csr` (PEM).
    pub async fn renew(&self, csr: &str) -> Result<RenewResponse, ClientError> {
        let request = RenewRequest { csr: csr.to_string() };
        Self::json(self.send(self.http().post(self.url(paths::RENEW)).json(&request)).await?).await
    }

    /// Opens the event stream; read it with [`crate::run::SseReader`].
    pub async fn open_stream(&self) -> Result<reqwest::Response, ClientError> {
        self.send(self.stream_http().get(self.url(paths::STREAM)).header("accept", "text/event-stream")).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fingerprints() {
        assert!(parse_fingerprint(&"ab".repeat(32)).is_ok());
        assert!(parse_fingerprint("abc").is_err());
        assert!(parse_fingerprint(&"zz".repeat(32)).is_err());
        assert!(parse_fingerprint(&"ab".repeat(33)).is_err());
    }
}
