//! `cloudweb-server join-token`: asks a running control plane for a join
//! token through its user API and prints the fields a script needs, one per
//! line, so installers never pick JSON apart with text tools.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context};
use http_body_util::BodyExt;

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum Field {
    /// The single-use token.
    Token,
    /// SHA-256 (hex) of the cluster CA, for `cloudweb-agent join --ca-sha256`.
    CaSha256,
    /// When the token expires (RFC 3339).
    ExpiresAt,
    /// The line to paste on a new node.
    Command,
}

impl Field {
    fn key(self) -> &'static str {
        match self {
            Field::Token => "token",
            Field::CaSha256 => "ca_sha256",
            Field::ExpiresAt => "expires_at",
            Field::Command => "command",
        }
    }
}

#[derive(clap::Parser)]
pub struct JoinTokenArgs {
    /// Address of the control plane's user API.
    #[arg(long, default_value = "127.0.0.1:8080")]
    api_address: SocketAddr,
    /// File holding an admin API token.
    #[arg(long, default_value = "/var/lib/cloudweb/admin-token")]
    admin_token_file: PathBuf,
    /// Field to print (repeatable; one line each, in the order given).
    #[arg(long = "print", value_enum, default_values_t = [Field::Command])]
    print: Vec<Field>,
}

const TIMEOUT: Duration = Duration::from_secs(10);

pub async fn run(args: JoinTokenArgs) -> anyhow::Result<()> {
    let token = std::fs::read_to_string(&args.admin_token_file)
        .with_context(|| format!("reading {}", args.admin_token_file.display()))?;
    let token = token.trim();
    if token.is_empty() || !token.bytes().all(|b| b.is_ascii_graphic()) {
        bail!("{} does not hold an admin token", args.admin_token_file.display());
    }
    let body = tokio::time::timeout(TIMEOUT, create(args.api_address, token))
        .await
        .with_context(|| format!("no answer from {} within {TIMEOUT:?}", args.api_address))??;
    let created: serde_json::Value = serde_json::from_slice(&body).context("the API answered something that is not JSON")?;
    for field in &args.print {
        let value = created
            .get(field.key())
            .and_then(|v| v.as_str())
            .with_context(|| format!("the answer has no {}", field.key()))?;
        println!("{value}");
    }
    Ok(())
}

/// `POST /api/join-tokens`; the body of a 201.
async fn create(address: SocketAddr, admin_token: &str) -> anyhow::Result<Vec<u8>> {
    let tcp = tokio::net::TcpStream::connect(address).await.with_context(|| format!("connecting to {address}"))?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tcp))
        .await
        .context("HTTP handshake")?;
    let driver = tokio::spawn(connection);
    let request = hyper::Request::post("/api/join-tokens")
        .header(hyper::header::HOST, address.to_string())
        .header(hyper::header::AUTHORIZATION, format!("Bearer {admin_token}"))
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .context("building the request")?;
    let response = sender.send_request(request).await.context("sending the request")?;
    let status = response.status();
    let body = response.into_body().collect().await.context("reading the answer")?.to_bytes();
    driver.abort();
    if status != hyper::StatusCode::CREATED {
        bail!("POST /api/join-tokens answered {status}: {}", String::from_utf8_lossy(&body).trim());
    }
    Ok(body.to_vec())
}
