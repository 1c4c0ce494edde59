//! What a replica's event hubs are told, passed to the other replicas
//! through PostgreSQL's `LISTEN`/`NOTIFY` (the store's `notify`): a command
//! queued through a follower's API reaches the node whose stream the
//! leader holds at once, and a deployment's new log lines reach a user
//! following them on another replica. Runs on every replica; nothing to do
//! on SQLite.
//!
//! A payload is four lines: the publishing replica (its lease holder
//! name, so it ignores its own), the hub (`nodes` or `logs`), the key (a
//! node or deployment id, `*` for every stream) and the event name. Only
//! known event names are passed on. Losing one (a full relay, a dropped
//! listener connection) loses nothing durable: the data is in the
//! database, and streams and nodes catch up at their next read.

use std::sync::Arc;
use std::time::Duration;

use cloudweb_protocol::events;
use tokio::sync::mpsc;

use crate::hub::{Hub, Relayed as HubEvent};
use crate::runtime_log_relay::{pieces, Relayed};
use crate::AppState;

/// Events waiting to be published; more are dropped (see the module text).
const QUEUE: usize = 1024;
/// The listener's reconnection wait, doubling up to [`LONGEST_WAIT`].
const FIRST_WAIT: Duration = Duration::from_secs(1);
const LONGEST_WAIT: Duration = Duration::from_secs(30);

/// The event names a hub is told, as the `&'static str` streams carry.
const KNOWN_EVENTS: [&str; 6] = [events::COMMANDS, events::ROUTES, events::PEERS, events::CERTIFICATES, "logs", "deleted"];

pub fn payload(origin: &str, event: &HubEvent) -> String {
    format!("{origin}\n{}\n{}\n{}", event.hub, event.key.as_deref().unwrap_or("*"), event.event)
}

/// The hub and what to tell it, unless the payload is this replica's own
/// or not one of ours.
pub fn parse<'a>(payload: &'a str, origin: &str) -> Option<(&'a str, Option<&'a str>, &'static str)> {
    let mut lines = payload.split('\n');
    let (from, hub, key, event) = (lines.next()?, lines.next()?, lines.next()?, lines.next()?);
    if from == origin || lines.next().is_some() {
        return None;
    }
    let event = KNOWN_EVENTS.iter().copied().find(|known| *known == event)?;
    Some((hub, (key != "*").then_some(key), event))
}

/// The hub name of runtime log lines, whose payload's third line is a
/// piece of [`crate::runtime_log_relay`] JSON.
pub const RUNTIME_LOGS: &str = "runtime-logs";

/// Runtime log lines another replica stored, unless the payload is this
/// replica's own or not such a payload.
pub fn parse_runtime_logs(payload: &str, origin: &str) -> Option<Relayed> {
    let mut lines = payload.splitn(3, '\n');
    let (from, hub, json) = (lines.next()?, lines.next()?, lines.next()?);
    if from == origin || hub != RUNTIME_LOGS {
        return None;
    }
    serde_json::from_str(json).ok()
}

fn hub<'a>(state: &'a AppState, name: &str) -> Option<&'a Hub> {
    match name {
        "nodes" => Some(&state.hub),
        "logs" => Some(&state.log_hub),
        _ => None,
    }
}

/// Publishes this replica's events and passes the others' on, for as long
/// as the server runs.
pub async fn run(state: Arc<AppState>) {
    if state.store.engine() != cloudweb_store::Engine::Postgres {
        return std::future::pending().await;
    }
    let (relay, mut outgoing) = mpsc::channel(QUEUE);
    state.hub.relay_to("nodes", relay.clone());
    state.log_hub.relay_to("logs", relay);
    let (lines_relay, mut outgoing_lines) = mpsc::channel(QUEUE);
    state.runtime_logs.relay_to(lines_relay);
    let origin = state.leader.holder.clone();
    let publish = async {
        while let Some(event) = outgoing.recv().await {
            if let Err(err) = state.store.publish_event(&payload(&origin, &event)).await {
                tracing::debug!(error = %err, "cannot pass an event to the other replicas");
            }
        }
    };
    let publish_lines = async {
        while let Some(relayed) = outgoing_lines.recv().await {
            for piece in pieces(&relayed) {
                if let Err(err) = state.store.publish_event(&format!("{origin}\n{RUNTIME_LOGS}\n{piece}")).await {
                    tracing::debug!(error = %err, "cannot pass runtime log lines to the other replicas");
                }
            }
        }
    };
    let listen = async {
        let mut wait = FIRST_WAIT;
        loop {
            match state.store.event_listener().await {
                Ok(Some(mut listener)) => {
                    wait = FIRST_WAIT;
                    loop {
                        match listener.recv().await {
                            Ok(text) => {
                                if let Some(relayed) = parse_runtime_logs(&text, &origin) {
                                    state.runtime_logs.take_relayed(relayed);
                                } else if let Some((name, key, event)) = parse(&text, &origin) {
                                    match (hub(&state, name), key) {
                                        (Some(hub), Some(key)) => hub.notify_local(key, event),
                                        (Some(hub), None) => hub.notify_all_local(event),
                                        (None, _) => {}
                                    }
                                }
                            }
                            Err(err) => {
                                tracing::warn!(error = %err, "lost the other replicas' events; listening again");
                                break;
                            }
                        }
                    }
                }
                Ok(None) => return,
                Err(err) => tracing::warn!(error = %err, wait_s = wait.as_secs(), "cannot listen for the other replicas' events"),
            }
            tokio::time::sleep(wait).await;
            wait = (wait * 2).min(LONGEST_WAIT);
        }
    };
    tokio::join!(publish, publish_lines, listen);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_round_trip_and_ones_own_or_unknown_ones_are_ignored() {
        let event = HubEvent { hub: "nodes", key: Some("n-1".into()), event: events::COMMANDS };
        let text = payload("a#1", &event);
        assert_eq!(parse(&text, "b#2"), Some(("nodes", Some("n-1"), events::COMMANDS)));
        assert_eq!(parse(&text, "a#1"), None, "its own");
        let all = payload("a#1", &HubEvent { hub: "nodes", key: None, event: events::PEERS });
        assert_eq!(parse(&all, "b#2"), Some(("nodes", None, events::PEERS)));
        assert_eq!(parse("a#1\nnodes\nn-1\nrm -rf", "b#2"), None, "unknown event");
        assert_eq!(parse("a#1\nnodes\nn-1", "b#2"), None, "short");
        assert_eq!(parse("a#1\nnodes\nn-1\ncommands\nextra", "b#2"), None, "long");
    }

    #[test]
    fn runtime_log_pieces_are_taken_from_other_replicas_only() {
        let relayed = Relayed::Forget("web".into());
        let text = format!("a#1\n{RUNTIME_LOGS}\n{}", pieces(&relayed)[0]);
        assert_eq!(parse_runtime_logs(&text, "b#2"), Some(relayed));
        assert_eq!(parse_runtime_logs(&text, "a#1"), None, "its own");
        assert_eq!(parse(&text, "b#2"), None, "not a hub event");
        assert_eq!(parse_runtime_logs("a#1\nnodes\nn-1\ncommands", "b#2"), None);
        assert_eq!(parse_runtime_logs(&format!("a#1\n{RUNTIME_LOGS}\nnot json"), "b#2"), None);
    }
}
