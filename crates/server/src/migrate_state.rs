//! `cloudweb-server migrate-state --from sqlite:///… --to postgres://…`:
//! copies a cluster's state from its SQLite file into an empty PostgreSQL
//! database, then checks every table on both sides (row count and a
//! checksum over its rows' values) and prints what it found.

use std::path::PathBuf;

use anyhow::{bail, Context};
use cloudweb_server::clock::{Clock, SystemClock};
use cloudweb_server::store::{DatabaseUrl, Store};

#[derive(clap::Parser)]
pub struct MigrateStateArgs {
    /// The SQLite state to copy: sqlite:///var/lib/cloudweb/state.db. Stop
    /// the control plane first: what it writes after the copy is not in it.
    #[arg(long, value_name = "URL", value_parser = DatabaseUrl::parse)]
    from: DatabaseUrl,
    /// An empty PostgreSQL database: postgres://user@host:5432/cloudweb (the
    /// password from CLOUDWEB_MIGRATE_TO_PASSWORD, never on a command line).
    #[arg(long, value_name = "URL", value_parser = DatabaseUrl::parse)]
    to: DatabaseUrl,
    /// Where a backup made before either database is migrated goes
    /// (`backups/` under it); the source file's directory by default.
    #[arg(long, value_name = "DIR")]
    backup_dir: Option<PathBuf>,
}

pub async fn run(args: MigrateStateArgs) -> anyhow::Result<()> {
    let DatabaseUrl::Sqlite(path) = &args.from else { bail!("--from must be a sqlite:// URL (the state to copy)") };
    let DatabaseUrl::Postgres(_) = &args.to else { bail!("--to must be a postgres:// URL (an empty database)") };
    if !path.is_file() {
        bail!("no SQLite state at {}", path.display());
    }
    let to = match std::env::var("CLOUDWEB_MIGRATE_TO_PASSWORD") {
        Ok(password) => args.to.with_password(&password).map_err(anyhow::Error::msg)?,
        Err(_) => args.to.clone(),
    };
    let backup_dir = args.backup_dir.clone().unwrap_or_else(|| path.parent().map(PathBuf::from).unwrap_or_default());
    let stamp = SystemClock
        .now()
        .format(time::macros::format_description!("[year][month][day]T[hour][minute][second]Z"))
        .unwrap_or_else(|_| "unknown".to_string());
    let source = Store::connect(&args.from, &backup_dir, &stamp).await.with_context(|| format!("cannot open {}", args.from))?;
    let target = Store::connect(&to, &backup_dir, &stamp).await.with_context(|| format!("cannot open {}", args.to))?;
    let copied = source.copy_into(&target).await.with_context(|| format!("cannot copy {} into {}", args.from, args.to));
    source.close().await;
    target.close().await;
    let copies = copied?;
    let rows: u64 = copies.iter().map(|c| c.rows).sum();
    for copy in &copies {
        println!("{:<28} {:>9} rows  sha256 {}", copy.table, copy.rows, copy.checksum);
    }
    println!("copied {rows} rows of {} tables from {} into {}; every table has the same rows and checksum on both sides", copies.len(), args.from, args.to);
    println!("next: start cloudweb-server serve with --database-url {} (and the same --data-dir, which keeps the CA and keys)", args.to);
    Ok(())
}
