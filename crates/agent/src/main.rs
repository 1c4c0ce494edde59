//! `cloudweb-agent`: join a cluster, run as a node, or leave.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};
use cloudweb_agent::client::{parse_fingerprint, ControlPlane};
use cloudweb_agent::deploy::DeployOptions;
use cloudweb_agent::ingress::config::Ports;
use cloudweb_agent::ingress::caddy::Launch;
use cloudweb_agent::ingress::IngressOptions;
use cloudweb_agent::identity::Identity;
use cloudweb_agent::join::{join, JoinOptions};
use cloudweb_agent::mesh::{EndpointSource, MeshMode, MeshOptions};
use cloudweb_agent::run::{run, RunError, RunOptions, EXIT_CERT_EXPIRED, EXIT_REMOVED};

#[derive(Parser)]
#[command(name = "cloudweb-agent", version, about = "The cloud-web node agent")]
struct Cli {
    /// Directory for the node's key, certificate and state.
    #[arg(long, global = true, env = "CLOUDWEB_AGENT_DATA_DIR", default_value = "/var/lib/cloudweb-agent")]
    data_dir: PathBuf,
    /// Protocol integer to announce (for compatibility testing).
    #[arg(long, global = true, hide = true, default_value_t = cloudweb_protocol::version::PROTOCOL)]
    speak_protocol: u32,
    #[command(subcommand)]
    command: Commands,
}

// Parsed once at start; boxing the run flags would buy nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Commands {
    /// Join a cluster with a single-use token.
    Join(JoinArgs),
    /// Run the agent: heartbeats, commands.
    Run(RunArgs),
    /// The WireGuard mesh on this node.
    #[command(subcommand)]
    Mesh(MeshCommand),
    /// Leave the cluster and delete this node's identity.
    Leave {
        /// Leave even while apps run here; their deployments become failed.
        #[arg(long)]
        force: bool,
        /// The Docker Engine whose containers of this node (apps, and the
        /// `--caddy-image` ingress) go too.
        #[arg(long, env = "DOCKER_HOST", default_value = "unix:///var/run/docker.sock")]
        docker_host: String,
    },
    /// Print this node's id and exit (for scripts).
    NodeId,
}

#[derive(Subcommand)]
enum MeshCommand {
    /// One line per peer: name, mesh address, endpoint, latest handshake,
    /// bytes received and sent, connected (handshake within 3 minutes).
    Status {
        #[arg(long)]
        json: bool,
        /// Handshake age under which a peer counts as connected (tests).
        #[arg(long, hide = true, default_value_t = 180, value_parser = clap::value_parser!(u64).range(1..=3600))]
        connected_seconds: u64,
    },
}

#[derive(Parser)]
struct JoinArgs {
    /// The control plane's agent URL, https://host:port.
    #[arg(long)]
    server: String,
    #[arg(long, env = "CLOUDWEB_JOIN_TOKEN", hide_env_values = true)]
    token: String,
    /// SHA-256 (hex) of the cluster CA certificate; the server must match it.
    #[arg(long)]
    ca_sha256: String,
    /// This node serves public HTTP(S) traffic.
    #[arg(long)]
    ingress: bool,
    /// Node name (defaults to the host name).
    #[arg(long)]
    name: Option<String>,
    /// host:port other nodes use to reach this node's WireGuard (leave it
    /// out behind NAT: the node then reaches the others, not the reverse).
    #[arg(long)]
    endpoint: Option<String>,
}

#[derive(Parser)]
struct RunArgs {
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=300))]
    heartbeat_interval_seconds: u64,
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=3600))]
    poll_interval_seconds: u64,
    /// Pace of retries after the control plane answered 426.
    #[arg(long, hide = true, default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..=3600))]
    upgrade_retry_seconds: u64,
    #[arg(long, env = "DOCKER_HOST", default_value = "unix:///var/run/docker.sock")]
    docker_host: String,
    /// Image that runs the install and build commands of static sites.
    #[arg(long, default_value = "node:20-bookworm-slim")]
    static_builder_image: String,
    /// Image with cloudweb-static, which serves static sites.
    #[arg(long, default_value = "cloudweb/static-server:latest")]
    static_server_image: String,
    /// Builder for buildpacks (used when the pack CLI is installed).
    #[arg(long, default_value = "paketobuildpacks/builder-jammy-base")]
    buildpacks_builder: String,
    /// Host address app ports are published on (default: the node's mesh
    /// address with the mesh on, 127.0.0.1 with it off). Never 0.0.0.0 by
    /// default: an instance port open on every interface bypasses the
    /// ingress and its TLS.
    #[arg(long)]
    publish_ip: Option<std::net::IpAddr>,
    /// Host the ingress (on any node) uses to reach this node's apps
    /// (default: the publish address).
    #[arg(long)]
    advertise_host: Option<String>,
    /// Accept file:// repositories (development and tests only).
    #[arg(long)]
    allow_file_repos: bool,
    /// Docker's per-registry certificate directory.
    #[arg(long, default_value = "/etc/docker/certs.d")]
    docker_certs_dir: PathBuf,
    /// Caddy binary run by ingress nodes.
    #[arg(long, default_value = "caddy")]
    caddy_bin: PathBuf,
    /// Run Caddy from this image as a container on the host network instead
    /// of the binary; it keeps serving while the agent restarts.
    #[arg(long, conflicts_with = "caddy_bin")]
    caddy_image: Option<String>,
    /// Port of the ingress's plain HTTP server (redirects to HTTPS).
    #[arg(long, default_value_t = 80)]
    http_port: u16,
    /// Port of the ingress's HTTPS server.
    #[arg(long, default_value_t = 443)]
    https_port: u16,
    /// The one address the ingress's HTTP and HTTPS servers listen on
    /// (default: every address of the host).
    #[arg(long)]
    ingress_ip: Option<std::net::IpAddr>,
    /// Seconds between two checks of the cluster registry.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=3600))]
    health_interval_seconds: u64,
    /// Check the registry at this host:port instead of the address the
    /// control plane gives (a node that reaches it by another route).
    #[arg(long)]
    registry_check_address: Option<String>,
    /// Images kept per app on this node besides those containers use; older
    /// images of superseded deployments are removed (the registry keeps them).
    #[arg(long, default_value_t = cloudweb_agent::prune::DEFAULT_KEEP)]
    keep_images: usize,
    /// Seconds between two prunings of superseded deployments' images.
    #[arg(long, default_value_t = cloudweb_agent::prune::DEFAULT_INTERVAL.as_secs(), value_parser = clap::value_parser!(u64).range(1..=86400))]
    image_prune_interval_seconds: u64,
    /// Seconds between two usage samples sent with heartbeats.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=3600))]
    metrics_interval_seconds: u64,
    /// WireGuard mesh: `off` leaves networking alone (several agents on one
    /// host), `userspace` runs wireguard-go, `kernel` uses kernel WireGuard
    /// (netlink), `auto` the kernel when it has WireGuard and wireguard-go
    /// otherwise (the installers' choice).
    #[arg(long, value_enum, default_value = "off")]
    mesh_mode: MeshMode,
    /// Name of the mesh interface (and of its socket in /var/run/wireguard).
    #[arg(long, default_value = "cw0")]
    mesh_interface: String,
    /// UDP port the mesh listens on (the port of the join's --endpoint).
    #[arg(long, default_value_t = 51820, value_parser = clap::value_parser!(u16).range(1..))]
    mesh_listen_port: u16,
    /// host:port other nodes reach this node's WireGuard at, sent with
    /// every heartbeat (it replaces the join's --endpoint when it changed).
    #[arg(long, conflicts_with = "mesh_endpoint_interface")]
    mesh_endpoint: Option<String>,
    /// Follow this interface's first IPv4 address as the endpoint host
    /// (with --mesh-listen-port): a node whose public address changes
    /// reports the new one within a heartbeat.
    #[arg(long)]
    mesh_endpoint_interface: Option<String>,
    /// The userspace WireGuard binary.
    #[arg(long, default_value = "wireguard-go")]
    wireguard_go: PathBuf,
    /// Handshake age under which a peer counts as connected (tests).
    #[arg(long, hide = true, default_value_t = 180, value_parser = clap::value_parser!(u64).range(1..=3600))]
    mesh_connected_seconds: u64,
}

fn main() -> std::process::ExitCode {
    cloudweb_allocator::tune();
    match real_main() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err:#}");
            // A removed node must not be restarted by its service manager.
            if matches!(err.downcast_ref::<RunError>(), Some(RunError::Removed(_))) {
                return std::process::ExitCode::from(EXIT_REMOVED);
            }
            if matches!(err.downcast_ref::<RunError>(), Some(RunError::CertificateExpired(_))) {
                return std::process::ExitCode::from(EXIT_CERT_EXPIRED);
            }
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
    // Keys, certificates and state files are the node's alone.
    nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o077));
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    runtime.block_on(async move {
        match cli.command {
            Commands::Join(args) => {
                let ca_sha256 = parse_fingerprint(&args.ca_sha256).map_err(anyhow::Error::msg)?;
                if !args.server.starts_with("https://") {
                    anyhow::bail!("--server must be an https:// URL");
                }
                let hostname = nix::unistd::gethostname()
                    .context("reading the host name")?
                    .into_string()
                    .map_err(|_| anyhow::anyhow!("the host name is not UTF-8"))?;
                let info = join(JoinOptions {
                    server: &args.server,
                    token: &args.token,
                    ca_sha256,
                    data_dir: &cli.data_dir,
                    ingress: args.ingress,
                    name: args.name,
                    hostname,
                    endpoint: args.endpoint,
                    protocol: cli.speak_protocol,
                })
                .await?;
                println!("joined as {} ({}), mesh address {}", info.name, info.node_id, info.mesh_address);
                Ok(())
            }
            Commands::Run(args) => {
                for image in [&args.static_builder_image, &args.static_server_image, &args.buildpacks_builder].into_iter().chain(args.caddy_image.as_ref()) {
                    if image.is_empty() || image.starts_with('-') || image.contains(char::is_whitespace) {
                        anyhow::bail!("image names must not be empty, start with '-' or contain spaces: {image:?}");
                    }
                }
                let identity = Identity::load(&cli.data_dir)?;
                if args.http_port == 0 || args.https_port == 0 || args.http_port == args.https_port {
                    anyhow::bail!("--http-port and --https-port must be two different non-zero ports");
                }
                let ingress = identity.info.ingress.then(|| IngressOptions {
                    launch: match args.caddy_image.clone() {
                        Some(image) => Launch::Image { image, docker_host: args.docker_host.clone(), node_id: identity.info.node_id.clone() },
                        None => Launch::Binary(resolve_binary(&args.caddy_bin)),
                    },
                    ports: Ports { http: args.http_port, https: args.https_port, ip: args.ingress_ip },
                    dir: cli.data_dir.join("caddy"),
                });
                let mesh = match args.mesh_mode.choice() {
                    None => None,
                    Some(choice) => {
                        if !cloudweb_agent::mesh::device::valid_interface_name(&args.mesh_interface) {
                            anyhow::bail!("--mesh-interface must be 1 to 15 characters of [A-Za-z0-9_.-], not starting with '-' or '.'");
                        }
                        let mesh_address = cloudweb_agent::mesh::parse_mesh_address(&identity.info.mesh_address)
                            .with_context(|| format!("node.json has no usable mesh address ({:?})", identity.info.mesh_address))?;
                        Some(MeshOptions {
                            choice,
                            data_dir: cli.data_dir.clone(),
                            interface: args.mesh_interface.clone(),
                            listen_port: args.mesh_listen_port,
                            wireguard_go: resolve_binary(&args.wireguard_go),
                            key: cloudweb_agent::mesh::key::KeyPair::load(&cli.data_dir)?,
                            mesh_address,
                            endpoint: match (&args.mesh_endpoint, &args.mesh_endpoint_interface) {
                                (Some(endpoint), _) => {
                                    cloudweb_protocol::validate::endpoint("--mesh-endpoint", endpoint).map_err(anyhow::Error::msg)?;
                                    EndpointSource::Fixed(endpoint.clone())
                                }
                                (None, Some(interface)) => {
                                    if !cloudweb_agent::mesh::device::valid_interface_name(interface) {
                                        anyhow::bail!("--mesh-endpoint-interface must be an interface name");
                                    }
                                    EndpointSource::Interface(interface.clone())
                                }
                                (None, None) => EndpointSource::Joined,
                            },
                            refresh: Duration::from_secs(args.poll_interval_seconds),
                            connected_within: Duration::from_secs(args.mesh_connected_seconds),
                        })
                    }
                };
                if mesh.is_none() && (args.mesh_endpoint.is_some() || args.mesh_endpoint_interface.is_some()) {
                    anyhow::bail!("--mesh-endpoint and --mesh-endpoint-interface need the mesh (--mesh-mode auto, kernel or userspace)");
                }
                let publish_ip = args.publish_ip.unwrap_or(match &mesh {
                    Some(mesh) => std::net::IpAddr::V4(mesh.mesh_address),
                    None => std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST),
                });
                if publish_ip.is_unspecified() {
                    tracing::warn!("--publish-ip {publish_ip}: instance ports are open on every interface, around the ingress and its TLS");
                }
                let advertise_host = match (args.advertise_host, &mesh) {
                    (Some(host), _) => host,
                    (None, _) if !publish_ip.is_unspecified() => publish_ip.to_string(),
                    (None, Some(mesh)) => mesh.mesh_address.to_string(),
                    (None, None) => anyhow::bail!("--publish-ip {publish_ip} needs --advertise-host (the address other nodes reach this one at)"),
                };
                if advertise_host.parse::<std::net::IpAddr>().is_err() {
                    cloudweb_protocol::validate::hostname("--advertise-host", &advertise_host).map_err(anyhow::Error::msg)?;
                }
                run(RunOptions {
                    data_dir: cli.data_dir.clone(),
                    heartbeat_interval: Duration::from_secs(args.heartbeat_interval_seconds),
                    poll_interval: Duration::from_secs(args.poll_interval_seconds),
                    upgrade_retry: Duration::from_secs(args.upgrade_retry_seconds),
                    docker_host: args.docker_host,
                    protocol: cli.speak_protocol,
                    deploy: DeployOptions {
                        data_dir: cli.data_dir.clone(),
                        static_builder_image: args.static_builder_image,
                        static_server_image: args.static_server_image,
                        buildpacks_builder: args.buildpacks_builder,
                        publish_ip: publish_ip.to_string(),
                        advertise_host,
                        allow_file_repos: args.allow_file_repos,
                        docker_certs_dir: args.docker_certs_dir,
                    },
                    ingress,
                    mesh,
                    metrics_interval: Duration::from_secs(args.metrics_interval_seconds),
                    health_interval: Duration::from_secs(args.health_interval_seconds),
                    keep_images: args.keep_images,
                    image_prune_interval: Duration::from_secs(args.image_prune_interval_seconds),
                    registry_check_address: match args.registry_check_address {
                        Some(address) => {
                            cloudweb_protocol::validate::endpoint("--registry-check-address", &address).map_err(anyhow::Error::msg)?;
                            Some(address)
                        }
                        None => None,
                    },
                })
                .await?;
                Ok(())
            }
            Commands::NodeId => {
                println!("{}", Identity::load(&cli.data_dir)?.info.node_id);
                Ok(())
            }
            Commands::Mesh(MeshCommand::Status { json, connected_seconds }) => {
                mesh_status(&cli.data_dir, json, Duration::from_secs(connected_seconds)).await
            }
            Commands::Leave { force, docker_host } => {
                let identity = Identity::load(&cli.data_dir)?;
                // From the replica the agent used last; one that is gone or
                // does not lead moves the client on, and the leave is tried
                // once more per replica known.
                let client = ControlPlane::for_node(&identity, cli.speak_protocol)?
                    .keeping_replicas_in(cli.data_dir.join(cloudweb_agent::control_planes::FILE));
                let node_id = identity.info.node_id.clone();
                let mut tried = client.replicas().current();
                let mut outcome = client.leave(force).await;
                for _ in 1..client.replicas().all().len() {
                    // Only a failure that moved the client is tried again.
                    if outcome.is_ok() || client.replicas().current() == tried {
                        break;
                    }
                    tried = client.replicas().current();
                    outcome = client.leave(force).await;
                }
                match outcome {
                    Ok(left) => {
                        remove_node_containers(&docker_host, &node_id).await;
                        remove_relay_rule(&cli.data_dir).await;
                        Identity::erase(&cli.data_dir)?;
                        println!("node {} left the cluster", left.node_id);
                        for deployment in left.failed_deployments {
                            println!("deployment {deployment} marked failed");
                        }
                        for deployment in left.rescheduled {
                            println!("deployment {deployment} runs its image again on another node");
                        }
                        Ok(())
                    }
                    // Removed by an administrator already: nothing left to
                    // tell the control plane, so just forget the identity.
                    Err(err) if err.status() == Some(403) => {
                        remove_node_containers(&docker_host, &node_id).await;
                        remove_relay_rule(&cli.data_dir).await;
                        Identity::erase(&cli.data_dir)?;
                        println!("node {node_id} was already removed from the cluster");
                        Ok(())
                    }
                    // Forced, and no answer at all (down, unreachable, no
                    // route): the node still leaves on its own side, so an
                    // uninstall does not stop half-way with the node's
                    // containers still serving on their ports. The control
                    // plane keeps the node until an administrator removes it.
                    Err(err) if force && err.status().is_none() => {
                        eprintln!("{err}");
                        remove_node_containers(&docker_host, &node_id).await;
                        remove_relay_rule(&cli.data_dir).await;
                        Identity::erase(&cli.data_dir)?;
                        println!("node {node_id} left on its own side; the control plane was NOT told (it could not be reached)");
                        println!("the node stays listed there: remove it with DELETE /api/nodes/{node_id}?force=1 once it shows unreachable");
                        Ok(())
                    }
                    Err(err) if err.status().is_none() => Err(anyhow::anyhow!(
                        "{err}; nothing was removed. Retry when the control plane is reachable, or use `leave --force` to remove this node's containers and identity without telling it"
                    )),
                    Err(err) => Err(err.into()),
                }
            }
        }
    })
}

/// The firewall rule the agent adds while this node relays between nodes
/// behind NAT (see `mesh::relay`), found through the interface named in
/// the mesh cache. Nothing to do on a node without a mesh.
async fn remove_relay_rule(data_dir: &std::path::Path) {
    let Ok(Some(cache)) = cloudweb_agent::mesh::status::MeshCache::load(data_dir) else { return };
    if let Err(err) = cloudweb_agent::mesh::relay::remove_rules(&cache.interface).await {
        eprintln!("could not remove the mesh relay's firewall rule: {err}");
    }
}

/// Stops and removes every container labelled with this node's id (app
/// instances, build steps, task runs, services, the ingress) and prints each. Only those: other
/// containers on the host are not ours. Docker being unreachable does not
/// stop the leave; it is said.
async fn remove_node_containers(docker_host: &str, node_id: &str) {
    let runtime = match cloudweb_agent::runtime::DockerRuntime::new(docker_host, node_id) {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("could not reach Docker to remove this node's containers: {err}");
            return;
        }
    };
    match runtime.all_node_containers().await {
        Ok(containers) => {
            for (id, name) in containers {
                match runtime.remove(&id).await {
                    Ok(()) => println!("removed container {name}"),
                    Err(err) => eprintln!("could not remove container {name}: {err}"),
                }
            }
        }
        Err(err) => eprintln!("could not list this node's containers: {err}"),
    }
}

/// A bare program name is looked up in PATH once, so the agent runs the same
/// binary for its whole life.
fn resolve_binary(name: &std::path::Path) -> PathBuf {
    if name.components().count() > 1 {
        return name.to_path_buf();
    }
    cloudweb_agent::find_on_path(name).unwrap_or_else(|| name.to_path_buf())
}

/// `cloudweb-agent mesh status`: the running agent's peer list (mesh.json)
/// joined with what the device reports now.
async fn mesh_status(data_dir: &std::path::Path, json: bool, within: Duration) -> anyhow::Result<()> {
    use cloudweb_agent::mesh::{device, status};
    let cache = status::MeshCache::load(data_dir)?.with_context(|| {
        format!("no mesh on this node ({} is missing): run the agent with --mesh-mode auto", data_dir.join(status::CACHE_FILE).display())
    })?;
    let device = device::read(&cache.interface)
        .await
        .with_context(|| format!("the mesh interface {} is not up; is the agent running?", cache.interface))?;
    let list = status::statuses(&cache.peers, &device, std::time::SystemTime::now(), within);
    let health = status::health(&list);
    if json {
        let body = serde_json::json!({
            "interface": cache.interface,
            "mesh_address": cache.mesh_address,
            "peers": list,
            "total": health.peers,
            "connected": health.connected,
        });
        println!("{}", serde_json::to_string_pretty(&body)?);
    } else {
        println!("{} {}: mesh {}/{} connected", cache.interface, cache.mesh_address, health.connected, health.peers);
        print!("{}", status::render(&list));
    }
    Ok(())
}
