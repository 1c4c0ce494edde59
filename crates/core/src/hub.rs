//! Per-node notification channels behind `GET /agent/v1/stream`. A message
//! only names what changed (`commands`, `routes`, `peers`); the durable data
//! stays in the store, so a missed message loses nothing.

use std::collections::HashMap;
use std::sync::Mutex;

use tokio::sync::broadcast;

#[derive(Default)]
pub struct Hub {
    channels: Mutex<HashMap<String, broadcast::Sender<&'static str>>>,
}

impl Hub {
    pub fn subscribe(&self, node_id: &str) -> broadcast::Receiver<&'static str> {
        let mut channels = self.channels.lock().expect("hub lock");
        channels.entry(node_id.to_string()).or_insert_with(|| broadcast::channel(16).0).subscribe()
    }

    pub fn notify(&self, node_id: &str, event: &'static str) {
        if let Some(sender) = self.channels.lock().expect("hub lock").get(node_id) {
            // No receiver just means the node is not connected right now.
            let _ = sender.send(event);
        }
    }

    pub fn notify_all(&self, event: &'static str) {
        for sender in self.channels.lock().expect("hub lock").values() {
            let _ = sender.send(event);
        }
    }

    /// Drops a node's channel, which ends its open streams.
    pub fn remove(&self, node_id: &str) {
        self.channels.lock().expect("hub lock").remove(node_id);
    }
}
