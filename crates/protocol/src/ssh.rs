//! The ssh access a deploy command may carry for an ssh:// or scp-like
//! repository, and the checks both sides run on it.

use serde::{Deserialize, Serialize};

use crate::validate::ValidationError;

/// What an ssh clone uses: the app's private key (OpenSSH or PEM) and the
/// `known_hosts` lines that say which host keys to trust.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SshAccess {
    pub private_key: String,
    pub known_hosts: String,
}

impl std::fmt::Debug for SshAccess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SshAccess").field("private_key", &"<redacted>").field("known_hosts", &self.known_hosts).finish()
    }
}

impl SshAccess {
    pub fn validate(&self) -> Result<(), ValidationError> {
        ssh_private_key(&self.private_key)?;
        known_hosts(&self.known_hosts)
    }
}

/// An ssh private key in PEM or OpenSSH armour, at most 16 KiB.
pub fn ssh_private_key(key: &str) -> Result<(), ValidationError> {
    const FIELD: &str = "git_ssh_key";
    let key = key.trim();
    let armoured = key.starts_with("-----BEGIN ") && key.ends_with("PRIVATE KEY-----") && key.lines().count() >= 3;
    if key.len() > 16 * 1024 || !armoured {
        return Err(ValidationError::new(FIELD, "must be a PEM or OpenSSH private key of at most 16 KiB"));
    }
    if key.chars().any(|c| c.is_control() && c != '\n' && c != '\r') {
        return Err(ValidationError::new(FIELD, "contains control characters"));
    }
    Ok(())
}

/// Key types a `known_hosts` line may name.
const HOST_KEY_TYPES: [&str; 8] = [
    "ssh-ed25519",
    "ssh-rsa",
    "ecdsa-sha2-nistp256",
    "ecdsa-sha2-nistp384",
    "ecdsa-sha2-nistp521",
    "sk-ssh-ed25519@openssh.com",
    "sk-ecdsa-sha2-nistp256@openssh.com",
    "ssh-dss",
];

/// `known_hosts` text (as `ssh-keyscan` prints it): at most 200 lines of
/// `hosts key-type base64-key [comment]`, optionally after `@cert-authority`
/// or `@revoked`; `#` comments and blank lines are fine.
pub fn known_hosts(text: &str) -> Result<(), ValidationError> {
    const FIELD: &str = "git_known_hosts";
    if text.len() > 64 * 1024 || text.lines().count() > 200 {
        return Err(ValidationError::new(FIELD, "must be at most 200 lines and 64 KiB"));
    }
    let mut entries = 0;
    for (index, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let bad = |problem: &str| ValidationError::new(FIELD, format!("line {}: {problem}", index + 1));
        if line.chars().any(char::is_control) {
            return Err(bad("contains control characters"));
        }
        let mut fields: Vec<&str> = line.split_whitespace().collect();
        if fields.first().is_some_and(|f| f.starts_with('@')) {
            if !matches!(fields[0], "@cert-authority" | "@revoked") {
                return Err(bad("unknown marker"));
            }
            fields.remove(0);
        }
        if fields.len() < 3 {
            return Err(bad("must be `hosts key-type key`"));
        }
        if fields[0].starts_with('-') {
            return Err(bad("hosts must not start with '-'"));
        }
        if !HOST_KEY_TYPES.contains(&fields[1]) {
            return Err(bad("unknown key type"));
        }
        let decodes = base64::Engine::decode(&base64::engine::general_purpose::STANDARD, fields[2]).is_ok_and(|k| !k.is_empty());
        if !decodes {
            return Err(bad("the key is not base64"));
        }
        entries += 1;
    }
    if entries == 0 {
        return Err(ValidationError::new(FIELD, "must list at least one host key"));
    }
    Ok(())
}
