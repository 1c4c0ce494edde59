//! The GitLab connection's settings as an administrator gives them (the
//! `PUT /api/gitlab/settings` body, or the `--gitlab-*` flags): the API's
//! typed body, under the name the control plane uses.

pub use cloudweb_api_types::git::GitlabSettingsInput as SettingsInput;
