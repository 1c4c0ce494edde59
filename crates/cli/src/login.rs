//! `cloudweb login`: stores the server URL and an API token, once the
//! server has accepted the token; and reading a secret from a terminal
//! without echo (also for a git password and an env value).

use std::io::{BufRead, IsTerminal, Read};

use clap::Args;
use cloudweb_api_types::apps::AppList;

use crate::client::Api;
use crate::{config, Failure};

#[derive(Args)]
pub struct LoginArgs {
    /// PEM file of the CA of an https server's certificate (default: the
    /// system's bundle).
    #[arg(long, value_name = "FILE")]
    ca_file: Option<std::path::PathBuf>,
}

/// Reads one secret line: from a terminal without echo, else from stdin.
pub fn read_secret(prompt: &str) -> Result<String, Failure> {
    let stdin = std::io::stdin();
    if stdin.is_terminal() {
        eprint!("{prompt}");
        let _echo = NoEcho::new();
        let mut line = String::new();
        let read = stdin.lock().read_line(&mut line);
        eprintln!();
        read.map_err(|e| Failure::Action(format!("cannot read stdin: {e}")))?;
        Ok(line)
    } else {
        let mut text = String::new();
        stdin.lock().take(64 * 1024).read_to_string(&mut text).map_err(|e| Failure::Action(format!("cannot read stdin: {e}")))?;
        Ok(text.lines().next().unwrap_or_default().to_string())
    }
}

/// Turns the terminal's echo off while it lives.
struct NoEcho(Option<libc::termios>);

impl NoEcho {
    fn new() -> NoEcho {
        // SAFETY: tcgetattr/tcsetattr on stdin with a zeroed termios that
        // tcgetattr fills in; the old settings are restored on drop.
        unsafe {
            let mut old: libc::termios = std::mem::zeroed();
            if libc::tcgetattr(libc::STDIN_FILENO, &mut old) != 0 {
                return NoEcho(None);
            }
            let mut quiet = old;
            quiet.c_lflag &= !libc::ECHO;
            quiet.c_lflag |= libc::ECHONL;
            if libc::tcsetattr(libc::STDIN_FILENO, libc::TCSANOW, &quiet) != 0 {
                return NoEcho(None);
            }
            NoEcho(Some(old))
        }
    }
}

impl Drop for NoEcho {
    fn drop(&mut self) {
        if let Some(old) = self.0 {
            // SAFETY: restores the settings read in `new`.
            unsafe {
                libc::tcsetattr(libc::STDIN_FILENO, libc::TCSANOW, &old);
            }
        }
    }
}

pub async fn login(server_flag: Option<&str>, args: &LoginArgs) -> Result<(), Failure> {
    let stored = config::load().ok().flatten();
    let server = match (server_flag, std::env::var("CLOUDWEB_SERVER").ok().filter(|s| !s.is_empty()), &stored) {
        (Some(server), _, _) => config::server_url(server)?,
        (None, Some(server), _) => config::server_url(&server)?,
        (None, None, Some(stored)) => stored.server.clone(),
        (None, None, None) => config::DEFAULT_SERVER.to_string(),
    };
    if let Some(file) = &args.ca_file {
        if !file.is_file() {
            return Err(Failure::Usage(format!("--ca-file {}: no such file", file.display())));
        }
    }
    let token = match std::env::var("CLOUDWEB_TOKEN").ok().filter(|t| !t.is_empty()) {
        Some(token) => token,
        None => read_secret("API token: ")?,
    };
    let token = config::token(&token)?;
    let ca_file = args.ca_file.clone().map(|f| std::path::absolute(&f).unwrap_or(f)).or(stored.and_then(|s| s.ca_file));
    let config = config::Config { server: server.clone(), token, ca_file, team: None };
    // Check the token before storing it.
    Api::new(&config)?.get::<AppList>("/api/apps").await?;
    let path = config::save(&config)?;
    println!("logged in to {server} (token stored in {})", path.display());
    Ok(())
}

