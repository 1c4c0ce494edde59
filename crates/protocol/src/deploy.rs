//! The `deploy` command's payload and the build settings of static sites.
//! The control plane validates these when a user sets them; the agent
//! validates them again before acting, because it does not trust the
//! server either.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::validate::{self, ValidationError};

/// Prefixes of variables that may enter a static site's build (they end up
/// in public JavaScript, so only variables meant to be public qualify).
pub const PUBLIC_ENV_PREFIXES: [&str; 5] = ["VITE_", "REACT_APP_", "NEXT_PUBLIC_", "PUBLIC_", "GATSBY_"];

pub fn is_public_env(name: &str) -> bool {
    PUBLIC_ENV_PREFIXES.iter().any(|prefix| name.starts_with(prefix))
}

/// Longest accepted build command.
pub const MAX_BUILD_COMMAND: usize = 512;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum Spa {
    #[default]
    Auto,
    Yes,
    No,
}

/// How the agent turns a checkout into an image. `Auto` detects: a
/// Dockerfile at the root, else a static site, else buildpacks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum Strategy {
    #[default]
    Auto,
    Dockerfile,
    Static,
    Buildpacks,
}

/// What a user sets for a static site. Every field is optional; what is
/// missing the agent detects.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema))]
pub struct BuildSettings {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub install_cmd: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub build_cmd: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_dir: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spa: Option<Spa>,
}

impl BuildSettings {
    /// Length, no line breaks, and an output dir that is relative and
    /// cannot climb out of the checkout. (Symlinks are checked by the agent
    /// on the real checkout.)
    pub fn validate(&self) -> Result<(), ValidationError> {
        for (field, value) in [("build.install_cmd", &self.install_cmd), ("build.build_cmd", &self.build_cmd)] {
            if let Some(command) = value {
                if command.trim().is_empty() {
                    return Err(ValidationError::new(field, "must not be empty"));
                }
                validate::bounded_text(field, command, MAX_BUILD_COMMAND)?;
            }
        }
        if let Some(dir) = &self.output_dir {
            output_dir(dir)?;
        }
        Ok(())
    }
}

/// A relative path inside the project: no leading '/', no '..', no empty or
/// odd components.
pub fn output_dir(dir: &str) -> Result<(), ValidationError> {
    const FIELD: &str = "build.output_dir";
    validate::bounded_text(FIELD, dir, 256)?;
    if dir.is_empty() || dir.starts_with('/') || dir.starts_with('-') {
        return Err(ValidationError::new(FIELD, "must be a relative path inside the project"));
    }
    for part in dir.split('/') {
        if part == ".." {
            return Err(ValidationError::new(FIELD, "must not contain '..'"));
        }
        if !part.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b'@' | b'+')) {
            return Err(ValidationError::new(FIELD, "may only contain letters, digits and . _ - @ +"));
        }
    }
    Ok(())
}

/// Where the code comes from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Source {
    pub repo_url: String,
    pub branch: String,
    /// Exact commit to build; the branch head when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commit: Option<String>,
    /// Short-lived credentials for this one clone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials: Option<GitCredentials>,
    /// The app's own ssh key and the host keys it trusts, for ssh:// and
    /// scp-like URLs (ssh never falls back to the node's keys).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ssh: Option<SshAccess>,
    /// The control plane runs with `--allow-private-git-hosts`: the git
    /// host may resolve to a loopback or private address.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_private_hosts: bool,
    /// PEM certificates (a private CA) that git trusts for this https
    /// repository's host only, on top of the node's own trust store: the
    /// control plane's `--gitlab-ca-file` for a self-hosted GitLab.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_pem: Option<String>,
}


pub use crate::ssh::{known_hosts, ssh_private_key, SshAccess};

#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GitCredentials {
    pub username: String,
    pub password: String,
}

impl std::fmt::Debug for GitCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GitCredentials").field("username", &self.username).field("password", &"<redacted>").finish()
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Limits {
    /// CPU cores (fractions allowed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_bytes: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HealthCheck {
    /// HTTP path probed until it answers (see [`healthy_status`]).
    pub path: String,
    pub timeout_seconds: u32,
}

impl Default for HealthCheck {
    fn default() -> Self {
        HealthCheck { path: "/".to_string(), timeout_seconds: 60 }
    }
}

pub use crate::probes::{
    healthy_status, CrashLoop, Liveness, ProbeCheck, Readiness, LIVENESS_BACKOFF_MAX_SECONDS,
    LIVENESS_BACKOFF_MIN_SECONDS,
};

/// Payload of a `deploy` command.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeployPayload {
    pub deployment_id: String,
    pub app: String,
    /// Which instance of the deployment this is (1-based).
    pub instance: u32,
    /// Container name, `cw-<app>-<n>`; `n` grows with every instance the
    /// app ever had, so an old and a new generation can run side by side.
    /// `cw-<app>-<instance>` when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<String>,
    /// Set for a deploy from code; absent when `image` is given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<Source>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Port the app listens on inside its container.
    pub port: u16,
    /// Only for deploys from code, and only when the user set it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub build: Option<BuildSettings>,
    /// Only for deploys from code; `auto` when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strategy: Option<Strategy>,
    /// A built image to run as is (rollback, reschedule, extra instances).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    #[serde(default)]
    pub limits: Limits,
    #[serde(default)]
    pub health: HealthCheck,
    /// How long cloning and building may take before the agent stops the
    /// build and fails the deployment; [`DEFAULT_BUILD_TIMEOUT_SECONDS`]
    /// when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub build_timeout_seconds: Option<u32>,
    /// Persistent volumes to mount (only to agents that report the
    /// `volumes` feature; absent means none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<crate::volumes::VolumeMount>,
    /// The app's rollout is `recreate`: stop its older instances on this
    /// node before starting this one (instead of blue/green).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub recreate: bool,
    /// Probe the instance after its health check and restart it when it
    /// stops answering (absent: no probe after the deploy).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub liveness: Option<Liveness>,
    /// Probe the instance after its health check and take it out of the
    /// upstreams while it fails (absent: in the upstreams while it runs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub readiness: Option<Readiness>,
}

/// Most variables an app may have, and the largest value.
pub const MAX_ENV_VARS: usize = 200;
pub const MAX_ENV_VALUE: usize = 32 * 1024;

/// Environment variable names: `[A-Za-z_][A-Za-z0-9_]*`, at most 128.
pub fn env_name(name: &str) -> Result<(), ValidationError> {
    let mut bytes = name.bytes();
    let first_ok = bytes.next().is_some_and(|b| b.is_ascii_alphabetic() || b == b'_');
    if !first_ok || name.len() > 128 || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
        return Err(ValidationError::new("env", "variable names must match [A-Za-z_][A-Za-z0-9_]* (at most 128)"));
    }
    Ok(())
}

pub fn env(vars: &BTreeMap<String, String>) -> Result<(), ValidationError> {
    if vars.len() > MAX_ENV_VARS {
        return Err(ValidationError::new("env", format!("at most {MAX_ENV_VARS} variables")));
    }
    for (name, value) in vars {
        env_name(name)?;
        if value.len() > MAX_ENV_VALUE {
            return Err(ValidationError::new(format!("env.{name}"), "value is larger than 32 KiB"));
        }
        if value.contains('\0') {
            return Err(ValidationError::new(format!("env.{name}"), "value contains a NUL byte"));
        }
    }
    Ok(())
}

/// A git repository URL: https://, ssh://, git:// or scp-like
/// `user@host:path`; `file://` only when `allow_file` (test and dev mode).
pub fn repo_url(url: &str, allow_file: bool) -> Result<(), ValidationError> {
    const FIELD: &str = "repo_url";
    validate::bounded_text(FIELD, url, 1024)?;
    if url.starts_with('-') || url.contains(char::is_whitespace) {
        return Err(ValidationError::new(FIELD, "must be a URL"));
    }
    let allowed = url.starts_with("https://")
        || url.starts_with("http://")
        || url.starts_with("ssh://")
        || url.starts_with("git://")
        || (allow_file && url.starts_with("file:///"));
    let scp_like = !url.contains("://") && url.split_once(':').is_some_and(|(host, _)| host.contains('@'));
    if !(allowed || scp_like) {
        return Err(ValidationError::new(FIELD, "scheme must be https, ssh or git"));
    }
    if let Some(rest) = url.strip_prefix("https://").or_else(|| url.strip_prefix("http://")) {
        if rest.split('/').next().is_some_and(|authority| authority.contains('@')) {
            return Err(ValidationError::new(FIELD, "must not carry credentials; set them on the app instead"));
        }
    }
    // git hands the host (and an ssh user) to ssh as an argument: one that
    // starts with '-' would be read as an option (`-oProxyCommand=…`).
    repo_host(url)?;
    Ok(())
}

/// Which transport a repository URL uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RepoScheme {
    Https,
    /// Plain HTTP: only to a git server on loopback or a private network
    /// that the control plane allows (see [`plain_http_address`]).
    Http,
    Ssh,
    Git,
}

impl RepoScheme {
    /// The port git dials when the URL names none.
    pub fn default_port(self) -> u16 {
        match self {
            RepoScheme::Https => 443,
            RepoScheme::Http => 80,
            RepoScheme::Ssh => 22,
            RepoScheme::Git => 9418,
        }
    }
}

/// The host a repository URL makes git contact, and the ssh user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepoHost {
    pub scheme: RepoScheme,
    pub user: Option<String>,
    /// A host name, or an IP address without brackets.
    pub host: String,
    pub port: Option<u16>,
}

impl RepoHost {
    /// The port git connects to.
    pub fn port_or_default(&self) -> u16 {
        self.port.unwrap_or(self.scheme.default_port())
    }
}

/// Splits a repository URL into scheme, user, host and port; `None` for
/// `file://`, which has no host. Refuses users and hosts starting with '-',
/// and hosts that are neither an IP address nor a DNS name.
pub fn repo_host(url: &str) -> Result<Option<RepoHost>, ValidationError> {
    const FIELD: &str = "repo_url";
    let bad = |problem: &str| ValidationError::new(FIELD, problem.to_string());
    let (scheme, authority) = if let Some((scheme, rest)) = url.split_once("://") {
        let scheme = match scheme {
            "https" => RepoScheme::Https,
            "http" => RepoScheme::Http,
            "ssh" => RepoScheme::Ssh,
            "git" => RepoScheme::Git,
            "file" => return Ok(None),
            _ => return Err(bad("scheme must be https, ssh or git")),
        };
        (scheme, rest.split(['/', '?', '#']).next().unwrap_or(""))
    } else {
        // scp-like `user@host:path`.
        let (authority, _) = url.split_once(':').ok_or_else(|| bad("must be a URL"))?;
        if authority.starts_with('[') {
            return Err(bad("an IPv6 host needs the ssh:// form"));
        }
        (RepoScheme::Ssh, authority)
    };
    let scp_like = !url.contains("://");
    let (user, host_port) = match authority.rsplit_once('@') {
        Some((user, rest)) => (Some(user), rest),
        None => (None, authority),
    };
    if let Some(user) = user {
        if user.is_empty() || user.starts_with('-') || !user.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-+".contains(&b)) {
            return Err(bad("the user must be letters, digits, '.', '_', '+' or '-', not starting with '-'"));
        }
    }
    let (host, port) = if let Some(v6) = host_port.strip_prefix('[') {
        let (host, after) = v6.split_once(']').ok_or_else(|| bad("unclosed '[' in the host"))?;
        if host.parse::<std::net::Ipv6Addr>().is_err() {
            return Err(bad("the host in brackets is not an IPv6 address"));
        }
        (host, after.strip_prefix(':'))
    } else if scp_like {
        (host_port, None)
    } else {
        match host_port.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (host_port, None),
        }
    };
    if host.is_empty() || host.starts_with('-') {
        return Err(bad("the host must not be empty or start with '-'"));
    }
    let port = match port {
        None | Some("") => None,
        Some(text) => match text.parse::<u16>() {
            Ok(port) if port > 0 => Some(port),
            _ => return Err(bad("the port must be 1 to 65535")),
        },
    };
    if host.parse::<std::net::IpAddr>().is_err() {
        validate::hostname(FIELD, host).map_err(|_| bad("the host is not a valid host name or IP address"))?;
        // The system resolver reads `2130706433`, `0x7f.1` or `127.1` as
        // addresses: only the plain dotted form is accepted for those.
        let last = host.rsplit('.').next().unwrap_or(host);
        if last.bytes().all(|b| b.is_ascii_digit()) || last.to_ascii_lowercase().starts_with("0x") {
            return Err(bad("write an IP address host in dotted decimal form"));
        }
    }
    Ok(Some(RepoHost { scheme, user: user.map(str::to_string), host: host.to_string(), port }))
}

/// Why a git host address is refused, or `None` when git may connect to
/// it. Loopback and private ranges pass only with `allow_private` (a
/// cluster whose git server is on its own network); link-local (which
/// holds cloud metadata services), unspecified, multicast and broadcast
/// addresses never do. An IPv4-mapped IPv6 address counts as its IPv4.
pub fn refused_git_address(ip: std::net::IpAddr, allow_private: bool) -> Option<&'static str> {
    use std::net::IpAddr;
    let ip = match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        },
        v4 => v4,
    };
    match ip {
        IpAddr::V4(v4) => {
            let [a, b, ..] = v4.octets();
            if v4.is_unspecified() || a == 0 {
                Some("an unspecified address")
            } else if v4.is_link_local() {
                Some("a link-local address (where cloud metadata services live)")
            } else if v4.is_multicast() || v4.is_broadcast() || a >= 240 {
                Some("a multicast, broadcast or reserved address")
            } else if v4.is_loopback() && !allow_private {
                Some("a loopback address")
            } else if (v4.is_private() || (a == 100 && (64..128).contains(&b))) && !allow_private {
                Some("a private address")
            } else {
                None
            }
        }
        IpAddr::V6(v6) => {
            let first = v6.segments()[0];
            if v6.is_unspecified() {
                Some("an unspecified address")
            } else if first & 0xffc0 == 0xfe80 {
                Some("a link-local address (where cloud metadata services live)")
            } else if v6.is_multicast() {
                Some("a multicast address")
            } else if v6.is_loopback() && !allow_private {
                Some("a loopback address")
            } else if first & 0xfe00 == 0xfc00 && !allow_private {
                Some("a private (unique local) address")
            } else {
                None
            }
        }
    }
}

/// Whether plain-HTTP git may go to `ip`: only loopback and private
/// addresses (credentials in clear never cross the internet).
pub fn plain_http_address(ip: std::net::IpAddr) -> bool {
    refused_git_address(ip, false).is_some() && refused_git_address(ip, true).is_none()
}

/// The control plane's check of where a repository URL points, before any
/// name is resolved: IP address hosts through [`refused_git_address`], and
/// `localhost` names as loopback. The agent checks the resolved addresses
/// again before it clones.
pub fn repo_destination(url: &str, allow_private: bool) -> Result<(), ValidationError> {
    let Some(target) = repo_host(url)? else {
        return Ok(());
    };
    let host = target.host.to_ascii_lowercase();
    if target.scheme == RepoScheme::Http {
        let private_literal = host.parse::<std::net::IpAddr>().map(plain_http_address).unwrap_or(true);
        if !allow_private || !private_literal {
            return Err(ValidationError::new(
                "repo_url",
                "plain http:// is only for a git server on loopback or a private network allowed by --allow-private-git-hosts or --allow-git-host; use https://",
            ));
        }
    }
    let reason = match host.parse::<std::net::IpAddr>() {
        Ok(ip) => refused_git_address(ip, allow_private),
        Err(_) if (host == "localhost" || host.ends_with(".localhost")) && !allow_private => Some("a loopback address"),
        Err(_) => None,
    };
    match reason {
        Some(reason) => Err(ValidationError::new(
            "repo_url",
            format!("the host is {reason}; git servers on loopback or private networks need --allow-private-git-hosts on the control plane"),
        )),
        None => Ok(()),
    }
}

/// A branch name git would accept, never starting with '-'.
pub fn branch(name: &str) -> Result<(), ValidationError> {
    const FIELD: &str = "branch";
    let bad = name.is_empty()
        || name.len() > 200
        || name.starts_with('-')
        || name.starts_with('/')
        || name.ends_with('/')
        || name.ends_with(".lock")
        || name.contains("..")
        || name.contains("@{")
        || name.contains("//")
        || name.bytes().any(|b| b.is_ascii_control() || b" ~^:?*[\\".contains(&b));
    if bad {
        return Err(ValidationError::new(FIELD, "is not a valid branch name"));
    }
    Ok(())
}

/// A full commit id as git prints it: 40 (SHA-1) or 64 (SHA-256)
/// lowercase hex digits.
pub fn full_commit(id: &str) -> Result<(), ValidationError> {
    if !(id.len() == 40 || id.len() == 64) || !id.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
        return Err(ValidationError::new("commit", "must be a full commit id (40 or 64 lowercase hexadecimal digits)"));
    }
    Ok(())
}

/// Build time limit when the app sets none, and the largest an app may set.
pub const DEFAULT_BUILD_TIMEOUT_SECONDS: u32 = 30 * 60;
pub const MAX_BUILD_TIMEOUT_SECONDS: u32 = 2 * 60 * 60;

/// A build time limit: 1 s to [`MAX_BUILD_TIMEOUT_SECONDS`].
pub fn build_timeout(seconds: u32) -> Result<(), ValidationError> {
    if seconds == 0 || seconds > MAX_BUILD_TIMEOUT_SECONDS {
        return Err(ValidationError::new("build_timeout_seconds", format!("must be 1 to {MAX_BUILD_TIMEOUT_SECONDS}")));
    }
    Ok(())
}

/// A full or abbreviated commit id: 7 to 64 hex digits.
pub fn commit(id: &str) -> Result<(), ValidationError> {
    if !(7..=64).contains(&id.len()) || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(ValidationError::new("commit", "must be 7 to 64 hexadecimal digits"));
    }
    Ok(())
}

impl DeployPayload {
    pub fn container_name(&self) -> String {
        self.container.clone().unwrap_or_else(|| format!("cw-{}-{}", self.app, self.instance))
    }

    pub fn validate(&self) -> Result<(), ValidationError> {
        validate::token("deployment_id", &self.deployment_id, 64)?;
        validate::node_name("app", &self.app)?;
        if self.instance == 0 || self.instance > 100 {
            return Err(ValidationError::new("instance", "must be 1 to 100"));
        }
        if self.port == 0 {
            return Err(ValidationError::new("port", "must be 1 to 65535"));
        }
        if let Some(liveness) = &self.liveness {
            liveness.validate()?;
        }
        if let Some(readiness) = &self.readiness {
            readiness.validate()?;
        }
        if let Some(container) = &self.container {
            let ok = container
                .strip_prefix(&format!("cw-{}-", self.app))
                .is_some_and(|n| !n.is_empty() && n.len() <= 9 && n.bytes().all(|b| b.is_ascii_digit()));
            if !ok {
                return Err(ValidationError::new("container", "must be cw-<app>-<number>"));
            }
        }
        match (&self.source, &self.image) {
            (Some(source), None) => {
                repo_url(&source.repo_url, true)?;
                branch(&source.branch)?;
                if let Some(ssh) = &source.ssh {
                    ssh.validate()?;
                }
                if let Some(id) = &source.commit {
                    commit(id)?;
                }
                source.validate_ca()?;
            }
            (None, Some(image)) => {
                validate::bounded_text("image", image, 512)?;
                if image.starts_with('-') || image.contains(char::is_whitespace) {
                    return Err(ValidationError::new("image", "is not an image reference"));
                }
                if self.build.is_some() {
                    return Err(ValidationError::new("build", "is only sent with a source"));
                }
            }
            _ => return Err(ValidationError::new("source", "exactly one of source and image must be set")),
        }
        if let Some(build) = &self.build {
            build.validate()?;
        }
        env(&self.env)?;
        if !self.health.path.starts_with('/') {
            return Err(ValidationError::new("health.path", "must start with '/'"));
        }
        validate::bounded_text("health.path", &self.health.path, 256)?;
        if self.health.timeout_seconds == 0 || self.health.timeout_seconds > 3600 {
            return Err(ValidationError::new("health.timeout_seconds", "must be 1 to 3600"));
        }
        if let Some(seconds) = self.build_timeout_seconds {
            build_timeout(seconds)?;
        }
        crate::volumes::mounts(&self.volumes)?;
        if let Some(cpu) = self.limits.cpu {
            if !cpu.is_finite() || cpu <= 0.0 || cpu > 1024.0 {
                return Err(ValidationError::new("limits.cpu", "must be between 0 and 1024 cores"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_dirs() {
        for good in ["dist", "build/web", "out.v2", "public_html"] {
            output_dir(good).unwrap();
        }
        for bad in ["../../etc", "/etc", "a/../../b", "", "dist\nx", "-rf", "a b", "$(id)"] {
            assert!(output_dir(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn build_commands() {
        let mut build = BuildSettings { build_cmd: Some("npm run build:prod".into()), ..Default::default() };
        build.validate().unwrap();
        build.build_cmd = Some("npm run build\nrm -rf /".into());
        assert!(build.validate().is_err());
        build.build_cmd = Some("x".repeat(513));
        assert!(build.validate().is_err());
    }

    #[test]
    fn spa_values() {
        let build: BuildSettings = serde_json::from_str(r#"{"spa": "yes"}"#).unwrap();
        assert_eq!(build.spa, Some(Spa::Yes));
        assert!(serde_json::from_str::<BuildSettings>(r#"{"spa": "maybe"}"#).is_err());
    }

    #[test]
    fn repo_urls_and_branches() {
        for good in ["https://gitlab.com/a/b.git", "ssh://git@host/a.git", "git://host/a", "git@gitlab.com:a/b.git"] {
            repo_url(good, false).unwrap();
        }
        // Plain http is well-formed; where it may go is repo_destination's call.
        repo_url("http://10.0.0.5:8080/group/app.git", false).unwrap();
        for bad in ["file:///tmp/x", "ftp://host/a", "-uhttps://x", "ext::sh -c id", "https://user:pw@host/a", "http://user:pw@10.0.0.5/a"] {
            assert!(repo_url(bad, false).is_err(), "{bad}");
        }
        repo_url("file:///tmp/x", true).unwrap();
        for bad in [
            "ssh://-oProxyCommand=touch%20x/a.git",
            "ssh://git@-oProxyCommand=x/a.git",
            "ssh://-oProxyCommand=x@host/a.git",
            "git@-oProxyCommand=touch x:x.git",
            "git@-oProxyCommand=x:x.git",
            "-oProxyCommand=x@host:x.git",
            "https://-host/a.git",
            "git://-h/a",
            "ssh://[not-v6]/a",
            "ssh://host:0/a",
            "https://0x7f.1/a.git",
            "https://2130706433/a.git",
        ] {
            assert!(repo_url(bad, false).is_err(), "{bad}");
        }
        assert_eq!(
            repo_host("ssh://git@host.example:2222/a.git").unwrap(),
            Some(RepoHost { scheme: RepoScheme::Ssh, user: Some("git".into()), host: "host.example".into(), port: Some(2222) })
        );
        assert_eq!(repo_host("git@gitlab.com:a/b.git").unwrap().unwrap().host, "gitlab.com");
        assert_eq!(repo_host("https://[::1]:8443/a").unwrap().unwrap().host, "::1");
        assert_eq!(repo_host("file:///tmp/x").unwrap(), None);
        for bad in ["-x", "--upload-pack=evil", "a..b", "a b", "a~1", ""] {
            assert!(branch(bad).is_err(), "{bad:?}");
        }
        branch("feature/x-1").unwrap();
    }

    #[test]
    fn repository_destinations() {
        // (url, allowed by default, allowed with --allow-private-git-hosts)
        let table = [
            ("https://gitlab.com/a/b.git", true, true),
            ("https://93.184.216.34/a.git", true, true),
            ("https://127.0.0.1/a.git", false, true),
            ("git://127.0.0.1:9418/a.git", false, true),
            ("https://localhost/a.git", false, true),
            ("ssh://git@api.localhost/a.git", false, true),
            ("https://10.1.2.3/a.git", false, true),
            ("https://172.16.0.1/a.git", false, true),
            ("https://192.168.1.1/a.git", false, true),
            ("https://100.64.0.1/a.git", false, true),
            ("https://[fd00::1]/a.git", false, true),
            ("https://[::1]/a.git", false, true),
            ("https://[::ffff:7f00:1]/a.git", false, true),
            ("https://[::ffff:a9fe:a9fe]/a.git", false, false),
            ("https://169.254.169.254/latest/meta-data", false, false),
            ("https://[fe80::1]/a.git", false, false),
            ("https://0.0.0.0/a.git", false, false),
            ("https://[::]/a.git", false, false),
            ("https://224.0.0.1/a.git", false, false),
            ("https://255.255.255.255/a.git", false, false),
            ("file:///tmp/x", true, true),
            // Plain http: only to private hosts, and only when they are allowed.
            ("http://127.0.0.1:8080/a.git", false, true),
            ("http://10.1.2.3/a.git", false, true),
            ("http://93.184.216.34/a.git", false, false),
            ("http://169.254.169.254/a.git", false, false),
            // A name is checked again by the agent once resolved.
            ("http://git.lan/a.git", false, true),
        ];
        for (url, public, private) in table {
            assert_eq!(repo_destination(url, false).is_ok(), public, "{url} by default");
            assert_eq!(repo_destination(url, true).is_ok(), private, "{url} with private hosts allowed");
        }
        let err = repo_destination("https://169.254.169.254/x", true).unwrap_err().to_string();
        assert!(err.contains("link-local"), "{err}");
    }

    #[test]
    fn ssh_keys_and_known_hosts() {
        let key = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n-----END OPENSSH PRIVATE KEY-----\n";
        ssh_private_key(key).unwrap();
        for bad in ["", "ssh-ed25519 AAAA", "-----BEGIN PUBLIC KEY-----\nx\n-----END PUBLIC KEY-----"] {
            assert!(ssh_private_key(bad).is_err(), "{bad:?}");
        }
        let line = "gitlab.com ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIAfuCHKVTjquxvt6CM6tdG4SLp1Btn/nOeHHE5UOzRdf";
        known_hosts(line).unwrap();
        known_hosts(&format!("# from ssh-keyscan\n\n{line}\n@cert-authority *.example.com {}", &line[11..])).unwrap();
        for bad in ["", "# only a comment", "gitlab.com ssh-ed25519", "gitlab.com ssh-foo AAAA", "gitlab.com ssh-ed25519 !!!", "-oProxyCommand=x ssh-ed25519 AAAA", "@weird h ssh-ed25519 AAAA"] {
            assert!(known_hosts(bad).is_err(), "{bad:?}");
        }
        let access = SshAccess { private_key: key.into(), known_hosts: line.into() };
        assert!(!format!("{access:?}").contains("b3BlbnNz"));
    }

    #[test]
    fn public_env_names() {
        assert!(is_public_env("VITE_API") && is_public_env("NEXT_PUBLIC_X") && !is_public_env("SECRET"));
    }

    #[test]
    fn credentials_never_print() {
        let credentials = GitCredentials { username: "u".into(), password: "hunter2".into() };
        assert!(!format!("{credentials:?}").contains("hunter2"));
    }
}
