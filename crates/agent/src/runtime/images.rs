//! Building, pushing and pulling images.

use bollard::auth::DockerCredentials;
use bollard::query_parameters::{BuildImageOptionsBuilder, CreateImageOptionsBuilder, PushImageOptionsBuilder};
use bytes::Bytes;
use futures_util::StreamExt;

use super::{DockerRuntime, RuntimeError};

/// Credentials for the cluster registry.
#[derive(Clone)]
pub struct RegistryAuth {
    pub address: String,
    pub username: String,
    pub password: String,
}

impl std::fmt::Debug for RegistryAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegistryAuth").field("address", &self.address).field("username", &self.username).finish_non_exhaustive()
    }
}

impl RegistryAuth {
    fn credentials(&self) -> DockerCredentials {
        DockerCredentials {
            username: Some(self.username.clone()),
            password: Some(self.password.clone()),
            serveraddress: Some(self.address.clone()),
            ..Default::default()
        }
    }
}

/// Splits `repo:tag` (the tag after the last ':' that follows the last '/').
fn split_reference(image: &str) -> (&str, &str) {
    match image.rfind(':') {
        Some(colon) if image.rfind('/').is_none_or(|slash| colon > slash) => (&image[..colon], &image[colon + 1..]),
        _ => (image, "latest"),
    }
}

impl DockerRuntime {
    /// Builds `context` (a tar archive with a Dockerfile at its root) as
    /// `tag`, passing every output line to `log`.
    pub async fn build_image(&self, context: Vec<u8>, tag: &str, mut log: impl FnMut(String)) -> Result<(), RuntimeError> {
        let docker = self.docker()?;
        // RUN steps go on the build network, like static site builds.
        let network = self.build_network().await?;
        let options = BuildImageOptionsBuilder::new().t(tag).rm(true).forcerm(true).networkmode(&network).build();
        let mut stream = docker.build_image(options, None, Some(bollard::body_full(Bytes::from(context))));
        while let Some(item) = stream.next().await {
            let info = item?;
            if let Some(error) = info.error.or(info.error_detail.and_then(|d| d.message)) {
                log(error.clone());
                return Err(RuntimeError::Failed(format!("image build failed: {error}")));
            }
            if let Some(text) = info.stream {
                for line in text.lines().filter(|l| !l.trim().is_empty()) {
                    log(line.to_string());
                }
            }
        }
        Ok(())
    }

    pub async fn push_image(&self, image: &str, auth: &RegistryAuth) -> Result<(), RuntimeError> {
        let (repo, tag) = split_reference(image);
        let docker = self.docker()?;
        let mut stream = docker.push_image(repo, Some(PushImageOptionsBuilder::new().tag(tag).build()), Some(auth.credentials()));
        while let Some(item) = stream.next().await {
            let info = item?;
            if let Some(error) = info.error.or(info.error_detail.and_then(|d| d.message)) {
                return Err(RuntimeError::Failed(format!("push of {image} failed: {error}")));
            }
        }
        Ok(())
    }

    /// Pulls an image unless it is already present.
    pub async fn ensure_image(&self, image: &str, auth: Option<&RegistryAuth>) -> Result<bool, RuntimeError> {
        let docker = self.docker()?;
        if docker.inspect_image(image).await.is_ok() {
            return Ok(false);
        }
        let (repo, tag) = split_reference(image);
        let options = CreateImageOptionsBuilder::new().from_image(repo).tag(tag).build();
        let mut stream = docker.create_image(Some(options), None, auth.map(RegistryAuth::credentials));
        while let Some(item) = stream.next().await {
            let info = item?;
            if let Some(error) = info.error.or(info.error_detail.and_then(|d| d.message)) {
                return Err(RuntimeError::Failed(format!("pull of {image} failed: {error}")));
            }
        }
        Ok(true)
    }

    pub async fn image_exists(&self, image: &str) -> Result<bool, RuntimeError> {
        Ok(self.docker()?.inspect_image(image).await.is_ok())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references() {
        assert_eq!(split_reference("127.0.0.1:5000/web:dep_1"), ("127.0.0.1:5000/web", "dep_1"));
        assert_eq!(split_reference("127.0.0.1:5000/web"), ("127.0.0.1:5000/web", "latest"));
        assert_eq!(split_reference("busybox"), ("busybox", "latest"));
    }
}
