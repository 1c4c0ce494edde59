//! The user API over HTTP(S), with the bearer token. Every non-2xx answer
//! becomes [`Failure::Action`] with the server's `error` text and status.

use std::time::Duration;

use cloudweb_api_types::ErrorBody;
use reqwest::Method;
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::config::Config;
use crate::Failure;

pub struct Api {
    http: reqwest::Client,
    /// HTTP/1.1 only and no timeout once connected: for the WebSockets of
    /// exec and port-forward sessions (see [`Sessions`]).
    sessions: reqwest::Client,
    /// Without an overall timeout, for streams (a read timeout instead:
    /// the server sends a keep-alive every 15 s).
    streaming: reqwest::Client,
    server: String,
    token: String,
    /// Sent as `X-Cloudweb-Team` (the team new things go to).
    team: Option<String>,
}

/// How a client times requests.
enum Timing {
    Overall(Duration),
    Stream,
    Session,
}

/// What every request waits at most, streams aside.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

impl Api {
    pub fn new(config: &Config) -> Result<Api, Failure> {
        let build = |timing: Timing| -> Result<reqwest::Client, Failure> {
            let mut builder = reqwest::Client::builder()
                .connect_timeout(Duration::from_secs(10))
                .user_agent(concat!("cloudweb-cli/", env!("CARGO_PKG_VERSION")));
            builder = match timing {
                Timing::Overall(timeout) => builder.timeout(timeout),
                Timing::Stream => builder.read_timeout(Duration::from_secs(60)),
                // An upgrade needs HTTP/1.1; a session may be quiet for
                // long (the server closes idle ones).
                Timing::Session => builder.http1_only(),
            };
            if config.server.starts_with("https://") {
                // This build carries no root store of its own: trust the
                // CA file given at login, else the system's bundle.
                let file = config.ca_file.clone().unwrap_or_else(|| "/etc/ssl/certs/ca-certificates.crt".into());
                let pem = std::fs::read(&file).map_err(|e| Failure::Action(format!("cannot read CA file {}: {e}", file.display())))?;
                let certificates = reqwest::Certificate::from_pem_bundle(&pem)
                    .map_err(|e| Failure::Action(format!("CA file {}: {e}", file.display())))?;
                for certificate in certificates {
                    builder = builder.add_root_certificate(certificate);
                }
            }
            builder.build().map_err(|e| Failure::Action(format!("cannot set up HTTP: {e}")))
        };
        Ok(Api {
            http: build(Timing::Overall(REQUEST_TIMEOUT))?,
            streaming: build(Timing::Stream)?,
            sessions: build(Timing::Session)?,
            server: config.server.clone(),
            token: config.token.clone(),
            team: config.team.clone(),
        })
    }

    /// What opens session WebSockets, for tasks of their own.
    pub fn sessions(&self) -> Sessions {
        Sessions { http: self.sessions.clone(), server: self.server.clone(), token: self.token.clone() }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.server)
    }

    /// Sends a request (with `body` as JSON); the answer's status and bytes,
    /// or the server's refusal.
    async fn send<B: Serialize + ?Sized>(&self, method: Method, path: &str, body: Option<&B>) -> Result<(u16, bytes::Bytes), Refused> {
        let unreached = |failure| Refused { status: None, failure };
        let mut request = self.http.request(method, self.url(path)).bearer_auth(&self.token);
        if let Some(team) = &self.team {
            request = request.header("x-cloudweb-team", team);
        }
        if let Some(body) = body {
            request = request.json(body);
        }
        let response = request.send().await.map_err(|e| unreached(self.transport(e)))?;
        let status = response.status();
        let bytes = response.bytes().await.map_err(|e| unreached(self.transport(e)))?;
        if !status.is_success() {
            return Err(Refused { status: Some(status.as_u16()), failure: api_error(status.as_u16(), &bytes) });
        }
        Ok((status.as_u16(), bytes))
    }

    /// Sends a request; its JSON answer as `T`.
    pub async fn call<T: DeserializeOwned, B: Serialize + ?Sized>(&self, method: Method, path: &str, body: Option<&B>) -> Result<T, Failure> {
        self.try_call(method, path, body).await.map_err(|refused| refused.failure)
    }

    /// [`Api::call`], telling a refusal's HTTP status apart (none when the
    /// server was not reached), for callers that try again on some.
    pub async fn try_call<T: DeserializeOwned, B: Serialize + ?Sized>(&self, method: Method, path: &str, body: Option<&B>) -> Result<T, Refused> {
        let (status, bytes) = self.send(method, path, body).await?;
        // With its (successful) status: an answer of another shape is not
        // one that waiting fixes.
        serde_json::from_slice(&bytes)
            .map_err(|e| Refused { status: Some(status), failure: Failure::Action(format!("the server's answer is not what this cloudweb expects: {e}")) })
    }

    /// A request without a body.
    pub async fn post<T: DeserializeOwned>(&self, path: &str) -> Result<T, Failure> {
        self.call(Method::POST, path, NO_BODY).await
    }

    pub async fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T, Failure> {
        self.call(Method::GET, path, NO_BODY).await
    }

    /// A request answered with no body (204).
    pub async fn call_no_answer<B: Serialize + ?Sized>(&self, method: Method, path: &str, body: Option<&B>) -> Result<(), Failure> {
        self.send(method, path, body).await.map(drop).map_err(|refused| refused.failure)
    }

    /// `DELETE`, answered with no body (204).
    pub async fn delete(&self, path: &str) -> Result<(), Failure> {
        self.send(Method::DELETE, path, NO_BODY).await.map(drop).map_err(|refused| refused.failure)
    }

    /// Opens a server-sent event stream.
    pub async fn stream(&self, path: &str) -> Result<reqwest::Response, Failure> {
        self.stream_after(path, None).await.map_err(|refused| refused.failure)
    }

    /// Opens a server-sent event stream again, after the event with id
    /// `last_event_id` (sent as `Last-Event-ID`) where one was seen.
    pub async fn stream_after(&self, path: &str, last_event_id: Option<&str>) -> Result<reqwest::Response, Refused> {
        let mut request = self.streaming.get(self.url(path)).bearer_auth(&self.token).header("accept", "text/event-stream");
        if let Some(id) = last_event_id {
            request = request.header("last-event-id", id);
        }
        let response = request.send().await.map_err(|e| Refused { status: None, failure: self.transport(e) })?;
        let status = response.status();
        if !status.is_success() {
            let bytes = response.bytes().await.unwrap_or_default();
            return Err(Refused { status: Some(status.as_u16()), failure: api_error(status.as_u16(), &bytes) });
        }
        Ok(response)
    }

    fn transport(&self, err: reqwest::Error) -> Failure {
        let mut text = err.to_string();
        let mut source = std::error::Error::source(&err);
        while let Some(inner) = source {
            text.push_str(": ");
            text.push_str(&inner.to_string());
            source = inner.source();
        }
        Failure::Action(format!("cannot reach {}: {text}", self.server))
    }
}

/// Opens the WebSockets of exec and port-forward sessions.
#[derive(Clone)]
pub struct Sessions {
    http: reqwest::Client,
    server: String,
    token: String,
}

pub type SessionSocket = tokio_tungstenite::WebSocketStream<reqwest::Upgraded>;

impl Sessions {
    /// A WebSocket to `path_and_query`; the server's refusal (no such
    /// instance, too many sessions, the node unreachable) as its words.
    pub async fn open(&self, path_and_query: &str) -> Result<SessionSocket, Failure> {
        use tokio_tungstenite::tungstenite::handshake::client::generate_key;
        use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
        let key = generate_key();
        let response = self
            .http
            .get(format!("{}{path_and_query}", self.server))
            .bearer_auth(&self.token)
            .header(reqwest::header::CONNECTION, "upgrade")
            .header(reqwest::header::UPGRADE, "websocket")
            .header("sec-websocket-version", "13")
            .header("sec-websocket-key", &key)
            .send()
            .await
            .map_err(|e| Failure::Action(format!("cannot reach {}: {e}", self.server)))?;
        let status = response.status().as_u16();
        if status != 101 {
            let bytes = response.bytes().await.unwrap_or_default();
            return Err(api_error(status, &bytes));
        }
        let accepted = response.headers().get("sec-websocket-accept").and_then(|v| v.to_str().ok()).map(str::to_string);
        if accepted.as_deref() != Some(derive_accept_key(key.as_bytes()).as_str()) {
            return Err(Failure::Action("the server's WebSocket answer does not match the request".to_string()));
        }
        let upgraded = response.upgrade().await.map_err(|e| Failure::Action(format!("the session did not start: {e}")))?;
        Ok(tokio_tungstenite::WebSocketStream::from_raw_socket(upgraded, tokio_tungstenite::tungstenite::protocol::Role::Client, None).await)
    }
}

/// No request body.
const NO_BODY: Option<&()> = None;

/// A request or stream the server did not answer with success: the HTTP
/// status (none when the server was not reached) and what to tell.
pub struct Refused {
    pub status: Option<u16>,
    pub failure: Failure,
}

/// The server's `{"error": ...}` text with the status.
fn api_error(status: u16, body: &[u8]) -> Failure {
    let message = serde_json::from_slice::<ErrorBody>(body)
        .ok()
        .map(|b| b.error)
        .unwrap_or_else(|| crate::render::clean(&String::from_utf8_lossy(&body[..body.len().min(300)])));
    let hint = match status {
        401 => " (run `cloudweb login` with a valid API token)",
        _ => "",
    };
    Failure::Action(format!("{message}{hint} (HTTP {status})"))
}

/// A path segment, percent-encoded (names are validated by the server;
/// this keeps a stray `/` or `?` from changing the route).
pub fn segment(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'.' | b'~') {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}
