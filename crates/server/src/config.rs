//! The control plane's settings, from command-line flags.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use cloudweb_protocol::SupportedRange;

#[derive(Debug, Clone)]
pub struct Config {
    pub data_dir: PathBuf,
    pub agent_listen: SocketAddr,
    pub api_listen: SocketAddr,
    /// What agents dial, e.g. `https://cp.example.com:8443`.
    pub public_url: public_url::HttpsUrl,
    /// The agent binary offered to new nodes by `/node.sh`.
    pub agent_binary: Option<PathBuf>,
    /// How often the latest heartbeats are written to the database.
    pub heartbeat_flush_interval: Duration,
    /// A node without a heartbeat for this long is unreachable.
    pub unreachable_after: Duration,
    /// Join tokens expire after this long.
    pub join_token_ttl: Duration,
    pub protocol_range: SupportedRange,
    /// How long a replaced instance keeps serving after its successor runs.
    pub drain_period: Duration,
    /// Accept `file://` repository URLs (development and tests only).
    pub allow_file_repos: bool,
    /// Every app answers on `<app>.<base_domain>`.
    pub base_domain: String,
    /// Run the cluster image registry, when set.
    pub registry: Option<crate::registry::RegistrySettings>,
}

impl Config {
    /// Settings for a control plane on loopback, used by tests.
    pub fn local(data_dir: PathBuf) -> Config {
        Config {
            data_dir,
            agent_listen: "127.0.0.1:0".parse().expect("literal address"),
            api_listen: "127.0.0.1:0".parse().expect("literal address"),
            public_url: public_url::HttpsUrl::parse("https://127.0.0.1:8443").expect("literal url"),
            agent_binary: None,
            heartbeat_flush_interval: Duration::from_secs(5),
            unreachable_after: Duration::from_secs(30),
            join_token_ttl: Duration::from_secs(3600),
            protocol_range: SupportedRange::default(),
            drain_period: Duration::from_secs(10),
            allow_file_repos: false,
            registry: None,
            base_domain: "localhost".to_string(),
        }
    }
}

/// The one URL shape the control plane needs: `https://host[:port]`,
/// parsed by the `url` crate (WHATWG rules) and then narrowed.
pub mod public_url {
    use std::fmt;

    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct HttpsUrl {
        pub host: String,
        pub port: u16,
    }

    impl HttpsUrl {
        pub fn parse(text: &str) -> Result<HttpsUrl, String> {
            let url = url::Url::parse(text).map_err(|e| format!("public URL {text:?} is not a URL: {e}"))?;
            if url.scheme() != "https" {
                return Err(format!("public URL {text:?} must start with https://"));
            }
            if !url.username().is_empty() || url.password().is_some() || url.path() != "/" || url.query().is_some() || url.fragment().is_some() {
                return Err(format!("public URL {text:?} must be https://host[:port] with no path"));
            }
            let port = url.port_or_known_default().unwrap_or(443);
            let host = match url.host() {
                Some(url::Host::Domain(name)) => {
                    cloudweb_protocol::validate::hostname("public URL host", name).map_err(|e| e.to_string())?;
                    name.to_string()
                }
                Some(url::Host::Ipv4(ip)) => ip.to_string(),
                Some(url::Host::Ipv6(ip)) => ip.to_string(),
                None => return Err(format!("public URL {text:?} has no host")),
            };
            Ok(HttpsUrl { host, port })
        }
    }

    impl fmt::Display for HttpsUrl {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            if self.host.contains(':') {
                write!(f, "https://[{}]:{}", self.host, self.port)
            } else {
                write!(f, "https://{}:{}", self.host, self.port)
            }
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn parses_public_urls() {
            assert_eq!(HttpsUrl::parse("https://cp.example.com:8443").unwrap().to_string(), "https://cp.example.com:8443");
            assert_eq!(HttpsUrl::parse("https://cp.example.com").unwrap().port, 443);
            assert_eq!(HttpsUrl::parse("https://[::1]:8443").unwrap().host, "::1");
            assert_eq!(HttpsUrl::parse("https://CP.Example.com:443/").unwrap().to_string(), "https://cp.example.com:443");
            for bad in ["http://x", "https://", "https://x/path", "https://u@x", "https://u:p@x", "https://x:99999", "https://a b", "https://x?q=1", "https://x#f", "cp.example.com"] {
                assert!(HttpsUrl::parse(bad).is_err(), "{bad}");
            }
        }
    }
}
