//! The script-facing subcommands of `cloudweb-server`: each asks a running
//! control plane's user API one thing and prints the fields a script needs,
//! one per line, so installers never pick JSON apart with text tools.

pub mod deploy;
pub mod join_token;
pub mod status;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context};
use http_body_util::BodyExt;

/// Where the user API is and the admin token that opens it.
#[derive(Debug, Clone, clap::Args)]
pub struct ApiArgs {
    /// Address of the control plane's user API.
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub api_address: SocketAddr,
    /// File holding an admin API token.
    #[arg(long, default_value = "/var/lib/cloudweb/admin-token")]
    pub admin_token_file: PathBuf,
}

/// How long one request may take.
const TIMEOUT: Duration = Duration::from_secs(10);

/// A user API client for one command: the address and the token read once.
pub struct Api {
    address: SocketAddr,
    token: String,
}

impl Api {
    pub fn open(args: &ApiArgs) -> anyhow::Result<Api> {
        let token = std::fs::read_to_string(&args.admin_token_file).with_context(|| format!("reading {}", args.admin_token_file.display()))?;
        let token = token.trim();
        if token.is_empty() || !token.bytes().all(|b| b.is_ascii_graphic()) {
            bail!("{} does not hold an admin token", args.admin_token_file.display());
        }
        Ok(Api { address: args.api_address, token: token.to_string() })
    }

    /// One request; the status and the body parsed as JSON (`null` when
    /// the body is empty).
    pub async fn call(&self, method: hyper::Method, path: &str, body: Option<&serde_json::Value>) -> anyhow::Result<(hyper::StatusCode, serde_json::Value)> {
        let (status, bytes) = tokio::time::timeout(TIMEOUT, self.send(method.clone(), path, body))
            .await
            .with_context(|| format!("no answer from {} within {TIMEOUT:?}", self.address))??;
        let value = if bytes.is_empty() {
            serde_json::Value::Null
        } else {
            serde_json::from_slice(&bytes).with_context(|| format!("{method} {path} answered {status} with something that is not JSON"))?
        };
        Ok((status, value))
    }

    async fn send(&self, method: hyper::Method, path: &str, body: Option<&serde_json::Value>) -> anyhow::Result<(hyper::StatusCode, Vec<u8>)> {
        let tcp = tokio::net::TcpStream::connect(self.address).await.with_context(|| format!("connecting to {}", self.address))?;
        let (mut sender, connection) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tcp)).await.context("HTTP handshake")?;
        let driver = tokio::spawn(connection);
        let mut request = hyper::Request::builder()
            .method(method)
            .uri(path)
            .header(hyper::header::HOST, self.address.to_string())
            .header(hyper::header::AUTHORIZATION, format!("Bearer {}", self.token));
        let payload = match body {
            Some(body) => {
                request = request.header(hyper::header::CONTENT_TYPE, "application/json");
                bytes::Bytes::from(serde_json::to_vec(body)?)
            }
            None => bytes::Bytes::new(),
        };
        let request = request.body(http_body_util::Full::new(payload)).context("building the request")?;
        let response = sender.send_request(request).await.context("sending the request")?;
        let status = response.status();
        let body = response.into_body().collect().await.context("reading the answer")?.to_bytes();
        driver.abort();
        Ok((status, body.to_vec()))
    }
}

/// The error of an answer that is not the one expected: its status and
/// the API's own `error` text.
pub fn unexpected(what: &str, status: hyper::StatusCode, body: &serde_json::Value) -> anyhow::Error {
    let reason = body.get("error").and_then(|e| e.as_str()).map(str::to_string).unwrap_or_else(|| body.to_string());
    anyhow::anyhow!("{what} answered {status}: {reason}")
}

/// A JSON value as one printed line: strings bare, `null` as an empty
/// line, booleans and numbers as JSON writes them.
pub fn line(value: &serde_json::Value) -> String {
    match value {
        serde_json::Value::String(text) => text.replace(['\n', '\r'], " "),
        serde_json::Value::Null => String::new(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn values_print_as_one_line_each() {
        assert_eq!(line(&json!("running")), "running");
        assert_eq!(line(&json!(true)), "true");
        assert_eq!(line(&json!(null)), "");
        assert_eq!(line(&json!("a\nb")), "a b");
        assert_eq!(line(&json!(3)), "3");
    }
}
