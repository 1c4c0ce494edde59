//! A deploy's log lines, shipped to the control plane as they come.

use std::sync::Arc;
use std::time::Duration;

use cloudweb_protocol::{LogLine, Report};
use tokio::sync::mpsc;

use crate::client::ControlPlane;
use crate::redact::Redactor;
use crate::timestamp::now_rfc3339;

/// Sends log lines to the control plane in batches, from its own task, so
/// a slow control plane never stalls a build. The lines still waiting when
/// the deploy ends go out with its final report (one request less before
/// the deployment runs), after every earlier batch.
pub(super) struct LogShipper {
    sender: mpsc::UnboundedSender<LogLine>,
    task: tokio::task::JoinHandle<Vec<LogLine>>,
    redactor: Redactor,
    client: Arc<ControlPlane>,
    deployment_id: String,
    instance: u32,
}

impl LogShipper {
    pub(super) fn start(client: Arc<ControlPlane>, deployment_id: String, instance: u32, redactor: Redactor) -> LogShipper {
        let (sender, mut receiver) = mpsc::unbounded_channel::<LogLine>();
        let task = {
            let (client, deployment_id) = (client.clone(), deployment_id.clone());
            tokio::spawn(async move {
                loop {
                    let mut batch = Vec::new();
                    match receiver.recv().await {
                        Some(line) => batch.push(line),
                        None => return batch,
                    }
                    // Gather what arrives in the next moment into the same report.
                    let deadline = tokio::time::sleep(Duration::from_millis(300));
                    tokio::pin!(deadline);
                    while batch.len() < cloudweb_protocol::misc::MAX_REPORT_LINES {
                        tokio::select! {
                            line = receiver.recv() => match line {
                                Some(line) => batch.push(line),
                                // The deploy ended: these go with its final report.
                                None => return batch,
                            },
                            _ = &mut deadline => break,
                        }
                    }
                    let mut report = Report::new(deployment_id.clone());
                    report.instance = Some(instance);
                    report.logs = batch;
                    if let Err(err) = client.report(&report).await {
                        tracing::warn!(error = %err, "could not ship log lines");
                    }
                }
            })
        };
        LogShipper { sender, task, redactor, client, deployment_id, instance }
    }

    pub(super) fn line(&self, stream: &str, line: impl Into<String>) {
        let mut line = self.redactor.apply(&line.into());
        cloudweb_protocol::misc::cap_log_line(&mut line);
        let _ = self.sender.send(LogLine { ts: now_rfc3339(), stream: stream.to_string(), line });
    }

    /// Waits until every batch went out; returns the lines not sent yet.
    pub(super) async fn finish(self) -> Vec<LogLine> {
        drop(self.sender);
        self.task.await.unwrap_or_default()
    }

    /// Waits until every line went out, the last ones in a report of their own.
    pub(super) async fn flush(self) {
        let (client, deployment_id, instance) = (self.client.clone(), self.deployment_id.clone(), self.instance);
        let rest = self.finish().await;
        if rest.is_empty() {
            return;
        }
        let mut report = Report::new(deployment_id);
        report.instance = Some(instance);
        report.logs = rest;
        if let Err(err) = client.report(&report).await {
            tracing::warn!(error = %err, "could not ship log lines");
        }
    }
}
