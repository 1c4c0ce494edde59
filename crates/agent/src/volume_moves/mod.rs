//! Moving a volume to another node (see `cloudweb_protocol::volume_moves`
//! for the sequence). This node may be either end: the target listens on
//! its mesh address and writes into `<data>/volumes/.incoming/<move id>`
//! until the copy is checked; the source copies twice (live, then with the
//! volume's containers stopped) and keeps its data, set aside in
//! `<data>/volumes/.moved/<name>.<move id>` once the control plane has
//! switched, until it is told to purge it.
//!
//! Every outcome is reported to `POST /agent/v1/volume-moves/{id}`; the
//! commands themselves are acked once handled, whatever the outcome.

mod receive;
mod send;
mod stream;
mod tree;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use cloudweb_protocol::{MoveReport, MoveReportState, VolumeMoveStep, VolumeReceivePayload, VolumeSendPayload};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::client::ControlPlane;
use crate::runtime::DockerRuntime;
use crate::volumes::VOLUMES_DIR;

/// What became of a move command.
#[derive(Debug, PartialEq, Eq)]
pub enum Step {
    Done,
    /// Try again later (the command stays queued).
    Retry(String),
}

/// What this node did for a move, kept on disk so an abort after an agent
/// restart still undoes it.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Record {
    /// Containers the source stopped for the last pass.
    #[serde(default)]
    stopped: Vec<String>,
    /// The target put the copy in place as this volume.
    #[serde(default)]
    committed: Option<String>,
}

#[derive(Clone)]
pub struct Moves {
    inner: Arc<Inner>,
}

struct Inner {
    runtime: DockerRuntime,
    data_dir: PathBuf,
    /// Moves this node is receiving now, and how to stop each.
    receiving: Mutex<HashMap<String, watch::Sender<bool>>>,
}

impl Moves {
    pub fn new(runtime: DockerRuntime, data_dir: &Path) -> Moves {
        Moves { inner: Arc::new(Inner { runtime, data_dir: data_dir.to_path_buf(), receiving: Mutex::new(HashMap::new()) }) }
    }

    fn volume_dir(&self, name: &str) -> PathBuf {
        crate::volumes::dir(&self.inner.data_dir, name)
    }

    fn staging(&self, move_id: &str) -> PathBuf {
        self.inner.data_dir.join(VOLUMES_DIR).join(".incoming").join(move_id)
    }

    fn kept(&self, name: &str, move_id: &str) -> PathBuf {
        self.inner.data_dir.join(VOLUMES_DIR).join(".moved").join(format!("{name}.{move_id}"))
    }

    fn record_path(&self, move_id: &str) -> PathBuf {
        self.inner.data_dir.join("volume-moves").join(format!("{move_id}.json"))
    }

    fn record(&self, move_id: &str) -> Record {
        std::fs::read(self.record_path(move_id)).ok().and_then(|b| serde_json::from_slice(&b).ok()).unwrap_or_default()
    }

    fn save_record(&self, move_id: &str, record: &Record) -> Result<(), String> {
        let path = self.record_path(move_id);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        }
        let bytes = serde_json::to_vec(record).expect("record serializes");
        crate::files::write_private(&path, &bytes).map_err(|e| format!("cannot write {}: {e}", path.display()))
    }

    fn forget_record(&self, move_id: &str) {
        let _ = std::fs::remove_file(self.record_path(move_id));
    }

    /// `volume_receive`: listen, report the port, and serve both passes in
    /// the background.
    pub async fn receive(&self, client: &Arc<ControlPlane>, payload: VolumeReceivePayload) -> Step {
        if let Err(err) = payload.validate() {
            tracing::error!(error = %err, "invalid volume_receive payload; dropping it");
            return Step::Done;
        }
        if self.inner.receiving.lock().expect("moves lock").contains_key(&payload.move_id) {
            return Step::Done;
        }
        let listener = match tokio::net::TcpListener::bind((payload.listen.as_str(), 0)).await {
            Ok(listener) => listener,
            Err(err) => {
                let mut report = MoveReport::new(MoveReportState::Failed);
                report.message = Some(format!("the target cannot listen on its mesh address {}: {err}", payload.listen));
                return self.report_or_retry(client, &payload.move_id, report).await;
            }
        };
        let port = match listener.local_addr() {
            Ok(address) => address.port(),
            Err(err) => return Step::Retry(err.to_string()),
        };
        let (cancel, cancelled) = watch::channel(false);
        self.inner.receiving.lock().expect("moves lock").insert(payload.move_id.clone(), cancel);
        tracing::info!(move_id = %payload.move_id, volume = %payload.volume, port, from = %payload.from, "waiting for a volume's data");
        let (moves, task_client, task_payload) = (self.clone(), client.clone(), payload.clone());
        tokio::spawn(async move { moves.serve(&task_client, listener, task_payload, cancelled).await });
        let mut report = MoveReport::new(MoveReportState::Listening);
        report.port = Some(port);
        match self.report_or_retry(client, &payload.move_id, report).await {
            Step::Done => Step::Done,
            Step::Retry(reason) => {
                // Listen again when the command comes back.
                if let Some(cancel) = self.inner.receiving.lock().expect("moves lock").remove(&payload.move_id) {
                    let _ = cancel.send(true);
                }
                Step::Retry(reason)
            }
        }
    }

    async fn serve(&self, client: &ControlPlane, listener: tokio::net::TcpListener, payload: VolumeReceivePayload, cancelled: watch::Receiver<bool>) {
        let staging = self.staging(&payload.move_id);
        let volume_dir = self.volume_dir(&payload.volume);
        if let Some(parent) = staging.parent() {
            let _ = std::fs::create_dir_all(parent);
        }
        let started = std::time::Instant::now();
        let outcome = receive::serve(listener, &payload, &staging, &volume_dir, cancelled).await;
        let mut report = match outcome {
            Ok(result) => {
                let record = Record { committed: Some(payload.volume.clone()), ..Record::default() };
                if let Err(err) = self.save_record(&payload.move_id, &record) {
                    tracing::warn!(error = %err, "could not record the received volume");
                }
                tracing::info!(move_id = %payload.move_id, volume = %payload.volume, files = result.files, bytes = result.bytes, seconds = started.elapsed().as_secs_f64(), "volume received");
                let mut report = MoveReport::new(MoveReportState::Received);
                report.files = Some(result.files);
                report.bytes = Some(result.bytes);
                report.digest = Some(result.digest);
                report
            }
            Err(reason) => {
                let _ = std::fs::remove_dir_all(&staging);
                tracing::warn!(move_id = %payload.move_id, volume = %payload.volume, %reason, "volume move failed on the receiving side; partial copy removed");
                let mut report = MoveReport::new(MoveReportState::Failed);
                report.message = Some(format!("target: {reason}"));
                report
            }
        };
        self.inner.receiving.lock().expect("moves lock").remove(&payload.move_id);
        report.message = report.message.map(|m| cloudweb_protocol::misc::one_line(&m, cloudweb_protocol::misc::MAX_REPORT_MESSAGE));
        report_with_retries(client, &payload.move_id, &report).await;
    }

    /// `volume_send`: both passes, the containers stopped between them.
    pub async fn send(&self, client: &Arc<ControlPlane>, payload: VolumeSendPayload) -> Step {
        if let Err(err) = payload.validate() {
            tracing::error!(error = %err, "invalid volume_send payload; dropping it");
            return Step::Done;
        }
        let report = match self.send_both(&payload).await {
            Ok(report) => report,
            Err(reason) => {
                self.restart_stopped(&payload.move_id).await;
                tracing::warn!(move_id = %payload.move_id, volume = %payload.volume, %reason, "volume move failed on the sending side; the volume stays here");
                let mut report = MoveReport::new(MoveReportState::Failed);
                report.message = Some(cloudweb_protocol::misc::one_line(&format!("source: {reason}"), cloudweb_protocol::misc::MAX_REPORT_MESSAGE));
                report
            }
        };
        self.report_or_retry(client, &payload.move_id, report).await
    }

    async fn send_both(&self, payload: &VolumeSendPayload) -> Result<MoveReport, String> {
        let root = self.volume_dir(&payload.volume);
        match std::fs::symlink_metadata(&root) {
            Ok(meta) if meta.is_dir() => {}
            Ok(_) => return Err(format!("{} is not a directory", root.display())),
            Err(err) => return Err(format!("this node holds no data for volume {} ({}: {err})", payload.volume, root.display())),
        }
        let started = std::time::Instant::now();
        let mut sent = send::Sent::new();
        let first = send::pass(send::connect(&payload.to).await?, &root, &payload.move_id, &payload.grant, 1, &mut sent).await?;
        tracing::info!(move_id = %payload.move_id, files = first.files, bytes = first.bytes, seconds = started.elapsed().as_secs_f64(), "first pass sent (live)");
        // The last pass runs with the volume's containers stopped, so
        // nothing writes to it any more.
        let source = root.to_string_lossy().into_owned();
        let running = self.inner.runtime.running_mounting(&source).await.map_err(|e| format!("cannot list the volume's containers: {e}"))?;
        self.save_record(&payload.move_id, &Record { stopped: running.clone(), committed: None })?;
        let stopped_at_ms = crate::timestamp::now_ms();
        for id in &running {
            self.inner.runtime.stop_keep(id).await.map_err(|e| format!("cannot stop container {id}: {e}"))?;
        }
        let second_started = std::time::Instant::now();
        let second = send::pass(send::connect(&payload.to).await?, &root, &payload.move_id, &payload.grant, 2, &mut sent).await?;
        tracing::info!(
            move_id = %payload.move_id, files = second.files, bytes = second.bytes, stopped = running.len(),
            seconds = second_started.elapsed().as_secs_f64(), "last pass sent (containers stopped)"
        );
        let mut report = MoveReport::new(MoveReportState::Sent);
        report.files = Some(second.files);
        report.bytes = Some(first.bytes + second.bytes);
        report.digest = Some(second.digest);
        report.stopped_at_ms = Some(stopped_at_ms);
        report.stopped = Some(running.len() as u32);
        Ok(report)
    }

    /// Starts again the containers this node stopped for a move.
    async fn restart_stopped(&self, move_id: &str) -> bool {
        let record = self.record(move_id);
        let mut all = true;
        for id in &record.stopped {
            match self.inner.runtime.start_existing(id).await {
                Ok(()) => tracing::info!(move_id, container = %id, "started the volume's container again"),
                Err(err) => {
                    tracing::warn!(move_id, container = %id, error = %err, "could not start the volume's container again");
                    all = false;
                }
            }
        }
        if all {
            let mut record = record;
            record.stopped.clear();
            if record.committed.is_none() {
                self.forget_record(move_id);
            } else {
                let _ = self.save_record(move_id, &record);
            }
        }
        all
    }

    /// `volume_move_abort`: undo this node's part of a failed move.
    pub async fn abort(&self, client: &Arc<ControlPlane>, step: VolumeMoveStep) -> Step {
        if let Err(err) = step.validate() {
            tracing::error!(error = %err, "invalid volume_move_abort payload; dropping it");
            return Step::Done;
        }
        if let Some(cancel) = self.inner.receiving.lock().expect("moves lock").remove(&step.move_id) {
            let _ = cancel.send(true);
        }
        let staging = self.staging(&step.move_id);
        if let Err(err) = remove_tree(&staging) {
            return Step::Retry(err);
        }
        let record = self.record(&step.move_id);
        if record.committed.as_deref() == Some(step.volume.as_str()) {
            // The copy this node received for the failed move; the source
            // still has the data.
            let dir = self.volume_dir(&step.volume);
            match self.inner.runtime.running_mounting(&dir.to_string_lossy()).await {
                Ok(users) if users.is_empty() => {
                    if let Err(err) = remove_tree(&dir) {
                        return Step::Retry(err);
                    }
                }
                Ok(users) => return Step::Retry(format!("the received copy is mounted by {}", users.join(", "))),
                Err(err) => return Step::Retry(err.to_string()),
            }
        }
        if !self.restart_stopped(&step.move_id).await {
            return Step::Retry("could not start the volume's containers again".into());
        }
        self.forget_record(&step.move_id);
        tracing::info!(move_id = %step.move_id, volume = %step.volume, "volume move aborted on this node");
        self.report_or_retry(client, &step.move_id, MoveReport::new(MoveReportState::Aborted)).await
    }

    /// `volume_release`: the move switched; this node's copy is set aside.
    pub async fn release(&self, client: &Arc<ControlPlane>, step: VolumeMoveStep) -> Step {
        if let Err(err) = step.validate() {
            tracing::error!(error = %err, "invalid volume_release payload; dropping it");
            return Step::Done;
        }
        let dir = self.volume_dir(&step.volume);
        let kept = self.kept(&step.volume, &step.move_id);
        if dir.exists() {
            match self.inner.runtime.running_mounting(&dir.to_string_lossy()).await {
                Ok(users) if users.is_empty() => {}
                Ok(users) => return Step::Retry(format!("still mounted by {}", users.join(", "))),
                Err(err) => return Step::Retry(err.to_string()),
            }
            if let Some(parent) = kept.parent() {
                if let Err(err) = std::fs::create_dir_all(parent) {
                    return Step::Retry(format!("cannot create {}: {err}", parent.display()));
                }
            }
            if let Err(err) = std::fs::rename(&dir, &kept) {
                return Step::Retry(format!("cannot set {} aside: {err}", dir.display()));
            }
            tracing::info!(volume = %step.volume, kept = %kept.display(), "moved volume's old copy set aside");
        }
        self.forget_record(&step.move_id);
        self.report_or_retry(client, &step.move_id, MoveReport::new(MoveReportState::Released)).await
    }

    /// `volume_purge`: the user confirmed (or the keep period ended).
    pub async fn purge(&self, client: &Arc<ControlPlane>, step: VolumeMoveStep) -> Step {
        if let Err(err) = step.validate() {
            tracing::error!(error = %err, "invalid volume_purge payload; dropping it");
            return Step::Done;
        }
        let kept = self.kept(&step.volume, &step.move_id);
        if let Err(err) = remove_tree(&kept) {
            return Step::Retry(err);
        }
        tracing::info!(volume = %step.volume, kept = %kept.display(), "moved volume's old copy deleted");
        self.report_or_retry(client, &step.move_id, MoveReport::new(MoveReportState::Purged)).await
    }

    async fn report_or_retry(&self, client: &ControlPlane, move_id: &str, report: MoveReport) -> Step {
        match client.volume_move(move_id, &report).await {
            Ok(()) => Step::Done,
            Err(err) => Step::Retry(format!("could not report the move: {err}")),
        }
    }
}

async fn report_with_retries(client: &ControlPlane, move_id: &str, report: &MoveReport) {
    for attempt in 1..=5u32 {
        match client.volume_move(move_id, report).await {
            Ok(()) => return,
            Err(err) => {
                tracing::warn!(move_id, attempt, error = %err, "could not report the move");
                tokio::time::sleep(std::time::Duration::from_secs(u64::from(attempt) * 2)).await;
            }
        }
    }
}

fn remove_tree(path: &Path) -> Result<(), String> {
    match std::fs::remove_dir_all(path) {
        Ok(()) => Ok(()),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(err) => Err(format!("cannot remove {}: {err}", path.display())),
    }
}
