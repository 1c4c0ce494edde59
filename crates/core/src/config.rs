//! The control plane's settings, from command-line flags.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use cloudweb_protocol::SupportedRange;

#[derive(Debug, Clone)]
pub struct Config {
    pub data_dir: PathBuf,
    /// Where the state lives: `None` is SQLite's `state.db` under
    /// `data_dir`; `--database-url postgres://…` a PostgreSQL database.
    pub database_url: Option<cloudweb_store::DatabaseUrl>,
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
    /// Accept git hosts on loopback and private networks (`repo_url` and,
    /// through the deploy payload, the agent's check of resolved names).
    pub allow_private_git_hosts: bool,
    /// Exact `host:port` git servers allowed although they are on loopback
    /// or a private network (the installer's example repository), without
    /// opening every private address the way `allow_private_git_hosts` does.
    pub allowed_git_hosts: Vec<String>,
    /// Every app answers on `<app>.<base_domain>`.
    pub base_domain: String,
    /// Run the cluster image registry, when set.
    pub registry: Option<crate::registry::RegistrySettings>,
    /// Bounds on the agent listener's connections.
    pub agent_connections: ConnectionLimits,
    /// Bounds on the user API's connections.
    pub api_connections: ApiConnectionLimits,
    /// How long a deployment that finds no node for an instance stays
    /// queued (retried every second) before it fails with the reasons.
    pub placement_wait: Duration,
    /// The ACME CA public hosts get their certificates from.
    pub acme: crate::acme::AcmeSettings,
    /// Where GitLab, browsers and git hosts reach the user API (OAuth
    /// redirect URI, webhook URLs, commit status links); the address it
    /// listens on when unset.
    pub public_api_url: Option<String>,
    /// GitLab settings from the `--gitlab-*` flags, written at start.
    pub gitlab: Option<crate::git::settings::SettingsInput>,
    /// An extra CA certificate (PEM) for a self-hosted GitLab.
    pub gitlab_ca_file: Option<PathBuf>,
    /// How long a node's client certificate is valid (agents renew it at
    /// two thirds of that).
    pub node_cert_lifetime: Duration,
    /// How long the agent listener's certificate is valid (renewed while
    /// the server runs at two thirds of that).
    pub listener_cert_lifetime: Duration,
    /// How long a leader's lease runs on PostgreSQL without a renewal
    /// (renewed every quarter of it); another replica takes over once it
    /// expired.
    pub leader_lease: Duration,
    /// Session lifetimes and login limits.
    pub auth: crate::auth::AuthSettings,
    /// Which WireGuard endpoints nodes may announce.
    pub mesh_endpoints: crate::mesh_endpoint::EndpointPolicy,
    /// The images managed services run (`--service-image`); the official
    /// ones by default.
    pub service_images: crate::services::ServiceImages,
    /// Host ports services are published on, per node (`--service-ports`).
    pub service_ports: std::ops::RangeInclusive<u16>,
    /// How long a moved volume's old copy stays on its old node before it
    /// is deleted, unless the user confirms the move sooner.
    pub volume_move_keep: Duration,
    /// Backup schedules, retries and keep periods.
    pub backups: BackupSettings,
    /// Exec and port-forward sessions' limits and idle timeout.
    pub sessions: crate::sessions::SessionSettings,
    /// How often the autoscaler looks at the apps it scales.
    pub autoscale_interval: Duration,
    /// The runtime-log store's retention, bounds and rates.
    pub logs: crate::log_archive::LogSettings,
    /// How often the alert evaluator looks.
    pub alert_interval: Duration,
    /// Alert channels may send to loopback and private addresses (a
    /// Mattermost or SMTP relay on the cluster's own network).
    pub allow_private_alert_targets: bool,
}

/// How backups are paced.
#[derive(Debug, Clone)]
pub struct BackupSettings {
    /// The wait before the first retry of a failed scheduled backup; each
    /// later retry waits four times longer (3 retries).
    pub retry_after: Duration,
    /// How long a restore keeps the data it replaced (`--backup-keep-days`).
    pub keep_restored: Duration,
    /// How often the control plane backs up its own state.
    pub control_plane_every: Duration,
    /// How often the backup watcher looks at what is due.
    pub tick: Duration,
}

impl Default for BackupSettings {
    fn default() -> Self {
        BackupSettings {
            retry_after: Duration::from_secs(60),
            keep_restored: Duration::from_secs(7 * 24 * 3600),
            control_plane_every: Duration::from_secs(3600),
            tick: Duration::from_secs(5),
        }
    }
}

impl Config {
    /// Settings for a control plane on loopback, used by tests.
    pub fn local(data_dir: PathBuf) -> Config {
        Config {
            data_dir,
            database_url: None,
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
            allow_private_git_hosts: false,
            allowed_git_hosts: Vec::new(),
            registry: None,
            base_domain: "localhost".to_string(),
            agent_connections: Default::default(),
            api_connections: Default::default(),
            placement_wait: Duration::from_secs(60),
            acme: Default::default(),
            public_api_url: None,
            gitlab: None,
            gitlab_ca_file: None,
            node_cert_lifetime: Duration::from_secs(365 * 24 * 3600),
            listener_cert_lifetime: Duration::from_secs(365 * 24 * 3600),
            leader_lease: Duration::from_secs(10),
            auth: crate::auth::AuthSettings::default(),
            mesh_endpoints: Default::default(),
            service_images: Default::default(),
            service_ports: 20_000..=29_999,
            volume_move_keep: Duration::from_secs(7 * 24 * 3600),
            backups: BackupSettings::default(),
            sessions: Default::default(),
            autoscale_interval: Duration::from_secs(15),
            logs: Default::default(),
            alert_interval: Duration::from_secs(5),
            allow_private_alert_targets: false,
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

impl Config {
    /// Whether a repository on a loopback or private address is allowed:
    /// by the general flag, or because its exact `host:port` is listed.
    /// The answer also goes to the agent, which checks resolved addresses.
    pub fn allows_private_git(&self, repo_url: &str) -> bool {
        if self.allow_private_git_hosts {
            return true;
        }
        let Ok(Some(target)) = cloudweb_protocol::deploy::repo_host(repo_url) else {
            return false;
        };
        let port = target.port.unwrap_or_else(|| target.scheme.default_port());
        let wanted = format!("{}:{port}", target.host.to_ascii_lowercase());
        self.allowed_git_hosts.iter().any(|allowed| allowed.eq_ignore_ascii_case(&wanted))
    }
}

#[cfg(test)]
mod git_host_tests {
    use super::Config;

    #[test]
    fn only_the_listed_host_and_port_pass_a_private_address() {
        let mut config = Config::local(std::path::PathBuf::from("/nonexistent"));
        config.allowed_git_hosts = vec!["127.0.0.1:9418".to_string()];
        assert!(config.allows_private_git("git://127.0.0.1/hello.git"), "9418 is git's own port");
        assert!(config.allows_private_git("git://127.0.0.1:9418/hello.git"));
        assert!(!config.allows_private_git("git://127.0.0.1:9419/hello.git"));
        assert!(!config.allows_private_git("https://127.0.0.1/hello.git"), "https dials 443");
        assert!(!config.allows_private_git("git://10.0.0.1:9418/hello.git"));
        config.allowed_git_hosts.clear();
        assert!(!config.allows_private_git("git://127.0.0.1:9418/hello.git"));
        config.allow_private_git_hosts = true;
        assert!(config.allows_private_git("git://10.0.0.1/x.git"));
    }
}

/// Bounds on connections, so that clients without a client certificate
/// (anyone who can reach the port) cannot crowd out the nodes. A connection
/// counts as unauthenticated from accept until its handshake proved a
/// certificate of the cluster CA.
#[derive(Debug, Clone)]
pub struct ConnectionLimits {
    /// Time from accept to a finished TLS handshake.
    pub handshake_timeout: Duration,
    /// An unauthenticated connection with no request in flight for this
    /// long (counted from accept, then from its last request) is closed.
    pub unauthenticated_idle: Duration,
    /// The same for a node's connection: the keep-alive limit. Longer than
    /// the agents' own pool timeout (90 s), so they close first.
    pub authenticated_idle: Duration,
    /// Unauthenticated connections held at once; past it the oldest goes.
    pub max_unauthenticated: usize,
    /// Unauthenticated connections held at once per source address; past
    /// it that address's oldest goes.
    pub max_unauthenticated_per_address: usize,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        ConnectionLimits {
            handshake_timeout: Duration::from_secs(5),
            unauthenticated_idle: Duration::from_secs(10),
            authenticated_idle: Duration::from_secs(300),
            max_unauthenticated: 1024,
            max_unauthenticated_per_address: 128,
        }
    }
}

/// Bounds on the user API's connections (the API, the dashboard, the OAuth
/// callback and webhooks: the port that may face the internet), so that
/// idle or slow clients cannot hold its descriptors.
#[derive(Debug, Clone)]
pub struct ApiConnectionLimits {
    /// Time to send a request's headers: from the accept for the first
    /// request, from its first byte for a later one.
    pub header_read_timeout: Duration,
    /// A connection with no request in flight for this long (since its
    /// last response) is closed: the keep-alive limit.
    pub idle_timeout: Duration,
    /// Connections held at once; past it one is closed: the oldest that
    /// never made a request, else the one idle the longest, else the
    /// oldest. Kept under half the process's open file limit at start.
    pub max_total: usize,
    /// Connections held at once per source address; past it one of that
    /// address's is closed, in the same order.
    pub max_per_address: usize,
}

impl Default for ApiConnectionLimits {
    fn default() -> Self {
        ApiConnectionLimits {
            header_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            max_total: 4096,
            max_per_address: 256,
        }
    }
}
