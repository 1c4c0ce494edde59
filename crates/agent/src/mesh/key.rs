//! The node's WireGuard key pair. The private key is made at join, stored
//! in the data dir with mode 0600 (in `wg genkey` format: base64 of 32
//! bytes) and only ever handed to the local WireGuard device; the public
//! key goes to the control plane.

use std::path::Path;

use base64::Engine;
use rand::Rng;

pub use crate::files::WIREGUARD_KEY_FILE as KEY_FILE;
use crate::files::{write_private, FileError};

#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error(transparent)]
    Io(#[from] FileError),
    #[error("{0} is not a WireGuard private key (base64 of 32 bytes)")]
    Invalid(std::path::PathBuf),
    #[error("this node has no WireGuard key ({0}); it joined before the mesh existed: leave and join again")]
    Missing(std::path::PathBuf),
}

#[derive(Clone)]
pub struct KeyPair {
    private: [u8; 32],
    public: [u8; 32],
}

/// Never prints the private key.
impl std::fmt::Debug for KeyPair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyPair").field("public", &self.public_base64()).finish_non_exhaustive()
    }
}

impl KeyPair {
    pub fn generate() -> KeyPair {
        let bytes: [u8; 32] = rand::rng().random();
        KeyPair::from_private(bytes)
    }

    fn from_private(bytes: [u8; 32]) -> KeyPair {
        // StaticSecret clamps the scalar the way `wg genkey` does.
        let secret = x25519_dalek::StaticSecret::from(bytes);
        let public = x25519_dalek::PublicKey::from(&secret);
        KeyPair { private: secret.to_bytes(), public: public.to_bytes() }
    }

    pub fn public_base64(&self) -> String {
        base64::engine::general_purpose::STANDARD.encode(self.public)
    }

    /// The public key as the UAPI writes it (lowercase hex).
    pub fn public_hex(&self) -> String {
        hex::encode(self.public)
    }

    /// The private key as the UAPI expects it; only for the `set` request.
    pub(crate) fn private_hex(&self) -> String {
        hex::encode(self.private)
    }

    pub fn save(&self, dir: &Path) -> Result<(), KeyError> {
        let text = format!("{}\n", base64::engine::general_purpose::STANDARD.encode(self.private));
        write_private(&dir.join(KEY_FILE), text.as_bytes())?;
        Ok(())
    }

    pub fn load(dir: &Path) -> Result<KeyPair, KeyError> {
        let path = dir.join(KEY_FILE);
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(KeyError::Missing(path)),
            Err(source) => return Err(FileError::Io { path, source }.into()),
        };
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(text.trim())
            .ok()
            .and_then(|b| <[u8; 32]>::try_from(b.as_slice()).ok())
            .ok_or_else(|| KeyError::Invalid(path.clone()))?;
        Ok(KeyPair::from_private(bytes))
    }
}

/// A base64 WireGuard key (as the protocol carries it) in UAPI hex, or
/// `None` when it is not 32 bytes of base64.
pub fn base64_to_hex(key: &str) -> Option<String> {
    let bytes = base64::engine::general_purpose::STANDARD.decode(key).ok()?;
    (bytes.len() == 32).then(|| hex::encode(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn round_trips_with_mode_0600_and_matches_wg_pubkey() {
        let dir = tempfile::tempdir().unwrap();
        let pair = KeyPair::generate();
        pair.save(dir.path()).unwrap();
        let mode = std::fs::metadata(dir.path().join(KEY_FILE)).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let loaded = KeyPair::load(dir.path()).unwrap();
        assert_eq!(loaded.public_base64(), pair.public_base64());
        assert_eq!(base64_to_hex(&pair.public_base64()).unwrap(), pair.public_hex());
        assert!(!format!("{pair:?}").contains(&pair.private_hex()));
        // RFC 7748 test vector (Alice): the derived public key must match.
        let private = hex::decode("77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a").unwrap();
        let alice = KeyPair::from_private(private.try_into().unwrap());
        assert_eq!(alice.public_hex(), "8520f0098930a754748b7ddcb43ef75a0dbf3a0d26381af4eba4a98eaa9b4e6a");
    }

    #[test]
    fn missing_and_broken_keys_are_clear_errors() {
        let dir = tempfile::tempdir().unwrap();
        assert!(matches!(KeyPair::load(dir.path()), Err(KeyError::Missing(_))));
        std::fs::write(dir.path().join(KEY_FILE), "not a key\n").unwrap();
        assert!(matches!(KeyPair::load(dir.path()), Err(KeyError::Invalid(_))));
    }
}
