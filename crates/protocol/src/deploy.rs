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
}

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

/// Whether a health probe's status means "up": any answer below 500 shows
/// the app is serving (a 404 on `/` is still a live server).
pub fn healthy_status(status: u16) -> bool {
    (200..500).contains(&status)
}

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
        || url.starts_with("ssh://")
        || url.starts_with("git://")
        || (allow_file && url.starts_with("file:///"));
    let scp_like = !url.contains("://") && url.split_once(':').is_some_and(|(host, _)| host.contains('@'));
    if !(allowed || scp_like) {
        return Err(ValidationError::new(FIELD, "scheme must be https, ssh or git"));
    }
    if let Some(rest) = url.strip_prefix("https://") {
        if rest.split('/').next().is_some_and(|authority| authority.contains('@')) {
            return Err(ValidationError::new(FIELD, "must not carry credentials; set them on the app instead"));
        }
    }
    Ok(())
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
                if let Some(id) = &source.commit {
                    commit(id)?;
                }
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
        for bad in ["file:///tmp/x", "http://host/a", "-uhttps://x", "ext::sh -c id", "https://user:pw@host/a"] {
            assert!(repo_url(bad, false).is_err(), "{bad}");
        }
        repo_url("file:///tmp/x", true).unwrap();
        for bad in ["-x", "--upload-pack=evil", "a..b", "a b", "a~1", ""] {
            assert!(branch(bad).is_err(), "{bad:?}");
        }
        branch("feature/x-1").unwrap();
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
