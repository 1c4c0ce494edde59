//! `cloudweb backups`: destinations (with the recovery kit, shown once),
//! plans, backups on demand, verification, restores.

use std::time::{Duration, Instant};

use clap::Subcommand;
use cloudweb_api_types::backups::{
    BackupJobView, BackupList, BackupOverview, BackupPlanView, DestinationCreated, DestinationList, NewDestination, RestoreBackup, SetBackupPlan,
};
use reqwest::Method;
use serde_json::json;

use crate::client::{segment, Api};
use crate::render::{self, cell, clean, table};
use crate::Failure;

#[derive(Subcommand)]
pub enum BackupsCommand {
    /// Every service's and volume's last backup, and what needs attention.
    Status,
    /// Where backups go.
    #[command(subcommand)]
    Destinations(DestinationsCommand),
    /// A service's or volume's backups, verifications and restores, newest
    /// first, with its plan.
    #[command(visible_alias = "ls")]
    List {
        /// A service's or volume's name.
        name: String,
        #[command(flatten)]
        which: Which,
    },
    /// Back up now. Waits until it ends unless --no-wait.
    Run {
        name: String,
        #[command(flatten)]
        which: Which,
        #[arg(long)]
        no_wait: bool,
    },
    /// Change when and where a service or volume is backed up.
    Plan {
        name: String,
        #[command(flatten)]
        which: Which,
        /// Cron, five fields, UTC (e.g. "17 3 * * *"), or @daily/@hourly.
        #[arg(long)]
        schedule: Option<String>,
        /// When the newest backup is verified by restoring it.
        #[arg(long)]
        verify_schedule: Option<String>,
        #[arg(long)]
        destination: Option<String>,
        /// Volumes: pause the containers that mount it for the snapshot.
        #[arg(long, conflicts_with = "no_pause")]
        pause: bool,
        #[arg(long)]
        no_pause: bool,
        #[arg(long, conflicts_with = "disable")]
        enable: bool,
        /// No scheduled backups (on-demand ones still work).
        #[arg(long)]
        disable: bool,
        /// Back to every default.
        #[arg(long)]
        reset: bool,
    },
    /// Check a backup by restoring it into a throwaway place. Waits unless
    /// --no-wait.
    Verify {
        /// The backup's job id (bj_…), or the service's or volume's name for
        /// its newest backup.
        backup: String,
        #[arg(long)]
        no_wait: bool,
    },
    /// Restore a backup: into the same service or volume (the data it
    /// replaces is kept as NAME-before-restore-TIME until confirm-restore
    /// or for the keep period), or with --to into a new one.
    Restore {
        name: String,
        #[command(flatten)]
        which: Which,
        /// The restic snapshot id (or a prefix of it), or the backup's job id;
        /// the newest backup when left out.
        #[arg(long)]
        snapshot: Option<String>,
        /// A new service (or volume) to restore into instead.
        #[arg(long)]
        to: Option<String>,
        /// With --to: the node it goes on.
        #[arg(long)]
        node: Option<String>,
        #[arg(long)]
        no_wait: bool,
    },
    /// Delete the data a restore replaced (kept until now).
    ConfirmRestore { job: String },
    /// One job.
    Show { job: String },
    /// Back up the control plane itself now (its state, CA and keys, to
    /// every destination). Waits until the first destination's ends
    /// unless --no-wait.
    ControlPlane {
        #[arg(long)]
        no_wait: bool,
    },
}

#[derive(clap::Args, Default)]
pub struct Which {
    /// NAME is a service (when a volume has the same name).
    #[arg(long, conflicts_with = "volume")]
    service: bool,
    /// NAME is a volume.
    #[arg(long)]
    volume: bool,
}

#[derive(Subcommand)]
// Parsed once per run: the size of the add variant costs nothing.
#[allow(clippy::large_enum_variant)]
pub enum DestinationsCommand {
    /// Every destination (no secrets).
    #[command(visible_alias = "ls")]
    List,
    /// Add a destination. Its repositories are created there now, and the
    /// recovery kit (repositories and password) is printed once: keep it.
    Add {
        name: String,
        /// An S3-compatible endpoint, https://host[:port].
        #[arg(long, conflicts_with = "path", requires_all = ["bucket", "access_key_id"])]
        s3_endpoint: Option<String>,
        #[arg(long)]
        bucket: Option<String>,
        /// Where in the bucket.
        #[arg(long)]
        prefix: Option<String>,
        #[arg(long)]
        region: Option<String>,
        #[arg(long)]
        access_key_id: Option<String>,
        /// A file holding the secret key (else AWS_SECRET_ACCESS_KEY; never
        /// on the command line).
        #[arg(long, value_name = "FILE")]
        secret_access_key_file: Option<std::path::PathBuf>,
        /// A directory (seen at the same path by every node).
        #[arg(long)]
        path: Option<String>,
        #[arg(long)]
        keep_daily: Option<u32>,
        #[arg(long)]
        keep_weekly: Option<u32>,
        #[arg(long)]
        keep_monthly: Option<u32>,
        /// Also write the recovery kit to this file (mode 0600).
        #[arg(long, value_name = "FILE")]
        kit_file: Option<std::path::PathBuf>,
    },
    /// Forget a destination (nothing there is deleted).
    Rm { name: String },
}

const WAIT_LIMIT: Duration = Duration::from_secs(6 * 3600);

fn kind_of(which: &Which) -> Option<&'static str> {
    if which.service {
        Some("service")
    } else if which.volume {
        Some("volume")
    } else {
        None
    }
}

/// The list of `name`: a service's, else a volume's.
async fn list_of(api: &Api, name: &str, which: &Which) -> Result<BackupList, Failure> {
    let kinds: &[&str] = match kind_of(which) {
        Some("service") => &["services"],
        Some(_) => &["volumes"],
        None => &["services", "volumes"],
    };
    let mut last = None;
    for kind in kinds {
        match api.get::<BackupList>(&format!("/api/{kind}/{}/backups", segment(name))).await {
            Ok(list) => return Ok(list),
            Err(err) => last = Some(err),
        }
    }
    Err(last.unwrap_or_else(|| Failure::Action(format!("no service or volume named {name}"))))
}

fn collection(plan: &BackupPlanView) -> &'static str {
    if plan.target.starts_with("service/") {
        "services"
    } else {
        "volumes"
    }
}

fn rows(jobs: &[BackupJobView]) -> Vec<Vec<String>> {
    jobs.iter()
        .map(|j| {
            let verified = j.verification.as_ref().map(|v| v.state.clone());
            vec![
                cell(&j.id),
                cell(&j.kind),
                cell(&j.state),
                cell(&j.snapshot),
                render::bytes(j.bytes.map(|b| b.max(0) as u64)),
                j.duration_ms.map(|ms| format!("{:.1}s", ms as f64 / 1000.0)).unwrap_or_else(|| "-".into()),
                cell(&verified),
                cell(&j.created_at),
                cell(&j.message.clone().or(j.detail.clone())),
            ]
        })
        .collect()
}

const HEADER: [&str; 9] = ["JOB", "KIND", "STATE", "SNAPSHOT", "SIZE", "TOOK", "VERIFIED", "CREATED", "NOTE"];

async fn wait(api: &Api, id: &str) -> Result<BackupJobView, Failure> {
    let start = Instant::now();
    loop {
        let job: BackupJobView = api.get(&format!("/api/backups/{}", segment(id))).await?;
        if !matches!(job.state.as_str(), "queued" | "running") && job.kept_state.as_deref() != Some("settling") {
            return Ok(job);
        }
        if start.elapsed() > WAIT_LIMIT {
            return Err(Failure::Action(format!("gave up waiting for {id} ({})", job.state)));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Prints the job (or its JSON); a job that did not succeed is a failure.
fn finish(job: &BackupJobView, json: bool, waited: bool) -> Result<(), Failure> {
    if json {
        render::json(job);
    } else {
        table(&HEADER, &rows(std::slice::from_ref(job)));
    }
    if waited && job.state != "succeeded" {
        return Err(Failure::Action(format!("{} {} {}: {}", job.kind, clean(&job.id), job.state, clean(job.message.as_deref().unwrap_or("no reason given")))));
    }
    Ok(())
}

fn secret_key(file: Option<&std::path::Path>) -> Result<Option<String>, Failure> {
    match file {
        Some(path) => std::fs::read_to_string(path)
            .map(|s| Some(s.trim().to_string()))
            .map_err(|e| Failure::Usage(format!("cannot read {}: {e}", path.display()))),
        None => Ok(std::env::var("AWS_SECRET_ACCESS_KEY").ok().filter(|s| !s.is_empty())),
    }
}

fn write_kit(path: &std::path::Path, text: &str) -> Result<(), Failure> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| Failure::Action(format!("cannot write the recovery kit to {}: {e}", path.display())))?;
    file.write_all(text.as_bytes()).map_err(|e| Failure::Action(format!("cannot write the recovery kit to {}: {e}", path.display())))
}

pub async fn run(api: &Api, command: BackupsCommand, json: bool) -> Result<(), Failure> {
    match command {
        BackupsCommand::Status => {
            let overview: BackupOverview = api.get("/api/backups").await?;
            if json {
                render::json(&overview);
                return Ok(());
            }
            if overview.destinations == 0 {
                println!("no backup destination: add one with `cloudweb backups destinations add`");
            }
            let rows: Vec<Vec<String>> = overview
                .targets
                .iter()
                .map(|t| vec![cell(&t.target), cell(&t.last_state), cell(&t.last_success_at), render::bytes(t.last_bytes.map(|b| b.max(0) as u64)), cell(&t.alert)])
                .collect();
            table(&["TARGET", "LAST", "LAST SUCCESS", "SIZE", "ATTENTION"], &rows);
        }
        BackupsCommand::Destinations(DestinationsCommand::List) => {
            let list: DestinationList = api.get("/api/backup-destinations").await?;
            if json {
                render::json(&list.destinations);
            } else {
                let rows: Vec<Vec<String>> = list
                    .destinations
                    .iter()
                    .map(|d| {
                        let keep = format!("{}d/{}w/{}m", d.keep_daily, d.keep_weekly, d.keep_monthly);
                        vec![cell(&d.name), cell(&d.kind), cell(&d.repository), keep, if d.default { "yes".into() } else { "-".into() }]
                    })
                    .collect();
                table(&["DESTINATION", "KIND", "REPOSITORY", "KEEP", "DEFAULT"], &rows);
            }
        }
        BackupsCommand::Destinations(DestinationsCommand::Add {
            name,
            s3_endpoint,
            bucket,
            prefix,
            region,
            access_key_id,
            secret_access_key_file,
            path,
            keep_daily,
            keep_weekly,
            keep_monthly,
            kit_file,
        }) => {
            let kind = match (&s3_endpoint, &path) {
                (Some(_), None) => "s3",
                (None, Some(_)) => "path",
                _ => return Err(Failure::Usage("give either --s3-endpoint (with --bucket and --access-key-id) or --path".into())),
            };
            let secret_access_key = if kind == "s3" {
                Some(secret_key(secret_access_key_file.as_deref())?.ok_or_else(|| {
                    Failure::Usage("the S3 secret key comes from --secret-access-key-file or AWS_SECRET_ACCESS_KEY".into())
                })?)
            } else {
                None
            };
            let body = NewDestination {
                name,
                kind: kind.into(),
                endpoint: s3_endpoint,
                bucket,
                prefix,
                region,
                access_key_id,
                secret_access_key,
                path,
                keep_daily,
                keep_weekly,
                keep_monthly,
            };
            let created: DestinationCreated = api.call(Method::POST, "/api/backup-destinations", Some(&body)).await?;
            if let Some(file) = &kit_file {
                write_kit(file, &created.recovery_kit.text)?;
            }
            if json {
                render::json(&created);
            } else {
                println!("{}", created.recovery_kit.text);
                if let Some(file) = &kit_file {
                    println!("(also written to {})", file.display());
                }
            }
        }
        BackupsCommand::Destinations(DestinationsCommand::Rm { name }) => {
            api.delete(&format!("/api/backup-destinations/{}", segment(&name))).await?;
            if json {
                render::json(&json!({"removed": name}));
            } else {
                println!("destination {} forgotten; its repositories and snapshots stay where they are", clean(&name));
            }
        }
        BackupsCommand::List { name, which } => {
            let list = list_of(api, &name, &which).await?;
            if json {
                render::json(&list);
                return Ok(());
            }
            let plan = &list.plan;
            println!(
                "{}: {} to {}, schedule {} (next {}), verified {} (next {}){}",
                clean(&plan.target),
                if plan.enabled { "backed up" } else { "not backed up on schedule" },
                cell(&plan.destination),
                clean(&plan.schedule),
                cell(&plan.next_run_at),
                clean(&plan.verify_schedule),
                cell(&plan.next_verify_at),
                if plan.pause { ", paused for each snapshot" } else { "" }
            );
            table(&HEADER, &rows(&list.jobs));
        }
        BackupsCommand::Run { name, which, no_wait } => {
            let list = list_of(api, &name, &which).await?;
            let path = format!("/api/{}/{}/backups", collection(&list.plan), segment(&name));
            let job: BackupJobView = api.post(&path).await?;
            let job = if no_wait { job } else { wait(api, &job.id).await? };
            finish(&job, json, !no_wait)?;
        }
        BackupsCommand::Plan { name, which, schedule, verify_schedule, destination, pause, no_pause, enable, disable, reset } => {
            let list = list_of(api, &name, &which).await?;
            let body = SetBackupPlan {
                destination,
                schedule,
                verify_schedule,
                pause: if pause { Some(true) } else if no_pause { Some(false) } else { None },
                enabled: if enable { Some(true) } else if disable { Some(false) } else { None },
                reset,
            };
            let path = format!("/api/{}/{}/backup-plan", collection(&list.plan), segment(&name));
            let plan: BackupPlanView = api.call(Method::PUT, &path, Some(&body)).await?;
            if json {
                render::json(&plan);
            } else {
                println!("{}: schedule {} (next {}), verify {}, destination {}{}", clean(&plan.target), clean(&plan.schedule), cell(&plan.next_run_at), clean(&plan.verify_schedule), cell(&plan.destination), if plan.enabled { "" } else { ", scheduled backups off" });
            }
        }
        BackupsCommand::Verify { backup, no_wait } => {
            let id = if backup.starts_with("bj_") {
                backup
            } else {
                let list = list_of(api, &backup, &Which::default()).await?;
                list.jobs.iter().find(|j| j.kind == "backup" && j.state == "succeeded").map(|j| j.id.clone()).ok_or_else(|| Failure::Action(format!("{} has no successful backup", clean(&backup))))?
            };
            let job: BackupJobView = api.post(&format!("/api/backups/{}/verify", segment(&id))).await?;
            let job = if no_wait { job } else { wait(api, &job.id).await? };
            finish(&job, json, !no_wait)?;
        }
        BackupsCommand::Restore { name, which, snapshot, to, node, no_wait } => {
            let list = list_of(api, &name, &which).await?;
            let good = list.jobs.iter().filter(|j| j.kind == "backup" && j.state == "succeeded");
            let backup = match &snapshot {
                Some(wanted) => good
                    .filter(|j| j.id == *wanted || j.snapshot.as_deref().is_some_and(|s| s.starts_with(wanted.as_str()) || wanted.starts_with(s)))
                    .max_by_key(|j| j.created_at.clone()),
                None => good.max_by_key(|j| j.created_at.clone()),
            }
            .ok_or_else(|| Failure::Action(format!("no successful backup of {}{}", clean(&name), snapshot.as_deref().map(|s| format!(" with snapshot {}", clean(s))).unwrap_or_default())))?;
            let body = RestoreBackup { to, node };
            let job: BackupJobView = api.call(Method::POST, &format!("/api/backups/{}/restore", segment(&backup.id)), Some(&body)).await?;
            let job = if no_wait { job } else { wait(api, &job.id).await? };
            finish(&job, json, !no_wait)?;
            if !json && job.state == "succeeded" {
                if let (Some(kept), Some("kept")) = (&job.kept_volume, job.kept_state.as_deref()) {
                    println!("the data it replaced is kept as volume {} until {}; `cloudweb backups confirm-restore {}` deletes it now", clean(kept), cell(&job.keep_until), clean(&job.id));
                }
            }
        }
        BackupsCommand::ConfirmRestore { job } => {
            let view: BackupJobView = api.post(&format!("/api/backups/{}/confirm", segment(&job))).await?;
            if json {
                render::json(&view);
            } else {
                println!("the data restore {} replaced ({}) is being deleted", clean(&view.id), cell(&view.kept_volume));
            }
        }
        BackupsCommand::ControlPlane { no_wait } => {
            let job: BackupJobView = api.post("/api/control-plane/backups").await?;
            let job = if no_wait { job } else { wait(api, &job.id).await? };
            finish(&job, json, !no_wait)?;
        }
        BackupsCommand::Show { job } => {
            let view: BackupJobView = api.get(&format!("/api/backups/{}", segment(&job))).await?;
            finish(&view, json, false)?;
        }
    }
    Ok(())
}
