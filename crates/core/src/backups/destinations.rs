//! Backup destinations: checked, initialized (both repositories, with
//! restic from the control plane), sealed, and listed without secrets.

use std::time::Duration;

use cloudweb_api_types::backups::{DestinationView, NewDestination, RecoveryKit};
use cloudweb_restic::{Restic, ResticError};

use super::{repository, secret_context};
use crate::error::ApiError;
use crate::store::{DestinationRemoval, DestinationRow};
use crate::AppState;

/// How long `restic init` of a new destination may take.
const INIT_LIMIT: Duration = Duration::from_secs(30);
/// Whether the S3 endpoint takes a TCP connection at all: an answer in
/// seconds, rather than after restic's retries.
async fn reachable(endpoint: &str) -> Result<(), ApiError> {
    crate::s3::reachable(endpoint).await.map_err(|e| ApiError::BadGateway(format!("the destination did not answer: {e}")))
}

fn bad(text: impl Into<String>) -> ApiError {
    ApiError::BadRequest(text.into())
}

fn bucket(value: &str) -> Result<(), ApiError> {
    crate::s3::bucket(value).map_err(bad)
}

fn plain_path(field: &str, value: &str) -> Result<(), ApiError> {
    crate::s3::plain_path(field, value).map_err(bad)
}

/// A new destination's restic URL base, region, key id and secret.
type Base = (String, Option<String>, Option<String>, Option<String>);

/// The restic URL base of a new destination, its region and its keys.
fn base_of(new: &NewDestination) -> Result<Base, ApiError> {
    match new.kind.as_str() {
        "s3" => {
            let endpoint = new.endpoint.as_deref().ok_or_else(|| bad("an s3 destination needs endpoint"))?;
            let (scheme, host) = crate::s3::endpoint(endpoint).map_err(bad)?;
            let bucket_name = new.bucket.as_deref().ok_or_else(|| bad("an s3 destination needs bucket"))?;
            bucket(bucket_name)?;
            let mut base = format!("s3:{scheme}://{host}/{bucket_name}");
            if let Some(prefix) = new.prefix.as_deref().map(|p| p.trim_matches('/')).filter(|p| !p.is_empty()) {
                plain_path("prefix", prefix)?;
                base = format!("{base}/{prefix}");
            }
            let key_id = new.access_key_id.clone().filter(|k| !k.is_empty()).ok_or_else(|| bad("an s3 destination needs access_key_id"))?;
            let secret = new.secret_access_key.clone().filter(|k| !k.is_empty()).ok_or_else(|| bad("an s3 destination needs secret_access_key"))?;
            for (field, value) in [("access_key_id", &key_id), ("secret_access_key", &secret)] {
                if value.len() > 256 || value.chars().any(|c| c.is_control() || c.is_whitespace()) {
                    return Err(bad(format!("{field} must be at most 256 characters without spaces")));
                }
            }
            let region = new.region.clone().unwrap_or_else(|| "us-east-1".into());
            crate::s3::region(&region).map_err(bad)?;
            if new.path.is_some() {
                return Err(bad("path is for path destinations"));
            }
            Ok((base, Some(region), Some(key_id), Some(secret)))
        }
        "path" => {
            let path = new.path.as_deref().ok_or_else(|| bad("a path destination needs path"))?;
            let rest = path.strip_prefix('/').ok_or_else(|| bad("path must be absolute"))?;
            plain_path("path", rest.trim_end_matches('/'))?;
            if new.endpoint.is_some() || new.bucket.is_some() || new.access_key_id.is_some() || new.secret_access_key.is_some() {
                return Err(bad("endpoint, bucket and keys are for s3 destinations"));
            }
            Ok((path.trim_end_matches('/').to_string(), None, None, None))
        }
        other => Err(bad(format!("kind must be s3 or path, not {other:?}"))),
    }
}

/// The recovery key: 32 random bytes as 64 hex digits.
fn recovery_key() -> String {
    use rand::Rng;
    let bytes: [u8; 32] = rand::rng().random();
    hex::encode(bytes)
}

fn kit(destination: &DestinationRow, password: &str) -> RecoveryKit {
    let data = format!("{}/data", destination.base_url);
    let control = format!("{}/control-plane", destination.base_url);
    let environment: Vec<String> =
        if destination.kind == "s3" { vec!["AWS_ACCESS_KEY_ID".into(), "AWS_SECRET_ACCESS_KEY".into(), "AWS_DEFAULT_REGION".into()] } else { Vec::new() };
    let mut text = format!(
        "cloud-web recovery kit: backup destination {name}\n\
         Keep this somewhere safe and away from the cluster. It is shown once.\n\n\
         Recovery key (the password of both repositories):\n    {password}\n\n\
         Volumes and services:  {data}\n\
         The control plane:     {control}\n\n",
        name = destination.name,
    );
    if destination.kind == "s3" {
        text.push_str(&format!(
            "Credentials: the access key {} and its secret, region {}.\n\n",
            destination.access_key_id.as_deref().unwrap_or_default(),
            destination.region.as_deref().unwrap_or("us-east-1")
        ));
    }
    text.push_str(&format!(
        "Without cloud-web, with plain restic:\n\
         \x20   export RESTIC_PASSWORD='{password}'\n{creds}\
         \x20   restic -r {data} snapshots --tag target=service/NAME\n\
         \x20   restic -r {data} dump latest /dump.pgdump --tag target=service/NAME > db.pgdump\n\
         \x20   restic -r {data} restore latest --tag target=volume/NAME --target ./NAME\n\n\
         A new control plane from its last backup:\n\
         \x20   cloudweb-server restore --from {control} --recovery-key-file KEY --data-dir /var/lib/cloudweb\n",
        creds = if destination.kind == "s3" { "    export AWS_ACCESS_KEY_ID=... AWS_SECRET_ACCESS_KEY=...\n" } else { "" },
    ));
    RecoveryKit { destination: destination.name.clone(), repository: data, control_plane_repository: control, password: password.to_string(), environment, text }
}

pub fn destination_view(destination: &DestinationRow, default: bool) -> DestinationView {
    let keep = |v: i64| u32::try_from(v.max(0)).unwrap_or(u32::MAX);
    DestinationView {
        name: destination.name.clone(),
        kind: destination.kind.clone(),
        repository: format!("{}/data", destination.base_url),
        control_plane_repository: format!("{}/control-plane", destination.base_url),
        region: destination.region.clone(),
        access_key_id: destination.access_key_id.clone(),
        keep_daily: keep(destination.keep_daily),
        keep_weekly: keep(destination.keep_weekly),
        keep_monthly: keep(destination.keep_monthly),
        default,
        created_at: crate::clock::rfc3339_ms(destination.created_at),
    }
}

pub async fn destinations(state: &AppState) -> Result<Vec<DestinationView>, ApiError> {
    let rows = state.store.destinations().await?;
    Ok(rows.iter().enumerate().map(|(i, d)| destination_view(d, i == 0)).collect())
}

fn init_error(which: &str, err: ResticError) -> ApiError {
    match err {
        ResticError::AlreadyInitialized => ApiError::Conflict(format!(
            "a restic repository exists at the destination's {which} already; cloud-web makes its own: choose an empty path or prefix"
        )),
        ResticError::NotInstalled(text) => ApiError::Unavailable(format!("the control plane cannot run restic: {text}")),
        err if err.is_transient() => ApiError::BadGateway(format!("the destination did not answer: {err}")),
        err => ApiError::BadGateway(format!("the destination refused: {err}")),
    }
}

/// Adds a destination: both repositories are created there first, so a
/// destination cloud-web cannot write to is never recorded. Returns the
/// recovery kit, which is never shown again.
pub async fn add_destination(state: &AppState, new: &NewDestination, team_id: &str) -> Result<(DestinationView, RecoveryKit), ApiError> {
    cloudweb_protocol::validate::node_name("name", &new.name).map_err(|e| bad(e.to_string()))?;
    let (base, region, key_id, secret) = base_of(new)?;
    let retention = cloudweb_protocol::Retention {
        keep_daily: new.keep_daily.unwrap_or(7),
        keep_weekly: new.keep_weekly.unwrap_or(4),
        keep_monthly: new.keep_monthly.unwrap_or(6),
    };
    retention.validate().map_err(|e| bad(e.to_string()))?;
    if state.store.destination(&new.name).await?.is_some() {
        return Err(ApiError::Conflict(format!("a backup destination named {} exists already", new.name)));
    }
    if let Some(endpoint) = new.endpoint.as_deref().filter(|_| new.kind == "s3") {
        reachable(endpoint).await?;
    }
    let password = recovery_key();
    let row = DestinationRow {
        name: new.name.clone(),
        kind: new.kind.clone(),
        base_url: base,
        region,
        access_key_id: key_id,
        secret_sealed: secret.as_ref().map(|s| state.sealer.seal(&secret_context(&new.name, "secret"), s.as_bytes())),
        password_sealed: state.sealer.seal(&secret_context(&new.name, "password"), password.as_bytes()),
        keep_daily: i64::from(retention.keep_daily),
        keep_weekly: i64::from(retention.keep_weekly),
        keep_monthly: i64::from(retention.keep_monthly),
        created_at: state.clock.now_ms(),
        team_id: team_id.to_string(),
    };
    for which in ["data", "control-plane"] {
        let repo = repository(state, &row, which)?;
        cloudweb_protocol::backups::repository_url(&repo.url).map_err(|e| bad(e.to_string()))?;
        let restic = Restic::new(repo, &super::cache_dir(state));
        if let Err(err) = restic.init(INIT_LIMIT).await {
            tracing::warn!(destination = %new.name, which, error = %err, "backup destination refused");
            return Err(init_error(which, err));
        }
    }
    if !state.store.insert_destination(&row).await? {
        return Err(ApiError::Conflict(format!("a backup destination named {} exists already", new.name)));
    }
    let first = state.store.destinations().await?.first().is_some_and(|d| d.name == row.name);
    tracing::info!(destination = %row.name, kind = %row.kind, repository = %format!("{}/data", row.base_url), "backup destination added");
    Ok((destination_view(&row, first), kit(&row, &password)))
}

/// Forgets a destination (its repositories and their snapshots stay where
/// they are).
pub async fn remove_destination(state: &AppState, name: &str) -> Result<(), ApiError> {
    match state.store.delete_destination(name).await? {
        DestinationRemoval::Removed => {
            tracing::info!(destination = %name, "backup destination removed from cloud-web; its data stays at the destination");
            Ok(())
        }
        DestinationRemoval::NotFound => Err(ApiError::NotFound(format!("no backup destination named {name}"))),
        DestinationRemoval::InUse(targets) => Err(ApiError::Conflict(format!(
            "backup destination {name} is named by the plans of {}; change them first",
            targets.join(", ")
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s3() -> NewDestination {
        NewDestination {
            name: "offsite".into(),
            kind: "s3".into(),
            endpoint: Some("https://s3.example.com".into()),
            bucket: Some("backups".into()),
            prefix: Some("/prod/cluster/".into()),
            access_key_id: Some("AKID".into()),
            secret_access_key: Some("secret".into()),
            ..NewDestination::default()
        }
    }

    #[test]
    fn destinations_are_checked() {
        let (base, region, _, _) = base_of(&s3()).unwrap();
        assert_eq!(base, "s3:https://s3.example.com/backups/prod/cluster");
        assert_eq!(region.as_deref(), Some("us-east-1"));
        let with_port = NewDestination { endpoint: Some("http://10.0.0.5:9000".into()), prefix: None, ..s3() };
        assert_eq!(base_of(&with_port).unwrap().0, "s3:http://10.0.0.5:9000/backups");
        for bad in [
            NewDestination { endpoint: Some("ftp://x".into()), ..s3() },
            NewDestination { endpoint: Some("https://h/path".into()), ..s3() },
            NewDestination { bucket: Some("UPPER".into()), ..s3() },
            NewDestination { prefix: Some("a/../b".into()), ..s3() },
            NewDestination { secret_access_key: None, ..s3() },
            NewDestination { kind: "sftp".into(), ..s3() },
            NewDestination { kind: "path".into(), path: Some("relative".into()), ..NewDestination::default() },
            NewDestination { kind: "path".into(), path: Some("/a b".into()), ..NewDestination::default() },
        ] {
            assert!(base_of(&bad).is_err(), "{bad:?}");
        }
        let path = NewDestination { kind: "path".into(), path: Some("/srv/backups/".into()), ..NewDestination::default() };
        assert_eq!(base_of(&path).unwrap().0, "/srv/backups");
    }
}
