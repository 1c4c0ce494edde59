//! Command-line parsing, by hand because the crate takes no dependencies.
//! Accepts `--flag value` and `--flag=value`.

use std::ffi::OsString;
use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;

pub const USAGE: &str = "\
usage: cloudweb-static --root DIR [--listen ADDR] [--spa]

Serves the files under DIR over HTTP/1.1 (GET and HEAD only).

  --root DIR      directory to serve; `/` and directories serve index.html
  --listen ADDR   socket address to listen on [default: 0.0.0.0:8080]
  --spa           answer missing paths without a file extension with
                  DIR/index.html (for client-side routers)
  -h, --help      print this help
";

const DEFAULT_LISTEN: &str = "0.0.0.0:8080";

/// What the command line asks for.
#[derive(Debug, PartialEq, Eq)]
pub enum Command {
    Serve(Options),
    Help,
}

#[derive(Debug, PartialEq, Eq)]
pub struct Options {
    pub root: PathBuf,
    pub listen: SocketAddr,
    pub spa: bool,
}

/// A command line that cannot be run; the message names the bad argument.
#[derive(Debug, PartialEq, Eq)]
pub struct ArgsError(String);

impl fmt::Display for ArgsError {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str(&self.0)
    }
}

impl std::error::Error for ArgsError {}

/// Parses the arguments after the program name.
pub fn parse(args: impl IntoIterator<Item = OsString>) -> Result<Command, ArgsError> {
    let mut args = args.into_iter();
    let mut root = None;
    let mut listen = None;
    let mut spa = false;
    while let Some(arg) = args.next() {
        // Only flag names must be UTF-8; values (paths) may be any bytes.
        let text = arg.to_str().ok_or_else(|| ArgsError(format!("unexpected argument {arg:?}")))?;
        let (name, inline_value) = match text.split_once('=') {
            Some((name, value)) if name.starts_with("--") => (name, Some(OsString::from(value))),
            _ => (text, None),
        };
        let mut value = |flag: &str| {
            inline_value.clone().or_else(|| args.next()).ok_or_else(|| ArgsError(format!("{flag} needs a value")))
        };
        match name {
            "-h" | "--help" => return Ok(Command::Help),
            "--root" => root = Some(PathBuf::from(value("--root")?)),
            "--listen" => listen = Some(value("--listen")?),
            "--spa" if inline_value.is_none() => spa = true,
            _ => return Err(ArgsError(format!("unexpected argument {text:?}"))),
        }
    }
    let root = root.ok_or_else(|| ArgsError("--root DIR is required".into()))?;
    let listen = listen.unwrap_or_else(|| DEFAULT_LISTEN.into());
    // A literal socket address only: name resolution would pull the NSS
    // machinery into a static binary that has no /etc to configure it.
    let listen = listen
        .to_str()
        .and_then(|text| text.parse().ok())
        .ok_or_else(|| ArgsError(format!("--listen {listen:?} is not an IP:PORT socket address")))?;
    Ok(Command::Serve(Options { root, listen, spa }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(args: &[&str], expected: Result<Command, &str>) {
        let actual = parse(args.iter().map(OsString::from));
        assert_eq!(actual.map_err(|error| error.to_string()), expected.map_err(str::to_string), "{args:?}");
    }

    fn serve(root: &str, listen: &str, spa: bool) -> Result<Command, &'static str> {
        Ok(Command::Serve(Options { root: root.into(), listen: listen.parse().unwrap(), spa }))
    }

    #[test]
    fn parses_flags() {
        check(&["--root", "/site", "--listen", "0.0.0.0:8080", "--spa"], serve("/site", "0.0.0.0:8080", true));
        check(&["--root=/site", "--listen=127.0.0.1:9000"], serve("/site", "127.0.0.1:9000", false));
        check(&["--spa", "--root", "/site"], serve("/site", "0.0.0.0:8080", true));
        check(&["--listen", "[::1]:80", "--root", "a=b"], serve("a=b", "[::1]:80", false));
        check(&["--root", "/site", "--help"], Ok(Command::Help));
    }

    #[test]
    fn refuses_bad_command_lines() {
        check(&[], Err("--root DIR is required"));
        check(&["--root"], Err("--root needs a value"));
        check(&["--root", "/site", "--port", "80"], Err("unexpected argument \"--port\""));
        check(&["--root", "/site", "--spa=yes"], Err("unexpected argument \"--spa=yes\""));
        check(
            &["--root", "/site", "--listen", "localhost:80"],
            Err("--listen \"localhost:80\" is not an IP:PORT socket address"),
        );
    }
}
