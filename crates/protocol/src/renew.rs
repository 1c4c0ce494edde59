//! `POST /agent/v1/renew`: a registered node trades a CSR for a new client
//! certificate before its current one expires.
//!
//! The request is authenticated by the node's current certificate (mTLS);
//! the new certificate names the same node, whatever the CSR asks for, and
//! certifies the CSR's key (a new one, made by the agent for each renewal).
//! The control plane keeps accepting the old certificate until the node
//! first presents the new one; from then on the old fingerprint is refused
//! with `401` and code [`crate::error_codes::CERTIFICATE_REPLACED`].

use serde::{Deserialize, Serialize};

use crate::join::MAX_CSR_LEN;
use crate::validate::ValidationError;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RenewRequest {
    /// PKCS#10 request in PEM for a new key. Only its public key is used.
    pub csr: String,
}

impl RenewRequest {
    pub fn validate(&self) -> Result<(), ValidationError> {
        if self.csr.trim().is_empty() {
            return Err(ValidationError::new("csr", "must not be empty"));
        }
        if self.csr.len() > MAX_CSR_LEN {
            return Err(ValidationError::new("csr", "longer than 16 KiB"));
        }
        Ok(())
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RenewResponse {
    /// The new client certificate (PEM), for the CSR's key.
    pub certificate: String,
    /// Its end of validity, RFC 3339.
    pub not_after: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csr_must_be_present_and_bounded() {
        assert!(RenewRequest { csr: " ".into() }.validate().is_err());
        assert!(RenewRequest { csr: "x".repeat(MAX_CSR_LEN + 1) }.validate().is_err());
        assert!(RenewRequest { csr: "-----BEGIN CERTIFICATE REQUEST-----".into() }.validate().is_ok());
    }
}
