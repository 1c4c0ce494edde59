//! Cloning the exact commit to build. git runs with an argument vector,
//! `--` before the URL and directory, no terminal prompts, no system or user
//! configuration, only the transport of the repository URL, and credentials
//! handed to that one process through its environment (an extra HTTP
//! header), never in the URL and never in a log line.
//!
//! Before git runs, the repository's host name is resolved here and every
//! address checked ([`refused_git_address`]: no loopback, link-local or
//! private address unless the control plane allows private git hosts), and
//! git is made to connect to the checked address: curl's resolve list for
//! https, the address itself for git://, ssh's `HostName` for ssh. A name
//! that resolves elsewhere a second time (DNS rebinding) changes nothing.
//!
//! ssh runs with no configuration file (`-F /dev/null`), only the app's own
//! key (`IdentitiesOnly`, `-i` a 0600 copy in the clone's empty `HOME`,
//! which is deleted with the build), no agent, and `StrictHostKeyChecking`
//! against the known hosts the user gave: never the keys or known hosts of
//! the user the agent runs as (ssh reads those from the password database,
//! not from `HOME`).

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use base64::Engine;
use cloudweb_protocol::deploy::{refused_git_address, repo_host, RepoHost, RepoScheme};
use cloudweb_protocol::{GitCredentials, Source, SshAccess};
use tokio::process::Command;

#[derive(Debug, thiserror::Error)]
pub enum GitError {
    #[error("git {step} failed: {message}")]
    Failed { step: &'static str, message: String },
    #[error("cannot run git: {0}")]
    Spawn(std::io::Error),
    #[error("repository host {host}: {message}")]
    Host { host: String, message: String },
    #[error("{0}")]
    Setup(String),
}

/// How long resolving the repository host may take.
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(10);

/// Resolves the repository host and checks every address it has; returns
/// the one git is to connect to.
pub async fn checked_address(target: &RepoHost, allow_private: bool) -> Result<IpAddr, GitError> {
    let fail = |message: String| GitError::Host { host: target.host.clone(), message };
    let addresses: Vec<SocketAddr> = match target.host.parse::<IpAddr>() {
        Ok(ip) => vec![SocketAddr::new(ip, target.port_or_default())],
        Err(_) => tokio::time::timeout(RESOLVE_TIMEOUT, tokio::net::lookup_host((target.host.as_str(), target.port_or_default())))
            .await
            .map_err(|_| fail("the name did not resolve within 10 s".into()))?
            .map_err(|e| fail(format!("cannot resolve the name: {e}")))?
            .collect(),
    };
    // Every address counts: the resolver may hand git any of them.
    for address in &addresses {
        if let Some(reason) = refused_git_address(address.ip(), allow_private) {
            return Err(fail(format!(
                "resolves to {}, {reason}; git servers on loopback or private networks need --allow-private-git-hosts on the control plane",
                address.ip()
            )));
        }
    }
    addresses.first().map(SocketAddr::ip).ok_or_else(|| fail("the name resolves to no address".into()))
}

/// Transports git may use: the repository URL's own.
fn allowed_protocol(target: Option<&RepoHost>) -> &'static str {
    match target.map(|t| t.scheme) {
        None => "file",
        Some(RepoScheme::Https) => "https",
        Some(RepoScheme::Http) => "http",
        Some(RepoScheme::Ssh) => "ssh",
        Some(RepoScheme::Git) => "git",
    }
}

/// Quotes `value` for the POSIX shell git runs `core.sshCommand` with, so
/// it is one literal word whatever it contains.
fn shell_word(value: &str) -> String {
    format!("'{}'", value.replace('\'', "'\\''"))
}

/// The files of one ssh clone, in the clone's private `HOME`.
pub struct SshFiles {
    pub key: PathBuf,
    pub known_hosts: PathBuf,
}

impl SshFiles {
    /// Writes the key (mode 0600) and known hosts under `home`.
    pub fn write(home: &Path, access: &SshAccess) -> Result<SshFiles, GitError> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let dir = home.join(".cloudweb-ssh");
        let setup = |e: std::io::Error| GitError::Setup(format!("cannot write the clone's ssh files: {e}"));
        std::fs::create_dir_all(&dir).map_err(setup)?;
        let key = dir.join("key");
        let mut file = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&key).map_err(setup)?;
        let mut text = access.private_key.trim().to_string();
        // ssh refuses a key file without its final line break.
        text.push('\n');
        file.write_all(text.as_bytes()).map_err(setup)?;
        let known_hosts = dir.join("known_hosts");
        std::fs::write(&known_hosts, format!("{}\n", access.known_hosts.trim())).map_err(setup)?;
        Ok(SshFiles { key, known_hosts })
    }
}

/// The `core.sshCommand` of an ssh clone: no config file, only the app's
/// key, no agent, strict host key checking against the user's known hosts,
/// and the checked address in place of the name (the name still selects
/// the known host entry, see [`host_key_alias`]).
pub fn ssh_command(files: &SshFiles, address: IpAddr, host: &str, port: u16) -> String {
    let words: Vec<String> = vec![
        "ssh".into(),
        "-F".into(),
        "/dev/null".into(),
        "-o".into(),
        "BatchMode=yes".into(),
        "-o".into(),
        "IdentitiesOnly=yes".into(),
        "-o".into(),
        "IdentityAgent=none".into(),
        "-o".into(),
        "StrictHostKeyChecking=yes".into(),
        "-o".into(),
        format!("UserKnownHostsFile={}", files.known_hosts.display()),
        "-o".into(),
        "GlobalKnownHostsFile=/dev/null".into(),
        "-o".into(),
        format!("HostName={address}"),
        "-o".into(),
        format!("HostKeyAlias={}", host_key_alias(host, port)),
        "-i".into(),
        files.key.display().to_string(),
    ];
    words.iter().map(|w| shell_word(w)).collect::<Vec<_>>().join(" ")
}

/// The known_hosts key ssh must look up. With `HostKeyAlias` ssh searches
/// for exactly this string, and known_hosts (as `ssh-keyscan -p` writes
/// it) names a host on another port than 22 as `[host]:port`; the plain
/// name would only match the port-22 entry.
pub fn host_key_alias(host: &str, port: u16) -> String {
    if port == 22 {
        host.to_string()
    } else {
        format!("[{host}]:{port}")
    }
}

/// How one clone reaches its repository.
pub(super) struct Route {
    pub(super) target: Option<RepoHost>,
    /// The URL handed to git (git:// URLs name the checked address).
    pub(super) url: String,
    /// `git -c` settings.
    pub(super) config: Vec<(String, String)>,
}

impl Route {
    /// For git commands that work on local repositories only.
    pub(super) fn local() -> Route {
        Route { target: None, url: String::new(), config: Vec::new() }
    }
}

pub(super) fn git(home: &Path, route: &Route, credentials: Option<&GitCredentials>) -> Command {
    let mut command = Command::new("git");
    command
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_else(|| "/usr/bin:/bin".into()))
        .env("HOME", home)
        .env("GIT_TERMINAL_PROMPT", "0")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_ALLOW_PROTOCOL", allowed_protocol(route.target.as_ref()))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut config = route.config.clone();
    if let Some(credentials) = credentials {
        let basic = base64::engine::general_purpose::STANDARD.encode(format!("{}:{}", credentials.username, credentials.password));
        config.push(("http.extraHeader".into(), format!("Authorization: Basic {basic}")));
    }
    // Settings go in the environment, where `ps` does not show them.
    command.env("GIT_CONFIG_COUNT", config.len().to_string());
    for (index, (key, value)) in config.iter().enumerate() {
        command.env(format!("GIT_CONFIG_KEY_{index}"), key).env(format!("GIT_CONFIG_VALUE_{index}"), value);
    }
    command
}

/// Works out how git reaches the repository of `source`: checks the
/// resolved addresses and pins git to the checked one. `home` is the
/// clone's own empty home dir.
pub(super) async fn route(source: &Source, home: &Path) -> Result<Route, GitError> {
    let target = repo_host(&source.repo_url).map_err(|e| GitError::Setup(e.to_string()))?;
    let Some(target) = target else {
        return Ok(Route { target: None, url: source.repo_url.clone(), config: Vec::new() });
    };
    let address = checked_address(&target, source.allow_private_hosts).await?;
    if target.scheme == RepoScheme::Http && !cloudweb_protocol::deploy::plain_http_address(address) {
        return Err(GitError::Host {
            host: target.host.clone(),
            message: format!("resolves to {address}: plain http:// only goes to loopback or private addresses"),
        });
    }
    let port = target.port_or_default();
    let literal = match address {
        IpAddr::V4(v4) => v4.to_string(),
        IpAddr::V6(v6) => format!("[{v6}]"),
    };
    let mut config = Vec::new();
    let mut url = source.repo_url.clone();
    match target.scheme {
        RepoScheme::Https | RepoScheme::Http => {
            config.push(("http.curloptResolve".into(), format!("{}:{port}:{literal}", target.host)));
            // A redirect would lead to a host nobody checked.
            config.push(("http.followRedirects".into(), "false".into()));
            if let Some(pem) = &source.ca_pem {
                config.push(private_ca(home, &target, pem)?);
            }
        }
        RepoScheme::Git => {
            let rest = source.repo_url.strip_prefix("git://").unwrap_or(&source.repo_url);
            let path = rest.find('/').map(|i| &rest[i..]).unwrap_or("/");
            url = format!("git://{literal}:{port}{path}");
        }
        RepoScheme::Ssh => {
            let access = source
                .ssh
                .as_ref()
                .ok_or_else(|| GitError::Setup("an ssh repository needs the app's git_ssh_key and git_known_hosts".into()))?;
            access.validate().map_err(|e| GitError::Setup(e.to_string()))?;
            let files = SshFiles::write(home, access)?;
            config.push(("core.sshCommand".into(), ssh_command(&files, address, &target.host, port)));
        }
    }
    Ok(Route { target: Some(target), url, config })
}

/// The private CA of an https repository (the control plane's
/// `--gitlab-ca-file`), written into the clone's `HOME` and trusted for
/// that repository's scheme, host and port only (`http.<url>.sslCAInfo`),
/// on top of the node's own trust store.
fn private_ca(home: &Path, target: &RepoHost, pem: &str) -> Result<(String, String), GitError> {
    if target.scheme != RepoScheme::Https {
        return Err(GitError::Setup("a repository CA is only for https:// repositories".into()));
    }
    let path = home.join(".cloudweb-ca.pem");
    std::fs::write(&path, pem).map_err(|e| GitError::Setup(format!("cannot write the repository's CA file: {e}")))?;
    let host = if target.host.contains(':') { format!("[{}]", target.host) } else { target.host.to_ascii_lowercase() };
    let authority = match target.port {
        Some(port) if port != target.scheme.default_port() => format!("{host}:{port}"),
        _ => host,
    };
    Ok((format!("http.https://{authority}/.sslCAInfo"), path.display().to_string()))
}

pub(super) async fn run(mut command: Command, step: &'static str, secret: Option<&str>) -> Result<String, GitError> {
    let output = command.output().await.map_err(GitError::Spawn)?;
    if output.status.success() {
        return Ok(String::from_utf8_lossy(&output.stdout).trim().to_string());
    }
    let mut message = String::from_utf8_lossy(&output.stderr).trim().to_string();
    if let Some(secret) = secret.filter(|s| !s.is_empty()) {
        message = explain_refusal(&message.replace(secret, "<redacted>"));
    }
    cloudweb_protocol::misc::truncate_on_char(&mut message, 2000);
    Err(GitError::Failed { step, message })
}

/// git answers a 401 to the credentials it was given by trying to prompt
/// for others, and says only that it "could not read Username": name what
/// happened (an expired or revoked deploy token, say) before git's words.
fn explain_refusal(message: &str) -> String {
    if message.contains("could not read Username") || message.contains("Authentication failed") {
        format!("the git host refused this deploy's credentials (expired, revoked, or not for this repository): {message}")
    } else {
        message.to_string()
    }
}

/// Like [`run`], for a command whose output is bytes (an archive).
pub(super) async fn run_bytes(mut command: Command, step: &'static str) -> Result<Vec<u8>, GitError> {
    let output = command.output().await.map_err(GitError::Spawn)?;
    if output.status.success() {
        return Ok(output.stdout);
    }
    let mut message = String::from_utf8_lossy(&output.stderr).trim().to_string();
    cloudweb_protocol::misc::truncate_on_char(&mut message, 2000);
    Err(GitError::Failed { step, message })
}

/// Clones `source` into `dir` (which must not exist) and checks out the
/// requested commit (the branch head when none). Returns the full commit id.
pub async fn checkout(source: &Source, dir: &Path, home: &Path, allow_file: bool) -> Result<String, GitError> {
    if source.repo_url.starts_with("file://") && !allow_file {
        return Err(GitError::Setup("file:// repositories are not allowed on this node".into()));
    }
    let route = route(source, home).await?;
    let credentials = source.credentials.as_ref();
    let secret = credentials.map(|c| c.password.as_str());
    let mut clone = git(home, &route, credentials);
    clone
        .arg("clone")
        .arg("--quiet")
        .arg("--no-checkout")
        .arg("--single-branch")
        .arg("--branch")
        .arg(&source.branch)
        .arg("--")
        .arg(&route.url)
        .arg(dir);
    run(clone, "clone", secret).await?;
    // The rest works on the local clone only.
    let local = Route { target: None, url: String::new(), config: Vec::new() };
    let target = source.commit.clone().unwrap_or_else(|| "HEAD".to_string());
    let mut resolve = git(home, &local, None);
    resolve.arg("-C").arg(dir).arg("rev-parse").arg("--verify").arg("--end-of-options").arg(format!("{target}^{{commit}}"));
    let commit = run(resolve, "rev-parse", None).await.map_err(|_| GitError::Failed {
        step: "checkout",
        message: format!("commit {target} is not on branch {}", source.branch),
    })?;
    let mut checkout = git(home, &local, None);
    checkout.arg("-C").arg(dir).arg("checkout").arg("--quiet").arg("--detach").arg(&commit);
    run(checkout, "checkout", None).await?;
    Ok(commit)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env_of(command: &Command, name: &str) -> Option<String> {
        command.as_std().get_envs().find(|(k, _)| *k == name).and_then(|(_, v)| v).map(|v| v.to_string_lossy().into_owned())
    }

    #[test]
    fn a_refused_credential_is_named() {
        let git = "fatal: could not read Username for 'https://github.com': terminal prompts disabled";
        assert!(super::explain_refusal(git).starts_with("the git host refused this deploy's credentials"));
        assert!(super::explain_refusal(git).ends_with(git));
        assert_eq!(super::explain_refusal("fatal: repository not found"), "fatal: repository not found");
    }

    #[test]
    fn credentials_travel_in_the_environment_only() {
        let credentials = GitCredentials { username: "ci".into(), password: "s3cret-token".into() };
        let target = repo_host("https://example.com/a.git").unwrap();
        let route = Route { target, url: "https://example.com/a.git".into(), config: Vec::new() };
        let mut command = git(Path::new("/tmp"), &route, Some(&credentials));
        command.arg("clone").arg("--").arg("https://example.com/a.git");
        let args: Vec<String> = command.as_std().get_args().map(|a| a.to_string_lossy().into_owned()).collect();
        assert!(args.iter().all(|a| !a.contains("s3cret")), "{args:?}");
        assert_eq!(env_of(&command, "GIT_CONFIG_KEY_0").as_deref(), Some("http.extraHeader"));
        assert!(env_of(&command, "GIT_CONFIG_VALUE_0").unwrap().starts_with("Authorization: Basic "));
        // Only the URL's own transport.
        assert_eq!(env_of(&command, "GIT_ALLOW_PROTOCOL").as_deref(), Some("https"));
    }

    #[tokio::test]
    async fn a_name_resolving_to_loopback_is_refused_unless_allowed() {
        let target = repo_host("https://localhost/a.git").unwrap().unwrap();
        let err = checked_address(&target, false).await.unwrap_err().to_string();
        assert!(err.contains("loopback"), "{err}");
        assert!(checked_address(&target, true).await.unwrap().is_loopback());
        // The same check for a literal the API would have refused.
        let metadata = repo_host("http://169.254.169.254/x").unwrap().unwrap();
        assert!(checked_address(&metadata, true).await.unwrap_err().to_string().contains("link-local"));
        let metadata = repo_host("https://169.254.169.254/x").unwrap().unwrap();
        assert!(checked_address(&metadata, true).await.unwrap_err().to_string().contains("link-local"));
    }

    #[tokio::test]
    async fn plain_http_goes_only_to_private_addresses() {
        let home = tempfile::tempdir().unwrap();
        let source = |url: &str| Source {
            repo_url: url.into(),
            branch: "main".into(),
            commit: None,
            credentials: Some(GitCredentials { username: "oauth2".into(), password: "t".into() }),
            ssh: None,
            allow_private_hosts: true,
            ca_pem: None,
        };
        let err = route(&source("http://93.184.216.34/a.git"), home.path()).await.err().unwrap().to_string();
        assert!(err.contains("plain http"), "{err}");
        let local = route(&source("http://127.0.0.1:8080/a.git"), home.path()).await.unwrap();
        assert!(local.config.contains(&("http.curloptResolve".into(), "127.0.0.1:8080:127.0.0.1".into())));
        assert!(local.config.contains(&("http.followRedirects".into(), "false".into())));
        let command = git(home.path(), &local, None);
        assert_eq!(env_of(&command, "GIT_ALLOW_PROTOCOL").as_deref(), Some("http"));
    }

    /// A branch-head source on a host the control plane allows to be private.
    fn private_host_source(url: &str, ca_pem: Option<&str>) -> Source {
        Source {
            repo_url: url.into(),
            branch: "main".into(),
            commit: None,
            credentials: None,
            ssh: None,
            allow_private_hosts: true,
            ca_pem: ca_pem.map(str::to_string),
        }
    }

    #[tokio::test]
    async fn git_connects_to_the_checked_address() {
        let home = tempfile::tempdir().unwrap();
        let source = |url: &str| private_host_source(url, None);
        let https = route(&source("https://localhost:8443/team/a.git"), home.path()).await.unwrap();
        let resolve = https.config.iter().find(|(k, _)| k == "http.curloptResolve").unwrap();
        assert!(resolve.1 == "localhost:8443:127.0.0.1" || resolve.1 == "localhost:8443:[::1]", "{resolve:?}");
        assert!(https.config.contains(&("http.followRedirects".into(), "false".into())));
        let daemon = route(&source("git://localhost/team/a.git"), home.path()).await.unwrap();
        assert!(daemon.url == "git://127.0.0.1:9418/team/a.git" || daemon.url == "git://[::1]:9418/team/a.git", "{}", daemon.url);
        // ssh without the app's own key is refused, never run with the node's.
        let err = route(&source("ssh://git@localhost/a.git"), home.path()).await.err().unwrap().to_string();
        assert!(err.contains("git_ssh_key"), "{err}");
    }

    #[tokio::test]
    async fn a_private_ca_is_trusted_for_the_repository_host_only() {
        let home = tempfile::tempdir().unwrap();
        let pem = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
        let source = |url: &str| private_host_source(url, Some(pem));
        let route = route(&source("https://LocalHost:8443/team/a.git"), home.path()).await.unwrap();
        let file = home.path().join(".cloudweb-ca.pem");
        assert!(route.config.contains(&("http.https://localhost:8443/.sslCAInfo".into(), file.display().to_string())), "{:?}", route.config);
        // Never the blanket http.sslCAInfo, which would trust it for any host.
        assert!(route.config.iter().all(|(k, _)| k != "http.sslCAInfo" && k != "http.sslVerify"));
        assert_eq!(std::fs::read_to_string(&file).unwrap(), pem);
        let default_port = super::route(&source("https://localhost:443/a.git"), home.path()).await.unwrap();
        assert!(default_port.config.iter().any(|(k, _)| k == "http.https://localhost/.sslCAInfo"), "{:?}", default_port.config);
        let plain = super::route(&source("http://localhost/a.git"), home.path()).await.err().unwrap().to_string();
        assert!(plain.contains("only for https"), "{plain}");
    }

    #[tokio::test]
    async fn ssh_uses_only_the_apps_key_and_known_hosts() {
        let home = tempfile::tempdir().unwrap();
        let access = SshAccess {
            private_key: "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n-----END OPENSSH PRIVATE KEY-----".into(),
            known_hosts: "localhost ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIAfuCHKVTjquxvt6CM6tdG4SLp1Btn/nOeHHE5UOzRdf".into(),
        };
        let mut source = Source {
            repo_url: "git@localhost:team/a.git".into(),
            branch: "main".into(),
            commit: None,
            credentials: None,
            ssh: Some(access),
            allow_private_hosts: true,
            ca_pem: None,
        };
        let route = route(&source, home.path()).await.unwrap();
        let command = git(home.path(), &route, None);
        assert_eq!(env_of(&command, "GIT_ALLOW_PROTOCOL").as_deref(), Some("ssh"));
        assert_eq!(env_of(&command, "GIT_CONFIG_KEY_0").as_deref(), Some("core.sshCommand"));
        let ssh = env_of(&command, "GIT_CONFIG_VALUE_0").unwrap();
        let key = home.path().join(".cloudweb-ssh/key");
        let known = home.path().join(".cloudweb-ssh/known_hosts");
        for word in [
            "'ssh'".to_string(),
            "'-F' '/dev/null'".to_string(),
            "'-o' 'IdentitiesOnly=yes'".to_string(),
            "'-o' 'IdentityAgent=none'".to_string(),
            "'-o' 'StrictHostKeyChecking=yes'".to_string(),
            format!("'-o' 'UserKnownHostsFile={}'", known.display()),
            "'-o' 'GlobalKnownHostsFile=/dev/null'".to_string(),
            "'-o' 'HostKeyAlias=localhost'".to_string(),
            format!("'-i' '{}'", key.display()),
        ] {
            assert!(ssh.contains(&word), "{word} missing from {ssh}");
        }
        assert!(ssh.contains("'-o' 'HostName=127.0.0.1'") || ssh.contains("'-o' 'HostName=::1'"), "{ssh}");
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&key).unwrap().permissions().mode() & 0o777, 0o600);
        assert!(std::fs::read_to_string(&known).unwrap().starts_with("localhost ssh-ed25519 "));
        // A name that resolves to loopback is refused without the allowance.
        source.allow_private_hosts = false;
        let other = tempfile::tempdir().unwrap();
        assert!(super::route(&source, other.path()).await.is_err());
    }

    #[test]
    fn the_host_key_alias_names_the_port_as_known_hosts_does() {
        assert_eq!(host_key_alias("git.example.com", 22), "git.example.com");
        assert_eq!(host_key_alias("git.example.com", 2222), "[git.example.com]:2222");
        assert_eq!(host_key_alias("10.0.0.5", 2200), "[10.0.0.5]:2200");
        assert_eq!(host_key_alias("::1", 2222), "[::1]:2222");
        let files = SshFiles { key: "/k".into(), known_hosts: "/kh".into() };
        let command = ssh_command(&files, "127.0.0.1".parse().unwrap(), "localhost", 2222);
        assert!(command.contains("'-o' 'HostKeyAlias=[localhost]:2222'"), "{command}");
        let command = ssh_command(&files, "127.0.0.1".parse().unwrap(), "localhost", 22);
        assert!(command.contains("'-o' 'HostKeyAlias=localhost'"), "{command}");
    }

    #[test]
    fn shell_words_stay_literal() {
        assert_eq!(shell_word("/data dir/it's"), "'/data dir/it'\\''s'");
    }
}
