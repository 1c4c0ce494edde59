//! `cloudweb-server join-token`: creates a join token through the user API
//! and prints the fields asked for.

use anyhow::Context;

use super::{line, unexpected, Api, ApiArgs};

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
    #[command(flatten)]
    api: ApiArgs,
    /// Field to print (repeatable; one line each, in the order given).
    #[arg(long = "print", value_enum, default_values_t = [Field::Command])]
    print: Vec<Field>,
}

pub async fn run(args: JoinTokenArgs) -> anyhow::Result<()> {
    let api = Api::open(&args.api)?;
    let (status, created) = api.call(hyper::Method::POST, "/api/join-tokens", None).await?;
    if status != hyper::StatusCode::CREATED {
        return Err(unexpected("POST /api/join-tokens", status, &created));
    }
    for field in &args.print {
        let value = created.get(field.key()).filter(|v| v.is_string()).with_context(|| format!("the answer has no {}", field.key()))?;
        println!("{}", line(value));
    }
    Ok(())
}
