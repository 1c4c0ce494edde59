//! Where `cloudweb login` keeps the server URL and the API token:
//! `$XDG_CONFIG_HOME/cloudweb/config.json` (else `~/.config/cloudweb/`),
//! the directory 0700 and the file 0600 from the moment it exists.
//! `CLOUDWEB_SERVER` and `CLOUDWEB_TOKEN` override what is stored, for
//! scripts that keep the token in their own secret store.

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::Failure;

/// The server `login` uses when none is given: the control plane's
/// default `--api-listen`.
pub const DEFAULT_SERVER: &str = "http://127.0.0.1:8080";

#[derive(Clone, Serialize, Deserialize, Default)]
pub struct Config {
    pub server: String,
    pub token: String,
    /// PEM file of the CA that signed an https server's certificate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<PathBuf>,
    /// The current team (`cloudweb teams switch`): new apps, services and
    /// destinations go to it. `CLOUDWEB_TEAM` overrides it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub team: Option<String>,
}

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Config").field("server", &self.server).field("token", &"<redacted>").field("ca_file", &self.ca_file).field("team", &self.team).finish()
    }
}

pub fn dir() -> Result<PathBuf, Failure> {
    if let Some(dir) = std::env::var_os("XDG_CONFIG_HOME").filter(|d| !d.is_empty()) {
        let dir = PathBuf::from(dir);
        if dir.is_absolute() {
            return Ok(dir.join("cloudweb"));
        }
    }
    match std::env::var_os("HOME").filter(|h| !h.is_empty()) {
        Some(home) => Ok(PathBuf::from(home).join(".config").join("cloudweb")),
        None => Err(Failure::Action("neither XDG_CONFIG_HOME nor HOME is set: no place for the configuration".into())),
    }
}

pub fn path() -> Result<PathBuf, Failure> {
    Ok(dir()?.join("config.json"))
}

/// The stored configuration, if any.
pub fn load() -> Result<Option<Config>, Failure> {
    let path = path()?;
    match std::fs::read(&path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| Failure::Action(format!("{} is damaged ({e}); run `cloudweb login` again", path.display()))),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(err) => Err(Failure::Action(format!("cannot read {}: {err}", path.display()))),
    }
}

/// Writes the configuration: a new 0600 file renamed over the old one.
pub fn save(config: &Config) -> Result<PathBuf, Failure> {
    let dir = dir()?;
    let io = |what: &str, err: std::io::Error| Failure::Action(format!("cannot {what} {}: {err}", dir.display()));
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(&dir).map_err(|e| io("create", e))?;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).map_err(|e| io("protect", e))?;
    let path = dir.join("config.json");
    let temporary = dir.join(format!(".config.json.{}", std::process::id()));
    let _ = std::fs::remove_file(&temporary);
    let mut file = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&temporary).map_err(|e| io("write in", e))?;
    let text = serde_json::to_vec_pretty(config).expect("config serializes");
    file.write_all(&text).and_then(|()| file.sync_all()).map_err(|e| io("write in", e))?;
    std::fs::rename(&temporary, &path).map_err(|e| io("write in", e))?;
    Ok(path)
}

/// Removes the stored configuration; true when there was one.
pub fn remove() -> Result<bool, Failure> {
    let path = path()?;
    match std::fs::remove_file(&path) {
        Ok(()) => Ok(true),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(err) => Err(Failure::Action(format!("cannot remove {}: {err}", path.display()))),
    }
}

/// Checks a server URL and gives it without a trailing slash: http or
/// https, a host, no user name or password (they would be stored and shown
/// in clear), no query or fragment.
pub fn server_url(text: &str) -> Result<String, Failure> {
    let url = url::Url::parse(text.trim()).map_err(|e| Failure::Usage(format!("invalid server URL: {e}")))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(Failure::Usage("invalid server URL: it must start with http:// or https://".into()));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(Failure::Usage("invalid server URL: no host".into()));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(Failure::Usage("invalid server URL: leave credentials out of it (the token is read from stdin or CLOUDWEB_TOKEN)".into()));
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(Failure::Usage("invalid server URL: no query or fragment".into()));
    }
    Ok(url.as_str().trim_end_matches('/').to_string())
}

/// Checks an API token's shape (it is never printed, so the message says
/// only what is wrong).
pub fn token(text: &str) -> Result<String, Failure> {
    let token = text.trim();
    if token.is_empty() {
        return Err(Failure::Usage("no API token given (on stdin or in CLOUDWEB_TOKEN)".into()));
    }
    if token.len() > 512 || !token.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(Failure::Usage("invalid API token: expected up to 512 visible ASCII characters".into()));
    }
    Ok(token.to_string())
}

/// What commands use: the stored configuration with the environment's
/// overrides and `--server`.
pub fn effective(server_flag: Option<&str>) -> Result<Config, Failure> {
    let stored = load()?;
    let env_token = std::env::var("CLOUDWEB_TOKEN").ok().filter(|t| !t.is_empty());
    let env_server = std::env::var("CLOUDWEB_SERVER").ok().filter(|s| !s.is_empty());
    let token = match (env_token, &stored) {
        (Some(token), _) => token,
        (None, Some(stored)) => stored.token.clone(),
        (None, None) => return Err(Failure::Action("not logged in: run `cloudweb login` (or set CLOUDWEB_TOKEN)".into())),
    };
    let server = match (server_flag, env_server, &stored) {
        (Some(server), _, _) => server_url(server)?,
        (None, Some(server), _) => server_url(&server)?,
        (None, None, Some(stored)) => stored.server.clone(),
        (None, None, None) => DEFAULT_SERVER.to_string(),
    };
    let team = std::env::var("CLOUDWEB_TEAM").ok().filter(|t| !t.is_empty()).or_else(|| stored.as_ref().and_then(|s| s.team.clone()));
    Ok(Config { server, token: self::token(&token)?, ca_file: stored.and_then(|s| s.ca_file), team })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_urls_are_checked() {
        assert_eq!(server_url("http://127.0.0.1:8080/").unwrap(), "http://127.0.0.1:8080");
        assert_eq!(server_url("https://paas.example.com/base/").unwrap(), "https://paas.example.com/base");
        for bad in ["ftp://x", "127.0.0.1:8080", "http://user:pw@host", "http://host/?a=1", "http://"] {
            assert!(matches!(server_url(bad), Err(Failure::Usage(_))), "{bad}");
        }
    }

    #[test]
    fn tokens_are_checked_and_never_shown() {
        assert_eq!(token(" abc \n").unwrap(), "abc");
        assert!(token("").is_err());
        let Err(Failure::Usage(message)) = token("with space") else { panic!() };
        assert!(!message.contains("with space"));
        let config = Config { server: "http://x".into(), token: "secret-token".into(), ca_file: None, team: None };
        assert!(!format!("{config:?}").contains("secret-token"));
    }
}
