//! Pruning the images of superseded deployments from this node.
//!
//! Every [`DEFAULT_INTERVAL`] the agent removes, from its Docker Engine,
//! the images of cloud-web apps (those carrying the `cloudweb.app` label
//! that every image an agent builds gets, and that pulled images bring
//! along) in this cluster's repositories (`<registry>/…`, or `cloudweb/…`
//! without a registry) that are neither used by a container nor among the
//! newest `keep` ([`DEFAULT_KEEP`], `--keep-images`) of their app. Other
//! images (base images, images deployed by reference) are never touched.
//! The cluster registry keeps every pushed image, so a rollback to a pruned
//! one pulls it again.
//!
//! An app with no container on this node and no image newer than a day
//! (deleted, a removed preview, or moved to other nodes) loses all its
//! images here ([`idle_apps`]).
//!
//! It also removes untagged images that carry an app's label and are older
//! than the longest build may run: the step images of a build that did not
//! finish and whose cleanup could not run or came too early (the agent was
//! killed, or the engine committed one more step after the build was
//! cancelled). An image that young may still be a running build's.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use crate::client::ControlPlane;
use crate::runtime::{AppImage, DockerRuntime};

/// Images of each app kept besides those in use.
pub const DEFAULT_KEEP: usize = 3;
/// Time between two prunings.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(600);

/// The references to remove: per app, the images in `prefix` beyond the
/// newest `keep` that no container uses; only their references in
/// `prefix` (the image goes with its last reference).
pub fn to_remove(images: &[AppImage], prefix: &str, in_use: &HashSet<String>, keep: usize) -> Vec<String> {
    let mut by_app: BTreeMap<&str, Vec<&AppImage>> = BTreeMap::new();
    for image in images.iter().filter(|i| !i.app.is_empty() && i.tags.iter().any(|t| t.starts_with(prefix))) {
        by_app.entry(image.app.as_str()).or_default().push(image);
    }
    let mut remove = Vec::new();
    for (_, mut images) in by_app {
        images.sort_by(|a, b| b.created.cmp(&a.created).then_with(|| b.id.cmp(&a.id)));
        for image in images.into_iter().skip(keep).filter(|i| !in_use.contains(&i.id)) {
            remove.extend(image.tags.iter().filter(|t| t.starts_with(prefix)).cloned());
        }
    }
    remove
}

/// How long an app may go with no container on this node and no new
/// image before all its images here go (a deleted app, a removed preview,
/// an app whose instances moved to other nodes: the registry still has
/// them, and a later start pulls them again).
pub const IDLE_APP_IMAGES_AFTER_S: i64 = 86_400;

/// The references of apps none of whose images a container uses and whose
/// newest image is at least [`IDLE_APP_IMAGES_AFTER_S`] old at `now_s`:
/// all their references in `prefix`.
pub fn idle_apps(images: &[AppImage], prefix: &str, in_use: &HashSet<String>, now_s: i64) -> Vec<String> {
    let mut by_app: BTreeMap<&str, Vec<&AppImage>> = BTreeMap::new();
    for image in images.iter().filter(|i| !i.app.is_empty() && i.tags.iter().any(|t| t.starts_with(prefix))) {
        by_app.entry(image.app.as_str()).or_default().push(image);
    }
    let mut remove = Vec::new();
    for (_, images) in by_app {
        let used = images.iter().any(|i| in_use.contains(&i.id));
        let newest = images.iter().map(|i| i.created).max().unwrap_or(now_s);
        if !used && now_s - newest >= IDLE_APP_IMAGES_AFTER_S {
            remove.extend(images.iter().flat_map(|i| i.tags.iter().filter(|t| t.starts_with(prefix)).cloned()));
        }
    }
    remove
}

/// How old an untagged app image must be to count as a leftover: longer
/// than any build may run (`MAX_BUILD_TIMEOUT_SECONDS`), with an hour to
/// spare.
pub const STALE_STEP_IMAGE_AGE_S: i64 = cloudweb_protocol::deploy::MAX_BUILD_TIMEOUT_SECONDS as i64 + 3600;

/// The untagged app images (step images of unfinished builds) at least
/// [`STALE_STEP_IMAGE_AGE_S`] old at `now_s` that no container uses.
pub fn stale_step_images(images: &[AppImage], in_use: &HashSet<String>, now_s: i64) -> Vec<String> {
    images
        .iter()
        .filter(|i| !i.app.is_empty() && i.tags.iter().all(|t| t == "<none>:<none>"))
        .filter(|i| now_s - i.created >= STALE_STEP_IMAGE_AGE_S && !in_use.contains(&i.id))
        .map(|i| i.id.clone())
        .collect()
}

/// Prunes every `interval` until the task is aborted.
pub async fn pruner(client: Arc<ControlPlane>, runtime: DockerRuntime, interval: Duration, keep: usize) {
    loop {
        tokio::time::sleep(interval).await;
        let prefix = match client.registry().await {
            Ok(config) if config.configured => match config.address {
                Some(address) => format!("{address}/"),
                None => continue,
            },
            Ok(_) => "cloudweb/".to_string(),
            Err(err) => {
                tracing::debug!(error = %err, "no registry settings; images are pruned next time");
                continue;
            }
        };
        let listed = async { Ok::<_, crate::runtime::RuntimeError>((runtime.app_images().await?, runtime.images_in_use().await?)) };
        let (images, in_use) = match listed.await {
            Ok(listed) => listed,
            Err(err) => {
                tracing::warn!(error = %err, "could not list images to prune");
                continue;
            }
        };
        let now_s = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0);
        for id in stale_step_images(&images, &in_use, now_s) {
            match runtime.remove_tag(&id).await {
                Ok(()) => tracing::info!(image = %id, "removed the step image of a build that did not finish"),
                Err(err) => tracing::debug!(image = %id, error = %err, "could not remove a leftover step image"),
            }
        }
        for reference in idle_apps(&images, &prefix, &in_use, now_s) {
            match runtime.remove_tag(&reference).await {
                Ok(()) => tracing::info!(image = %reference, "pruned the image of an app with no container here for a day"),
                Err(err) => tracing::debug!(image = %reference, error = %err, "could not prune an image"),
            }
        }
        for reference in to_remove(&images, &prefix, &in_use, keep) {
            match runtime.remove_tag(&reference).await {
                Ok(()) => tracing::info!(image = %reference, keep, "pruned the image of a superseded deployment"),
                // In use since the listing, or gone already: next time.
                Err(err) => tracing::debug!(image = %reference, error = %err, "could not prune an image"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(id: &str, app: &str, created: i64, tags: &[&str]) -> AppImage {
        AppImage { id: id.into(), app: app.into(), created, tags: tags.iter().map(|t| t.to_string()).collect() }
    }

    #[test]
    fn an_app_with_no_container_here_for_a_day_loses_all_its_images() {
        let r = "10.77.0.1:5000/";
        let day = IDLE_APP_IMAGES_AFTER_S;
        let now = 10 * day;
        let images = vec![
            // Gone a day: every image goes.
            image("g1", "web-pr-7", now - 3 * day, &["10.77.0.1:5000/web-pr-7:dep_1"]),
            image("g2", "web-pr-7", now - day, &["10.77.0.1:5000/web-pr-7:dep_2", "mine/web-pr-7:keep"]),
            // Built an hour ago: kept.
            image("y1", "fresh", now - 3600, &["10.77.0.1:5000/fresh:dep_1"]),
            // One of its images runs: kept, old ones too (to_remove's business).
            image("u1", "web", now - 5 * day, &["10.77.0.1:5000/web:dep_1"]),
            image("u2", "web", now - 4 * day, &["10.77.0.1:5000/web:dep_2"]),
            // Another cluster's: not ours.
            image("o1", "other", now - 5 * day, &["127.0.0.1:9/other:dep_1"]),
        ];
        let in_use = HashSet::from(["u2".to_string()]);
        assert_eq!(idle_apps(&images, r, &in_use, now), vec!["10.77.0.1:5000/web-pr-7:dep_1".to_string(), "10.77.0.1:5000/web-pr-7:dep_2".to_string()]);
    }

    #[test]
    fn only_old_untagged_app_images_count_as_leftover_steps() {
        let old = 1_000_000;
        let now = old + STALE_STEP_IMAGE_AGE_S;
        let images = vec![
            image("s1", "web", old, &[]),
            image("s2", "web", old, &["<none>:<none>"]),
            image("young", "web", now - 60, &[]),
            image("tagged", "web", old, &["10.77.0.1:5000/web:dep_1"]),
            image("base", "", old, &[]),
            image("used", "web", old, &[]),
        ];
        let in_use = HashSet::from(["used".to_string()]);
        assert_eq!(stale_step_images(&images, &in_use, now), vec!["s1".to_string(), "s2".to_string()]);
    }

    #[test]
    fn keeps_the_newest_and_those_in_use_and_touches_nothing_else() {
        let r = "10.77.0.1:5000/";
        let images = vec![
            image("a1", "web", 1, &["10.77.0.1:5000/web:dep_1"]),
            image("a2", "web", 2, &["10.77.0.1:5000/web:dep_2"]),
            image("a3", "web", 3, &["10.77.0.1:5000/web:dep_3"]),
            image("a4", "web", 4, &["10.77.0.1:5000/web:dep_4", "mine/web:keep"]),
            image("a5", "web", 5, &["10.77.0.1:5000/web:dep_5"]),
            image("b1", "api", 1, &["10.77.0.1:5000/api:dep_1"]),
            // Another cluster's registry, and no app label: not ours.
            image("c1", "web", 0, &["127.0.0.1:9/web:dep_0"]),
            image("d1", "", 0, &["10.77.0.1:5000/base:latest"]),
        ];
        let in_use = HashSet::from(["a1".to_string()]);
        let mut removed = to_remove(&images, r, &in_use, 2);
        removed.sort();
        assert_eq!(removed, vec!["10.77.0.1:5000/web:dep_2", "10.77.0.1:5000/web:dep_3"]);
        let removed = to_remove(&images, r, &HashSet::new(), 4);
        assert_eq!(removed, vec!["10.77.0.1:5000/web:dep_1"]);
        assert!(to_remove(&images, "cloudweb/", &HashSet::new(), 0).is_empty());
    }
}
