//! Secrets at rest. Everything secret that the control plane stores (app
//! environment variables, git credentials, queued command payloads, which
//! carry both) is sealed here with AES-256-GCM under a master key that lives
//! in `<data-dir>/master.key` (mode 0600) and nowhere else. Each sealed value
//! is bound to a context string (what it is and whose), so a value copied
//! into another row does not open there.

use std::path::Path;

use aes_gcm::aead::{Aead, KeyInit, Payload};
use aes_gcm::{Aes256Gcm, Nonce};
use base64::Engine;
use rand::Rng;

use crate::ca::{write_private, CaError};

pub const MASTER_KEY_FILE: &str = "master.key";
const PREFIX: &str = "v1:";

#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    #[error("cannot read or create the master key: {0}")]
    Key(String),
    #[error("a sealed value is corrupt or was sealed under another key or context")]
    Open,
}

impl From<CaError> for SecretError {
    fn from(err: CaError) -> Self {
        SecretError::Key(err.to_string())
    }
}

pub struct Sealer {
    cipher: Aes256Gcm,
    /// For [`Sealer::digest`]: derived from the master key, never the key
    /// itself.
    digest_key: [u8; 32],
}

impl Sealer {
    /// Loads the master key, creating it on first start.
    pub fn load_or_create(data_dir: &Path) -> Result<Sealer, SecretError> {
        let path = data_dir.join(MASTER_KEY_FILE);
        if !path.exists() {
            let key: [u8; 32] = rand::rng().random();
            write_private(&path, &key)?;
        }
        let key = std::fs::read(&path).map_err(|e| SecretError::Key(format!("{}: {e}", path.display())))?;
        if key.len() != 32 {
            return Err(SecretError::Key(format!("{} must hold exactly 32 bytes", path.display())));
        }
        let cipher = Aes256Gcm::new_from_slice(&key).map_err(|_| SecretError::Key("bad key length".into()))?;
        let digest_key = {
            use sha2::Digest;
            let mut hash = sha2::Sha256::new();
            hash.update(b"cloudweb keyed digest v1\0");
            hash.update(&key);
            hash.finalize().into()
        };
        Ok(Sealer { cipher, digest_key })
    }

    /// Encrypts `plaintext` for `context`; the result is printable text.
    pub fn seal(&self, context: &str, plaintext: &[u8]) -> String {
        let nonce: [u8; 12] = rand::rng().random();
        let ciphertext = self
            .cipher
            .encrypt(Nonce::from_slice(&nonce), Payload { msg: plaintext, aad: context.as_bytes() })
            .expect("AES-GCM encryption does not fail for in-memory buffers");
        let mut out = nonce.to_vec();
        out.extend_from_slice(&ciphertext);
        format!("{PREFIX}{}", base64::engine::general_purpose::STANDARD.encode(out))
    }

    pub fn open(&self, context: &str, sealed: &str) -> Result<Vec<u8>, SecretError> {
        let encoded = sealed.strip_prefix(PREFIX).ok_or(SecretError::Open)?;
        let bytes = base64::engine::general_purpose::STANDARD.decode(encoded).map_err(|_| SecretError::Open)?;
        if bytes.len() < 12 + 16 {
            return Err(SecretError::Open);
        }
        let (nonce, ciphertext) = bytes.split_at(12);
        self.cipher
            .decrypt(Nonce::from_slice(nonce), Payload { msg: ciphertext, aad: context.as_bytes() })
            .map_err(|_| SecretError::Open)
    }

    /// A keyed digest of `data` for `context` (HMAC-SHA-256, hex): the same
    /// on every start, but of no use to anyone without the master key. For
    /// values that must be looked up again but not kept in clear.
    pub fn digest(&self, context: &str, data: &[u8]) -> String {
        use hmac::Mac;
        let mut mac = <hmac::Hmac<sha2::Sha256> as Mac>::new_from_slice(&self.digest_key).expect("HMAC takes any key length");
        mac.update(context.as_bytes());
        mac.update(b"\0");
        mac.update(data);
        hex::encode(mac.finalize().into_bytes())
    }

    pub fn seal_json<T: serde::Serialize>(&self, context: &str, value: &T) -> String {
        self.seal(context, &serde_json::to_vec(value).expect("serializable value"))
    }

    pub fn open_json<T: serde::de::DeserializeOwned>(&self, context: &str, sealed: &str) -> Result<T, SecretError> {
        serde_json::from_slice(&self.open(context, sealed)?).map_err(|_| SecretError::Open)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_bound_to_context_and_key() {
        let dir = tempfile::tempdir().unwrap();
        let sealer = Sealer::load_or_create(dir.path()).unwrap();
        let sealed = sealer.seal("app-env:web", b"DATABASE_URL=postgres://secret");
        assert!(!sealed.contains("secret"));
        assert_eq!(sealer.open("app-env:web", &sealed).unwrap(), b"DATABASE_URL=postgres://secret");
        assert!(sealer.open("app-env:other", &sealed).is_err(), "context is bound");
        let reloaded = Sealer::load_or_create(dir.path()).unwrap();
        assert!(reloaded.open("app-env:web", &sealed).is_ok(), "the key persists");
        let other = Sealer::load_or_create(tempfile::tempdir().unwrap().path()).unwrap();
        assert!(other.open("app-env:web", &sealed).is_err());
        let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(dir.path().join(MASTER_KEY_FILE)).unwrap().permissions());
        assert_eq!(mode & 0o777, 0o600);
        assert_ne!(sealer.seal("c", b"x"), sealer.seal("c", b"x"), "fresh nonce each time");
    }
}
