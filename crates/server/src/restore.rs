//! `cloudweb-server restore`: a new control plane's data dir from the
//! newest (or a named) control-plane backup, with the recovery key. The
//! work is `cloudweb_core::backups::control_plane::restore`; this is its
//! command line: the key file, S3 credentials from the environment (as
//! restic takes them), and what to do next.

use std::path::{Path, PathBuf};

use anyhow::Context;
use cloudweb_protocol::Repository;
use cloudweb_core::backups::control_plane::{self, human_age, RestoreRequest, Restored};

#[derive(clap::Args)]
pub struct RestoreArgs {
    /// The control-plane repository of the recovery kit: a directory, or
    /// s3:https://host/bucket/prefix/control-plane. S3 credentials come
    /// from AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and AWS_DEFAULT_REGION.
    #[arg(long, value_name = "REPOSITORY")]
    from: String,
    /// A file holding the recovery key (the recovery kit's password).
    #[arg(long, value_name = "FILE")]
    recovery_key_file: PathBuf,
    /// The data dir to create; refused when it holds a cluster already.
    #[arg(long, value_name = "DIR")]
    data_dir: PathBuf,
    /// The snapshot to restore (an id or its prefix); the newest when left
    /// out.
    #[arg(long, value_name = "ID")]
    snapshot: Option<String>,
}

/// The S3 variables restic reads, passed on when set.
const CREDENTIALS: [&str; 4] = ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_DEFAULT_REGION"];

fn request(args: &RestoreArgs) -> anyhow::Result<RestoreRequest> {
    let key = std::fs::read_to_string(&args.recovery_key_file).with_context(|| format!("reading the recovery key {}", args.recovery_key_file.display()))?;
    let key = key.trim_end_matches(['\n', '\r']).to_string();
    if key.trim().is_empty() {
        anyhow::bail!("{} is empty: it must hold the recovery kit's password", args.recovery_key_file.display());
    }
    let env = CREDENTIALS
        .iter()
        .filter_map(|name| std::env::var(name).ok().filter(|v| !v.is_empty()).map(|v| (name.to_string(), v)))
        .collect();
    Ok(RestoreRequest { repository: Repository { url: args.from.clone(), password: key, env }, data_dir: args.data_dir.clone(), snapshot: args.snapshot.clone() })
}

/// restic's cache for this one run, outside the data dir and removed
/// after.
fn cache_dir() -> PathBuf {
    let bytes: [u8; 6] = rand::random();
    std::env::temp_dir().join(format!("cloudweb-restore-cache-{}-{}", std::process::id(), hex::encode(bytes)))
}

pub async fn run(args: RestoreArgs) -> anyhow::Result<()> {
    let request = request(&args)?;
    let cache = cache_dir();
    let restored = control_plane::restore(&request, &cache, time::OffsetDateTime::now_utc()).await;
    let _ = std::fs::remove_dir_all(&cache);
    let restored = restored?;
    print!("{}", report(&restored, &args.data_dir));
    Ok(())
}

/// What was restored, how old it is, and what to do next.
fn report(restored: &Restored, data_dir: &Path) -> String {
    let mut text = format!(
        "restored control-plane snapshot {} into {}\nthe restored state is {} old (the backup was taken at {})\n",
        restored.snapshot.short_id,
        data_dir.display(),
        human_age(restored.age),
        restored.snapshot.time
    );
    if !restored.failed_deployments.is_empty() {
        text.push_str(&format!(
            "{} deployment(s) in flight when the backup was taken are now failed (deploy them again): {}\n",
            restored.failed_deployments.len(),
            restored.failed_deployments.join(", ")
        ));
    }
    if restored.failed_jobs > 0 {
        text.push_str(&format!("{} backup job(s) unfinished when the backup was taken are now failed\n", restored.failed_jobs));
    }
    let public_url = restored.manifest.as_ref().map(|m| m.public_url.clone()).unwrap_or_else(|| "<the same public URL as before>".into());
    text.push_str(&format!(
        "\nnext:\n\
         \x20 1. point {public_url}'s host name at this machine (if it moved)\n\
         \x20 2. start the control plane with the same public URL and this data dir (and your other flags as before):\n\
         \x20      cloudweb-server serve --data-dir {} --public-url {public_url}\n\
         \x20 3. agents reconnect by themselves (same CA and listener key): no node joins again, and apps kept serving\n\
         \x20 4. images in the cluster registry are not in the backup: deploy an app again before rolling it back\n",
        data_dir.display()
    ));
    text
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;
    use std::sync::Arc;
    use std::time::Duration;

    use cloudweb_api_types::backups::NewDestination;
    use cloudweb_core::backups::control_plane::RestoreError;
    use cloudweb_server::clock::SystemClock;
    use cloudweb_server::config::Config;
    use cloudweb_server::store::{AppRow, DeploymentRow, Store};

    use super::*;

    struct Backed {
        _tmp: tempfile::TempDir,
        root: PathBuf,
        repository: Repository,
        admin_token: String,
        deployment: String,
    }

    /// A control plane with an app whose deployment is queued, a path
    /// destination, and one control-plane backup there.
    async fn backed_up() -> Backed {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().to_path_buf();
        let opened = cloudweb_server::open_state(Config::local(root.join("old")), Arc::new(SystemClock)).await.unwrap();
        let state = opened.state;
        let app = AppRow {
            name: "web".into(),
            repo_url: "https://git.example.com/web.git".into(),
            branch: "main".into(),
            port: 8080,
            domains: "[]".into(),
            build: None,
            strategy: "auto".into(),
            instances: 1,
            cpu: None,
            memory_bytes: None,
            health_path: "/".into(),
            health_timeout_s: 30,
            build_timeout_s: None,
            env_sealed: None,
            git_credentials_sealed: None,
            created_at: 1,
            rollout: "blue-green".into(),
            liveness: None,
            readiness: None,
            team_id: "team_default".into(),
        };
        state.store.insert_app(&app, "web.localhost").await.unwrap().unwrap();
        let now = state.clock.now_ms();
        let deployment = DeploymentRow {
            id: "dep_inflight".into(),
            seq: 0,
            app: "web".into(),
            kind: "source".into(),
            commit_sha: None,
            rollback_of: None,
            state: "queued".into(),
            image: None,
            error: None,
            created_at: now,
            updated_at: now,
        };
        state.store.insert_deployment(&deployment, 1, false).await.unwrap();
        let new = NewDestination { name: "local".into(), kind: "path".into(), path: Some(root.join("repo").display().to_string()), ..NewDestination::default() };
        let (_, kit) = cloudweb_core::backups::add_destination(&state, &new, cloudweb_core::access::teams::DEFAULT_TEAM_ID).await.unwrap();
        let job = control_plane::run_now(&state).await.unwrap();
        let mut done = None;
        for _ in 0..600 {
            let row = state.store.backup_job(&job.id).await.unwrap().unwrap();
            if !matches!(row.state.as_str(), "queued" | "running") {
                done = Some(row);
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let done = done.expect("the backup ends");
        assert_eq!(done.state, "succeeded", "{done:?}");
        assert!(done.snapshot.is_some() && done.bytes.unwrap_or(0) > 0 && done.pruned == Some(true), "{done:?}");
        assert!(!root.join("old").join("control-plane-backup.tmp").exists(), "the staging dir is removed");
        let admin_token = std::fs::read_to_string(root.join("old").join(cloudweb_server::ADMIN_TOKEN_FILE)).unwrap();
        state.store.close().await;
        let repository = Repository { url: kit.control_plane_repository.clone(), password: kit.password.clone(), env: Default::default() };
        Backed { _tmp: tmp, root, repository, admin_token, deployment: deployment.id }
    }

    fn entries(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        names.sort();
        names
    }

    #[tokio::test]
    async fn a_backup_restores_into_a_new_data_dir_and_refuses_a_wrong_key_or_a_cluster() {
        let backed = backed_up().await;
        let root = &backed.root;
        let target = root.join("new").join("data");
        let cache = root.join("cache");
        let now = time::OffsetDateTime::now_utc();

        // A wrong key: refused before anything is created.
        let before = entries(root);
        let wrong = RestoreRequest {
            repository: Repository { password: "not the key".into(), ..backed.repository.clone() },
            data_dir: target.clone(),
            snapshot: None,
        };
        let err = control_plane::restore(&wrong, &cache, now).await.unwrap_err();
        assert!(matches!(err, RestoreError::WrongKey(_)), "{err}");
        assert!(err.to_string().contains("nothing was written"), "{err}");
        assert!(!root.join("new").exists(), "nothing was created");
        assert_eq!(entries(root).into_iter().filter(|n| n != "cache").collect::<Vec<_>>(), before.into_iter().filter(|n| n != "cache").collect::<Vec<_>>());

        // A data dir that holds a cluster: refused, untouched.
        let err = control_plane::restore(&RestoreRequest { data_dir: root.join("old"), ..wrong.clone() }, &cache, now).await.unwrap_err();
        assert!(matches!(err, RestoreError::DataDirInUse { .. }), "{err}");
        let err = control_plane::restore(&RestoreRequest { data_dir: root.join("old"), repository: backed.repository.clone(), snapshot: None }, &cache, now).await.unwrap_err();
        assert!(err.to_string().contains("refusing to overwrite"), "{err}");

        // A snapshot that is not there.
        let missing = RestoreRequest { repository: backed.repository.clone(), data_dir: target.clone(), snapshot: Some("ffffffff".into()) };
        assert!(matches!(control_plane::restore(&missing, &cache, now).await.unwrap_err(), RestoreError::NoSnapshot(..)));
        assert!(!target.exists());

        // The right key: the data dir comes back, private, and opens.
        let good = RestoreRequest { repository: backed.repository.clone(), data_dir: target.clone(), snapshot: None };
        let restored = control_plane::restore(&good, &cache, now).await.unwrap();
        assert!(restored.age < Duration::from_secs(300), "{:?}", restored.age);
        assert_eq!(restored.failed_deployments, vec![backed.deployment.clone()]);
        assert_eq!(restored.manifest.as_ref().unwrap().public_url, "https://127.0.0.1:8443");
        for name in ["state.db", "ca.crt", "ca.key", "listener.crt", "listener.key", "master.key", "admin-token"] {
            let meta = std::fs::metadata(target.join(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(meta.permissions().mode() & 0o777, 0o600, "{name}");
        }
        assert_eq!(std::fs::metadata(&target).unwrap().permissions().mode() & 0o777, 0o700);
        assert!(!target.join(control_plane::MANIFEST_FILE).exists());
        for name in ["ca.crt", "ca.key", "listener.key", "master.key", "admin-token"] {
            assert_eq!(std::fs::read(target.join(name)).unwrap(), std::fs::read(root.join("old").join(name)).unwrap(), "{name}");
        }
        assert_eq!(std::fs::read_to_string(target.join("admin-token")).unwrap(), backed.admin_token);
        assert_eq!(entries(&root.join("new")), vec!["data".to_string()], "no staging dir is left beside it");
        let store = Store::open(&target, "test").await.unwrap();
        let deployment = store.deployment(&backed.deployment).await.unwrap().unwrap();
        assert_eq!(deployment.state, "failed");
        assert!(deployment.error.as_deref().unwrap().contains("restored from a backup"), "{deployment:?}");
        assert_eq!(store.apps().await.unwrap().len(), 1);
        let own = store.backup_jobs_of("control-plane", Some("backup"), 5).await.unwrap();
        assert_eq!(own.len(), 1, "{own:?}");
        assert_eq!((own[0].state.as_str(), own[0].snapshot.as_deref()), ("succeeded", Some(restored.snapshot.id.as_str())), "the backup that made the snapshot ended well in it");
        store.close().await;
        let text = report(&restored, &target);
        assert!(text.contains("old") && text.contains("--public-url https://127.0.0.1:8443"), "{text}");

        // Once restored, the same data dir is refused.
        let err = control_plane::restore(&good, &cache, now).await.unwrap_err();
        assert!(matches!(err, RestoreError::DataDirInUse { .. }), "{err}");
        // The restored control plane starts on it.
        let opened = cloudweb_server::open_state(Config::local(target.clone()), Arc::new(SystemClock)).await.unwrap();
        assert_eq!(opened.state.ca.cert_pem(), std::fs::read_to_string(root.join("old").join("ca.crt")).unwrap());
    }
}
