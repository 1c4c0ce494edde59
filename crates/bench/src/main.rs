//! `cloudweb-bench`: benchmarks that start the real binaries and print
//! figures. Build with `--release`; see the README for the targets.

mod heartbeats;
mod procstat;
mod server;
mod stats;

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
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("tokio runtime");
    let result = runtime.block_on(async {
        match cli.command {
            Commands::Heartbeats(args) => heartbeats::run(args).await,
        }
    });
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
