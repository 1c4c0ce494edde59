//! Where the cluster registry keeps its blobs and manifests: a directory
//! under the control plane's data directory (the default), or an
//! S3-compatible bucket (`--registry-s3-*`), so the images every rollback
//! and reschedule pulls outlive the control plane's host.
//!
//! With S3 the registry serves blobs itself (`redirect: disable`): nodes
//! reach only the registry, never the bucket. Its keys travel in the
//! registry process's environment (`REGISTRY_STORAGE_S3_*`, the
//! distribution registry's own overrides), never in its config file, and
//! the process gets nothing else of the control plane's environment.

use std::fmt;
use std::path::Path;

/// The registry's storage.
#[derive(Debug, Clone, Default)]
pub enum RegistryStorage {
    #[default]
    Filesystem,
    S3(RegistryS3),
}

/// An S3-compatible bucket for the registry.
#[derive(Clone)]
pub struct RegistryS3 {
    /// `http(s)://host[:port]` of an S3-compatible service; AWS S3 itself
    /// when absent.
    pub endpoint: Option<String>,
    pub bucket: String,
    pub region: String,
    /// A key prefix in the bucket (`rootdirectory`).
    pub prefix: Option<String>,
    pub access_key_id: String,
    pub secret_access_key: String,
}

impl fmt::Debug for RegistryS3 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RegistryS3")
            .field("endpoint", &self.endpoint)
            .field("bucket", &self.bucket)
            .field("region", &self.region)
            .field("prefix", &self.prefix)
            .field("access_key_id", &self.access_key_id)
            .field("secret_access_key", &"[redacted]")
            .finish()
    }
}

impl RegistryS3 {
    /// Checks every part; the errors name the flag.
    pub fn new(endpoint: Option<String>, bucket: String, region: String, prefix: Option<String>, access_key_id: String, secret_access_key: String) -> Result<RegistryS3, String> {
        if let Some(endpoint) = &endpoint {
            crate::s3::endpoint(endpoint).map_err(|e| format!("--registry-s3-endpoint: {e}"))?;
        }
        crate::s3::bucket(&bucket).map_err(|e| format!("--registry-s3-bucket: {e}"))?;
        crate::s3::region(&region).map_err(|e| format!("--registry-s3-region: {e}"))?;
        let prefix = prefix.map(|p| p.trim_matches('/').to_string()).filter(|p| !p.is_empty());
        if let Some(prefix) = &prefix {
            crate::s3::plain_path("--registry-s3-prefix", prefix)?;
        }
        let printable = |v: &str| !v.is_empty() && v.len() <= 256 && v.bytes().all(|b| b.is_ascii_graphic());
        if !printable(&access_key_id) {
            return Err("--registry-s3-access-key-id: 1 to 256 printable characters without spaces".into());
        }
        if !printable(&secret_access_key) {
            return Err("the registry's S3 secret access key: 1 to 256 printable characters without spaces".into());
        }
        Ok(RegistryS3 { endpoint, bucket, region, prefix, access_key_id, secret_access_key })
    }
}

fn quoted(text: &str) -> String {
    // A JSON string is a YAML string.
    serde_json::to_string(text).expect("a string serializes")
}

impl RegistryStorage {
    /// The `storage:` section of the registry's config, without secrets;
    /// `root` is the filesystem storage's directory.
    pub fn config(&self, root: &Path) -> String {
        match self {
            RegistryStorage::Filesystem => {
                format!("storage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\n", quoted(&root.display().to_string()))
            }
            RegistryStorage::S3(s3) => {
                let mut text = format!("storage:\n  s3:\n    region: {}\n    bucket: {}\n    v4auth: true\n", quoted(&s3.region), quoted(&s3.bucket));
                if let Some(endpoint) = &s3.endpoint {
                    // With an endpoint, distribution 2.x addresses the
                    // bucket by path, as S3-compatible services want.
                    text.push_str(&format!("    regionendpoint: {}\n", quoted(endpoint)));
                    if crate::s3::endpoint(endpoint).is_ok_and(|(scheme, _)| scheme == "http") {
                        text.push_str("    secure: false\n");
                    }
                }
                if let Some(prefix) = &s3.prefix {
                    text.push_str(&format!("    rootdirectory: {}\n", quoted(&format!("/{prefix}"))));
                }
                text.push_str("  redirect:\n    disable: true\n  delete:\n    enabled: true\n");
                text
            }
        }
    }

    /// The registry process's whole environment.
    pub fn env(&self) -> Vec<(String, String)> {
        match self {
            RegistryStorage::Filesystem => Vec::new(),
            RegistryStorage::S3(s3) => vec![
                ("REGISTRY_STORAGE_S3_ACCESSKEY".into(), s3.access_key_id.clone()),
                ("REGISTRY_STORAGE_S3_SECRETKEY".into(), s3.secret_access_key.clone()),
            ],
        }
    }

    /// For logs and the operator: where the blobs are.
    pub fn describe(&self, root: &Path) -> String {
        match self {
            RegistryStorage::Filesystem => format!("directory {}", root.display()),
            RegistryStorage::S3(s3) => format!(
                "bucket {}{} at {}",
                s3.bucket,
                s3.prefix.as_deref().map(|p| format!(" (prefix {p})")).unwrap_or_default(),
                s3.endpoint.as_deref().unwrap_or("AWS S3")
            ),
        }
    }

    /// The endpoint to probe before starting, if any.
    pub fn endpoint(&self) -> Option<&str> {
        match self {
            RegistryStorage::S3(s3) => s3.endpoint.as_deref(),
            RegistryStorage::Filesystem => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s3() -> RegistryS3 {
        RegistryS3::new(Some("http://127.0.0.1:9000".into()), "images".into(), "us-east-1".into(), Some("/cluster/one/".into()), "AKID".into(), "s3cr3t".into()).unwrap()
    }

    #[test]
    fn the_config_names_the_bucket_and_never_the_keys() {
        let storage = RegistryStorage::S3(s3());
        let config = storage.config(Path::new("/unused"));
        for line in ["  s3:\n", "    bucket: \"images\"\n", "    regionendpoint: \"http://127.0.0.1:9000\"\n", "    secure: false\n", "    rootdirectory: \"/cluster/one\"\n", "    disable: true\n"] {
            assert!(config.contains(line), "{line:?} in {config}");
        }
        assert!(!config.contains("AKID") && !config.contains("s3cr3t"), "{config}");
        assert_eq!(storage.env().len(), 2);
        assert!(!format!("{storage:?}").contains("s3cr3t"));
        let local = RegistryStorage::Filesystem.config(Path::new("/var/lib/cloudweb/registry/storage"));
        assert!(local.contains("rootdirectory: \"/var/lib/cloudweb/registry/storage\""), "{local}");
        assert!(RegistryStorage::Filesystem.env().is_empty());
        let upper = RegistryS3 { endpoint: Some("HTTP://127.0.0.1:9000".into()), ..s3() };
        assert!(RegistryStorage::S3(upper).config(Path::new("/unused")).contains("secure: false"), "the scheme as parsed");
    }

    #[test]
    fn bad_settings_name_their_flag() {
        let bad = |endpoint: &str, bucket: &str, prefix: &str, key: &str| {
            RegistryS3::new(Some(endpoint.into()), bucket.into(), "us-east-1".into(), Some(prefix.into()), key.into(), "secret".into()).unwrap_err()
        };
        assert!(bad("ftp://h", "images", "", "k").contains("--registry-s3-endpoint"));
        assert!(bad("http://h", "Images", "", "k").contains("--registry-s3-bucket"));
        assert!(bad("http://h", "images", "a/../b", "k").contains("--registry-s3-prefix"));
        assert!(bad("http://h", "images", "", "a key").contains("--registry-s3-access-key-id"));
    }
}
