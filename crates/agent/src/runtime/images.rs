//! Building, pushing and pulling images.

use bollard::auth::DockerCredentials;
use bollard::query_parameters::{BuildImageOptionsBuilder, CreateImageOptionsBuilder, PushImageOptionsBuilder};
use bytes::Bytes;
use futures_util::StreamExt;

use super::{DockerRuntime, RuntimeError, LABEL_APP, LABEL_BUILT_BY};

/// An image of a cloud-web app on this engine (it carries [`LABEL_APP`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppImage {
    pub id: String,
    /// `repository:tag` references.
    pub tags: Vec<String>,
    pub app: String,
    /// Unix seconds.
    pub created: i64,
}

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

/// Whether a push or pull failed because the registry could not be
/// reached for a moment: the connection was refused or reset, closed
/// early (EOF), or a proxy answered 502/503. The control plane restarts
/// its registry when the node credentials change, so such errors pass
/// within seconds and are worth a few more tries; anything else (a
/// refused login, an unknown image, a full disk) fails at once.
pub fn is_transient_registry_error(err: &RuntimeError) -> bool {
    let Some(message) = engine_message(err) else { return false };
    let connection = ["connection refused", "connection reset", "broken pipe", "unexpected eof"].iter().any(|m| message.contains(m));
    // Go's net/http says a bare "EOF" after the request, e.g.
    // `Head "http://…/v2/…": EOF`.
    let eof = message.ends_with(": eof") || message.contains(": eof ") || message.contains(": eof\n");
    let unavailable = ["502 bad gateway", "503 service unavailable", "status: 502", "status: 503", "http 502", "http 503"]
        .iter()
        .any(|m| message.contains(m));
    connection || eof || unavailable
}

/// What the engine (or the agent) said went wrong, lowercased: a failure
/// message, an engine error's message, or the error a progress stream
/// reported (a push or pull reports the registry's failure there, `Put
/// "https://…/v2/…": connection refused`; a build its step's).
fn engine_message(err: &RuntimeError) -> Option<String> {
    let message = match err {
        RuntimeError::Failed(message) => message.as_str(),
        RuntimeError::Engine(bollard::errors::Error::DockerResponseServerError { message, .. }) => message.as_str(),
        RuntimeError::Engine(bollard::errors::Error::DockerStreamError { error }) => error.as_str(),
        _ => return None,
    };
    Some(message.to_ascii_lowercase())
}

/// The image a build step made, from the classic builder's ` ---> <id>`
/// line (not ` ---> Running in <container>` or ` ---> Using cache`).
fn step_image(line: &str) -> Option<&str> {
    let id = line.trim().strip_prefix("---> ")?.trim();
    (id.len() == 12 && id.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())).then_some(id)
}

/// The last step image of a build in progress. The classic builder keeps
/// the image of every finished step; when the build fails, times out or
/// is cancelled (its future dropped: a newer deploy, a stop), nothing
/// names them any more and they would pile up on the node as untagged
/// images. Dropped before the build completed, this removes the last one
/// unless something tagged it, which also removes its untagged parents
/// (the engine stops at an image that is tagged or has other children, so
/// shared cache and base images stay); when the last one seen is the base
/// image (cut off right after FROM) it removes the base's fresh, childless,
/// untagged children instead (see [`first_steps_since`]). A killed agent
/// cannot do this; the engine's `docker image prune` removes what such a
/// build left.
struct StepImages {
    docker: bollard::Docker,
    last: Option<String>,
    done: bool,
    /// When the build started (unix seconds).
    started: i64,
}

/// How long a cancelled build's cleanup waits for the engine to commit the
/// step it was in when the build was cut off.
const STEP_SETTLE: std::time::Duration = std::time::Duration::from_secs(2);

/// How many steps past the last one seen the cleanup follows.
const STEPS_PAST_LAST: usize = 3;

impl Drop for StepImages {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let (Some(id), Ok(runtime)) = (self.last.take(), tokio::runtime::Handle::try_current()) else { return };
        let docker = self.docker.clone();
        let started = self.started;
        runtime.spawn(async move {
            // The engine may commit the step it was in after the build was
            // cut off: give it a moment, then take that image too.
            tokio::time::sleep(STEP_SETTLE).await;
            let Ok(image) = docker.inspect_image(&id).await else { return };
            let untagged = |tags: &[String]| tags.iter().all(|t| t == "<none>:<none>");
            let base = !untagged(image.repo_tags.as_deref().unwrap_or_default());
            let leaves = || async {
                let options = bollard::query_parameters::ListImagesOptionsBuilder::new().all(true).build();
                let all = docker.list_images(Some(options)).await.unwrap_or_default();
                if !base {
                    let images: Vec<(&str, &str, bool, i64)> = all.iter().map(|i| (i.id.as_str(), i.parent_id.as_str(), untagged(&i.repo_tags), i.created)).collect();
                    unfinished_leaves(&images, &id, started)
                } else {
                    // A base image: the build was cut off right after FROM,
                    // and the engine may still have committed the first
                    // step (it carries no label: the classic builder labels
                    // only the final image). Its untagged, childless
                    // children made since the build started are taken; one
                    // another build uses has a child or a container, and
                    // the engine keeps it.
                    let images: Vec<(&str, &str, bool, i64)> = all.iter().map(|i| (i.id.as_str(), i.parent_id.as_str(), untagged(&i.repo_tags), i.created)).collect();
                    first_steps_since(&images, &id, started)
                }
            };
            // Another build on this engine may be between two steps: its
            // newest step image is childless for that moment, and taking it
            // would fail that build ("No such image"). Only what is still a
            // leaf a moment later is left over from this build.
            let first = leaves().await;
            tokio::time::sleep(STEP_SETTLE).await;
            let again = leaves().await;
            for leaf in first.into_iter().filter(|l| again.contains(l)) {
                // Removing the leaf removes its untagged parents up to one
                // that is tagged or has another child (shared cache).
                match docker.remove_image(&leaf, None::<bollard::query_parameters::RemoveImageOptions>, None).await {
                    Ok(_) => tracing::debug!(image = %leaf, "removed the step images of an unfinished build"),
                    Err(err) => tracing::debug!(image = %leaf, error = %err, "kept the step images of an unfinished build"),
                }
            }
        });
    }
}

/// The images to remove for an unfinished build whose last seen step image
/// is `last`: the untagged images that descend from it (at most
/// [`STEPS_PAST_LAST`] steps down, through untagged images only) and have
/// no child, or `last` itself when nothing descends from it; of those, only
/// the ones made at or after `since` (unix seconds, with a second of slack).
/// An older one is the engine's cache from an earlier build, not this
/// build's: another build may take it from the cache at any moment, and
/// removing it under that build fails it ("failed to get digest").
/// `images` are (id, parent id, untagged, created) of every image on the
/// engine; ids may be given short or with their `sha256:` prefix.
fn unfinished_leaves(images: &[(&str, &str, bool, i64)], last: &str, since: i64) -> Vec<String> {
    let same = |a: &str, b: &str| {
        let (a, b) = (a.trim_start_matches("sha256:"), b.trim_start_matches("sha256:"));
        !a.is_empty() && !b.is_empty() && (a.starts_with(b) || b.starts_with(a))
    };
    let mut frontier = vec![last.to_string()];
    let mut leaves = Vec::new();
    for depth in 0..=STEPS_PAST_LAST {
        let mut next = Vec::new();
        for parent in &frontier {
            let children: Vec<&(&str, &str, bool, i64)> = images.iter().filter(|(_, p, _, _)| same(p, parent)).collect();
            let fresh = images.iter().find(|(id, _, _, _)| same(id, parent)).is_some_and(|(_, _, _, created)| *created >= since - 1);
            if (children.is_empty() || depth == STEPS_PAST_LAST) && fresh {
                leaves.push(parent.clone());
            }
            if depth < STEPS_PAST_LAST {
                // A tagged child is a finished image: not this build's.
                next.extend(children.iter().filter(|(_, _, untagged, _)| *untagged).map(|(id, _, _, _)| id.to_string()));
            }
        }
        if next.is_empty() {
            break;
        }
        frontier = next;
    }
    leaves
}

/// The untagged images with no child whose parent is the base image `base`
/// and that were made at or after `since` (unix seconds, with a second of
/// slack for the engine's rounding): what a build cut off right after its
/// FROM may have committed. `images` are (id, parent id, untagged,
/// created).
fn first_steps_since(images: &[(&str, &str, bool, i64)], base: &str, since: i64) -> Vec<String> {
    let same = |a: &str, b: &str| {
        let (a, b) = (a.trim_start_matches("sha256:"), b.trim_start_matches("sha256:"));
        !a.is_empty() && !b.is_empty() && (a.starts_with(b) || b.starts_with(a))
    };
    images
        .iter()
        .filter(|(id, parent, untagged, created)| *untagged && same(parent, base) && *created >= since - 1 && !images.iter().any(|(_, p, _, _)| same(p, id)))
        .map(|(id, _, _, _)| id.to_string())
        .collect()
}

/// Whether a build failed because an image it had taken from the cache
/// was removed under it (by another build's cleanup, a prune, or `docker
/// rmi` on the same engine): the engine then cannot read the image it
/// just found ("failed to get digest sha256:…: no such file or directory",
/// or "No such image: sha256:…"). Such a failure says nothing about the
/// app, and a second build succeeds.
fn lost_cached_step(err: &RuntimeError) -> bool {
    let Some(message) = engine_message(err) else { return false };
    message.contains("failed to get digest sha256:") || message.contains("no such image: sha256:")
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
    /// Builds `tag` from a context archive; `labels` go on the image (the
    /// agent sets `cloudweb.commit`, the commit it was built from).
    ///
    /// A build that lost a cached step to an image removal running beside
    /// it (the engine found the step in its cache, then the image was gone:
    /// see [`lost_cached_step`]) is built once more; the second build does
    /// not find that step in the cache and makes it again.
    pub async fn build_image(&self, context: Vec<u8>, tag: &str, labels: &[(&str, &str)], mut log: impl FnMut(String)) -> Result<(), RuntimeError> {
        let context = Bytes::from(context);
        match self.build_once(context.clone(), tag, labels, &mut log).await {
            Err(err) if lost_cached_step(&err) => {
                tracing::info!(image = %tag, error = %err, "a cached build step was removed during the build; building again");
                log("the engine lost a cached step to an image removal during the build; building again".to_string());
                self.build_once(context, tag, labels, &mut log).await
            }
            result => result,
        }
    }

    async fn build_once(&self, context: Bytes, tag: &str, labels: &[(&str, &str)], log: &mut impl FnMut(String)) -> Result<(), RuntimeError> {
        let docker = self.docker()?;
        // RUN steps go on the build network, like static site builds.
        let network = self.build_network().await?;
        // The app is the repository's last path segment (see the deploy's
        // build tag): with it and the node, images can be pruned and found.
        let (repository, _) = split_reference(tag);
        let app = repository.rsplit('/').next().unwrap_or(repository);
        let mut labels: std::collections::HashMap<&str, &str> = labels.iter().copied().collect();
        labels.insert(LABEL_APP, app);
        labels.insert(LABEL_BUILT_BY, &self.node_id);
        let options = BuildImageOptionsBuilder::new().t(tag).rm(true).forcerm(true).networkmode(&network).labels(&labels).build();
        let mut stream = docker.build_image(options, None, Some(bollard::body_full(context)));
        // Until the build completes, the images of its finished steps are
        // removed when it ends in any other way (see `StepImages`).
        let started = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0);
        let mut steps = StepImages { docker: docker.clone(), last: None, done: false, started };
        while let Some(item) = stream.next().await {
            let failed = match item {
                Err(err) => Some(RuntimeError::from(err)),
                Ok(info) => match info.error.or(info.error_detail.and_then(|d| d.message)) {
                    Some(error) => {
                        log(error.clone());
                        Some(RuntimeError::Failed(format!("image build failed: {error}")))
                    }
                    None => {
                        for line in info.stream.iter().flat_map(|text| text.lines()).filter(|l| !l.trim().is_empty()) {
                            if let Some(id) = step_image(line) {
                                steps.last = Some(id.to_string());
                            }
                            log(line.to_string());
                        }
                        None
                    }
                },
            };
            if let Some(err) = failed {
                // The steps made so far are the cache the second build
                // (see `build_image`) starts from: they stay.
                steps.done = lost_cached_step(&err);
                return Err(err);
            }
        }
        steps.done = true;
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

    /// Removes a tag this agent built (the image goes when no other tag
    /// or container holds it).
    pub async fn remove_tag(&self, tag: &str) -> Result<(), RuntimeError> {
        self.docker()?.remove_image(tag, None::<bollard::query_parameters::RemoveImageOptions>, None).await?;
        Ok(())
    }

    /// Every image on the engine labelled as a cloud-web app's (built by
    /// any agent: a pulled image carries its builder's labels).
    pub async fn app_images(&self) -> Result<Vec<AppImage>, RuntimeError> {
        let filters = std::collections::HashMap::from([("label", vec![LABEL_APP.to_string()])]);
        let options = bollard::query_parameters::ListImagesOptionsBuilder::new().filters(&filters).build();
        let images = self.docker()?.list_images(Some(options)).await?;
        Ok(images
            .into_iter()
            .map(|image| AppImage {
                app: image.labels.get(LABEL_APP).cloned().unwrap_or_default(),
                id: image.id,
                tags: image.repo_tags,
                created: image.created,
            })
            .collect())
    }

    /// Ids of the images any container on the engine (running or not) was
    /// made from.
    pub async fn images_in_use(&self) -> Result<std::collections::HashSet<String>, RuntimeError> {
        let options = bollard::query_parameters::ListContainersOptionsBuilder::new().all(true).build();
        let containers = self.docker()?.list_containers(Some(options)).await?;
        Ok(containers.into_iter().filter_map(|c| c.image_id).collect())
    }

    pub async fn image_exists(&self, image: &str) -> Result<bool, RuntimeError> {
        Ok(self.docker()?.inspect_image(image).await.is_ok())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unfinished_build_removes_the_steps_committed_after_it_was_cut_off() {
        // base -> copy (last seen) -> cmd (committed after the cut): cmd goes.
        let images = [("sha256:base", "", false, 100), ("sha256:copy", "sha256:base", true, 200), ("sha256:cmd", "sha256:copy", true, 201)];
        assert_eq!(unfinished_leaves(&images, "copy", 200), vec!["sha256:cmd".to_string()]);
        // Nothing after the last seen step: that one goes.
        assert_eq!(unfinished_leaves(&images, "cmd", 200), vec!["cmd".to_string()]);
        // A tagged child is a finished image (shared cache): only the last
        // seen step is tried, and the engine keeps it while the child lives.
        let shared = [("sha256:copy", "sha256:base", true, 200), ("sha256:done", "sha256:copy", false, 201)];
        assert_eq!(unfinished_leaves(&shared, "copy", 200), Vec::<String>::new());
    }

    #[test]
    fn a_cached_step_removed_under_a_build_is_told_from_a_failing_build() {
        let stream = |error: &str| RuntimeError::Engine(bollard::errors::Error::DockerStreamError { error: error.to_string() });
        let lost = "failed to get digest sha256:a6bc46: open /var/lib/docker/image/overlay2/imagedb/content/sha256/a6bc46: no such file or directory";
        assert!(lost_cached_step(&stream(lost)));
        assert!(lost_cached_step(&RuntimeError::Failed("image build failed: No such image: sha256:0123abcd".into())));
        // The app's own failures are not retried.
        assert!(!lost_cached_step(&RuntimeError::Failed("image build failed: The command '/bin/sh -c exit 7' returned a non-zero code: 7".into())));
        assert!(!lost_cached_step(&stream("pull access denied for nosuch, repository does not exist")));
        assert!(!lost_cached_step(&RuntimeError::Failed("image build failed: No such image: nosuch:latest".into())));
    }

    /// A stand-in engine whose first build loses a cached step and whose
    /// second succeeds: the build is tried once more and succeeds, and the
    /// app's log says why it was built twice. A third build is never asked.
    #[tokio::test]
    async fn a_build_that_lost_a_cached_step_is_built_once_more() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("docker.sock");
        let listener = tokio::net::UnixListener::bind(&socket).unwrap();
        let builds = std::sync::Arc::new(AtomicUsize::new(0));
        let counted = builds.clone();
        let (_requests, _task) = cloudweb_test_support::serve_json(listener, move |request| {
            if request.path.contains("/networks/") {
                return ("200 OK", r#"{"Name":"cloudweb-build"}"#.to_string());
            }
            if !request.path.contains("/build") {
                return ("500 Internal Server Error", r#"{"message":"unexpected request"}"#.to_string());
            }
            let body = match counted.fetch_add(1, Ordering::SeqCst) {
                0 => concat!(
                    r#"{"stream":"Step 1/2 : FROM base\n"}"#, "\n",
                    r#"{"errorDetail":{"message":"failed to get digest sha256:a6bc: no such file or directory"},"error":"failed to get digest sha256:a6bc: no such file or directory"}"#, "\n",
                ),
                _ => concat!(r#"{"stream":"Successfully built 0123456789ab\n"}"#, "\n"),
            };
            ("200 OK", body.to_string())
        });
        let runtime = DockerRuntime::new(&format!("unix://{}", socket.display()), "n-test").unwrap();
        let mut lines = Vec::new();
        runtime.build_image(Vec::new(), "web:1", &[], |line| lines.push(line)).await.unwrap();
        assert_eq!(builds.load(Ordering::SeqCst), 2, "{lines:?}");
        assert!(lines.iter().any(|l| l.contains("building again")), "{lines:?}");
        assert!(lines.iter().any(|l| l.contains("Successfully built")), "{lines:?}");
    }

    #[test]
    fn an_unfinished_build_leaves_the_cache_of_earlier_builds() {
        // The last seen step came from the cache (made before this build
        // started) and has no child: another build may be taking it from
        // the cache right now, so it stays.
        let images = [("sha256:base", "", false, 100), ("sha256:run", "sha256:base", true, 150)];
        assert_eq!(unfinished_leaves(&images, "run", 200), Vec::<String>::new());
        // A cached step followed by one this build committed: only the
        // fresh one goes.
        let images = [("sha256:base", "", false, 100), ("sha256:run", "sha256:base", true, 150), ("sha256:cmd", "sha256:run", true, 205)];
        assert_eq!(unfinished_leaves(&images, "run", 200), vec!["sha256:cmd".to_string()]);
    }

    #[test]
    fn step_images_are_read_from_the_classic_builders_lines() {
        assert_eq!(step_image(" ---> 486cf7b7e8f2"), Some("486cf7b7e8f2"));
        assert_eq!(step_image("---> 486cf7b7e8f2\n"), Some("486cf7b7e8f2"));
        for other in [" ---> Running in 4ddad2ae8e2c", " ---> Using cache", "Step 2/4 : RUN echo", " ---> 486CF7B7E8F2", " ---> 486cf7b7e8f"] {
            assert_eq!(step_image(other), None, "{other:?}");
        }
    }

    #[test]
    fn a_build_cut_off_after_from_removes_only_its_fresh_first_step() {
        let images = [
            ("sha256:base", "", false, 100),
            // Committed after the cut: taken.
            ("sha256:copy", "sha256:base", true, 205),
            // Older than the build: another's (the engine's cache).
            ("sha256:old", "sha256:base", true, 150),
            // Another build's step with a child of its own: kept.
            ("sha256:busy", "sha256:base", true, 206),
            ("sha256:next", "sha256:busy", true, 207),
            // Another build's finished image: tagged.
            ("sha256:final", "sha256:base", false, 208),
            // A step of another base.
            ("sha256:elsewhere", "sha256:other", true, 209),
        ];
        assert_eq!(first_steps_since(&images, "sha256:base", 200), vec!["sha256:copy".to_string()]);
        assert_eq!(first_steps_since(&images, "base", 210), Vec::<String>::new());
    }

    #[test]
    fn registry_errors_that_pass_are_told_from_those_that_do_not() {
        let engine = |message: &str| {
            RuntimeError::Engine(bollard::errors::Error::DockerResponseServerError { status_code: 500, message: message.to_string() })
        };
        let failed = |message: &str| RuntimeError::Failed(message.to_string());
        for transient in [
            engine("Get \"http://127.0.0.1:5000/v2/\": dial tcp 127.0.0.1:5000: connect: connection refused"),
            failed("push of 127.0.0.1:5000/web:d1 failed: Put \"http://127.0.0.1:5000/v2/web/blobs/uploads/x\": read tcp 127.0.0.1:4242->127.0.0.1:5000: read: connection reset by peer"),
            failed("push of r/web:d1 failed: Patch \"http://127.0.0.1:5000/v2/web/blobs/uploads/x\": EOF"),
            engine("Head \"http://127.0.0.1:5000/v2/web/manifests/d1\": EOF"),
            failed("pull of r/web:d1 failed: unexpected EOF"),
            failed("push of r/web:d1 failed: write tcp 127.0.0.1:1->127.0.0.1:5000: write: broken pipe"),
            engine("received unexpected HTTP status: 502 Bad Gateway"),
            failed("push of r/web:d1 failed: received unexpected HTTP status: 503 Service Unavailable"),
            // What a push says when the control plane (and its registry)
            // restarts under it, as seen in the kill fault test.
            RuntimeError::Engine(bollard::errors::Error::DockerStreamError {
                error: "Get \"http://127.0.0.1:33047/v2/\": dial tcp 127.0.0.1:33047: connect: connection refused".into(),
            }),
        ] {
            assert!(is_transient_registry_error(&transient), "{transient}");
        }
        for lasting in [
            engine("Head \"http://127.0.0.1:5000/v2/web/manifests/d1\": no basic auth credentials"),
            engine("manifest for 127.0.0.1:5000/web:d1 not found: manifest unknown"),
            failed("push of r/web:d1 failed: unauthorized: authentication required"),
            failed("pull of r/web:d1 failed: write /var/lib/docker/tmp/x: no space left on device"),
            engine("received unexpected HTTP status: 500 Internal Server Error"),
            failed("push of r/eofweb:d1 failed: denied: requested access to the resource is denied"),
            RuntimeError::Unavailable("the Docker Engine does not answer".into()),
            RuntimeError::Engine(bollard::errors::Error::DockerStreamError { error: "unauthorized: authentication required".into() }),
        ] {
            assert!(!is_transient_registry_error(&lasting), "{lasting}");
        }
    }

    #[test]
    fn references() {
        assert_eq!(split_reference("127.0.0.1:5000/web:dep_1"), ("127.0.0.1:5000/web", "dep_1"));
        assert_eq!(split_reference("127.0.0.1:5000/web"), ("127.0.0.1:5000/web", "latest"));
        assert_eq!(split_reference("busybox"), ("busybox", "latest"));
    }
}
