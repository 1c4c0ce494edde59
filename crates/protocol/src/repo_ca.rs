//! A repository's private CA, sent with a clone ([`Source::ca_pem`]): the
//! control plane's `--gitlab-ca-file` for a self-hosted GitLab. Only PEM
//! `CERTIFICATE` blocks travel, at most [`MAX_CA_PEM_BYTES`] of them.

use crate::deploy::Source;
use crate::validate::ValidationError;

/// The largest [`Source::ca_pem`] a node accepts.
pub const MAX_CA_PEM_BYTES: usize = 64 * 1024;

impl Source {
    /// Checks [`Source::ca_pem`]: at most [`MAX_CA_PEM_BYTES`], PEM
    /// `CERTIFICATE` blocks only (at least one), for an https repository.
    pub fn validate_ca(&self) -> Result<(), ValidationError> {
        let Some(pem) = &self.ca_pem else { return Ok(()) };
        if !self.repo_url.starts_with("https://") {
            return Err(ValidationError::new("source.ca_pem", "is only for https:// repositories"));
        }
        if ca_certificates(pem, false)? != *pem {
            return Err(ValidationError::new("source.ca_pem", "must hold PEM CERTIFICATE blocks only"));
        }
        Ok(())
    }
}

/// The PEM `CERTIFICATE` blocks of `text`, one line each between their
/// markers, at most [`MAX_CA_PEM_BYTES`] and at least one. With
/// `lenient`, text outside the blocks (the comments of a CA bundle) is
/// left out; without, anything but whole blocks is refused.
pub fn ca_certificates(text: &str, lenient: bool) -> Result<String, ValidationError> {
    const FIELD: &str = "source.ca_pem";
    let too_large = || ValidationError::new(FIELD, "is larger than 64 KiB of certificates");
    if text.len() > if lenient { 16 * MAX_CA_PEM_BYTES } else { MAX_CA_PEM_BYTES } {
        return Err(too_large());
    }
    let mut out = String::new();
    let mut inside = false;
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        match (inside, line) {
            (false, "-----BEGIN CERTIFICATE-----") => inside = true,
            (true, "-----END CERTIFICATE-----") => inside = false,
            (true, body) if body.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'/' | b'=')) => {}
            (false, _) if lenient => continue,
            _ => return Err(ValidationError::new(FIELD, "must hold PEM CERTIFICATE blocks only")),
        }
        out.push_str(line);
        out.push('\n');
    }
    if inside || out.is_empty() {
        return Err(ValidationError::new(FIELD, "must hold at least one whole PEM CERTIFICATE block"));
    }
    if out.len() > MAX_CA_PEM_BYTES {
        return Err(too_large());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_source_ca_is_pem_certificates_for_https_only() {
        let pem = "-----BEGIN CERTIFICATE-----\nMIIBdzCCAR2gAwIBAgIU\nAbc+/=\n-----END CERTIFICATE-----\n";
        let mut source = Source {
            repo_url: "https://git.internal/a.git".into(),
            branch: "main".into(),
            commit: None,
            credentials: None,
            ssh: None,
            allow_private_hosts: true,
            ca_pem: Some(pem.into()),
        };
        source.validate_ca().unwrap();
        source.ca_pem = Some(format!("{pem}{pem}"));
        source.validate_ca().unwrap();
        for bad in [
            String::new(),
            "-----BEGIN CERTIFICATE-----\nMIIB\n".to_string(),
            "-----BEGIN PRIVATE KEY-----\nMIIB\n-----END PRIVATE KEY-----\n".to_string(),
            format!("{pem}[core]\n"),
            format!("{pem}-----BEGIN CERTIFICATE-----\nMI IB\n-----END CERTIFICATE-----\n"),
            "-----BEGIN CERTIFICATE-----\n".to_string() + &"A".repeat(MAX_CA_PEM_BYTES) + "\n-----END CERTIFICATE-----\n",
        ] {
            source.ca_pem = Some(bad.clone());
            assert!(source.validate_ca().is_err(), "{bad:.80}");
        }
        // A bundle's comments are left out when the control plane reads it.
        let bundle = format!("# Subject: CN=Private CA\n{pem}\n# another\n{pem}");
        assert_eq!(ca_certificates(&bundle, true).unwrap(), format!("{pem}{pem}"));
        assert!(ca_certificates(&bundle, false).is_err());
        assert!(ca_certificates("# nothing\n", true).is_err());
        source.ca_pem = Some(pem.into());
        source.repo_url = "http://git.internal/a.git".into();
        assert!(source.validate_ca().is_err(), "not for plain http");
    }
}
