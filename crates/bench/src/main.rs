//! `cloudweb-bench`: benchmarks that start the real binaries and print
//! figures. Build with `--release`; docs/src/operations/benchmarks.md has
//! the targets.
//! `heartbeats` measures the agent protocol under load; `deploy` measures
//! the time from a deploy request to a running instance; `ingress` measures
//! route changes, blue/green switches and the latency Caddy adds; `mesh`
//! measures what the agents' configuration of the WireGuard mesh costs
//! against the same WireGuard configured by hand; `dashboard` measures
//! the dashboard's page weight and the Nodes page's time to first byte;
//! `acme` measures the time to a public host's first certificate from
//! pebble with N ingress nodes; `backups` measures issue 23's backups
//! against restic run by hand. Every command ends with its targets'
//! verdicts (`target …: met|NOT met`, see `target.rs`); `all --quick` runs
//! every command at a small size and sums the verdicts up.

mod acme;
mod agent_rss;
mod all;
mod apps;
mod permissions;
mod backups;
mod dashboard;
mod logs;
mod failover;
mod deploy;
mod docker;
mod exec;
mod flood;
mod git_daemon;
mod heartbeats;
mod ingress;
mod mesh;
mod process;
mod procstat;
mod scheduler;
mod server;
mod services;
mod simulate;
mod stats;
mod target;
mod timestamp;
mod volumes;
mod webhook;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "cloudweb-bench", about = "Benchmarks for cloud-web")]
struct Cli {
    #[command(subcommand)]
    command: Commands,
}

#[derive(Subcommand)]
enum Commands {
    /// N simulated agents, each on its own mTLS connection, heartbeating a
    /// real control plane on loopback.
    Heartbeats(heartbeats::Args),
    /// Time from a deploy request to running, stage by stage, for a rollback
    /// and a cached Dockerfile build, against a bare `docker run`, with a
    /// real control plane, agent, registry and git daemon on loopback.
    Deploy(deploy::Args),
    /// Route change to served by Caddy at 10, 1,000 and 10,000 routes,
    /// failed requests during blue/green switches, and the latency and
    /// throughput Caddy costs, with a real control plane, ingress agent and
    /// Caddy on loopback.
    Ingress(ingress::Args),
    /// Placements per second of the scheduler against simulated nodes, on
    /// one thread.
    Scheduler(scheduler::Args),
    /// Seeds of the deterministic simulation of the control plane (real
    /// store and deployment code, simulated agents, kills at any commit),
    /// counted by broken invariant; `--seed N` replays one.
    Simulate(simulate::Args),
    /// TCP throughput and latency between two real agents' network
    /// namespaces over the mesh the agents configured, against the same
    /// WireGuard configured by hand with `wg` in the same namespaces (and
    /// the plain link, for context).
    Mesh(mesh::Args),
    /// The agent's memory idle and with 50 containers, and the time one
    /// usage sample takes with 1, 20 and 100 containers.
    Agent(agent_rss::Args),
    /// Idle TLS connections without a client certificate against the agent
    /// listener: how many the server holds, the user API's latency and a
    /// fresh handshake under the flood, and what is left after the idle
    /// timeout.
    Flood(flood::Args),
    /// `POST /api/apps` answer times at growing route table sizes, against
    /// a real control plane on loopback.
    Apps(apps::Args),
    /// What the permission step adds to a user API request (the caller's
    /// access and the route's team check, on a state with many teams and
    /// apps), and the audit write a change adds.
    Permissions(permissions::Args),
    /// The dashboard's page weight per page, and the time to first byte of
    /// the Nodes page with 1,000 heartbeating nodes in the database.
    Dashboard(dashboard::Args),
    /// The runtime-log store: lines per second stored through the agent
    /// listener while 1,000 simulated agents heartbeat, and search latency
    /// over 10 million stored lines, against a real control plane.
    Logs(logs::Args),
    /// Time from a push webhook received to the deployment running, for a
    /// cached build, next to POST /deploy of the same commit (`--provider
    /// gitlab|github`: the host is a test stand-in on loopback; everything
    /// else is real).
    Webhook(webhook::WebhookArgs),
    /// Time from creating an app with a public domain to the first
    /// certificate Caddy serves for it, issued by pebble (Let's Encrypt's
    /// test CA) through the control plane, with N ingress nodes: median
    /// and p90 over the runs, and the ACME orders per host.
    Acme(acme::Args),
    Failover(failover::Args),
    /// Time from creating a managed PostgreSQL or Redis to it accepting
    /// connections, against `docker run` of the same image with the same
    /// readiness probe (local images from scripts/service-images.sh).
    Services(services::Args),
    /// Throughput of a volume move between two real agents over their
    /// mesh (from the POST to `switched`), against `tar | TCP | tar` over
    /// the same path, with the app's downtime.
    VolumeMove(volumes::Args),
    /// A PostgreSQL backup through cloud-web against `pg_dump -Fc | restic
    /// backup --stdin` by hand into the same repository, the restore in
    /// place to accepting connections, an unchanged volume's incremental
    /// backup, and the control plane's own backup with many apps.
    Backups(backups::Args),
    /// A keystroke's round trip and `cat` of a 100 MiB file through an
    /// exec session (WebSocket, control plane, the node's dial-back,
    /// `docker exec`), against `docker exec` on the node.
    Exec(exec::Args),
    /// Every command above, one after the other, each in its own process
    /// and bounded in time, then a table of every target's verdict; exits
    /// non-zero if a target is NOT met or a command failed. `--quick` runs
    /// each at a small size (under 5 minutes in all on 2 cores). Not run in
    /// CI: it needs Docker, root, pebble, Caddy and wireguard-go.
    All(all::Args),
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    if let Commands::All(args) = cli.command {
        return all::run(args);
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("tokio runtime");
    let result = runtime.block_on(async {
        match cli.command {
            // These three stop on Ctrl-C themselves and still clean up.
            Commands::Deploy(args) => deploy::run(args).await,
            Commands::Ingress(args) => ingress::run(args).await,
            Commands::Webhook(args) => webhook::run(args).await,
            Commands::Heartbeats(args) => interruptible(heartbeats::run(args)).await,
            Commands::Scheduler(args) => scheduler::run(args),
            Commands::Simulate(args) => simulate::run(args).await,
            Commands::Agent(args) => interruptible(agent_rss::run(args)).await,
            Commands::Flood(args) => interruptible(flood::run(args)).await,
            Commands::Apps(args) => interruptible(apps::run(args)).await,
            Commands::Permissions(args) => interruptible(permissions::run(args)).await,
            Commands::Dashboard(args) => interruptible(dashboard::run(args)).await,
            Commands::Logs(args) => interruptible(logs::run(args)).await,
            Commands::Mesh(args) => interruptible(mesh::run(args)).await,
            Commands::Acme(args) => interruptible(acme::run(args)).await,
            Commands::Failover(args) => interruptible(failover::run(args)).await,
            Commands::Services(args) => interruptible(services::run(args)).await,
            Commands::Exec(args) => interruptible(exec::run(args)).await,
            Commands::VolumeMove(args) => interruptible(volumes::run(args)).await,
            Commands::Backups(args) => interruptible(backups::run(args)).await,
            Commands::All(_) => unreachable!("handled above"),
        }
    });
    match result {
        Ok(targets) => {
            println!();
            target::print(&targets);
            std::process::ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("error: {err:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Ends `bench` on Ctrl-C (SIGINT, which is also how `all` stops a command
/// that overran its bound) by dropping it, which stops the processes it
/// started and removes its temporary directory and containers, instead of
/// dying with them left behind. (`mesh` measures on a blocking thread,
/// which the runtime waits for at exit; its namespaces go when it ends.)
async fn interruptible<T>(bench: impl std::future::Future<Output = anyhow::Result<T>>) -> anyhow::Result<T> {
    tokio::select! {
        outcome = bench => outcome,
        _ = tokio::signal::ctrl_c() => Err(anyhow::anyhow!("interrupted")),
    }
}

#[cfg(test)]
mod tests {
    /// Every subcommand's arguments are well formed (clap checks them only
    /// when that subcommand is parsed, which no other test does).
    #[test]
    fn the_command_line_is_well_formed() {
        <super::Cli as clap::CommandFactory>::command().debug_assert();
    }
}
