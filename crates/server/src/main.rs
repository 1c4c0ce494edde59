//! `cloudweb-server`: flag parsing and process wiring around
//! [`cloudweb_server::start`], and the subcommands for scripts (see `cli`).

mod admin_cli;
mod migrate_state;
mod cli;
mod restore;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};
use cloudweb_server::auth::limiter::Limits;
use cloudweb_server::auth::AuthSettings;
use cloudweb_server::clock::SystemClock;
use cloudweb_server::config::{public_url::HttpsUrl, Config};
use cloudweb_server::agent_api::listener::ConnectionLimits;
use cloudweb_server::api::listener::ApiConnectionLimits;
use cloudweb_server::registry::{RegistryS3, RegistrySettings, RegistryStorage};
use cloudweb_protocol::SupportedRange;

#[derive(Parser)]
#[command(name = "cloudweb-server", version, about = "The cloud-web control plane")]
struct Cli {
    #[command(subcommand)]
    command: Commands,
}

#[derive(Subcommand)]
enum Commands {
    /// Run the control plane.
    Serve(Box<ServeArgs>),
    /// Create a join token through a running control plane's user API and
    /// print the fields asked for, one per line.
    JoinToken(cli::join_token::JoinTokenArgs),
    /// Account chores on this machine's database (no API needed).
    #[command(subcommand)]
    Admin(admin_cli::AdminCommand),
    /// Print a node's state, ingress flag or readiness through a running
    /// control plane's user API, one field per line; optionally wait until
    /// it is ready.
    NodeStatus(cli::status::NodeStatusArgs),
    /// Print whether an app exists and whether it runs, one field per line.
    AppStatus(cli::status::AppStatusArgs),
    /// Deploy an app through a running control plane's user API, optionally
    /// wait until it runs, and print the deployment's id or state.
    Deploy(cli::deploy::DeployArgs),
    /// Rebuild a data dir from the newest (or a named) control-plane
    /// backup with the recovery key, on a new host; then `serve` it with
    /// the same public URL and every agent reconnects without joining.
    Restore(restore::RestoreArgs),
    /// Copy a cluster's SQLite state into an empty PostgreSQL database,
    /// checked table by table (rows and a checksum), to run the control
    /// plane on PostgreSQL from then on.
    MigrateState(migrate_state::MigrateStateArgs),
}

#[derive(Parser)]
struct ServeArgs {
    /// Directory for the database, the cluster CA and the admin token.
    #[arg(long, env = "CLOUDWEB_DATA_DIR", default_value = "/var/lib/cloudweb")]
    data_dir: PathBuf,
    /// Where the state lives: sqlite:///path/state.db (default: state.db
    /// under --data-dir) or postgres://user:password@host:5432/db
    /// (postgres:///db?host=/run/postgresql for a Unix socket). Give a
    /// password through the environment variable, not on a command line.
    #[arg(long, env = "CLOUDWEB_DATABASE_URL", value_name = "URL", value_parser = parse_database_url, hide_env_values = true)]
    database_url: Option<cloudweb_server::store::DatabaseUrl>,
    /// Address of the agent listener (TLS 1.3, mTLS).
    #[arg(long, default_value = "0.0.0.0:8443")]
    agent_listen: SocketAddr,
    /// Address of the user API and dashboard.
    #[arg(long, default_value = "127.0.0.1:8080")]
    api_listen: SocketAddr,
    /// URL agents dial, https://host[:port]; its host goes into the listener's certificate.
    #[arg(long)]
    public_url: String,
    /// Agent binary that /node.sh installs (default: cloudweb-agent next to this binary, if present).
    #[arg(long)]
    agent_binary: Option<PathBuf>,
    /// Seconds between batched writes of heartbeats to the database.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..=300))]
    heartbeat_flush_seconds: u64,
    /// Seconds a replaced instance keeps serving after its successor runs.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(0..=3600))]
    drain_seconds: u64,
    /// Accept file:// repository URLs (development and tests only).
    #[arg(long)]
    allow_file_repos: bool,
    /// Accept git hosts on loopback and private networks (a git server on
    /// the cluster's own network); link-local and unspecified addresses
    /// stay refused.
    #[arg(long)]
    allow_private_git_hosts: bool,
    /// Allow one git server on loopback or a private network by its exact
    /// `host:port` (repeatable), e.g. the installer's example repository.
    #[arg(long = "allow-git-host", value_name = "HOST:PORT", value_parser = parse_git_host)]
    allow_git_host: Vec<String>,
    /// The Docker distribution registry binary to run as the cluster registry
    /// (Debian: /usr/bin/docker-registry). No registry runs without it.
    #[arg(long)]
    registry_bin: Option<PathBuf>,
    /// Where the registry listens.
    #[arg(long, default_value = "10.77.0.1:5000")]
    registry_listen: SocketAddr,
    /// host:port nodes use to reach the registry (default: --registry-listen).
    #[arg(long)]
    registry_advertise: Option<String>,
    /// Keep the registry's images in this bucket of an S3-compatible
    /// service rather than under --data-dir, so they outlive this host.
    #[arg(long, value_name = "BUCKET", requires = "registry_bin")]
    registry_s3_bucket: Option<String>,
    /// The S3-compatible service, http(s)://host[:port] (MinIO, Garage, R2,
    /// ...); AWS S3 itself when absent.
    #[arg(long, value_name = "URL", requires = "registry_s3_bucket")]
    registry_s3_endpoint: Option<String>,
    /// The bucket's region.
    #[arg(long, value_name = "REGION", default_value = "us-east-1")]
    registry_s3_region: String,
    /// A prefix of the registry's keys in the bucket (a/b).
    #[arg(long, value_name = "PREFIX", requires = "registry_s3_bucket")]
    registry_s3_prefix: Option<String>,
    /// The access key id for the bucket.
    #[arg(long, value_name = "ID", requires = "registry_s3_bucket")]
    registry_s3_access_key_id: Option<String>,
    /// A file holding the secret access key (else the environment variable
    /// CLOUDWEB_REGISTRY_S3_SECRET_ACCESS_KEY); never on a command line.
    #[arg(long, value_name = "FILE", requires = "registry_s3_bucket")]
    registry_s3_secret_access_key_file: Option<PathBuf>,
    /// Every app answers on <app>.<base-domain> (besides its own domains).
    #[arg(long, default_value = "localhost")]
    base_domain: String,
    /// Seconds without a heartbeat after which a node is unreachable.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(5..=3600))]
    unreachable_after_seconds: u64,
    /// Seconds an agent-listener connection without a client certificate may
    /// stay open without a request (counted from accept).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=3600))]
    unauthenticated_idle_seconds: u64,
    /// Agent-listener connections without a client certificate held at
    /// once; past it the oldest are closed.
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    max_unauthenticated_connections: u64,
    /// The same, per source address.
    #[arg(long, default_value_t = 128, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    max_unauthenticated_per_address: u64,
    /// Seconds a user API connection may take to send a request's headers
    /// (from the accept, or from the first byte of a later request).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=3600))]
    api_header_timeout_seconds: u64,
    /// Seconds a user API connection may stay open with no request in
    /// flight (the keep-alive limit).
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=3600))]
    api_idle_timeout_seconds: u64,
    /// User API connections held at once (at most half the open file
    /// limit); past it one is closed: the oldest that never made a
    /// request, else the one idle the longest.
    #[arg(long, default_value_t = 4096, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    max_api_connections: u64,
    /// The same, per source address.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    max_api_connections_per_address: u64,
    /// Seconds a deployment waits, queued, for a node that can take it
    /// before it fails with the scheduler's reasons (0: fail at once).
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(0..=3600))]
    placement_wait_seconds: u64,
    /// ACME directory URL of the CA that issues certificates for public
    /// host names (one order per host for the whole cluster).
    #[arg(long, default_value = cloudweb_server::acme::LETS_ENCRYPT)]
    acme_ca: String,
    /// Contact address of the ACME account (the CA's expiry notices).
    #[arg(long)]
    acme_email: Option<String>,
    /// PEM file with the root certificate the --acme-ca directory is served
    /// under, instead of the system's roots (a private or test CA).
    #[arg(long)]
    acme_ca_root: Option<PathBuf>,
    /// The ACME challenge type to use: http-01 (port 80) or tls-alpn-01
    /// (port 443). The other type is used when the CA does not offer it.
    #[arg(long, default_value = "http-01")]
    acme_challenge: String,
    /// Where GitLab, browsers and git hosts reach the user API, e.g.
    /// https://cloud.example.com (OAuth redirect URI, webhook URLs, links
    /// in commit statuses). Default: http://<api-listen>.
    #[arg(long)]
    public_api_url: Option<String>,
    /// GitLab base URL for login and push-to-deploy (https://gitlab.com or
    /// a self-hosted instance). Also settable with PUT /api/gitlab/settings.
    #[arg(long, requires_all = ["gitlab_client_id", "gitlab_client_secret_file"])]
    gitlab_url: Option<String>,
    /// The GitLab OAuth application's id.
    #[arg(long, requires = "gitlab_url")]
    gitlab_client_id: Option<String>,
    /// File holding the GitLab OAuth application's secret (kept off the
    /// command line; stored sealed).
    #[arg(long, requires = "gitlab_url")]
    gitlab_client_secret_file: Option<PathBuf>,
    /// GitLab username allowed to log in (repeatable).
    #[arg(long = "gitlab-allow-user", value_name = "USERNAME")]
    gitlab_allow_user: Vec<String>,
    /// GitLab group (full path) whose members may log in (repeatable).
    #[arg(long = "gitlab-allow-group", value_name = "GROUP")]
    gitlab_allow_group: Vec<String>,
    /// Extra CA certificate (PEM) for a self-hosted GitLab.
    #[arg(long)]
    gitlab_ca_file: Option<PathBuf>,
    /// The image a kind of managed service runs, KIND=IMAGE with KIND
    /// postgres, redis or mariadb (repeatable; for mirrors and air-gapped
    /// sites). A repository without a tag takes each service's version as
    /// its tag; an image with a tag or digest pins the version (`services
    /// upgrade` is refused). Default: postgres:16, valkey/valkey:8,
    /// mariadb:11.
    #[arg(long = "service-image", value_name = "KIND=IMAGE")]
    service_image: Vec<String>,
    /// Host ports managed services are published on, on each node's
    /// service address (FIRST-LAST).
    #[arg(long, default_value = "20000-29999", value_name = "FIRST-LAST")]
    service_ports: String,
    /// Seconds an exec or port-forward session may pass with no byte
    /// either way before it is closed.
    #[arg(long, default_value_t = 1800, value_parser = clap::value_parser!(u64).range(5..=86_400))]
    exec_idle_seconds: u64,
    /// Exec and port-forward sessions one user may hold open at once.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u64).range(1..=1000))]
    exec_sessions_per_user: u64,
    /// Exec and port-forward sessions one node may serve at once.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    exec_sessions_per_node: u64,
    /// Seconds between two looks of the autoscaler at the apps it scales.
    #[arg(long, default_value_t = 15, value_parser = clap::value_parser!(u64).range(1..=3600))]
    autoscale_interval_seconds: u64,
    /// How long runtime log lines are kept (older ones are deleted): a
    /// number of days, hours, minutes or seconds (7d, 36h, 90m, 30s).
    #[arg(long, default_value = "7d", value_parser = retention)]
    log_retention: std::time::Duration,
    /// MiB of runtime log lines one app (or service) may keep; past it its
    /// oldest lines are deleted.
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u64).range(1..=1_048_576))]
    log_max_mib_per_app: u64,
    /// MiB of runtime log lines all apps together may keep; past it the
    /// app holding the most loses its oldest lines first.
    #[arg(long, default_value_t = 4096, value_parser = clap::value_parser!(u64).range(1..=16_777_216))]
    log_max_mib: u64,
    /// Runtime log lines per second one app may send; lines over it are
    /// dropped, counted and noted in the app's log.
    #[arg(long, default_value_t = 5000, value_parser = clap::value_parser!(u32).range(1..=10_000_000))]
    log_lines_per_second: u32,
    /// Runtime log lines one app may send at once after a quiet time.
    #[arg(long, default_value_t = 100_000, value_parser = clap::value_parser!(u32).range(1..=100_000_000))]
    log_burst_lines: u32,
    /// Also ship every stored runtime log line to a log system:
    /// syslog+tcp://HOST:PORT or syslog+tls://HOST:PORT (RFC 5424,
    /// octet-counted), otlp+https://HOST[:PORT][/v1/logs] (OTLP/HTTP JSON)
    /// or loki+https://[USER:PASSWORD@]HOST[:PORT][/loki/api/v1/push].
    /// Lines it cannot take are counted and stay stored here.
    #[arg(long, value_name = "URL", value_parser = parse_log_forward)]
    log_forward: Option<cloudweb_core::log_archive::forward::ForwardTarget>,
    /// Alert channels (webhooks, SMTP servers) may be on loopback and
    /// private networks; link-local addresses stay refused.
    #[arg(long)]
    allow_private_alert_targets: bool,
    /// Seconds between two looks of the alert evaluator.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..=3600))]
    alert_interval_seconds: u64,
    /// Seconds between two runs of the runtime logs' retention.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    log_prune_interval_seconds: u64,
    /// Days a moved volume's old copy stays on its old node before it is
    /// deleted (`cloudweb volumes confirm-move` deletes it sooner).
    #[arg(long, default_value_t = 7, value_parser = clap::value_parser!(u64).range(0..=365))]
    volume_move_keep_days: u64,
    /// Days a restore keeps the data it replaced (as the volume
    /// `<name>-before-restore-<time>`) before deleting it
    /// (`cloudweb backups confirm-restore` deletes it sooner).
    #[arg(long, default_value_t = 7, value_parser = clap::value_parser!(u64).range(0..=365))]
    backup_keep_days: u64,
    /// Seconds before the first retry of a failed scheduled backup; each
    /// of the next two retries waits four times longer.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    backup_retry_seconds: u64,
    /// Minutes between the control plane's backups of its own state (to
    /// every backup destination).
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=10_080))]
    control_plane_backup_minutes: u64,
    /// Seconds a node's client certificate is valid; agents renew it
    /// through the agent listener at two thirds of that (default 365 days).
    #[arg(long, default_value_t = 365 * 24 * 3600, value_parser = clap::value_parser!(u64).range(30..=10 * 365 * 24 * 3600))]
    node_cert_seconds: u64,
    /// Seconds the agent listener's certificate is valid; renewed while the
    /// server runs at two thirds of that (default 365 days). For tests.
    #[arg(long, hide = true, default_value_t = 365 * 24 * 3600, value_parser = clap::value_parser!(u64).range(6..=10 * 365 * 24 * 3600))]
    listener_cert_seconds: u64,
    /// Seconds a leader's lease runs on PostgreSQL without a renewal
    /// (renewed every quarter of it): how soon another replica takes over
    /// from one that died (default 10).
    #[arg(long, hide = true, default_value_t = 10, value_parser = clap::value_parser!(u64).range(2..=300))]
    leader_lease_seconds: u64,
    /// Seconds the image registry's certificate is valid; renewed while the
    /// server runs at two thirds of that, restarting the registry (default
    /// 365 days). For tests.
    #[arg(long, hide = true, default_value_t = 365 * 24 * 3600, value_parser = clap::value_parser!(u64).range(6..=10 * 365 * 24 * 3600))]
    registry_cert_seconds: u64,
    /// Agent protocols accepted, MIN-MAX (default: this build's range).
    /// For compatibility tests that need two sides whose ranges do not meet.
    #[arg(long, hide = true, value_parser = parse_protocol_range)]
    agent_protocols: Option<SupportedRange>,
    /// Minutes without a request after which a browser session ends.
    #[arg(long, default_value_t = 480, value_parser = clap::value_parser!(u64).range(1..=43_200))]
    session_idle_minutes: u64,
    /// Hours after login at which a browser session ends, used or not.
    #[arg(long, default_value_t = 168, value_parser = clap::value_parser!(u64).range(1..=8_760))]
    session_max_hours: u64,
    /// Failed logins per account, and per address (IPv6: per /64), allowed
    /// in each window before logins answer 429.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=1_000))]
    login_attempts_per_account: u32,
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    login_attempts_per_address: u32,
    /// Allow nodes to announce this exact WireGuard endpoint (repeatable),
    /// although it is loopback, link-local, in the mesh range or on a port
    /// below 1024, which are refused otherwise.
    #[arg(long = "mesh-allow-endpoint", value_name = "HOST:PORT", value_parser = parse_mesh_endpoint)]
    mesh_allow_endpoint: Vec<String>,
    /// Accept host names as node endpoints (each peer resolves them);
    /// without it, nodes announce IP addresses only.
    #[arg(long)]
    mesh_endpoint_names: bool,
    /// The window of those limits, in seconds.
    #[arg(long, default_value_t = 900, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    login_window_seconds: u64,
    /// How long audit log entries are kept, in days.
    #[arg(long, default_value_t = 365, value_parser = clap::value_parser!(u64).range(1..=36_500))]
    audit_retention_days: u64,
    /// What a change does when its audit entry cannot be written: refuse
    /// (503) or warn (go ahead unaudited; for a single user's cluster).
    #[arg(long, default_value = "refuse", value_parser = ["refuse", "warn"])]
    audit_failure: String,
    /// Also ship every audit entry this control plane writes to a log
    /// system (the forms of --log-forward; syslog facility 13, log
    /// audit). Entries it cannot take are counted and stay stored here.
    #[arg(long, value_name = "URL", value_parser = parse_log_forward)]
    audit_forward: Option<cloudweb_core::log_archive::forward::ForwardTarget>,
    /// Anonymous requests (webhooks and other public endpoints) written to
    /// the audit log one by one per minute; past it, only those that
    /// changed something are, and refused ones are summed up in one entry
    /// a minute.
    #[arg(long, default_value_t = 120, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    audit_anonymous_per_minute: u32,
    /// The share of those one address may take.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    audit_anonymous_per_address: u32,
    /// How often, in seconds, team memberships granted by login mappings
    /// are checked against the git host's groups between logins.
    #[arg(long, default_value_t = 3600, value_parser = clap::value_parser!(u64).range(5..=86_400))]
    team_mapping_check_seconds: u64,
}

fn main() -> std::process::ExitCode {
    cloudweb_allocator::tune();
    match real_main() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn real_main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("CLOUDWEB_LOG").unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let script = |command: std::pin::Pin<Box<dyn std::future::Future<Output = anyhow::Result<()>>>>| -> anyhow::Result<()> {
        tokio::runtime::Builder::new_current_thread().enable_all().build()?.block_on(command)
    };
    let args = match cli.command {
        Commands::Serve(args) => *args,
        Commands::Admin(command) => {
            nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o077));
            return script(Box::pin(admin_cli::run(command)));
        }
        Commands::JoinToken(args) => return script(Box::pin(cli::join_token::run(args))),
        Commands::NodeStatus(args) => return script(Box::pin(cli::status::node(args))),
        Commands::AppStatus(args) => return script(Box::pin(cli::status::app(args))),
        Commands::Deploy(args) => return script(Box::pin(cli::deploy::run(args))),
        Commands::MigrateState(args) => return script(Box::pin(migrate_state::run(args))),
        Commands::Restore(args) => {
            // The restored files are keys and the state: for no other user.
            nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o077));
            return script(Box::pin(restore::run(args)));
        }
    };
    raise_open_file_limit();
    // The data dir holds keys, token digests and logs: nothing the control
    // plane writes is for other users.
    nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o077));
    let public_url = HttpsUrl::parse(&args.public_url).map_err(anyhow::Error::msg)?;
    let agent_binary = args.agent_binary.or_else(|| {
        let sibling = std::env::current_exe().ok()?.parent()?.join("cloudweb-agent");
        sibling.exists().then_some(sibling)
    });
    let config = Config {
        data_dir: args.data_dir,
        database_url: args.database_url,
        agent_listen: args.agent_listen,
        api_listen: args.api_listen,
        public_url,
        agent_binary,
        heartbeat_flush_interval: Duration::from_secs(args.heartbeat_flush_seconds),
        unreachable_after: Duration::from_secs(args.unreachable_after_seconds),
        join_token_ttl: Duration::from_secs(3600),
        protocol_range: args.agent_protocols.unwrap_or_default(),
        drain_period: Duration::from_secs(args.drain_seconds),
        base_domain: {
            cloudweb_protocol::validate::hostname("--base-domain", &args.base_domain).map_err(anyhow::Error::msg)?;
            // Every app's default host, `<app>.<base domain>`, must stay
            // routable with the longest app name (63).
            let longest = cloudweb_protocol::validate::MAX_ROUTE_HOST_LEN - 64;
            if args.base_domain.len() > longest {
                anyhow::bail!("--base-domain must be at most {longest} characters");
            }
            args.base_domain.to_ascii_lowercase()
        },
        allow_file_repos: args.allow_file_repos,
        agent_connections: ConnectionLimits {
            unauthenticated_idle: Duration::from_secs(args.unauthenticated_idle_seconds),
            max_unauthenticated: args.max_unauthenticated_connections as usize,
            max_unauthenticated_per_address: args.max_unauthenticated_per_address as usize,
            ..ConnectionLimits::default()
        },
        api_connections: ApiConnectionLimits {
            header_read_timeout: Duration::from_secs(args.api_header_timeout_seconds),
            idle_timeout: Duration::from_secs(args.api_idle_timeout_seconds),
            max_total: args.max_api_connections as usize,
            max_per_address: args.max_api_connections_per_address as usize,
        },
        placement_wait: Duration::from_secs(args.placement_wait_seconds),
        acme: cloudweb_server::acme::AcmeSettings::parse(&args.acme_ca, args.acme_email.as_deref(), args.acme_ca_root)
            .and_then(|settings| settings.with_challenge(&args.acme_challenge))
            .map_err(anyhow::Error::msg)?,
        node_cert_lifetime: Duration::from_secs(args.node_cert_seconds),
        listener_cert_lifetime: Duration::from_secs(args.listener_cert_seconds),
        leader_lease: Duration::from_secs(args.leader_lease_seconds),
        auth: AuthSettings {
            session_idle: Duration::from_secs(args.session_idle_minutes * 60),
            session_absolute: Duration::from_secs(args.session_max_hours * 3600),
            login_limits: Limits {
                per_account: args.login_attempts_per_account,
                per_address: args.login_attempts_per_address,
                window: Duration::from_secs(args.login_window_seconds),
                ..Limits::default()
            },
            audit: cloudweb_server::access::audit::AuditSettings {
                retention: Duration::from_secs(args.audit_retention_days * 24 * 3600),
                on_failure: cloudweb_server::access::audit::OnFailure::parse(&args.audit_failure).expect("clap checked it"),
                forward: args.audit_forward,
                anonymous: cloudweb_core::audit_policy::AnonymousLimits {
                    per_minute: args.audit_anonymous_per_minute,
                    per_address_per_minute: args.audit_anonymous_per_address,
                },
            },
            mapping_check: Duration::from_secs(args.team_mapping_check_seconds),
        },
        mesh_endpoints: cloudweb_server::mesh_endpoint::EndpointPolicy {
            allowed: args.mesh_allow_endpoint,
            names: args.mesh_endpoint_names,
        },
        allow_private_git_hosts: args.allow_private_git_hosts,
        allowed_git_hosts: args.allow_git_host,
        public_api_url: match args.public_api_url {
            Some(text) => {
                let url = url::Url::parse(&text).map_err(|e| anyhow::anyhow!("--public-api-url {text:?}: {e}"))?;
                if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() || url.query().is_some() {
                    anyhow::bail!("--public-api-url must be http(s)://host[:port][/path]");
                }
                Some(url.as_str().trim_end_matches('/').to_string())
            }
            None => None,
        },
        gitlab: match (args.gitlab_url, args.gitlab_client_id, args.gitlab_client_secret_file) {
            (Some(base_url), Some(client_id), Some(secret_file)) => {
                let secret = std::fs::read_to_string(&secret_file).with_context(|| format!("reading {}", secret_file.display()))?;
                Some(cloudweb_server::git::api::SettingsInput {
                    base_url,
                    client_id,
                    client_secret: Some(secret.trim().to_string()),
                    allowed_users: args.gitlab_allow_user,
                    allowed_groups: args.gitlab_allow_group,
                })
            }
            _ => None,
        },
        gitlab_ca_file: args.gitlab_ca_file,
        service_ports: {
            let (first, last) = args.service_ports.split_once('-').ok_or_else(|| anyhow::anyhow!("--service-ports takes FIRST-LAST"))?;
            let (first, last): (u16, u16) = (first.parse()?, last.parse()?);
            if first < 1024 || last < first {
                anyhow::bail!("--service-ports {first}-{last}: ports from 1024 up, FIRST at most LAST");
            }
            first..=last
        },
        volume_move_keep: std::time::Duration::from_secs(args.volume_move_keep_days * 24 * 3600),
        autoscale_interval: std::time::Duration::from_secs(args.autoscale_interval_seconds),
        alert_interval: std::time::Duration::from_secs(args.alert_interval_seconds),
        allow_private_alert_targets: args.allow_private_alert_targets,
        logs: cloudweb_core::log_archive::LogSettings {
            retention: args.log_retention,
            app_max_bytes: args.log_max_mib_per_app * 1024 * 1024,
            total_max_bytes: args.log_max_mib * 1024 * 1024,
            lines_per_second: args.log_lines_per_second,
            burst_lines: args.log_burst_lines,
            prune_every: std::time::Duration::from_secs(args.log_prune_interval_seconds),
            forward: args.log_forward,
        },
        sessions: cloudweb_core::sessions::SessionSettings {
            idle_timeout: std::time::Duration::from_secs(args.exec_idle_seconds),
            max_per_user: args.exec_sessions_per_user as usize,
            max_per_node: args.exec_sessions_per_node as usize,
            ..Default::default()
        },
        backups: cloudweb_server::config::BackupSettings {
            retry_after: std::time::Duration::from_secs(args.backup_retry_seconds),
            keep_restored: std::time::Duration::from_secs(args.backup_keep_days * 24 * 3600),
            control_plane_every: std::time::Duration::from_secs(args.control_plane_backup_minutes * 60),
            ..Default::default()
        },
        service_images: {
            let mut images = cloudweb_server::services::ServiceImages::default();
            for text in &args.service_image {
                images.add(text).map_err(anyhow::Error::msg)?;
            }
            images
        },
        registry: match args.registry_bin {
            Some(binary) => {
                let advertise = args.registry_advertise.unwrap_or_else(|| args.registry_listen.to_string());
                cloudweb_protocol::validate::endpoint("--registry-advertise", &advertise).map_err(anyhow::Error::msg)?;
                Some(RegistrySettings {
                    binary,
                    listen: args.registry_listen,
                    advertise,
                    cert_lifetime: Duration::from_secs(args.registry_cert_seconds),
                    storage: registry_storage(
                        args.registry_s3_bucket,
                        args.registry_s3_endpoint,
                        args.registry_s3_region,
                        args.registry_s3_prefix,
                        args.registry_s3_access_key_id,
                        args.registry_s3_secret_access_key_file,
                    )?,
                })
            }
            None => None,
        },
    };
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(async move {
        let server = cloudweb_server::start(config, Arc::new(SystemClock)).await.context("starting the control plane")?;
        wait_for_signal().await;
        tracing::info!("shutting down");
        server.shutdown().await;
        Ok(())
    })
}

/// Every agent holds a connection (and its event stream); lift the soft
/// limit on open files to the hard one so thousands of nodes fit.
fn raise_open_file_limit() {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) {
        if soft < hard && setrlimit(Resource::RLIMIT_NOFILE, hard, hard).is_err() {
            tracing::warn!(soft, hard, "could not raise the open file limit");
        }
    }
}

async fn wait_for_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

/// `MIN-MAX`, two protocol numbers with MIN <= MAX.
fn parse_protocol_range(value: &str) -> Result<SupportedRange, String> {
    let (min, max) = value.split_once('-').ok_or("expected MIN-MAX, e.g. 1-2")?;
    let min: u32 = min.trim().parse().map_err(|_| "MIN must be a number")?;
    let max: u32 = max.trim().parse().map_err(|_| "MAX must be a number")?;
    if min > max || min == 0 {
        return Err("expected 1 <= MIN <= MAX".into());
    }
    Ok(SupportedRange { min, max })
}

/// `host:port` with a host name or IP address (IPv6 in brackets) and a port.
fn parse_mesh_endpoint(value: &str) -> Result<String, String> {
    cloudweb_protocol::validate::endpoint("--mesh-allow-endpoint", value).map_err(|e| e.to_string())?;
    Ok(value.to_string())
}

fn parse_git_host(value: &str) -> Result<String, String> {
    let (host, port) = value.rsplit_once(':').ok_or("expected HOST:PORT")?;
    port.parse::<u16>().ok().filter(|p| *p != 0).ok_or("the port must be 1 to 65535")?;
    let host = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
    let plain = !host.is_empty() && !host.starts_with('-') && host.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | ':'));
    if !plain {
        return Err("the host must be a name or an IP address".into());
    }
    Ok(format!("{}:{port}", host.to_ascii_lowercase()))
}

/// The registry's storage from the `--registry-s3-*` flags: a directory
/// under --data-dir without a bucket.
fn registry_storage(
    bucket: Option<String>,
    endpoint: Option<String>,
    region: String,
    prefix: Option<String>,
    access_key_id: Option<String>,
    secret_file: Option<PathBuf>,
) -> anyhow::Result<RegistryStorage> {
    let Some(bucket) = bucket else { return Ok(RegistryStorage::Filesystem) };
    let access_key_id = access_key_id.context("--registry-s3-bucket needs --registry-s3-access-key-id")?;
    let secret = match secret_file {
        Some(path) => std::fs::read_to_string(&path).with_context(|| format!("--registry-s3-secret-access-key-file {}", path.display()))?.trim().to_string(),
        None => std::env::var("CLOUDWEB_REGISTRY_S3_SECRET_ACCESS_KEY")
            .context("--registry-s3-bucket needs the secret access key: --registry-s3-secret-access-key-file or CLOUDWEB_REGISTRY_S3_SECRET_ACCESS_KEY")?,
    };
    Ok(RegistryStorage::S3(RegistryS3::new(endpoint, bucket, region, prefix, access_key_id, secret).map_err(anyhow::Error::msg)?))
}

fn parse_database_url(value: &str) -> Result<cloudweb_server::store::DatabaseUrl, String> {
    cloudweb_server::store::DatabaseUrl::parse(value)
}

/// `--log-retention`: `7d`, `36h`, `90m` or `30s`, from 10 seconds to ten
/// years.
fn retention(text: &str) -> Result<std::time::Duration, String> {
    let error = || format!("{text:?}: a number with d, h, m or s (7d, 36h, 90m, 30s), from 10s to 3650d");
    let Some((at, _)) = text.char_indices().last() else { return Err(error()) };
    let (number, unit) = text.split_at(at);
    let seconds = match unit {
        "d" => 86_400,
        "h" => 3_600,
        "m" => 60,
        "s" => 1,
        _ => return Err(error()),
    };
    let total = number.parse::<u64>().ok().and_then(|n| n.checked_mul(seconds)).ok_or_else(error)?;
    if !(10..=3650 * 86_400).contains(&total) {
        return Err(error());
    }
    Ok(std::time::Duration::from_secs(total))
}

#[cfg(test)]
mod tests {
    #[test]
    fn retention_takes_a_number_and_a_unit() {
        assert_eq!(super::retention("7d").unwrap().as_secs(), 7 * 86_400);
        assert_eq!(super::retention("90m").unwrap().as_secs(), 5_400);
        assert_eq!(super::retention("30s").unwrap().as_secs(), 30);
        for bad in ["", "7", "d", "5s", "7w", "-1d", "99999d", "1é", "1.5h"] {
            assert!(super::retention(bad).is_err(), "{bad}");
        }
    }
}

fn parse_log_forward(text: &str) -> Result<cloudweb_core::log_archive::forward::ForwardTarget, String> {
    cloudweb_core::log_archive::forward::ForwardTarget::parse(text)
}
