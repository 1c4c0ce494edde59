//! After an agent start: the jobs an earlier agent left halfway are
//! settled (reported `failed`, or `succeeded` for a restore whose data it
//! had begun to put in place, which is completed), the throwaway
//! containers and temporary directories nothing runs in are removed, final
//! reports never sent go out, and old ones are forgotten.

use cloudweb_protocol::{BackupJobReport, JobState};

use super::{remove_tree, restore, verify, Backups, Finished, JobKind, KEEP_FINISHED};
use crate::volumes::VOLUMES_DIR;

impl Backups {
    /// After an agent start: settles the jobs an earlier agent left
    /// halfway (reported `failed`, or `succeeded` for a swap it had made),
    /// removes throwaway containers and temporary directories nothing runs
    /// in, resends final reports never sent and forgets old ones. The
    /// reports go out in the background.
    pub async fn recover(&self) {
        let mut reports = Vec::new();
        for record in self.unfinished() {
            if self.is_running(&record.job_id) {
                continue;
            }
            let kind = record.kind.noun();
            tracing::warn!(job_id = %record.job_id, kind, "a backup job was cut off by an agent restart; cleaning up");
            let mut report = BackupJobReport::new(JobState::Failed);
            let mut message = match record.kind {
                JobKind::Restore => "the agent restarted during the restore; the partial copy was removed and the data it would have replaced is as it was".to_string(),
                _ => format!("the agent restarted during the {kind}; nothing of it was kept"),
            };
            let settled = restore::recover(self, &record).await;
            match settled {
                Ok(Some((files, bytes))) => {
                    report = BackupJobReport::new(JobState::Succeeded);
                    report.files = Some(files);
                    report.bytes = Some(bytes);
                    message = "the agent restarted while putting the restored data in place, and finished it".to_string();
                }
                Ok(None) => {}
                Err(err) => message = format!("{message}; {err}"),
            }
            let mut plain = record.clone();
            plain.swap = None;
            plain.commit = None;
            if let Err(problem) = self.clean_up(&plain).await {
                message = format!("{message}; {problem}");
            }
            report.message = Some(cloudweb_protocol::misc::one_line(&message, cloudweb_protocol::misc::MAX_REPORT_MESSAGE));
            let finished = Finished { finished_ms: crate::timestamp::now_ms(), sent: false, report };
            self.save_finished(&record.job_id, &finished);
            let _ = std::fs::remove_file(self.record_path(&record.job_id));
            reports.push((record.job_id.clone(), finished));
        }
        self.remove_leftovers().await;
        reports.extend(self.unsent_and_prune());
        if !reports.is_empty() {
            let backups = self.clone();
            tokio::spawn(async move {
                for (job_id, finished) in reports {
                    backups.send_final(&job_id, finished).await;
                }
            });
        }
    }

    /// Throwaway containers and temporary directories of no running job.
    /// (A dump an earlier agent left running in a service's container is
    /// killed with its job's clean-up: its record names the exec.)
    async fn remove_leftovers(&self) {
        match self.inner.runtime.throwaways().await {
            Ok(found) => {
                for (id, job) in found {
                    if self.is_running(&job) {
                        continue;
                    }
                    match self.inner.runtime.kill_and_remove(&id).await {
                        Ok(()) => tracing::info!(container = %id, job_id = %job, "removed a throwaway container of an earlier agent"),
                        Err(err) => tracing::warn!(container = %id, error = %err, "could not remove a throwaway container"),
                    }
                }
            }
            Err(err) => tracing::warn!(error = %err, "could not list throwaway containers; any left stay"),
        }
        for parent in [verify::TEMP_DIR, restore::STAGING_DIR] {
            let Ok(entries) = std::fs::read_dir(self.inner.data_dir.join(VOLUMES_DIR).join(parent)) else { continue };
            for entry in entries.filter_map(Result::ok) {
                let job = entry.file_name().to_string_lossy().into_owned();
                if self.is_running(&job) || self.record_path(&job).exists() {
                    continue;
                }
                let path = entry.path();
                match tokio::task::spawn_blocking(move || remove_tree(&path)).await {
                    Ok(Ok(())) => tracing::info!(job_id = %job, parent, "removed a temporary directory of an earlier agent"),
                    Ok(Err(err)) => tracing::warn!(error = %err, "could not remove a temporary directory"),
                    Err(_) => {}
                }
            }
        }
    }

    /// Final reports never sent; those older than [`KEEP_FINISHED`] are
    /// removed.
    fn unsent_and_prune(&self) -> Vec<(String, Finished)> {
        let Ok(entries) = std::fs::read_dir(self.jobs_dir()) else { return Vec::new() };
        let now = crate::timestamp::now_ms();
        let mut unsent = Vec::new();
        for entry in entries.filter_map(Result::ok) {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some(job_id) = name.strip_suffix(".json").filter(|n| !n.ends_with(".run")) else { continue };
            match self.finished(job_id) {
                Some(finished) if now - finished.finished_ms > KEEP_FINISHED.as_millis() as i64 => {
                    let _ = std::fs::remove_file(entry.path());
                }
                Some(finished) if !finished.sent => unsent.push((job_id.to_string(), finished)),
                Some(_) => {}
                None => {
                    let _ = std::fs::remove_file(entry.path());
                }
            }
        }
        unsent
    }

}
