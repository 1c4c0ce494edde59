//! Per-node notification channels behind `GET /agent/v1/stream`. A message
//! only names what changed (`commands`, `routes`, `peers`); the durable data
//! stays in the store, so a missed message loses nothing.

use std::collections::HashMap;
use std::sync::Mutex;

use tokio::sync::broadcast;

#[derive(Default)]
pub struct Hub {
    channels: Mutex<HashMap<String, broadcast::Sender<&'static str>>>,
    /// Where what this hub is told is also sent for the other replicas
    /// (see `event_relay`), with this hub's name.
    relay: std::sync::OnceLock<(&'static str, tokio::sync::mpsc::Sender<Relayed>)>,
}

/// What one hub was told, for the other replicas: `key` is `None` for
/// "every stream".
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Relayed {
    pub hub: &'static str,
    pub key: Option<String>,
    pub event: &'static str,
}

impl Hub {
    pub fn subscribe(&self, node_id: &str) -> broadcast::Receiver<&'static str> {
        let mut channels = self.channels.lock().expect("hub lock");
        channels.entry(node_id.to_string()).or_insert_with(|| broadcast::channel(16).0).subscribe()
    }

    /// Also sends what this hub is told to `relay` under `name`. A full
    /// relay drops the event (the other replicas' nodes then catch up at
    /// their next poll) rather than slow the caller down.
    pub fn relay_to(&self, name: &'static str, relay: tokio::sync::mpsc::Sender<Relayed>) {
        let _ = self.relay.set((name, relay));
    }

    fn relay(&self, key: Option<&str>, event: &'static str) {
        if let Some((hub, relay)) = self.relay.get() {
            let _ = relay.try_send(Relayed { hub, key: key.map(str::to_string), event });
        }
    }

    pub fn notify(&self, node_id: &str, event: &'static str) {
        self.notify_local(node_id, event);
        self.relay(Some(node_id), event);
    }

    pub fn notify_all(&self, event: &'static str) {
        self.notify_all_local(event);
        self.relay(None, event);
    }

    /// Tells this replica's streams only (what another replica relayed).
    pub fn notify_local(&self, node_id: &str, event: &'static str) {
        if let Some(sender) = self.channels.lock().expect("hub lock").get(node_id) {
            // No receiver just means the node is not connected right now.
            let _ = sender.send(event);
        }
    }

    /// [`Hub::notify_all`] for this replica's streams only.
    pub fn notify_all_local(&self, event: &'static str) {
        for sender in self.channels.lock().expect("hub lock").values() {
            let _ = sender.send(event);
        }
    }

    /// Drops a node's channel, which ends its open streams.
    pub fn remove(&self, node_id: &str) {
        self.channels.lock().expect("hub lock").remove(node_id);
    }
}
