//! HTTP clients for the ingress benchmark: every host name resolves to
//! 127.0.0.1 (so a route's new host reaches the local Caddy without DNS,
//! and no request can leave the machine), HTTPS trusts only Caddy's
//! internal root, and errors are grouped into short kinds for the report.

use std::collections::BTreeMap;
use std::error::Error;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// HTTP/1.1 only, connections kept alive between requests.
    Http1,
    /// HTTP/2, negotiated through ALPN.
    Http2,
}

impl Protocol {
    pub fn name(self) -> &'static str {
        match self {
            Protocol::Http1 => "HTTP/1.1 keep-alive",
            Protocol::Http2 => "HTTP/2",
        }
    }

    pub fn version(self) -> reqwest::Version {
        match self {
            Protocol::Http1 => reqwest::Version::HTTP_11,
            Protocol::Http2 => reqwest::Version::HTTP_2,
        }
    }
}

/// Resolves every name to 127.0.0.1; the port comes from the URL.
struct Loopback;

impl reqwest::dns::Resolve for Loopback {
    fn resolve(&self, _name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        Box::pin(async {
            let addresses: reqwest::dns::Addrs = Box::new(std::iter::once(SocketAddr::from((Ipv4Addr::LOCALHOST, 0))));
            Ok(addresses)
        })
    }
}

fn builder(timeout: Duration) -> reqwest::ClientBuilder {
    reqwest::Client::builder()
        .dns_resolver(Arc::new(Loopback))
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(timeout)
        .connect_timeout(timeout)
}

/// HTTPS to Caddy, trusting its internal root (`root_pem`) only.
pub fn https(root_pem: &[u8], protocol: Protocol, timeout: Duration) -> Result<reqwest::Client> {
    let root = reqwest::Certificate::from_pem(root_pem).context("reading Caddy's root certificate")?;
    let builder = builder(timeout).tls_built_in_root_certs(false).add_root_certificate(root).https_only(true);
    let builder = match protocol {
        Protocol::Http1 => builder.http1_only(),
        Protocol::Http2 => builder,
    };
    Ok(builder.build()?)
}

/// Plain HTTP/1.1, for requests straight to a container.
pub fn plain(timeout: Duration) -> Result<reqwest::Client> {
    Ok(builder(timeout).http1_only().build()?)
}

/// A failed request, in a few words: what failed (connect, timeout, ...)
/// and the innermost cause.
pub fn error_kind(error: &reqwest::Error) -> String {
    let class = if error.is_timeout() {
        "timeout"
    } else if error.is_connect() {
        "connect"
    } else if error.is_body() || error.is_decode() {
        "body"
    } else if error.is_request() {
        "request"
    } else {
        "other"
    };
    let mut cause: &dyn Error = error;
    while let Some(next) = cause.source() {
        cause = next;
    }
    let mut text = cause.to_string();
    cloudweb_protocol::misc::truncate_on_char(&mut text, 120);
    format!("{class}: {text}")
}

/// Failed requests counted by kind.
#[derive(Debug, Default, Clone)]
pub struct Failures {
    pub by_kind: BTreeMap<String, u64>,
}

impl Failures {
    pub fn add(&mut self, kind: String) {
        *self.by_kind.entry(kind).or_default() += 1;
    }

    pub fn total(&self) -> u64 {
        self.by_kind.values().sum()
    }

    pub fn merge(&mut self, other: &Failures) {
        for (kind, count) in &other.by_kind {
            *self.by_kind.entry(kind.clone()).or_default() += count;
        }
    }

    /// "none", or the kinds, most frequent first.
    pub fn describe(&self) -> String {
        if self.by_kind.is_empty() {
            return "none".to_string();
        }
        let mut kinds: Vec<(&String, &u64)> = self.by_kind.iter().collect();
        kinds.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
        kinds.iter().map(|(kind, count)| format!("{count} x {kind}")).collect::<Vec<_>>().join("; ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_are_listed_most_frequent_first() {
        let mut failures = Failures::default();
        assert_eq!(failures.describe(), "none");
        failures.add("status 502".into());
        failures.add("connect: refused".into());
        failures.add("connect: refused".into());
        let mut more = Failures::default();
        more.add("status 502".into());
        more.add("status 502".into());
        failures.merge(&more);
        assert_eq!(failures.total(), 5);
        assert_eq!(failures.describe(), "3 x status 502; 2 x connect: refused");
    }
}
