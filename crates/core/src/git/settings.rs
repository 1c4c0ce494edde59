//! The GitLab connection's settings as an administrator gives them (the
//! `PUT /api/gitlab/settings` body, or the `--gitlab-*` flags).

use serde::Deserialize;

#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SettingsInput {
    pub base_url: String,
    pub client_id: String,
    /// Required the first time; kept when absent later.
    pub client_secret: Option<String>,
    #[serde(default)]
    pub allowed_users: Vec<String>,
    #[serde(default)]
    pub allowed_groups: Vec<String>,
}

impl std::fmt::Debug for SettingsInput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SettingsInput")
            .field("base_url", &self.base_url)
            .field("client_id", &self.client_id)
            .field(
                "client_secret",
                &self.client_secret.as_ref().map(|_| "<redacted>"),
            )
            .field("allowed_users", &self.allowed_users)
            .field("allowed_groups", &self.allowed_groups)
            .finish()
    }
}
