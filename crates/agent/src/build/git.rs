//! Cloning the exact commit to build. git runs with an argument vector,
//! `--` before the URL and directory, no terminal prompts, no system or user
//! configuration, only the transports we allow, and credentials handed to
//! that one process through its environment (an extra HTTP header), never
//! in the URL and never in a log line.

use std::path::Path;
use std::process::Stdio;

use base64::Engine;
use cloudweb_protocol::{GitCredentials, Source};
use tokio::process::Command;

#[derive(Debug, thiserror::Error)]
pub enum GitError {
    #[error("git {step} failed: {message}")]
    Failed { step: &'static str, message: String },
    #[error("cannot run git: {0}")]
    Spawn(std::io::Error),
}

/// Transports git may use. `file` only when the agent allows file:// repos.
fn allowed_protocols(allow_file: bool) -> &'static str {
    if allow_file {
        "https:ssh:git:file"
    } else {
        "https:ssh:git"
    }
}

fn git(home: &Path, allow_file: bool, credentials: Option<&GitCredentials>) -> Command {
    let mut command = Command::new("git");
    command
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_else(|| "/usr/bin:/bin".into()))
        .env("HOME", home)
        .env("GIT_TERMINAL_PROMPT", "0")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_ALLOW_PROTOCOL", allowed_protocols(allow_file))
        .env("GIT_SSH_COMMAND", "ssh -o BatchMode=yes -o StrictHostKeyChecking=accept-new")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    if let Some(credentials) = credentials {
        let basic = base64::engine::general_purpose::STANDARD.encode(format!("{}:{}", credentials.username, credentials.password));
        command
            .env("GIT_CONFIG_COUNT", "1")
            .env("GIT_CONFIG_KEY_0", "http.extraHeader")
            .env("GIT_CONFIG_VALUE_0", format!("Authorization: Basic {basic}"));
    }
    command
}

async fn run(mut command: Command, step: &'static str, secret: Option<&str>) -> Result<String, GitError> {
    let output = command.output().await.map_err(GitError::Spawn)?;
    if output.status.success() {
        return Ok(String::from_utf8_lossy(&output.stdout).trim().to_string());
    }
    let mut message = String::from_utf8_lossy(&output.stderr).trim().to_string();
    if let Some(secret) = secret.filter(|s| !s.is_empty()) {
        message = message.replace(secret, "<redacted>");
    }
    cloudweb_protocol::misc::truncate_on_char(&mut message, 2000);
    Err(GitError::Failed { step, message })
}

/// Clones `source` into `dir` (which must not exist) and checks out the
/// requested commit (the branch head when none). Returns the full commit id.
pub async fn checkout(source: &Source, dir: &Path, home: &Path, allow_file: bool) -> Result<String, GitError> {
    let credentials = source.credentials.as_ref();
    let secret = credentials.map(|c| c.password.as_str());
    let mut clone = git(home, allow_file, credentials);
    clone
        .arg("clone")
        .arg("--quiet")
        .arg("--no-checkout")
        .arg("--single-branch")
        .arg("--branch")
        .arg(&source.branch)
        .arg("--")
        .arg(&source.repo_url)
        .arg(dir);
    run(clone, "clone", secret).await?;
    let target = source.commit.clone().unwrap_or_else(|| "HEAD".to_string());
    let mut resolve = git(home, allow_file, None);
    resolve.arg("-C").arg(dir).arg("rev-parse").arg("--verify").arg("--end-of-options").arg(format!("{target}^{{commit}}"));
    let commit = run(resolve, "rev-parse", None).await.map_err(|_| GitError::Failed {
        step: "checkout",
        message: format!("commit {target} is not on branch {}", source.branch),
    })?;
    let mut checkout = git(home, allow_file, None);
    checkout.arg("-C").arg(dir).arg("checkout").arg("--quiet").arg("--detach").arg(&commit);
    run(checkout, "checkout", None).await?;
    Ok(commit)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_travel_in_the_environment_only() {
        let credentials = GitCredentials { username: "ci".into(), password: "s3cret-token".into() };
        let mut command = git(Path::new("/tmp"), false, Some(&credentials));
        command.arg("clone").arg("--").arg("https://example.com/a.git");
        let std = command.as_std();
        let args: Vec<String> = std.get_args().map(|a| a.to_string_lossy().into_owned()).collect();
        assert!(args.iter().all(|a| !a.contains("s3cret")), "{args:?}");
        let header = std
            .get_envs()
            .find(|(k, _)| *k == "GIT_CONFIG_VALUE_0")
            .and_then(|(_, v)| v)
            .map(|v| v.to_string_lossy().into_owned())
            .unwrap();
        assert!(header.starts_with("Authorization: Basic "));
        let protocols = std.get_envs().find(|(k, _)| *k == "GIT_ALLOW_PROTOCOL").and_then(|(_, v)| v).unwrap();
        assert_eq!(protocols, "https:ssh:git");
    }
}
