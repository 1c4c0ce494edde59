//! `cloudweb-server admin`: account chores done on the control plane's
//! machine, straight on its database, without the API: creating the first
//! user, setting a forgotten password. Passwords are read from a file or
//! from standard input (without echo on a terminal), never from the
//! command line, where other users could see them in the process list.

use std::io::{BufRead, IsTerminal, Write};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use cloudweb_server::auth::users;
use cloudweb_server::clock::{Clock, SystemClock};
use cloudweb_server::store::{Store, DATABASE_FILE};

#[derive(clap::Subcommand)]
pub enum AdminCommand {
    /// Create a user who can log in with a name and password.
    CreateUser(UserArgs),
    /// Set a user's password (ends their sessions).
    SetPassword(UserArgs),
}

#[derive(clap::Parser)]
pub struct UserArgs {
    /// The control plane's data directory.
    #[arg(long, env = "CLOUDWEB_DATA_DIR", default_value = "/var/lib/cloudweb")]
    data_dir: PathBuf,
    /// The control plane's --database-url when its state is not SQLite's
    /// state.db under --data-dir.
    #[arg(long, env = "CLOUDWEB_DATABASE_URL", value_name = "URL", value_parser = cloudweb_server::store::DatabaseUrl::parse, hide_env_values = true)]
    database_url: Option<cloudweb_server::store::DatabaseUrl>,
    /// The login name: letters, digits, '.', '_' or '-'.
    #[arg(long)]
    name: String,
    /// Read the password from this file (its first line) instead of
    /// standard input.
    #[arg(long)]
    password_file: Option<PathBuf>,
}

pub async fn run(command: AdminCommand) -> anyhow::Result<()> {
    let (args, create) = match command {
        AdminCommand::CreateUser(args) => (args, true),
        AdminCommand::SetPassword(args) => (args, false),
    };
    users::validate_name(&args.name).map_err(|e| anyhow::anyhow!("{e}"))?;
    let password = read_password(args.password_file.as_deref())?;
    users::validate_password(&password).map_err(|e| anyhow::anyhow!("{e}"))?;
    let store = open(&args.data_dir, args.database_url.as_ref()).await?;
    let result = if create {
        users::create(&store, SystemClock.now_ms(), &args.name, Some(&password), Some(cloudweb_server::access::ClusterRole::Admin)).await.map(|user| {
            println!("created user {} ({})", user.name, user.id);
        })
    } else {
        match store.user_by_name(&args.name).await? {
            Some(user) => users::set_password(&store, &user.id, &password).await.map(|()| {
                println!("set the password of {} and ended their sessions", user.name);
            }),
            None => bail!("no user named {}", args.name),
        }
    };
    store.close().await;
    result.map_err(|e| anyhow::anyhow!("{e}"))
}

async fn open(data_dir: &Path, url: Option<&cloudweb_server::store::DatabaseUrl>) -> anyhow::Result<Store> {
    let stamp = SystemClock
        .now()
        .format(time::macros::format_description!("[year][month][day]T[hour][minute][second]Z"))
        .unwrap_or_else(|_| "unknown".to_string());
    if let Some(url @ cloudweb_server::store::DatabaseUrl::Postgres(_)) = url {
        return Store::connect(url, data_dir, &stamp).await.with_context(|| format!("cannot open the database {url}"));
    }
    if !data_dir.join(DATABASE_FILE).is_file() {
        bail!(
            "no database at {}: start the control plane once (cloudweb-server serve --data-dir {}) or give the right --data-dir",
            data_dir.join(DATABASE_FILE).display(),
            data_dir.display()
        );
    }
    Store::open(data_dir, &stamp).await.with_context(|| format!("cannot open the database in {}", data_dir.display()))
}

/// The first line of the file, or of standard input (asked twice, without
/// echo, when it is a terminal). The line ending is not part of it.
fn read_password(file: Option<&Path>) -> anyhow::Result<String> {
    if let Some(path) = file {
        let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
        return Ok(first_line(&text));
    }
    let stdin = std::io::stdin();
    if stdin.is_terminal() {
        let first = prompt_hidden("Password: ")?;
        let again = prompt_hidden("Password (again): ")?;
        if first != again {
            bail!("the passwords differ");
        }
        return Ok(first);
    }
    let mut line = String::new();
    stdin.lock().read_line(&mut line).context("cannot read the password from standard input")?;
    if line.is_empty() {
        bail!("no password on standard input (or give --password-file)");
    }
    Ok(first_line(&line))
}

fn first_line(text: &str) -> String {
    text.lines().next().unwrap_or("").trim_end_matches('\r').to_string()
}

fn prompt_hidden(prompt: &str) -> anyhow::Result<String> {
    use nix::sys::termios::{tcgetattr, tcsetattr, LocalFlags, SetArg};
    let stdin = std::io::stdin();
    let saved = tcgetattr(&stdin).context("cannot read the terminal settings")?;
    let mut quiet = saved.clone();
    quiet.local_flags.remove(LocalFlags::ECHO);
    eprint!("{prompt}");
    let _ = std::io::stderr().flush();
    tcsetattr(&stdin, SetArg::TCSANOW, &quiet).context("cannot turn off the terminal echo")?;
    let mut line = String::new();
    let read = stdin.lock().read_line(&mut line);
    let _ = tcsetattr(&stdin, SetArg::TCSANOW, &saved);
    eprintln!();
    read.context("cannot read the password")?;
    Ok(first_line(&line))
}
